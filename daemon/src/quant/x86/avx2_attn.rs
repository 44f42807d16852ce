//! AVX2 (+FMA) tiles of attention's two products over cached rows, as `avx512_attn.rs` has
//! them for AVX-512: several queries scored against the same gathered keys, several
//! accumulators summing the same gathered values, each bit-identical to the AVX2 one-pair
//! kernels ([`dot_f32`](super::avx2::dot_f32), [`axpy_f32`](super::avx2::axpy_f32)).
//!
//! # Safety (all functions)
//! As in `avx2.rs`: the caller has checked that the CPU has AVX2 and FMA and that every
//! pointer is valid for the elements stated on each function.

use core::arch::x86_64::*;

/// [`dot_f32`](super::avx2::dot_f32) of four queries against the same gathered rows: `out[h][i] = dot_f32(q[h],
/// base + keys[i] * stride)`, bit for bit. Two queries by four rows a pass keep `dot_f32`'s
/// lane vector (its four chains of eight lanes added as it adds them) for each of the eight
/// pairs, then reduce the eight together ([`reduce8`]) through `dot_f32`'s horizontal
/// additions, and add its scalar tail (`n % 8` elements) per pair as it does. A last pass
/// short of four rows repeats its last row and stores only the rows it has.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot_f32_gather4(
    q: [*const f32; 4],
    n: usize,
    base: *const f32,
    stride: usize,
    keys: &[usize],
    out: [*mut f32; 4],
) {
    let vec_end = n / 8 * 8;
    let mut o = 0;
    while o < keys.len() {
        let left = keys.len() - o;
        let rows: [*const f32; 4] =
            core::array::from_fn(|k| base.add(keys[o + k.min(left - 1)] * stride));
        for qp in [[q[0], q[1]], [q[2], q[3]]]
            .iter()
            .zip([[out[0], out[1]], [out[2], out[3]]])
        {
            let (two_q, two_out) = qp;
            // lanes[2 * row + query]: the order `reduce8` turns into one query per 128 bits.
            let mut lanes = [_mm256_setzero_ps(); 8];
            for half in 0..2 {
                let two = [rows[2 * half], rows[2 * half + 1]];
                let s = pair_lanes_2x2(two_q, &two, n);
                for (h, sh) in s.iter().enumerate() {
                    for (k, &v) in sh.iter().enumerate() {
                        lanes[2 * (2 * half + k) + h] = v;
                    }
                }
            }
            let mut sums = [0f32; 8];
            _mm256_storeu_ps(sums.as_mut_ptr(), reduce8(&lanes));
            for (h, &oh) in two_out.iter().enumerate() {
                for (k, &row) in rows.iter().enumerate().take(left.min(4)) {
                    let mut s = sums[4 * h + k];
                    for i in vec_end..n {
                        s += *two_q[h].add(i) * *row.add(i);
                    }
                    *oh.add(o + k) = s;
                }
            }
        }
        o += 4;
    }
}

/// `dot_f32`'s lane vector before its horizontal sum for two queries by two rows of `n`:
/// chain `c` takes main-loop vectors `32 i + 8 c`, chain 0 then the whole vectors after the
/// main loop, and the chains are added `(c0 + c1) + (c2 + c3)`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn pair_lanes_2x2(q: &[*const f32; 2], r: &[*const f32; 2], n: usize) -> [[__m256; 2]; 2] {
    let main = n / 32 * 32;
    let c0 = chain_2x2(q, r, 0, main, n);
    let c1 = chain_2x2(q, r, 1, main, n);
    let mut s = [[_mm256_setzero_ps(); 2]; 2];
    for h in 0..2 {
        for k in 0..2 {
            s[h][k] = _mm256_add_ps(c0[h][k], c1[h][k]);
        }
    }
    let c2 = chain_2x2(q, r, 2, main, n);
    let c3 = chain_2x2(q, r, 3, main, n);
    for h in 0..2 {
        for k in 0..2 {
            s[h][k] = _mm256_add_ps(s[h][k], _mm256_add_ps(c2[h][k], c3[h][k]));
        }
    }
    s
}

/// Chain `c` of `dot_f32` for two queries by two rows (`main` the length its main loop
/// covers; chain 0 also takes the whole vectors after it).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn chain_2x2(
    q: &[*const f32; 2],
    r: &[*const f32; 2],
    c: usize,
    main: usize,
    n: usize,
) -> [[__m256; 2]; 2] {
    let mut acc = [[_mm256_setzero_ps(); 2]; 2];
    let step = |acc: &mut [[__m256; 2]; 2], i: usize| {
        let kv = [_mm256_loadu_ps(r[0].add(i)), _mm256_loadu_ps(r[1].add(i))];
        for (ah, &qh) in acc.iter_mut().zip(q) {
            let qv = _mm256_loadu_ps(qh.add(i));
            ah[0] = _mm256_fmadd_ps(qv, kv[0], ah[0]);
            ah[1] = _mm256_fmadd_ps(qv, kv[1], ah[1]);
        }
    };
    let mut i = 8 * c;
    while i < main {
        step(&mut acc, i);
        i += 32;
    }
    if c == 0 {
        let mut i = main;
        while i + 8 <= n {
            step(&mut acc, i);
            i += 8;
        }
    }
    acc
}

