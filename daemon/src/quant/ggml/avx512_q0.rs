//! AVX-512 dot products of GGUF's 32-element block types (Q8_0, Q4_0, IQ4_NL, MXFP4) for the
//! `avx512bw` and `avx512vnni` kernel sets, laid out as the reference (`dot_q0.rs`) defines
//! the float part: two blocks a 512-bit product (the even block's eight i32 lanes in the low
//! half, the odd one's in the high half), eight blocks' lanes reduced to their exact sums,
//! scaled and added into one float vector holding the reference's eight sets. Only the row's
//! end reduces it, so each kernel equals the reference bit for bit.
//!
//! VNNI's `dpbusd` does the multiply-adds in one instruction where the BW set uses `maddubs`
//! + `madd` (pairs at most 2 x 128 x 127, never saturated). Signed weights use the sign
//! trick: `|w|` times `x` negated where `w < 0`. Q4_1, Q5_0 and Q5_1 take the AVX2 kernels.

use std::arch::x86_64::*;

use super::avx512::{dp_bw, dp_vnni, load64_i8, pair, sign_trick};
use super::dot::f16_at;
use super::dot_q0::{e8m0_half, tree8, SETS};
use super::x86::{dot_i8, hsum, load32_i8};
use super::x86_q0::{e8m0x8, f16x8, lanes8, load8_ps, wq_iq4_nl, wq_mxfp4, wq_q4_0, wq_q8_0};
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

/// The AVX-512 1-row x 4-position tile of `ty` for the VNNI set (`vnni`) or the BW set,
/// where there is one and this CPU has the set's features.
pub(super) fn tile(ty: GgmlType, vnni: bool) -> Option<DotTileFn> {
    dot(ty, vnni)?;
    use GgmlType::*;
    Some(match (ty, vnni) {
        (Q8_0, true) => vnni::q8_0_tile,
        (Q4_0, true) => vnni::q4_0_tile,
        (IQ4_NL, true) => vnni::iq4_nl_tile,
        (MXFP4, true) => vnni::mxfp4_tile,
        (Q8_0, false) => bw::q8_0_tile,
        (Q4_0, false) => bw::q4_0_tile,
        (IQ4_NL, false) => bw::iq4_nl_tile,
        (MXFP4, false) => bw::mxfp4_tile,
        _ => return None,
    })
}

/// Defines the safe entries of a kernel: the row dot product (`N = 1`) and the 4-position
/// tile (`N = 4`).
macro_rules! entry {
    ($vis:vis $name:ident, $tile:ident, $imp:ident) => {
        $vis fn $name(w: &[u8], a: &Q8Row) -> f32 {
            // SAFETY: `dot` hands this function out only after detecting every feature
            // `$imp` is compiled for (AVX2, F16C, AVX-512F, BW, VL, and VNNI for the VNNI
            // set); loads go through bounds-checked slices.
            unsafe { $imp::<1>(w, &[*a])[0] }
        }

        $vis fn $tile(w: &[u8], a: &[Q8Row; 4]) -> [f32; 4] {
            // SAFETY: as the row entry (`tile` checks the same features through `dot`).
            unsafe { $imp::<4>(w, a) }
        }
    };
}

/// Per 128-bit lane `[a0 + a2, a1 + a3, b0 + b2, b1 + b3]`.
#[inline]
#[target_feature(enable = "avx512f")]
fn pairs(a: __m512i, b: __m512i) -> __m512i {
    _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b))
}

/// The exact sums of eight blocks from four 512-bit products (`z[k]`: block `2k`'s eight i32
/// lanes in the low half, block `2k + 1`'s in the high half): lane `k` of the result is block
/// `k`'s sum (integers, exact in any order), so it is the reference's `isum` of each block.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
fn isum8_zmm(z: &[__m512i; 4]) -> __m256i {
    // Per 128-bit lane: [a, a, b, b] partial sums of that lane's quarter of each block.
    let (s01, s23) = (
        _mm512_castsi512_ps(pairs(z[0], z[1])),
        _mm512_castsi512_ps(pairs(z[2], z[3])),
    );
    // Per 128-bit lane: [z0, z1, z2, z3] quarter sums: lanes 0 and 1 hold blocks 0, 2, 4, 6,
    // lanes 2 and 3 blocks 1, 3, 5, 7.
    let t = _mm512_add_epi32(
        _mm512_castps_si512(_mm512_shuffle_ps::<0b10_00_10_00>(s01, s23)),
        _mm512_castps_si512(_mm512_shuffle_ps::<0b11_01_11_01>(s01, s23)),
    );
    let v = _mm512_add_epi32(t, _mm512_shuffle_i32x4::<0b10_11_00_01>(t, t));
    let order = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 11, 3, 10, 2, 9, 1, 8, 0);
    _mm512_castsi512_si256(_mm512_permutexvar_epi32(order, v))
}

