//! `colibri convert`'s parts: what gets written where (`plan`), the record that makes a
//! conversion resumable and refuses mixing two (`manifest`), writing one shard (`shard`) and
//! showing progress (`progress`), identifying the source files by content (`source`). The command itself, which strings them together, is
//! `cmd/convert.rs`.

pub mod gpt_oss;
pub mod manifest;
pub mod plan;
pub mod progress;
pub mod shard;
pub mod source;
