//! The client's streaming decoder for the daemon's stdout in mux mode.
//!
//! Before READY everything is skipped (upstream prints a banner there). After it every
//! frame is one line, except that a `DATA <id> <n>` header is followed by exactly `n` payload
//! bytes and a `\n`. Decisions depend only on the bytes, never on where the chunks split,
//! so the decoded sequence is the same however the stream is chunked (property-tested).

use crate::num::parse_u64;
use crate::reply::{parse_stat_line, READY};
use crate::telemetry::{parse_telemetry_line, Telemetry};

use super::{ErrorCode, LogprobTail, MuxReply};

/// A line longer than this (without `\n`) is not waited for: its first `MAX_REPLY_LINE`
/// bytes come out as [`MuxReply::Other`] and decoding goes on from there. (GLM-5's EMAP
/// line is ~40 KB.)
pub const MAX_REPLY_LINE: usize = 1 << 20;
/// A DATA header announcing more bytes than this is [`MuxReply::Other`] (upstream's gateway
/// refuses more than 64 KiB; one token's text is a few bytes).
pub const MAX_DATA_BYTES: u64 = 16 << 20;

/// Streaming decoder: [`feed`](MuxReplyDecoder::feed) it stdout bytes in chunks of any
/// size, pull [`MuxReply`] values with [`next_reply`](MuxReplyDecoder::next_reply). Never
/// panics, never holds more than one frame.
#[derive(Clone, Debug, Default)]
pub struct MuxReplyDecoder {
    buf: Vec<u8>,
    /// Start of the unconsumed bytes in `buf`.
    pos: usize,
    /// `buf[pos..pos + scanned]` is known to hold no `\n`.
    scanned: usize,
    ready: bool,
    eof: bool,
}

