//! The portable reference dot products of GGUF's 32-element block types (Q4_0, Q4_1, Q5_0,
//! Q5_1, Q8_0, MXFP4, IQ4_NL) against Q8_0 activation blocks, as llama.cpp's generic CPU
//! code computes them: an exact i32 sum per block, then the block's float scale products in
//! llama.cpp's order.

use super::dot::{f16_at, u32_at};
use super::Q8Row;
use crate::gguf::grids::{IQ4NL_KVALUES, MXFP4_KVALUES};

/// Sum over a 32-block of `lo(q[j]) * a[j] + hi(q[j]) * a[j + 16]` for 16 bytes of
/// nibbles, each nibble mapped by `f`.
#[inline]
pub(super) fn nibbles32(qs: &[u8], a: &[i8], f: impl Fn(u8) -> i32) -> i32 {
    let mut s = 0i32;
    for j in 0..16 {
        s += f(qs[j] & 0x0F) * a[j] as i32 + f(qs[j] >> 4) * a[j + 16] as i32;
    }
    s
}

pub(super) fn q4_0(w: &[u8], a: &Q8Row) -> f32 {
    let mut sum = 0.0f32;
    for (ib, b) in w.chunks_exact(18).enumerate() {
        let qa = &a.qs[ib * 32..ib * 32 + 32];
        let si = nibbles32(&b[2..18], qa, |q| q as i32 - 8);
        sum += si as f32 * f16_at(b, 0) * a.d[ib];
    }
    sum
}

pub(super) fn q4_1(w: &[u8], a: &Q8Row) -> f32 {
    let mut sum = 0.0f32;
    for (ib, b) in w.chunks_exact(20).enumerate() {
        let qa = &a.qs[ib * 32..ib * 32 + 32];
        let si = nibbles32(&b[4..20], qa, |q| q as i32);
        sum += (f16_at(b, 0) * a.d[ib]) * si as f32 + f16_at(b, 2) * a.s[ib];
    }
    sum
}

/// A Q5 block's 32 five-bit quants' sum against `a`, each quant shifted by `off`.
#[inline]
fn five32(qh: u32, qs: &[u8], a: &[i8], off: i32) -> i32 {
    let mut s = 0i32;
    for j in 0..16 {
        let lo = (qs[j] & 0x0F) as i32 | ((((qh >> j) & 1) as i32) << 4);
        let hi = (qs[j] >> 4) as i32 | ((((qh >> (j + 16)) & 1) as i32) << 4);
        s += (lo - off) * a[j] as i32 + (hi - off) * a[j + 16] as i32;
    }
    s
}

pub(super) fn q5_0(w: &[u8], a: &Q8Row) -> f32 {
    let mut sum = 0.0f32;
    for (ib, b) in w.chunks_exact(22).enumerate() {
        let si = five32(u32_at(b, 2), &b[6..22], &a.qs[ib * 32..ib * 32 + 32], 16);
        sum += (f16_at(b, 0) * a.d[ib]) * si as f32;
    }
    sum
}

pub(super) fn q5_1(w: &[u8], a: &Q8Row) -> f32 {
    let mut sum = 0.0f32;
    for (ib, b) in w.chunks_exact(24).enumerate() {
        let si = five32(u32_at(b, 4), &b[8..24], &a.qs[ib * 32..ib * 32 + 32], 0);
        sum += (f16_at(b, 0) * a.d[ib]) * si as f32 + f16_at(b, 2) * a.s[ib];
    }
    sum
}

pub(super) fn q8_0(w: &[u8], a: &Q8Row) -> f32 {
    let mut sum = 0.0f32;
    for (ib, b) in w.chunks_exact(34).enumerate() {
        let qa = &a.qs[ib * 32..ib * 32 + 32];
        let si: i32 = b[2..34]
            .iter()
            .zip(qa)
            .map(|(&q, &x)| q as i8 as i32 * x as i32)
            .sum();
        sum += si as f32 * (f16_at(b, 0) * a.d[ib]);
    }
    sum
}

/// ggml's e8m0-to-f32-half: `2^(e - 128)`, subnormal for `e < 2`.
#[inline]
pub(super) fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

pub(super) fn mxfp4(w: &[u8], a: &Q8Row) -> f32 {
    let mut sum = 0.0f32;
    for (ib, b) in w.chunks_exact(17).enumerate() {
        let d = a.d[ib] * e8m0_half(b[0]);
        let si = nibbles32(&b[1..17], &a.qs[ib * 32..ib * 32 + 32], |q| {
            MXFP4_KVALUES[q as usize] as i32
        });
        sum += d * si as f32;
    }
    sum
}

pub(super) fn iq4_nl(w: &[u8], a: &Q8Row) -> f32 {
    let mut sum = 0.0f32;
    for (ib, b) in w.chunks_exact(18).enumerate() {
        let d = a.d[ib] * f16_at(b, 0);
        let si = nibbles32(&b[2..18], &a.qs[ib * 32..ib * 32 + 32], |q| {
            IQ4NL_KVALUES[q as usize] as i32
        });
        sum += d * si as f32;
    }
    sum
}
