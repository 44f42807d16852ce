//! A GGUF's hyper-parameters as the engine's [`ModelConfig`]: llama.cpp's `<arch>.*` metadata
//! keys written back as the Hugging Face `config.json` keys its converter read them from, then
//! validated by the same parser as a `config.json` (so a GGUF and the checkpoint it was
//! converted from give the same config, and every range check applies to both).

use std::path::Path;

use serde_json::{json, Map, Value};

use super::meta::GgufValue;
use super::{GgufError, GgufModel};
use crate::config::ModelConfig;

/// llama.cpp's architectures colibri runs from a GGUF, with the `model_type` of each.
pub const ARCHS: [(&str, &str); 9] = [
    ("glm4moe", "glm4_moe"),
    ("qwen3moe", "qwen3_moe"),
    // Qwen3.5/3.6-MoE, text only (a vision-language checkpoint's GGUF holds its language
    // model; the vision tower goes to a separate mmproj file).
    ("qwen35moe", "qwen3_5_moe_text"),
    // DeepSeek-V3/R1, Kimi K2 (llama.cpp's converter writes them all as deepseek2).
    ("deepseek2", "deepseek_v3"),
    ("gpt-oss", "gpt_oss"),
    ("minimax-m2", "minimax_m2"),
    // GLM-5 and DeepSeek-V3.2: deepseek2's MLA with the DSA indexer.
    ("glm-dsa", "glm_moe_dsa"),
    ("deepseek32", "deepseek_v32"),
    // DeepSeek-V4-Flash / V4-Pro: hyper-connections, compressed attention, hash routing.
    ("deepseek4", "deepseek_v4"),
];

/// The supported architectures in words, for refusals.
pub fn supported() -> String {
    ARCHS.map(|(a, _)| a).join(", ")
}

/// Token texts llama.cpp also counts as end of generation, whatever the special-token keys
/// say (`llama_vocab::impl::load`'s list, the ones these families use: gpt-oss's harmony
/// ends a turn with `<|return|>` or `<|call|>`; its `<|end|>` only closes a message, and
/// llama.cpp drops it from the list when both of those are there; DeepSeek's
/// `<｜end▁of▁sentence｜>`).
const EOG_TEXTS: [&str; 7] = [
    "<|endoftext|>",
    "<|im_end|>",
    "<|user|>",
    "<|observation|>",
    "<|return|>",
    "<|call|>",
    "<｜end▁of▁sentence｜>",
];

/// The `general.architecture` of `m`, refused unless colibri runs it.
pub fn arch(m: &GgufModel) -> Result<&'static str, GgufError> {
    let path = m.parts[0].path();
    let found = m
        .get("general.architecture")
        .ok_or_else(|| GgufError::Metadata {
            path: path.to_path_buf(),
            key: "general.architecture".into(),
            reason: "missing; every llama.cpp model names its architecture".into(),
        })?;
    let name = found.as_str().unwrap_or("");
    ARCHS
        .iter()
        .find(|(a, _)| *a == name)
        .map(|(a, _)| *a)
        .ok_or_else(|| GgufError::Metadata {
            path: path.to_path_buf(),
            key: "general.architecture".into(),
            reason: format!(
                "{found:?} is not an architecture colibri runs from a GGUF (supported: {})",
                supported()
            ),
        })
}

/// llama.cpp's `expert_gating_func` of a sigmoid router (`LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID`).
const GATING_SIGMOID: u64 = 2;

/// Reads typed metadata, naming the key of a missing or mistyped one.
pub(super) struct Keys<'a> {
    m: &'a GgufModel,
    pub(super) arch: &'static str,
}

impl<'a> Keys<'a> {
    /// The keys of `m`'s architecture (refused unless one colibri runs).
    pub(super) fn of(m: &'a GgufModel) -> Result<Self, GgufError> {
        Ok(Keys { m, arch: arch(m)? })
    }

    fn path(&self) -> &Path {
        self.m.parts[0].path()
    }

    pub(super) fn bad(&self, key: &str, reason: String) -> GgufError {
        GgufError::Metadata {
            path: self.path().to_path_buf(),
            key: key.to_string(),
            reason,
        }
    }

    pub(super) fn m(&self) -> &GgufModel {
        self.m
    }

