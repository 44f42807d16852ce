//! AVX2 (+FMA) kernels.
//!
//! # Safety (all functions)
//! Callers must have verified at run time that the CPU supports AVX2 and FMA
//! (`is_x86_feature_detected!`), and that the pointers are valid for the
//! element counts stated on each function.  Loads are unaligned.
//!
//! Signed int8 x int8 products use the `maddubs` sign trick:
//! `maddubs(|w|, sign(x, w))`; `|w| <= 128` and `|x| <= 127` (activations
//! never hold -128), so each i16 pair sum is at most 2*128*127 = 32512 and
//! never saturates: the integer results are exact and equal the scalar ones.

use core::arch::x86_64::*;

use super::super::scalar::{combine16, split2_index, split4_index};
use super::{prefetch_ahead, PROBE_AHEAD, T3_HI_BITS, T3_HI_IDX};

/// Horizontal sum of 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// Horizontal sum of 8 f32 lanes (fixed order).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn hsum_f32(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s));
    _mm_cvtss_f32(s)
}

/// 32 signed bytes x 32 signed bytes -> 8 i32 partial sums (exact, see
/// module docs: `x` must not contain -128).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn mul_i8(w: __m256i, x: __m256i) -> __m256i {
    let p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    _mm256_madd_epi16(p16, _mm256_set1_epi16(1))
}

/// f32 dot of `n` elements.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot_f32(a: *const f32, b: *const f32, n: usize) -> f32 {
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut acc2 = _mm256_setzero_ps();
    let mut acc3 = _mm256_setzero_ps();
    let mut i = 0;
    while i + 32 <= n {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i)), _mm256_loadu_ps(b.add(i)), acc0);
        acc1 = _mm256_fmadd_ps(
            _mm256_loadu_ps(a.add(i + 8)),
            _mm256_loadu_ps(b.add(i + 8)),
            acc1,
        );
        acc2 = _mm256_fmadd_ps(
            _mm256_loadu_ps(a.add(i + 16)),
            _mm256_loadu_ps(b.add(i + 16)),
            acc2,
        );
        acc3 = _mm256_fmadd_ps(
            _mm256_loadu_ps(a.add(i + 24)),
            _mm256_loadu_ps(b.add(i + 24)),
            acc3,
        );
        i += 32;
    }
    while i + 8 <= n {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i)), _mm256_loadu_ps(b.add(i)), acc0);
        i += 8;
    }
    let mut s = hsum_f32(_mm256_add_ps(
        _mm256_add_ps(acc0, acc1),
        _mm256_add_ps(acc2, acc3),
    ));
    while i < n {
        s += *a.add(i) * *b.add(i);
        i += 1;
    }
    s
}

/// `acc[i] += c * x[i]` for `n` elements, fused.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn axpy_f32(acc: *mut f32, c: f32, x: *const f32, n: usize) {
    let cv = _mm256_set1_ps(c);
    let mut i = 0;
    while i + 8 <= n {
        let a = _mm256_loadu_ps(acc.add(i));
        _mm256_storeu_ps(
            acc.add(i),
            _mm256_fmadd_ps(cv, _mm256_loadu_ps(x.add(i)), a),
        );
        i += 8;
    }
    while i < n {
        *acc.add(i) = c.mul_add(*x.add(i), *acc.add(i));
        i += 1;
    }
}

/// `acc[i] += c * x[i]` for `n` int8 `x` (widened exactly), fused.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn axpy_i8(acc: *mut f32, c: f32, x: *const i8, n: usize) {
    let cv = _mm256_set1_ps(c);
    let mut i = 0;
    while i + 8 <= n {
        let w = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(x.add(i) as *const _)));
        let a = _mm256_loadu_ps(acc.add(i));
        _mm256_storeu_ps(acc.add(i), _mm256_fmadd_ps(cv, w, a));
        i += 8;
    }
    while i < n {
        *acc.add(i) = c.mul_add(*x.add(i) as f32, *acc.add(i));
        i += 1;
    }
}

