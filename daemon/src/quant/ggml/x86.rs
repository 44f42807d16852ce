//! AVX2 dot products of the K-quants and IQ4_XS (the 32-element types are in `x86_q0.rs`,
//! which shares this file's helpers). Each computes the same exact integer sums as the
//! portable reference (`dot.rs`) and then the same float operations in the same order, so its
//! result equals the reference's bit for bit (tested in `tests_simd.rs`):
//!
//! * IQ4_XS and Q2_K need only a block's (or sub-block's) total, which `maddubs` + `madd`
//!   give in any order (they scale their groups in the `madd`);
//! * Q4_K, Q5_K and Q6_K need a block's total (and Q4_K/Q5_K their min term's,
//!   `dot::K4Sums`), added from the eight i32 that `maddubs` and then `madd` by the run's
//!   scales leave;
//! * Q3_K keeps the reference's eight lanes (element `n` of a block in lane
//!   `(n % 32) / 4`), which is what `maddubs` and then `madd` by the run's scales leave in the
//!   eight i32 of a 32-element run, so no widening or shuffling of products is needed.
//!
//! Activation quants are in [-127, 127] (`act.rs`), so `maddubs`'s pair sums never saturate:
//! at most 2 x 128 x 127 for a signed weight handled by the sign trick. The block scales'
//! f16 are widened by F16C (exact, as the reference's conversion).

use std::arch::x86_64::*;

use super::dot::u16_at;
use super::{DotFn, DotTileFn, Q8Row};
use crate::gguf::grids::IQ4NL_KVALUES;
use crate::gguf::GgmlType;

/// The AVX2 kernel of `ty`, where there is one and this CPU has AVX2.
pub(super) fn dot(ty: GgmlType) -> Option<DotFn> {
    if !is_x86_feature_detected!("avx2") || !is_x86_feature_detected!("f16c") {
        return None;
    }
    use GgmlType::*;
    Some(match ty {
        IQ4_XS => iq4_xs,
        Q2_K => q2_k,
        Q3_K => q3_k,
        Q4_K => q4_k,
        Q5_K => q5_k,
        Q6_K => q6_k,
        _ => return None,
    })
}

/// Defines the safe entries of a K-quant kernel: the row dot product and the 4-position tile.
macro_rules! k_entry {
    ($dot:ident, $tile:ident, $imp:ident) => {
        fn $dot(w: &[u8], a: &Q8Row) -> f32 {
            // SAFETY: `dot` hands this function out only after detecting AVX2 and F16C,
            // the features `$imp` is compiled for; its loads go through bounds-checked
            // slices.
            unsafe { $imp::<1>(w, &[*a])[0] }
        }

        fn $tile(w: &[u8], a: &[Q8Row; 4]) -> [f32; 4] {
            // SAFETY: as the row entry (`tile` checks the same features).
            unsafe { $imp::<4>(w, a) }
        }
    };
}

k_entry!(iq4_xs, iq4_xs_tile, iq4_xs_n);
k_entry!(q2_k, q2_k_tile, q2_k_n);
k_entry!(q3_k, q3_k_tile, q3_k_n);
k_entry!(q4_k, q4_k_tile, q4_k_n);
k_entry!(q5_k, q5_k_tile, q5_k_n);
k_entry!(q6_k, q6_k_tile, q6_k_n);

/// The 1-row x 4-position tile of `ty`, where there is one and this CPU has AVX2 and F16C.
pub(super) fn tile(ty: GgmlType) -> Option<DotTileFn> {
    if !is_x86_feature_detected!("avx2") || !is_x86_feature_detected!("f16c") {
        return None;
    }
    use GgmlType::*;
    Some(match ty {
        IQ4_XS => iq4_xs_tile,
        Q2_K => q2_k_tile,
        Q3_K => q3_k_tile,
        Q4_K => q4_k_tile,
        Q5_K => q5_k_tile,
        Q6_K => q6_k_tile,
        _ => return None,
    })
}

/// Whether this CPU has every feature the AVX-512 VNNI panels (`kpanel.rs`, `panel_q0.rs`)
/// are compiled for: AVX2, F16C, AVX-512 F/BW/VL/VNNI.
pub(super) fn has_panel_features() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("f16c")
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn hsum(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// Eight i32 partial sums of `w * x` for 32 signed bytes each (sign trick).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn dot_i8(w: __m256i, x: __m256i) -> __m256i {
    let p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

/// Eight i32 partial sums of `u * x` for 32 unsigned bytes `u` (< 128) and signed `x`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn dot_u8(u: __m256i, x: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1))
}

