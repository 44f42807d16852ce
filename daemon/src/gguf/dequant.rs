//! GGUF weight blocks to f32, bit for bit as gguf-py's `gguf.quants.dequantize` computes them.
//!
//! Float arithmetic is not associative, so each block mirrors quants.py's ORDER of operations:
//! the f16 scales become f32 first, then the same products and sums in f32, one rounding each
//! (Rust never contracts `a * b + c` into a fused multiply-add unless asked). Where quants.py
//! computes `d * sc` once per sub-block and then multiplies by the quant, so does this code.
//! The IQ (lattice) types live in `iq`; the fixtures in tests/fixtures/gguf/dequant check
//! every type against gguf-py's output with `f32::to_bits` equality.

use super::iq;
use super::types::GgmlType;

/// Why a row could not be dequantized: always a caller's mistake or a type this module does
/// not compute, never something about the values.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DequantError {
    #[error("{ty} has no f32 dequantization here (integer, activation-only or unpublished type)")]
    Unsupported { ty: GgmlType },
    #[error("{ty}: {bytes} bytes is not a whole number of {block_bytes}-byte blocks")]
    PartialBlock {
        ty: GgmlType,
        bytes: usize,
        block_bytes: usize,
    },
    #[error("{ty}: {bytes} bytes hold {want} values but the output has room for {got}")]
    OutputLength {
        ty: GgmlType,
        bytes: usize,
        want: usize,
        got: usize,
    },
}

/// Dequantizes `bytes` (whole blocks of `ty`) into `out`, which must hold exactly the
/// blocks' elements. Allocates nothing.
pub fn dequantize_row(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), DequantError> {
    if !ty.can_dequantize() {
        return Err(DequantError::Unsupported { ty });
    }
    let (be, bb) = ty.block();
    if !bytes.len().is_multiple_of(bb) {
        return Err(DequantError::PartialBlock {
            ty,
            bytes: bytes.len(),
            block_bytes: bb,
        });
    }
    let want = bytes.len() / bb * be;
    if out.len() != want {
        return Err(DequantError::OutputLength {
            ty,
            bytes: bytes.len(),
            want,
            got: out.len(),
        });
    }
    let block: fn(&[u8], &mut [f32]) = match ty {
        GgmlType::F32 => f32_block,
        GgmlType::F16 => f16_block,
        GgmlType::BF16 => bf16_block,
        GgmlType::Q4_0 => q4_0,
        GgmlType::Q4_1 => q4_1,
        GgmlType::Q5_0 => q5_0,
        GgmlType::Q5_1 => q5_1,
        GgmlType::Q8_0 => q8_0,
        GgmlType::Q2_K => q2_k,
        GgmlType::Q3_K => q3_k,
        GgmlType::Q4_K => q4_k,
        GgmlType::Q5_K => q5_k,
        GgmlType::Q6_K => q6_k,
        GgmlType::TQ1_0 => tq1_0,
        GgmlType::TQ2_0 => tq2_0,
        GgmlType::MXFP4 => mxfp4,
        GgmlType::IQ4_NL => iq::iq4_nl,
        GgmlType::IQ4_XS => iq::iq4_xs,
        GgmlType::IQ2_XXS => iq::iq2_xxs,
        GgmlType::IQ2_XS => iq::iq2_xs,
        GgmlType::IQ2_S => iq::iq2_s,
        GgmlType::IQ3_XXS => iq::iq3_xxs,
        GgmlType::IQ3_S => iq::iq3_s,
        GgmlType::IQ1_S => iq::iq1_s,
        GgmlType::IQ1_M => iq::iq1_m,
        _ => return Err(DequantError::Unsupported { ty }),
    };
    for (b, y) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(be)) {
        block(b, y);
    }
    Ok(())
}

/// The little-endian f16 at `b[off..off + 2]`, widened exactly.
#[inline]
pub(super) fn f16_at(b: &[u8], off: usize) -> f32 {
    half::f16::from_le_bytes([b[off], b[off + 1]]).to_f32()
}

