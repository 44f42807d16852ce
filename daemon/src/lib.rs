//! colibri: a GLM-5 (`glm_moe_dsa`) inference engine.

pub mod quant;
