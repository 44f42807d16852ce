//! The device mirror of one session's KV cache: per layer, the rows the GPU attention reads
//! (MLA's latents and rope keys and the indexer keys; grouped-query attention's keys and
//! values).
//!
//! The CPU cache (`model::kv::KvCache`) stays the reference: the crash-safe `.coli_kv` files,
//! truncation, rollback after a failed forward and prefix adoption all read and write it, and
//! a device loss must leave nothing the CPU path could not recompute from. So the mirror is
//! only ever a copy: it knows how many words of each part it holds and appends what the CPU
//! rows gained since. Whatever rewrites history re-uploads from the CPU rows: a truncation or
//! a rollback lowers what the mirror counts as held to the rows kept (those are the same
//! numbers, so the rows after the cut are uploaded again from the CPU as new ones arrive; left
//! counted, a later append past the old length would be mistaken for rows the device already
//! has), and a clone or a resumed session starts with no device rows at all.

use super::ops::Kernels;
use super::{DeviceBuffer, GpuError};

/// One part of one layer: device words `0..held` equal the CPU's.
#[derive(Default)]
struct Rows {
    buf: Option<DeviceBuffer>,
    /// Words the buffer has room for.
    cap: usize,
    held: usize,
}

impl Rows {
    /// Makes the device copy equal `cpu` (which only grew since the last call, or the mirror
    /// was dropped) and returns its buffer.
    fn sync(&mut self, k: &Kernels, cpu: &[f32]) -> Result<&DeviceBuffer, GpuError> {
        if cpu.len() < self.held {
            // Never after an invalidation; kept as the safe answer to a shrunk CPU copy.
            self.held = 0;
        }
        if self.buf.is_none() || cpu.len() > self.cap {
            // Room for twice the rows (as the device allows), so a conversation's steps
            // append in place.
            let most = (k.gpu.max_buffer / 4) as usize;
            let cap = (cpu.len() * 2).max(1024).min(most).max(cpu.len());
            self.buf = Some(DeviceBuffer { buf: k.alloc(cap)? });
            self.cap = cap;
            self.held = 0;
        }
        let buf = self.buf.as_ref().expect("allocated above");
        if cpu.len() > self.held {
            let bytes: Vec<u8> = cpu[self.held..]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            k.gpu
                .queue
                .write_buffer(&buf.buf, (self.held * 4) as u64, &bytes);
            self.held = cpu.len();
        }
        Ok(buf)
    }
}

/// A session's device rows, layer by layer, each layer's parts in the order its attention
/// asks for them.
#[derive(Default)]
pub struct KvMirror {
    layers: Vec<[Rows; 3]>,
}

impl KvMirror {
    /// After the CPU's rows of `layer` were cut to `lens` words per part (in the order
    /// [`KvMirror::sync`] takes them), holds at most those: the rows after the cut come from
    /// the CPU again.
    pub fn keep(&mut self, layer: usize, lens: [usize; 3]) {
        if let Some(parts) = self.layers.get_mut(layer) {
            for (rows, len) in parts.iter_mut().zip(lens) {
                rows.held = rows.held.min(len);
            }
        }
    }

    /// Positions' words the mirror holds for `layer`'s part `part` (for tests and telemetry).
    pub fn held(&self, layer: usize, part: usize) -> usize {
        self.layers.get(layer).map_or(0, |l| l[part].held)
    }

    /// The device copies of `layer`'s parts, brought up to `cpu` (up to three CPU row
    /// vectors, e.g. latent, rope, index).
    pub fn sync<'a, const N: usize>(
        &'a mut self,
        k: &Kernels,
        layer: usize,
        cpu: [&[f32]; N],
    ) -> Result<[&'a DeviceBuffer; N], GpuError> {
        if self.layers.len() <= layer {
            self.layers.resize_with(layer + 1, Default::default);
        }
        let parts = &mut self.layers[layer];
        for (rows, cpu) in parts.iter_mut().zip(cpu) {
            rows.sync(k, cpu)?;
        }
        let parts = &self.layers[layer];
        Ok(std::array::from_fn(|i| {
            parts[i].buf.as_ref().expect("synced above")
        }))
    }
}

/// A copy of a cache has its own history from then on: it starts without device rows.
impl Clone for KvMirror {
    fn clone(&self) -> Self {
        KvMirror::default()
    }
}

impl std::fmt::Debug for KvMirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvMirror")
            .field("layers", &self.layers.len())
            .finish()
    }
}
