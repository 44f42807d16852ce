//! AVX-512 dot products of IQ4_XS, Q4_K, Q5_K and Q6_K for the `avx512bw` and `avx512vnni`
//! kernel sets (the 32-element types are in `avx512_q0.rs`, which shares this file's 512-bit
//! helpers). As the AVX2 kernels (`x86.rs`) they compute the reference's exact integer sums
//! in any order and then its float operations in its order, so each equals the portable
//! reference bit for bit:
//!
//! * IQ4_XS sums four groups in two 512-bit products, then reduces the four sums together;
//!   VNNI's `dpbusd` does the multiply-adds in one instruction where the BW set uses
//!   `maddubs` + `madd` (pairs at most 2 x 128 x 127, never saturated). Signed weights use the
//!   sign trick: `|w|` times `x` negated where `w < 0`;
//! * Q4_K, Q5_K and Q6_K keep the reference's eight float lanes (element `i` in lane `i % 8`):
//!   the products, exact in i16 (at most 32 x 127), are widened so lane `j` of sixteen i32
//!   holds elements `j mod 16`, scaled, and lanes `j` and `j + 8` added once a block.

use std::arch::x86_64::*;

use super::dot::{f16_at, u16_at};
use super::x86::{add_lanes, fold8, k4_mins, load32, load32_i8, nibbles, scale_min_k4, table16};
use super::{DotFn, Q8Row};
use crate::gguf::grids::IQ4NL_KVALUES;
use crate::gguf::GgmlType;

/// The AVX-512 kernel of `ty` for the VNNI set (`vnni`) or the BW set, where there is one
/// and this CPU has the features the set's kernels are compiled for.
pub(super) fn dot(ty: GgmlType, vnni: bool) -> Option<DotFn> {
    let base = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl");
    if !base || (vnni && !is_x86_feature_detected!("avx512vnni")) {
        return None;
    }
    use GgmlType::*;
    Some(match (ty, vnni) {
        (IQ4_XS, true) => vnni::iq4_xs,
        (IQ4_XS, false) => bw::iq4_xs,
        (Q4_K, _) => q4_k,
        (Q5_K, _) => q5_k,
        (Q6_K, _) => q6_k,
        _ => return None,
    })
}

/// `sum u * x` of 64 unsigned and signed bytes, four at a time into 16 i32: one `dpbusd`.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) fn dp_vnni(u: __m512i, x: __m512i) -> __m512i {
    _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, x)
}

/// As [`dp_vnni`] with `maddubs` + `madd` (`u` at most 128, so a pair never saturates).
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
pub(super) fn dp_bw(u: __m512i, x: __m512i) -> __m512i {
    _mm512_madd_epi16(_mm512_maddubs_epi16(u, x), _mm512_set1_epi16(1))
}

