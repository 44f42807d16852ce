//! Running a batch of products: activations quantized (or copied) on the CPU into one
//! upload, every product dispatched in one compute pass, every output read back through one
//! staging buffer. The activation, info, call and output buffers and their bind group belong
//! to the device and only grow, so a steady stream of batches creates no buffer and no bind
//! group (each matrix has its own, made at upload).

use std::sync::atomic::Ordering;

use super::sync::Scopes;
use super::{Gpu, GpuError, GpuMatrix};
use crate::quant::{quantize_natural, ActMode, KernelSet, QFormat};

/// One product of a batch: `matrix` times the `n` positions of `x` (`(n, cols)` f32), into
/// `(n, rows)`. With [`ActMode::Int8`] each position is quantized as the CPU kernels do; an f32
/// matrix (which the CPU never multiplies with int8 activations) takes f32 activations either
/// way, as on the CPU.
pub struct Product<'a> {
    pub matrix: &'a GpuMatrix,
    pub x: &'a [f32],
    pub n: usize,
    pub act: ActMode,
}

/// Positions one invocation of the tiled products takes (`TP` in matvec.wgsl).
const TILE_POSITIONS: usize = 4;

/// Whether the shader's `row_tile` computes `p` (its `tiled()`): int8 activations against int8
/// or int4 per row, at more than one position.
fn tiled(p: &Product<'_>) -> bool {
    p.act == ActMode::Int8 && matches!(p.matrix.fmt, QFormat::I8Row | QFormat::I4Row) && p.n > 1
}

/// Activation words a position takes: whole 64-element groups (16 words), which covers the
/// words every format's loop reads.
fn x_words(cols: usize) -> usize {
    cols.div_ceil(64) * 16
}

/// The order of the CPU's f32 dot product in the kernels it runs now (`order` in the shader):
/// the AVX2 and AVX-512 kernels chain fused multiply-adds their own ways, the others share the
/// portable order.
fn f32_order() -> usize {
    match KernelSet::active().name() {
        "avx2" => 1,
        name if name.starts_with("avx512") => 2,
        _ => 0,
    }
}

/// The call uniform's fields (`Call` in the shader).
const CALL_WORDS: usize = 8;

/// The grow-only buffers the products share, and the bind group over them.
pub(crate) struct Io {
    calls: wgpu::Buffer,
    x: wgpu::Buffer,
    info: wgpu::Buffer,
    y: wgpu::Buffer,
    staging: wgpu::Buffer,
    bind: wgpu::BindGroup,
}

/// A batch laid out for upload: the words of each buffer, and where each product's output is.
#[derive(Default)]
struct Staged {
    calls: Vec<u32>,
    x: Vec<u32>,
    info: Vec<u32>,
    /// Per product: output offset and length, in floats.
    outs: Vec<(usize, usize)>,
    y_len: usize,
}

impl Staged {
    fn of(batch: &[Product<'_>], call_stride: usize) -> Result<Staged, GpuError> {
        let mut st = Staged::default();
        let mut q = Vec::new();
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
            // MXFP4 always meets f32 activations, as on the CPU (`QMatrix::i8_via_f32`).
            let f32_act = p.act == ActMode::F32
                || matches!(m.fmt, QFormat::F32 | QFormat::Mxfp4)
                || m.via_f32();
            let (x_off, info_off) = (st.x.len(), st.info.len());
            let (x_stride, info_stride);
            if f32_act {
                x_stride = m.cols;
                info_stride = 0;
                st.x.extend(p.x.iter().map(|v| v.to_bits()));
            } else {
                x_stride = x_words(m.cols);
                let groups = m.cols.div_ceil(64);
                info_stride = 2 + groups;
                q.clear();
                q.resize(x_stride * 4, 0i8);
                for row in p.x.chunks_exact(m.cols.max(1)).take(p.n) {
                    let (scale, total) = quantize_natural(row, &mut q);
                    st.x.extend(q.chunks_exact(4).map(|b| {
                        u32::from_le_bytes([b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8])
                    }));
                    st.info.push(scale.to_bits());
                    st.info.push(total as u32);
                    // The per-group sums of the grouped formats, from the very values.
                    for g in q[..groups * 64].chunks_exact(64) {
                        st.info
                            .push(g.iter().map(|&v| v as i32).sum::<i32>() as u32);
                    }
                }
            }
            let call = [
                p.n,
                f32_act as usize,
                x_off,
                x_stride,
                info_off,
                info_stride,
                st.y_len,
                f32_order(),
            ];
            st.calls.extend(call.iter().map(|&v| v as u32));
            st.calls
                .resize(st.calls.len() + call_stride / 4 - CALL_WORDS, 0);
            st.outs.push((st.y_len, p.n * m.rows));
            st.y_len += p.n * m.rows;
        }
        Ok(st)
    }
}

impl GpuMatrix {
    /// Whether the CPU multiplies this matrix with f32 activations even in int8 mode: a per-row
    /// format so wide that a row's i32 sum could overflow (never for real model shapes).
    fn via_f32(&self) -> bool {
        let row_format = matches!(self.fmt, QFormat::I8Row | QFormat::I4Row | QFormat::I2Row);
        row_format && self.cols > 1 << 17
    }
}

/// Bytes a buffer grows to for `need` bytes: the next power of two, at least 4 KiB.
fn grown(need: u64) -> u64 {
    need.max(4096).next_power_of_two()
}

