//! `f32::exp` eight lanes at a time, bit for bit with glibc's `expf` in the build it picks on
//! CPUs with FMA (`__expf_fma`, glibc 2.27 on): the argument goes to double, `x / ln 2` is
//! split into a multiple of 1/32 (a 32-entry table of `2^(i/32)` and an exponent shift) and a
//! remainder `r`, `2^r` is a degree-3 polynomial in `r`, and the product is rounded once to
//! f32. The same double operations (the same fused multiply-adds) in the same order give the
//! same bits; lanes outside the fast path (|x| >= 88, inf, NaN) take `f32::exp` itself.
//! [`crate::quant::expf`] checks the agreement on the running machine before using this.
//! Beside it, a softmax's other passes sixteen lanes at a time (the scale and maximum, the
//! division by the sum), exact operations whose bits need no such check.

use std::arch::x86_64::*;

use super::avx512::mask16;

/// `bits(2^(i/32)) - (i << 47)`: the exponent bits `ki << 47` adds back (glibc's table).
const TAB: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];
/// 32 / ln 2.
const INV_LN2_N: u64 = 0x40471547652b82fe;
/// 0x1.8p52: adding it rounds to an integer held in the low mantissa bits.
const SHIFT: u64 = 0x4338000000000000;
/// The polynomial's coefficients, scaled for a remainder in units of 1/32.
const C0: u64 = 0x3ebc6af84b912394;
const C1: u64 = 0x3f2ebfce50fac4f3;
const C2: u64 = 0x3f962e42ff0c52d6;
/// `(bits >> 20) & 0x7ff` above this (|x| >= 88, inf, NaN) leaves the fast path.
const FAST_TOP: i32 = 0x42a;

/// `f32::exp` of eight lanes: the fast path's steps, and `f32::exp` itself for the lanes that
/// leave it.
///
/// # Safety
/// The CPU must have AVX-512F, AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn exp8(x: __m256) -> __m256 {
    let top = _mm256_and_si256(
        _mm256_srli_epi32::<20>(_mm256_castps_si256(x)),
        _mm256_set1_epi32(0x7ff),
    );
    let bad = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(
        top,
        _mm256_set1_epi32(FAST_TOP),
    )));
    let pd = |b: u64| _mm512_set1_pd(f64::from_bits(b));
    let xd = _mm512_cvtps_pd(x);
    let (inv, shift) = (pd(INV_LN2_N), pd(SHIFT));
    let z = _mm512_fmadd_pd(inv, xd, shift);
    let ki = _mm512_castpd_si512(z);
    let kd = _mm512_sub_pd(z, shift);
    let r = _mm512_fmsub_pd(inv, xd, kd);
    let t = |i: usize| _mm512_loadu_si512(TAB.as_ptr().add(i) as *const _);
    // Entries 0-15 and 16-31 (index bits 0-3 within each pair of registers), then bit 4.
    let lo = _mm512_permutex2var_epi64(t(0), ki, t(8));
    let hi = _mm512_permutex2var_epi64(t(16), ki, t(24));
    let upper = _mm512_test_epi64_mask(ki, _mm512_set1_epi64(16));
    let tab = _mm512_mask_blend_epi64(upper, lo, hi);
    let s = _mm512_castsi512_pd(_mm512_add_epi64(tab, _mm512_slli_epi64::<47>(ki)));
    let p0 = _mm512_fmadd_pd(r, pd(C0), pd(C1));
    let r2 = _mm512_mul_pd(r, r);
    let y = _mm512_fmadd_pd(r, pd(C2), _mm512_set1_pd(1.0));
    let y = _mm512_fmadd_pd(p0, r2, y);
    let y = _mm512_cvtpd_ps(_mm512_mul_pd(y, s));
    if bad == 0 {
        return y;
    }
    let (mut lanes, mut args) = ([0f32; 8], [0f32; 8]);
    _mm256_storeu_ps(lanes.as_mut_ptr(), y);
    _mm256_storeu_ps(args.as_mut_ptr(), x);
    for (l, (o, a)) in lanes.iter_mut().zip(args).enumerate() {
        if bad & (1 << l) != 0 {
            *o = a.exp();
        }
    }
    _mm256_loadu_ps(lanes.as_ptr())
}

