//! GGUF's quantized weight types computed as they are stored: a row of ggml blocks (the bytes
//! of a GGUF tensor's row, unchanged) times activations quantized once per position to 8-bit
//! blocks, with the integer arithmetic of llama.cpp's CPU dot products.
//!
//! Which activation blocks a type meets is llama.cpp's choice (its `vec_dot_type`): the
//! 32-element types take Q8_0 blocks (an f16 scale per 32 values; Q4_1 and Q5_1 also read
//! the block's scaled sum, llama.cpp's Q8_1), the 256-element K-quants and IQ types take Q8_K
//! blocks (an f32 scale per 256 values and the sums of every 16). `act` quantizes, `dot_q0`
//! (the 32-element types), `dot` (K-quants) and `dot_iq` (the lattice types) are the portable reference
//! products: exact integer sums per block, then llama.cpp's float operations in llama.cpp's
//! order, so a SIMD kernel can be checked against them bit for bit. The 32-element types
//! keep their reference and kernels in their own files (`dot_q0`, `x86_q0`, `avx512_q0`).

mod act;
#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_q0;
mod dot;
mod dot_iq;
mod dot_q0;
#[cfg(target_arch = "x86_64")]
mod iqpanel;
#[cfg(target_arch = "x86_64")]
mod iqpanel_amx;
#[cfg(target_arch = "x86_64")]
mod kpanel;
#[cfg(target_arch = "x86_64")]
mod kpanel_amx;
#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "x86_64")]
mod panel_q0;
mod rows;
#[cfg(test)]
mod tests;
#[cfg(all(test, target_arch = "x86_64"))]
mod tests_moe;
#[cfg(test)]
mod tests_panel;
#[cfg(test)]
mod tests_simd;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_q0;
#[cfg(target_arch = "x86_64")]
mod x86_rest;

pub use act::{quantize_q8_0, quantize_q8_k, Q8Act, Q8Row};
pub(in crate::quant) use rows::panels_by_positions;

use crate::gguf::types::{GgmlType, QK_K};

/// The activation blocks a weight type's dot product reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActKind {
    /// 32 values a block, an f16 scale (and, for Q4_1/Q5_1, the f16 of scale x sum).
    Q8_0,
    /// 256 values a block, an f32 scale, and the sum of every 16 quants.
    Q8K,
}

impl ActKind {
    /// Values per activation block.
    pub fn block(self) -> usize {
        match self {
            ActKind::Q8_0 => 32,
            ActKind::Q8K => QK_K,
        }
    }
}

/// A row dot product: whole blocks of one weight type against the activation row of the
/// same length.
pub type DotFn = fn(&[u8], &Q8Row) -> f32;

/// One weight row against four positions' activation rows: output `p` is the row's
/// [`DotFn`] against `a[p]`, bit for bit, with the weights decoded once for the four
/// (prefill's tile).
pub type DotTileFn = fn(&[u8], &[Q8Row; 4]) -> [f32; 4];

/// A rows x positions product (prefill): `w` holds whole weight rows of `cols` inputs
/// stored as the panel's type, `x` the positions' activation rows; writes
/// `out[j * row_stride + p * pos_stride]` for row `j`, position `p` (`[rows][positions]`
/// with `pos_stride` 1, or `[positions][rows]`, the products' own layout, with `row_stride`
/// 1). Outputs are the dot's bits.
pub type PanelFn =
    fn(w: &[u8], cols: usize, x: &[Q8Row], out: &mut [f32], row_stride: usize, pos_stride: usize);

/// The activation blocks `ty` is computed with, `None` for a type that is not computed as
/// stored (the float types, which are read as f32, and the ones llama.cpp has no published
/// weights in).
pub fn act_kind(ty: GgmlType) -> Option<ActKind> {
    use GgmlType::*;
    match ty {
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | MXFP4 | IQ4_NL => Some(ActKind::Q8_0),
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ4_XS | IQ3_XXS | IQ3_S | IQ2_XXS | IQ2_XS | IQ2_S
        | IQ1_S | IQ1_M => Some(ActKind::Q8K),
        _ => None,
    }
}

