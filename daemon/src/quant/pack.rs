//! Quantize / pack / unpack for every [`QFormat`], one row at a time.
//!
//! The byte layouts here are fixed: they are what the upstream converter
//! writes into pre-quantized containers, so they must not change.
//!
//! * int8 row:  one signed byte per weight, one scale per row.
//! * int4 row / int4-g64: `q + 8` nibbles, low nibble = even column, high
//!   nibble = odd column; `ceil(I/2)` bytes per row.  g64 has one scale per
//!   64 inputs (groups start on byte boundaries since 64 is even).
//! * int2 row: `q + 2` in 2-bit fields, element `k` at bits `2*(k%4)` of byte
//!   `k/4`; `ceil(I/4)` bytes per row.
//! * int3-g64: per group 24 bytes: 16-byte low plane (low 2 bits of `u = q+4`
//!   of value `k` at byte `k>>2`, shift `(k&3)*2`) then 8-byte high plane
//!   (bit 2 of `u` at byte `k>>3`, bit `k&7`).  A short tail group is padded
//!   with `u = 4` (value 0).

use super::QFormat;

/// Group size of the grouped formats.
pub(crate) const GROUP: usize = 64;
/// Bytes per 64-group in int3-g64.
pub(crate) const I3_GROUP_BYTES: usize = 24;
/// Smallest scale the converter writes (avoids division by zero).
const MIN_SCALE: f32 = 1e-8;

/// Number of 64-groups in a row of `cols` inputs.
#[inline]
pub(crate) fn n_groups(cols: usize) -> usize {
    cols.div_ceil(GROUP)
}

/// Packed bytes per row (F32: 4 bytes per element).
pub(crate) fn row_bytes(fmt: QFormat, cols: usize) -> usize {
    match fmt {
        QFormat::F32 => cols * 4,
        QFormat::I8Row => cols,
        QFormat::I4Row | QFormat::I4G64 => cols.div_ceil(2),
        QFormat::I2Row => cols.div_ceil(4),
        QFormat::I3G64 => n_groups(cols) * I3_GROUP_BYTES,
        // Whole groups: gpt-oss's rows are multiples of 32 (checked where one is built).
        QFormat::Mxfp4 => cols / 2,
        // Whole blocks (checked where one is built).
        QFormat::Ggml(t) => cols / t.block_elems() * t.block_bytes(),
    }
}

/// f32 scales per row.
pub(crate) fn scales_per_row(fmt: QFormat, cols: usize) -> usize {
    match fmt {
        QFormat::F32 => 0,
        QFormat::I8Row | QFormat::I4Row | QFormat::I2Row => 1,
        QFormat::I4G64 | QFormat::I3G64 => n_groups(cols),
        QFormat::Mxfp4 => cols / super::mxfp4::GROUP,
        // The scales are inside the blocks.
        QFormat::Ggml(_) => 0,
    }
}

/// `max(amax / qmax, 1e-8)` over the real elements. Eight running maxima instead of one, so
/// the loop vectorizes; `max` ignores order (and NaN the same way), so the result is the
/// one-accumulator fold's.
#[inline]
fn scale_for(vals: &[f32], qmax: f32) -> f32 {
    let mut m = [0.0f32; 8];
    let mut blocks = vals.chunks_exact(8);
    for b in &mut blocks {
        for (acc, v) in m.iter_mut().zip(b) {
            *acc = acc.max(v.abs());
        }
    }
    let tail = blocks
        .remainder()
        .iter()
        .fold(0.0f32, |a, v| a.max(v.abs()));
    let amax = m.iter().fold(tail, |a, &v| a.max(v));
    (amax / qmax).max(MIN_SCALE)
}

/// `clamp(rint(v / s), lo, hi)` (numpy `rint` = round half to even).
#[inline]
fn q(v: f32, s: f32, lo: f32, hi: f32) -> i32 {
    rint_clamped(v / s).clamp(lo, hi) as i32
}

