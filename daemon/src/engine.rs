//! A loaded model with its tokenizer and stop tokens: what every subcommand starts from.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crate::config::ModelConfig;
use crate::error::EngineError;
use crate::model::{LoadOptions, Model};
use crate::tokenizer::Tokenizer;
use crate::weights::{Dtype, ShardSet};

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
        check_dense_fits(&shards, &opts)?;
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

/// Bytes the dense (non-expert) weights will take once loaded: packed tensors as stored,
/// 2-D float tensors in `--dense-bits` with their scales (embedding and lm_head at >= 8 bits;
/// the router and the indexer's weights_proj stay f32), everything else f32.
pub fn projected_dense_bytes(shards: &ShardSet, opts: &LoadOptions) -> u64 {
    use crate::quant::QFormat;
    let io_fmt = if opts.dense_fmt.bits() < 8 {
        QFormat::I8Row
    } else {
        opts.dense_fmt
    };
    let mut total = 0u64;
    for name in shards.names() {
        let Some(info) = shards.get(name) else {
            continue;
        };
        if name.contains(".mlp.experts.") {
            continue;
        }
        let elems: u64 = info.shape.iter().map(|&d| d as u64).product();
        total += match (info.dtype, info.shape.as_slice()) {
            (Dtype::U8 | Dtype::I8, _) => info.len,
            (_, &[rows, cols]) => {
                let fmt = if name.ends_with("mlp.gate.weight") || name.contains("weights_proj") {
                    QFormat::F32
                } else if name.contains("embed_tokens") || name.starts_with("lm_head") {
                    io_fmt
                } else {
                    opts.dense_fmt
                }
                .canonical(cols);
                (fmt.data_len(rows, cols) + 4 * fmt.scales_len(rows, cols)) as u64
            }
            _ => elems * 4,
        };
    }
    total
}

/// Refuses, before anything is loaded, dense weights that cannot fit the available memory:
/// a clear message with the way out instead of an out-of-memory kill minutes later.
fn check_dense_fits(shards: &ShardSet, opts: &LoadOptions) -> Result<(), EngineError> {
    let need = projected_dense_bytes(shards, opts);
    let (_, avail) = crate::telemetry::meminfo();
    if avail == 0 || need <= avail || std::env::var("COLI_RAM_OVERCOMMIT").is_ok_and(|v| v == "1") {
        return Ok(());
    }
    let at = |bits: u32| {
        let o = LoadOptions {
            dense_fmt: crate::quant::QFormat::from_bits(bits, 64).unwrap_or(opts.dense_fmt),
            ..opts.clone()
        };
        projected_dense_bytes(shards, &o) as f64 / 1e9
    };
    Err(EngineError::Usage(format!(
        "[RAM] the dense weights would take {:.1} GB at --dense-bits {} but only {:.1} GB are available; \
         try --dense-bits 8 ({:.1} GB) or 4 ({:.1} GB), or set COLI_RAM_OVERCOMMIT=1 to try anyway",
        need as f64 / 1e9,
        if opts.dense_fmt.bits() == 32 { 16 } else { opts.dense_fmt.bits() },
        avail as f64 / 1e9,
        at(8),
        at(4)
    )))
}
