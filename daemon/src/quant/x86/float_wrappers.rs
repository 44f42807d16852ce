//! The safe wrappers of the float and activation kernels (f32 dots and axpys, attention's
//! gathered and column forms, absolute maxima and int8 quantization, the bandwidth probe's
//! read): each asserts the lengths its kernel reads and calls it under the kernel sets'
//! invariant ("features detected", see the parent module). Kept apart from the integer tiles
//! the parent stamps out, which share nothing with these but the invariant.

use super::{avx2, avx2_attn, avx512, avx512_attn};

pub(super) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    // SAFETY: features detected (avx2+fma); both slices hold at least `n`.
    unsafe { avx2::dot_f32(a.as_ptr(), b.as_ptr(), n) }
}

pub(super) fn avx2_axpy_f32(acc: &mut [f32], c: f32, x: &[f32]) {
    let n = acc.len().min(x.len());
    // SAFETY: features detected (avx2+fma); both slices hold at least `n`.
    unsafe { avx2::axpy_f32(acc.as_mut_ptr(), c, x.as_ptr(), n) }
}

/// The safe wrappers of one build's four-query gathered attention kernels
/// (`dot_f32_gather4`, `axpy_f32_gather4` of `$m`, the features `$features` names): the
/// lengths checked once for every build ([`check_dot_gather4`], [`check_axpy_gather4`]).
macro_rules! gather4_wrappers {
    ($m:ident, $features:literal, $dot:ident, $axpy:ident) => {
        pub(super) fn $dot(
            qs: [&[f32]; 4],
            base: &[f32],
            stride: usize,
            keys: &[usize],
            outs: [&mut [f32]; 4],
        ) {
            let n = check_dot_gather4(&qs, base, stride, keys, &outs);
            // SAFETY: features detected (`$features`); each query holds `n` elements, every
            // row `key * stride .. + n` is inside `base` (checked above) and each output
            // holds one value per key (asserted).
            unsafe {
                $m::dot_f32_gather4(
                    qs.map(|q| q.as_ptr()),
                    n,
                    base.as_ptr(),
                    stride,
                    keys,
                    outs.map(|o| o.as_mut_ptr()),
                )
            }
        }

        pub(super) fn $axpy(
            accs: [&mut [f32]; 4],
            coefs: [&[f32]; 4],
            base: &[f32],
            stride: usize,
            keys: &[usize],
        ) {
            let n = check_axpy_gather4(&accs, &coefs, base, stride, keys);
            // SAFETY: features detected (`$features`); each accumulator holds `n <= 64`
            // elements, every row `key * stride .. + n` is inside `base` (checked above) and
            // each `coefs[h]` holds one value per key (asserted).
            unsafe {
                $m::axpy_f32_gather4(
                    accs.map(|a| a.as_mut_ptr()),
                    n,
                    coefs.map(|c| c.as_ptr()),
                    base.as_ptr(),
                    stride,
                    keys,
                )
            }
        }
    };
}

gather4_wrappers!(
    avx2_attn,
    "avx2+fma",
    avx2_dot_f32_gather4,
    avx2_axpy_f32_gather4
);
gather4_wrappers!(
    avx512_attn,
    "avx512f, avx512vl",
    avx512_dot_f32_gather4,
    avx512_axpy_f32_gather4
);

pub(super) fn avx2_axpy_i8(acc: &mut [f32], c: f32, x: &[i8]) {
    let n = acc.len().min(x.len());
    // SAFETY: features detected (avx2+fma); both slices hold at least `n`.
    unsafe { avx2::axpy_i8(acc.as_mut_ptr(), c, x.as_ptr(), n) }
}

pub(super) fn avx512_axpy_i8(acc: &mut [f32], c: f32, x: &[i8]) {
    let n = acc.len().min(x.len());
    // SAFETY: features detected (avx512f, bw, vl); both slices hold at least
    // `n`.
    unsafe { avx512::axpy_i8(acc.as_mut_ptr(), c, x.as_ptr(), n) }
}

pub(super) fn avx512_dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    // SAFETY: features detected (avx512f); both slices hold at least `n`.
    unsafe { avx512::dot_f32(a.as_ptr(), b.as_ptr(), n) }
}

pub(super) fn avx512_axpy_f32(acc: &mut [f32], c: f32, x: &[f32]) {
    let n = acc.len().min(x.len());
    // SAFETY: features detected (avx512f); both slices hold at least `n`.
    unsafe { avx512::axpy_f32(acc.as_mut_ptr(), c, x.as_ptr(), n) }
}

pub(super) fn avx512_dot_f32_gather(
    q: &[f32],
    base: &[f32],
    stride: usize,
    keys: &[usize],
    out: &mut [f32],
) {
    crate::quant::kernel_set::check_gather(q.len(), base.len(), stride, keys);
    assert!(out.len() >= keys.len());
    // SAFETY: features detected (avx512f); every row `key * stride .. + q.len()` is inside
    // `base` (checked above) and `out` holds one value per key.
    unsafe {
        avx512::dot_f32_gather(
            q.as_ptr(),
            q.len(),
            base.as_ptr(),
            stride,
            keys,
            out.as_mut_ptr(),
        )
    }
}

pub(super) fn avx512_dot_f32_cols(q: &[f32], kt: &[f32], ld: usize, out: &mut [f32]) {
    crate::quant::kernel_set::check_cols(q.len(), kt.len(), ld, out.len());
    // SAFETY: features detected (avx512f); the kernel reads `kt[e * ld + t]` for `e < q.len()`
    // and `t < out.len() <= ld` (masked loads touch no lane past `out.len()`), inside `kt`
    // (checked above), and writes `out[..out.len()]`.
    unsafe {
        avx512::dot_f32_cols(
            q.as_ptr(),
            q.len(),
            kt.as_ptr(),
            ld,
            out.len(),
            out.as_mut_ptr(),
        )
    }
}

