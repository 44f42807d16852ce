//! `gpt_oss` (OpenAI gpt-oss-20b, gpt-oss-120b): transformers' `GptOssConfig`. Grouped-query
//! attention with q/k/v/o biases and a learned sink logit per head, sliding-window and full
//! layers alternating (`layer_types`, `sliding_window`), YaRN; a router with a bias whose
//! top-k logits are softmaxed (the other experts do not count), experts with biases and the
//! clamped SwiGLU (`swiglu_alpha`, `swiglu_limit`); no shared expert, no dense layer.
//! `intermediate_size` is the experts' width (the family has no `moe_intermediate_size`).

use serde_json::Value;

use super::*;

/// What gpt-oss adds to a grouped-query MoE config.
#[derive(Clone, Debug, PartialEq)]
pub struct OssConfig {
    /// The window of the `sliding_attention` layers: a query sees itself and the
    /// `sliding_window - 1` keys before it. `None` (config.json's null): they see every key.
    pub sliding_window: Option<usize>,
    /// One entry per layer: whether the layer is a sliding-window one.
    pub sliding: Vec<bool>,
    /// The experts' SwiGLU: `gate.clamp(max = limit) * sigmoid(alpha * gate)` times
    /// `up.clamp(-limit, limit) + 1`.
    pub swiglu_alpha: f32,
    pub swiglu_limit: f32,
}

impl OssConfig {
    /// Layer `l`'s attention window (`None`: every earlier key).
    pub fn window(&self, l: usize) -> Option<usize> {
        if self.sliding.get(l).copied().unwrap_or(false) {
            self.sliding_window
        } else {
            None
        }
    }
}

pub(super) fn parse(c: &Keys<'_>) -> Result<ModelConfig, ConfigError> {
    let mut common = Common::parse(
        c,
        &Defaults {
            vocab: 201088,
            hidden: 2880,
            intermediate: 2880,
            moe_intermediate: 2880,
            layers: 36,
            heads: 64,
            experts: 128,
            norm_topk_prob: false,
            eps: 1e-5,
            max_positions: 131072,
            bos: None,
        },
    )?;
    // transformers' GptOssExperts are `intermediate_size` wide; `moe_intermediate_size`, if a
    // file has it, is not read.
    common.moe_intermediate_size = common.intermediate_size;
    // GptOssConfig defaults attention_bias to true (every published file writes it).
    common.attention_bias = c.bool_or("attention_bias", true)?;
    // GptOssConfig's defaults: 4 experts a token, 8 key-value heads of 64.
    common.num_experts_per_tok =
        c.usize_in("num_experts_per_tok", 4, 1, common.n_routed_experts)?;
    let heads = common.num_attention_heads;
    let kv_heads = c.usize_in("num_key_value_heads", 8.min(heads), 1, heads)?;
    super::glm4::check_kv_heads(heads, kv_heads)?;
    let head_dim = c.usize_in("head_dim", 64, 2, MAX_HEAD_DIM)?;
    even_rotary("head_dim", head_dim)?;
    let (rope_theta, yarn) = oss_rope(c, common.max_position_embeddings)?;
    let layers = common.num_hidden_layers;
    let sliding = layer_types(c, layers)?;
    let sliding_window = match c.get("sliding_window") {
        Some(Value::Null) => None,
        None => Some(128),
        Some(v) => Some(c.usize_value("sliding_window", v, 1, MAX_POSITIONS)?),
    };
    let finite_pos = |x: f64| x > 0.0 && x <= 1e6;
    let swiglu_alpha = c.f64_in(
        "swiglu_alpha",
        1.702,
        "a finite number > 0 and <= 1e6",
        finite_pos,
    )? as f32;
    let swiglu_limit = c.f64_in(
        "swiglu_limit",
        7.0,
        "a finite number > 0 and <= 1e6",
        finite_pos,
    )? as f32;
    let mut cfg = common.finish(Parts {
        family: Family::GptOss,
        attn: Attn::Gqa(GqaConfig {
            kv_heads,
            head_dim,
            rotary_dim: head_dim,
            qk_norm: false,
            qk_norm_whole: false,
        }),
        router: RouterKind::SoftmaxTopk,
        n_shared_experts: 0,
        routed_scaling_factor: 1.0,
        n_group: 1,
        topk_group: 1,
        rope_theta,
        yarn,
        mlp_layer_types: vec![MlpKind::Sparse; layers],
    });
    cfg.oss = Some(OssConfig {
        sliding_window,
        sliding,
        swiglu_alpha,
        swiglu_limit,
    });
    Ok(cfg)
}

/// RoPE as every family reads it; with none of its keys written, GptOssConfig's own default
/// (theta 150000, YaRN of factor 32 over 4096 with betas 32 and 1, untruncated).
fn oss_rope(c: &Keys<'_>, max_positions: usize) -> Result<(f64, Option<Yarn>), ConfigError> {
    let written = ["rope_theta", "rope_scaling", "rope_parameters"]
        .iter()
        .any(|k| c.get(k).is_some_and(|v| !v.is_null()));
    if written {
        return rope(c, max_positions);
    }
    let factor = 32.0;
    Ok((
        150000.0,
        Some(Yarn {
            factor,
            original_max_position_embeddings: 4096.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: Yarn::mscale(factor, 1.0),
            mscale_all_dim: 0.0,
            truncate: false,
        }),
    ))
}

