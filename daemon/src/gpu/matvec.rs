//! The product the VRAM tier runs: int8 activations (quantized on the CPU by the very code the
//! CPU kernels use) against an int8-per-row or int4-per-row matrix, one invocation per output
//! row and position, the dot an exact 32-bit integer as on the CPU, then the CPU's float end.

use std::sync::atomic::Ordering;

use wgpu::util::DeviceExt;

use super::{Gpu, GpuError};
use crate::quant::{quantize_natural, QFormat, QMatrix};

/// WGSL of the product. `acc` wraps as the CPU's does; its conversion to f32 goes through two
/// exactly representable halves added once, so it is the correctly rounded `acc as f32` on
/// every device (a plain `f32(acc)` above 2^24 may round either way); the float end is two
/// correctly rounded products, as on the CPU.
const SHADER: &str = r#"
struct Dims { rows: u32, row_words: u32, n: u32, x_words: u32, fmt: u32, pad0: u32, pad1: u32, pad2: u32 };
@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> scales: array<f32>;
@group(0) @binding(3) var<storage, read> x: array<u32>;
@group(0) @binding(4) var<storage, read> xinfo: array<u32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

// Signed byte k (0..4) of a word.
fn sb(v: u32, k: u32) -> i32 { return bitcast<i32>(v << (24u - 8u * k)) >> 24u; }

fn exact_f32(acc: i32) -> f32 {
    let hi = acc >> 12u;
    let lo = acc - (hi << 12u);
    return f32(hi) * 4096.0 + f32(lo);
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    let s = gid.y;
    if (r >= dims.rows || s >= dims.n) { return; }
    let wb = r * dims.row_words;
    let xb = s * dims.x_words;
    var acc: i32 = 0;
    if (dims.fmt == 0u) {
        for (var i = 0u; i < dims.row_words; i = i + 1u) {
            let a = w[wb + i];
            let b = x[xb + i];
            acc = acc + sb(a, 0u) * sb(b, 0u) + sb(a, 1u) * sb(b, 1u)
                      + sb(a, 2u) * sb(b, 2u) + sb(a, 3u) * sb(b, 3u);
        }
    } else {
        // Nibble t of word i is element 8i + t, stored as q + 8.
        for (var i = 0u; i < dims.row_words; i = i + 1u) {
            let a = w[wb + i];
            let b0 = x[xb + 2u * i];
            let b1 = x[xb + 2u * i + 1u];
            for (var t = 0u; t < 4u; t = t + 1u) {
                acc = acc + i32((a >> (4u * t)) & 15u) * sb(b0, t)
                          + i32((a >> (16u + 4u * t)) & 15u) * sb(b1, t);
            }
        }
        acc = acc - 8 * bitcast<i32>(xinfo[2u * s + 1u]);
    }
    let sx = bitcast<f32>(xinfo[2u * s]);
    y[s * dims.rows + r] = exact_f32(acc) * (sx * scales[r]);
}
"#;

pub(super) fn pipeline(device: &wgpu::Device) -> wgpu::ComputePipeline {
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("matvec"),
        source: wgpu::ShaderSource::Wgsl(SHADER.into()),
    });
    device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("matvec"),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    })
}

/// A matrix in device memory: its rows re-packed to whole 32-bit words (zero padded), one f32
/// scale per row.
pub struct GpuMatrix {
    w: wgpu::Buffer,
    scales: wgpu::Buffer,
    rows: usize,
    cols: usize,
    row_words: usize,
    /// 0: int8 per row, 1: int4 per row.
    fmt: u32,
    /// Device bytes held.
    pub bytes: u64,
}

impl GpuMatrix {
    /// Whether the GPU products take matrices of `fmt`.
    pub fn supports(fmt: QFormat) -> bool {
        matches!(fmt, QFormat::I8Row | QFormat::I4Row)
    }

    pub fn upload(gpu: &Gpu, m: &QMatrix) -> Result<GpuMatrix, GpuError> {
        let (rows, cols) = (m.rows(), m.cols());
        let (fmt, row_bytes) = match m.format() {
            QFormat::I8Row => (0, cols),
            QFormat::I4Row => (1, cols.div_ceil(2)),
            other => {
                return Err(GpuError::Device(format!(
                    "the GPU products take int8 or int4 per row, not {}",
                    other.name()
                )))
            }
        };
        // int4 words hold 8 elements and read two activation words each.
        let row_words = row_bytes.div_ceil(4);
        let data = m.data();
        let mut packed = vec![0u8; rows * row_words * 4];
        for r in 0..rows {
            packed[r * row_words * 4..r * row_words * 4 + row_bytes]
                .copy_from_slice(&data[r * row_bytes..(r + 1) * row_bytes]);
        }
        let scales: Vec<u8> = m.scales().iter().flat_map(|v| v.to_le_bytes()).collect();
        if scales.len() != rows * 4 {
            return Err(GpuError::Device(format!(
                "expected one scale per row ({rows}), found {}",
                scales.len() / 4
            )));
        }
        let bytes = (packed.len() + scales.len()) as u64;
        if packed.len() as u64 > gpu.max_buffer {
            return Err(GpuError::Device(format!(
                "a {rows} x {cols} matrix ({} bytes) exceeds the device's largest buffer ({})",
                packed.len(),
                gpu.max_buffer
            )));
        }
        let buf = |label: &str, contents: &[u8]| {
            gpu.device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some(label),
                    contents,
                    usage: wgpu::BufferUsages::STORAGE,
                })
        };
        Ok(GpuMatrix {
            w: buf("weights", &packed),
            scales: buf("scales", &scales),
            rows,
            cols,
            row_words,
            fmt,
            bytes,
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }
}

