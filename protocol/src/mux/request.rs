//! Decoding and encoding the client's mux requests (SUBMIT, STOP, CANCEL).
//!
//! Upstream parses a SUBMIT header with `sscanf` (`c/decode_batch.h` `coli_submit_parse`)
//! and a STOP/CANCEL id with `sscanf("%llu %c")`; the rules below are those, over fields
//! separated by ASCII whitespace. A header that fails is a *value*
//! ([`MuxRequest::Rejected`]), and its payload is consumed whenever its sizes parse, so the
//! next request decodes in sync.

use crate::num::{parse_f64, parse_i64, parse_u64};
use crate::request::{too_long, MAX_LINE_BYTES};
use crate::DecodeError;

use super::{
    ErrorCode, MuxRejected, MuxRequest, Submit, MAX_GRAMMAR_BYTES, MAX_LOGPROBS, MAX_SUBMIT_BYTES,
};

/// Decodes one request from the front of `buf`.
///
/// `Ok((request, consumed))`: drop `consumed` bytes (always at least 1) and call again.
/// `Err(Incomplete)`: read more and call again with the longer buffer. `Err(Malformed)`: no
/// `\n` within [`MAX_LINE_BYTES`]; stop reading, as at EOF. Never panics.
///
/// A SUBMIT is complete only once the byte after its payload and grammar is known (it must
/// be `\n`); at EOF use [`decode_mux_request_eof`].
pub fn decode_mux_request(buf: &[u8]) -> Result<(MuxRequest, usize), DecodeError> {
    decode(buf, false)
}

/// Like [`decode_mux_request`], for the bytes left once input has reached EOF: a last line
/// without `\n` is a request (as upstream's `getline`), and a SUBMIT whose payload ends the
/// stream is `BAD_FRAME` (upstream's `fgetc` finds EOF, not `\n`). A payload cut short is
/// still `Incomplete`: upstream treats it as the end of input, and so should the daemon.
pub fn decode_mux_request_eof(buf: &[u8]) -> Result<(MuxRequest, usize), DecodeError> {
    decode(buf, true)
}

fn decode(buf: &[u8], eof: bool) -> Result<(MuxRequest, usize), DecodeError> {
    let (line, header_len) = match buf.iter().position(|&b| b == b'\n') {
        Some(i) if i > MAX_LINE_BYTES => return Err(too_long()),
        Some(i) => (&buf[..i], i + 1),
        None if buf.len() > MAX_LINE_BYTES => return Err(too_long()),
        None if eof && !buf.is_empty() => (buf, buf.len()),
        None => return Err(DecodeError::Incomplete),
    };
    // Upstream matches these prefixes with `strncmp`, space included.
    if let Some(arg) = line.strip_prefix(b"STOP ") {
        return Ok((control(line, arg, |id| MuxRequest::Stop { id }), header_len));
    }
    if let Some(arg) = line.strip_prefix(b"CANCEL ") {
        return Ok((
            control(line, arg, |id| MuxRequest::Cancel { id }),
            header_len,
        ));
    }
    let fields: Vec<&[u8]> = line
        .split(u8::is_ascii_whitespace)
        .filter(|f| !f.is_empty())
        .collect();
    // The command word must start the line (upstream's `sscanf("SUBMIT ...")` matches the
    // literal at byte 0).
    if fields.first() != Some(&&b"SUBMIT"[..]) || !line.starts_with(b"SUBMIT") {
        let word = String::from_utf8_lossy(fields.first().copied().unwrap_or(b""));
        let reason = format!("unknown command {word:?}: wants SUBMIT, STOP or CANCEL");
        return Ok((
            reject(0, ErrorCode::BadRequest, reason, line, None),
            header_len,
        ));
    }
    let rest = &buf[header_len..];
    let (req, used) = decode_submit(line, &fields[1..], rest, eof)?;
    Ok((req, header_len + used))
}

fn reject(
    id: u64,
    code: ErrorCode,
    reason: String,
    line: &[u8],
    payload: Option<Vec<u8>>,
) -> MuxRequest {
    MuxRequest::Rejected(MuxRejected {
        id,
        code,
        reason,
        line: line.to_vec(),
        payload,
    })
}

/// `STOP <id>` / `CANCEL <id>`: exactly one unsigned, non-zero integer.
fn control(line: &[u8], arg: &[u8], make: impl Fn(u64) -> MuxRequest) -> MuxRequest {
    let mut words = arg.split(u8::is_ascii_whitespace).filter(|w| !w.is_empty());
    match (words.next().and_then(parse_u64), words.next()) {
        (Some(id), None) if id > 0 => make(id),
        _ => {
            let cmd = if line.starts_with(b"STOP") {
                "STOP"
            } else {
                "CANCEL"
            };
            let reason = format!("{cmd} wants one id, an integer in 1..={}", u64::MAX);
            reject(0, ErrorCode::BadRequest, reason, line, None)
        }
    }
}

