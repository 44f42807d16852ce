//! AVX-512 dot products of the GGUF types people run most (Q8_0, Q4_0, IQ4_NL, MXFP4, Q6_K;
//! IQ4_XS, Q4_K and Q5_K take their AVX2 kernels, which 512-bit versions did not beat), for the `avx512bw` and `avx512vnni` kernel sets. As the AVX2
//! kernels (`x86.rs`) they compute the reference's exact integer sums in any order and then
//! its float operations in its order, so each equals the portable reference bit for bit:
//!
//! * the 32-element types sum four blocks in two 512-bit products, then
//!   reduce the four sums together; VNNI's `dpbusd` does the multiply-adds in one
//!   instruction where the BW set uses `maddubs` + `madd` (pairs at most 2 x 128 x 127, never
//!   saturated). Signed weights use the sign trick: `|w|` times `x` negated where `w < 0`;
//! * Q6_K keeps the reference's eight float lanes (element `n` of a block in
//!   lane `(n % 32) / 4`): two 32-element runs a 512-bit vector, `maddubs` then the runs'
//!   scales by `madd` (BW) or `dpwssd` (VNNI) into sixteen i32, whose upper eight are added to
//!   the lower eight once a block.

use std::arch::x86_64::*;

use super::dot::{e8m0_half, f16_at, u16_at};
use super::x86::{
    add_lanes, dot_i8, f16_one, fold8, hsum, load16, load32, load32_i8, nibbles, table16,
};
use super::{DotFn, Q8Row};
use crate::gguf::grids::{IQ4NL_KVALUES, MXFP4_KVALUES};
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
        (Q8_0, true) => vnni::q8_0,
        (Q4_0, true) => vnni::q4_0,
        (IQ4_NL, true) => vnni::iq4_nl,
        (MXFP4, true) => vnni::mxfp4,
        (Q8_0, false) => bw::q8_0,
        (Q4_0, false) => bw::q4_0,
        (IQ4_NL, false) => bw::iq4_nl,
        (MXFP4, false) => bw::mxfp4,
        (Q6_K, true) => kvnni::q6_k,
        (Q6_K, false) => kbw::q6_k,
        _ => return None,
    })
}

/// `sum u * x` of 64 unsigned and signed bytes, four at a time into 16 i32: one `dpbusd`.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,avx512vnni")]
fn dp_vnni(u: __m512i, x: __m512i) -> __m512i {
    _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, x)
}

/// As [`dp_vnni`] with `maddubs` + `madd` (`u` at most 128, so a pair never saturates).
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
fn dp_bw(u: __m512i, x: __m512i) -> __m512i {
    _mm512_madd_epi16(_mm512_maddubs_epi16(u, x), _mm512_set1_epi16(1))
}

