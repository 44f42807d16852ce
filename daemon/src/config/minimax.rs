//! `minimax_m2` (MiniMax-M2, M2.1, M2.5, M2.7: 230B-A10B): transformers' `MiniMaxM2Config`.
//! Grouped-query attention without biases, q/k RMSNorm over the whole projection (all heads at
//! once, one weight per value: `qk_norm_type` `per_layer`, where Qwen3's norm is per head),
//! rotary on the first `rotary_dim` values of each head (rotate-half); a sigmoid router with
//! `e_score_correction_bias`, the top-k weights always renormalised, no routed scaling, no
//! expert groups, no shared expert; every layer a mixture of experts of width
//! `intermediate_size` (there is no dense MLP in this family).
//!
//! Keys of the original remote code that transformers' class does not read are checked
//! against the one value transformers implements, so a config written for another variant
//! (MiniMax-Text-01's lightning attention layers, a per-head q/k norm, a shared expert) is
//! refused by name instead of run as something else. The MTP modules (`use_mtp`,
//! `num_mtp_modules`) are not in the published safetensors and transformers does not run
//! them: they are ignored, as there.

use serde_json::Value;

use super::*;

pub(super) fn parse(c: &Keys<'_>) -> Result<ModelConfig, ConfigError> {
    let mut common = Common::parse(
        c,
        &Defaults {
            vocab: 200064,
            hidden: 3072,
            intermediate: 1536,
            moe_intermediate: 1536,
            layers: 62,
            heads: 48,
            experts: 256,
            norm_topk_prob: true,
            eps: 1e-6,
            max_positions: 196608,
            bos: Some(200034),
        },
    )?;
    // MiniMaxM2Experts are `intermediate_size` wide; transformers reads no
    // `moe_intermediate_size` here, always renormalises the top-k weights and builds every
    // projection without a bias, whatever the file says.
    common.moe_intermediate_size = common.intermediate_size;
    common.norm_topk_prob = true;
    common.attention_bias = false;
    let heads = common.num_attention_heads;
    let kv_heads = c.usize_in("num_key_value_heads", 8, 1, heads)?;
    super::glm4::check_kv_heads(heads, kv_heads)?;
    let head_dim = c.usize_in("head_dim", 128, 2, MAX_HEAD_DIM)?;
    let rotary_dim = rotary_dim(c, head_dim)?;
    let (rope_theta, yarn) = rope(c, common.max_position_embeddings)?;
    only(
        "scoring_func",
        c,
        &Value::from("sigmoid"),
        "the router's scores are sigmoids",
    )?;
    only(
        "use_routing_bias",
        c,
        &Value::Bool(true),
        "transformers' MiniMaxM2 always selects by score + e_score_correction_bias",
    )?;
    only(
        "use_qk_norm",
        c,
        &Value::Bool(true),
        "transformers' MiniMaxM2 always RMSNorms queries and keys",
    )?;
    only(
        "qk_norm_type",
        c,
        &Value::from("per_layer"),
        "the q/k RMSNorm spans the whole projection (a per-head norm is another family's)",
    )?;
    only(
        "shared_intermediate_size",
        c,
        &Value::from(0),
        "MiniMax-M2 has no shared expert",
    )?;
    attn_types(c, common.num_hidden_layers)?;
    let layers = common.num_hidden_layers;
    Ok(common.finish(Parts {
        family: Family::MiniMaxM2,
        attn: Attn::Gqa(GqaConfig {
            kv_heads,
            head_dim,
            rotary_dim,
            qk_norm: true,
            qk_norm_whole: true,
        }),
        router: RouterKind::SigmoidBias,
        n_shared_experts: 0,
        routed_scaling_factor: 1.0,
        n_group: 1,
        topk_group: 1,
        rope_theta,
        yarn,
        mlp_layer_types: vec![MlpKind::Sparse; layers],
    }))
}

/// `key`, when written (and not null), must be `allowed`: the only value transformers runs.
fn only(key: &str, c: &Keys<'_>, allowed: &Value, why: &str) -> Result<(), ConfigError> {
    match c.get(key).filter(|v| !v.is_null()) {
        Some(v) if v != allowed => Err(unsupported(
            key,
            v,
            &format!("only {allowed} is implemented: {why}"),
        )),
        _ => Ok(()),
    }
}

/// The rotated width of a head: `rotary_dim` (the published configs), or
/// `partial_rotary_factor` (top level or in `rope_parameters`, as transformers 5 writes it
/// back) times `head_dim`, or the whole head when neither is given (transformers' default
/// factor 1.0). Given both, they must agree.
fn rotary_dim(c: &Keys<'_>, head_dim: usize) -> Result<usize, ConfigError> {
    let factor_at = |block: Option<&str>| -> Option<(String, &Value)> {
        let v = match block {
            None => c.get("partial_rotary_factor"),
            Some(b) => match c.get(b) {
                Some(Value::Object(p)) => p.get("partial_rotary_factor"),
                _ => None,
            },
        }?;
        let key = block.map_or("partial_rotary_factor".to_string(), |b| {
            format!("{b}.partial_rotary_factor")
        });
        (!v.is_null()).then_some((key, v))
    };
    let mut factors = Vec::new();
    for block in [None, Some("rope_parameters"), Some("rope_scaling")] {
        if let Some((key, v)) = factor_at(block) {
            let f = c.f64_value(&key, v, "a number in (0, 1]", |x| x > 0.0 && x <= 1.0)?;
            factors.push((key, f));
        }
    }
    // The width and the key that gave it (what a refusal names).
    let (dim, key, value) = match c.get("rotary_dim").filter(|v| !v.is_null()) {
        Some(v) => {
            let d = c.usize_value("rotary_dim", v, 2, head_dim)?;
            (d, "rotary_dim".to_string(), d.to_string())
        }
        // transformers: int(head_dim * partial_rotary_factor).
        None => match factors.first() {
            Some((k, f)) => ((head_dim as f64 * f) as usize, k.clone(), f.to_string()),
            None => return Ok(head_dim),
        },
    };
    if dim < 2 || !dim.is_multiple_of(2) {
        return Err(ConfigError::Invalid {
            key,
            value,
            why: format!(
                "it rotates {dim} of head_dim {head_dim} values; rotary rotates pairs, so that \
                 must be even and at least 2"
            ),
        });
    }
    for (k, f) in &factors {
        let d = (head_dim as f64 * f) as usize;
        if d != dim {
            return Err(ConfigError::Invalid {
                key: k.clone(),
                value: f.to_string(),
                why: format!(
                    "it rotates {d} of head_dim {head_dim} values where {key} rotates {dim}; \
                     give one width"
                ),
            });
        }
    }
    Ok(dim)
}