/// The SUBMIT header is consumed; `fields` are the words after `SUBMIT`, `rest` the bytes
/// after the header line. Returns the request and how many bytes of `rest` belong to it.
fn decode_submit(
    line: &[u8],
    fields: &[&[u8]],
    rest: &[u8],
    eof: bool,
) -> Result<(MuxRequest, usize), DecodeError> {
    let checked = check_header(fields);
    // The sizes decide the framing, whatever else is wrong with the header.
    let Some((nbytes, gbytes)) = framing(fields) else {
        let reason = checked.err().unwrap_or_default();
        return Ok((reject(0, ErrorCode::BadRequest, reason, line, None), 0));
    };
    let total = nbytes + gbytes; // both bounded, so this fits easily
    if rest.len() < total || (rest.len() == total && !eof) {
        return Err(DecodeError::Incomplete);
    }
    let body = rest[..total].to_vec();
    let newline = rest.get(total) == Some(&b'\n');
    let header = match checked {
        Ok(h) => h,
        Err(reason) => {
            let used = total + usize::from(newline);
            return Ok((
                reject(0, ErrorCode::BadRequest, reason, line, Some(body)),
                used,
            ));
        }
    };
    if !newline {
        // Upstream answers BAD_FRAME and stops reading; here the byte stays in the stream
        // as the start of the next line (README: "what differs from upstream").
        let reason = match rest.get(total) {
            Some(b) => format!("byte 0x{b:02x} after the SUBMIT payload, wants \\n"),
            None => "input ended right after the SUBMIT payload, wants \\n".to_string(),
        };
        return Ok((
            reject(header.id, ErrorCode::BadFrame, reason, line, Some(body)),
            total,
        ));
    }
    if body[..nbytes].contains(&0) {
        let reason = "SUBMIT payload contains a NUL byte".to_string();
        return Ok((
            reject(header.id, ErrorCode::BadRequest, reason, line, Some(body)),
            total + 1,
        ));
    }
    let mut payload = body;
    let grammar = (gbytes > 0).then(|| payload.split_off(nbytes));
    let submit = Submit {
        id: header.id,
        slot: header.slot,
        max_tokens: header.max_tokens,
        temperature: header.temperature,
        top_p: header.top_p,
        payload,
        grammar,
        logprobs: header.logprobs,
        ids: header.ids,
    };
    Ok((MuxRequest::Submit(submit), total + 1))
}

/// Payload and grammar sizes when they parse within bounds: field 3 (`bytes`) and, when a
/// seventh field is present, field 7 (`gbytes`).
fn framing(fields: &[&[u8]]) -> Option<(usize, usize)> {
    let nbytes = parse_u64(fields.get(2)?).filter(|&n| n <= MAX_SUBMIT_BYTES)?;
    let gbytes = match fields.get(6) {
        None => 0,
        Some(f) => parse_u64(f).filter(|&n| n <= MAX_GRAMMAR_BYTES)?,
    };
    // Both are at most 16 MiB, so they fit a usize on every target.
    Some((nbytes as usize, gbytes as usize))
}

/// A SUBMIT header's checked values.
struct Header {
    id: u64,
    slot: u32,
    max_tokens: u32,
    temperature: f64,
    top_p: f64,
    logprobs: Option<u32>,
    ids: bool,
}

/// Checks the words after `SUBMIT` in upstream's order; `Err` is the reason for stderr.
fn check_header(f: &[&[u8]]) -> Result<Header, String> {
    if f.len() < 6 {
        return Err(format!(
            "SUBMIT header has {} fields, wants 6 (id slot bytes max_tokens temperature top_p), \
             7 (+ gbytes) or more (+ key=value)",
            f.len()
        ));
    }
    let id = parse_u64(f[0])
        .filter(|&id| id > 0)
        .ok_or_else(|| format!("SUBMIT id must be an integer in 1..={}", u64::MAX))?;
    let slot = parse_i64(f[1])
        .filter(|v| (0..=i64::from(i32::MAX)).contains(v))
        .ok_or_else(|| format!("SUBMIT slot must be an integer in 0..={}", i32::MAX))?
        as u32;
    parse_u64(f[2])
        .filter(|&n| n <= MAX_SUBMIT_BYTES)
        .ok_or_else(|| format!("SUBMIT bytes must be an integer in 0..={MAX_SUBMIT_BYTES}"))?;
    // 0 is checked once the extensions are read: it is a prompt read-out, only with logprobs.
    let max_tokens = parse_i64(f[3])
        .filter(|v| (0..=i64::from(i32::MAX)).contains(v))
        .ok_or_else(|| format!("SUBMIT max_tokens must be an integer in 1..={}", i32::MAX))?
        as u32;
    let temperature = parse_float(f[4], |t| (0.0..=2.0).contains(&t), 0.0, 2.0)
        .ok_or("SUBMIT temperature must be a finite number in [0, 2]")?;
    let top_p = parse_float(f[5], |p| p > 0.0 && p <= 1.0, 0.0, 1.0)
        .ok_or("SUBMIT top_p must be a number in (0, 1]")?;
    if let Some(g) = f.get(6) {
        parse_u64(g)
            .filter(|&n| n <= MAX_GRAMMAR_BYTES)
            .ok_or_else(|| {
                format!("SUBMIT gbytes must be an integer in 0..={MAX_GRAMMAR_BYTES}")
            })?;
    }
    let (logprobs, ids) = check_extensions(f.get(7..).unwrap_or(&[]))?;
    if max_tokens == 0 && !logprobs.is_some_and(|k| k > 0) {
        return Err(format!(
            "SUBMIT max_tokens must be an integer in 1..={} (0 reads the prompt out, with logprobs=<1..={MAX_LOGPROBS}> only)",
            i32::MAX
        ));
    }
    Ok(Header {
        id,
        slot,
        max_tokens,
        temperature,
        top_p,
        logprobs,
        ids,
    })
}

