//! AVX-512 tiles of attention's two products over cached rows: scores (several queries
//! against the same gathered keys) and weighted sums of values (several accumulators over the
//! same gathered rows), each bit-identical to the one-pair kernels it stands for
//! ([`dot_f32`](super::avx512::dot_f32), [`axpy_f32`](super::avx512::axpy_f32)).
//!
//! # Safety (all functions)
//! As in `avx512.rs`: the caller has checked that the CPU has AVX-512F (and VL where a
//! function enables it) and that every pointer is valid for the elements stated on each
//! function.

use core::arch::x86_64::*;

use super::avx512::mask16;

/// [`dot_f32`](super::avx512::dot_f32) of four queries against the same gathered rows, four rows a pass: `out[h][i]
/// = dot_f32(q[h], base + keys[i] * stride)`, bit for bit.
///
/// `dot_f32` ends each dot with a horizontal sum of one vector, which costs as much as the
/// products at attention's head widths when done for one dot at a time. Here a pass keeps
/// `dot_f32`'s lane vector (its four chains added as it adds them) for each of its sixteen
/// query-row pairs, then reduces the sixteen together ([`reduce16`]), each lane through the
/// same additions as `_mm512_reduce_add_ps`. A last pass short of four rows repeats its last
/// row and stores only the rows it has. (AVX-512VL for the 128-bit masked stores: without it
/// they were calls, not instructions.)
#[target_feature(enable = "avx512f,avx512vl")]
pub(super) unsafe fn dot_f32_gather4(
    q: [*const f32; 4],
    n: usize,
    base: *const f32,
    stride: usize,
    keys: &[usize],
    out: [*mut f32; 4],
) {
    let mut o = 0;
    while o < keys.len() {
        let left = keys.len() - o;
        let rows: [*const f32; 4] =
            core::array::from_fn(|k| base.add(keys[o + k.min(left - 1)] * stride));
        // lanes[4 * row + query]: the order `reduce16` turns into one query per 128-bit block.
        let mut lanes = [_mm512_setzero_ps(); 16];
        for half in 0..2 {
            let two = [rows[2 * half], rows[2 * half + 1]];
            let s = pair_lanes_4x2(&q, &two, n);
            for (h, sh) in s.iter().enumerate() {
                for (k, &v) in sh.iter().enumerate() {
                    lanes[4 * (2 * half + k) + h] = v;
                }
            }
        }
        let sums = reduce16(&lanes);
        let m: __mmask8 = if left >= 4 { 0xF } else { (1 << left) - 1 };
        _mm_mask_storeu_ps(out[0].add(o), m, _mm512_extractf32x4_ps::<0>(sums));
        _mm_mask_storeu_ps(out[1].add(o), m, _mm512_extractf32x4_ps::<1>(sums));
        _mm_mask_storeu_ps(out[2].add(o), m, _mm512_extractf32x4_ps::<2>(sums));
        _mm_mask_storeu_ps(out[3].add(o), m, _mm512_extractf32x4_ps::<3>(sums));
        o += 4;
    }
}

/// `dot_f32`'s lane vector before its horizontal sum, for four queries by two rows of `n`:
/// chain `c` takes main-loop vectors `64 i + 16 c`, chain 0 then the masked tail, and the
/// chains are added `(c0 + c1) + (c2 + c3)`. Two chains at a time keep 24 accumulators live.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn pair_lanes_4x2(q: &[*const f32; 4], r: &[*const f32; 2], n: usize) -> [[__m512; 2]; 4] {
    let main = n / 64 * 64;
    let c0 = chain_4x2(q, r, 0, main, n);
    let c1 = chain_4x2(q, r, 1, main, n);
    let mut s = [[_mm512_setzero_ps(); 2]; 4];
    for h in 0..4 {
        for k in 0..2 {
            s[h][k] = _mm512_add_ps(c0[h][k], c1[h][k]);
        }
    }
    let c2 = chain_4x2(q, r, 2, main, n);
    let c3 = chain_4x2(q, r, 3, main, n);
    for h in 0..4 {
        for k in 0..2 {
            s[h][k] = _mm512_add_ps(s[h][k], _mm512_add_ps(c2[h][k], c3[h][k]));
        }
    }
    s
}

