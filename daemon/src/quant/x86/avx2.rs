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

/// 32 packed int4 bytes (64 values) x 64 int8 activations -> 8 i32 partial
/// sums.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn i4_block(w: *const u8, x: *const i8) -> __m256i {
    let mask = _mm256_set1_epi8(0x0F);
    let eight = _mm256_set1_epi8(8);
    let b = _mm256_loadu_si256(w as *const __m256i);
    let lo = _mm256_and_si256(b, mask); // even elements
    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(b), mask); // odd elements
    let a = _mm256_unpacklo_epi8(lo, hi); // [e0..16 | e32..48]
    let c = _mm256_unpackhi_epi8(lo, hi); // [e16..32 | e48..64]
    let q0 = _mm256_sub_epi8(_mm256_permute2x128_si256::<0x20>(a, c), eight); // e0..32
    let q1 = _mm256_sub_epi8(_mm256_permute2x128_si256::<0x31>(a, c), eight); // e32..64
    let x0 = _mm256_loadu_si256(x as *const __m256i);
    let x1 = _mm256_loadu_si256(x.add(32) as *const __m256i);
    _mm256_add_epi32(mul_i8(q0, x0), mul_i8(q1, x1))
}

/// Packed int4 row of `nb` bytes x `2 * nb` int8 activations.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn dot_i4(w: *const u8, x: *const i8, nb: usize) -> i32 {
    let mut acc = _mm256_setzero_si256();
    let mut j = 0;
    while j + 32 <= nb {
        acc = _mm256_add_epi32(acc, i4_block(w.add(j), x.add(2 * j)));
        j += 32;
    }
    let mut s = hsum_i32(acc);
    while j < nb {
        let b = *w.add(j);
        s += ((b & 15) as i32 - 8) * *x.add(2 * j) as i32
            + ((b >> 4) as i32 - 8) * *x.add(2 * j + 1) as i32;
        j += 1;
    }
    s
}

/// `groups` complete int4 64-groups (32 bytes each) x `64 * groups` int8
/// activations; writes one i32 per group to `out[0..groups]`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn dot_i4_groups(w: *const u8, x: *const i8, groups: usize, out: *mut i32) {
    for g in 0..groups {
        *out.add(g) = hsum_i32(i4_block(w.add(32 * g), x.add(64 * g)));
    }
}

/// Expand 8 bytes of 2-bit fields (field f of byte j at bits 2f) into 32
/// bytes holding the field values 0..=3, element `4j + f` at byte `4j + f`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn expand_2bit(src: *const u8) -> __m256i {
    // Byte e of the expanded vector is source byte e/4 (the 8 source bytes
    // are broadcast to both 128-bit lanes; lane 1 starts at element 16).
    let idx = _mm256_setr_epi8(
        0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, //
        4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7,
    );
    let b = _mm256_shuffle_epi8(
        _mm256_set1_epi64x((src as *const i64).read_unaligned()),
        idx,
    );
    // Select field f where e % 4 == f; after masking, the 16-bit shifts
    // never move bits across bytes.
    let m0 = _mm256_set1_epi32(0x0000_0003);
    let m1 = _mm256_set1_epi32(0x0000_0C00);
    let m2 = _mm256_set1_epi32(0x0030_0000);
    let m3 = _mm256_set1_epi32(0xC000_0000u32 as i32);
    _mm256_or_si256(
        _mm256_or_si256(
            _mm256_and_si256(b, m0),
            _mm256_srli_epi16::<2>(_mm256_and_si256(b, m1)),
        ),
        _mm256_or_si256(
            _mm256_srli_epi16::<4>(_mm256_and_si256(b, m2)),
            _mm256_srli_epi16::<6>(_mm256_and_si256(b, m3)),
        ),
    )
}

/// Expand 4 bytes of bits (element k at byte k>>3, bit k&7) into 32 bytes
/// holding 4 where the bit is set, else 0.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn expand_bit2(src: *const u8) -> __m256i {
    let idx = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, //
        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
    );
    let b = _mm256_shuffle_epi8(_mm256_set1_epi32((src as *const i32).read_unaligned()), idx);
    let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(b, bits), bits);
    _mm256_and_si256(set, _mm256_set1_epi8(4))
}

/// Packed int2 row of `nb` bytes x `4 * nb` int8 activations.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn dot_i2(w: *const u8, x: *const i8, nb: usize) -> i32 {
    let two = _mm256_set1_epi8(2);
    let mut acc = _mm256_setzero_si256();
    let mut j = 0;
    while j + 8 <= nb {
        let q = _mm256_sub_epi8(expand_2bit(w.add(j)), two);
        let xv = _mm256_loadu_si256(x.add(4 * j) as *const __m256i);
        acc = _mm256_add_epi32(acc, mul_i8(q, xv));
        j += 8;
    }
    let mut s = hsum_i32(acc);
    while j < nb {
        let b = *w.add(j);
        for f in 0..4 {
            s += (((b >> (2 * f)) & 3) as i32 - 2) * *x.add(4 * j + f) as i32;
        }
        j += 1;
    }
    s
}

/// `groups` int3 64-groups (24 bytes each) x `64 * groups` int8
/// activations; writes one i32 per group to `out[0..groups]`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn dot_i3_groups(w: *const u8, x: *const i8, groups: usize, out: *mut i32) {
    let four = _mm256_set1_epi8(4);
    for g in 0..groups {
        let grp = w.add(24 * g);
        let xg = x.add(64 * g);
        // Elements 0..32: low plane bytes 0..8, high plane bytes 16..20;
        // elements 32..64: low plane bytes 8..16, high plane bytes 20..24.
        let u0 = _mm256_or_si256(expand_2bit(grp), expand_bit2(grp.add(16)));
        let u1 = _mm256_or_si256(expand_2bit(grp.add(8)), expand_bit2(grp.add(20)));
        let q0 = _mm256_sub_epi8(u0, four);
        let q1 = _mm256_sub_epi8(u1, four);
        let x0 = _mm256_loadu_si256(xg as *const __m256i);
        let x1 = _mm256_loadu_si256(xg.add(32) as *const __m256i);
        *out.add(g) = hsum_i32(_mm256_add_epi32(mul_i8(q0, x0), mul_i8(q1, x1)));
    }
}
