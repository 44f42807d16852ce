//! The mux codec's seeded properties: random requests and replies round trip through encode
//! and decode (whatever the chunking, the decoder staying in sync), and mutated valid frames
//! never panic the decoder and always let it progress.

use super::tests::{decode_stream, stat6};
use super::*;
use crate::telemetry::Tiers;
use crate::DecodeError;

/// xorshift64*: small, seeded, reproducible.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }
    fn id(&mut self) -> u64 {
        match self.below(3) {
            0 => 1 + self.below(10),
            1 => self.next().max(1),
            _ => u64::MAX - self.below(3),
        }
    }
    /// `n / 10^decimals`, exact at that many places.
    fn fixed(&mut self, decimals: i32) -> f64 {
        self.below(100_000) as f64 / 10f64.powi(decimals)
    }
    /// Bytes heavy in protocol-significant ones.
    fn bytes(&mut self, max_len: u64) -> Vec<u8> {
        const ALPHA: &[u8] = b"\x01\x01\n\n\r\0 0123456789.=-SUBMITSTOPCANCELDATADONEERROR\xff";
        let len = self.below(max_len + 1) as usize;
        (0..len)
            .map(|_| {
                if self.chance(4) {
                    self.next() as u8
                } else {
                    ALPHA[self.below(ALPHA.len() as u64) as usize]
                }
            })
            .collect()
    }
}

fn random_submit(rng: &mut Rng) -> Submit {
    let payload = rng.bytes(60).into_iter().map(|b| b.max(1)).collect();
    Submit {
        id: rng.id(),
        slot: rng.below(i32::MAX as u64 + 1) as u32,
        max_tokens: 1 + rng.below(i32::MAX as u64) as u32,
        temperature: match rng.below(3) {
            0 => 0.0,
            1 => 2.0,
            _ => rng.fixed(3).min(2.0),
        },
        top_p: match rng.below(3) {
            0 => 1.0,
            _ => rng.fixed(4).clamp(1e-4, 1.0),
        },
        payload,
        grammar: rng.chance(3).then(|| {
            let mut g = rng.bytes(20);
            g.push(b'g');
            g
        }),
        logprobs: rng.chance(3).then(|| rng.below(33) as u32),
        ids: rng.chance(4),
    }
}

fn random_request(rng: &mut Rng) -> MuxRequest {
    match rng.below(4) {
        0 | 1 => MuxRequest::Submit(random_submit(rng)),
        2 => MuxRequest::Stop { id: rng.id() },
        _ => MuxRequest::Cancel { id: rng.id() },
    }
}

fn random_stat(rng: &mut Rng) -> Stat {
    stat6(
        rng.below(100_000) as u32,
        rng.fixed(2),
        rng.fixed(1),
        rng.fixed(2),
        rng.below(100_000) as u32,
        rng.chance(2),
    )
}

fn random_reply(rng: &mut Rng) -> MuxReply {
    match rng.below(7) {
        0 => MuxReply::Accept {
            id: rng.id(),
            prompt_tokens: rng.below(1 << 20),
        },
        1 | 2 => MuxReply::Data {
            id: rng.id(),
            bytes: rng.bytes(12),
        },
        3 => MuxReply::Done {
            id: rng.id(),
            stat: random_stat(rng),
        },
        4 => {
            let codes = [
                ErrorCode::BadRequest,
                ErrorCode::BadFrame,
                ErrorCode::SlotBusy,
                ErrorCode::DuplicateId,
                ErrorCode::EmptyPrompt,
                ErrorCode::ContextExceeded {
                    tokens: rng.next(),
                    limit: rng.below(1 << 20),
                },
                ErrorCode::NotFound,
                ErrorCode::Cancelled,
            ];
            MuxReply::Error {
                id: rng.id(),
                code: codes[rng.below(8) as usize],
            }
        }
        5 => MuxReply::Telemetry(Telemetry::Tiers(Tiers {
            vram_experts: rng.below(100) as u32,
            ram_experts: rng.below(100) as u32,
            disk_experts: rng.below(100) as u32,
            vram_gb: rng.fixed(2),
            ram_gb: rng.fixed(2),
        })),
        _ => MuxReply::Stat(Stat::zero(rng.fixed(2))),
    }
}

