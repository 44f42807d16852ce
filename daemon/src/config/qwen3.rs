//! `qwen3_moe` (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-480B): transformers'
//! `Qwen3MoeConfig`. Grouped-query attention with per-head q/k RMSNorm and full rotary over
//! the head, a softmax router (top-k renormalised when `norm_topk_prob`), no shared expert,
//! dense layers from `mlp_only_layers` and `decoder_sparse_step`; YaRN when `rope_scaling`
//! asks for it (the model card's recipe for contexts past 32k). `attention_bias` biases
//! o_proj as well as q/k/v (`gqa_moe.rs`).

use serde_json::Value;

use super::*;

pub(super) fn parse(c: &Keys<'_>) -> Result<ModelConfig, ConfigError> {
    let common = Common::parse(
        c,
        &Defaults {
            vocab: 151936,
            hidden: 2048,
            intermediate: 6144,
            moe_intermediate: 768,
            layers: 24,
            heads: 32,
            experts: 128,
            norm_topk_prob: false,
            eps: 1e-6,
            max_positions: 32768,
            bos: None,
        },
    )?;
    let heads = common.num_attention_heads;
    let kv_heads = c.usize_in("num_key_value_heads", 4, 1, heads)?;
    super::glm4::check_kv_heads(heads, kv_heads)?;
    // transformers: `head_dim` or hidden_size // num_attention_heads.
    let head_dim = c.usize_in("head_dim", common.hidden_size / heads, 2, MAX_HEAD_DIM)?;
    even_rotary("head_dim", head_dim)?;
    let (rope_theta, yarn) = rope(c, common.max_position_embeddings)?;
    if c.bool_or("use_sliding_window", false)? {
        return Err(unsupported(
            "use_sliding_window",
            &Value::Bool(true),
            "sliding-window attention is not implemented",
        ));
    }
    let mlp_layer_types = sparse_layers(c, common.num_hidden_layers)?;
    Ok(common.finish(Parts {
        family: Family::Qwen3Moe,
        attn: Attn::Gqa(GqaConfig {
            kv_heads,
            head_dim,
            rotary_dim: head_dim,
            qk_norm: true,
            qk_norm_whole: false,
        }),
        router: RouterKind::Softmax,
        // No shared expert, no routed scaling, no expert groups in this family.
        n_shared_experts: 0,
        routed_scaling_factor: 1.0,
        n_group: 1,
        topk_group: 1,
        rope_theta,
        yarn,
        mlp_layer_types,
    }))
}

