//! Where the forward's work runs: one [`Placement`] per model, made at load, decides per call
//! whether a norm or an attention core runs on the GPU or on the CPU, so the layers name no
//! device and branch on none. The products go with their weights: each `Linear` carries a
//! [`DeviceSlot`] (empty, or the device copy `gpu::Placer` put there at load, see
//! [`Placement::dense_placer`]) that only [`product`] and [`product_pair`] read; the device
//! those went to is kept here too, for whoever asks.
//!
//! A device failure mid-turn leaves every answer unchanged: the CPU computes what the device
//! could not, from its own copies (the KV cache is the reference, the mirror only a copy;
//! every `Linear` keeps its weights).

use std::sync::Arc;

use super::ops::rms_norm_rows;
use crate::gpu::{AttnGpu, DensePlaced, Gpu, GpuChoice, GpuError, Placer};
use crate::quant::{ActMode, QMatrix};

pub use crate::gpu::DeviceSlot;

/// What runs where for one model.
pub struct Placement {
    /// Attention's cores and the norms on the GPU (`--gpu` with `--vram-gb`), while it works.
    attn: Option<AttnGpu>,
    /// The device holding the dense weights, shared with the VRAM expert tier.
    dense: Option<Arc<Gpu>>,
}

/// Everything on the CPU: the placement the tests and `plan`'s attention probe run the cores
/// with.
pub(crate) static CPU: Placement = Placement {
    attn: None,
    dense: None,
};

impl Placement {
    /// The placement of a model loaded with `tiers`: attention goes to the GPU when they name
    /// one and a VRAM budget; one `[GPU]` line says what runs there. `COLI_GPU_ATTN`: `0`/`off`
    /// keeps attention on the CPU, `1`/`on` moves it whatever the activations; unset, it
    /// moves unless the products take int8 activations (`int8`: `--act int8` on quantized
    /// dense weights). With those the CPU core rounds the latent context to int8 before kv_b's
    /// value half and every product after it rounds its input to int8, so the device's f32
    /// differences (about 1e-7 relative) would become int8 rounding flips: another function
    /// than the CPU's, not the same one to f32 rounding. Without an adapter nothing is printed
    /// here: the expert tier, opened with the same choice, says why.
    pub(crate) fn open(
        tiers: &crate::experts::TierConfig,
        cfg: &crate::config::ModelConfig,
        int8: bool,
    ) -> Placement {
        Placement {
            attn: gpu_attention(tiers, cfg, int8),
            dense: None,
        }
    }

    /// `--vram-gb` with an adapter `--gpu` allows: a placer for the dense projections, the
    /// budget less `attention_bytes` when attention was placed on the device (the absorbed MLA
    /// core's kv_b copies in f32, uploaded at their first use). `None`: everything stays on
    /// the CPU (a failure to open is said once, on the expert tier's start line).
    pub(crate) fn dense_placer(
        &self,
        tiers: &crate::experts::TierConfig,
        attention_bytes: u64,
    ) -> Option<Placer> {
        let gb = tiers.vram_gb.filter(|_| tiers.gpu != GpuChoice::Off)?;
        let gpu = crate::gpu::shared(tiers.gpu).ok()?;
        crate::gpu::note_in_use(&gpu, gb);
        let mut placer = Placer::new(gpu, (gb * 1e9) as u64);
        if self.attention_placed() {
            placer.reserve_attention(attention_bytes);
        }
        Some(placer)
    }

    /// The dense weights were offered to `placer`: what went to its device.
    pub(crate) fn dense_placed(&mut self, placer: Placer) -> DensePlaced {
        let (placed, gpu) = placer.done();
        self.dense = Some(gpu);
        placed
    }

    /// The device the dense weights are on, when they are.
    pub fn dense_gpu(&self) -> Option<&Arc<Gpu>> {
        self.dense.as_ref()
    }

    /// Whether attention was placed on the GPU at load (its kv_b copies need VRAM then).
    pub(crate) fn attention_placed(&self) -> bool {
        self.attn.is_some()
    }

    /// Whether attention runs on the GPU now (placed there, and no failure turned it off).
    pub(crate) fn attention_on(&self) -> bool {
        self.attn.as_ref().is_some_and(AttnGpu::is_on)
    }

    /// RMSNorm of `x`'s rows (`rms_norm_rows`) on the GPU while attention runs there; on the
    /// CPU otherwise, or when the device fails (which turns GPU attention off).
    pub(crate) fn norm_rows(&self, x: &mut [f32], w: &[f32], eps: f32) {
        let done = self.attention(|g| g.kernels().rms_norm_rows(x, w, eps));
        if done.is_none() {
            rms_norm_rows(x, w, eps);
        }
    }

    /// `on_device`'s answer while attention runs on the GPU; `None` when it does not, or when
    /// the device failed it (said once, see `AttnGpu::fail`): the caller computes on the CPU,
    /// whose copies hold everything the device had.
    pub(crate) fn attention<T>(
        &self,
        on_device: impl FnOnce(&AttnGpu) -> Result<T, GpuError>,
    ) -> Option<T> {
        let g = self.attn.as_ref().filter(|g| g.is_on())?;
        on_device(g).map_err(|e| g.fail(&e)).ok()
    }
}

