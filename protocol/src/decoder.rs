//! The client's streaming decoder for the daemon's stdout.
//!
//! Text is raw bytes without framing, so frames are recognised by position:
//!
//! | state | what the bytes mean | leaves on |
//! |---|---|---|
//! | [`DecoderState::AwaitReady`] | anything before READY is skipped | the READY sentinel -> `AwaitStat` |
//! | [`DecoderState::AwaitStat`] | one line, a STAT | a full line: STAT -> `BetweenTurns`; any other line is left for `BetweenTurns` |
//! | [`DecoderState::BetweenTurns`] | a full line of an upstream telemetry kind that parses is telemetry | anything else -> `InTurn` |
//! | [`DecoderState::InTurn`] | text, until a sentinel | END -> `AwaitStat`; READY (daemon restarted) -> `AwaitStat` |
//!
//! The sentinels are recognised anywhere inside a turn. Text is emitted as soon as it
//! arrives, except for what might still turn into a frame: a partial sentinel at the end of
//! the buffer (`\x01`, `\x01\x01`, `\x01\x01E`, ...), the `\n` just before it or at the end of
//! the buffer (it may be the `\n` of `\n\x01\x01END\x01\x01\n`), and, between turns, the
//! start of a line that could still become a telemetry line. So the decoded sequence (with
//! adjacent texts joined) does not depend on how the stream is split into chunks.
//!
//! Known ambiguity (inherent in upstream's protocol): an answer that begins with a complete,
//! valid upstream telemetry line (e.g. `TIERS 1 2 3 0.50 0.50\n`) decodes as telemetry.

use crate::reply::{parse_stat_line, Reply, END, READY};
use crate::telemetry::{parse_telemetry_line, Telemetry, UPSTREAM_KINDS};

/// A STAT line longer than this (without `\n`) is not waited for.
const MAX_STAT_LINE: usize = 4096;
/// A telemetry candidate line longer than this (without `\n`) is taken as text.
pub const MAX_TELEMETRY_LINE: usize = 1 << 20;

/// Where the decoder is in the stream (see the module table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecoderState {
    /// Before READY.
    AwaitReady,
    /// After READY or END: the next line is a STAT.
    AwaitStat,
    /// After a STAT: telemetry lines or the start of the next turn's text.
    BetweenTurns,
    /// Streaming a turn's text.
    InTurn,
}

/// Streaming decoder: [`feed`](ReplyDecoder::feed) it stdout bytes in chunks of any size,
/// pull [`Reply`] values with [`next_reply`](ReplyDecoder::next_reply). Never panics.
#[derive(Clone, Debug)]
pub struct ReplyDecoder {
    buf: Vec<u8>,
    /// Start of the unconsumed bytes in `buf`.
    pos: usize,
    /// `buf[pos..pos + scanned]` is known to hold no `\n`.
    scanned: usize,
    state: DecoderState,
    eof: bool,
}

impl Default for ReplyDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl ReplyDecoder {
    /// A decoder at the start of the daemon's stdout (before READY).
    pub fn new() -> Self {
        ReplyDecoder {
            buf: Vec::new(),
            pos: 0,
            scanned: 0,
            state: DecoderState::AwaitReady,
            eof: false,
        }
    }

    /// The current state.
    pub fn state(&self) -> DecoderState {
        self.state
    }

    /// Bytes held back, waiting for more input.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Appends a chunk of stdout.
    pub fn feed(&mut self, chunk: &[u8]) {
        crate::decoder::append_compacting(&mut self.buf, &mut self.pos, chunk);
    }

    /// Feeds `chunk` and appends every reply it completes to `out`.
    pub fn decode_chunk(&mut self, chunk: &[u8], out: &mut Vec<Reply>) {
        self.feed(chunk);
        while let Some(r) = self.next_reply() {
            out.push(r);
        }
    }

    /// At EOF: the replies still held back (a held text tail, a last line without `\n`).
    pub fn finish(mut self) -> Vec<Reply> {
        self.eof = true;
        let mut out = Vec::new();
        while let Some(r) = self.next_reply() {
            out.push(r);
        }
        out
    }

    /// The next complete reply, or `None` when more input is needed.
    pub fn next_reply(&mut self) -> Option<Reply> {
        loop {
            match self.state {
                DecoderState::AwaitReady => return self.await_ready(),
                DecoderState::AwaitStat => {
                    let line = match self.find_newline() {
                        // Too long to be a STAT, whether or not its `\n` has arrived.
                        Some(i) if i > MAX_STAT_LINE => {
                            self.state = DecoderState::BetweenTurns;
                            continue;
                        }
                        Some(i) => i,
                        None if self.eof && self.buffered() > 0 => self.buffered(),
                        None if self.buffered() > MAX_STAT_LINE => {
                            self.state = DecoderState::BetweenTurns;
                            continue;
                        }
                        None => return None,
                    };
                    self.state = DecoderState::BetweenTurns;
                    if let Some(stat) = parse_stat_line(&self.avail()[..line]) {
                        self.consume((line + 1).min(self.buffered()));
                        return Some(Reply::Stat(stat));
                    }
                }
                DecoderState::BetweenTurns => {
                    let a = self.avail();
                    if a.is_empty() {
                        return None;
                    }
                    let line = match self.find_newline() {
                        Some(i) if i > MAX_TELEMETRY_LINE => {
                            self.state = DecoderState::InTurn;
                            continue;
                        }
                        Some(i) => i,
                        None if self.eof => self.buffered(),
                        None => {
                            let a = self.avail();
                            if a.len() <= MAX_TELEMETRY_LINE && could_be_telemetry(a) {
                                return None;
                            }
                            self.state = DecoderState::InTurn;
                            continue;
                        }
                    };
                    if let Some(t) = stdout_telemetry(&self.avail()[..line]) {
                        self.consume((line + 1).min(self.buffered()));
                        return Some(Reply::Telemetry(t));
                    }
                    self.state = DecoderState::InTurn;
                }
                DecoderState::InTurn => return self.in_turn(),
            }
        }
    }

