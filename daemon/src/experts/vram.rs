//! Placing the VRAM tier at start: with `--vram-gb` and an adapter `--gpu` allows, in what the
//! dense weights (placed at model load, `gpu::Placer`) leave of the budget, the experts
//! the usage history ranks hottest (in the order pins are chosen, every expert a candidate)
//! are read once, uploaded, and dropped from RAM; [`ExpertStore::run_layer`] then computes
//! them on the GPU. Anything that stops it (no adapter, a format the GPU products do not take,
//! a failed upload) is one `[GPU]` line and the CPU path. Biased experts with a clamped
//! SwiGLU (gpt-oss, in our int containers or its published MXFP4) and DeepSeek-V4's clamped
//! ones go too: the tier applies their activation and biases as the CPU does.

use super::usage::Usage;
use super::{pin, ExpertStore};

/// Swaps per re-plan between turns: each is one expert read from disk and uploaded.
const SWAPS_PER_TURN: usize = 8;
use crate::gpu::{DensePlaced, GpuChoice, VramTier};
use crate::quant::QFormat;

impl ExpertStore {
    /// The dense weights placed in VRAM at load (before [`ExpertStore::start`]): the tier gets
    /// what they leave of `--vram-gb`, and the start line counts them.
    pub fn set_dense_vram(&mut self, placed: DensePlaced) {
        self.dense_vram = placed;
    }

    /// The one `[GPU]` line of the start: the dense weights, then the experts placed here (or
    /// why none).
    pub(super) fn place_vram(&self, usage: &Usage) {
        let Some(gb) = self.cfg.vram_gb else {
            return;
        };
        if self.cfg.gpu == GpuChoice::Off {
            return;
        }
        let gpu = match crate::gpu::shared(self.cfg.gpu) {
            Ok(g) => g,
            Err(e) => {
                crate::elog!("[GPU] {e}: every expert runs on the CPU, and every dense weight");
                return;
            }
        };
        let d = self.dense_vram;
        let attention = if d.attention > 0 {
            format!(", attention's kv_b ({:.2} GB)", d.attention as f64 / 1e9)
        } else {
            String::new()
        };
        let dense = format!(
            "{} dense matrices ({:.2} GB){attention} and",
            d.matrices,
            d.bytes as f64 / 1e9
        );
        // Quantized experts only: their products are the CPU's bit for bit; the f32 ones
        // (`validate`'s fake quantization) are not, as the CPU's f32 order depends on its ISA.
        let fmt = self.core.geom.fmt;
        if fmt == QFormat::F32 || self.core.geom.fake_quant {
            crate::elog!(
                "[GPU] {}: {dense} 0 experts in VRAM (--vram-gb {gb}): the tier takes quantized experts, not f32 ones, so they run on the CPU",
                gpu.name
            );
            return;
        }
        // A GGUF's quantized experts are computed in their own blocks, which the tier's
        // kernels do not read.
        if let QFormat::Ggml(t) = self.format() {
            crate::elog!(
                "[GPU] {}: {dense} 0 experts in VRAM (--vram-gb {gb}): GGUF {} experts run on the CPU",
                gpu.name,
                t.name()
            );
            return;
        }
        let eb = self.expert_bytes.max(1);
        let left = (gb * 1e9 - (d.bytes + d.attention) as f64).max(0.0);
        let want = (left / eb as f64) as usize;
        let list = pin::select(usage, &self.sparse, want, true);
        let tier = VramTier::new(gpu);
        let t = std::time::Instant::now();
        for &(l, e) in &list {
            let placed = self
                .core
                .load(l, e, None)
                .map_err(|e| e.to_string())
                .and_then(|mut x| {
                    // `Expert` has a `Drop`: its activation is taken, not moved out.
                    let oss = x.oss.take();
                    tier.add(l, e, [&x.gate, &x.up, &x.down], oss)
                        .map_err(|e| e.to_string())
                });
            if let Err(why) = placed {
                crate::elog!(
                    "[GPU] expert {e} of layer {l} could not be placed ({why}): the tier keeps the {} placed before it",
                    tier.resident().0
                );
                break;
            }
        }
        let (n, bytes) = tier.resident();
        crate::elog!(
            "[GPU] {}: {dense} {n} experts in VRAM ({:.2} GB of --vram-gb {gb}), the hottest by the usage history, placed in {:.1} s",
            tier.device_name(),
            (d.bytes + bytes) as f64 / 1e9,
            t.elapsed().as_secs_f64()
        );
        let _ = self.vram.set(tier);
    }

    /// Between turns: the experts the usage history now ranks hottest outside the VRAM tier take
    /// the places of the coldest inside it, where clearly hotter (25% plus 4 selections, the
    /// hysteresis of re-pin, so two experts of like heat do not trade places every turn), at
    /// most [`SWAPS_PER_TURN`]; says how many on a `[GPU]` line.
    pub(super) fn replan_vram(&self) -> usize {
        let Some(v) = self.vram.get().filter(|v| v.active()) else {
            return 0;
        };
        let (mut cold, hot) = {
            let t = self.track.lock();
            let count = |l: usize, e: usize| t.usage.get(l, e);
            let cold: Vec<(u64, usize, usize)> = v
                .held()
                .into_iter()
                .map(|(l, e)| (count(l, e), l, e))
                .collect();
            let mut hot: Vec<(u64, usize, usize)> = (0..self.sparse.len())
                .filter(|&l| self.sparse[l])
                .flat_map(|l| (0..self.n_experts).map(move |e| (l, e)))
                .filter(|&(l, e)| !v.holds(l, e))
                .map(|(l, e)| (count(l, e), l, e))
                .filter(|&(c, _, _)| c > 0)
                .collect();
            hot.sort_by(|a, b| b.0.cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
            hot.truncate(SWAPS_PER_TURN);
            (cold, hot)
        };
        cold.sort();
        let mut swaps = 0;
        for (&(h, l, e), &(c, cl, ce)) in hot.iter().zip(&cold) {
            if h <= c + c / 4 + 4 {
                break;
            }
            let placed = self
                .core
                .load(l, e, None)
                .map_err(|e| e.to_string())
                .and_then(|mut x| {
                    v.remove(cl, ce);
                    let oss = x.oss.take();
                    v.add(l, e, [&x.gate, &x.up, &x.down], oss)
                        .map_err(|e| e.to_string())
                });
            if let Err(why) = placed {
                crate::elog!(
                    "[GPU] re-plan stopped: expert {e} of layer {l} could not be placed ({why})"
                );
                break;
            }
            // Its RAM copy, if the LRU holds one, is no longer read.
            if let Ok(layer) = self.layer(l) {
                layer.lock().lru.remove(e);
            }
            swaps += 1;
        }
        if swaps > 0 {
            crate::elog!(
                "[GPU] re-plan: {swaps} experts swapped into VRAM for colder ones, by the usage history"
            );
        }
        swaps
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
