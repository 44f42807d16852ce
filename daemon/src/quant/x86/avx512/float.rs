//! The float kernels of the AVX-512 sets, one build for both (AVX-512F, BW/VL for the int8
//! rows): the dot and axpy every vector step uses, attention's gathered and column-stored
//! variants (bit-identical to one call per key), the axpy of int8 rows, `amax`, `quant_i8`
//! and the probe's `read_sum`. They share no code with the quantized kernels of the two
//! builds (`avx512.rs`), only the masked-tail helper [`mask16`], which the attention and
//! `expf` kernels use too.
//!
//! # Safety (all functions)
//! As `avx512.rs`'s: the features of each `target_feature` list detected at run time, the
//! pointers valid for the element counts stated on each function; tails are masked loads.

use core::arch::x86_64::*;

use super::super::{prefetch_ahead, PROBE_AHEAD};

/// `16` lanes of `n - i` remaining (all when 16 or more).
#[inline]
pub(in super::super) fn mask16(left: usize) -> __mmask16 {
    if left >= 16 {
        0xFFFF
    } else {
        (1u16 << left) - 1
    }
}

/// f32 dot of `n` elements: four chains of 16 fused products, the tail
/// masked into the first.
#[target_feature(enable = "avx512f")]
pub(in super::super) unsafe fn dot_f32(a: *const f32, b: *const f32, n: usize) -> f32 {
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    while i + 64 <= n {
        for (k, ak) in acc.iter_mut().enumerate() {
            let o = i + 16 * k;
            *ak = _mm512_fmadd_ps(_mm512_loadu_ps(a.add(o)), _mm512_loadu_ps(b.add(o)), *ak);
        }
        i += 64;
    }
    while i < n {
        let k = mask16(n - i);
        let (x, y) = (
            _mm512_maskz_loadu_ps(k, a.add(i)),
            _mm512_maskz_loadu_ps(k, b.add(i)),
        );
        acc[0] = _mm512_fmadd_ps(x, y, acc[0]);
        i += 16;
    }
    let s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    _mm512_reduce_add_ps(s)
}

/// [`dot_f32`] of `q` (`n` elements) against `m` keys stored by column: element `e` of key
/// `t` at `kt[e * ld + t]`, so sixteen consecutive keys fill one vector and a pass needs no
/// horizontal sum (the gathered kernels spend most of a short key on that).  Each vector
/// lane `j` of `dot_f32`'s accumulators becomes an accumulator of its own here, holding that
/// lane for sixteen keys at once: chain `c` takes elements `64 i + 16 c + j` of the main
/// loop, chain 0 then the tail's `main + 16 i + j`; the chains are added as `dot_f32` adds
/// them and the lanes as `_mm512_reduce_add_ps` does (halves, quarters, pairs, then the last
/// two), so `out[t]` is bit-identical to `dot_f32`.  (`dot_f32`'s masked-off tail lanes only
/// add `+0`, which changes nothing: an accumulator that starts at `+0` is never `-0`.)
#[target_feature(enable = "avx512f")]
pub(in super::super) unsafe fn dot_f32_cols(
    q: *const f32,
    n: usize,
    kt: *const f32,
    ld: usize,
    m: usize,
    out: *mut f32,
) {
    let mut t = 0;
    while t < m {
        let k = mask16(m - t);
        let lanes = if n < 64 {
            col_lanes_short(q, n, kt.add(t), ld, k)
        } else {
            col_lanes_long(q, n, kt.add(t), ld, k)
        };
        // `_mm512_reduce_add_ps`'s tree, lane by lane: halves, quarters, pairs, the last two.
        let b: [__m512; 8] = core::array::from_fn(|j| _mm512_add_ps(lanes[j], lanes[j + 8]));
        let c: [__m512; 4] = core::array::from_fn(|j| _mm512_add_ps(b[j], b[j + 4]));
        let d = [_mm512_add_ps(c[0], c[2]), _mm512_add_ps(c[1], c[3])];
        _mm512_mask_storeu_ps(out.add(t), k, _mm512_add_ps(d[0], d[1]));
        t += 16;
    }
}

/// `q[e] * kt[e * ld ..][..16] + acc` (the keys of mask `k` only).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn col_term(
    q: *const f32,
    kt: *const f32,
    ld: usize,
    k: __mmask16,
    e: usize,
    acc: __m512,
) -> __m512 {
    let col = _mm512_maskz_loadu_ps(k, kt.add(e * ld));
    _mm512_fmadd_ps(_mm512_set1_ps(*q.add(e)), col, acc)
}