/// `layer_types`: `"sliding_attention"` or `"full_attention"` per layer; absent, transformers'
/// default (even layers sliding, odd ones full).
fn layer_types(c: &Keys<'_>, layers: usize) -> Result<Vec<bool>, ConfigError> {
    const KEY: &str = "layer_types";
    let Some(v) = c.get(KEY).filter(|v| !v.is_null()) else {
        return Ok((0..layers).map(|i| i % 2 == 0).collect());
    };
    list_of_len(KEY, v, layers)?
        .iter()
        .map(|item| match item.as_str() {
            Some("sliding_attention") => Ok(true),
            Some("full_attention") => Ok(false),
            _ => Err(unsupported(
                KEY,
                item,
                "entries must be \"sliding_attention\" or \"full_attention\"",
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::*;

    const GPT_OSS_20B: &str = include_str!("../../../tests/fixtures/configs/gpt-oss-20b.json");
    const GPT_OSS_120B: &str = include_str!("../../../tests/fixtures/configs/gpt-oss-120b.json");

    #[test]
    fn the_published_configs_parse() {
        let c = ModelConfig::from_json(GPT_OSS_20B).unwrap();
        assert_eq!(c.family, Family::GptOss);
        assert_eq!(
            c.gqa().copied(),
            Some(GqaConfig {
                kv_heads: 8,
                head_dim: 64,
                rotary_dim: 64,
                qk_norm: false,
                qk_norm_whole: false
            })
        );
        assert_eq!(c.router, RouterKind::SoftmaxTopk);
        assert_eq!((c.n_routed_experts, c.num_experts_per_tok), (32, 4));
        assert_eq!((c.moe_intermediate_size, c.n_sparse_layers()), (2880, 24));
        assert!(c.attention_bias);
        let o = c.oss.as_ref().unwrap();
        assert_eq!((o.window(0), o.window(1)), (Some(128), None));
        assert_eq!((o.swiglu_alpha, o.swiglu_limit), (1.702, 7.0));
        assert_eq!(c.rope_theta, 150000.0);
        let y = c.yarn.unwrap();
        assert_eq!(
            (y.factor, y.original_max_position_embeddings),
            (32.0, 4096.0)
        );
        assert!(!y.truncate);
        assert_eq!(c.eos_token_ids, vec![200002]);
        let c = ModelConfig::from_json(GPT_OSS_120B).unwrap();
        assert_eq!((c.n_routed_experts, c.num_hidden_layers), (128, 36));
    }

    fn with(key: &str, value: &str) -> Result<ModelConfig, ConfigError> {
        let mut v: serde_json::Value = serde_json::from_str(GPT_OSS_20B).unwrap();
        v[key] = serde_json::from_str(value).unwrap();
        ModelConfig::from_json(&v.to_string())
    }

    #[test]
    fn bad_gpt_oss_configs_name_the_key_the_value_and_what_is_allowed() {
        let mut types = vec!["full_attention"; 24];
        types[3] = "chunked_attention";
        let e = with("layer_types", &serde_json::to_string(&types).unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"layer_types\" = \"chunked_attention\"")
                && e.contains("\"sliding_attention\" or \"full_attention\""),
            "{e}"
        );
        let e = with("layer_types", r#"["full_attention"]"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("layer_types") && e.contains("num_hidden_layers = 24"),
            "{e}"
        );
        let e = with("sliding_window", "0").unwrap_err().to_string();
        assert!(e.contains("\"sliding_window\" = 0"), "{e}");
        let e = with("swiglu_limit", "-1").unwrap_err().to_string();
        assert!(
            e.contains("\"swiglu_limit\" = -1") && e.contains("> 0"),
            "{e}"
        );
        let e = with("num_key_value_heads", "7").unwrap_err().to_string();
        assert!(e.contains("must divide num_attention_heads (64)"), "{e}");
    }

    #[test]
    fn defaults_follow_transformers() {
        // No layer_types: even layers slide; no RoPE keys: GptOssConfig's YaRN.
        let c =
            ModelConfig::from_json(r#"{"model_type": "gpt_oss", "num_hidden_layers": 4}"#).unwrap();
        assert_eq!((c.num_experts_per_tok, c.gqa().unwrap().head_dim), (4, 64));
        assert_eq!(c.gqa().unwrap().kv_heads, 8);
        let o = c.oss.unwrap();
        assert_eq!(o.sliding, vec![true, false, true, false]);
        assert_eq!(c.rope_theta, 150000.0);
        assert_eq!(c.yarn.unwrap().factor, 32.0);
        let c = with("sliding_window", "null").unwrap();
        assert_eq!(c.oss.unwrap().window(0), None);
    }
}
