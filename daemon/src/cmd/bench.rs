//! `colibri bench --ref FILE`: replay `full_ids` exactly (prefill the prompt but its last
//! token, then decode the rest one token at a time, no sampling) through the engine's step,
//! with its tiers started as a daemon starts them (`--pin`, the RAM clamp of the LRU), and
//! report speed beside the machine's memory-read bandwidth. With `--streams N` the same replay
//! also runs as N concurrent sessions stepped in one batch, beside the single-stream figures
//! of the same run. `--prompt-tokens P --gen-tokens G` (llama-bench's `-p`/`-n`) replays
//! P + G fixed pseudo-random ids instead of a file: P positions prefilled, G steps decoded.
//! The last stdout line is
//! `BENCH prefill_pos_s=<x> decode_tok_s=<y> hit_pct=<z> read_gbs=<w>` (single stream; with
//! `--pilot`, then `prefetch_in_time_mb`, `prefetch_late_mb`, `prefetch_unused_mb` per token).

use std::process::ExitCode;
use std::time::Instant;

use crate::cli::BenchArgs;
use crate::cmd::validate::Reference;
use crate::engine::{Engine, Event, Finish, StartOptions, StepReport, TurnSpec};
use crate::error::EngineError;
use crate::experts::stats::device_read_bytes;
use crate::experts::{ExpertCounters, Snapshot};
use crate::model::profile::ProfileSnapshot;
use crate::quant::pool::{PoolTimes, SpinPool};
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
    /// Bytes the process had read from storage at the same three points
    /// ([`crate::experts::stats::device_read_bytes`]): read here, not with every counters'
    /// snapshot, as the serve loops take those a token.
    device: [Option<u64>; 3],
    prefill_prof: ProfileSnapshot,
    decode_prof: ProfileSnapshot,
    /// The spin pool's times over the decode (all zero without `--pool-times`).
    decode_pool: PoolTimes,
    /// Each stream's own decode tok/s.
    per_stream: Vec<f64>,
}

impl Replay {
    fn decode_tok_s(&self) -> f64 {
        (self.streams * self.decode_steps) as f64 / self.decode_s.max(1e-9)
    }
}

