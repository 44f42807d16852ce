//! Steady-state decode does not touch the heap: a counting global allocator watches ~16 decode
//! steps (forward + sampling) of fixture models whose experts are all resident, after a prefill
//! and a few warm-up steps, and the count must be zero.
//!
//! The engine's step loop (`begin` + `step`) is checked the same way from inside. Rayon is measured separately: see
//! `rayon_allocs`.
//!
//! Everything runs in ONE `#[test]`: the counter is process-wide (rayon workers must count
//! too), so a second test allocating on another thread would be counted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use colibri::cmd::validate::Reference;
use colibri::engine::{Engine, Event, StepReport, TurnSpec};
use colibri::model::{ActMode, KvCache, LoadOptions, Logits, Model};
use colibri::quant::{QFormat, QMatrix};
use colibri::sampling::{Rng, Sampler, SamplingParams};
use rayon::prelude::*;

/// Counts allocations and reallocations (not frees) while `COUNTING` is on.
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static COUNT: AtomicUsize = AtomicUsize::new(0);

fn note() {
    if COUNTING.load(Ordering::Relaxed) {
        COUNT.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so the
// `GlobalAlloc` contract holds exactly as it does for `System`; the counting touches only atomics
// and never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: forwarded verbatim; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: forwarded verbatim.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: forwarded verbatim; `ptr` came from this allocator, i.e. from `System`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded verbatim; `ptr` came from `System`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made by `f`.
fn count_allocs(f: impl FnOnce()) -> usize {
    COUNT.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    f();
    COUNTING.store(false, Ordering::SeqCst);
    COUNT.load(Ordering::SeqCst)
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

/// Every routed expert of every sparse layer loaded into the LRU (the default cache holds all
/// of them), so decode never reads from disk.
fn make_all_resident(model: &Model) {
    for l in 0..model.cfg.num_hidden_layers {
        for e in 0..model.cfg.n_routed_experts {
            // Dense layers have no routed experts: an error, ignored.
            let _ = model.experts.get(l, e);
        }
    }
}

const WARMUP: usize = 4;
const COUNTED: usize = 16;

/// One decode step as `generate` runs it: forward the last token, sample the next.
fn step(
    model: &Model,
    kv: &mut KvCache,
    tok: u32,
    sampler: &mut Sampler,
    logits: &mut Vec<f32>,
) -> u32 {
    model
        .forward_into(kv, &[tok], Logits::Last, logits)
        .unwrap();
    sampler.sample(logits)
}

/// A fixture's reference: its own, or for a re-layout of another fixture's weights
/// (`NAME-split`), that fixture's.
fn reference(model_name: &str) -> PathBuf {
    let own = fixture(model_name).join("ref.json");
    match model_name.strip_suffix("-split") {
        Some(base) if !own.exists() => fixture(base).join("ref.json"),
        _ => own,
    }
}

/// Quantized weights (4-bit experts, 8-bit dense), every expert resident.
fn quantized(act: ActMode) -> LoadOptions {
    LoadOptions {
        expert_fmt: QFormat::I4G64,
        dense_fmt: QFormat::I8Row,
        act,
        ..LoadOptions::default()
    }
}

/// Allocations over `COUNTED` decode steps after prefill and warm-up.
/// With `pilot`, two I/O workers and the pilot guessing each next layer's experts (which are
/// all resident, so it reads nothing).
fn decode_allocs(model_name: &str, act: ActMode, mut sampler: Sampler, pilot: bool) -> usize {
    let dir = fixture(model_name);
    let r = Reference::load(&reference(model_name), Some("long")).unwrap();
    let mut opts = quantized(act);
    if pilot {
        opts.tiers.pipe = 2;
        opts.tiers.pilot = colibri::experts::PilotMode::On;
    }
    let workers = opts.tiers.pipe;
    let engine = Engine::open(vec![dir], opts).unwrap();
    let model = &engine.model_for_tests();
    make_all_resident(model);
    let mut kv = model.new_cache();
    // As `generate` does: room for the prompt and every step.
    model.reserve(&mut kv, r.prompt_ids.len() + WARMUP + COUNTED + 1);
    let mut logits = Vec::new();
    model
        .forward_into(&mut kv, &r.prompt_ids, Logits::Last, &mut logits)
        .unwrap();
    let mut tok = sampler.sample(&logits);
    for _ in 0..WARMUP {
        tok = step(model, &mut kv, tok, &mut sampler, &mut logits);
    }
    if pilot {
        wait_for_parked_io_workers(workers);
    }
    let misses = model.experts.counters().store.misses;
    let n = count_allocs(|| {
        for _ in 0..COUNTED {
            tok = step(model, &mut kv, tok, &mut sampler, &mut logits);
        }
    });
    assert_eq!(
        model.experts.counters().store.misses,
        misses,
        "{model_name}: an expert was read from disk during the counted steps"
    );
    eprintln!("{model_name} {act:?} pilot {pilot}: {n} allocations over {COUNTED} decode steps");
    n
}

/// Waits until the `n` I/O worker threads are asleep in their first receive. A worker's
/// first blocking receive allocates (crossbeam's per-thread context and the channels' waiter
/// lists grow once); on a busy machine a freshly spawned worker may get there only during the
/// counted steps, and the process-wide counter would charge that one-off to decode.
fn wait_for_parked_io_workers(n: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let mut parked = 0;
        for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            if !comm.starts_with("colibri-io-") {
                continue;
            }
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            // The state is the first field after the parenthesised command name.
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next());
            if state == Some("S") {
                parked += 1;
            }
        }
        if parked >= n {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "only {parked} of {n} I/O workers parked after 20 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Allocations in the engine's step loop (`begin` + `step`, as every caller drives it, its
/// up-front reservation included) once `WARMUP` tokens were produced.
fn engine_step_allocs(model_name: &str) -> usize {
    let dir = fixture(model_name);
    let r = Reference::load(&reference(model_name), Some("long")).unwrap();
    let mut engine = Engine::open(vec![dir], quantized(ActMode::Int8)).unwrap();
    make_all_resident(&engine.model_for_tests());
    engine
        .begin(
            0,
            TurnSpec {
                use_stops: false,
                ..TurnSpec::new(r.prompt_ids.clone(), WARMUP + COUNTED, Sampler::greedy())
            },
        )
        .unwrap();
    let mut report = StepReport::default();
    let mut seen = 0;
    let mut done = None;
    while done.is_none() {
        engine.step(&mut report).unwrap();
        for e in &report.events {
            match e {
                Event::Token { .. } => {
                    seen += 1;
                    if seen == WARMUP {
                        COUNT.store(0, Ordering::SeqCst);
                        COUNTING.store(true, Ordering::SeqCst);
                    }
                }
                Event::Done { outcome, .. } => done = Some(outcome.completion_tokens),
                Event::Prefill { .. } | Event::Logprob { .. } => {}
            }
        }
    }
    COUNTING.store(false, Ordering::SeqCst);
    assert_eq!(done, Some(WARMUP + COUNTED));
    let n = COUNT.load(Ordering::SeqCst);
    eprintln!("{model_name} engine step: {n} allocations over {COUNTED} decode steps");
    n
}

/// What rayon's own machinery allocates per parallel loop, from outside and from inside its
/// pool (the head-parallel attention and the matmuls use `par_chunks_mut` ... `for_each`).
/// The tiny fixtures stay under the parallel thresholds, so the decode checks above never
/// reach rayon; this measures it directly.
fn rayon_allocs(calls: usize) -> (usize, usize) {
    fn par_loop(buf: &mut [f32]) {
        buf.par_chunks_mut(256)
            .enumerate()
            .for_each(|(i, c)| c.iter_mut().for_each(|v| *v += i as f32));
    }
    let mut buf = vec![0.0f32; 64 * 256];
    let mut measure = || {
        (0..calls).for_each(|_| par_loop(&mut buf));
        count_allocs(|| (0..calls).for_each(|_| par_loop(&mut buf)))
    };
    let outside = measure();
    // `rayon::scope` runs its body on a pool thread.
    let inside = rayon::scope(|_| measure());
    (outside, inside)
}

/// The fixtures are too small for the matmuls to go parallel: this drives the decode-shaped
/// products that do (one matmul, gate+up pairs, the batched MoE products) on matrices big enough
/// to split across the threads, from a pool thread, and counts after a warm-up.
fn parallel_matmul_allocs() -> usize {
    let (rows, cols) = (512, 1024);
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919) % 201) as f32 - 100.0)
        .collect();
    let mats: Vec<QMatrix> = [QFormat::I4G64, QFormat::I8Row, QFormat::I4G64]
        .into_iter()
        .map(|f| QMatrix::quantize(&w, rows, cols, f))
        .collect();
    let x: Vec<f32> = (0..cols).map(|i| (i % 13) as f32 - 6.0).collect();
    let (mut y, mut y2, mut batch) = (vec![0.0; rows], vec![0.0; rows], vec![0.0; 3 * rows]);
    let mut step = || {
        mats[1].matmul_i8act(&x, 1, &mut y);
        QMatrix::matmul_pair_i8act(&mats[0], &mats[2], &x, 1, &mut y, &mut y2);
        QMatrix::matmul_batch_i8act(3, |j| (&mats[j], &x[..]), &mut batch);
    };
    rayon::scope(|_| {
        (0..WARMUP).for_each(|_| step());
        count_allocs(|| (0..16).for_each(|_| step()))
    })
}

