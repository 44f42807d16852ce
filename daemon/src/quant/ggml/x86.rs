//! AVX2 dot products of the K-quants and IQ4_XS (the 32-element types are in `x86_q0.rs`,
//! which shares this file's helpers). Each computes the same exact integer sums as the
//! portable reference (`dot.rs`) and then the same float operations in the same order, so its
//! result equals the reference's bit for bit (tested in `tests_simd.rs`):
//!
//! * IQ4_XS and Q2_K need only a block's (or sub-block's) total, which `maddubs` + `madd`
//!   give in any order;
//! * Q3_K, Q4_K, Q5_K and Q6_K keep the reference's eight lanes (element `i` in lane `i % 8`): the
//!   products are widened to i16, the two 16-element halves and then the two 8-element
//!   quarters of each run added (still exact in i16), and the eight sums scaled in i32.
//!
//! Activation quants are in [-127, 127] (`act.rs`), so `maddubs`'s pair sums never saturate:
//! at most 2 x 128 x 127 for a signed weight handled by the sign trick.

use std::arch::x86_64::*;

use super::dot::{f16_at, u16_at};
use super::{DotFn, Q8Row};
use crate::gguf::grids::IQ4NL_KVALUES;
use crate::gguf::GgmlType;

/// The AVX2 kernel of `ty`, where there is one and this CPU has AVX2.
pub(super) fn dot(ty: GgmlType) -> Option<DotFn> {
    if !is_x86_feature_detected!("avx2") {
        return None;
    }
    use GgmlType::*;
    Some(match ty {
        IQ4_XS => iq4_xs,
        Q2_K => q2_k,
        Q3_K => q3_k,
        Q4_K => q4_k,
        Q5_K => q5_k,
        Q6_K => q6_k,
        _ => return None,
    })
}

/// Defines the safe entry of an AVX2 kernel.
macro_rules! entry {
    ($name:ident, $imp:ident) => {
        fn $name(w: &[u8], a: &Q8Row) -> f32 {
            // SAFETY: `dot` hands this function out only after detecting AVX2, the one
            // feature `$imp` is compiled for; its loads stay inside `w` and `a` (whole blocks,
            // as the reference reads them).
            unsafe { $imp(w, a) }
        }
    };
}

entry!(iq4_xs, iq4_xs_avx2);
entry!(q2_k, q2_k_avx2);
entry!(q3_k, q3_k_avx2);
entry!(q4_k, q4_k_avx2);
entry!(q5_k, q5_k_avx2);
entry!(q6_k, q6_k_avx2);

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn hsum(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// Eight i32 partial sums of `w * x` for 32 signed bytes each (sign trick).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn dot_i8(w: __m256i, x: __m256i) -> __m256i {
    let p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

/// Eight i32 partial sums of `u * x` for 32 unsigned bytes `u` (< 128) and signed `x`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn dot_u8(u: __m256i, x: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1))
}

/// 32 unaligned bytes at `p[off..off + 32]` (bounds checked).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn load32(p: &[u8], off: usize) -> __m256i {
    let s = &p[off..off + 32];
    // SAFETY: `s` is 32 readable bytes; the load is unaligned.
    unsafe { _mm256_loadu_si256(s.as_ptr() as *const __m256i) }
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn load32_i8(p: &[i8], off: usize) -> __m256i {
    let s = &p[off..off + 32];
    // SAFETY: as `load32`.
    unsafe { _mm256_loadu_si256(s.as_ptr() as *const __m256i) }
}

/// 16 nibble bytes at `p[off..]` as 32 bytes: low nibbles (elements 0..16), then high.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn nibbles(p: &[u8], off: usize) -> __m256i {
    let s = &p[off..off + 16];
    // SAFETY: `s` is 16 readable bytes.
    let v = unsafe { _mm_loadu_si128(s.as_ptr() as *const __m128i) };
    let m = _mm_set1_epi8(0x0F);
    let lo = _mm_and_si128(v, m);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), m);
    _mm256_set_m128i(hi, lo)
}

