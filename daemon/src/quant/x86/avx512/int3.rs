//! The int3-g64 kernels of the two AVX-512 builds: a group's two bit planes unpacked to the
//! int3 activation layout (`u3_group`), the single-row dot and its `R x P` tile. A macro of
//! its own so the format's unpacking and its tile read apart from the int8/int4/int2 kernels;
//! it is expanded in `vnni` and `bw` right after `avx512_kernels!`, whose imports, `$dp` and
//! reductions (`reduce16`, `accumulate16`, `reduce_f32`) it uses.

macro_rules! avx512_int3_kernels {
    ($features:literal, $dp:ident) => {
        use super::super::{T3_HI_BITS, T3_HI_IDX};

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
