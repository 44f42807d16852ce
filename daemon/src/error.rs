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
    /// A token id at or past the end of the vocabulary (a client's ids, a reference file's).
    #[error("token id {token} is outside the vocabulary (0..{vocab})")]
    TokenOutOfVocab { token: u32, vocab: usize },
    /// A forward asked to compute no position.
    #[error("forward over an empty token list")]
    EmptyForward,
    /// An expert the router picked never came back from the loader (its read failed).
    #[error("expert {expert} of layer {layer} was never delivered")]
    ExpertNotDelivered { layer: usize, expert: usize },
    /// An option's value outside what it allows: its name as the user gave it (flag and, where
    /// there is one, environment variable), the value, and what is allowed, in words.
    #[error("{name} {value}: {allowed}")]
    BadOption {
        name: String,
        value: String,
        allowed: String,
    },
    /// A prompt too big to tokenize inside the RAM budget (the figures in bytes).
    #[error(
        "the prompt is {len} bytes: tokenizing it takes up to {:.2} GB, and the {:.2} GB RAM budget leaves {:.2} GB above the {:.2} GB resident now; not tokenized, nothing was truncated (send less at once, or raise --ram-gb)",
        gb(.need),
        gb(.budget),
        gb(.room),
        gb(.rss)
    )]
    EncodeBudget {
        len: usize,
        need: u64,
        budget: u64,
        room: u64,
        rss: u64,
    },
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
            // FP8 block scales or DeepSeek-V4's published scales that do not fit their weights.
            EngineError::Weights(WeightsError::Refused { .. } | WeightsError::Fp8 { .. }) => 2,
            EngineError::Config(_)
            | EngineError::Usage(_)
            | EngineError::TokenOutOfVocab { .. }
            | EngineError::EmptyForward
            | EngineError::BadOption { .. }
            | EngineError::EncodeBudget { .. }
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

    /// [`EngineError::BadOption`] of option `name` with `value`; `allowed` says what it takes.
    pub fn bad_option(
        name: impl Into<String>,
        value: impl std::fmt::Display,
        allowed: impl Into<String>,
    ) -> EngineError {
        EngineError::BadOption {
            name: name.into(),
            value: value.to_string(),
            allowed: allowed.into(),
        }
    }
}

/// Bytes in GB, for messages.
fn gb(b: &u64) -> f64 {
    *b as f64 / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    // The typed variants replaced strings users and tests read: each says the same bytes,
    // and exits as the variant it replaced did (Usage 2, Load 1).
    #[test]
    fn typed_variants_say_what_the_strings_said() {
        let cases: [(EngineError, &str, u8); 5] = [
            (
                EngineError::TokenOutOfVocab {
                    token: 7,
                    vocab: 5,
                },
                "token id 7 is outside the vocabulary (0..5)",
                2,
            ),
            (
                EngineError::EmptyForward,
                "forward over an empty token list",
                2,
            ),
            (
                EngineError::ExpertNotDelivered {
                    layer: 3,
                    expert: 9,
                },
                "expert 9 of layer 3 was never delivered",
                1,
            ),
            (
                EngineError::bad_option("--vram-gb", -1.5, "must be a number of GB from 0 to 1000000"),
                "--vram-gb -1.5: must be a number of GB from 0 to 1000000",
                2,
            ),
            (
                EngineError::EncodeBudget {
                    len: 4194304,
                    need: 2_500_000_000,
                    budget: 8_000_000_000,
                    room: 1_250_000_000,
                    rss: 6_000_000_000,
                },
                "the prompt is 4194304 bytes: tokenizing it takes up to 2.50 GB, and the 8.00 GB RAM budget leaves 1.25 GB above the 6.00 GB resident now; not tokenized, nothing was truncated (send less at once, or raise --ram-gb)",
                2,
            ),
        ];
        for (err, said, code) in cases {
            assert_eq!(err.to_string(), said);
            assert_eq!(err.exit_code(), code, "{said}");
        }
    }
}
