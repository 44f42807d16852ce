//! MXFP4 (OCP microscaling, gpt-oss's published expert format): each row of `cols` inputs is
//! `cols / 32` groups of 32 e2m1 values (4 bits: sign, 2-bit exponent, 1-bit mantissa; two a
//! byte, the even element in the low nibble) sharing one e8m0 scale (a bare exponent byte,
//! `2^(e - 127)`). The engine keeps the published bytes as they are: the matrix's data is the
//! nibbles, its f32 scales are the e8m0 bytes' exact values (`2^(e - 127)` is an f32 for every
//! `e` but 255, e8m0's NaN, which loading refuses).
//!
//! The product runs on f32 activations: an e2m1 value times its scale is exact in f32, so a
//! row's dot is the f32 dot of the dequantized row, with no second rounding of the
//! activations (int8 activations would add one the reference does not have; the row is 4.25
//! bits a weight, so its bytes, not the activations', bound the product). [`dot_row`] is the
//! reference order every SIMD kernel reproduces bit for bit: eight lanes, lane `j % 8` of
//! each group taking its `j`-th value, a product then a sum (no fused multiply-add), combined
//! as [`super::scalar::dot_f32`] combines its lanes.

/// e2m1 by code (bit 3 the sign), as transformers' `FP4_VALUES`.
pub const E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Values in one scale group.
pub const GROUP: usize = 32;
/// Bytes of one group's values.
pub const GROUP_BYTES: usize = GROUP / 2;

/// An e8m0 scale byte's value, `2^(e - 127)`; `None` for 255 (NaN).
pub fn e8m0(e: u8) -> Option<f32> {
    match e {
        255 => None,
        // 2^-127 is a subnormal f32, exact.
        0 => Some(f32::from_bits(0x0040_0000)),
        e => Some(f32::from_bits((e as u32) << 23)),
    }
}

impl super::QMatrix {
    /// A `[rows, cols]` MXFP4 matrix from its stored bytes: `blocks` (`cols / 2` a row) and
    /// one e8m0 byte per 32 inputs (`cols / 32` a row). Refused: `cols` not a multiple of 32,
    /// lengths that do not match, a NaN scale (255).
    pub fn from_mxfp4(
        rows: usize,
        cols: usize,
        blocks: Vec<u8>,
        e8m0_scales: &[u8],
    ) -> Result<super::QMatrix, String> {
        if !cols.is_multiple_of(GROUP) {
            return Err(format!(
                "{cols} inputs a row: MXFP4 needs whole groups of {GROUP}"
            ));
        }
        let groups = rows * (cols / GROUP);
        if blocks.len() != rows * cols / 2 || e8m0_scales.len() != groups {
            return Err(format!(
                "{} block bytes and {} scales for a [{rows}, {cols}] MXFP4 matrix, which has {}                  and {groups}",
                blocks.len(),
                e8m0_scales.len(),
                rows * cols / 2
            ));
        }
        let mut scales = Vec::with_capacity(groups);
        for (i, &e) in e8m0_scales.iter().enumerate() {
            scales.push(e8m0(e).ok_or_else(|| {
                format!(
                    "scale {i} is 255, e8m0's NaN (row {}, group {})",
                    i / (cols / GROUP),
                    i % (cols / GROUP)
                )
            })?);
        }
        super::QMatrix::from_parts(super::QFormat::Mxfp4, rows, cols, blocks, scales)
            .map_err(|e| e.to_string())
    }
}

/// Row `blocks` (`scales.len()` groups of [`GROUP_BYTES`]) dequantized into `out`.
pub fn dequant_row(blocks: &[u8], scales: &[f32], out: &mut [f32]) {
    for ((o, b), &s) in out
        .chunks_exact_mut(GROUP)
        .zip(blocks.chunks_exact(GROUP_BYTES))
        .zip(scales)
    {
        for (pair, &byte) in o.chunks_exact_mut(2).zip(b) {
            pair[0] = E2M1[(byte & 0x0F) as usize] * s;
            pair[1] = E2M1[(byte >> 4) as usize] * s;
        }
    }
}