/// int8 x int8 dot of `n` elements (`x` in [-127, 127]).
#[target_feature(enable = "avx2")]
pub(super) unsafe fn dot_i8(w: *const i8, x: *const i8, n: usize) -> i32 {
    let mut acc0 = _mm256_setzero_si256();
    let mut acc1 = _mm256_setzero_si256();
    let mut i = 0;
    while i + 64 <= n {
        let w0 = _mm256_loadu_si256(w.add(i) as *const __m256i);
        let x0 = _mm256_loadu_si256(x.add(i) as *const __m256i);
        let w1 = _mm256_loadu_si256(w.add(i + 32) as *const __m256i);
        let x1 = _mm256_loadu_si256(x.add(i + 32) as *const __m256i);
        acc0 = _mm256_add_epi32(acc0, mul_i8(w0, x0));
        acc1 = _mm256_add_epi32(acc1, mul_i8(w1, x1));
        i += 64;
    }
    while i + 32 <= n {
        let w0 = _mm256_loadu_si256(w.add(i) as *const __m256i);
        let x0 = _mm256_loadu_si256(x.add(i) as *const __m256i);
        acc0 = _mm256_add_epi32(acc0, mul_i8(w0, x0));
        i += 32;
    }
    let mut s = hsum_i32(_mm256_add_epi32(acc0, acc1));
    while i < n {
        s += *w.add(i) as i32 * *x.add(i) as i32;
        i += 1;
    }
    s
}

/// One int4 64-group: 32 packed bytes (`u` = stored nibbles) against its
/// split-layout activations (`xe` = the 32 even-element activations, the odd
/// ones 64 bytes later) -> 8 i32 partial sums of `u x`.  maddubs pairs are
/// at most 2*15*127 and the i16 sum of two at most 7620: exact.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn u4_group(w: *const u8, xe: *const i8) -> __m256i {
    let mask = _mm256_set1_epi8(0x0F);
    let b = _mm256_loadu_si256(w as *const __m256i);
    let lo = _mm256_and_si256(b, mask);
    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(b), mask);
    let p = _mm256_add_epi16(
        _mm256_maddubs_epi16(lo, _mm256_loadu_si256(xe as *const __m256i)),
        _mm256_maddubs_epi16(hi, _mm256_loadu_si256(xe.add(64) as *const __m256i)),
    );
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

/// Split-layout offset of int4 group `g`'s even activations.
#[inline]
fn split4_group(g: usize) -> usize {
    128 * (g / 2) + 32 * (g % 2)
}

/// `sum u x` of packed int4 bytes (`nb` of them) against split-layout
/// activations (at least `128 * ceil(nb / 64)` elements).
#[target_feature(enable = "avx2")]
pub(super) unsafe fn dot_u4(w: *const u8, x: *const i8, nb: usize) -> i32 {
    let mut acc = _mm256_setzero_si256();
    let mut g = 0;
    while 32 * g + 32 <= nb {
        acc = _mm256_add_epi32(acc, u4_group(w.add(32 * g), x.add(split4_group(g))));
        g += 1;
    }
    let mut s = hsum_i32(acc);
    for j in 32 * g..nb {
        let b = *w.add(j);
        s += (b & 15) as i32 * *x.add(split4_index(j, false)) as i32
            + (b >> 4) as i32 * *x.add(split4_index(j, true)) as i32;
    }
    s
}

/// Eight vectors of 8 i32 -> one vector of their 8 horizontal sums, in
/// order (exact integer adds).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn reduce8(v: &[__m256i; 8]) -> __m256i {
    let h01 = _mm256_hadd_epi32(v[0], v[1]);
    let h23 = _mm256_hadd_epi32(v[2], v[3]);
    let h45 = _mm256_hadd_epi32(v[4], v[5]);
    let h67 = _mm256_hadd_epi32(v[6], v[7]);
    let a = _mm256_hadd_epi32(h01, h23); // [v0..v3 low halves | v0..v3 high]
    let b = _mm256_hadd_epi32(h45, h67);
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(a, b),
        _mm256_permute2x128_si256::<0x31>(a, b),
    )
}

