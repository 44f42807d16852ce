//! The GPU's attention-side kernels against the CPU functions they replace, on whatever
//! Vulkan adapter the machine has (Mesa's lavapipe where there is no GPU): RMSNorm rows,
//! rotary in each family's layout, SwiGLU, the residual add and the router's top-k on odd
//! shapes; then whole models with attention on the GPU against the CPU. The attention cores
//! themselves are checked against the CPU's private cores in `model/mla.rs`, `gqa.rs` and
//! `dsa_indexer.rs`. Without a Vulkan driver each test says it is skipped and why.

use colibri::config::RouterKind;
use colibri::gpu::{GpuChoice, RouterSpec};
use colibri::model::moe::Router;
use colibri::model::ops::rms_norm_rows;
use colibri::model::rope::Rope;
use colibri::quant::QMatrix;

#[path = "common/gpu.rs"]
mod gpu_common;
use gpu_common::{vulkan_attention as vulkan, wide_values as values};

/// `got` within `rel` of `want`, relative to want's largest magnitude; the worst error.
fn close(got: &[f32], want: &[f32], rel: f32, what: &str) -> f32 {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
    let worst = got
        .iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs() / scale)
        .fold(0f32, f32::max);
    assert!(
        worst <= rel,
        "{what}: worst relative error {worst:e} > {rel:e}"
    );
    worst
}

#[test]
fn rms_norm_rows_match_the_cpu() {
    let Some(g) = vulkan("rms_norm_rows_match_the_cpu") else {
        return;
    };
    let mut worst = 0f32;
    for cols in [1, 7, 64, 129, 300] {
        for rows in [1, 3, 17] {
            let x = values(rows * cols, (rows * 1000 + cols) as u64);
            let w = values(cols, cols as u64);
            let mut want = x.clone();
            rms_norm_rows(&mut want, &w, 1e-6);
            let mut got = x.clone();
            g.kernels().rms_norm_rows(&mut got, &w, 1e-6).unwrap();
            worst = worst.max(close(&got, &want, 2e-6, &format!("{rows}x{cols}")));
        }
    }
    eprintln!("rms_norm: worst relative error {worst:e}");
}

/// Rotary as each family lays it out: MLA's interleaved rope part after `nope` in every
/// head, GLM-4.5's partial rotate-half (the first `rotary_dim` of each head), DeepSeek-V3.2's
/// indexer rotate-half over the leading rope part, and YaRN's attention factor.
#[test]
fn rotary_matches_the_cpu_in_every_layout() {
    let Some(g) = vulkan("rotary_matches_the_cpu_in_every_layout") else {
        return;
    };
    let yarn = colibri::config::Yarn {
        factor: 40.0,
        original_max_position_embeddings: 4096.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        mscale_all_dim: 1.0,
        attention_factor: 1.3,
        truncate: true,
    };
    // (heads, head_len, offset, rope dim, rotate-half, yarn)
    let layouts = [
        (3, 24, 16, 8, false, false),
        (5, 40, 0, 20, true, false),
        (2, 36, 0, 6, true, false),
        (4, 24, 16, 8, false, true),
    ];
    for (heads, head_len, offset, dim, half, with_yarn) in layouts {
        let rope = if with_yarn {
            Rope::yarn(dim, 10000.0, &yarn)
        } else {
            Rope::new(dim, 10000.0)
        };
        for (rows, pos0) in [(1, 0), (3, 7), (17, 1000)] {
            let row_len = heads * head_len;
            let x = values(rows * row_len, (rows + dim) as u64);
            let mut want = x.clone();
            let mut table = Vec::new();
            for (r, row) in want.chunks_exact_mut(row_len).enumerate() {
                rope.cos_sin(pos0 + r, &mut table);
                for head in row.chunks_exact_mut(head_len) {
                    let part = &mut head[offset..offset + dim];
                    if half {
                        rope.rotate_half(part, pos0 + r);
                    } else {
                        rope.rotate(part, pos0 + r);
                    }
                }
            }
            let mut got = x.clone();
            g.kernels()
                .rope(&mut got, row_len, heads, head_len, offset, &table, half)
                .unwrap();
            close(&got, &want, 1e-6, &format!("{heads}x{head_len} rope {dim}"));
        }
    }
}

