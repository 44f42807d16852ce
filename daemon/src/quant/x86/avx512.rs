//! AVX-512 kernels in two builds from one source: `vnni` (AVX-512F/BW/VL +
//! VNNI, the u8 x i8 dot is one `vpdpbusd`) and `bw` (AVX-512F/BW/VL, the
//! same dot as `vpmaddubsw` + `vpmaddwd`).
//!
//! # Safety (all functions)
//! Callers must have verified at run time that the CPU supports every
//! feature in the build's `target_feature` list (see `x86/mod.rs`), and that
//! the pointers are valid for the element counts stated on each function.
//! Loads are unaligned; short tails use masked loads, which do not touch
//! (and cannot fault on) the masked-off bytes.
//!
//! Exactness: every product is `u8 x i8` with `u <= 128` and `|x| <= 127`
//! (int8 weights go through `|w|` and `sign(w) x`; activations never hold
//! -128), so a maddubs pair is at most 2*128*127 = 32512 and never
//! saturates; VNNI sums four products straight into i32.  Group sums are
//! then exact, and the float work follows the shared order in `scalar.rs`.

use core::arch::x86_64::*;

/// u8 x i8 products of `u` and `x`, summed in fours, added to `acc`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dp_vnni(acc: __m512i, u: __m512i, x: __m512i) -> __m512i {
    _mm512_dpbusd_epi32(acc, u, x)
}

/// Same as [`dp_vnni`] without VNNI (exact: see the module docs).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn dp_bw(acc: __m512i, u: __m512i, x: __m512i) -> __m512i {
    let p = _mm512_maddubs_epi16(u, x);
    _mm512_add_epi32(acc, _mm512_madd_epi16(p, _mm512_set1_epi16(1)))
}

/// Position in the 16-lane vector of [`reduce16`] of group `g`'s sum,
/// before the final permute (see there).
const REDUCE16_IDX: [i32; 16] = [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15];

