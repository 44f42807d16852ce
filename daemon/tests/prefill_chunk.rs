//! A prompt's logits and cache are the same bits whatever chunk it is prefilled in (issue 50:
//! the engine's chunk grows where the experts stream from disk, `experts/chunk.rs`), which
//! decode = prefill, the prefix cache and KV resume rely on: the model fed in chunks of 256,
//! 2048 (the whole prompt at once) and 97 positions, at grouped-query and MLA shapes (each MLA
//! attention path alone, and `AttnPath::Auto`, which picks a path per 256 rows), f32 and int8
//! activations; and the engine's
//! step, which cuts the chunks, at its chunk while no one decodes and at most 256 while a
//! session does.

use std::path::PathBuf;

use colibri::engine::{Engine, Event, StepReport, TurnSpec};
use colibri::model::{ActMode, AttnPath, KvCache, LoadOptions, Logits, Model};
use colibri::quant::QFormat;
use colibri::sampling::Sampler;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `n` token ids below `vocab` from a fixed xorshift: a prompt longer than any fixture's.
fn prompt(n: usize, vocab: usize) -> Vec<u32> {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab as u64) as u32
        })
        .collect()
}

/// The cache's every stored float, layer by layer, as bits.
fn cache_bits(kv: &KvCache) -> Vec<Vec<u32>> {
    kv.layers
        .iter()
        .flat_map(|l| l.parts().into_iter().map(bits))
        .collect()
}

/// `ids` fed in chunks of `chunk`: the last position's logits and the cache, as bits.
fn prefill_bits(model: &Model, ids: &[u32], chunk: usize) -> (Vec<u32>, Vec<Vec<u32>>) {
    let mut kv = model.new_cache();
    let mut last = Vec::new();
    for (i, part) in ids.chunks(chunk).enumerate() {
        let end = (i + 1) * chunk >= ids.len();
        let which = if end { Logits::Last } else { Logits::None };
        let logits = model.forward(&mut kv, part, which).unwrap();
        if end {
            last = bits(&logits);
        }
    }
    assert_eq!(kv.tokens.len(), ids.len());
    (last, cache_bits(&kv))
}

const PROMPT: usize = 600;

#[test]
fn a_prompt_has_the_same_bits_in_any_chunk() {
    let int8 = LoadOptions {
        expert_fmt: QFormat::I4G64,
        dense_fmt: QFormat::I8Row,
        act: ActMode::Int8,
        ..LoadOptions::default()
    };
    let with_path = |o: &LoadOptions, p| LoadOptions {
        attn_path: p,
        ..o.clone()
    };
    let cases: Vec<(&str, LoadOptions)> = vec![
        ("tiny-qwen3-moe", LoadOptions::default()),
        ("tiny-qwen3-moe", int8.clone()),
        ("tiny-glm4-moe", int8.clone()),
        (
            "tiny-deepseek-v3",
            with_path(&LoadOptions::default(), AttnPath::Reconstruct),
        ),
        ("tiny-deepseek-v3", with_path(&int8, AttnPath::Reconstruct)),
        ("tiny-deepseek-v3", with_path(&int8, AttnPath::Absorbed)),
        ("tiny-deepseek-v32", with_path(&int8, AttnPath::Reconstruct)),
    ];
    for (name, opts) in cases {
        let engine = Engine::open(vec![fixture(name)], opts.clone()).unwrap();
        let model = engine.model_for_tests();
        let ids = prompt(PROMPT, model.cfg.vocab_size);
        let (logits, cache) = prefill_bits(model, &ids, 256);
        assert!(logits.iter().any(|&b| b != 0), "{name}: logits computed");
        for chunk in [2048, 97] {
            let (l, c) = prefill_bits(model, &ids, chunk);
            let what = format!("{name} {:?} {:?} chunk {chunk}", opts.act, opts.attn_path);
            assert!(
                l == logits,
                "{what}: the last logits differ from chunks of 256"
            );
            assert_eq!(c.len(), cache.len(), "{what}");
            for (i, (a, b)) in c.iter().zip(&cache).enumerate() {
                assert!(a == b, "{what}: cache part {i} differs from chunks of 256");
            }
        }
    }
}