/// Defines a 32-element type's kernel `$imp` for one set, one weight row against `N`
/// positions: blocks of `$bytes` decoded once by `$wq` for every position, weight scales
/// read eight at a time by `$dw8` and one at a time by `$dw1`. Eight blocks a step, two a
/// 512-bit product (the even block's eight i32 lanes in the low half, the odd one's in the
/// high half), reduced to the eight blocks' exact sums (`isum8`) and scaled into one float
/// vector whose lane `k` is the reference's set `k`; the last blocks one at a time. Each
/// position's float steps are the single dot's, so `N = 4` (the tile) gives `N = 1`'s bits.
macro_rules! block32 {
    ($feat:tt, $dp:ident, $imp:ident, $bytes:expr, $wq:ident, $dw8:expr, $dw1:expr) => {
        #[inline]
        #[target_feature(enable = $feat)]
        fn $imp<const N: usize>(w: &[u8], a: &[Q8Row; N]) -> [f32; N] {
            let nb = w.len() / $bytes;
            let blk = |k: usize| &w[k * $bytes..(k + 1) * $bytes];
            let mut acc = [_mm256_setzero_ps(); N];
            let mut ib = 0;
            while ib + 8 <= nb {
                // One bounds check for eight blocks and each position's activations.
                let c = &w[ib * $bytes..(ib + 8) * $bytes];
                // Plain loops, not `array::from_fn`: its closure, compiled without this
                // function's target features, is a call per step (15% of a prefill).
                let mut xs: [&[i8]; N] = [&[]; N];
                let mut d8 = [_mm256_setzero_ps(); N];
                let cb = |k: usize| &c[k * $bytes..(k + 1) * $bytes];
                let dw = $dw8(c);
                for p in 0..N {
                    xs[p] = &a[p].qs[ib * 32..ib * 32 + 256];
                    d8[p] = _mm256_mul_ps(dw, load8_ps(a[p].d, ib));
                }
                let mut z = [[_mm512_setzero_si512(); 4]; N];
                for k in 0..4 {
                    let wv = pair($wq(cb(2 * k)), $wq(cb(2 * k + 1)));
                    for p in 0..N {
                        let (u, x) = sign_trick(wv, load64_i8(xs[p], 64 * k));
                        z[p][k] = $dp(u, x);
                    }
                }
                for p in 0..N {
                    let v = _mm256_mul_ps(d8[p], _mm256_cvtepi32_ps(isum8_zmm(&z[p])));
                    acc[p] = _mm256_add_ps(acc[p], v);
                }
                ib += 8;
            }
            let mut out = [0f32; N];
            for p in 0..N {
                let mut l = lanes8(acc[p]);
                for jb in ib..nb {
                    let si = hsum(dot_i8($wq(blk(jb)), load32_i8(a[p].qs, jb * 32)));
                    l[jb % SETS] += ($dw1(blk(jb)) * a[p].d[jb]) * si as f32;
                }
                out[p] = tree8(&l);
            }
            out
        }
    };
}

/// Defines one set's kernels (module `$m`, compiled for `$feat`, multiply-adds by `$dp`).
macro_rules! block_set {
    ($m:ident, $feat:tt, $dp:ident) => {
        mod $m {
            use super::*;

            entry!(pub(super) q8_0, q8_0_tile, q8_0_k);
            entry!(pub(super) q4_0, q4_0_tile, q4_0_k);
            entry!(pub(super) iq4_nl, iq4_nl_tile, iq4_nl_k);
            entry!(pub(super) mxfp4, mxfp4_tile, mxfp4_k);

            block32!($feat, $dp, q8_0_k, 34, wq_q8_0, |c: &[u8]| f16x8::<34, 0>(c), |b: &[u8]| f16_at(b, 0));
            block32!($feat, $dp, q4_0_k, 18, wq_q4_0, |c: &[u8]| f16x8::<18, 0>(c), |b: &[u8]| f16_at(b, 0));
            block32!($feat, $dp, iq4_nl_k, 18, wq_iq4_nl, |c: &[u8]| f16x8::<18, 0>(c), |b: &[u8]| f16_at(b, 0));
            block32!($feat, $dp, mxfp4_k, 17, wq_mxfp4, e8m0x8, |b: &[u8]| e8m0_half(b[0]));
        }
    };
}

block_set!(
    vnni,
    "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    dp_vnni
);
block_set!(bw, "avx2,f16c,avx512f,avx512bw,avx512vl", dp_bw);