/// `v.round_ties_even()` wherever that lands inside `[-2^22, 2^22]` (as a value: a negative
/// half gives +0, not -0, which no integer cast can tell apart), and a value that clamps the
/// same way elsewhere (NaN stays NaN). Without SSE4.1 in the baseline target
/// `round_ties_even` is a libm call per weight, a tenth of the time of quantizing a model at
/// load; adding and removing 1.5 * 2^23 rounds in the FPU instead: the sum lies in
/// [2^23, 2^24), where f32 holds integers only, so the addition rounds `v` to an integer,
/// ties to even, and the subtraction is exact.
#[inline]
pub(crate) fn rint_clamped(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
    if v.abs() < 4_194_304.0 {
        (v + MAGIC) - MAGIC
    } else {
        v
    }
}

/// Quantize one row of `w` (len = cols) into `out` (len = `row_bytes`) and
/// `scales` (len = `scales_per_row`).  Not for F32.
pub(crate) fn quantize_row(fmt: QFormat, w: &[f32], out: &mut [u8], scales: &mut [f32]) {
    debug_assert_eq!(out.len(), row_bytes(fmt, w.len()));
    debug_assert_eq!(scales.len(), scales_per_row(fmt, w.len()));
    match fmt {
        QFormat::F32 => unreachable!("F32 is not packed"),
        QFormat::Mxfp4 => unreachable!("MXFP4 is read as stored, never quantized to"),
        QFormat::Ggml(_) => unreachable!("GGUF blocks are read as stored, never quantized to"),
        QFormat::I8Row => {
            let s = scale_for(w, 127.0);
            scales[0] = s;
            for (o, &v) in out.iter_mut().zip(w) {
                *o = q(v, s, -128.0, 127.0) as i8 as u8;
            }
        }
        QFormat::I4Row => pack_i4(w, w.len().max(1), out, scales),
        QFormat::I4G64 => pack_i4(w, GROUP, out, scales),
        QFormat::I2Row => {
            let s = scale_for(w, 1.0);
            scales[0] = s;
            // Padding fields hold 2 (value 0).
            out.fill(0b1010_1010);
            for (k, &v) in w.iter().enumerate() {
                let u = (q(v, s, -2.0, 1.0) + 2) as u8;
                let sh = 2 * (k % 4);
                out[k / 4] = (out[k / 4] & !(3 << sh)) | (u << sh);
            }
        }
        QFormat::I3G64 => {
            for (g, (grp, dst)) in w
                .chunks(GROUP)
                .zip(out.chunks_exact_mut(I3_GROUP_BYTES))
                .enumerate()
            {
                let s = scale_for(grp, 3.0);
                scales[g] = s;
                dst.fill(0);
                for k in 0..GROUP {
                    // Tail padding: w = 0 -> q = 0 -> u = 4.
                    let u = match grp.get(k) {
                        Some(&v) => (q(v, s, -4.0, 3.0) + 4) as u8,
                        None => 4,
                    };
                    dst[k >> 2] |= (u & 3) << ((k & 3) * 2);
                    dst[16 + (k >> 3)] |= ((u >> 2) & 1) << (k & 7);
                }
            }
        }
    }
}

/// int4 packing with one scale per `group` inputs (`group` even, or the
/// whole row for per-row). An odd tail's high nibble holds 8 (value 0).
fn pack_i4(w: &[f32], group: usize, out: &mut [u8], scales: &mut [f32]) {
    for (g, grp) in w.chunks(group).enumerate() {
        let s = scale_for(grp, 7.0);
        scales[g] = s;
        let dst = &mut out[g * group / 2..][..grp.len().div_ceil(2)];
        let mut pairs = grp.chunks_exact(2);
        for (o, pair) in dst.iter_mut().zip(&mut pairs) {
            *o = nibble(pair[0], s) | (nibble(pair[1], s) << 4);
        }
        if let [last] = pairs.remainder() {
            dst[grp.len() / 2] = nibble(*last, s) | (8 << 4);
        }
    }
}

/// `q + 8` of an int4 weight.
#[inline(always)]
fn nibble(v: f32, s: f32) -> u8 {
    (q(v, s, -8.0, 7.0) + 8) as u8
}