pub(super) fn avx512_dot_f32_cols4(qs: [&[f32]; 4], kt: &[f32], ld: usize, outs: [&mut [f32]; 4]) {
    let (n, m) = (qs[0].len(), outs[0].len());
    assert!(qs.iter().all(|q| q.len() == n) && outs.iter().all(|o| o.len() == m));
    crate::quant::kernel_set::check_cols(n, kt.len(), ld, m);
    // SAFETY: features detected (avx512f); each query holds `n` elements, the kernel reads
    // `kt[e * ld + t]` for `e < n` and `t < m <= ld` (masked loads touch no lane past `m`),
    // inside `kt` (checked above), and writes `outs[h][..m]` (each of length `m`, asserted).
    unsafe {
        avx512_attn::dot_f32_cols4(
            qs.map(|q| q.as_ptr()),
            n,
            kt.as_ptr(),
            ld,
            m,
            outs.map(|o| o.as_mut_ptr()),
        )
    }
}

pub(super) fn avx512_axpy_f32_gather(
    acc: &mut [f32],
    coefs: &[f32],
    base: &[f32],
    stride: usize,
    keys: &[usize],
) {
    crate::quant::kernel_set::check_gather(acc.len(), base.len(), stride, keys);
    assert!(coefs.len() >= keys.len());
    // SAFETY: features detected (avx512f); every row `key * stride .. + acc.len()` is inside
    // `base` (checked above) and `coefs` holds one value per key.
    unsafe {
        avx512::axpy_f32_gather(
            acc.as_mut_ptr(),
            acc.len(),
            coefs.as_ptr(),
            base.as_ptr(),
            stride,
            keys,
        )
    }
}

pub(super) fn avx512_axpy_i8_rows(acc: &mut [f32], coefs: &[f32], rows: &[i8], stride: usize) {
    let (n, nrows) = (acc.len(), coefs.len());
    assert!(nrows == 0 || (stride >= n && (nrows - 1) * stride + n <= rows.len()));
    // SAFETY: features detected (avx512f, bw, vl); row `j < nrows` is `rows[j * stride..][..n]`,
    // inside `rows` (asserted), and `acc` holds `n`.
    unsafe {
        avx512::axpy_i8_rows(
            acc.as_mut_ptr(),
            n,
            coefs.as_ptr(),
            rows.as_ptr(),
            stride,
            nrows,
        )
    }
}

pub(super) fn avx2_amax(x: &[f32]) -> f32 {
    // SAFETY: features detected (avx2); `x` holds `x.len()`.
    unsafe { avx2::amax(x.as_ptr(), x.len()) }
}

pub(super) fn avx2_quant_i8(x: &[f32], scale: f32, q: &mut [i8]) {
    assert_eq!(x.len(), q.len());
    // SAFETY: features detected (avx2); both hold `x.len()` (asserted).
    unsafe { avx2::quant_i8(x.as_ptr(), scale, q.as_mut_ptr(), x.len()) }
}

pub(super) fn avx512_amax(x: &[f32]) -> f32 {
    // SAFETY: features detected (avx512f); `x` holds `x.len()`.
    unsafe { avx512::amax(x.as_ptr(), x.len()) }
}

pub(super) fn avx512_quant_i8(x: &[f32], scale: f32, q: &mut [i8]) {
    assert_eq!(x.len(), q.len());
    // SAFETY: features detected (avx512f); both hold `x.len()` (asserted).
    unsafe { avx512::quant_i8(x.as_ptr(), scale, q.as_mut_ptr(), x.len()) }
}

pub(super) fn avx2_read_sum(buf: &[u8]) -> u64 {
    // SAFETY: features detected (avx2); `buf` holds `buf.len()`.
    unsafe { avx2::read_sum(buf.as_ptr(), buf.len()) }
}

pub(super) fn avx512_read_sum(buf: &[u8]) -> u64 {
    // SAFETY: features detected (avx512f); `buf` holds `buf.len()`.
    unsafe { avx512::read_sum(buf.as_ptr(), buf.len()) }
}

/// The lengths both `dot_f32_gather4` kernels read: four queries of one length `n` (returned),
/// every key's row `key * stride .. + n` inside `base`, one output per key in each `outs`.
fn check_dot_gather4(
    qs: &[&[f32]; 4],
    base: &[f32],
    stride: usize,
    keys: &[usize],
    outs: &[&mut [f32]; 4],
) -> usize {
    let n = qs[0].len();
    assert!(qs.iter().all(|q| q.len() == n));
    assert!(outs.iter().all(|o| o.len() >= keys.len()));
    crate::quant::kernel_set::check_gather(n, base.len(), stride, keys);
    n
}

/// The lengths both `axpy_f32_gather4` kernels read: four accumulators of one length
/// `n <= 64` (returned), one coefficient per key in each `coefs`, every key's row inside `base`.
fn check_axpy_gather4(
    accs: &[&mut [f32]; 4],
    coefs: &[&[f32]; 4],
    base: &[f32],
    stride: usize,
    keys: &[usize],
) -> usize {
    let n = accs[0].len();
    assert!(n <= 64 && accs.iter().all(|a| a.len() == n));
    assert!(coefs.iter().all(|c| c.len() >= keys.len()));
    crate::quant::kernel_set::check_gather(n, base.len(), stride, keys);
    n
}