    fn avail(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    fn consume(&mut self, n: usize) {
        self.pos += n;
        self.scanned = 0;
    }

    /// Offset of the first `\n` in the unconsumed bytes.
    fn find_newline(&mut self) -> Option<usize> {
        let a = &self.buf[self.pos..];
        let from = self.scanned.min(a.len());
        match a[from..].iter().position(|&b| b == b'\n') {
            Some(i) => Some(from + i),
            None => {
                self.scanned = a.len();
                None
            }
        }
    }

    fn await_ready(&mut self) -> Option<Reply> {
        let a = self.avail();
        if let Some(i) = find(a, READY) {
            self.consume(i + READY.len());
            self.state = DecoderState::AwaitStat;
            return Some(Reply::Ready);
        }
        // Keep only a tail that may still grow into READY.
        let keep = if self.eof {
            0
        } else {
            (1..READY.len().min(a.len() + 1))
                .rev()
                .find(|&k| a.ends_with(&READY[..k]))
                .unwrap_or(0)
        };
        let n = a.len() - keep;
        self.consume(n);
        None
    }

    fn in_turn(&mut self) -> Option<Reply> {
        let a = self.avail();
        let mut from = 0;
        // (offset of a sentinel or held partial sentinel, the sentinel if complete)
        let (at, sentinel) = loop {
            let Some(j) = a[from..].iter().position(|&b| b == 0x01) else {
                break (a.len(), None);
            };
            let k = from + j;
            let rest = &a[k..];
            if rest.starts_with(END) {
                break (
                    k,
                    Some(Reply::End {
                        leading_newline: false,
                    }),
                );
            }
            if rest.starts_with(READY) {
                break (k, Some(Reply::Ready));
            }
            if !self.eof && (END.starts_with(rest) || READY.starts_with(rest)) {
                break (k, None);
            }
            from = k + 1;
        };
        match sentinel {
            Some(Reply::End { .. }) => {
                let leading_newline = at > 0 && a[at - 1] == b'\n';
                let text_len = at - usize::from(leading_newline);
                if text_len > 0 {
                    let text = a[..text_len].to_vec();
                    self.consume(text_len);
                    return Some(Reply::Text(text));
                }
                self.consume(at + END.len());
                self.state = DecoderState::AwaitStat;
                Some(Reply::End { leading_newline })
            }
            Some(_) => {
                if at > 0 {
                    let text = a[..at].to_vec();
                    self.consume(at);
                    return Some(Reply::Text(text));
                }
                self.consume(READY.len());
                self.state = DecoderState::AwaitStat;
                Some(Reply::Ready)
            }
            None => {
                // Hold back a `\n` that may be the one before END.
                let hold_newline = !self.eof && at > 0 && a[at - 1] == b'\n';
                let text_len = at - usize::from(hold_newline);
                if text_len == 0 {
                    return None;
                }
                let text = a[..text_len].to_vec();
                self.consume(text_len);
                Some(Reply::Text(text))
            }
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Whether `a` (no `\n` yet) may still become a line of an upstream telemetry kind.
fn could_be_telemetry(a: &[u8]) -> bool {
    UPSTREAM_KINDS.iter().any(|kind| {
        let k = kind.as_bytes();
        if a.len() <= k.len() {
            k.starts_with(a)
        } else {
            a.starts_with(k) && a[k.len()] == b' '
        }
    })
}

/// A full stdout line of an upstream telemetry kind that parses.
fn stdout_telemetry(line: &[u8]) -> Option<Telemetry> {
    let kind_end = line.iter().position(|&b| b == b' ')?;
    if !UPSTREAM_KINDS
        .iter()
        .any(|k| k.as_bytes() == &line[..kind_end])
    {
        return None;
    }
    parse_telemetry_line(line).filter(|t| !matches!(t, Telemetry::Unknown(_)))
}

/// Appends `chunk` to a decoder's buffer whose bytes before `pos` are consumed: the consumed
/// front is dropped first when it is everything, or at least 4 KiB and half the buffer, so the
/// buffer holds about one frame however long the stream.
pub(crate) fn append_compacting(buf: &mut Vec<u8>, pos: &mut usize, chunk: &[u8]) {
    if *pos == buf.len() {
        buf.clear();
        *pos = 0;
    } else if *pos >= 4096 && *pos * 2 >= buf.len() {
        buf.drain(..*pos);
        *pos = 0;
    }
    buf.extend_from_slice(chunk);
}
