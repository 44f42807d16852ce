//! The storage formats and what follows from a format alone: names, bits, group sizes and the
//! packed lengths of a `[rows, cols]` matrix.  Kept apart from the matrices and kernels so that
//! the CLI and container parsing can pick, check and name a format without touching either.

use std::fmt;

use crate::gguf::GgmlType;

use super::pack::{row_bytes, scales_per_row, GROUP};

/// Storage format of a weight matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QFormat {
    /// Plain f32.
    F32,
    /// int8, one scale per row.
    I8Row,
    /// int4, one scale per row.
    I4Row,
    /// int2, one scale per row.
    I2Row,
    /// int4, one scale per 64 inputs.
    I4G64,
    /// int3, one scale per 64 inputs (24 bytes per group).
    I3G64,
    /// MXFP4 (gpt-oss's published experts): e2m1 values, two a byte, one power-of-two scale
    /// per 32 inputs (`mxfp4.rs`). Only ever read as stored, never quantized to, so it is not
    /// in [`QFormat::ALL`] nor inferred from a container's lengths.
    Mxfp4,
    /// A GGUF tensor's ggml blocks, computed as stored against activations quantized to
    /// llama.cpp's 8-bit blocks (`ggml/`). Only ever read from a GGUF, never quantized to.
    Ggml(GgmlType),
}

impl QFormat {
    /// The one name of a layout that two formats share: an int4-g64 matrix with a single
    /// group per row (cols <= 64) is stored, scaled and decoded exactly as int4 per row, so it
    /// is int4 per row, and both the at-load and the pre-quantized paths give the same bits.
    pub fn canonical(self, cols: usize) -> QFormat {
        if self == QFormat::I4G64 && cols <= 64 {
            QFormat::I4Row
        } else {
            self
        }
    }

    /// All formats, for iteration in tools and tests.
    pub const ALL: [QFormat; 6] = [
        QFormat::F32,
        QFormat::I8Row,
        QFormat::I4Row,
        QFormat::I2Row,
        QFormat::I4G64,
        QFormat::I3G64,
    ];

    /// From CLI bits: 16 -> F32, 8 -> I8Row, 4 -> I4G64 (group_size 64) or
    /// I4Row (group_size 0), 3 -> I3G64 (group_size must be 64), 2 -> I2Row.
    /// For 16, 8 and 2 the group size must still be 0 or 64 and is ignored.
    pub fn from_bits(bits: u32, group_size: u32) -> Result<QFormat, QuantError> {
        let bad = QuantError::BadBits { bits, group_size };
        if group_size != 0 && group_size != 64 {
            return Err(bad);
        }
        match (bits, group_size) {
            (16, _) => Ok(QFormat::F32),
            (8, _) => Ok(QFormat::I8Row),
            (4, 0) => Ok(QFormat::I4Row),
            (4, _) => Ok(QFormat::I4G64),
            (3, 64) => Ok(QFormat::I3G64),
            (2, _) => Ok(QFormat::I2Row),
            _ => Err(bad),
        }
    }

    /// The format a pre-quantized container's `[rows, cols]` tensor of `data_len` bytes and
    /// `scales_len` scales is read as (no format ordinal is stored, upstream's rule): the first
    /// of int8, int4 (per row), int4-g64, int3-g64, int2 whose lengths match. Where two formats
    /// give the same lengths (only for `cols` in {1, 2, 24, 47, 48, 95, 96, 143, 144}, or int4
    /// with a single group) the earlier one wins; a writer must not pick the later one.
    pub fn infer(rows: usize, cols: usize, data_len: usize, scales_len: usize) -> Option<QFormat> {
        const ORDER: [QFormat; 5] = [
            QFormat::I8Row,
            QFormat::I4Row,
            QFormat::I4G64,
            QFormat::I3G64,
            QFormat::I2Row,
        ];
        ORDER
            .iter()
            .copied()
            .find(|f| f.data_len(rows, cols) == data_len && f.scales_len(rows, cols) == scales_len)
    }

    /// Short name: "f32", "int8", "int4", "int2", "int4-g64", "int3-g64".
    pub fn name(self) -> &'static str {
        match self {
            QFormat::F32 => "f32",
            QFormat::I8Row => "int8",
            QFormat::I4Row => "int4",
            QFormat::I2Row => "int2",
            QFormat::I4G64 => "int4-g64",
            QFormat::I3G64 => "int3-g64",
            QFormat::Mxfp4 => "mxfp4",
            QFormat::Ggml(t) => t.name(),
        }
    }

    /// Bits per stored weight value (F32: 32; scales not counted).
    pub fn bits(self) -> u32 {
        match self {
            QFormat::F32 => 32,
            QFormat::I8Row => 8,
            QFormat::I4Row | QFormat::I4G64 | QFormat::Mxfp4 => 4,
            QFormat::I3G64 => 3,
            QFormat::I2Row => 2,
            // Bits a weight with the block's scales, rounded down (Q4_K: 4.5 -> 4).
            QFormat::Ggml(t) => (t.block_bytes() * 8 / t.block_elems()) as u32,
        }
    }

    /// Inputs per scale group: 64 for the grouped formats, 0 for per-row
    /// (and F32).
    pub fn group_size(self) -> u32 {
        match self {
            QFormat::I4G64 | QFormat::I3G64 => GROUP as u32,
            QFormat::Mxfp4 => super::mxfp4::GROUP as u32,
            QFormat::Ggml(t) => t.block_elems() as u32,
            _ => 0,
        }
    }

    /// Packed data bytes of a `[rows, cols]` matrix in this format.
    pub fn data_len(self, rows: usize, cols: usize) -> usize {
        rows * row_bytes(self, cols)
    }

    /// Number of f32 scales of a `[rows, cols]` matrix in this format.
    pub fn scales_len(self, rows: usize, cols: usize) -> usize {
        rows * scales_per_row(self, cols)
    }
}

impl fmt::Display for QFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Errors from format selection and container parsing.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuantError {
    #[error(
        "unsupported quantization bits={bits} group_size={group_size}: allowed bits are \
         16 (f32), 8 (int8 per row), 4 (int4; group size 0 = per row, 64 = per 64 inputs), \
         3 (int3, group size must be 64), 2 (int2 per row); allowed group sizes are 0 and 64"
    )]
    BadBits { bits: u32, group_size: u32 },
    #[error(
        "cannot infer the quantized layout of a [{rows} x {cols}] matrix from {data_len} data \
         bytes and {scales_len} scales; expected (data bytes, scales) to be one of: {}",
        layouts(*rows, *cols)
    )]
    UnknownLayout {
        rows: usize,
        cols: usize,
        data_len: usize,
        scales_len: usize,
    },
    #[error(
        "length mismatch for a {fmt} matrix: expected {expected_data} data bytes and \
         {expected_scales} scales, got {got_data} data bytes and {got_scales} scales"
    )]
    LengthMismatch {
        fmt: QFormat,
        expected_data: usize,
        got_data: usize,
        expected_scales: usize,
        got_scales: usize,
    },
}

/// The accepted (data bytes, scales) pairs of a `[rows, cols]` matrix, for
/// error messages.
fn layouts(rows: usize, cols: usize) -> String {
    QFormat::ALL[1..]
        .iter()
        .map(|f| {
            format!(
                "{} ({}, {})",
                f,
                f.data_len(rows, cols),
                f.scales_len(rows, cols)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}