/// 32 unaligned bytes at `p[off..off + 32]` (bounds checked).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn load32(p: &[u8], off: usize) -> __m256i {
    let s = &p[off..off + 32];
    // SAFETY: `s` is 32 readable bytes; the load is unaligned.
    unsafe { _mm256_loadu_si256(s.as_ptr() as *const __m256i) }
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn load32_i8(p: &[i8], off: usize) -> __m256i {
    let s = &p[off..off + 32];
    // SAFETY: as `load32`.
    unsafe { _mm256_loadu_si256(s.as_ptr() as *const __m256i) }
}

/// 16 nibble bytes at `p[off..]` as 32 bytes: low nibbles (elements 0..16), then high.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn nibbles(p: &[u8], off: usize) -> __m256i {
    let s = &p[off..off + 16];
    // SAFETY: `s` is 16 readable bytes.
    let v = unsafe { _mm_loadu_si128(s.as_ptr() as *const __m128i) };
    let m = _mm_set1_epi8(0x0F);
    let lo = _mm_and_si128(v, m);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), m);
    _mm256_set_m128i(hi, lo)
}

/// A 16-entry signed table in both 128-bit lanes, for `shuffle_epi8` lookups.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn table16(t: &[i8; 16]) -> __m256i {
    // SAFETY: `t` is 16 readable bytes.
    let v = unsafe { _mm_loadu_si128(t.as_ptr() as *const __m128i) };
    _mm256_set_m128i(v, v)
}

// The 256-element K-quants. Each 32-element run is one `maddubs` (weights unsigned, so
// `u * x` pairs, at most 2 x 63 x 127, never saturate) and one `madd` by the run's i16
// scales, which leaves i32 lane `m` holding elements `4m..4m + 4` of the run: the reference's
// lane `(n % 32) / 4`. Signed quants (Q3_K, Q6_K) are stored with an offset (4, 32); the
// offset's products are subtracted in i16 per pair, so every lane stays exact.

/// 16 bytes at `p[off..off + 16]` (bounds checked).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn load16(p: &[u8], off: usize) -> __m128i {
    let s = &p[off..off + 16];
    // SAFETY: `s` is 16 readable bytes; the load is unaligned.
    unsafe { _mm_loadu_si128(s.as_ptr() as *const __m128i) }
}

/// Sixteen i16 (the sums of every 16 activation quants) of block `i`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn bsums16(a: &Q8Row, i: usize) -> __m256i {
    let s = &a.bsums[i * 16..i * 16 + 16];
    // SAFETY: `s` is 16 readable i16 (32 bytes); the load is unaligned.
    unsafe { _mm256_loadu_si256(s.as_ptr() as *const __m256i) }
}

/// The four i32 of `v` added (exact).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn hsum128(v: __m128i) -> i32 {
    let s = _mm_add_epi32(v, _mm_shuffle_epi32::<0b01_00_11_10>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// The two f16 at `b[off..off + 4]` widened (exact, as `f16_at`), by F16C.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn f16_pair(b: &[u8], off: usize) -> (f32, f32) {
    let bits = u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]]);
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32));
    (
        _mm_cvtss_f32(v),
        _mm_cvtss_f32(_mm_shuffle_ps::<0b01>(v, v)),
    )
}