    pub(super) fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    pub(super) fn u64_opt(&self, k: &str) -> Result<Option<u64>, GgufError> {
        let key = self.key(k);
        match self.m.get(&key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                self.bad(
                    &key,
                    format!("expected a non-negative integer, found {v:?}"),
                )
            }),
        }
    }

    pub(super) fn u64(&self, k: &str) -> Result<u64, GgufError> {
        self.u64_opt(k)?
            .ok_or_else(|| self.bad(&self.key(k), "missing; the model's shape needs it".into()))
    }

    /// A float key as the decimal it was written from: a key stored as f32 (llama.cpp's
    /// converter writes most so) is read back through its shortest f32 decimal, so that
    /// `1e-05` in config.json is `1e-05` here too, not f32's `9.99999974e-06`.
    pub(super) fn f64_opt(&self, k: &str) -> Result<Option<f64>, GgufError> {
        let key = self.key(k);
        match self.m.get(&key) {
            None => Ok(None),
            Some(GgufValue::F32(x)) => Ok(x.to_string().parse().ok()),
            Some(GgufValue::F64(x)) => Ok(Some(*x)),
            Some(v) => match v.as_u64() {
                Some(n) => Ok(Some(n as f64)),
                None => Err(self.bad(&key, format!("expected a number, found {v:?}"))),
            },
        }
    }

    pub(super) fn f64(&self, k: &str) -> Result<f64, GgufError> {
        self.f64_opt(k)?
            .ok_or_else(|| self.bad(&self.key(k), "missing; the model needs it".into()))
    }

    pub(super) fn bool_opt(&self, k: &str) -> Result<Option<bool>, GgufError> {
        let key = self.key(k);
        match self.m.get(&key) {
            None => Ok(None),
            Some(GgufValue::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.bad(&key, format!("expected a bool, found {v:?}"))),
        }
    }

    /// The model's own layers and the MTP layers after them: llama.cpp counts the MTP
    /// layers among its blocks (glm4moe's, glm-dsa's and qwen35moe's converters add them).
    pub(super) fn trunk_and_mtp(&self) -> Result<(u64, u64), GgufError> {
        let nextn = self.u64_opt("nextn_predict_layers")?.unwrap_or(0);
        let blocks = self.u64("block_count")?;
        let layers = blocks
            .checked_sub(nextn)
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                self.bad(
                    &self.key("nextn_predict_layers"),
                    format!("{nextn} MTP layers leave none of the {blocks} blocks for the model"),
                )
            })?;
        Ok((layers, nextn))
    }

    /// Refuses a router other than a sigmoid, naming `expert_gating_func` (llama.cpp's
    /// gating function, 2 the sigmoid) and saying `routes`; a file without the key is taken
    /// as a sigmoid only where `missing_ok` (what llama.cpp assumes for the architecture).
    pub(super) fn sigmoid_router(&self, missing_ok: bool, routes: &str) -> Result<(), GgufError> {
        match self.u64_opt("expert_gating_func")? {
            Some(GATING_SIGMOID) => Ok(()),
            None if missing_ok => Ok(()),
            Some(g) => Err(self.bad(
                &self.key("expert_gating_func"),
                format!("{g}; {routes} ({GATING_SIGMOID})"),
            )),
            None => Err(self.bad(
                &self.key("expert_gating_func"),
                format!(
                    "missing; {routes} ({GATING_SIGMOID}), which llama.cpp reads from this key"
                ),
            )),
        }
    }

    pub(super) fn str_opt(&self, key: &str) -> Result<Option<&str>, GgufError> {
        match self.m.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.bad(key, format!("expected a string, found {v:?}"))),
        }
    }
}

