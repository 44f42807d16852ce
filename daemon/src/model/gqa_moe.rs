//! Loading a decoder layer of the grouped-query families (`model.layers.{l}.*`, transformers'
//! tensor names): `qwen3_moe` (q/k RMSNorm, softmax router, no shared expert, q/k/v/o
//! biased with `attention_bias`) and `glm4_moe` (q/k/v biased, o_proj never, optional q/k
//! RMSNorm, partial rotary, sigmoid router with correction bias and groups, a shared expert)
//! and `minimax_m2` (no biases, q/k RMSNorm over the whole projection, partial rotary, sigmoid
//! router with correction bias, no shared expert; its Mixtral-layout expert names are read
//! under these by `weights::names`).
//! Attention, then a dense SwiGLU MLP or a mixture of experts.
//! The forward is the shared one in `layer.rs` (`Layer::forward`): what differs lives
//! in `Attention::Gqa` and the router's kind.

use super::gqa::Gqa;
use super::layer::{Attention, Ffn, Layer};
use super::linear::load_linear;
use super::moe::{Mlp, Moe, Router};
use crate::config::{MlpKind, ModelConfig, RouterKind};
use crate::error::EngineError;
use crate::quant::{QFormat, QMatrix};
use crate::weights::ShardSet;

pub(crate) fn load_layer(
    s: &ShardSet,
    c: &ModelConfig,
    l: usize,
    dense: QFormat,
    mlp_kind: MlpKind,
) -> Result<Layer, EngineError> {
    let g = *c.gqa().ok_or_else(|| {
        EngineError::Load("a grouped-query family without its attention shape".into())
    })?;
    let (h, heads) = (c.hidden_size, c.num_attention_heads);
    let p = format!("model.layers.{l}");
    let a = format!("{p}.self_attn");
    let bias = c.attention_bias;
    // `attention_bias` biases q/k/v in both families; o_proj too in Qwen3-MoE
    // (Qwen3MoeAttention), never in GLM-4.x (Glm4MoeAttention's o_proj has bias=False).
    let o_bias = bias && c.family.spec().o_proj_bias;
    let lin = |name: &str, rows: usize, cols: usize, bias: bool| {
        load_linear(s, &format!("{a}.{name}"), rows, cols, dense, bias)
    };
    // Per head (`head_dim` weights), or over the whole projection of `n` heads (MiniMax-M2).
    let norm = |name: &str, n: usize| -> Result<Option<Vec<f32>>, EngineError> {
        let width = if g.qk_norm_whole {
            n * g.head_dim
        } else {
            g.head_dim
        };
        Ok(if g.qk_norm {
            Some(s.read_f32(&format!("{a}.{name}.weight"), &[width])?)
        } else {
            None
        })
    };
    let attn = Attention::Gqa(Box::new(Gqa {
        q: lin("q_proj", heads * g.head_dim, h, bias)?,
        k: lin("k_proj", g.kv_heads * g.head_dim, h, bias)?,
        v: lin("v_proj", g.kv_heads * g.head_dim, h, bias)?,
        o: lin("o_proj", h, heads * g.head_dim, o_bias)?,
        q_norm: norm("q_norm", heads)?,
        k_norm: norm("k_norm", g.kv_heads)?,
        heads,
        cfg: g,
        eps: c.rms_norm_eps,
        sinks: None,
        window: None,
        output_gate: false,
    }));
    let mlp = |prefix: &str, inter: usize| -> Result<Mlp, EngineError> {
        Ok(Mlp {
            gate: load_linear(s, &format!("{prefix}.gate_proj"), inter, h, dense, false)?,
            up: load_linear(s, &format!("{prefix}.up_proj"), inter, h, dense, false)?,
            down: load_linear(s, &format!("{prefix}.down_proj"), h, inter, dense, false)?,
        })
    };
    let ne = c.n_routed_experts;
    let ffn = match mlp_kind {
        MlpKind::Dense => Ffn::Dense(mlp(&format!("{p}.mlp"), c.intermediate_size)?),
        MlpKind::Sparse => Ffn::Moe(Moe {
            router: Router {
                weight: QMatrix::from_f32(
                    s.read_f32(&format!("{p}.mlp.gate.weight"), &[ne, h])?,
                    ne,
                    h,
                ),
                bias: match c.router {
                    RouterKind::SigmoidBias | RouterKind::SqrtSoftplus => {
                        s.read_f32(&format!("{p}.mlp.gate.e_score_correction_bias"), &[ne])?
                    }
                    RouterKind::Softmax | RouterKind::SoftmaxTopk => vec![0.0; ne],
                },
                kind: c.router,
                top_k: c.num_experts_per_tok,
                n_group: c.n_group,
                topk_group: c.topk_group,
                norm_topk_prob: c.norm_topk_prob,
                scaling: c.routed_scaling_factor,
            },
            shared_gate: None,
            shared: if c.n_shared_experts > 0 {
                Some(mlp(
                    &format!("{p}.mlp.shared_experts"),
                    c.moe_intermediate_size * c.n_shared_experts,
                )?)
            } else {
                None
            },
        }),
    };
    Ok(Layer {
        input_norm: s.read_f32(&format!("{p}.input_layernorm.weight"), &[h])?,
        post_norm: s.read_f32(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
        attn,
        ffn,
    })
}
