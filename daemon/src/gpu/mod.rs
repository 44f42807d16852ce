//! The GPU: one adapter opened through wgpu (Vulkan, Metal or DX12 from one code path), the
//! products of every weight format (`matvec.rs`, `run.rs`), the VRAM expert tier (`tier.rs`)
//! and the dense weights in VRAM (`dense.rs`).
//!
//! Exactness comes first. With int8 activations the products are the CPU's integer ones
//! (exact 32-bit sums per row or per 64-group) with the CPU's float end in the CPU's order,
//! every product rounded on its own as on the CPU, so a layer's output bytes do not depend on
//! which device computed it. With f32 activations the device follows the order of the CPU
//! kernels in use: the portable one exactly; the AVX2 and AVX-512 ones chain fused
//! multiply-adds, equal only where the device fuses them too, else within a few units in the
//! last place. On a machine without a GPU, Mesa's software Vulkan (lavapipe, `llvmpipe`) runs
//! the same code, which is how the tests check it.
//!
//! Built with the cargo feature `gpu` (on by default). Without it (`cargo build
//! --no-default-features`) wgpu is not compiled in: `stub.rs` gives the same names, none of
//! whose device types can be made, [`shared`] answers that the GPU is not built in, and the
//! options that would ask for a device are refused at start ([`refuse_without_gpu`]).

/// Declares the modules built with the `gpu` feature (the one switch between the two builds).
macro_rules! with_gpu {
    ($($item:item)*) => { $(#[cfg(feature = "gpu")] $item)* };
}

with_gpu! {
    mod attention;
    mod calls;
    mod dense;
    mod device;
    mod kv;
    mod matvec;
    mod ops;
    mod probe;
    mod run;
    mod sync;
    mod tier;

    pub use attention::{AttnGpu, DeviceF32, KeptKeys};
    pub use dense::{DeviceSlot, Placer};
    pub use device::{shared, DeviceBuffer, Gpu};
    pub use kv::KvMirror;
    pub use matvec::GpuMatrix;
    pub use ops::{Kernels, RouterSpec};
    pub use run::Product;
    pub use tier::VramTier;
}

#[cfg(not(feature = "gpu"))]
mod stub;
#[cfg(not(feature = "gpu"))]
pub use stub::*;

use std::fmt;

/// Whether this build has the GPU (the cargo feature `gpu`).
pub const BUILT_IN: bool = cfg!(feature = "gpu");

/// Refuses `--gpu NAME` (a backend) and `--vram-gb` on a build without the GPU (`built_in`
/// false): they ask for a device this binary cannot open, and running on as if they were not
/// given would hide that. `--gpu auto` (the default) and `--gpu off` ask for nothing.
pub fn refuse_without_gpu(
    built_in: bool,
    choice: GpuChoice,
    vram_gb: Option<f64>,
) -> Result<(), String> {
    let asked = match (choice, vram_gb) {
        (GpuChoice::Vulkan | GpuChoice::Metal | GpuChoice::Dx12, _) => "--gpu (COLI_GPU)",
        (GpuChoice::Auto, Some(_)) => "--vram-gb (VRAM_GB)",
        (GpuChoice::Auto | GpuChoice::Off, _) => return Ok(()),
    };
    if built_in {
        return Ok(());
    }
    Err(format!(
        "{asked} asks for the GPU, which this build does not have: rebuild with it \
         (cargo build --release --features gpu, or without --no-default-features)"
    ))
}

/// `--gpu`: which adapter the VRAM tier may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GpuChoice {
    /// A hardware GPU through any backend; never a software one (a CPU rasterizer would only
    /// slow the CPU path down).
    Auto,
    Vulkan,
    Metal,
    Dx12,
    Off,
}

impl GpuChoice {
    pub const NAMES: &'static str = "auto, vulkan, metal, dx12 or off";

    pub fn parse(s: &str) -> Result<GpuChoice, String> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "auto" => GpuChoice::Auto,
            "vulkan" => GpuChoice::Vulkan,
            "metal" => GpuChoice::Metal,
            "dx12" => GpuChoice::Dx12,
            "off" | "none" | "0" => GpuChoice::Off,
            other => {
                return Err(format!(
                    "unknown GPU backend {other:?}: use {}",
                    Self::NAMES
                ))
            }
        })
    }
}

