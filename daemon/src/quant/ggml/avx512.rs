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
//! * Q4_K, Q5_K and Q6_K keep the reference's eight float lanes (element `n` of a block in
//!   lane `(n % 32) / 4`): two 32-element runs a 512-bit vector, `maddubs` then the runs'
//!   scales by `madd` (BW) or `dpwssd` (VNNI) into sixteen i32, whose upper eight are added to
//!   the lower eight once a block.

use std::arch::x86_64::*;

use super::dot::{f16_at, u16_at};
use super::x86::{
    add_lanes, f16_one, f16_pair, fold8, k4_msum, k4_scales_mins, load16, load32, nibbles, table16,
};
use super::{DotFn, Q8Row};
use crate::gguf::grids::IQ4NL_KVALUES;
use crate::gguf::GgmlType;

/// The AVX-512 kernel of `ty` for the VNNI set (`vnni`) or the BW set, where there is one
/// and this CPU has the features the set's kernels are compiled for.
pub(super) fn dot(ty: GgmlType, vnni: bool) -> Option<DotFn> {
    let base = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("f16c")
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
        (Q4_K, true) => kvnni::q4_k,
        (Q5_K, true) => kvnni::q5_k,
        (Q6_K, true) => kvnni::q6_k,
        (Q4_K, false) => kbw::q4_k,
        (Q5_K, false) => kbw::q5_k,
        (Q6_K, false) => kbw::q6_k,
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
            // `$imp` is compiled for (AVX2, F16C, AVX-512F, BW, VL, and VNNI for the VNNI
            // set);
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

/// Defines one set's K-quant kernels (module `$m`, compiled for `$feat`): each 64 elements
/// (two 32-element runs, one a 256-bit half) one `maddubs` and one scaled pair sum into
/// sixteen i32, `$acc(acc, pairs, scales)` (`madd` + add, or VNNI's `dpwssd`). Lane `m` of
/// a half holds elements `4m..4m + 4` of its run, so the upper eight lanes added to the lower
/// eight are the reference's lanes `(n % 32) / 4`.
macro_rules! k_set {
    ($m:ident, $feat:tt, $acc:ident) => {
        pub(super) mod $m {
            use super::*;

            entry!(pub(in super::super) q4_k, q4_k_k);
            entry!(pub(in super::super) q5_k, q5_k_k);
            entry!(pub(in super::super) q6_k, q6_k_k);

            /// Q4_K/Q5_K's runs `4jj .. 4jj + 4` of block `i`: the low-nibble runs (4jj in
            /// the low half, 4jj + 2 in the high) and the high-nibble ones, with their
            /// activations, into `acc`.
            #[inline]
            #[target_feature(enable = $feat)]
            fn k4_runs(acc: __m512i, lo: __m512i, hi: __m512i, sc: __m512i, a: &Q8Row,
                       i: usize, jj: usize) -> __m512i {
                let x0 = load64_i8(a.qs, i * 256 + jj * 128);
                let x1 = load64_i8(a.qs, i * 256 + jj * 128 + 64);
                let xlo = _mm512_shuffle_i64x2::<0b01_00_01_00>(x0, x1);
                let xhi = _mm512_shuffle_i64x2::<0b11_10_11_10>(x0, x1);
                let g = 4 * jj;
                let slo = _mm512_shuffle_epi8(sc, spread2(g, g + 2));
                let shi = _mm512_shuffle_epi8(sc, spread2(g + 1, g + 3));
                let acc = $acc(acc, _mm512_maddubs_epi16(lo, xlo), slo);
                $acc(acc, _mm512_maddubs_epi16(hi, xhi), shi)
            }

            #[target_feature(enable = $feat)]
            unsafe fn q4_k_k(w: &[u8], a: &Q8Row) -> f32 {
                let m4 = _mm512_set1_epi8(0x0F);
                let mut lanes = _mm256_setzero_ps();
                let mut sumf = 0.0f32;
                for (i, b) in w.chunks_exact(144).enumerate() {
                    let (d, dmin) = f16_pair(b, 0);
                    let sm = k4_scales_mins(&b[4..16]);
                    let sc = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(sm));
                    let mut acc = _mm512_setzero_si512();
                    for jj in 0..2 {
                        let q4 = load64(b, 16 + jj * 64);
                        let lo = _mm512_and_si512(q4, m4);
                        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q4), m4);
                        acc = k4_runs(acc, lo, hi, sc, a, i, jj);
                    }
                    lanes = add_lanes(lanes, d * a.d[i], fold16(acc));
                    sumf -= dmin * a.d[i] * k4_msum(sm, a, i) as f32;
                }
                fold8(sumf, lanes)
            }

            #[target_feature(enable = $feat)]
            unsafe fn q5_k_k(w: &[u8], a: &Q8Row) -> f32 {
                let m4 = _mm512_set1_epi8(0x0F);
                let b4 = _mm512_set1_epi8(0x10);
                let mut lanes = _mm256_setzero_ps();
                let mut sumf = 0.0f32;
                for (i, b) in w.chunks_exact(176).enumerate() {
                    let (d, dmin) = f16_pair(b, 0);
                    let sm = k4_scales_mins(&b[4..16]);
                    let sc = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(sm));
                    // Bit g of each qh byte is bit 4 of run g's quant.
                    let qh = _mm512_broadcast_i64x4(load32(b, 16));
                    let mut acc = _mm512_setzero_si512();
                    for jj in 0..2 {
                        let g = 4 * jj;
                        let q4 = load64(b, 48 + jj * 64);
                        let lo = _mm512_and_si512(q4, m4);
                        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q4), m4);
                        let klo = _mm512_test_epi8_mask(qh, bit2(g, g + 2));
                        let khi = _mm512_test_epi8_mask(qh, bit2(g + 1, g + 3));
                        let lo = _mm512_mask_add_epi8(lo, klo, lo, b4);
                        let hi = _mm512_mask_add_epi8(hi, khi, hi, b4);
                        acc = k4_runs(acc, lo, hi, sc, a, i, jj);
                    }
                    lanes = add_lanes(lanes, d * a.d[i], fold16(acc));
                    sumf -= dmin * a.d[i] * k4_msum(sm, a, i) as f32;
                }
                fold8(sumf, lanes)
            }

            #[target_feature(enable = $feat)]
            unsafe fn q6_k_k(w: &[u8], a: &Q8Row) -> f32 {
                let m4 = _mm512_set1_epi8(0x0F);
                let m2 = _mm512_set1_epi8(0x30);
                let off = _mm512_set1_epi8(32);
                let mut lanes = _mm256_setzero_ps();
                for (i, b) in w.chunks_exact(210).enumerate() {
                    let sc = _mm512_broadcast_i32x4(load16(b, 192));
                    let mut acc = _mm512_setzero_si512();
                    for half in 0..2 {
                        // Runs 0, 1 of the half: low nibbles of its 64 ql bytes, bits 0-1
                        // and 2-3 of qh on top; runs 2, 3: high nibbles, bits 4-5 and 6-7.
                        let ql = load64(b, half * 64);
                        let qh = _mm512_broadcast_i64x4(load32(b, 128 + half * 32));
                        let q01 = _mm512_or_si512(
                            _mm512_and_si512(ql, m4),
                            _mm512_and_si512(_mm512_sllv_epi16(qh, shifts(4, 2)), m2),
                        );
                        let q23 = _mm512_or_si512(
                            _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4),
                            _mm512_and_si512(_mm512_srlv_epi16(qh, shifts(0, 2)), m2),
                        );
                        for (p, q) in [(0, q01), (1, q23)] {
                            let n = half * 128 + p * 64;
                            let x = load64_i8(a.qs, i * 256 + n);
                            let pairs = _mm512_sub_epi16(
                                _mm512_maddubs_epi16(q, x),
                                _mm512_maddubs_epi16(off, x),
                            );
                            acc = $acc(acc, pairs, scales4_i8(sc, n / 16));
                        }
                    }
                    lanes = add_lanes(lanes, f16_one(b, 208) * a.d[i], fold16(acc));
                }
                fold8(0.0, lanes)
            }
        }
    };
}

