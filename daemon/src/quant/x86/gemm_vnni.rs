//! Register-blocked integer GEMM tiles for the multi-position (prefill) products of the per-row
//! int8 and int4 formats, in two builds from one source like `avx512.rs`: `vnni` (the u8 x i8
//! dot is one `vpdpbusd`) and `bw` (`vpmaddubsw` + `vpmaddwd`).
//!
//! A tile is `R` weight rows x `P` positions (`R`, `P` <= 4): every 64-byte weight block is
//! loaded and (for int4) unpacked once per row and meets all `P` positions, each activation
//! vector is loaded once per position and meets all `R` rows, and the `R * P` accumulators
//! stay in registers for the whole row.  The end is vectorized too: the `R * P` exact i32 sums
//! are reduced together (one transpose-and-add tree instead of a horizontal sum each), the
//! format's offset is taken off (`8 * xsum` for int4, `128 * xsum` for the VNNI int8 bias),
//! and each lane gets the same two IEEE operations as `QMatrix::finish_i8`:
//! `(i as f32) * (sx * ws)`.  So every output is the portable kernel's, bit for bit.
//!
//! # Safety (all functions)
//! Callers must have verified at run time that the CPU supports every feature in the build's
//! `target_feature` list (see `x86/mod.rs`), and that the pointers are valid for the element
//! counts stated on [`vnni::tile`].  Weight tails are masked loads (masked-off bytes are not
//! touched); activations are read in whole 64-byte vectors, inside the zero padded rows.
//!
//! Exactness: as in `avx512.rs`: int4 nibbles (<= 15) and the BW build's `|w|` (<= 128) times
//! activations in [-127, 127] never saturate `vpmaddubsw`; VNNI sums into i32 directly; the
//! i32 sums wrap only where the true sum would not fit (never for rows under 2^17 inputs).

use core::arch::x86_64::*;

use super::super::act::ACT_BLOCK;
use super::avx2;

/// u8 x i8 products summed in fours into `acc` (VNNI).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dp_vnni(acc: __m512i, u: __m512i, x: __m512i) -> __m512i {
    _mm512_dpbusd_epi32(acc, u, x)
}

/// The same sums without VNNI (exact: see the module docs).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn dp_bw(acc: __m512i, u: __m512i, x: __m512i) -> __m512i {
    let p = _mm512_maddubs_epi16(u, x);
    _mm512_add_epi32(acc, _mm512_madd_epi16(p, _mm512_set1_epi16(1)))
}

/// `lo x0 + hi x1` of one int4 block into `acc` (VNNI: two chained `vpdpbusd`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dpu4_vnni(acc: __m512i, lo: __m512i, x0: __m512i, hi: __m512i, x1: __m512i) -> __m512i {
    _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc, lo, x0), hi, x1)
}

/// The same without VNNI: a nibble pair is at most 2 * 15 * 127 = 3810, the i16 sum of the
/// two `maddubs` at most 7620 (exact), then one `vpmaddwd` widens.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn dpu4_bw(acc: __m512i, lo: __m512i, x0: __m512i, hi: __m512i, x1: __m512i) -> __m512i {
    let p = _mm512_add_epi16(_mm512_maddubs_epi16(lo, x0), _mm512_maddubs_epi16(hi, x1));
    _mm512_add_epi32(acc, _mm512_madd_epi16(p, _mm512_set1_epi16(1)))
}

/// Where [`sum16`]'s add tree leaves the total of input `i` before its last permute: input
/// `4j + k` ends in lane `4k + j`.
const SUM16_IDX: [i32; 16] = [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15];