/// One product of a batch: `matrix` times the `n` positions of `x` (`(n, cols)` f32, quantized
/// per position here), into `(n, rows)`.
pub struct Product<'a> {
    pub matrix: &'a GpuMatrix,
    pub x: &'a [f32],
    pub n: usize,
}

/// Activation words a position takes for `cols` inputs: whole int4 words' worth (8 inputs).
fn x_words(cols: usize) -> usize {
    cols.div_ceil(8) * 2
}

impl Gpu {
    /// Runs every product of `batch` in one submission and one read back; `out[i]` gets
    /// product i's `(n, rows)` values.
    pub fn run(&self, batch: &[Product<'_>], out: &mut [Vec<f32>]) -> Result<(), GpuError> {
        self.fail_point()?;
        let dev = &self.device;
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let memory = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let mut outputs = Vec::with_capacity(batch.len());
        let mut enc = dev.create_command_encoder(&Default::default());
        let mut total = 0u64;
        for p in batch {
            let m = p.matrix;
            if p.x.len() != p.n * m.cols {
                return Err(GpuError::Device(format!(
                    "{} inputs for {} positions of {} columns",
                    p.x.len(),
                    p.n,
                    m.cols
                )));
            }
            let xw = x_words(m.cols);
            let mut q = vec![0i8; xw * 4];
            let mut xq = Vec::with_capacity(p.n * xw * 4);
            let mut info = Vec::with_capacity(p.n * 8);
            for row in p.x.chunks_exact(m.cols) {
                let (scale, sum) = quantize_natural(row, &mut q);
                xq.extend(q.iter().map(|&v| v as u8));
                info.extend_from_slice(&scale.to_bits().to_le_bytes());
                info.extend_from_slice(&sum.to_le_bytes());
            }
            let dims: Vec<u8> = [m.rows, m.row_words, p.n, xw, m.fmt as usize, 0, 0, 0]
                .iter()
                .flat_map(|&v| (v as u32).to_le_bytes())
                .collect();
            let init = |label: &str, contents: &[u8], usage| {
                dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some(label),
                    contents,
                    usage,
                })
            };
            let dims = init("dims", &dims, wgpu::BufferUsages::UNIFORM);
            let xbuf = init("x", &xq, wgpu::BufferUsages::STORAGE);
            let ibuf = init("xinfo", &info, wgpu::BufferUsages::STORAGE);
            let size = (p.n * m.rows * 4) as u64;
            let y = dev.create_buffer(&wgpu::BufferDescriptor {
                label: Some("y"),
                size: size.max(4),
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            });
            let layout = self.pipeline.get_bind_group_layout(0);
            let entries = [&dims, &m.w, &m.scales, &xbuf, &ibuf, &y];
            let entries: Vec<wgpu::BindGroupEntry> = entries
                .iter()
                .enumerate()
                .map(|(i, b)| wgpu::BindGroupEntry {
                    binding: i as u32,
                    resource: b.as_entire_binding(),
                })
                .collect();
            let bind = dev.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &layout,
                entries: &entries,
            });
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                pass.set_pipeline(&self.pipeline);
                pass.set_bind_group(0, &bind, &[]);
                pass.dispatch_workgroups((m.rows as u32).div_ceil(64), p.n as u32, 1);
            }
            outputs.push((y, total, size));
            total += size;
        }
        let staging = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("read back"),
            size: total.max(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        for (y, at, size) in &outputs {
            if *size > 0 {
                enc.copy_buffer_to_buffer(y, 0, &staging, *at, *size);
            }
        }
        self.queue.submit([enc.finish()]);
        let slice = staging.slice(..);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        dev.poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuError::Lost(e.to_string()))?;
        // Innermost first.
        if let Some(e) = pollster::block_on(memory.pop()) {
            return Err(GpuError::Lost(format!("out of memory: {e}")));
        }
        if let Some(e) = pollster::block_on(validation.pop()) {
            return Err(GpuError::Lost(format!("validation: {e}")));
        }
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(GpuError::Lost(format!("read back: {e}"))),
            Err(_) => return Err(GpuError::Lost("read back never completed".into())),
        }
        let data = slice
            .get_mapped_range()
            .map_err(|e| GpuError::Lost(format!("read back: {e}")))?;
        for ((_, at, size), o) in outputs.iter().zip(out.iter_mut()) {
            let bytes = &data[*at as usize..(*at + *size) as usize];
            o.clear();
            o.extend(
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            );
        }
        drop(data);
        staging.unmap();
        Ok(())
    }

    /// `COLI_GPU_FAIL_AFTER=N`: the (N+1)th batch fails as a lost device would (for the tests
    /// of the fallback).
    fn fail_point(&self) -> Result<(), GpuError> {
        let done = self.batches.fetch_add(1, Ordering::Relaxed);
        match self.fail_after {
            Some(n) if done >= n => Err(GpuError::Lost(format!(
                "device lost (simulated after {n} batches, COLI_GPU_FAIL_AFTER)"
            ))),
            _ => Ok(()),
        }
    }
}
