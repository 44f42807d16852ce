//! Quantized weight matrices and their matmul kernels.
//!
//! A [`QMatrix`] holds a `[rows, cols]` weight (PyTorch `Linear` layout,
//! `y = W x`, one row per output) in one of the [`QFormat`]s.  The packed
//! byte layouts match upstream's pre-quantized containers (see
//! `pack.rs`).  Two products are offered:
//!
//! * [`QMatrix::matmul`]: f32 activations, the weight row is dequantized on
//!   the fly and products are accumulated in f32 (the exact path);
//! * [`QMatrix::matmul_i8act`]: activations quantized to int8 per sequence
//!   position, exact integer dot products per row (or per 64-group), then
//!   scaled (the fast decode path).
//!
//! Kernels come as a [`KernelSet`] of function pointers chosen once at run
//! time.  Dispatch order: x86-64 AVX-512 VNNI, AVX-512BW, AVX2+FMA; aarch64
//! NEON; else portable scalar (always built, the reference).  Integer
//! kernels return exact i32 sums and the grouped-row kernels follow one
//! float order (`scalar.rs`), so every set gives bit-identical
//! `matmul_i8act` results.
//!
//! Where things live: `format.rs` (the formats, their lengths and errors), `matrix.rs` (building
//! and reading a [`QMatrix`]), `matmul.rs` (the products and how they split rows across
//! threads), `gemm.rs` (the multi-position products of the per-row formats as register-blocked
//! tiles), `kernel_set.rs` (the kernel table and which set runs), `tuning.rs` (threading and
//! decode knobs).  Below them: `act.rs` (int8 activations), `pack.rs` (bit packing) and
//! `scalar.rs`, `x86/`, `aarch64/` (the kernels).  `batch.rs`, `rowops.rs` and `pool.rs` add
//! many-matrix, row-range and spin-pool products.

#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

#[cfg(target_arch = "aarch64")]
mod aarch64;
mod act;
mod batch;
mod chain;
pub mod expf;
mod format;
mod gemm;
pub mod ggml;
pub mod hugepages;
mod kernel_set;
mod matmul;
mod matrix;
pub mod mxfp4;
#[cfg(target_arch = "x86_64")]
mod mxfp4_avx512;
#[cfg(target_arch = "aarch64")]
mod mxfp4_neon;
mod pack;
pub mod pool;
mod rowops;
mod scalar;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_f32;
#[cfg(test)]
mod tests_matmul;
#[cfg(test)]
mod tests_tiles;
#[cfg(test)]
mod tests_triple;
#[cfg(target_arch = "x86_64")]
mod transpose_avx512;
mod tuning;
#[cfg(target_arch = "x86_64")]
mod x86;

/// How activations meet quantized weights. `F32` dequantizes weights on the fly and is exact
/// against the dequantized f32 model; `Int8` quantizes activations per row and uses integer
/// dot products (the fast decode path). F32 weights always use f32 activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActMode {
    F32,
    Int8,
}

pub use act::quantize_natural;
pub use batch::BatchInputs;
pub use chain::{ChainScratch, Experts, MAX_CHAIN_MEMBERS};
pub use format::{QFormat, QuantError};
pub use kernel_set::{
    axpy_f32, axpy_f32_gather, axpy_f32_gather4, dot_f32, dot_f32_cols, dot_f32_cols4,
    dot_f32_gather, dot_f32_gather4, has_dot_f32_cols, has_dot_f32_cols4, kernel_name,
    set_force_portable, KernelSet,
};
pub use matrix::{QMatrix, SharedBytes};
pub use rowops::PreparedRows;
pub use tuning::{
    decode_tuning, par_chunk_pairs, par_chunks_mut, set_decode_tuning, set_threading, threading,
    DecodeTuning, Threading,
};
