//! Requests: what a client writes to the daemon's stdin.
//!
//! | bytes | value |
//! |---|---|
//! | `<text>\n` (not starting with `\x02`) | [`Request::Chat`] |
//! | `\x02PROMPT <bytes> <max_tokens> <temperature> <top_p> [slot]\n<bytes>\n` | [`Request::Prompt`], or [`Request::Rejected`] |
//! | `\x02MORE\n` | [`Request::More`] |
//! | `\x02RESET\n`, `\x02RESET <slot>\n` | [`Request::Reset`] |
//! | `\x02<anything else>\n` | [`Request::Unknown`] |
//!
//! A bad `\x02PROMPT` header is a *value* ([`Request::Rejected`]), not a decode error: the
//! daemon answers it with END + zero STAT and the decoder has already consumed exactly the
//! bytes that belong to it, so the next request decodes in sync.

use std::fmt;

use crate::num::{parse_f64, parse_i64, parse_u64};
use crate::DecodeError;

/// Largest payload a `\x02PROMPT` header may announce (16 MiB, as upstream).
pub const MAX_PROMPT_BYTES: u64 = 16 * 1024 * 1024;

/// Longest line (plain chat line or command header, without its `\n`) the decoder waits
/// for; a longer one is [`MalformedReason::LineTooLong`].
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// One request from the client.
#[derive(Clone, Debug, PartialEq)]
pub enum Request {
    /// A plain line: one user chat turn (bytes without the `\n`; may be empty, may be
    /// invalid UTF-8, is never templated here). The daemon answers an empty one with
    /// END + `STAT 0 0.00 0.0 <rss>`.
    Chat(Vec<u8>),
    /// A valid `\x02PROMPT` request. The slot's upper bound (`--kv-slots`) is the daemon's
    /// to check, with [`check_slot`].
    Prompt(Prompt),
    /// `\x02MORE`: continue the last answer.
    More,
    /// `\x02RESET` (`None`: slot 0) or `\x02RESET <slot>`.
    Reset {
        /// The named slot, if any; the daemon checks it against `--kv-slots` with
        /// [`check_slot`].
        slot: Option<u32>,
    },
    /// A command whose header (or payload) breaks a rule. Answer END +
    /// `STAT 0 0.00 0.0 <rss> 0 0`; its bytes are already consumed.
    Rejected(Rejected),
    /// `\x02<name ...>` that is no known command: the whole line after `\x02` (trailing
    /// whitespace trimmed, lossily UTF-8). Gets a reply (END + zero STAT), never an error.
    Unknown(String),
}

/// A valid `\x02PROMPT` request.
#[derive(Clone, Debug, PartialEq)]
pub struct Prompt {
    /// At least 1 (the daemon clamps it to NGEN).
    pub max_tokens: u32,
    /// Finite, in `[0, 2]`.
    pub temperature: f64,
    /// In `(0, 1]`.
    pub top_p: f64,
    /// The optional fifth header field (`None` means slot 0; kept apart so that encoding
    /// reproduces a 4-field header).
    pub slot: Option<u32>,
    /// Exactly the announced bytes; never contains NUL.
    pub payload: Vec<u8>,
}

impl Prompt {
    /// The KV slot this prompt addresses (0 when the header had no slot field).
    pub fn slot(&self) -> u32 {
        self.slot.unwrap_or(0)
    }
}

/// A rejected command, with everything needed to re-encode it byte for byte.
#[derive(Clone, Debug, PartialEq)]
pub struct Rejected {
    /// The command line after `\x02`, without its `\n` (e.g. `PROMPT 5 0 0.7 0.9`).
    pub line: Vec<u8>,
    /// Why it was rejected.
    pub reason: RejectReason,
    /// The payload consumed after the header: `Some` when the header's byte count parsed as
    /// a number `<= MAX_PROMPT_BYTES` (so those bytes were skipped, a deliberate difference
    /// from upstream), `None` when nothing beyond the header line was consumed.
    pub payload: Option<Vec<u8>>,
}

