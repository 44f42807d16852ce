//! Each quantized format against the f32 forward over the same weights dequantized.
//!
//! * f32 activations (`--act f32`): the quantized model multiplies by exactly the dequantized
//!   weights, so it must equal the fake-quantized f32 model up to float summation order:
//!   |d logit| <= 1e-4. Justification: in full precision the engine is within 1e-6 of
//!   transformers on these fixtures (validate's LOGITS line), and dequantize-then-dot performs
//!   the same f32 operations; 100x headroom covers the different order of the sums.
//! * int8 activations (`--act int8`, the fast path): each activation is rounded to 1/254 of its
//!   row's max |x|, a relative error of at most 0.4% per element that partly averages out over
//!   a dot product (the kernel-level bound is asserted in `quant`'s tests). Through the layers
//!   that stays a few percent of the logit spread at a typical position, so the median
//!   position must be within 3% RMS of the spread. A few positions differ more: these random
//!   models have router top-k gaps of ~5e-4, so a perturbation of that size moves a token to
//!   another expert and its logits jump. Those are bounded only loosely (25% over all positions)
//!   and the measured figures are printed.

use std::path::PathBuf;

use colibri::cmd::validate::{check, logit_error, Reference};
use colibri::engine::Engine;
use colibri::model::{ActMode, LoadOptions};
use colibri::quant::QFormat;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

fn tf_logits(model: &str, case: &str, opts: LoadOptions) -> (Vec<f32>, usize) {
    let dir = fixture(model);
    let r = Reference::load(&dir.join("ref.json"), Some(case)).unwrap();
    let mut engine = Engine::open(vec![dir], opts).unwrap();
    let o = check(&mut engine, &r).unwrap();
    (o.tf_logits, o.tf_matched)
}

const FORMATS: [QFormat; 5] = [
    QFormat::I8Row,
    QFormat::I4Row,
    QFormat::I4G64,
    QFormat::I3G64,
    QFormat::I2Row,
];

fn opts(fmt: QFormat, act: ActMode, fake_quant: bool) -> LoadOptions {
    // The dense reference case: DSA selection flips (score gaps ~1e-4 on these random models)
    // would measure the indexer's sensitivity, not the arithmetic of the formats.
    LoadOptions {
        expert_fmt: fmt,
        dense_fmt: fmt,
        act,
        fake_quant,
        index_topk: Some(4096),
        ..LoadOptions::default()
    }
}

#[test]
fn quantized_models_match_their_dequantized_f32_twin() {
    // GLM-5's fixtures attend densely in "long_dense"; the other families have no indexer.
    for (model, case) in [
        ("tiny-dense-shared", "long_dense"),
        ("tiny-moe-bias", "long_dense"),
        ("tiny-qwen3-moe", "long"),
        ("tiny-qwen3-moe-step", "long"),
        ("tiny-glm4-moe", "long"),
        ("tiny-glm4-moe-groups", "long"),
        ("tiny-deepseek-v3", "long"),
        ("tiny-deepseek-v32", "long"),
    ] {
        let dir = fixture(model);
        let r = Reference::load(&dir.join("ref.json"), Some(case)).unwrap();
        let oracle = r.logits.clone().unwrap();
        let total = r.full_ids.len();
        for fmt in FORMATS {
            let (twin, _) = tf_logits(model, case, opts(fmt, ActMode::F32, true));
            let (exact, _) = tf_logits(model, case, opts(fmt, ActMode::F32, false));
            let (fast, agree) = tf_logits(model, case, opts(fmt, ActMode::Int8, false));
            let e_exact = logit_error(&exact, &twin);
            let e_fast = logit_error(&fast, &twin);
            let vocab = twin.len() / total;
            let mut per_pos: Vec<f64> = fast
                .chunks_exact(vocab)
                .zip(twin.chunks_exact(vocab))
                .map(|(a, b)| logit_error(a, b).rel_rms)
                .collect();
            per_pos.sort_by(f64::total_cmp);
            let median = per_pos[per_pos.len() / 2];
            let e_oracle = logit_error(&fast, &oracle);
            eprintln!(
                "{model} {:>9}: f32-act vs twin max {:.2e} | int8-act vs twin rel_rms {:.4} (median position {median:.4}) | vs transformers f32: argmax {agree}/{total}, rel_rms {:.4}",
                fmt.name(),
                e_exact.max_abs,
                e_fast.rel_rms,
                e_oracle.rel_rms
            );
            assert!(
                e_exact.max_abs <= 1e-4,
                "{model} {}: {e_exact:?}",
                fmt.name()
            );
            assert!(
                median <= 0.03,
                "{model} {}: median position {median}",
                fmt.name()
            );
            assert!(e_fast.rel_rms <= 0.25, "{model} {}: {e_fast:?}", fmt.name());
        }
    }
}

#[test]
fn both_attention_paths_agree_on_the_same_input() {
    use colibri::model::AttnPath;
    // MLA's two paths; grouped-query attention has one.
    for model in ["tiny-dense-shared", "tiny-moe-bias"] {
        let run = |path| {
            tf_logits(
                model,
                "long",
                LoadOptions {
                    attn_path: path,
                    ..LoadOptions::default()
                },
            )
            .0
        };
        let a = run(AttnPath::Reconstruct);
        let b = run(AttnPath::Absorbed);
        let e = logit_error(&a, &b);
        assert!(e.max_abs <= 1e-5, "{model}: {e:?}");
    }
}
