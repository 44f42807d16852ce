//! The multiplexed protocol (*upstream* `run_serve_mux`, selected by `SERVE=1 SERVE_BATCH=1`
//! or `colibri serve --mux`): many requests in flight at once, each named by a client-chosen
//! id, every reply frame tagged with the id it belongs to.
//!
//! | direction | frame | value |
//! |---|---|---|
//! | client -> daemon | `SUBMIT <id> <slot> <bytes> <max_tokens> <temp> <top_p> [<gbytes> [key=value ...]]\n<bytes><gbytes>\n` | [`MuxRequest::Submit`] |
//! | client -> daemon | `STOP <id>\n`, `CANCEL <id>\n` | [`MuxRequest::Stop`], [`MuxRequest::Cancel`] |
//! | client -> daemon | anything breaking a rule | [`MuxRequest::Rejected`]: answer `ERROR <id> <code>` |
//! | daemon -> client | `ACCEPT <id> <prompt_tokens>`, `DATA <id> <n>\n<n bytes>\n`, `DONE <id> STAT ...`, `ERROR <id> <CODE> [args]` | [`MuxReply`] |
//!
//! Unlike the legacy protocol, every daemon frame is line-shaped (DATA's payload is byte
//! counted), so the client's [`MuxReplyDecoder`] needs no positional state beyond READY.
//! `protocol/README.md` ("Multiplexed protocol") lists every frame, every rule and what
//! differs from upstream.
//!
//! ```
//! use protocol::mux::{decode_mux_request, ErrorCode, MuxReply, MuxReplyDecoder, MuxRequest};
//! use protocol::Stat;
//!
//! // Daemon: a bad header is a value; its payload is consumed, so the STOP decodes next.
//! let stdin = b"SUBMIT 7 0 2 0 0.7 0.9\nhi\nSTOP 3\n";
//! let (req, used) = decode_mux_request(stdin).unwrap();
//! assert!(matches!(&req, MuxRequest::Rejected(r) if r.id == 0 && r.code == ErrorCode::BadRequest));
//! assert_eq!(decode_mux_request(&stdin[used..]).unwrap().0, MuxRequest::Stop { id: 3 });
//! let mut stdout = Vec::new();
//! MuxReply::Accept { id: 3, prompt_tokens: 12 }.encode(&mut stdout);
//! MuxReply::Data { id: 3, bytes: b"Hi".to_vec() }.encode(&mut stdout);
//! let stat = Stat { prompt: Some((12, false)), ..Stat::zero(1.5) };
//! MuxReply::Done { id: 3, stat }.encode(&mut stdout);
//! assert_eq!(stdout, b"ACCEPT 3 12\nDATA 3 2\nHi\nDONE 3 STAT 0 0.00 0.0 1.50 12 0\n");
//!
//! // Client: decode the daemon's stdout in whatever chunks it arrives.
//! let mut dec = MuxReplyDecoder::new();
//! let mut replies = Vec::new();
//! dec.decode_chunk(b"\x01\x01READY\x01\x01\nDATA 3 2\nH", &mut replies);
//! dec.decode_chunk(b"i\nERROR 4 SLOT_BUSY\n", &mut replies);
//! assert_eq!(replies[1], MuxReply::Data { id: 3, bytes: b"Hi".to_vec() });
//! assert_eq!(replies[2], MuxReply::Error { id: 4, code: ErrorCode::SlotBusy });
//! ```

use std::fmt;

use crate::reply::Stat;
use crate::telemetry::Telemetry;

mod decoder;
mod request;

pub use decoder::{MuxReplyDecoder, MAX_DATA_BYTES, MAX_REPLY_LINE};
pub use request::{decode_mux_request, decode_mux_request_eof, encode_mux_request};

/// Largest prompt payload a SUBMIT header may announce (16 MiB, as upstream).
pub const MAX_SUBMIT_BYTES: u64 = 16 << 20;
/// Largest grammar a SUBMIT header may announce (`gbytes`, 1 MiB, as upstream).
pub const MAX_GRAMMAR_BYTES: u64 = 1 << 20;
/// Largest announced body (`bytes` + `gbytes`) the daemon discards to stay in sync: 64 MiB,
/// four times the largest body a SUBMIT may carry. A count beyond it is no body a client
/// meant to send (a typo, a corrupt header): discarding it would swallow every later frame
/// (`SUBMIT 2 0 99999999999999 8 0 1` would silence the daemon for ever), so such a header is
/// refused at once and the next line is read as the next frame.
pub const MAX_DISCARD_BYTES: u64 = 64 << 20;
/// Largest `logprobs=<k>` extension value (upstream's `COLI_SUBMIT_TOPK_MAX`).
pub const MAX_LOGPROBS: u32 = 32;

