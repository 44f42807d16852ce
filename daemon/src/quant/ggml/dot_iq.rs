//! The portable reference dot products of the lattice ("importance") types: each group of 4
//! or 8 weights is a row of a fixed grid, with sign bits and a per-32 odd scale. The grids
//! are gguf-py's (decoded in `gguf::iq`), turned into the integer values llama.cpp's tables
//! hold, so the sums are exact integers as in llama.cpp's generic code.

use super::dot::{f16_at, u16_at, u32_at};
use super::Q8Row;
use crate::gguf::grids::*;
use crate::gguf::iq::decode_grid;

/// A decoded grid's indices replaced by the values they index (`map`, integers in gguf-py's
/// float table).
const fn values<const N: usize, const W: usize, const M: usize>(
    g: [[u8; W]; N],
    map: [f32; M],
) -> [[i8; W]; N] {
    let mut out = [[0i8; W]; N];
    let mut r = 0;
    while r < N {
        let mut c = 0;
        while c < W {
            out[r][c] = map[g[r][c] as usize] as i8;
            c += 1;
        }
        r += 1;
    }
    out
}

pub(super) static IQ2XXS: [[i8; IQ2XXS_WIDTH]; IQ2XXS_ROWS] =
    values(decode_grid(IQ2XXS_HEX, 2), IQ2XXS_MAP);
pub(super) static IQ2XS: [[i8; IQ2XS_WIDTH]; IQ2XS_ROWS] =
    values(decode_grid(IQ2XS_HEX, 2), IQ2XS_MAP);
pub(super) static IQ2S: [[i8; IQ2S_WIDTH]; IQ2S_ROWS] = values(decode_grid(IQ2S_HEX, 2), IQ2S_MAP);
pub(super) static IQ3XXS: [[i8; IQ3XXS_WIDTH]; IQ3XXS_ROWS] =
    values(decode_grid(IQ3XXS_HEX, 3), IQ3XXS_MAP);
pub(super) static IQ3S: [[i8; IQ3S_WIDTH]; IQ3S_ROWS] = values(decode_grid(IQ3S_HEX, 3), IQ3S_MAP);
pub(super) static IQ1S: [[i8; IQ1S_WIDTH]; IQ1S_ROWS] = values(decode_grid(IQ1S_HEX, 2), IQ1S_MAP);

/// `sum grid[j] * a[j]`, negated where bit j of `signs` is set.
#[inline]
fn signed8(grid: &[i8], signs: u8, a: &[i8]) -> i32 {
    let mut s = 0i32;
    for j in 0..grid.len() {
        let p = grid[j] as i32 * a[j] as i32;
        s += if (signs >> j) & 1 == 1 { -p } else { p };
    }
    s
}

pub(super) fn iq2_xxs(w: &[u8], a: &Q8Row) -> f32 {
    let mut sumf = 0.0f32;
    for (i, b) in w.chunks_exact(66).enumerate() {
        let d = f16_at(b, 0) * a.d[i];
        let mut bsum = 0i32;
        for g in 0..8 {
            let off = 2 + 8 * g;
            let aux1 = u32_at(b, off + 4);
            let ls = 2 * (aux1 >> 28) as i32 + 1;
            let mut sumi = 0i32;
            for l in 0..4 {
                let signs = KSIGNS[((aux1 >> (7 * l)) & 127) as usize];
                let x = &a.qs[i * 256 + g * 32 + l * 8..][..8];
                sumi += signed8(&IQ2XXS[b[off + l] as usize], signs, x);
            }
            bsum += sumi * ls;
        }
        sumf += d * bsum as f32;
    }
    0.125 * sumf
}

pub(super) fn iq2_xs(w: &[u8], a: &Q8Row) -> f32 {
    let mut sumf = 0.0f32;
    for (i, b) in w.chunks_exact(74).enumerate() {
        let d = f16_at(b, 0) * a.d[i];
        let sc = &b[66..74];
        let mut bsum = 0i32;
        for g in 0..8 {
            for half in 0..2 {
                let ls = 2 * ((sc[g] >> (4 * half)) & 0x0F) as i32 + 1;
                let mut sumi = 0i32;
                for l in 2 * half..2 * half + 2 {
                    let q = u16_at(b, 2 + 2 * (4 * g + l));
                    let x = &a.qs[i * 256 + g * 32 + l * 8..][..8];
                    sumi += signed8(&IQ2XS[(q & 511) as usize], KSIGNS[(q >> 9) as usize], x);
                }
                bsum += sumi * ls;
            }
        }
        sumf += d * bsum as f32;
    }
    0.125 * sumf
}

pub(super) fn iq2_s(w: &[u8], a: &Q8Row) -> f32 {
    let mut sumf = 0.0f32;
    for (i, b) in w.chunks_exact(82).enumerate() {
        let d = f16_at(b, 0) * a.d[i];
        let (qs, signs, qh, sc) = (&b[2..34], &b[34..66], &b[66..74], &b[74..82]);
        let mut bsum = 0i32;
        for g in 0..8 {
            let mut sums = [0i32; 2];
            for l in 0..4 {
                let idx = qs[4 * g + l] as usize | ((qh[g] as usize) << (8 - 2 * l) & 0x300);
                let x = &a.qs[i * 256 + g * 32 + l * 8..][..8];
                sums[l / 2] += signed8(&IQ2S[idx], signs[4 * g + l], x);
            }
            let ls1 = 1 + 2 * (sc[g] & 0x0F) as i32;
            let ls2 = 1 + 2 * (sc[g] >> 4) as i32;
            bsum += ls1 * sums[0] + ls2 * sums[1];
        }
        sumf += d * bsum as f32;
    }
    0.125 * sumf
}

