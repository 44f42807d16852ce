//! The dense weights in VRAM: at load, with `--gpu` and `--vram-gb`, every dense projection
//! (attention and the DSA indexer, shared experts, the dense layers' MLPs, lm_head) is
//! uploaded in the model's order while it fits the budget, into the [`DeviceSlot`] each
//! [`crate::model::Linear`] carries; the model's placement (`model::placement`) then runs its
//! product on the device. What is left of the budget goes to the VRAM expert tier.
//!
//! Each matrix keeps its CPU copy: a device lost mid-turn must not change the answer, and the
//! CPU can only take over a product whose weights it still has (reading them back from a
//! failed device is not an option, and re-reading the checkpoint mid-turn would stall it).

use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

use super::{AttnGpu, DensePlaced, DeviceF32, Gpu, GpuError, GpuMatrix, Product};
use crate::quant::{ActMode, QMatrix};

/// A weight matrix's copies in device memory, as a model's `Linear` holds them: a handle the
/// placement passes back here, never read outside `gpu/`. Empty until something is placed.
#[derive(Default)]
pub struct DeviceSlot {
    /// The product's copy, placed at load (`Placer::offer`).
    dense: Option<DenseMatrix>,
    /// The rows dequantized to f32, uploaded at the first use of GPU attention (kv_b's, which
    /// the absorbed MLA core multiplies by); an upload that failed stays failed.
    f32_rows: OnceLock<Result<DeviceF32, GpuError>>,
}

impl DeviceSlot {
    /// Whether the product was placed on the device (it runs there, whole, while the device
    /// works).
    pub fn placed(&self) -> bool {
        self.dense.is_some()
    }

    /// `ys[i] = slots[i]'s matrix x` on the device in one batch; false when the caller must
    /// compute them on the CPU: a slot holds no copy, the device failed (now, said once on a
    /// `[GPU]` line, or before) or the batch does not fit its buffers.
    pub fn forward_all(
        slots: &[&DeviceSlot],
        x: &[f32],
        n: usize,
        ys: &mut [&mut [f32]],
        act: ActMode,
    ) -> bool {
        let mats: Option<Vec<&DenseMatrix>> = slots.iter().map(|s| s.dense.as_ref()).collect();
        mats.is_some_and(|m| DenseMatrix::forward_all(&m, x, n, ys, act))
    }
}

impl AttnGpu {
    /// `w`'s rows as f32 in device memory, uploaded into `slot` the first time they are asked.
    pub fn f32_rows<'s>(
        &self,
        slot: &'s DeviceSlot,
        w: &QMatrix,
    ) -> Result<&'s DeviceF32, GpuError> {
        (slot.f32_rows.get_or_init(|| self.upload(&w.dequantize())))
            .as_ref()
            .map_err(Clone::clone)
    }
}

/// A dense matrix's device copy.
struct DenseMatrix {
    gpu: Arc<Gpu>,
    m: GpuMatrix,
}

thread_local! {
    /// The read-back outputs of this thread's last dense product (reused, grown only).
    static OUT: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

impl DenseMatrix {
    fn upload(gpu: &Arc<Gpu>, w: &QMatrix) -> Result<DenseMatrix, GpuError> {
        Ok(DenseMatrix {
            gpu: gpu.clone(),
            m: GpuMatrix::upload(gpu, w)?,
        })
    }

    /// Device bytes held.
    fn bytes(&self) -> u64 {
        self.m.bytes
    }

    /// `ys[i] = mats[i] x` on the device in one batch (the matrices of one device, the same
    /// columns); false when the caller must compute them on the CPU: the device failed (now,
    /// said once on a `[GPU]` line, or before) or the batch does not fit its buffers.
    fn forward_all(
        mats: &[&DenseMatrix],
        x: &[f32],
        n: usize,
        ys: &mut [&mut [f32]],
        act: ActMode,
    ) -> bool {
        let Some(first) = mats.first() else {
            return true;
        };
        let gpu = &first.gpu;
        if gpu.failed() {
            return false;
        }
        let batch: Vec<Product> = mats
            .iter()
            .map(|d| Product {
                matrix: &d.m,
                x,
                n,
                act,
            })
            .collect();
        OUT.with_borrow_mut(|out| {
            if out.len() < batch.len() {
                out.resize(batch.len(), Vec::new());
            }
            match gpu.run(&batch, &mut out[..batch.len()]) {
                Ok(()) => {
                    for (y, o) in ys.iter_mut().zip(out.iter()) {
                        y.copy_from_slice(o);
                    }
                    true
                }
                Err(e @ GpuError::Lost(_)) => {
                    gpu.announce_loss(&e);
                    false
                }
                Err(_) => false,
            }
        })
    }
}

/// Uploads the matrices offered, in the order offered, while their device bytes fit the
/// budget; stops at the first that does not fit or fails to upload (said on a `[GPU]` line).
/// A matrix larger than the device's largest buffer (lm_head, on a device with small ones) is
/// passed over with a `[GPU]` line, and the next ones still go.
pub struct Placer {
    gpu: Arc<Gpu>,
    budget: u64,
    placed: DensePlaced,
    stopped: bool,
}

impl Placer {
    pub fn new(gpu: Arc<Gpu>, budget: u64) -> Placer {
        Placer {
            gpu,
            budget,
            placed: DensePlaced::default(),
            stopped: false,
        }
    }

    /// Sets `bytes` of the budget aside for attention's own device copies (kv_b in f32); what
    /// does not fit is not refused here (attention uploads on first use and falls back to the
    /// CPU on an out-of-memory error), but the dense matrices and experts get no part of it.
    pub fn reserve_attention(&mut self, bytes: u64) {
        self.placed.attention += bytes;
    }

    fn used(&self) -> u64 {
        self.placed.bytes + self.placed.attention
    }

    /// Uploads `w` into `slot` if it fits (see [`Placer`]).
    pub fn offer(&mut self, w: &QMatrix, slot: &mut DeviceSlot) {
        // The shaders have no GGUF block formats (`matvec::code`): such a matrix stays on the
        // CPU, and the device's room goes to the next.
        if matches!(w.format(), crate::quant::QFormat::Ggml(_)) {
            return;
        }
        // Rows padded to whole words: at most 3 bytes a row above the CPU's size.
        let need = (w.resident_bytes() + 3 * w.rows()) as u64;
        if self.stopped || self.used() + need > self.budget {
            self.stopped = true;
            return;
        }
        if w.data().len() as u64 + 3 * w.rows() as u64 > self.gpu.max_buffer {
            crate::elog!(
                "[GPU] a {} x {} dense matrix ({:.2} GB) exceeds the device's largest buffer ({:.2} GB): it stays on the CPU",
                w.rows(),
                w.cols(),
                need as f64 / 1e9,
                self.gpu.max_buffer as f64 / 1e9
            );
            return;
        }
        match DenseMatrix::upload(&self.gpu, w) {
            Ok(d) => {
                self.placed.matrices += 1;
                self.placed.bytes += d.bytes();
                slot.dense = Some(d);
            }
            Err(e) => {
                crate::elog!(
                    "[GPU] a {} x {} dense matrix could not be placed ({e}): the {} placed before it stay",
                    w.rows(),
                    w.cols(),
                    self.placed.matrices
                );
                self.stopped = true;
            }
        }
    }

    /// What was placed, and the device it went to.
    pub fn done(self) -> (DensePlaced, Arc<Gpu>) {
        self.gpu.note_dense(self.placed.matrices);
        (self.placed, self.gpu)
    }
}
