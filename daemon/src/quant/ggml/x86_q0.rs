//! AVX2 dot products of GGUF's 32-element block types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4,
//! IQ4_NL). Each computes the reference's (`dot_q0.rs`) exact integer sum per block with
//! `maddubs` + `madd` in any order, then the reference's float operations in its order, so
//! its result equals the reference's bit for bit (tested in `tests_simd.rs`).
//!
//! Activation quants are in [-127, 127] (`act.rs`), so `maddubs`'s pair sums never saturate:
//! at most 2 x 128 x 127 for a signed weight handled by the sign trick.

use std::arch::x86_64::*;

use super::dot::{f16_at, u32_at};
use super::x86::{dot_i8, dot_u8, hsum, load32, load32_i8, nibbles, table16};
use super::{DotFn, Q8Row};
use crate::gguf::grids::{IQ4NL_KVALUES, MXFP4_KVALUES};
use crate::gguf::GgmlType;

/// The AVX2 kernel of `ty` among the 32-element types, where this CPU has AVX2.
pub(super) fn dot(ty: GgmlType) -> Option<DotFn> {
    if !is_x86_feature_detected!("avx2") {
        return None;
    }
    use GgmlType::*;
    Some(match ty {
        Q8_0 => q8_0,
        Q4_0 => q4_0,
        Q4_1 => q4_1,
        Q5_0 => q5_0,
        Q5_1 => q5_1,
        IQ4_NL => iq4_nl,
        MXFP4 => mxfp4,
        _ => return None,
    })
}

/// Defines the safe entry of an AVX2 kernel.
macro_rules! entry {
    ($name:ident, $imp:ident) => {
        fn $name(w: &[u8], a: &Q8Row) -> f32 {
            // SAFETY: `dot` hands this function out only after detecting AVX2, the one
            // feature `$imp` is compiled for; every load goes through a bounds-checked slice.
            unsafe { $imp(w, a) }
        }
    };
}

entry!(q8_0, q8_0_avx2);
entry!(q4_0, q4_0_avx2);
entry!(q4_1, q4_1_avx2);
entry!(q5_0, q5_0_avx2);
entry!(q5_1, q5_1_avx2);
entry!(iq4_nl, iq4_nl_avx2);
entry!(mxfp4, mxfp4_avx2);

#[target_feature(enable = "avx2")]
unsafe fn q8_0_avx2(w: &[u8], a: &Q8Row) -> f32 {
    let mut sum = 0.0f32;
    for (ib, b) in w.chunks_exact(34).enumerate() {
        let si = hsum(dot_i8(load32(b, 2), load32_i8(a.qs, ib * 32)));
        sum += si as f32 * (f16_at(b, 0) * a.d[ib]);
    }
    sum
}

#[target_feature(enable = "avx2")]
unsafe fn q4_0_avx2(w: &[u8], a: &Q8Row) -> f32 {
    let mut sum = 0.0f32;
    for (ib, b) in w.chunks_exact(18).enumerate() {
        let q = _mm256_sub_epi8(nibbles(b, 2), _mm256_set1_epi8(8));
        let si = hsum(dot_i8(q, load32_i8(a.qs, ib * 32)));
        sum += si as f32 * f16_at(b, 0) * a.d[ib];
    }
    sum
}

#[target_feature(enable = "avx2")]
unsafe fn iq4_nl_avx2(w: &[u8], a: &Q8Row) -> f32 {
    let tab = table16(&IQ4NL_KVALUES);
    let mut sum = 0.0f32;
    for (ib, b) in w.chunks_exact(18).enumerate() {
        let d = a.d[ib] * f16_at(b, 0);
        let q = _mm256_shuffle_epi8(tab, nibbles(b, 2));
        sum += d * hsum(dot_i8(q, load32_i8(a.qs, ib * 32))) as f32;
    }
    sum
}

#[target_feature(enable = "avx2")]
unsafe fn mxfp4_avx2(w: &[u8], a: &Q8Row) -> f32 {
    let tab = table16(&MXFP4_KVALUES);
    let mut sum = 0.0f32;
    for (ib, b) in w.chunks_exact(17).enumerate() {
        let d = a.d[ib] * super::dot_q0::e8m0_half(b[0]);
        let q = _mm256_shuffle_epi8(tab, nibbles(b, 1));
        sum += d * hsum(dot_i8(q, load32_i8(a.qs, ib * 32))) as f32;
    }
    sum
}

/// Byte j of the result: 0xFF where bit j of `x` is set, else 0 (llama.cpp's
/// `bytes_from_bits_32`).
#[inline]
#[target_feature(enable = "avx2")]
fn bits32(x: u32) -> __m256i {
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let b = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), shuf);
    let b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe_u64 as i64));
    _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1))
}

#[target_feature(enable = "avx2")]
unsafe fn q4_1_avx2(w: &[u8], a: &Q8Row) -> f32 {
    let mut sum = 0.0f32;
    for (ib, b) in w.chunks_exact(20).enumerate() {
        let si = hsum(dot_u8(nibbles(b, 4), load32_i8(a.qs, ib * 32)));
        sum += (f16_at(b, 0) * a.d[ib]) * si as f32 + f16_at(b, 2) * a.s[ib];
    }
    sum
}

/// A Q5 block's 32 five-bit quants: the nibbles at `qs_off` with bit j of `qh` as bit 4.
#[inline]
#[target_feature(enable = "avx2")]
fn five(b: &[u8], qh: u32, qs_off: usize) -> __m256i {
    let hi = _mm256_and_si256(bits32(qh), _mm256_set1_epi8(16));
    _mm256_or_si256(nibbles(b, qs_off), hi)
}

#[target_feature(enable = "avx2")]
unsafe fn q5_0_avx2(w: &[u8], a: &Q8Row) -> f32 {
    let mut sum = 0.0f32;
    for (ib, b) in w.chunks_exact(22).enumerate() {
        let q = _mm256_sub_epi8(five(b, u32_at(b, 2), 6), _mm256_set1_epi8(16));
        let si = hsum(dot_i8(q, load32_i8(a.qs, ib * 32)));
        sum += (f16_at(b, 0) * a.d[ib]) * si as f32;
    }
    sum
}

#[target_feature(enable = "avx2")]
unsafe fn q5_1_avx2(w: &[u8], a: &Q8Row) -> f32 {
    let mut sum = 0.0f32;
    for (ib, b) in w.chunks_exact(24).enumerate() {
        let si = hsum(dot_u8(five(b, u32_at(b, 4), 8), load32_i8(a.qs, ib * 32)));
        sum += (f16_at(b, 0) * a.d[ib]) * si as f32 + f16_at(b, 2) * a.s[ib];
    }
    sum
}