impl Rejected {
    /// Payload bytes the header announced that were *not* consumed because the count
    /// parsed but exceeds [`MAX_PROMPT_BYTES`]: the reader discards that many as they
    /// arrive (then one `\n`), without buffering them, so the next command is read in
    /// sync. 0 when the payload was consumed or the count did not parse.
    pub fn unread_payload(&self) -> u64 {
        if self.payload.is_some() || !self.line.starts_with(b"PROMPT") {
            return 0;
        }
        self.line
            .split(u8::is_ascii_whitespace)
            .filter(|f| !f.is_empty())
            .nth(1)
            .and_then(parse_u64)
            .filter(|&n| n > MAX_PROMPT_BYTES)
            .unwrap_or(0)
    }
}

/// Why a command was rejected. `Display` gives a one-line message for stderr.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RejectReason {
    /// `\x02PROMPT` needs 4 or 5 fields; this many were given.
    FieldCount(usize),
    /// The byte count is not an unsigned integer or exceeds [`MAX_PROMPT_BYTES`].
    Bytes,
    /// `max_tokens` is not an integer in `1..=2^31-1`.
    MaxTokens,
    /// `temperature` is not a finite number in `[0, 2]`.
    Temperature,
    /// `top_p` is not a number in `(0, 1]`.
    TopP,
    /// The slot field is not an integer in `0..=2^31-1` (or, from [`check_slot`], not below
    /// `--kv-slots`; then `kv_slots` says the bound).
    Slot {
        /// The daemon's `--kv-slots`, when the check came from [`check_slot`].
        kv_slots: Option<u32>,
    },
    /// The payload contains a NUL byte.
    NulInPayload,
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RejectReason::FieldCount(n) => {
                write!(f, "PROMPT header has {n} fields, wants 4 or 5")
            }
            RejectReason::Bytes => write!(
                f,
                "PROMPT byte count is not an integer in 0..={MAX_PROMPT_BYTES}"
            ),
            RejectReason::MaxTokens => write!(f, "max_tokens must be an integer in 1..=2147483647"),
            RejectReason::Temperature => write!(f, "temperature must be a number in 0..=2"),
            RejectReason::TopP => write!(f, "top_p must be in (0, 1]"),
            RejectReason::Slot { kv_slots: Some(n) } => {
                write!(
                    f,
                    "slot must be in 0..={} (--kv-slots {n})",
                    n.saturating_sub(1)
                )
            }
            RejectReason::Slot { kv_slots: None } => write!(f, "slot must be an integer >= 0"),
            RejectReason::NulInPayload => write!(f, "PROMPT payload contains a NUL byte"),
        }
    }
}

impl std::error::Error for RejectReason {}

/// The daemon-side slot check (the protocol crate does not know `--kv-slots`): `Ok` when
/// `slot < kv_slots`, else the reason to log before answering END + zero STAT.
pub fn check_slot(slot: u32, kv_slots: u32) -> Result<(), RejectReason> {
    if slot < kv_slots {
        Ok(())
    } else {
        Err(RejectReason::Slot {
            kv_slots: Some(kv_slots),
        })
    }
}

/// Why the byte stream itself cannot be decoded (see [`DecodeError::Malformed`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MalformedReason {
    /// No `\n` within [`MAX_LINE_BYTES`]: the stream cannot be resynchronised, so the
    /// reader should treat it like EOF.
    LineTooLong,
}

impl fmt::Display for MalformedReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MalformedReason::LineTooLong => {
                write!(f, "request line longer than {MAX_LINE_BYTES} bytes")
            }
        }
    }
}

/// A request that cannot be put on the wire without breaking the framing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EncodeError {
    /// A chat line containing `\n` (replace newlines first, as upstream's client does) or
    /// starting with `\x02` (it would read as a command).
    ChatNotOneLine,
    /// An `Unknown`/`Rejected` line containing `\n`. (A `Rejected` is re-encoded as it was
    /// decoded; one built by hand must keep its header's byte count and payload in step.)
    Inconsistent,
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::ChatNotOneLine => {
                write!(f, "chat text must be one line not starting with \\x02")
            }
            EncodeError::Inconsistent => write!(f, "request cannot be framed as given"),
        }
    }
}

impl std::error::Error for EncodeError {}

/// Decodes one request from the front of `buf`.
///
/// `Ok((request, consumed))`: drop `consumed` bytes and call again. `Err(Incomplete)`: read
/// more and call again with the longer buffer (nothing was consumed). `Err(Malformed)`:
/// the stream is unusable from here (stop reading). Never panics, whatever the bytes.
///
/// A `\x02PROMPT` frame is complete only once the byte after the payload is known (it is
/// consumed when it is `\n`); at EOF use [`decode_request_eof`].
pub fn decode_request(buf: &[u8]) -> Result<(Request, usize), DecodeError> {
    decode(buf, false)
}

