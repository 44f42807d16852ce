//! colibri: a GLM-5 (`glm_moe_dsa`) inference engine.

pub mod config;
pub mod quant;
pub mod tokenizer;
pub mod weights;
