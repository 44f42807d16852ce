//! int3-g64 decode rows where the CPU has GFNI and AVX-512 VBMI besides VNNI: the same
//! exact group sums as `int3.rs`'s kernels (so every output's bits), in about 6.6 vector
//! operations a group where `int3.rs`'s tile takes about 9.
//!
//! `int3.rs` unpacks a group in six operations (a variable shift and a mask for the low
//! plane, a byte shuffle, a bit test and a masked add for the high plane, then the dot) and
//! reduces each group's 16 lanes through a scratch array and a cross-lane pairing. Here the
//! low plane's field `f` comes out of one `vgf2p8affineqb` (a per-64-bit-lane bit matrix
//! taking bits `2f, 2f+1` of each byte to bits 0, 1), the high plane's bit of each element
//! out of one `vpmultishiftqb` (each byte takes the 8 bits from the element's bit less 2),
//! and one `vpternlogd` joins them (`l | (h & 4)`). The group sums are then reduced in
//! registers as they come: two levels of `halve` (an i32 -> i16 pack and a `vpmaddwd`)
//! leave four groups' sums per 128-bit lane, and two cross-lane adds finish sixteen groups
//! in order. The `int3.rs` tile computed 13-14 GB/s of int3 weights a core from L2, against
//! 30-33 for int4-g64, and left the int3-g64 decode probe at 17.9 GB/s of a 26 GB/s memory;
//! these rows compute 16-17 (`bench_decode_hot`, the same run). A transposed form (one
//! vector holding the same field of four groups, the activations' 128-bit lanes moved to
//! match, a `vpdpbusd` chain a quad and no cross-lane pairing) took about 6 operations a
//! group instead of 6.6 and measured the same (15.9-18.2 against 16.1-18.8 GB/s, A B B A),
//! so it was not kept.
//!
//! # Safety
//! As `avx512.rs`: callers have detected every feature in the `target_feature` list below
//! and pass pointers valid for the stated counts.

use core::arch::x86_64::*;

use super::super::prefetch_ahead;
use super::vnni::{accumulate16, reduce_f32};

/// The `vgf2p8affineqb` matrix of each 64-bit lane (128-bit lane `f`): output bit `i` is
/// the parity of input byte AND matrix byte `7 - i`, so bytes 7 and 6 select bits `2f` and
/// `2f + 1` into bits 0 and 1, and the zero bytes clear bits 2..8.
const LO_MATRIX: [u64; 8] = {
    let mut m = [0u64; 8];
    let mut q = 0;
    while q < 8 {
        let f = q / 2;
        m[q] = (1u64 << (2 * f)) << 56 | (1u64 << (2 * f + 1)) << 48;
        q += 1;
    }
    m
};

/// The `vpmultishiftqb` controls: byte `p = 16f + j` (element `4j + f`, the int3 layout)
/// takes the 8 bits of the high plane from bit `4j + f - 2` (mod 64), so the element's bit
/// lands on bit 2, its value 4.
#[repr(align(64))]
struct Ctrl([u8; 64]);
static HI_CTRL: Ctrl = Ctrl({
    let mut t = [0u8; 64];
    let mut p = 0;
    while p < 64 {
        let (f, j) = (p / 16, p % 16);
        t[p] = ((4 * j + f + 62) % 64) as u8;
        p += 1;
    }
    t
});

/// The constants of [`u3_group`]: the low-plane matrices, the high-plane controls, 4s.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,gfni")]
unsafe fn unpack_consts() -> (__m512i, __m512i, __m512i) {
    (
        _mm512_loadu_si512(LO_MATRIX.as_ptr() as *const _),
        _mm512_loadu_si512(HI_CTRL.0.as_ptr() as *const _),
        _mm512_set1_epi8(4),
    )
}

/// One int3 group (24 bytes at `grp`) as 64 `u` bytes in the int3 activation layout
/// (position `16f + j` holds element `4j + f`), as `int3.rs`'s `u3_group`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,gfni")]
unsafe fn u3_group(grp: *const u8, (lo_m, hi_c, four): (__m512i, __m512i, __m512i)) -> __m512i {
    let lo = _mm512_broadcast_i32x4(_mm_loadu_si128(grp as *const __m128i));
    let l = _mm512_gf2p8affine_epi64_epi8::<0>(lo, lo_m);
    let hi = _mm512_set1_epi64((grp.add(16) as *const i64).read_unaligned());
    let h = _mm512_multishift_epi64_epi8(hi_c, hi);
    // l | (h & 4): A | (B & C) is 0xF0 | (0xCC & 0xAA).
    _mm512_ternarylogic_epi32::<0xF8>(l, h, four)
}

