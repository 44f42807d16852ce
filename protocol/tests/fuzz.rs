//! Seeded mutation fuzzing of the four decoders (legacy and multiplexed, requests and
//! replies), a million cases each for the request decoders: every case is checked not to
//! panic (caught per case), not to allocate beyond what its input holds (a counting
//! allocator: no single allocation past 2x the input plus a small constant, whatever length a
//! header declares), and every refusal to say what it refused. Case counts and time go to
//! stderr (`cargo test -- --nocapture`).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use protocol::mux::{decode_mux_request, decode_mux_request_eof, MuxReplyDecoder, MuxRequest};
use protocol::{decode_request, decode_request_eof, DecodeError, ReplyDecoder, Request};

#[path = "common/fuzzing.rs"]
mod fuzzing;
use fuzzing::{Rng, LARGEST};

/// Bytes that steer decoders into their branches.
const INTERESTING: &[&[u8]] = &[
    b"\x02",
    b"\n",
    b" ",
    b"0",
    b"-1",
    b"16777216",
    b"16777217",
    b"18446744073709551615",
    b"4294967296",
    b"nan",
    b"inf",
    b"1e308",
    b"\x01\x01END\x01\x01\n",
    b"\x01\x01READY\x01\x01\n",
    b"\0",
    b"\xff",
];

/// 1 to 4 edits: byte set, interesting insert, delete, truncate, duplicate tail, splice of
/// another seed.
fn mutate(rng: &mut Rng, seeds: &[&[u8]], mut v: Vec<u8>) -> Vec<u8> {
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(v.len() + 1);
        match rng.below(6) {
            0 if at < v.len() => v[at] = rng.next() as u8,
            1 => {
                let s = INTERESTING[rng.below(INTERESTING.len())];
                v.splice(at..at, s.iter().copied());
            }
            2 if at < v.len() => {
                let n = rng.below(8).min(v.len() - at);
                v.drain(at..at + n);
            }
            3 => v.truncate(at),
            4 => {
                let tail = v[at..].to_vec();
                v.extend_from_slice(&tail);
            }
            _ => {
                let other = seeds[rng.below(seeds.len())];
                let from = rng.below(other.len() + 1);
                v.splice(at..at, other[from..].iter().copied());
            }
        }
    }
    v.truncate(4096);
    v
}

/// Runs `cases` mutated inputs through `check`, each under `catch_unwind` and the allocation
/// bound. Returns the cases run.
fn fuzz(name: &str, seed: u64, cases: usize, seeds: &[&[u8]], check: impl Fn(&[u8])) -> usize {
    let mut rng = Rng(seed | 1);
    let t0 = Instant::now();
    for i in 0..cases {
        let input = if i % 8 == 0 {
            (0..rng.below(64)).map(|_| rng.next() as u8).collect()
        } else {
            let s = seeds[rng.below(seeds.len())];
            mutate(&mut rng, seeds, s.to_vec())
        };
        LARGEST.with(|l| l.set(0));
        let r = catch_unwind(AssertUnwindSafe(|| check(&input)));
        let largest = LARGEST.with(|l| l.get());
        assert!(r.is_ok(), "{name}: case {i} panicked on {input:?}");
        let bound = 2 * input.len() + 8192;
        assert!(
            largest <= bound,
            "{name}: case {i} allocated {largest} bytes at once for {} input bytes: {input:?}",
            input.len()
        );
    }
    eprintln!(
        "fuzz {name}: {cases} cases in {:.2}s",
        t0.elapsed().as_secs_f64()
    );
    cases
}

const LEGACY: &[&[u8]] = &[
    b"hello there\n",
    b"\x02PROMPT 5 12 0.7 0.9\nhello\n",
    b"\x02PROMPT 5 12 0.7 0.9 3\nhello\n",
    b"\x02PROMPT 0 1 0 1\n\n",
    b"\x02MORE\n",
    b"\x02RESET\n",
    b"\x02RESET 2\n",
    b"\x02STATS\n",
    b"\n",
];

fn check_legacy(buf: &[u8]) {
    for eof in [false, true] {
        let got = if eof {
            decode_request_eof(buf)
        } else {
            decode_request(buf)
        };
        match got {
            Ok((req, used)) => {
                assert!(used > 0 && used <= buf.len());
                if let Request::Rejected(r) = req {
                    assert!(!r.reason.to_string().is_empty());
                }
            }
            Err(DecodeError::Incomplete) => {}
            Err(e @ DecodeError::Malformed { .. }) => {
                assert!(e.to_string().contains("malformed request at byte"))
            }
        }
    }
}

#[test]
fn legacy_request_decoder() {
    assert_eq!(
        fuzz("legacy requests", 1, 1_000_000, LEGACY, check_legacy),
        1_000_000
    );
}

const MUX: &[&[u8]] = &[
    b"SUBMIT 1 0 5 12 0.7 0.9\nhello\n",
    b"SUBMIT 7 3 5 12 0 1 4\nhelloroot\n",
    b"SUBMIT 18446744073709551615 511 1 1 2 1\nx\n",
    b"STOP 1\n",
    b"CANCEL 9\n",
    b"\n",
];

fn check_mux(buf: &[u8]) {
    for eof in [false, true] {
        let got = if eof {
            decode_mux_request_eof(buf)
        } else {
            decode_mux_request(buf)
        };
        match got {
            Ok((req, used)) => {
                assert!(used > 0 && used <= buf.len());
                if let MuxRequest::Rejected(r) = req {
                    assert!(!r.reason.is_empty(), "{r:?}");
                }
            }
            Err(DecodeError::Incomplete) => {}
            Err(e @ DecodeError::Malformed { .. }) => {
                assert!(e.to_string().contains("malformed request at byte"))
            }
        }
    }
}

#[test]
fn mux_request_decoder() {
    assert_eq!(
        fuzz("mux requests", 2, 1_000_000, MUX, check_mux),
        1_000_000
    );
}

const REPLIES: &[&[u8]] = &[
    b"\x01\x01READY\x01\x01\nSTAT 0 0.00 0.0 0.12\nTIERS 0 0 24 0.00 0.00\n",
    b"hello\x01\x01END\x01\x01\nSTAT 4 12.00 51.3 0.50 4 1\n",
    b"HITS 2 5 8001\nEMAP 1 2 00bf\n",
];

#[test]
fn legacy_reply_decoder() {
    fuzz("legacy replies", 3, 1_000_000, REPLIES, |b| {
        let mut d = ReplyDecoder::new();
        let mut out = Vec::new();
        d.decode_chunk(b, &mut out);
        out.extend(d.finish());
    });
}

const MUX_REPLIES: &[&[u8]] = &[
    b"\x01\x01READY\x01\x01\nSTAT 0 0.00 0.0 0.12\n",
    b"ACCEPT 1 5\nDATA 1 3\nabc\nDONE 1 STAT 4 12.00 51.3 0.50 4 1\n",
    b"ERROR 3 ENGINE_ERROR\nERROR 0 BAD_REQUEST\n",
];

#[test]
fn mux_reply_decoder() {
    fuzz("mux replies", 4, 1_000_000, MUX_REPLIES, |b| {
        let mut d = MuxReplyDecoder::new();
        let mut out = Vec::new();
        d.decode_chunk(b, &mut out);
        while d.next_reply().is_some() {}
    });
}
