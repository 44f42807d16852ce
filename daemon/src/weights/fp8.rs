//! FP8 e4m3 weights with 128x128 block scales, as DeepSeek-V3 and GLM-5 ship them: a
//! `F8_E4M3` tensor `<name>` `[rows, cols]` and an F32 (or BF16) tensor `<name>_scale_inv`
//! `[ceil(rows/128), ceil(cols/128)]`; weight `(r, c)` is `e4m3(code) * scale[r/128][c/128]`.
//!
//! Decoding is exact: every e4m3 value is an f32, and the one rounding is the f32 product
//! with the scale, the same single multiply torch does (`w.to(float32) * scale`), so a
//! dequantized tensor equals torch's bit for bit (tested against a table torch wrote).

/// Rows and columns covered by one scale.
pub const BLOCK: usize = 128;

/// The f32 bit pattern of e4m3 (`float8_e4m3fn`) code `code`: 1 sign, 4 exponent (bias 7) and
/// 3 mantissa bits, no infinities, `S.1111.111` the only NaN. A NaN keeps its mantissa bits
/// (`0x7FF00000`, sign kept), which is what torch's conversion gives.
const fn e4m3_bits(code: u8) -> u32 {
    let sign = ((code as u32) >> 7) << 31;
    let exp = ((code >> 3) & 0xF) as u32;
    let man = (code & 0x7) as u32;
    if exp == 0xF && man == 0x7 {
        return sign | 0x7F80_0000 | (man << 20);
    }
    if exp == 0 {
        if man == 0 {
            return sign; // +0 or -0
        }
        // Subnormal: man * 2^-9. Normalise on the highest set bit p (0..=2): 2^(p-9) * 1.f.
        let p = 31 - man.leading_zeros();
        let frac = (man - (1 << p)) << (23 - p);
        return sign | ((p + 127 - 9) << 23) | frac;
    }
    sign | ((exp + 127 - 7) << 23) | (man << 20)
}

const fn build_table() -> [f32; 256] {
    let mut t = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = f32::from_bits(e4m3_bits(i as u8));
        i += 1;
    }
    t
}

/// Every e4m3 code's value.
pub static E4M3: [f32; 256] = build_table();

/// The `[ceil(rows/128), ceil(cols/128)]` shape the scales of a `[rows, cols]` tensor have.
pub fn scale_shape(rows: usize, cols: usize) -> [usize; 2] {
    [rows.div_ceil(BLOCK), cols.div_ceil(BLOCK)]
}