/// One request from the client (the gateway, `coli --mux`, a script).
#[derive(Clone, Debug, PartialEq)]
pub enum MuxRequest {
    /// A SUBMIT whose header and framing are valid. The daemon still checks the slot
    /// against `KV_SLOTS`, busy slots, duplicate ids and the tokenized length.
    Submit(Submit),
    /// `STOP <id>`: end that request through the normal DONE path.
    Stop {
        /// A non-zero request id.
        id: u64,
    },
    /// `CANCEL <id>`: end that request with `ERROR <id> CANCELLED` (no DONE).
    Cancel {
        /// A non-zero request id.
        id: u64,
    },
    /// Answer `ERROR <id> <code>`; its bytes (header, and the payload+grammar when the header
    /// announced parseable sizes within bounds) are already consumed, so the stream stays in
    /// sync (a deliberate difference from upstream, which re-reads the payload as commands).
    Rejected(MuxRejected),
}

/// A valid SUBMIT frame.
#[derive(Clone, Debug, PartialEq)]
pub struct Submit {
    /// Non-zero; unique among the requests in flight (the daemon's check).
    pub id: u64,
    /// KV slot, `0..=2^31-1` here; below `KV_SLOTS` is the daemon's check.
    pub slot: u32,
    /// At least 1 (the daemon clamps it to the slot's room).
    pub max_tokens: u32,
    /// In `[0, 2]` (checked as upstream's `float`, see the README).
    pub temperature: f64,
    /// In `(0, 1]` (checked as upstream's `float`).
    pub top_p: f64,
    /// The fully rendered prompt (the client owns the chat template in mux mode); never
    /// contains NUL.
    pub payload: Vec<u8>,
    /// The `gbytes` bytes after the payload (GBNF or JSON Schema); `None` when `gbytes` is 0
    /// or absent.
    pub grammar: Option<Vec<u8>>,
    /// `logprobs=<0..=32>` extension (`None`: key absent).
    pub logprobs: Option<u32>,
    /// `ids=1` extension: the payload is ASCII decimal token ids.
    pub ids: bool,
}

/// A request the daemon answers with `ERROR <id> <code>`, its bytes already consumed.
#[derive(Clone, Debug, PartialEq)]
pub struct MuxRejected {
    /// The id to answer with: 0 for a header that fails to parse, an unknown command or a
    /// STOP/CANCEL with a bad id (as upstream); the SUBMIT's id for BAD_FRAME and NUL.
    pub id: u64,
    /// [`ErrorCode::BadRequest`] or [`ErrorCode::BadFrame`] from the decoder.
    pub code: ErrorCode,
    /// One line for stderr naming the broken rule and the allowed range.
    pub reason: String,
    /// The command line, without its `\n`.
    pub line: Vec<u8>,
    /// The payload and grammar bytes consumed after the header (`None`: nothing beyond the
    /// header line was consumed, because its sizes did not parse within bounds).
    pub payload: Option<Vec<u8>>,
}

impl MuxRejected {
    /// Payload and grammar bytes a SUBMIT header announced that were *not* consumed because
    /// its `bytes` or `gbytes` parsed but exceeds [`MAX_SUBMIT_BYTES`] / [`MAX_GRAMMAR_BYTES`]:
    /// the reader discards that many as they arrive (then one `\n`), without buffering
    /// them, so the next frame is read in sync. 0 when the body was consumed, a size did
    /// not parse (then nothing tells where the frame ends) or the sizes add up to more than
    /// [`MAX_DISCARD_BYTES`] (then the next line is the next frame).
    pub fn unread_body(&self) -> u64 {
        if self.payload.is_some() || !self.line.starts_with(b"SUBMIT") {
            return 0;
        }
        let fields: Vec<&[u8]> = self
            .line
            .split(u8::is_ascii_whitespace)
            .filter(|f| !f.is_empty())
            .collect();
        let Some(nbytes) = fields.get(3).and_then(|f| crate::num::parse_u64(f)) else {
            return 0;
        };
        let gbytes = match fields.get(7) {
            None => 0,
            Some(f) => match crate::num::parse_u64(f) {
                Some(g) => g,
                None => return 0,
            },
        };
        let total = nbytes.saturating_add(gbytes);
        if (nbytes <= MAX_SUBMIT_BYTES && gbytes <= MAX_GRAMMAR_BYTES) || total > MAX_DISCARD_BYTES
        {
            return 0;
        }
        total
    }
}