/// The portable reference dot product of `ty`, `None` where [`act_kind`] is `None`.
pub fn dot_fn(ty: GgmlType) -> Option<DotFn> {
    use GgmlType::*;
    Some(match ty {
        Q4_0 => dot_q0::q4_0,
        Q4_1 => dot_q0::q4_1,
        Q5_0 => dot_q0::q5_0,
        Q5_1 => dot_q0::q5_1,
        Q8_0 => dot_q0::q8_0,
        MXFP4 => dot_q0::mxfp4,
        IQ4_NL => dot_q0::iq4_nl,
        Q2_K => dot::q2_k,
        Q3_K => dot::q3_k,
        Q4_K => dot::q4_k,
        Q5_K => dot::q5_k,
        Q6_K => dot::q6_k,
        IQ4_XS => dot::iq4_xs,
        IQ2_XXS => dot_iq::iq2_xxs,
        IQ2_XS => dot_iq::iq2_xs,
        IQ2_S => dot_iq::iq2_s,
        IQ3_XXS => dot_iq::iq3_xxs,
        IQ3_S => dot_iq::iq3_s,
        IQ1_S => dot_iq::iq1_s,
        IQ1_M => dot_iq::iq1_m,
        _ => return None,
    })
}

/// The dot product of `ty` that kernel set `k` runs: its SIMD kernel where it has one, else
/// the portable reference. Every kernel gives the reference's bits. On x86 the AVX-512 sets
/// take their AVX-512 kernel where there is one and the AVX2 one otherwise (each AVX-512 set
/// implies AVX2); the NEON set takes its NEON kernel. `None` where [`act_kind`] is `None`.
pub fn dot_for(k: &crate::quant::KernelSet, ty: GgmlType) -> Option<DotFn> {
    simd_dot(k.name(), ty).or_else(|| dot_fn(ty))
}

/// The SIMD kernel of `ty` for the kernel set named `set`, `None` where that set has none
/// for `ty` (the portable set has none) or this CPU lacks its features.
fn simd_dot(set: &str, ty: GgmlType) -> Option<DotFn> {
    #[cfg(target_arch = "x86_64")]
    {
        let wide = match set {
            "avx512vnni" => avx512_q0::dot(ty, true).or_else(|| avx512::dot(ty, true)),
            "avx512bw" => avx512_q0::dot(ty, false).or_else(|| avx512::dot(ty, false)),
            _ => None,
        };
        if wide.is_some() || set == "portable" {
            return wide;
        }
        x86_q0::dot(ty)
            .or_else(|| x86::dot(ty))
            .or_else(|| x86_rest::dot(ty))
    }
    #[cfg(target_arch = "aarch64")]
    {
        if set == "neon" {
            return neon::dot(ty);
        }
        None
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = (set, ty);
        None
    }
}

/// The 1-row x 4-position tile of `ty` that kernel set `k` runs, `None` where it has none
/// (the type is then computed one [`dot_for`] call a position). Every tile gives
/// [`dot_for`]'s bits.
pub fn tile_for(k: &crate::quant::KernelSet, ty: GgmlType) -> Option<DotTileFn> {
    #[cfg(target_arch = "x86_64")]
    {
        let wide = match k.name() {
            "portable" => return None,
            "avx512vnni" => avx512::tile(ty, true),
            "avx512bw" => avx512::tile(ty, false),
            _ => None,
        };
        wide.or_else(|| x86::tile(ty))
            .or_else(|| x86_q0::set_tile(k.name(), ty))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (k, ty);
        None
    }
}

/// The rows x positions panel of `ty` that kernel set `k` runs for prefill, `None` where it
/// has none (the type then goes through [`tile_for`] and [`dot_for`]). Every panel gives
/// [`dot_for`]'s bits. Forced paths as [`tile_for`]: the portable set has none, a set has
/// only panels compiled for its own features.
pub fn panel_for(k: &crate::quant::KernelSet, ty: GgmlType) -> Option<PanelFn> {
    #[cfg(target_arch = "x86_64")]
    {
        match k.name() {
            "avx512vnni" => kpanel::panel(ty)
                .or_else(|| panel_q0::panel(ty))
                .or_else(|| iqpanel::panel(ty)),
            _ => None,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (k, ty);
        None
    }
}

/// Every type computed as stored, for iteration in tools and tests.
pub const COMPUTED: [GgmlType; 20] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::MXFP4,
    GgmlType::IQ4_NL,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_XS,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
];