macro_rules! avx512_kernels {
    ($features:literal, $dp:ident) => {
        use core::arch::x86_64::*;

        use super::super::super::scalar::combine16;
        use super::super::{T3_HI_BITS, T3_HI_IDX};
        use super::{$dp, REDUCE16_IDX};

        /// `(1 << n) - 1` for `n < 64`, all ones for `n >= 64`.
        #[inline]
        fn mask64(n: usize) -> u64 {
            if n >= 64 {
                u64::MAX
            } else {
                (1u64 << n) - 1
            }
        }

        /// int8 x int8 dot of `n` elements (`x` in [-127, 127]).
        #[target_feature(enable = $features)]
        pub(in super::super) unsafe fn dot_i8(w: *const i8, x: *const i8, n: usize) -> i32 {
            let zero = _mm512_setzero_si512();
            let mut acc0 = zero;
            let mut acc1 = zero;
            let mut i = 0;
            // |w| (128 stays 0x80 = 128 as u8) times sign(w) * x.
            while i + 128 <= n {
                let w0 = _mm512_loadu_si512(w.add(i) as *const _);
                let x0 = _mm512_loadu_si512(x.add(i) as *const _);
                let w1 = _mm512_loadu_si512(w.add(i + 64) as *const _);
                let x1 = _mm512_loadu_si512(x.add(i + 64) as *const _);
                let s0 = _mm512_mask_sub_epi8(x0, _mm512_movepi8_mask(w0), zero, x0);
                let s1 = _mm512_mask_sub_epi8(x1, _mm512_movepi8_mask(w1), zero, x1);
                acc0 = $dp(acc0, _mm512_abs_epi8(w0), s0);
                acc1 = $dp(acc1, _mm512_abs_epi8(w1), s1);
                i += 128;
            }
            while i < n {
                let m = mask64(n - i);
                let w0 = _mm512_maskz_loadu_epi8(m, w.add(i));
                let x0 = _mm512_maskz_loadu_epi8(m, x.add(i));
                let s0 = _mm512_mask_sub_epi8(x0, _mm512_movepi8_mask(w0), zero, x0);
                acc0 = $dp(acc0, _mm512_abs_epi8(w0), s0);
                i += 64;
            }
            _mm512_reduce_add_epi32(_mm512_add_epi32(acc0, acc1))
        }

        /// 64 packed int4 bytes at `w` (only the first `nb` loaded when
        /// `nb < 64`) against one 128-element split-layout activation block
        /// at `x`: 16 i32 partial sums of `u x`, lanes 0..8 for the block's
        /// first 64-group, 8..16 for its second.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn u4_block(w: *const u8, nb: usize, x: *const i8) -> __m512i {
            let mask = _mm512_set1_epi8(0x0F);
            let b = if nb >= 64 {
                _mm512_loadu_si512(w as *const _)
            } else {
                _mm512_maskz_loadu_epi8(mask64(nb), w as *const i8)
            };
            let lo = _mm512_and_si512(b, mask);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(b), mask);
            let acc = $dp(
                _mm512_setzero_si512(),
                lo,
                _mm512_loadu_si512(x as *const _),
            );
            $dp(acc, hi, _mm512_loadu_si512(x.add(64) as *const _))
        }

        /// `sum u x` of packed int4 bytes (`nb`) against split-layout
        /// activations (at least `128 * ceil(nb / 64)` elements).
        #[target_feature(enable = $features)]
        pub(in super::super) unsafe fn dot_u4(w: *const u8, x: *const i8, nb: usize) -> i32 {
            let mut acc0 = _mm512_setzero_si512();
            let mut acc1 = _mm512_setzero_si512();
            let mut j = 0;
            while j + 128 <= nb {
                acc0 = _mm512_add_epi32(acc0, u4_block(w.add(j), 64, x.add(2 * j)));
                acc1 = _mm512_add_epi32(acc1, u4_block(w.add(j + 64), 64, x.add(2 * j + 128)));
                j += 128;
            }
            while j < nb {
                acc0 = _mm512_add_epi32(acc0, u4_block(w.add(j), nb - j, x.add(2 * j)));
                j += 64;
            }
            _mm512_reduce_add_epi32(_mm512_add_epi32(acc0, acc1))
        }

        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn pairs(a: __m512i, b: __m512i) -> __m512i {
            _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b))
        }

        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn quads(a: __m512i, b: __m512i) -> __m512i {
            _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b))
        }

        /// Eight vectors, each holding two groups' partial sums (lanes 0..8
        /// and 8..16), -> the 16 exact group sums in order.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn reduce16(v: &[__m512i; 8]) -> __m512i {
            // Within each 128-bit lane k: pairs, then quads, so lane k of
            // q0123 holds [sum of lane k of v0, v1, v2, v3].
            let q0123 = quads(pairs(v[0], v[1]), pairs(v[2], v[3]));
            let q4567 = quads(pairs(v[4], v[5]), pairs(v[6], v[7]));
            // Group 2b+h of v_b spans 128-bit lanes 2h, 2h+1: add them.
            // Result lane L, slot i: group 8(L/2) + 2i + L%2.
            let r = _mm512_add_epi32(
                _mm512_shuffle_i32x4::<0x88>(q0123, q4567),
                _mm512_shuffle_i32x4::<0xDD>(q0123, q4567),
            );
            _mm512_permutexvar_epi32(_mm512_loadu_si512(REDUCE16_IDX.as_ptr() as *const _), r)
        }

        /// The shared float order: group sums `gi` of groups `g0..g0 + n`
        /// (`n <= 16`, `g0` a multiple of 16) into lanes `g % 16` of `acc`.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn accumulate16(
            acc: __m512,
            gi: __m512i,
            off_shift: u32,
            xg: *const i32,
            s: *const f32,
            n: usize,
        ) -> __m512 {
            let k: __mmask16 = if n >= 16 { 0xFFFF } else { (1u16 << n) - 1 };
            let xs = _mm512_sll_epi32(
                _mm512_maskz_loadu_epi32(k, xg),
                _mm_cvtsi32_si128(off_shift as i32),
            );
            let p = _mm512_mul_ps(
                _mm512_cvtepi32_ps(_mm512_sub_epi32(gi, xs)),
                _mm512_maskz_loadu_ps(k, s),
            );
            _mm512_mask_add_ps(acc, k, acc, p)
        }

        /// The shared 16-lane reduction (`scalar::combine16`).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn reduce_f32(acc: __m512) -> f32 {
            let mut a = [0f32; 16];
            _mm512_storeu_ps(a.as_mut_ptr(), acc);
            combine16(&a)
        }

        /// int4-g64 row (`nb` packed bytes, `groups = ceil(nb / 32)`) in the
        /// shared float order; split-layout `x` (at least
        /// `128 * ceil(nb / 64)` elements), `xg` and `s` with `groups`.
        #[target_feature(enable = $features)]
        pub(in super::super) unsafe fn row_i4g64(
            w: *const u8,
            nb: usize,
            x: *const i8,
            xg: *const i32,
            s: *const f32,
            groups: usize,
        ) -> f32 {
            let nblocks = nb.div_ceil(64);
            let mut acc = _mm512_setzero_ps();
            let mut b = 0;
            while b < nblocks {
                let mut v = [_mm512_setzero_si512(); 8];
                if 64 * (b + 8) <= nb {
                    for (i, vi) in v.iter_mut().enumerate() {
                        let o = 64 * (b + i);
                        *vi = u4_block(w.add(o), 64, x.add(2 * o));
                    }
                } else {
                    for (i, vi) in v.iter_mut().enumerate().take(nblocks - b) {
                        let o = 64 * (b + i);
                        *vi = u4_block(w.add(o), nb - o, x.add(2 * o));
                    }
                }
                let g0 = 2 * b;
                acc = accumulate16(acc, reduce16(&v), 3, xg.add(g0), s.add(g0), groups - g0);
                b += 8;
            }
            reduce_f32(acc)
        }

        /// One int3 group (24 bytes) as 64 `u` bytes in the int3 activation
        /// layout (position 16f + j holds element 4j + f).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn u3_group(grp: *const u8) -> __m512i {
            // Low plane broadcast to the 4 lanes, lane f shifted by 2f.
            let lo = _mm512_broadcast_i32x4(_mm_loadu_si128(grp as *const __m128i));
            let sh = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6);
            let l = _mm512_and_si512(_mm512_srlv_epi32(lo, sh), _mm512_set1_epi8(3));
            // High plane: element 4j+f has its bit at byte j/2, bit 4(j%2)+f.
            let hb = _mm512_shuffle_epi8(
                _mm512_set1_epi64((grp.add(16) as *const i64).read_unaligned()),
                _mm512_loadu_si512(T3_HI_IDX.0.as_ptr() as *const _),
            );
            let k =
                _mm512_test_epi8_mask(hb, _mm512_loadu_si512(T3_HI_BITS.0.as_ptr() as *const _));
            _mm512_mask_add_epi8(l, k, l, _mm512_set1_epi8(4))
        }

        /// Two int3 groups' partial sums in one vector (lanes 0..8 first
        /// group, 8..16 second).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn u3_pair(a: __m512i, b: __m512i) -> __m512i {
            _mm512_add_epi32(
                _mm512_shuffle_i32x4::<0x44>(a, b),
                _mm512_shuffle_i32x4::<0xEE>(a, b),
            )
        }

        /// int3-g64 row (`groups` 24-byte groups) in the shared float order;
        /// int3-layout `x` (`64 * groups` elements), `xg` and `s`.
        #[target_feature(enable = $features)]
        pub(in super::super) unsafe fn row_i3g64(
            w: *const u8,
            x: *const i8,
            xg: *const i32,
            s: *const f32,
            groups: usize,
        ) -> f32 {
            let zero = _mm512_setzero_si512();
            let mut acc = _mm512_setzero_ps();
            let mut g0 = 0;
            while g0 < groups {
                let mut d = [zero; 16];
                for (i, di) in d.iter_mut().enumerate().take(groups - g0) {
                    let g = g0 + i;
                    let xv = _mm512_loadu_si512(x.add(64 * g) as *const _);
                    *di = $dp(zero, u3_group(w.add(24 * g)), xv);
                }
                let mut v = [zero; 8];
                for (i, vi) in v.iter_mut().enumerate() {
                    *vi = u3_pair(d[2 * i], d[2 * i + 1]);
                }
                acc = accumulate16(acc, reduce16(&v), 2, xg.add(g0), s.add(g0), groups - g0);
                g0 += 16;
            }
            reduce_f32(acc)
        }
    };
}

/// The AVX-512 VNNI build.
pub(super) mod vnni {
    avx512_kernels!("avx512f,avx512bw,avx512vl,avx512vnni", dp_vnni);
}

/// The AVX-512BW build (no VNNI).
pub(super) mod bw {
    avx512_kernels!("avx512f,avx512bw,avx512vl", dp_bw);
}
