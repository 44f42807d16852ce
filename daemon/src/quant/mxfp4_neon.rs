//! The MXFP4 dot with NEON: the reference's eight lanes as two four-lane accumulators (lanes
//! 0..4 and 4..8), each quad of eight values decoded through the e2m1 table and multiplied by
//! its scale and then by `x` (no fused multiply-add), so the result is
//! [`super::mxfp4::dot_row`]'s bit for bit.

use std::arch::aarch64::*;

use super::mxfp4::{E2M1, GROUP, GROUP_BYTES};

/// [`super::mxfp4::dot_row`] over `x.len() / 32` groups. Panics (a caller's bug) when
/// `blocks` or `scales` is shorter than `x`.
pub fn dot(blocks: &[u8], scales: &[f32], x: &[f32]) -> f32 {
    let groups = x.len() / GROUP;
    assert!(blocks.len() >= groups * GROUP_BYTES && scales.len() >= groups);
    // SAFETY: NEON is part of every AArch64 CPU; `groups` groups of `blocks`, `scales` and
    // `x` are in bounds (checked above).
    unsafe { dot_raw(blocks.as_ptr(), scales.as_ptr(), x.as_ptr(), groups) }
}

#[target_feature(enable = "neon")]
unsafe fn dot_raw(b: *const u8, s: *const f32, x: *const f32, groups: usize) -> f32 {
    let mut lo = vdupq_n_f32(0.0);
    let mut hi = vdupq_n_f32(0.0);
    for g in 0..groups {
        let scale = vdupq_n_f32(*s.add(g));
        for q in 0..4 {
            let p = b.add(g * GROUP_BYTES + q * 4);
            let mut w = [0.0f32; 8];
            for (i, pair) in w.chunks_exact_mut(2).enumerate() {
                let byte = *p.add(i);
                pair[0] = E2M1[(byte & 0x0F) as usize];
                pair[1] = E2M1[(byte >> 4) as usize];
            }
            let xs = x.add(g * GROUP + q * 8);
            let a = vmulq_f32(vmulq_f32(vld1q_f32(w.as_ptr()), scale), vld1q_f32(xs));
            let c = vmulq_f32(
                vmulq_f32(vld1q_f32(w.as_ptr().add(4)), scale),
                vld1q_f32(xs.add(4)),
            );
            lo = vaddq_f32(lo, a);
            hi = vaddq_f32(hi, c);
        }
    }
    let mut l = [0.0f32; 8];
    vst1q_f32(l.as_mut_ptr(), lo);
    vst1q_f32(l.as_mut_ptr().add(4), hi);
    ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]))
}
