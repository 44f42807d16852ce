//! colibri: a mixture-of-experts inference engine for five families (GLM-5, DeepSeek-V3 and
//! V3.2, GLM-4.x, Qwen3-MoE; `config::family`). Data flows one way: the command line
//! (`cli`, `cmd`) builds an `Engine`, whose `Model` runs the forward and takes routed experts
//! from the `ExpertStore`, which reads them from the shards (`weights`).

#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

pub mod api;
pub mod cache_route;
pub mod cli;
pub mod cmd;
pub mod computebw;
pub mod config;
pub mod convert;
pub mod demo;
pub mod durable;
pub mod engine;
pub mod error;
pub mod experts;
pub mod gguf;
pub mod gpu;
pub mod grammar;
pub mod identity;
pub mod kv_file;
pub mod kv_state;
pub mod log;
pub mod membw;
pub mod model;
pub mod quant;
pub mod rng;
pub mod routing;
pub mod sampling;
pub mod serve;
pub mod telemetry;
pub mod tokenizer;
pub mod weights;
