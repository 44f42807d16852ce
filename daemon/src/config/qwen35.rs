//! `qwen3_5_moe` (Qwen3.5-397B-A17B, Qwen3.5/3.6-35B-A3B): transformers' `Qwen3_5MoeConfig`.
//! The published checkpoints are vision-language ones whose language model sits in
//! `text_config` (read from there; the vision tower is not run); the text-only
//! `qwen3_5_moe_text` writes the same keys at the top level.
//!
//! A hybrid stack (`layer_types`): Gated DeltaNet layers (`linear_attention`: a causal
//! depthwise conv1d over q/k/v, then the gated delta rule's recurrent state, a gated RMSNorm)
//! beside gated full-attention layers (`full_attention`: grouped-query attention whose q_proj
//! also yields a sigmoid output gate, per-head q/k RMSNorm, rotary on the first
//! `partial_rotary_factor` of a head). Every layer is a mixture of experts (softmax router,
//! top-k always renormalised) plus one shared expert behind a sigmoid gate. Every RMSNorm but
//! the DeltaNet's gated one is zero-centred (`x * (1 + w)`).

use serde_json::Value;

use super::*;

/// A hybrid layer's token mixer (`layer_types`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MixerKind {
    /// Gated DeltaNet (`linear_attention`).
    Linear,
    /// Gated grouped-query attention (`full_attention`).
    Full,
}

/// The Gated DeltaNet's shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNetConfig {
    pub conv_kernel: usize,
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_head_dim: usize,
    pub value_head_dim: usize,
}

impl DeltaNetConfig {
    pub fn key_dim(&self) -> usize {
        self.key_heads * self.key_head_dim
    }
    pub fn value_dim(&self) -> usize {
        self.value_heads * self.value_head_dim
    }
    /// Channels of the conv1d: queries, keys and values side by side.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
    /// f32 values of one layer's recurrent state: per value head a key_head_dim x
    /// value_head_dim matrix.
    pub fn state_len(&self) -> usize {
        self.value_heads * self.key_head_dim * self.value_head_dim
    }
    /// f32 values of one layer's conv state: the last `conv_kernel - 1` inputs per channel.
    pub fn conv_state_len(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim()
    }
}

/// Qwen3.5-MoE's hybrid attention: the full-attention layers' shape (`gqa`, gated), the
/// DeltaNet layers' shape, which layer is which, and the shared expert's width.
#[derive(Clone, Debug, PartialEq)]
pub struct HybridConfig {
    pub gqa: GqaConfig,
    pub delta: DeltaNetConfig,
    /// One entry per layer.
    pub layer_types: Vec<MixerKind>,
    /// `shared_expert_intermediate_size` (the shared expert need not be a whole number of
    /// routed experts, so `n_shared_experts` cannot say it).
    pub shared_inter: usize,
}

impl HybridConfig {
    pub fn mixer(&self, l: usize) -> MixerKind {
        self.layer_types.get(l).copied().unwrap_or(MixerKind::Full)
    }

    /// Parameters of layer `l`'s token mixer, as transformers builds it.
    pub fn mixer_params(&self, l: usize, h: u64, heads: u64, bias: bool) -> u64 {
        match self.mixer(l) {
            MixerKind::Full => {
                let (kv, hd) = (self.gqa.kv_heads as u64, self.gqa.head_dim as u64);
                let (q, k) = (heads * hd, kv * hd);
                // q_proj yields the query and its output gate; q_norm and k_norm.
                let mut n = h * 2 * q + 2 * h * k + q * h + 2 * hd;
                if bias {
                    n += 2 * q + 2 * k + h;
                }
                n
            }
            MixerKind::Linear => {
                let d = &self.delta;
                let (conv, vd, vh) = (
                    d.conv_dim() as u64,
                    d.value_dim() as u64,
                    d.value_heads as u64,
                );
                // in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, conv1d, dt_bias, A_log,
                // the gated norm, out_proj.
                h * conv
                    + h * vd
                    + 2 * h * vh
                    + conv * d.conv_kernel as u64
                    + 2 * vh
                    + d.value_head_dim as u64
                    + vd * h
            }
        }
    }

    /// The shared expert and its gate (hidden -> 1).
    pub fn shared_params(&self, h: u64) -> u64 {
        3 * h * self.shared_inter as u64 + h
    }
}

pub(super) fn parse(top: &Keys<'_>) -> Result<ModelConfig, ConfigError> {
    // The vision-language checkpoints nest the language model; the text-only one does not.
    match top.get("text_config") {
        None | Some(Value::Null) => parse_text(top),
        Some(Value::Object(inner)) => {
            let c = Keys(inner);
            if let Some(v) = c.get("model_type").filter(|v| !v.is_null()) {
                let name = c.string("text_config.model_type", v)?;
                if !matches!(name, "qwen3_5_moe_text" | "qwen3_5_moe") {
                    return Err(unsupported(
                        "text_config.model_type",
                        v,
                        "a qwen3_5_moe checkpoint's language model is \"qwen3_5_moe_text\"",
                    ));
                }
            }
            if let Some(v) = c.get("hidden_act").filter(|v| !v.is_null()) {
                if c.string("hidden_act", v)? != "silu" {
                    return Err(unsupported(
                        "text_config.hidden_act",
                        v,
                        "only \"silu\" is implemented",
                    ));
                }
            }
            parse_text(&c)
        }
        Some(_) => Err(wrong_type("text_config", "an object")),
    }
}