/// `dot_f32`'s sixteen lane sums for sixteen keys when `n < 64`: no main loop, so lane `j` is
/// chain 0 alone, elements `j, j + 16, ..`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn col_lanes_short(
    q: *const f32,
    n: usize,
    kt: *const f32,
    ld: usize,
    k: __mmask16,
) -> [__m512; 16] {
    let mut l = [_mm512_setzero_ps(); 16];
    let mut i = 0;
    while i + 16 <= n {
        for (j, lj) in l.iter_mut().enumerate() {
            *lj = col_term(q, kt, ld, k, i + j, *lj);
        }
        i += 16;
    }
    for (j, lj) in l.iter_mut().enumerate() {
        if i + j < n {
            *lj = col_term(q, kt, ld, k, i + j, *lj);
        }
    }
    l
}

/// The same for `n >= 64`, four lanes at a time: lane `j`'s chain `c` takes main-loop
/// elements `64 i + 16 c + j`, chain 0 then the tail's `main + 16 i + j`, and the lane is
/// `(c0 + c1) + (c2 + c3)`, as `dot_f32` adds its chains.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn col_lanes_long(
    q: *const f32,
    n: usize,
    kt: *const f32,
    ld: usize,
    k: __mmask16,
) -> [__m512; 16] {
    let main = n / 64 * 64;
    let mut lanes = [_mm512_setzero_ps(); 16];
    for g in (0..16).step_by(4) {
        // acc[c][i]: chain c of lane g + i.
        let mut acc = [[_mm512_setzero_ps(); 4]; 4];
        let mut i = 0;
        while i < main {
            for (c, ac) in acc.iter_mut().enumerate() {
                for (jj, a) in ac.iter_mut().enumerate() {
                    *a = col_term(q, kt, ld, k, i + 16 * c + g + jj, *a);
                }
            }
            i += 64;
        }
        while i < n {
            for (jj, a) in acc[0].iter_mut().enumerate() {
                if i + g + jj < n {
                    *a = col_term(q, kt, ld, k, i + g + jj, *a);
                }
            }
            i += 16;
        }
        for jj in 0..4 {
            let (c0, c1) = (acc[0][jj], acc[1][jj]);
            let (c2, c3) = (acc[2][jj], acc[3][jj]);
            lanes[g + jj] = _mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3));
        }
    }
    lanes
}

/// [`dot_f32`] of `q` (`n` elements) against the rows at `base + keys[i] * stride`, four keys
/// per pass so each load of `q` serves four rows.  Every dot keeps [`dot_f32`]'s four chains,
/// tail and final additions, so `out[i]` is bit-identical to it.
#[target_feature(enable = "avx512f")]
pub(in super::super) unsafe fn dot_f32_gather(
    q: *const f32,
    n: usize,
    base: *const f32,
    stride: usize,
    keys: &[usize],
    out: *mut f32,
) {
    let mut quads = keys.chunks_exact(4);
    let mut o = 0;
    for quad in &mut quads {
        let rows = [0, 1, 2, 3].map(|r| base.add(quad[r] * stride));
        let mut acc = [[_mm512_setzero_ps(); 4]; 4];
        let mut i = 0;
        while i + 64 <= n {
            for k in 0..4 {
                let qv = _mm512_loadu_ps(q.add(i + 16 * k));
                for (ar, &row) in acc.iter_mut().zip(&rows) {
                    ar[k] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(row.add(i + 16 * k)), ar[k]);
                }
            }
            i += 64;
        }
        while i < n {
            let k = mask16(n - i);
            let qv = _mm512_maskz_loadu_ps(k, q.add(i));
            for (ar, &row) in acc.iter_mut().zip(&rows) {
                ar[0] = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(k, row.add(i)), ar[0]);
            }
            i += 16;
        }
        for ar in &acc {
            let s = _mm512_add_ps(_mm512_add_ps(ar[0], ar[1]), _mm512_add_ps(ar[2], ar[3]));
            *out.add(o) = _mm512_reduce_add_ps(s);
            o += 1;
        }
    }
    for &t in quads.remainder() {
        *out.add(o) = dot_f32(q, base.add(t * stride), n);
        o += 1;
    }
}

