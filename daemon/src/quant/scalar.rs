//! Portable scalar kernels: always built, the reference for the SIMD ones.
//!
//! Contracts shared with the SIMD kernels (checked by the safe wrappers and
//! by the callers in `quant/mod.rs`):
//! * activations are int8 in `[-127, 127]` (never -128), zero padded to a
//!   multiple of [`ACT_BLOCK`] elements, laid out as [`Layout`] says for the
//!   weight format (see `act.rs`), so every packed weight field, padding
//!   included, meets an activation (0 for padding);
//! * integer sums are exact in i32 (rows shorter than ~130K inputs); the
//!   SIMD kernels may wrap in intermediate steps, but the final sums are
//!   exact whenever the true sum fits in i32;
//! * the grouped-format row kernels return
//!   [`combine16`]`(acc)` where `acc[g % 16] += (i_g as f32) * s[g]` in
//!   ascending `g` (`i_g` the exact group sum), so every ISA gives the same
//!   bits.
//!
//! int4, int3 and int2 are computed on the unsigned stored fields `u = q + 8`
//! (`q + 4`, `q + 2`): `sum q x = sum u x - 8 sum x`, with `sum x` per 64-group
//! precomputed once per activation row.

use super::act::ACT_BLOCK;
use super::pack::{GROUP, I3_GROUP_BYTES};

/// f32 dot product with 8 independent partial sums (a fixed order, so the
/// result depends only on the inputs).
pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0.0f32;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        tail += x * y;
    }
    let s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    s + tail
}

/// `acc[i] += c * x[i]` (a product, then a sum: no fused multiply-add).
pub(crate) fn axpy_f32(acc: &mut [f32], c: f32, x: &[f32]) {
    for (a, v) in acc.iter_mut().zip(x) {
        *a += c * v;
    }
}

/// `acc[i] += c * x[i]` with int8 `x` (exact in f32), no fused multiply-add.
pub(crate) fn axpy_i8(acc: &mut [f32], c: f32, x: &[i8]) {
    for (a, &v) in acc.iter_mut().zip(x) {
        *a += c * v as f32;
    }
}

/// Largest `|v|` of `x` (0 when empty; NaN values are skipped, as
/// `f32::max` does).  The result does not depend on the order.
pub(crate) fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |m, v| m.max(v.abs()))
}