fn parse_text(c: &Keys<'_>) -> Result<ModelConfig, ConfigError> {
    // Qwen3_5MoeTextConfig's defaults. It has no dense MLP: intermediate_size only stands in
    // for the common key.
    let common = Common::parse(
        c,
        &Defaults {
            vocab: 248320,
            hidden: 2048,
            intermediate: 512,
            moe_intermediate: 512,
            layers: 40,
            heads: 16,
            experts: 256,
            // Qwen3_5MoeTopKRouter always renormalises the top-k (it reads no such key).
            norm_topk_prob: true,
            eps: 1e-6,
            max_positions: 32768,
            bos: None,
        },
    )?;
    let heads = common.num_attention_heads;
    let layers = common.num_hidden_layers;
    let kv_heads = c.usize_in("num_key_value_heads", 2, 1, heads)?;
    super::glm4::check_kv_heads(heads, kv_heads)?;
    let head_dim = c.usize_in("head_dim", 256, 2, MAX_HEAD_DIM)?;
    // transformers defaults the factor to 0.25 for this family.
    let rotary_dim = super::glm4::partial_rotary(c, head_dim, 0.25)?;
    // mrope (`mrope_section`, `mrope_interleaved`) splits the rotary frequencies among the
    // temporal, height and width position ids; for text all three ids are the token's
    // position, so every section rotates by the same angle and mrope is plain rotary.
    let (rope_theta, yarn) = rope(c, common.max_position_embeddings)?;
    if !c.bool_or("attn_output_gate", true)? {
        return Err(unsupported(
            "attn_output_gate",
            &Value::Bool(false),
            "transformers' Qwen3.5-MoE attention is always gated (true)",
        ));
    }
    let delta = DeltaNetConfig {
        conv_kernel: c.usize_in("linear_conv_kernel_dim", 4, 1, 64)?,
        key_heads: c.usize_in("linear_num_key_heads", 16, 1, MAX_HEADS)?,
        value_heads: c.usize_in("linear_num_value_heads", 32, 1, MAX_HEADS)?,
        key_head_dim: c.usize_in("linear_key_head_dim", 128, 1, MAX_HEAD_DIM)?,
        value_head_dim: c.usize_in("linear_value_head_dim", 128, 1, MAX_HEAD_DIM)?,
    };
    if !delta.value_heads.is_multiple_of(delta.key_heads) {
        return Err(ConfigError::Invalid {
            key: "linear_num_value_heads".into(),
            value: delta.value_heads.to_string(),
            why: format!(
                "it must be a multiple of linear_num_key_heads ({}): each query/key head \
                 serves a whole group of value heads",
                delta.key_heads
            ),
        });
    }
    let layer_types = layer_types(c, layers)?;
    let shared_inter = c.usize_in("shared_expert_intermediate_size", 512, 1, MAX_INTERMEDIATE)?;
    Ok(common.finish(Parts {
        family: Family::Qwen35Moe,
        attn: Attn::Hybrid(HybridConfig {
            gqa: GqaConfig {
                kv_heads,
                head_dim,
                rotary_dim,
                qk_norm: true,
                qk_norm_whole: false,
            },
            delta,
            layer_types,
            shared_inter,
        }),
        router: RouterKind::Softmax,
        // The shared expert's width is HybridConfig::shared_inter.
        n_shared_experts: 0,
        routed_scaling_factor: 1.0,
        n_group: 1,
        topk_group: 1,
        rope_theta,
        yarn,
        // transformers builds a sparse block on every layer (it reads no mlp_only_layers).
        mlp_layer_types: vec![MlpKind::Sparse; layers],
    }))
}