/// Signed int4 value of element `k` of a packed int4 row.
#[cfg(test)]
pub(crate) fn i4_at(row: &[u8], k: usize) -> i32 {
    ((row[k / 2] >> (4 * (k & 1))) & 15) as i32 - 8
}

/// Signed int2 value of element `k` of a packed int2 row.
#[cfg(test)]
pub(crate) fn i2_at(row: &[u8], k: usize) -> i32 {
    ((row[k / 4] >> (2 * (k % 4))) & 3) as i32 - 2
}

/// Signed int3 value of element `k` (0..64) of one 24-byte int3 group.
#[cfg(test)]
pub(crate) fn i3_at(grp: &[u8], k: usize) -> i32 {
    let lo = (grp[k >> 2] >> ((k & 3) * 2)) & 3;
    let hi = (grp[16 + (k >> 3)] >> (k & 7)) & 1;
    (lo | (hi << 2)) as i32 - 4
}

/// Unpack one 24-byte int3 group into 64 signed values in [-4, 3].
#[inline]
pub(crate) fn unpack_i3(grp: &[u8], out: &mut [i8; GROUP]) {
    let grp = &grp[..I3_GROUP_BYTES];
    for j in 0..8 {
        // Elements 8j..8j+8: low bits are the 16 bits of plane bytes
        // 2j, 2j+1 (2 bits each, element t at bit 2t), high bits plane byte j.
        let lo = u16::from_le_bytes([grp[2 * j], grp[2 * j + 1]]);
        let hi = grp[16 + j];
        for t in 0..8 {
            let u = ((lo >> (2 * t)) & 3) as u8 | (((hi >> t) & 1) << 2);
            out[8 * j + t] = u as i8 - 4;
        }
    }
}

/// int4 nibbles of `row` (low = even element) times `s` into `out`.
#[inline]
fn dequant_i4(row: &[u8], s: f32, out: &mut [f32]) {
    let mut pairs = out.chunks_exact_mut(2);
    for (o, &b) in (&mut pairs).zip(row) {
        o[0] = ((b & 15) as i32 - 8) as f32 * s;
        o[1] = ((b >> 4) as i32 - 8) as f32 * s;
    }
    let n = out.len();
    if n % 2 == 1 {
        out[n - 1] = ((row[n / 2] & 15) as i32 - 8) as f32 * s;
    }
}

