//! Placing the VRAM tier at start: with `--vram-gb` and an adapter `--gpu` allows, the experts
//! the usage history ranks hottest (in the order pins are chosen, every expert a candidate)
//! are read once, uploaded, and dropped from RAM; [`ExpertStore::run_layer`] then computes
//! them on the GPU. Anything that stops it (no adapter, a format the GPU products do not take,
//! a failed upload) is one `[GPU]` line and the CPU path.

use super::usage::Usage;
use super::{pin, ExpertStore};
use crate::gpu::{Gpu, GpuChoice, GpuMatrix, VramTier};

impl ExpertStore {
    pub(super) fn place_vram(&self, usage: &Usage) {
        let Some(gb) = self.cfg.vram_gb else {
            return;
        };
        if self.cfg.gpu == GpuChoice::Off {
            return;
        }
        let gpu = match Gpu::open(self.cfg.gpu) {
            Ok(g) => g,
            Err(e) => {
                eprintln!("[GPU] {e}: every expert runs on the CPU");
                return;
            }
        };
        let fmt = self.core.geom.fmt;
        if !GpuMatrix::supports(fmt) || self.core.geom.fake_quant {
            eprintln!(
                "[GPU] {}: the VRAM tier takes int8 or int4-per-row experts (--expert-bits 8, or 4 with --group-size 0), not {}: every expert runs on the CPU",
                gpu.name,
                fmt.name()
            );
            return;
        }
        let eb = self.expert_bytes.max(1);
        let want = (gb * 1e9 / eb as f64) as usize;
        let list = pin::select(usage, &self.sparse, want, true);
        let mut tier = VramTier::new(gpu);
        let t = std::time::Instant::now();
        for &(l, e) in &list {
            let placed = self
                .core
                .load(l, e, None)
                .map_err(|e| e.to_string())
                .and_then(|x| tier.add(l, e, &x).map_err(|e| e.to_string()));
            if let Err(why) = placed {
                eprintln!(
                    "[GPU] expert {e} of layer {l} could not be placed ({why}): the tier keeps the {} placed before it",
                    tier.resident().0
                );
                break;
            }
        }
        let (n, bytes) = tier.resident();
        eprintln!(
            "[GPU] {}: {n} experts in VRAM ({:.2} GB of --vram-gb {gb}), the hottest by the usage history, placed in {:.1} s",
            tier.device_name(),
            bytes as f64 / 1e9,
            t.elapsed().as_secs_f64()
        );
        let _ = self.vram.set(tier);
    }

    /// Whether the VRAM tier computes expert `e` of `layer`.
    pub fn in_vram(&self, layer: usize, e: usize) -> bool {
        self.vram.get().is_some_and(|v| v.holds(layer, e))
    }

    /// Experts in the VRAM tier and their device bytes.
    pub fn vram_resident(&self) -> (usize, u64) {
        self.vram.get().map_or((0, 0), |v| v.resident())
    }
}