impl MuxReplyDecoder {
    /// A decoder at the start of the daemon's stdout (before READY).
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether READY has been seen.
    pub fn is_ready(&self) -> bool {
        self.ready
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
    pub fn decode_chunk(&mut self, chunk: &[u8], out: &mut Vec<MuxReply>) {
        self.feed(chunk);
        while let Some(r) = self.next_reply() {
            out.push(r);
        }
    }

    /// At EOF: the replies still held back. A last line without `\n` is decoded as a line;
    /// a DATA frame cut short comes out as [`MuxReply::Other`] with the bytes left.
    pub fn finish(mut self) -> Vec<MuxReply> {
        self.eof = true;
        let mut out = Vec::new();
        while let Some(r) = self.next_reply() {
            out.push(r);
        }
        out
    }

    /// The next complete reply, or `None` when more input is needed.
    pub fn next_reply(&mut self) -> Option<MuxReply> {
        if !self.ready {
            return self.await_ready();
        }
        let avail_len = self.buffered();
        if avail_len == 0 {
            return None;
        }
        let line_len = match self.find_newline() {
            Some(i) if i > MAX_REPLY_LINE => return Some(self.take_other(MAX_REPLY_LINE)),
            Some(i) => i,
            None if avail_len > MAX_REPLY_LINE => return Some(self.take_other(MAX_REPLY_LINE)),
            None if self.eof => avail_len,
            None => return None,
        };
        let header_len = (line_len + 1).min(avail_len);
        let a = &self.buf[self.pos..];
        let line = &a[..line_len];
        let framed = if let Some(head) = line.strip_prefix(b"DATA ") {
            data_header(head)
        } else if let Some(head) = line.strip_prefix(b"ECHO ") {
            echo_header(head)
        } else {
            None
        };
        if let Some((n, make)) = framed {
            let rest = &a[header_len..];
            if rest.len() < n || (rest.len() == n && !self.eof) {
                if self.eof {
                    let left = self.buffered();
                    return Some(self.take_other(left));
                }
                return None;
            }
            let bytes = rest[..n].to_vec();
            // A byte other than `\n` after the payload is left as the next line's start.
            let used = header_len + n + usize::from(rest.get(n) == Some(&b'\n'));
            self.consume(used);
            return Some(make.reply(bytes));
        }
        let reply = classify(line);
        self.consume(header_len);
        Some(reply)
    }

    fn consume(&mut self, n: usize) {
        self.pos += n;
        self.scanned = 0;
    }

    fn take_other(&mut self, n: usize) -> MuxReply {
        let line = self.buf[self.pos..self.pos + n].to_vec();
        self.consume(n);
        MuxReply::Other(line)
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

    fn await_ready(&mut self) -> Option<MuxReply> {
        let a = &self.buf[self.pos..];
        if let Some(i) = a.windows(READY.len()).position(|w| w == READY) {
            self.consume(i + READY.len());
            self.ready = true;
            return Some(MuxReply::Ready);
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
}

/// A payload frame's header, read: what the frame is once its bytes are in.
enum Framed {
    Data(u64),
    DataLogprobs(u64, LogprobTail),
    Echo(u64, u64, LogprobTail),
}

impl Framed {
    fn reply(self, bytes: Vec<u8>) -> MuxReply {
        match self {
            Framed::Data(id) => MuxReply::Data { id, bytes },
            Framed::DataLogprobs(id, tail) => MuxReply::DataLogprobs { id, bytes, tail },
            Framed::Echo(id, pos, tail) => MuxReply::Echo {
                id,
                pos,
                bytes,
                tail,
            },
        }
    }
}

/// The payload length, at most [`MAX_DATA_BYTES`] (so it fits a usize on every target).
fn payload_len(w: &[u8]) -> Option<usize> {
    parse_u64(w)
        .filter(|&n| n <= MAX_DATA_BYTES)
        .map(|n| n as usize)
}

/// `<id> <n> [<lp> <k> [<tid> <tlp>]*k]` after `DATA `. A tail that does not read as a
/// logprobs tail is ignored (the frame is still the token's bytes).
fn data_header(head: &[u8]) -> Option<(usize, Framed)> {
    let mut w = words(head);
    let id = parse_u64(w.next()?)?;
    let n = payload_len(w.next()?)?;
    let mut rest = w.peekable();
    if rest.peek().is_none() {
        return Some((n, Framed::Data(id)));
    }
    Some((
        n,
        match LogprobTail::parse(&mut rest) {
            Some(tail) => Framed::DataLogprobs(id, tail),
            None => Framed::Data(id),
        },
    ))
}

/// `<id> <n> <pos> <lp> <k> [<tid> <tlp>]*k` after `ECHO `.
fn echo_header(head: &[u8]) -> Option<(usize, Framed)> {
    let mut w = words(head);
    let id = parse_u64(w.next()?)?;
    let n = payload_len(w.next()?)?;
    let pos = parse_u64(w.next()?)?;
    let tail = LogprobTail::parse(&mut w)?;
    Some((n, Framed::Echo(id, pos, tail)))
}

fn words(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|&b| b == b' ').filter(|w| !w.is_empty())
}

/// One full line (without `\n`) other than a DATA header.
fn classify(line: &[u8]) -> MuxReply {
    let parsed = if line == &READY[..READY.len() - 1] {
        Some(MuxReply::Ready)
    } else if line.starts_with(b"STAT ") {
        parse_stat_line(line).map(MuxReply::Stat)
    } else if let Some(rest) = line.strip_prefix(b"ACCEPT ") {
        let mut w = words(rest);
        (|| {
            Some(MuxReply::Accept {
                id: parse_u64(w.next()?)?,
                prompt_tokens: parse_u64(w.next()?)?,
            })
        })()
    } else if let Some(rest) = line.strip_prefix(b"DONE ") {
        done(rest)
    } else if let Some(rest) = line.strip_prefix(b"ERROR ") {
        let w: Vec<&[u8]> = words(rest).collect();
        w.first()
            .and_then(|id| parse_u64(id))
            .zip(ErrorCode::parse(w.get(1..).unwrap_or(&[])))
            .map(|(id, code)| MuxReply::Error { id, code })
    } else {
        parse_telemetry_line(line)
            .filter(|t| !matches!(t, Telemetry::Unknown(_)))
            .map(MuxReply::Telemetry)
    };
    parsed.unwrap_or_else(|| MuxReply::Other(line.to_vec()))
}

/// `<id> STAT ...` after `DONE `.
fn done(rest: &[u8]) -> Option<MuxReply> {
    let sp = rest.iter().position(|&b| b == b' ')?;
    let id = parse_u64(&rest[..sp])?;
    let stat = parse_stat_line(&rest[sp + 1..])?;
    Some(MuxReply::Done { id, stat })
}
