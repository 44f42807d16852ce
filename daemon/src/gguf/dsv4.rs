//! llama.cpp's `deepseek4` (DeepSeek-V4-Flash, V4-Pro): its hyper-parameters as the keys of
//! DeepSeek's published `config.json` (`compress_ratios`, `num_hash_layers`, `rope_scaling`,
//! which `config::deepseek_v4` reads as transformers does), and its tensor names as the
//! published checkpoint's (`layers.N.attn.wq_a`, `hc_head_fn`, ...), which the engine loads.
//!
//! Its converter (`DeepseekV4Model`) moves no value inside a tensor: the FP8 matrices are
//! dequantized (e4m3 x a power of two: exact in F32, the default writes them as Q8_0), the FP4
//! experts repacked into ggml's MXFP4 blocks (the same codes and E8M0 scales), the hash
//! routing table `tid2eid` written as I32 (read as numbers, as the published I64 one is), the
//! hash layers' unused `gate.bias` dropped (the engine gives them none). So the mapping is by
//! name only. What it computes, followed here where it says more than the Hugging Face config:
//! - `attention.compress_ratios`, one per block: 0 a sliding layer, 4 a compressed sparse one
//!   (overlapping blocks and an indexer: llama.cpp tells the kinds apart by the 4), any other
//!   a heavily compressed one at that rate (llama.cpp's loader takes only 128 there; the
//!   tiny fixture's 8 is the same computation). The HCA layers share one rate in colibri.
//! - `rope.scaling.*` (YaRN) applies to the compressed layers only, at
//!   `attention.compress_rope_freq_base`, with cos and sin unscaled (llama.cpp cancels YaRN's
//!   magnitude scaling: DeepseekV4Config's `attention_factor` 1); the sliding layers rotate
//!   plainly at `rope.freq_base`. A file converted from transformers 5's nested
//!   `rope_parameters.compress` has no `rope.scaling.*` (the converter does not read it):
//!   llama.cpp then rotates the compressed layers plainly too, and so does colibri.
//! - `expert_weights_norm` false, SwiGLU clamps that differ by layer or between routed and
//!   shared experts, and a router other than sqrtsoftplus are things colibri's family does
//!   not compute: refused naming the key.
//!
//! Each key that says which tensors a layer has (`compress_ratios`, `hash_layer_count`) is
//! checked against the tensors, and a file where they disagree is refused naming the key.

use serde_json::{json, Value};

use super::config::Keys;
use super::meta::GgufValue;
use super::{GgufError, GgufModel};

/// llama.cpp's `expert_gating_func` of DeepSeek-V4's router (`LLAMA_EXPERT_GATING_FUNC_TYPE_
/// SQRT_SOFTPLUS`), the only one its loader takes.
const GATING_SQRT_SOFTPLUS: u64 = 4;

/// The compression ratio llama.cpp reads as compressed sparse attention.
const CSA_RATIO: u64 = 4;

/// deepseek4's per-block tensors, llama.cpp's suffix to the published name (after
/// `model.layers.N.`). Looked up before the shared table, whose names mean otherwise here.
pub(super) const BLOCK: &[(&str, &str)] = &[
    ("attn_norm.weight", "attn_norm.weight"),
    ("ffn_norm.weight", "ffn_norm.weight"),
    ("attn_sinks.weight", "attn.attn_sink"),
    ("attn_q_a.weight", "attn.wq_a.weight"),
    ("attn_q_a_norm.weight", "attn.q_norm.weight"),
    ("attn_q_b.weight", "attn.wq_b.weight"),
    ("attn_kv.weight", "attn.wkv.weight"),
    // llama.cpp's ATTN_KV_NORM, which its name table writes as attn_kv_a_norm.
    ("attn_kv_a_norm.weight", "attn.norm.weight"),
    ("attn_output_a.weight", "attn.wo_a.weight"),
    ("attn_output_b.weight", "attn.wo_b.weight"),
    ("attn_compressor_ape.weight", "attn.compressor.ape"),
    ("attn_compressor_kv.weight", "attn.compressor.wkv.weight"),
    (
        "attn_compressor_gate.weight",
        "attn.compressor.wgate.weight",
    ),
    ("attn_compressor_norm.weight", "attn.compressor.norm.weight"),
    ("indexer.attn_q_b.weight", "attn.indexer.wq_b.weight"),
    ("indexer.proj.weight", "attn.indexer.weights_proj.weight"),
    (
        "indexer_compressor_ape.weight",
        "attn.indexer.compressor.ape",
    ),
    (
        "indexer_compressor_kv.weight",
        "attn.indexer.compressor.wkv.weight",
    ),
    (
        "indexer_compressor_gate.weight",
        "attn.indexer.compressor.wgate.weight",
    ),
    (
        "indexer_compressor_norm.weight",
        "attn.indexer.compressor.norm.weight",
    ),
    ("hc_attn_fn.weight", "hc_attn_fn"),
    ("hc_attn_base.weight", "hc_attn_base"),
    ("hc_attn_scale.weight", "hc_attn_scale"),
    ("hc_ffn_fn.weight", "hc_ffn_fn"),
    ("hc_ffn_base.weight", "hc_ffn_base"),
    ("hc_ffn_scale.weight", "hc_ffn_scale"),
    ("ffn_gate_inp.weight", "ffn.gate.weight"),
    ("exp_probs_b.bias", "ffn.gate.bias"),
    ("ffn_gate_tid2eid.weight", "ffn.gate.tid2eid"),
    ("ffn_gate_shexp.weight", "ffn.shared_experts.w1.weight"),
    ("ffn_up_shexp.weight", "ffn.shared_experts.w3.weight"),
    ("ffn_down_shexp.weight", "ffn.shared_experts.w2.weight"),
];

