//! `deepseek_v3` (DeepSeek-V3, R1, V3.1; Kimi K2 ships the same layout): transformers'
//! `DeepseekV3Config`. GLM-5's MLA without the DSA indexer (every key attended), interleaved
//! rotary (`rope_interleave`), YaRN (`rope_scaling` or `rope_parameters` of type yarn, with
//! `mscale` / `mscale_all_dim`), a sigmoid router with correction bias and group-limited
//! routing, a shared expert, the first `first_k_dense_replace` layers dense.

use serde_json::Value;

use super::*;

/// `deepseek_v32` (DeepSeek-V3.2): DeepSeek-V3 plus a DSA indexer on every layer
/// (`index_topk`, `index_head_dim`, `index_n_heads`; GLM-5's indexer with rotate-half rotary).
pub(super) fn parse_v32(c: &Keys<'_>) -> Result<ModelConfig, ConfigError> {
    parse_as(c, Family::DeepseekV32)
}

pub(super) fn parse(c: &Keys<'_>) -> Result<ModelConfig, ConfigError> {
    parse_as(c, Family::DeepseekV3)
}

/// The two share every key but the indexer's, which only DeepSeek-V3.2 reads.
fn parse_as(c: &Keys<'_>, family: Family) -> Result<ModelConfig, ConfigError> {
    let common = Common::parse(
        c,
        &Defaults {
            vocab: 129280,
            hidden: 7168,
            intermediate: 18432,
            moe_intermediate: 2048,
            layers: 61,
            heads: 128,
            experts: 256,
            norm_topk_prob: true,
            eps: 1e-6,
            max_positions: 4096,
            bos: None,
        },
    )?;
    let layers = common.num_hidden_layers;
    mla_kv_heads(c, common.num_attention_heads)?;
    // false: DeepseekV3Attention rotates halves (`apply_rotary_pos_emb`) instead of pairs.
    // DeepseekV32Attention always rotates pairs, whatever the key says (found by the sweep).
    let rope_interleave = family == Family::DeepseekV32 || c.bool_or("rope_interleave", true)?;
    // null: one unfactored q_proj (DeepSeek-V2-Lite, Moonlight).
    let q_lora_rank = match c.get("q_lora_rank") {
        Some(Value::Null) => None,
        _ => Some(c.usize_in("q_lora_rank", 1536, 1, MAX_LORA_RANK)?),
    };
    let kv_lora_rank = c.usize_in("kv_lora_rank", 512, 1, MAX_LORA_RANK)?;
    let qk_rope_head_dim = c.usize_in("qk_rope_head_dim", 64, 2, MAX_HEAD_DIM)?;
    even_rotary("qk_rope_head_dim", qk_rope_head_dim)?;
    let qk_nope_head_dim = c.usize_in("qk_nope_head_dim", 128, 1, MAX_HEAD_DIM)?;
    let v_head_dim = c.usize_in("v_head_dim", 128, 1, MAX_HEAD_DIM)?;
    let n_shared_experts = c.usize_in("n_shared_experts", 1, 0, MAX_SHARED_EXPERTS)?;
    let routed_scaling_factor = scaling(c, 2.5)?;
    let (n_group, topk_group) =
        super::glm4::expert_groups(c, common.n_routed_experts, common.num_experts_per_tok)?;
    let (rope_theta, yarn) = rope(c, common.max_position_embeddings)?;
    let mut mlp_layer_types = first_k_dense(c, layers, 3.min(layers))?;
    // No DSA indexer in DeepSeek-V3: every layer attends to every key.
    let mut indexer = None;
    if family == Family::DeepseekV32 {
        if q_lora_rank.is_none() {
            return Err(unsupported(
                "q_lora_rank",
                &Value::Null,
                "DeepSeek-V3.2's indexer reads the query's low-rank residual (indexer.wq_b \
                 takes q_lora_rank inputs), so it must be a rank",
            ));
        }
        // Unlike DeepseekV3Config, DeepseekV32Config reads `mlp_layer_types` (one "dense" or
        // "sparse" per layer) and only without it places first_k_dense_replace dense layers
        // first.
        mlp_layer_types = super::mlp_layer_types(c, layers)?;
        // Every layer has its own indexer; its rotary pairs halves (GLM-5's interleaves).
        let full = vec![IndexerKind::Full; layers];
        indexer = Some(dsa_indexer(c, qk_rope_head_dim, 64, full, true)?);
    }
    Ok(common.finish(Parts {
        family,
        attn: Attn::Mla(MlaConfig {
            kv_lora_rank,
            q_lora_rank,
            qk_rope_head_dim,
            qk_nope_head_dim,
            v_head_dim,
            rope_interleave,
            indexer,
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

#[cfg(test)]
mod tests {
    use super::super::*;

    /// DeepSeek-V3's config.json, as published (legacy `rope_scaling` spelling, FP8
    /// `quantization_config`, extra keys).
    const DEEPSEEK_V3: &str = r#"{
      "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false,
      "attention_dropout": 0.0, "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config"},
      "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1,
      "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
      "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
      "max_position_embeddings": 163840, "model_type": "deepseek_v3",
      "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8,
      "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true,
      "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
      "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
      "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
      "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
        "quant_method": "fp8", "weight_block_size": [128, 128]},
      "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40,
        "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
        "type": "yarn"},
      "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
      "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc",
      "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": true,
      "v_head_dim": 128, "vocab_size": 129280
    }"#;

    #[test]
    fn the_published_deepseek_v3_config_parses() {
        let c = ModelConfig::from_json(DEEPSEEK_V3).unwrap();
        assert_eq!(c.family, Family::DeepseekV3);
        assert!(c.gqa().is_none() && c.indexer().is_none());
        assert_eq!((c.n_group, c.topk_group), (8, 4));
        let m = c.mla().unwrap();
        assert_eq!(
            (m.kv_lora_rank, m.q_lora_rank, m.qk_rope_head_dim),
            (512, Some(1536), 64)
        );
        assert_eq!(c.n_sparse_layers(), 58);
        assert_eq!(c.routed_scaling_factor, 2.5);
        let y = c.yarn.unwrap();
        assert_eq!(
            (y.factor, y.original_max_position_embeddings),
            (40.0, 4096.0)
        );
        // mscale == mscale_all_dim: cos/sin unscaled, the softmax by (0.1 ln 40 + 1)^2.
        assert_eq!(y.attention_factor, 1.0);
        let m = 0.1 * 40f64.ln() + 1.0;
        assert!((y.softmax_factor() - m * m).abs() < 1e-12);
        assert_eq!(c.indexer_kind(60), IndexerKind::Shared);
    }

    #[test]
    fn the_rope_parameters_spelling_is_the_same_yarn() {
        let mut v: serde_json::Value = serde_json::from_str(DEEPSEEK_V3).unwrap();
        let o = v.as_object_mut().unwrap();
        let mut p = o.remove("rope_scaling").unwrap();
        o.remove("rope_theta");
        p["rope_type"] = p["type"].take();
        p.as_object_mut().unwrap().remove("type");
        p["rope_theta"] = 10000.into();
        o.insert("rope_parameters".into(), p);
        let a = ModelConfig::from_json(&v.to_string()).unwrap();
        let b = ModelConfig::from_json(DEEPSEEK_V3).unwrap();
        assert_eq!(a.yarn, b.yarn);
        assert_eq!(a.rope_theta, b.rope_theta);
    }

    #[test]
    fn deepseek_v32_adds_an_indexer_on_every_layer() {
        let mut v: serde_json::Value = serde_json::from_str(DEEPSEEK_V3).unwrap();
        v["model_type"] = "deepseek_v32".into();
        v["index_topk"] = 2048.into();
        v["index_head_dim"] = 128.into();
        v["index_n_heads"] = 64.into();
        let c = ModelConfig::from_json(&v.to_string()).unwrap();
        assert_eq!(c.family, Family::DeepseekV32);
        let ix = c.indexer().unwrap();
        assert_eq!(
            (ix.index_topk, ix.index_head_dim, ix.index_n_heads),
            (2048, 128, 64)
        );
        assert_eq!(ix.indexer_types, vec![IndexerKind::Full; 61]);
        assert!(ix.rope_half);
        assert!(c.yarn.is_some());
        v["index_head_dim"] = 32.into();
        let e = ModelConfig::from_json(&v.to_string())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"index_head_dim\" = 32") && e.contains("qk_rope_head_dim (64)"),
            "{e}"
        );
    }

    /// `q_lora_rank: null` (Moonlight-16B-A3B, DeepSeek-V2-Lite layout) is an unfactored
    /// q_proj: rank 0 here. DeepSeek-V3.2 cannot have it (its indexer reads the low-rank
    /// residual), as transformers' DeepseekV32 cannot.
    #[test]
    fn a_null_q_lora_rank_is_an_unfactored_query() {
        let mut v: serde_json::Value = serde_json::from_str(DEEPSEEK_V3).unwrap();
        v["q_lora_rank"] = serde_json::Value::Null;
        let c = ModelConfig::from_json(&v.to_string()).unwrap();
        assert_eq!(c.mla().unwrap().q_lora_rank, None);
        v["model_type"] = "deepseek_v32".into();
        let e = ModelConfig::from_json(&v.to_string())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"q_lora_rank\" = null") && e.contains("indexer"),
            "{e}"
        );
    }

    /// DeepSeek-V3.2 follows `mlp_layer_types` wherever the dense layers are, and
    /// first_k_dense_replace without it; DeepSeek-V3 reads only first_k_dense_replace, as
    /// transformers' DeepseekV3DecoderLayer does.
    #[test]
    fn deepseek_v32_reads_mlp_layer_types() {
        use MlpKind::{Dense, Sparse};
        let mut v: serde_json::Value = serde_json::from_str(DEEPSEEK_V3).unwrap();
        v["num_hidden_layers"] = 4.into();
        v["first_k_dense_replace"] = 1.into();
        v["mlp_layer_types"] = serde_json::json!(["sparse", "dense", "sparse", "dense"]);
        let c = ModelConfig::from_json(&v.to_string()).unwrap();
        assert_eq!(c.mlp_layer_types, vec![Dense, Sparse, Sparse, Sparse]);
        v["model_type"] = "deepseek_v32".into();
        let c = ModelConfig::from_json(&v.to_string()).unwrap();
        assert_eq!(c.mlp_layer_types, vec![Sparse, Dense, Sparse, Dense]);
        v.as_object_mut().unwrap().remove("mlp_layer_types");
        let c = ModelConfig::from_json(&v.to_string()).unwrap();
        assert_eq!(c.mlp_layer_types, vec![Dense, Sparse, Sparse, Sparse]);
        v["mlp_layer_types"] = serde_json::json!(["sparse", "dense"]);
        let e = ModelConfig::from_json(&v.to_string())
            .unwrap_err()
            .to_string();
        assert!(e.contains("mlp_layer_types"), "{e}");
        v["mlp_layer_types"] = serde_json::json!(["sparse", "moe", "sparse", "dense"]);
        let e = ModelConfig::from_json(&v.to_string())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"mlp_layer_types\"") && e.contains("\"dense\""),
            "{e}"
        );
    }

    #[test]
    fn bad_deepseek_configs_name_the_key_and_what_is_allowed() {
        let with = |key: &str, value: &str| {
            let mut v: serde_json::Value = serde_json::from_str(DEEPSEEK_V3).unwrap();
            v[key] = serde_json::from_str(value).unwrap();
            ModelConfig::from_json(&v.to_string())
                .unwrap_err()
                .to_string()
        };
        let e = with("rope_scaling", r#"{"type": "longrope", "factor": 4}"#);
        assert!(
            e.contains("rope_scaling.rope_type") && e.contains("\"yarn\""),
            "{e}"
        );
        let e = with("rope_scaling", r#"{"type": "yarn", "factor": 40}"#);
        assert!(e.contains("original_max_position_embeddings"), "{e}");
        let e = with("topk_group", "9");
        assert!(
            e.contains("\"topk_group\" = 9") && e.contains("1..=8"),
            "{e}"
        );
        let e = with("q_lora_rank", "0");
        assert!(
            e.contains("\"q_lora_rank\" = 0") && e.contains("1..="),
            "{e}"
        );
        let e = with("num_key_value_heads", "8");
        assert!(e.contains("must equal num_attention_heads (128)"), "{e}");
        let c = ModelConfig::from_json(&DEEPSEEK_V3.replace(
            "\"v_head_dim\": 128",
            "\"v_head_dim\": 128, \"rope_interleave\": false",
        ))
        .unwrap();
        assert!(!c.mla().unwrap().rope_interleave);
        let e = with("rope_interleave", "7");
        assert!(e.contains("rope_interleave"), "{e}");
    }
}
