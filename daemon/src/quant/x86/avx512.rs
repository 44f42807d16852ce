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

use super::{prefetch_ahead, PROBE_AHEAD};

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

        use super::super::{prefetch_ahead, T3_HI_BITS, T3_HI_IDX};
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

        /// One int3 group (24 bytes) as 64 `u` bytes in the int3 activation
        /// layout (position 16f + j holds element 4j + f).
        #[inline]
        #[target_feature(enable = $features)]
        pub(in super::super) unsafe fn u3_group(grp: *const u8) -> __m512i {
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

        /// `R` int3-g64 rows (`rb` bytes apart) x `P` int3-layout positions
        /// (`x` `xs` apart, `xg` `xgs` apart): `out[r * P + p]` is
        /// [`row_i3g64`] of row `r` (scales at `s + r * spr`) and position
        /// `p`, bit for bit.  Each group is unpacked once per row and each
        /// activation vector loaded once per position; the per-group sums
        /// of a chunk of 16 groups wait in a scratch array, then each
        /// output reduces them as the single kernel does.  `pf` as in
        /// [`row_i4g64_tile`].
        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = $features)]
        pub(in super::super) unsafe fn row_i3g64_tile<const R: usize, const P: usize>(
            w: *const u8,
            rb: usize,
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
            let spf = if pf == 0 { 0 } else { pf / rb * spr * 4 };
            let zero = _mm512_setzero_si512();
            let mut acc = [[_mm512_setzero_ps(); P]; R];
            // Written in full for each chunk (a group sum or zero) before
            // it is read, as in `row_i4g64_big`: no initial fill.
            let mut d = [[[MaybeUninit::<__m512i>::uninit(); 16]; P]; R];
            let mut g0 = 0;
            while g0 < groups {
                let n = (groups - g0).min(16);
                for r in 0..R {
                    prefetch_ahead(s.add(r * spr + g0) as *const u8, spf);
                }
                for i in 0..16 {
                    if i >= n {
                        for dr in d.iter_mut() {
                            for dp in dr.iter_mut() {
                                dp[i] = MaybeUninit::new(zero);
                            }
                        }
                        continue;
                    }
                    let g = g0 + i;
                    let mut xv = [zero; P];
                    for (p, xp) in xv.iter_mut().enumerate() {
                        *xp = _mm512_loadu_si512(x.add(p * xs + 64 * g) as *const _);
                    }
                    for (r, dr) in d.iter_mut().enumerate() {
                        if g % 8 == 0 {
                            // Eight 24-byte groups fill three lines.
                            for line in 0..3 {
                                prefetch_ahead(w.add(r * rb + 24 * g + 64 * line), pf);
                            }
                        }
                        let u = u3_group(w.add(r * rb + 24 * g));
                        for (dp, &xp) in dr.iter_mut().zip(&xv) {
                            dp[i] = MaybeUninit::new($dp(zero, u, xp));
                        }
                    }
                }
                for (r, (ar, dr)) in acc.iter_mut().zip(&d).enumerate() {
                    for (p, (ap, dp)) in ar.iter_mut().zip(dr).enumerate() {
                        // Fully written this chunk; a cast as in `row_i4g64_big`.
                        let dp = &*(dp as *const _ as *const [__m512i; 16]);
                        let mut v = [zero; 8];
                        for (i, vi) in v.iter_mut().enumerate() {
                            *vi = u3_pair(dp[2 * i], dp[2 * i + 1]);
                        }
                        *ap = accumulate16(
                            *ap,
                            reduce16(&v),
                            2,
                            xg.add(p * xgs + g0),
                            s.add(r * spr + g0),
                            groups - g0,
                        );
                    }
                }
                g0 += 16;
            }
            for (r, ar) in acc.iter().enumerate() {
                for (p, &ap) in ar.iter().enumerate() {
                    *out.add(r * P + p) = reduce_f32(ap);
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
}

/// The AVX-512BW build (no VNNI).
pub(super) mod bw {
    avx512_kernels!("avx512f,avx512bw,avx512vl", dp_bw, dp2_bw, false);
}

/// `16` lanes of `n - i` remaining (all when 16 or more).
#[inline]
pub(super) fn mask16(left: usize) -> __mmask16 {
    if left >= 16 {
        0xFFFF
    } else {
        (1u16 << left) - 1
    }
}

/// f32 dot of `n` elements: four chains of 16 fused products, the tail
/// masked into the first.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn dot_f32(a: *const f32, b: *const f32, n: usize) -> f32 {
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
pub(super) unsafe fn dot_f32_cols(
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
pub(super) unsafe fn dot_f32_gather(
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
pub(super) unsafe fn axpy_f32_gather(
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
pub(super) unsafe fn axpy_f32(acc: *mut f32, c: f32, x: *const f32, n: usize) {
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
pub(super) unsafe fn axpy_i8(acc: *mut f32, c: f32, x: *const i8, n: usize) {
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
pub(super) unsafe fn axpy_i8_rows(
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
pub(super) unsafe fn amax(x: *const f32, n: usize) -> f32 {
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
pub(super) unsafe fn read_sum(p: *const u8, n: usize) -> u64 {
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
    (_mm512_reduce_add_epi64(v) as u64).wrapping_add(super::super::scalar::read_sum(tail))
}

/// `n` f32 at `x` to int8 at `q`, natural order, as `scalar::quant_i8`:
/// the quotient is clamped to [-127, 127] in f32 (the same result as
/// clamping after rounding), converted with the default round-to-nearest-
/// even mode (`round_ties_even`), and NaN lanes give 0.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn quant_i8(x: *const f32, scale: f32, q: *mut i8, n: usize) {
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
