//! Byte transcripts of every mux frame and every rejection followed by a good request; the
//! seeded properties (round trips, a mutation loop over valid frames) are `tests_props.rs`.

use super::*;
use crate::telemetry::{Emap, HwInfo, Tiers};
use crate::DecodeError;

fn submit(id: u64, slot: u32, payload: &[u8]) -> Submit {
    Submit {
        id,
        slot,
        max_tokens: 64,
        temperature: 0.7,
        top_p: 0.9,
        payload: payload.to_vec(),
        grammar: None,
        logprobs: None,
        ids: false,
    }
}

fn decode_one(bytes: &[u8]) -> (MuxRequest, usize) {
    decode_mux_request(bytes).unwrap_or_else(|e| panic!("{e:?} on {bytes:?}"))
}

// ---------------------------------------------------------------- request transcripts

#[test]
fn submit_six_fields() {
    let wire = b"SUBMIT 42 3 18 64 0.7 0.9\nhello\nworld, again\nSTOP 42\n";
    let (req, n) = decode_one(wire);
    assert_eq!(
        req,
        MuxRequest::Submit(submit(42, 3, b"hello\nworld, again"))
    );
    assert_eq!(&wire[n..], b"STOP 42\n");
    assert_eq!(req.to_bytes(), &wire[..n]);
    assert_eq!(decode_one(&wire[n..]), (MuxRequest::Stop { id: 42 }, 8));
}

#[test]
fn submit_with_grammar_and_extensions() {
    let wire = b"SUBMIT 7 0 2 16 0 1 4 logprobs=5 ids=1\n12root\n";
    let (req, n) = decode_mux_request_eof(wire).unwrap();
    let want = Submit {
        max_tokens: 16,
        temperature: 0.0,
        top_p: 1.0,
        grammar: Some(b"root".to_vec()),
        logprobs: Some(5),
        ids: true,
        ..submit(7, 0, b"12")
    };
    assert_eq!((req.clone(), n), (MuxRequest::Submit(want), wire.len()));
    assert_eq!(req.to_bytes(), wire);
    // Upstream's own parser cases (`c/decode_batch.h` self-test).
    let (req, _) = decode_one(b"SUBMIT 42 3 0 64 0.7 0.95\n\n");
    assert!(matches!(req, MuxRequest::Submit(s) if s.id == 42 && s.slot == 3 && s.top_p == 0.95));
    // gbytes 0 with an extension: no grammar; re-encoded the same way.
    let wire = b"SUBMIT 9 1 1 8 0.5 0.5 0 logprobs=0\nx\n";
    let (req, _) = decode_one(wire);
    assert!(matches!(&req, MuxRequest::Submit(s) if s.grammar.is_none() && s.logprobs == Some(0)));
    assert_eq!(req.to_bytes(), wire);
    // Leading zeros in an extension value, tabs and a trailing \r between fields.
    let (req, _) = decode_one(b"SUBMIT 9\t1 1 8 0.5 0.5 0 logprobs=000032 ids=0\r\nx\n");
    assert!(matches!(req, MuxRequest::Submit(s) if s.logprobs == Some(32) && !s.ids));
}

#[test]
fn stop_and_cancel() {
    assert_eq!(decode_one(b"STOP 5\n"), (MuxRequest::Stop { id: 5 }, 7));
    assert_eq!(
        decode_one(b"CANCEL 18446744073709551615\n").0,
        MuxRequest::Cancel { id: u64::MAX }
    );
    // `sscanf("%llu %c")` skips whitespace on both sides of the id.
    assert_eq!(decode_one(b"STOP   5  \r\n").0, MuxRequest::Stop { id: 5 });
    assert_eq!(MuxRequest::Cancel { id: 3 }.to_bytes(), b"CANCEL 3\n");
    // A last line without `\n` at EOF, as `getline` returns it.
    assert_eq!(decode_mux_request(b"STOP 5"), Err(DecodeError::Incomplete));
    assert_eq!(
        decode_mux_request_eof(b"STOP 5"),
        Ok((MuxRequest::Stop { id: 5 }, 6))
    );
    assert_eq!(decode_mux_request_eof(b""), Err(DecodeError::Incomplete));
}