/// `layer_types`, or transformers' default: every `full_attention_interval`-th layer (4)
/// full attention, the others linear.
fn layer_types(c: &Keys<'_>, layers: usize) -> Result<Vec<MixerKind>, ConfigError> {
    const KEY: &str = "layer_types";
    if let Some(v) = c.get(KEY).filter(|v| !v.is_null()) {
        return list_of_len(KEY, v, layers)?
            .iter()
            .map(|item| match item.as_str() {
                Some("linear_attention") => Ok(MixerKind::Linear),
                Some("full_attention") => Ok(MixerKind::Full),
                _ => Err(unsupported(
                    KEY,
                    item,
                    "entries must be \"linear_attention\" or \"full_attention\"",
                )),
            })
            .collect();
    }
    let every = c.usize_in("full_attention_interval", 4, 1, MAX_LAYERS)?;
    Ok((0..layers)
        .map(|i| {
            if (i + 1).is_multiple_of(every) {
                MixerKind::Full
            } else {
                MixerKind::Linear
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn published(name: &str) -> String {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/configs/");
        std::fs::read_to_string(format!("{dir}{name}")).unwrap()
    }

    #[test]
    fn the_published_configs_parse_from_their_text_config() {
        let c = ModelConfig::from_json(&published("qwen3.5-397b-a17b.json")).unwrap();
        assert_eq!(c.family, Family::Qwen35Moe);
        let Attn::Hybrid(hy) = &c.attn else {
            panic!("{:?}", c.attn)
        };
        assert_eq!(
            (c.hidden_size, c.num_hidden_layers, c.vocab_size),
            (4096, 60, 248320)
        );
        assert_eq!(
            hy.gqa,
            GqaConfig {
                kv_heads: 2,
                head_dim: 256,
                rotary_dim: 64,
                qk_norm: true,
                qk_norm_whole: false
            }
        );
        assert_eq!((hy.delta.key_heads, hy.delta.value_heads), (16, 64));
        assert_eq!(hy.delta.conv_dim(), 2 * 16 * 128 + 64 * 128);
        assert_eq!(hy.mixer(2), MixerKind::Linear);
        assert_eq!(hy.mixer(3), MixerKind::Full);
        assert_eq!(
            hy.layer_types
                .iter()
                .filter(|k| **k == MixerKind::Full)
                .count(),
            15
        );
        assert_eq!((c.n_routed_experts, c.num_experts_per_tok), (512, 10));
        assert_eq!(hy.shared_inter, 1024);
        assert_eq!(c.rope_theta, 1e7);
        assert_eq!(c.eos_token_ids, vec![248044]);
        assert!(c.norm_topk_prob && c.gqa().is_some());
        let c = ModelConfig::from_json(&published("qwen3.6-35b-a3b.json")).unwrap();
        assert_eq!(
            (c.hidden_size, c.num_hidden_layers, c.n_routed_experts),
            (2048, 40, 256)
        );
    }

    fn with(key: &str, value: &str) -> Result<ModelConfig, ConfigError> {
        let mut v: serde_json::Value =
            serde_json::from_str(&published("qwen3.6-35b-a3b.json")).unwrap();
        v["text_config"][key] = serde_json::from_str(value).unwrap();
        ModelConfig::from_json(&v.to_string())
    }

    #[test]
    fn the_text_only_spelling_reads_the_same_keys() {
        let v: serde_json::Value =
            serde_json::from_str(&published("qwen3.6-35b-a3b.json")).unwrap();
        let text = v["text_config"].to_string();
        let c = ModelConfig::from_json(&text).unwrap();
        assert_eq!(c.family, Family::Qwen35Moe);
        assert_eq!(c.attn, ModelConfig::from_json(&v.to_string()).unwrap().attn);
        // Without layer_types, every fourth layer is full attention.
        let mut t = v["text_config"].clone();
        t.as_object_mut().unwrap().remove("layer_types");
        t["full_attention_interval"] = 2.into();
        let c = ModelConfig::from_json(&t.to_string()).unwrap();
        let Attn::Hybrid(hy) = &c.attn else { panic!() };
        assert_eq!(hy.mixer(0), MixerKind::Linear);
        assert_eq!(hy.mixer(1), MixerKind::Full);
    }

    #[test]
    fn bad_qwen35_configs_name_the_key_the_value_and_what_is_allowed() {
        let mut types = vec!["\"linear_attention\""; 40];
        types[5] = "\"sliding_attention\"";
        let e = with("layer_types", &format!("[{}]", types.join(",")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"layer_types\" = \"sliding_attention\"")
                && e.contains("\"linear_attention\" or \"full_attention\""),
            "{e}"
        );
        let e = with("layer_types", "[\"full_attention\"]")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"layer_types\"") && e.contains("num_hidden_layers = 40"),
            "{e}"
        );
        let e = with("linear_num_value_heads", "24")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"linear_num_value_heads\" = 24")
                && e.contains("multiple of linear_num_key_heads (16)"),
            "{e}"
        );
        let e = with("num_key_value_heads", "3").unwrap_err().to_string();
        assert!(
            e.contains("\"num_key_value_heads\" = 3") && e.contains("must divide"),
            "{e}"
        );
        let e = with("attn_output_gate", "false").unwrap_err().to_string();
        assert!(e.contains("\"attn_output_gate\" = false"), "{e}");
        let e = with("hidden_act", "\"gelu\"").unwrap_err().to_string();
        assert!(e.contains("\"text_config.hidden_act\" = \"gelu\""), "{e}");
        let e = with("model_type", "\"llama\"").unwrap_err().to_string();
        assert!(e.contains("\"text_config.model_type\" = \"llama\""), "{e}");
    }
}
