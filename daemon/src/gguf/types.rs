//! ggml's tensor types as a GGUF file numbers them, with their block geometry.
//!
//! Ids, block element counts and block byte sizes are those of gguf-py's
//! `GGMLQuantizationType` and `GGML_QUANT_SIZES` (constants.py); the test at the bottom
//! pins every one of them, so a typo cannot silently shift a tensor's byte range.

/// One ggml tensor type. The discriminant is the id stored in a GGUF tensor info.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
    NVFP4 = 40,
    Q1_0 = 41,
}

/// Elements per super-block of the k-quants and IQ types (ggml's `QK_K`).
pub const QK_K: usize = 256;

impl GgmlType {
    /// Every type this reader knows, in id order.
    pub const ALL: [GgmlType; 34] = [
        Self::F32,
        Self::F16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q8_1,
        Self::Q2_K,
        Self::Q3_K,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
        Self::Q8_K,
        Self::IQ2_XXS,
        Self::IQ2_XS,
        Self::IQ3_XXS,
        Self::IQ1_S,
        Self::IQ4_NL,
        Self::IQ3_S,
        Self::IQ2_S,
        Self::IQ4_XS,
        Self::I8,
        Self::I16,
        Self::I32,
        Self::I64,
        Self::F64,
        Self::IQ1_M,
        Self::BF16,
        Self::TQ1_0,
        Self::TQ2_0,
        Self::MXFP4,
        Self::NVFP4,
        Self::Q1_0,
    ];

