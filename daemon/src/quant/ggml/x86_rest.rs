//! AVX2 dot products of the lattice types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S,
//! IQ1_M). Each reference product (`dot_iq.rs`) sums exact integers per block and only then
//! does floats, so these kernels compute the same integers in any order (vector lanes,
//! `maddubs` pairs) and then the reference's float operations in its order: the result is
//! the reference's bit for bit.
//!
//! The lattice types look up 8 (or 2 x 4) grid values per index: the grids are kept here as
//! little-endian u64 (u32) rows so four lookups make one 32-byte vector, and sign bytes become
//! u64 masks of +1/-1 bytes for `sign_epi8`. Bounds that keep the 16-bit steps exact: grid
//! values are at most 62 (IQ3_XXS), activations at most 127 in magnitude, so a `maddubs` pair
//! is at most 2 x 62 x 127 = 15748, and times an odd scale of at most 31 in `madd` stays
//! far inside i32.

use std::arch::x86_64::*;

use super::dot::{f16_at, u16_at, u32_at};
use super::x86::{hsum, load32_i8};
use super::{DotFn, Q8Row};
use crate::gguf::grids::*;
use crate::gguf::iq::decode_grid;
use crate::gguf::GgmlType;

/// The AVX2 kernel of `ty` among the types this file covers, where this CPU has AVX2.
pub(super) fn dot(ty: GgmlType) -> Option<DotFn> {
    if !is_x86_feature_detected!("avx2") {
        return None;
    }
    use GgmlType::*;
    Some(match ty {
        IQ2_XXS => iq2_xxs,
        IQ2_XS => iq2_xs,
        IQ2_S => iq2_s,
        IQ3_XXS => iq3_xxs,
        IQ3_S => iq3_s,
        IQ1_S => iq1_s,
        IQ1_M => iq1_m,
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

entry!(iq2_xxs, iq2_xxs_avx2);
entry!(iq2_xs, iq2_xs_avx2);
entry!(iq2_s, iq2_s_avx2);
entry!(iq3_xxs, iq3_xxs_avx2);
entry!(iq3_s, iq3_s_avx2);
entry!(iq1_s, iq1_s_avx2);
entry!(iq1_m, iq1_m_avx2);

/// A decoded grid (indices into `map`) as little-endian rows of its integer values: u64 for
/// 8-wide grids, u32 (in a u64) for 4-wide ones.
const fn grid_rows<const N: usize, const W: usize, const M: usize>(
    g: [[u8; W]; N],
    map: [f32; M],
) -> [u64; N] {
    let mut out = [0u64; N];
    let mut r = 0;
    while r < N {
        let mut c = 0;
        while c < W {
            let v = map[g[r][c] as usize] as i8 as u8;
            out[r] |= (v as u64) << (8 * c);
            c += 1;
        }
        r += 1;
    }
    out
}

static IQ2XXS: [u64; IQ2XXS_ROWS] = grid_rows(
    decode_grid::<IQ2XXS_ROWS, IQ2XXS_WIDTH>(IQ2XXS_HEX, 2),
    IQ2XXS_MAP,
);
static IQ2XS: [u64; IQ2XS_ROWS] = grid_rows(
    decode_grid::<IQ2XS_ROWS, IQ2XS_WIDTH>(IQ2XS_HEX, 2),
    IQ2XS_MAP,
);
static IQ2S: [u64; IQ2S_ROWS] =
    grid_rows(decode_grid::<IQ2S_ROWS, IQ2S_WIDTH>(IQ2S_HEX, 2), IQ2S_MAP);
static IQ3XXS: [u64; IQ3XXS_ROWS] = grid_rows(
    decode_grid::<IQ3XXS_ROWS, IQ3XXS_WIDTH>(IQ3XXS_HEX, 3),
    IQ3XXS_MAP,
);
static IQ3S: [u64; IQ3S_ROWS] =
    grid_rows(decode_grid::<IQ3S_ROWS, IQ3S_WIDTH>(IQ3S_HEX, 3), IQ3S_MAP);
static IQ1S: [u64; IQ1S_ROWS] =
    grid_rows(decode_grid::<IQ1S_ROWS, IQ1S_WIDTH>(IQ1S_HEX, 2), IQ1S_MAP);

/// Sign byte `s` as eight bytes: -1 where bit j of `s` is set (the reference negates that
/// element), else +1.
const fn sign_masks() -> [u64; 256] {
    let mut out = [0u64; 256];
    let mut s = 0;
    while s < 256 {
        let mut j = 0;
        while j < 8 {
            let b: u64 = if (s >> j) & 1 == 1 { 0xFF } else { 0x01 };
            out[s] |= b << (8 * j);
            j += 1;
        }
        s += 1;
    }
    out
}

static SIGNS: [u64; 256] = sign_masks();

/// Four u64 as one vector, `r[0]` in the lowest bytes.
#[inline]
#[target_feature(enable = "avx2")]
fn v4(r: [u64; 4]) -> __m256i {
    _mm256_set_epi64x(r[3] as i64, r[2] as i64, r[1] as i64, r[0] as i64)
}

/// `madd(maddubs(w, x), scale)`: eight i32 sums of `scale * w * x` for 32 unsigned `w`
/// (< 64) and signed `x`; `scale` per 16-bit pair (one value a 128-bit half, say).
#[inline]
#[target_feature(enable = "avx2")]
fn dot_scaled(w: __m256i, x: __m256i, scale: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), scale)
}

/// A 16-bit scale `lo` for the low 16 elements and `hi` for the high 16.
#[inline]
#[target_feature(enable = "avx2")]
fn scales2(lo: i32, hi: i32) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi as i16), _mm_set1_epi16(lo as i16))
}

