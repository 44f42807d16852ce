//! AVX2 dot products of GGUF's 32-element block types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4,
//! IQ4_NL), laid out as the reference (`dot_q0.rs`) defines the float part: a block's
//! `maddubs` + `madd` leaves eight i32 lanes, eight blocks' lanes are reduced together to one
//! vector of the eight blocks' exact sums (`isum8`), which is scaled and added into one
//! 256-bit float accumulator whose lane `k` is the reference's set `k`, and only the row's
//! end reduces it. The result equals the reference's bit for bit (tested in `tests_simd.rs`).
//!
//! Scales are read eight blocks at a time: eight f16 weight scales widened by one F16C
//! `cvtph`, multiplied by the eight activation scales, and each block's taken out with a
//! lane permute. Activation quants are in [-127, 127] (`act.rs`), so `maddubs`'s pair sums
//! never saturate: at most 2 x 128 x 127 for a signed weight handled by the sign trick.

use std::arch::x86_64::*;

use super::dot::{f16_at, u32_at};
use super::dot_q0::{e8m0_half, tree8, SETS};
use super::x86::{dot_i8, dot_u8, hsum, load32, load32_i8, nibbles, table16};
use super::{DotFn, DotTileFn, Q8Row};
use crate::gguf::grids::{IQ4NL_KVALUES, MXFP4_KVALUES};
use crate::gguf::GgmlType;

/// The AVX2 kernel of `ty` among the 32-element types, where this CPU has AVX2 and F16C.
pub(super) fn dot(ty: GgmlType) -> Option<DotFn> {
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")) {
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

/// The AVX2 1-row x 4-position tile of `ty` among the 32-element types, where this CPU has
/// AVX2 and F16C.
pub(super) fn tile(ty: GgmlType) -> Option<DotTileFn> {
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")) {
        return None;
    }
    use GgmlType::*;
    Some(match ty {
        Q8_0 => q8_0_tile,
        Q4_0 => q4_0_tile,
        Q4_1 => q4_1_tile,
        Q5_0 => q5_0_tile,
        Q5_1 => q5_1_tile,
        IQ4_NL => iq4_nl_tile,
        MXFP4 => mxfp4_tile,
        _ => return None,
    })
}

/// The 32-element tile of `ty` for the x86 kernel set named `set`: the AVX-512 sets' own
/// where they have one (each gives that set's dot bits, as every kernel gives the
/// reference's), else the AVX2 one.
pub(super) fn set_tile(set: &str, ty: GgmlType) -> Option<DotTileFn> {
    let wide = match set {
        "avx512vnni" => super::avx512_q0::tile(ty, true),
        "avx512bw" => super::avx512_q0::tile(ty, false),
        _ => None,
    };
    wide.or_else(|| tile(ty))
}

/// Defines the safe entries of an AVX2 kernel: the row dot product (`N = 1`) and the
/// 4-position tile (`N = 4`).
macro_rules! entry {
    ($name:ident, $tile:ident, $imp:ident) => {
        fn $name(w: &[u8], a: &Q8Row) -> f32 {
            // SAFETY: `dot` hands this function out only after detecting AVX2 and F16C, the
            // features `$imp` is compiled for; every load goes through a bounds-checked slice.
            unsafe { $imp::<1>(w, &[*a])[0] }
        }

        fn $tile(w: &[u8], a: &[Q8Row; 4]) -> [f32; 4] {
            // SAFETY: as the row entry (`tile` checks the same features).
            unsafe { $imp::<4>(w, a) }
        }
    };
}

entry!(q8_0, q8_0_tile, q8_0_avx2);
entry!(q4_0, q4_0_tile, q4_0_avx2);
entry!(q4_1, q4_1_tile, q4_1_avx2);
entry!(q5_0, q5_0_tile, q5_0_avx2);
entry!(q5_1, q5_1_tile, q5_1_avx2);
entry!(iq4_nl, iq4_nl_tile, iq4_nl_avx2);
entry!(mxfp4, mxfp4_tile, mxfp4_avx2);

/// Eight f32 at `p[off..off + 8]` (bounds checked).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn load8_ps(p: &[f32], off: usize) -> __m256 {
    let s = &p[off..off + 8];
    // SAFETY: `s` is 8 readable f32; the load is unaligned.
    unsafe { _mm256_loadu_ps(s.as_ptr()) }
}

