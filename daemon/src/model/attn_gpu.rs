//! Which attention runs on the GPU: opening it for a model, and the RMSNorm that follows it
//! there (`norm_rows`), shared by MLA (`mla.rs`), grouped-query attention (`gqa.rs`) and the
//! layer's own norms. The cores are in `crate::gpu::attention`.

use super::ops::rms_norm_rows;
use crate::gpu::AttnGpu;

/// GPU attention for a model loaded with `tiers`, when they name a GPU and a VRAM budget; one
/// `[GPU]` line says what runs there. `COLI_GPU_ATTN`: `0`/`off` keeps attention on the CPU,
/// `1`/`on` moves it whatever the activations; unset, it moves unless the products take int8
/// activations (`int8`: `--act int8` on quantized dense weights). With those the CPU core
/// rounds the latent context to int8 before kv_b's value half and every product after it
/// rounds its input to int8, so the device's f32 differences (about 1e-7 relative) would
/// become int8 rounding flips: another function than the CPU's, not the same one to f32
/// rounding. Without an adapter nothing is printed here: the expert tier, opened with the
/// same choice, says why.
pub(crate) fn gpu_attention(
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
    if off || tiers.gpu == crate::gpu::GpuChoice::Off || tiers.vram_gb.is_none_or(|g| g <= 0.0) {
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

/// RMSNorm of `x`'s rows (`rms_norm_rows`) on the GPU while attention runs there; on the CPU
/// otherwise, or when the device fails (which turns GPU attention off).
pub(crate) fn norm_rows(gpu: Option<&AttnGpu>, x: &mut [f32], w: &[f32], eps: f32) {
    if let Some(g) = gpu.filter(|g| g.is_on()) {
        match g.kernels().rms_norm_rows(x, w, eps) {
            Ok(()) => return,
            Err(e) => g.fail(&e),
        }
    }
    rms_norm_rows(x, w, eps);
}