#[inline]
pub(super) fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

#[inline]
pub(super) fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

fn f32_block(b: &[u8], y: &mut [f32]) {
    y[0] = f32::from_bits(u32_at(b, 0));
}

fn f16_block(b: &[u8], y: &mut [f32]) {
    y[0] = f16_at(b, 0);
}

fn bf16_block(b: &[u8], y: &mut [f32]) {
    // bf16 is the top half of an f32: the widening is a shift, exact for every pattern.
    y[0] = f32::from_bits((u16_at(b, 0) as u32) << 16);
}

/// The 4-bit quant `i` (0..32) of a 16-byte nibble array: low nibbles first, then high.
#[inline]
fn nibble32(qs: &[u8], i: usize) -> u8 {
    (qs[i % 16] >> (4 * (i / 16))) & 0x0F
}

fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (i, v) in y.iter_mut().enumerate() {
        let q = nibble32(&b[2..18], i) as i8 - 8;
        *v = d * q as f32;
    }
}

fn q4_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    for (i, v) in y.iter_mut().enumerate() {
        *v = d * nibble32(&b[4..20], i) as f32 + m;
    }
}

/// A Q5 quant: the nibble plus bit `i` of the 32-bit high mask as bit 4.
#[inline]
fn five_bit(qh: u32, qs: &[u8], i: usize) -> u8 {
    nibble32(qs, i) | ((((qh >> i) & 1) as u8) << 4)
}

fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32_at(b, 2);
    for (i, v) in y.iter_mut().enumerate() {
        let q = five_bit(qh, &b[6..22], i) as i8 - 16;
        *v = d * q as f32;
    }
}

fn q5_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qh = u32_at(b, 4);
    for (i, v) in y.iter_mut().enumerate() {
        *v = d * five_bit(qh, &b[8..24], i) as f32 + m;
    }
}

fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (i, v) in y.iter_mut().enumerate() {
        *v = (b[2 + i] as i8) as f32 * d;
    }
}

/// The 2-bit quant `i` (0..256) of a 64-byte array laid out as ggml's Q2_K/Q3_K/TQ2_0: two
/// 128-element halves, each four 32-element planes at bit shifts 0, 2, 4, 6.
#[inline]
fn crumb256(qs: &[u8], i: usize) -> u8 {
    let (half, r) = (i / 128, i % 128);
    (qs[half * 32 + r % 32] >> (2 * (r / 32))) & 3
}

fn q2_k(b: &[u8], y: &mut [f32]) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let d = f16_at(b, 80);
    let dmin = f16_at(b, 82);
    for (k, group) in y.chunks_exact_mut(16).enumerate() {
        let dl = d * (scales[k] & 0x0F) as f32;
        let ml = dmin * (scales[k] >> 4) as f32;
        for (j, v) in group.iter_mut().enumerate() {
            *v = dl * crumb256(qs, k * 16 + j) as f32 - ml;
        }
    }
}

fn q3_k(b: &[u8], y: &mut [f32]) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let sc = &b[96..108];
    let d = f16_at(b, 108);
    for (k, group) in y.chunks_exact_mut(16).enumerate() {
        // 6-bit scale k: low nibble from byte k % 8 (shift 4 for k >= 8), top two bits from
        // byte 8 + k % 4 at shift 2 * (k / 4).
        let lo = (sc[k % 8] >> (4 * (k / 8))) & 0x0F;
        let hi = (sc[8 + k % 4] >> (2 * (k / 4))) & 0x03;
        let s = ((lo | (hi << 4)) as i8 - 32) as f32;
        let dl = d * s;
        for (j, v) in group.iter_mut().enumerate() {
            let i = k * 16 + j;
            let ql = crumb256(qs, i) as i8;
            // The high bit is inverted: a set bit means no -4 offset.
            let h = ((hmask[i % 32] >> (i / 32)) & 1) ^ 1;
            let q = (ql - ((h << 2) as i8)) as f32;
            *v = dl * q;
        }
    }
}

