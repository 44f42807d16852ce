//! NEON kernels (baseline AArch64 SIMD: `smull` + `sadalp`, no dotprod).
//!
//! # Safety (all functions)
//! NEON is part of the AArch64 base ISA, so it is always present on the
//! targets this module is built for; callers must only make sure the
//! pointers are valid for the element counts stated on each function.
//! Loads are unaligned.
//!
//! Exactness: products are i8 x i8 widened to i16 (`|w| <= 128`,
//! `|x| <= 127`: at most 16256), and pairs are added into i32 lanes, so the
//! sums equal the scalar ones.  The float work of the grouped rows is the
//! shared `scalar::accumulate_groups` / `combine16`.
//!
//! Not run in CI here (x86-64 machine); checked with
//! `cargo check --target aarch64-unknown-linux-gnu`.

use core::arch::aarch64::*;

use super::super::scalar::{accumulate_groups, combine16, split4_index};

/// `acc += pairwise(w * x)` over 16 bytes.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn mul_acc(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
    let lo = vmull_s8(vget_low_s8(w), vget_low_s8(x));
    let hi = vmull_high_s8(w, x);
    vpadalq_s16(vpadalq_s16(acc, lo), hi)
}

/// int8 x int8 dot of `n` elements.
#[target_feature(enable = "neon")]
pub(super) unsafe fn dot_i8(w: *const i8, x: *const i8, n: usize) -> i32 {
    let mut acc0 = vdupq_n_s32(0);
    let mut acc1 = vdupq_n_s32(0);
    let mut i = 0;
    while i + 32 <= n {
        acc0 = mul_acc(acc0, vld1q_s8(w.add(i)), vld1q_s8(x.add(i)));
        acc1 = mul_acc(acc1, vld1q_s8(w.add(i + 16)), vld1q_s8(x.add(i + 16)));
        i += 32;
    }
    while i + 16 <= n {
        acc0 = mul_acc(acc0, vld1q_s8(w.add(i)), vld1q_s8(x.add(i)));
        i += 16;
    }
    let mut s = vaddvq_s32(vaddq_s32(acc0, acc1));
    while i < n {
        s += *w.add(i) as i32 * *x.add(i) as i32;
        i += 1;
    }
    s
}

/// `sum u x` of 16 packed int4 bytes starting at byte `j` (a multiple of
/// 16) against split-layout activations, added to `acc`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn u4_16(acc: int32x4_t, w: *const u8, j: usize, x: *const i8) -> int32x4_t {
    let b = vld1q_u8(w.add(j));
    let lo = vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(0x0F)));
    let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(b));
    let xe = vld1q_s8(x.add(split4_index(j, false)));
    let xo = vld1q_s8(x.add(split4_index(j, true)));
    mul_acc(mul_acc(acc, lo, xe), hi, xo)
}

/// Scalar `sum u x` of int4 bytes `j0..j1`.
#[inline]
unsafe fn u4_tail(w: *const u8, j0: usize, j1: usize, x: *const i8) -> i32 {
    let mut s = 0i32;
    for j in j0..j1 {
        let b = *w.add(j);
        s += (b & 15) as i32 * *x.add(split4_index(j, false)) as i32
            + (b >> 4) as i32 * *x.add(split4_index(j, true)) as i32;
    }
    s
}

/// `sum u x` of `nb` packed int4 bytes against split-layout activations.
#[target_feature(enable = "neon")]
pub(super) unsafe fn dot_u4(w: *const u8, x: *const i8, nb: usize) -> i32 {
    let mut acc = vdupq_n_s32(0);
    let mut j = 0;
    while j + 16 <= nb {
        acc = u4_16(acc, w, j, x);
        j += 16;
    }
    vaddvq_s32(acc) + u4_tail(w, j, nb, x)
}

/// int4-g64 row (`nb` bytes, `groups` groups) in the shared float order.
#[target_feature(enable = "neon")]
pub(super) unsafe fn row_i4g64(
    w: *const u8,
    nb: usize,
    x: *const i8,
    xg: &[i32],
    s: &[f32],
) -> f32 {
    let mut acc = [0f32; 16];
    for g in 0..s.len() {
        let j0 = 32 * g;
        let sum = if j0 + 32 <= nb {
            let a = u4_16(vdupq_n_s32(0), w, j0, x);
            vaddvq_s32(u4_16(a, w, j0 + 16, x))
        } else {
            u4_tail(w, j0, nb, x)
        };
        accumulate_groups(&mut acc, g, &[sum], 8, &xg[g..], &s[g..]);
    }
    combine16(&acc)
}

/// Per position j (0..16): high-plane byte j / 2.
const T3_IDX: [u8; 16] = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7];

/// `sum u x` of one int3 group (24 bytes) against its 64 int3-layout
/// activations (position 16f + j holds element 4j + f).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn u3_group(grp: *const u8, x: *const i8) -> i32 {
    let lo = vld1q_u8(grp);
    let three = vdupq_n_u8(3);
    let four = vdupq_n_u8(4);
    let h8 = vld1_u8(grp.add(16));
    let hb = vqtbl1q_u8(vcombine_u8(h8, h8), vld1q_u8(T3_IDX.as_ptr()));
    // Field f of low byte j, and bit 4(j%2)+f of high byte j/2.
    let fields = [
        vandq_u8(lo, three),
        vandq_u8(vshrq_n_u8::<2>(lo), three),
        vandq_u8(vshrq_n_u8::<4>(lo), three),
        vshrq_n_u8::<6>(lo),
    ];
    let mut acc = vdupq_n_s32(0);
    for (f, &l) in fields.iter().enumerate() {
        // Bit 4(j%2)+f: alternating (1 << f), (16 << f) over j.
        let bits = vreinterpretq_u8_u16(vdupq_n_u16((1u16 << f) | ((16u16 << f) << 8)));
        let h = vandq_u8(vtstq_u8(hb, bits), four);
        let u = vreinterpretq_s8_u8(vorrq_u8(l, h));
        acc = mul_acc(acc, u, vld1q_s8(x.add(16 * f)));
    }
    vaddvq_s32(acc)
}

/// int3-g64 row (`s.len()` 24-byte groups) in the shared float order.
#[target_feature(enable = "neon")]
pub(super) unsafe fn row_i3g64(w: *const u8, x: *const i8, xg: &[i32], s: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    for g in 0..s.len() {
        let sum = u3_group(w.add(24 * g), x.add(64 * g));
        accumulate_groups(&mut acc, g, &[sum], 4, &xg[g..], &s[g..]);
    }
    combine16(&acc)
}