/// The shared float order (see `scalar.rs`): 8 group sums `gi` starting at
/// group `g` (a multiple of 8) go into the accumulator of lanes `g % 16`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn accumulate8(
    acc: &mut [__m256; 2],
    g: usize,
    gi: __m256i,
    off_shift: i32,
    xg: *const i32,
    s: *const f32,
) {
    let xs = _mm256_sll_epi32(
        _mm256_loadu_si256(xg.add(g) as *const __m256i),
        _mm_cvtsi32_si128(off_shift),
    );
    let p = _mm256_mul_ps(
        _mm256_cvtepi32_ps(_mm256_sub_epi32(gi, xs)),
        _mm256_loadu_ps(s.add(g)),
    );
    let a = &mut acc[(g / 8) % 2];
    *a = _mm256_add_ps(*a, p);
}

/// Finish a grouped row: lanes to an array, the tail groups `g0..` (their
/// exact sums in `tail`) in scalar, then the shared reduction.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn finish(
    acc: [__m256; 2],
    g0: usize,
    tail: &[i32],
    off: i32,
    xg: *const i32,
    s: *const f32,
) -> f32 {
    let mut a = [0f32; 16];
    _mm256_storeu_ps(a.as_mut_ptr(), acc[0]);
    _mm256_storeu_ps(a.as_mut_ptr().add(8), acc[1]);
    for (t, &u) in tail.iter().enumerate() {
        let g = g0 + t;
        let i = u.wrapping_sub(off.wrapping_mul(*xg.add(g)));
        a[g % 16] += i as f32 * *s.add(g);
    }
    combine16(&a)
}

/// int4-g64 row (`nb` packed bytes, `groups = ceil(2 nb / 64)` groups) in
/// the shared float order; split-layout `x`, group sums `xg` and scales `s`
/// with `groups` elements.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn row_i4g64(
    w: *const u8,
    nb: usize,
    x: *const i8,
    xg: *const i32,
    s: *const f32,
    groups: usize,
) -> f32 {
    let full = nb / 32;
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut g = 0;
    while g + 8 <= full {
        let mut v = [_mm256_setzero_si256(); 8];
        for (i, vi) in v.iter_mut().enumerate() {
            *vi = u4_group(w.add(32 * (g + i)), x.add(split4_group(g + i)));
        }
        accumulate8(&mut acc, g, reduce8(&v), 3, xg, s);
        g += 8;
    }
    // At most 8 tail groups (7 complete, one short).
    let mut tail = [0i32; 8];
    for (t, sum) in tail[..groups - g].iter_mut().enumerate() {
        let gt = g + t;
        *sum = if 32 * gt + 32 <= nb {
            hsum_i32(u4_group(w.add(32 * gt), x.add(split4_group(gt))))
        } else {
            let mut u = 0i32;
            for j in 32 * gt..nb {
                let b = *w.add(j);
                u += (b & 15) as i32 * *x.add(split4_index(j, false)) as i32
                    + (b >> 4) as i32 * *x.add(split4_index(j, true)) as i32;
            }
            u
        };
    }
    finish(acc, g, &tail[..groups - g], 8, xg, s)
}

