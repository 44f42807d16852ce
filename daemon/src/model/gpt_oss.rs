//! Loading a gpt-oss decoder layer (`model.layers.{l}.*`): grouped-query attention with
//! q/k/v/o biases (`attention_bias`), a learned sink logit per query head (`self_attn.sinks`)
//! and, on the `sliding_attention` layers, a window; then a mixture of experts whose router
//! (`mlp.router.weight` + `.bias`) softmaxes its top-k logits. The experts (biased, clamped
//! SwiGLU) are the store's, one `mlp.experts.{e}.{gate,up,down}_proj.{weight,bias}` set each:
//! `colibri convert` writes them so from the published fused `gate_up_proj` (gate and up
//! interleaved) and `down_proj`; the published MXFP4 ones are read in place, as per-expert
//! views of the fused tensors (`weights::fused_experts`).

use super::gqa::Gqa;
use super::layer::{Attention, Ffn, Layer};
use super::linear::load_linear;
use super::moe::{Moe, Router};
use crate::config::{ModelConfig, RouterKind};
use crate::error::EngineError;
use crate::quant::{QFormat, QMatrix};
use crate::weights::{fused_experts, ShardSet};

/// The published tensors of gpt-oss's fused float experts (input-major, so each expert's
/// matrices are a transpose away), which the engine reads only through `colibri convert`.
pub(crate) const FUSED: [&str; 2] = ["gate_up_proj", "down_proj"];

/// What a gpt-oss checkpoint must hold before any weight is read: every layer's sinks one per
/// query head, and its experts split per expert or as published in MXFP4 (`*_blocks` /
/// `*_scales`, read in place: `weights::fused_experts`) with the config's shapes; the fused
/// float layout goes through `colibri convert` first. Refused as a usage error (exit 2)
/// naming the tensor.
pub(crate) fn check_tensors(s: &ShardSet, c: &ModelConfig) -> Result<(), EngineError> {
    check_sinks(s, c)?;
    for l in 0..c.num_hidden_layers {
        for f in FUSED {
            let name = format!("model.layers.{l}.mlp.experts.{f}");
            if s.contains(&name) {
                return Err(EngineError::Usage(format!(
                    "tensor {name} is gpt-oss's published fused expert layout, which this engine \
                     reads through `colibri convert` (it splits each expert's gate, up and down \
                     out of it): convert the checkpoint first"
                )));
            }
        }
        let prefix = format!("model.layers.{l}");
        let p = format!("{prefix}.mlp.experts");
        let mx = ["gate_up_proj", "down_proj"]
            .iter()
            .flat_map(|f| [format!("{p}.{f}_blocks"), format!("{p}.{f}_scales")]);
        if !mx.into_iter().any(|n| s.contains(&n)) {
            continue;
        }
        fused_experts::check_layer(&|n: &str| s.get(n), &prefix).map_err(EngineError::Usage)?;
        check_mxfp4_shapes(s, c, &p)?;
    }
    Ok(())
}

/// The published MXFP4 experts of one layer (`p`: `model.layers.N.mlp.experts`) against the
/// config: gate_up `[E, 2 * intermediate, hidden / 32, 16]`, down `[E, hidden,
/// intermediate / 32, 16]`.
fn check_mxfp4_shapes(s: &ShardSet, c: &ModelConfig, p: &str) -> Result<(), EngineError> {
    let (h, inter, e) = (c.hidden_size, c.moe_intermediate_size, c.n_routed_experts);
    for (f, rows, cols) in [("gate_up_proj", 2 * inter, h), ("down_proj", h, inter)] {
        let name = format!("{p}.{f}_blocks");
        let Some(t) = s.get(&name) else { continue };
        let want = [e, rows, cols / 32, 16];
        if cols % 32 != 0 || t.shape != want {
            return Err(EngineError::Usage(format!(
                "tensor {name} has shape {:?}: the config (n_routed_experts {e}, hidden_size \
                 {h}, intermediate_size {inter}) needs [{e}, {rows}, {cols} / 32, 16] (32 \
                 values a group, whole groups a row)",
                t.shape
            )));
        }
    }
    Ok(())
}

/// Every layer's sinks, where present, one per query head (`convert` checks it too, before
/// converting anything).
pub(crate) fn check_sinks(s: &ShardSet, c: &ModelConfig) -> Result<(), EngineError> {
    let heads = c.num_attention_heads;
    for l in 0..c.num_hidden_layers {
        let name = format!("model.layers.{l}.self_attn.sinks");
        if let Some(t) = s.get(&name) {
            if t.shape != [heads] {
                return Err(EngineError::Usage(format!(
                    "tensor {name} has shape {:?}: gpt-oss has one sink logit per query head, \
                     so it must be [{heads}] (num_attention_heads)",
                    t.shape
                )));
            }
        }
    }
    Ok(())
}

pub(crate) fn load_layer(
    s: &ShardSet,
    c: &ModelConfig,
    l: usize,
    dense: QFormat,
) -> Result<Layer, EngineError> {
    let (g, oss) = c.gqa().zip(c.oss.as_ref()).ok_or_else(|| {
        EngineError::Load("a gpt-oss config without its attention shape or windows".into())
    })?;
    let (h, heads) = (c.hidden_size, c.num_attention_heads);
    let p = format!("model.layers.{l}");
    let a = format!("{p}.self_attn");
    let bias = c.attention_bias;
    let lin = |name: &str, rows: usize, cols: usize| {
        load_linear(s, &format!("{a}.{name}"), rows, cols, dense, bias)
    };
    let attn = Attention::Gqa(Box::new(Gqa {
        q: lin("q_proj", heads * g.head_dim, h)?,
        k: lin("k_proj", g.kv_heads * g.head_dim, h)?,
        v: lin("v_proj", g.kv_heads * g.head_dim, h)?,
        o: lin("o_proj", h, heads * g.head_dim)?,
        q_norm: None,
        k_norm: None,
        heads,
        cfg: *g,
        eps: c.rms_norm_eps,
        sinks: Some(s.read_f32(&format!("{a}.sinks"), &[heads])?),
        window: oss.window(l),
        output_gate: false,
    }));
    let ne = c.n_routed_experts;
    let ffn = Ffn::Moe(Moe {
        router: Router {
            // f32 as transformers computes it (the published checkpoints keep it in bf16).
            weight: QMatrix::from_f32(
                s.read_f32(&format!("{p}.mlp.router.weight"), &[ne, h])?,
                ne,
                h,
            ),
            bias: s.read_f32(&format!("{p}.mlp.router.bias"), &[ne])?,
            kind: RouterKind::SoftmaxTopk,
            top_k: c.num_experts_per_tok,
            n_group: 1,
            topk_group: 1,
            norm_topk_prob: false,
            scaling: 1.0,
        },
        shared: None,
        shared_gate: None,
    });
    Ok(Layer {
        input_norm: s.read_f32(&format!("{p}.input_layernorm.weight"), &[h])?,
        post_norm: s.read_f32(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
        attn,
        ffn,
    })
}
