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
//!
//! The int2 tile and the int3-g64 kernels of both builds are `avx512/int2.rs`'s and
//! `avx512/int3.rs`'s macros, expanded beside these (`avx512/int3_vbmi.rs` has the int3-g64
//! decode rows of CPUs with GFNI and VBMI too); the float kernels (one build for both) are `avx512/float.rs`, re-exported here.

use core::arch::x86_64::*;

#[macro_use]
mod int2;
#[macro_use]
mod int3;
mod float;
pub(super) mod int3_vbmi;

pub(super) use float::{
    amax, axpy_f32, axpy_f32_gather, axpy_i8, axpy_i8_rows, dot_f32, dot_f32_cols, dot_f32_gather,
    mask16, quant_i8, read_sum,
};

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

/// Nibble products of one int4 block, `lo x0 + hi x1` summed in fours into
/// `a0` (and `a1`): two independent `vpdpbusd` chains.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dp2_vnni(
    a0: __m512i,
    a1: __m512i,
    lo: __m512i,
    x0: __m512i,
    hi: __m512i,
    x1: __m512i,
) -> (__m512i, __m512i) {
    (
        _mm512_dpbusd_epi32(a0, lo, x0),
        _mm512_dpbusd_epi32(a1, hi, x1),
    )
}

/// Same sums as [`dp2_vnni`] without VNNI, all into `a0`: nibbles are at
/// most 15, so each `maddubs` pair is at most 2*15*127 = 3810 and the i16
/// sum of the two at most 7620 (exact); one `vpmaddwd` then widens.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn dp2_bw(
    a0: __m512i,
    a1: __m512i,
    lo: __m512i,
    x0: __m512i,
    hi: __m512i,
    x1: __m512i,
) -> (__m512i, __m512i) {
    let p = _mm512_add_epi16(_mm512_maddubs_epi16(lo, x0), _mm512_maddubs_epi16(hi, x1));
    (
        _mm512_add_epi32(a0, _mm512_madd_epi16(p, _mm512_set1_epi16(1))),
        a1,
    )
}

/// Position in the 16-lane vector of [`reduce16`] of group `g`'s sum,
/// before the final permute (see there).
const REDUCE16_IDX: [i32; 16] = [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15];