/// The f16 at `b[off..off + 2]` widened by F16C.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn f16_one(b: &[u8], off: usize) -> f32 {
    let bits = u16::from_le_bytes([b[off], b[off + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// A Q4_K/Q5_K block's twelve packed scale bytes as sixteen: the eight 6-bit scales (bytes
/// 0..8), then the eight 6-bit mins (8..16). Scales and mins 0..3 are the low six bits of
/// bytes 0..3 and 4..7; 4..7 take their low four bits from the nibbles of bytes 8..11 and
/// their top two from the top bits of bytes 0..3 (scales) and 4..7 (mins).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn k4_scales_mins(s: &[u8]) -> __m128i {
    const LOW6: u32 = 0x3F3F_3F3F;
    const LOW4: u32 = 0x0F0F_0F0F;
    const TOP2: u32 = 0x0303_0303;
    let word = |k: usize| u32::from_le_bytes([s[4 * k], s[4 * k + 1], s[4 * k + 2], s[4 * k + 3]]);
    let (w0, w1, w2) = (word(0), word(1), word(2));
    let sc_hi = (w2 & LOW4) | (((w0 >> 6) & TOP2) << 4);
    let m_hi = ((w2 >> 4) & LOW4) | (((w1 >> 6) & TOP2) << 4);
    _mm_set_epi32(
        m_hi as i32,
        (w1 & LOW6) as i32,
        sc_hi as i32,
        (w0 & LOW6) as i32,
    )
}

/// A Q3_K block's twelve packed scale bytes as its sixteen signed scales (`-32..32`): the
/// low four bits of scale `k` are nibble `k / 8` of byte `k % 8`, the top two are bits
/// `2 (k / 4)` of byte `8 + k % 4`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn k3_scales(s: &[u8]) -> __m128i {
    const LOW4: u32 = 0x0F0F_0F0F;
    const TOP2: u32 = 0x0303_0303;
    let word = |k: usize| u32::from_le_bytes([s[4 * k], s[4 * k + 1], s[4 * k + 2], s[4 * k + 3]]);
    let (w0, w1, w2) = (word(0), word(1), word(2));
    let v = _mm_set_epi32(
        (((w1 >> 4) & LOW4) | (((w2 >> 6) & TOP2) << 4)) as i32,
        (((w0 >> 4) & LOW4) | (((w2 >> 4) & TOP2) << 4)) as i32,
        ((w1 & LOW4) | (((w2 >> 2) & TOP2) << 4)) as i32,
        ((w0 & LOW4) | ((w2 & TOP2) << 4)) as i32,
    );
    _mm_sub_epi8(v, _mm_set1_epi8(32))
}

/// The shuffle that spreads i16 `g` of each 128-bit half to all eight of that half.
#[inline]
#[target_feature(enable = "avx2")]
fn spread16(g: usize) -> __m256i {
    _mm256_set1_epi16((((2 * g + 1) << 8) | 2 * g) as i16)
}

/// From sixteen signed bytes `s` in both halves: byte `k` sign-extended into the low half's
/// eight i16, byte `k + 1` into the high half's (the scales of two 16-element sub-blocks).
#[inline]
#[target_feature(enable = "avx2")]
fn scale_pair_i8(s: __m256i, k: usize) -> __m256i {
    let pick = _mm256_set_m128i(_mm_set1_epi8(k as i8 + 1), _mm_set1_epi8(k as i8));
    // Each i16 gets the byte twice; its high copy shifted down extends the sign.
    _mm256_srai_epi16::<8>(_mm256_shuffle_epi8(s, pick))
}

/// The eight lanes of one 32-element run: `u` (unsigned weights) times `x`, pairs scaled
/// by the i16 `scale`.
#[inline]
#[target_feature(enable = "avx2")]
fn run32(u: __m256i, x: __m256i, scale: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), scale)
}

/// As [`run32`] for weights `u - off` (`u` and `off` unsigned, pairs exact in i16).
#[inline]
#[target_feature(enable = "avx2")]
fn run32_off(u: __m256i, off: __m256i, x: __m256i, scale: __m256i) -> __m256i {
    let p = _mm256_sub_epi16(_mm256_maddubs_epi16(u, x), _mm256_maddubs_epi16(off, x));
    _mm256_madd_epi16(p, scale)
}

/// `lanes[l] += d * acc[l]`, a product then a sum per lane as the reference.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn add_lanes(lanes: __m256, d: f32, acc: __m256i) -> __m256 {
    _mm256_add_ps(
        lanes,
        _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(acc)),
    )
}

/// `sumf` plus the eight lanes in order.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn fold8(sumf: f32, lanes: __m256) -> f32 {
    let mut l = [0f32; 8];
    // SAFETY: `l` is 8 writable f32; the store is unaligned.
    unsafe { _mm256_storeu_ps(l.as_mut_ptr(), lanes) };
    l.iter().fold(sumf, |s, &v| s + v)
}