/// Dequantize one packed row (`row` = its bytes, `scales` = its scales) into
/// `out` (len = cols).  Each value is exactly `q * scale`.  Not for F32.
pub(crate) fn dequant_row(fmt: QFormat, row: &[u8], scales: &[f32], out: &mut [f32]) {
    match fmt {
        QFormat::F32 => unreachable!("F32 is not packed"),
        QFormat::I8Row => {
            let s = scales[0];
            for (o, &b) in out.iter_mut().zip(row) {
                *o = (b as i8) as f32 * s;
            }
        }
        QFormat::I4Row => dequant_i4(row, scales[0], out),
        QFormat::Mxfp4 => super::mxfp4::dequant_row(row, scales, out),
        // The row's length was checked against the type's blocks when the matrix was built.
        QFormat::Ggml(t) => crate::gguf::dequantize_row(t, row, out)
            .expect("a ggml matrix's rows are whole blocks of its type"),
        QFormat::I4G64 => {
            for (g, chunk) in out.chunks_mut(GROUP).enumerate() {
                dequant_i4(&row[g * (GROUP / 2)..], scales[g], chunk);
            }
        }
        QFormat::I2Row => {
            let s = scales[0];
            let last = out.len() / 4;
            let mut quads = out.chunks_exact_mut(4);
            for (o, &b) in (&mut quads).zip(row) {
                o[0] = ((b & 3) as i32 - 2) as f32 * s;
                o[1] = (((b >> 2) & 3) as i32 - 2) as f32 * s;
                o[2] = (((b >> 4) & 3) as i32 - 2) as f32 * s;
                o[3] = ((b >> 6) as i32 - 2) as f32 * s;
            }
            let tail = quads.into_remainder();
            if !tail.is_empty() {
                let b = row[last];
                for (f, o) in tail.iter_mut().enumerate() {
                    *o = (((b >> (2 * f)) & 3) as i32 - 2) as f32 * s;
                }
            }
        }
        QFormat::I3G64 => {
            let mut q = [0i8; GROUP];
            for (g, chunk) in out.chunks_mut(GROUP).enumerate() {
                unpack_i3(&row[g * I3_GROUP_BYTES..], &mut q);
                let s = scales[g];
                for (o, &v) in chunk.iter_mut().zip(&q) {
                    *o = v as f32 * s;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The packing as first written (one running max, a branch per pair), kept as the
    /// reference the faster loops must equal byte for byte.
    fn reference_i4(w: &[f32], group: usize, out: &mut [u8], scales: &mut [f32]) {
        for (g, grp) in w.chunks(group).enumerate() {
            let amax = grp.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let s = (amax / 7.0).max(MIN_SCALE);
            scales[g] = s;
            for (j, pair) in grp.chunks(2).enumerate() {
                let lo = (q(pair[0], s, -8.0, 7.0) + 8) as u8;
                let hi = pair.get(1).map_or(8, |&v| (q(v, s, -8.0, 7.0) + 8) as u8);
                out[g * group / 2 + j] = lo | (hi << 4);
            }
        }
    }

    #[test]
    fn i4_packing_equals_the_reference() {
        let mut state = crate::rng::XorShift64(0x1234_5678_9abc_def0);
        let mut next = move || state.next_u64();
        let specials = [
            0.0,
            -0.0,
            f32::NAN,
            f32::INFINITY,
            -f32::INFINITY,
            1e30,
            -1e-30,
            3.5,
        ];
        for cols in [1, 2, 3, 7, 8, 9, 63, 64, 65, 127, 128, 200, 1000] {
            for trial in 0..20 {
                let w: Vec<f32> = (0..cols)
                    .map(|i| {
                        let r = next();
                        if trial % 4 == 3 && r % 17 == 0 {
                            specials[i % specials.len()]
                        } else {
                            ((r >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * (1 + trial) as f32
                        }
                    })
                    .collect();
                for fmt in [QFormat::I4Row, QFormat::I4G64] {
                    let (rb, spr) = (row_bytes(fmt, cols), scales_per_row(fmt, cols));
                    let (mut a, mut sa) = (vec![0u8; rb], vec![0f32; spr]);
                    let (mut b, mut sb) = (vec![0u8; rb], vec![0f32; spr]);
                    quantize_row(fmt, &w, &mut a, &mut sa);
                    let group = if fmt == QFormat::I4G64 { GROUP } else { cols };
                    reference_i4(&w, group, &mut b, &mut sb);
                    assert_eq!(a, b, "{fmt} cols {cols} trial {trial}");
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&sa), bits(&sb), "{fmt} cols {cols} trial {trial}");
                }
            }
        }
    }

    #[test]
    #[ignore = "timing, not a check: cargo test --release -p colibri --lib pack_speed -- --ignored --nocapture"]
    fn pack_speed() {
        let (rows, cols) = (1024, 2048);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919) % 1000) as f32 * 1e-3 - 0.5)
            .collect();
        let (mut out, mut sc) = (vec![0u8; cols / 2], vec![0f32; cols / 64]);
        for _ in 0..3 {
            let t = std::time::Instant::now();
            for r in w.chunks_exact(cols) {
                quantize_row(QFormat::I4G64, r, &mut out, &mut sc);
            }
            let new = t.elapsed();
            let t = std::time::Instant::now();
            for r in w.chunks_exact(cols) {
                reference_i4(r, GROUP, &mut out, &mut sc);
            }
            let old = t.elapsed();
            crate::elog!(
                "int4-g64 one core: {new:?} now, {old:?} before ({} weights)",
                rows * cols
            );
        }
    }
}
