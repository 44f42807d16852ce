//! The VRAM tier's experts with biases and a clamped SwiGLU against the CPU expert, on
//! whatever Vulkan adapter the machine has (Mesa's lavapipe where there is no GPU): gpt-oss's
//! `(up + 1) * gate * sigmoid(alpha * gate)` with its biases and clamps, and DeepSeek-V4's
//! clamp, on random weights with values well past the clamp, in every format the tier takes
//! them in (int8 and int4 per row, int4-g64, gpt-oss's published MXFP4), each product bit for
//! bit the CPU's; and batched sessions of the gpt-oss and DeepSeek-V4 fixtures with every
//! expert in VRAM decode the CPU's tokens. Without a Vulkan driver each test says it is
//! skipped and why.

mod common;
#[path = "common/gpu.rs"]
mod gpu_common;

use colibri::experts::{OssExpert, TierConfig};
use colibri::gpu::{ExpertRows, GpuChoice, VramTier};
use colibri::quant::{QFormat, QMatrix};
use colibri::rng::XorShift64;
use common::{fixture, run_batch};
use gpu_common::values;

/// A `rows x cols` matrix in `fmt` from deterministic values (MXFP4: random nibbles, and
/// e8m0 scales around 1 so the products are of the CPU's usual size).
fn matrix(rows: usize, cols: usize, fmt: QFormat, seed: u64) -> QMatrix {
    if fmt == QFormat::Mxfp4 {
        let mut s = XorShift64(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let blocks: Vec<u8> = (0..rows * cols / 2).map(|_| s.next_u64() as u8).collect();
        let scales: Vec<u8> = (0..rows * cols / 32)
            .map(|_| 122 + (s.next_u64() % 8) as u8)
            .collect();
        return QMatrix::from_mxfp4(rows, cols, blocks, &scales).unwrap();
    }
    QMatrix::quantize(&values(rows * cols, seed), rows, cols, fmt)
}

/// What an expert of `kind` adds to its matrices: none (plain SwiGLU), gpt-oss's biases
/// and clamped SwiGLU, or DeepSeek-V4's clamp (a small limit, so many values pass it).
fn activation(kind: usize, inter: usize, hidden: usize, seed: u64) -> Option<Box<OssExpert>> {
    let bias =
        |n: usize, k: u64| -> Vec<f32> { values(n, seed + k).iter().map(|v| v * 6.0).collect() };
    match kind {
        0 => None,
        1 => Some(Box::new(OssExpert {
            gate_bias: bias(inter, 1),
            up_bias: bias(inter, 2),
            down_bias: bias(hidden, 3),
            alpha: 1.702,
            limit: 7.0,
            dsv4: false,
        })),
        _ => Some(Box::new(OssExpert::dsv4(inter, hidden, 0.75))),
    }
}

/// The CPU expert's product of `x` (`n` rows), as `model::ops::swiglu` computes it in int8
/// mode; and how many gate and up values (biases added) were past the clamp.
fn cpu_expert(
    [gate, up, down]: [&QMatrix; 3],
    oss: Option<&OssExpert>,
    x: &[f32],
    n: usize,
) -> (Vec<f32>, usize) {
    let inter = gate.rows();
    let (mut g, mut u) = (vec![0.0; n * inter], vec![0.0; n * inter]);
    QMatrix::matmul_pair_i8act(gate, up, x, n, &mut g, &mut u);
    let mut past = 0;
    if let Some(o) = oss {
        for (i, (gv, uv)) in g.iter().zip(&u).enumerate() {
            let k = i % inter;
            past += (gv + o.gate_bias[k] > o.limit) as usize;
            past += ((uv + o.up_bias[k]).abs() > o.limit) as usize;
        }
        o.glu(&mut g, &u);
    } else {
        colibri::quant::expf::silu_mul(&mut g, &u);
    }
    let mut y = vec![0.0; n * down.rows()];
    down.matmul_i8act(&g, n, &mut y);
    if let Some(o) = oss {
        o.add_down_bias(&mut y);
    }
    (y, past)
}

#[test]
fn biased_and_clamped_experts_on_the_tier_are_the_cpus_bit_for_bit() {
    let test = "biased_and_clamped_experts_on_the_tier_are_the_cpus_bit_for_bit";
    let gpu = match colibri::gpu::shared(GpuChoice::Vulkan) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("{test}: skipped: {e} (install mesa-vulkan-drivers for lavapipe)");
            return;
        }
    };
    let (hidden, inter) = (128, 96);
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for fmt in [
        QFormat::I8Row,
        QFormat::I4Row,
        QFormat::I4G64,
        QFormat::Mxfp4,
    ] {
        let tier = VramTier::new(gpu.clone());
        // Experts 0..6: plain, gpt-oss and V4 kinds twice over, different weights each.
        let experts: Vec<_> = (0..6u64)
            .map(|e| {
                let mats = [
                    matrix(inter, hidden, fmt, 10 * e + 1),
                    matrix(inter, hidden, fmt, 10 * e + 2),
                    matrix(hidden, inter, fmt, 10 * e + 3),
                ];
                let kind = e as usize % 3;
                (mats, kind)
            })
            .collect();
        for (e, (m, kind)) in experts.iter().enumerate() {
            let oss = activation(*kind, inter, hidden, 100 + e as u64);
            tier.add(3, e, [&m[0], &m[1], &m[2]], oss).unwrap();
        }
        for n in [1, 3, 9] {
            // Each expert gets its own rows, all computed in one call of the tier.
            let xs: Vec<Vec<f32>> = (0..experts.len())
                .map(|e| {
                    let x = values(n * hidden, (1000 + 7 * e + n) as u64);
                    x.iter().map(|v| v * 4.0).collect()
                })
                .collect();
            let mut outs = vec![vec![f32::NAN; n * hidden]; experts.len()];
            let mut jobs: Vec<ExpertRows<'_>> = (xs.iter().zip(outs.iter_mut()))
                .enumerate()
                .map(|(e, (x, out))| ExpertRows {
                    expert: e,
                    x,
                    n,
                    out,
                })
                .collect();
            tier.run(3, &mut jobs).unwrap();
            drop(jobs);
            for (e, (m, kind)) in experts.iter().enumerate() {
                let oss = activation(*kind, inter, hidden, 100 + e as u64);
                let (want, past) = cpu_expert([&m[0], &m[1], &m[2]], oss.as_deref(), &xs[e], n);
                let what = format!("{} expert {e} (kind {kind}), {n} rows", fmt.name());
                // The clamp is exercised, not only the values inside it.
                if *kind != 0 {
                    assert!(past > 0, "{what}: no value past the clamp");
                }
                assert_eq!(bits(&outs[e]), bits(&want), "{what}");
            }
        }
    }
}