/// The horizontal sums of eight vectors in one: lane `4 b + m` of the result is the sum of
/// `v[2 m + b]`, each lane taken through `dot_f32`'s horizontal additions (`hsum_f32`: lanes
/// `j + 4` onto `j`, then `j + 2` onto `j`, the last two) with the same operands in the same
/// order, two vectors' steps sharing each addition.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn reduce8(v: &[__m256; 8]) -> __m256 {
    // Halves: w[a] holds v[2a]'s four sums, then v[2a + 1]'s.
    let w: [__m256; 4] = core::array::from_fn(|a| {
        let (x, y) = (v[2 * a], v[2 * a + 1]);
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(x, y),
            _mm256_permute2f128_ps::<0x31>(x, y),
        )
    });
    // Pairs: 128-bit block b of z[c] holds the two sums of v[4c + b], then of v[4c + 2 + b].
    let z: [__m256; 2] = core::array::from_fn(|c| {
        let (x, y) = (w[2 * c], w[2 * c + 1]);
        _mm256_add_ps(
            _mm256_shuffle_ps::<0b01_00_01_00>(x, y),
            _mm256_shuffle_ps::<0b11_10_11_10>(x, y),
        )
    });
    // The last two: block b holds the sums of v[b], v[2 + b], v[4 + b], v[6 + b].
    _mm256_add_ps(
        _mm256_shuffle_ps::<0b10_00_10_00>(z[0], z[1]),
        _mm256_shuffle_ps::<0b11_01_11_01>(z[0], z[1]),
    )
}

/// `acc[h] += coefs[h][i] * row(keys[i])` for four accumulators of `n` elements over the same
/// gathered rows, keys in order: one `axpy_f32` a key and accumulator, bit for bit (fused
/// multiply-adds; the last `n % 8` elements with `mul_add`, as `axpy_f32` takes them). Sixteen
/// elements of the four at a time stay in registers across the keys.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn axpy_f32_gather4(
    acc: [*mut f32; 4],
    n: usize,
    coefs: [*const f32; 4],
    base: *const f32,
    stride: usize,
    keys: &[usize],
) {
    let mut e = 0;
    while e + 16 <= n {
        axpy4_vectors::<2>(acc, e, coefs, base, stride, keys);
        e += 16;
    }
    if e + 8 <= n {
        axpy4_vectors::<1>(acc, e, coefs, base, stride, keys);
        e += 8;
    }
    if e < n {
        for (&a, &c) in acc.iter().zip(&coefs) {
            for (j, &t) in keys.iter().enumerate() {
                let row = base.add(t * stride);
                for i in e..n {
                    *a.add(i) = (*c.add(j)).mul_add(*row.add(i), *a.add(i));
                }
            }
        }
    }
}

/// Elements `e .. e + 8 * NV` of [`axpy_f32_gather4`].
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn axpy4_vectors<const NV: usize>(
    acc: [*mut f32; 4],
    e: usize,
    coefs: [*const f32; 4],
    base: *const f32,
    stride: usize,
    keys: &[usize],
) {
    let mut a = [[_mm256_setzero_ps(); NV]; 4];
    for (ah, &p) in a.iter_mut().zip(&acc) {
        for (v, av) in ah.iter_mut().enumerate() {
            *av = _mm256_loadu_ps(p.add(e + 8 * v));
        }
    }
    for (j, &t) in keys.iter().enumerate() {
        let row = base.add(t * stride + e);
        let mut x = [_mm256_setzero_ps(); NV];
        for (v, xv) in x.iter_mut().enumerate() {
            *xv = _mm256_loadu_ps(row.add(8 * v));
        }
        for (ah, &c) in a.iter_mut().zip(&coefs) {
            let cv = _mm256_set1_ps(*c.add(j));
            for (av, &xv) in ah.iter_mut().zip(&x) {
                *av = _mm256_fmadd_ps(cv, xv, *av);
            }
        }
    }
    for (ah, &p) in a.iter().zip(&acc) {
        for (v, av) in ah.iter().enumerate() {
            _mm256_storeu_ps(p.add(e + 8 * v), *av);
        }
    }
}