    /// The type with GGUF id `id`, or `None` for an id this reader does not know.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        Self::ALL.iter().copied().find(|t| t.id() == id)
    }

    /// The id a GGUF file stores for this type.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// (elements per block, bytes per block), as `GGML_QUANT_SIZES`.
    pub fn block(self) -> (usize, usize) {
        use GgmlType::*;
        match self {
            F32 => (1, 4),
            F16 => (1, 2),
            Q4_0 => (32, 2 + 16),
            Q4_1 => (32, 2 + 2 + 16),
            Q5_0 => (32, 2 + 4 + 16),
            Q5_1 => (32, 2 + 2 + 4 + 16),
            Q8_0 => (32, 2 + 32),
            Q8_1 => (32, 4 + 4 + 32),
            Q2_K => (QK_K, 2 + 2 + QK_K / 16 + QK_K / 4),
            Q3_K => (QK_K, 2 + QK_K / 4 + QK_K / 8 + 12),
            Q4_K => (QK_K, 2 + 2 + QK_K / 2 + 12),
            Q5_K => (QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12),
            Q6_K => (QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16),
            Q8_K => (QK_K, 4 + QK_K + QK_K / 8),
            IQ2_XXS => (QK_K, 2 + QK_K / 4),
            IQ2_XS => (QK_K, 2 + QK_K / 4 + QK_K / 32),
            IQ3_XXS => (QK_K, 2 + QK_K / 4 + QK_K / 8),
            IQ1_S => (QK_K, 2 + QK_K / 8 + QK_K / 16),
            IQ4_NL => (32, 2 + 16),
            IQ3_S => (QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4),
            IQ2_S => (QK_K, 2 + QK_K / 4 + QK_K / 16),
            IQ4_XS => (QK_K, 2 + 2 + QK_K / 2 + QK_K / 64),
            I8 => (1, 1),
            I16 => (1, 2),
            I32 => (1, 4),
            I64 => (1, 8),
            F64 => (1, 8),
            IQ1_M => (QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32),
            BF16 => (1, 2),
            TQ1_0 => (QK_K, 2 + 4 * 13),
            TQ2_0 => (QK_K, 2 + 64),
            MXFP4 => (32, 1 + 16),
            NVFP4 => (64, 4 + 32),
            Q1_0 => (128, 2 + 16),
        }
    }

    /// Elements per block.
    pub fn block_elems(self) -> usize {
        self.block().0
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.block().1
    }

    /// Whether `dequantize_row` turns this type into f32 (the weight types; not the integer
    /// types, nor the activation-only Q8_1/Q8_K, nor NVFP4/Q1_0, which no published GGUF
    /// weight uses yet).
    pub fn can_dequantize(self) -> bool {
        use GgmlType::*;
        !matches!(
            self,
            Q8_1 | Q8_K | I8 | I16 | I32 | I64 | F64 | NVFP4 | Q1_0
        )
    }

    /// The name gguf-py and llama.cpp print for this type.
    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q8_1 => "Q8_1",
            Q2_K => "Q2_K",
            Q3_K => "Q3_K",
            Q4_K => "Q4_K",
            Q5_K => "Q5_K",
            Q6_K => "Q6_K",
            Q8_K => "Q8_K",
            IQ2_XXS => "IQ2_XXS",
            IQ2_XS => "IQ2_XS",
            IQ3_XXS => "IQ3_XXS",
            IQ1_S => "IQ1_S",
            IQ4_NL => "IQ4_NL",
            IQ3_S => "IQ3_S",
            IQ2_S => "IQ2_S",
            IQ4_XS => "IQ4_XS",
            I8 => "I8",
            I16 => "I16",
            I32 => "I32",
            I64 => "I64",
            F64 => "F64",
            IQ1_M => "IQ1_M",
            BF16 => "BF16",
            TQ1_0 => "TQ1_0",
            TQ2_0 => "TQ2_0",
            MXFP4 => "MXFP4",
            NVFP4 => "NVFP4",
            Q1_0 => "Q1_0",
        }
    }

    /// Bytes of `n_elems` elements (a whole number of blocks), or `None` when `n_elems` is
    /// not a multiple of the block or the size overflows.
    pub fn bytes_for(self, n_elems: u64) -> Option<u64> {
        let (be, bb) = self.block();
        if !n_elems.is_multiple_of(be as u64) {
            return None;
        }
        (n_elems / be as u64).checked_mul(bb as u64)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Transcribed from gguf-py 0.x constants.py (`GGMLQuantizationType`,
    /// `GGML_QUANT_SIZES`): (name, id, block elements, block bytes).
    const GGUF_PY: &[(&str, u32, usize, usize)] = &[
        ("F32", 0, 1, 4),
        ("F16", 1, 1, 2),
        ("Q4_0", 2, 32, 18),
        ("Q4_1", 3, 32, 20),
        ("Q5_0", 6, 32, 22),
        ("Q5_1", 7, 32, 24),
        ("Q8_0", 8, 32, 34),
        ("Q8_1", 9, 32, 40),
        ("Q2_K", 10, 256, 84),
        ("Q3_K", 11, 256, 110),
        ("Q4_K", 12, 256, 144),
        ("Q5_K", 13, 256, 176),
        ("Q6_K", 14, 256, 210),
        ("Q8_K", 15, 256, 292),
        ("IQ2_XXS", 16, 256, 66),
        ("IQ2_XS", 17, 256, 74),
        ("IQ3_XXS", 18, 256, 98),
        ("IQ1_S", 19, 256, 50),
        ("IQ4_NL", 20, 32, 18),
        ("IQ3_S", 21, 256, 110),
        ("IQ2_S", 22, 256, 82),
        ("IQ4_XS", 23, 256, 136),
        ("I8", 24, 1, 1),
        ("I16", 25, 1, 2),
        ("I32", 26, 1, 4),
        ("I64", 27, 1, 8),
        ("F64", 28, 1, 8),
        ("IQ1_M", 29, 256, 56),
        ("BF16", 30, 1, 2),
        ("TQ1_0", 34, 256, 54),
        ("TQ2_0", 35, 256, 66),
        ("MXFP4", 39, 32, 17),
        ("NVFP4", 40, 64, 36),
        ("Q1_0", 41, 128, 18),
    ];

    #[test]
    fn ids_and_block_sizes_match_gguf_py() {
        assert_eq!(GGUF_PY.len(), GgmlType::ALL.len());
        for &(name, id, be, bb) in GGUF_PY {
            let t = GgmlType::from_id(id).unwrap_or_else(|| panic!("id {id} ({name}) unknown"));
            assert_eq!(
                (t.name(), t.block_elems(), t.block_bytes()),
                (name, be, bb),
                "id {id}"
            );
        }
        for unknown in [4, 5, 31, 32, 33, 36, 37, 38, 42, 1000] {
            assert_eq!(GgmlType::from_id(unknown), None, "id {unknown}");
        }
    }

    #[test]
    fn bytes_for_refuses_partial_blocks() {
        assert_eq!(GgmlType::Q4_K.bytes_for(512), Some(288));
        assert_eq!(GgmlType::Q4_K.bytes_for(100), None);
        assert_eq!(GgmlType::F32.bytes_for(u64::MAX), None);
    }
}
