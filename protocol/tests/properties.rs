//! Seeded random properties: round trips (`decode(encode(x)) == x`), never-panic fuzzing of
//! both decoders, and chunking invariance of the reply decoder.

use protocol::{
    decode_request, decode_request_eof, encode_request, parse_stat_line, parse_telemetry_line,
    DecodeError, DiskClass, DiskClassFigures, DriveFigures, Emap, EngineState, GrammarEnd, Hits,
    HwInfo, KvSave, Live, Prof, Progress, ProgressPhase, Prompt, Repin, Reply, ReplyDecoder,
    Request, SessionInfo, SessionState, Spec, SpecSource, Stat, Telemetry, Tiers, END, READY,
};

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
    fn u32(&mut self) -> u32 {
        // Mostly small numbers, sometimes the extremes.
        match self.below(4) {
            0 => self.below(10) as u32,
            1 => self.next() as u32,
            2 => u32::MAX - self.below(3) as u32,
            _ => self.below(100_000) as u32,
        }
    }
    fn u64(&mut self) -> u64 {
        match self.below(3) {
            0 => self.below(1000),
            1 => self.next(),
            _ => u64::MAX - self.below(3),
        }
    }
    fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }
    /// A value exactly representable at `decimals` places: `n / 10^decimals`.
    fn fixed(&mut self, decimals: u32) -> f64 {
        let bound = if self.chance(4) { 1 << 40 } else { 100_000 };
        let n = self.below(bound);
        n as f64 / 10f64.powi(decimals as i32)
    }
    /// Bytes from an alphabet heavy in protocol-significant bytes.
    fn bytes(&mut self, max_len: u64) -> Vec<u8> {
        const ALPHA: &[u8] =
            b"\x01\x01\x01\x02\n\n\r\0 0123456789.-ENDREADYSTATPROMPTMORESETIERH|\xff\xc3";
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

fn random_request(rng: &mut Rng) -> Request {
    match rng.below(6) {
        0 => {
            let mut text: Vec<u8> = rng.bytes(40).into_iter().filter(|&b| b != b'\n').collect();
            if text.first() == Some(&0x02) {
                text[0] = b'x';
            }
            Request::Chat(text)
        }
        1 | 2 => {
            let temperature = match rng.below(4) {
                0 => 0.0,
                1 => 2.0,
                2 => rng.fixed(2).min(2.0),
                _ => f64::from_bits(rng.next()).abs() % 2.0,
            };
            let top_p = match rng.below(3) {
                0 => 1.0,
                1 => f64::MIN_POSITIVE,
                _ => (f64::from_bits(rng.next()).abs() % 1.0).max(1e-300),
            };
            let payload = rng
                .bytes(200)
                .into_iter()
                .map(|b| if b == 0 { 1 } else { b })
                .collect();
            Request::Prompt(Prompt {
                max_tokens: 1 + rng.below(i32::MAX as u64) as u32,
                temperature: if temperature.is_nan() {
                    0.5
                } else {
                    temperature
                },
                top_p: if top_p.is_nan() { 0.5 } else { top_p },
                slot: if rng.chance(2) {
                    None
                } else {
                    Some(rng.below(i32::MAX as u64 + 1) as u32)
                },
                payload,
            })
        }
        3 => Request::More,
        4 => Request::Reset {
            slot: if rng.chance(2) {
                None
            } else {
                Some(rng.below(i32::MAX as u64 + 1) as u32)
            },
        },
        _ => {
            // Whatever `\x02<random>` decodes to: Unknown, Rejected, or a known command.
            let mut line = vec![0x02];
            line.extend(rng.bytes(30).into_iter().filter(|&b| b != b'\n'));
            line.push(b'\n');
            line.extend_from_slice(&rng.bytes(30));
            match decode_request_eof(&line) {
                Ok((req, _)) => req,
                Err(_) => Request::More,
            }
        }
    }
}

#[test]
fn requests_round_trip() {
    let mut rng = Rng::new(1);
    let mut stream = Vec::new();
    let mut all = Vec::new();
    for _ in 0..20_000 {
        let req = random_request(&mut rng);
        let mut bytes = Vec::new();
        encode_request(&req, &mut bytes).unwrap();
        // Some frames are complete only once the next byte is known.
        let got = decode_request_eof(&bytes);
        assert_eq!(got, Ok((req.clone(), bytes.len())), "{bytes:?}");
        stream.extend_from_slice(&bytes);
        all.push(req);
    }
    // The same requests back to back decode in sync.
    let mut pos = 0;
    for want in &all {
        let (req, n) = decode_request_eof(&stream[pos..]).unwrap();
        assert_eq!(&req, want);
        pos += n;
    }
    assert_eq!(pos, stream.len());
}

#[test]
fn stat_round_trip() {
    let mut rng = Rng::new(2);
    for _ in 0..20_000 {
        let stat = Stat {
            route: None,
            prefetch: None,
            completion_tokens: rng.u32(),
            tok_per_s: rng.fixed(2),
            hit_pct: rng.fixed(1),
            rss_gb: rng.fixed(2),
            prompt: if rng.chance(2) {
                None
            } else {
                Some((rng.u32(), rng.chance(2)))
            },
        };
        let line = stat.to_line();
        assert_eq!(
            parse_stat_line(line.as_bytes()).as_ref(),
            Some(&stat),
            "{line}"
        );
    }
}

fn random_emap(rng: &mut Rng) -> Emap {
    let (rows, cols) = (rng.below(8) as u32, rng.below(40) as u32);
    let mut m = Emap::new(rows, cols);
    for c in &mut m.cells {
        *c = rng.next() as u8;
    }
    m
}

fn random_hits(rng: &mut Rng) -> Hits {
    let (rows, cols) = (rng.below(8) as u32, rng.below(40) as u32);
    let mut h = Hits::new(rows, cols);
    for b in &mut h.bits {
        *b = rng.next() as u8;
    }
    h
}

fn figures(rng: &mut Rng) -> DiskClassFigures {
    DiskClassFigures {
        count: rng.u64(),
        bytes: rng.u64(),
        thread_s: rng.fixed(3),
        busy_s: rng.fixed(3),
        direct: rng.u64(),
    }
}

fn random_name(rng: &mut Rng, bar_ok: bool) -> String {
    let alpha = if bar_ok {
        "abc XYZ(R)@ 9.|-é"
    } else {
        "abc XYZ(R)@ 9.-é"
    };
    let chars: Vec<char> = alpha.chars().collect();
    (0..rng.below(24))
        .map(|_| chars[rng.below(chars.len() as u64) as usize])
        .collect()
}

fn random_telemetry(rng: &mut Rng, upstream_only: bool) -> Telemetry {
    let kinds = if upstream_only { 5 } else { 15 };
    match rng.below(kinds) {
        0 => Telemetry::HwInfo(HwInfo {
            cores: rng.u32(),
            ram_total_gb: rng.fixed(1),
            ram_avail_gb: rng.fixed(1),
            ngpu: rng.u32(),
            vram_total_gb: rng.fixed(1),
            cpu_name: random_name(rng, false),
            gpu_name: random_name(rng, true),
        }),
        1 => Telemetry::Tiers(Tiers {
            vram_experts: rng.u32(),
            ram_experts: rng.u32(),
            disk_experts: rng.u32(),
            vram_gb: rng.fixed(2),
            ram_gb: rng.fixed(2),
        }),
        2 => Telemetry::Emap(random_emap(rng)),
        3 => Telemetry::Hits(random_hits(rng)),
        4 => Telemetry::Prof(Prof {
            wall_s: rng.fixed(3),
            prompt_tokens: rng.u32(),
            completion_tokens: rng.u32(),
            expert_disk_s: rng.fixed(3),
            expert_wait_s: rng.fixed(3),
            expert_matmul_s: rng.fixed(3),
            attention_s: rng.fixed(3),
            lm_head_s: rng.fixed(3),
            forwards: rng.u64(),
        }),
        5 => Telemetry::Progress(Progress {
            phase: [
                ProgressPhase::Load,
                ProgressPhase::Pin,
                ProgressPhase::Prefill,
            ][rng.below(3) as usize],
            done: rng.u64(),
            total: rng.u64(),
        }),
        6 => Telemetry::Live(Live {
            tokens: rng.u32(),
            tok_per_s: rng.fixed(2),
            hit_pct: rng.fixed(1),
            rss_gb: rng.fixed(2),
            slot: rng.u32(),
            tokens_per_forward: (rng.below(2) == 1).then(|| rng.fixed(2)),
        }),
        7 => Telemetry::Repin(Repin {
            layer: rng.u32(),
            evicted: rng.u32(),
            evicted_heat: rng.u32(),
            admitted: rng.u32(),
            admitted_heat: rng.u32(),
            ms: rng.fixed(1),
        }),
        8 => Telemetry::DiskClass(DiskClass {
            cold: figures(rng),
            warm: figures(rng),
            drives: (0..rng.below(3))
                .map(|_| DriveFigures {
                    reads: rng.u64(),
                    bytes: rng.u64(),
                    thread_s: rng.fixed(3),
                    busy_s: rng.fixed(3),
                    failed: rng.u64(),
                })
                .collect(),
        }),
        9 => Telemetry::State(
            [
                EngineState::Loading,
                EngineState::Idle,
                EngineState::Prefill,
                EngineState::Generating,
            ][rng.below(4) as usize],
        ),
        10 => Telemetry::Sessions(
            (0..rng.below(5))
                .map(|_| SessionInfo {
                    slot: rng.u32(),
                    state: [
                        SessionState::Idle,
                        SessionState::Prefill,
                        SessionState::Decode,
                    ][rng.below(3) as usize],
                    id: rng.u64(),
                    ctx_tokens: rng.u64(),
                    generated: rng.u64(),
                })
                .collect(),
        ),
        11 => {
            let mut source = || {
                let proposed = rng.u64();
                SpecSource {
                    proposed,
                    accepted: rng.below(proposed.saturating_add(1)),
                }
            };
            let (mtp, ngram, grammar) = (source(), source(), source());
            Telemetry::Spec(Spec {
                slot: rng.u32(),
                tokens: rng.u64(),
                forwards: rng.u64(),
                max_draft: rng.u32(),
                drafting_forwards: rng.u64(),
                mtp,
                ngram,
                grammar,
            })
        }
        12 => Telemetry::KvSave(KvSave {
            slot: rng.u32(),
            // The reason runs to the line's end; the parser drops the spaces before it.
            reason: random_name(rng, true).trim_start().to_string(),
        }),
        13 => Telemetry::Grammar(GrammarEnd {
            id: rng.u64(),
            complete: rng.below(2) == 1,
        }),
        _ => Telemetry::Unknown(format!("GPUS {} {}", rng.u32(), random_name(rng, true))),
    }
}

#[test]
fn telemetry_round_trip() {
    let mut rng = Rng::new(3);
    for _ in 0..30_000 {
        let t = random_telemetry(&mut rng, false);
        let mut bytes = Vec::new();
        t.encode(&mut bytes);
        assert_eq!(bytes.last(), Some(&b'\n'));
        assert_eq!(bytes.iter().filter(|&&b| b == b'\n').count(), 1);
        assert_eq!(
            parse_telemetry_line(&bytes).as_ref(),
            Some(&t),
            "{}",
            t.to_line()
        );
        // Without the line end, and with a CRLF, too.
        assert_eq!(
            parse_telemetry_line(t.to_line().as_bytes()).as_ref(),
            Some(&t)
        );
        // Extra trailing fields are ignored (forward compatibility), except where the last
        // field is free text.
        // (An empty EMAP/HITS hex field followed by more fields is ambiguous.)
        let empty_hex = matches!(&t, Telemetry::Emap(m) if m.cells.is_empty())
            || matches!(&t, Telemetry::Hits(h) if h.bits.is_empty());
        // HWINFO's names and KVSAVE's reason are free text to the line's end.
        let free_text = matches!(
            t,
            Telemetry::HwInfo(_) | Telemetry::KvSave(_) | Telemetry::Unknown(_)
        );
        if !empty_hex && !free_text {
            let extended = format!("{} 1.5 extra=1", t.to_line());
            // A LIVE line without its optional tokens/forward reads the next field as it:
            // that is how the field was added.
            let mut expected = t.clone();
            if let Telemetry::Live(l) = &mut expected {
                l.tokens_per_forward.get_or_insert(1.5);
            }
            assert_eq!(
                parse_telemetry_line(extended.as_bytes()).as_ref(),
                Some(&expected)
            );
        }
    }
}

#[test]
fn emap_hits_helpers() {
    let mut rng = Rng::new(4);
    for _ in 0..2_000 {
        let (rows, cols) = (1 + rng.below(6) as u32, 1 + rng.below(70) as u32);
        let mut m = Emap::new(rows, cols);
        let mut h = Hits::new(rows, cols);
        let mut want = vec![(0u8, 0u8, false); (rows * cols) as usize];
        for _ in 0..50 {
            let (r, e) = (rng.below(rows as u64) as u32, rng.below(cols as u64) as u32);
            let (tier, heat) = (rng.below(3) as u8, rng.below(64) as u8);
            m.set(r, e, tier, heat);
            h.set(r, e);
            want[(r * cols + e) as usize] = (tier, heat, true);
        }
        let m2 = match parse_telemetry_line(Telemetry::Emap(m.clone()).to_line().as_bytes()) {
            Some(Telemetry::Emap(m2)) => m2,
            other => panic!("{other:?}"),
        };
        let h2 = match parse_telemetry_line(Telemetry::Hits(h.clone()).to_line().as_bytes()) {
            Some(Telemetry::Hits(h2)) => h2,
            other => panic!("{other:?}"),
        };
        assert_eq!((&m2, &h2), (&m, &h));
        for r in 0..rows {
            for e in 0..cols {
                let (tier, heat, hit) = want[(r * cols + e) as usize];
                assert_eq!(m2.tier(r, e), Some(tier));
                assert_eq!(m2.heat(r, e), Some(heat));
                assert_eq!(h2.hit(r, e), Some(hit));
            }
        }
        assert_eq!(m2.tier(rows, 0), None);
        assert_eq!(h2.hit(0, cols), None);
    }
    // Bit order: bit index row*cols+e, LSB first.
    let mut h = Hits::new(2, 5);
    h.set(1, 2); // index 7
    h.set(1, 3); // index 8
    assert_eq!(Telemetry::Hits(h).to_line(), "HITS 2 5 8001");
    let mut m = Emap::new(1, 2);
    m.set(0, 1, 2, 63);
    assert_eq!(Telemetry::Emap(m).to_line(), "EMAP 1 2 00bf");
    assert_eq!(
        parse_telemetry_line(b"EMAP 0 0 \n"),
        Some(Telemetry::Emap(Emap::new(0, 0)))
    );
    assert_eq!(parse_telemetry_line(b"EMAP 1 2 00b"), None);
    assert_eq!(parse_telemetry_line(b"HITS 2 5 80"), None);
}

/// Mutations of valid frames: flip, insert, delete, truncate, duplicate.
fn mutate(rng: &mut Rng, mut v: Vec<u8>) -> Vec<u8> {
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(v.len() as u64 + 1) as usize;
        match rng.below(5) {
            0 if at < v.len() => v[at] = rng.next() as u8,
            1 => v.insert(
                at,
                [0x01, 0x02, b'\n', b' ', b'0', 0][rng.below(6) as usize],
            ),
            2 if at < v.len() => {
                v.remove(at);
            }
            3 => v.truncate(at),
            _ => {
                let tail = v[at..].to_vec();
                v.extend_from_slice(&tail);
            }
        }
    }
    v
}

