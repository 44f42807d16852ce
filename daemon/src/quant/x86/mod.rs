//! x86-64 SIMD kernels, selected at run time.
//!
//! The functions here are safe wrappers around `#[target_feature]` kernels.
//! They are private and only reachable through the [`KernelSet`] returned by
//! [`avx2_kernels`], which is `Some` only when AVX2 and FMA were detected on
//! the running CPU; that is the invariant every `unsafe` call below relies on.

mod avx2;

use super::pack::{GROUP, I3_GROUP_BYTES};
use super::{scalar, KernelSet};

/// The AVX2+FMA kernel set, if this CPU supports it.
pub(crate) fn avx2_kernels() -> Option<KernelSet> {
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        Some(KernelSet {
            name: "avx2",
            dot_f32,
            dot_i8,
            dot_i4,
            dot_i2,
            dot_i4g64,
            dot_i3g64,
        })
    } else {
        None
    }
}

fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    // SAFETY: only reachable via `avx2_kernels`, which checked avx2+fma at
    // run time; both slices hold at least `n` elements.
    unsafe { avx2::dot_f32(a.as_ptr(), b.as_ptr(), n) }
}

fn dot_i8(w: &[i8], x: &[i8]) -> i32 {
    assert!(x.len() >= w.len());
    // SAFETY: avx2 detected (see `avx2_kernels`); `x` holds at least
    // `w.len()` elements (asserted above).
    unsafe { avx2::dot_i8(w.as_ptr(), x.as_ptr(), w.len()) }
}

fn dot_i4(w: &[u8], x: &[i8]) -> i32 {
    assert!(x.len() >= 2 * w.len());
    // SAFETY: avx2 detected; `x` holds `2 * w.len()` elements (asserted).
    unsafe { avx2::dot_i4(w.as_ptr(), x.as_ptr(), w.len()) }
}

fn dot_i2(w: &[u8], x: &[i8]) -> i32 {
    assert!(x.len() >= 4 * w.len());
    // SAFETY: avx2 detected; `x` holds `4 * w.len()` elements (asserted).
    unsafe { avx2::dot_i2(w.as_ptr(), x.as_ptr(), w.len()) }
}

fn dot_i4g64(w: &[u8], x: &[i8], out: &mut [i32]) {
    let full = w.len() / (GROUP / 2);
    assert!(out.len() >= full && out.len() <= full + 1);
    assert!(x.len() >= out.len() * GROUP);
    // SAFETY: avx2 detected; `w` holds `full` complete 32-byte groups and
    // `x` at least `64 * full` elements (asserted above).
    unsafe { avx2::dot_i4_groups(w.as_ptr(), x.as_ptr(), full, out.as_mut_ptr()) };
    if out.len() > full {
        // Short tail group (fewer than 32 bytes): scalar.
        let b0 = full * (GROUP / 2);
        out[full] = scalar::dot_i4(&w[b0..], &x[2 * b0..]);
    }
}

fn dot_i3g64(w: &[u8], x: &[i8], out: &mut [i32]) {
    let groups = out.len();
    assert!(w.len() >= groups * I3_GROUP_BYTES && x.len() >= groups * GROUP);
    // SAFETY: avx2 detected; `w` holds `groups` 24-byte groups and `x` at
    // least `64 * groups` elements (asserted above); `out` has `groups`.
    unsafe { avx2::dot_i3_groups(w.as_ptr(), x.as_ptr(), groups, out.as_mut_ptr()) }
}