impl Io {
    fn new(gpu: &Gpu, sizes: [u64; 4]) -> Io {
        use wgpu::BufferUsages as U;
        let buf = |label, size, usage| {
            gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage,
                mapped_at_creation: false,
            })
        };
        let calls = buf("calls", sizes[0], U::UNIFORM | U::COPY_DST);
        let x = buf("x", sizes[1], U::STORAGE | U::COPY_DST);
        let info = buf("xinfo", sizes[2], U::STORAGE | U::COPY_DST);
        let y = buf("y", sizes[3], U::STORAGE | U::COPY_SRC);
        let staging = buf("read back", sizes[3], U::MAP_READ | U::COPY_DST);
        let call = wgpu::BufferBinding {
            buffer: &calls,
            offset: 0,
            size: wgpu::BufferSize::new((CALL_WORDS * 4) as u64),
        };
        let bind = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("products"),
            layout: &gpu.products.io_layout,
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(call),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: x.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: info.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 3,
                    resource: y.as_entire_binding(),
                },
            ],
        });
        Io {
            calls,
            x,
            info,
            y,
            staging,
            bind,
        }
    }

    fn sizes(&self) -> [u64; 4] {
        [
            self.calls.size(),
            self.x.size(),
            self.info.size(),
            self.y.size(),
        ]
    }
}

impl Gpu {
    /// Runs every product of `batch` in one submission and one read back; `out[i]` gets
    /// product i's `(n, rows)` values. A batch too large for the device's buffers is a
    /// [`GpuError::Device`] (the caller runs it on the CPU; the device is fine); a failure of
    /// the device itself is [`GpuError::Lost`].
    /// Once the device failed, every later batch fails at once: a buffer may be left mapped
    /// and nothing it returns can be trusted.
    pub fn run(&self, batch: &[Product<'_>], out: &mut [Vec<f32>]) -> Result<(), GpuError> {
        if self.lost.load(Ordering::Relaxed) {
            return Err(GpuError::Lost("the device failed earlier".into()));
        }
        let r = self.run_batch(batch, out);
        if let Err(GpuError::Lost(_)) = &r {
            self.lost.store(true, Ordering::Relaxed);
        }
        r
    }

    fn run_batch(&self, batch: &[Product<'_>], out: &mut [Vec<f32>]) -> Result<(), GpuError> {
        self.fail_point()?;
        let most = self.max_workgroups as usize;
        if let Some(p) = (batch.iter()).find(|p| p.n > most || p.matrix.rows.div_ceil(64) > most) {
            return Err(GpuError::Device(format!(
                "{} positions of {} rows exceed the device's {most} workgroups a dimension",
                p.n, p.matrix.rows
            )));
        }
        let stride = self.call_stride as usize;
        let st = Staged::of(batch, stride)?;
        let need = [
            (st.calls.len() * 4) as u64,
            (st.x.len() * 4) as u64,
            (st.info.len() * 4) as u64,
            (st.y_len * 4) as u64,
        ];
        if let Some(&big) = need.iter().find(|&&b| b > self.max_buffer) {
            return Err(GpuError::Device(format!(
                "a batch of {big} bytes exceeds the device's largest buffer ({})",
                self.max_buffer
            )));
        }
        let dev = &self.device;
        // The shared buffers serve one batch at a time.
        let mut io = self.io.lock().unwrap_or_else(|p| p.into_inner());
        let scopes = Scopes::push(dev);
        let have = io.as_ref().map(|io| io.sizes());
        if have.is_none_or(|h| need.iter().zip(&h).any(|(n, h)| n > h)) {
            let have = have.unwrap_or([0; 4]);
            let size = |i: usize| {
                if need[i] > have[i] || have[i] == 0 {
                    grown(need[i]).min(self.max_buffer).max(need[i])
                } else {
                    have[i]
                }
            };
            *io = Some(Io::new(self, [size(0), size(1), size(2), size(3)]));
            self.grows.fetch_add(1, Ordering::Relaxed);
        }
        let io = io.as_ref().expect("made above");
        let words = |v: &[u32]| -> Vec<u8> { v.iter().flat_map(|w| w.to_le_bytes()).collect() };
        for (buf, v) in [(&io.calls, &st.calls), (&io.x, &st.x), (&io.info, &st.info)] {
            if !v.is_empty() {
                self.queue.write_buffer(buf, 0, &words(v));
            }
        }
        let mut enc = dev.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&self.products.pipeline);
            for (i, p) in batch.iter().enumerate() {
                if p.n == 0 || p.matrix.rows == 0 {
                    continue;
                }
                pass.set_bind_group(0, &p.matrix.bind, &[]);
                pass.set_bind_group(1, &io.bind, &[(i * stride) as u32]);
                let ny = if tiled(p) {
                    p.n.div_ceil(TILE_POSITIONS)
                } else {
                    p.n
                };
                pass.dispatch_workgroups((p.matrix.rows as u32).div_ceil(64), ny as u32, 1);
            }
        }
        let bytes = (st.y_len * 4) as u64;
        if bytes > 0 {
            enc.copy_buffer_to_buffer(&io.y, 0, &io.staging, 0, bytes);
        }
        self.queue.submit([enc.finish()]);
        let slice = io.staging.slice(..bytes.max(4));
        let mapped = self.map_read(&slice);
        if let Some(why) = scopes.pop() {
            return Err(GpuError::Lost(why));
        }
        mapped?;
        {
            let data = slice
                .get_mapped_range()
                .map_err(|e| GpuError::Lost(format!("read back: {e}")))?;
            for (&(at, len), o) in st.outs.iter().zip(out.iter_mut()) {
                o.clear();
                o.extend(
                    data[at * 4..(at + len) * 4]
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                );
            }
        }
        io.staging.unmap();
        Ok(())
    }

    /// How many times the products' shared buffers were made or grown (a steady stream of
    /// like batches makes them once).
    pub fn buffer_grows(&self) -> u64 {
        self.grows.load(Ordering::Relaxed)
    }
}