#[test]
fn requests_round_trip_and_stay_in_sync() {
    let mut rng = Rng::new(11);
    let mut stream = Vec::new();
    let mut all = Vec::new();
    for _ in 0..20_000 {
        let req = random_request(&mut rng);
        let bytes = req.to_bytes();
        assert_eq!(
            decode_mux_request(&bytes),
            Ok((req.clone(), bytes.len())),
            "{bytes:?}"
        );
        stream.extend_from_slice(&bytes);
        all.push(req);
    }
    let mut pos = 0;
    for want in &all {
        let (req, n) = decode_mux_request_eof(&stream[pos..]).unwrap();
        assert_eq!(&req, want);
        pos += n;
    }
    assert_eq!(pos, stream.len());
}

#[test]
fn replies_round_trip_whatever_the_chunking() {
    let mut rng = Rng::new(12);
    let replies: Vec<MuxReply> = (0..5_000).map(|_| random_reply(&mut rng)).collect();
    let mut wire = Vec::new();
    for r in &replies {
        r.encode(&mut wire);
    }
    for chunk in [1, 2, 5, 64, 4096, wire.len()] {
        assert_eq!(decode_stream(&wire, chunk), replies, "chunk {chunk}");
    }
    // Random chunk sizes.
    let mut dec = MuxReplyDecoder::new();
    let mut out = Vec::new();
    dec.decode_chunk(crate::READY, &mut out);
    let mut pos = 0;
    while pos < wire.len() {
        let n = (1 + rng.below(40) as usize).min(wire.len() - pos);
        dec.decode_chunk(&wire[pos..pos + n], &mut out);
        pos += n;
    }
    out.extend(dec.finish());
    assert_eq!(out[1..], replies[..]);
}

/// A valid frame with a few random edits: flipped, inserted, deleted bytes, a cut.
fn mutate(rng: &mut Rng, mut bytes: Vec<u8>) -> Vec<u8> {
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(bytes.len() as u64 + 1) as usize;
        match rng.below(5) {
            0 if at < bytes.len() => bytes[at] = rng.next() as u8,
            1 => bytes.insert(at, b" \n0-9x=\0"[rng.below(8) as usize]),
            2 if at < bytes.len() => {
                bytes.remove(at);
            }
            3 => bytes.truncate(at),
            _ => bytes.splice(at..at, rng.bytes(6)).for_each(drop),
        }
    }
    bytes
}

#[test]
fn mutated_frames_never_panic_and_always_progress() {
    let mut rng = Rng::new(13);
    for _ in 0..30_000 {
        let mut stream = Vec::new();
        for _ in 0..1 + rng.below(3) {
            let frame = random_request(&mut rng).to_bytes();
            stream.extend(mutate(&mut rng, frame));
        }
        for eof in [false, true] {
            let mut pos = 0;
            loop {
                let rest = &stream[pos..];
                let got = if eof {
                    decode_mux_request_eof(rest)
                } else {
                    decode_mux_request(rest)
                };
                match got {
                    Ok((_, n)) => {
                        assert!(n > 0 && n <= rest.len(), "{n} of {rest:?}");
                        pos += n;
                    }
                    Err(DecodeError::Incomplete) => break,
                    Err(e) => panic!("{e:?} on {rest:?}"),
                }
            }
            if eof {
                // At EOF only a SUBMIT whose payload is cut short may remain undecoded.
                assert!(
                    pos == stream.len() || stream[pos..].starts_with(b"SUBMIT"),
                    "{stream:?}"
                );
            }
        }
        // The reply decoder over mutated reply frames: never panics, and the chunking does
        // not change what it decodes.
        let mut wire = Vec::new();
        for _ in 0..1 + rng.below(3) {
            let frame = random_reply(&mut rng).to_bytes();
            wire.extend(mutate(&mut rng, frame));
        }
        let whole = decode_stream(&wire, wire.len());
        assert_eq!(decode_stream(&wire, 1), whole, "{wire:?}");
    }
}
