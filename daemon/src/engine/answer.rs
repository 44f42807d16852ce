//! A session's answer as bytes on the wire: each token's raw bytes as they come, with an
//! incomplete UTF-8 tail held back until the next token completes it (or the request ends),
//! and, under `--stop`, bytes that may still begin a stop string held back until the next
//! token says whether they do.

use super::Engine;
use crate::sampling::StopStrings;

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

/// One request's answer on its way to the wire: `--stop` strings cut it (the stop string
/// and everything after it are never sent), then the UTF-8 hold. Also remembers where each
/// token's bytes end, so the caller can cut the conversation back to the tokens it sent.
pub struct AnswerStream {
    stops: StopStrings,
    utf8: Utf8Hold,
    /// The answer's byte offset at each token's end (only with stop strings: without them no
    /// cut is ever needed).
    ends: Vec<usize>,
    /// Bytes the stop strings released so far: at a hit, the offset of the cut.
    released: usize,
}

impl AnswerStream {
    pub fn new(stops: &[String]) -> AnswerStream {
        AnswerStream {
            stops: StopStrings::new(stops),
            utf8: Utf8Hold::default(),
            ends: Vec::new(),
            released: 0,
        }
    }

    /// A token's bytes; returns the bytes that may go out now (none once a stop string came).
    pub fn push(&mut self, bytes: &[u8]) -> Vec<u8> {
        if self.stops.hit() {
            return Vec::new();
        }
        if !self.stops.is_empty() {
            let end = self.ends.last().copied().unwrap_or(0) + bytes.len();
            self.ends.push(end);
        }
        let ready = self.stops.push(bytes);
        self.released += ready.len();
        self.utf8.push(&ready)
    }

    /// Whether a stop string ended the answer.
    pub fn stopped(&self) -> bool {
        self.stops.hit()
    }

    /// The stop string that ended the answer.
    pub fn stop_string(&self) -> Option<String> {
        self.stops
            .matched()
            .map(|s| String::from_utf8_lossy(s).into_owned())
    }

    /// The request ended: whatever is still held. Bytes held as a possible stop string's
    /// start go out when no stop string came (they turned out not to be one).
    pub fn finish(&mut self) -> Vec<u8> {
        if !self.stops.hit() {
            let rest = self.stops.flush();
            self.released += rest.len();
            let mut out = self.utf8.push(&rest);
            out.extend(self.utf8.finish());
            return out;
        }
        self.utf8.finish()
    }

    /// After a stop string: how many of the answer's tokens were sent whole (those whose
    /// bytes end at or before the cut). `None` when no stop string came.
    pub fn tokens_sent(&self) -> Option<usize> {
        self.stops
            .hit()
            .then(|| self.ends.partition_point(|&e| e <= self.released))
    }
}

/// A `--stop` string ended `slot`'s answer: its conversation keeps what the client was sent
/// and nothing of the stop string, as a stop token is not kept either. That is the history
/// up to `answer_start` and the answer's first `sent` tokens (those sent whole); the tokens
/// that carried the stop string go, fed or pending. When the stop string begins inside a
/// token, that token's bytes before it were sent but are not kept: the history never holds
/// what the client did not see, and a client that sends its answer back as the next
/// prompt's prefix reuses all of it.
pub fn keep_sent(engine: &mut Engine, slot: usize, answer_start: usize, sent: usize) {
    let keep = answer_start + sent;
    // Every token before the one that completed the stop string was fed, so the cache holds
    // at least `keep` positions.
    if engine.session(slot).kv.len() > keep {
        engine.truncate(slot, keep);
    }
    engine.set_pending(slot, None);
}

#[cfg(test)]
mod tests {
    use super::incomplete_utf8_tail;

    #[test]
    fn answer_stream_cuts_at_a_stop_string_and_counts_the_tokens_sent() {
        // "ab" "c|E" "N" "D": the stop string starts inside the second token.
        let mut a = super::AnswerStream::new(&["END".into()]);
        assert_eq!(a.push(b"ab"), b"ab");
        assert_eq!(a.push(b"cE"), b"c");
        assert_eq!(a.push(b"N"), b"");
        assert_eq!(a.push(b"D tail"), b"");
        assert!(a.stopped());
        assert_eq!(a.push(b"more"), b"");
        assert_eq!(a.finish(), b"");
        assert_eq!(a.tokens_sent(), Some(1));
        // On a token boundary every token before the stop string was sent whole.
        let mut a = super::AnswerStream::new(&["END".into()]);
        for t in [&b"ab"[..], b"c", b"EN", b"D"] {
            a.push(t);
        }
        assert_eq!(a.tokens_sent(), Some(2));
        // A false start is released, and at the end what is held goes out in order.
        let mut a = super::AnswerStream::new(&["END".into()]);
        assert_eq!(a.push(b"xE"), b"x");
        assert_eq!(a.push(b"Nx"), b"ENx");
        assert_eq!(a.push(b"EN"), b"");
        assert_eq!(a.finish(), b"EN");
        assert_eq!(a.tokens_sent(), None);
    }

    #[test]
    fn answer_stream_holds_utf8_after_the_stop_strings() {
        let e = "é".as_bytes();
        let mut a = super::AnswerStream::new(&[]);
        assert_eq!(a.push(&e[..1]), b"");
        assert_eq!(a.push(&e[1..]), e);
        // A character cut short by the stop string: its lead byte goes out at the end, as an
        // ordinary end sends an incomplete tail.
        let mut a = super::AnswerStream::new(&["X".into()]);
        assert_eq!(a.push(&[b'a', e[0]]), b"a");
        assert_eq!(a.push(b"X"), b"");
        assert_eq!(a.finish(), &e[..1]);
        assert_eq!(a.tokens_sent(), Some(1));
    }

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