/// Two 32-byte halves as one vector, `lo` in the low half.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
pub(super) fn pair(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// 64 activation quants at `p[off..off + 64]` (bounds checked).
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
pub(super) fn load64_i8(p: &[i8], off: usize) -> __m512i {
    let s = &p[off..off + 64];
    // SAFETY: `s` is 64 readable bytes; the load is unaligned.
    unsafe { _mm512_loadu_si512(s.as_ptr() as *const _) }
}

/// `|w|` and `x` negated where `w < 0`: the same products, the weight made unsigned.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
pub(super) fn sign_trick(w: __m512i, x: __m512i) -> (__m512i, __m512i) {
    let neg = _mm512_movepi8_mask(w);
    let xs = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
    (_mm512_abs_epi8(w), xs)
}

/// The totals of four 32-element runs from two vectors of eight i32 partial sums a run
/// (run 0 in the low half of `v01`, run 1 in its high half, runs 2 and 3 in `v23`).
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
pub(super) fn reduce4(v01: __m512i, v23: __m512i) -> [i32; 4] {
    // 128-bit quarter k of `c` holds four partial sums of run k.
    let a = _mm512_shuffle_i64x2::<0b10_00_10_00>(v01, v23);
    let b = _mm512_shuffle_i64x2::<0b11_01_11_01>(v01, v23);
    let c = _mm512_add_epi32(a, b);
    let c = _mm512_add_epi32(c, _mm512_shuffle_epi32::<0b01_00_11_10>(c));
    let c = _mm512_add_epi32(c, _mm512_shuffle_epi32::<0b10_11_00_01>(c));
    [
        _mm_cvtsi128_si32(_mm512_castsi512_si128(c)),
        _mm_cvtsi128_si32(_mm512_extracti32x4_epi32::<1>(c)),
        _mm_cvtsi128_si32(_mm512_extracti32x4_epi32::<2>(c)),
        _mm_cvtsi128_si32(_mm512_extracti32x4_epi32::<3>(c)),
    ]
}

/// IQ4_XS group `g` of block `b`.
#[inline]
#[target_feature(enable = "avx2")]
fn wq_iq4_xs(b: &[u8], g: usize) -> __m256i {
    _mm256_shuffle_epi8(table16(&IQ4NL_KVALUES), nibbles(b, 8 + g * 16))
}

/// Defines the safe entry of a kernel.
macro_rules! entry {
    ($vis:vis $name:ident, $imp:ident) => {
        $vis fn $name(w: &[u8], a: &Q8Row) -> f32 {
            // SAFETY: `dot` hands this function out only after detecting every feature
            // `$imp` is compiled for (AVX2, AVX-512F, BW, VL, and VNNI for the VNNI set);
            // loads go through bounds-checked slices.
            unsafe { $imp(w, a) }
        }
    };
}

/// Defines one set's kernels (module `$m`, compiled for `$feat`, multiply-adds by `$dp`).
macro_rules! block_set {
    ($m:ident, $feat:tt, $dp:ident) => {
        mod $m {
            use super::*;

            entry!(pub(super) iq4_xs, iq4_xs_k);

            /// IQ4_XS: eight groups of 32 a block, each with its own float scale, so the
            /// eight integer sums are reduced four at a time and added in group order.
            #[target_feature(enable = $feat)]
            unsafe fn iq4_xs_k(w: &[u8], a: &Q8Row) -> f32 {
                let mut sumf = 0.0f32;
                for (i, b) in w.chunks_exact(136).enumerate() {
                    let d4d8 = f16_at(b, 0) * a.d[i];
                    let h = u16_at(b, 2);
                    for half in 0..2 {
                        let g0 = 4 * half;
                        let w01 = pair(wq_iq4_xs(b, g0), wq_iq4_xs(b, g0 + 1));
                        let w23 = pair(wq_iq4_xs(b, g0 + 2), wq_iq4_xs(b, g0 + 3));
                        let x = i * 256 + g0 * 32;
                        let (u01, x01) = sign_trick(w01, load64_i8(a.qs, x));
                        let (u23, x23) = sign_trick(w23, load64_i8(a.qs, x + 64));
                        let s = reduce4($dp(u01, x01), $dp(u23, x23));
                        for (k, &si) in s.iter().enumerate() {
                            let g = g0 + k;
                            let lo = (b[4 + g / 2] >> (4 * (g % 2))) & 0x0F;
                            let hi = ((h >> (2 * g)) & 3) as u8;
                            let dl = d4d8 * ((lo | (hi << 4)) as i32 - 32) as f32;
                            sumf += dl * si as f32;
                        }
                    }
                }
                sumf
            }
        }
    };
}

block_set!(vnni, "avx2,avx512f,avx512bw,avx512vl,avx512vnni", dp_vnni);
block_set!(bw, "avx2,avx512f,avx512bw,avx512vl", dp_bw);

entry!(q4_k, q4_k_512);
entry!(q5_k, q5_k_512);
entry!(q6_k, q6_k_512);

/// Adds `scale * q[i] * x[i]` for 32 elements into sixteen i32 lanes (element `i` in lane
/// `i % 16`): `q` unsigned (< 32) or signed (-32..32), the products exact in i16 and two of
/// them (at most 2 x 32 x 127) still exact before the widening.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
fn lanes32(acc: __m512i, q: __m256i, x: __m256i, scale: i32, signed: bool) -> __m512i {
    let q16 = if signed {
        _mm512_cvtepi8_epi16(q)
    } else {
        _mm512_cvtepu8_epi16(q)
    };
    let p = _mm512_mullo_epi16(q16, _mm512_cvtepi8_epi16(x));
    let f = _mm256_add_epi16(_mm512_castsi512_si256(p), _mm512_extracti64x4_epi64::<1>(p));
    let s = _mm512_mullo_epi32(_mm512_cvtepi16_epi32(f), _mm512_set1_epi32(scale));
    _mm512_add_epi32(acc, s)
}

/// Sixteen lanes (`i % 16`) folded to the reference's eight (`i % 8`).
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
fn fold16(acc: __m512i) -> __m256i {
    _mm256_add_epi32(
        _mm512_castsi512_si256(acc),
        _mm512_extracti64x4_epi64::<1>(acc),
    )
}

#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
unsafe fn q4_k_512(w: &[u8], a: &Q8Row) -> f32 {
    let m4 = _mm256_set1_epi8(0x0F);
    let mut lanes = _mm256_setzero_ps();
    let mut sumf = 0.0f32;
    for (i, b) in w.chunks_exact(144).enumerate() {
        let mut acc = _mm512_setzero_si512();
        for j in 0..4 {
            let q4 = load32(b, 16 + j * 32);
            let lo = _mm256_and_si256(q4, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q4), m4);
            for (g, q) in [(2 * j, lo), (2 * j + 1, hi)] {
                let x = load32_i8(a.qs, i * 256 + g * 32);
                acc = lanes32(acc, q, x, scale_min_k4(&b[4..16], g).0 as i32, false);
            }
        }
        lanes = add_lanes(lanes, f16_at(b, 0) * a.d[i], fold16(acc));
        sumf -= k4_mins(b, a, i);
    }
    fold8(sumf, lanes)
}