/// Upstream reads temperature and top_p with `%f` into a C `float` and range-checks that,
/// so the check runs on the value rounded to `f32` (`1e-50` is a top_p of 0, refused;
/// `2.00000001` is a temperature of 2, accepted). The `f64` is kept, clamped into
/// `lo..=hi` (it moves only by less than `f32` rounding).
fn parse_float(field: &[u8], ok: impl Fn(f32) -> bool, lo: f64, hi: f64) -> Option<f64> {
    let v = parse_f64(field)?;
    let single = v as f32;
    (single.is_finite() && ok(single)).then(|| v.clamp(lo, hi))
}

/// `key=value` words after `gbytes` (upstream's `coli_submit_ext`): `logprobs=<0..=32>` and
/// `ids=<0|1>`, each at most once; anything else rejects the frame.
fn check_extensions(words: &[&[u8]]) -> Result<(Option<u32>, bool), String> {
    let mut logprobs = None;
    let mut ids = None;
    for w in words {
        let text = String::from_utf8_lossy(w);
        let (key, value) = match w.iter().position(|&b| b == b'=') {
            Some(i) => (&w[..i], &w[i + 1..]),
            None => return Err(format!("SUBMIT extension {text:?} is not key=value")),
        };
        let value = small_decimal(value)
            .ok_or_else(|| format!("SUBMIT extension {text:?}: the value must be digits"))?;
        let (slot, max) = match key {
            b"logprobs" => (&mut logprobs, MAX_LOGPROBS),
            b"ids" => (&mut ids, 1),
            _ => {
                return Err(format!(
                    "SUBMIT extension {text:?}: unknown key, wants logprobs or ids"
                ))
            }
        };
        if slot.is_some() {
            return Err(format!("SUBMIT extension {text:?}: key given twice"));
        }
        if value > u64::from(max) {
            return Err(format!(
                "SUBMIT extension {text:?}: value must be in 0..={max}"
            ));
        }
        *slot = Some(value as u32);
    }
    Ok((logprobs, ids == Some(1)))
}

/// Digits only (leading zeros allowed, as upstream's digit loop), saturating.
fn small_decimal(v: &[u8]) -> Option<u64> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(v.iter().fold(0u64, |acc, d| {
        acc.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    }))
}

/// Appends the wire bytes of `req` to `out` (the client side: `coli`, tests).
///
/// The encoding is canonical: a SUBMIT has 6 header fields, 7 when it has a grammar, and
/// `gbytes` (0 if no grammar) plus `logprobs=<k>` / `ids=1` when it has extensions; floats
/// are written in Rust's shortest round-trip form, never in exponent notation. A
/// [`MuxRequest::Rejected`] is written back as decoded: its line, `\n`, and its consumed
/// payload followed by `\n` (none after a BAD_FRAME payload, whose next byte was not `\n`).
pub fn encode_mux_request(req: &MuxRequest, out: &mut Vec<u8>) {
    match req {
        MuxRequest::Submit(s) => {
            let mut header = format!(
                "SUBMIT {} {} {} {} {} {}",
                s.id,
                s.slot,
                s.payload.len(),
                s.max_tokens,
                s.temperature,
                s.top_p
            );
            let grammar = s.grammar.as_deref().unwrap_or(&[]);
            if s.grammar.is_some() || s.logprobs.is_some() || s.ids {
                header.push_str(&format!(" {}", grammar.len()));
            }
            if let Some(k) = s.logprobs {
                header.push_str(&format!(" logprobs={k}"));
            }
            if s.ids {
                header.push_str(" ids=1");
            }
            header.push('\n');
            out.extend_from_slice(header.as_bytes());
            out.extend_from_slice(&s.payload);
            out.extend_from_slice(grammar);
            out.push(b'\n');
        }
        MuxRequest::Stop { id } => out.extend_from_slice(format!("STOP {id}\n").as_bytes()),
        MuxRequest::Cancel { id } => out.extend_from_slice(format!("CANCEL {id}\n").as_bytes()),
        MuxRequest::Rejected(r) => {
            out.extend_from_slice(&r.line);
            out.push(b'\n');
            if let Some(payload) = &r.payload {
                out.extend_from_slice(payload);
                if r.code != ErrorCode::BadFrame {
                    out.push(b'\n');
                }
            }
        }
    }
}

impl MuxRequest {
    /// The wire bytes of this request (see [`encode_mux_request`]).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        encode_mux_request(self, &mut out);
        out
    }
}
