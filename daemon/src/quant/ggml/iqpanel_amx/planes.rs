//! IQ2_XXS and IQ2_S straight into the AMX panel's hi/lo planes, with no signed-byte pass
//! between (issue 49: the unpack and its fold were a large part of the IQ2_XXS kernel's
//! time at 512 positions, and nearly all of it at a few positions an expert). IQ2_XS was
//! tried the same way and measured no faster than its unpacker folded (`bench_iq2_planes`),
//! so it keeps that path.
//!
//! Their grids hold only three values (8, 25, 43), so a weight is known by a 3-bit code
//! (value index, sign) and its group's 4-bit scale index `s` (`ls = 2 s + 1`): 128 cases.
//! Two 128-byte tables hold every case's `v >> 6` and `v & 63` (`v = +-value x ls`, the
//! folded weight the panel splits), and one `vpermt2b` a plane turns 64 indices into 64
//! plane bytes, a whole tile row. The grid rows are kept as their value indices (one byte
//! each), so a chunk of 64 weights is eight table loads, an OR of the scale indices, a
//! masked add of the sign bit and two permutes; every plane byte is the split of the same
//! `v` the generic path (`fold_split`) computes, as the tests check byte by byte.

use std::arch::x86_64::*;

use super::super::x86::f16_one;
use super::{Unpacked, R, ROW};
use crate::gguf::grids::*;
use crate::gguf::iq::decode_grid;

/// A decoded 8-wide grid's rows as their value indices (0..2), one byte each, little-endian.
const fn code_rows<const N: usize>(g: [[u8; 8]; N]) -> [u64; N] {
    let mut out = [0u64; N];
    let mut r = 0;
    while r < N {
        let mut c = 0;
        while c < 8 {
            out[r] |= (g[r][c] as u64) << (8 * c);
            c += 1;
        }
        r += 1;
    }
    out
}

static IQ2XXS_CODES: [u64; IQ2XXS_ROWS] = code_rows(decode_grid::<IQ2XXS_ROWS, 8>(IQ2XXS_HEX, 2));
static IQ2S_CODES: [u64; IQ2S_ROWS] = code_rows(decode_grid::<IQ2S_ROWS, 8>(IQ2S_HEX, 2));

/// Both planes' bytes of every case: index `8 s + 4 negative + value index` (values 3 and 7
/// of a scale's eight are never indexed: 0).
#[repr(C, align(64))]
struct SplitTable {
    hi: [i8; 128],
    lo: [i8; 128],
}

const fn split_table(map: [f32; 3]) -> SplitTable {
    let mut t = SplitTable {
        hi: [0; 128],
        lo: [0; 128],
    };
    let mut i = 0;
    while i < 128 {
        let (s, neg, code) = (i >> 3, (i >> 2) & 1, i & 3);
        if code < 3 {
            let m = map[code] as i32 * (2 * s as i32 + 1);
            let v = if neg == 1 { -m } else { m };
            t.hi[i] = (v >> 6) as i8;
            t.lo[i] = (v & 63) as i8;
        }
        i += 1;
    }
    t
}

/// The two grids share their values.
static IQ2_SPLIT: SplitTable = split_table(IQ2XXS_MAP);
const _: () = assert!(same_map(IQ2XXS_MAP, IQ2S_MAP));

const fn same_map(a: [f32; 3], b: [f32; 3]) -> bool {
    a[0] == b[0] && a[1] == b[1] && a[2] == b[2]
}

