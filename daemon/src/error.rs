//! The daemon's error type. Each variant keeps the context (file, tensor, key) of where it
//! came from; `exit_code` maps it onto the CONTRACT's exit codes.

use crate::config::ConfigError;
use crate::quant::QuantError;
use crate::tokenizer::TokenizerError;
use crate::weights::WeightsError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Weights(#[from] WeightsError),
    #[error("{0}")]
    Quant(#[from] QuantError),
    #[error("{0}")]
    Tokenizer(#[from] TokenizerError),
    /// A model that loads but is inconsistent (missing scales, bad packed layout, ...).
    #[error("{0}")]
    Load(String),
    /// Bad input from the user: an option, a reference file, a token id.
    #[error("{0}")]
    Usage(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    /// A GGUF model (`--snap FILE.gguf`) refused or unreadable.
    #[error("{0}")]
    Gguf(#[from] crate::gguf::GgufError),
}

impl EngineError {
    /// 2 for refused configuration or usage, 1 for runtime failures.
    pub fn exit_code(&self) -> u8 {
        match self {
            // A GGUF says itself whether it was refused (2) or could not be read (1).
            EngineError::Gguf(g) => g.exit_code(),
            EngineError::Config(ConfigError::Gguf(g))
            | EngineError::Weights(WeightsError::Gguf(g)) => g.exit_code(),
            EngineError::Config(_)
            | EngineError::Usage(_)
            | EngineError::Quant(QuantError::BadBits { .. }) => 2,
            _ => 1,
        }
    }

    pub fn io(context: impl Into<String>, source: std::io::Error) -> EngineError {
        EngineError::Io {
            context: context.into(),
            source,
        }
    }
}
