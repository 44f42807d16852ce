//! `glm_moe_dsa` (GLM-5, GLM-5.2): transformers' `GlmMoeDsaConfig`, keys, defaults and derived
//! rules after `../shared/reference/glm_moe_dsa-forward.md` §1 and §4.3. MLA attention with
//! the DSA indexer on the layers `indexer_types` (or the older pattern keys) makes full, a
//! sigmoid router with correction bias (group-limited where `n_group` > 1), YaRN where
//! `rope_parameters` asks for it, shared experts. The
//! config predates the other families: without `model_type` a config is this family's.

use serde_json::Value;

use super::*;

pub(super) fn parse(c: &Keys<'_>) -> Result<ModelConfig, ConfigError> {
    let common = Common::parse(
        c,
        &Defaults {
            vocab: 154880,
            hidden: 6144,
            intermediate: 12288,
            moe_intermediate: 2048,
            layers: 78,
            heads: 64,
            experts: 256,
            norm_topk_prob: true,
            eps: 1e-5,
            max_positions: 202752,
            bos: Some(0),
        },
    )?;
    let layers = common.num_hidden_layers;
    mla_kv_heads(c, common.num_attention_heads)?;
    let n_shared_experts = c.usize_in("n_shared_experts", 1, 0, MAX_SHARED_EXPERTS)?;
    let routed_scaling_factor = scaling(c, 2.5)?;
    let kv_lora_rank = c.usize_in("kv_lora_rank", 512, 1, MAX_LORA_RANK)?;
    let q_lora_rank = c.usize_in("q_lora_rank", 2048, 1, MAX_LORA_RANK)?;
    let qk_rope_head_dim = c.usize_in("qk_rope_head_dim", 64, 1, MAX_HEAD_DIM)?;
    even_rotary("qk_rope_head_dim", qk_rope_head_dim)?;
    let qk_nope_head_dim = c.usize_in("qk_nope_head_dim", 192, 1, MAX_HEAD_DIM)?;
    let v_head_dim = c.usize_in("v_head_dim", 256, 1, MAX_HEAD_DIM)?;
    // GlmMoeDsa routes group-limited and reads YaRN as DeepSeek-V3 does (the published
    // checkpoints use neither: n_group 1, plain RoPE).
    let (n_group, topk_group) =
        super::glm4::expert_groups(c, common.n_routed_experts, common.num_experts_per_tok)?;
    let (rope_theta, yarn) = rope(c, common.max_position_embeddings)?;
    let mlp_layer_types = mlp_layer_types(c, layers)?;
    let indexer_types = indexer_types(c, layers)?;
    // GLM-5's indexer rotary is interleaved, as its MLA's.
    let indexer = dsa_indexer(c, qk_rope_head_dim, 32, indexer_types, false)?;
    Ok(common.finish(Parts {
        family: Family::GlmMoeDsa,
        attn: Attn::Mla(MlaConfig {
            kv_lora_rank,
            q_lora_rank: Some(q_lora_rank),
            qk_rope_head_dim,
            qk_nope_head_dim,
            v_head_dim,
            // GlmMoeDsaAttention always rotates interleaved pairs.
            rope_interleave: true,
            indexer: Some(indexer),
        }),
        router: RouterKind::SigmoidBias,
        n_shared_experts,
        routed_scaling_factor,
        n_group,
        topk_group,
        rope_theta,
        yarn,
        mlp_layer_types,
    }))
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
