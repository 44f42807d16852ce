//! `glm_moe_dsa` (GLM-5, GLM-5.2): transformers' `GlmMoeDsaConfig`, keys, defaults and derived
//! rules after `../shared/reference/glm_moe_dsa-forward.md` §1 and §4.3. MLA attention with
//! the DSA indexer on the layers `indexer_types` (or the older pattern keys) makes full, a
//! sigmoid router with correction bias and no group-limited routing, shared experts. The
//! config predates the other families: without `model_type` a config is this family's.

use serde_json::Value;

use super::*;

pub(super) fn parse(c: &Keys<'_>) -> Result<ModelConfig, ConfigError> {
    for key in ["n_group", "topk_group"] {
        if let Some(v) = c.get(key).filter(|v| !v.is_null()) {
            if c.uint(key, v)? != 1 {
                return Err(unsupported(
                    key,
                    v,
                    "group-limited routing is not implemented; it must be 1",
                ));
            }
        }
    }

    let vocab_size = c.usize_in("vocab_size", 154880, 1, MAX_VOCAB)?;
    let hidden_size = c.usize_in("hidden_size", 6144, 1, MAX_HIDDEN)?;
    let intermediate_size = c.usize_in("intermediate_size", 12288, 1, MAX_INTERMEDIATE)?;
    let moe_intermediate_size = c.usize_in("moe_intermediate_size", 2048, 1, MAX_INTERMEDIATE)?;
    let num_hidden_layers = c.usize_in("num_hidden_layers", 78, 1, MAX_LAYERS)?;
    let num_attention_heads = c.usize_in("num_attention_heads", 64, 1, MAX_HEADS)?;
    if let Some(v) = c.get("num_key_value_heads").filter(|v| !v.is_null()) {
        if c.uint("num_key_value_heads", v)? != num_attention_heads as u64 {
            return Err(unsupported(
                "num_key_value_heads",
                v,
                &format!(
                    "must equal num_attention_heads ({num_attention_heads}) for MLA attention"
                ),
            ));
        }
    }
    let n_shared_experts = c.usize_in("n_shared_experts", 1, 0, MAX_SHARED_EXPERTS)?;
    let n_routed_experts = routed_experts(c, 256)?;
    let num_experts_per_tok = c.usize_in("num_experts_per_tok", 8, 1, n_routed_experts)?;
    let routed_scaling_factor = c.f64_in(
        "routed_scaling_factor",
        2.5,
        "a finite number > 0 and <= 1e6",
        |x| x > 0.0 && x <= 1e6,
    )? as f32;
    let norm_topk_prob = c.bool_or("norm_topk_prob", true)?;
    let kv_lora_rank = c.usize_in("kv_lora_rank", 512, 1, MAX_LORA_RANK)?;
    let q_lora_rank = c.usize_in("q_lora_rank", 2048, 1, MAX_LORA_RANK)?;
    let qk_rope_head_dim = c.usize_in("qk_rope_head_dim", 64, 1, MAX_HEAD_DIM)?;
    even_rotary("qk_rope_head_dim", qk_rope_head_dim)?;
    let qk_nope_head_dim = c.usize_in("qk_nope_head_dim", 192, 1, MAX_HEAD_DIM)?;
    let v_head_dim = c.usize_in("v_head_dim", 256, 1, MAX_HEAD_DIM)?;
    let rms_norm_eps = norm_eps(c, 1e-5)?;
    let rope_theta = rope_theta(c)?;
    let attention_bias = c.bool_or("attention_bias", false)?;
    let index_topk = c.usize_in("index_topk", 2048, 1, MAX_INDEX_TOPK)?;
    let index_head_dim = c.usize_in("index_head_dim", 128, 1, MAX_HEAD_DIM)?;
    if index_head_dim < qk_rope_head_dim {
        return Err(ConfigError::Invalid {
            key: "index_head_dim".into(),
            value: index_head_dim.to_string(),
            why: format!(
                "the indexer head holds a RoPE part of qk_rope_head_dim ({qk_rope_head_dim}), \
                 so it must be at least that"
            ),
        });
    }
    let index_n_heads = c.usize_in("index_n_heads", 32, 1, MAX_HEADS)?;
    let max_position_embeddings =
        c.usize_in("max_position_embeddings", 202752, 1, MAX_POSITIONS)?;
    let tie_word_embeddings = c.bool_or("tie_word_embeddings", false)?;

    let mlp_layer_types = mlp_layer_types(c, num_hidden_layers)?;
    let indexer_types = indexer_types(c, num_hidden_layers)?;
    let eos_token_ids = eos_token_ids(c, vocab_size)?;
    let bos_token_id = match c.get("bos_token_id") {
        None => Some(0),
        Some(Value::Null) => None,
        Some(v) => Some(token_id(c, "bos_token_id", v, vocab_size)?),
    };

    Ok(ModelConfig {
        family: Family::GlmMoeDsa,
        gqa: None,
        router: RouterKind::SigmoidBias,
        n_group: 1,
        topk_group: 1,
        vocab_size,
        hidden_size,
        intermediate_size,
        moe_intermediate_size,
        num_hidden_layers,
        num_attention_heads,
        n_shared_experts,
        n_routed_experts,
        num_experts_per_tok,
        routed_scaling_factor,
        norm_topk_prob,
        kv_lora_rank,
        q_lora_rank,
        qk_rope_head_dim,
        qk_nope_head_dim,
        v_head_dim,
        rms_norm_eps,
        rope_theta,
        attention_bias,
        index_topk,
        index_head_dim,
        index_n_heads,
        mlp_layer_types,
        indexer_types,
        eos_token_ids,
        bos_token_id,
        max_position_embeddings,
        tie_word_embeddings,
        yarn: None,
    })
}