/// transformers' rule: layer `i` is a mixture of experts unless it is in `mlp_only_layers`,
/// and only when `(i + 1) % decoder_sparse_step == 0`.
fn sparse_layers(c: &Keys<'_>, layers: usize) -> Result<Vec<MlpKind>, ConfigError> {
    const KEY: &str = "mlp_only_layers";
    let step = c.usize_in("decoder_sparse_step", 1, 1, MAX_LAYERS)?;
    let mut dense = vec![false; layers];
    match c.get(KEY) {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            for item in items {
                let l = c.usize_value(KEY, item, 0, layers - 1)?;
                dense[l] = true;
            }
        }
        Some(_) => return Err(wrong_type(KEY, "a list of layer indices")),
    }
    Ok((0..layers)
        .map(|i| {
            if !dense[i] && (i + 1) % step == 0 {
                MlpKind::Sparse
            } else {
                MlpKind::Dense
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::super::*;

    /// Qwen3-30B-A3B's config.json, as published (extra keys included).
    const QWEN3_30B: &str = r#"{
      "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false,
      "attention_dropout": 0.0, "bos_token_id": 151643, "decoder_sparse_step": 1,
      "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
      "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40960,
      "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe",
      "moe_intermediate_size": 768, "norm_topk_prob": true, "num_attention_heads": 32,
      "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
      "num_key_value_heads": 4, "output_router_logits": false, "rms_norm_eps": 1e-06,
      "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
      "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
      "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false,
      "vocab_size": 151936
    }"#;

    #[test]
    fn the_published_qwen3_30b_config_parses() {
        let c = ModelConfig::from_json(QWEN3_30B).unwrap();
        assert_eq!(c.family, Family::Qwen3Moe);
        assert_eq!(
            c.gqa().copied(),
            Some(GqaConfig {
                kv_heads: 4,
                head_dim: 128,
                rotary_dim: 128,
                qk_norm: true,
                qk_norm_whole: false
            })
        );
        assert_eq!(c.router, RouterKind::Softmax);
        assert_eq!((c.n_routed_experts, c.num_experts_per_tok), (128, 8));
        assert_eq!((c.n_sparse_layers(), c.n_shared_experts), (48, 0));
        assert_eq!(c.rope_theta, 1e6);
        assert_eq!(c.eos_token_ids, vec![151645]);
        assert!(c.norm_topk_prob);
    }

    fn with(key: &str, value: &str) -> Result<ModelConfig, ConfigError> {
        let mut v: serde_json::Value = serde_json::from_str(QWEN3_30B).unwrap();
        v[key] = serde_json::from_str(value).unwrap();
        ModelConfig::from_json(&v.to_string())
    }

    #[test]
    fn dense_layers_come_from_mlp_only_layers_and_the_sparse_step() {
        let c = with("mlp_only_layers", "[0, 47]").unwrap();
        assert_eq!(c.mlp_layer_types[0], MlpKind::Dense);
        assert_eq!(c.mlp_layer_types[47], MlpKind::Dense);
        assert_eq!(c.n_sparse_layers(), 46);
        let c = with("decoder_sparse_step", "2").unwrap();
        assert_eq!(c.mlp_layer_types[0], MlpKind::Dense);
        assert_eq!(c.mlp_layer_types[1], MlpKind::Sparse);
        assert_eq!(c.n_sparse_layers(), 24);
    }

    /// The model card's recipe for contexts past 32k, in both legacy spellings and in
    /// transformers 5's: YaRN of factor 4 over 32768, cos and sin scaled by 0.1 ln 4 + 1, the
    /// softmax scale left alone (only MLA scales it).
    #[test]
    fn the_model_cards_yarn_is_read_in_every_spelling() {
        assert_eq!(ModelConfig::from_json(QWEN3_30B).unwrap().yarn, None);
        let card =
            r#"{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}"#;
        let c = with("rope_scaling", card).unwrap();
        let y = c.yarn.unwrap();
        assert_eq!(
            (y.factor, y.original_max_position_embeddings),
            (4.0, 32768.0)
        );
        assert_eq!((y.beta_fast, y.beta_slow, y.truncate), (32.0, 1.0, true));
        assert_eq!(y.attention_factor, 0.1 * 4f64.ln() + 1.0);
        assert_eq!(y.softmax_factor(), 1.0);
        assert_eq!(c.rope_theta, 1e6);
        let older = card.replace("rope_type", "type");
        assert_eq!(with("rope_scaling", &older).unwrap().yarn, c.yarn);
        let mut v: serde_json::Value = serde_json::from_str(QWEN3_30B).unwrap();
        let o = v.as_object_mut().unwrap();
        o.remove("rope_scaling");
        o.remove("rope_theta");
        let mut p: serde_json::Value = serde_json::from_str(card).unwrap();
        p["rope_theta"] = 1e6.into();
        o.insert("rope_parameters".into(), p);
        let v5 = ModelConfig::from_json(&v.to_string()).unwrap();
        assert_eq!((v5.yarn, v5.rope_theta), (c.yarn, 1e6));
        // The card's key added beside transformers 5's plain `rope_parameters`: transformers
        // would run YaRN at theta 10000, the file seems to say plain RoPE at 1e6. Refused.
        v["rope_parameters"] = serde_json::json!({"rope_type": "default", "rope_theta": 1e6});
        v["rope_scaling"] = serde_json::from_str(card).unwrap();
        let e = ModelConfig::from_json(&v.to_string())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"rope_scaling\" = {") && e.contains("rope_parameters says otherwise"),
            "{e}"
        );
        // The same object under both keys says one thing.
        v["rope_parameters"] = v["rope_scaling"].clone();
        assert_eq!(ModelConfig::from_json(&v.to_string()).unwrap().yarn, c.yarn);
    }

    #[test]
    fn bad_qwen3_configs_name_the_key_and_what_is_allowed() {
        let e = with("num_key_value_heads", "5").unwrap_err().to_string();
        assert!(
            e.contains("\"num_key_value_heads\" = 5")
                && e.contains("must divide num_attention_heads (32)"),
            "{e}"
        );
        let e = with("num_experts_per_tok", "200").unwrap_err().to_string();
        assert!(
            e.contains("\"num_experts_per_tok\" = 200") && e.contains("1..=128"),
            "{e}"
        );
        let e = with("mlp_only_layers", "[48]").unwrap_err().to_string();
        assert!(
            e.contains("\"mlp_only_layers\" = 48") && e.contains("0..=47"),
            "{e}"
        );
        let e = with("head_dim", "127").unwrap_err().to_string();
        assert!(
            e.contains("\"head_dim\" = 127") && e.contains("even"),
            "{e}"
        );
        let e = with("rope_scaling", r#"{"rope_type": "dynamic", "factor": 4.0}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rope_scaling.rope_type") && e.contains("\"yarn\""),
            "{e}"
        );
        let e = with("rope_scaling", r#"{"rope_type": "yarn", "factor": 4.0}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rope_scaling.original_max_position_embeddings"),
            "{e}"
        );
        let e = with("use_sliding_window", "true").unwrap_err().to_string();
        assert!(e.contains("sliding-window"), "{e}");
    }

    #[test]
    fn an_unknown_model_type_lists_the_families() {
        let e = ModelConfig::from_json(r#"{"model_type": "llama"}"#)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "config.json: \"model_type\" = \"llama\" is not supported: the families this engine runs are \"glm_moe_dsa\", \"deepseek_v32\", \"deepseek_v3\", \"glm4_moe\", \"qwen3_moe\", \"minimax_m2\", \"gpt_oss\", \"qwen3_5_moe\", \"deepseek_v4\""
        );
    }
}
