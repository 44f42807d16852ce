//! `config.json` of a checkpoint, validated once before any weight is touched. The family
//! comes from `model_type`, and its row of the family table (`family.rs`) names the parser of
//! its keys (`glm5.rs`, `deepseek.rs`, `glm4.rs`, `qwen3.rs`), whose defaults and derived
//! rules follow transformers' config class of that family. Every dimension is range-checked, so a hostile file
//! cannot make the engine allocate absurd buffers, and every refusal names the key, the value
//! and what is allowed. Unknown keys are ignored, as transformers does.

use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

mod common;
mod deepseek;
mod deepseek_v4;
mod family;
mod glm4;
mod glm5;
mod gpt_oss;
mod minimax;
pub mod params;
mod qwen3;
mod qwen35;

pub use deepseek_v4::{Dsv4Attn, Dsv4Config};
pub use family::{Family, FamilySpec, LayerKind, ToolSyntax};
pub use gpt_oss::OssConfig;
pub use qwen35::{DeltaNetConfig, HybridConfig, MixerKind};

use common::{dsa_indexer, mla_kv_heads, scaling, Common, Defaults, Parts};

/// Grouped-query attention (Qwen3-MoE, GLM-4.x): `kv_heads` key-value heads each
/// serving `heads / kv_heads` query heads of `head_dim`, rotary on the first `rotary_dim`
/// values of each head (rotate-half pairing, as Llama/Qwen).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GqaConfig {
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rotary_dim: usize,
    /// Per-head RMSNorm of queries and keys before rotary (`q_norm`, `k_norm`).
    pub qk_norm: bool,
    /// With `qk_norm`: one RMSNorm over the whole q (and k) projection, all heads at once,
    /// a weight per value (MiniMax-M2's `qk_norm_type: per_layer`), instead of one per head.
    pub qk_norm_whole: bool,
}

/// How the router turns its logits into a selection and weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouterKind {
    /// Sigmoid scores; selection by score + `e_score_correction_bias`, weights unbiased.
    SigmoidBias,
    /// Softmax over all experts; the top-k probabilities are the weights.
    Softmax,
    /// gpt-oss: the top-k of the (biased) logits, their weights a softmax over those k alone.
    SoftmaxTopk,
    /// DeepSeek-V4: `sqrt(softplus(logit))` scores; selection by score +
    /// `e_score_correction_bias`, weights unbiased and normalised.
    SqrtSoftplus,
}

/// Feed-forward block of one decoder layer (`mlp_layer_types`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlpKind {
    /// Plain SiLU-gated MLP of width `intermediate_size`.
    Dense,
    /// Routed mixture of experts plus shared experts.
    Sparse,
}

/// DSA indexer of one decoder layer (`indexer_types`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexerKind {
    /// The layer has its own indexer weights and computes a fresh top-k selection.
    Full,
    /// No indexer weights: the layer reuses the selection of the most recent full layer.
    Shared,
}

/// The model hyper-parameters the engine uses, all validated. What differs by attention kind
/// sits in [`Attn`], so a family carries only the fields of its own kind.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub family: Family,
    pub attn: Attn,
    pub router: RouterKind,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub n_shared_experts: usize,
    pub n_routed_experts: usize,
    pub num_experts_per_tok: usize,
    pub routed_scaling_factor: f32,
    /// Group-limited routing (DeepSeek-V3, GLM-4.5): the experts split into `n_group` groups,
    /// only the best `topk_group` groups (by the sum of their two best scores) are eligible.
    /// 1 and 1: no grouping.
    pub n_group: usize,
    pub topk_group: usize,
    pub norm_topk_prob: bool,
    pub rms_norm_eps: f32,
    pub rope_theta: f64,
    pub attention_bias: bool,
    /// One entry per layer.
    pub mlp_layer_types: Vec<MlpKind>,
    /// `eos_token_id` (a number or a list in config.json); may be empty.
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// YaRN context extension of the rotary frequencies (DeepSeek-V3 and Kimi K2 ship it;
    /// Qwen3-MoE and GLM-4.x when a user adds it); `None`: plain.
    pub yarn: Option<Yarn>,
    /// gpt-oss's sliding windows, attention sinks and clamped expert SwiGLU; `None` in the
    /// other families.
    pub oss: Option<OssConfig>,
}