#[test]
fn float_fields_are_checked_as_upstreams_float() {
    let temp = |t: &str| match decode_one(format!("SUBMIT 1 0 0 1 {t} 1\n\n").as_bytes()).0 {
        MuxRequest::Submit(s) => Some(s.temperature),
        _ => None,
    };
    assert_eq!(temp("2"), Some(2.0));
    assert_eq!(temp("2.00000001"), Some(2.0)); // 2.0f after rounding
    assert_eq!(temp("2.001"), None);
    assert_eq!(temp("-0"), Some(0.0));
    assert_eq!(temp("1e0"), Some(1.0));
    assert_eq!(temp("nan"), None);
    assert_eq!(temp("inf"), None);
    let top_p = |p: &str| match decode_one(format!("SUBMIT 1 0 0 1 1 {p}\n\n").as_bytes()).0 {
        MuxRequest::Submit(s) => Some(s.top_p),
        _ => None,
    };
    assert_eq!(top_p("1e-50"), None); // 0.0f
    assert_eq!(top_p("1e-30"), Some(1e-30));
    assert_eq!(top_p("1.00000001"), Some(1.0));
    assert_eq!(top_p("0"), None);
}

#[test]
fn limits_are_inclusive() {
    let n = MAX_SUBMIT_BYTES as usize;
    let mut wire = format!("SUBMIT 1 0 {n} 1 0 1\n").into_bytes();
    wire.resize(wire.len() + n, b'a');
    wire.push(b'\n');
    let (req, used) = decode_one(&wire);
    assert!(matches!(req, MuxRequest::Submit(s) if s.payload.len() == n));
    assert_eq!(used, wire.len());
    let g = MAX_GRAMMAR_BYTES as usize;
    let mut wire = format!("SUBMIT 1 0 0 1 0 1 {g}\n").into_bytes();
    wire.resize(wire.len() + g, b'g');
    wire.push(b'\n');
    let (req, _) = decode_one(&wire);
    assert!(matches!(req, MuxRequest::Submit(s) if s.grammar.as_ref().map(Vec::len) == Some(g)));
    let (req, _) = decode_one(b"SUBMIT 1 2147483647 0 2147483647 0 1\n\n");
    assert!(
        matches!(req, MuxRequest::Submit(s) if s.slot == i32::MAX as u32 && s.max_tokens == i32::MAX as u32)
    );
}