/// Wrapping sum of `buf` as little-endian u64 lanes (a short tail is
/// zero-padded): the memory-read probe.  Eight independent lanes keep the
/// loop bound by the loads.
pub(crate) fn read_sum(buf: &[u8]) -> u64 {
    let mut acc = [0u64; 8];
    let mut blocks = buf.chunks_exact(64);
    for b in &mut blocks {
        for (a, w) in acc.iter_mut().zip(b.chunks_exact(8)) {
            *a = a.wrapping_add(u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
    }
    for (i, w) in blocks.remainder().chunks(8).enumerate() {
        let mut lane = [0u8; 8];
        lane[..w.len()].copy_from_slice(w);
        acc[i] = acc[i].wrapping_add(u64::from_le_bytes(lane));
    }
    acc.iter().fold(0, |s, &a| s.wrapping_add(a))
}

/// Quantize `x` to int8 in natural order: `clamp(rint(v / scale), -127,
/// 127)` (ties to even; NaN gives 0).  `q.len() == x.len()`.
pub(crate) fn quant_i8(x: &[f32], scale: f32, q: &mut [i8]) {
    for (d, &v) in q.iter_mut().zip(x) {
        *d = super::pack::rint_clamped(v / scale).clamp(-127.0, 127.0) as i8;
    }
}

/// int8 weights x int8 activations (natural layout), `w.len()` elements.
pub(crate) fn dot_i8(w: &[i8], x: &[i8]) -> i32 {
    let x = &x[..w.len()];
    w.iter().zip(x).map(|(&a, &b)| a as i32 * b as i32).sum()
}

/// Index of the activation for the high nibble (`hi = true`) or low nibble
/// of packed int4 byte `j` in the split layout: per 128-element block, the
/// 64 even elements then the 64 odd ones.
#[inline]
pub(crate) fn split4_index(j: usize, hi: bool) -> usize {
    (j / 64) * ACT_BLOCK + (j % 64) + if hi { 64 } else { 0 }
}

/// `sum u x` over packed int4 bytes (`u` = the stored nibble, 0..=15)
/// against split-layout activations.
pub(crate) fn dot_u4(w: &[u8], x: &[i8]) -> i32 {
    let mut s = 0i32;
    for (j, &b) in w.iter().enumerate() {
        s += (b & 15) as i32 * x[split4_index(j, false)] as i32
            + (b >> 4) as i32 * x[split4_index(j, true)] as i32;
    }
    s
}

/// `sum u x` of a packed int2 row (`u` = the stored 2-bit field, 0..=3)
/// against split2-layout activations (`sum q x = sum u x - 2 sum x`).
pub(crate) fn dot_i2(w: &[u8], x: &[i8]) -> i32 {
    let mut s = 0i32;
    for (j, &b) in w.iter().enumerate() {
        for f in 0..4 {
            s += ((b >> (2 * f)) & 3) as i32 * x[split2_index(4 * j + f)] as i32;
        }
    }
    s
}

/// Position of element `k` in the int2 split layout: per 256-element block,
/// field `f = k % 4` of packed byte `j = k / 4` at `64 f + j % 64`.
#[inline]
pub(crate) fn split2_index(k: usize) -> usize {
    (k / 256) * 256 + 64 * (k % 4) + (k % 256) / 4
}

/// The fixed reduction of 16 lanes every ISA reproduces: halves, then
/// quarters, then pairs (`s8[i] = a[i] + a[i+8]`, `s4[i] = s8[i] + s8[i+4]`,
/// `s2[i] = s4[i] + s4[i+2]`, `s2[0] + s2[1]`).
#[inline]
pub(crate) fn combine16(a: &[f32; 16]) -> f32 {
    let mut s8 = [0f32; 8];
    for i in 0..8 {
        s8[i] = a[i] + a[i + 8];
    }
    let mut s4 = [0f32; 4];
    for i in 0..4 {
        s4[i] = s8[i] + s8[i + 4];
    }
    let s2 = [s4[0] + s4[2], s4[1] + s4[3]];
    s2[0] + s2[1]
}

/// Add `(gi[g] - off * xg[g]) as f32 * s[g]` into `acc[(g0 + g) % 16]`, in
/// ascending `g` (the shared float order of the grouped kernels).
#[inline]
pub(crate) fn accumulate_groups(
    acc: &mut [f32; 16],
    g0: usize,
    gi: &[i32],
    off: i32,
    xg: &[i32],
    s: &[f32],
) {
    for (g, ((&u, &xs), &sc)) in gi.iter().zip(xg).zip(s).enumerate() {
        acc[(g0 + g) % 16] += (u.wrapping_sub(off.wrapping_mul(xs))) as f32 * sc;
    }
}

/// int4-g64 row: `sum_g (sum_{k in g} q_k x_k) * s[g]` in the shared float
/// order, before the activation scale.  `w` is the whole packed row
/// (`ceil(I/2)` bytes), `x` split layout, `xg` the per-group activation
/// sums, `s` the group scales (one per group).
pub(crate) fn row_i4g64(w: &[u8], x: &[i8], xg: &[i32], s: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    for g in 0..s.len() {
        let b0 = g * (GROUP / 2);
        let b1 = (b0 + GROUP / 2).min(w.len());
        let mut u = 0i32;
        for (j, &b) in w[b0..b1].iter().enumerate() {
            let j = b0 + j;
            u += (b & 15) as i32 * x[split4_index(j, false)] as i32
                + (b >> 4) as i32 * x[split4_index(j, true)] as i32;
        }
        accumulate_groups(&mut acc, g, &[u], 8, &xg[g..], &s[g..]);
    }
    combine16(&acc)
}

/// Index of element `r` (0..64) of a 64-group in the int3 activation
/// layout: the group transposed as 4 x 16 (`r = 4j + f` goes to `16f + j`),
/// so 2-bit field `f` of low-plane byte `j` meets it.
#[inline]
pub(crate) fn t3_index(r: usize) -> usize {
    16 * (r % 4) + r / 4
}

/// `sum u x` of one 24-byte int3 group (`u = q + 4`) against the group's 64
/// int3-layout activations.
#[inline]
pub(crate) fn dot_u3_group(grp: &[u8], x: &[i8]) -> i32 {
    let mut s = 0i32;
    for r in 0..GROUP {
        let lo = (grp[r >> 2] >> ((r & 3) * 2)) & 3;
        let hi = (grp[16 + (r >> 3)] >> (r & 7)) & 1;
        s += (lo | (hi << 2)) as i32 * x[t3_index(r)] as i32;
    }
    s
}

/// int3-g64 row (24 bytes per group), same contract as [`row_i4g64`] with
/// the int3 activation layout.
pub(crate) fn row_i3g64(w: &[u8], x: &[i8], xg: &[i32], s: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    for g in 0..s.len() {
        let u = dot_u3_group(&w[g * I3_GROUP_BYTES..], &x[g * GROUP..(g + 1) * GROUP]);
        accumulate_groups(&mut acc, g, &[u], 4, &xg[g..], &s[g..]);
    }
    combine16(&acc)
}