/// [`axpy_f32`] of every gathered row in key order (`acc += coefs[i] * row(keys[i])`), up to
/// 256 accumulator elements at a time held in registers across all the keys instead of
/// loaded and stored once per key.  Each element sees the same fused multiply-adds in the
/// same order whatever block it falls in, so the result is bit-identical to the per-key loop.
#[target_feature(enable = "avx512f")]
pub(in super::super) unsafe fn axpy_f32_gather(
    acc: *mut f32,
    n: usize,
    coefs: *const f32,
    base: *const f32,
    stride: usize,
    keys: &[usize],
) {
    let mut i = 0;
    while i + 256 <= n {
        axpy_gather_block::<16>(acc.add(i), 256, coefs, base.add(i), stride, keys);
        i += 256;
    }
    while n - i > 64 {
        axpy_gather_block::<4>(acc.add(i), 64, coefs, base.add(i), stride, keys);
        i += 64;
    }
    // The last at most four vectors (all of a short row: attention heads of 32), the final
    // one masked as `axpy_f32` masks it.  The vector count is a constant of each block so its
    // accumulators live in registers: an array indexed up to a run-time count lived on the
    // stack, and a store-to-load round trip per key cost more than the multiply-adds.
    let (a, len, b) = (acc.add(i), n - i, base.add(i));
    match len.div_ceil(16) {
        0 => {}
        1 => axpy_gather_block::<1>(a, len, coefs, b, stride, keys),
        2 => axpy_gather_block::<2>(a, len, coefs, b, stride, keys),
        3 => axpy_gather_block::<3>(a, len, coefs, b, stride, keys),
        _ => axpy_gather_block::<4>(a, len, coefs, b, stride, keys),
    }
}

/// [`axpy_f32_gather`] of `n` elements, more than `16 * (NV - 1)` and at most `16 * NV`,
/// with `NV` accumulator vectors.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn axpy_gather_block<const NV: usize>(
    acc: *mut f32,
    n: usize,
    coefs: *const f32,
    base: *const f32,
    stride: usize,
    keys: &[usize],
) {
    let m: [__mmask16; NV] = core::array::from_fn(|v| mask16(n - 16 * v));
    let mut a: [__m512; NV] =
        core::array::from_fn(|v| _mm512_maskz_loadu_ps(m[v], acc.add(16 * v)));
    for (j, &t) in keys.iter().enumerate() {
        let cv = _mm512_set1_ps(*coefs.add(j));
        let row = base.add(t * stride);
        for (v, av) in a.iter_mut().enumerate() {
            *av = _mm512_fmadd_ps(cv, _mm512_maskz_loadu_ps(m[v], row.add(16 * v)), *av);
        }
    }
    for (v, av) in a.iter().enumerate() {
        _mm512_mask_storeu_ps(acc.add(16 * v), m[v], *av);
    }
}

/// `acc[i] += c * x[i]` for `n` elements, fused, the tail masked.
#[target_feature(enable = "avx512f")]
pub(in super::super) unsafe fn axpy_f32(acc: *mut f32, c: f32, x: *const f32, n: usize) {
    let cv = _mm512_set1_ps(c);
    let mut i = 0;
    while i < n {
        let k = mask16(n - i);
        let a = _mm512_maskz_loadu_ps(k, acc.add(i));
        let v = _mm512_fmadd_ps(cv, _mm512_maskz_loadu_ps(k, x.add(i)), a);
        _mm512_mask_storeu_ps(acc.add(i), k, v);
        i += 16;
    }
}

/// `acc[i] += c * x[i]` for `n` int8 `x` (widened exactly), fused, the tail
/// masked.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(in super::super) unsafe fn axpy_i8(acc: *mut f32, c: f32, x: *const i8, n: usize) {
    let cv = _mm512_set1_ps(c);
    let mut i = 0;
    while i < n {
        let k = mask16(n - i);
        let b = _mm_maskz_loadu_epi8(k, x.add(i));
        let w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
        let a = _mm512_maskz_loadu_ps(k, acc.add(i));
        _mm512_mask_storeu_ps(acc.add(i), k, _mm512_fmadd_ps(cv, w, a));
        i += 16;
    }
}