macro_rules! gemm_kernels {
    ($features:literal, $dp:ident, $dpu4:ident, $vnni:literal) => {
        use core::arch::x86_64::*;

        use super::super::prefetch_ahead;
        use super::{$dp, $dpu4, SUM16_IDX};

        /// 64 weight bytes at `p`, or only the first `n` (the rest 0) when `n < 64`.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn load_w(p: *const u8, n: usize) -> __m512i {
            if n >= 64 {
                _mm512_loadu_si512(p as *const _)
            } else {
                _mm512_maskz_loadu_epi8((1u64 << n) - 1, p as *const i8)
            }
        }

        /// Lane `i` of the result is the (wrapping, so exact) sum of the 16 i32 lanes of
        /// `v[i]`: a transpose-and-add tree, 128-bit halves, then quarters, then in-lane.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn sum16(v: &[__m512i; 16]) -> __m512i {
            let zero = _mm512_setzero_si512();
            // a[i], 128-bit lanes: [v2i (L0+L2), v2i (L1+L3), v2i+1 (..), v2i+1 (..)].
            let mut a = [zero; 8];
            for (i, ai) in a.iter_mut().enumerate() {
                let (x, y) = (v[2 * i], v[2 * i + 1]);
                *ai = _mm512_add_epi32(
                    _mm512_shuffle_i32x4::<0x44>(x, y),
                    _mm512_shuffle_i32x4::<0xEE>(x, y),
                );
            }
            // b[j], 128-bit lane k: four partial sums of v[4j + k].
            let mut b = [zero; 4];
            for (j, bj) in b.iter_mut().enumerate() {
                let (x, y) = (a[2 * j], a[2 * j + 1]);
                *bj = _mm512_add_epi32(
                    _mm512_shuffle_i32x4::<0x88>(x, y),
                    _mm512_shuffle_i32x4::<0xDD>(x, y),
                );
            }
            let q01 = _mm512_add_epi32(
                _mm512_unpacklo_epi32(b[0], b[1]),
                _mm512_unpackhi_epi32(b[0], b[1]),
            );
            let q23 = _mm512_add_epi32(
                _mm512_unpacklo_epi32(b[2], b[3]),
                _mm512_unpackhi_epi32(b[2], b[3]),
            );
            // Lane 4k + j: the total of b[j]'s lane k, that is of v[4j + k].
            let r = _mm512_add_epi32(
                _mm512_unpacklo_epi64(q01, q23),
                _mm512_unpackhi_epi64(q01, q23),
            );
            _mm512_permutexvar_epi32(_mm512_loadu_si512(SUM16_IDX.as_ptr() as *const _), r)
        }

        /// `R` weight rows (`rb` bytes each, `rb` apart at `w`) x `P` positions (int8
        /// activations `xs` apart at `x`, in the format's layout, zero padded to whole
        /// 128-element blocks): `out[p * R + r] = (i as f32) * (sx[p] * ws[r])` with `i` the
        /// exact `sum q_w x` of row `r` and position `p` (for int4 `sum u x - 8 xsum[p]`).
        /// `U4`: packed int4 (split-layout `x`, `128 * ceil(rb / 64)` elements a position),
        /// else int8 (`rb` elements, natural layout).  `pf`: weight bytes to prefetch ahead of
        /// each line read (0: none; a hint, never a result).  `R`, `P` in `1..=4`.
        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = $features)]
        pub(in super::super) unsafe fn tile<const R: usize, const P: usize, const U4: bool>(
            w: *const u8,
            rb: usize,
            x: *const i8,
            xs: usize,
            xsum: *const i32,
            sx: *const f32,
            ws: *const f32,
            pf: usize,
            out: *mut f32,
        ) {
            let zero = _mm512_setzero_si512();
            let mut acc = [[zero; R]; P];
            let mut j = 0;
            if U4 {
                let m4 = _mm512_set1_epi8(0x0F);
                while j < rb {
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
                        let b = load_w(w.add(r * rb + j), rb - j);
                        let lo = _mm512_and_si512(b, m4);
                        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(b), m4);
                        for (ap, &(x0, x1)) in acc.iter_mut().zip(&xv) {
                            ap[r] = $dpu4(ap[r], lo, x0, hi, x1);
                        }
                    }
                    j += 64;
                }
            } else {
                let bias = _mm512_set1_epi8(-128);
                while j < rb {
                    let mut xv = [zero; P];
                    for (p, xp) in xv.iter_mut().enumerate() {
                        *xp = _mm512_loadu_si512(x.add(p * xs + j) as *const _);
                    }
                    for r in 0..R {
                        prefetch_ahead(w.add(r * rb + j), pf);
                        // Masked-off tail bytes meet x = 0 (padding) either way.
                        let w0 = load_w(w.add(r * rb + j), rb - j);
                        if $vnni {
                            // Offset weights w + 128 (unsigned), the offset taken off at the end.
                            let u = _mm512_xor_si512(w0, bias);
                            for (ap, &xp) in acc.iter_mut().zip(&xv) {
                                ap[r] = $dp(ap[r], u, xp);
                            }
                        } else {
                            // |w| (128 stays 0x80 = 128 as u8) times sign(w) x.
                            let neg = _mm512_movepi8_mask(w0);
                            let a = _mm512_abs_epi8(w0);
                            for (ap, &xp) in acc.iter_mut().zip(&xv) {
                                ap[r] = $dp(ap[r], a, _mm512_mask_sub_epi8(xp, neg, zero, xp));
                            }
                        }
                    }
                    j += 64;
                }
            }
            // Lane p * R + r of every per-lane vector below belongs to output (r, p).
            let mut v = [zero; 16];
            let (mut off, mut sxl, mut wsl) = ([0i32; 16], [0f32; 16], [0f32; 16]);
            for p in 0..P {
                for r in 0..R {
                    v[p * R + r] = acc[p][r];
                    off[p * R + r] = *xsum.add(p);
                    sxl[p * R + r] = *sx.add(p);
                    wsl[p * R + r] = *ws.add(r);
                }
            }
            let raw = sum16(&v);
            let shift = if U4 {
                3
            } else if $vnni {
                7
            } else {
                0
            };
            let i = if shift == 0 {
                raw
            } else {
                let o = _mm512_loadu_si512(off.as_ptr() as *const _);
                _mm512_sub_epi32(raw, _mm512_sll_epi32(o, _mm_cvtsi32_si128(shift)))
            };
            let scale = _mm512_mul_ps(_mm512_loadu_ps(sxl.as_ptr()), _mm512_loadu_ps(wsl.as_ptr()));
            let y = _mm512_mul_ps(_mm512_cvtepi32_ps(i), scale);
            let k: __mmask16 = if R * P >= 16 {
                0xFFFF
            } else {
                (1u16 << (R * P)) - 1
            };
            _mm512_mask_storeu_ps(out, k, y);
        }
    };
}