/// A 16-entry signed table in both 128-bit lanes, for `shuffle_epi8` lookups.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn table16(t: &[i8; 16]) -> __m256i {
    // SAFETY: `t` is 16 readable bytes.
    let v = unsafe { _mm_loadu_si128(t.as_ptr() as *const __m128i) };
    _mm256_set_m128i(v, v)
}

#[target_feature(enable = "avx2")]
unsafe fn iq4_xs_avx2(w: &[u8], a: &Q8Row) -> f32 {
    let tab = table16(&IQ4NL_KVALUES);
    let mut sumf = 0.0f32;
    for (i, b) in w.chunks_exact(136).enumerate() {
        let d4d8 = f16_at(b, 0) * a.d[i];
        let h = u16_at(b, 2);
        for g in 0..8 {
            let lo = (b[4 + g / 2] >> (4 * (g % 2))) & 0x0F;
            let hi = ((h >> (2 * g)) & 3) as u8;
            let dl = d4d8 * ((lo | (hi << 4)) as i32 - 32) as f32;
            let q = _mm256_shuffle_epi8(tab, nibbles(b, 8 + g * 16));
            let si = hsum(dot_i8(q, load32_i8(a.qs, i * 256 + g * 32)));
            sumf += dl * si as f32;
        }
    }
    sumf
}

#[target_feature(enable = "avx2")]
unsafe fn q2_k_avx2(w: &[u8], a: &Q8Row) -> f32 {
    let mut sumf = 0.0f32;
    let m3 = _mm256_set1_epi8(3);
    for (i, b) in w.chunks_exact(84).enumerate() {
        let sc = &b[0..16];
        let bs = &a.bsums[i * 16..(i + 1) * 16];
        let summs: i32 = bs
            .iter()
            .zip(sc)
            .map(|(&s, &c)| s as i32 * (c >> 4) as i32)
            .sum();
        let dall = a.d[i] * f16_at(b, 80);
        let dmin = a.d[i] * f16_at(b, 82);
        let mut acc = _mm256_setzero_si256();
        for half in 0..2 {
            let q2 = load32(b, 16 + half * 32);
            for plane in 0..4 {
                // Sub-blocks k (low 16 bytes) and k + 1 (high 16): one scale per 128-bit lane.
                let k = half * 8 + plane * 2;
                let q = _mm256_and_si256(
                    _mm256_srl_epi16(q2, _mm_cvtsi32_si128(2 * plane as i32)),
                    m3,
                );
                let x = load32_i8(a.qs, i * 256 + k * 16);
                let s = _mm256_set_epi32(
                    (sc[k + 1] & 0x0F) as i32,
                    (sc[k + 1] & 0x0F) as i32,
                    (sc[k + 1] & 0x0F) as i32,
                    (sc[k + 1] & 0x0F) as i32,
                    (sc[k] & 0x0F) as i32,
                    (sc[k] & 0x0F) as i32,
                    (sc[k] & 0x0F) as i32,
                    (sc[k] & 0x0F) as i32,
                );
                acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(dot_u8(q, x), s));
            }
        }
        let isum = hsum(acc);
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

/// Adds `scale * q[i] * x[i]` for 32 elements into the eight lanes `acc` (lane `i % 8`):
/// `q` unsigned (< 128) or signed, widened exactly; at most 4 x 64 x 128 in a lane's i16.
#[inline]
#[target_feature(enable = "avx2")]
fn lanes32(acc: __m256i, q: __m256i, x: __m256i, scale: i32, signed: bool) -> __m256i {
    let (ql, qh) = (_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q));
    let (q0, q1) = if signed {
        (_mm256_cvtepi8_epi16(ql), _mm256_cvtepi8_epi16(qh))
    } else {
        (_mm256_cvtepu8_epi16(ql), _mm256_cvtepu8_epi16(qh))
    };
    let x0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(x));
    let x1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(x));
    let p = _mm256_add_epi16(_mm256_mullo_epi16(q0, x0), _mm256_mullo_epi16(q1, x1));
    let p8 = _mm_add_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256::<1>(p));
    let s = _mm256_mullo_epi32(_mm256_cvtepi16_epi32(p8), _mm256_set1_epi32(scale));
    _mm256_add_epi32(acc, s)
}