/// A family's attention: MLA (GLM-5, DeepSeek-V3/V3.2) or grouped-query (the others).
#[derive(Clone, Debug, PartialEq)]
pub enum Attn {
    Mla(MlaConfig),
    Gqa(GqaConfig),
    /// Qwen3.5-MoE: Gated DeltaNet layers beside gated grouped-query attention ones.
    Hybrid(HybridConfig),
    /// DeepSeek-V4: sliding, compressed-sparse and heavily-compressed layers.
    Dsv4(Dsv4Config),
}

/// Multi-head latent attention: keys and values decompressed from a `kv_lora_rank` latent,
/// each head's query/key a `qk_nope_head_dim` part plus a rotated `qk_rope_head_dim` one.
#[derive(Clone, Debug, PartialEq)]
pub struct MlaConfig {
    pub kv_lora_rank: usize,
    /// `None`: config.json's `null`, an unfactored `q_proj` (DeepSeek-V2-Lite, Moonlight).
    pub q_lora_rank: Option<usize>,
    pub qk_rope_head_dim: usize,
    pub qk_nope_head_dim: usize,
    pub v_head_dim: usize,
    /// Rotary over interleaved pairs (`rope_interleave`, true in every published checkpoint),
    /// else over halves.
    pub rope_interleave: bool,
    /// The DSA indexer (GLM-5, DeepSeek-V3.2); `None`: every key attended (DeepSeek-V3).
    pub indexer: Option<IndexerConfig>,
}

impl MlaConfig {
    /// Width of one query/key head: `qk_nope_head_dim + qk_rope_head_dim`.
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }
}

/// The DSA indexer: per query, the `index_topk` best keys by its own small attention.
#[derive(Clone, Debug, PartialEq)]
pub struct IndexerConfig {
    pub index_topk: usize,
    pub index_head_dim: usize,
    pub index_n_heads: usize,
    /// One entry per layer; entry 0 is always `Full`.
    pub indexer_types: Vec<IndexerKind>,
    /// Rotate-half rotary in the indexer (DeepSeek-V3.2); GLM-5's is interleaved.
    pub rope_half: bool,
}

/// YaRN as transformers computes it (`_compute_yarn_parameters`): frequencies blended between
/// interpolated (`/ factor`) and original by a linear ramp over the dimensions whose
/// wavelengths fall between `beta_fast` and `beta_slow` rotations of the original context,
/// cos/sin scaled by `attention_factor`, and (MLA only: transformers' DeepSeek attention
/// does it, its grouped-query attentions do not) the softmax scale by
/// `mscale(factor, mscale_all_dim)^2`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    pub factor: f64,
    pub original_max_position_embeddings: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
    pub attention_factor: f64,
    pub mscale_all_dim: f64,
    pub truncate: bool,
}

impl Yarn {
    /// `0.1 * m * ln(scale) + 1`, or 1 when the scale does not extend the context.
    pub fn mscale(scale: f64, m: f64) -> f64 {
        if scale <= 1.0 {
            1.0
        } else {
            0.1 * m * scale.ln() + 1.0
        }
    }

    /// The factor DeepSeek multiplies its softmax scale by (1 without `mscale_all_dim`).
    pub fn softmax_factor(&self) -> f64 {
        if self.mscale_all_dim != 0.0 {
            let m = Yarn::mscale(self.factor, self.mscale_all_dim);
            m * m
        } else {
            1.0
        }
    }
}

/// Why a `config.json` was refused. Every variant names the key (or file) at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: not valid JSON: {msg}", path.display())]
    Json { path: PathBuf, msg: String },
    #[error("config.json: \"{key}\" = {value} is out of range (allowed {allowed})")]
    OutOfRange {
        key: String,
        value: String,
        allowed: String,
    },
    #[error("config.json: \"{key}\" = {value} is not supported: {why}")]
    Unsupported {
        key: String,
        value: String,
        why: String,
    },
    #[error("config.json: \"{key}\" = {value} is invalid: {why}")]
    Invalid {
        key: String,
        value: String,
        why: String,
    },
    #[error("config.json: \"{key}\" must be {expected}")]
    WrongType { key: String, expected: String },
    /// The config of a GGUF model (`--snap FILE.gguf`), from its metadata.
    #[error("{0}")]
    Gguf(Box<crate::gguf::GgufError>),
}

