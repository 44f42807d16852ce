//! Byte-exact request/response transcripts from CONTRACT.md §3.
//!
//! The protocol crate has no engine, so each transcript pairs the request bytes (decoded
//! here) with the reply bytes the daemon must write for it (encoded here from `Reply`
//! values, compared with literal bytes).

use protocol::{
    check_slot, decode_request, decode_request_eof, encode_request, DecodeError, Prompt,
    RejectReason, Rejected, Reply, ReplyDecoder, Request, Stat, Telemetry, Tiers, MAX_PROMPT_BYTES,
};

fn encode_all(replies: &[Reply]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in replies {
        r.encode(&mut out);
    }
    out
}

/// Decodes every request in `stream` (which ends at EOF).
fn decode_all(stream: &[u8]) -> Vec<(Request, usize)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < stream.len() {
        match decode_request_eof(&stream[pos..]) {
            Ok((req, n)) => {
                assert!(n > 0);
                out.push((req, n));
                pos += n;
            }
            Err(e) => panic!("decode error {e:?} at {pos}"),
        }
    }
    out
}

/// The reply the daemon owes a request that gets END + zero STAT.
fn zero_reply(six: bool) -> Vec<u8> {
    let stat = if six {
        Stat::zero6(1.5)
    } else {
        Stat::zero(1.5)
    };
    encode_all(&[
        Reply::End {
            leading_newline: false,
        },
        Reply::Stat(stat),
    ])
}

#[test]
fn startup() {
    let replies = [
        Reply::Ready,
        Reply::Stat(Stat::zero(1.5)),
        Reply::Telemetry(Telemetry::Tiers(Tiers {
            vram_experts: 0,
            ram_experts: 12,
            disk_experts: 244,
            vram_gb: 0.0,
            ram_gb: 3.25,
        })),
    ];
    let bytes = encode_all(&replies);
    assert_eq!(
        bytes,
        b"\x01\x01READY\x01\x01\nSTAT 0 0.00 0.0 1.50\nTIERS 0 12 244 0.00 3.25\n"
    );
    let mut dec = ReplyDecoder::new();
    let mut got = Vec::new();
    dec.decode_chunk(&bytes, &mut got);
    assert_eq!(got, replies);
}

#[test]
fn chat_turn() {
    let (req, n) = decode_request(b"hello there\n").unwrap();
    assert_eq!(req, Request::Chat(b"hello there".to_vec()));
    assert_eq!(n, 12);
    let reply = encode_all(&[
        Reply::Text(b"Hi!".to_vec()),
        Reply::End {
            leading_newline: true,
        },
        Reply::Stat(Stat {
            route: None,
            prefetch: None,
            completion_tokens: 3,
            tok_per_s: 12.345,
            hit_pct: 87.25,
            rss_gb: 1.5,
            prompt: Some((20, false)),
        }),
    ]);
    assert_eq!(
        reply,
        b"Hi!\n\x01\x01END\x01\x01\nSTAT 3 12.35 87.2 1.50 20 0\n"
    );
}

#[test]
fn empty_line_more_reset_unknown() {
    let stream = b"\n\x02MORE\n\x02RESET\n\x02RESET 3\n\x02XYZ a b\n\x02MORE\r\n";
    let got = decode_all(stream);
    let want = [
        (Request::Chat(vec![]), 1),
        (Request::More, 6),
        (Request::Reset { slot: None }, 7),
        (Request::Reset { slot: Some(3) }, 9),
        (Request::Unknown("XYZ a b".into()), 9),
        (Request::More, 7),
    ];
    assert_eq!(got, want);
    // Empty line, RESET: END + 4-field zero STAT.
    assert_eq!(
        zero_reply(false),
        b"\x01\x01END\x01\x01\nSTAT 0 0.00 0.0 1.50\n"
    );
    // MORE: streamed text, `\n` END, 4-field STAT.
    let more = encode_all(&[
        Reply::Text(b" and more".to_vec()),
        Reply::End {
            leading_newline: true,
        },
        Reply::Stat(Stat {
            route: None,
            prefetch: None,
            completion_tokens: 9,
            tok_per_s: 3.0,
            hit_pct: 100.0,
            rss_gb: 12.0,
            prompt: None,
        }),
    ]);
    assert_eq!(
        more,
        b" and more\n\x01\x01END\x01\x01\nSTAT 9 3.00 100.0 12.00\n"
    );
}

