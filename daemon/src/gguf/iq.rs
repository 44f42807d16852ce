//! The IQ ("importance" lattice) types: each group of 4 or 8 weights is an index into a
//! fixed grid plus sign bits, times a block scale. Same contract as `dequant`: quants.py's
//! order of float operations, block by block.

use super::dequant::{f16_at, u16_at, u32_at};
use super::grids::*;

/// Decodes a gguf-py `grid_hex` string into rows of indices into its `grid_map`, exactly as
/// `__Quant.init_grid` does: two hex digits a byte (high digit first), then each byte
/// unpacked low bits first into `8 / bits` elements of `bits` bits.
pub(crate) const fn decode_grid<const N: usize, const W: usize>(
    hex: &[u8],
    bits: u32,
) -> [[u8; W]; N] {
    let mut grid = [[0u8; W]; N];
    let per_byte = 8 / bits as usize;
    let step = 8 / per_byte;
    let mask = (1u8 << bits) - 1;
    let mut byte = 0;
    let mut n = 0;
    while n < N * W {
        let v = (hex_digit(hex[2 * byte]) << 4) | hex_digit(hex[2 * byte + 1]);
        let mut k = 0;
        while k < per_byte && n < N * W {
            grid[n / W][n % W] = (v >> (k * step)) & mask;
            n += 1;
            k += 1;
        }
        byte += 1;
    }
    grid
}

/// One hex digit's value, as `init_grid` computes it (letters are above 0x40).
const fn hex_digit(c: u8) -> u8 {
    if c > 0x40 {
        (c + 9) & 0x0F
    } else {
        c & 0x0F
    }
}

static IQ2XXS_GRID: [[u8; IQ2XXS_WIDTH]; IQ2XXS_ROWS] = decode_grid(IQ2XXS_HEX, 2);
static IQ2XS_GRID: [[u8; IQ2XS_WIDTH]; IQ2XS_ROWS] = decode_grid(IQ2XS_HEX, 2);
static IQ2S_GRID: [[u8; IQ2S_WIDTH]; IQ2S_ROWS] = decode_grid(IQ2S_HEX, 2);
static IQ3XXS_GRID: [[u8; IQ3XXS_WIDTH]; IQ3XXS_ROWS] = decode_grid(IQ3XXS_HEX, 3);
static IQ3S_GRID: [[u8; IQ3S_WIDTH]; IQ3S_ROWS] = decode_grid(IQ3S_HEX, 3);
static IQ1S_GRID: [[u8; IQ1S_WIDTH]; IQ1S_ROWS] = decode_grid(IQ1S_HEX, 2);

/// ±1 from bit `bit` of `signs` (set means negative).
#[inline]
fn sign(signs: u8, bit: usize) -> f32 {
    if (signs >> bit) & 1 == 0 {
        1.0
    } else {
        -1.0
    }
}

/// The 4-bit scale `i` of a nibble-packed scale array (low nibble first).
#[inline]
fn scale4(s: &[u8], i: usize) -> u8 {
    (s[i / 2] >> (4 * (i % 2))) & 0x0F
}

pub(super) fn iq4_nl(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (i, v) in y.iter_mut().enumerate() {
        let q = (b[2 + i % 16] >> (4 * (i / 16))) & 0x0F;
        *v = d * IQ4NL_KVALUES[q as usize] as f32;
    }
}

pub(super) fn iq4_xs(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let scales_h = u16_at(b, 2);
    let scales_l = &b[4..8];
    let qs = &b[8..136];
    for (g, group) in y.chunks_exact_mut(32).enumerate() {
        let lo = scale4(scales_l, g);
        let hi = ((scales_h >> (2 * g)) as u8) & 0x03;
        let dl = d * ((lo | (hi << 4)) as i8 - 32) as f32;
        for (e, v) in group.iter_mut().enumerate() {
            let q = (qs[g * 16 + e % 16] >> (4 * (e / 16))) & 0x0F;
            *v = dl * IQ4NL_KVALUES[q as usize] as f32;
        }
    }
}

pub(super) fn iq2_xxs(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (g, group) in y.chunks_exact_mut(32).enumerate() {
        let off = 2 + 8 * g;
        let aux1 = u32_at(b, off + 4);
        let db = d * (0.5f32 + (aux1 >> 28) as f32) * 0.25f32;
        for (e, v) in group.iter_mut().enumerate() {
            let sub = e / 8;
            let row = &IQ2XXS_GRID[b[off + sub] as usize];
            let signs = KSIGNS[((aux1 >> (7 * sub)) & 0x7F) as usize];
            *v = db * IQ2XXS_MAP[row[e % 8] as usize] * sign(signs, e % 8);
        }
    }
}

/// The IQ2_XS/IQ2_S sub-block scale: `d * (0.5 + s) * 0.25`.
#[inline]
fn iq2_db(d: f32, s: u8) -> f32 {
    d * (0.5f32 + s as f32) * 0.25f32
}