/// The dot of the dequantized row and `x` (`scales.len() * GROUP` values), in the reference
/// order (see the module's comment).
pub fn dot_row(blocks: &[u8], scales: &[f32], x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    for ((b, &s), xg) in blocks
        .chunks_exact(GROUP_BYTES)
        .zip(scales)
        .zip(x.chunks_exact(GROUP))
    {
        for (j, (&byte, xp)) in b.iter().zip(xg.chunks_exact(2)).enumerate() {
            let lane = (2 * j) % 8;
            acc[lane] += (E2M1[(byte & 0x0F) as usize] * s) * xp[0];
            acc[lane + 1] += (E2M1[(byte >> 4) as usize] * s) * xp[1];
        }
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// Rows `r0..` of MXFP4 matrix `m` against `x` (`n_seq` positions of `m.cols`) into `out`
/// (`[rows][n_seq]`): with an AVX-512 set, four rows at a time (`mxfp4_avx512`), else a row
/// at a time with [`dot`]; bit for bit [`dot_row`] either way.
pub(super) fn rows_into(
    k: &super::KernelSet,
    m: &super::QMatrix,
    r0: usize,
    x: &[f32],
    n_seq: usize,
    out: &mut [f32],
) {
    let cols = m.cols;
    #[cfg(target_arch = "x86_64")]
    if k.name.starts_with("avx512") {
        use super::mxfp4_avx512::dot as simd;
        let nr = out.len() / n_seq;
        for s in 0..n_seq {
            let xs = &x[s * cols..(s + 1) * cols];
            let mut j = 0;
            while j + 4 <= nr {
                let r = r0 + j;
                let rows: [usize; 4] = std::array::from_fn(|i| r + i);
                let y = simd(
                    rows.map(|r| m.row_packed(r)),
                    rows.map(|r| m.row_scales(r)),
                    xs,
                );
                for (i, v) in y.into_iter().enumerate() {
                    out[(j + i) * n_seq + s] = v;
                }
                j += 4;
            }
            for j in j..nr {
                let r = r0 + j;
                out[j * n_seq + s] = simd([m.row_packed(r)], [m.row_scales(r)], xs)[0];
            }
        }
        return;
    }
    for (j, o) in out.chunks_exact_mut(n_seq).enumerate() {
        let (b, sc) = (m.row_packed(r0 + j), m.row_scales(r0 + j));
        for (s, ys) in o.iter_mut().enumerate() {
            *ys = dot(k, b, sc, &x[s * cols..(s + 1) * cols]);
        }
    }
}

/// [`dot_row`] with the best kernel of `k`: AVX2 wherever the set is not the portable one and
/// the CPU has it (the AVX-512 sets included), NEON for the NEON set, else the reference.
pub(super) fn dot(k: &super::KernelSet, blocks: &[u8], scales: &[f32], x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if !std::ptr::eq(k, super::KernelSet::portable()) && std::arch::is_x86_feature_detected!("avx2")
    {
        return dot_row_avx2(blocks, scales, x);
    }
    #[cfg(target_arch = "aarch64")]
    if !std::ptr::eq(k, super::KernelSet::portable()) {
        return super::mxfp4_neon::dot(blocks, scales, x);
    }
    let _ = k;
    dot_row(blocks, scales, x)
}

/// [`dot_row`] with AVX2: eight values a vector, decoded from four bytes by variable shifts
/// and a permute of the eight magnitudes, the sign moved to bit 31. Bit-identical to
/// [`dot_row`].
#[cfg(target_arch = "x86_64")]
pub fn dot_row_avx2(blocks: &[u8], scales: &[f32], x: &[f32]) -> f32 {
    let groups = scales
        .len()
        .min(blocks.len() / GROUP_BYTES)
        .min(x.len() / GROUP);
    assert!(
        std::arch::is_x86_feature_detected!("avx2"),
        "dot_row_avx2 without AVX2"
    );
    // SAFETY: AVX2 was detected just above; `groups` groups of `blocks`, `scales` and `x` are
    // in bounds (the minimum of the three lengths).
    unsafe { avx2::dot(blocks.as_ptr(), scales.as_ptr(), x.as_ptr(), groups) }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// `groups` groups of `b` (16 bytes each), `s` (one scale each) and `x` (32 values each).
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dot(b: *const u8, s: *const f32, x: *const f32, groups: usize) -> f32 {
        let mags = _mm256_setr_ps(0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0);
        let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
        let low3 = _mm256_set1_epi32(7);
        let sign = _mm256_set1_epi32(8);
        let mut acc = _mm256_setzero_ps();
        for g in 0..groups {
            let scale = _mm256_set1_ps(*s.add(g));
            for q in 0..4 {
                // Four bytes: values 8q..8q+8 of the group, nibble i at bit 4i.
                let word = (b.add(g * 16 + q * 4) as *const u32).read_unaligned();
                let codes = _mm256_srlv_epi32(_mm256_set1_epi32(word as i32), shifts);
                let mag = _mm256_permutevar8x32_ps(mags, _mm256_and_si256(codes, low3));
                let neg = _mm256_slli_epi32(_mm256_and_si256(codes, sign), 28);
                let w = _mm256_xor_ps(mag, _mm256_castsi256_ps(neg));
                let prod = _mm256_mul_ps(
                    _mm256_mul_ps(w, scale),
                    _mm256_loadu_ps(x.add(g * 32 + q * 8)),
                );
                acc = _mm256_add_ps(acc, prod);
            }
        }
        let mut l = [0.0f32; 8];
        _mm256_storeu_ps(l.as_mut_ptr(), acc);
        ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic row of `groups` groups: every code, scales from 2^-8 to 2^3.
    fn row(groups: usize, seed: u32) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
        let mut r = seed;
        let mut next = || {
            r = r.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            r >> 8
        };
        let blocks: Vec<u8> = (0..groups * GROUP_BYTES).map(|_| next() as u8).collect();
        let scales: Vec<f32> = (0..groups)
            .map(|_| e8m0(119 + (next() % 12) as u8).unwrap())
            .collect();
        let x: Vec<f32> = (0..groups * GROUP)
            .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
            .collect();
        (blocks, scales, x)
    }

    #[test]
    fn e8m0_is_a_power_of_two_and_255_is_refused() {
        assert_eq!(e8m0(127), Some(1.0));
        assert_eq!(e8m0(128), Some(2.0));
        assert_eq!(e8m0(120), Some(2f32.powi(-7)));
        assert_eq!(e8m0(0), Some(2f32.powi(-127)));
        assert_eq!(e8m0(254), Some(2f32.powi(127)));
        assert_eq!(e8m0(255), None);
    }

    #[test]
    fn the_low_nibble_is_the_even_element() {
        // 0x72: low 2 (1.0), high 7 (6.0); 0x9F: low 15 (-6.0), high 9 (-0.5).
        let mut blocks = vec![0u8; GROUP_BYTES];
        blocks[0] = 0x72;
        blocks[1] = 0x9F;
        let mut out = vec![0.0; GROUP];
        dequant_row(&blocks, &[0.5], &mut out);
        assert_eq!(&out[..4], &[0.5, 3.0, -3.0, -0.25]);
    }

    #[test]
    fn the_dot_is_the_dequantized_rows_dot_in_the_reference_order() {
        for groups in [1, 2, 5, 90] {
            let (b, s, x) = row(groups, groups as u32);
            let mut w = vec![0.0; groups * GROUP];
            dequant_row(&b, &s, &mut w);
            assert_eq!(dot_row(&b, &s, &x), crate::quant::scalar::dot_f32(&w, &x));
        }
    }

    #[test]
    fn a_matrix_multiplies_as_its_dequantized_rows_with_every_kernel_set() {
        // Six rows: a block of four and two left over for the AVX-512 sets.
        let (rows, cols) = (6, 64);
        let (b, _, x) = row(rows * cols / GROUP, 7);
        let e8: Vec<u8> = (0..rows * cols / GROUP).map(|i| 120 + i as u8).collect();
        let m = crate::quant::QMatrix::from_mxfp4(rows, cols, b.clone(), &e8).unwrap();
        assert_eq!(
            m.resident_bytes(),
            rows * cols / 2 + 4 * rows * cols / GROUP
        );
        let x = &x[..cols];
        for k in crate::quant::KernelSet::available() {
            let mut y = vec![0.0; rows];
            m.matmul_with(k, x, 1, &mut y);
            let mut yi = vec![0.0; rows];
            m.matmul_i8act_with(k, x, 1, &mut yi);
            for r in 0..rows {
                let s: Vec<f32> = e8[r * 2..r * 2 + 2]
                    .iter()
                    .map(|&e| e8m0(e).unwrap())
                    .collect();
                let want = dot_row(&b[r * 32..(r + 1) * 32], &s, x);
                assert_eq!(y[r].to_bits(), want.to_bits(), "{} row {r}", k.name);
                assert_eq!(
                    yi[r].to_bits(),
                    want.to_bits(),
                    "{} int8 act row {r}",
                    k.name
                );
            }
        }
        let mut bad = e8.clone();
        bad[4] = 255;
        let e = crate::quant::QMatrix::from_mxfp4(rows, cols, b.clone(), &bad).unwrap_err();
        assert!(
            e.contains("scale 4 is 255") && e.contains("row 2, group 0"),
            "{e}"
        );
        assert!(crate::quant::QMatrix::from_mxfp4(rows, 48, b, &e8).is_err());
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_is_the_reference_bit_for_bit() {
        if !crate::quant::mxfp4_avx512::available() {
            return;
        }
        use crate::quant::mxfp4_avx512::dot as simd;
        for groups in [1, 3, 64, 90] {
            for seed in 0..8 {
                let rows: Vec<_> = (0..4)
                    .map(|r| row(groups, seed * 131 + r * 7 + groups as u32))
                    .collect();
                let x = &rows[0].2;
                let got = simd(
                    std::array::from_fn::<_, 4, _>(|r| &rows[r].0[..]),
                    std::array::from_fn(|r| &rows[r].1[..]),
                    x,
                );
                for (r, (b, s, _)) in rows.iter().enumerate() {
                    let want = dot_row(b, s, x).to_bits();
                    assert_eq!(
                        got[r].to_bits(),
                        want,
                        "{groups} groups, seed {seed}, row {r}"
                    );
                    assert_eq!(simd([&b[..]], [&s[..]], x)[0].to_bits(), want);
                }
            }
        }
    }

    /// Not a check: the time of a gpt-oss-shaped expert matrix ([2880, 2880]) times one
    /// vector with each kernel set, on this thread alone, the best of 30 runs (`cargo test
    /// --release -p colibri --lib mxfp4_speed -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn mxfp4_speed() {
        let (rows, cols) = (2880, 2880);
        let (b, _, x) = row(rows * cols / GROUP, 11);
        let e8: Vec<u8> = (0..rows * cols / GROUP)
            .map(|i| 120 + (i % 8) as u8)
            .collect();
        let m = crate::quant::QMatrix::from_mxfp4(rows, cols, b, &e8).unwrap();
        let x = &x[..cols];
        let mut y = vec![0.0; rows];
        for k in crate::quant::KernelSet::available() {
            let best = (0..30)
                .map(|_| {
                    let t = std::time::Instant::now();
                    rows_into(k, &m, 0, x, 1, &mut y);
                    t.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min);
            let bytes = (rows * cols / 2 + rows * cols / GROUP) as f64;
            eprintln!(
                "{:>10}: {:.3} ms, {:.2} GB/s of weights",
                k.name,
                best * 1e3,
                bytes / best / 1e9
            );
        }
    }

    #[cfg(target_arch = "aarch64")]
    #[test]
    fn neon_is_the_reference_bit_for_bit() {
        for groups in [1, 3, 64, 90] {
            for seed in 0..8 {
                let (b, s, x) = row(groups, seed * 131 + groups as u32);
                assert_eq!(
                    crate::quant::mxfp4_neon::dot(&b, &s, &x).to_bits(),
                    dot_row(&b, &s, &x).to_bits(),
                    "{groups} groups, seed {seed}"
                );
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_is_the_reference_bit_for_bit() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        for groups in [1, 3, 64, 90] {
            for seed in 0..8 {
                let (b, s, x) = row(groups, seed * 131 + groups as u32);
                assert_eq!(
                    dot_row_avx2(&b, &s, &x).to_bits(),
                    dot_row(&b, &s, &x).to_bits(),
                    "{groups} groups, seed {seed}"
                );
            }
        }
    }
}
