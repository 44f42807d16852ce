//! NEON dot products of Q8_0, Q4_0, Q4_K and Q6_K for the `neon` kernel set. They mirror
//! the portable references (`dot_q0.rs`, `dot.rs`) step by step: the same quants decoded from
//! the same bits, the same exact integer sums (only their order differs, which integers do
//! not see), and the same float operations in the same order, so each returns the
//! reference's bits. Q8_0 and Q4_0 add each block's exact sum into `dot_q0`'s eight sets.
//! Q4_K and Q6_K add their eight integer lanes into the block's total (`dot::K4Sums`,
//! `dot::q6_k`), lanes (element `n` of a block in lane `(n % 32) / 4`):
//! the sixteen products of half a run are added in neighbouring pairs and then pairs of
//! pairs, which leaves the run half's four lanes.
//!
//! Bounds: activations are in [-127, 127]; a 16-bit lane sums at most two Q8_0 products
//! (2 x 128 x 127 = 32512), two Q4_K ones (2 x 15 x 127) or two Q6_K ones (2 x 32 x 127).

use std::arch::aarch64::*;

use super::dot::{f16_at, scale_min_k4, K4Sums};
use super::dot_q0::{tree8, SETS};
use super::{DotFn, Q8Row};
use crate::gguf::GgmlType;

/// The NEON kernel of `ty`, where there is one (NEON is part of every AArch64 CPU).
pub(super) fn dot(ty: GgmlType) -> Option<DotFn> {
    use GgmlType::*;
    Some(match ty {
        Q8_0 => q8_0,
        Q4_0 => q4_0,
        Q4_K => q4_k,
        Q6_K => q6_k,
        _ => return None,
    })
}

/// 16 weight bytes at `p[off..off + 16]` (bounds checked).
#[inline]
fn ld_u8(p: &[u8], off: usize) -> uint8x16_t {
    let s = &p[off..off + 16];
    // SAFETY: `s` is 16 readable bytes; NEON is part of every AArch64 CPU.
    unsafe { vld1q_u8(s.as_ptr()) }
}

/// 16 activation quants at `p[off..off + 16]` (bounds checked).
#[inline]
fn ld_i8(p: &[i8], off: usize) -> int8x16_t {
    let s = &p[off..off + 16];
    // SAFETY: as `ld_u8`.
    unsafe { vld1q_s8(s.as_ptr()) }
}

/// The reference's four integer lanes of 16 elements: lane `k` sums elements `4k .. 4k + 4`
/// (products widened to i16, then pairs, then pairs of pairs).
#[inline]
fn lanes16(w: int8x16_t, x: int8x16_t) -> int32x4_t {
    // SAFETY: register-only NEON arithmetic; NEON is part of every AArch64 CPU.
    unsafe {
        let lo = vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(x)));
        let hi = vpaddlq_s16(vmull_high_s8(w, x));
        vpaddq_s32(lo, hi)
    }
}

/// The eight float sets of `dot_q0`.
struct Sets([f32; SETS]);

impl Sets {
    fn zero() -> Sets {
        Sets([0.0; SETS])
    }

    /// Block `ib`'s two 16-element halves `(w0, x0)` and `(w1, x1)`: their exact integer
    /// sum, scaled by `d` (a product, then a sum: no fused multiply-add, as the reference).
    #[inline]
    fn add(&mut self, ib: usize, d: f32, w: (int8x16_t, int8x16_t), x: (int8x16_t, int8x16_t)) {
        // SAFETY: register-only NEON arithmetic.
        let isum = unsafe { vaddvq_s32(vaddq_s32(lanes16(w.0, x.0), lanes16(w.1, x.1))) };
        self.0[ib % SETS] += d * isum as f32;
    }

    /// The sets reduced as `dot_q0::tree8`.
    fn fold(&self) -> f32 {
        tree8(&self.0)
    }
}

fn q8_0(w: &[u8], a: &Q8Row) -> f32 {
    let mut sets = Sets::zero();
    for (ib, b) in w.chunks_exact(34).enumerate() {
        // SAFETY: reinterpreting a register's bytes as signed.
        let q = unsafe {
            (
                vreinterpretq_s8_u8(ld_u8(b, 2)),
                vreinterpretq_s8_u8(ld_u8(b, 18)),
            )
        };
        let x = (ld_i8(a.qs, ib * 32), ld_i8(a.qs, ib * 32 + 16));
        sets.add(ib, f16_at(b, 0) * a.d[ib], q, x);
    }
    sets.fold()
}

/// 16 nibble bytes as quants: low nibbles (elements 0..16) and high (16..32), unsigned.
#[inline]
fn nibbles(p: &[u8], off: usize) -> (int8x16_t, int8x16_t) {
    let v = ld_u8(p, off);
    // SAFETY: register-only NEON arithmetic.
    unsafe {
        let lo = vandq_u8(v, vdupq_n_u8(0x0F));
        let hi = vshrq_n_u8::<4>(v);
        (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi))
    }
}