#[test]
fn decode_request_never_panics() {
    let mut rng = Rng::new(5);
    for i in 0..150_000 {
        let buf = if i % 2 == 0 {
            rng.bytes(64)
        } else {
            let mut b = Vec::new();
            encode_request(&random_request(&mut rng), &mut b).unwrap();
            mutate(&mut rng, b)
        };
        for eof in [false, true] {
            let got = if eof {
                decode_request_eof(&buf)
            } else {
                decode_request(&buf)
            };
            match got {
                Ok((_, n)) => {
                    assert!(n > 0 && n <= buf.len());
                    // More bytes never change a decoded frame.
                    if !eof {
                        let mut longer = buf.clone();
                        longer.extend_from_slice(&rng.bytes(8));
                        assert_eq!(decode_request(&longer), got);
                    }
                }
                Err(DecodeError::Incomplete) => {}
                Err(e) => panic!("{e:?} on {buf:?}"),
            }
        }
    }
}

/// Joins adjacent texts so sequences can be compared across chunkings.
fn merged(replies: impl IntoIterator<Item = Reply>) -> Vec<Reply> {
    let mut out: Vec<Reply> = Vec::new();
    for r in replies {
        match (out.last_mut(), r) {
            (_, Reply::Text(t)) if t.is_empty() => {}
            (Some(Reply::Text(prev)), Reply::Text(t)) => prev.extend_from_slice(&t),
            (_, r) => out.push(r),
        }
    }
    out
}