/// The integer min term of a Q4_K/Q5_K block (`sum bsums[j] * min[j / 2]`, exact): the
/// bsums added in pairs (at most 2 x 16 x 127 in i16), times the eight mins.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn k4_msum(sm: __m128i, a: &Q8Row, i: usize) -> i32 {
    let bs = bsums16(a, i);
    let pairs = _mm_hadd_epi16(
        _mm256_castsi256_si128(bs),
        _mm256_extracti128_si256::<1>(bs),
    );
    let mins = _mm_cvtepu8_epi16(_mm_unpackhi_epi64(sm, sm));
    hsum128(_mm_madd_epi16(pairs, mins))
}

/// The integer min terms of Q4_K/Q5_K block `i` for four positions at once (each
/// `sum bsums[j] * min[j / 2]`, exact, as [`k4_msum`]): each min doubled against the
/// position's sixteen bsums by `madd`, then the four positions' eight partial sums added
/// across in two rounds of `hadd` and one of the halves.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn k4_msum4(sm: __m128i, a: &[Q8Row], i: usize) -> __m128i {
    let mh = _mm_unpackhi_epi64(sm, sm);
    let mins2 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mh, mh));
    let m = |p: usize| _mm256_madd_epi16(bsums16(&a[p], i), mins2);
    let h = _mm256_hadd_epi32(_mm256_hadd_epi32(m(0), m(1)), _mm256_hadd_epi32(m(2), m(3)));
    _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h))
}

/// The float steps of Q4_K/Q5_K block `i` (`dot::K4Sums`) for four positions in one
/// vector: `sum += (d * a[p].d[i]) * isum[p]`, `mins += (dmin * a[p].d[i]) * msum[p]`, each
/// lane the scalar's products and sum, so the same bits.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn k4_add4(
    sum: &mut [f32],
    mins: &mut [f32],
    (d, dmin): (f32, f32),
    (isum, msum): (__m128i, __m128i),
    a: &[Q8Row],
    i: usize,
) {
    let ad = _mm_setr_ps(a[0].d[i], a[1].d[i], a[2].d[i], a[3].d[i]);
    let add = |acc: &mut [f32], scale: f32, v: __m128i| {
        let t = _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(scale), ad), _mm_cvtepi32_ps(v));
        let s = &mut acc[..4];
        // SAFETY: `s` is 4 readable and writable f32; the load and store are unaligned.
        unsafe { _mm_storeu_ps(s.as_mut_ptr(), _mm_add_ps(_mm_loadu_ps(s.as_ptr()), t)) };
    };
    add(sum, d, isum);
    add(mins, dmin, msum);
}

/// The totals of four vectors of eight i32 (exact: any order).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn hsum4(v: [__m256i; 4]) -> __m128i {
    let h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h))
}

/// A Q4_K/Q5_K block's eight scales as i16 in both halves (spread by [`spread16`]).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn k4_scales16(sm: __m128i) -> __m256i {
    _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm))
}

/// Runs `2j` and `2j + 1` of Q4_K/Q5_K block `i` (`q`: their unsigned quants) against each
/// position's activations, scaled by the runs' i16 scales from [`k4_scales16`], into `acc`.
#[inline]
#[target_feature(enable = "avx2")]
fn k4_runs<const N: usize>(
    acc: &mut [__m256i; N],
    a: &[Q8Row; N],
    i: usize,
    j: usize,
    q: [__m256i; 2],
    sc: __m256i,
) {
    let s0 = _mm256_shuffle_epi8(sc, spread16(2 * j));
    let s1 = _mm256_shuffle_epi8(sc, spread16(2 * j + 1));
    for (acc, a) in acc.iter_mut().zip(a) {
        let x0 = load32_i8(a.qs, i * 256 + j * 64);
        let x1 = load32_i8(a.qs, i * 256 + j * 64 + 32);
        let r = _mm256_add_epi32(run32(q[0], x0, s0), run32(q[1], x1, s1));
        *acc = _mm256_add_epi32(*acc, r);
    }
}