fn q4_0(w: &[u8], a: &Q8Row) -> f32 {
    let mut sets = Sets::zero();
    for (ib, b) in w.chunks_exact(18).enumerate() {
        let (lo, hi) = nibbles(b, 2);
        // SAFETY: register-only NEON arithmetic.
        let q = unsafe {
            let eight = vdupq_n_s8(8);
            (vsubq_s8(lo, eight), vsubq_s8(hi, eight))
        };
        let x = (ld_i8(a.qs, ib * 32), ld_i8(a.qs, ib * 32 + 16));
        sets.add(ib, f16_at(b, 0) * a.d[ib], q, x);
    }
    sets.fold()
}

/// The reference's eight integer lanes of a K-quant block, lanes 0..4 and 4..8.
#[derive(Clone, Copy)]
struct Lanes(int32x4_t, int32x4_t);

impl Lanes {
    fn zero() -> Lanes {
        // SAFETY: register-only NEON arithmetic.
        unsafe { Lanes(vdupq_n_s32(0), vdupq_n_s32(0)) }
    }

    /// `acc[lane] += scale * q[i] * x[i]` for half a 32-element run (`q`, `x` signed):
    /// elements `4m..4m + 4` into lane `m` of the first half's lanes 0..4 (`upper` false)
    /// or of the second half's lanes 4..8.
    #[inline]
    fn mac16(self, scale: i16, q: int8x16_t, x: int8x16_t, upper: bool) -> Lanes {
        // SAFETY: register-only NEON arithmetic.
        unsafe {
            let p = vpaddq_s16(
                vmull_s8(vget_low_s8(q), vget_low_s8(x)),
                vmull_high_s8(q, x),
            );
            let s = vpaddq_s32(
                vmull_n_s16(vget_low_s16(p), scale),
                vmull_high_n_s16(p, scale),
            );
            if upper {
                Lanes(self.0, vaddq_s32(self.1, s))
            } else {
                Lanes(vaddq_s32(self.0, s), self.1)
            }
        }
    }
}

fn q4_k(w: &[u8], a: &Q8Row) -> f32 {
    let mut sums = K4Sums::default();
    for (i, b) in w.chunks_exact(144).enumerate() {
        let scales = &b[4..16];
        let mut acc = Lanes::zero();
        // Bytes 32j..32j + 32 of the quants hold groups 2j (low nibbles) and 2j + 1 (high).
        for j in 0..4 {
            for h in 0..2 {
                let (lo, hi) = nibbles(b, 16 + 32 * j + 16 * h);
                for (g, q) in [(2 * j, lo), (2 * j + 1, hi)] {
                    let scale = scale_min_k4(scales, g).0 as i16;
                    acc = acc.mac16(scale, q, ld_i8(a.qs, i * 256 + g * 32 + 16 * h), h == 1);
                }
            }
        }
        // SAFETY: register-only NEON arithmetic.
        let isum = unsafe { vaddvq_s32(vaddq_s32(acc.0, acc.1)) };
        let mut msum = 0i32;
        for (j, &s) in a.bsums[i * 16..(i + 1) * 16].iter().enumerate() {
            msum += s as i32 * scale_min_k4(scales, j / 2).1 as i32;
        }
        sums.add(f16_at(b, 0), f16_at(b, 2), a.d[i], isum, msum);
    }
    sums.result()
}

fn q6_k(w: &[u8], a: &Q8Row) -> f32 {
    let mut sum = 0.0f32;
    for (i, b) in w.chunks_exact(210).enumerate() {
        let sc = &b[192..208];
        let mut acc = Lanes::zero();
        // Element n = 128 half + 32 c + t: the low nibble of ql[64 half + 32 (c % 2) + t]
        // (shifted by 4 for c >= 2) and bits 2c of qh[32 half + t], less 32.
        for half in 0..2 {
            for c in 0..4 {
                for t0 in [0, 16] {
                    let ql = ld_u8(b, half * 64 + (c % 2) * 32 + t0);
                    let qh = ld_u8(b, 128 + half * 32 + t0);
                    // SAFETY: register-only NEON arithmetic.
                    let q = unsafe {
                        let lo = if c < 2 {
                            vandq_u8(ql, vdupq_n_u8(0x0F))
                        } else {
                            vshrq_n_u8::<4>(ql)
                        };
                        let hi = vandq_u8(vshlq_u8(qh, vdupq_n_s8(-2 * c as i8)), vdupq_n_u8(3));
                        let q = vorrq_u8(lo, vshlq_n_u8::<4>(hi));
                        vsubq_s8(vreinterpretq_s8_u8(q), vdupq_n_s8(32))
                    };
                    let n = half * 128 + c * 32 + t0;
                    acc = acc.mac16(
                        sc[n / 16] as i8 as i16,
                        q,
                        ld_i8(a.qs, i * 256 + n),
                        t0 == 16,
                    );
                }
            }
        }
        // SAFETY: register-only NEON arithmetic.
        let isum = unsafe { vaddvq_s32(vaddq_s32(acc.0, acc.1)) };
        sum += (f16_at(b, 208) * a.d[i]) * isum as f32;
    }
    sum
}
