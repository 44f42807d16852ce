//! Input the serve loops throw away without buffering: the announced body of a frame whose
//! sizes exceed the protocol's limits, or the rest of a line longer than the decoder waits
//! for. Either way the daemon answers that frame as refused and reads the next one in sync,
//! with memory bounded by one read chunk whatever the client announced.

/// What is still to be dropped from the front of the input.
#[derive(Debug, Default)]
pub(super) struct Discard {
    /// Bytes of an oversized body still to come.
    bytes: u64,
    /// After those bytes, the frame's closing `\n` (dropped only if it is one).
    newline: bool,
    /// Drop everything up to and including the next `\n` (an over-long line).
    to_newline: bool,
}

impl Discard {
    /// Drops `n` announced body bytes, then the `\n` that should end the frame.
    pub(super) fn body(n: u64) -> Discard {
        Discard {
            bytes: n,
            newline: true,
            to_newline: false,
        }
    }

    /// Drops the rest of the current line, through its `\n`.
    pub(super) fn line() -> Discard {
        Discard {
            bytes: 0,
            newline: false,
            to_newline: true,
        }
    }

    pub(super) fn is_done(&self) -> bool {
        self.bytes == 0 && !self.newline && !self.to_newline
    }

    /// Drops what belongs to the discarded frame from the front of `buf`; true once all of
    /// it is gone (the rest of `buf` is the next frame).
    pub(super) fn apply(&mut self, buf: &mut Vec<u8>) -> bool {
        if self.bytes > 0 {
            let n = usize::try_from(self.bytes).map_or(buf.len(), |b| b.min(buf.len()));
            buf.drain(..n);
            self.bytes -= n as u64;
        }
        if self.bytes == 0 && self.newline {
            match buf.first() {
                Some(b'\n') => {
                    buf.drain(..1);
                    self.newline = false;
                }
                Some(_) => self.newline = false,
                None => {}
            }
        }
        if self.to_newline {
            match buf.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    buf.drain(..=i);
                    self.to_newline = false;
                }
                None => buf.clear(),
            }
        }
        self.is_done()
    }
}

#[cfg(test)]
mod tests {
    use super::Discard;

    #[test]
    fn a_body_and_its_newline_go_across_chunks() {
        let mut d = Discard::body(5);
        let mut buf = b"abc".to_vec();
        assert!(!d.apply(&mut buf));
        assert!(buf.is_empty());
        buf.extend_from_slice(b"de");
        assert!(!d.apply(&mut buf), "the closing newline has not come yet");
        buf.extend_from_slice(b"\nNEXT\n");
        assert!(d.apply(&mut buf));
        assert_eq!(buf, b"NEXT\n");
    }

    #[test]
    fn a_missing_newline_keeps_the_next_byte() {
        let mut d = Discard::body(2);
        let mut buf = b"abXY".to_vec();
        assert!(d.apply(&mut buf));
        assert_eq!(buf, b"XY");
    }

    #[test]
    fn a_long_line_goes_through_its_newline() {
        let mut d = Discard::line();
        let mut buf = vec![b'x'; 100];
        assert!(!d.apply(&mut buf));
        assert!(buf.is_empty());
        buf.extend_from_slice(b"xx\nnext\n");
        assert!(d.apply(&mut buf));
        assert_eq!(buf, b"next\n");
    }
}