/// The hyper-head that folds the streams into one before the final norm, and the output head
/// under the published name (the engine's `lm_head` elsewhere).
pub(super) const GLOBAL: &[(&str, &str)] = &[
    ("output.weight", "head.weight"),
    ("output_hc_fn.weight", "model.hc_head.hc_fn"),
    ("output_hc_base.weight", "model.hc_head.hc_base"),
    ("output_hc_scale.weight", "model.hc_head.hc_scale"),
];

/// The one tensor of an integer type a deepseek4 file holds: the hash layers' token-to-expert
/// table (I32).
pub(super) const HASH_TABLE: &str = "ffn_gate_tid2eid.weight";

/// The config keys of a deepseek4 file of `layers` layers and `experts` routed experts,
/// checked against the tensors.
pub(super) fn config_keys(
    k: &Keys,
    m: &GgufModel,
    layers: u64,
    experts: u64,
    head_dim: Option<u64>,
    put: &mut dyn FnMut(&str, Value),
) -> Result<(), GgufError> {
    put("n_routed_experts", json!(experts));
    put(
        "n_shared_experts",
        json!(k.u64_opt("expert_shared_count")?.unwrap_or(1)),
    );
    if let Some(s) = k.f64_opt("expert_weights_scale")? {
        put("routed_scaling_factor", json!(s));
    }
    // DeepseekV4TopKRouter always renormalises its top-k weights; llama.cpp reads the key.
    if k.bool_opt("expert_weights_norm")? == Some(false) {
        return Err(k.bad(
            &k.key("expert_weights_norm"),
            "false; DeepSeek-V4's router renormalises its top-k weights (colibri always does)"
                .into(),
        ));
    }
    let key = k.key("expert_gating_func");
    match k.u64_opt("expert_gating_func")? {
        Some(GATING_SQRT_SOFTPLUS) => put("scoring_func", json!("sqrtsoftplus")),
        other => {
            return Err(k.bad(
                &key,
                format!(
                    "{other:?}; DeepSeek-V4 routes by sqrt(softplus) ({GATING_SQRT_SOFTPLUS}), \
                     the only router llama.cpp's deepseek4 loads"
                ),
            ))
        }
    }
    // One key=value head as wide as a query head.
    let value = k.u64_opt("attention.value_length")?;
    if let (Some(v), Some(d)) = (value, head_dim) {
        if v != d {
            return Err(k.bad(
                &k.key("attention.value_length"),
                format!("{v}; DeepSeek-V4's one key=value head is key_length ({d}) wide"),
            ));
        }
    }
    put("qk_rope_head_dim", json!(k.u64("rope.dimension_count")?));
    put("q_lora_rank", json!(k.u64("attention.q_lora_rank")?));
    put("sliding_window", json!(k.u64("attention.sliding_window")?));
    put("o_groups", json!(k.u64("attention.output_group_count")?));
    put("o_lora_rank", json!(k.u64("attention.output_lora_rank")?));
    super::dsa::indexer_keys(k, put)?;
    let hc = k.u64("hyper_connection.count")?;
    put("hc_mult", json!(hc));
    put(
        "hc_sinkhorn_iters",
        json!(k.u64("hyper_connection.sinkhorn_iterations")?),
    );
    put("hc_eps", json!(k.f64("hyper_connection.epsilon")?));
    if let Some(out) = k.u64_opt("embedding_length_out")? {
        let h = k.u64("embedding_length")?;
        if out != hc * h {
            return Err(k.bad(
                &k.key("embedding_length_out"),
                format!("{out}; the {hc} streams of {h} are {} wide", hc * h),
            ));
        }
    }
    put("swiglu_limit", json!(swiglu_limit(k, m, layers)?));
    let (types, hca) = layer_types(k, m, layers)?;
    put("layer_types", json!(types));
    put(
        "compress_rates",
        json!({"compressed_sparse_attention": CSA_RATIO, "heavily_compressed_attention": hca}),
    );
    let hashed = hash_layers(k, m, layers)?;
    put("num_hash_layers", json!(hashed));
    put(
        "rope_theta",
        json!(k.f64_opt("rope.freq_base")?.unwrap_or(10000.0)),
    );
    put(
        "compress_rope_theta",
        json!(k.f64("attention.compress_rope_freq_base")?),
    );
    put("rope_scaling", compress_yarn(k)?);
    // The engine reads no BOS id; a file says its own (or none), as its config.json did.
    let bos = m
        .get("tokenizer.ggml.bos_token_id")
        .and_then(GgufValue::as_u64);
    put("bos_token_id", json!(bos));
    Ok(())
}