/// The end of Q4_K/Q5_K block `i` for each position: the total of its integer sums and its
/// min term, then the reference's float steps (`dot::K4Sums`) into `sum` and `mins`. A macro,
/// not a function: as a `#[target_feature]` function it cannot be forced inline, and LLVM left
/// it a call per block per tile (a fifth of a Q4_K_M prefill's time).
/// `|p| lanes` gives position `p`'s i32 partial sums of the block as eight lanes (the AVX-512
/// kernels fold theirs from sixteen first).
macro_rules! k4_block_end {
    ($n:expr, $sum:ident, $mins:ident, |$p:ident| $int_lanes:expr, $a:ident, $i:expr, $d:expr, $dmin:expr, $sm:expr) => {
        if $n == 4 {
            let isum = hsum4(std::array::from_fn(|$p| $int_lanes));
            let msum = k4_msum4($sm, &$a[..], $i);
            k4_add4(
                &mut $sum,
                &mut $mins,
                ($d, $dmin),
                (isum, msum),
                &$a[..],
                $i,
            );
        } else {
            for $p in 0..$n {
                let ad = $a[$p].d[$i];
                $sum[$p] += ($d * ad) * hsum($int_lanes) as f32;
                $mins[$p] += ($dmin * ad) * k4_msum($sm, &$a[$p], $i) as f32;
            }
        }
    };
}
pub(super) use k4_block_end;

// Each K-quant kernel runs one weight row against `N` positions: `N = 1` is the row dot
// product, `N = 4` the prefill tile, which decodes each run of weights once for the four.
// Every position's integer lanes and float steps are the single dot's, so the outputs are the
// same bits whichever way a position is computed.

#[inline]
#[target_feature(enable = "avx2,f16c")]
fn q4_k_n<const N: usize>(w: &[u8], a: &[Q8Row; N]) -> [f32; N] {
    let m4 = _mm256_set1_epi8(0x0F);
    let (mut sum, mut mins) = ([0.0f32; N], [0.0f32; N]);
    for (i, b) in w.chunks_exact(144).enumerate() {
        let (d, dmin) = f16_pair(b, 0);
        let sm = k4_scales_mins(&b[4..16]);
        let sc = k4_scales16(sm);
        let mut acc = [_mm256_setzero_si256(); N];
        for j in 0..4 {
            // Runs 2j (low nibbles) and 2j + 1 (high) share 32 bytes.
            let q4 = load32(b, 16 + j * 32);
            let lo = _mm256_and_si256(q4, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q4), m4);
            k4_runs(&mut acc, a, i, j, [lo, hi], sc);
        }
        k4_block_end!(N, sum, mins, |p| acc[p], a, i, d, dmin, sm);
    }
    std::array::from_fn(|p| sum[p] - mins[p])
}

#[inline]
#[target_feature(enable = "avx2,f16c")]
fn q5_k_n<const N: usize>(w: &[u8], a: &[Q8Row; N]) -> [f32; N] {
    let m4 = _mm256_set1_epi8(0x0F);
    let b4 = _mm256_set1_epi8(0x10);
    let (mut sum, mut mins) = ([0.0f32; N], [0.0f32; N]);
    for (i, b) in w.chunks_exact(176).enumerate() {
        let (d, dmin) = f16_pair(b, 0);
        let sm = k4_scales_mins(&b[4..16]);
        let sc = k4_scales16(sm);
        // Bit g of each qh byte is bit 4 of run g's quant; shifted down one bit a run.
        let mut qh = load32(b, 16);
        let mut acc = [_mm256_setzero_si256(); N];
        for j in 0..4 {
            let q4 = load32(b, 48 + j * 32);
            let lo = _mm256_and_si256(q4, m4);
            let lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16::<4>(qh), b4));
            qh = _mm256_srli_epi16::<1>(qh);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q4), m4);
            let hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16::<4>(qh), b4));
            qh = _mm256_srli_epi16::<1>(qh);
            k4_runs(&mut acc, a, i, j, [lo, hi], sc);
        }
        k4_block_end!(N, sum, mins, |p| acc[p], a, i, d, dmin, sm);
    }
    std::array::from_fn(|p| sum[p] - mins[p])
}

/// Half `half` of a Q6_K block `b` as its four 32-quant runs, unsigned (0..63, the stored
/// value before the `- 32`): run c takes the low nibbles of the half's first and second 32
/// `ql` bytes, then their high nibbles, with bits 2c and 2c + 1 of its `qh` bytes on top.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn q6_k_half(b: &[u8], half: usize) -> [__m256i; 4] {
    let m4 = _mm256_set1_epi8(0x0F);
    let m2 = _mm256_set1_epi8(0x30);
    let qh = load32(b, 128 + half * 32);
    let ql0 = load32(b, half * 64);
    let ql1 = load32(b, half * 64 + 32);
    [
        _mm256_or_si256(
            _mm256_and_si256(ql0, m4),
            _mm256_and_si256(_mm256_slli_epi16::<4>(qh), m2),
        ),
        _mm256_or_si256(
            _mm256_and_si256(ql1, m4),
            _mm256_and_si256(_mm256_slli_epi16::<2>(qh), m2),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
            _mm256_and_si256(qh, m2),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
            _mm256_and_si256(_mm256_srli_epi16::<2>(qh), m2),
        ),
    ]
}

