//! A forward over several sequences at once (`Model::forward_batch`) gives every sequence
//! exactly the logits, bit for bit, that a forward of that sequence alone gives, and leaves
//! every cache as the single-sequence forward would: decode rows beside prefill chunks,
//! sequences of different lengths (so the DSA indexer is sparse for some and dense for
//! others), f32 and int8 activations, both attention paths.

use std::path::PathBuf;

use colibri::cmd::validate::Reference;
use colibri::engine::Engine;
use colibri::model::{ActMode, AttnPath, KvCache, LoadOptions, Logits, Model, SeqStep};
use colibri::quant::QFormat;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

fn option_sets() -> Vec<LoadOptions> {
    let q = LoadOptions {
        expert_fmt: QFormat::I4G64,
        dense_fmt: QFormat::I8Row,
        act: ActMode::Int8,
        ..LoadOptions::default()
    };
    vec![
        LoadOptions::default(),
        LoadOptions {
            attn_path: AttnPath::Absorbed,
            ..LoadOptions::default()
        },
        q.clone(),
        LoadOptions {
            attn_path: AttnPath::Reconstruct,
            ..q
        },
    ]
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A cache holding `prefix` (fed in one forward).
fn cache_with(model: &Model, prefix: &[u32]) -> KvCache {
    let mut kv = model.new_cache();
    if !prefix.is_empty() {
        model.forward(&mut kv, prefix, Logits::Last).unwrap();
    }
    kv
}

#[test]
fn batched_step_equals_each_sequence_alone() {
    for name in [
        "tiny-moe-bias",
        "tiny-dense-shared",
        "tiny-qwen3-moe",
        "tiny-qwen3-moe-step",
        "tiny-glm4-moe",
        "tiny-glm4-moe-groups",
        "tiny-deepseek-v3",
        "tiny-deepseek-v32",
    ] {
        let dir = fixture(name);
        let long = Reference::load(&dir.join("ref.json"), Some("long")).unwrap();
        let ids = &long.full_ids;
        assert!(ids.len() >= 40, "{name}: the long case is long enough");
        for opts in option_sets() {
            let engine = Engine::open(vec![dir.clone()], opts.clone()).unwrap();
            let model = &engine.model_for_tests();
            let vocab = model.cfg.vocab_size;
            // (cached prefix, fed tokens, which logits): two decode rows at different depths,
            // a prefill chunk onto an empty cache, a chunk after a prefix, a long prefill.
            let cases: Vec<(&[u32], &[u32], Logits)> = vec![
                (&ids[..20], &ids[20..21], Logits::Last),
                (&ids[..5], &ids[5..6], Logits::Last),
                (&[], &ids[..7], Logits::All),
                (&ids[..9], &ids[9..17], Logits::Last),
                (&ids[..1], &ids[1..ids.len() - 1], Logits::All),
            ];
            // Alone: each sequence's logits and cache.
            let mut alone = Vec::new();
            for (prefix, feed, which) in &cases {
                let mut kv = cache_with(model, prefix);
                let logits = model.forward(&mut kv, feed, *which).unwrap();
                alone.push((bits(&logits), kv));
            }
            // Together, in one forward: all of them (a prefill-sized batch), and the decode
            // rows with one short chunk (a few-rows batch, the MoE's one-expert-per-thread path).
            for subset in [vec![0, 1, 2, 3, 4], vec![0, 1, 2]] {
                let cases: Vec<_> = subset.iter().map(|&i| cases[i]).collect();
                let alone: Vec<_> = subset.iter().map(|&i| &alone[i]).collect();
                let mut caches: Vec<KvCache> =
                    cases.iter().map(|(p, _, _)| cache_with(model, p)).collect();
                let mut seqs: Vec<SeqStep> = caches
                    .iter_mut()
                    .zip(&cases)
                    .map(|(kv, (_, feed, which))| SeqStep {
                        kv,
                        tokens: feed,
                        logits: *which,
                    })
                    .collect();
                let rows: Vec<usize> = seqs.iter().map(SeqStep::logit_rows).collect();
                let mut logits = Vec::new();
                model.forward_batch(&mut seqs, &mut logits).unwrap();
                drop(seqs);
                assert_eq!(logits.len(), rows.iter().sum::<usize>() * vocab);
                let mut at = 0;
                for (i, ((want, kv_alone), kv)) in
                    alone.iter().map(|a| (&a.0, &a.1)).zip(&caches).enumerate()
                {
                    let got = bits(&logits[at * vocab..(at + rows[i]) * vocab]);
                    at += rows[i];
                    assert!(
                        got == *want,
                        "{name} {:?} {:?} {subset:?}: sequence {i}'s logits differ in the batch",
                        opts.expert_fmt,
                        opts.attn_path
                    );
                    assert_eq!(kv.tokens, kv_alone.tokens);
                    for (a, b) in kv.layers.iter().zip(&kv_alone.layers) {
                        for (a, b) in a.parts().into_iter().zip(b.parts()) {
                            assert_eq!(bits(a), bits(b));
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn a_bad_token_fails_the_whole_batch_and_changes_no_cache() {
    let dir = fixture("tiny-moe-bias");
    let engine = Engine::open(vec![dir], LoadOptions::default()).unwrap();
    let model = &engine.model_for_tests();
    let mut a = cache_with(model, &[1, 2, 3]);
    let mut b = model.new_cache();
    let bad = [model.cfg.vocab_size as u32];
    let mut seqs = [
        SeqStep {
            kv: &mut a,
            tokens: &[4],
            logits: Logits::Last,
        },
        SeqStep {
            kv: &mut b,
            tokens: &bad,
            logits: Logits::Last,
        },
    ];
    let err = model.forward_batch(&mut seqs, &mut Vec::new()).unwrap_err();
    let vocab = model.cfg.vocab_size;
    assert!(
        matches!(err, colibri::error::EngineError::TokenOutOfVocab { token, vocab: v } if token as usize == vocab && v == vocab),
        "{err}"
    );
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");
    assert_eq!(a.len(), 3);
    assert_eq!(a.tokens, [1, 2, 3]);
    assert!(b.is_empty());
}