#[test]
fn biases_of_the_wrong_length_are_refused_at_upload() {
    let test = "biases_of_the_wrong_length_are_refused_at_upload";
    let gpu = match colibri::gpu::shared(GpuChoice::Vulkan) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("{test}: skipped: {e} (install mesa-vulkan-drivers for lavapipe)");
            return;
        }
    };
    let tier = VramTier::new(gpu);
    let (gate, up, down) = (
        matrix(64, 32, QFormat::I8Row, 1),
        matrix(64, 32, QFormat::I8Row, 2),
        matrix(32, 64, QFormat::I8Row, 3),
    );
    // Down's bias sized for the intermediate rows instead of the hidden ones.
    let bad = Box::new(OssExpert::dsv4(64, 64, 7.0));
    let e = tier
        .add(0, 5, [&gate, &up, &down], Some(bad))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("expert 5 of layer 0") && e.contains("64 intermediate and 32 hidden"),
        "{e}"
    );
    assert!(!tier.holds(0, 5));
}

/// Batched sessions of gpt-oss (its experts split per expert) and DeepSeek-V4 with every
/// expert in VRAM decode the tokens they decode on the CPU, in both per-row formats, and
/// every routed expert was a VRAM hit.
#[test]
fn batched_gpt_oss_and_v4_sessions_on_the_vram_tier_decode_as_on_the_cpu() {
    let test = "batched_gpt_oss_and_v4_sessions_on_the_vram_tier_decode_as_on_the_cpu";
    if gpu_common::vulkan(test).is_none() {
        return;
    }
    for name in ["tiny-gpt-oss-split", "tiny-deepseek-v4"] {
        for fmt in [QFormat::I8Row, QFormat::I4Row] {
            let (cpu, _) = run_batch(fixture(name), TierConfig::default(), fmt, 128);
            let on_gpu = TierConfig {
                gpu: GpuChoice::Vulkan,
                vram_gb: Some(1.0),
                ..TierConfig::default()
            };
            let (gpu, engine) = run_batch(fixture(name), on_gpu, fmt, 128);
            assert_eq!(gpu, cpu, "{name} {}", fmt.name());
            let s = &engine.model_for_tests().experts;
            let tiers = s.tiers();
            let total = (s.n_sparse() * s.n_experts()) as u32;
            assert_eq!(tiers.vram_experts, total, "{name}: {tiers:?}");
            let c = s.counters();
            assert_eq!((c.store.misses, c.store.hits_lru), (0, 0), "{name}: {c:?}");
            assert!(c.store.hits_pin > 0, "{name}: {c:?}");
        }
    }
}
