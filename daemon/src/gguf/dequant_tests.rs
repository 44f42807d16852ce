//! Every dequantizer against gguf-py's output (tests/fixtures/gguf/dequant/<TYPE>.bin, made
//! by scripts/gguf_reference.py), compared as f32 bit patterns.

use std::path::PathBuf;

use super::{dequantize_row, DequantError, GgmlType};

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gguf/dequant")
}

/// (type, raw blocks, expected f32 bits) from one fixture file.
fn load(name: &str) -> (GgmlType, Vec<u8>, Vec<u32>) {
    let path = fixture_dir().join(format!("{name}.bin"));
    let b = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&b[0..4], b"CGDQ", "{name}: magic");
    let word = |i: usize| u32::from_le_bytes(b[4 + 4 * i..8 + 4 * i].try_into().unwrap()) as usize;
    let (id, n_blocks, block_bytes, block_elems) = (word(0), word(1), word(2), word(3));
    let ty = GgmlType::from_id(id as u32).unwrap_or_else(|| panic!("{name}: id {id}"));
    assert_eq!(
        (ty.name(), ty.block()),
        (name, (block_elems, block_bytes)),
        "{name}: geometry"
    );
    let raw_end = 20 + n_blocks * block_bytes;
    let raw = b[20..raw_end].to_vec();
    let want: Vec<u32> = b[raw_end..]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(
        want.len(),
        n_blocks * block_elems,
        "{name}: expected values"
    );
    (ty, raw, want)
}

/// The weight types GGUF files publish, every one checked against gguf-py.
pub(super) const VERIFIED: [&str; 25] = [
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
    "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_NL", "IQ4_XS",
    "TQ1_0", "TQ2_0", "MXFP4",
];

#[test]
fn every_type_is_bit_exact_against_gguf_py() {
    let mut failures = Vec::new();
    for name in VERIFIED {
        let (ty, raw, want) = load(name);
        let mut got = vec![f32::NAN; want.len()];
        dequantize_row(ty, &raw, &mut got).unwrap();
        if let Some(i) = (0..want.len()).find(|&i| got[i].to_bits() != want[i]) {
            let be = ty.block_elems();
            failures.push(format!(
                "{name}: block {} index {}: got {:e} ({:#010x}), want {:e} ({:#010x})",
                i / be,
                i % be,
                got[i],
                got[i].to_bits(),
                f32::from_bits(want[i]),
                want[i]
            ));
        }
    }
    assert!(failures.is_empty(), "mismatches:\n{}", failures.join("\n"));
}

#[test]
fn every_dequantizable_type_has_a_fixture() {
    for ty in GgmlType::ALL.into_iter().filter(|t| t.can_dequantize()) {
        assert!(
            VERIFIED.contains(&ty.name()),
            "{ty} dequantizes but has no fixture"
        );
    }
}

#[test]
fn row_shape_mistakes_are_errors_not_panics() {
    let mut out = [0f32; 32];
    assert_eq!(
        dequantize_row(GgmlType::Q8_0, &[0u8; 33], &mut out),
        Err(DequantError::PartialBlock {
            ty: GgmlType::Q8_0,
            bytes: 33,
            block_bytes: 34
        })
    );
    assert_eq!(
        dequantize_row(GgmlType::Q8_0, &[0u8; 68], &mut out),
        Err(DequantError::OutputLength {
            ty: GgmlType::Q8_0,
            bytes: 68,
            want: 64,
            got: 32
        })
    );
    assert_eq!(
        dequantize_row(GgmlType::I32, &[0u8; 4], &mut out[..1]),
        Err(DequantError::Unsupported { ty: GgmlType::I32 })
    );
}
