//! GGUF, llama.cpp's single-file model format, read as it is: the header, metadata and
//! tensor table (`file`), the ggml weight types (`types`) and their dequantization to f32,
//! bit-exact against gguf-py (`dequant`, `iq`, with the IQ grids in `grids`).
//!
//! Self-contained: nothing else in the engine depends on it yet; mapping llama.cpp's tensor
//! names onto the engine's, the GGUF tokenizer and `--snap FILE.gguf` build on it later.

pub mod dequant;
mod grids;
mod iq;
pub mod types;

pub use dequant::{dequantize_row, DequantError};
pub use types::GgmlType;

#[cfg(test)]
mod dequant_tests;