/// The f16 at byte `OFF` of each of the eight blocks of `BYTES` that `c` starts with,
/// widened (exactly, as `f16_at`): one bounds check, sixteen byte loads, one `cvtph`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn f16x8<const BYTES: usize, const OFF: usize>(c: &[u8]) -> __m256 {
    let c = &c[..7 * BYTES + OFF + 2];
    let h = |k: usize| u16::from_le_bytes([c[k * BYTES + OFF], c[k * BYTES + OFF + 1]]) as u64;
    let lo = h(0) | h(1) << 16 | h(2) << 32 | h(3) << 48;
    let hi = h(4) | h(5) << 16 | h(6) << 32 | h(7) << 48;
    _mm256_cvtph_ps(_mm_set_epi64x(hi as i64, lo as i64))
}

/// MXFP4's e8m0 scales (byte 0) of the eight blocks `c` starts with.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn e8m0x8(c: &[u8]) -> __m256 {
    let c = &c[..7 * 17 + 1];
    let e = |k: usize| e8m0_half(c[k * 17]);
    _mm256_set_ps(e(7), e(6), e(5), e(4), e(3), e(2), e(1), e(0))
}

/// Eight lanes reduced as `dot_q0::tree8` does.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn tree8_ps(t: __m256) -> f32 {
    let u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps::<1>(t));
    let v = _mm_add_ps(u, _mm_movehl_ps(u, u));
    _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)))
}

/// Q4_1/Q5_1's minimum terms: `m * s` of block `ib` into lane `ib % 8` (eight blocks a
/// step), reduced as the reference.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn mins(w: &[u8], a: &Q8Row, bytes: usize, min8: impl Fn(&[u8]) -> __m256) -> f32 {
    let nb = w.len() / bytes;
    let mut acc = _mm256_setzero_ps();
    let mut ib = 0;
    while ib + 8 <= nb {
        acc = _mm256_add_ps(
            acc,
            _mm256_mul_ps(min8(&w[ib * bytes..]), load8_ps(a.s, ib)),
        );
        ib += 8;
    }
    let mut l = [0f32; 8];
    // SAFETY: `l` is 8 writable f32; the store is unaligned.
    unsafe { _mm256_storeu_ps(l.as_mut_ptr(), acc) };
    while ib < nb {
        l[ib % 8] += f16_at(&w[ib * bytes..], 2) * a.s[ib];
        ib += 1;
    }
    // SAFETY: `l` is 8 readable f32.
    tree8_ps(unsafe { _mm256_loadu_ps(l.as_ptr()) })
}

/// The exact sums of eight blocks, `h` holding their integer lanes as pairs `hadd(v[2j],
/// v[2j + 1])` (`v[k]`: block `k`'s eight i32 lanes): lane `k` of the result is block `k`'s
/// sum. Integer sums are exact in any order, so this is the reference's `isum` of each block.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn isum8(h: &[__m256i; 4]) -> __m256i {
    // [b0 b1 b2 b3 (lanes 0..4) | b0 b1 b2 b3 (lanes 4..8)], and the same for b4..b8.
    let g0 = _mm256_hadd_epi32(h[0], h[1]);
    let g1 = _mm256_hadd_epi32(h[2], h[3]);
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(g0, g1),
        _mm256_permute2x128_si256::<0x31>(g0, g1),
    )
}

/// The eight float lanes of `v`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn lanes8(v: __m256) -> [f32; 8] {
    let mut l = [0f32; 8];
    // SAFETY: `l` is 8 writable f32; the store is unaligned.
    unsafe { _mm256_storeu_ps(l.as_mut_ptr(), v) };
    l
}

/// Defines kernel `$imp`, one weight row against `N` positions: blocks of `$bytes`, each
/// block's 32 weights decoded once by `$wq` and multiplied into eight integer lanes by `$dp`
/// for every position, weight scales eight at a time from `$dw8` and one at a time from
/// `$dw1`. Eight blocks a step: their lanes reduced to the eight blocks' exact sums (lane `k`
/// is set `k`), scaled and added into one float vector holding the eight sets; the last
/// blocks one at a time into their set. Each position's float steps are the single dot's,
/// so `N = 4` (the tile) gives `N = 1`'s (the dot's) bits.
macro_rules! kernel {
    ($imp:ident, $bytes:expr, $wq:ident, $dp:ident, $dw8:expr, $dw1:expr) => {
        #[inline]
        #[target_feature(enable = "avx2,f16c")]
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
                let dw = $dw8(c);
                for p in 0..N {
                    xs[p] = &a[p].qs[ib * 32..ib * 32 + 256];
                    d8[p] = _mm256_mul_ps(dw, load8_ps(a[p].d, ib));
                }
                let mut h = [[_mm256_setzero_si256(); 4]; N];
                for j in 0..4 {
                    let q0 = $wq(&c[2 * j * $bytes..(2 * j + 1) * $bytes]);
                    let q1 = $wq(&c[(2 * j + 1) * $bytes..(2 * j + 2) * $bytes]);
                    for p in 0..N {
                        let s0 = $dp(q0, load32_i8(xs[p], 64 * j));
                        let s1 = $dp(q1, load32_i8(xs[p], 64 * j + 32));
                        h[p][j] = _mm256_hadd_epi32(s0, s1);
                    }
                }
                for p in 0..N {
                    let v = _mm256_mul_ps(d8[p], _mm256_cvtepi32_ps(isum8(&h[p])));
                    acc[p] = _mm256_add_ps(acc[p], v);
                }
                ib += 8;
            }
            let mut out = [0f32; N];
            for p in 0..N {
                let mut l = lanes8(acc[p]);
                for jb in ib..nb {
                    let si = hsum($dp($wq(blk(jb)), load32_i8(a[p].qs, jb * 32)));
                    l[jb % SETS] += ($dw1(blk(jb)) * a[p].d[jb]) * si as f32;
                }
                out[p] = tree8(&l);
            }
            out
        }
    };
}