/// The AVX-512 VNNI build.
pub(super) mod vnni {
    gemm_kernels!(
        "avx512f,avx512bw,avx512vl,avx512vnni",
        dp_vnni,
        dpu4_vnni,
        true
    );
}

/// The AVX-512BW build (no VNNI).
pub(super) mod bw {
    gemm_kernels!("avx512f,avx512bw,avx512vl", dp_bw, dpu4_bw, false);
}

// ---------------------------------------------------------------------------
// Safe wrappers (the kernel set's `gemm_i8` / `gemm_u4`)
// ---------------------------------------------------------------------------

/// Stamp out the safe wrappers of one build's GEMM tiles (see `gemm_vnni.rs`): `nr` rows of
/// `rb` bytes x `np` positions, both in `1..=4`; a `(4, np)` or `(1, np)` kernel, `nr` of 2 or
/// 3 as that many one-row tiles.
macro_rules! gemm_wrappers {
    ($m:path, $i8:ident, $u4:ident) => {
        #[allow(clippy::too_many_arguments)]
        pub(super) fn $i8(
            w: &[u8],
            rb: usize,
            nr: usize,
            x: &[i8],
            xs: usize,
            np: usize,
            xsum: &[i32],
            sx: &[f32],
            ws: &[f32],
            pf: usize,
            out: &mut [f32],
        ) {
            gemm_checked::<false>(w, rb, nr, x, xs, np, xsum, sx, ws, out);
            use $m as k;
            // SAFETY: features detected; the lengths every call reads were checked above.
            unsafe { gemm_dispatch!(k, false, w, rb, nr, x, xs, np, xsum, sx, ws, pf, out) }
        }

        #[allow(clippy::too_many_arguments)]
        pub(super) fn $u4(
            w: &[u8],
            rb: usize,
            nr: usize,
            x: &[i8],
            xs: usize,
            np: usize,
            xsum: &[i32],
            sx: &[f32],
            ws: &[f32],
            pf: usize,
            out: &mut [f32],
        ) {
            gemm_checked::<true>(w, rb, nr, x, xs, np, xsum, sx, ws, out);
            use $m as k;
            // SAFETY: features detected; the lengths every call reads were checked above.
            unsafe { gemm_dispatch!(k, true, w, rb, nr, x, xs, np, xsum, sx, ws, pf, out) }
        }
    };
}

/// The `match` from a run-time `np` to the const-generic `($r, np)` tile (inside `unsafe`).
macro_rules! gemm_np {
    ($k:ident, $r:literal, $u4:literal, $np:expr, $($a:expr),*) => {
        match $np {
            1 => $k::tile::<$r, 1, $u4>($($a),*),
            2 => $k::tile::<$r, 2, $u4>($($a),*),
            3 => $k::tile::<$r, 3, $u4>($($a),*),
            _ => $k::tile::<$r, 4, $u4>($($a),*),
        }
    };
}