// Upper bounds. Generous against real checkpoints (GLM-5: vocab 154880, hidden 6144, 78
// layers, 64 heads, 256 experts), tight enough that no product of them overflows or asks for
// an absurd allocation before a single weight is read.
/// Present while `colibri plan --measure` writes a model (removed last): a folder holding it
/// is refused at load.
pub const UNFINISHED_MARKER: &str = ".colibri-unfinished";

const MAX_VOCAB: usize = 1 << 20;
const MAX_HIDDEN: usize = 65536;
const MAX_INTERMEDIATE: usize = 1 << 18;
const MAX_LAYERS: usize = 256;
const MAX_HEADS: usize = 1024;
const MAX_EXPERTS: usize = 4096;
const MAX_SHARED_EXPERTS: usize = 64;
const MAX_LORA_RANK: usize = 65536;
const MAX_HEAD_DIM: usize = 4096;
const MAX_INDEX_TOPK: usize = 1 << 20;
const MAX_POSITIONS: usize = 1 << 24;
const MAX_EOS_IDS: usize = 1024;
const MAX_INDEX_FREQ: usize = 1 << 16;

impl ModelConfig {
    /// Reads and validates `dir/config.json`.
    pub fn load(dir: &Path) -> Result<Self, ConfigError> {
        // `--snap FILE.gguf`: callers pass the search path's first entry as the folder.
        if crate::gguf::snap::is_gguf(dir) {
            return crate::gguf::snap::model_config(dir)
                .map_err(|e| ConfigError::Gguf(Box::new(e)));
        }
        // A model `colibri plan --measure` is still writing, or an interrupted one left.
        let unfinished = dir.join(UNFINISHED_MARKER);
        if unfinished.exists() {
            return Err(ConfigError::Io {
                path: unfinished,
                source: std::io::Error::other(
                    "this model was left half-written by an interrupted `colibri plan --measure` \
                     (or one is writing it now): delete the folder and run the measure again",
                ),
            });
        }
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Io {
            path: path.clone(),
            source,
        })?;
        Self::parse(&text, &path)
    }

    /// Validates the text of a `config.json`.
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        Self::parse(text, Path::new("config.json"))
    }

    /// MLA's shape, for the families that have it.
    pub fn mla(&self) -> Option<&MlaConfig> {
        match &self.attn {
            Attn::Mla(m) => Some(m),
            Attn::Gqa(_) | Attn::Hybrid(_) | Attn::Dsv4(_) => None,
        }
    }

    /// Grouped-query attention's shape, for the families that have it (a hybrid stack's
    /// full-attention layers).
    pub fn gqa(&self) -> Option<&GqaConfig> {
        match &self.attn {
            Attn::Gqa(g) => Some(g),
            Attn::Hybrid(h) => Some(&h.gqa),
            Attn::Mla(_) | Attn::Dsv4(_) => None,
        }
    }

    /// The hybrid stack's shapes (Qwen3.5-MoE), for the family that has one.
    pub fn hybrid(&self) -> Option<&HybridConfig> {
        match &self.attn {
            Attn::Hybrid(h) => Some(h),
            _ => None,
        }
    }

    /// DeepSeek-V4's shapes, for the family that has them.
    pub fn dsv4(&self) -> Option<&Dsv4Config> {
        match &self.attn {
            Attn::Dsv4(d) => Some(d),
            _ => None,
        }
    }

    /// The DSA indexer, for the MLA families that have one.
    pub fn indexer(&self) -> Option<&IndexerConfig> {
        self.mla().and_then(|m| m.indexer.as_ref())
    }

    /// The indexer's selection size; 0 without an indexer (every key attended).
    pub fn index_topk(&self) -> usize {
        self.indexer().map_or(0, |ix| ix.index_topk)
    }

    /// Bytes per context position of MLA's decompressed keys and values (the k/v buffer the
    /// RAM clamp reserves, in f32); 0 for grouped-query attention, which keeps none.
    pub fn kvb_bytes_per_position(&self) -> usize {
        self.num_attention_heads * self.mla().map_or(0, |m| m.qk_nope_head_dim + m.v_head_dim) * 4
    }

    /// Layer `l`'s indexer: `Shared` (no weights of its own) on every layer of a family
    /// without one.
    pub fn indexer_kind(&self, l: usize) -> IndexerKind {
        self.indexer()
            .and_then(|ix| ix.indexer_types.get(l).copied())
            .unwrap_or(IndexerKind::Shared)
    }

    /// Number of layers whose feed-forward block is a mixture of experts.
    pub fn n_sparse_layers(&self) -> usize {
        self.mlp_layer_types
            .iter()
            .filter(|k| **k == MlpKind::Sparse)
            .count()
    }

    fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let value: Value = serde_json::from_str(text).map_err(|e| ConfigError::Json {
            path: path.to_path_buf(),
            msg: e.to_string(),
        })?;
        let Value::Object(obj) = value else {
            return Err(ConfigError::Json {
                path: path.to_path_buf(),
                msg: "the top level is not a JSON object".into(),
            });
        };
        Self::from_object(&Keys(&obj))
    }

    fn from_object(c: &Keys<'_>) -> Result<Self, ConfigError> {
        // No model_type: GLM-5, as every checkpoint before the families were added.
        let family = match c.get("model_type").filter(|v| !v.is_null()) {
            None => Family::GlmMoeDsa,
            Some(v) => {
                let name = c.string("model_type", v)?;
                // Kimi K2 ships DeepSeek-V3's architecture under its own name (its config.json
                // says `kimi_k2` so that engines can tell the two apart); the shapes and the
                // forward pass are DeepSeek-V3's.
                let name = if name == "kimi_k2" {
                    "deepseek_v3"
                } else {
                    name
                };
                Family::from_model_type(name).ok_or_else(|| {
                    let known: Vec<String> = Family::ALL
                        .iter()
                        .map(|f| format!("\"{}\"", f.model_type()))
                        .collect();
                    unsupported(
                        "model_type",
                        v,
                        &format!("the families this engine runs are {}", known.join(", ")),
                    )
                })?
            }
        };
        if let Some(v) = c.get("hidden_act").filter(|v| !v.is_null()) {
            if c.string("hidden_act", v)? != "silu" {
                return Err(unsupported("hidden_act", v, "only \"silu\" is implemented"));
            }
        }
        (family.spec().parse)(c)
    }
}

