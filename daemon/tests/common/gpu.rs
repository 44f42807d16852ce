//! What the GPU product tests share: the Vulkan adapter (or why the test is skipped) and the
//! activations and weights they multiply.

use colibri::gpu::{Gpu, GpuChoice};

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
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let v = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            if i % 97 == 0 {
                v * 40.0
            } else {
                v
            }
        })
        .collect()
}