fn decode_chunked(stream: &[u8], cuts: &[usize]) -> Vec<Reply> {
    let mut dec = ReplyDecoder::new();
    let mut out = Vec::new();
    let mut last = 0;
    for &c in cuts {
        dec.decode_chunk(&stream[last..c], &mut out);
        last = c;
    }
    dec.decode_chunk(&stream[last..], &mut out);
    for r in &out {
        assert!(!matches!(r, Reply::Text(t) if t.is_empty()));
    }
    out.extend(dec.finish());
    out
}

fn random_cuts(rng: &mut Rng, len: usize) -> Vec<usize> {
    let mut cuts: Vec<usize> = (0..rng.below(12))
        .map(|_| rng.below(len as u64 + 1) as usize)
        .collect();
    if rng.chance(20) {
        cuts = (0..=len).collect(); // byte at a time
    }
    cuts.sort_unstable();
    cuts
}

#[test]
fn reply_decoder_never_panics_and_ignores_chunking() {
    let mut rng = Rng::new(6);
    for i in 0..100_000 {
        let stream = if i % 2 == 0 {
            let mut s = Vec::new();
            if rng.chance(2) {
                s.extend_from_slice(READY);
            }
            s.extend(rng.bytes(120));
            s
        } else {
            let valid = valid_stream(&mut rng).0;
            mutate(&mut rng, valid)
        };
        let whole = merged(decode_chunked(&stream, &[]));
        let cuts = random_cuts(&mut rng, stream.len());
        assert_eq!(
            merged(decode_chunked(&stream, &cuts)),
            whole,
            "{stream:?} {cuts:?}"
        );
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A random, valid daemon stdout and the replies it encodes (texts merged).
fn valid_stream(rng: &mut Rng) -> (Vec<u8>, Vec<Reply>) {
    let mut replies = vec![
        Reply::Ready,
        Reply::Stat(Stat::zero(rng.fixed(2))),
        Reply::Telemetry(random_telemetry(rng, true)),
    ];
    for _ in 0..rng.below(4) {
        for _ in 0..rng.below(3) {
            replies.push(Reply::Telemetry(random_telemetry(rng, true)));
        }
        let leading_newline = rng.chance(2);
        // Text of one turn, in pieces.
        let mut text = Vec::new();
        let mut pieces = Vec::new();
        for _ in 0..rng.below(4) {
            let p = rng.bytes(30);
            text.extend_from_slice(&p);
            pieces.push(p);
        }
        let mut end = Vec::new();
        Reply::End { leading_newline }.encode(&mut end);
        let mut turn = text.clone();
        turn.extend_from_slice(&end);
        let first_line = &text[..text.iter().position(|&b| b == b'\n').unwrap_or(text.len())];
        let ambiguous = find(&turn, READY).is_some()
            || find(&turn, END) != Some(turn.len() - END.len())
            || (!leading_newline && text.last() == Some(&b'\n'))
            || matches!(parse_telemetry_line(first_line), Some(t) if !matches!(t, Telemetry::Unknown(_)));
        if ambiguous {
            continue;
        }
        replies.extend(pieces.into_iter().map(Reply::Text));
        replies.push(Reply::End { leading_newline });
        replies.push(Reply::Stat(Stat {
            route: None,
            prefetch: None,
            completion_tokens: rng.u32(),
            tok_per_s: rng.fixed(2),
            hit_pct: rng.fixed(1),
            rss_gb: rng.fixed(2),
            prompt: if rng.chance(2) {
                None
            } else {
                Some((rng.u32(), rng.chance(2)))
            },
        }));
    }
    let mut bytes = Vec::new();
    for r in &replies {
        r.encode(&mut bytes);
    }
    (bytes, merged(replies))
}

#[test]
fn valid_streams_decode_to_what_was_encoded() {
    let mut rng = Rng::new(7);
    let (mut turns, mut texts) = (0, 0);
    for _ in 0..20_000 {
        let (stream, want) = valid_stream(&mut rng);
        turns += want
            .iter()
            .filter(|r| matches!(r, Reply::End { .. }))
            .count();
        texts += want.iter().filter(|r| matches!(r, Reply::Text(_))).count();
        let mut with_banner = b"== GLM C engine ==\nloaded in 1.00s\n\x01\x01".to_vec();
        with_banner.extend_from_slice(&stream);
        for s in [&stream, &with_banner] {
            assert_eq!(merged(decode_chunked(s, &[])), want);
            let cuts = random_cuts(&mut rng, s.len());
            assert_eq!(merged(decode_chunked(s, &cuts)), want, "{cuts:?}");
        }
    }
    // The generator's ambiguity filter leaves most turns in.
    assert!(
        turns > 20_000 && texts > 10_000,
        "{turns} turns, {texts} texts"
    );
}

/// The transcript of the brief under every split into two and three chunks, and byte at a
/// time.
#[test]
fn full_transcript_under_every_chunking() {
    let replies = vec![
        Reply::Ready,
        Reply::Stat(Stat::zero(0.42)),
        Reply::Telemetry(Telemetry::Tiers(Tiers {
            vram_experts: 0,
            ram_experts: 3,
            disk_experts: 5,
            vram_gb: 0.0,
            ram_gb: 0.01,
        })),
        Reply::Text(b"caf\xc3".to_vec()),
        Reply::Text(b"\xa9 \xff\x01\x01EN\x01\x01READY\x01 \n\n".to_vec()),
        Reply::End {
            leading_newline: true,
        },
        Reply::Stat(Stat {
            route: None,
            prefetch: None,
            completion_tokens: 17,
            tok_per_s: 3.5,
            hit_pct: 92.5,
            rss_gb: 0.42,
            prompt: Some((31, true)),
        }),
    ];
    let mut stream = Vec::new();
    for r in &replies {
        r.encode(&mut stream);
    }
    let want = merged(replies);
    let n = stream.len();
    assert_eq!(merged(decode_chunked(&stream, &[])), want);
    assert_eq!(
        merged(decode_chunked(&stream, &(0..=n).collect::<Vec<_>>())),
        want
    );
    for a in 0..=n {
        for b in a..=n {
            assert_eq!(
                merged(decode_chunked(&stream, &[a, b])),
                want,
                "cuts {a} {b}"
            );
        }
    }
}

/// Text flows out as it arrives: only a possible sentinel prefix or `\n` is held back.
#[test]
fn text_is_streamed_incrementally() {
    let mut dec = ReplyDecoder::new();
    let mut out = Vec::new();
    dec.decode_chunk(b"\x01\x01READY\x01\x01\nSTAT 0 0.00 0.0 1.00\n", &mut out);
    assert_eq!(out.len(), 2);
    out.clear();
    dec.decode_chunk(b"Hello", &mut out);
    assert_eq!(out, [Reply::Text(b"Hello".to_vec())]);
    out.clear();
    dec.decode_chunk(b" world\n", &mut out);
    assert_eq!(out, [Reply::Text(b" world".to_vec())]);
    out.clear();
    dec.decode_chunk(b"\x01", &mut out);
    assert!(out.is_empty());
    dec.decode_chunk(b"\x01E", &mut out);
    assert!(out.is_empty());
    dec.decode_chunk(b"X", &mut out);
    assert_eq!(out, [Reply::Text(b"\n\x01\x01EX".to_vec())]);
    out.clear();
    // Between turns, only the start of what may be a telemetry line waits.
    let mut dec = ReplyDecoder::new();
    dec.decode_chunk(
        b"\x01\x01READY\x01\x01\nSTAT 0 0.00 0.0 1.00\nHIT",
        &mut out,
    );
    assert_eq!(out.len(), 2);
    out.clear();
    dec.decode_chunk(b"S!", &mut out);
    assert_eq!(out, [Reply::Text(b"HITS!".to_vec())]);
}
