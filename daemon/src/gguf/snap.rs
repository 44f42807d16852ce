//! `--snap FILE.gguf`: a GGUF model (one file, or the first part of a split set) where a
//! model folder is accepted. The hooks the folder path goes through call in here when the
//! search path is a single `.gguf` file: its config (from the metadata), its tensors (under
//! the engine's names, pointing into the GGUF's bytes) and its tokenizer and chat template.

use std::path::{Path, PathBuf};

use super::{config, names, tokenizer, GgufError, GgufModel};
use crate::config::ModelConfig;
use crate::tokenizer::Tokenizer;
use crate::weights::{ShardSet, WeightsError};

/// Whether `p` names a GGUF model: a `.gguf` file.
pub fn is_gguf(p: &Path) -> bool {
    p.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
        && p.is_file()
}

/// The GGUF a search path names: one `.gguf` file (a GGUF is a whole model, so it is not
/// combined with folders).
pub fn gguf_of(dirs: &[PathBuf]) -> Option<&Path> {
    match dirs {
        [p] if is_gguf(p) => Some(p),
        _ => None,
    }
}

/// The model's config from its metadata.
pub fn model_config(path: &Path) -> Result<ModelConfig, GgufError> {
    config::model_config(&GgufModel::open(path)?)
}

/// The MTP layers the GGUF's metadata declares after its trunk (`nextn_predict_layers`;
/// 0 when it has none or cannot be read).
pub fn mtp_layers(path: &Path) -> u64 {
    GgufModel::open(path)
        .ok()
        .and_then(|m| config::Keys::of(&m).ok()?.trunk_and_mtp().ok())
        .map_or(0, |(_, mtp)| mtp)
}

/// The model's tensors under the engine's names, read in place from every part.
pub fn shard_set(path: &Path) -> Result<ShardSet, WeightsError> {
    let gguf = |e| WeightsError::Gguf(Box::new(e));
    let m = GgufModel::open(path).map_err(gguf)?;
    // The architecture first: a model colibri does not run is refused as that, not by the
    // first of its tensors that has no name here.
    config::arch(&m).map_err(gguf)?;
    let tensors = names::tensors(&m).map_err(gguf)?;
    let files: Vec<PathBuf> = m.parts.iter().map(|p| p.path().to_path_buf()).collect();
    ShardSet::from_tensors(&files, tensors)
}

/// What `ModelFiles` holds, from a GGUF: the config, the tokenizer, and the chat template
/// (`tokenizer.chat_template`) with the texts of its bos and eos tokens.
pub struct SnapFiles {
    pub cfg: ModelConfig,
    pub tokenizer: Tokenizer,
    /// (template, bos text, eos text).
    pub template: Option<(String, String, String)>,
}

/// Reads and checks a GGUF's config, tokenizer and template, before any weight is read.
pub fn files(path: &Path) -> Result<SnapFiles, GgufError> {
    let m = GgufModel::open(path)?;
    let cfg = config::model_config(&m)?;
    let tokenizer = tokenizer::tokenizer(&m)?;
    // A special token's text is its entry in the vocabulary.
    let text = |key: &str| -> String {
        let id = m.get(key).and_then(|v| v.as_u64());
        match (id, m.get("tokenizer.ggml.tokens")) {
            (Some(id), Some(super::GgufValue::Array(_, toks))) => toks
                .get(id as usize)
                .and_then(|t| t.as_str())
                .unwrap_or_default()
                .to_string(),
            _ => String::new(),
        }
    };
    let template = tokenizer::chat_template(&m).map(|t| {
        (
            t.to_string(),
            text("tokenizer.ggml.bos_token_id"),
            text("tokenizer.ggml.eos_token_id"),
        )
    });
    Ok(SnapFiles {
        cfg,
        tokenizer,
        template,
    })
}
