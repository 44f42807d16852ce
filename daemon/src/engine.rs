//! A loaded model with its tokenizer and stop tokens: what every subcommand starts from.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crate::config::ModelConfig;
use crate::error::EngineError;
use crate::model::{LoadOptions, Model};
use crate::tokenizer::Tokenizer;
use crate::weights::ShardSet;

pub struct Engine {
    pub model: Model,
    pub tokenizer: Tokenizer,
    /// Config `eos_token_id` list plus `<|endoftext|>`.
    pub stops: Vec<u32>,
    /// The model directories, first one holding config.json and tokenizer.json.
    pub dirs: Vec<PathBuf>,
    pub load_s: f64,
}

impl Engine {
    /// Loads the model from a `:`-separated search path of directories.
    pub fn open(dirs: Vec<PathBuf>, opts: LoadOptions) -> Result<Engine, EngineError> {
        let t0 = Instant::now();
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
        let tokenizer = Tokenizer::from_file(&find("tokenizer.json"))?;
        if tokenizer.vocab_size() > cfg.vocab_size {
            return Err(EngineError::Load(format!(
                "tokenizer.json has {} tokens but config.json vocab_size is {}",
                tokenizer.vocab_size(),
                cfg.vocab_size
            )));
        }
        let shards = Arc::new(ShardSet::open(&dirs)?);
        let mut stops = cfg.eos_token_ids.clone();
        if let Some(id) = tokenizer.token_id("<|endoftext|>") {
            if !stops.contains(&id) {
                stops.push(id);
            }
        }
        let model = Model::load(cfg, shards, opts)?;
        Ok(Engine {
            model,
            tokenizer,
            stops,
            dirs,
            load_s: t0.elapsed().as_secs_f64(),
        })
    }

    /// The GLM chat template around one user turn. `first` adds `[gMASK]<sop>`.
    pub fn chat_prompt(text: &str, first: bool, think: bool) -> String {
        format!(
            "{}<|user|>{text}<|assistant|>{}",
            if first { "[gMASK]<sop>" } else { "" },
            if think { "<think>" } else { "<think></think>" }
        )
    }
}

/// Splits `a:b:c` into directories (empty parts ignored).
pub fn split_search_path(s: &str) -> Vec<PathBuf> {
    s.split(':')
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .collect()
}
