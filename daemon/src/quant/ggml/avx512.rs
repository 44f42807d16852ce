//! AVX-512 kernels of the K-quants for the `avx512bw` and `avx512vnni` kernel sets (the
//! 32-element types are in `avx512_q0.rs`, which shares this file's 512-bit helpers): the
//! Q6_K row dot product, and the 1-row x 4-position prefill tiles of Q4_K, Q5_K and Q6_K
//! (IQ4_XS, Q4_K and Q5_K dot products take their AVX2 kernels, which 512-bit versions did
//! not beat one position at a time). As the AVX2 kernels (`x86.rs`) they compute the
//! reference's exact integer sums in any order and then its float operations in its order,
//! so each equals the portable reference bit for bit:
//!
//! * each 64 elements are two 32-element runs, one a 256-bit half: `maddubs`, then the runs'
//!   scales by `madd` (BW) or `dpwssd` (VNNI) into sixteen i32, whose upper eight are added
//!   to the lower eight once a block, which leaves the reference's eight lanes (element `n`
//!   of a block in lane `(n % 32) / 4`), whose total the float steps take (`dot::K4Sums`,
//!   `dot::q6_k`).
//! * a tile decodes a block's weights once for its four positions and keeps each position's
//!   lanes and running sum apart, with the row dot's float steps.

use std::arch::x86_64::*;

use super::x86::{
    f16_one, f16_pair, hsum, hsum4, k4_add4, k4_block_end, k4_msum, k4_msum4, k4_scales_mins,
    load16, load32,
};
use super::{DotFn, DotTileFn, Q8Row};
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
        (Q6_K, true) => kvnni::q6_k,
        (Q6_K, false) => kbw::q6_k,
        _ => return None,
    })
}

