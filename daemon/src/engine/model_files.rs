//! What a model folder must hold before any weight is read: `config.json` of a family this
//! engine runs, a `tokenizer.json` that fits its vocabulary, and the checkpoint's chat template
//! when it has one. `run` (through [`super::Engine::open`]) and `convert` (on its source, before
//! it writes anything) make these same checks, so a conversion never produces a folder that
//! `run` then refuses.

use std::path::{Path, PathBuf};

use super::checkpoint_chat::CheckpointTemplate;
use crate::config::ModelConfig;
use crate::error::EngineError;
use crate::tokenizer::Tokenizer;

pub struct ModelFiles {
    pub cfg: ModelConfig,
    pub tokenizer: Tokenizer,
    /// The checkpoint's own chat template (`chat_template.jinja` beside tokenizer.json, else
    /// tokenizer_config.json's `chat_template`); `None`: the family's built-in one.
    pub template: Option<CheckpointTemplate>,
}

impl ModelFiles {
    /// Reads and checks the files of the model in `dirs` (a search path: the first folder that
    /// has a file wins).
    pub fn check(dirs: &[PathBuf]) -> Result<ModelFiles, EngineError> {
        if let Some(path) = crate::gguf::snap::gguf_of(dirs) {
            let f = crate::gguf::snap::files(path)?;
            let origin = format!("{} (tokenizer.chat_template)", path.display());
            let template = match f.template {
                Some((source, bos, eos)) => {
                    Some(CheckpointTemplate::from_source(source, origin, bos, eos)?)
                }
                None => None,
            };
            return Ok(ModelFiles {
                cfg: f.cfg,
                tokenizer: f.tokenizer,
                template,
            });
        }
        let first = dirs
            .first()
            .ok_or_else(|| EngineError::Usage("--snap: no model directory given".into()))?;
        let find = |name: &str| -> PathBuf {
            dirs.iter()
                .map(|d| d.join(name))
                .find(|p| p.exists())
                .unwrap_or_else(|| first.join(name))
        };
        let cfg = ModelConfig::load(find("config.json").parent().unwrap_or(Path::new(".")))?;
        let tokenizer_json = find("tokenizer.json");
        let tokenizer = Tokenizer::from_file(&tokenizer_json)?;
        let template = CheckpointTemplate::load(tokenizer_json.parent().unwrap_or(Path::new(".")))?;
        if tokenizer.vocab_size() > cfg.vocab_size {
            return Err(EngineError::Load(format!(
                "tokenizer.json has {} tokens but config.json vocab_size is {}",
                tokenizer.vocab_size(),
                cfg.vocab_size
            )));
        }
        Ok(ModelFiles {
            cfg,
            tokenizer,
            template,
        })
    }
}

/// Where the chat template of the model in `dirs` comes from, as [`ModelFiles::check`] finds
/// it (without reading tokenizer.json, so `info` stays quick): its file, `built-in (<family>)`,
/// or why it cannot be used.
pub fn template_origin(dirs: &[PathBuf], family: crate::config::Family) -> String {
    let Some(first) = dirs.first() else {
        return "(no model directory)".into();
    };
    if let Some(path) = crate::gguf::snap::gguf_of(dirs) {
        return match ModelFiles::check(dirs) {
            Ok(f) if f.template.is_some() => {
                format!("{} (tokenizer.chat_template)", path.display())
            }
            Ok(_) => format!("built-in ({})", family.model_type()),
            Err(e) => format!("(unusable: {e})"),
        };
    }
    let dir = dirs
        .iter()
        .find(|d| d.join("tokenizer.json").exists())
        .unwrap_or(first);
    match CheckpointTemplate::load(dir) {
        Ok(Some(t)) => t.origin().to_string(),
        Ok(None) => format!("built-in ({})", family.model_type()),
        Err(e) => format!("(unusable: {e})"),
    }
}