pub fn run(args: BenchArgs) -> Result<ExitCode, EngineError> {
    let opts = args.input.load_options(&args.model)?;
    let synthetic = args.input.synthetic();
    let mut r = match (&args.input.reference, synthetic) {
        (Some(path), _) => {
            let r = Reference::load(path, args.input.case.as_deref())?;
            if r.full_ids.len() < 2 {
                return Err(EngineError::Usage(format!(
                    "{}: full_ids needs at least 2 tokens to replay",
                    path.display()
                )));
            }
            r
        }
        // The ids are drawn once the vocabulary is known (after the start); the lengths size
        // the context now.
        (None, Some((p, g))) => Reference {
            prompt_ids: vec![0; p + 1],
            full_ids: vec![0; p + g],
            tf_pred: None,
            logits: None,
        },
        (None, None) => unreachable!("clap requires --ref or --prompt-tokens/--gen-tokens"),
    };
    let gen = args.gen.unwrap_or(0) as usize;
    let streams = args.streams.iter().copied().max().unwrap_or(1) as usize;
    let dirs = args.model.dirs()?;
    // The tier start of `run` and `serve` (usage history, autopin, pins, the RAM clamp), but
    // the history is only read: a benchmark must not teach the cache what to keep.
    let state_dir = crate::engine::state::resolve(&dirs[0], args.state_dir.as_deref())?;
    let mut opts = opts;
    opts.tiers.usage_save = false;
    crate::quant::pool::set_timing(args.pool_times);
    let mut engine = Engine::start(StartOptions {
        dirs,
        load: opts,
        sessions: streams,
        ctx: (r.full_ids.len().max(r.prompt_ids.len() + gen) + 2).max(context_ctx(&args)),
        state_dir: Some(state_dir),
        kv_save: false,
        progress: None,
    })?;
    if let Some((p, g)) = synthetic {
        r.full_ids = synthetic_ids(engine.vocab_size(), p + g);
        r.prompt_ids = r.full_ids[..p + 1].to_vec();
        crate::elog!("[bench] synthetic ids: {p} prompt positions prefilled, {g} decode steps");
    }
    if gen > 0 {
        r.full_ids = greedy_continuation(&mut engine, &r.prompt_ids, gen)?;
        crate::elog!(
            "[bench] replaying the model's own greedy continuation: {} prompt + {gen} tokens",
            r.prompt_ids.len()
        );
    }
    // The prompt but its last token, at least one token.
    let p = r.prompt_ids.len().clamp(2, r.full_ids.len()) - 1;
    let (prefill, decode) = r.full_ids.split_at(p);
    let one = [r.full_ids.clone()];
    if args.warmup {
        let before = engine.tiers().counters();
        let t = Instant::now();
        // The timed replay itself, once untimed: the steps are deterministic, so the timed
        // one routes to exactly these experts and finds every one resident. (A prefill of the
        // whole replay is not enough: its batched attention sums in another order, and on a
        // near tie a decode step then routes to an expert the prefill never touched.)
        replay(&mut engine, &rotations(&r.full_ids, streams), p)?;
        let loads = engine.tiers().counters().store.misses - before.store.misses;
        crate::elog!(
            "[bench] warm-up: the replay x {streams} untimed in {:.3}s, {loads} expert loads",
            t.elapsed().as_secs_f64()
        );
    }
    // The experts the warm-up read are in memory now too: in 2 MiB pages before the timed
    // rounds, as the dense weights are since the load (`COLI_HUGEPAGES=0`: neither).
    let t = Instant::now();
    if let Some(done) = crate::quant::hugepages::remap_weights() {
        crate::elog!(
            "[bench] huge pages: {:.2} GB remapped in {:.2}s ({} of {} resident extents)",
            done.huge_bytes() as f64 / 1e9,
            t.elapsed().as_secs_f64(),
            done.huge,
            done.asked
        );
    }
    let spec0 = engine.spec().figures();
    // Each round: a probe round, then the timed replay. The replay with the fastest decode
    // stands for decode (its profile and counters), the fastest prefill for prefill, and the
    // probe's best over all rounds is the limit both are put beside.
    let mut probe_gbs = 0f64;
    let mut single: Option<(Replay, Snapshot)> = None;
    let mut best_prefill_s = f64::MAX;
    let ab = match std::env::var("BENCH_AB") {
        Ok(spec) => {
            let with = std::env::var("BENCH_AB_WITH").unwrap_or_default();
            Some(TuningAb::parse(&spec, &with).map_err(EngineError::Load)?)
        }
        Err(_) => None,
    };
    let mut ab_best = [(f64::MAX, f64::MAX); 2];
    // Each side's fastest decode's pool times, for a `pool` line per side.
    let mut ab_pool: [Option<(f64, PoolTimes)>; 2] = [None, None];
    for round in 0..args.rounds.max(1) as usize {
        if !args.no_membw && args.rounds > 1 {
            probe_gbs = probe_gbs.max(crate::membw::read_bandwidth_gbs(1024, 2));
        }
        if let Some(ab) = &ab {
            ab.apply(round % 2);
        }
        let snap0 = engine.tiers().snapshot();
        let this = replay(&mut engine, &one, p)?;
        let io = engine.tiers().snapshot().since(&snap0);
        let side = &mut ab_best[round % 2];
        *side = (side.0.min(this.prefill_s), side.1.min(this.decode_s));
        if let Some(ab) = &ab {
            crate::elog!(
                "[bench] A/B round {round}: {}={}: decode {:.2} tok/s",
                ab.knob,
                ab.values[round % 2],
                this.decode_tok_s()
            );
            let pool = &mut ab_pool[round % 2];
            if pool.as_ref().is_none_or(|(s, _)| this.decode_s < *s) {
                *pool = Some((this.decode_s, this.decode_pool.clone()));
            }
        }
        best_prefill_s = best_prefill_s.min(this.prefill_s);
        if single
            .as_ref()
            .is_none_or(|(b, _)| this.decode_s < b.decode_s)
        {
            single = Some((this, io));
        }
    }
    let (single, io) = single.expect("at least one round");
    if let Some(ab) = &ab {
        ab.apply_default();
        let steps = (r.full_ids.len() - p) as f64;
        for (i, (pre, dec)) in ab_best.iter().enumerate() {
            crate::elog!(
                "[bench] A/B {}={}: best prefill {:.1} pos/s, best decode {:.2} tok/s",
                ab.knob,
                ab.values[i],
                (p as f64) / pre,
                steps / dec
            );
            if let Some((decode_s, pool)) = ab_pool[i].as_ref().filter(|_| args.pool_times) {
                crate::elog!(
                    "[bench] A/B {}={}: {}",
                    ab.knob,
                    ab.values[i],
                    pool_line(pool, *decode_s, steps as usize)
                );
            }
        }
        crate::elog!(
            "[bench] A/B {}: decode {}={} / {}={} = {:.3}, prefill {:.3}",
            ab.knob,
            ab.knob,
            ab.values[1],
            ab.knob,
            ab.values[0],
            ab_best[0].1 / ab_best[1].1,
            ab_best[0].0 / ab_best[1].0
        );
    }
    if args.rounds > 1 {
        crate::elog!(
            "[bench] {} timed replays, each after a probe round: the best prefill and the best decode below",
            args.rounds
        );
    }
    let spec = engine.spec().figures().since(&spec0);
    let hit_pct = single.c2.hit_pct_since(&single.c0);
    let read_gbs = (single.c2.store.bytes_read - single.c0.store.bytes_read) as f64
        / 1e9
        / (single.prefill_s + single.decode_s).max(1e-9);
    let prefill_pos_s = prefill.len() as f64 / best_prefill_s.max(1e-9);
    let decode_tok_s = single.decode_tok_s();
    crate::elog!(
        "[bench] {} prefill positions in {:.3}s, {} decode steps in {:.3}s | experts {:.2} MB each ({}) / dense {} | act {:?}",
        prefill.len(),
        best_prefill_s,
        decode.len(),
        single.decode_s,
        engine.tiers().expert_bytes() as f64 / 1e6,
        engine.format_names().0,
        engine.format_names().1,
        engine.act_mode(),
    );
    crate::elog!(
        "[bench] prefill profile: {}",
        single.prefill_prof.describe(single.prefill_s)
    );
    crate::elog!(
        "[bench] decode profile:  {}",
        single.decode_prof.describe(single.decode_s)
    );
    if args.pool_times {
        crate::elog!(
            "[bench] {}",
            pool_line(&single.decode_pool, single.decode_s, decode.len())
        );
    }
    crate::elog!(
        "[bench] decode: {:.2} tokens/forward | draft {} | acceptance {} | cost of a verify position {:.2}, of an MTP draft {:.2} (x a decode row)",
        spec.tokens_per_forward(),
        engine.spec().max_draft,
        spec.acceptance_line(),
        engine.spec().extra_cost(),
        engine.spec().mtp_cost()
    );
    crate::elog!(
        "[bench] weights: dense {:.3} GB, {} layers of routed experts of {:.3} GB each",
        engine.dense_bytes() as f64 / 1e9,
        engine.n_sparse_layers(),
        engine.tiers().expert_bytes() as f64 / 1e9
    );
    let device =
        |to: usize, from: usize| Some(single.device[to]?.saturating_sub(single.device[from]?));
    crate::elog!(
        "[bench] prefill: {} expert loads, {:.2} MB read{}",
        single.c1.store.misses - single.c0.store.misses,
        (single.c1.store.bytes_read - single.c0.store.bytes_read) as f64 / 1e6,
        device(1, 0)
            .map(|d| format!(", {:.2} MB of them from the device", d as f64 / 1e6))
            .unwrap_or_default()
    );
    let steps = decode.len().max(1) as f64;
    crate::elog!(
        "[bench] decode: {:.2} expert loads/token, {:.2} MB read/token",
        (single.c2.store.misses - single.c1.store.misses) as f64 / steps,
        (single.c2.store.bytes_read - single.c1.store.bytes_read) as f64 / 1e6 / steps
    );
    let decode_loads = single.c2.store.since(&single.c1.store);
    if decode_loads.all_loads > 0 {
        crate::elog!(
            "[bench] {}",
            crate::experts::stats::load_line("decode", &decode_loads, device(2, 1), decode.len())
        );
    }
    // Weight bytes touched per decode token: dense weights plus the routed experts it used.
    let per_tok = engine.decode_weight_bytes_per_token() as f64;
    // Whole-token decode against the memory-read probe of this run (BENCH's last field).
    let mut membw_ratio = None;
    if !args.no_membw {
        let bw = probe_gbs.max(crate::membw::read_bandwidth_gbs(1024, 5));
        let gbs = per_tok * decode_tok_s / 1e9;
        crate::elog!(
            "[bench] weights read per token {:.1} MB -> {gbs:.2} GB/s; memory read bandwidth {bw:.2} GB/s; ratio {:.3}",
            per_tok / 1e6,
            gbs / bw
        );
        membw_ratio = Some(gbs / bw.max(1e-9));
        gpu_line(&engine, gbs);
    }
    if !args.no_membw {
        let (peak, how) = crate::computebw::int8_peak_gmacs(3);
        let gmacs = engine.prefill_macs_per_position() as f64 * prefill_pos_s / 1e9;
        crate::elog!(
            "[bench] prefill {gmacs:.1} G multiply-adds/s in the weight products; 8-bit compute peak {peak:.1} G/s ({how}); ratio {:.3}",
            gmacs / peak.max(1e-9)
        );
    }
    if !args.no_disk_probe {
        disk_line(&engine, &io, read_gbs, single.prefill_s + single.decode_s);
    }
    // The pilot's precision and recall, and the bytes its guesses wasted against those they
    // took off the stall path, over this process's forwards (as `run` prints them).
    if let Some(line) = engine.tiers().pilot_report() {
        crate::elog!("{line}");
    }
    // Cache-aware routing (`--cache-route`) over the decode steps: how often it took a
    // resident expert over the exact one (`run` reports the whole run's in `[PROF]`).
    let (r1, r2) = (&single.c1.route, &single.c2.route);
    if let Some(a) = r2.since(r1) {
        crate::elog!(
            "[bench] decode: cache-route M={} J={}: agreement with exact routing {:.1}% ({} of {} expert slots swapped for resident ones), route_kl {:.4}",
            r2.m, r2.j, a.agree_pct, a.swaps, a.slots, a.kl
        );
    }
    // What the pilot's reads ahead became over the decode steps: in time, late, never used.
    let prefetch = single.c2.prefetch.since(&single.c1.prefetch);
    let prefetch_mb = engine.tiers().pilot_enabled().then(|| {
        let eb = engine.tiers().expert_bytes();
        crate::elog!("[bench] decode: {}", prefetch.line(eb, decode.len()));
        prefetch.mb_per_token(eb, decode.len())
    });
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
        let batched = replay(&mut engine, &rotations(&r.full_ids, n_streams), p)?;
        println!("{}", stream_line(&engine, &batched));
        crate::elog!(
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
    let mut first: Option<f64> = None;
    for &n in &args.context {
        let c = context_point(&mut engine, n as usize, args.context_steps as usize)?;
        let base = *first.get_or_insert(c.step_s);
        println!(
            "CONTEXT n={n} decode_tok_s={:.2} attention_ms_per_tok={:.2} cost_vs_first={:.2}",
            1.0 / c.step_s.max(1e-9),
            c.attention_s * 1e3,
            c.step_s / base.max(1e-12)
        );
    }
    if let Some(pairs) = args.draft_ab {
        draft_ab(&mut engine, &one, p, pairs as usize)?;
    }
    if let Some(path) = &args.usage_out {
        engine
            .tiers()
            .usage_now()
            .save(path)
            .map_err(|e| EngineError::Usage(format!("--usage-out: {e}")))?;
    }
    println!(
        "BENCH prefill_pos_s={prefill_pos_s:.2} decode_tok_s={decode_tok_s:.2} hit_pct={hit_pct:.1} read_gbs={read_gbs:.3}{}{}",
        membw_ratio
            .map(|r| format!(" decode_membw_ratio={r:.3}"))
            .unwrap_or_default(),
        prefetch_mb
            .map(|(t, l, u)| format!(
                " prefetch_in_time_mb={t:.2} prefetch_late_mb={l:.2} prefetch_unused_mb={u:.2}"
            ))
            .unwrap_or_default()
    );
    Ok(ExitCode::SUCCESS)
}

/// With a GPU in use (`--gpu`, `--vram-gb`), its read bandwidth beside the bytes the whole
/// token moved per second: the ceiling a device tier is measured against. One line either way.
fn gpu_line(engine: &Engine, token_gbs: f64) {
    let tiers = engine.tiers().config();
    if tiers.gpu == crate::gpu::GpuChoice::Off || !tiers.vram_gb.is_some_and(|g| g > 0.0) {
        return;
    }
    let (experts, bytes) = engine.tiers().vram_resident();
    match crate::gpu::shared(tiers.gpu)
        .and_then(|g| Ok((g.name.clone(), g.read_bandwidth_gbs(256 << 20, 5)?)))
    {
        Ok((name, bw)) => crate::elog!(
            "[bench] gpu: {name}: read bandwidth {bw:.2} GB/s; {experts} experts ({:.2} GB) in VRAM; the whole token's {token_gbs:.2} GB/s = {:.3} of it",
            bytes as f64 / 1e9,
            token_gbs / bw.max(1e-9)
        ),
        Err(e) => crate::elog!("[bench] gpu: no probe: {e}"),
    }
}

/// `n` token ids spread over the vocabulary, the same on every run (the warm-up and each
/// timed round must route alike, and two runs must do the same work): llama-bench's stand-in
/// for a prompt, which routes as varied text does rather than as one id repeated.
fn synthetic_ids(vocab: usize, n: usize) -> Vec<u32> {
    let mut rng = crate::sampling::Rng::new(0xC011_B1E5);
    (0..n)
        .map(|_| (rng.next_u64() % vocab.max(1) as u64) as u32)
        .collect()
}

/// `prompt` and the model's greedy continuation of it, `n` tokens, on session 0 with drafts
/// off (greedy output does not depend on them).
fn greedy_continuation(
    engine: &mut Engine,
    prompt: &[u32],
    n: usize,
) -> Result<Vec<u32>, EngineError> {
    let draft = engine.set_max_draft(0);
    engine.reset(0);
    engine.begin(
        0,
        TurnSpec {
            use_stops: false,
            ..TurnSpec::new(prompt.to_vec(), n, Sampler::greedy())
        },
    )?;
    let mut ids = prompt.to_vec();
    let mut report = StepReport::default();
    while engine.any_active() {
        engine.step(&mut report)?;
        for e in &report.events {
            match e {
                Event::Token { id, .. } => ids.push(*id),
                Event::Done { outcome, .. } => {
                    if let Finish::Failed(why) = &outcome.finish {
                        return Err(EngineError::Load(why.clone()));
                    }
                }
                _ => {}
            }
        }
    }
    engine.reset(0);
    engine.set_max_draft(draft);
    Ok(ids)
}

/// `--draft-ab`: the single-stream replay with drafts off and on in turn, `pairs` times (which
/// goes first alternates, so a machine that slows down or speeds up over the run weighs on
/// both alike).
fn draft_ab(
    engine: &mut Engine,
    one: &[Vec<u32>],
    p: usize,
    pairs: usize,
) -> Result<(), EngineError> {
    let draft = engine.spec().max_draft;
    if draft == 0 {
        return Err(EngineError::Usage("--draft-ab needs --draft > 0".into()));
    }
    let mut ratios = Vec::with_capacity(pairs);
    let (mut off_sum, mut on_sum) = (0.0, 0.0);
    let mut on_figures = crate::engine::spec::SpecFigures::default();
    for i in 0..pairs {
        let mut tok_s = [0.0; 2];
        let mut tpf = 0.0;
        for j in 0..2 {
            let on = (i + j) % 2 == 1;
            engine.set_max_draft(if on { draft } else { 0 });
            let before = engine.spec().figures();
            let rep = replay(engine, one, p)?;
            tok_s[usize::from(on)] = rep.decode_tok_s();
            if on {
                let f = engine.spec().figures().since(&before);
                tpf = f.tokens_per_forward();
                on_figures = on_figures.plus(&f);
            }
        }
        let ratio = tok_s[1] / tok_s[0].max(1e-9);
        ratios.push(ratio);
        off_sum += tok_s[0];
        on_sum += tok_s[1];
        println!(
            "SPEC_AB pair={i} off_tok_s={:.2} on_tok_s={:.2} ratio={ratio:.3} tokens_per_forward={tpf:.2}",
            tok_s[0], tok_s[1]
        );
    }
    engine.set_max_draft(draft);
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    let geomean = (ratios.iter().map(|r| r.ln()).sum::<f64>() / pairs as f64).exp();
    println!(
        "SPEC_AB_SUMMARY draft={draft} pairs={pairs} off_tok_s={:.2} on_tok_s={:.2} median_ratio={median:.3} geomean_ratio={geomean:.3} min_ratio={:.3} max_ratio={:.3} tokens_per_forward={:.2} acceptance {} | verify position {:.2}, MTP draft {:.2} (x a decode row)",
        off_sum / pairs as f64,
        on_sum / pairs as f64,
        ratios[0],
        ratios[ratios.len() - 1],
        on_figures.tokens_per_forward(),
        on_figures.acceptance_line(),
        engine.spec().extra_cost(),
        engine.spec().mtp_cost(),
    );
    Ok(())
}

/// The replay's read rate beside the disk's ceiling for the same read size and queue depth,
/// measured now: `[bench] disk: ...`.
fn disk_line(engine: &Engine, io: &Snapshot, read_gbs: f64, wall_s: f64) {
    let store = &engine.tiers();
    if io.loads == 0 {
        crate::elog!("[bench] disk: the replay read no expert (all resident): no probe");
        return;
    }
    let depth = store.queue_depth();
    // Enough reads to see the disk rather than one request's latency, bounded in bytes.
    let reads = ((2_000_000_000 / store.expert_bytes().max(1)) as usize).clamp(16, 256);
    // One load's bytes over its own time, beside one probe read's: both per request, so
    // the queue depth cancels.
    let load_gbs = io.bytes_read as f64 / 1e9 / io.load_s.max(1e-12);
    match store.disk_probe(reads, depth) {
        Some(p) => crate::elog!(
            "[bench] disk: probe {} random reads of one expert ({:.2} MB) at queue depth {depth}: \
             {:.2} GB/s, {:.2} ms per read | replay read {read_gbs:.3} GB/s = {:.3} of the probe | \
             read service {:.2} ms per load, {:.2} reads in flight on average, compute waited \
             {:.3}s of {wall_s:.3}s for reads | first-use loads (read and decode) {:.2} GB/s = \
             {:.3} of the probe's per-read rate",
            p.reads,
            p.bytes as f64 / p.reads as f64 / 1e6,
            p.gbs(),
            p.service_s * 1e3,
            read_gbs / p.gbs().max(1e-12),
            io.load_s * 1e3 / io.loads as f64,
            io.load_s / wall_s.max(1e-9),
            io.wait_s,
            load_gbs,
            load_gbs / p.per_read_gbs().max(1e-12),
        ),
        None => crate::elog!("[bench] disk: the probe's reads failed: no ceiling measured"),
    }
}

/// `STREAMS n=<streams> aggregate_tok_s=.. per_stream_tok_s=.. union_per_layer=..
/// expert_mb_per_tok=.. read_mb_per_tok=.. hit_pct=..` over the decode steps of a replay:
/// the distinct experts each layer's step multiplied (the union across the streams), the
/// expert weight bytes that streamed from memory and from disk per generated token.
fn stream_line(engine: &Engine, r: &Replay) -> String {
    let sparse = engine.n_sparse_layers().max(1) as f64;
    let asked = (r.c2.hits() + r.c2.store.misses - r.c1.hits() - r.c1.store.misses) as f64;
    let steps = r.decode_steps.max(1) as f64;
    let tokens = (r.streams * r.decode_steps).max(1) as f64;
    let union = asked / steps / sparse;
    let expert_mb = asked * engine.tiers().expert_bytes() as f64 / 1e6 / tokens;
    let read_mb = (r.c2.store.bytes_read - r.c1.store.bytes_read) as f64 / 1e6 / tokens;
    let per_stream = r.per_stream.iter().sum::<f64>() / r.per_stream.len().max(1) as f64;
    format!(
        "STREAMS n={} aggregate_tok_s={:.2} per_stream_tok_s={per_stream:.2} union_per_layer={union:.2} expert_mb_per_tok={expert_mb:.2} read_mb_per_tok={read_mb:.2} hit_pct={:.1}",
        r.streams,
        r.decode_tok_s(),
        r.c2.hit_pct_since(&r.c1),
    )
}

/// The context the `--context` points need: the longest, its decode steps and the token fed.
fn context_ctx(args: &BenchArgs) -> usize {
    args.context
        .iter()
        .map(|&n| n as usize + args.context_steps as usize + 2)
        .max()
        .unwrap_or(0)
}

/// One `--context` point: seconds per decode step and attention seconds per step.
struct ContextPoint {
    step_s: f64,
    attention_s: f64,
}

/// Decodes `steps` tokens on session 0 after `n` synthetic positions (the first sampled token
/// comes from the one-token prefill and is not timed).
fn context_point(engine: &mut Engine, n: usize, steps: usize) -> Result<ContextPoint, EngineError> {
    engine.fill_synthetic(0, n, 0x5eed ^ n as u64)?;
    engine.begin(
        0,
        TurnSpec {
            use_stops: false,
            ..TurnSpec::new(vec![1], steps + 1, Sampler::greedy())
        },
    )?;
    let mut report = StepReport::default();
    let mut outcome = None;
    while engine.any_active() {
        engine.step(&mut report)?;
        for e in &report.events {
            match e {
                Event::Token { .. } if engine.session(0).emitted() == 1 => {
                    engine.profile().reset();
                }
                Event::Done { outcome: o, .. } => outcome = Some(o.clone()),
                _ => {}
            }
        }
    }
    let prof = engine.profile().snapshot();
    engine.reset(0);
    let o = outcome.ok_or_else(|| EngineError::Load("the context request never ended".into()))?;
    if let Finish::Failed(why) = &o.finish {
        return Err(EngineError::Load(why.clone()));
    }
    let decoded = o.completion_tokens.saturating_sub(1).max(1) as f64;
    Ok(ContextPoint {
        step_s: o.decode_s / decoded,
        attention_s: prof.get(crate::model::profile::Stage::Attention) / decoded,
    })
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

/// The `pool` line of `--pool-times`: over a decode of `steps` tokens in `wall` seconds,
/// the spin pool's regions per token, each thread's share of the time in tasks (even work
/// gives each `1 / threads`), what the caller lost at joins and how long each worker sat
/// idle (spinning or parked: the caller's serial code between regions).
fn pool_line(t: &PoolTimes, wall: f64, steps: usize) -> String {
    let total: f64 = t.tasks_s.iter().sum();
    let pct = |x: f64| 100.0 * x / wall.max(1e-9);
    let shares = t
        .tasks_s
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            let who = if i == 0 {
                "caller".to_string()
            } else {
                format!("worker {i}")
            };
            let idle = if i == 0 {
                format!("waits at joins {:.1}%", pct(t.join_s))
            } else {
                format!("idle {:.1}%", pct((wall - s).max(0.0)))
            };
            format!(
                "{who} {:.0}% of the task time, tasks {:.1}% of the decode, {idle}",
                100.0 * s / total.max(1e-12),
                pct(s)
            )
        })
        .collect::<Vec<_>>()
        .join(" | ");
    format!(
        "pool: {:.0} parallel regions/token | {shares}",
        t.calls as f64 / steps.max(1) as f64
    )
}