#[test]
fn decode_steps_do_not_allocate() {
    // On a pool thread, as the binaries run every command (`main`): a forward called from
    // outside the pool hops onto a worker first, through rayon's allocating injector.
    let mut failures = rayon::scope(|_| decode_steps_do_not_allocate_in_pool());
    // A parallel loop entered from outside the pool hands its job to rayon's global injector
    // (a crossbeam `Injector`), which allocates a new block every 63 jobs: about 1.6 per 100
    // loops, a rayon internal the engine cannot reach. From a pool thread the job goes to the
    // worker's own deque, whose buffer is reused: that must stay zero.
    let calls = 1000;
    let (outside, inside) = rayon_allocs(calls);
    eprintln!(
        "rayon: {outside} allocations over {calls} parallel loops from outside the pool, {inside} from inside"
    );
    if inside != 0 {
        failures.push(format!("rayon inside its pool: {inside}"));
    }
    let n = parallel_matmul_allocs();
    eprintln!("parallel decode-shaped matmuls: {n} allocations over 16 steps");
    if n != 0 {
        failures.push(format!("parallel matmuls: {n}"));
    }
    assert!(failures.is_empty(), "allocations in decode: {failures:?}");
}

fn decode_steps_do_not_allocate_in_pool() -> Vec<String> {
    let mut failures = Vec::new();
    // GLM-5's two fixtures, and every other family (grouped-query attention, softmax and
    // group-limited routers, MLA without an indexer, YaRN, DeepSeek-V3.2's indexer, gpt-oss,
    // and Qwen3.5-MoE's DeltaNet and gated shared expert).
    for model in [
        "tiny-moe-bias",
        "tiny-dense-shared",
        "tiny-qwen3-moe",
        "tiny-glm4-moe-groups",
        "tiny-deepseek-v3",
        "tiny-deepseek-v32",
        // gpt-oss: sinks, sliding windows, biased experts with the clamped SwiGLU; split per
        // expert, and as published (MXFP4, gate and up interleaved, read in place).
        "tiny-gpt-oss-split",
        "tiny-gpt-oss-mxfp4",
        // Qwen3.5-MoE: Gated DeltaNet layers and the gated shared expert.
        "tiny-qwen35-moe",
        // DeepSeek-V4: hyper-connections, sliding, CSA (indexer) and HCA layers; the 16
        // counted steps close the fixture's CSA (rate 4) and HCA (rate 8) windows.
        "tiny-deepseek-v4",
    ] {
        for act in [ActMode::Int8, ActMode::F32] {
            for (name, sampler) in [
                ("greedy", Sampler::greedy()),
                ("top-p", Sampler::new(0.8, 0.9, Rng::new(7))),
                // Every filter and penalty on: their buffers are taken in the warm-up.
                (
                    "penalties",
                    Sampler::new(0.8, 0.9, Rng::new(7)).with_params(SamplingParams {
                        top_k: 40,
                        min_p: 0.02,
                        repeat_penalty: 1.1,
                        frequency_penalty: 0.5,
                        presence_penalty: 0.3,
                    }),
                ),
            ] {
                let n = decode_allocs(model, act, sampler, false);
                if n != 0 {
                    failures.push(format!("{model} {act:?} {name}: {n}"));
                }
            }
        }
        let n = decode_allocs(model, ActMode::Int8, Sampler::greedy(), true);
        if n != 0 {
            failures.push(format!("{model} pilot: {n}"));
        }
        let n = engine_step_allocs(model);
        if n != 0 {
            failures.push(format!("{model} generate: {n}"));
        }
    }
    failures
}