/// `n_routed_experts`, or its aliases `num_local_experts` / `num_experts`; `default` when
/// none is given.
fn routed_experts(c: &Keys<'_>, default: usize) -> Result<usize, ConfigError> {
    let mut found: Option<(&str, usize)> = None;
    for key in ["n_routed_experts", "num_local_experts", "num_experts"] {
        let Some(v) = c.get(key) else { continue };
        let n = c.usize_value(key, v, 1, MAX_EXPERTS)?;
        match found {
            None => found = Some((key, n)),
            Some((first, m)) if m != n => {
                return Err(ConfigError::Invalid {
                    key: key.into(),
                    value: n.to_string(),
                    why: format!("it is an alias of \"{first}\", which says {m}"),
                })
            }
            Some(_) => {}
        }
    }
    Ok(found.map_or(default, |(_, n)| n))
}

/// `rope_theta` and YaRN from `rope_parameters` (transformers 5) or the legacy top-level
/// `rope_theta` + `rope_scaling` (`rope_type` or the older `type`), as the published
/// checkpoints and model cards write them: DeepSeek-V3 ships YaRN, Qwen3's card tells users
/// to add it for contexts past 32k, and GLM-4.x fine-tunes do the same. Every family reads
/// its RoPE here.
fn rope(c: &Keys<'_>, max_positions: usize) -> Result<(f64, Option<Yarn>), ConfigError> {
    const THETA_RULE: &str = "a finite number > 0";
    let present = |key| c.get(key).filter(|v| !v.is_null());
    // Both written (a card's `rope_scaling` added to a config transformers 5 saved):
    // transformers reads `rope_scaling` alone and drops `rope_parameters`, its `rope_theta`
    // with it, so a RoPE other than the one the file seems to say would run.
    if let (Some(p), Some(s)) = (present("rope_parameters"), present("rope_scaling")) {
        if p != s {
            return Err(ConfigError::Invalid {
                key: "rope_scaling".into(),
                value: show(s),
                why: "rope_parameters says otherwise, and transformers would read rope_scaling \
                      alone (dropping rope_parameters and its rope_theta); keep one of the two"
                    .into(),
            });
        }
    }
    let (key, params) = match (c.get("rope_parameters"), c.get("rope_scaling")) {
        (Some(Value::Object(p)), _) => ("rope_parameters", Some(p)),
        (Some(v), _) if !v.is_null() => return Err(wrong_type("rope_parameters", "an object")),
        (_, Some(Value::Object(p))) => ("rope_scaling", Some(p)),
        (_, Some(v)) if !v.is_null() => {
            return Err(wrong_type("rope_scaling", "an object or null"))
        }
        _ => ("rope_scaling", None),
    };
    let theta = match params.and_then(|p| p.get("rope_theta")) {
        Some(v) => c.f64_value(&format!("{key}.rope_theta"), v, THETA_RULE, |x| x > 0.0)?,
        None => c.f64_in("rope_theta", 10000.0, THETA_RULE, |x| x > 0.0)?,
    };
    let Some(p) = params else {
        return Ok((theta, None));
    };
    match p.get("rope_type").or_else(|| p.get("type")) {
        None => return Ok((theta, None)),
        Some(Value::String(s)) if s == "default" => return Ok((theta, None)),
        Some(Value::String(s)) if s == "yarn" => {}
        Some(v) => {
            return Err(unsupported(
                &format!("{key}.rope_type"),
                v,
                "only \"default\" and \"yarn\" RoPE are implemented",
            ))
        }
    }
    let num = |name: &str, default: Option<f64>| -> Result<Option<f64>, ConfigError> {
        match p.get(name) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => Ok(Some(c.f64_value(
                &format!("{key}.{name}"),
                v,
                "a finite number >= 0",
                |x| x >= 0.0,
            )?)),
        }
    };
    let original =
        num("original_max_position_embeddings", None)?.ok_or_else(|| ConfigError::Invalid {
            key: format!("{key}.original_max_position_embeddings"),
            value: "(missing)".into(),
            why: "YaRN needs the context the model was pretrained with".into(),
        })?;
    if original < 1.0 {
        return Err(ConfigError::OutOfRange {
            key: format!("{key}.original_max_position_embeddings"),
            value: original.to_string(),
            allowed: "a number >= 1".into(),
        });
    }
    // transformers: a missing factor is max_position_embeddings / original.
    let factor = num("factor", Some(max_positions as f64 / original))?.unwrap_or(1.0);
    let mscale = num("mscale", None)?;
    let mscale_all_dim = num("mscale_all_dim", None)?;
    let attention_factor = match num("attention_factor", None)? {
        Some(a) => a,
        None => match (mscale, mscale_all_dim) {
            (Some(m), Some(a)) if m != 0.0 && a != 0.0 => {
                Yarn::mscale(factor, m) / Yarn::mscale(factor, a)
            }
            _ => Yarn::mscale(factor, 1.0),
        },
    };
    let truncate = match p.get("truncate") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(wrong_type(&format!("{key}.truncate"), "true or false")),
    };
    Ok((
        theta,
        Some(Yarn {
            factor,
            original_max_position_embeddings: original,
            beta_fast: num("beta_fast", Some(32.0))?
                .filter(|&b| b != 0.0)
                .unwrap_or(32.0),
            beta_slow: num("beta_slow", Some(1.0))?
                .filter(|&b| b != 0.0)
                .unwrap_or(1.0),
            attention_factor,
            mscale_all_dim: mscale_all_dim.unwrap_or(0.0),
            truncate,
        }),
    ))
}

