//! One module per subcommand; each takes its parsed arguments and returns the exit code.

pub mod bench;
pub mod convert;
pub mod convert_gguf;
pub mod info;
pub mod plan;
pub mod run;
pub mod score;
pub mod validate;
pub mod verify;
