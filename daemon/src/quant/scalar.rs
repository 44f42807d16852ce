//! Portable scalar kernels: always built, the reference for the SIMD ones.
//!
//! Contracts shared with the SIMD kernels (checked by the callers in
//! `quant/mod.rs`):
//! * activations `x` are int8 in `[-127, 127]` (never -128) and are zero
//!   padded to a multiple of 64, so `x.len()` covers every packed element
//!   of the row, including padding fields (whose weight value is 0);
//! * integer sums are exact in i32 (rows shorter than ~130K inputs).

use super::pack::{unpack_i3, GROUP, I3_GROUP_BYTES};

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

/// int8 weights x int8 activations, `w.len()` elements.
pub(crate) fn dot_i8(w: &[i8], x: &[i8]) -> i32 {
    let x = &x[..w.len()];
    w.iter().zip(x).map(|(&a, &b)| a as i32 * b as i32).sum()
}

/// Packed int4 (nibble - 8) x int8, `2 * w.len()` elements.
pub(crate) fn dot_i4(w: &[u8], x: &[i8]) -> i32 {
    let x = &x[..2 * w.len()];
    let mut s = 0i32;
    for (&b, xx) in w.iter().zip(x.chunks_exact(2)) {
        let lo = (b & 15) as i32 - 8;
        let hi = (b >> 4) as i32 - 8;
        s += lo * xx[0] as i32 + hi * xx[1] as i32;
    }
    s
}

/// Packed int2 (field - 2) x int8, `4 * w.len()` elements.
pub(crate) fn dot_i2(w: &[u8], x: &[i8]) -> i32 {
    let x = &x[..4 * w.len()];
    let mut s = 0i32;
    for (&b, xx) in w.iter().zip(x.chunks_exact(4)) {
        s += ((b & 3) as i32 - 2) * xx[0] as i32
            + (((b >> 2) & 3) as i32 - 2) * xx[1] as i32
            + (((b >> 4) & 3) as i32 - 2) * xx[2] as i32
            + ((b >> 6) as i32 - 2) * xx[3] as i32;
    }
    s
}

/// int4-g64 row x int8: one i32 sum per 64-group into `out` (len = groups).
/// `w` is the whole packed row (`ceil(I/2)` bytes; the last group may be
/// shorter than 32 bytes).
pub(crate) fn dot_i4g64(w: &[u8], x: &[i8], out: &mut [i32]) {
    for (g, o) in out.iter_mut().enumerate() {
        let b0 = g * (GROUP / 2);
        let b1 = (b0 + GROUP / 2).min(w.len());
        *o = dot_i4(&w[b0..b1], &x[2 * b0..]);
    }
}

/// int3-g64 row x int8: one i32 sum per 64-group into `out`.
pub(crate) fn dot_i3g64(w: &[u8], x: &[i8], out: &mut [i32]) {
    let mut q = [0i8; GROUP];
    for (g, o) in out.iter_mut().enumerate() {
        unpack_i3(&w[g * I3_GROUP_BYTES..], &mut q);
        *o = dot_i8(&q, &x[g * GROUP..(g + 1) * GROUP]);
    }
}
