//! AVX-512 dot products of GGUF's 32-element block types (Q8_0, Q4_0, IQ4_NL, MXFP4) for the
//! `avx512bw` and `avx512vnni` kernel sets. As the AVX2 kernels (`x86_q0.rs`) they compute the
//! reference's exact integer sum per block in any order and then its float operations in its
//! order, so each equals the portable reference (`dot_q0.rs`) bit for bit: four blocks are
//! summed in two 512-bit products, then the four sums reduced together; VNNI's `dpbusd` does
//! the multiply-adds in one instruction where the BW set uses `maddubs` + `madd` (pairs at
//! most 2 x 128 x 127, never saturated). Signed weights use the sign trick: `|w|` times `x`
//! negated where `w < 0`.

use std::arch::x86_64::*;

use super::avx512::{dp_bw, dp_vnni, load64_i8, pair, reduce4, sign_trick};
use super::dot::{f16_at, u16_at};
use super::dot_q0::e8m0_half;
use super::x86::{dot_i8, hsum, load32, load32_i8, nibbles, table16};
use super::{DotFn, Q8Row};
use crate::gguf::grids::{IQ4NL_KVALUES, MXFP4_KVALUES};
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
        (Q8_0, true) => vnni::q8_0,
        (Q4_0, true) => vnni::q4_0,
        (IQ4_NL, true) => vnni::iq4_nl,
        (MXFP4, true) => vnni::mxfp4,
        (Q8_0, false) => bw::q8_0,
        (Q4_0, false) => bw::q4_0,
        (IQ4_NL, false) => bw::iq4_nl,
        (MXFP4, false) => bw::mxfp4,
        _ => return None,
    })
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
            // `$imp` is compiled for (AVX2, AVX-512F, BW, VL, and VNNI for the VNNI set);
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