/// The codes of `ERROR <id> <code>`; `Display` writes the wire text (with the arguments of
/// `CONTEXT_EXCEEDED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    /// A header, command or id that breaks a rule; a slot `>= KV_SLOTS`; NUL in the payload.
    BadRequest,
    /// The byte after a SUBMIT's payload (and grammar) is not `\n`.
    BadFrame,
    /// The slot already has a request in flight.
    SlotBusy,
    /// The id already names a request in flight.
    DuplicateId,
    /// The prompt tokenizes to nothing.
    EmptyPrompt,
    /// The prompt does not fit: `CONTEXT_EXCEEDED <tokens> <limit>` (limit = CTX-2).
    ContextExceeded {
        /// Prompt tokens (upstream: at least this many; tokenizing stops at the limit).
        tokens: u64,
        /// The most prompt tokens a request may have.
        limit: u64,
    },
    /// STOP or CANCEL of an id not in flight.
    NotFound,
    /// The answer to CANCEL (instead of DONE).
    Cancelled,
    /// *ours*: the request failed inside the engine (an expert read failed); the session's
    /// conversation is as it was before the request, and other requests go on.
    EngineError,
}

impl ErrorCode {
    /// The code word alone (`CONTEXT_EXCEEDED` without its arguments).
    pub fn word(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "BAD_REQUEST",
            ErrorCode::BadFrame => "BAD_FRAME",
            ErrorCode::SlotBusy => "SLOT_BUSY",
            ErrorCode::DuplicateId => "DUPLICATE_ID",
            ErrorCode::EmptyPrompt => "EMPTY_PROMPT",
            ErrorCode::ContextExceeded { .. } => "CONTEXT_EXCEEDED",
            ErrorCode::NotFound => "NOT_FOUND",
            ErrorCode::Cancelled => "CANCELLED",
            ErrorCode::EngineError => "ENGINE_ERROR",
        }
    }

    /// Parses the words after `ERROR <id>`; `None` for an unknown code or missing arguments.
    /// Words after the documented ones are ignored (forward-compatible).
    fn parse(words: &[&[u8]]) -> Option<ErrorCode> {
        use crate::num::parse_u64;
        Some(match *words.first()? {
            b"BAD_REQUEST" => ErrorCode::BadRequest,
            b"BAD_FRAME" => ErrorCode::BadFrame,
            b"SLOT_BUSY" => ErrorCode::SlotBusy,
            b"DUPLICATE_ID" => ErrorCode::DuplicateId,
            b"EMPTY_PROMPT" => ErrorCode::EmptyPrompt,
            b"CONTEXT_EXCEEDED" => ErrorCode::ContextExceeded {
                tokens: parse_u64(words.get(1)?)?,
                limit: parse_u64(words.get(2)?)?,
            },
            b"NOT_FOUND" => ErrorCode::NotFound,
            b"CANCELLED" => ErrorCode::Cancelled,
            b"ENGINE_ERROR" => ErrorCode::EngineError,
            _ => return None,
        })
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorCode::ContextExceeded { tokens, limit } => {
                write!(f, "CONTEXT_EXCEEDED {tokens} {limit}")
            }
            other => f.write_str(other.word()),
        }
    }
}

/// One frame of the daemon's stdout in mux mode.
#[derive(Clone, Debug, PartialEq)]
pub enum MuxReply {
    /// `\x01\x01READY\x01\x01\n` (a second one means the daemon restarted).
    Ready,
    /// A bare `STAT` line: the startup `STAT 0 0.00 0.0 <rss>`.
    Stat(Stat),
    /// `ACCEPT <id> <prompt_tokens>`: tokenized and fits, before prefill.
    Accept {
        /// The request.
        id: u64,
        /// Tokens of the prompt.
        prompt_tokens: u64,
    },
    /// `DATA <id> <n>\n<n bytes>\n`: one sampled token's text (raw bytes).
    Data {
        /// The request.
        id: u64,
        /// The token's bytes (may be a partial UTF-8 sequence).
        bytes: Vec<u8>,
    },
    /// `DATA <id> <n> <lp> <k> [<tid> <tlp>]*k\n<n bytes>\n`: a sampled token's text with
    /// its logprobs, for a SUBMIT that asked `logprobs=k` (one frame per token, its bytes
    /// possibly empty while a UTF-8 sequence or a stop string is held back).
    DataLogprobs {
        /// The request.
        id: u64,
        /// The text ready with this token (may be empty or a partial UTF-8 sequence).
        bytes: Vec<u8>,
        /// The token's logprob and its alternatives.
        tail: LogprobTail,
    },
    /// `ECHO <id> <n> <pos> <lp> <k> [<tid> <tlp>]*k\n<n bytes>\n`: the prompt's read-out for a
    /// SUBMIT that asked `logprobs=k`, one frame per prompt token after ACCEPT (position 0,
    /// which nothing predicts, carries `nan 0`).
    Echo {
        /// The request.
        id: u64,
        /// The prompt position, from 0.
        pos: u64,
        /// The prompt token's bytes.
        bytes: Vec<u8>,
        /// Its logprob under the positions before it, and the alternatives.
        tail: LogprobTail,
    },
    /// `DONE <id> STAT <completion> <tok/s> <hit%> <rss> <prompt_tokens> <length_limited>`.
    Done {
        /// The request.
        id: u64,
        /// The 6-field STAT (`stat.prompt` is `Some`); mux tok/s covers decode only.
        stat: Stat,
    },
    /// `ERROR <id> <CODE> [args]`.
    Error {
        /// The request (0 when the request's id could not be read).
        id: u64,
        /// What went wrong.
        code: ErrorCode,
    },
    /// A telemetry line of a known kind (HWINFO, TIERS, EMAP, HITS, PROF on stdout).
    Telemetry(Telemetry),
    /// Any other line (without its `\n`): an unknown kind, or a malformed line of a known
    /// kind. Upstream's rule: ignore unknown kinds.
    Other(Vec<u8>),
}

