//! The GPU tier against the CPU, on whatever Vulkan adapter the machine has (Mesa's lavapipe
//! where there is no GPU; `.ci/run` installs it): every product bit for bit equal to the CPU
//! kernel's on odd shapes, and batched sessions with their experts in VRAM giving the tokens
//! they give on the CPU. Without a Vulkan driver each test says it is skipped and why.

mod common;
#[path = "common/gpu.rs"]
mod gpu_common;

use colibri::experts::TierConfig;
use colibri::gpu::{GpuChoice, GpuMatrix, Product};
use colibri::model::ActMode;
use colibri::quant::{QFormat, QMatrix};
use common::{fixture, run_batch};
use gpu_common::{values, vulkan};

#[test]
fn gpu_products_equal_the_cpu_kernels_bit_for_bit() {
    let Some(gpu) = vulkan("gpu_products_equal_the_cpu_kernels_bit_for_bit") else {
        return;
    };
    for fmt in [QFormat::I8Row, QFormat::I4Row] {
        for (rows, cols) in [(37, 200), (64, 129), (5, 2056), (130, 64), (1, 7)] {
            let m = QMatrix::quantize(&values(rows * cols, rows as u64), rows, cols, fmt);
            let g = GpuMatrix::upload(&gpu, &m).unwrap();
            for n in [1, 3, 17] {
                let mut x = values(n * cols, (cols + n) as u64);
                // An all-zero position (scale 0) beside the others.
                if n > 1 {
                    x[cols..2 * cols].fill(0.0);
                }
                let mut want = vec![0.0; n * rows];
                m.matmul_i8act(&x, n, &mut want);
                let mut got = vec![Vec::new()];
                gpu.run(
                    &[Product {
                        matrix: &g,
                        x: &x,
                        n,
                        act: ActMode::Int8,
                    }],
                    &mut got,
                )
                .unwrap();
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got[0]),
                    bits(&want),
                    "{} {rows}x{cols}, {n} positions",
                    fmt.name()
                );
            }
        }
    }
}

/// Batched sessions with every expert in VRAM decode the tokens they decode on the CPU, in
/// each family and both formats the tier takes, and TIERS counts the VRAM tier.
#[test]
fn batched_sessions_on_the_vram_tier_decode_as_on_the_cpu() {
    if vulkan("batched_sessions_on_the_vram_tier_decode_as_on_the_cpu").is_none() {
        return;
    }
    for name in [
        "tiny-moe-bias",
        "tiny-qwen3-moe",
        "tiny-glm4-moe",
        "tiny-deepseek-v3",
    ] {
        for fmt in [QFormat::I8Row, QFormat::I4Row] {
            let (cpu, _) = run_batch(fixture(name), TierConfig::default(), fmt, 256);
            let on_gpu = TierConfig {
                gpu: GpuChoice::Vulkan,
                vram_gb: Some(1.0),
                ..TierConfig::default()
            };
            let (gpu, engine) = run_batch(fixture(name), on_gpu, fmt, 256);
            assert_eq!(gpu, cpu, "{name} {}", fmt.name());
            let tiers = engine.model_for_tests().experts.tiers();
            assert!(tiers.vram_experts > 0, "{name}: {tiers:?}");
            let s = &engine.model_for_tests().experts;
            let total = (s.n_sparse() * s.n_experts()) as u32;
            assert_eq!(
                tiers.ram_experts + tiers.vram_experts + tiers.disk_experts,
                total,
                "{name}: {tiers:?}"
            );
            // Every expert fits: none was read into RAM, each routed one counted a hit.
            assert_eq!(tiers.vram_experts, total, "{name}: {tiers:?}");
            let c = s.counters();
            assert_eq!((c.store.misses, c.store.hits_lru), (0, 0), "{name}: {c:?}");
            assert!(c.store.hits_pin > 0, "{name}: {c:?}");
        }
    }
}