/// The `config.json` the GGUF's metadata stands for (its keys as `ModelConfig` reads them).
pub fn config_json(m: &GgufModel) -> Result<Value, GgufError> {
    let arch = arch(m)?;
    let model_type = ARCHS
        .iter()
        .find(|(a, _)| *a == arch)
        .map_or("", |(_, t)| *t);
    let k = Keys { m, arch };
    let mut c = Map::new();
    let mut put = |key: &str, v: Value| {
        c.insert(key.to_string(), v);
    };
    put("model_type", json!(model_type));
    put("hidden_act", json!("silu"));
    let (layers, nextn) = k.trunk_and_mtp()?;
    put("num_hidden_layers", json!(layers));
    if nextn > 0 {
        put("num_nextn_predict_layers", json!(nextn));
    }
    put("hidden_size", json!(k.u64("embedding_length")?));
    if let Some(n) = k.u64_opt("feed_forward_length")? {
        put("intermediate_size", json!(n));
    }
    put(
        "moe_intermediate_size",
        json!(k.u64("expert_feed_forward_length")?),
    );
    let heads = k.u64("attention.head_count")?;
    put("num_attention_heads", json!(heads));
    // deepseek2 writes MLA as one shared key-value head of the latent's width (its
    // `head_count_kv` 1, `key_length` kv_lora + rope): the Hugging Face keys are in `mla`.
    let mla = arch == "deepseek2" || super::dsa::ARCHS.contains(&arch);
    let kv_heads = match mla {
        true => heads,
        false => k.u64_opt("attention.head_count_kv")?.unwrap_or(heads),
    };
    put("num_key_value_heads", json!(kv_heads));
    let head_dim = match mla {
        true => None,
        false => k.u64_opt("attention.key_length")?,
    };
    if let Some(d) = head_dim {
        put("head_dim", json!(d));
    }
    put("max_position_embeddings", json!(k.u64("context_length")?));
    if let Some(eps) = k.f64_opt("attention.layer_norm_rms_epsilon")? {
        put("rms_norm_eps", json!(eps));
    }
    let experts = k.u64("expert_count")?;
    let used = k.u64("expert_used_count")?;
    put("num_experts_per_tok", json!(used));
    // llama.cpp's qwen3moe and qwen35moe renormalise the top-k weights whatever the
    // metadata says (their converter writes no key for it); glm4moe reads the key.
    let norm_default = matches!(arch, "qwen3moe" | "qwen35moe");
    put(
        "norm_topk_prob",
        json!(k.bool_opt("expert_weights_norm")?.unwrap_or(norm_default)),
    );
    put(
        "attention_bias",
        json!(m.tensor("blk.0.attn_q.bias").is_some()),
    );
    put(
        "tie_word_embeddings",
        json!(m.tensor("output.weight").is_none()),
    );
    let vocab = match m.get("tokenizer.ggml.tokens") {
        Some(GgufValue::Array(_, v)) => v.len() as u64,
        _ => match m.tensor("token_embd.weight") {
            Some(t) if t.ne.len() == 2 => t.ne[1],
            _ => {
                return Err(k.bad(
                    "tokenizer.ggml.tokens",
                    "missing, and no token_embd.weight to size the vocabulary".into(),
                ))
            }
        },
    };
    put("vocab_size", json!(vocab));
    put("eos_token_id", json!(eos_ids(m)?));
    // deepseek4 rotates its sliding and compressed layers differently (its own keys).
    if arch != "deepseek4" {
        put("rope_parameters", rope(&k, head_dim, mla)?);
    }
    match arch {
        "gpt-oss" => super::families::gpt_oss_keys(&k, m, experts, layers + nextn, &mut put)?,
        "minimax-m2" => super::families::minimax_m2_keys(&k, m, experts, head_dim, &mut put)?,
        "glm4moe" => {
            put("n_routed_experts", json!(experts));
            put(
                "n_shared_experts",
                json!(k.u64_opt("expert_shared_count")?.unwrap_or(0)),
            );
            put(
                "first_k_dense_replace",
                json!(k.u64_opt("leading_dense_block_count")?.unwrap_or(0)),
            );
            if let Some(s) = k.f64_opt("expert_weights_scale")? {
                put("routed_scaling_factor", json!(s));
            }
            put(
                "n_group",
                json!(k.u64_opt("expert_group_count")?.unwrap_or(1)),
            );
            put(
                "topk_group",
                json!(k.u64_opt("expert_group_used_count")?.unwrap_or(1)),
            );
            put(
                "use_qk_norm",
                json!(m.tensor("blk.0.attn_q_norm.weight").is_some()),
            );
            // GLM-4.5's router is a sigmoid; its config has no key for it, so anything else
            // is a model colibri's glm4_moe would misroute.
            k.sigmoid_router(true, "glm4moe routes with a sigmoid")?;
        }
        "deepseek2" => super::mla::config_keys(&k, m, experts, &mut put)?,
        "glm-dsa" | "deepseek32" => {
            super::dsa::config_keys(&k, m, arch, layers, experts, &mut put)?
        }
        "qwen35moe" => super::qwen35::config_keys(&k, experts, layers, &mut put)?,
        "deepseek4" => super::dsv4::config_keys(&k, m, layers, experts, head_dim, &mut put)?,
        _ => {
            put("num_experts", json!(experts));
            // llama.cpp's qwen3moe has every block sparse: it has no key for Qwen3's
            // mlp_only_layers or decoder_sparse_step.
            put("decoder_sparse_step", json!(1));
            put("mlp_only_layers", json!([]));
        }
    }
    Ok(Value::Object(c))
}