/// `sum u x` of a packed int2 row of `nb` bytes (`u` the stored 2-bit
/// field) against split2-layout activations (`256 * ceil(nb / 64)`
/// elements): per 64 bytes, field `f` of the 32-byte halves meets the
/// contiguous activations at `64 f`.  `maddubs` pairs reach at most
/// `2 * 3 * 127`, four of them 3048: exact in i16.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn dot_i2(w: *const u8, x: *const i8, nb: usize) -> i32 {
    let m3 = _mm256_set1_epi8(3);
    let mut acc = _mm256_setzero_si256();
    let mut j = 0;
    while j + 64 <= nb {
        for h in 0..2 {
            let b = _mm256_loadu_si256(w.add(j + 32 * h) as *const __m256i);
            let xb = x.add(4 * j + 32 * h);
            let xf = |f: usize| _mm256_loadu_si256(xb.add(64 * f) as *const __m256i);
            let p = _mm256_add_epi16(
                _mm256_add_epi16(
                    _mm256_maddubs_epi16(_mm256_and_si256(b, m3), xf(0)),
                    _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16::<2>(b), m3), xf(1)),
                ),
                _mm256_add_epi16(
                    _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16::<4>(b), m3), xf(2)),
                    _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16::<6>(b), m3), xf(3)),
                ),
            );
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
        }
        j += 64;
    }
    let mut s = hsum_i32(acc);
    while j < nb {
        let b = *w.add(j);
        for f in 0..4 {
            s += ((b >> (2 * f)) & 3) as i32 * *x.add(split2_index(4 * j + f)) as i32;
        }
        j += 1;
    }
    s
}

/// One int3 group (24 bytes) against its 64 int3-layout activations -> 8
/// i32 partial sums of `u x` (`u = q + 4` in 0..=7; maddubs pairs at most
/// 2*7*127, two of them 3556: exact).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn u3_group(grp: *const u8, x: *const i8) -> __m256i {
    // Low plane byte j, field f (element 4j+f) -> layout position 16f + j:
    // broadcast the 16 bytes to both lanes and shift lane 1 by 2 (fields 0,
    // 1) or by 4 and 6 (fields 2, 3); masking keeps each byte's own bits.
    let three = _mm256_set1_epi8(3);
    let lo = _mm256_broadcastsi128_si256(_mm_loadu_si128(grp as *const __m128i));
    let u01 = _mm256_and_si256(
        _mm256_srlv_epi32(lo, _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2)),
        three,
    );
    let u23 = _mm256_and_si256(
        _mm256_srlv_epi32(lo, _mm256_setr_epi32(4, 4, 4, 4, 6, 6, 6, 6)),
        three,
    );
    // High plane: element 4j+f has its bit at byte j/2, bit 4(j%2)+f.
    let hb = _mm256_shuffle_epi8(
        _mm256_set1_epi64x((grp.add(16) as *const i64).read_unaligned()),
        _mm256_loadu_si256(T3_HI_IDX.0.as_ptr() as *const __m256i),
    );
    let b01 = _mm256_loadu_si256(T3_HI_BITS.0.as_ptr() as *const __m256i);
    let b23 = _mm256_loadu_si256(T3_HI_BITS.0.as_ptr().add(32) as *const __m256i);
    let four = _mm256_set1_epi8(4);
    let h01 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, b01), b01), four);
    let h23 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, b23), b23), four);
    let p = _mm256_add_epi16(
        _mm256_maddubs_epi16(
            _mm256_or_si256(u01, h01),
            _mm256_loadu_si256(x as *const __m256i),
        ),
        _mm256_maddubs_epi16(
            _mm256_or_si256(u23, h23),
            _mm256_loadu_si256(x.add(32) as *const __m256i),
        ),
    );
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

/// int3-g64 row (`groups` 24-byte groups) in the shared float order;
/// int3-layout `x` (`64 * groups` elements), `xg` and `s` with `groups`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn row_i3g64(
    w: *const u8,
    x: *const i8,
    xg: *const i32,
    s: *const f32,
    groups: usize,
) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut g = 0;
    while g + 8 <= groups {
        let mut v = [_mm256_setzero_si256(); 8];
        for (i, vi) in v.iter_mut().enumerate() {
            *vi = u3_group(w.add(24 * (g + i)), x.add(64 * (g + i)));
        }
        accumulate8(&mut acc, g, reduce8(&v), 2, xg, s);
        g += 8;
    }
    let mut tail = [0i32; 8];
    for (t, sum) in tail[..groups - g].iter_mut().enumerate() {
        *sum = hsum_i32(u3_group(w.add(24 * (g + t)), x.add(64 * (g + t))));
    }
    finish(acc, g, &tail[..groups - g], 4, xg, s)
}

