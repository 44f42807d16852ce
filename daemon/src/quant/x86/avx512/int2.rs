//! The int2 tile of the two AVX-512 builds: `R` packed int2 rows against `P` split2-layout
//! positions, each weight byte loaded once for the tile and each activation vector once per
//! position, and (decode) every line of the weight stream asked for ahead of its use as the
//! int4 tiles do. The one-row `dot_i2` left the stream to whole-row prefetches between calls
//! and read 16.4 GB/s of a 26 GB/s memory at DeepSeek-V3's expert shapes.
//!
//! A macro of its own, expanded in `vnni` and `bw` after `avx512_kernels!`, whose imports,
//! `load64` and `$dp` it uses.

macro_rules! avx512_int2_kernels {
    ($features:literal, $dp:ident, $vnni:literal) => {
        /// `R` int2 rows (`rb` bytes apart, `nb` each) x `P` split2-layout positions (`xs`
        /// apart, `256 * ceil(nb / 64)` elements each): `out[r * P + p] = sum u x` (exact),
        /// `u` the stored 2-bit field, as [`dot_i2`]. `pf`: weight bytes to prefetch ahead
        /// (see `prefetch_ahead`).
        ///
        /// The VNNI build's small tiles (`R * P <= 4`, decode's `4 x 1`) take field `f` in
        /// place, `b & (3 << 2f)`, which is `4^f u`: one `vpand` a field instead of a shift
        /// and a mask. Each field then has its own accumulator, whose lanes are sums of
        /// multiples of `4^f` and are divided back exactly by an arithmetic shift before
        /// the fields are added. Exact while a lane stays below 2^31: a field-3 lane gains
        /// at most `4 * 192 * 127 < 2^17` a block, so rows up to 2^14 blocks (1 MiB), far
        /// past `MAX_I32_ROW_COLS`. (`vpmaddubsw` would saturate on `192 * 127 * 2`, so the
        /// BW build, and the big tiles whose 4 accumulators an output would not fit the
        /// registers, shift each field down and keep one accumulator an output.)
        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = $features)]
        pub(in super::super) unsafe fn dot_i2_tile<const R: usize, const P: usize>(
            w: *const u8,
            rb: usize,
            nb: usize,
            x: *const i8,
            xs: usize,
            pf: usize,
            out: *mut i32,
        ) {
            let in_place = $vnni && R * P <= 4;
            let zero = _mm512_setzero_si512();
            let m3 = _mm512_set1_epi8(3);
            let field_mask = [
                m3,
                _mm512_set1_epi8(0x0C),
                _mm512_set1_epi8(0x30),
                _mm512_set1_epi8(0xC0u8 as i8),
            ];
            let mut acc = [[[zero; 4]; P]; R];
            let mut j = 0;
            while j < nb {
                let mut b = [zero; R];
                for (r, br) in b.iter_mut().enumerate() {
                    prefetch_ahead(w.add(r * rb + j), pf);
                    // Bytes past the row load as 0 (u = 0).
                    *br = load64(w.add(r * rb + j) as *const i8, nb - j);
                }
                for f in 0..4 {
                    let mut xv = [zero; P];
                    for (p, xp) in xv.iter_mut().enumerate() {
                        *xp = _mm512_loadu_si512(x.add(p * xs + 4 * j + 64 * f) as *const _);
                    }
                    for (ar, &br) in acc.iter_mut().zip(&b) {
                        let (u, a) = if in_place {
                            (_mm512_and_si512(br, field_mask[f]), f)
                        } else {
                            let d = match f {
                                0 => br,
                                1 => _mm512_srli_epi16::<2>(br),
                                2 => _mm512_srli_epi16::<4>(br),
                                _ => _mm512_srli_epi16::<6>(br),
                            };
                            (_mm512_and_si512(d, m3), 0)
                        };
                        for (ap, &xp) in ar.iter_mut().zip(&xv) {
                            ap[a] = $dp(ap[a], u, xp);
                        }
                    }
                }
                j += 64;
            }
            for (r, ar) in acc.iter().enumerate() {
                for (p, ap) in ar.iter().enumerate() {
                    let s = if in_place {
                        _mm512_add_epi32(
                            _mm512_add_epi32(ap[0], _mm512_srai_epi32::<2>(ap[1])),
                            _mm512_add_epi32(
                                _mm512_srai_epi32::<4>(ap[2]),
                                _mm512_srai_epi32::<6>(ap[3]),
                            ),
                        )
                    } else {
                        ap[0]
                    };
                    *out.add(r * P + p) = _mm512_reduce_add_epi32(s);
                }
            }
        }
    };
}