/// `x[i] = (x[i] - shift).exp()` for every `i`, the subtraction in f32 as written.
///
/// # Safety
/// The CPU must have AVX-512F, AVX2 and FMA.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(in super::super) unsafe fn exp_shifted(x: &mut [f32], shift: f32) {
    let m = _mm256_set1_ps(shift);
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        let v = _mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), m);
        _mm256_storeu_ps(c.as_mut_ptr(), exp8(v));
    }
    // The last few through the same eight lanes, padded with `shift` (an argument of 0, on
    // the fast path): one scalar `f32::exp` call each cost as much as a whole vector.
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let mut lanes = [shift; 8];
        lanes[..rest.len()].copy_from_slice(rest);
        let v = _mm256_sub_ps(_mm256_loadu_ps(lanes.as_ptr()), m);
        _mm256_storeu_ps(lanes.as_mut_ptr(), exp8(v));
        rest.copy_from_slice(&lanes[..rest.len()]);
    }
}

/// `x[i] *= scale` (where given), then the largest value of `x`, sixteen lanes at a time:
/// NaNs skipped as `f32::max` skips them (`vmaxps` returns its second operand, the running
/// maximum, when the first is a NaN), so only a tie of +0 and -0 may come out with the other
/// sign than a scalar fold's (`model::ops::softmax_rows` says why a softmax does not see it).
///
/// # Safety
/// The CPU must have AVX-512F.
#[target_feature(enable = "avx512f")]
pub(in super::super) unsafe fn scale_max(x: &mut [f32], scale: Option<f32>) -> f32 {
    let (p, n) = (x.as_mut_ptr(), x.len());
    let mut m = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut i = 0;
    match scale {
        Some(s) => {
            let s = _mm512_set1_ps(s);
            while i < n {
                let k = mask16(n - i);
                let v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, p.add(i)), s);
                _mm512_mask_storeu_ps(p.add(i), k, v);
                m = _mm512_mask_max_ps(m, k, v, m);
                i += 16;
            }
        }
        None => {
            while i < n {
                let k = mask16(n - i);
                m = _mm512_mask_max_ps(m, k, _mm512_maskz_loadu_ps(k, p.add(i)), m);
                i += 16;
            }
        }
    }
    // No lane holds a NaN: the order of the last sixteen does not matter.
    _mm512_reduce_max_ps(m)
}

/// `x[i] /= d` for every `i`, sixteen lanes at a time (the same IEEE quotients).
///
/// # Safety
/// The CPU must have AVX-512F.
#[target_feature(enable = "avx512f")]
pub(in super::super) unsafe fn div_by(x: &mut [f32], d: f32) {
    let (p, n) = (x.as_mut_ptr(), x.len());
    let d = _mm512_set1_ps(d);
    let mut i = 0;
    while i < n {
        let k = mask16(n - i);
        let v = _mm512_div_ps(_mm512_maskz_loadu_ps(k, p.add(i)), d);
        _mm512_mask_storeu_ps(p.add(i), k, v);
        i += 16;
    }
}

/// `out[i] = g[i] / (1 + (-g[i]).exp()) * u[i]` (SiLU of the gate times the up product), each
/// operation in f32 as written, for `i < n`. `out` may be `g` itself.
///
/// # Safety
/// The CPU must have AVX-512F, AVX2 and FMA; `g` and `u` must be valid for `n` reads and `out`
/// for `n` writes, and `out` may overlap `g` only exactly (the same element read, then
/// written), never `u`.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(in super::super) unsafe fn silu_mul(out: *mut f32, g: *const f32, u: *const f32, n: usize) {
    let one = _mm256_set1_ps(1.0);
    let sign = _mm256_set1_ps(-0.0);
    let mut i = 0;
    while i + 8 <= n {
        let gv = _mm256_loadu_ps(g.add(i));
        let e = exp8(_mm256_xor_ps(gv, sign));
        let y = _mm256_div_ps(gv, _mm256_add_ps(one, e));
        _mm256_storeu_ps(out.add(i), _mm256_mul_ps(y, _mm256_loadu_ps(u.add(i))));
        i += 8;
    }
    while i < n {
        *out.add(i) = super::super::expf::silu_times(*g.add(i), *u.add(i));
        i += 1;
    }
}
