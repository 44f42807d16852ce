//! The keys every family reads, parsed once: each family's parser gives its defaults
//! ([`Defaults`]), reads its own keys (attention, router, rotary, dense layers) and hands both
//! to [`Common::finish`], the one place a [`ModelConfig`] is assembled.

use super::*;

/// A family's defaults for the common keys (transformers' config class of that family).
pub(super) struct Defaults {
    pub vocab: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub moe_intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub experts: usize,
    pub norm_topk_prob: bool,
    pub eps: f64,
    pub max_positions: usize,
    /// `bos_token_id` when the key is absent (null is always none).
    pub bos: Option<u32>,
}

/// The common keys of a config, validated.
pub(super) struct Common {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub n_routed_experts: usize,
    pub num_experts_per_tok: usize,
    pub norm_topk_prob: bool,
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    pub attention_bias: bool,
    pub tie_word_embeddings: bool,
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
}

/// What a family's parser adds to the common keys.
pub(super) struct Parts {
    pub family: Family,
    pub attn: Attn,
    pub router: RouterKind,
    pub n_shared_experts: usize,
    pub routed_scaling_factor: f32,
    pub n_group: usize,
    pub topk_group: usize,
    pub rope_theta: f64,
    pub yarn: Option<Yarn>,
    pub mlp_layer_types: Vec<MlpKind>,
}

impl Common {
    pub(super) fn parse(c: &Keys<'_>, d: &Defaults) -> Result<Common, ConfigError> {
        let vocab_size = c.usize_in("vocab_size", d.vocab, 1, MAX_VOCAB)?;
        let hidden_size = c.usize_in("hidden_size", d.hidden, 1, MAX_HIDDEN)?;
        let intermediate_size =
            c.usize_in("intermediate_size", d.intermediate, 1, MAX_INTERMEDIATE)?;
        let moe_intermediate_size = c.usize_in(
            "moe_intermediate_size",
            d.moe_intermediate,
            1,
            MAX_INTERMEDIATE,
        )?;
        let num_hidden_layers = c.usize_in("num_hidden_layers", d.layers, 1, MAX_LAYERS)?;
        let num_attention_heads = c.usize_in("num_attention_heads", d.heads, 1, MAX_HEADS)?;
        let n_routed_experts = routed_experts(c, d.experts)?;
        let num_experts_per_tok = c.usize_in("num_experts_per_tok", 8, 1, n_routed_experts)?;
        let norm_topk_prob = c.bool_or("norm_topk_prob", d.norm_topk_prob)?;
        let rms_norm_eps = norm_eps(c, d.eps)?;
        let max_position_embeddings =
            c.usize_in("max_position_embeddings", d.max_positions, 1, MAX_POSITIONS)?;
        let attention_bias = c.bool_or("attention_bias", false)?;
        let tie_word_embeddings = c.bool_or("tie_word_embeddings", false)?;
        let eos_token_ids = eos_token_ids(c, vocab_size)?;
        let bos_token_id = match c.get("bos_token_id") {
            None => d.bos,
            Some(Value::Null) => None,
            Some(v) => Some(token_id(c, "bos_token_id", v, vocab_size)?),
        };
        Ok(Common {
            vocab_size,
            hidden_size,
            intermediate_size,
            moe_intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            n_routed_experts,
            num_experts_per_tok,
            norm_topk_prob,
            rms_norm_eps,
            max_position_embeddings,
            attention_bias,
            tie_word_embeddings,
            eos_token_ids,
            bos_token_id,
        })
    }

    /// The config of `p.family`: these keys and the family's own.
    pub(super) fn finish(self, p: Parts) -> ModelConfig {
        ModelConfig {
            family: p.family,
            attn: p.attn,
            router: p.router,
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            moe_intermediate_size: self.moe_intermediate_size,
            num_hidden_layers: self.num_hidden_layers,
            num_attention_heads: self.num_attention_heads,
            n_shared_experts: p.n_shared_experts,
            n_routed_experts: self.n_routed_experts,
            num_experts_per_tok: self.num_experts_per_tok,
            routed_scaling_factor: p.routed_scaling_factor,
            n_group: p.n_group,
            topk_group: p.topk_group,
            norm_topk_prob: self.norm_topk_prob,
            rms_norm_eps: self.rms_norm_eps,
            rope_theta: p.rope_theta,
            attention_bias: self.attention_bias,
            mlp_layer_types: p.mlp_layer_types,
            eos_token_ids: self.eos_token_ids,
            bos_token_id: self.bos_token_id,
            max_position_embeddings: self.max_position_embeddings,
            tie_word_embeddings: self.tie_word_embeddings,
            yarn: p.yarn,
            oss: None,
        }
    }
}

/// MLA gives every query head its own key and value: `num_key_value_heads`, when written,
/// must be `num_attention_heads`.
pub(super) fn mla_kv_heads(c: &Keys<'_>, heads: usize) -> Result<(), ConfigError> {
    if let Some(v) = c.get("num_key_value_heads").filter(|v| !v.is_null()) {
        if c.uint("num_key_value_heads", v)? != heads as u64 {
            return Err(unsupported(
                "num_key_value_heads",
                v,
                &format!("must equal num_attention_heads ({heads}) for MLA attention"),
            ));
        }
    }
    Ok(())
}

/// `routed_scaling_factor`, `default` when absent.
pub(super) fn scaling(c: &Keys<'_>, default: f64) -> Result<f32, ConfigError> {
    Ok(c.f64_in(
        "routed_scaling_factor",
        default,
        "a finite number > 0 and <= 1e6",
        |x| x > 0.0 && x <= 1e6,
    )? as f32)
}

/// The DSA indexer's keys (GLM-5, DeepSeek-V3.2): its selection size, head width (which
/// holds a RoPE part of `qk_rope`) and heads (`default_heads` when absent).
pub(super) fn dsa_indexer(
    c: &Keys<'_>,
    qk_rope: usize,
    default_heads: usize,
    indexer_types: Vec<IndexerKind>,
    rope_half: bool,
) -> Result<IndexerConfig, ConfigError> {
    let index_topk = c.usize_in("index_topk", 2048, 1, MAX_INDEX_TOPK)?;
    let index_head_dim = c.usize_in("index_head_dim", 128, 1, MAX_HEAD_DIM)?;
    if index_head_dim < qk_rope {
        return Err(ConfigError::Invalid {
            key: "index_head_dim".into(),
            value: index_head_dim.to_string(),
            why: format!(
                "the indexer head holds a RoPE part of qk_rope_head_dim ({qk_rope}), so it \
                 must be at least that"
            ),
        });
    }
    let index_n_heads = c.usize_in("index_n_heads", default_heads, 1, MAX_HEADS)?;
    Ok(IndexerConfig {
        index_topk,
        index_head_dim,
        index_n_heads,
        indexer_types,
        rope_half,
    })
}