/// Like [`decode_request`], for the bytes left once the input has reached EOF: a last line
/// without `\n` is a request (as with upstream's `getline`), and a payload may end the
/// stream without its trailing `\n`. A payload cut short is still `Incomplete`: upstream
/// treats it as the end of input, and so should the daemon.
pub fn decode_request_eof(buf: &[u8]) -> Result<(Request, usize), DecodeError> {
    decode(buf, true)
}

fn decode(buf: &[u8], eof: bool) -> Result<(Request, usize), DecodeError> {
    let (line, mut consumed) = match buf.iter().position(|&b| b == b'\n') {
        Some(i) if i > MAX_LINE_BYTES => return Err(too_long()),
        Some(i) => (&buf[..i], i + 1),
        None if buf.len() > MAX_LINE_BYTES => return Err(too_long()),
        None if eof && !buf.is_empty() => (buf, buf.len()),
        None => return Err(DecodeError::Incomplete),
    };
    let Some(cmd) = line.strip_prefix(b"\x02") else {
        return Ok((Request::Chat(line.to_vec()), consumed));
    };
    let name_end = cmd
        .iter()
        .position(u8::is_ascii_whitespace)
        .unwrap_or(cmd.len());
    let (name, args) = cmd.split_at(name_end);
    let fields: Vec<&[u8]> = args
        .split(u8::is_ascii_whitespace)
        .filter(|f| !f.is_empty())
        .collect();
    let request = match name {
        b"PROMPT" => {
            let rest = &buf[consumed..];
            let (req, used) = decode_prompt(cmd, &fields, rest, eof)?;
            consumed += used;
            req
        }
        b"MORE" if fields.is_empty() => Request::More,
        b"RESET" => match fields.as_slice() {
            [] => Request::Reset { slot: None },
            [slot] => match parse_slot(slot) {
                Some(s) => Request::Reset { slot: Some(s) },
                None => Request::Rejected(Rejected {
                    line: cmd.to_vec(),
                    reason: RejectReason::Slot { kv_slots: None },
                    payload: None,
                }),
            },
            _ => Request::Rejected(Rejected {
                line: cmd.to_vec(),
                reason: RejectReason::FieldCount(fields.len()),
                payload: None,
            }),
        },
        _ => Request::Unknown(String::from_utf8_lossy(cmd.trim_ascii_end()).into_owned()),
    };
    Ok((request, consumed))
}

pub(crate) fn too_long() -> DecodeError {
    DecodeError::Malformed {
        at: MAX_LINE_BYTES,
        reason: MalformedReason::LineTooLong,
    }
}

/// Slot field: `%d`, `>= 0`, so `0..=i32::MAX`.
fn parse_slot(f: &[u8]) -> Option<u32> {
    parse_i64(f)
        .filter(|v| (0..=i64::from(i32::MAX)).contains(v))
        .map(|v| v as u32)
}

/// The header line is already consumed; `rest` follows it. Returns the request and how
/// many bytes of `rest` belong to it.
fn decode_prompt(
    line: &[u8],
    fields: &[&[u8]],
    rest: &[u8],
    eof: bool,
) -> Result<(Request, usize), DecodeError> {
    let reject = |reason, payload| {
        Request::Rejected(Rejected {
            line: line.to_vec(),
            reason,
            payload,
        })
    };
    // The byte count decides the framing, whatever else is wrong with the header.
    let Some(nbytes) = fields
        .first()
        .and_then(|f| parse_u64(f))
        .filter(|&n| n <= MAX_PROMPT_BYTES)
    else {
        let reason = if (4..=5).contains(&fields.len()) {
            RejectReason::Bytes
        } else {
            RejectReason::FieldCount(fields.len())
        };
        return Ok((reject(reason, None), 0));
    };
    let n = nbytes as usize; // <= 16 MiB, fits
    if rest.len() < n || (rest.len() == n && !eof) {
        return Err(DecodeError::Incomplete);
    }
    let payload = rest[..n].to_vec();
    let used = n + usize::from(rest.get(n) == Some(&b'\n'));

    let checked = if (4..=5).contains(&fields.len()) {
        check_fields(fields)
    } else {
        Err(RejectReason::FieldCount(fields.len()))
    };
    let (max_tokens, temperature, top_p, slot) = match checked {
        Ok(values) => values,
        Err(reason) => return Ok((reject(reason, Some(payload)), used)),
    };
    if payload.contains(&0) {
        return Ok((reject(RejectReason::NulInPayload, Some(payload)), used));
    }
    let prompt = Prompt {
        max_tokens,
        temperature,
        top_p,
        slot,
        payload,
    };
    Ok((Request::Prompt(prompt), used))
}