#[test]
fn swiglu_and_the_residual_add_match_the_cpu() {
    let Some(g) = vulkan("swiglu_and_the_residual_add_match_the_cpu") else {
        return;
    };
    for n in [1, 3, 17, 1000] {
        let (a, b) = (values(n, n as u64), values(n, 7 + n as u64));
        let mut want = a.clone();
        colibri::quant::expf::silu_mul(&mut want, &b);
        let mut got = a.clone();
        g.kernels().swiglu(&mut got, &b).unwrap();
        close(&got, &want, 1e-6, &format!("swiglu {n}"));
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        let mut got = a.clone();
        g.kernels().add(&mut got, &b).unwrap();
        assert_eq!(got, want, "add {n}");
    }
    assert!(g.kernels().add(&mut [1.0], &[1.0, 2.0]).is_err());
}

/// The router's choices equal the CPU's, its weights to f32 rounding: sigmoid with the
/// correction bias and groups (DeepSeek-V3, GLM-5), with and without norm_topk_prob and a
/// routed scaling factor; softmax routing (qwen3_moe).
#[test]
fn router_top_k_matches_the_cpu() {
    let Some(g) = vulkan("router_top_k_matches_the_cpu") else {
        return;
    };
    // (kind, experts, top_k, n_group, topk_group, norm, scaling)
    let cases = [
        (RouterKind::SigmoidBias, 32, 4, 4, 2, true, 2.5),
        (RouterKind::SigmoidBias, 24, 6, 8, 3, false, 1.0),
        (RouterKind::SigmoidBias, 17, 3, 1, 1, true, 1.0),
        (RouterKind::Softmax, 20, 4, 1, 1, true, 1.0),
        (RouterKind::Softmax, 9, 2, 1, 1, false, 1.0),
    ];
    for (kind, experts, top_k, n_group, topk_group, norm, scaling) in cases {
        let mut identity = vec![0.0; experts * experts];
        (0..experts).for_each(|e| identity[e * experts + e] = 1.0);
        let bias = match kind {
            RouterKind::SigmoidBias => values(experts, 99).iter().map(|v| v * 0.3).collect(),
            // gpt-oss's top-k softmax and DeepSeek-V4's sqrt-softplus are not among the cases
            // (the device kernel has no such mode; those models route on the CPU).
            RouterKind::Softmax | RouterKind::SoftmaxTopk | RouterKind::SqrtSoftplus => {
                vec![0.0; experts]
            }
        };
        let router = Router {
            weight: QMatrix::from_f32(identity, experts, experts),
            bias: bias.clone(),
            kind,
            top_k,
            n_group,
            topk_group,
            norm_topk_prob: norm,
            scaling,
        };
        for rows in [1, 3, 17] {
            let logits = values(rows * experts, (experts * rows) as u64);
            let spec = RouterSpec {
                bias: &bias,
                softmax: kind == RouterKind::Softmax,
                top_k,
                n_group,
                topk_group,
                norm_topk_prob: norm,
                scaling,
            };
            let (chosen, weights) = g.kernels().route(&logits, &spec).unwrap();
            for (r, x) in logits.chunks_exact(experts).enumerate() {
                let want = router.route(x);
                let got: Vec<usize> = chosen[r * top_k..(r + 1) * top_k]
                    .iter()
                    .map(|&e| e as usize)
                    .collect();
                assert_eq!(got, want.experts, "{kind:?} {experts} row {r}");
                close(
                    &weights[r * top_k..(r + 1) * top_k],
                    &want.weights,
                    1e-6,
                    &format!("{kind:?} {experts} row {r} weights"),
                );
            }
        }
    }
}

mod common;

use std::path::PathBuf;

use colibri::cmd::validate::Reference;
use colibri::engine::Engine;
use colibri::experts::TierConfig;
use colibri::model::{KvCache, LoadOptions, Logits, Model, SeqStep};
use colibri::sampling::Sampler;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

const FAMILIES: [&str; 6] = [
    "tiny-deepseek-v32",
    "tiny-moe-bias",
    "tiny-deepseek-v3",
    "tiny-qwen3-moe",
    "tiny-glm4-moe",
    "tiny-glm4-moe-groups",
];