/// The activations of group `g` of block `i` with the sign masks of its four 8-element runs
/// applied.
#[inline]
#[target_feature(enable = "avx2")]
fn signed_x(a: &Q8Row, i: usize, g: usize, s: [u8; 4]) -> __m256i {
    let m = v4(s.map(|b| SIGNS[b as usize]));
    _mm256_sign_epi8(load32_i8(a.qs, i * 256 + g * 32), m)
}

#[target_feature(enable = "avx2")]
unsafe fn iq2_xxs_avx2(w: &[u8], a: &Q8Row) -> f32 {
    let mut sumf = 0.0f32;
    for (i, b) in w.chunks_exact(66).enumerate() {
        let d = f16_at(b, 0) * a.d[i];
        let mut acc = _mm256_setzero_si256();
        for g in 0..8 {
            let off = 2 + 8 * g;
            let aux1 = u32_at(b, off + 4);
            let ls = 2 * (aux1 >> 28) as i32 + 1;
            let q = v4([0, 1, 2, 3].map(|l| IQ2XXS[b[off + l] as usize]));
            let s = [0, 1, 2, 3].map(|l| KSIGNS[((aux1 >> (7 * l)) & 127) as usize]);
            let x = signed_x(a, i, g, s);
            acc = _mm256_add_epi32(acc, dot_scaled(q, x, _mm256_set1_epi16(ls as i16)));
        }
        sumf += d * hsum(acc) as f32;
    }
    0.125 * sumf
}

#[target_feature(enable = "avx2")]
unsafe fn iq2_xs_avx2(w: &[u8], a: &Q8Row) -> f32 {
    let mut sumf = 0.0f32;
    for (i, b) in w.chunks_exact(74).enumerate() {
        let d = f16_at(b, 0) * a.d[i];
        let mut acc = _mm256_setzero_si256();
        for (g, &sc) in b[66..74].iter().enumerate() {
            let e = [0, 1, 2, 3].map(|l| u16_at(b, 2 + 2 * (4 * g + l)));
            let q = v4(e.map(|q| IQ2XS[(q & 511) as usize]));
            let x = signed_x(a, i, g, e.map(|q| KSIGNS[(q >> 9) as usize]));
            let ls = scales2(2 * (sc & 0x0F) as i32 + 1, 2 * (sc >> 4) as i32 + 1);
            acc = _mm256_add_epi32(acc, dot_scaled(q, x, ls));
        }
        sumf += d * hsum(acc) as f32;
    }
    0.125 * sumf
}

