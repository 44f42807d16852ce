//! `colibri bench --ref FILE`: replay `full_ids` exactly (prefill the prompt but its last
//! token, then decode the rest one token at a time, no sampling) and report speed beside the
//! machine's memory-read bandwidth. The last stdout line is
//! `BENCH prefill_pos_s=<x> decode_tok_s=<y> hit_pct=<z> read_gbs=<w>`.

use std::process::ExitCode;
use std::time::Instant;

use crate::cli::BenchArgs;
use crate::cmd::validate::Reference;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::model::Logits;

pub fn run(args: BenchArgs) -> Result<ExitCode, EngineError> {
    let opts = args.reference.load_options(&args.model)?;
    let r = Reference::load(&args.reference.reference, args.reference.case.as_deref())?;
    let engine = Engine::open(args.model.dirs()?, opts)?;
    let model = &engine.model;
    let prefill = &r.prompt_ids[..r.prompt_ids.len() - 1];
    let decode = &r.full_ids[prefill.len()..];
    let mut kv = model.new_cache();
    // Sized for the whole replay, as `generate` does, so decode is timed without regrowth.
    model.reserve(&mut kv, r.full_ids.len());
    let mut logits = Vec::with_capacity(model.cfg.vocab_size);
    if args.warmup && !prefill.is_empty() {
        let before = model.experts.counters();
        let t = Instant::now();
        model.forward_into(&mut kv, prefill, Logits::Last, &mut logits)?;
        let loads = model.experts.counters().misses - before.misses;
        eprintln!(
            "[bench] warm-up: {} prefill positions untimed in {:.3}s, {loads} expert loads",
            prefill.len(),
            t.elapsed().as_secs_f64()
        );
        kv = model.new_cache();
        model.reserve(&mut kv, r.full_ids.len());
    }
    let c0 = model.experts.counters();
    model.profile.reset();
    let t0 = Instant::now();
    if !prefill.is_empty() {
        model.forward_into(&mut kv, prefill, Logits::Last, &mut logits)?;
    }
    let prefill_s = t0.elapsed().as_secs_f64();
    let prefill_prof = model.profile.snapshot();
    model.profile.reset();
    let c1 = model.experts.counters();
    let t1 = Instant::now();
    for &tok in decode {
        model.forward_into(&mut kv, &[tok], Logits::Last, &mut logits)?;
    }
    let decode_s = t1.elapsed().as_secs_f64();
    let c2 = model.experts.counters();
    let decode_prof = model.profile.snapshot();

    let hit_pct = c2.hit_pct_since(&c0);
    let read_gbs = (c2.bytes_read - c0.bytes_read) as f64 / 1e9 / (prefill_s + decode_s).max(1e-9);
    let prefill_pos_s = prefill.len() as f64 / prefill_s.max(1e-9);
    let decode_tok_s = decode.len() as f64 / decode_s.max(1e-9);
    eprintln!(
        "[bench] {} prefill positions in {prefill_s:.3}s, {} decode steps in {decode_s:.3}s | experts {:.2} MB each ({} unless stored packed) / dense {} | act {:?}",
        prefill.len(),
        decode.len(),
        model.experts.expert_bytes() as f64 / 1e6,
        model.opts.expert_fmt.name(),
        model.opts.dense_fmt.name(),
        model.opts.act,
    );
    eprintln!(
        "[bench] prefill profile: {}",
        prefill_prof.describe(prefill_s)
    );
    eprintln!(
        "[bench] decode profile:  {}",
        decode_prof.describe(decode_s)
    );
    let loaded = (c2.misses - c1.misses) as f64 / decode.len().max(1) as f64;
    eprintln!(
        "[bench] decode: {loaded:.2} expert loads/token, {:.2} MB read/token",
        (c2.bytes_read - c1.bytes_read) as f64 / 1e6 / decode.len().max(1) as f64
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
    println!(
        "BENCH prefill_pos_s={prefill_pos_s:.2} decode_tok_s={decode_tok_s:.2} hit_pct={hit_pct:.1} read_gbs={read_gbs:.3}"
    );
    Ok(ExitCode::SUCCESS)
}