/// `y = w x` for the `n` rows of `x`: on the device holding `slot`'s copy of `w` while it
/// works, else on the CPU from `w` (the same answer, see `gpu`).
pub(crate) fn product(
    slot: &DeviceSlot,
    w: &QMatrix,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    act: ActMode,
) {
    if !DeviceSlot::forward_all(&[slot], x, n, &mut [&mut *y], act) {
        cpu_product(w, x, n, y, act);
    }
}

fn cpu_product(w: &QMatrix, x: &[f32], n: usize, y: &mut [f32], act: ActMode) {
    match act {
        ActMode::Int8 => w.matmul_i8act(x, n, y),
        ActMode::F32 => w.matmul(x, n, y),
    }
}

/// [`product`] of `a` and of `b` over the same rows `x`: both on the device in one batch (one
/// round trip) when both are placed; with int8 activations on the CPU, the rows quantized once
/// and both matrices split across the threads in one parallel region (one fork and join
/// instead of two). Bit-identical to two [`product`] calls.
#[allow(clippy::too_many_arguments)]
pub(crate) fn product_pair(
    (sa, wa): (&DeviceSlot, &QMatrix),
    (sb, wb): (&DeviceSlot, &QMatrix),
    x: &[f32],
    n: usize,
    ya: &mut [f32],
    yb: &mut [f32],
    act: ActMode,
) {
    let same_cols = wa.cols() == wb.cols();
    if same_cols && DeviceSlot::forward_all(&[sa, sb], x, n, &mut [&mut *ya, &mut *yb], act) {
        return;
    }
    if act == ActMode::F32 || !same_cols || sa.placed() || sb.placed() {
        product(sa, wa, x, n, ya, act);
        product(sb, wb, x, n, yb, act);
        return;
    }
    QMatrix::matmul_pair_i8act(wa, wb, x, n, ya, yb);
}

/// [`product`] of `q` and [`product_pair`] of `k`, `v`, all over the same rows `x`: with int8
/// activations on the CPU (none of the three placed), the rows quantized once for the three
/// ([`QMatrix::matmul_triple_i8act`]). Bit-identical to those two calls, which it is elsewhere.
pub(crate) fn product_triple(
    [(sq, wq), (sk, wk), (sv, wv)]: [(&DeviceSlot, &QMatrix); 3],
    x: &[f32],
    n: usize,
    [yq, yk, yv]: [&mut [f32]; 3],
    act: ActMode,
) {
    let same_cols = wq.cols() == wk.cols() && wq.cols() == wv.cols();
    if act == ActMode::F32 || !same_cols || sq.placed() || sk.placed() || sv.placed() {
        product(sq, wq, x, n, yq, act);
        return product_pair((sk, wk), (sv, wv), x, n, yk, yv, act);
    }
    QMatrix::matmul_triple_i8act([wq, wk, wv], x, n, [yq, yk, yv]);
}

/// Whether `slot`'s product runs whole, on the device that holds it, rather than a block of
/// output rows at a time from the CPU's copy (MLA's per-head rebuild of keys and values).
pub(crate) fn runs_whole(slot: &DeviceSlot) -> bool {
    slot.placed()
}

/// GPU attention for a model loaded with `tiers` (see [`Placement::open`]).
fn gpu_attention(
    tiers: &crate::experts::TierConfig,
    cfg: &crate::config::ModelConfig,
    int8: bool,
) -> Option<AttnGpu> {
    let asked = std::env::var("COLI_GPU_ATTN").ok();
    let (off, forced) = match asked.as_deref().map(str::trim) {
        Some("0" | "off") => (true, false),
        Some("1" | "on") => (false, true),
        _ => (false, false),
    };
    if off || tiers.gpu == GpuChoice::Off || tiers.vram_gb.is_none_or(|g| g <= 0.0) {
        return None;
    }
    if int8 && !forced {
        if crate::gpu::shared(tiers.gpu).is_ok() {
            crate::elog!(
                "[GPU] attention stays on the CPU with int8 activations (COLI_GPU_ATTN=1 \
                 moves it: equal to f32 rounding before the int8 products, not bit for bit)"
            );
        }
        return None;
    }
    let gpu = crate::gpu::shared(tiers.gpu).ok()?;
    match AttnGpu::new(gpu) {
        Ok(g) => {
            let indexer = cfg
                .indexer()
                .is_some_and(|ix| ix.indexer_types.contains(&crate::config::IndexerKind::Full));
            let core = match (cfg.gqa().is_some(), indexer) {
                (true, _) => "the grouped-query core",
                (false, true) => "the MLA core (absorbed) with the DSA indexer's selection",
                (false, false) => "the MLA core (absorbed)",
            };
            crate::elog!(
                "[GPU] attention on {}: {core} and the RMSNorms (the projections go with the dense weights)",
                g.kernels().name()
            );
            Some(g)
        }
        Err(e) => {
            crate::elog!("[GPU] {e}: attention stays on the CPU");
            None
        }
    }
}