/// Dequantizes rows `first_row..first_row + codes.len() / cols` of a `[_, cols]` FP8 tensor
/// into `out` (same length as `codes`). `scales` is the whole tensor's scale grid, row major,
/// `cols.div_ceil(128)` per block row. Panics on lengths that do not fit (callers check the
/// shapes once, when they find the tensor).
pub fn dequant_rows(codes: &[u8], cols: usize, first_row: usize, scales: &[f32], out: &mut [f32]) {
    assert_eq!(
        codes.len(),
        out.len(),
        "fp8: codes and output lengths differ"
    );
    if cols == 0 {
        return;
    }
    let per_row = cols.div_ceil(BLOCK);
    for (r, (src, dst)) in codes
        .chunks_exact(cols)
        .zip(out.chunks_exact_mut(cols))
        .enumerate()
    {
        let grid = &scales[((first_row + r) / BLOCK) * per_row..][..per_row];
        for ((s, d), &scale) in src.chunks(BLOCK).zip(dst.chunks_mut(BLOCK)).zip(grid) {
            for (&c, o) in s.iter().zip(d) {
                *o = E4M3[c as usize] * scale;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        assert_eq!(E4M3[0x00].to_bits(), 0);
        assert_eq!(E4M3[0x80].to_bits(), 0x8000_0000);
        assert_eq!(E4M3[0x38], 1.0);
        assert_eq!(E4M3[0x7E], 448.0);
        assert_eq!(E4M3[0xFE], -448.0);
        assert_eq!(E4M3[0x01], 2f32.powi(-9));
        assert_eq!(E4M3[0x07], 7.0 * 2f32.powi(-9));
        assert_eq!(E4M3[0x08], 2f32.powi(-6));
        assert!(E4M3[0x7F].is_nan() && E4M3[0xFF].is_nan());
    }

    #[test]
    fn blocks_pick_their_scale() {
        // [130, 3]: rows 0..128 use scale 2, rows 128..130 scale 0.5.
        let codes = vec![0x38u8; 130 * 3];
        let mut out = vec![0.0; codes.len()];
        dequant_rows(&codes, 3, 0, &[2.0, 0.5], &mut out);
        assert!(out[..128 * 3].iter().all(|&v| v == 2.0));
        assert!(out[128 * 3..].iter().all(|&v| v == 0.5));
        // The same rows decoded on their own, starting at row 128.
        let mut tail = vec![0.0; 6];
        dequant_rows(&codes[..6], 3, 128, &[2.0, 0.5], &mut tail);
        assert_eq!(tail, vec![0.5; 6]);
    }

    fn fixture() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/fp8")
    }

    /// All 256 codes against torch's `float8_e4m3fn -> float32` (scripts/make_hf_fixtures.py),
    /// bit for bit: signed zeros, subnormals and the NaN payloads included.
    #[test]
    fn every_code_matches_torch() {
        let text = std::fs::read_to_string(fixture().join("e4m3_table.json")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let bits: Vec<u32> = v["f32_bits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(bits.len(), 256);
        for (code, want) in bits.iter().enumerate() {
            assert_eq!(E4M3[code].to_bits(), *want, "code {code:#04x}");
        }
    }

    /// A [136, 140] tensor with 2x2 block scales, the last block row and column partial,
    /// through `ShardSet::read_f32`, against torch's `w.to(float32) * scale`, bit for bit.
    #[test]
    fn edge_blocks_match_torch() {
        let set = crate::weights::ShardSet::open(&[fixture()]).unwrap();
        assert_eq!(set.get("w").unwrap().dtype, crate::weights::Dtype::F8E4M3);
        let got = set.read_f32("w", &[136, 140]).unwrap();
        let want = set.read_f32("expected", &[136, 140]).unwrap();
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "element ({}, {})",
                i / 140,
                i % 140
            );
        }
        // Rows decoded from the middle of the tensor give the same values (the converter
        // reads a tensor in row chunks).
        let raw = set.bytes("w").unwrap();
        let scales = set.fp8_scales("w").unwrap();
        let mut part = vec![0.0; 10 * 140];
        dequant_rows(&raw[125 * 140..135 * 140], 140, 125, &scales, &mut part);
        assert_eq!(&part[..], &got[125 * 140..135 * 140]);
    }

    #[test]
    fn missing_or_misshapen_scales_are_errors() {
        let dir = std::env::temp_dir().join(format!("colibri-fp8-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut w = crate::weights::writer::SafetensorsWriter::new();
        w.add(
            "a",
            crate::weights::Dtype::F8E4M3,
            &[130, 4],
            vec![0x38; 520],
        );
        w.add(
            "b",
            crate::weights::Dtype::F8E4M3,
            &[130, 4],
            vec![0x38; 520],
        );
        w.add_f32("b_scale_inv", &[1, 1], &[1.0]);
        w.write(&dir.join("m.safetensors")).unwrap();
        let set = crate::weights::ShardSet::open(std::slice::from_ref(&dir)).unwrap();
        let e = set.read_f32("a", &[130, 4]).unwrap_err().to_string();
        assert!(e.contains("a_scale_inv") && e.contains("missing"), "{e}");
        let e = set.read_f32("b", &[130, 4]).unwrap_err().to_string();
        assert!(e.contains("[2, 1]"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
