//! GGUF, llama.cpp's single-file model format, read as it is: the header, metadata and
//! tensor table (`file`), the ggml weight types (`types`) and their dequantization to f32,
//! bit-exact against gguf-py (`dequant`, `iq`, with the IQ grids in `grids`).
//!
//! `--snap FILE.gguf` builds on it: the config from the metadata (`config`), llama.cpp's
//! tensor names mapped onto the engine's (`names`), the tokenizer from the vocabulary
//! (`tokenizer`), and the hooks the model-folder path calls (`snap`). `colibri convert --from
//! FILE.gguf` rewrites one as our container, each tensor in its own type (`cmd::convert_gguf`).

pub mod config;
pub mod dequant;
pub mod dsa;
pub mod dsv4;
mod families;
pub mod file;
pub(crate) mod grids;
pub(crate) mod iq;
pub mod meta;
pub mod mla;
pub mod model;
pub mod names;
pub mod qwen35;
pub mod snap;
pub mod tokenizer;
pub mod types;

use std::path::PathBuf;

pub use dequant::{dequantize_row, DequantError};
pub use file::{GgufFile, TensorInfo};
pub use meta::GgufValue;
pub use model::{expert_range, GgufModel};
pub use types::GgmlType;

/// Why a GGUF file or set was refused. Each names the file and the tensor or key at fault,
/// and what was expected; all are bad input (CONTRACT exit 2) except `Io`.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a GGUF file (magic {found:02x?}, expected \"GGUF\")")]
    BadMagic { path: PathBuf, found: Vec<u8> },
    #[error("{path}: GGUF version {version}; expected 2 or 3")]
    Version { path: PathBuf, version: u32 },
    #[error("{path}: truncated: the file ends inside {what}")]
    Truncated { path: PathBuf, what: String },
    #[error(
        "{path}: {count} {what} cannot fit in the {bytes_left} bytes left in the file \
         (truncated, or a corrupt count)"
    )]
    AbsurdCount {
        path: PathBuf,
        what: String,
        count: u64,
        bytes_left: u64,
    },
    #[error("{path}: {what} is not valid UTF-8")]
    Utf8 { path: PathBuf, what: String },
    #[error("{path}: metadata key {key:?}: {reason}")]
    Metadata {
        path: PathBuf,
        key: String,
        reason: String,
    },
    #[error("{path}: tensor {tensor:?} has type id {id}, which this reader does not know")]
    UnknownType {
        path: PathBuf,
        tensor: String,
        id: u32,
    },
    #[error("{path}: tensor {tensor:?}: {reason}")]
    Tensor {
        path: PathBuf,
        tensor: String,
        reason: String,
    },
    #[error("{path}: metadata key {key:?} contradicts tensor {tensor:?}: {reason}")]
    Contradiction {
        path: PathBuf,
        key: String,
        tensor: String,
        reason: String,
    },
    #[error("{path}: split part {part} of {count} is missing")]
    MissingPart {
        path: PathBuf,
        part: u64,
        count: u64,
    },
    #[error("{path}: split set: {reason}")]
    Split { path: PathBuf, reason: String },
    #[error("tensor {tensor:?} is not a stacked experts tensor: {reason}")]
    NotExperts { tensor: String, reason: String },
    #[error("tensor {tensor:?}: {source}")]
    Dequant {
        tensor: String,
        source: DequantError,
    },
}

impl GgufError {
    /// The CONTRACT exit code: 2 for a file refused as bad input, 1 for an I/O failure or a
    /// caller's mistake (a dequantization or expert query the tensor cannot answer).
    pub fn exit_code(&self) -> u8 {
        match self {
            GgufError::Io { .. } | GgufError::NotExperts { .. } | GgufError::Dequant { .. } => 1,
            _ => 2,
        }
    }
}

#[cfg(test)]
mod dequant_tests;
#[cfg(test)]
mod dsa_tests;
#[cfg(test)]
mod dsv4_tests;
#[cfg(test)]
mod file_tests;
#[cfg(test)]
mod qwen35_tests;
#[cfg(test)]
mod snap_tests;