#[test]
fn reset_with_bad_slot_is_rejected() {
    for (line, reason) in [
        (
            &b"\x02RESET -1\n"[..],
            RejectReason::Slot { kv_slots: None },
        ),
        (b"\x02RESET x\n", RejectReason::Slot { kv_slots: None }),
        (b"\x02RESET 1 2\n", RejectReason::FieldCount(2)),
    ] {
        let (req, n) = decode_request(line).unwrap();
        assert_eq!(n, line.len());
        match req {
            Request::Rejected(r) => assert_eq!(r.reason, reason),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn prompt_turn() {
    let stream = b"\x02PROMPT 11 64 0.7 0.9 1\nhello\nworld\n\x02MORE\n";
    let (req, n) = decode_request(stream).unwrap();
    assert_eq!(
        req,
        Request::Prompt(Prompt {
            max_tokens: 64,
            temperature: 0.7,
            top_p: 0.9,
            slot: Some(1),
            payload: b"hello\nworld".to_vec(),
        })
    );
    assert_eq!(n, stream.len() - 6);
    assert_eq!(decode_request(&stream[n..]).unwrap(), (Request::More, 6));
    // 4-field header: slot 0.
    let (req, _) = decode_request(b"\x02PROMPT 2 1 0 1\nhi\n").unwrap();
    let Request::Prompt(p) = req else { panic!() };
    assert_eq!((p.slot, p.slot()), (None, 0));
    // Re-encoding gives the same bytes.
    let mut out = Vec::new();
    encode_request(&Request::Prompt(p), &mut out).unwrap();
    assert_eq!(out, b"\x02PROMPT 2 1 0 1\nhi\n");
    // Reply: text, END without the leading `\n`, 6-field STAT.
    let reply = encode_all(&[
        Reply::Text(b"ok".to_vec()),
        Reply::End {
            leading_newline: false,
        },
        Reply::Stat(Stat {
            route: None,
            prefetch: None,
            completion_tokens: 2,
            tok_per_s: 0.125,
            hit_pct: 0.05,
            rss_gb: 2.675,
            prompt: Some((7, true)),
        }),
    ]);
    assert_eq!(reply, b"ok\x01\x01END\x01\x01\nSTAT 2 0.12 0.1 2.67 7 1\n");
}

#[test]
fn prompt_payload_without_trailing_newline() {
    let stream = b"\x02PROMPT 3 1 0.5 0.5\nabc\x02MORE\n";
    let (req, n) = decode_request(stream).unwrap();
    assert!(matches!(req, Request::Prompt(ref p) if p.payload == b"abc"));
    assert_eq!(&stream[n..], b"\x02MORE\n");
    // The byte after the payload decides: until it arrives, the frame is incomplete...
    let frame = b"\x02PROMPT 3 1 0.5 0.5\nabc";
    for end in 0..=frame.len() {
        assert_eq!(decode_request(&frame[..end]), Err(DecodeError::Incomplete));
    }
    // ...except at EOF.
    assert_eq!(decode_request_eof(frame).unwrap().1, frame.len());
    assert_eq!(
        decode_request_eof(&frame[..frame.len() - 1]),
        Err(DecodeError::Incomplete)
    );
}

/// Each bad-header rule: the decoded value, how much was consumed, the reply, and that the
/// next request decodes in sync.
#[test]
fn bad_headers() {
    use RejectReason::*;
    type Case = (&'static [u8], RejectReason, Option<&'static [u8]>);
    let cases: Vec<Case> = vec![
        (
            b"\x02PROMPT 5 64 0.7\nabcde\n",
            FieldCount(3),
            Some(b"abcde"),
        ),
        (
            b"\x02PROMPT 5 64 0.7 0.9 0 9\nabcde\n",
            FieldCount(6),
            Some(b"abcde"),
        ),
        (b"\x02PROMPT\n", FieldCount(0), None),
        (b"\x02PROMPT 16777217 64 0.7 0.9\n", Bytes, None),
        (
            b"\x02PROMPT 99999999999999999999999 64 0.7 0.9\n",
            Bytes,
            None,
        ),
        (b"\x02PROMPT -5 64 0.7 0.9\n", Bytes, None),
        (b"\x02PROMPT abc 64 0.7 0.9\n", Bytes, None),
        (
            b"\x02PROMPT 5 0 0.7 0.9\nabcde\n",
            MaxTokens,
            Some(b"abcde"),
        ),
        (
            b"\x02PROMPT 5 -3 0.7 0.9\nabcde\n",
            MaxTokens,
            Some(b"abcde"),
        ),
        (
            b"\x02PROMPT 5 x 0.7 0.9\nabcde\n",
            MaxTokens,
            Some(b"abcde"),
        ),
        (
            b"\x02PROMPT 5 64 -0.1 0.9\nabcde\n",
            Temperature,
            Some(b"abcde"),
        ),
        (
            b"\x02PROMPT 5 64 2.5 0.9\nabcde\n",
            Temperature,
            Some(b"abcde"),
        ),
        (
            b"\x02PROMPT 5 64 nan 0.9\nabcde\n",
            Temperature,
            Some(b"abcde"),
        ),
        (
            b"\x02PROMPT 5 64 inf 0.9\nabcde\n",
            Temperature,
            Some(b"abcde"),
        ),
        (b"\x02PROMPT 5 64 0.7 0\nabcde\n", TopP, Some(b"abcde")),
        (b"\x02PROMPT 5 64 0.7 1.5\nabcde\n", TopP, Some(b"abcde")),
        (b"\x02PROMPT 5 64 0.7 nan\nabcde\n", TopP, Some(b"abcde")),
        (
            b"\x02PROMPT 5 64 0.7 0.9 -1\nabcde\n",
            Slot { kv_slots: None },
            Some(b"abcde"),
        ),
        (
            b"\x02PROMPT 5 64 0.7 0.9\nab\0de\n",
            NulInPayload,
            Some(b"ab\0de"),
        ),
        // The payload may itself look like commands: it is skipped all the same.
        (
            b"\x02PROMPT 6 0 0.7 0.9\n\x02RESET\n",
            MaxTokens,
            Some(b"\x02RESET"),
        ),
    ];
    for (frame, reason, payload) in cases {
        let mut stream = frame.to_vec();
        stream.extend_from_slice(b"\x02MORE\n");
        let (req, n) = decode_request(&stream).unwrap();
        let Request::Rejected(Rejected {
            line,
            reason: got_reason,
            payload: got_payload,
        }) = req
        else {
            panic!("{frame:?} decoded as {req:?}");
        };
        assert_eq!(got_reason, reason, "{frame:?}");
        assert_eq!(got_payload.as_deref(), payload, "{frame:?}");
        assert_eq!(n, frame.len(), "{frame:?} consumed {n}");
        assert_eq!(
            &line[..],
            &frame[1..frame.iter().position(|&b| b == b'\n').unwrap()]
        );
        assert_eq!(decode_request(&stream[n..]).unwrap(), (Request::More, 6));
        // Re-encoding reproduces the frame byte for byte.
        let mut out = Vec::new();
        encode_request(
            &Request::Rejected(Rejected {
                line,
                reason,
                payload: got_payload,
            }),
            &mut out,
        )
        .unwrap();
        assert_eq!(out, frame);
    }
    // The reply to every one of them.
    assert_eq!(
        zero_reply(true),
        b"\x01\x01END\x01\x01\nSTAT 0 0.00 0.0 1.50 0 0\n"
    );
}

#[test]
fn limits_are_inclusive() {
    let max = MAX_PROMPT_BYTES as usize;
    let mut stream = format!("\x02PROMPT {max} 1 2 1 0\n").into_bytes();
    stream.resize(stream.len() + max, b'a');
    stream.push(b'\n');
    let (req, n) = decode_request(&stream).unwrap();
    assert_eq!(n, stream.len());
    let Request::Prompt(p) = req else { panic!() };
    assert_eq!((p.payload.len(), p.temperature, p.top_p), (max, 2.0, 1.0));
    let (req, _) = decode_request(b"\x02PROMPT 0 2147483647 0 0.000001 2147483647\n\n").unwrap();
    assert!(
        matches!(req, Request::Prompt(p) if p.max_tokens == i32::MAX as u32 && p.payload.is_empty())
    );
    let (req, _) = decode_request(b"\x02PROMPT 0 2147483648 0 1\n\n").unwrap();
    assert!(matches!(req, Request::Rejected(r) if r.reason == RejectReason::MaxTokens));
}

#[test]
fn an_oversized_prompt_names_the_bytes_to_discard() {
    let unread = |wire: &[u8]| match decode_request(wire).unwrap() {
        (Request::Rejected(r), used) => {
            assert_eq!(used, wire.len(), "only the header is consumed");
            r.unread_payload()
        }
        (other, _) => panic!("{other:?}"),
    };
    let over = MAX_PROMPT_BYTES + 1;
    assert_eq!(
        unread(format!("\x02PROMPT {over} 1 0 1\n").as_bytes()),
        over
    );
    // A count that does not parse, or is within bounds, leaves nothing to discard.
    assert_eq!(unread(b"\x02PROMPT 5x 1 0 1\n"), 0);
    let (req, _) = decode_request(b"\x02PROMPT 2 0 0 1\nab\n").unwrap();
    assert!(matches!(req, Request::Rejected(r) if r.unread_payload() == 0));
}

#[test]
fn slot_range_is_the_daemons_check() {
    assert_eq!(check_slot(0, 1), Ok(()));
    assert_eq!(check_slot(3, 4), Ok(()));
    assert_eq!(
        check_slot(4, 4),
        Err(RejectReason::Slot { kv_slots: Some(4) })
    );
    assert_eq!(
        RejectReason::Slot { kv_slots: Some(4) }.to_string(),
        "slot must be in 0..=3 (--kv-slots 4)"
    );
}

#[test]
fn chat_encoding_refuses_to_break_framing() {
    let mut out = Vec::new();
    assert!(encode_request(&Request::Chat(b"a\nb".to_vec()), &mut out).is_err());
    assert!(encode_request(&Request::Chat(b"\x02MORE".to_vec()), &mut out).is_err());
    assert!(out.is_empty());
    assert_eq!(
        Request::chat_from_text("two\nlines\r\n")
            .to_bytes()
            .unwrap(),
        b"two lines  \n"
    );
}

#[test]
fn full_session_reply_stream() {
    let stream: &[u8] = b"== banner upstream prints ==\n\x01\x01READY\x01\x01\nSTAT 0 0.00 0.0 1.50\nTIERS 0 12 244 0.00 3.25\nHi\x01 there \xff\xfe\n\x01\x01END\x01\x01\nSTAT 4 5.00 50.0 1.50 9 0\n";
    let mut dec = ReplyDecoder::new();
    let mut got = Vec::new();
    dec.decode_chunk(stream, &mut got);
    got.extend(dec.finish());
    assert_eq!(
        got,
        [
            Reply::Ready,
            Reply::Stat(Stat::zero(1.5)),
            Reply::Telemetry(Telemetry::Tiers(Tiers {
                vram_experts: 0,
                ram_experts: 12,
                disk_experts: 244,
                vram_gb: 0.0,
                ram_gb: 3.25
            })),
            Reply::Text(b"Hi\x01 there \xff\xfe".to_vec()),
            Reply::End {
                leading_newline: true
            },
            Reply::Stat(Stat {
                route: None,
                prefetch: None,
                completion_tokens: 4,
                tok_per_s: 5.0,
                hit_pct: 50.0,
                rss_gb: 1.5,
                prompt: Some((9, false))
            }),
        ]
    );
}
