//! Activations quantized to llama.cpp's 8-bit blocks, as its reference quantizers round them
//! (`quantize_row_q8_0_ref`, `_q8_1_ref`, `_q8_K_ref` in ggml-quants.c), kept as arrays of
//! quants, scales and sums rather than packed structs so kernels load each kind contiguously.

use rayon::prelude::*;

use super::ActKind;
use crate::gguf::types::QK_K;
use crate::quant::pack::rint_clamped;

/// Inputs from which a fill quantizes its rows across the threads (`quant::act`'s bound).
const PAR_QUANT_ELEMS: usize = 1 << 15;

/// `quantize(row, quants, scales, sums)` over each row of `x` and its slices of the three
/// outputs (`(buffer, length a row)`). A prefill's rows are independent: from
/// [`PAR_QUANT_ELEMS`] inputs they are quantized on every thread rather than on the caller
/// while the others wait (as `ActBuf::fill_with`), each row by the same call.
fn each_row<S: Send>(
    x: &[f32],
    (qs, cols): (&mut [i8], usize),
    (d, nb): (&mut [f32], usize),
    (sums, ns): (&mut [S], usize),
    quantize: impl Fn(&[f32], &mut [i8], &mut [f32], &mut [S]) + Sync,
) {
    let row =
        |(((x, q), d), s): (((&[f32], &mut [i8]), &mut [f32]), &mut [S])| quantize(x, q, d, s);
    let rows = x.len() / cols.max(1);
    if rows > 1 && x.len() >= PAR_QUANT_ELEMS {
        x.par_chunks_exact(cols)
            .zip(qs.par_chunks_exact_mut(cols))
            .zip(d.par_chunks_exact_mut(nb))
            .zip(sums.par_chunks_exact_mut(ns))
            .for_each(row);
    } else {
        x.chunks_exact(cols)
            .zip(qs.chunks_exact_mut(cols))
            .zip(d.chunks_exact_mut(nb))
            .zip(sums.chunks_exact_mut(ns))
            .for_each(row);
    }
}

/// One position's quantized activations, borrowed from a [`Q8Act`].
#[derive(Clone, Copy, Debug)]
pub struct Q8Row<'a> {
    /// One quant per input.
    pub qs: &'a [i8],
    /// One scale per block (Q8_0: the f16 scale widened; Q8_K: the f32 scale).
    pub d: &'a [f32],
    /// Q8_0 only: per block, the f16 of (scale x sum of the block's quants), widened.
    pub s: &'a [f32],
    /// Q8_K only: the sum of every 16 quants.
    pub bsums: &'a [i16],
}

/// Quantized activations for `n_seq` positions of `cols` inputs. Its buffers grow to the
/// largest shape asked of them and are reused: once sized, filling allocates nothing, which
/// keeps the decode step allocation-free when the buffer lives in the scratch.
#[derive(Default, Debug)]
pub struct Q8Act {
    kind: Option<ActKind>,
    cols: usize,
    n_seq: usize,
    qs: Vec<i8>,
    d: Vec<f32>,
    s: Vec<f32>,
    bsums: Vec<i16>,
}

impl Q8Act {
    pub fn new() -> Q8Act {
        Q8Act::default()
    }

    /// Quantizes `x` (`n_seq` rows of `cols`) to `kind`'s blocks. Panics if `cols` is not a
    /// whole number of blocks or `x` is not `n_seq * cols` long (callers check the weight's
    /// shape when it is loaded).
    pub fn fill(&mut self, kind: ActKind, x: &[f32], n_seq: usize, cols: usize) {
        let blk = kind.block();
        assert!(
            cols.is_multiple_of(blk),
            "Q8Act: {cols} inputs are not whole {blk}-blocks"
        );
        assert_eq!(x.len(), n_seq * cols, "Q8Act: x.len() != n_seq * cols");
        let nb = cols / blk;
        self.kind = Some(kind);
        self.cols = cols;
        self.n_seq = n_seq;
        self.qs.resize(n_seq * cols, 0);
        self.d.resize(n_seq * nb, 0.0);
        let (qs, d) = (&mut self.qs[..n_seq * cols], &mut self.d[..n_seq * nb]);
        match kind {
            ActKind::Q8_0 => {
                self.s.resize(n_seq * nb, 0.0);
                let s = &mut self.s[..n_seq * nb];
                each_row(x, (qs, cols), (d, nb), (s, nb), quantize_q8_0);
            }
            ActKind::Q8K => {
                let ns = cols / 16;
                self.bsums.resize(n_seq * ns, 0);
                let sums = &mut self.bsums[..n_seq * ns];
                each_row(x, (qs, cols), (d, nb), (sums, ns), quantize_q8_k);
            }
        }
    }