/// As [`lanes32`] for 16 signed elements at the low half of `q` and `x` (Q6_K's sub-blocks).
#[inline]
#[target_feature(enable = "avx2")]
fn lanes16(acc: __m256i, q: __m128i, x: __m128i, scale: i32) -> __m256i {
    let p = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(q), _mm256_cvtepi8_epi16(x));
    let p8 = _mm_add_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256::<1>(p));
    let s = _mm256_mullo_epi32(_mm256_cvtepi16_epi32(p8), _mm256_set1_epi32(scale));
    _mm256_add_epi32(acc, s)
}

/// `lanes[l] += d * acc[l]`, a product then a sum per lane as the reference.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn add_lanes(lanes: __m256, d: f32, acc: __m256i) -> __m256 {
    _mm256_add_ps(
        lanes,
        _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(acc)),
    )
}

/// `sumf` plus the eight lanes in order.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn fold8(sumf: f32, lanes: __m256) -> f32 {
    let mut l = [0f32; 8];
    // SAFETY: `l` is 8 writable f32; the store is unaligned.
    unsafe { _mm256_storeu_ps(l.as_mut_ptr(), lanes) };
    l.iter().fold(sumf, |s, &v| s + v)
}

#[inline]
pub(super) fn scale_min_k4(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 0x3F, s[4 + j] & 0x3F)
    } else {
        let sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 2) & 0x30);
        let m = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
        (sc, m)
    }
}

/// The min term of a Q4_K/Q5_K block, as the reference computes it.
#[inline]
pub(super) fn k4_mins(b: &[u8], a: &Q8Row, i: usize) -> f32 {
    let scales = &b[4..16];
    let mut msum = 0i32;
    for (j, &s) in a.bsums[i * 16..(i + 1) * 16].iter().enumerate() {
        msum += s as i32 * scale_min_k4(scales, j / 2).1 as i32;
    }
    f16_at(b, 2) * a.d[i] * msum as f32
}

#[target_feature(enable = "avx2")]
unsafe fn q4_k_avx2(w: &[u8], a: &Q8Row) -> f32 {
    let m4 = _mm256_set1_epi8(0x0F);
    let mut lanes = _mm256_setzero_ps();
    let mut sumf = 0.0f32;
    for (i, b) in w.chunks_exact(144).enumerate() {
        let mut acc = _mm256_setzero_si256();
        for j in 0..4 {
            let q4 = load32(b, 16 + j * 32);
            let lo = _mm256_and_si256(q4, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q4), m4);
            for (g, q) in [(2 * j, lo), (2 * j + 1, hi)] {
                let x = load32_i8(a.qs, i * 256 + g * 32);
                acc = lanes32(acc, q, x, scale_min_k4(&b[4..16], g).0 as i32, false);
            }
        }
        lanes = add_lanes(lanes, f16_at(b, 0) * a.d[i], acc);
        sumf -= k4_mins(b, a, i);
    }
    fold8(sumf, lanes)
}

#[target_feature(enable = "avx2")]
unsafe fn q5_k_avx2(w: &[u8], a: &Q8Row) -> f32 {
    let m4 = _mm256_set1_epi8(0x0F);
    let mut lanes = _mm256_setzero_ps();
    let mut sumf = 0.0f32;
    for (i, b) in w.chunks_exact(176).enumerate() {
        let qh = load32(b, 16);
        let mut acc = _mm256_setzero_si256();
        for j in 0..4 {
            let q4 = load32(b, 48 + j * 32);
            let lo = _mm256_and_si256(q4, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q4), m4);
            for (g, q) in [(2 * j, lo), (2 * j + 1, hi)] {
                // Bit g of each qh byte, as 16.
                let bit = _mm256_set1_epi8(1 << g);
                let set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
                let q = _mm256_or_si256(q, _mm256_and_si256(set, _mm256_set1_epi8(16)));
                let x = load32_i8(a.qs, i * 256 + g * 32);
                acc = lanes32(acc, q, x, scale_min_k4(&b[4..16], g).0 as i32, false);
            }
        }
        lanes = add_lanes(lanes, f16_at(b, 0) * a.d[i], acc);
        sumf -= k4_mins(b, a, i);
    }
    fold8(sumf, lanes)
}