/// The AVX-512 1-row x 4-position tile of `ty` for the VNNI set (`vnni`) or the BW set,
/// where there is one and this CPU has the set's features.
pub(super) fn tile(ty: GgmlType, vnni: bool) -> Option<DotTileFn> {
    dot(GgmlType::Q6_K, vnni)?;
    use GgmlType::*;
    Some(match (ty, vnni) {
        (Q4_K, true) => kvnni::q4_k_tile,
        (Q4_K, false) => kbw::q4_k_tile,
        (Q5_K, true) => kvnni::q5_k_tile,
        (Q5_K, false) => kbw::q5_k_tile,
        (Q6_K, true) => kvnni::q6_k_tile,
        (Q6_K, false) => kbw::q6_k_tile,
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

/// Defines the safe row entry of a kernel (one position of its `N`-position form).
macro_rules! entry {
    ($vis:vis $name:ident, $imp:ident) => {
        $vis fn $name(w: &[u8], a: &Q8Row) -> f32 {
            // SAFETY: `dot` hands this function out only after detecting every feature
            // `$imp` is compiled for (AVX2, F16C, AVX-512F, BW, VL, and VNNI for the VNNI
            // set);
            // loads go through bounds-checked slices.
            unsafe { $imp::<1>(w, &[*a])[0] }
        }
    };
}

/// Defines the safe 4-position tile entry of a kernel.
macro_rules! tile_entry {
    ($vis:vis $name:ident, $imp:ident) => {
        $vis fn $name(w: &[u8], a: &[Q8Row; 4]) -> [f32; 4] {
            // SAFETY: `tile` hands this function out only after `dot` detected every
            // feature `$imp` is compiled for; loads go through bounds-checked slices.
            unsafe { $imp::<4>(w, a) }
        }
    };
}

/// Defines one set's K-quant kernels (module `$m`, compiled for `$feat`): each 64 elements
/// (two 32-element runs, one a 256-bit half) one `maddubs` and one scaled pair sum into
/// sixteen i32 a position, `$acc(acc, pairs, scales)` (`madd` + add, or VNNI's `dpwssd`).
/// Each kernel runs one weight row against `N` positions (`N = 1`: the row dot, `N = 4`: the
/// tile), every position with the single dot's integer lanes and float steps.
macro_rules! k_set {
    ($m:ident, $feat:tt, $acc:ident) => {
        pub(super) mod $m {
            use super::*;

            entry!(pub(in super::super) q6_k, q6_k_n);
            tile_entry!(pub(in super::super) q4_k_tile, q4_k_n);
            tile_entry!(pub(in super::super) q5_k_tile, q5_k_n);
            tile_entry!(pub(in super::super) q6_k_tile, q6_k_n);

            #[target_feature(enable = $feat)]
            unsafe fn q4_k_n<const N: usize>(w: &[u8], a: &[Q8Row; N]) -> [f32; N] {
                let m4 = _mm512_set1_epi8(0x0F);
                let nib = shifts(0, 4);
                let (mut sum, mut mins) = ([0.0f32; N], [0.0f32; N]);
                for (i, b) in w.chunks_exact(144).enumerate() {
                    let (d, dmin) = f16_pair(b, 0);
                    let sm = k4_scales_mins(&b[4..16]);
                    let sc = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(sm));
                    let mut acc = [_mm512_setzero_si512(); N];
                    for j in 0..4 {
                        // Run 2j: the low nibbles of 32 bytes (low half); run 2j + 1: the
                        // high nibbles (high half).
                        let q4 = _mm512_broadcast_i64x4(load32(b, 16 + j * 32));
                        let q = _mm512_and_si512(_mm512_srlv_epi16(q4, nib), m4);
                        let s = scales2_u16(sc, 2 * j);
                        for p in 0..N {
                            let x = load64_i8(a[p].qs, i * 256 + j * 64);
                            acc[p] = $acc(acc[p], _mm512_maddubs_epi16(q, x), s);
                        }
                    }
                    k4_block_end!(N, sum, mins, |p| fold16(acc[p]), a, i, d, dmin, sm);
                }
                std::array::from_fn(|p| sum[p] - mins[p])
            }

            #[target_feature(enable = $feat)]
            unsafe fn q5_k_n<const N: usize>(w: &[u8], a: &[Q8Row; N]) -> [f32; N] {
                let m4 = _mm512_set1_epi8(0x0F);
                let b4 = _mm512_set1_epi8(0x10);
                let nib = shifts(0, 4);
                let (mut sum, mut mins) = ([0.0f32; N], [0.0f32; N]);
                for (i, b) in w.chunks_exact(176).enumerate() {
                    let (d, dmin) = f16_pair(b, 0);
                    let sm = k4_scales_mins(&b[4..16]);
                    let sc = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(sm));
                    // Bit g of each qh byte is bit 4 of run g's quant: the high half starts
                    // one bit further down (run 2j + 1), and both move two bits a step.
                    let mut qh = _mm512_srlv_epi16(
                        _mm512_broadcast_i64x4(load32(b, 16)),
                        shifts(0, 1),
                    );
                    let mut acc = [_mm512_setzero_si512(); N];
                    for j in 0..4 {
                        let q4 = _mm512_broadcast_i64x4(load32(b, 48 + j * 32));
                        let q = _mm512_or_si512(
                            _mm512_and_si512(_mm512_srlv_epi16(q4, nib), m4),
                            _mm512_and_si512(_mm512_slli_epi16::<4>(qh), b4),
                        );
                        qh = _mm512_srli_epi16::<2>(qh);
                        let s = scales2_u16(sc, 2 * j);
                        for p in 0..N {
                            let x = load64_i8(a[p].qs, i * 256 + j * 64);
                            acc[p] = $acc(acc[p], _mm512_maddubs_epi16(q, x), s);
                        }
                    }
                    k4_block_end!(N, sum, mins, |p| fold16(acc[p]), a, i, d, dmin, sm);
                }
                std::array::from_fn(|p| sum[p] - mins[p])
            }

            #[target_feature(enable = $feat)]
            unsafe fn q6_k_n<const N: usize>(w: &[u8], a: &[Q8Row; N]) -> [f32; N] {
                let m4 = _mm512_set1_epi8(0x0F);
                let m2 = _mm512_set1_epi8(0x30);
                let off = _mm512_set1_epi8(32);
                let mut sum = [0.0f32; N];
                for (i, b) in w.chunks_exact(210).enumerate() {
                    let sc = _mm512_broadcast_i32x4(load16(b, 192));
                    let mut acc = [_mm512_setzero_si512(); N];
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
                        for (r, q) in [(0, q01), (1, q23)] {
                            let n = half * 128 + r * 64;
                            let s = scales4_i8(sc, n / 16);
                            for p in 0..N {
                                let x = load64_i8(a[p].qs, i * 256 + n);
                                let pairs = _mm512_sub_epi16(
                                    _mm512_maddubs_epi16(q, x),
                                    _mm512_maddubs_epi16(off, x),
                                );
                                acc[p] = $acc(acc[p], pairs, s);
                            }
                        }
                    }
                    let d = f16_one(b, 208);
                    for p in 0..N {
                        sum[p] += (d * a[p].d[i]) * hsum(fold16(acc[p])) as f32;
                    }
                }
                sum
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

/// From eight i16 `s` in every quarter: i16 `g` spread over the low half's sixteen, `g + 1`
/// over the high half's (the scales of two 32-element runs).
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
fn scales2_u16(s: __m512i, g: usize) -> __m512i {
    let pick = |g: usize| _mm256_set1_epi16((((2 * g + 1) << 8) | 2 * g) as i16);
    _mm512_shuffle_epi8(s, pair(pick(g), pick(g + 1)))
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
