//! The device itself: one adapter opened through wgpu, its queue and the product pipeline,
//! shared by everyone who computes there (see [`shared`]). Built with the `gpu` feature only.

use super::{matvec, run, GpuChoice, GpuError};

/// A buffer in device memory, as code outside `gpu/` holds it: a handle to pass back to the
/// kernels (a session's KV rows in its mirror), never read or bound there. Keeps wgpu's types
/// inside this module.
pub struct DeviceBuffer {
    pub(crate) buf: wgpu::Buffer,
}

impl GpuChoice {
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

/// An open adapter, its device and queue, and the compiled product pipeline.
pub struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) products: matvec::Products,
    /// The products' shared buffers (grow-only), made at the first batch; the lock also keeps
    /// one batch at a time on the staging buffer, and one user at a time on the error scopes.
    pub(super) io: std::sync::Mutex<Option<run::Io>>,
    /// Bytes between two products' call uniforms (the device's dynamic offset alignment).
    pub(super) call_stride: u32,
    /// Most workgroups a dispatch takes in one dimension (rows / 64, and positions).
    pub(super) max_workgroups: u32,
    /// `name (backend, driver)`, for the `[GPU]` line.
    pub name: String,
    /// The adapter's own name (HWINFO's gpu name).
    pub adapter: String,
    /// Largest single buffer the device takes, bytes.
    pub max_buffer: u64,
    /// Product batches run, and `COLI_GPU_FAIL_AFTER` (a simulated device loss, for tests).
    pub(super) batches: std::sync::atomic::AtomicU64,
    pub(super) fail_after: Option<u64>,
    /// Set by the first failed batch: the device is not used again.
    pub(super) lost: std::sync::atomic::AtomicBool,
    /// Times the shared buffers were made or grown.
    pub(super) grows: std::sync::atomic::AtomicU64,
    /// The loss was said (one `[GPU]` line for every user of the device).
    pub(super) said_lost: std::sync::atomic::AtomicBool,
    /// Dense matrices and experts held, for that line.
    pub(super) dense_held: std::sync::atomic::AtomicUsize,
    pub(crate) experts_held: std::sync::atomic::AtomicUsize,
    /// Attention runs here (`AttnGpu`), for that line.
    pub(super) attention_held: std::sync::atomic::AtomicBool,
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