/// Largest `|v|` of `n` f32 at `x` (as `scalar::amax`: NaN skipped; the
/// maximum does not depend on the order).
#[target_feature(enable = "avx2")]
pub(super) unsafe fn amax(x: *const f32, n: usize) -> f32 {
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let mut m = _mm256_setzero_ps();
    let mut i = 0;
    // `max_ps(a, b)` returns `b` when `a` is NaN: the running max is `b`.
    while i + 8 <= n {
        m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x.add(i)), abs), m);
        i += 8;
    }
    let mut a = [0f32; 8];
    _mm256_storeu_ps(a.as_mut_ptr(), m);
    let mut r = a.iter().fold(0f32, |r, &v| r.max(v));
    while i < n {
        r = r.max((*x.add(i)).abs());
        i += 1;
    }
    r
}

/// Wrapping u64-lane sum of `n` bytes at `p` (as `scalar::read_sum`), four
/// 32-byte loads in flight per step, each line asked for [`PROBE_AHEAD`]
/// bytes ahead.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn read_sum(p: *const u8, n: usize) -> u64 {
    let mut a = [_mm256_setzero_si256(); 4];
    let mut i = 0;
    while i + 128 <= n {
        prefetch_ahead(p.add(i), PROBE_AHEAD);
        prefetch_ahead(p.add(i + 64), PROBE_AHEAD);
        for (k, ak) in a.iter_mut().enumerate() {
            *ak = _mm256_add_epi64(*ak, _mm256_loadu_si256(p.add(i + 32 * k) as *const _));
        }
        i += 128;
    }
    let v = _mm256_add_epi64(_mm256_add_epi64(a[0], a[1]), _mm256_add_epi64(a[2], a[3]));
    let mut lanes = [0u64; 4];
    _mm256_storeu_si256(lanes.as_mut_ptr() as *mut _, v);
    let tail = std::slice::from_raw_parts(p.add(i), n - i);
    lanes
        .iter()
        .fold(super::super::scalar::read_sum(tail), |s, &l| {
            s.wrapping_add(l)
        })
}

/// `n` f32 at `x` to int8 at `q` as `scalar::quant_i8` (clamp in f32, then
/// round to nearest even with the default rounding mode; NaN gives 0).
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quant_i8(x: *const f32, scale: f32, q: *mut i8, n: usize) {
    let sc = _mm256_set1_ps(scale);
    let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
    let mut i = 0;
    while i + 8 <= n {
        let v = _mm256_div_ps(_mm256_loadu_ps(x.add(i)), sc);
        let ord = _mm256_cmp_ps::<_CMP_ORD_Q>(v, v);
        let c = _mm256_and_ps(_mm256_min_ps(_mm256_max_ps(v, lo), hi), ord);
        let r = _mm256_cvtps_epi32(c);
        // i32 in [-127, 127] -> i8 (saturating packs are exact here).
        let p = _mm256_packs_epi32(r, r);
        let p = _mm256_packs_epi16(p, p);
        let b = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4));
        (q.add(i) as *mut i64).write_unaligned(_mm256_extract_epi64::<0>(b));
        i += 8;
    }
    while i < n {
        *q.add(i) = (*x.add(i) / scale).round_ties_even().clamp(-127.0, 127.0) as i8;
        i += 1;
    }
}

