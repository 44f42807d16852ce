//! `glm4_moe` (GLM-4.5, 4.6, 4.7 and GLM-4.5-Air): transformers' `Glm4MoeConfig`.
//! Grouped-query attention with biased q/k/v projections (`attention_bias`; o_proj never
//! biased), optional per-head q/k RMSNorm (`use_qk_norm`), rotary on the first
//! `partial_rotary_factor` of each head (rotate-half; YaRN, when configured, over that rotated
//! part); a sigmoid router with `e_score_correction_bias`, group-limited routing (`n_group`,
//! `topk_group`) and `routed_scaling_factor`; a shared expert; the first
//! `first_k_dense_replace` layers dense.

use serde_json::Value;

use super::*;

pub(super) fn parse(c: &Keys<'_>) -> Result<ModelConfig, ConfigError> {
    let common = Common::parse(
        c,
        &Defaults {
            vocab: 151552,
            hidden: 4096,
            intermediate: 10944,
            moe_intermediate: 1408,
            layers: 46,
            heads: 96,
            experts: 128,
            norm_topk_prob: true,
            eps: 1e-5,
            max_positions: 131072,
            bos: None,
        },
    )?;
    let heads = common.num_attention_heads;
    let kv_heads = c.usize_in("num_key_value_heads", 8, 1, heads)?;
    check_kv_heads(heads, kv_heads)?;
    let head_dim = c.usize_in("head_dim", common.hidden_size / heads, 2, MAX_HEAD_DIM)?;
    let rotary_dim = partial_rotary(c, head_dim, 0.5)?;
    let n_shared_experts = c.usize_in("n_shared_experts", 1, 0, MAX_SHARED_EXPERTS)?;
    let routed_scaling_factor = scaling(c, 1.0)?;
    let (n_group, topk_group) =
        expert_groups(c, common.n_routed_experts, common.num_experts_per_tok)?;
    let (rope_theta, yarn) = rope(c, common.max_position_embeddings)?;
    let qk_norm = c.bool_or("use_qk_norm", false)?;
    let mlp_layer_types = first_k_dense(c, common.num_hidden_layers, 1)?;
    Ok(common.finish(Parts {
        family: Family::Glm4Moe,
        attn: Attn::Gqa(GqaConfig {
            kv_heads,
            head_dim,
            rotary_dim,
            qk_norm,
            qk_norm_whole: false,
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

/// Each key-value head serves a whole group of query heads.
pub(super) fn check_kv_heads(heads: usize, kv_heads: usize) -> Result<(), ConfigError> {
    if !heads.is_multiple_of(kv_heads) {
        return Err(ConfigError::Invalid {
            key: "num_key_value_heads".into(),
            value: kv_heads.to_string(),
            why: format!(
                "it must divide num_attention_heads ({heads}): each key-value head serves a whole group of query heads"
            ),
        });
    }
    Ok(())
}

/// `partial_rotary_factor` (top level, or in `rope_parameters`; `default` when absent, as
/// transformers defaults it for the family: 0.5 here): the rotated width of a head, even and
/// >= 2.
pub(super) fn partial_rotary(
    c: &Keys<'_>,
    head_dim: usize,
    default: f64,
) -> Result<usize, ConfigError> {
    const RULE: &str = "a number in (0, 1]";
    let ok = |x: f64| x > 0.0 && x <= 1.0;
    // transformers 5 reads the factor inside `rope_parameters`, or inside the older
    // `rope_scaling` it turns into `rope_parameters`, as well as at the top level.
    let nested = ["rope_parameters", "rope_scaling"]
        .into_iter()
        .find_map(|block| match c.get(block) {
            Some(Value::Object(p)) => p
                .get("partial_rotary_factor")
                .filter(|v| !v.is_null())
                .map(|v| (block, v)),
            _ => None,
        });
    let top = c.get("partial_rotary_factor").filter(|v| !v.is_null());
    let factor = match (top, nested) {
        (Some(v), Some((block, w))) if v.as_f64() != w.as_f64() => {
            return Err(ConfigError::Invalid {
                key: format!("{block}.partial_rotary_factor"),
                value: w.to_string(),
                why: format!(
                    "the top-level partial_rotary_factor is {v}; give one value, in one place"
                ),
            })
        }
        (Some(v), _) => c.f64_value("partial_rotary_factor", v, RULE, ok)?,
        (None, Some((block, v))) => {
            c.f64_value(&format!("{block}.partial_rotary_factor"), v, RULE, ok)?
        }
        (None, None) => default,
    };
    // transformers: int(head_dim * partial_rotary_factor).
    let dim = (head_dim as f64 * factor) as usize;
    if dim < 2 || !dim.is_multiple_of(2) {
        return Err(ConfigError::Invalid {
            key: "partial_rotary_factor".into(),
            value: factor.to_string(),
            why: format!(
                "it rotates {dim} of head_dim {head_dim} values; rotary rotates pairs, so that must be even and at least 2"
            ),
        });
    }
    Ok(dim)
}

/// `n_group` and `topk_group`: the experts split evenly into groups, at least as many groups
/// kept as the top-k needs.
pub(super) fn expert_groups(
    c: &Keys<'_>,
    experts: usize,
    top_k: usize,
) -> Result<(usize, usize), ConfigError> {
    let n_group = c.usize_in("n_group", 1, 1, experts)?;
    if !experts.is_multiple_of(n_group) {
        return Err(ConfigError::Invalid {
            key: "n_group".into(),
            value: n_group.to_string(),
            why: format!("it must divide the {experts} routed experts into equal groups"),
        });
    }
    let topk_group = c.usize_in("topk_group", 1.min(n_group), 1, n_group)?;
    let per_group = experts / n_group;
    if topk_group * per_group < top_k {
        return Err(ConfigError::Invalid {
            key: "topk_group".into(),
            value: topk_group.to_string(),
            why: format!(
                "{topk_group} groups of {per_group} experts cannot hold num_experts_per_tok ({top_k}) experts"
            ),
        });
    }
    if n_group > 1 && per_group < 2 {
        return Err(ConfigError::Invalid {
            key: "n_group".into(),
            value: n_group.to_string(),
            why: "a group is scored by its two best experts, so it needs at least two".into(),
        });
    }
    Ok((n_group, topk_group))
}

#[cfg(test)]
mod tests {
    use super::super::*;

    /// GLM-4.5-Air's config.json, as published (extra keys included).
    const GLM45_AIR: &str = r#"{
      "architectures": ["Glm4MoeForCausalLM"], "attention_bias": true,
      "attention_dropout": 0.0, "pad_token_id": 151329,
      "eos_token_id": [151329, 151336, 151338], "head_dim": 128, "hidden_act": "silu",
      "hidden_size": 4096, "partial_rotary_factor": 0.5, "initializer_range": 0.02,
      "intermediate_size": 10944, "max_position_embeddings": 131072, "model_type": "glm4_moe",
      "moe_intermediate_size": 1408, "norm_topk_prob": true, "num_attention_heads": 96,
      "n_group": 1, "topk_group": 1, "n_routed_experts": 128, "n_shared_experts": 1,
      "routed_scaling_factor": 1.0, "num_experts_per_tok": 8, "first_k_dense_replace": 1,
      "num_hidden_layers": 46, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
      "rope_scaling": null, "rope_theta": 1000000, "num_nextn_predict_layers": 1,
      "tie_word_embeddings": false, "torch_dtype": "bfloat16",
      "transformers_version": "4.54.0", "use_cache": true, "use_qk_norm": false,
      "vocab_size": 151552
    }"#;

    /// GLM-4.5-Air's config with `drop` removed and the RoPE block `block` set to `rope`.
    fn air_rope(drop: &[&str], block: &str, rope: serde_json::Value) -> serde_json::Value {
        let mut v: serde_json::Value = serde_json::from_str(GLM45_AIR).unwrap();
        let o = v.as_object_mut().unwrap();
        for k in drop {
            o.remove(*k);
        }
        o.insert(block.into(), rope);
        v
    }

    fn with(key: &str, value: &str) -> Result<ModelConfig, ConfigError> {
        let mut v: serde_json::Value = serde_json::from_str(GLM45_AIR).unwrap();
        v[key] = serde_json::from_str(value).unwrap();
        ModelConfig::from_json(&v.to_string())
    }

    #[test]
    fn the_published_glm45_air_config_parses() {
        let c = ModelConfig::from_json(GLM45_AIR).unwrap();
        assert_eq!(c.family, Family::Glm4Moe);
        assert_eq!(
            c.gqa().copied(),
            Some(GqaConfig {
                kv_heads: 8,
                head_dim: 128,
                rotary_dim: 64,
                qk_norm: false,
                qk_norm_whole: false
            })
        );
        assert_eq!(c.router, RouterKind::SigmoidBias);
        assert_eq!((c.n_routed_experts, c.n_shared_experts), (128, 1));
        assert_eq!((c.n_group, c.topk_group), (1, 1));
        assert_eq!(c.mlp_layer_types[0], MlpKind::Dense);
        assert_eq!(c.n_sparse_layers(), 45);
        assert!(c.attention_bias);
        assert_eq!(c.eos_token_ids, vec![151329, 151336, 151338]);
    }

    #[test]
    fn the_rotary_share_may_sit_in_rope_parameters() {
        let v = air_rope(
            &["partial_rotary_factor", "rope_theta"],
            "rope_parameters",
            serde_json::json!({"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25}),
        );
        let c = ModelConfig::from_json(&v.to_string()).unwrap();
        assert_eq!(c.gqa().unwrap().rotary_dim, 32);
        assert_eq!(c.rope_theta, 1e6);
    }

    /// YaRN beside the rotary share in `rope_parameters`: the ramp's width is the rotated part
    /// of a head (the model builds its rotary from `rotary_dim`), betas and `truncate` as set.
    #[test]
    fn the_rotary_share_is_read_inside_rope_scaling_too() {
        // Found by scripts/sweep_families.py: transformers 5 reads it there; colibri took
        // the default 0.5 and was silently wrong (long case 60/64 teacher-forced).
        let mut v = air_rope(
            &["partial_rotary_factor"],
            "rope_scaling",
            serde_json::json!({"rope_type": "default", "partial_rotary_factor": 0.25}),
        );
        let c = ModelConfig::from_json(&v.to_string()).unwrap();
        assert_eq!(c.gqa().unwrap().rotary_dim, 32);
        // The same value in two places is one value; two values are refused by name.
        let o = v.as_object_mut().unwrap();
        o.insert("partial_rotary_factor".into(), serde_json::json!(0.25));
        assert_eq!(
            ModelConfig::from_json(&v.to_string())
                .unwrap()
                .gqa()
                .unwrap()
                .rotary_dim,
            32
        );
        let o = v.as_object_mut().unwrap();
        o.insert("partial_rotary_factor".into(), serde_json::json!(0.5));
        let e = ModelConfig::from_json(&v.to_string())
            .unwrap_err()
            .to_string();
        assert!(e.contains("rope_scaling.partial_rotary_factor"), "{e}");
    }

    #[test]
    fn yarn_sits_beside_the_rotary_share() {
        assert_eq!(ModelConfig::from_json(GLM45_AIR).unwrap().yarn, None);
        let v = air_rope(
            &["partial_rotary_factor", "rope_theta"],
            "rope_parameters",
            serde_json::json!({"rope_type": "yarn", "rope_theta": 1e6,
                "partial_rotary_factor": 0.5, "factor": 4.0,
                "original_max_position_embeddings": 32768, "beta_fast": 8, "beta_slow": 2,
                "truncate": false}),
        );
        let c = ModelConfig::from_json(&v.to_string()).unwrap();
        assert_eq!(c.gqa().unwrap().rotary_dim, 64);
        let y = c.yarn.unwrap();
        assert_eq!((y.factor, y.beta_fast, y.beta_slow), (4.0, 8.0, 2.0));
        assert!(!y.truncate);
        let c = with(
            "rope_scaling",
            r#"{"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 65536}"#,
        )
        .unwrap();
        assert_eq!(c.yarn.unwrap().attention_factor, 0.1 * 2f64.ln() + 1.0);
        let e = with("rope_scaling", r#"{"type": "linear", "factor": 2.0}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rope_scaling.rope_type") && e.contains("\"linear\""),
            "{e}"
        );
    }

    #[test]
    fn bad_glm4_configs_name_the_key_and_what_is_allowed() {
        let e = with("num_key_value_heads", "7").unwrap_err().to_string();
        assert!(e.contains("must divide num_attention_heads (96)"), "{e}");
        let e = with("partial_rotary_factor", "1.5")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"partial_rotary_factor\" = 1.5") && e.contains("(0, 1]"),
            "{e}"
        );
        let e = with("n_group", "3").unwrap_err().to_string();
        assert!(
            e.contains("\"n_group\" = 3") && e.contains("128 routed experts"),
            "{e}"
        );
        let c = with("n_group", "8").unwrap();
        assert_eq!((c.n_group, c.topk_group), (8, 1));
        let mut v: serde_json::Value = serde_json::from_str(GLM45_AIR).unwrap();
        v["n_group"] = 64.into();
        v["topk_group"] = 2.into();
        let e = ModelConfig::from_json(&v.to_string())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"topk_group\" = 2") && e.contains("cannot hold num_experts_per_tok (8)"),
            "{e}"
        );
        let e = with("num_experts_per_tok", "129").unwrap_err().to_string();
        assert!(e.contains("1..=128"), "{e}");
    }
}