#[inline]
#[target_feature(enable = "avx2,f16c")]
fn q6_k_n<const N: usize>(w: &[u8], a: &[Q8Row; N]) -> [f32; N] {
    let off = _mm256_set1_epi8(32);
    let mut sum = [0.0f32; N];
    for (i, b) in w.chunks_exact(210).enumerate() {
        let sc = _mm256_broadcastsi128_si256(load16(b, 192));
        let mut acc = [_mm256_setzero_si256(); N];
        for half in 0..2 {
            let runs = q6_k_half(b, half);
            for (c, &q) in runs.iter().enumerate() {
                let n = half * 128 + c * 32;
                let s = scale_pair_i8(sc, n / 16);
                for (acc, a) in acc.iter_mut().zip(a) {
                    let x = load32_i8(a.qs, i * 256 + n);
                    *acc = _mm256_add_epi32(*acc, run32_off(q, off, x, s));
                }
            }
        }
        let d = f16_one(b, 208);
        for p in 0..N {
            sum[p] += (d * a[p].d[i]) * hsum(acc[p]) as f32;
        }
    }
    sum
}

#[inline]
#[target_feature(enable = "avx2,f16c")]
fn q3_k_n<const N: usize>(w: &[u8], a: &[Q8Row; N]) -> [f32; N] {
    let m3 = _mm256_set1_epi8(3);
    let four = _mm256_set1_epi8(4);
    let mut lanes = [_mm256_setzero_ps(); N];
    for (i, b) in w.chunks_exact(110).enumerate() {
        let sc = _mm256_broadcastsi128_si256(k3_scales(&b[96..108]));
        // Bit c of each hmask byte is run c's high bit; shifted down one bit a run.
        let mut hm = load32(b, 0);
        let mut acc = [_mm256_setzero_si256(); N];
        for half in 0..2 {
            let q2 = load32(b, 32 + half * 32);
            let planes = [
                _mm256_and_si256(q2, m3),
                _mm256_and_si256(_mm256_srli_epi16::<2>(q2), m3),
                _mm256_and_si256(_mm256_srli_epi16::<4>(q2), m3),
                _mm256_and_si256(_mm256_srli_epi16::<6>(q2), m3),
            ];
            for (p, &lo) in planes.iter().enumerate() {
                let c = half * 4 + p;
                // 4 where the high bit is clear: the quant is `lo - 4` there.
                let clear = _mm256_andnot_si256(_mm256_slli_epi16::<2>(hm), four);
                hm = _mm256_srli_epi16::<1>(hm);
                let s = scale_pair_i8(sc, 2 * c);
                for (acc, a) in acc.iter_mut().zip(a) {
                    let x = load32_i8(a.qs, i * 256 + c * 32);
                    *acc = _mm256_add_epi32(*acc, run32_off(lo, clear, x, s));
                }
            }
        }
        let d = f16_one(b, 108);
        for p in 0..N {
            lanes[p] = add_lanes(lanes[p], d * a[p].d[i], acc[p]);
        }
    }
    std::array::from_fn(|p| fold8(0.0, lanes[p]))
}