/// Chain `c` of `dot_f32` for four queries by two rows (`main` the length its main loop
/// covers, the tail in chain 0).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn chain_4x2(
    q: &[*const f32; 4],
    r: &[*const f32; 2],
    c: usize,
    main: usize,
    n: usize,
) -> [[__m512; 2]; 4] {
    let mut acc = [[_mm512_setzero_ps(); 2]; 4];
    let mut i = 16 * c;
    while i < main {
        let kv = [_mm512_loadu_ps(r[0].add(i)), _mm512_loadu_ps(r[1].add(i))];
        for (ah, &qh) in acc.iter_mut().zip(q) {
            let qv = _mm512_loadu_ps(qh.add(i));
            ah[0] = _mm512_fmadd_ps(qv, kv[0], ah[0]);
            ah[1] = _mm512_fmadd_ps(qv, kv[1], ah[1]);
        }
        i += 64;
    }
    if c == 0 {
        let mut i = main;
        while i < n {
            let m = mask16(n - i);
            let kv = [
                _mm512_maskz_loadu_ps(m, r[0].add(i)),
                _mm512_maskz_loadu_ps(m, r[1].add(i)),
            ];
            for (ah, &qh) in acc.iter_mut().zip(q) {
                let qv = _mm512_maskz_loadu_ps(m, qh.add(i));
                ah[0] = _mm512_fmadd_ps(qv, kv[0], ah[0]);
                ah[1] = _mm512_fmadd_ps(qv, kv[1], ah[1]);
            }
            i += 16;
        }
    }
    acc
}

/// The horizontal sums of sixteen vectors in one: lane `4 b + m` of the result is the sum of
/// `v[4 m + b]`, each lane taken through `_mm512_reduce_add_ps`'s additions with the same
/// operands in the same order (lanes `j + 8` onto `j`, then `j + 4` onto `j`, `j + 2` onto
/// `j`, the last two), two vectors' steps sharing each addition.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn reduce16(v: &[__m512; 16]) -> __m512 {
    // Halves: w[a] holds v[2a]'s eight sums, then v[2a + 1]'s.
    let w: [__m512; 8] = core::array::from_fn(|a| {
        let (x, y) = (v[2 * a], v[2 * a + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(x, y),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(x, y),
        )
    });
    // Quarters: z[c] holds the four sums of v[4c], v[4c + 1], v[4c + 2], v[4c + 3].
    let z: [__m512; 4] = core::array::from_fn(|c| {
        let (x, y) = (w[2 * c], w[2 * c + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
        )
    });
    // Pairs: block b of u[d] holds the two sums of v[8d + b], then of v[8d + 4 + b].
    let u: [__m512; 2] = core::array::from_fn(|d| {
        let (x, y) = (z[2 * d], z[2 * d + 1]);
        _mm512_add_ps(
            _mm512_shuffle_ps::<0b01_00_01_00>(x, y),
            _mm512_shuffle_ps::<0b11_10_11_10>(x, y),
        )
    });
    // The last two: block b holds the sums of v[b], v[4 + b], v[8 + b], v[12 + b].
    _mm512_add_ps(
        _mm512_shuffle_ps::<0b10_00_10_00>(u[0], u[1]),
        _mm512_shuffle_ps::<0b11_01_11_01>(u[0], u[1]),
    )
}

/// `axpy_f32_gather` for four accumulators of `n <= 64` elements at once, each with its own
/// coefficients over the same gathered rows (four attention heads summing one stripe of the
/// same cached values): each row's vectors are loaded once for the four. Every element sees
/// the same fused multiply-adds in the same key order as one `axpy_f32` a key, so the result
/// is bit-identical to that loop.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn axpy_f32_gather4(
    acc: [*mut f32; 4],
    n: usize,
    coefs: [*const f32; 4],
    base: *const f32,
    stride: usize,
    keys: &[usize],
) {
    // A constant vector count per block keeps the sixteen accumulators in registers (an
    // array indexed up to a run-time count would live on the stack).
    match n.div_ceil(16) {
        0 => {}
        1 => axpy4_block::<1>(acc, n, coefs, base, stride, keys),
        2 => axpy4_block::<2>(acc, n, coefs, base, stride, keys),
        3 => axpy4_block::<3>(acc, n, coefs, base, stride, keys),
        _ => axpy4_block::<4>(acc, n, coefs, base, stride, keys),
    }
}