/// Explicit `mlp_layer_types`, else `first_k_dense_replace` dense layers then sparse ones.
fn mlp_layer_types(c: &Keys<'_>, layers: usize) -> Result<Vec<MlpKind>, ConfigError> {
    const KEY: &str = "mlp_layer_types";
    if let Some(v) = c.get(KEY).filter(|v| !v.is_null()) {
        let items = list_of_len(KEY, v, layers)?;
        return items
            .iter()
            .map(|item| match item.as_str() {
                Some("dense") => Ok(MlpKind::Dense),
                Some("sparse") => Ok(MlpKind::Sparse),
                _ => Err(unsupported(
                    KEY,
                    item,
                    "entries must be \"dense\" or \"sparse\"",
                )),
            })
            .collect();
    }
    // HF's default of 3 dense layers, clamped for models with fewer layers.
    first_k_dense(c, layers, 3.min(layers))
}

/// `first_k_dense_replace` dense layers (`default` when absent), then sparse ones.
fn first_k_dense(c: &Keys<'_>, layers: usize, default: usize) -> Result<Vec<MlpKind>, ConfigError> {
    let k = c.usize_in("first_k_dense_replace", default, 0, layers)?;
    Ok((0..layers)
        .map(|i| {
            if i < k {
                MlpKind::Dense
            } else {
                MlpKind::Sparse
            }
        })
        .collect())
}