#[inline]
#[target_feature(enable = "avx2,f16c")]
fn q2_k_n<const N: usize>(w: &[u8], a: &[Q8Row; N]) -> [f32; N] {
    let m3 = _mm256_set1_epi8(3);
    let m4 = _mm_set1_epi8(0x0F);
    let mut sumf = [0.0f32; N];
    for (i, b) in w.chunks_exact(84).enumerate() {
        // Byte k: scale k in its low nibble, min k in its high.
        let sm = load16(b, 0);
        let sc = _mm256_broadcastsi128_si256(_mm_and_si128(sm, m4));
        let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(sm), m4));
        let (dall, dmin) = f16_pair(b, 80);
        let mut acc = [_mm256_setzero_si256(); N];
        for half in 0..2 {
            let q2 = load32(b, 16 + half * 32);
            let planes = [
                _mm256_and_si256(q2, m3),
                _mm256_and_si256(_mm256_srli_epi16::<2>(q2), m3),
                _mm256_and_si256(_mm256_srli_epi16::<4>(q2), m3),
                _mm256_and_si256(_mm256_srli_epi16::<6>(q2), m3),
            ];
            for (plane, &q) in planes.iter().enumerate() {
                // Sub-blocks k (low 16 bytes) and k + 1 (high 16), each with its scale.
                let k = half * 8 + plane * 2;
                let pick = _mm256_set_m128i(
                    _mm_set1_epi16((0x8000 | (k + 1)) as i16),
                    _mm_set1_epi16((0x8000 | k) as i16),
                );
                let s = _mm256_shuffle_epi8(sc, pick);
                for (acc, a) in acc.iter_mut().zip(a) {
                    let x = load32_i8(a.qs, i * 256 + k * 16);
                    *acc = _mm256_add_epi32(*acc, run32(q, x, s));
                }
            }
        }
        for p in 0..N {
            let summs = hsum(_mm256_madd_epi16(bsums16(&a[p], i), mins));
            let isum = hsum(acc[p]);
            let ad = a[p].d[i];
            sumf[p] += ad * dall * isum as f32 - ad * dmin * summs as f32;
        }
    }
    sumf
}

/// IQ4_XS's eight group scales less 32 (`-32..32`), as i16 in both halves: the low four bits
/// of group `g` are nibble `g` of bytes 4..8, the top two bits `2g` of the u16 at byte 2.
#[inline]
#[target_feature(enable = "avx2")]
fn iq4_xs_scales(b: &[u8]) -> __m256i {
    let m4 = _mm_set1_epi8(0x0F);
    let v = _mm_cvtsi32_si128(i32::from_le_bytes([b[4], b[5], b[6], b[7]]));
    let nib = _mm_unpacklo_epi8(
        _mm_and_si128(v, m4),
        _mm_and_si128(_mm_srli_epi16::<4>(v), m4),
    );
    let lo = _mm_cvtepu8_epi16(nib);
    // Field g of the u16, masked in lane g, moved to bits 14-15 by 2^(14 - 2g), then down.
    let h = _mm_set1_epi16(u16_at(b, 2) as i16);
    let field = _mm_and_si128(
        h,
        _mm_setr_epi16(
            0x0003,
            0x000C,
            0x0030,
            0x00C0,
            0x0300,
            0x0C00,
            0x3000,
            0xC000u16 as i16,
        ),
    );
    let up = _mm_setr_epi16(
        0x4000, 0x1000, 0x0400, 0x0100, 0x0040, 0x0010, 0x0004, 0x0001,
    );
    let hi = _mm_srli_epi16::<14>(_mm_mullo_epi16(field, up));
    let s = _mm_sub_epi16(
        _mm_or_si128(lo, _mm_slli_epi16::<4>(hi)),
        _mm_set1_epi16(32),
    );
    _mm256_broadcastsi128_si256(s)
}

#[inline]
#[target_feature(enable = "avx2,f16c")]
fn iq4_xs_n<const N: usize>(w: &[u8], a: &[Q8Row; N]) -> [f32; N] {
    let tab = table16(&IQ4NL_KVALUES);
    let mut sumf = [0.0f32; N];
    for (i, b) in w.chunks_exact(136).enumerate() {
        let d = f16_one(b, 0);
        let sc = iq4_xs_scales(b);
        let mut acc = [_mm256_setzero_si256(); N];
        for g in 0..8 {
            // Signed table values (|v| <= 127): `|q|` times `x` negated where `q < 0`.
            let q = _mm256_shuffle_epi8(tab, nibbles(b, 8 + g * 16));
            let u = _mm256_sign_epi8(q, q);
            let s = _mm256_shuffle_epi8(sc, spread16(g));
            for (acc, a) in acc.iter_mut().zip(a) {
                let x = _mm256_sign_epi8(load32_i8(a.qs, i * 256 + g * 32), q);
                *acc = _mm256_add_epi32(*acc, run32(u, x, s));
            }
        }
        for p in 0..N {
            sumf[p] += d * a[p].d[i] * hsum(acc[p]) as f32;
        }
    }
    sumf
}
