//! Decode steps through the model's reused working memory (`forward_into` on a warm scratch)
//! give the same bits whatever ran before them, and the same logits as a teacher-forced
//! forward over the whole sequence. (Agreement with transformers is `validate`'s job: the e2e
//! tests and `quantized.rs`.)

use std::path::PathBuf;

use colibri::cmd::validate::Reference;
use colibri::engine::Engine;
use colibri::model::{ActMode, AttnPath, LoadOptions, Logits, Model};
use colibri::quant::QFormat;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

const MODELS: [&str; 8] = [
    "tiny-deepseek-v3",
    "tiny-deepseek-v32",
    "tiny-moe-bias",
    "tiny-dense-shared",
    "tiny-qwen3-moe",
    "tiny-qwen3-moe-step",
    "tiny-glm4-moe",
    "tiny-glm4-moe-groups",
];

fn option_sets() -> [LoadOptions; 2] {
    [
        LoadOptions::default(),
        LoadOptions {
            expert_fmt: QFormat::I4G64,
            dense_fmt: QFormat::I8Row,
            act: ActMode::Int8,
            ..LoadOptions::default()
        },
    ]
}

/// Prefill `prompt`, then feed `rest` one token at a time: the logits after the prompt and
/// after each fed token, as bits.
fn decode_bits(model: &Model, prompt: &[u32], rest: &[u32]) -> Vec<Vec<u32>> {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let mut kv = model.new_cache();
    model.reserve(&mut kv, prompt.len() + rest.len());
    let mut logits = Vec::new();
    model
        .forward_into(&mut kv, prompt, Logits::Last, &mut logits)
        .unwrap();
    let mut out = vec![bits(&logits)];
    for &t in rest {
        model
            .forward_into(&mut kv, &[t], Logits::Last, &mut logits)
            .unwrap();
        out.push(bits(&logits));
    }
    out
}

#[test]
fn decode_steps_do_not_depend_on_what_ran_before() {
    for name in MODELS {
        let dir = fixture(name);
        let short = Reference::load(&dir.join("ref.json"), Some("short")).unwrap();
        let long = Reference::load(&dir.join("ref.json"), Some("long")).unwrap();
        let (prompt, rest) = short.full_ids.split_at(short.prompt_ids.len());
        for opts in option_sets() {
            let engine = Engine::open(vec![dir.clone()], opts.clone()).unwrap();
            let model = &engine.model_for_tests();
            let fresh = decode_bits(model, prompt, rest);
            // Leave every scratch buffer bigger and full of other values: a long teacher-forced
            // batch (all logits), then a failed forward (token out of the vocabulary).
            let mut kv = model.new_cache();
            model.forward(&mut kv, &long.full_ids, Logits::All).unwrap();
            let bad = model.cfg.vocab_size as u32;
            assert!(model.forward(&mut kv, &[1, bad], Logits::All).is_err());
            let after = decode_bits(model, prompt, rest);
            assert!(
                fresh == after,
                "{name} {:?}/{:?}: decode logits changed after a bigger forward",
                opts.expert_fmt,
                opts.act
            );
        }
    }
}

#[test]
fn decode_steps_match_the_teacher_forced_forward() {
    for name in MODELS {
        let dir = fixture(name);
        let r = Reference::load(&dir.join("ref.json"), Some("long")).unwrap();
        let (prompt, rest) = r.full_ids.split_at(r.prompt_ids.len());
        for opts in option_sets() {
            // The batch takes the absorbed path too, so both sides do the same attention.
            let opts = LoadOptions {
                attn_path: AttnPath::Absorbed,
                ..opts
            };
            let engine = Engine::open(vec![dir.clone()], opts.clone()).unwrap();
            let model = &engine.model_for_tests();
            let vocab = model.cfg.vocab_size;
            let steps = decode_bits(model, prompt, &rest[..rest.len() - 1]);
            let mut kv = model.new_cache();
            let all = model.forward(&mut kv, &r.full_ids, Logits::All).unwrap();
            let mut worst = 0.0f32;
            for (i, step) in steps.iter().enumerate() {
                let row = &all[(prompt.len() - 1 + i) * vocab..][..vocab];
                for (a, b) in step.iter().zip(row) {
                    worst = worst.max((f32::from_bits(*a) - b).abs());
                }
            }
            eprintln!(
                "{name} {:?}/{:?}: max |decode - teacher-forced| = {worst:e}",
                opts.expert_fmt, opts.act
            );
            // Bit-equal: with int8 activations a decode step takes the batched MoE path (every
            // ready expert's rows in one parallel region) and the batch the per-expert one, and
            // the kernels promise the same bits for any split of rows and any tile shape.
            assert_eq!(worst, 0.0, "{name}");
        }
    }
}
