//! `colibri bench --ref FILE`: replay `full_ids` exactly (prefill the prompt but its last
//! token, then decode the rest one token at a time, no sampling) through the engine's step,
//! with its tiers started as a daemon starts them (`--pin`, the RAM clamp of the LRU), and
//! report speed beside the machine's memory-read bandwidth. With `--streams N` the same replay
//! also runs as N concurrent sessions stepped in one batch, beside the single-stream figures
//! of the same run. The last stdout line is
//! `BENCH prefill_pos_s=<x> decode_tok_s=<y> hit_pct=<z> read_gbs=<w>` (single stream).

use std::process::ExitCode;
use std::time::Instant;

use crate::cli::BenchArgs;
use crate::cmd::validate::Reference;
use crate::engine::{Engine, Event, Finish, StartOptions, StepReport, TurnSpec};
use crate::error::EngineError;
use crate::experts::ExpertCounters;
use crate::model::profile::ProfileSnapshot;
use crate::sampling::Sampler;

/// What one replay measured.
struct Replay {
    streams: usize,
    decode_steps: usize,
    prefill_s: f64,
    decode_s: f64,
    /// Counters at the start, after the prefill and at the end.
    c0: ExpertCounters,
    c1: ExpertCounters,
    c2: ExpertCounters,
    prefill_prof: ProfileSnapshot,
    decode_prof: ProfileSnapshot,
    /// Each stream's own decode tok/s.
    per_stream: Vec<f64>,
}

impl Replay {
    fn decode_tok_s(&self) -> f64 {
        (self.streams * self.decode_steps) as f64 / self.decode_s.max(1e-9)
    }
}

