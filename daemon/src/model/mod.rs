//! The GLM-5 (`glm_moe_dsa`) forward pass. `glm_moe_dsa.rs` holds the model and its top-level
//! loop; attention, the DSA indexer and the MoE block sit beside it.

mod attn_gpu;
pub mod batch;
pub mod dsa_indexer;
pub mod glm_moe_dsa;
mod gqa;
mod gqa_moe;
pub mod kv;
pub mod linear;
pub mod mla;
pub mod moe;
pub mod mtp;
pub mod ops;
pub mod profile;
pub mod rope;
mod scratch;

pub use batch::SeqStep;
pub use glm_moe_dsa::{LoadOptions, Logits, Model};
pub use kv::KvCache;
pub use linear::ActMode;
pub use mla::AttnPath;
pub use mtp::{Mtp, MtpStep};
pub use scratch::IndexCuts;