#[target_feature(enable = "avx2")]
unsafe fn q6_k_avx2(w: &[u8], a: &Q8Row) -> f32 {
    let m4 = _mm256_set1_epi8(0x0F);
    let m2 = _mm256_set1_epi8(3);
    let mut lanes = _mm256_setzero_ps();
    for (i, b) in w.chunks_exact(210).enumerate() {
        let sc = &b[192..208];
        let mut acc = _mm256_setzero_si256();
        for half in 0..2 {
            let qh = load32(b, 128 + half * 32);
            for c in 0..4 {
                let ql = load32(b, half * 64 + (c % 2) * 32);
                let lo = if c < 2 {
                    _mm256_and_si256(ql, m4)
                } else {
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql), m4)
                };
                let shift = _mm_cvtsi32_si128(2 * c as i32);
                let hi = _mm256_and_si256(_mm256_srl_epi16(qh, shift), m2);
                let q = _mm256_sub_epi8(
                    _mm256_or_si256(lo, _mm256_slli_epi16::<4>(hi)),
                    _mm256_set1_epi8(32),
                );
                let n = half * 128 + c * 32;
                let x = load32_i8(a.qs, i * 256 + n);
                let k = n / 16;
                acc = lanes16(
                    acc,
                    _mm256_castsi256_si128(q),
                    _mm256_castsi256_si128(x),
                    sc[k] as i8 as i32,
                );
                acc = lanes16(
                    acc,
                    _mm256_extracti128_si256::<1>(q),
                    _mm256_extracti128_si256::<1>(x),
                    sc[k + 1] as i8 as i32,
                );
            }
        }
        lanes = add_lanes(lanes, f16_at(b, 208) * a.d[i], acc);
    }
    fold8(0.0, lanes)
}

#[target_feature(enable = "avx2")]
unsafe fn q3_k_avx2(w: &[u8], a: &Q8Row) -> f32 {
    let m3 = _mm256_set1_epi8(3);
    let mut lanes = _mm256_setzero_ps();
    for (i, b) in w.chunks_exact(110).enumerate() {
        let hm = load32(b, 0);
        let sc = &b[96..108];
        let scale = |k: usize| {
            let lo = (sc[k % 8] >> (4 * (k / 8))) & 0x0F;
            let hi = (sc[8 + k % 4] >> (2 * (k / 4))) & 0x03;
            (lo | (hi << 4)) as i32 - 32
        };
        let mut acc = _mm256_setzero_si256();
        for c in 0..8 {
            // Elements 32c..: plane c % 4 of half c / 4, less 4 where high bit c is clear.
            let shift = _mm_cvtsi32_si128(2 * (c % 4) as i32);
            let lo = _mm256_and_si256(_mm256_srl_epi16(load32(b, 32 + (c / 4) * 32), shift), m3);
            let bit = _mm256_set1_epi8(1 << c);
            let set = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit);
            let q = _mm256_sub_epi8(lo, _mm256_andnot_si256(set, _mm256_set1_epi8(4)));
            let x = load32_i8(a.qs, i * 256 + c * 32);
            acc = lanes16(
                acc,
                _mm256_castsi256_si128(q),
                _mm256_castsi256_si128(x),
                scale(2 * c),
            );
            acc = lanes16(
                acc,
                _mm256_extracti128_si256::<1>(q),
                _mm256_extracti128_si256::<1>(x),
                scale(2 * c + 1),
            );
        }
        lanes = add_lanes(lanes, f16_at(b, 108) * a.d[i], acc);
    }
    fold8(0.0, lanes)
}