// Each type's 32 weights of one block as bytes: signed ones (multiplied by `dot_i8`) or,
// for Q4_1 and Q5_1, unsigned ones below 32 (by `dot_u8`). The signed ones serve avx512_q0.rs's
// kernels too.

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn wq_q8_0(b: &[u8]) -> __m256i {
    load32(b, 2)
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn wq_q4_0(b: &[u8]) -> __m256i {
    _mm256_sub_epi8(nibbles(b, 2), _mm256_set1_epi8(8))
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn wq_q4_1(b: &[u8]) -> __m256i {
    nibbles(b, 4)
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn wq_q5_0(b: &[u8]) -> __m256i {
    _mm256_sub_epi8(five(b, u32_at(b, 2), 6), _mm256_set1_epi8(16))
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn wq_q5_1(b: &[u8]) -> __m256i {
    five(b, u32_at(b, 4), 8)
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn wq_iq4_nl(b: &[u8]) -> __m256i {
    _mm256_shuffle_epi8(table16(&IQ4NL_KVALUES), nibbles(b, 2))
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn wq_mxfp4(b: &[u8]) -> __m256i {
    _mm256_shuffle_epi8(table16(&MXFP4_KVALUES), nibbles(b, 1))
}

/// Byte j of the result: 0xFF where bit j of `x` is set, else 0.
#[inline]
#[target_feature(enable = "avx2")]
fn bits32(x: u32) -> __m256i {
    // Byte j takes byte j / 8 of `x`; or-ing every bit but j % 8 leaves all ones exactly
    // where bit j % 8 is set.
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

/// A Q5 block's 32 five-bit quants: the nibbles at `qs_off` with bit j of `qh` as bit 4.
#[inline]
#[target_feature(enable = "avx2")]
fn five(b: &[u8], qh: u32, qs_off: usize) -> __m256i {
    let hi = _mm256_and_si256(bits32(qh), _mm256_set1_epi8(16));
    _mm256_or_si256(nibbles(b, qs_off), hi)
}

/// Eight f16 weight scales at byte 0 of blocks of `bytes`.
macro_rules! f16_at0 {
    ($bytes:expr) => {
        |c: &[u8]| f16x8::<$bytes, 0>(c)
    };
}

kernel!(
    q8_0_avx2,
    34,
    wq_q8_0,
    dot_i8,
    f16_at0!(34),
    |b: &[u8]| f16_at(b, 0)
);
kernel!(
    q4_0_avx2,
    18,
    wq_q4_0,
    dot_i8,
    f16_at0!(18),
    |b: &[u8]| f16_at(b, 0)
);
kernel!(
    q5_0_avx2,
    22,
    wq_q5_0,
    dot_i8,
    f16_at0!(22),
    |b: &[u8]| f16_at(b, 0)
);
kernel!(
    iq4_nl_avx2,
    18,
    wq_iq4_nl,
    dot_i8,
    f16_at0!(18),
    |b: &[u8]| f16_at(b, 0)
);
kernel!(mxfp4_avx2, 17, wq_mxfp4, dot_i8, e8m0x8, |b: &[u8]| {
    e8m0_half(b[0])
});
kernel!(
    q4_1_lanes,
    20,
    wq_q4_1,
    dot_u8,
    f16_at0!(20),
    |b: &[u8]| f16_at(b, 0)
);
kernel!(
    q5_1_lanes,
    24,
    wq_q5_1,
    dot_u8,
    f16_at0!(24),
    |b: &[u8]| f16_at(b, 0)
);

/// Q4_1/Q5_1: the integer lanes' sum plus the minimum terms, for each position.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn with_mins<const N: usize, const BYTES: usize>(
    w: &[u8],
    a: &[Q8Row; N],
    lanes: [f32; N],
) -> [f32; N] {
    let mut out = lanes;
    for p in 0..N {
        out[p] += mins(w, &a[p], BYTES, |c| f16x8::<BYTES, 2>(c));
    }
    out
}

#[inline]
#[target_feature(enable = "avx2,f16c")]
fn q4_1_avx2<const N: usize>(w: &[u8], a: &[Q8Row; N]) -> [f32; N] {
    with_mins::<N, 20>(w, a, q4_1_lanes(w, a))
}

#[inline]
#[target_feature(enable = "avx2,f16c")]
fn q5_1_avx2<const N: usize>(w: &[u8], a: &[Q8Row; N]) -> [f32; N] {
    with_mins::<N, 24>(w, a, q5_1_lanes(w, a))
}

/// One 32-block of Q8_0 activation quantization, the vector twin of `act::q8_0_block`: the
/// quants into `q`, and the unrounded scale and the quant sum. `None` (nothing written)
/// where this CPU lacks AVX2, the block holds a NaN (whose place in the scalar maximum
/// depends on the order) or the scale's inverse overflows (infinite products): the scalar
/// steps handle those.
pub(super) fn q8_0_block(x: &[f32], q: &mut [i8]) -> Option<(f32, i32)> {
    if !is_x86_feature_detected!("avx2") {
        return None;
    }
    // SAFETY: AVX2 was detected above; loads and stores go through bounds-checked slices.
    unsafe { q8_0_block_avx2(x, q) }
}

#[target_feature(enable = "avx2")]
fn q8_0_block_avx2(x: &[f32], q: &mut [i8]) -> Option<(f32, i32)> {
    let x = &x[..32];
    let v = [
        load8_ps(x, 0),
        load8_ps(x, 8),
        load8_ps(x, 16),
        load8_ps(x, 24),
    ];
    let sign = _mm256_set1_ps(-0.0);
    // Loops, not `array::map`: its closure would be a call (compiled without AVX2).
    let mut abs = v;
    for a in &mut abs {
        *a = _mm256_andnot_ps(sign, *a);
    }
    let nan = _mm256_or_ps(
        _mm256_or_ps(
            _mm256_cmp_ps::<_CMP_UNORD_Q>(v[0], v[0]),
            _mm256_cmp_ps::<_CMP_UNORD_Q>(v[1], v[1]),
        ),
        _mm256_or_ps(
            _mm256_cmp_ps::<_CMP_UNORD_Q>(v[2], v[2]),
            _mm256_cmp_ps::<_CMP_UNORD_Q>(v[3], v[3]),
        ),
    );
    if _mm256_movemask_ps(nan) != 0 {
        return None;
    }
    // Without NaNs the maximum is the same whatever the order.
    let m = _mm256_max_ps(_mm256_max_ps(abs[0], abs[1]), _mm256_max_ps(abs[2], abs[3]));
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
    let scale = amax / 127.0;
    let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
    if !inv.is_finite() {
        return None;
    }
    let inv8 = _mm256_set1_ps(inv);
    let half = _mm256_set1_ps(0.5);
    let one = _mm256_set1_ps(1.0);
    // Half away from zero, exactly: floor(|t|), plus one where the fraction (exact, since
    // |t| <= 127) is at least a half, with t's sign.
    let mut qi = [_mm256_setzero_si256(); 4];
    for (q, &v) in qi.iter_mut().zip(&v) {
        let t = _mm256_mul_ps(v, inv8);
        let a = _mm256_andnot_ps(sign, t);
        let f = _mm256_round_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(a);
        let up = _mm256_and_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(_mm256_sub_ps(a, f), half), one);
        let r = _mm256_or_ps(_mm256_add_ps(f, up), _mm256_and_ps(sign, t));
        *q = _mm256_cvtps_epi32(r);
    }
    let sum = _mm256_add_epi32(
        _mm256_add_epi32(qi[0], qi[1]),
        _mm256_add_epi32(qi[2], qi[3]),
    );
    // packs interleave 128-bit halves; the permute puts the 32 quants back in order.
    let p = _mm256_packs_epi16(
        _mm256_packs_epi32(qi[0], qi[1]),
        _mm256_packs_epi32(qi[2], qi[3]),
    );
    let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    let q = &mut q[..32];
    // SAFETY: `q` is 32 writable bytes; the store is unaligned.
    unsafe { _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, p) };
    Some((scale, super::x86::hsum(sum)))
}
