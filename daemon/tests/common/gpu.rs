//! What the GPU product tests share: the Vulkan adapter (or why the test is skipped) and the
//! activations and weights they multiply. Each test binary uses part of it.
#![allow(dead_code)]

use colibri::gpu::{AttnGpu, Gpu, GpuChoice};
use colibri::rng::XorShift64;

/// A device of the test's own on the Vulkan adapter, or `None` (the test says it is skipped
/// and returns) when none opens.
pub fn vulkan(test: &str) -> Option<Gpu> {
    match Gpu::open(GpuChoice::Vulkan) {
        Ok(g) => Some(g),
        Err(e) => {
            eprintln!("{test}: skipped: {e} (install mesa-vulkan-drivers for lavapipe)");
            None
        }
    }
}

/// A deterministic spread of values with a few large ones (the int8 scale follows the amax).
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = XorShift64(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    (0..n)
        .map(|i| {
            let v = s.unit_f32() - 0.5;
            if i % 97 == 0 {
                v * 40.0
            } else {
                v
            }
        })
        .collect()
}

/// The attention kernels on the Vulkan adapter, or `None` (the test says it is skipped and
/// returns) when none opens. A kernel the device rejects fails the test: only a missing
/// driver skips it.
pub fn vulkan_attention(test: &str) -> Option<AttnGpu> {
    match colibri::gpu::shared(GpuChoice::Vulkan) {
        Ok(gpu) => Some(AttnGpu::new(gpu).unwrap()),
        Err(e) => {
            eprintln!("{test}: skipped: {e} (install mesa-vulkan-drivers for lavapipe)");
            None
        }
    }
}

/// Deterministic values in [-1, 1) with a few large ones (every 97th, offset by 5, times 30):
/// the wider spread the attention kernels are checked on.
pub fn wide_values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = XorShift64(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    (0..n)
        .map(|i| {
            let v = s.unit_f32() * 2.0 - 1.0;
            if i % 97 == 5 {
                v * 30.0
            } else {
                v
            }
        })
        .collect()
}