/// Runs `prompt` on session 0 of an engine opened on `name` with chunk `chunk`, asking one
/// greedy token with every logprob: the Prefill events' `done`, the logprobs' bits and the
/// cache's bits.
fn engine_run(name: &str, chunk: usize) -> (Vec<usize>, Vec<(u32, u32)>, Vec<Vec<u32>>) {
    let opts = LoadOptions {
        attn_path: AttnPath::Reconstruct,
        ..LoadOptions::default()
    };
    let mut engine = Engine::open(vec![fixture(name)], opts).unwrap();
    engine.set_prefill_chunk(chunk);
    assert_eq!(engine.prefill_chunk(), chunk);
    let vocab = engine.model_for_tests().cfg.vocab_size;
    let ids = prompt(PROMPT, vocab);
    let mut sampler = Sampler::greedy();
    sampler.logprobs = Some(vocab);
    engine
        .begin(
            0,
            TurnSpec {
                use_stops: false,
                ..TurnSpec::new(ids, 1, sampler)
            },
        )
        .unwrap();
    let (mut done, mut lp) = (Vec::new(), Vec::new());
    let mut report = StepReport::default();
    while engine.any_active() {
        engine.step(&mut report).unwrap();
        for e in &report.events {
            match e {
                Event::Prefill { done: d, .. } => done.push(*d),
                Event::Logprob { lp: l, .. } => {
                    lp = l.top.iter().map(|&(id, p)| (id, p.to_bits())).collect()
                }
                _ => {}
            }
        }
    }
    assert_eq!(lp.len(), vocab, "{name}: every logprob came");
    (done, lp, cache_bits(engine.session(0).kv_for_tests()))
}

#[test]
fn the_engine_cuts_its_chunk_and_the_bits_do_not_move() {
    for name in ["tiny-qwen3-moe", "tiny-deepseek-v3"] {
        let (done, lp, cache) = engine_run(name, 256);
        assert_eq!(done, vec![256, 512, 600], "{name}");
        for (chunk, want) in [
            (2048, vec![600]),
            (97, vec![97, 194, 291, 388, 485, 582, 600]),
        ] {
            let (d, l, c) = engine_run(name, chunk);
            assert_eq!(d, want, "{name} chunk {chunk}");
            assert!(l == lp, "{name} chunk {chunk}: the logprobs differ");
            assert!(c == cache, "{name} chunk {chunk}: the cache differs");
        }
    }
}

#[test]
fn a_decoding_session_keeps_a_joining_prompt_at_256_positions() {
    let mut engine = Engine::open(vec![fixture("tiny-qwen3-moe")], LoadOptions::default()).unwrap();
    let vocab = engine.model_for_tests().cfg.vocab_size;
    engine.start_sessions(2, 4096, None, false, None).unwrap();
    engine.set_prefill_chunk(1024);
    let spec = |n, max_new| TurnSpec {
        use_stops: false,
        ..TurnSpec::new(prompt(n, vocab), max_new, Sampler::greedy())
    };
    let mut report = StepReport::default();
    // Session 0 decodes: its prompt, then its first tokens.
    engine.begin(0, spec(8, 4)).unwrap();
    engine.step(&mut report).unwrap();
    engine.begin(1, spec(PROMPT, 1)).unwrap();
    let mut chunks = Vec::new();
    while engine.any_active() {
        engine.step(&mut report).unwrap();
        let decoding = report
            .events
            .iter()
            .any(|e| matches!(e, Event::Token { slot: 0, .. }));
        for e in &report.events {
            if let Event::Prefill { slot: 1, done, .. } = e {
                chunks.push((*done, decoding));
            }
        }
    }
    // Beside session 0's three remaining tokens, 256-position chunks; alone, the rest at once.
    assert_eq!(
        chunks,
        vec![(256, true), (512, true), (600, true)],
        "{chunks:?}"
    );
    // Once no one decodes, the engine's chunk.
    engine.begin(1, spec(1500, 1)).unwrap();
    engine.step(&mut report).unwrap();
    let done: Vec<usize> = report
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Prefill { slot: 1, done, .. } => Some(*done),
            _ => None,
        })
        .collect();
    assert_eq!(done, vec![1024], "after the decode ended");
}