pub fn run(args: BenchArgs) -> Result<ExitCode, EngineError> {
    let opts = args.reference.load_options(&args.model)?;
    let r = Reference::load(&args.reference.reference, args.reference.case.as_deref())?;
    if r.full_ids.len() < 2 {
        return Err(EngineError::Usage(format!(
            "{}: full_ids needs at least 2 tokens to replay",
            args.reference.reference.display()
        )));
    }
    let streams = args.streams.iter().copied().max().unwrap_or(1) as usize;
    let mut engine = Engine::start(StartOptions {
        dirs: args.model.dirs()?,
        load: opts,
        sessions: streams,
        ctx: r.full_ids.len() + 2,
        state_dir: None,
        kv_save: false,
        progress: None,
    })?;
    // The prompt but its last token, at least one token.
    let p = r.prompt_ids.len().clamp(2, r.full_ids.len()) - 1;
    let (prefill, decode) = r.full_ids.split_at(p);
    let one = [r.full_ids.clone()];
    if args.warmup {
        let before = engine.model.experts.counters();
        let t = Instant::now();
        // Every stream's prefill, so the figures of each stream count are warm alike.
        replay(&mut engine, &rotations(&r.full_ids, streams), p, true)?;
        let loads = engine.model.experts.counters().misses - before.misses;
        eprintln!(
            "[bench] warm-up: {} prefill positions x {streams} untimed in {:.3}s, {loads} expert loads",
            prefill.len(),
            t.elapsed().as_secs_f64()
        );
    }
    let spec0 = engine.spec.figures();
    let single = replay(&mut engine, &one, p, false)?;
    let spec = engine.spec.figures().since(&spec0);
    let model = &engine.model;
    let hit_pct = single.c2.hit_pct_since(&single.c0);
    let read_gbs = (single.c2.bytes_read - single.c0.bytes_read) as f64
        / 1e9
        / (single.prefill_s + single.decode_s).max(1e-9);
    let prefill_pos_s = prefill.len() as f64 / single.prefill_s.max(1e-9);
    let decode_tok_s = single.decode_tok_s();
    eprintln!(
        "[bench] {} prefill positions in {:.3}s, {} decode steps in {:.3}s | experts {:.2} MB each ({} unless stored packed) / dense {} | act {:?}",
        prefill.len(),
        single.prefill_s,
        decode.len(),
        single.decode_s,
        model.experts.expert_bytes() as f64 / 1e6,
        model.opts.expert_fmt.name(),
        model.opts.dense_fmt.name(),
        model.opts.act,
    );
    eprintln!(
        "[bench] prefill profile: {}",
        single.prefill_prof.describe(single.prefill_s)
    );
    eprintln!(
        "[bench] decode profile:  {}",
        single.decode_prof.describe(single.decode_s)
    );
    eprintln!(
        "[bench] decode: {:.2} tokens/forward | draft {} | acceptance {} | cost of a verify position {:.2}, of an MTP draft {:.2} (x a decode row)",
        spec.tokens_per_forward(),
        engine.spec.max_draft,
        spec.acceptance_line(),
        engine.spec.extra_cost(),
        engine.spec.mtp_cost()
    );
    let steps = decode.len().max(1) as f64;
    eprintln!(
        "[bench] decode: {:.2} expert loads/token, {:.2} MB read/token",
        (single.c2.misses - single.c1.misses) as f64 / steps,
        (single.c2.bytes_read - single.c1.bytes_read) as f64 / 1e6 / steps
    );
    // Weight bytes touched per decode token: dense weights plus the routed experts it used.
    let per_tok = model.decode_weight_bytes_per_token() as f64;
    if !args.no_membw {
        let bw = crate::membw::read_bandwidth_gbs(1024, 5);
        let gbs = per_tok * decode_tok_s / 1e9;
        eprintln!(
            "[bench] weights read per token {:.1} MB -> {gbs:.2} GB/s; memory read bandwidth {bw:.2} GB/s; ratio {:.3}",
            per_tok / 1e6,
            gbs / bw
        );
    }
    let counts: Vec<usize> = args
        .streams
        .iter()
        .map(|&n| n as usize)
        .filter(|&n| n > 1)
        .collect();
    if !counts.is_empty() {
        println!("{}", stream_line(&engine, &single));
    }
    for n_streams in counts {
        let batched = replay(&mut engine, &rotations(&r.full_ids, n_streams), p, false)?;
        println!("{}", stream_line(&engine, &batched));
        eprintln!(
            "[bench] {n_streams} streams: aggregate {:.2} tok/s = {:.2}x one stream; per stream {}",
            batched.decode_tok_s(),
            batched.decode_tok_s() / decode_tok_s.max(1e-9),
            batched
                .per_stream
                .iter()
                .map(|v| format!("{v:.2}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    println!(
        "BENCH prefill_pos_s={prefill_pos_s:.2} decode_tok_s={decode_tok_s:.2} hit_pct={hit_pct:.1} read_gbs={read_gbs:.3}"
    );
    Ok(ExitCode::SUCCESS)
}

/// `STREAMS n=<streams> aggregate_tok_s=.. per_stream_tok_s=.. union_per_layer=..
/// expert_mb_per_tok=.. read_mb_per_tok=.. hit_pct=..` over the decode steps of a replay:
/// the distinct experts each layer's step multiplied (the union across the streams), the
/// expert weight bytes that streamed from memory and from disk per generated token.
fn stream_line(engine: &Engine, r: &Replay) -> String {
    let m = &engine.model;
    let sparse = m.cfg.n_sparse_layers().max(1) as f64;
    let asked = (r.c2.hits + r.c2.misses - r.c1.hits - r.c1.misses) as f64;
    let steps = r.decode_steps.max(1) as f64;
    let tokens = (r.streams * r.decode_steps).max(1) as f64;
    let union = asked / steps / sparse;
    let expert_mb = asked * m.experts.expert_bytes() as f64 / 1e6 / tokens;
    let read_mb = (r.c2.bytes_read - r.c1.bytes_read) as f64 / 1e6 / tokens;
    let per_stream = r.per_stream.iter().sum::<f64>() / r.per_stream.len().max(1) as f64;
    format!(
        "STREAMS n={} aggregate_tok_s={:.2} per_stream_tok_s={per_stream:.2} union_per_layer={union:.2} expert_mb_per_tok={expert_mb:.2} read_mb_per_tok={read_mb:.2} hit_pct={:.1}",
        r.streams,
        r.decode_tok_s(),
        r.c2.hit_pct_since(&r.c1),
    )
}

/// Stream i replays the reference rotated by i/N of its length: the same work per stream,
/// routed differently (identical replays would share every expert). Stream 0 is the reference.
fn rotations(ids: &[u32], streams: usize) -> Vec<Vec<u32>> {
    (0..streams)
        .map(|i| {
            let mut v = ids.to_vec();
            v.rotate_left(i * ids.len() / streams);
            v
        })
        .collect()
}

/// Replays each of `seqs` on its own session (`0..seqs.len()`), all begun together: the first
/// `p` tokens as the prefill (batched across the sessions), then the rest one forced token a
/// step (each step decodes one token of every session). With `prefill_only`, only the
/// prefill runs (warm-up). Every session is reset first and after.
fn replay(
    engine: &mut Engine,
    seqs: &[Vec<u32>],
    p: usize,
    prefill_only: bool,
) -> Result<Replay, EngineError> {
    let streams = seqs.len();
    let mut decode_steps = 0;
    for (s, ids) in seqs.iter().enumerate() {
        engine.reset(s);
        let (prefill, decode) = ids.split_at(p);
        let decode = if prefill_only { &[][..] } else { decode };
        decode_steps = decode.len();
        // Forced: each step emits the next reference token, fed at the step after; the last
        // emitted one is never fed, so one more than `decode` is emitted (none: prefill only).
        let mut forced = decode.to_vec();
        forced.extend(decode.last());
        engine.begin(
            s,
            TurnSpec {
                use_stops: false,
                ..TurnSpec::new(prefill.to_vec(), forced.len(), Sampler::greedy())
            }
            .with_forced(forced),
        )?;
    }
    let m = &engine.model;
    let c0 = m.experts.counters();
    m.profile.reset();
    let t0 = Instant::now();
    let mut report = StepReport::default();
    let mut started: Option<(Instant, ExpertCounters, ProfileSnapshot)> = None;
    let mut per_stream = vec![0.0; streams];
    while engine.any_active() {
        engine.step(&mut report)?;
        for e in &report.events {
            match e {
                Event::Token { .. } if started.is_none() => {
                    // Every stream's first token comes from the same (batched) prefill step.
                    let m = &engine.model;
                    started = Some((Instant::now(), m.experts.counters(), m.profile.snapshot()));
                    m.profile.reset();
                }
                Event::Done { slot, outcome } => {
                    if let Finish::Failed(why) = &outcome.finish {
                        return Err(EngineError::Load(why.clone()));
                    }
                    per_stream[*slot] = outcome.decode_tok_s();
                }
                _ => {}
            }
        }
    }
    let m = &engine.model;
    let end = Instant::now();
    let (t1, c1, prefill_prof) =
        started.unwrap_or((end, m.experts.counters(), m.profile.snapshot()));
    let r = Replay {
        streams,
        decode_steps,
        prefill_s: (t1 - t0).as_secs_f64(),
        decode_s: (end - t1).as_secs_f64(),
        c0,
        c1,
        c2: m.experts.counters(),
        prefill_prof,
        decode_prof: m.profile.snapshot(),
        per_stream,
    };
    for s in 0..streams {
        engine.reset(s);
    }
    Ok(r)
}