#[test]
fn oversized_sizes_name_the_bytes_to_discard() {
    let unread = |wire: &[u8]| match decode_one(wire) {
        (MuxRequest::Rejected(r), used) => {
            assert_eq!(used, wire.len(), "only the header is consumed");
            r.unread_body()
        }
        (other, _) => panic!("{other:?}"),
    };
    let n = MAX_SUBMIT_BYTES + 1;
    assert_eq!(unread(format!("SUBMIT 1 0 {n} 1 0 1\n").as_bytes()), n);
    let g = MAX_GRAMMAR_BYTES + 1;
    assert_eq!(
        unread(format!("SUBMIT 1 0 5 1 0 1 {g}\n").as_bytes()),
        g + 5
    );
    // A size that does not parse: nothing says where the frame ends.
    assert_eq!(unread(b"SUBMIT 1 0 5x 1 0 1\n"), 0);
    // Beyond any body a client could mean: nothing is discarded, the next line is a frame.
    assert_eq!(
        unread(format!("SUBMIT 1 0 {MAX_DISCARD_BYTES} 1 0 1\n").as_bytes()),
        MAX_DISCARD_BYTES
    );
    let over = MAX_DISCARD_BYTES + 1;
    assert_eq!(unread(format!("SUBMIT 1 0 {over} 1 0 1\n").as_bytes()), 0);
    assert_eq!(unread(b"SUBMIT 2 0 99999999999999 8 0 1\n"), 0);
    assert_eq!(unread(format!("SUBMIT 1 0 {n} 1 0 1 zz\n").as_bytes()), 0);
    // A body that was consumed leaves nothing to discard.
    match decode_one(b"SUBMIT 1 0 2 0 0 1\nab\n").0 {
        MuxRequest::Rejected(r) => assert_eq!(r.unread_body(), 0),
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------- rejections

/// The bad frame's bytes (all consumed), the id and code to answer, the payload consumed.
type RejectionCase = (Vec<u8>, u64, ErrorCode, Option<&'static [u8]>);

fn rejection_cases() -> Vec<RejectionCase> {
    use ErrorCode::{BadFrame, BadRequest};
    let case = |b: &[u8], id, code, p| (b.to_vec(), id, code, p);
    vec![
        case(b"HELLO 1\n", 0, BadRequest, None),
        case(b"\n", 0, BadRequest, None),
        case(b"\r\n", 0, BadRequest, None),
        case(b"STOP\n", 0, BadRequest, None),
        case(b"STOP\t5\n", 0, BadRequest, None), // upstream's strncmp wants "STOP "
        case(b"stop 5\n", 0, BadRequest, None),
        case(b"STOP 0\n", 0, BadRequest, None),
        case(b"STOP -1\n", 0, BadRequest, None),
        case(b"STOP 5 6\n", 0, BadRequest, None),
        case(b"STOP 5x\n", 0, BadRequest, None),
        case(b"CANCEL \n", 0, BadRequest, None),
        case(b"CANCEL 18446744073709551616\n", 0, BadRequest, None),
        case(b" SUBMIT 1 0 0 1 0 1\n", 0, BadRequest, None),
        case(b"SUBMITX 1 0 0 1 0 1\n", 0, BadRequest, None),
        // Header rules; the sizes parse, so the payload is consumed with the header.
        case(b"SUBMIT 0 0 2 5 0.7 0.9\nhi\n", 0, BadRequest, Some(b"hi")),
        case(b"SUBMIT 1 -1 2 5 0.7 0.9\nhi\n", 0, BadRequest, Some(b"hi")),
        case(
            b"SUBMIT 1 2147483648 2 5 0.7 0.9\nhi\n",
            0,
            BadRequest,
            Some(b"hi"),
        ),
        case(b"SUBMIT 1 0 2 0 0.7 0.9\nhi\n", 0, BadRequest, Some(b"hi")),
        case(
            b"SUBMIT 1 0 2 2147483648 0.7 0.9\nhi\n",
            0,
            BadRequest,
            Some(b"hi"),
        ),
        case(b"SUBMIT 1 0 2 5 4 1\nhi\n", 0, BadRequest, Some(b"hi")),
        case(b"SUBMIT 1 0 2 5 nan 1\nhi\n", 0, BadRequest, Some(b"hi")),
        case(b"SUBMIT 1 0 2 5 -0.5 1\nhi\n", 0, BadRequest, Some(b"hi")),
        case(b"SUBMIT 1 0 2 5 1 inf\nhi\n", 0, BadRequest, Some(b"hi")),
        case(b"SUBMIT 1 0 2 5 1 0\nhi\n", 0, BadRequest, Some(b"hi")),
        case(b"SUBMIT 1 0 2 5 1 1.5\nhi\n", 0, BadRequest, Some(b"hi")),
        case(b"SUBMIT 1 0 2 5 0.7\nhi\n", 0, BadRequest, Some(b"hi")),
        case(
            b"SUBMIT 1 0 2 5 0.7 0.9 1 x\nhig\n",
            0,
            BadRequest,
            Some(b"hig"),
        ),
        case(
            b"SUBMIT 1 0 2 5 0.7 0.9 0 foo=1\nhi\n",
            0,
            BadRequest,
            Some(b"hi"),
        ),
        case(
            b"SUBMIT 1 0 2 5 0.7 0.9 0 logprobs=33\nhi\n",
            0,
            BadRequest,
            Some(b"hi"),
        ),
        case(
            b"SUBMIT 1 0 2 5 0.7 0.9 0 logprobs=1 logprobs=1\nhi\n",
            0,
            BadRequest,
            Some(b"hi"),
        ),
        case(
            b"SUBMIT 1 0 2 5 0.7 0.9 0 ids=2\nhi\n",
            0,
            BadRequest,
            Some(b"hi"),
        ),
        case(
            b"SUBMIT 1 0 2 5 0.7 0.9 0 ids=\nhi\n",
            0,
            BadRequest,
            Some(b"hi"),
        ),
        case(
            b"SUBMIT 1 0 2 5 0.7 0.9 0 =1\nhi\n",
            0,
            BadRequest,
            Some(b"hi"),
        ),
        // A header that fails with the byte after its payload not `\n`: that byte stays.
        case(b"SUBMIT 0 0 2 5 0.7 0.9\nhi", 0, BadRequest, Some(b"hi")),
        // Sizes that do not parse within bounds: only the header line is consumed.
        case(b"SUBMIT 1 0 16777217 5 0.7 0.9\n", 0, BadRequest, None),
        case(b"SUBMIT 1 0 x 5 0.7 0.9\n", 0, BadRequest, None),
        case(b"SUBMIT 1 0 0 5 0.7 0.9 1048577\n", 0, BadRequest, None),
        case(b"SUBMIT 1 0 0 5 0.7 0.9 0logprobs=5\n", 0, BadRequest, None),
        case(b"SUBMIT 1 0\n", 0, BadRequest, None),
        case(b"SUBMIT\n", 0, BadRequest, None),
        // A valid header: the request's own id.
        case(
            b"SUBMIT 3 0 3 5 0.7 0.9\na\0b\n",
            3,
            BadRequest,
            Some(b"a\0b"),
        ),
        case(b"SUBMIT 4 0 2 5 0.7 0.9\nhi", 4, BadFrame, Some(b"hi")),
        case(b"SUBMIT 4 0 2 5 0.7 0.9 1\nhig", 4, BadFrame, Some(b"hig")),
        // BAD_FRAME is decided before the NUL check, as upstream.
        case(b"SUBMIT 5 0 2 5 0.7 0.9\n\0\0", 5, BadFrame, Some(b"\0\0")),
    ]
}

/// Each bad frame, then a good request: the bad one is consumed exactly (where the byte
/// after a payload is not `\n`, it is the good request's first byte, left in the stream),
/// and the good one decodes next.
#[test]
fn every_rejection_then_a_good_request_in_sync() {
    let good = MuxRequest::Submit(submit(77, 1, b"next\n"));
    for (bad, id, code, payload) in rejection_cases() {
        let mut stream = bad.clone();
        stream.extend_from_slice(&good.to_bytes());
        let (req, n) = decode_one(&stream);
        let MuxRequest::Rejected(r) = &req else {
            panic!("{bad:?} decoded as {req:?}");
        };
        assert_eq!(
            (r.id, r.code, r.payload.as_deref()),
            (id, code, payload),
            "{bad:?}"
        );
        assert!(!r.reason.is_empty());
        assert_eq!(n, bad.len(), "{bad:?}");
        assert_eq!(decode_one(&stream[n..]).0, good, "after {bad:?}");
        // A rejected frame re-encodes to the bytes it was decoded from (a failed header
        // whose payload is not followed by `\n` gets one: the encoding is canonical).
        if bad.ends_with(b"\n") || code == ErrorCode::BadFrame {
            assert_eq!(req.to_bytes(), bad, "{bad:?}");
        }
    }
}

#[test]
fn bad_frame_at_eof_and_incomplete_payloads() {
    let wire = b"SUBMIT 4 0 2 5 0.7 0.9\nhi";
    assert_eq!(decode_mux_request(wire), Err(DecodeError::Incomplete));
    let (req, n) = decode_mux_request_eof(wire).unwrap();
    assert!(matches!(req, MuxRequest::Rejected(r) if r.code == ErrorCode::BadFrame && r.id == 4));
    assert_eq!(n, wire.len());
    // A payload cut short by EOF: upstream's end of input.
    assert_eq!(
        decode_mux_request_eof(b"SUBMIT 4 0 9 5 0.7 0.9\nhi"),
        Err(DecodeError::Incomplete)
    );
    // Every strict prefix of a stream of valid frames is Incomplete for its first frame.
    let mut stream = MuxRequest::Submit(submit(1, 0, b"ab\ncd")).to_bytes();
    stream.extend_from_slice(b"STOP 1\n");
    let first = decode_one(&stream).1;
    for cut in 0..first {
        assert_eq!(
            decode_mux_request(&stream[..cut]),
            Err(DecodeError::Incomplete),
            "{cut}"
        );
    }
}

#[test]
fn error_codes_display_as_wire_text() {
    let all = [
        (ErrorCode::BadRequest, "BAD_REQUEST"),
        (ErrorCode::BadFrame, "BAD_FRAME"),
        (ErrorCode::SlotBusy, "SLOT_BUSY"),
        (ErrorCode::DuplicateId, "DUPLICATE_ID"),
        (ErrorCode::EmptyPrompt, "EMPTY_PROMPT"),
        (
            ErrorCode::ContextExceeded {
                tokens: 5000,
                limit: 4094,
            },
            "CONTEXT_EXCEEDED 5000 4094",
        ),
        (ErrorCode::NotFound, "NOT_FOUND"),
        (ErrorCode::Cancelled, "CANCELLED"),
    ];
    for (code, text) in all {
        assert_eq!(code.to_string(), text);
        let wire = MuxReply::Error { id: 12, code }.to_bytes();
        assert_eq!(wire, format!("ERROR 12 {text}\n").as_bytes());
        assert_eq!(
            decode_stream(&wire, 1),
            vec![MuxReply::Error { id: 12, code }]
        );
    }
}

// ---------------------------------------------------------------- reply transcripts

pub(super) fn stat6(n: u32, tps: f64, hit: f64, rss: f64, prompt: u32, limited: bool) -> Stat {
    Stat {
        route: None,
        prefetch: None,
        completion_tokens: n,
        tok_per_s: tps,
        hit_pct: hit,
        rss_gb: rss,
        prompt: Some((prompt, limited)),
    }
}

/// Decodes a whole stream (which then ends) fed in chunks of `chunk` bytes.
pub(super) fn decode_stream(stream: &[u8], chunk: usize) -> Vec<MuxReply> {
    let mut dec = MuxReplyDecoder::new();
    dec.feed(crate::READY);
    let mut out = Vec::new();
    assert_eq!(dec.next_reply(), Some(MuxReply::Ready));
    for c in stream.chunks(chunk.max(1)) {
        dec.decode_chunk(c, &mut out);
    }
    out.extend(dec.finish());
    out
}

#[test]
fn startup_handshake() {
    let replies = [
        MuxReply::Ready,
        MuxReply::Stat(Stat::zero(1.5)),
        MuxReply::Telemetry(Telemetry::HwInfo(HwInfo {
            cores: 16,
            ram_total_gb: 64.0,
            ram_avail_gb: 50.5,
            ngpu: 0,
            vram_total_gb: 0.0,
            cpu_name: "AMD Ryzen 9".into(),
            gpu_name: String::new(),
        })),
        MuxReply::Telemetry(Telemetry::Tiers(Tiers {
            vram_experts: 0,
            ram_experts: 12,
            disk_experts: 244,
            vram_gb: 0.0,
            ram_gb: 0.5,
        })),
        MuxReply::Telemetry(Telemetry::Emap(Emap {
            rows: 1,
            cols: 2,
            cells: vec![0x41, 0x00],
        })),
    ];
    let mut wire = Vec::new();
    for r in &replies {
        r.encode(&mut wire);
    }
    assert_eq!(
        wire,
        b"\x01\x01READY\x01\x01\nSTAT 0 0.00 0.0 1.50\n\
          HWINFO 16 64.0 50.5 0 0.0 AMD Ryzen 9|\n\
          TIERS 0 12 244 0.00 0.50\nEMAP 1 2 4100\n"
    );
    // Upstream's banner before READY is skipped.
    let mut dec = MuxReplyDecoder::new();
    let mut out = Vec::new();
    dec.decode_chunk(b"== GLM C engine ==\nloaded in 1.00s\n", &mut out);
    dec.decode_chunk(&wire, &mut out);
    assert_eq!(out, replies);
}

#[test]
fn one_request_transcript() {
    let replies = [
        MuxReply::Accept {
            id: 9,
            prompt_tokens: 12,
        },
        MuxReply::Data {
            id: 9,
            bytes: b"Hel".to_vec(),
        },
        MuxReply::Data {
            id: 9,
            bytes: b"lo\n".to_vec(),
        },
        MuxReply::Data {
            id: 9,
            bytes: vec![0xe2, 0x82],
        }, // half a UTF-8 sequence
        MuxReply::Data {
            id: 9,
            bytes: vec![],
        },
        MuxReply::Done {
            id: 9,
            stat: stat6(4, 2.5, 62.5, 3.25, 12, false),
        },
        MuxReply::Done {
            id: 10,
            stat: stat6(64, 0.125, 0.05, 0.375, 3, true),
        },
    ];
    let mut wire = Vec::new();
    for r in &replies {
        r.encode(&mut wire);
    }
    assert_eq!(
        wire,
        b"ACCEPT 9 12\nDATA 9 3\nHel\nDATA 9 3\nlo\n\nDATA 9 2\n\xe2\x82\nDATA 9 0\n\n\
          DONE 9 STAT 4 2.50 62.5 3.25 12 0\nDONE 10 STAT 64 0.12 0.1 0.38 3 1\n"
    );
    for chunk in [1, 2, 3, 7, 1000] {
        let got = decode_stream(&wire, chunk);
        assert_eq!(got.len(), replies.len());
        assert_eq!(&got[..6], &replies[..6]);
    }
}

#[test]
fn decoder_edge_cases() {
    // Unknown kinds and malformed known kinds are kept as Other; a DATA header announcing
    // too much is a plain line; a DATA tail that reads as logprobs is kept, one that does
    // not is ignored.
    let wire = b"GPUS 0\nACCEPT 1\nDONE x STAT 1 1.00 1.0 1.00 1 0\nERROR 1 WHAT\n\
                 ERROR 1 CONTEXT_EXCEEDED 5\nDATA 1 16777217\nDATA 2 1 -0.5 0\nA\nDATA 4 1 x y\nB\n\
                 TIERS 1 2\n\x01\x01READY\x01\x01\nSTAT 0 0.00 0.0 1.00\nDATA 3 2\nabDONE";
    let got = decode_stream(wire, 5);
    let other = |s: &[u8]| MuxReply::Other(s.to_vec());
    assert_eq!(
        got,
        vec![
            other(b"GPUS 0"),
            other(b"ACCEPT 1"),
            other(b"DONE x STAT 1 1.00 1.0 1.00 1 0"),
            other(b"ERROR 1 WHAT"),
            other(b"ERROR 1 CONTEXT_EXCEEDED 5"),
            other(b"DATA 1 16777217"),
            MuxReply::DataLogprobs {
                id: 2,
                bytes: b"A".to_vec(),
                tail: LogprobTail {
                    logprob: -0.5,
                    top: vec![]
                }
            },
            MuxReply::Data {
                id: 4,
                bytes: b"B".to_vec()
            },
            other(b"TIERS 1 2"),
            MuxReply::Ready,
            MuxReply::Stat(Stat::zero(1.0)),
            // The byte after the payload is not `\n`: it starts the next line.
            MuxReply::Data {
                id: 3,
                bytes: b"ab".to_vec()
            },
            other(b"DONE"),
        ]
    );
    // A DATA payload cut short by EOF.
    assert_eq!(
        decode_stream(b"DATA 1 5\nab", 1),
        vec![other(b"DATA 1 5\nab")]
    );
    // An over-long line comes out in MAX_REPLY_LINE pieces, however it is chunked.
    let long = vec![b'x'; MAX_REPLY_LINE * 2 + 3];
    for chunk in [4096, MAX_REPLY_LINE + 1] {
        let got = decode_stream(&long, chunk);
        let lens: Vec<usize> = got
            .iter()
            .map(|r| match r {
                MuxReply::Other(l) => l.len(),
                _ => usize::MAX,
            })
            .collect();
        assert_eq!(lens, vec![MAX_REPLY_LINE, MAX_REPLY_LINE, 3]);
    }
}

#[test]
fn logprobs_frames_are_upstreams_bytes_and_read_back() {
    let data = MuxReply::DataLogprobs {
        id: 7,
        bytes: b" the".to_vec(),
        tail: LogprobTail {
            logprob: -0.25,
            top: vec![(42, -0.25), (7, -1.5)],
        },
    };
    let echo0 = MuxReply::Echo {
        id: 7,
        pos: 0,
        bytes: b"Hi".to_vec(),
        tail: LogprobTail::unpredicted(),
    };
    let echo1 = MuxReply::Echo {
        id: 7,
        pos: 1,
        bytes: b"\n".to_vec(),
        tail: LogprobTail {
            logprob: -3.0,
            top: vec![(9, -0.125)],
        },
    };
    let mut wire = b"\x01\x01READY\x01\x01\n".to_vec();
    for r in [&echo0, &echo1, &data] {
        r.encode(&mut wire);
    }
    assert_eq!(
        &wire[crate::READY.len()..],
        &b"ECHO 7 2 0 nan 0\nHi\nECHO 7 1 1 -3.000000 1 9 -0.125000\n\n\n\
           DATA 7 4 -0.250000 2 42 -0.250000 7 -1.500000\n the\n"[..]
    );
    for chunk in [1, 3, 1000] {
        let got = decode_stream(&wire, chunk);
        assert_eq!(got.len(), 4);
        // NaN is not equal to itself: compare the bytes again.
        let back: Vec<u8> = got[1..].iter().flat_map(|r| r.to_bytes()).collect();
        assert_eq!(back, &wire[crate::READY.len()..]);
        assert_eq!(got[3], data);
    }
}

#[test]
fn max_tokens_zero_is_a_read_out_and_needs_logprobs() {
    let (req, _) = decode_one(b"SUBMIT 3 0 2 0 0 1 0 logprobs=2\nhi\n");
    assert!(matches!(req, MuxRequest::Submit(s) if s.max_tokens == 0 && s.logprobs == Some(2)));
    for wire in [
        &b"SUBMIT 3 0 2 0 0 1\nhi\n"[..],
        b"SUBMIT 3 0 2 0 0 1 0 logprobs=0\nhi\n",
    ] {
        let (req, _) = decode_one(wire);
        assert!(
            matches!(req, MuxRequest::Rejected(_)),
            "{:?}: {req:?}",
            String::from_utf8_lossy(wire)
        );
    }
}