#[target_feature(enable = "avx2")]
unsafe fn iq2_s_avx2(w: &[u8], a: &Q8Row) -> f32 {
    let mut sumf = 0.0f32;
    for (i, b) in w.chunks_exact(82).enumerate() {
        let d = f16_at(b, 0) * a.d[i];
        let (qs, signs, qh, sc) = (&b[2..34], &b[34..66], &b[66..74], &b[74..82]);
        let mut acc = _mm256_setzero_si256();
        for g in 0..8 {
            let (mut r, mut sg) = ([0u64; 4], [0u8; 4]);
            for l in 0..4 {
                r[l] = IQ2S[qs[4 * g + l] as usize | ((qh[g] as usize) << (8 - 2 * l) & 0x300)];
                sg[l] = signs[4 * g + l];
            }
            let (q, x) = (v4(r), signed_x(a, i, g, sg));
            let ls = scales2(1 + 2 * (sc[g] & 0x0F) as i32, 1 + 2 * (sc[g] >> 4) as i32);
            acc = _mm256_add_epi32(acc, dot_scaled(q, x, ls));
        }
        sumf += d * hsum(acc) as f32;
    }
    0.125 * sumf
}

#[target_feature(enable = "avx2")]
unsafe fn iq3_xxs_avx2(w: &[u8], a: &Q8Row) -> f32 {
    let mut sumf = 0.0f32;
    for (i, b) in w.chunks_exact(98).enumerate() {
        let d = f16_at(b, 0) * a.d[i];
        let q3 = &b[2..66];
        let mut acc = _mm256_setzero_si256();
        for g in 0..8 {
            let aux = u32_at(b, 66 + 4 * g);
            let ls = 2 * (aux >> 28) as i32 + 1;
            let q = v4([0, 1, 2, 3].map(|l| {
                IQ3XXS[q3[8 * g + 2 * l] as usize] | IQ3XXS[q3[8 * g + 2 * l + 1] as usize] << 32
            }));
            let s = [0, 1, 2, 3].map(|l| KSIGNS[((aux >> (7 * l)) & 127) as usize]);
            let x = signed_x(a, i, g, s);
            acc = _mm256_add_epi32(acc, dot_scaled(q, x, _mm256_set1_epi16(ls as i16)));
        }
        sumf += d * hsum(acc) as f32;
    }
    0.25 * sumf
}

#[target_feature(enable = "avx2")]
unsafe fn iq3_s_avx2(w: &[u8], a: &Q8Row) -> f32 {
    let mut sumf = 0.0f32;
    for (i, b) in w.chunks_exact(110).enumerate() {
        let d = f16_at(b, 0) * a.d[i];
        let (qs, qh, signs, sc) = (&b[2..66], &b[66..74], &b[74..106], &b[106..110]);
        let mut acc = _mm256_setzero_si256();
        for g in 0..8 {
            let ls = 2 * ((sc[g / 2] >> (4 * (g % 2))) & 0x0F) as i32 + 1;
            let h = qh[g] as usize;
            let (mut r, mut sg) = ([0u64; 4], [0u8; 4]);
            for l in 0..4 {
                let i1 = qs[8 * g + 2 * l] as usize | ((h << (8 - 2 * l)) & 256);
                let i2 = qs[8 * g + 2 * l + 1] as usize | ((h << (7 - 2 * l)) & 256);
                r[l] = IQ3S[i1] | IQ3S[i2] << 32;
                sg[l] = signs[4 * g + l];
            }
            let (q, x) = (v4(r), signed_x(a, i, g, sg));
            acc = _mm256_add_epi32(acc, dot_scaled(q, x, _mm256_set1_epi16(ls as i16)));
        }
        sumf += d * hsum(acc) as f32;
    }
    sumf
}

