//! The GPU: one adapter opened through wgpu (Vulkan, Metal or DX12 from one code path), and the
//! products the VRAM expert tier runs on it (`matvec.rs`, `tier.rs`).
//!
//! Exactness comes first: the products are the CPU's integer ones (int8 activations against
//! int8-per-row or int4-per-row weights, summed as exact 32-bit integers) with the same float
//! end (`sum as f32 * (activation scale * row scale)`), so a layer's output bytes do not depend
//! on which tier computed an expert. On a machine without a GPU, Mesa's software Vulkan
//! (lavapipe, `llvmpipe`) runs the same code, which is how the tests check it.

mod attention;
mod kv;
mod matvec;
mod ops;
mod tier;

pub use attention::{AttnGpu, DeviceF32, GqaShape, MlaShape};
pub use kv::KvMirror;
pub use matvec::{GpuMatrix, Product};
pub use ops::{Kernels, RouterSpec};
pub use tier::{ExpertRows, VramTier};

use std::fmt;

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

    fn backends(self) -> wgpu::Backends {
        match self {
            GpuChoice::Auto => {
                wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12
            }
            GpuChoice::Vulkan => wgpu::Backends::VULKAN,
            GpuChoice::Metal => wgpu::Backends::METAL,
            GpuChoice::Dx12 => wgpu::Backends::DX12,
            GpuChoice::Off => wgpu::Backends::empty(),
        }
    }
}

/// Why no GPU is used; every one of them leaves the CPU path, never a crash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuError {
    NoAdapter(String),
    Device(String),
    /// The device stopped answering or a transfer failed mid-turn.
    Lost(String),
}

impl fmt::Display for GpuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuError::NoAdapter(why) => write!(f, "no GPU adapter: {why}"),
            GpuError::Device(why) => write!(f, "the GPU could not be opened: {why}"),
            GpuError::Lost(why) => write!(f, "the GPU failed: {why}"),
        }
    }
}

/// An open adapter, its device and queue, and the compiled product pipeline.
pub struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) pipeline: wgpu::ComputePipeline,
    /// `name (backend, driver)`, for the `[GPU]` line.
    pub name: String,
    /// Largest single buffer the device takes, bytes.
    pub max_buffer: u64,
    /// Product batches run, and `COLI_GPU_FAIL_AFTER` (a simulated device loss, for tests).
    batches: std::sync::atomic::AtomicU64,
    fail_after: Option<u64>,
}

/// The process's one open adapter per `--gpu` choice: the dense weights, attention and the
/// VRAM expert tier share it (one device, one queue, one memory budget). A failure to open is
/// remembered, so every caller gets the same answer and the message is printed once by whoever
/// asked first.
pub fn shared(choice: GpuChoice) -> Result<std::sync::Arc<Gpu>, GpuError> {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};
    type Opened = Mutex<HashMap<GpuChoice, Result<Arc<Gpu>, GpuError>>>;
    static OPENED: OnceLock<Opened> = OnceLock::new();
    let mut opened = OPENED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    opened
        .entry(choice)
        .or_insert_with(|| Gpu::open(choice).map(Arc::new))
        .clone()
}

impl Gpu {
    /// Opens the first adapter `choice` allows. `Auto` skips software adapters. Most callers
    /// want [`shared`], which opens each choice once per process.
    pub fn open(choice: GpuChoice) -> Result<Gpu, GpuError> {
        if choice == GpuChoice::Off {
            return Err(GpuError::NoAdapter("--gpu off".into()));
        }
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        desc.backends = choice.backends();
        let instance = wgpu::Instance::new(desc);
        let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            ..Default::default()
        }))
        .map_err(|e| GpuError::NoAdapter(e.to_string()))?;
        let info = adapter.get_info();
        if choice == GpuChoice::Auto && info.device_type == wgpu::DeviceType::Cpu {
            return Err(GpuError::NoAdapter(format!(
                "only the software adapter {} ({}): name a backend (--gpu vulkan) to use it",
                info.name, info.driver
            )));
        }
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("colibri"),
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .map_err(|e| GpuError::Device(e.to_string()))?;
        let pipeline = matvec::pipeline(&device);
        Ok(Gpu {
            device,
            queue,
            pipeline,
            name: format!("{} ({:?}, {})", info.name, info.backend, info.driver),
            max_buffer: limits
                .max_storage_buffer_binding_size
                .min(limits.max_buffer_size),
            batches: std::sync::atomic::AtomicU64::new(0),
            fail_after: std::env::var("COLI_GPU_FAIL_AFTER")
                .ok()
                .and_then(|v| v.parse().ok()),
        })
    }
}
