//! A session's answer as bytes on the wire: each token's raw bytes as they come, with an
//! incomplete UTF-8 tail held back until the next token completes it (or the request ends).

/// How many bytes at the end of `b` form the start of a UTF-8 sequence that is not complete
/// yet (0 when `b` ends on a boundary or with bytes that can never become valid).
pub fn incomplete_utf8_tail(b: &[u8]) -> usize {
    for back in 1..=b.len().min(3) {
        let byte = b[b.len() - back];
        if byte & 0xC0 == 0x80 {
            continue; // continuation byte: look further back for the lead
        }
        let need = match byte {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => return 0,
        };
        return if need > back { back } else { 0 };
    }
    0
}

/// The bytes of one answer not yet sent because they end inside a UTF-8 sequence.
#[derive(Default)]
pub struct Utf8Hold {
    held: Vec<u8>,
}

impl Utf8Hold {
    /// Adds a token's bytes; returns the bytes that may go out now.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<u8> {
        self.held.extend_from_slice(bytes);
        let ready = self.held.len() - incomplete_utf8_tail(&self.held);
        self.held.drain(..ready).collect()
    }

    /// Whatever is still held (the request ended).
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::incomplete_utf8_tail;

    #[test]
    fn holds_back_only_incomplete_sequences() {
        assert_eq!(incomplete_utf8_tail(b"abc"), 0);
        assert_eq!(incomplete_utf8_tail("é".as_bytes()), 0);
        assert_eq!(incomplete_utf8_tail(&"é".as_bytes()[..1]), 1);
        assert_eq!(incomplete_utf8_tail(&"你".as_bytes()[..2]), 2);
        assert_eq!(incomplete_utf8_tail(&"😀".as_bytes()[..3]), 3);
        assert_eq!(incomplete_utf8_tail("😀".as_bytes()), 0);
        // Bytes that can never start a sequence are not held.
        assert_eq!(incomplete_utf8_tail(b"a\xff"), 0);
        assert_eq!(incomplete_utf8_tail(b"\x80\x80\x80"), 0);
    }

    #[test]
    fn hold_releases_a_character_once_complete() {
        let mut h = super::Utf8Hold::default();
        let e = "é".as_bytes();
        assert_eq!(h.push(b"a"), b"a");
        assert_eq!(h.push(&e[..1]), b"");
        assert_eq!(h.push(&e[1..]), e);
        assert_eq!(h.push(&e[..1]), b"");
        assert_eq!(h.finish(), &e[..1]);
        assert_eq!(h.finish(), b"");
    }
}