/// IQ1_S/IQ1_M's grid offset (`dot_iq::IQ1_DELTA`).
const IQ1_DELTA: f32 = 0.125;

/// Eight i32 sums of `scale * w * x` for 32 signed `w` in {-1, 0, 1} (sign trick; a pair is
/// at most 254, times a scale of at most 15).
#[inline]
#[target_feature(enable = "avx2")]
fn dot_i8_scaled(w: __m256i, x: __m256i, scale: __m256i) -> __m256i {
    dot_scaled(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w), scale)
}

#[target_feature(enable = "avx2")]
unsafe fn iq1_s_avx2(w: &[u8], a: &Q8Row) -> f32 {
    let mut sumf = 0.0f32;
    for (i, b) in w.chunks_exact(50).enumerate() {
        let qs = &b[2..34];
        let mut acc = _mm256_setzero_si256();
        let mut sumi1 = 0i32;
        for g in 0..8 {
            let qh = u16_at(b, 34 + 2 * g);
            let ls = 2 * ((qh >> 12) & 7) as i32 + 1;
            let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
            let q = v4([0, 1, 2, 3]
                .map(|l| IQ1S[qs[4 * g + l] as usize | ((((qh >> (3 * l)) & 7) as usize) << 8)]));
            let x = load32_i8(a.qs, i * 256 + g * 32);
            acc = _mm256_add_epi32(acc, dot_i8_scaled(q, x, _mm256_set1_epi16(ls as i16)));
            let bs = a.bsums[i * 16 + 2 * g] as i32 + a.bsums[i * 16 + 2 * g + 1] as i32;
            sumi1 += ls * delta * bs;
        }
        let sumi = hsum(acc);
        sumf += f16_at(b, 0) * a.d[i] * (sumi as f32 + IQ1_DELTA * sumi1 as f32);
    }
    sumf
}

#[target_feature(enable = "avx2")]
unsafe fn iq1_m_avx2(w: &[u8], a: &Q8Row) -> f32 {
    // +1 bytes, or -1 bytes where the run's delta is negative.
    const PLUS: u64 = 0x0101_0101_0101_0101;
    let mut sumf = 0.0f32;
    for (i, b) in w.chunks_exact(56).enumerate() {
        let (qs, qh) = (&b[0..32], &b[32..48]);
        let sc = [u16_at(b, 48), u16_at(b, 50), u16_at(b, 52), u16_at(b, 54)];
        let d_bits =
            (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000);
        let d = half::f16::from_bits(d_bits).to_f32();
        let (mut acc1, mut acc2) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for g in 0..8 {
            let hb = [0, 1, 2, 3].map(|l| qh[2 * g + l / 2] >> (4 * (l % 2)));
            let q =
                v4([0, 1, 2, 3]
                    .map(|l| IQ1S[qs[4 * g + l] as usize | (((hb[l] & 7) as usize) << 8)]));
            let dl = v4(hb.map(|h| if h & 0x08 != 0 { u64::MAX } else { PLUS }));
            let s = sc[g / 2] >> (6 * (g % 2));
            let ls = scales2(2 * (s & 7) as i32 + 1, 2 * ((s >> 3) & 7) as i32 + 1);
            let x = load32_i8(a.qs, i * 256 + g * 32);
            acc1 = _mm256_add_epi32(acc1, dot_i8_scaled(q, x, ls));
            acc2 = _mm256_add_epi32(acc2, dot_i8_scaled(dl, x, ls));
        }
        let (sumi1, sumi2) = (hsum(acc1), hsum(acc2));
        sumf += d * a.d[i] * (sumi1 as f32 + IQ1_DELTA * sumi2 as f32);
    }
    sumf
}
