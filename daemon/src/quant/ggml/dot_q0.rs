//! The portable reference dot products of GGUF's 32-element block types (Q4_0, Q4_1, Q5_0,
//! Q5_1, Q8_0, MXFP4, IQ4_NL) against Q8_0 activation blocks. The integer part is llama.cpp's
//! (each block's quants times the activation quants, exact in i32); the float part is fixed
//! here so that every kernel (a row dot, a 1 x 4 tile, a rows x positions panel) can match it
//! bit for bit at full speed:
//!
//! * a block's 32 products are summed exactly into one i32 `isum` (any order: integers are
//!   exact, at most 32 x 128 x 127 in magnitude, and exact again as an f32);
//! * block `ib` adds `d * isum` (one f32 product `d = dw * da`, weight scale times
//!   activation scale, then one product and one sum: no fused multiply-add) into float set
//!   `ib % 8`. A SIMD dot reduces eight blocks' integer lanes to one vector of eight block
//!   sums whose lane `k` is set `k`; a panel keeps a set's sums per row in a register;
//! * Q4_1 and Q5_1 also add `m * s` per block (weight minimum times the activation block's
//!   scaled sum) into minimum set `ib % 8`;
//! * at the end of the row the eight sets are reduced as a tree ([`tree8`]); the minimum sets
//!   likewise, added last.
//!
//! Which set a block's product lands in changes only the last bits against llama.cpp's
//! sequential order (both are f32 sums of the same terms).

use super::dot::{f16_at, u32_at};
use super::Q8Row;
use crate::gguf::grids::{IQ4NL_KVALUES, MXFP4_KVALUES};

/// Float sets a row's blocks rotate through (block `ib` adds into set `ib % SETS`).
pub(super) const SETS: usize = 8;

/// The float sets of one row's dot product.
#[derive(Default)]
struct Sets {
    sets: [f32; SETS],
    mins: [f32; SETS],
}

impl Sets {
    /// Block `ib`'s exact integer sum `isum`, scaled by `d`.
    #[inline]
    fn add(&mut self, ib: usize, d: f32, isum: i32) {
        self.sets[ib % SETS] += d * isum as f32;
    }

    /// Block `ib`'s minimum term.
    #[inline]
    fn add_min(&mut self, ib: usize, m: f32, s: f32) {
        self.mins[ib % SETS] += m * s;
    }

    fn fold(&self) -> f32 {
        tree8(&self.sets)
    }

    fn fold_with_mins(&self) -> f32 {
        self.fold() + tree8(&self.mins)
    }
}

/// Eight lanes reduced as a register halves them: `t[i] + t[i + 4]`, then `u[i] + u[i + 2]`,
/// then the two.
#[inline]
pub(super) fn tree8(t: &[f32; 8]) -> f32 {
    let u: [f32; 4] = std::array::from_fn(|i| t[i] + t[i + 4]);
    (u[0] + u[2]) + (u[1] + u[3])
}

/// A block's exact integer sum `sum q[n] * a[n]`.
#[inline]
fn isum32(q: &[i8; 32], a: &[i8]) -> i32 {
    q.iter()
        .zip(&a[..32])
        .map(|(&w, &x)| w as i32 * x as i32)
        .sum()
}

/// A block's 32 quants from 16 bytes of nibbles (low nibbles are elements 0..16, high ones
/// 16..32), each mapped by `f` (every type's values fit an i8).
#[inline]
fn nibble_quants(qs: &[u8], f: impl Fn(u8) -> i8) -> [i8; 32] {
    let mut q = [0i8; 32];
    for (j, &b) in qs[..16].iter().enumerate() {
        q[j] = f(b & 0x0F);
        q[j + 16] = f(b >> 4);
    }
    q
}

/// Sum over a 32-block of `lo(q[j]) * a[j] + hi(q[j]) * a[j + 16]` for 16 bytes of
/// nibbles, each nibble mapped by `f` (IQ4_XS's groups, in `dot.rs`).
#[inline]
pub(super) fn nibbles32(qs: &[u8], a: &[i8], f: impl Fn(u8) -> i32) -> i32 {
    let mut s = 0i32;
    for j in 0..16 {
        s += f(qs[j] & 0x0F) * a[j] as i32 + f(qs[j] >> 4) * a[j + 16] as i32;
    }
    s
}

/// A Q5 block's 32 five-bit quants (bit `n` of `qh` is element `n`'s fifth bit), each
/// shifted by `off`.
#[inline]
fn five_quants(qh: u32, qs: &[u8], off: i8) -> [i8; 32] {
    let mut q = nibble_quants(qs, |v| v as i8);
    for (n, v) in q.iter_mut().enumerate() {
        *v = (*v | (((qh >> n) & 1) as i8) << 4) - off;
    }
    q
}

/// The product of `w`'s blocks of `bytes` against `a`: `block` gives a block's quants and
/// weight scale.
#[inline]
fn blocks(w: &[u8], a: &Q8Row, bytes: usize, block: impl Fn(&[u8]) -> ([i8; 32], f32)) -> Sets {
    let mut sets = Sets::default();
    for (ib, b) in w.chunks_exact(bytes).enumerate() {
        let (q, dw) = block(b);
        sets.add(ib, dw * a.d[ib], isum32(&q, &a.qs[ib * 32..ib * 32 + 32]));
    }
    sets
}

pub(super) fn q4_0(w: &[u8], a: &Q8Row) -> f32 {
    blocks(w, a, 18, |b| {
        (nibble_quants(&b[2..18], |q| q as i8 - 8), f16_at(b, 0))
    })
    .fold()
}

pub(super) fn q4_1(w: &[u8], a: &Q8Row) -> f32 {
    let mut sets = blocks(w, a, 20, |b| {
        (nibble_quants(&b[4..20], |q| q as i8), f16_at(b, 0))
    });
    for (ib, b) in w.chunks_exact(20).enumerate() {
        sets.add_min(ib, f16_at(b, 2), a.s[ib]);
    }
    sets.fold_with_mins()
}

pub(super) fn q5_0(w: &[u8], a: &Q8Row) -> f32 {
    blocks(w, a, 22, |b| {
        (five_quants(u32_at(b, 2), &b[6..22], 16), f16_at(b, 0))
    })
    .fold()
}

pub(super) fn q5_1(w: &[u8], a: &Q8Row) -> f32 {
    let mut sets = blocks(w, a, 24, |b| {
        (five_quants(u32_at(b, 4), &b[8..24], 0), f16_at(b, 0))
    });
    for (ib, b) in w.chunks_exact(24).enumerate() {
        sets.add_min(ib, f16_at(b, 2), a.s[ib]);
    }
    sets.fold_with_mins()
}

pub(super) fn q8_0(w: &[u8], a: &Q8Row) -> f32 {
    blocks(w, a, 34, |b| {
        (std::array::from_fn(|n| b[2 + n] as i8), f16_at(b, 0))
    })
    .fold()
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
    blocks(w, a, 17, |b| {
        let q = nibble_quants(&b[1..17], |q| MXFP4_KVALUES[q as usize]);
        (q, e8m0_half(b[0]))
    })
    .fold()
}

pub(super) fn iq4_nl(w: &[u8], a: &Q8Row) -> f32 {
    blocks(w, a, 18, |b| {
        let q = nibble_quants(&b[2..18], |q| IQ4NL_KVALUES[q as usize]);
        (q, f16_at(b, 0))
    })
    .fold()
}