/// Explicit `indexer_types`, else `index_topk_pattern`, else the freq/offset rule (§4.3).
fn indexer_types(c: &Keys<'_>, layers: usize) -> Result<Vec<IndexerKind>, ConfigError> {
    let (key, kinds) = if let Some(v) = c.get("indexer_types").filter(|v| !v.is_null()) {
        let items = list_of_len("indexer_types", v, layers)?;
        let kinds = items
            .iter()
            .map(|item| match item.as_str() {
                Some("full") => Ok(IndexerKind::Full),
                Some("shared") => Ok(IndexerKind::Shared),
                _ => Err(unsupported(
                    "indexer_types",
                    item,
                    "entries must be \"full\" or \"shared\"",
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        ("indexer_types", kinds)
    } else if let Some(v) = c.get("index_topk_pattern").filter(|v| !v.is_null()) {
        ("index_topk_pattern", topk_pattern(v, layers)?)
    } else {
        let freq = c.usize_in("index_topk_freq", 1, 1, MAX_INDEX_FREQ)?;
        let offset = c.usize_in("index_skip_topk_offset", 2, 0, MAX_LAYERS)?;
        let kinds = (0..layers)
            .map(|i| {
                // full iff max(i - offset + 1, 0) % freq == 0
                let shifted = (i + 1).saturating_sub(offset);
                if shifted % freq == 0 {
                    IndexerKind::Full
                } else {
                    IndexerKind::Shared
                }
            })
            .collect();
        ("index_topk_freq", kinds)
    };
    if kinds.first() != Some(&IndexerKind::Full) {
        let value = c.get(key).map_or_else(|| "(default)".into(), show);
        return Err(ConfigError::Invalid {
            key: key.into(),
            value,
            why: "layer 0 must have a full indexer (a shared layer reuses an earlier one)".into(),
        });
    }
    Ok(kinds)
}

/// `index_topk_pattern`: a string of `F`/`S` characters or a list of "F"/"S"/"full"/"shared".
fn topk_pattern(v: &Value, layers: usize) -> Result<Vec<IndexerKind>, ConfigError> {
    const KEY: &str = "index_topk_pattern";
    let bad = || unsupported(KEY, v, "entries must be F (full) or S (shared)");
    let kinds: Vec<IndexerKind> = match v {
        Value::String(s) => {
            if s.chars().count() != layers {
                return Err(wrong_len(KEY, s.chars().count(), layers));
            }
            s.chars()
                .map(|ch| match ch {
                    'F' => Ok(IndexerKind::Full),
                    'S' => Ok(IndexerKind::Shared),
                    _ => Err(bad()),
                })
                .collect::<Result<_, _>>()?
        }
        Value::Array(_) => list_of_len(KEY, v, layers)?
            .iter()
            .map(|item| match item.as_str() {
                Some("F" | "full") => Ok(IndexerKind::Full),
                Some("S" | "shared") => Ok(IndexerKind::Shared),
                _ => Err(bad()),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(wrong_type(KEY, "a string of F/S characters or a list")),
    };
    Ok(kinds)
}
