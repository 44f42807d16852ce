//! AVX-512 dot products of Q6_K for the `avx512bw` and `avx512vnni` kernel sets (the
//! 32-element types are in `avx512_q0.rs`, which shares this file's 512-bit helpers; IQ4_XS,
//! Q4_K and Q5_K take their AVX2 kernels, which 512-bit versions did not beat). As the AVX2
//! kernels (`x86.rs`) they compute the reference's exact integer sums in any order and then
//! its float operations in its order, so each equals the portable reference bit for bit:
//!
//! * Q6_K keeps the reference's eight float lanes (element `n` of a block in
//!   lane `(n % 32) / 4`): two 32-element runs a 512-bit vector, `maddubs` then the runs'
//!   scales by `madd` (BW) or `dpwssd` (VNNI) into sixteen i32, whose upper eight are added to
//!   the lower eight once a block.

use std::arch::x86_64::*;

use super::x86::{add_lanes, f16_one, fold8, load16, load32};
use super::{DotFn, Q8Row};
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

/// Defines one set's K-quant kernel (module `$m`, compiled for `$feat`): each 64 elements
/// (two 32-element runs, one a 256-bit half) one `maddubs` and one scaled pair sum into
/// sixteen i32, `$acc(acc, pairs, scales)` (`madd` + add, or VNNI's `dpwssd`). Lane `m` of
/// a half holds elements `4m..4m + 4` of its run, so the upper eight lanes added to the lower
/// eight are the reference's lanes `(n % 32) / 4`.
macro_rules! k_set {
    ($m:ident, $feat:tt, $acc:ident) => {
        pub(super) mod $m {
            use super::*;

            entry!(pub(in super::super) q6_k, q6_k_k);

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