type Fields = (u32, f64, f64, Option<u32>);

/// Checks fields 2..=5 of a header with 4 or 5 fields, in upstream's order.
fn check_fields(fields: &[&[u8]]) -> Result<Fields, RejectReason> {
    let max_tokens = parse_i64(fields[1])
        .filter(|v| (1..=i64::from(i32::MAX)).contains(v))
        .ok_or(RejectReason::MaxTokens)? as u32;
    let temperature = parse_f64(fields[2])
        .filter(|t| (0.0..=2.0).contains(t))
        .ok_or(RejectReason::Temperature)?;
    let top_p = parse_f64(fields[3])
        .filter(|p| *p > 0.0 && *p <= 1.0)
        .ok_or(RejectReason::TopP)?;
    let slot = match fields.get(4) {
        None => None,
        Some(f) => Some(parse_slot(f).ok_or(RejectReason::Slot { kv_slots: None })?),
    };
    Ok((max_tokens, temperature, top_p, slot))
}

/// Appends the wire bytes of `req` to `out`. Numbers are written so that the daemon (and
/// upstream's `sscanf`) reads back the same values: floats in Rust's shortest round-trip
/// decimal form, never in exponent notation. On error nothing is appended.
pub fn encode_request(req: &Request, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    match req {
        Request::Chat(text) => {
            if text.contains(&b'\n') || text.first() == Some(&0x02) {
                return Err(EncodeError::ChatNotOneLine);
            }
            out.extend_from_slice(text);
            out.push(b'\n');
        }
        Request::Prompt(p) => {
            let mut header = format!(
                "\x02PROMPT {} {} {} {}",
                p.payload.len(),
                p.max_tokens,
                p.temperature,
                p.top_p
            );
            if let Some(slot) = p.slot {
                header.push_str(&format!(" {slot}"));
            }
            header.push('\n');
            out.extend_from_slice(header.as_bytes());
            out.extend_from_slice(&p.payload);
            out.push(b'\n');
        }
        Request::More => out.extend_from_slice(b"\x02MORE\n"),
        Request::Reset { slot: None } => out.extend_from_slice(b"\x02RESET\n"),
        Request::Reset { slot: Some(s) } => {
            out.extend_from_slice(format!("\x02RESET {s}\n").as_bytes())
        }
        Request::Rejected(r) => {
            if r.line.contains(&b'\n') {
                return Err(EncodeError::Inconsistent);
            }
            out.push(0x02);
            out.extend_from_slice(&r.line);
            out.push(b'\n');
            if let Some(payload) = &r.payload {
                out.extend_from_slice(payload);
                out.push(b'\n');
            }
        }
        Request::Unknown(line) => {
            if line.contains('\n') {
                return Err(EncodeError::Inconsistent);
            }
            out.push(0x02);
            out.extend_from_slice(line.as_bytes());
            out.push(b'\n');
        }
    }
    Ok(())
}

impl Request {
    /// A chat turn from user text, made safe to frame the way upstream's client does it:
    /// `\n` and `\r` become spaces, and a leading `\x02` becomes a space.
    pub fn chat_from_text(text: &str) -> Request {
        let mut bytes: Vec<u8> = text
            .bytes()
            .map(|b| if b == b'\n' || b == b'\r' { b' ' } else { b })
            .collect();
        if bytes.first() == Some(&0x02) {
            bytes[0] = b' ';
        }
        Request::Chat(bytes)
    }

    /// The wire bytes of this request (see [`encode_request`]).
    pub fn to_bytes(&self) -> Result<Vec<u8>, EncodeError> {
        let mut out = Vec::new();
        encode_request(self, &mut out)?;
        Ok(out)
    }
}