/// `acc` plus the pair products of `p` and `s` (AVX-512 BW).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn madd_add(acc: __m512i, p: __m512i, s: __m512i) -> __m512i {
    _mm512_add_epi32(acc, _mm512_madd_epi16(p, s))
}

/// As [`madd_add`] in one VNNI instruction.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn dpwssd(acc: __m512i, p: __m512i, s: __m512i) -> __m512i {
    _mm512_dpwssd_epi32(acc, p, s)
}

k_set!(kbw, "avx2,f16c,avx512f,avx512bw,avx512vl", madd_add);
k_set!(
    kvnni,
    "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    dpwssd
);

/// 64 bytes at `p[off..off + 64]` (bounds checked).
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
fn load64(p: &[u8], off: usize) -> __m512i {
    let s = &p[off..off + 64];
    // SAFETY: `s` is 64 readable bytes; the load is unaligned.
    unsafe { _mm512_loadu_si512(s.as_ptr() as *const _) }
}

/// The shuffle that spreads i16 `g0` of each 128-bit quarter over the low 256-bit half's
/// quarters and i16 `g1` over the high half's (the scales of two runs).
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
fn spread2(g0: usize, g1: usize) -> __m512i {
    let s = |g: usize| _mm256_set1_epi16((((2 * g + 1) << 8) | 2 * g) as i16);
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(s(g0)), s(g1))
}

/// Bit `g0` in every byte of the low half, bit `g1` in every byte of the high half.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
fn bit2(g0: usize, g1: usize) -> __m512i {
    let lo = _mm256_set1_epi8((1u8 << g0) as i8);
    let hi = _mm256_set1_epi8((1u8 << g1) as i8);
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// Per-i16 shift counts: `lo` in the low half, `hi` in the high half.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
fn shifts(lo: i16, hi: i16) -> __m512i {
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_set1_epi16(lo)),
        _mm256_set1_epi16(hi),
    )
}

/// From sixteen signed bytes `s` in every quarter: byte `k + q` sign-extended into the
/// eight i16 of quarter `q` (the scales of four 16-element sub-blocks).
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
fn scales4_i8(s: __m512i, k: usize) -> __m512i {
    let quarter = _mm512_set_epi64(
        0x0303_0303_0303_0303,
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0x0101_0101_0101_0101,
        0,
        0,
    );
    let pick = _mm512_add_epi8(_mm512_set1_epi8(k as i8), quarter);
    // Each i16 gets the byte twice; its high copy shifted down extends the sign.
    _mm512_srai_epi16::<8>(_mm512_shuffle_epi8(s, pick))
}

/// Sixteen lanes folded to the reference's eight: the high half's runs onto the low half's.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
fn fold16(acc: __m512i) -> __m256i {
    _mm256_add_epi32(
        _mm512_castsi512_si256(acc),
        _mm512_extracti64x4_epi64::<1>(acc),
    )
}
