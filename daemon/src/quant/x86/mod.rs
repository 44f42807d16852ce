//! x86-64 SIMD kernels, selected at run time.
//!
//! The functions here are safe wrappers around `#[target_feature]` kernels.
//! They are private and only reachable through the [`KernelSet`]s returned
//! by [`avx2_kernels`] and [`avx512_kernels`], which are `Some` only when
//! every feature the set's kernels enable was detected on the running CPU;
//! that is the invariant every `unsafe` call below relies on ("features
//! detected").  The wrappers assert the slice lengths each kernel reads.

mod avx2;
mod avx512;

use super::act::ACT_BLOCK;
use super::pack::{GROUP, I3_GROUP_BYTES};
use super::KernelSet;

/// 64-byte aligned table for the int3 high-plane expansion.
#[repr(align(64))]
pub(crate) struct Table64(pub [u8; 64]);

/// Per 128-bit lane, position j takes high-plane byte j / 2.
pub(crate) static T3_HI_IDX: Table64 = Table64({
    let mut t = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        t[i] = ((i % 16) / 2) as u8;
        i += 1;
    }
    t
});

/// Lane f, position j: the bit of element 4j + f in its byte, 4(j%2) + f.
pub(crate) static T3_HI_BITS: Table64 = Table64({
    let mut t = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        let (f, j) = (i / 16, i % 16);
        t[i] = 1 << (4 * (j % 2) + f);
        i += 1;
    }
    t
});

/// The AVX2+FMA kernel set, if this CPU supports it.
pub(crate) fn avx2_kernels() -> Option<KernelSet> {
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        Some(KernelSet {
            name: "avx2",
            dot_f32,
            dot_i8: avx2_dot_i8,
            dot_u4: avx2_dot_u4,
            dot_i2,
            row_i4g64: avx2_row_i4g64,
            row_i3g64: avx2_row_i3g64,
        })
    } else {
        None
    }
}

/// The AVX-512 kernel set: `vnni` (F, BW, VL, VNNI) or `bw` (F, BW, VL);
/// both also need AVX2+FMA (the f32 and int2 kernels are the AVX2 ones).
pub(crate) fn avx512_kernels(vnni: bool) -> Option<KernelSet> {
    let base = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl");
    if !base {
        return None;
    }
    if vnni {
        is_x86_feature_detected!("avx512vnni").then_some(KernelSet {
            name: "avx512vnni",
            dot_f32,
            dot_i8: vnni_dot_i8,
            dot_u4: vnni_dot_u4,
            dot_i2,
            row_i4g64: vnni_row_i4g64,
            row_i3g64: vnni_row_i3g64,
        })
    } else {
        Some(KernelSet {
            name: "avx512bw",
            dot_f32,
            dot_i8: bw_dot_i8,
            dot_u4: bw_dot_u4,
            dot_i2,
            row_i4g64: bw_row_i4g64,
            row_i3g64: bw_row_i3g64,
        })
    }
}

fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    // SAFETY: features detected (avx2+fma); both slices hold at least `n`.
    unsafe { avx2::dot_f32(a.as_ptr(), b.as_ptr(), n) }
}

fn dot_i2(w: &[u8], x: &[i8]) -> i32 {
    assert!(x.len() >= 4 * w.len());
    // SAFETY: features detected (avx2); `x` holds `4 * w.len()` (asserted).
    unsafe { avx2::dot_i2(w.as_ptr(), x.as_ptr(), w.len()) }
}

/// Length checks shared by the grouped kernels: `x` padded to whole
/// activation blocks, one sum and one scale per group.
fn check_grouped(x: &[i8], xg: &[i32], s: &[f32], elems: usize) {
    let groups = s.len();
    assert!(xg.len() >= groups, "group sums shorter than scales");
    assert!(x.len() >= elems.div_ceil(ACT_BLOCK) * ACT_BLOCK);
}

/// Stamp out the safe wrappers of one kernel module.
macro_rules! wrappers {
    ($m:path, $dot_i8:ident, $dot_u4:ident, $row_i4g64:ident, $row_i3g64:ident) => {
        fn $dot_i8(w: &[i8], x: &[i8]) -> i32 {
            assert!(x.len() >= w.len());
            use $m as k;
            // SAFETY: features detected; `x` holds `w.len()` (asserted).
            unsafe { k::dot_i8(w.as_ptr(), x.as_ptr(), w.len()) }
        }

        fn $dot_u4(w: &[u8], x: &[i8]) -> i32 {
            assert!(x.len() >= w.len().div_ceil(64) * ACT_BLOCK);
            use $m as k;
            // SAFETY: features detected; `x` holds the whole split-layout
            // blocks the `w.len()` bytes meet (asserted).
            unsafe { k::dot_u4(w.as_ptr(), x.as_ptr(), w.len()) }
        }

        fn $row_i4g64(w: &[u8], x: &[i8], xg: &[i32], s: &[f32]) -> f32 {
            assert_eq!(w.len().div_ceil(GROUP / 2), s.len());
            check_grouped(x, xg, s, 2 * w.len());
            use $m as k;
            // SAFETY: features detected; `w` is a whole row of `s.len()`
            // groups, `x` covers its blocks, `xg` and `s` one per group.
            unsafe {
                k::row_i4g64(
                    w.as_ptr(),
                    w.len(),
                    x.as_ptr(),
                    xg.as_ptr(),
                    s.as_ptr(),
                    s.len(),
                )
            }
        }

        fn $row_i3g64(w: &[u8], x: &[i8], xg: &[i32], s: &[f32]) -> f32 {
            assert!(w.len() >= s.len() * I3_GROUP_BYTES);
            check_grouped(x, xg, s, s.len() * GROUP);
            use $m as k;
            // SAFETY: features detected; `w` holds `s.len()` 24-byte groups,
            // `x` 64 per group, `xg` and `s` one per group (asserted).
            unsafe { k::row_i3g64(w.as_ptr(), x.as_ptr(), xg.as_ptr(), s.as_ptr(), s.len()) }
        }
    };
}

wrappers!(
    avx2,
    avx2_dot_i8,
    avx2_dot_u4,
    avx2_row_i4g64,
    avx2_row_i3g64
);
wrappers!(
    avx512::vnni,
    vnni_dot_i8,
    vnni_dot_u4,
    vnni_row_i4g64,
    vnni_row_i3g64
);
wrappers!(avx512::bw, bw_dot_i8, bw_dot_u4, bw_row_i4g64, bw_row_i3g64);