impl MuxReply {
    /// Appends the exact wire bytes of this reply to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            MuxReply::Ready => out.extend_from_slice(crate::READY),
            MuxReply::Stat(stat) => push_line(out, &stat.to_line()),
            MuxReply::Accept { id, prompt_tokens } => {
                push_line(out, &format!("ACCEPT {id} {prompt_tokens}"))
            }
            MuxReply::Data { id, bytes } => {
                push_line(out, &format!("DATA {id} {}", bytes.len()));
                out.extend_from_slice(bytes);
                out.push(b'\n');
            }
            MuxReply::DataLogprobs { id, bytes, tail } => {
                push_line(out, &format!("DATA {id} {}{tail}", bytes.len()));
                out.extend_from_slice(bytes);
                out.push(b'\n');
            }
            MuxReply::Echo {
                id,
                pos,
                bytes,
                tail,
            } => {
                push_line(out, &format!("ECHO {id} {} {pos}{tail}", bytes.len()));
                out.extend_from_slice(bytes);
                out.push(b'\n');
            }
            MuxReply::Done { id, stat } => push_line(out, &format!("DONE {id} {}", stat.to_line())),
            MuxReply::Error { id, code } => push_line(out, &format!("ERROR {id} {code}")),
            MuxReply::Telemetry(t) => t.encode(out),
            MuxReply::Other(line) => {
                out.extend_from_slice(line);
                out.push(b'\n');
            }
        }
    }

    /// The wire bytes of this reply.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out);
        out
    }
}

/// The numeric tail of a logprobs frame: the token's log-probability under the whole
/// vocabulary's log-softmax and the `k` most likely tokens with theirs, most likely first.
/// A `logprob` of NaN with no alternatives is upstream's `nan 0`, the first prompt position
/// of a read-out, which nothing predicts.
#[derive(Clone, Debug, PartialEq)]
pub struct LogprobTail {
    /// The token's log-probability (NaN: nothing predicts it).
    pub logprob: f32,
    /// `(token id, log-probability)`, most likely first.
    pub top: Vec<(u32, f32)>,
}

impl LogprobTail {
    /// The tail of a position nothing predicts (`nan 0`).
    pub fn unpredicted() -> LogprobTail {
        LogprobTail {
            logprob: f32::NAN,
            top: Vec::new(),
        }
    }

    /// `<lp> <k> [<tid> <tlp>]*k` after a frame's other words.
    fn parse(words: &mut dyn Iterator<Item = &[u8]>) -> Option<LogprobTail> {
        let logprob = std::str::from_utf8(words.next()?)
            .ok()?
            .parse::<f32>()
            .ok()?;
        let k = std::str::from_utf8(words.next()?)
            .ok()?
            .parse::<u32>()
            .ok()?;
        if k > MAX_LOGPROBS {
            return None;
        }
        let mut top = Vec::with_capacity(k as usize);
        for _ in 0..k {
            let id = std::str::from_utf8(words.next()?)
                .ok()?
                .parse::<u32>()
                .ok()?;
            let lp = std::str::from_utf8(words.next()?)
                .ok()?
                .parse::<f32>()
                .ok()?;
            top.push((id, lp));
        }
        words
            .next()
            .is_none()
            .then_some(LogprobTail { logprob, top })
    }
}

/// Upstream's bytes (`coli_logprob_tail`): ` %.6f %d` then ` %d %.6f` per alternative, and
/// ` nan 0` for a position nothing predicts.
impl fmt::Display for LogprobTail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.logprob.is_nan() {
            return write!(f, " nan 0");
        }
        write!(f, " {:.6} {}", self.logprob, self.top.len())?;
        for (id, lp) in &self.top {
            write!(f, " {id} {lp:.6}")?;
        }
        Ok(())
    }
}

fn push_line(out: &mut Vec<u8>, line: &str) {
    out.extend_from_slice(line.as_bytes());
    out.push(b'\n');
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_props;
