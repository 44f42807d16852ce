//! `exp` over slices for attention's softmax and the SwiGLU of the MLPs, bit for bit the
//! scalar `f32::exp` each element would get: the softmax of a 1024-position prefill on the
//! medium model made 200 M calls, about a tenth of its time, one call at a time.
//!
//! Where the CPU has AVX-512 the elements go eight at a time through the same steps as glibc's
//! `expf` (see `x86/expf.rs`). Whether that reproduces this process's `f32::exp` (which libm,
//! which build of it) is checked once, on a spread of arguments over the whole float range;
//! if one differs, the scalar loop runs instead, so the bits never depend on the path taken.

use std::sync::OnceLock;

/// Whether the SIMD path runs (detected and agreeing; checked once).
pub fn simd_exp() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| available() && agrees())
}

#[cfg(target_arch = "x86_64")]
fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
}

#[cfg(not(target_arch = "x86_64"))]
fn available() -> bool {
    false
}

/// The SIMD path against `f32::exp` on 65 536 arguments spread over every float's bit
/// pattern, the region softmax lives in (`[-100, 0]`) and the fast path's edges.
fn agrees() -> bool {
    let mut args: Vec<f32> = (0..65_536u32)
        .map(|i| f32::from_bits(i.wrapping_mul(65_537)))
        .collect();
    args.extend((0..4096).map(|i| -100.0 * i as f32 / 4096.0));
    args.extend([
        87.9, 88.0, 88.7, 89.0, -87.9, -88.0, -103.9, -104.0, -0.0, 0.0,
    ]);
    args.extend([
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
    ]);
    let mut got = args.clone();
    simd_shifted(&mut got, 0.0);
    got.iter()
        .zip(&args)
        .all(|(g, a)| g.to_bits() == (a - 0.0).exp().to_bits())
}

fn simd_shifted(x: &mut [f32], shift: f32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: only called where `available()` held: AVX-512F, AVX2 and FMA were detected.
    unsafe {
        super::x86::expf::exp_shifted(x, shift)
    }
    #[cfg(not(target_arch = "x86_64"))]
    scalar_shifted(x, shift)
}

fn scalar_shifted(x: &mut [f32], shift: f32) {
    for v in x.iter_mut() {
        *v = (*v - shift).exp();
    }
}

/// `x[i] = (x[i] - shift).exp()`: softmax's numerators.
pub fn exp_shifted(x: &mut [f32], shift: f32) {
    if simd_exp() {
        simd_shifted(x, shift)
    } else {
        scalar_shifted(x, shift)
    }
}

/// `x[i] *= scale` where a scale is given (each product rounded as `*v *= scale` rounds it),
/// then the largest value of `x` (`f32::NEG_INFINITY` for none), NaNs skipped as `f32::max`
/// skips them; a tie of +0 and -0 may come out with either sign (a softmax's shift, where the
/// sign makes no difference: see `model::ops::softmax_rows`). A softmax's first pass.
pub fn scale_max(x: &mut [f32], scale: Option<f32>) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F detected just above.
        return unsafe { super::x86::expf::scale_max(x, scale) };
    }
    if let Some(s) = scale {
        for v in x.iter_mut() {
            *v *= s;
        }
    }
    x.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

/// `x[i] /= d` for every `i` (a softmax's last pass; IEEE quotients, the same bits on every
/// path).
pub fn div_by(x: &mut [f32], d: f32) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F detected just above.
        return unsafe { super::x86::expf::div_by(x, d) };
    }
    for v in x.iter_mut() {
        *v /= d;
    }
}

/// `g[i] = g[i] / (1 + (-g[i]).exp()) * u[i]` over the shorter length: SiLU of the gate
/// product times the up product, in place, each operation in f32 as written.
pub fn silu_mul(g: &mut [f32], u: &[f32]) {
    let n = g.len().min(u.len());
    #[cfg(target_arch = "x86_64")]
    if simd_exp() {
        let p = g.as_mut_ptr();
        // SAFETY: `simd_exp` holds only where AVX-512F, AVX2 and FMA were detected; `g` and
        // `u` hold `n` elements, `out` is exactly `g` and `u` is a distinct borrow.
        unsafe { super::x86::expf::silu_mul(p, p, u.as_ptr(), n) };
        return;
    }
    for (gv, &uv) in g[..n].iter_mut().zip(u) {
        *gv = silu_times(*gv, uv);
    }
}

/// As [`silu_mul`], into `out` (over the shortest of the three).
pub fn silu_mul_into(out: &mut [f32], g: &[f32], u: &[f32]) {
    let n = out.len().min(g.len()).min(u.len());
    #[cfg(target_arch = "x86_64")]
    if simd_exp() {
        // SAFETY: as in `silu_mul`; `out` is a `&mut` borrow, so it overlaps neither input.
        unsafe { super::x86::expf::silu_mul(out.as_mut_ptr(), g.as_ptr(), u.as_ptr(), n) };
        return;
    }
    for ((o, &gv), &uv) in out[..n].iter_mut().zip(g).zip(u) {
        *o = silu_times(gv, uv);
    }
}