pub(super) fn iq2_xs(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let scales = &b[66..74];
    for (i, group) in y.chunks_exact_mut(16).enumerate() {
        let db = iq2_db(d, scale4(scales, i));
        for (e, v) in group.iter_mut().enumerate() {
            let q = u16_at(b, 2 + 2 * (2 * i + e / 8));
            let row = &IQ2XS_GRID[(q & 511) as usize];
            let signs = KSIGNS[(q >> 9) as usize];
            *v = db * IQ2XS_MAP[row[e % 8] as usize] * sign(signs, e % 8);
        }
    }
}

pub(super) fn iq2_s(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..34];
    let signs = &b[34..66];
    let qh = &b[66..74];
    let scales = &b[74..82];
    for (i, group) in y.chunks_exact_mut(16).enumerate() {
        let db = iq2_db(d, scale4(scales, i));
        for (e, v) in group.iter_mut().enumerate() {
            let j = 2 * i + e / 8;
            let idx = qs[j] as usize | ((((qh[j / 4] >> (2 * (j % 4))) & 3) as usize) << 8);
            let row = &IQ2S_GRID[idx];
            *v = db * IQ2S_MAP[row[e % 8] as usize] * sign(signs[j], e % 8);
        }
    }
}

pub(super) fn iq3_xxs(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..66];
    for (g, group) in y.chunks_exact_mut(32).enumerate() {
        let aux = u32_at(b, 66 + 4 * g);
        let db = d * (0.5f32 + (aux >> 28) as f32) * 0.5f32;
        for (e, v) in group.iter_mut().enumerate() {
            let row = &IQ3XXS_GRID[qs[g * 8 + e / 4] as usize];
            let signs = KSIGNS[((aux >> (7 * (e / 8))) & 0x7F) as usize];
            *v = db * IQ3XXS_MAP[row[e % 4] as usize] * sign(signs, e % 8);
        }
    }
}

pub(super) fn iq3_s(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..66];
    let qh = &b[66..74];
    let signs = &b[74..106];
    let scales = &b[106..110];
    for (g, group) in y.chunks_exact_mut(32).enumerate() {
        // quants.py: `d * (1 + 2 * scales)`, the odd multiplier formed in integers first.
        let db = d * (1 + 2 * scale4(scales, g)) as f32;
        for (e, v) in group.iter_mut().enumerate() {
            let j = g * 8 + e / 4;
            let idx = qs[j] as usize | ((((qh[j / 8] >> (j % 8)) & 1) as usize) << 8);
            let row = &IQ3S_GRID[idx];
            *v = db * IQ3S_MAP[row[e % 4] as usize] * sign(signs[g * 4 + e / 8], e % 8);
        }
    }
}

/// IQ1_S/IQ1_M's offset added to every grid value, its sign chosen per group.
const IQ1_DELTA: f32 = 0.125;

pub(super) fn iq1_s(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..34];
    for (g, group) in y.chunks_exact_mut(32).enumerate() {
        let qh = u16_at(b, 34 + 2 * g);
        let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
        let delta = if qh & 0x8000 == 0 {
            IQ1_DELTA
        } else {
            -IQ1_DELTA
        };
        for (e, v) in group.iter_mut().enumerate() {
            let k = e / 8;
            let idx = qs[g * 4 + k] as usize | ((((qh >> (3 * k)) & 7) as usize) << 8);
            *v = dl * (IQ1S_MAP[IQ1S_GRID[idx][e % 8] as usize] + delta);
        }
    }
}

pub(super) fn iq1_m(b: &[u8], y: &mut [f32]) {
    let qs = &b[0..32];
    let qh = &b[32..48];
    let sc = [u16_at(b, 48), u16_at(b, 50), u16_at(b, 52), u16_at(b, 54)];
    // The block's f16 scale is spread over the top nibbles of the four scale words.
    let d_bits = ((sc[0] & 0xF000) >> 12)
        | ((sc[1] & 0xF000) >> 8)
        | ((sc[2] & 0xF000) >> 4)
        | (sc[3] & 0xF000);
    let d = half::f16::from_bits(d_bits).to_f32();
    for (j, row_out) in y.chunks_exact_mut(8).enumerate() {
        // Grid row j (0..32): its 3-bit scale is number j / 2 of the sixteen, its high index
        // bits and delta sign in nibble j of qh.
        let s = j / 2;
        let scale = (sc[s / 4] >> (3 * (s % 4))) & 7;
        let dl = d * (2 * scale + 1) as f32;
        let h = qh[j / 2] >> (4 * (j % 2));
        let idx = qs[j] as usize | (((h & 7) as usize) << 8);
        let delta = if h & 0x08 == 0 { IQ1_DELTA } else { -IQ1_DELTA };
        for (c, v) in row_out.iter_mut().enumerate() {
            *v = dl * (IQ1S_MAP[IQ1S_GRID[idx][c] as usize] + delta);
        }
    }
}