/// `rope_parameters` from the `rope.*` keys (transformers 5's layout of config.json).
fn rope(k: &Keys, head_dim: Option<u64>, mla: bool) -> Result<Value, GgufError> {
    let mut p = Map::new();
    p.insert(
        "rope_theta".into(),
        json!(k.f64_opt("rope.freq_base")?.unwrap_or(10000.0)),
    );
    if let (Some(dims), Some(hd)) = (k.u64_opt("rope.dimension_count")?, head_dim) {
        if dims != hd && hd > 0 {
            p.insert(
                "partial_rotary_factor".into(),
                json!(dims as f64 / hd as f64),
            );
        }
    }
    let scaling = k.str_opt(&k.key("rope.scaling.type"))?.unwrap_or("none");
    match scaling {
        "none" => {
            p.insert("rope_type".into(), json!("default"));
        }
        "yarn" => {
            p.insert("rope_type".into(), json!("yarn"));
            let factor = k.f64_opt("rope.scaling.factor")?.ok_or_else(|| {
                k.bad(
                    &k.key("rope.scaling.factor"),
                    "missing for yarn scaling".into(),
                )
            })?;
            p.insert("factor".into(), json!(factor));
            // gpt-oss's YaRN keeps its correction range unrounded (GptOssConfig's `truncate`
            // false, every published config); llama.cpp has no key for it.
            if k.arch == "gpt-oss" {
                p.insert("truncate".into(), json!(false));
            }
            if let Some(n) = k.u64_opt("rope.scaling.original_context_length")? {
                p.insert("original_max_position_embeddings".into(), json!(n));
            }
            for (g, hf) in [
                ("rope.scaling.yarn_beta_fast", "beta_fast"),
                ("rope.scaling.yarn_beta_slow", "beta_slow"),
            ] {
                if let Some(x) = k.f64_opt(g)? {
                    p.insert(hf.into(), json!(x));
                }
            }
            // deepseek2 keeps DeepSeek's `mscale_all_dim` as 0.1 x it (and no `mscale`:
            // llama.cpp computes as if both were equal, as in every published checkpoint).
            if mla {
                if let Some(x) = k.f64_opt("rope.scaling.yarn_log_multiplier")? {
                    let m: f64 = ((x * 10.0) as f32).to_string().parse().unwrap_or(x * 10.0);
                    p.insert("mscale".into(), json!(m));
                    p.insert("mscale_all_dim".into(), json!(m));
                }
            }
        }
        other => {
            return Err(k.bad(
                &k.key("rope.scaling.type"),
                format!("{other:?}; colibri runs none or yarn"),
            ))
        }
    }
    Ok(Value::Object(p))
}

/// The end-of-generation ids as llama.cpp takes them: `eos`, `eot` and `eom` token ids, and
/// the tokens whose text it counts as an end whatever the keys say; ascending.
fn eos_ids(m: &GgufModel) -> Result<Vec<u64>, GgufError> {
    let mut ids = Vec::new();
    for key in [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ] {
        if let Some(v) = m.get(key) {
            ids.push(v.as_u64().ok_or_else(|| GgufError::Metadata {
                path: m.parts[0].path().to_path_buf(),
                key: key.into(),
                reason: format!("expected a token id, found {v:?}"),
            })?);
        }
    }
    if let Some(GgufValue::Array(_, toks)) = m.get("tokenizer.ggml.tokens") {
        for (i, t) in toks.iter().enumerate() {
            if t.as_str().is_some_and(|s| EOG_TEXTS.contains(&s)) {
                ids.push(i as u64);
            }
        }
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

/// The GGUF's [`ModelConfig`]: [`config_json`] validated as a `config.json` is; a value the
/// parser refuses is refused naming the GGUF.
pub fn model_config(m: &GgufModel) -> Result<ModelConfig, GgufError> {
    let v = config_json(m)?;
    ModelConfig::from_json(&v.to_string()).map_err(|e| GgufError::Metadata {
        path: m.parts[0].path().to_path_buf(),
        key: format!("{}.*", arch(m).unwrap_or("?")),
        reason: format!("the hyper-parameters it gives are refused: {e}"),
    })
}