#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
unsafe fn q5_k_512(w: &[u8], a: &Q8Row) -> f32 {
    let m4 = _mm256_set1_epi8(0x0F);
    let mut lanes = _mm256_setzero_ps();
    let mut sumf = 0.0f32;
    for (i, b) in w.chunks_exact(176).enumerate() {
        let qh = load32(b, 16);
        let mut acc = _mm512_setzero_si512();
        for j in 0..4 {
            let q4 = load32(b, 48 + j * 32);
            let lo = _mm256_and_si256(q4, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q4), m4);
            for (g, q) in [(2 * j, lo), (2 * j + 1, hi)] {
                // Bit g of each qh byte is bit 4 of the quant.
                let bit = _mm256_set1_epi8(1 << g);
                let set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
                let q = _mm256_or_si256(q, _mm256_and_si256(set, _mm256_set1_epi8(16)));
                let x = load32_i8(a.qs, i * 256 + g * 32);
                acc = lanes32(acc, q, x, scale_min_k4(&b[4..16], g).0 as i32, false);
            }
        }
        lanes = add_lanes(lanes, f16_at(b, 0) * a.d[i], fold16(acc));
        sumf -= k4_mins(b, a, i);
    }
    fold8(sumf, lanes)
}

#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
unsafe fn q6_k_512(w: &[u8], a: &Q8Row) -> f32 {
    let m4 = _mm256_set1_epi8(0x0F);
    let m2 = _mm256_set1_epi8(3);
    let mut lanes = _mm256_setzero_ps();
    for (i, b) in w.chunks_exact(210).enumerate() {
        let sc = &b[192..208];
        let mut acc = _mm512_setzero_si512();
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
                // Sub-blocks of 16 with their own scales: elements n..n + 16 (lane j = element
                // j) and n + 16..n + 32 (lane j = element 16 + j), both `i % 16` = j.
                let p = _mm512_mullo_epi16(_mm512_cvtepi8_epi16(q), _mm512_cvtepi8_epi16(x));
                let p0 = _mm512_cvtepi16_epi32(_mm512_castsi512_si256(p));
                let p1 = _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64::<1>(p));
                let k = n / 16;
                let s0 = _mm512_mullo_epi32(p0, _mm512_set1_epi32(sc[k] as i8 as i32));
                let s1 = _mm512_mullo_epi32(p1, _mm512_set1_epi32(sc[k + 1] as i8 as i32));
                acc = _mm512_add_epi32(acc, _mm512_add_epi32(s0, s1));
            }
        }
        lanes = add_lanes(lanes, f16_at(b, 208) * a.d[i], fold16(acc));
    }
    fold8(0.0, lanes)
}
