//! llama.cpp's `glm-dsa` (GLM-5) and `deepseek32` (DeepSeek-V3.2): deepseek2's MLA (`mla`:
//! the same keys, `kv_b_proj` split the same way) plus the DSA lightning indexer, its keys as
//! the Hugging Face config's `index_*` / `indexer_types` and its tensors under the names the
//! engine's loader reads. Its converter (`DeepseekV2Model.modify_tensors`) writes the
//! indexer's matrices as transformers holds them (no row permuted or split), so the mapping
//! is by name only.
//!
//! Two keys say which tensors each layer has, and a file where they disagree with the
//! tensors is refused naming the key (not a missing tensor at load): `leading_dense_block_count`
//! (the dense MLP layers, which the converter takes from `first_k_dense_replace`; transformers'
//! `mlp_layer_types` is not written) and glm-dsa's `attention.indexer.types` (a full layer has
//! an indexer, a shared one reuses the latest full layer's selection and has none).

use serde_json::{json, Value};

use super::config::Keys;
use super::{GgufError, GgufModel};

/// The architectures here, MLA with a DSA indexer.
pub const ARCHS: [&str; 2] = ["glm-dsa", "deepseek32"];

/// The indexer's tensors (llama.cpp's suffix after `blk.N.`, ours after `model.layers.N.`),
/// and GLM-5's attention biases (`attention_bias`: q_a, kv_a and o_proj; llama.cpp's glm-dsa
/// graph does not read them, its converter writes them).
pub const NAMES: [(&str, &str); 8] = [
    ("indexer.attn_q_b.weight", "self_attn.indexer.wq_b.weight"),
    ("indexer.attn_k.weight", "self_attn.indexer.wk.weight"),
    ("indexer.k_norm.weight", "self_attn.indexer.k_norm.weight"),
    ("indexer.k_norm.bias", "self_attn.indexer.k_norm.bias"),
    (
        "indexer.proj.weight",
        "self_attn.indexer.weights_proj.weight",
    ),
    ("attn_q_a.bias", "self_attn.q_a_proj.bias"),
    ("attn_kv_a_mqa.bias", "self_attn.kv_a_proj_with_mqa.bias"),
    ("attn_output.bias", "self_attn.o_proj.bias"),
];

/// llama.cpp's glm-dsa takes a file without `indexer.types` for GLM-5 / 5.1 (every layer
/// full) below this context length, and as GLM-5.2 (a pattern of its own) from it.
const GLM_5_2_CONTEXT: u64 = 1 << 20;

/// The lightning indexer's keys (DeepSeek-V3.2's, GLM-5's and DeepSeek-V4's alike).
pub(super) fn indexer_keys(k: &Keys, put: &mut dyn FnMut(&str, Value)) -> Result<(), GgufError> {
    put(
        "index_n_heads",
        json!(k.u64("attention.indexer.head_count")?),
    );
    put(
        "index_head_dim",
        json!(k.u64("attention.indexer.key_length")?),
    );
    put("index_topk", json!(k.u64("attention.indexer.top_k")?));
    Ok(())
}

/// The config keys of `arch` (one of [`ARCHS`]) for a model of `layers` layers (the MTP
/// blocks not counted) and `experts` routed experts, checked against the tensors.
pub(super) fn config_keys(
    k: &Keys,
    m: &GgufModel,
    arch: &str,
    layers: u64,
    experts: u64,
    put: &mut dyn FnMut(&str, Value),
) -> Result<(), GgufError> {
    super::mla::config_keys(k, m, experts, put)?;
    indexer_keys(k, put)?;
    // GLM-5's attention_bias (q_a, kv_a and o_proj biased), from the tensors as for glm4moe.
    put(
        "attention_bias",
        json!(m.tensor("blk.0.attn_q_a.bias").is_some()),
    );
    // The engine reads no BOS id; the safetensors configs say null, the default of the
    // glm_moe_dsa parser (0) would differ from them for nothing.
    put("bos_token_id", Value::Null);
    let has = |l: u64, t: &str| m.tensor(&format!("blk.{l}.{t}")).is_some();
    let dense = k.u64_opt("leading_dense_block_count")?.unwrap_or(0);
    if let Some(l) = (0..layers).find(|&l| has(l, "ffn_gate_inp.weight") == (l < dense)) {
        return Err(k.bad(
            &k.key("leading_dense_block_count"),
            format!(
                "{dense} leading dense layers, but layer {l} has {} router \
                 (blk.{l}.ffn_gate_inp.weight)",
                if l < dense { "a" } else { "no" }
            ),
        ));
    }
    if arch != "glm-dsa" {
        // DeepSeek-V3.2 has an indexer on every layer: the loader names a missing one.
        return Ok(());
    }
    let key = k.key("attention.indexer.types");
    let full: Vec<bool> = match m.get(&key) {
        Some(super::GgufValue::Array(_, v)) => v
            .iter()
            .map(|b| match b {
                super::GgufValue::Bool(b) => Ok(*b),
                other => Err(k.bad(&key, format!("expected bools, found {other:?}"))),
            })
            .collect::<Result<_, _>>()?,
        Some(v) => return Err(k.bad(&key, format!("expected an array of bools, found {v:?}"))),
        None => {
            let ctx = k.u64("context_length")?;
            if ctx >= GLM_5_2_CONTEXT {
                return Err(k.bad(
                    &key,
                    format!(
                        "missing at a context of {ctx}: llama.cpp takes such a file as GLM-5.2, \
                         whose pattern of full and shared indexers it keeps built in; colibri \
                         needs the key"
                    ),
                ));
            }
            vec![true; layers as usize]
        }
    };
    if full.len() as u64 != layers {
        return Err(k.bad(&key, format!("{} entries for {layers} layers", full.len())));
    }
    if let Some(l) = (0..layers).find(|&l| has(l, "indexer.k_norm.weight") != full[l as usize]) {
        return Err(k.bad(
            &key,
            format!(
                "layer {l} is {} but {} blk.{l}.indexer.* tensors",
                if full[l as usize] { "full" } else { "shared" },
                if full[l as usize] { "has no" } else { "has" },
            ),
        ));
    }
    let kinds: Vec<&str> = full
        .iter()
        .map(|&f| if f { "full" } else { "shared" })
        .collect();
    put("indexer_types", json!(kinds));
    Ok(())
}
