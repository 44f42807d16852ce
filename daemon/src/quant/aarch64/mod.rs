//! AArch64 SIMD kernels.
//!
//! NEON is mandatory on AArch64, so the set needs no run-time detection;
//! the `unsafe` calls below rely only on the length checks made here.  The
//! f32 and int2 kernels are the portable ones (LLVM vectorizes them with
//! NEON).

mod neon;

use super::act::ACT_BLOCK;
use super::pack::{GROUP, I3_GROUP_BYTES};
use super::{scalar, KernelSet};

/// The NEON kernel set.
pub(crate) static NEON: KernelSet = KernelSet {
    name: "neon",
    dot_f32: scalar::dot_f32,
    axpy_f32: scalar::axpy_f32,
    axpy_i8: scalar::axpy_i8,
    dot_i8,
    dot_u4,
    dot_i2: scalar::dot_i2,
    row_i4g64,
    row_i3g64,
    amax: scalar::amax,
    quant_i8: scalar::quant_i8,
    read_sum: scalar::read_sum,
    dot_i8_tile: None,
    dot_u4_tile: None,
    dot_i2_tile: None,
    row_i4g64_tile: None,
    row_i3g64_tile: None,
    dot_f32_gather: None,
    dot_f32_gather4: None,
    dot_f32_cols: None,
    dot_f32_cols4: None,
    axpy_f32_gather: None,
    axpy_f32_gather4: None,
    axpy_i8_rows: None,
    gemm_i8: None,
    gemm_u4: None,
    gemm_i4g64: None,
    gemm_i3g64: None,
};

fn dot_i8(w: &[i8], x: &[i8]) -> i32 {
    assert!(x.len() >= w.len());
    // SAFETY: NEON is baseline on aarch64; `x` holds `w.len()` (asserted).
    unsafe { neon::dot_i8(w.as_ptr(), x.as_ptr(), w.len()) }
}

fn dot_u4(w: &[u8], x: &[i8]) -> i32 {
    assert!(x.len() >= w.len().div_ceil(64) * ACT_BLOCK);
    // SAFETY: NEON is baseline; `x` covers the split-layout blocks of the
    // `w.len()` bytes (asserted).
    unsafe { neon::dot_u4(w.as_ptr(), x.as_ptr(), w.len()) }
}

fn row_i4g64(w: &[u8], x: &[i8], xg: &[i32], s: &[f32]) -> f32 {
    assert_eq!(w.len().div_ceil(GROUP / 2), s.len());
    assert!(xg.len() >= s.len());
    assert!(x.len() >= w.len().div_ceil(64) * ACT_BLOCK);
    // SAFETY: NEON is baseline; `w` is a whole row of `s.len()` groups and
    // `x` covers its blocks (asserted); `xg`, `s` are slices.
    unsafe { neon::row_i4g64(w.as_ptr(), w.len(), x.as_ptr(), xg, s) }
}

fn row_i3g64(w: &[u8], x: &[i8], xg: &[i32], s: &[f32]) -> f32 {
    assert!(w.len() >= s.len() * I3_GROUP_BYTES);
    assert!(xg.len() >= s.len());
    assert!(x.len() >= s.len() * GROUP);
    // SAFETY: NEON is baseline; `w` holds `s.len()` 24-byte groups and `x`
    // 64 elements per group (asserted).
    unsafe { neon::row_i3g64(w.as_ptr(), x.as_ptr(), xg, s) }
}
