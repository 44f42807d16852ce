//! Parameter counts from a config's shapes alone: what `info --config` and `plan` report, and
//! what a test checks against every oracle fixture's tensors and the published figures.

use super::{Attn, MlpKind, ModelConfig};

/// Parameter counts from a config's shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamCount {
    /// Every tensor of the model as transformers builds it (embeddings, norms, attention with
    /// its biases and the DSA indexer, dense and routed MLPs, routers), without the MTP layers.
    pub total: u64,
    /// What one token's forward pass multiplies by: `top_k` of each layer's routed experts and
    /// everything that is not a routed expert, the output head included but not the input
    /// embedding table, of which a token reads one row. This is DeepSeek's definition (its
    /// README_WEIGHTS.md: "36.6B activated, including 0.9B for the output head"); vendors who
    /// count the input table too, or neither table, differ from it by `embedding`.
    pub active: u64,
    /// The input embedding table (`vocab_size x hidden_size`; with tied embeddings it is also
    /// the output head).
    pub embedding: u64,
    /// The MTP layers (`num_nextn_predict_layers`) on top of `total`, without the embedding
    /// and output head they share with the main model. Published totals leave them out
    /// (DeepSeek-V3's 671B does; the 685B of its Hugging Face page counts them).
    pub mtp: u64,
}

/// The counts of `c`, with `mtp_layers` MTP layers (config.json's `num_nextn_predict_layers`).
/// A test checks them against the tensors of every oracle fixture.
pub fn count_params(c: &ModelConfig, mtp_layers: u64) -> ParamCount {
    // DeepSeek-V4's layers share nothing of the shapes below: its own count.
    if let Some(d) = c.dsv4() {
        return d.count(c, mtp_layers);
    }
    let (h, heads) = (c.hidden_size as u64, c.num_attention_heads as u64);
    let norms = 2 * h;
    let attn = match &c.attn {
        Attn::Gqa(g) => {
            let (kv, hd) = (g.kv_heads as u64, g.head_dim as u64);
            let (q, k) = (heads * hd, kv * hd);
            let mut n = h * q + 2 * h * k + q * h;
            if c.attention_bias {
                n += q + 2 * k;
                // Qwen3-MoE biases o_proj too; GLM-4.x does not.
                if c.family.spec().o_proj_bias {
                    n += h;
                }
            }
            if g.qk_norm {
                // Per head, or over the whole q and k projections (MiniMax-M2).
                n += if g.qk_norm_whole { q + k } else { 2 * hd };
            }
            // gpt-oss: one learned sink logit per query head.
            if c.oss.is_some() {
                n += heads;
            }
            n
        }
        // Per layer, below.
        Attn::Hybrid(_) => 0,
        // Counted above.
        Attn::Dsv4(_) => 0,
        Attn::Mla(m) => {
            let qk = m.qk_head_dim() as u64;
            let (ql, kvl) = (m.q_lora_rank.unwrap_or(0) as u64, m.kv_lora_rank as u64);
            let q = if ql > 0 {
                h * ql + ql + ql * heads * qk
            } else {
                h * heads * qk
            };
            // `attention_bias` biases q_a_proj, kv_a_proj_with_mqa and o_proj (never the
            // unfactored q_proj, q_b_proj or kv_b_proj), as transformers builds MLA.
            let bias = if c.attention_bias {
                ql + kvl + m.qk_rope_head_dim as u64 + h
            } else {
                0
            };
            q + h * (kvl + m.qk_rope_head_dim as u64)
                + kvl
                + kvl * heads * (m.qk_nope_head_dim + m.v_head_dim) as u64
                + heads * m.v_head_dim as u64 * h
                + bias
        }
    };
    let q_lora = c.mla().and_then(|m| m.q_lora_rank).unwrap_or(0) as u64;
    let indexer = c.indexer().map_or(0, |ix| {
        let (idx_heads, idx_dim) = (ix.index_n_heads as u64, ix.index_head_dim as u64);
        q_lora * idx_heads * idx_dim + h * idx_dim + 2 * idx_dim + h * idx_heads
    });
    let mut expert = 3 * h * c.moe_intermediate_size as u64;
    // gpt-oss's experts carry biases: gate and up (the fused gate_up_proj_bias), and down.
    if c.oss.is_some() {
        expert += 2 * c.moe_intermediate_size as u64 + h;
    }
    let experts = c.n_routed_experts as u64;
    let router = experts * h
        + match c.router {
            crate::config::RouterKind::SigmoidBias => experts,
            crate::config::RouterKind::Softmax => 0,
            // gpt-oss's router is a biased linear layer.
            crate::config::RouterKind::SoftmaxTopk => experts,
            // DeepSeek-V4's correction bias (counted above).
            crate::config::RouterKind::SqrtSoftplus => experts,
        };
    // Qwen3.5-MoE: each layer's own mixer, and a gated shared expert of its own width.
    let attn_at = |l: usize| {
        c.hybrid()
            .map_or(attn, |hy| hy.mixer_params(l, h, heads, c.attention_bias))
    };
    let shared = c
        .hybrid()
        .map_or(c.n_shared_experts as u64 * expert, |hy| hy.shared_params(h));
    let (mut total, mut active) = (0u64, 0u64);
    for l in 0..c.num_hidden_layers {
        let mut layer = norms + attn_at(l);
        if c.indexer_kind(l) == crate::config::IndexerKind::Full {
            layer += indexer;
        }
        if c.mlp_layer_types.get(l) == Some(&MlpKind::Sparse) {
            layer += router + shared;
            total += layer + experts * expert;
            active += layer + c.num_experts_per_tok as u64 * expert;
        } else {
            layer += 3 * h * c.intermediate_size as u64;
            total += layer;
            active += layer;
        }
    }
    let embedding = c.vocab_size as u64 * h;
    let head = if c.tie_word_embeddings { 0 } else { embedding };
    // An MTP layer is one more sparse decoder layer (with an indexer where the family has one)
    // plus enorm, hnorm, eh_proj (2h -> h) and shared_head.norm; it reuses embed_tokens and
    // the output head.
    let mtp_indexer = match c.indexer_kind(0) {
        crate::config::IndexerKind::Full => indexer,
        _ => 0,
    };
    let mtp_layer = norms
        + attn
        + mtp_indexer
        + router
        + (c.n_shared_experts as u64 + experts) * expert
        + 2 * h
        + 2 * h * h
        + h;
    ParamCount {
        // + the final norm
        total: total + embedding + head + h,
        // The output head is one table whether or not it is tied to the input embedding.
        active: active + embedding + h,
        embedding,
        mtp: mtp_layers * mtp_layer,
    }
}

/// `num_nextn_predict_layers` of a config.json (0 when absent or not a count): the engine's
/// config parser does not keep it, and info only needs it to say how big the MTP head is.
pub fn mtp_layers(config_json: &str) -> u64 {
    serde_json::from_str::<serde_json::Value>(config_json)
        .ok()
        .and_then(|v| v.get("num_nextn_predict_layers")?.as_u64())
        .unwrap_or(0)
}