/// `g / (1 + exp(-g)) * u`, one element: the operations every path above reproduces.
#[inline]
pub(super) fn silu_times(g: f32, u: f32) -> f32 {
    g / (1.0 + (-g).exp()) * u
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every 61st bit pattern (70 M arguments, all exponents and signs) and the softmax range
    /// densely: the slice functions give `f32::exp`'s bits, whichever path runs.
    #[test]
    fn slices_match_scalar_exp_bit_for_bit() {
        crate::elog!("SIMD exp in use: {}", simd_exp());
        let mut args: Vec<f32> = (0..u32::MAX / 61).map(|i| f32::from_bits(i * 61)).collect();
        args.extend((0..1 << 20).map(|i| -104.0 * i as f32 / (1 << 20) as f32));
        for chunk in args.chunks(1 << 16) {
            let mut got = chunk.to_vec();
            exp_shifted(&mut got, 0.5);
            for (g, a) in got.iter().zip(chunk) {
                let want = (a - 0.5).exp();
                assert_eq!(g.to_bits(), want.to_bits(), "exp({a:e} - 0.5)");
            }
            let mut g = chunk.to_vec();
            let u: Vec<f32> = chunk.iter().rev().copied().collect();
            let mut into = vec![0f32; chunk.len()];
            silu_mul_into(&mut into, chunk, &u);
            silu_mul(&mut g, &u);
            for (((got, &a), &b), &c) in g.iter().zip(chunk).zip(&u).zip(&into) {
                let want = a / (1.0 + (-a).exp()) * b;
                assert_eq!(got.to_bits(), want.to_bits(), "silu({a:e}) * {b:e}");
                assert_eq!(c.to_bits(), want.to_bits(), "silu({a:e}) * {b:e} into");
            }
        }
    }

    #[test]
    fn short_and_odd_lengths_take_the_tail_path() {
        for n in 0..20 {
            let mut x: Vec<f32> = (0..n).map(|i| -(i as f32) * 0.37).collect();
            let want: Vec<u32> = x.iter().map(|v| (v - 1.0f32).exp().to_bits()).collect();
            exp_shifted(&mut x, 1.0);
            assert_eq!(x.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want);
        }
    }

    /// The scale-and-maximum and the division passes give the scalar loops' bits (the maximum
    /// up to the sign of a zero tie) at every length around the sixteen lanes, with NaNs,
    /// infinities and signed zeros among the values, scaled and not.
    #[test]
    fn scale_max_and_div_by_match_the_scalar_loops() {
        let mut rng = crate::rng::XorShift64(0x5ca1_ab1e_0ddb_a11);
        for n in 0..70 {
            for case in 0..4 {
                let mut x: Vec<f32> = (0..n).map(|_| rng.unit_f32() * 40.0 - 20.0).collect();
                if n > 3 && case >= 1 {
                    x[n / 2] = f32::NAN;
                    x[n - 1] = if case == 2 { f32::INFINITY } else { -0.0 };
                    x[0] = f32::NAN;
                }
                if case == 3 {
                    x.iter_mut().for_each(|v| *v = f32::NAN);
                }
                for scale in [None, Some(0.088_388_35f32), Some(-3.0)] {
                    let mut want = x.clone();
                    if let Some(s) = scale {
                        want.iter_mut().for_each(|v| *v *= s);
                    }
                    let want_max = want.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let mut got = x.clone();
                    let got_max = scale_max(&mut got, scale);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "scaled values, {n} case {case}");
                    // Equal as floats: the same value, or +0 against -0.
                    assert!(
                        got_max == want_max || got_max.is_nan() && want_max.is_nan(),
                        "max of {n} case {case} {scale:?}: {got_max} vs {want_max}"
                    );
                    assert!(!got_max.is_nan(), "the maximum skips NaNs");
                    for d in [want_max, 3.0, 1e-40, f32::INFINITY] {
                        let mut q = got.clone();
                        div_by(&mut q, d);
                        let want: Vec<f32> = got.iter().map(|v| v / d).collect();
                        assert_eq!(bits(&q), bits(&want), "divided by {d}, {n} case {case}");
                    }
                }
            }
        }
    }

    /// Every f32 argument (4.3 G; about 20 s): `cargo test --release -- --ignored exp_every`.
    #[test]
    #[ignore]
    fn exp_every_float_matches_scalar() {
        let mut buf = vec![0f32; 1 << 16];
        for hi in 0..1u32 << 16 {
            for (i, b) in buf.iter_mut().enumerate() {
                *b = f32::from_bits(hi << 16 | i as u32);
            }
            let args = buf.clone();
            exp_shifted(&mut buf, 0.0);
            for (g, a) in buf.iter().zip(&args) {
                assert_eq!(g.to_bits(), (a - 0.0).exp().to_bits(), "exp({a:e})");
            }
        }
    }
}