/// A chunk longer than 256 positions takes its rows' working set from the expert cache only
/// while it runs: before the prompt and once it is fed, every layer holds the cap the budget
/// gives without it; during the long chunk, that less the chunk's slots; and the turn's bits
/// are those of an engine whose budget never streamed.
#[test]
fn a_long_chunk_borrows_the_cache_only_while_it_runs() {
    use colibri::experts::chunk::ChunkRequest;
    let open = |ram_gb: Option<f64>| {
        let opts = LoadOptions {
            tiers: colibri::experts::TierConfig {
                ram_gb,
                ram_reserve: Some(0),
                prefill_chunk: ChunkRequest::Rows(320),
                ..Default::default()
            },
            ..LoadOptions::default()
        };
        let mut engine = Engine::open(vec![fixture("tiny-qwen3-moe")], opts).unwrap();
        engine.start_sessions(1, 1024, None, false, None).unwrap();
        engine
    };
    // 2.3 MB: 6 experts a layer held while decoding, 1 while 320 rows run.
    let mut engine = open(Some(0.0023));
    let mut whole = open(None);
    let cap = |e: &Engine| e.model_for_tests().experts.cap();
    let decode_cap = cap(&engine);
    assert!((2..8).contains(&decode_cap), "{decode_cap}");
    assert_eq!(cap(&whole), 8);
    let vocab = engine.model_for_tests().cfg.vocab_size;
    let spec = || TurnSpec {
        use_stops: false,
        ..TurnSpec::new(prompt(PROMPT, vocab), 4, Sampler::greedy())
    };
    let run = |e: &mut Engine, caps: &mut Vec<usize>| {
        e.begin(0, spec()).unwrap();
        let mut report = StepReport::default();
        let mut tokens = Vec::new();
        while e.any_active() {
            e.step(&mut report).unwrap();
            caps.push(cap(e));
            for ev in &report.events {
                if let Event::Token { id, .. } = ev {
                    tokens.push(*id);
                }
            }
        }
        tokens
    };
    let mut caps = Vec::new();
    let got = run(&mut engine, &mut caps);
    // 600 positions: chunks of 320 and 280, both long; then decode steps.
    let during = caps[0];
    assert!(during < decode_cap, "{caps:?}");
    assert_eq!(caps[1], during, "{caps:?}");
    assert!(caps[2..].iter().all(|&c| c == decode_cap), "{caps:?}");
    assert_eq!(caps.len(), 2 + 3, "{caps:?}");
    // The cache's size never changes a bit.
    assert_eq!(got, run(&mut whole, &mut Vec::new()));
    assert_eq!(got.len(), 4);
}

/// Under `AttnPath::Auto` an MLA chunk picks its path per 256 rows, each block as a chunk of
/// its own would: a 520-position prompt (two blocks on the reconstruct path, then 8 rows the
/// rule sends absorbed, at these shapes) has the same bits in one chunk as in chunks of 256,
/// the chunks an engine cuts while another session decodes; at DeepSeek-V3's and V3.2's
/// (DSA selection per row) shapes, f32 and int8.
#[test]
fn the_automatic_mla_path_is_chosen_per_256_rows() {
    let int8 = LoadOptions {
        expert_fmt: QFormat::I4G64,
        dense_fmt: QFormat::I8Row,
        act: ActMode::Int8,
        ..LoadOptions::default()
    };
    for name in ["tiny-deepseek-v3", "tiny-deepseek-v32"] {
        for opts in [LoadOptions::default(), int8.clone()] {
            let auto = Engine::open(vec![fixture(name)], opts.clone()).unwrap();
            let model = auto.model_for_tests();
            let ids = prompt(520, model.cfg.vocab_size);
            let (logits, cache) = prefill_bits(model, &ids, 256);
            let (l, c) = prefill_bits(model, &ids, 2048);
            assert!(l == logits, "{name} {:?}: logits differ", opts.act);
            assert!(c == cache, "{name} {:?}: the cache differs", opts.act);
            // The last 8 rows did go absorbed: the same prompt on the reconstruct path alone
            // ends in other bits (else this test could not fail).
            let rec = LoadOptions {
                attn_path: AttnPath::Reconstruct,
                ..opts.clone()
            };
            let engine = Engine::open(vec![fixture(name)], rec).unwrap();
            let (r, _) = prefill_bits(engine.model_for_tests(), &ids, 2048);
            assert!(
                r != logits,
                "{name} {:?}: no row took the absorbed path",
                opts.act
            );
        }
    }
}