/// Q4_K/Q5_K's eight 6-bit (scale, min) pairs packed in 12 bytes.
#[inline]
fn scale_min_k4(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 0x3F, s[4 + j] & 0x3F)
    } else {
        let sc = (s[8 + j - 4] & 0x0F) | ((s[j - 4] >> 2) & 0x30);
        let m = (s[8 + j - 4] >> 4) | ((s[4 + j - 4] >> 2) & 0x30);
        (sc, m)
    }
}

fn q4_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for (g, group) in y.chunks_exact_mut(32).enumerate() {
        let (sc, m) = scale_min_k4(scales, g);
        let dd = d * sc as f32;
        let dm = dmin * m as f32;
        for (l, v) in group.iter_mut().enumerate() {
            let q = (qs[(g / 2) * 32 + l] >> (4 * (g % 2))) & 0x0F;
            *v = dd * q as f32 - dm;
        }
    }
}

fn q5_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for (g, group) in y.chunks_exact_mut(32).enumerate() {
        let (sc, m) = scale_min_k4(scales, g);
        let dd = d * sc as f32;
        let dm = dmin * m as f32;
        for (l, v) in group.iter_mut().enumerate() {
            let ql = (qs[(g / 2) * 32 + l] >> (4 * (g % 2))) & 0x0F;
            let h = (qh[l] >> g) & 1;
            *v = dd * (ql | (h << 4)) as f32 - dm;
        }
    }
}

fn q6_k(b: &[u8], y: &mut [f32]) {
    let ql = &b[0..128];
    let qh = &b[128..192];
    let scales = &b[192..208];
    let d = f16_at(b, 208);
    for (k, group) in y.chunks_exact_mut(16).enumerate() {
        let dk = d * (scales[k] as i8) as f32;
        for (j, v) in group.iter_mut().enumerate() {
            let i = k * 16 + j;
            let (half, r) = (i / 128, i % 128);
            let lo = (ql[half * 64 + r % 64] >> (4 * (r / 64))) & 0x0F;
            let hi = (qh[half * 32 + r % 32] >> (2 * (r / 32))) & 0x03;
            let q = (lo | (hi << 4)) as i8 - 32;
            *v = dk * q as f32;
        }
    }
}

fn tq1_0(b: &[u8], y: &mut [f32]) {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    let qs = &b[0..48];
    let qh = &b[48..52];
    let d = f16_at(b, 52);
    for (i, v) in y.iter_mut().enumerate() {
        // Base-3 digits stored as fixed-point fractions: multiplying (mod 256) by 3^k brings
        // digit k to the top, and (x * 3) >> 8 reads it.
        let x = if i < 160 {
            qs[i % 32].wrapping_mul(POW3[i / 32])
        } else if i < 240 {
            let r = i - 160;
            qs[32 + r % 16].wrapping_mul(POW3[r / 16])
        } else {
            let r = i - 240;
            qh[r % 4].wrapping_mul(POW3[r / 4])
        };
        let q = ((x as u16 * 3) >> 8) as i8 - 1;
        *v = d * q as f32;
    }
}

fn tq2_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 64);
    for (i, v) in y.iter_mut().enumerate() {
        let q = crumb256(&b[0..64], i) as i8 - 1;
        *v = d * q as f32;
    }
}

/// ggml's `ggml_e8m0_to_fp32_half`: 2^(e - 127) / 2, subnormal for e < 2.
#[inline]
fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

fn mxfp4(b: &[u8], y: &mut [f32]) {
    let d = e8m0_half(b[0]);
    for (i, v) in y.iter_mut().enumerate() {
        let q = super::grids::MXFP4_KVALUES[nibble32(&b[1..17], i) as usize];
        *v = d * q as f32;
    }
}