/// Why no GPU is used; every one of them leaves the CPU path, never a crash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuError {
    NoAdapter(String),
    Device(String),
    /// The device stopped answering or a transfer failed mid-turn.
    Lost(String),
    /// The work asked a buffer of `bytes` and the device binds at most `max`: this work is
    /// refused before the device is asked (it runs on the CPU), the device itself is fine.
    TooBig {
        bytes: u64,
        max: u64,
    },
}

impl fmt::Display for GpuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuError::NoAdapter(why) => write!(f, "no GPU adapter: {why}"),
            GpuError::Device(why) => write!(f, "the GPU could not be opened: {why}"),
            GpuError::Lost(why) => write!(f, "the GPU failed: {why}"),
            GpuError::TooBig { bytes, max } => write!(
                f,
                "a buffer too big for the device ({bytes} bytes, the device binds at most {max})"
            ),
        }
    }
}

/// An MLA layer's shape for the device core.
#[derive(Clone, Copy, Debug)]
pub struct MlaShape {
    pub heads: usize,
    pub nope: usize,
    pub rope: usize,
    pub v: usize,
    pub kv_lora: usize,
    /// The softmax scale, YaRN's factor included (`Mla::scaling`).
    pub scale: f32,
}

/// A grouped-query layer's shape for the device core.
#[derive(Clone, Copy, Debug)]
pub struct GqaShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
}

/// What a `Placer` put in VRAM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DensePlaced {
    pub matrices: usize,
    pub bytes: u64,
    /// Held for attention on the device (each MLA layer's kv_b as f32, uploaded at its first
    /// use): counted against the budget before any dense matrix.
    pub attention: u64,
}

/// One expert's rows for `VramTier::run`: `x` is `(n, hidden)`, `out` receives `(n, hidden)`.
pub struct ExpertRows<'a> {
    pub expert: usize,
    pub x: &'a [f32],
    pub n: usize,
    pub out: &'a mut [f32],
}

/// The device the model's weights went to and the `--vram-gb` it was given, for HWINFO.
static IN_USE: std::sync::OnceLock<(String, f64)> = std::sync::OnceLock::new();

/// Records that the engine uses `gpu` with a budget of `vram_gb` (the first call counts).
pub fn note_in_use(gpu: &Gpu, vram_gb: f64) {
    let _ = IN_USE.set((gpu.adapter.clone(), vram_gb));
}

/// The adapter the engine uses and its `--vram-gb`, if any.
pub fn in_use() -> Option<(String, f64)> {
    IN_USE.get().cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A build without the GPU refuses what asks for a device, naming the option and how to
    /// build one that has it; what asks for nothing, and every choice on a build with the
    /// GPU, passes.
    #[test]
    fn a_build_without_the_gpu_refuses_what_asks_for_one() {
        let backend = refuse_without_gpu(false, GpuChoice::Vulkan, None).unwrap_err();
        assert!(
            backend.starts_with("--gpu (COLI_GPU) asks for the GPU"),
            "{backend}"
        );
        assert!(
            backend.contains("cargo build --release --features gpu"),
            "{backend}"
        );
        let vram = refuse_without_gpu(false, GpuChoice::Auto, Some(2.0)).unwrap_err();
        assert!(
            vram.starts_with("--vram-gb (VRAM_GB) asks for the GPU"),
            "{vram}"
        );
        for choice in [GpuChoice::Metal, GpuChoice::Dx12] {
            assert!(refuse_without_gpu(false, choice, Some(1.0)).is_err());
        }
        assert_eq!(refuse_without_gpu(false, GpuChoice::Auto, None), Ok(()));
        assert_eq!(refuse_without_gpu(false, GpuChoice::Off, Some(4.0)), Ok(()));
        for choice in [
            GpuChoice::Auto,
            GpuChoice::Vulkan,
            GpuChoice::Metal,
            GpuChoice::Dx12,
        ] {
            assert_eq!(refuse_without_gpu(true, choice, Some(1.0)), Ok(()));
        }
    }

    /// The options' refusal follows this build: `--gpu vulkan` parses and is refused exactly
    /// when the GPU is not built in, and then the one way to a device says why there is none.
    #[test]
    fn this_build_refuses_only_without_the_gpu() {
        let asked = refuse_without_gpu(BUILT_IN, GpuChoice::Vulkan, Some(1.0));
        assert_eq!(asked.is_err(), !BUILT_IN);
        if !BUILT_IN {
            let why = shared(GpuChoice::Vulkan)
                .err()
                .expect("no device without the GPU");
            assert!(why.to_string().contains("no GPU support"), "{why}");
        }
    }
}