/// Replays each of `seqs` on its own session (`0..seqs.len()`), all begun together: the first
/// `p` tokens as the prefill (batched across the sessions), then the rest one forced token a
/// step (each step decodes one token of every session). Every session is reset first and
/// after.
fn replay(engine: &mut Engine, seqs: &[Vec<u32>], p: usize) -> Result<Replay, EngineError> {
    let streams = seqs.len();
    let mut decode_steps = 0;
    for (s, ids) in seqs.iter().enumerate() {
        engine.reset(s);
        let (prefill, decode) = ids.split_at(p);
        decode_steps = decode.len();
        // Forced: each step emits the next reference token, fed at the step after; the last
        // emitted one is never fed, so one more than `decode` is emitted.
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
    let c0 = engine.tiers().counters();
    let d0 = device_read_bytes();
    engine.profile().reset();
    let t0 = Instant::now();
    let mut report = StepReport::default();
    let mut started: Option<(Instant, (ExpertCounters, Option<u64>), ProfileSnapshot)> = None;
    let mut per_stream = vec![0.0; streams];
    while engine.any_active() {
        engine.step(&mut report)?;
        for e in &report.events {
            match e {
                Event::Token { .. } if started.is_none() => {
                    // Every stream's first token comes from the same (batched) prefill step.
                    let (experts, profile) = (engine.tiers(), engine.profile());
                    let c1 = (experts.counters(), device_read_bytes());
                    started = Some((Instant::now(), c1, profile.snapshot()));
                    profile.reset();
                    SpinPool::global().reset_times();
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
    let (experts, profile) = (engine.tiers(), engine.profile());
    let end = Instant::now();
    let c2 = experts.counters();
    let d2 = device_read_bytes();
    let (t1, (c1, d1), prefill_prof) = started.unwrap_or((end, (c2, d2), profile.snapshot()));
    let r = Replay {
        streams,
        decode_steps,
        prefill_s: (t1 - t0).as_secs_f64(),
        decode_s: (end - t1).as_secs_f64(),
        c0,
        c1,
        c2,
        device: [d0, d1, d2],
        prefill_prof,
        decode_prof: profile.snapshot(),
        decode_pool: SpinPool::global().times(),
        per_stream,
    };
    for s in 0..streams {
        engine.reset(s);
    }
    Ok(r)
}

/// `BENCH_AB=knob=a,b` (with `--rounds`, even counts best): the rounds alternate a decode
/// tuning knob between two values, and each side's best is printed beside the other's, in one
/// process (this machine's bandwidth drifts too much for runs in separate processes to show
/// a few percent). Knobs: the `DecodeTuning` fields (`prefetch_bytes`, `tile_min_row_bytes`,
/// `guided`, `prefetch_l2`, `one_region`, `one_region_leave_us`,
/// `one_region_pieces`; booleans as 0/1). `BENCH_AB_WITH="knob=v ..."` sets knobs alike on both
/// sides (`BENCH_AB=one_region_pieces=0,2 BENCH_AB_WITH=one_region=1`).
struct TuningAb {
    knob: String,
    values: [String; 2],
    /// `BENCH_AB_WITH="knob=v knob=v"`: knobs both sides set alike (e.g. `one_region=1` under
    /// an A/B of the one region's own knobs).
    with: Vec<(String, String)>,
}

impl TuningAb {
    const KNOBS: &'static str =
        "prefetch_bytes, tile_min_row_bytes, guided, prefetch_l2, one_region, one_region_leave_us, one_region_pieces";

    fn parse(spec: &str, with_spec: &str) -> Result<TuningAb, String> {
        let bad = || format!("BENCH_AB={spec:?}: want knob=a,b (knobs: {})", Self::KNOBS);
        let (knob, vals) = spec.split_once('=').ok_or_else(bad)?;
        let (a, b) = vals.split_once(',').ok_or_else(bad)?;
        let with = with_spec
            .split_whitespace()
            .map(|kv| {
                kv.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .ok_or_else(|| format!("BENCH_AB_WITH={with_spec:?}: want knob=v ..."))
            })
            .collect::<Result<Vec<_>, String>>()?;
        let ab = TuningAb {
            knob: knob.to_string(),
            values: [a.to_string(), b.to_string()],
            with,
        };
        // Both values must set the knob.
        ab.tuning(0).ok_or_else(bad)?;
        ab.tuning(1).ok_or_else(bad)?;
        Ok(ab)
    }

    fn tuning(&self, side: usize) -> Option<crate::quant::DecodeTuning> {
        let mut t = crate::quant::DecodeTuning::default();
        for (k, v) in &self.with {
            Self::set(&mut t, k, v)?;
        }
        Self::set(&mut t, &self.knob, &self.values[side])?;
        Some(t)
    }

    fn set(t: &mut crate::quant::DecodeTuning, knob: &str, v: &str) -> Option<()> {
        let flag = || match v {
            "0" => Some(false),
            "1" => Some(true),
            _ => None,
        };
        match knob {
            "prefetch_bytes" => t.prefetch_bytes = v.parse().ok()?,
            "tile_min_row_bytes" => t.tile_min_row_bytes = v.parse().ok()?,
            "guided" => t.guided = flag()?,
            "prefetch_l2" => t.prefetch_l2 = flag()?,
            "one_region" => t.one_region = flag()?,
            "one_region_leave_us" => t.one_region_leave_us = v.parse().ok()?,
            "one_region_pieces" => t.one_region_pieces = v.parse().ok()?,
            _ => return None,
        }
        Some(())
    }

    fn apply(&self, side: usize) {
        if let Some(t) = self.tuning(side) {
            crate::quant::set_decode_tuning(t);
        }
    }

    fn apply_default(&self) {
        crate::quant::set_decode_tuning(crate::quant::DecodeTuning::default());
    }
}