/// f32 everywhere, attention on the GPU when `gpu`.
fn open(name: &str, gpu: bool) -> Engine {
    let tiers = if gpu {
        TierConfig {
            gpu: GpuChoice::Vulkan,
            vram_gb: Some(1.0),
            ..TierConfig::default()
        }
    } else {
        TierConfig::default()
    };
    let opts = LoadOptions {
        tiers,
        ..LoadOptions::default()
    };
    Engine::open(vec![fixture(name)], opts).unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn argmaxes(logits: &[f32], vocab: usize) -> Vec<usize> {
    logits
        .chunks_exact(vocab)
        .map(colibri::model::ops::argmax)
        .collect()
}

/// A cache holding `prefix` (fed in one forward).
fn cache_with(model: &Model, prefix: &[u32]) -> KvCache {
    let mut kv = model.new_cache();
    if !prefix.is_empty() {
        model.forward(&mut kv, prefix, Logits::Last).unwrap();
    }
    kv
}

/// With attention on the GPU, every sequence of a batch gets the logits it gets alone, bit for
/// bit (the device cores run per sequence, its norms per row), and the CPU's logits to f32
/// rounding with the same argmax at every position: decode rows at different depths, prefill
/// chunks, and the DSA families past `index_topk`.
#[test]
fn gpu_attention_batches_equal_single_sequences_and_the_cpu() {
    if vulkan("gpu_attention_batches_equal_single_sequences_and_the_cpu").is_none() {
        return;
    }
    for name in FAMILIES {
        let long = Reference::load(&fixture(name).join("ref.json"), Some("long")).unwrap();
        let ids = &long.full_ids;
        let (gpu, cpu) = (open(name, true), open(name, false));
        let vocab = gpu.model_for_tests().cfg.vocab_size;
        let cases: Vec<(&[u32], &[u32], Logits)> = vec![
            (&ids[..20], &ids[20..21], Logits::Last),
            (&ids[..5], &ids[5..6], Logits::Last),
            (&[], &ids[..7], Logits::All),
            (&ids[..9], &ids[9..17], Logits::All),
            (&ids[..1], &ids[1..ids.len() - 1], Logits::All),
        ];
        let mut alone = Vec::new();
        let mut worst = 0f32;
        for (prefix, feed, which) in &cases {
            let mut kv = cache_with(&gpu.model_for_tests(), prefix);
            let logits = gpu
                .model_for_tests()
                .forward(&mut kv, feed, *which)
                .unwrap();
            let mut kv_cpu = cache_with(&cpu.model_for_tests(), prefix);
            let want = cpu
                .model_for_tests()
                .forward(&mut kv_cpu, feed, *which)
                .unwrap();
            assert_eq!(argmaxes(&logits, vocab), argmaxes(&want, vocab), "{name}");
            worst = worst.max(close(&logits, &want, 1e-4, name));
            alone.push(bits(&logits));
        }
        let mut caches: Vec<KvCache> = cases
            .iter()
            .map(|(p, _, _)| cache_with(&gpu.model_for_tests(), p))
            .collect();
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
        gpu.model_for_tests()
            .forward_batch(&mut seqs, &mut logits)
            .unwrap();
        let mut at = 0;
        for (i, want) in alone.iter().enumerate() {
            let got = bits(&logits[at * vocab..(at + rows[i]) * vocab]);
            at += rows[i];
            assert!(&got == want, "{name}: sequence {i} differs in the batch");
        }
        eprintln!("{name}: GPU attention against the CPU, worst relative logit error {worst:e}");
    }
}

/// The device mirror follows the CPU cache through a truncation (new tokens then take the
/// truncated positions), a clear and a clone: each continues exactly as a fresh cache fed
/// the same history does, and as the CPU does.
#[test]
fn the_device_kv_mirror_follows_truncate_clear_and_clone() {
    if vulkan("the_device_kv_mirror_follows_truncate_clear_and_clone").is_none() {
        return;
    }
    for name in ["tiny-deepseek-v32", "tiny-qwen3-moe"] {
        let long = Reference::load(&fixture(name).join("ref.json"), Some("long")).unwrap();
        let ids = &long.full_ids;
        let (gpu, cpu) = (open(name, true), open(name, false));
        let m = &gpu.model_for_tests();
        let vocab = m.cfg.vocab_size;
        // History: ids[..12] then ids[30..38] at positions 12..20.
        let history: Vec<u32> = ids[..12].iter().chain(&ids[30..38]).copied().collect();
        let fresh = {
            let mut kv = cache_with(m, &ids[..12]);
            m.forward(&mut kv, &ids[30..38], Logits::All).unwrap()
        };
        let mut kv_cpu = cache_with(&cpu.model_for_tests(), &ids[..12]);
        let want = cpu
            .model_for_tests()
            .forward(&mut kv_cpu, &ids[30..38], Logits::All)
            .unwrap();
        assert_eq!(argmaxes(&fresh, vocab), argmaxes(&want, vocab), "{name}");
        close(&fresh, &want, 1e-4, name);

        // Truncated: positions 12..20 held other rows on the device, and the new tokens
        // bring the cache back to the length the device copy had.
        let mut kv = cache_with(m, &ids[..20]);
        kv.truncate(12);
        let got = m.forward(&mut kv, &ids[30..38], Logits::All).unwrap();
        assert!(bits(&got) == bits(&fresh), "{name}: after truncate");
        assert_eq!(kv.tokens, history);

        // Cleared, then fed the whole history.
        kv.clear();
        m.forward(&mut kv, &ids[..12], Logits::Last).unwrap();
        let got = m.forward(&mut kv, &ids[30..38], Logits::All).unwrap();
        assert!(bits(&got) == bits(&fresh), "{name}: after clear");

        // A clone (prefix adoption) and the original go on alike.
        let mut a = cache_with(m, &ids[..12]);
        let mut b = a.clone();
        let ga = m.forward(&mut a, &ids[30..38], Logits::All).unwrap();
        let gb = m.forward(&mut b, &ids[30..38], Logits::All).unwrap();
        assert!(bits(&ga) == bits(&fresh), "{name}: original");
        assert!(bits(&gb) == bits(&fresh), "{name}: clone");
    }
}

/// Four sessions decoded together through the engine's step with attention on the GPU give
/// the tokens each gives decoded alone, and the CPU's.
#[test]
fn batched_sessions_with_gpu_attention_decode_as_alone_and_on_the_cpu() {
    if vulkan("batched_sessions_with_gpu_attention_decode_as_alone_and_on_the_cpu").is_none() {
        return;
    }
    let prompts: [Vec<u32>; 4] = [
        (1..21).collect(),
        vec![7, 7, 7],
        vec![21, 3, 8, 40, 11],
        vec![1],
    ];
    let turns = |only: Option<usize>| -> Vec<(Vec<u32>, usize, Sampler)> {
        prompts
            .iter()
            .enumerate()
            .filter(|(i, _)| only.is_none_or(|o| o == *i))
            .map(|(i, p)| (p.clone(), 12 + 3 * i, Sampler::greedy()))
            .collect()
    };
    for name in ["tiny-deepseek-v32", "tiny-qwen3-moe"] {
        let decode = |gpu: bool, only: Option<usize>| {
            let mut engine = open(name, gpu);
            let t = turns(only);
            engine
                .start_sessions(t.len(), 256, None, false, None)
                .unwrap();
            common::run_to_end(&mut engine, t)
        };
        let cpu = decode(false, None);
        let batched = decode(true, None);
        assert_eq!(batched, cpu, "{name}: batched on the GPU against the CPU");
        for (i, want) in batched.iter().enumerate() {
            assert_eq!(&decode(true, Some(i))[0], want, "{name}: session {i} alone");
        }
    }
}

/// Speculative decoding with attention on the GPU: each verified draft cut back (a truncation
/// the device mirror follows without a full upload) leaves greedy output identical to decoding
/// without drafts, batched and alone, on the demo model (whose MTP drafts get accepted) and a
/// DSA fixture.
#[test]
fn greedy_drafts_with_gpu_attention_decode_as_without() {
    if vulkan("greedy_drafts_with_gpu_attention_decode_as_without").is_none() {
        return;
    }
    let demo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("demo");
    for (dir, reference) in [
        (demo, fixture("demo-trained")),
        (fixture("tiny-moe-bias"), fixture("tiny-moe-bias")),
    ] {
        let short = Reference::load(&reference.join("ref.json"), Some("short"));
        let p = short.unwrap().prompt_ids;
        // Different lengths, one with a repeat for the n-gram drafts to find.
        let mut rep = p.clone();
        rep.extend_from_slice(&p);
        let prompts = [p.clone(), p[..p.len() / 2].to_vec(), rep];
        let decode = |draft: usize, prompts: &[Vec<u32>]| {
            let opts = LoadOptions {
                draft,
                tiers: TierConfig {
                    gpu: GpuChoice::Vulkan,
                    vram_gb: Some(1.0),
                    ..TierConfig::default()
                },
                ..LoadOptions::default()
            };
            let mut engine = Engine::open(vec![dir.clone()], opts).unwrap();
            engine
                .start_sessions(prompts.len(), 512, None, false, None)
                .unwrap();
            let turns = prompts
                .iter()
                .map(|p| (p.clone(), 40, Sampler::greedy()))
                .collect();
            let out = common::run_to_end(&mut engine, turns);
            let drafted: u64 = engine.spec().proposed.iter().sum();
            (out, drafted)
        };
        let (off, _) = decode(0, &prompts);
        for draft in [1, 3] {
            let (on, drafted) = decode(draft, &prompts);
            assert_eq!(on, off, "{} --draft {draft}", dir.display());
            assert!(drafted > 0, "{}: drafts were verified", dir.display());
            let (alone, _) = decode(draft, &prompts[2..3]);
            assert_eq!(alone[0], off[2], "{} alone --draft {draft}", dir.display());
        }
    }
}