/// `eos_token_id`: a number, a list of numbers, or null. HF's default is 1.
fn eos_token_ids(c: &Keys<'_>, vocab: usize) -> Result<Vec<u32>, ConfigError> {
    const KEY: &str = "eos_token_id";
    match c.get(KEY) {
        None => Ok(vec![1]),
        Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => {
            if items.len() > MAX_EOS_IDS {
                return Err(ConfigError::OutOfRange {
                    key: KEY.into(),
                    value: format!("a list of {} ids", items.len()),
                    allowed: format!("at most {MAX_EOS_IDS} ids"),
                });
            }
            items.iter().map(|v| token_id(c, KEY, v, vocab)).collect()
        }
        Some(v) => Ok(vec![token_id(c, KEY, v, vocab)?]),
    }
}

/// `rms_norm_eps`, `default` when absent.
fn norm_eps(c: &Keys<'_>, default: f64) -> Result<f32, ConfigError> {
    Ok(
        c.f64_in("rms_norm_eps", default, "a finite number in (0, 1)", |x| {
            x > 0.0 && x < 1.0
        })? as f32,
    )
}

/// A rotary width: rotary rotates pairs, so it must be even.
fn even_rotary(key: &str, dim: usize) -> Result<(), ConfigError> {
    if dim.is_multiple_of(2) {
        return Ok(());
    }
    Err(ConfigError::Invalid {
        key: key.into(),
        value: dim.to_string(),
        why: "RoPE rotates pairs, so it must be even".into(),
    })
}

fn token_id(c: &Keys<'_>, key: &str, v: &Value, vocab: usize) -> Result<u32, ConfigError> {
    // vocab <= MAX_VOCAB < u32::MAX, so the cast is exact.
    Ok(c.usize_value(key, v, 0, vocab - 1)? as u32)
}

fn list_of_len<'v>(key: &str, v: &'v Value, len: usize) -> Result<&'v [Value], ConfigError> {
    let Value::Array(items) = v else {
        return Err(wrong_type(key, "a list"));
    };
    if items.len() != len {
        return Err(wrong_len(key, items.len(), len));
    }
    Ok(items)
}

fn wrong_len(key: &str, found: usize, layers: usize) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        value: format!("({found} entries)"),
        why: format!("it needs one entry per layer (num_hidden_layers = {layers})"),
    }
}

fn unsupported(key: &str, v: &Value, why: &str) -> ConfigError {
    ConfigError::Unsupported {
        key: key.into(),
        value: show(v),
        why: why.into(),
    }
}

fn wrong_type(key: &str, expected: &str) -> ConfigError {
    ConfigError::WrongType {
        key: key.into(),
        expected: expected.into(),
    }
}

/// A JSON value for an error message, cut short so a hostile file cannot flood the terminal.
fn show(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 80 {
        let head: String = s.chars().take(77).collect();
        format!("{head}...")
    } else {
        s
    }
}

/// Typed access to the top-level keys, each getter producing a named error.
struct Keys<'a>(&'a Map<String, Value>);