/// [`axpy_f32_gather4`] of `n` elements, more than `16 * (NV - 1)` and at most `16 * NV`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn axpy4_block<const NV: usize>(
    acc: [*mut f32; 4],
    n: usize,
    coefs: [*const f32; 4],
    base: *const f32,
    stride: usize,
    keys: &[usize],
) {
    let m: [__mmask16; NV] = core::array::from_fn(|v| mask16(n - 16 * v));
    let mut a = [[_mm512_setzero_ps(); NV]; 4];
    for (ah, &p) in a.iter_mut().zip(&acc) {
        for (v, av) in ah.iter_mut().enumerate() {
            *av = _mm512_maskz_loadu_ps(m[v], p.add(16 * v));
        }
    }
    for (j, &t) in keys.iter().enumerate() {
        let row = base.add(t * stride);
        let mut x = [_mm512_setzero_ps(); NV];
        for (v, xv) in x.iter_mut().enumerate() {
            *xv = _mm512_maskz_loadu_ps(m[v], row.add(16 * v));
        }
        for (ah, &c) in a.iter_mut().zip(&coefs) {
            let cv = _mm512_set1_ps(*c.add(j));
            for (av, &xv) in ah.iter_mut().zip(&x) {
                *av = _mm512_fmadd_ps(cv, xv, *av);
            }
        }
    }
    for (ah, &p) in a.iter().zip(&acc) {
        for (v, av) in ah.iter().enumerate() {
            _mm512_mask_storeu_ps(p.add(16 * v), m[v], *av);
        }
    }
}

/// [`dot_f32_cols`](super::avx512::dot_f32_cols) of four queries against the same keys stored
/// by column (element `e` of key `t` at `kt[e * ld + t]`): `out[h][t] = dot_f32(q[h], key t)`
/// for `t < m`, bit for bit.
///
/// Sixteen keys fill a vector, so no pass ends in a horizontal sum (what [`dot_f32_gather4`]
/// spends most beside its products on), and each column of sixteen keys is loaded once for
/// the four queries. Lane `j` of `dot_f32`'s lane vector becomes a vector of its own: its four
/// chains (main-loop elements `64 i + 16 c + j`, chain 0 then the tail's `main + 16 i + j`)
/// for the four queries are sixteen accumulators, added `(c0 + c1) + (c2 + c3)` as `dot_f32`
/// adds its chains; the sixteen lanes then go through `_mm512_reduce_add_ps`'s tree (halves,
/// quarters, pairs, the last two). A tail element past `n` is skipped where `dot_f32` adds a
/// masked `+0`, which changes nothing: an accumulator that starts at `+0` is never `-0`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn dot_f32_cols4(
    q: [*const f32; 4],
    n: usize,
    kt: *const f32,
    ld: usize,
    m: usize,
    out: [*mut f32; 4],
) {
    let main = n / 64 * 64;
    let mut t = 0;
    while t < m {
        let k = mask16(m - t);
        let cols = kt.add(t);
        // lanes[h][j]: lane j of query h's lane vector, for sixteen keys.
        let mut lanes = [[_mm512_setzero_ps(); 16]; 4];
        for j in 0..16 {
            // acc[c][h]: chain c of query h.
            let mut acc = [[_mm512_setzero_ps(); 4]; 4];
            let mut i = 0;
            while i < main {
                for (c, ac) in acc.iter_mut().enumerate() {
                    let e = i + 16 * c + j;
                    let col = _mm512_maskz_loadu_ps(k, cols.add(e * ld));
                    for (a, &qh) in ac.iter_mut().zip(&q) {
                        *a = _mm512_fmadd_ps(_mm512_set1_ps(*qh.add(e)), col, *a);
                    }
                }
                i += 64;
            }
            while i + j < n {
                let e = i + j;
                let col = _mm512_maskz_loadu_ps(k, cols.add(e * ld));
                for (a, &qh) in acc[0].iter_mut().zip(&q) {
                    *a = _mm512_fmadd_ps(_mm512_set1_ps(*qh.add(e)), col, *a);
                }
                i += 16;
            }
            for (h, lh) in lanes.iter_mut().enumerate() {
                let (c0, c1, c2, c3) = (acc[0][h], acc[1][h], acc[2][h], acc[3][h]);
                lh[j] = _mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3));
            }
        }
        for (l, &o) in lanes.iter().zip(&out) {
            // `_mm512_reduce_add_ps`'s tree, lane by lane.
            let b: [__m512; 8] = core::array::from_fn(|j| _mm512_add_ps(l[j], l[j + 8]));
            let c: [__m512; 4] = core::array::from_fn(|j| _mm512_add_ps(b[j], b[j + 4]));
            let d = [_mm512_add_ps(c[0], c[2]), _mm512_add_ps(c[1], c[3])];
            _mm512_mask_storeu_ps(o.add(t), k, _mm512_add_ps(d[0], d[1]));
        }
        t += 16;
    }
}