/// The SwiGLU clamp: `swiglu_clamp_exp` (one per block, or one for all), which
/// `swiglu_clamp_shexp` must repeat (colibri clamps both with one `swiglu_limit`).
fn swiglu_limit(k: &Keys, m: &GgufModel, layers: u64) -> Result<f64, GgufError> {
    let read = |name: &str| -> Result<Option<Vec<f64>>, GgufError> {
        let key = k.key(name);
        match m.get(&key) {
            None => Ok(None),
            Some(GgufValue::Array(_, v)) => v
                .iter()
                .take(layers as usize)
                .map(|x| number(x).ok_or_else(|| k.bad(&key, format!("{x:?} is not a number"))))
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(x) => number(x)
                .map(|n| Some(vec![n; layers as usize]))
                .ok_or_else(|| k.bad(&key, format!("{x:?} is not a number"))),
        }
    };
    let key = k.key("swiglu_clamp_exp");
    let exp = read("swiglu_clamp_exp")?.ok_or_else(|| {
        k.bad(
            &key,
            "missing; llama.cpp's deepseek4 reads the SwiGLU clamp from it".into(),
        )
    })?;
    let Some(&limit) = exp.first() else {
        return Err(k.bad(&key, "empty".into()));
    };
    if let Some(l) = exp.iter().position(|&x| x != limit) {
        return Err(k.bad(
            &key,
            format!(
                "layer {l} clamps at {}, layer 0 at {limit}; colibri's DeepSeek-V4 has one \
                 swiglu_limit",
                exp[l]
            ),
        ));
    }
    if let Some(sh) = read("swiglu_clamp_shexp")? {
        if let Some(l) = sh.iter().position(|&x| x != limit) {
            return Err(k.bad(
                &k.key("swiglu_clamp_shexp"),
                format!(
                    "layer {l}'s shared expert clamps at {}, the routed ones at {limit}; \
                     colibri's DeepSeek-V4 clamps both with one swiglu_limit",
                    sh[l]
                ),
            ));
        }
    }
    Ok(limit)
}

/// A float metadata value (as written from config.json: f32's shortest decimal).
fn number(v: &GgufValue) -> Option<f64> {
    match v {
        GgufValue::F32(x) => x.to_string().parse().ok(),
        GgufValue::F64(x) => Some(*x),
        other => other.as_u64().map(|n| n as f64),
    }
}