    /// The kind last filled, if any.
    pub fn kind(&self) -> Option<ActKind> {
        self.kind
    }

    /// Inputs a row of the last fill.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Rows of the last fill.
    pub fn n_seq(&self) -> usize {
        self.n_seq
    }

    /// Position `s`'s row. Panics if `s` is past the positions last filled.
    pub fn row(&self, s: usize) -> Q8Row<'_> {
        assert!(s < self.n_seq, "Q8Act::row: position {s} of {}", self.n_seq);
        let cols = self.cols;
        let Some(kind) = self.kind else {
            unreachable!("n_seq > 0 only after a fill")
        };
        let nb = cols / kind.block();
        match kind {
            ActKind::Q8_0 => Q8Row {
                qs: &self.qs[s * cols..(s + 1) * cols],
                d: &self.d[s * nb..(s + 1) * nb],
                s: &self.s[s * nb..(s + 1) * nb],
                bsums: &[],
            },
            ActKind::Q8K => Q8Row {
                qs: &self.qs[s * cols..(s + 1) * cols],
                d: &self.d[s * nb..(s + 1) * nb],
                s: &[],
                bsums: &self.bsums[s * cols / 16..(s + 1) * cols / 16],
            },
        }
    }
}

/// f32 to f16 (round to nearest even, as ggml's conversion) and back.
#[inline]
fn via_f16(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}

/// `x` (whole 32-blocks) to Q8_0: per block the scale `amax / 127` (stored as f16), quants
/// `round(x / scale)` rounded half away from zero, and `s`, the f16 of the block's quant sum
/// times the unrounded scale (what Q4_1/Q5_1's minimum term multiplies). Where the CPU has
/// AVX2 a block goes through its vector twin (`x86_q0::q8_0_block`, the same results).
pub fn quantize_q8_0(x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    for (((xb, qb), db), sb) in x
        .chunks_exact(32)
        .zip(qs.chunks_exact_mut(32))
        .zip(d.iter_mut())
        .zip(s.iter_mut())
    {
        #[cfg(target_arch = "x86_64")]
        let simd = super::x86_q0::q8_0_block(xb, qb);
        #[cfg(not(target_arch = "x86_64"))]
        let simd = None;
        let (scale, sum) = simd.unwrap_or_else(|| q8_0_block(xb, qb));
        *db = via_f16(scale);
        *sb = via_f16(sum as f32 * scale);
    }
}

/// One block of [`quantize_q8_0`]: the quants into `qb`; returns the unrounded scale and
/// the quants' sum.
pub(super) fn q8_0_block(xb: &[f32], qb: &mut [i8]) -> (f32, i32) {
    let amax = xb
        .iter()
        .fold(0.0f32, |m, v| if m > v.abs() { m } else { v.abs() });
    let scale = amax / 127.0;
    let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
    let mut sum = 0i32;
    for (q, &v) in qb.iter_mut().zip(xb) {
        // |v * inv| <= 127 (up to one rounding), so the cast never saturates.
        *q = (v * inv).round() as i8;
        sum += *q as i32;
    }
    (scale, sum)
}

/// `x` (whole 256-blocks) to Q8_K: the scale from the value of largest magnitude (the first
/// such), `-127 / max`, quants rounded half to even and capped at 127, the f32 scale
/// `1 / iscale`, and the sums of every 16 quants. An all-zero block is all zeros. Where the
/// CPU has AVX-512 F/BW a block goes through [`q8_k_block_avx512`] (the same results).
pub fn quantize_q8_k(x: &[f32], qs: &mut [i8], d: &mut [f32], bsums: &mut [i16]) {
    #[cfg(target_arch = "x86_64")]
    let wide = is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw");
    for (((xb, qb), db), bb) in x
        .chunks_exact(QK_K)
        .zip(qs.chunks_exact_mut(QK_K))
        .zip(d.iter_mut())
        .zip(bsums.chunks_exact_mut(QK_K / 16))
    {
        #[cfg(target_arch = "x86_64")]
        if wide {
            // SAFETY: AVX-512 F and BW were detected just above.
            *db = unsafe { q8_k_block_avx512(xb, qb, bb) };
            continue;
        }
        *db = q8_k_block(xb, qb, bb);
    }
}

