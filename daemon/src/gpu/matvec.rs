//! The products: a weight matrix of any [`QFormat`] in device memory times activations, one
//! invocation per output row and position (`matvec.wgsl`).
//!
//! * int8 activations (quantized on the CPU by the very code the CPU kernels use) against the
//!   per-row formats (int8, int4, int2): the dot is an exact 32-bit integer as on the CPU, then
//!   the CPU's float end, so these products equal the CPU's bit for bit.
//! * int8 activations against the grouped formats (int4-g64, int3-g64): exact integer sums per
//!   group, then the CPU's float order (sixteen lanes, a fixed tree), each product rounded on
//!   its own (the shader keeps the compiler from fusing it into the add), so these too are the
//!   CPU's bit for bit.
//! * f32 activations (f32 weights, or the others dequantized as the CPU does): the order of the
//!   CPU's `dot_f32` in the kernel set it runs (portable, AVX2 or AVX-512). The portable order
//!   has no fused operation and is the CPU's bit for bit; the AVX2/AVX-512 orders use WGSL's
//!   `fma`, which a device may compute unfused (lavapipe does), and then agree within a few
//!   units in the last place.
//! * MXFP4 (gpt-oss's published experts, kept as stored: nibbles and their e8m0 scales as
//!   f32) always meets f32 activations, as on the CPU, in `mxfp4::dot_row`'s order (eight
//!   lanes, each product rounded on its own, the CPU's fixed tree), which every CPU kernel set
//!   reproduces: the CPU's bit for bit wherever the device keeps subnormals (a scale byte of 0
//!   is 2^-127, a subnormal; published checkpoints do not use it).

use wgpu::util::DeviceExt;

use super::sync::Scopes;
use super::{Gpu, GpuError};
use crate::quant::{QFormat, QMatrix};

/// The compiled product and the layouts of its two bind groups.
pub(crate) struct Products {
    pub(super) pipeline: wgpu::ComputePipeline,
    /// Group 0: a matrix's shape uniform, weights and scales (one bind group per matrix).
    mat_layout: wgpu::BindGroupLayout,
    /// Group 1: the call uniform (dynamic offset), activations, their info, outputs.
    pub(super) io_layout: wgpu::BindGroupLayout,
    /// Bound as the scales of an f32 matrix, which has none (a binding is never empty).
    dummy: wgpu::Buffer,
}

fn entry(binding: u32, ty: wgpu::BufferBindingType, dynamic: bool) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty,
            has_dynamic_offset: dynamic,
            min_binding_size: None,
        },
        count: None,
    }
}

impl Products {
    pub(super) fn new(device: &wgpu::Device) -> Products {
        use wgpu::BufferBindingType::{Storage, Uniform};
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("matvec"),
            source: wgpu::ShaderSource::Wgsl(include_str!("matvec.wgsl").into()),
        });
        let layout = |label, entries: &[wgpu::BindGroupLayoutEntry]| {
            device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some(label),
                entries,
            })
        };
        let read = Storage { read_only: true };
        let mat_layout = layout(
            "matrix",
            &[
                entry(0, Uniform, false),
                entry(1, read, false),
                entry(2, read, false),
            ],
        );
        let io_layout = layout(
            "products",
            &[
                entry(0, Uniform, true),
                entry(1, read, false),
                entry(2, read, false),
                entry(3, Storage { read_only: false }, false),
            ],
        );
        let pl = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("matvec"),
            bind_group_layouts: &[Some(&mat_layout), Some(&io_layout)],
            immediate_size: 0,
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("matvec"),
            layout: Some(&pl),
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        let dummy = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("no scales"),
            size: 4,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        Products {
            pipeline,
            mat_layout,
            io_layout,
            dummy,
        }
    }
}

/// The shader's format code of `fmt`.
fn code(fmt: QFormat) -> u32 {
    match fmt {
        QFormat::I8Row => 0,
        QFormat::I4Row => 1,
        QFormat::I2Row => 2,
        QFormat::I4G64 => 3,
        QFormat::I3G64 => 4,
        QFormat::F32 => 5,
        QFormat::Mxfp4 => 6,
        // GGUF's blocks likewise (`experts/vram.rs` keeps them off).
        QFormat::Ggml(_) => unreachable!("GGUF block matrices stay on the CPU"),
    }
}

/// A matrix in device memory: its rows as stored on the CPU, each padded to whole 32-bit words
/// (zeros, which meet zero activations), its scales as stored, and its bind group, made once.
pub struct GpuMatrix {
    pub(super) bind: wgpu::BindGroup,
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) fmt: QFormat,
    /// Device bytes held.
    pub bytes: u64,
}

impl GpuMatrix {
    pub fn upload(gpu: &Gpu, m: &QMatrix) -> Result<GpuMatrix, GpuError> {
        let (rows, cols, fmt) = (m.rows(), m.cols(), m.format());
        let data = m.data();
        // The CPU's layout: whole rows of `row_bytes`, `spr` scales a row.
        let (row_bytes, spr) = (fmt.data_len(1, cols), fmt.scales_len(1, cols));
        if data.len() != rows * row_bytes || m.scales().len() != rows * spr {
            return Err(GpuError::Device(format!(
                "a {rows} x {cols} {} matrix of {} bytes and {} scales",
                fmt.name(),
                data.len(),
                m.scales().len()
            )));
        }
        let row_words = row_bytes.div_ceil(4);
        let mut packed = vec![0u8; (rows * row_words * 4).max(4)];
        if row_bytes > 0 {
            for (r, src) in data.chunks_exact(row_bytes).enumerate() {
                packed[r * row_words * 4..r * row_words * 4 + row_bytes].copy_from_slice(src);
            }
        }
        let scales: Vec<u8> = m.scales().iter().flat_map(|v| v.to_le_bytes()).collect();
        if packed.len() as u64 > gpu.max_buffer {
            return Err(GpuError::Device(format!(
                "a {rows} x {cols} matrix ({} bytes) exceeds the device's largest buffer ({})",
                packed.len(),
                gpu.max_buffer
            )));
        }
        let dev = &gpu.device;
        // A failed allocation is this upload's error, not a panic of wgpu's default handler.
        let scopes = Scopes::push(dev);
        let init = |label: &str, contents: &[u8], usage| {
            dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents,
                usage,
            })
        };
        let shape: Vec<u8> = [rows, cols, row_words, code(fmt) as usize, spr, 0, 0, 0]
            .iter()
            .flat_map(|&v| (v as u32).to_le_bytes())
            .collect();
        let shape = init("shape", &shape, wgpu::BufferUsages::UNIFORM);
        let w = init("weights", &packed, wgpu::BufferUsages::STORAGE);
        let s = (!scales.is_empty()).then(|| init("scales", &scales, wgpu::BufferUsages::STORAGE));
        let p = &gpu.products;
        let bind = dev.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("matrix"),
            layout: &p.mat_layout,
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: shape.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: w.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: s.as_ref().unwrap_or(&p.dummy).as_entire_binding(),
                },
            ],
        });
        if let Some(why) = scopes.pop() {
            return Err(GpuError::Device(format!("upload: {why}")));
        }
        Ok(GpuMatrix {
            bind,
            rows,
            cols,
            fmt,
            bytes: (packed.len() + scales.len()) as u64,
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn format(&self) -> QFormat {
        self.fmt
    }
}