/// `layer_types` from `attention.compress_ratios` (see the module note), with the one rate of
/// the heavily compressed layers (128 when there are none), checked against each layer's
/// compressor and indexer tensors.
fn layer_types(
    k: &Keys,
    m: &GgufModel,
    layers: u64,
) -> Result<(Vec<&'static str>, u64), GgufError> {
    let key = k.key("attention.compress_ratios");
    let ratios: Vec<u64> = match m.get(&key) {
        Some(GgufValue::Array(_, v)) => v
            .iter()
            .map(|x| {
                x.as_u64()
                    .ok_or_else(|| k.bad(&key, format!("{x:?} is not a ratio")))
            })
            .collect::<Result<_, _>>()?,
        Some(v) => return Err(k.bad(&key, format!("expected one ratio per block, found {v:?}"))),
        None => {
            return Err(k.bad(
                &key,
                "missing; llama.cpp's deepseek4 reads each layer's attention from it".into(),
            ))
        }
    };
    if (ratios.len() as u64) < layers {
        return Err(k.bad(
            &key,
            format!(
                "{} entries for {layers} layers; one per layer",
                ratios.len()
            ),
        ));
    }
    let has = |l: u64, t: &str| m.tensor(&format!("blk.{l}.{t}")).is_some();
    let mut hca = None;
    let mut types = Vec::with_capacity(layers as usize);
    for l in 0..layers {
        let r = ratios[l as usize];
        let (kind, compressed, indexed) = match r {
            0 => ("sliding_attention", false, false),
            CSA_RATIO => ("compressed_sparse_attention", true, true),
            _ => ("heavily_compressed_attention", true, false),
        };
        if kind == "heavily_compressed_attention" {
            match hca {
                None => hca = Some(r),
                Some(h) if h != r => {
                    return Err(k.bad(
                        &key,
                        format!(
                            "layer {l} compresses every {r} tokens, an earlier heavily \
                             compressed layer every {h}; colibri's DeepSeek-V4 has one rate"
                        ),
                    ))
                }
                _ => {}
            }
        }
        for (t, want) in [
            ("attn_compressor_kv.weight", compressed),
            ("indexer.attn_q_b.weight", indexed),
        ] {
            if has(l, t) != want {
                return Err(k.bad(
                    &key,
                    format!(
                        "layer {l}'s ratio {r} ({kind}) but {} blk.{l}.{t}",
                        if want { "no" } else { "a" }
                    ),
                ));
            }
        }
        types.push(kind);
    }
    Ok((types, hca.unwrap_or(128)))
}

/// `num_hash_layers` from `hash_layer_count`: the first layers route by token id (their
/// `ffn_gate_tid2eid` table), the rest by score (their `exp_probs_b` bias).
fn hash_layers(k: &Keys, m: &GgufModel, layers: u64) -> Result<u64, GgufError> {
    let key = k.key("hash_layer_count");
    let n = k.u64("hash_layer_count")?;
    let has = |l: u64, t: &str| m.tensor(&format!("blk.{l}.{t}")).is_some();
    if let Some(l) = (0..layers).find(|&l| has(l, HASH_TABLE) != (l < n)) {
        return Err(k.bad(
            &key,
            format!(
                "{n} hash layers, but layer {l} has {} token-to-expert table \
                 (blk.{l}.{HASH_TABLE})",
                if l < n { "no" } else { "a" }
            ),
        ));
    }
    Ok(n)
}

/// The compressed layers' YaRN as DeepSeek's published `rope_scaling`, or null (plain RoPE,
/// as llama.cpp computes a file without `rope.scaling.type`).
fn compress_yarn(k: &Keys) -> Result<Value, GgufError> {
    let key = k.key("rope.scaling.type");
    match k.str_opt(&key)?.unwrap_or("none") {
        "none" => Ok(Value::Null),
        "yarn" => {
            let mut p = serde_json::Map::new();
            p.insert("type".into(), json!("yarn"));
            p.insert("factor".into(), json!(k.f64("rope.scaling.factor")?));
            p.insert(
                "original_max_position_embeddings".into(),
                json!(k.u64("rope.scaling.original_context_length")?),
            );
            for (g, hf) in [
                ("rope.scaling.yarn_beta_fast", "beta_fast"),
                ("rope.scaling.yarn_beta_slow", "beta_slow"),
            ] {
                if let Some(x) = k.f64_opt(g)? {
                    p.insert(hf.into(), json!(x));
                }
            }
            Ok(Value::Object(p))
        }
        other => Err(k.bad(
            &key,
            format!("{other:?}; DeepSeek-V4's compressed layers rotate by YaRN or plainly"),
        )),
    }
}