/// `attn_type_list`: one entry per layer, 1 (softmax attention) on every one. MiniMax-Text-01
/// writes 0 for its lightning (linear) attention layers, which this engine does not run.
fn attn_types(c: &Keys<'_>, layers: usize) -> Result<(), ConfigError> {
    const KEY: &str = "attn_type_list";
    let Some(v) = c.get(KEY).filter(|v| !v.is_null()) else {
        return Ok(());
    };
    let items = list_of_len(KEY, v, layers)?;
    for (l, item) in items.iter().enumerate() {
        if item.as_u64() != Some(1) {
            return Err(unsupported(
                &format!("{KEY}[{l}]"),
                item,
                "only 1 (softmax attention) is implemented; 0 is MiniMax-Text-01's lightning \
                 attention",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::*;

    /// MiniMax-M2.7's config.json as published (`tests/fixtures/configs/minimax-m2.7.json`;
    /// M2's architecture, with the FP8 `quantization_config`).
    const M2: &str = include_str!("../../../tests/fixtures/configs/minimax-m2.7.json");

    fn with(key: &str, value: &str) -> Result<ModelConfig, ConfigError> {
        let mut v: serde_json::Value = serde_json::from_str(M2).unwrap();
        v[key] = serde_json::from_str(value).unwrap();
        ModelConfig::from_json(&v.to_string())
    }

    #[test]
    fn the_published_minimax_m2_config_parses() {
        let c = ModelConfig::from_json(M2).unwrap();
        assert_eq!(c.family, Family::MiniMaxM2);
        assert_eq!(
            c.gqa().copied(),
            Some(GqaConfig {
                kv_heads: 8,
                head_dim: 128,
                rotary_dim: 64,
                qk_norm: true,
                qk_norm_whole: true,
            })
        );
        assert_eq!(c.router, RouterKind::SigmoidBias);
        assert_eq!((c.n_routed_experts, c.num_experts_per_tok), (256, 8));
        assert_eq!((c.n_sparse_layers(), c.n_shared_experts), (62, 0));
        assert_eq!((c.moe_intermediate_size, c.hidden_size), (1536, 3072));
        assert_eq!((c.rope_theta, c.yarn), (5e6, None));
        assert!(c.norm_topk_prob && !c.attention_bias);
        assert_eq!(c.routed_scaling_factor, 1.0);
    }

    #[test]
    fn the_rotary_width_may_be_a_factor_and_must_agree() {
        let mut v: serde_json::Value = serde_json::from_str(M2).unwrap();
        let o = v.as_object_mut().unwrap();
        o.remove("rotary_dim");
        o.remove("rope_theta");
        o.insert(
            "rope_parameters".into(),
            serde_json::json!({"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.25}),
        );
        let c = ModelConfig::from_json(&v.to_string()).unwrap();
        assert_eq!(c.gqa().unwrap().rotary_dim, 32);
        v["rotary_dim"] = 64.into();
        let e = ModelConfig::from_json(&v.to_string())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"rope_parameters.partial_rotary_factor\" = 0.25")
                && e.contains("where rotary_dim rotates 64"),
            "{e}"
        );
        // Neither given: the whole head, as transformers' default factor 1.0.
        let o = v.as_object_mut().unwrap();
        o.remove("rotary_dim");
        o.insert(
            "rope_parameters".into(),
            serde_json::json!({"rope_type": "default", "rope_theta": 5e6}),
        );
        let c = ModelConfig::from_json(&v.to_string()).unwrap();
        assert_eq!(c.gqa().unwrap().rotary_dim, 128);
    }

    #[test]
    fn bad_minimax_configs_name_the_key_and_what_is_allowed() {
        let cases = [
            ("scoring_func", "\"softmax\"", "only \"sigmoid\""),
            ("use_routing_bias", "false", "only true"),
            ("use_qk_norm", "false", "only true"),
            ("qk_norm_type", "\"per_head\"", "only \"per_layer\""),
            ("shared_intermediate_size", "1536", "no shared expert"),
            ("rotary_dim", "63", "even"),
            ("rotary_dim", "256", "2..=128"),
            (
                "num_key_value_heads",
                "7",
                "must divide num_attention_heads (48)",
            ),
            ("attn_type_list", "[1, 1]", "62"),
        ];
        for (key, value, says) in cases {
            let e = with(key, value).unwrap_err().to_string();
            assert!(
                e.contains(&format!("\"{key}\"")) && e.contains(says),
                "{key}: {e}"
            );
        }
        let mut v: serde_json::Value = serde_json::from_str(M2).unwrap();
        v["attn_type_list"][7] = 0.into();
        let e = ModelConfig::from_json(&v.to_string())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"attn_type_list[7]\" = 0") && e.contains("lightning"),
            "{e}"
        );
    }
}