/// Two 32-byte halves as one vector, `lo` in the low half.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
fn pair(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// 64 activation quants at `p[off..off + 64]` (bounds checked).
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
fn load64_i8(p: &[i8], off: usize) -> __m512i {
    let s = &p[off..off + 64];
    // SAFETY: `s` is 64 readable bytes; the load is unaligned.
    unsafe { _mm512_loadu_si512(s.as_ptr() as *const _) }
}

/// `|w|` and `x` negated where `w < 0`: the same products, the weight made unsigned.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
fn sign_trick(w: __m512i, x: __m512i) -> (__m512i, __m512i) {
    let neg = _mm512_movepi8_mask(w);
    let xs = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
    (_mm512_abs_epi8(w), xs)
}

/// The totals of four 32-element runs from two vectors of eight i32 partial sums a run
/// (run 0 in the low half of `v01`, run 1 in its high half, runs 2 and 3 in `v23`).
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
fn reduce4(v01: __m512i, v23: __m512i) -> [i32; 4] {
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

// The 32 signed weight values of one block (or IQ4_XS group), as 32 bytes.

#[inline]
#[target_feature(enable = "avx2")]
fn wq_q8_0(b: &[u8]) -> __m256i {
    load32(b, 2)
}

#[inline]
#[target_feature(enable = "avx2")]
fn wq_q4_0(b: &[u8]) -> __m256i {
    _mm256_sub_epi8(nibbles(b, 2), _mm256_set1_epi8(8))
}

#[inline]
#[target_feature(enable = "avx2")]
fn wq_iq4_nl(b: &[u8]) -> __m256i {
    _mm256_shuffle_epi8(table16(&IQ4NL_KVALUES), nibbles(b, 2))
}

#[inline]
#[target_feature(enable = "avx2")]
fn wq_mxfp4(b: &[u8]) -> __m256i {
    _mm256_shuffle_epi8(table16(&MXFP4_KVALUES), nibbles(b, 1))
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

/// The f16 scale at byte 0 of four blocks, widened as `f16_at` does (the conversion is
/// exact) but four at once: `half`'s one-at-a-time conversion is most of a block's time.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
fn f16x4(b: [&[u8]; 4]) -> [f32; 4] {
    let h = |k: usize| u16_at(b[k], 0) as u64;
    let packed = h(0) | h(1) << 16 | h(2) << 32 | h(3) << 48;
    let v = _mm512_cvtph_ps(_mm256_set_epi64x(0, 0, 0, packed as i64));
    let mut out = [0f32; 4];
    // SAFETY: `out` is 4 writable f32; the store is unaligned.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), _mm512_castps512_ps128(v)) };
    out
}

/// MXFP4's e8m0 scales of four blocks (`f16x4`'s counterpart).
#[inline(always)]
fn e8m0x4(b: [&[u8]; 4]) -> [f32; 4] {
    [
        e8m0_half(b[0][0]),
        e8m0_half(b[1][0]),
        e8m0_half(b[2][0]),
        e8m0_half(b[3][0]),
    ]
}

/// The f16 scale of one block.
#[inline]
fn f16x1(b: &[u8]) -> f32 {
    f16_at(b, 0)
}

/// MXFP4's e8m0 scale of one block.
#[inline]
fn e8m0x1(b: &[u8]) -> f32 {
    e8m0_half(b[0])
}

/// Defines a 32-element type's kernel `$imp` for one set: blocks of `$bytes` decoded by
/// `$wq`, their scales read by `$s4` (four) or `$s1` (one), four blocks a step (the rest one
/// at a time with AVX2); each block's integer sum `$si` and weight scale `$dw` turned into
/// the term `$term` the reference adds, in block order.
macro_rules! block32 {
    ($feat:tt, $dp:ident, $imp:ident, $bytes:expr, $wq:ident, $s4:ident, $s1:ident,
     |$a:ident, $ib:ident, $dw:ident, $si:ident| $term:expr) => {
        #[target_feature(enable = $feat)]
        unsafe fn $imp(w: &[u8], $a: &Q8Row) -> f32 {
            let nb = w.len() / $bytes;
            let blk = |k: usize| &w[k * $bytes..(k + 1) * $bytes];
            let mut sum = 0.0f32;
            let mut ib = 0;
            while ib + 4 <= nb {
                let bs = [blk(ib), blk(ib + 1), blk(ib + 2), blk(ib + 3)];
                let w01 = pair($wq(bs[0]), $wq(bs[1]));
                let w23 = pair($wq(bs[2]), $wq(bs[3]));
                let (u01, x01) = sign_trick(w01, load64_i8($a.qs, ib * 32));
                let (u23, x23) = sign_trick(w23, load64_i8($a.qs, ib * 32 + 64));
                let s = reduce4($dp(u01, x01), $dp(u23, x23));
                let d4 = $s4(bs);
                for k in 0..4 {
                    let ($ib, $dw, $si) = (ib + k, d4[k], s[k]);
                    sum += $term;
                }
                ib += 4;
            }
            while ib < nb {
                let b = blk(ib);
                let ($ib, $dw) = (ib, $s1(b));
                let $si = hsum(dot_i8($wq(b), load32_i8($a.qs, ib * 32)));
                sum += $term;
                ib += 1;
            }
            sum
        }
    };
}

/// Defines one set's kernels (module `$m`, compiled for `$feat`, multiply-adds by `$dp`).
macro_rules! block_set {
    ($m:ident, $feat:tt, $dp:ident) => {
        mod $m {
            use super::*;

            entry!(pub(super) q8_0, q8_0_k);
            entry!(pub(super) q4_0, q4_0_k);
            entry!(pub(super) iq4_nl, iq4_nl_k);
            entry!(pub(super) mxfp4, mxfp4_k);

            block32!($feat, $dp, q8_0_k, 34, wq_q8_0, f16x4, f16x1, |a, ib, dw, si| si
                as f32
                * (dw * a.d[ib]));
            block32!($feat, $dp, q4_0_k, 18, wq_q4_0, f16x4, f16x1, |a, ib, dw, si| si
                as f32
                * dw
                * a.d[ib]);
            block32!($feat, $dp, iq4_nl_k, 18, wq_iq4_nl, f16x4, f16x1, |a, ib, dw, si| (a
                .d[ib]
                * dw)
                * si as f32);
            block32!($feat, $dp, mxfp4_k, 17, wq_mxfp4, e8m0x4, e8m0x1, |a, ib, dw, si| (a
                .d[ib]
                * dw)
                * si as f32);
        }
    };
}

block_set!(vnni, "avx2,avx512f,avx512bw,avx512vl,avx512vnni", dp_vnni);
block_set!(bw, "avx2,avx512f,avx512bw,avx512vl", dp_bw);

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