/// [`axpy_i8`] of `nrows` int8 rows (`stride` apart) in order, `acc += coefs[j] * row_j`,
/// 256 accumulator elements at a time held in registers across the rows.  Each element sees
/// the same widening and fused multiply-adds in the same order: bit-identical to the loop.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(in super::super) unsafe fn axpy_i8_rows(
    acc: *mut f32,
    n: usize,
    coefs: *const f32,
    rows: *const i8,
    stride: usize,
    nrows: usize,
) {
    const V: usize = 16;
    let mut i = 0;
    while i + 16 * V <= n {
        let mut a = [_mm512_setzero_ps(); V];
        for (v, av) in a.iter_mut().enumerate() {
            *av = _mm512_loadu_ps(acc.add(i + 16 * v));
        }
        for j in 0..nrows {
            let cv = _mm512_set1_ps(*coefs.add(j));
            let row = rows.add(j * stride + i);
            for (v, av) in a.iter_mut().enumerate() {
                let b = _mm_loadu_si128(row.add(16 * v) as *const __m128i);
                let w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
                *av = _mm512_fmadd_ps(cv, w, *av);
            }
        }
        for (v, av) in a.iter().enumerate() {
            _mm512_storeu_ps(acc.add(i + 16 * v), *av);
        }
        i += 16 * V;
    }
    if i < n {
        for j in 0..nrows {
            axpy_i8(acc.add(i), *coefs.add(j), rows.add(j * stride + i), n - i);
        }
    }
}

/// Largest `|v|` of `n` f32 at `x` (NaN skipped, as `scalar::amax`; the
/// maximum does not depend on the order, so the result is the same).
#[target_feature(enable = "avx512f")]
pub(in super::super) unsafe fn amax(x: *const f32, n: usize) -> f32 {
    let mut m0 = _mm512_setzero_ps();
    let mut m1 = _mm512_setzero_ps();
    let mut i = 0;
    // `max_ps(a, b)` returns `b` when `a` is NaN: the running max is `b`.
    while i + 32 <= n {
        m0 = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x.add(i))), m0);
        m1 = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x.add(i + 16))), m1);
        i += 32;
    }
    while i < n {
        let k: __mmask16 = if n - i >= 16 {
            0xFFFF
        } else {
            (1u16 << (n - i)) - 1
        };
        m0 = _mm512_max_ps(_mm512_abs_ps(_mm512_maskz_loadu_ps(k, x.add(i))), m0);
        i += 16;
    }
    _mm512_reduce_max_ps(_mm512_max_ps(m0, m1))
}

/// Wrapping u64-lane sum of `n` bytes at `p` (as `scalar::read_sum`; the
/// order does not matter for a wrapping sum): four 64-byte loads in flight
/// per step, the widest this CPU has, each line asked for
/// [`PROBE_AHEAD`] bytes ahead as the decode tiles do.
#[target_feature(enable = "avx512f")]
pub(in super::super) unsafe fn read_sum(p: *const u8, n: usize) -> u64 {
    let mut a = [_mm512_setzero_si512(); 4];
    let mut i = 0;
    while i + 256 <= n {
        for (k, ak) in a.iter_mut().enumerate() {
            prefetch_ahead(p.add(i + 64 * k), PROBE_AHEAD);
            *ak = _mm512_add_epi64(*ak, _mm512_loadu_si512(p.add(i + 64 * k) as *const _));
        }
        i += 256;
    }
    let v = _mm512_add_epi64(_mm512_add_epi64(a[0], a[1]), _mm512_add_epi64(a[2], a[3]));
    let tail = std::slice::from_raw_parts(p.add(i), n - i);
    (_mm512_reduce_add_epi64(v) as u64).wrapping_add(crate::quant::scalar::read_sum(tail))
}

/// `n` f32 at `x` to int8 at `q`, natural order, as `scalar::quant_i8`:
/// the quotient is clamped to [-127, 127] in f32 (the same result as
/// clamping after rounding), converted with the default round-to-nearest-
/// even mode (`round_ties_even`), and NaN lanes give 0.
#[target_feature(enable = "avx512f")]
pub(in super::super) unsafe fn quant_i8(x: *const f32, scale: f32, q: *mut i8, n: usize) {
    let sc = _mm512_set1_ps(scale);
    let (lo, hi) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
    let mut i = 0;
    while i < n {
        let k: __mmask16 = if n - i >= 16 {
            0xFFFF
        } else {
            (1u16 << (n - i)) - 1
        };
        let v = _mm512_div_ps(_mm512_maskz_loadu_ps(k, x.add(i)), sc);
        let ord = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(v, v);
        let c = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
        let r = _mm512_maskz_cvtps_epi32(ord, c);
        _mm512_mask_cvtepi32_storeu_epi8(q.add(i) as *mut _, k, r);
        i += 16;
    }
}