/// The `match` from run-time `(nr, np)` to the const-generic tiles (inside `unsafe`): a
/// `(4, np)` tile, or `nr` one-row tiles whose outputs go to `p * nr + j`.
macro_rules! gemm_dispatch {
    ($k:ident, $u4:literal, $w:ident, $rb:ident, $nr:ident, $x:ident, $xs:ident, $np:ident,
     $xsum:ident, $sx:ident, $ws:ident, $pf:ident, $out:ident) => {{
        let (w, x, xsum, sx, ws) = (
            $w.as_ptr(),
            $x.as_ptr(),
            $xsum.as_ptr(),
            $sx.as_ptr(),
            $ws.as_ptr(),
        );
        if $nr == 4 {
            let o = $out.as_mut_ptr();
            gemm_np!($k, 4, $u4, $np, w, $rb, x, $xs, xsum, sx, ws, $pf, o)
        } else {
            let mut one = [0f32; 4];
            for j in 0..$nr {
                let o = one.as_mut_ptr();
                gemm_np!(
                    $k,
                    1,
                    $u4,
                    $np,
                    w.add(j * $rb),
                    $rb,
                    x,
                    $xs,
                    xsum,
                    sx,
                    ws.add(j),
                    $pf,
                    o
                );
                for p in 0..$np {
                    $out[p * $nr + j] = one[p];
                }
            }
        }
    }};
}

/// Length checks of a GEMM tile: `nr` rows of `rb` bytes, `np` positions `xs` apart each
/// reading the whole 64-byte vectors its row needs, one `xsum`, `sx` per position, one `ws`
/// per row, `nr * np` outputs.
#[allow(clippy::too_many_arguments)]
fn gemm_checked<const U4: bool>(
    w: &[u8],
    rb: usize,
    nr: usize,
    x: &[i8],
    xs: usize,
    np: usize,
    xsum: &[i32],
    sx: &[f32],
    ws: &[f32],
    out: &[f32],
) {
    let need = if U4 {
        rb.div_ceil(64) * ACT_BLOCK
    } else {
        rb.div_ceil(64) * 64
    };
    assert!(
        (1..=4).contains(&nr) && (1..=4).contains(&np),
        "gemm tile shape"
    );
    assert!(rb > 0 && w.len() >= nr * rb, "gemm weights too short");
    assert!(np == 1 || xs >= need, "gemm positions overlap");
    assert!(
        x.len() >= (np - 1) * xs + need,
        "gemm activations too short"
    );
    assert!(xsum.len() >= np && sx.len() >= np && ws.len() >= nr && out.len() >= nr * np);
}

gemm_wrappers!(vnni, vnni_gemm_i8, vnni_gemm_u4);
gemm_wrappers!(bw, bw_gemm_i8, bw_gemm_u4);

/// The AVX2 GEMM tiles (`vpmaddubsw` + `vpmaddwd`; 16 registers hold one row x 4 positions, as
/// the AVX2 prefill tile): each of the `nr` rows as one `(1, np)` tile of exact sums, then
/// `QMatrix::finish_i8`'s operations on each. `U4`: int4 rows (else int8); no prefetch (`_pf`).
#[allow(clippy::too_many_arguments)]
pub(super) fn avx2_gemm<const U4: bool>(
    w: &[u8],
    rb: usize,
    nr: usize,
    x: &[i8],
    xs: usize,
    np: usize,
    xsum: &[i32],
    sx: &[f32],
    ws: &[f32],
    _pf: usize,
    out: &mut [f32],
) {
    gemm_checked::<U4>(w, rb, nr, x, xs, np, xsum, sx, ws, out);
    let mut raw = [0i32; 4];
    for r in 0..nr {
        let (wr, xp, o) = (w[r * rb..].as_ptr(), x.as_ptr(), raw.as_mut_ptr());
        // SAFETY: features detected (avx2, checked where the set is built); row `r` holds `rb`
        // bytes and every position the elements its row needs, `xs` apart (checked above);
        // `raw` holds the `np <= 4` sums.
        unsafe {
            macro_rules! one_row {
                ($p:literal) => {
                    if U4 {
                        avx2::dot_u4_tile::<1, $p>(wr, rb, rb, xp, xs, 0, o)
                    } else {
                        avx2::dot_i8_tile::<1, $p>(wr as *const i8, rb, xp, xs, rb, 0, o)
                    }
                };
            }
            match np {
                1 => one_row!(1),
                2 => one_row!(2),
                3 => one_row!(3),
                _ => one_row!(4),
            }
        }
        for p in 0..np {
            let i = if U4 {
                raw[p].wrapping_sub(8i32.wrapping_mul(xsum[p]))
            } else {
                raw[p]
            };
            out[p * nr + r] = i as f32 * (sx[p] * ws[r]);
        }
    }
}