pub(super) fn iq3_xxs(w: &[u8], a: &Q8Row) -> f32 {
    let mut sumf = 0.0f32;
    for (i, b) in w.chunks_exact(98).enumerate() {
        let d = f16_at(b, 0) * a.d[i];
        let q3 = &b[2..66];
        let mut bsum = 0i32;
        for g in 0..8 {
            let aux = u32_at(b, 66 + 4 * g);
            let ls = 2 * (aux >> 28) as i32 + 1;
            let mut sumi = 0i32;
            for l in 0..4 {
                let signs = KSIGNS[((aux >> (7 * l)) & 127) as usize];
                let x = &a.qs[i * 256 + g * 32 + l * 8..][..8];
                let g1 = &IQ3XXS[q3[8 * g + 2 * l] as usize];
                let g2 = &IQ3XXS[q3[8 * g + 2 * l + 1] as usize];
                sumi += signed8(g1, signs, &x[..4]) + signed8(g2, signs >> 4, &x[4..]);
            }
            bsum += sumi * ls;
        }
        sumf += d * bsum as f32;
    }
    0.25 * sumf
}

pub(super) fn iq3_s(w: &[u8], a: &Q8Row) -> f32 {
    let mut sumf = 0.0f32;
    for (i, b) in w.chunks_exact(110).enumerate() {
        let d = f16_at(b, 0) * a.d[i];
        let (qs, qh, signs, sc) = (&b[2..66], &b[66..74], &b[74..106], &b[106..110]);
        let mut bsum = 0i32;
        for g in 0..8 {
            let ls = 2 * ((sc[g / 2] >> (4 * (g % 2))) & 0x0F) as i32 + 1;
            let h = qh[g] as usize;
            let mut sumi = 0i32;
            for l in 0..4 {
                let i1 = qs[8 * g + 2 * l] as usize | ((h << (8 - 2 * l)) & 256);
                let i2 = qs[8 * g + 2 * l + 1] as usize | ((h << (7 - 2 * l)) & 256);
                let s = signs[4 * g + l];
                let x = &a.qs[i * 256 + g * 32 + l * 8..][..8];
                sumi += signed8(&IQ3S[i1], s, &x[..4]) + signed8(&IQ3S[i2], s >> 4, &x[4..]);
            }
            bsum += sumi * ls;
        }
        sumf += d * bsum as f32;
    }
    sumf
}

/// IQ1_S/IQ1_M's offset of every grid value, its sign chosen per group (llama.cpp's
/// `IQ1S_DELTA`, `IQ1M_DELTA`).
const IQ1_DELTA: f32 = 0.125;

pub(super) fn iq1_s(w: &[u8], a: &Q8Row) -> f32 {
    let mut sumf = 0.0f32;
    for (i, b) in w.chunks_exact(50).enumerate() {
        let qs = &b[2..34];
        let (mut sumi, mut sumi1) = (0i32, 0i32);
        for g in 0..8 {
            let qh = u16_at(b, 34 + 2 * g);
            let ls = 2 * ((qh >> 12) & 7) as i32 + 1;
            let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
            let mut lsum = 0i32;
            for l in 0..4 {
                let idx = qs[4 * g + l] as usize | ((((qh >> (3 * l)) & 7) as usize) << 8);
                let x = &a.qs[i * 256 + g * 32 + l * 8..][..8];
                lsum += signed8(&IQ1S[idx], 0, x);
            }
            sumi += ls * lsum;
            let bs = a.bsums[i * 16 + 2 * g] as i32 + a.bsums[i * 16 + 2 * g + 1] as i32;
            sumi1 += ls * delta * bs;
        }
        sumf += f16_at(b, 0) * a.d[i] * (sumi as f32 + IQ1_DELTA * sumi1 as f32);
    }
    sumf
}

pub(super) fn iq1_m(w: &[u8], a: &Q8Row) -> f32 {
    let mut sumf = 0.0f32;
    for (i, b) in w.chunks_exact(56).enumerate() {
        let (qs, qh) = (&b[0..32], &b[32..48]);
        let sc = [u16_at(b, 48), u16_at(b, 50), u16_at(b, 52), u16_at(b, 54)];
        // The block's f16 scale is spread over the top nibbles of the four scale words.
        let d_bits =
            (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000);
        let d = half::f16::from_bits(d_bits).to_f32();
        let (mut sumi1, mut sumi2) = (0i32, 0i32);
        for g in 0..8 {
            let h = [qh[2 * g], qh[2 * g + 1]];
            let mut sum1 = [0i32; 2];
            let mut sum2 = [0i32; 2];
            for l in 0..4 {
                let hb = h[l / 2] >> (4 * (l % 2));
                let idx = qs[4 * g + l] as usize | (((hb & 7) as usize) << 8);
                let delta = if hb & 0x08 != 0 { -1 } else { 1 };
                let x = &a.qs[i * 256 + g * 32 + l * 8..][..8];
                sum1[l / 2] += signed8(&IQ1S[idx], 0, x);
                sum2[l / 2] += x.iter().map(|&v| v as i32).sum::<i32>() * delta;
            }
            let s = sc[g / 2] >> (6 * (g % 2));
            let ls1 = 2 * (s & 7) as i32 + 1;
            let ls2 = 2 * ((s >> 3) & 7) as i32 + 1;
            sumi1 += sum1[0] * ls1 + sum1[1] * ls2;
            sumi2 += sum2[0] * ls1 + sum2[1] * ls2;
        }
        sumf += d * a.d[i] * (sumi1 as f32 + IQ1_DELTA * sumi2 as f32);
    }
    sumf
}