/// `R` int8 rows (`rb` bytes apart) x `P` positions (`xs` apart), `n`
/// elements: `out[r * P + p] = sum w_r x_p` (exact, as [`dot_i8`]).
/// `pf`: weight bytes to prefetch ahead (see [`prefetch_ahead`]).
#[target_feature(enable = "avx2")]
pub(super) unsafe fn dot_i8_tile<const R: usize, const P: usize>(
    w: *const i8,
    rb: usize,
    x: *const i8,
    xs: usize,
    n: usize,
    pf: usize,
    out: *mut i32,
) {
    let zero = _mm256_setzero_si256();
    let mut acc = [[zero; P]; R];
    let mut i = 0;
    while i + 32 <= n {
        if i % 64 == 0 {
            for r in 0..R {
                prefetch_ahead(w.add(r * rb + i) as *const u8, pf);
            }
        }
        let mut xv = [zero; P];
        for (p, xp) in xv.iter_mut().enumerate() {
            *xp = _mm256_loadu_si256(x.add(p * xs + i) as *const __m256i);
        }
        for (r, ar) in acc.iter_mut().enumerate() {
            let w0 = _mm256_loadu_si256(w.add(r * rb + i) as *const __m256i);
            for (ap, &xp) in ar.iter_mut().zip(&xv) {
                *ap = _mm256_add_epi32(*ap, mul_i8(w0, xp));
            }
        }
        i += 32;
    }
    for (r, ar) in acc.iter().enumerate() {
        for (p, &ap) in ar.iter().enumerate() {
            let (wr, xp) = (w.add(r * rb), x.add(p * xs));
            let mut s = hsum_i32(ap);
            for j in i..n {
                s += *wr.add(j) as i32 * *xp.add(j) as i32;
            }
            *out.add(r * P + p) = s;
        }
    }
}

/// `R` int4 rows (`rb` bytes apart, `nb` each) x `P` split-layout
/// positions (`xs` apart): `out[r * P + p] = sum u x` (exact, as
/// [`dot_u4`]).  `pf` as in [`dot_i8_tile`].
#[target_feature(enable = "avx2")]
pub(super) unsafe fn dot_u4_tile<const R: usize, const P: usize>(
    w: *const u8,
    rb: usize,
    nb: usize,
    x: *const i8,
    xs: usize,
    pf: usize,
    out: *mut i32,
) {
    let zero = _mm256_setzero_si256();
    let (mask, ones) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi16(1));
    let mut acc = [[zero; P]; R];
    let mut g = 0;
    while 32 * g + 32 <= nb {
        if g % 2 == 0 {
            for r in 0..R {
                prefetch_ahead(w.add(r * rb + 32 * g), pf);
            }
        }
        let mut xv = [(zero, zero); P];
        for (p, xp) in xv.iter_mut().enumerate() {
            let xe = x.add(p * xs + split4_group(g));
            *xp = (
                _mm256_loadu_si256(xe as *const __m256i),
                _mm256_loadu_si256(xe.add(64) as *const __m256i),
            );
        }
        for (r, ar) in acc.iter_mut().enumerate() {
            let b = _mm256_loadu_si256(w.add(r * rb + 32 * g) as *const __m256i);
            let lo = _mm256_and_si256(b, mask);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(b), mask);
            for (ap, &(x0, x1)) in ar.iter_mut().zip(&xv) {
                // As `u4_group`: the i16 sum of two pairs is at most 7620.
                let p16 =
                    _mm256_add_epi16(_mm256_maddubs_epi16(lo, x0), _mm256_maddubs_epi16(hi, x1));
                *ap = _mm256_add_epi32(*ap, _mm256_madd_epi16(p16, ones));
            }
        }
        g += 1;
    }
    for (r, ar) in acc.iter().enumerate() {
        for (p, &ap) in ar.iter().enumerate() {
            let (wr, xp) = (w.add(r * rb), x.add(p * xs));
            let mut s = hsum_i32(ap);
            for j in 32 * g..nb {
                let b = *wr.add(j);
                s += (b & 15) as i32 * *xp.add(split4_index(j, false)) as i32
                    + (b >> 4) as i32 * *xp.add(split4_index(j, true)) as i32;
            }
            *out.add(r * P + p) = s;
        }
    }
}