macro_rules! avx512_kernels {
    ($features:literal, $dp:ident, $dp2:ident, $vnni:literal) => {
        use core::arch::x86_64::*;
        use core::mem::MaybeUninit;

        use super::super::prefetch_ahead;
        use super::{$dp, $dp2, REDUCE16_IDX};

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

        /// 64 bytes at `p`, or only the first `n` (the rest 0) when
        /// `n < 64`.
        #[inline]
        #[target_feature(enable = $features)]
        pub(in super::super) unsafe fn load64(p: *const i8, n: usize) -> __m512i {
            if n >= 64 {
                _mm512_loadu_si512(p as *const _)
            } else {
                _mm512_maskz_loadu_epi8(mask64(n), p)
            }
        }

        /// Low and high nibbles of 64 packed int4 bytes at `w` (only the
        /// first `nb` loaded when `nb < 64`).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn u4_nibbles(w: *const u8, nb: usize) -> (__m512i, __m512i) {
            let mask = _mm512_set1_epi8(0x0F);
            let b = load64(w as *const i8, nb);
            (
                _mm512_and_si512(b, mask),
                _mm512_and_si512(_mm512_srli_epi16::<4>(b), mask),
            )
        }

        /// 64 packed int4 bytes at `w` (only the first `nb` loaded when
        /// `nb < 64`) against one 128-element split-layout activation block
        /// at `x`: 16 i32 partial sums of `u x`, lanes 0..8 for the block's
        /// first 64-group, 8..16 for its second.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn u4_block(w: *const u8, nb: usize, x: *const i8) -> __m512i {
            let (lo, hi) = u4_nibbles(w, nb);
            let x0 = _mm512_loadu_si512(x as *const _);
            let x1 = _mm512_loadu_si512(x.add(64) as *const _);
            u4_fresh(lo, x0, hi, x1)
        }

        /// `lo x0 + hi x1` summed in fours from zero: VNNI, two chained
        /// `vpdpbusd` (callers have many independent ones in flight); BW,
        /// the one-`vpmaddwd` [`dp2_bw`].
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn u4_fresh(lo: __m512i, x0: __m512i, hi: __m512i, x1: __m512i) -> __m512i {
            let zero = _mm512_setzero_si512();
            if $vnni {
                $dp($dp(zero, lo, x0), hi, x1)
            } else {
                $dp2(zero, zero, lo, x0, hi, x1).0
            }
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

        /// `sum u x` of a packed int2 row of `nb` bytes (`u` the stored
        /// 2-bit field) against split2-layout activations (`256 *
        /// ceil(nb / 64)` elements): field `f` of 64 packed bytes meets
        /// the 64 contiguous activations at `64 f`, one chain per field.
        #[target_feature(enable = $features)]
        pub(in super::super) unsafe fn dot_i2(w: *const u8, x: *const i8, nb: usize) -> i32 {
            let m3 = _mm512_set1_epi8(3);
            let mut acc = [_mm512_setzero_si512(); 4];
            let mut j = 0;
            while j < nb {
                // Bytes past the row load as 0 (u = 0).
                let b = load64(w.add(j) as *const i8, nb - j);
                let u = [
                    b,
                    _mm512_srli_epi16::<2>(b),
                    _mm512_srli_epi16::<4>(b),
                    _mm512_srli_epi16::<6>(b),
                ];
                let xb = x.add(4 * j);
                for (f, a) in acc.iter_mut().enumerate() {
                    let xv = _mm512_loadu_si512(xb.add(64 * f) as *const _);
                    *a = $dp(*a, _mm512_and_si512(u[f], m3), xv);
                }
                j += 64;
            }
            let s = _mm512_add_epi32(
                _mm512_add_epi32(acc[0], acc[1]),
                _mm512_add_epi32(acc[2], acc[3]),
            );
            _mm512_reduce_add_epi32(s)
        }

        /// Adjacent lanes of `a` and `b` summed in pairs: within each
        /// 128-bit lane, `[a0 + a1, a2 + a3, b0 + b1, b2 + b3]`.  Two ops (a
        /// saturating i32 -> i16 pack, then `vpmaddwd` by ones) where the
        /// unpack-and-add form takes three.  Exact for the two levels
        /// [`reduce16`] uses: a block lane is below 2^14 in magnitude (an
        /// int4 lane sums 8 products of at most 15 * 127 = 1905, an int3
        /// pair lane 8 of at most 7 * 127), so a first-level sum is below
        /// 2^15 and fits the second level's i16 pack too.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn halve(a: __m512i, b: __m512i) -> __m512i {
            _mm512_madd_epi16(_mm512_packs_epi32(a, b), _mm512_set1_epi16(1))
        }

        /// Eight vectors, each holding two groups' partial sums (lanes 0..8
        /// and 8..16), -> the 16 exact group sums in order.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn reduce16(v: &[__m512i; 8]) -> __m512i {
            finish16(
                halve(halve(v[0], v[1]), halve(v[2], v[3])),
                halve(halve(v[4], v[5]), halve(v[6], v[7])),
            )
        }

        /// The end of [`reduce16`] from `q0123 = halve(halve(v0, v1),
        /// halve(v2, v3))` and `q4567` likewise.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn finish16(q0123: __m512i, q4567: __m512i) -> __m512i {
            // Within each 128-bit lane k, lane k of q0123 holds [sum of
            // lane k of v0, v1, v2, v3].  Group 2b+h of v_b spans 128-bit
            // lanes 2h, 2h+1: add them.  Result lane L, slot i: group
            // 8(L/2) + 2i + L%2.
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
        pub(in super::super) unsafe fn accumulate16(
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

        /// The shared 16-lane reduction (`scalar::combine16`), in
        /// registers: halves (`a[i] + a[i + 8]`), quarters, pairs, the same
        /// IEEE additions in the same order.
        #[inline]
        #[target_feature(enable = $features)]
        pub(in super::super) unsafe fn reduce_f32(acc: __m512) -> f32 {
            let hi8 = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)));
            let s8 = _mm256_add_ps(_mm512_castps512_ps256(acc), hi8);
            let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
            let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps::<1>(s2, s2)))
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
            let mut out = 0f32;
            row_i4g64_tile::<1, 1>(w, 0, nb, x, 0, xg, 0, s, 0, groups, 0, &mut out);
            out
        }

        /// `R` int4-g64 rows (`rb` bytes apart, `nb` each) x `P` positions
        /// (`x` `xs` elements apart, `xg` `xgs` apart): `out[r * P + p]` is
        /// [`row_i4g64`] of row `r` (scales at `s + r * spr`) and position
        /// `p`, bit for bit (the same exact group sums, then each output's
        /// own accumulator in the shared order).  `pf`: weight bytes to
        /// prefetch ahead, a whole number of rows (see `prefetch_ahead`);
        /// the scales are asked for the same number of rows ahead.
        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = $features)]
        pub(in super::super) unsafe fn row_i4g64_tile<const R: usize, const P: usize>(
            w: *const u8,
            rb: usize,
            nb: usize,
            x: *const i8,
            xs: usize,
            xg: *const i32,
            xgs: usize,
            s: *const f32,
            spr: usize,
            groups: usize,
            pf: usize,
            out: *mut f32,
        ) {
            let nblocks = nb.div_ceil(64);
            let spf = if pf == 0 { 0 } else { pf / rb * spr * 4 };
            let zero = _mm512_setzero_si512();
            let mut acc = [[_mm512_setzero_ps(); P]; R];
            let mut b = 0;
            while b < nblocks {
                let nbk = (nblocks - b).min(8);
                for r in 0..R {
                    // This chunk's 16 scales: one line a row.
                    prefetch_ahead(s.add(r * spr + 2 * b) as *const u8, spf);
                }
                // Reduced as they come, to keep few vectors live: block
                // pair i halved into `half`, two of those into `quad`.
                // Pairs past the row's end are all zero and skipped: a
                // short row (512 bytes: 4 blocks) halves 2 pairs, not 4.
                let pairs = nbk.div_ceil(2);
                let mut half = [[zero; P]; R];
                let mut quad = [[[zero; 2]; P]; R];
                for i in 0..pairs {
                    let mut v = [[[zero; 2]; P]; R];
                    for h in 0..2 {
                        let k = 2 * i + h;
                        if k >= nbk {
                            break;
                        }
                        let o = 64 * (b + k);
                        let mut xv = [(zero, zero); P];
                        for (p, xp) in xv.iter_mut().enumerate() {
                            let xo = x.add(p * xs + 2 * o);
                            *xp = (
                                _mm512_loadu_si512(xo as *const _),
                                _mm512_loadu_si512(xo.add(64) as *const _),
                            );
                        }
                        for (r, vr) in v.iter_mut().enumerate() {
                            prefetch_ahead(w.add(r * rb + o), pf);
                            let (lo, hi) = u4_nibbles(w.add(r * rb + o), nb - o);
                            for (vp, &(x0, x1)) in vr.iter_mut().zip(&xv) {
                                vp[h] = u4_fresh(lo, x0, hi, x1);
                            }
                        }
                    }
                    for r in 0..R {
                        for p in 0..P {
                            let h = halve(v[r][p][0], v[r][p][1]);
                            if i % 2 == 0 {
                                half[r][p] = h;
                            } else {
                                quad[r][p][i / 2] = halve(half[r][p], h);
                            }
                        }
                    }
                }
                if pairs % 2 == 1 {
                    // The skipped pair halves to zero.
                    for r in 0..R {
                        for p in 0..P {
                            quad[r][p][pairs / 2] = halve(half[r][p], zero);
                        }
                    }
                }
                let g0 = 2 * b;
                for (r, (ar, qr)) in acc.iter_mut().zip(&quad).enumerate() {
                    for (p, (ap, qp)) in ar.iter_mut().zip(qr).enumerate() {
                        let gi = finish16(qp[0], qp[1]);
                        *ap = accumulate16(
                            *ap,
                            gi,
                            3,
                            xg.add(p * xgs + g0),
                            s.add(r * spr + g0),
                            groups - g0,
                        );
                    }
                }
                b += 8;
            }
            for (r, ar) in acc.iter().enumerate() {
                for (p, &ap) in ar.iter().enumerate() {
                    *out.add(r * P + p) = reduce_f32(ap);
                }
            }
        }

        /// [`row_i4g64_tile`] for big tiles (`R * P` up to 16): the block
        /// sums of a chunk of 8 blocks go to a scratch array (L1) instead of
        /// being paired in registers, then each output reduces its own 8
        /// vectors with [`reduce16`] as the single kernel does.  Same bits.
        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = $features)]
        pub(in super::super) unsafe fn row_i4g64_big<const R: usize, const P: usize>(
            w: *const u8,
            rb: usize,
            nb: usize,
            x: *const i8,
            xs: usize,
            xg: *const i32,
            xgs: usize,
            s: *const f32,
            spr: usize,
            groups: usize,
            out: *mut f32,
        ) {
            let nblocks = nb.div_ceil(64);
            let zero = _mm512_setzero_si512();
            let mut acc = [[_mm512_setzero_ps(); P]; R];
            // Every entry is written for each chunk (a block sum or zero)
            // before the chunk's reduction reads it, so the scratch starts
            // uninitialized: filling it costs a 8 KB memset a call at 4 x 4.
            let mut blk = [[[MaybeUninit::<__m512i>::uninit(); 8]; P]; R];
            let mut b = 0;
            while b < nblocks {
                let nbk = (nblocks - b).min(8);
                for k in 0..8 {
                    if k >= nbk {
                        for br in blk.iter_mut() {
                            for bp in br.iter_mut() {
                                bp[k] = MaybeUninit::new(zero);
                            }
                        }
                        continue;
                    }
                    let o = 64 * (b + k);
                    let mut xv = [(zero, zero); P];
                    for (p, xp) in xv.iter_mut().enumerate() {
                        let xo = x.add(p * xs + 2 * o);
                        *xp = (
                            _mm512_loadu_si512(xo as *const _),
                            _mm512_loadu_si512(xo.add(64) as *const _),
                        );
                    }
                    for (r, br) in blk.iter_mut().enumerate() {
                        let (lo, hi) = u4_nibbles(w.add(r * rb + o), nb - o);
                        for (bp, &(x0, x1)) in br.iter_mut().zip(&xv) {
                            bp[k] = MaybeUninit::new(u4_fresh(lo, x0, hi, x1));
                        }
                    }
                }
                let g0 = 2 * b;
                for (r, (ar, br)) in acc.iter_mut().zip(&blk).enumerate() {
                    for (p, (ap, bp)) in ar.iter_mut().zip(br).enumerate() {
                        *ap = accumulate16(
                            *ap,
                            // Fully written this chunk (above); `MaybeUninit<T>` has
                            // `T`'s layout.  A cast, not `map`: a closure would not
                            // inherit the target features.
                            reduce16(&*(bp as *const _ as *const [__m512i; 8])),
                            3,
                            xg.add(p * xgs + g0),
                            s.add(r * spr + g0),
                            groups - g0,
                        );
                    }
                }
                b += 8;
            }
            for (r, ar) in acc.iter().enumerate() {
                for (p, &ap) in ar.iter().enumerate() {
                    *out.add(r * P + p) = reduce_f32(ap);
                }
            }
        }

        /// `R` int8 rows (`rb` bytes apart) x `P` positions (`xs` apart),
        /// `n` elements: `out[r * P + p] = sum w_r x_p` (exact).  `xsum[p]`
        /// is the exact sum of position `p`'s `n` activations.
        ///
        /// VNNI build: the unsigned offset weights `w + 128` (one xor) meet
        /// `x` directly, `sum (w + 128) x - 128 xsum` (wrapping i32, exact
        /// whenever the true sum fits; `vpdpbusd` does not saturate).  BW
        /// build: `maddubs` would saturate on `255 * 127 * 2`, so it takes
        /// `|w|` times `sign(w) x`.  `pf`: weight bytes to prefetch ahead
        /// (see `prefetch_ahead`).
        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = $features)]
        pub(in super::super) unsafe fn dot_i8_tile<const R: usize, const P: usize>(
            w: *const i8,
            rb: usize,
            x: *const i8,
            xs: usize,
            xsum: *const i32,
            n: usize,
            pf: usize,
            out: *mut i32,
        ) {
            let zero = _mm512_setzero_si512();
            let bias = _mm512_set1_epi8(-128);
            let mut acc = [[zero; P]; R];
            let mut i = 0;
            while i < n {
                let mut xv = [zero; P];
                for (p, xp) in xv.iter_mut().enumerate() {
                    *xp = load64(x.add(p * xs + i), n - i);
                }
                for (r, ar) in acc.iter_mut().enumerate() {
                    // Masked-off tail bytes meet x = 0 either way.
                    prefetch_ahead(w.add(r * rb + i) as *const u8, pf);
                    let w0 = load64(w.add(r * rb + i), n - i);
                    if $vnni {
                        let u = _mm512_xor_si512(w0, bias);
                        for (ap, &xp) in ar.iter_mut().zip(&xv) {
                            *ap = $dp(*ap, u, xp);
                        }
                    } else {
                        // |w| (128 stays 0x80 = 128 as u8) times sign(w) x.
                        let neg = _mm512_movepi8_mask(w0);
                        let a = _mm512_abs_epi8(w0);
                        for (ap, &xp) in ar.iter_mut().zip(&xv) {
                            *ap = $dp(*ap, a, _mm512_mask_sub_epi8(xp, neg, zero, xp));
                        }
                    }
                }
                i += 64;
            }
            for (r, ar) in acc.iter().enumerate() {
                for (p, &ap) in ar.iter().enumerate() {
                    let mut v = _mm512_reduce_add_epi32(ap);
                    if $vnni {
                        v = v.wrapping_sub((*xsum.add(p)).wrapping_mul(128));
                    }
                    *out.add(r * P + p) = v;
                }
            }
        }

        /// `R` int4 rows (`rb` bytes apart, `nb` each) x `P` split-layout
        /// positions (`xs` apart): `out[r * P + p] = sum u x` (exact).  The
        /// BW `dp2` only ever touches `a0`, so big tiles keep 16
        /// accumulators in either build.  `pf` as in [`dot_i8_tile`].
        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = $features)]
        pub(in super::super) unsafe fn dot_u4_tile<const R: usize, const P: usize>(
            w: *const u8,
            rb: usize,
            nb: usize,
            x: *const i8,
            xs: usize,
            pf: usize,
            out: *mut i32,
        ) {
            let zero = _mm512_setzero_si512();
            let mut a0 = [[zero; P]; R];
            let mut a1 = [[zero; P]; R];
            let mut j = 0;
            while j < nb {
                let mut xv = [(zero, zero); P];
                for (p, xp) in xv.iter_mut().enumerate() {
                    let xo = x.add(p * xs + 2 * j);
                    *xp = (
                        _mm512_loadu_si512(xo as *const _),
                        _mm512_loadu_si512(xo.add(64) as *const _),
                    );
                }
                for r in 0..R {
                    prefetch_ahead(w.add(r * rb + j), pf);
                    let (lo, hi) = u4_nibbles(w.add(r * rb + j), nb - j);
                    for p in 0..P {
                        let (x0, x1) = xv[p];
                        if R * P > 4 && $vnni {
                            // Big tiles: one chain per output (16 chains
                            // hide the latency; 32 would not fit).
                            a0[r][p] = $dp($dp(a0[r][p], lo, x0), hi, x1);
                        } else {
                            (a0[r][p], a1[r][p]) = $dp2(a0[r][p], a1[r][p], lo, x0, hi, x1);
                        }
                    }
                }
                j += 64;
            }
            for r in 0..R {
                for p in 0..P {
                    *out.add(r * P + p) =
                        _mm512_reduce_add_epi32(_mm512_add_epi32(a0[r][p], a1[r][p]));
                }
            }
        }
    };
}

/// The AVX-512 VNNI build.
pub(super) mod vnni {
    avx512_kernels!(
        "avx512f,avx512bw,avx512vl,avx512vnni",
        dp_vnni,
        dp2_vnni,
        true
    );
    avx512_int2_kernels!("avx512f,avx512bw,avx512vl,avx512vnni", dp_vnni, true);
    avx512_int3_kernels!("avx512f,avx512bw,avx512vl,avx512vnni", dp_vnni);
}

/// The AVX-512BW build (no VNNI).
pub(super) mod bw {
    avx512_kernels!("avx512f,avx512bw,avx512vl", dp_bw, dp2_bw, false);
    avx512_int2_kernels!("avx512f,avx512bw,avx512vl", dp_bw, false);
    avx512_int3_kernels!("avx512f,avx512bw,avx512vl", dp_bw);
}
