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

mod attention;
mod calls;
mod dense;
mod kv;
mod matvec;
mod ops;
mod probe;
mod run;
mod sync;
mod tier;

pub use attention::{AttnGpu, DeviceF32, GqaShape, KeptKeys, MlaShape};
pub use dense::{DensePlaced, DeviceSlot, Placer};
pub use kv::KvMirror;
pub use matvec::GpuMatrix;
pub use ops::{Kernels, RouterSpec};
pub use run::Product;
pub use tier::{ExpertRows, VramTier};

use std::fmt;

/// A buffer in device memory, as code outside `gpu/` holds it: a handle to pass back to the
/// kernels (a session's KV rows in its mirror), never read or bound there. Keeps wgpu's types
/// inside this module.
pub struct DeviceBuffer {
    pub(crate) buf: wgpu::Buffer,
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

/// An open adapter, its device and queue, and the compiled product pipeline.
pub struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) products: matvec::Products,
    /// The products' shared buffers (grow-only), made at the first batch; the lock also keeps
    /// one batch at a time on the staging buffer, and one user at a time on the error scopes.
    io: std::sync::Mutex<Option<run::Io>>,
    /// Bytes between two products' call uniforms (the device's dynamic offset alignment).
    call_stride: u32,
    /// Most workgroups a dispatch takes in one dimension (rows / 64, and positions).
    max_workgroups: u32,
    /// `name (backend, driver)`, for the `[GPU]` line.
    pub name: String,
    /// The adapter's own name (HWINFO's gpu name).
    pub adapter: String,
    /// Largest single buffer the device takes, bytes.
    pub max_buffer: u64,
    /// Product batches run, and `COLI_GPU_FAIL_AFTER` (a simulated device loss, for tests).
    batches: std::sync::atomic::AtomicU64,
    fail_after: Option<u64>,
    /// Set by the first failed batch: the device is not used again.
    lost: std::sync::atomic::AtomicBool,
    /// Times the shared buffers were made or grown.
    grows: std::sync::atomic::AtomicU64,
    /// The loss was said (one `[GPU]` line for every user of the device).
    said_lost: std::sync::atomic::AtomicBool,
    /// Dense matrices and experts held, for that line.
    dense_held: std::sync::atomic::AtomicUsize,
    pub(crate) experts_held: std::sync::atomic::AtomicUsize,
    /// Attention runs here (`AttnGpu`), for that line.
    attention_held: std::sync::atomic::AtomicBool,
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
        let products = matvec::Products::new(&device);
        Ok(Gpu {
            device,
            queue,
            products,
            io: std::sync::Mutex::new(None),
            call_stride: limits.min_uniform_buffer_offset_alignment.max(32),
            max_workgroups: limits.max_compute_workgroups_per_dimension,
            name: format!("{} ({:?}, {})", info.name, info.backend, info.driver),
            adapter: info.name.clone(),
            max_buffer: limits
                .max_storage_buffer_binding_size
                .min(limits.max_buffer_size),
            batches: std::sync::atomic::AtomicU64::new(0),
            fail_after: std::env::var("COLI_GPU_FAIL_AFTER")
                .ok()
                .and_then(|v| v.parse().ok()),
            lost: std::sync::atomic::AtomicBool::new(false),
            grows: std::sync::atomic::AtomicU64::new(0),
            said_lost: Default::default(),
            dense_held: Default::default(),
            experts_held: Default::default(),
            attention_held: Default::default(),
        })
    }
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

impl Gpu {
    /// Whether a batch failed: nothing runs on the device any more.
    pub fn failed(&self) -> bool {
        self.lost.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The one `[GPU]` line of a device loss, whichever user saw it first: what the device
    /// held now runs on the CPU.
    pub fn announce_loss(&self, why: &GpuError) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.said_lost.swap(true, Relaxed) {
            return;
        }
        // Whoever saw it first, the device is not used again by anyone.
        self.lost.store(true, Relaxed);
        let attention = if self.attention_held.load(Relaxed) {
            "attention is off (the CPU computes it from its own KV cache, the reference copy), "
        } else {
            ""
        };
        let dense = match self.dense_held.load(Relaxed) {
            0 => String::new(),
            n => format!("its {n} dense matrices run on the CPU and "),
        };
        crate::elog!(
            "[GPU] {why}: {attention}{dense}the VRAM tier is off; its {} experts are read from disk and run on the CPU from now on",
            self.experts_held.load(Relaxed)
        );
    }

    pub(crate) fn note_attention(&self) {
        self.attention_held
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn note_dense(&self, n: usize) {
        self.dense_held
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }
}