/// One block of [`quantize_q8_k`]: the quants into `qb`, the sums into `bb`; returns the scale.
pub(super) fn q8_k_block(xb: &[f32], qb: &mut [i8], bb: &mut [i16]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in xb {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        qb.fill(0);
        bb.fill(0);
        return 0.0;
    }
    let iscale = -127.0f32 / max;
    for (q, &v) in qb.iter_mut().zip(xb) {
        // |iscale * v| <= 127 (up to one rounding), inside `rint_clamped`'s exact range:
        // `round_ties_even`'s integer without its libm call per element.
        *q = (rint_clamped(iscale * v) as i32).min(127) as i8;
    }
    for (b, q16) in bb.iter_mut().zip(qb.chunks_exact(16)) {
        *b = q16.iter().map(|&q| q as i16).sum();
    }
    1.0 / iscale
}

/// [`q8_k_block`] sixteen values a vector, with the same results: the largest magnitude by
/// `max(|v|, acc)` (a NaN, which the scalar's `>` skips, loses: `max` returns its second
/// operand), the first value of that magnitude, the same product `iscale * v` rounded half to
/// even by the conversion (the default rounding mode, as `rint_clamped`), capped at 127, and
/// narrowed by truncation (a NaN's conversion, `i32::MIN`, truncates to the scalar's 0); a
/// block whose scale overflows goes to the scalar.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) fn q8_k_block_avx512(xb: &[f32], qb: &mut [i8], bb: &mut [i16]) -> f32 {
    use std::arch::x86_64::*;
    let xb: &[f32; QK_K] = xb.try_into().expect("a 256-block");
    let qb: &mut [i8; QK_K] = qb.try_into().expect("a 256-block");
    let ld = |k: usize| {
        // SAFETY: `xb` has 256 f32 and `k < 16`: 16 readable f32; the load is unaligned.
        unsafe { _mm512_loadu_ps(xb.as_ptr().add(16 * k)) }
    };
    let mut acc = _mm512_setzero_ps();
    for k in 0..16 {
        acc = _mm512_max_ps(_mm512_abs_ps(ld(k)), acc);
    }
    let amax = _mm512_reduce_max_ps(acc);
    if amax == 0.0 {
        qb.fill(0);
        bb.fill(0);
        return 0.0;
    }
    let mut max = 0.0f32;
    for k in 0..16 {
        let hit = _mm512_cmpeq_ps_mask(_mm512_abs_ps(ld(k)), _mm512_set1_ps(amax));
        if hit != 0 {
            max = xb[16 * k + hit.trailing_zeros() as usize];
            break;
        }
    }
    let iscale = -127.0f32 / max;
    if !iscale.is_finite() {
        // A subnormal max: infinite products, which the scalar's saturating casts take to 127
        // or 0 and the conversion to `i32::MIN`; rare enough to leave to it.
        return q8_k_block(xb, qb, bb);
    }
    let (sc, cap) = (_mm512_set1_ps(iscale), _mm512_set1_epi32(127));
    for (k, b) in bb.iter_mut().enumerate() {
        let q = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(sc, ld(k))), cap);
        let bytes = _mm512_cvtepi32_epi8(q);
        // The sum of the stored bytes (a NaN's quant is 0 there, not its conversion's).
        *b = _mm512_reduce_add_epi32(_mm512_cvtepi8_epi32(bytes)) as i16;
        // SAFETY: `qb` has 256 bytes and `k < 16`: 16 writable bytes; the store is unaligned.
        unsafe { _mm_storeu_si128(qb.as_mut_ptr().add(16 * k) as *mut __m128i, bytes) };
    }
    1.0 / iscale
}