impl Keys<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key)
    }

    fn string<'v>(&self, key: &str, v: &'v Value) -> Result<&'v str, ConfigError> {
        v.as_str().ok_or_else(|| wrong_type(key, "a string"))
    }

    fn uint(&self, key: &str, v: &Value) -> Result<u64, ConfigError> {
        match v.as_u64() {
            Some(n) => Ok(n),
            None if v.is_i64() => Err(ConfigError::OutOfRange {
                key: key.into(),
                value: show(v),
                allowed: "a non-negative integer".into(),
            }),
            None => Err(wrong_type(key, "an integer")),
        }
    }

    fn usize_value(
        &self,
        key: &str,
        v: &Value,
        lo: usize,
        hi: usize,
    ) -> Result<usize, ConfigError> {
        let out_of_range = || ConfigError::OutOfRange {
            key: key.into(),
            value: show(v),
            allowed: Range(lo, hi).to_string(),
        };
        if v.is_i64() && !v.is_u64() {
            return Err(out_of_range());
        }
        let n = v.as_u64().ok_or_else(|| wrong_type(key, "an integer"))?;
        match usize::try_from(n) {
            Ok(n) if (lo..=hi).contains(&n) => Ok(n),
            _ => Err(out_of_range()),
        }
    }

    /// An integer key in `lo..=hi`, or `default` when absent or null.
    fn usize_in(
        &self,
        key: &str,
        default: usize,
        lo: usize,
        hi: usize,
    ) -> Result<usize, ConfigError> {
        match self.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => self.usize_value(key, v, lo, hi),
        }
    }

    fn f64_value(
        &self,
        key: &str,
        v: &Value,
        rule: &str,
        ok: impl Fn(f64) -> bool,
    ) -> Result<f64, ConfigError> {
        let x = v.as_f64().ok_or_else(|| wrong_type(key, "a number"))?;
        if x.is_finite() && ok(x) {
            Ok(x)
        } else {
            Err(ConfigError::OutOfRange {
                key: key.into(),
                value: show(v),
                allowed: rule.into(),
            })
        }
    }

    fn f64_in(
        &self,
        key: &str,
        default: f64,
        rule: &str,
        ok: impl Fn(f64) -> bool,
    ) -> Result<f64, ConfigError> {
        match self.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => self.f64_value(key, v, rule, ok),
        }
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool, ConfigError> {
        match self.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(wrong_type(key, "true or false")),
        }
    }
}

/// `lo..=hi`, as the error messages print an allowed range.
struct Range(usize, usize);

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..={}", self.0, self.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_object_gives_glm5_defaults() {
        let c = ModelConfig::from_json("{}").unwrap();
        assert_eq!(c.vocab_size, 154880);
        assert_eq!(c.hidden_size, 6144);
        assert_eq!(c.num_hidden_layers, 78);
        assert_eq!(c.n_routed_experts, 256);
        assert_eq!(c.mla().unwrap().qk_head_dim(), 256);
        assert_eq!(c.n_sparse_layers(), 75);
        assert!(c
            .indexer()
            .unwrap()
            .indexer_types
            .iter()
            .all(|k| *k == IndexerKind::Full));
        assert_eq!(c.rope_theta, 10000.0);
        assert_eq!(c.eos_token_ids, vec![1]);
        assert_eq!(c.bos_token_id, Some(0));
    }

    #[test]
    fn negative_and_float_values_are_named() {
        let e = ModelConfig::from_json(r#"{"hidden_size": -4}"#).unwrap_err();
        assert!(matches!(e, ConfigError::OutOfRange { ref key, .. } if key == "hidden_size"));
        let e = ModelConfig::from_json(r#"{"hidden_size": 4.5}"#).unwrap_err();
        assert!(matches!(e, ConfigError::WrongType { ref key, .. } if key == "hidden_size"));
        let e = ModelConfig::from_json(r#"{"hidden_size": 1e300}"#).unwrap_err();
        assert!(matches!(e, ConfigError::WrongType { ref key, .. } if key == "hidden_size"));
    }

    #[test]
    fn not_an_object_is_a_json_error() {
        let e = ModelConfig::from_json("[1, 2]").unwrap_err();
        assert!(matches!(e, ConfigError::Json { .. }));
        let e = ModelConfig::from_json("{").unwrap_err();
        assert!(matches!(e, ConfigError::Json { .. }));
    }
}
