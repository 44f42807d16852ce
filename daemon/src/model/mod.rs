//! The forward pass of every family. `model.rs` holds the model and its top-level loop,
//! `layer.rs` a decoder layer; attention (MLA with the DSA indexer, grouped-query), the MoE
//! block and the MTP head sit beside them.

pub mod attn_core;
pub mod batch;
pub(crate) mod delta_net;
pub mod dsa_indexer;
// DeepSeek-V4: its layer (hyper-connection streams), attention and compressors, state.
mod dsv4_attn;
mod dsv4_compress;
mod dsv4_hc;
mod dsv4_layer;
pub(crate) mod dsv4_state;
#[cfg(test)]
mod dsv4_tests;
mod dsv4_trail;
pub(crate) mod gpt_oss;
mod gqa;
mod gqa_moe;
pub mod kv;
mod kv_snap;
mod layer;
pub mod linear;
pub mod mla;
// The module holds the type it is named for; `model::Model` is re-exported below.
#[allow(clippy::module_inception)]
mod model;
pub mod moe;
pub mod mtp;
pub mod ops;
pub mod placement;
pub mod profile;
mod qwen35;
pub mod rope;
mod scratch;

pub use batch::SeqStep;
pub use kv::KvCache;
pub use linear::ActMode;
pub use mla::AttnPath;
pub use model::{LoadOptions, Logits, Model};
pub use mtp::{Mtp, MtpStep};
pub use scratch::{batch_row_bytes, IndexCuts};