/// Inputs `64 chunk .. 64 chunk + 64` of row `r`: eight grid rows of value indices
/// (`codes`), negated where their bit of `signs` is set (bit `8 l + j`: element `j` of row
/// `l`), each 16 elements' scale index in `scales` (as `8 s` bytes), through the table into
/// both planes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
fn chunk(u: &mut Unpacked, r: usize, chunk: usize, codes: [u64; 8], signs: u64, scales: __m512i) {
    let c = codes.map(|v| v as i64);
    let idx = _mm512_set_epi64(c[7], c[6], c[5], c[4], c[3], c[2], c[1], c[0]);
    let idx = _mm512_or_si512(idx, scales);
    let idx = _mm512_mask_add_epi8(idx, signs, idx, _mm512_set1_epi8(4));
    let t = &IQ2_SPLIT;
    // SAFETY: each table half is 64 readable bytes of a 64-byte aligned struct.
    let (h0, h1, l0, l1) = unsafe {
        (
            _mm512_load_si512(t.hi.as_ptr() as *const _),
            _mm512_load_si512(t.hi.as_ptr().add(64) as *const _),
            _mm512_load_si512(t.lo.as_ptr() as *const _),
            _mm512_load_si512(t.lo.as_ptr().add(64) as *const _),
        )
    };
    let hi = _mm512_permutex2var_epi8(h0, idx, h1);
    let lo = _mm512_permutex2var_epi8(l0, idx, l1);
    let (dh, dl): (&mut [i8; ROW], &mut [i8; ROW]) = (&mut u.hi[chunk][r], &mut u.lo[chunk][r]);
    // SAFETY: `dh` and `dl` are 64 writable bytes each; the stores are unaligned.
    unsafe {
        _mm512_storeu_si512(dh.as_mut_ptr() as *mut _, hi);
        _mm512_storeu_si512(dl.as_mut_ptr() as *mut _, lo);
    }
}

/// Two bytes of two 4-bit scale indices each (low nibble first) as [`scales4`].
#[inline]
#[target_feature(enable = "avx512f")]
fn nibble_scales(a: u8, c: u8) -> __m512i {
    scales4([a & 15, a >> 4, c & 15, c >> 4])
}

/// Four sixteen-element scale indices as the four 128-bit lanes' `8 s` bytes.
#[inline]
#[target_feature(enable = "avx512f")]
fn scales4(s: [u8; 4]) -> __m512i {
    let b = s.map(|s| (s as u64 * 8 * 0x0101_0101_0101_0101) as i64);
    _mm512_set_epi64(b[3], b[3], b[2], b[2], b[1], b[1], b[0], b[0])
}

/// Four KSIGNS sign bytes of 7-bit indices `aux >> 7 l` as one 32-bit mask.
#[inline]
fn ksigns4(aux: u32) -> u64 {
    u32::from_le_bytes(std::array::from_fn(|l| {
        KSIGNS[((aux >> (7 * l)) & 127) as usize]
    })) as u64
}

#[inline]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// IQ2_XXS (66 bytes: f16 scale, then per 32 elements four grid indices and a word of four
/// 7-bit sign indices and the 4-bit scale on top).
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vbmi")]
pub(super) fn iq2_xxs(b: &[u8], u: &mut Unpacked, r: usize) -> (f32, f32) {
    debug_assert!(r < R);
    for k in 0..4 {
        let (o0, o1) = (2 + 16 * k, 10 + 16 * k);
        let (a0, a1) = (u32_at(b, o0 + 4), u32_at(b, o1 + 4));
        let codes = std::array::from_fn(|l| {
            let off = if l < 4 { o0 + l } else { o1 + l - 4 };
            IQ2XXS_CODES[b[off] as usize]
        });
        let signs = ksigns4(a0) | ksigns4(a1) << 32;
        let (s0, s1) = ((a0 >> 28) as u8, (a1 >> 28) as u8);
        chunk(u, r, k, codes, signs, scales4([s0, s0, s1, s1]));
    }
    (f16_one(b, 0), 0.0)
}

/// IQ2_S (82 bytes: f16 scale, 32 low grid index bytes, 32 sign bytes, eight bytes of the
/// indices' high two bits, eight bytes of two 4-bit scales).
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vbmi")]
pub(super) fn iq2_s(b: &[u8], u: &mut Unpacked, r: usize) -> (f32, f32) {
    let (qs, qh, s) = (&b[2..34], &b[66..74], &b[74..82]);
    for k in 0..4 {
        let codes = std::array::from_fn(|l| {
            let g = 2 * k + l / 4;
            let idx =
                qs[4 * g + l % 4] as usize | (((qh[g] as usize) << (8 - 2 * (l % 4))) & 0x300);
            IQ2S_CODES[idx]
        });
        let signs = u64::from_le_bytes(b[34 + 8 * k..42 + 8 * k].try_into().expect("8 bytes"));
        chunk(u, r, k, codes, signs, nibble_scales(s[2 * k], s[2 * k + 1]));
    }
    (f16_one(b, 0), 0.0)
}