/// Adjacent i32 lanes of `a` and `b` summed in pairs, per 128-bit lane `[a0 + a1, a2 + a3,
/// b0 + b1, b2 + b3]` (`avx512.rs`'s `halve`). Exact here: a group's dot lane sums 4
/// products of at most `7 * 127` (3556), a first-level lane 8 (7112), both within i16.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,gfni")]
unsafe fn halve(a: __m512i, b: __m512i) -> __m512i {
    _mm512_madd_epi16(_mm512_packs_epi32(a, b), _mm512_set1_epi16(1))
}

/// 128-bit lanes of `a` and `b` summed in pairs: `[a0 + a1, a2 + a3, b0 + b1, b2 + b3]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,gfni")]
unsafe fn lanes_pair(a: __m512i, b: __m512i) -> __m512i {
    _mm512_add_epi32(
        _mm512_shuffle_i32x4::<0x88>(a, b),
        _mm512_shuffle_i32x4::<0xDD>(a, b),
    )
}

/// `R` int3-g64 rows (`rb` bytes apart, `groups` 24-byte groups each, scales `spr` apart
/// at `s`) at one int3-layout position (`x`, its group sums `xg`): `out[r]` is
/// `row_i3g64` of row `r`, bit for bit (the same exact group sums, then the shared float
/// order). `pf` as in `int3.rs`'s `row_i3g64_tile`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,gfni")]
pub(in super::super) unsafe fn row_i3g64_rows<const R: usize>(
    w: *const u8,
    rb: usize,
    x: *const i8,
    xg: *const i32,
    s: *const f32,
    spr: usize,
    groups: usize,
    pf: usize,
    out: *mut f32,
) {
    let spf = if pf == 0 { 0 } else { pf / rb * spr * 4 };
    let consts = unpack_consts();
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); R];
    let mut g0 = 0;
    while g0 < groups {
        let n = (groups - g0).min(16);
        for r in 0..R {
            prefetch_ahead(s.add(r * spr + g0) as *const u8, spf);
        }
        // Quad `c`'s four group sums, per 128-bit lane, then quads 0-1 and 2-3 paired.
        let mut q = [[zero; 4]; R];
        for c in 0..n.div_ceil(4) {
            // Groups past the row's last are neither loaded nor read (the activations are
            // padded to whole 128-element blocks only).
            let mut xv = [zero; 4];
            for (i, xi) in xv.iter_mut().enumerate().take(n - 4 * c) {
                *xi = _mm512_loadu_si512(x.add(64 * (g0 + 4 * c + i)) as *const _);
            }
            for (r, qr) in q.iter_mut().enumerate() {
                let mut d = [zero; 4];
                for (i, di) in d.iter_mut().enumerate().take(n - 4 * c) {
                    let g = g0 + 4 * c + i;
                    if g % 8 == 0 {
                        // Eight 24-byte groups fill three lines.
                        for line in 0..3 {
                            prefetch_ahead(w.add(r * rb + 24 * g + 64 * line), pf);
                        }
                    }
                    let u = u3_group(w.add(r * rb + 24 * g), consts);
                    *di = _mm512_dpbusd_epi32(zero, u, xv[i]);
                }
                qr[c] = halve(halve(d[0], d[1]), halve(d[2], d[3]));
            }
        }
        for (r, (ar, qr)) in acc.iter_mut().zip(&q).enumerate() {
            // Lane L of the result: groups 4L..4L + 4, in order.
            let gi = lanes_pair(lanes_pair(qr[0], qr[1]), lanes_pair(qr[2], qr[3]));
            *ar = accumulate16(*ar, gi, 2, xg.add(g0), s.add(r * spr + g0), groups - g0);
        }
        g0 += 16;
    }
    for (r, &ar) in acc.iter().enumerate() {
        *out.add(r) = reduce_f32(ar);
    }
}
