//! Loading a decoder layer of `qwen3_5_moe` (`model.layers.{l}.*`, transformers' tensor
//! names): a Gated DeltaNet (`linear_attn.*`, `delta_net.rs`) or gated grouped-query
//! attention (`self_attn.*`, `gqa.rs` with its output gate) as `layer_types` says, then a
//! mixture of experts with a softmax router and a shared expert behind a sigmoid gate.
//! Every RMSNorm weight but the DeltaNet's gated norm is zero-centred (transformers'
//! `Qwen3_5MoeRMSNorm` multiplies by `1 + w`): the loader adds the 1 once, so the shared
//! forward's plain RMSNorm computes the same numbers. A GGUF's tensors (`gguf::qwen35`) hold
//! the 1 already, `-exp(A_log)` instead of `A_log`, and the DeltaNet's value heads in
//! llama.cpp's tiled order; the loader takes each as it is.

use super::delta_net::DeltaNet;
use super::gqa::Gqa;
use super::layer::{Attention, Ffn, Layer};
use super::linear::load_linear;
use super::moe::{Mlp, Moe, Router};
use crate::config::{MixerKind, ModelConfig, RouterKind};
use crate::error::EngineError;
use crate::quant::{QFormat, QMatrix};
use crate::weights::ShardSet;

/// `1 + w`, in f32 as transformers adds it.
fn centred(mut w: Vec<f32>) -> Vec<f32> {
    w.iter_mut().for_each(|v| *v += 1.0);
    w
}

/// The zero-centred norm `{base}` as the forward multiplies by it: transformers' `weight`
/// plus 1, or a GGUF's `centred_weight`, which llama.cpp's converter wrote with the 1 added
/// (the same f32 sum; `gguf::qwen35`).
pub(crate) fn centred_norm(s: &ShardSet, base: &str, n: usize) -> Result<Vec<f32>, EngineError> {
    let done = format!("{base}.centred_weight");
    if s.contains(&done) {
        return Ok(s.read_f32(&done, &[n])?);
    }
    Ok(centred(s.read_f32(&format!("{base}.weight"), &[n])?))
}

pub(crate) fn load_layer(
    s: &ShardSet,
    c: &ModelConfig,
    l: usize,
    dense: QFormat,
) -> Result<Layer, EngineError> {
    let hy = c
        .hybrid()
        .ok_or_else(|| EngineError::Load("a hybrid family without its layer shapes".into()))?;
    let (h, heads) = (c.hidden_size, c.num_attention_heads);
    let p = format!("model.layers.{l}");
    let bias = c.attention_bias;
    let attn = match hy.mixer(l) {
        MixerKind::Full => {
            let g = hy.gqa;
            let a = format!("{p}.self_attn");
            let lin = |name: &str, rows: usize, cols: usize| {
                load_linear(s, &format!("{a}.{name}"), rows, cols, dense, bias)
            };
            let norm = |name: &str| -> Result<Option<Vec<f32>>, EngineError> {
                Ok(Some(centred_norm(s, &format!("{a}.{name}"), g.head_dim)?))
            };
            Attention::Gqa(Box::new(Gqa {
                q: lin("q_proj", 2 * heads * g.head_dim, h)?,
                k: lin("k_proj", g.kv_heads * g.head_dim, h)?,
                v: lin("v_proj", g.kv_heads * g.head_dim, h)?,
                o: lin("o_proj", h, heads * g.head_dim)?,
                q_norm: norm("q_norm")?,
                k_norm: norm("k_norm")?,
                heads,
                cfg: g,
                eps: c.rms_norm_eps,
                sinks: None,
                window: None,
                output_gate: true,
            }))
        }
        MixerKind::Linear => {
            let d = hy.delta;
            let a = format!("{p}.linear_attn");
            let lin = |name: &str, rows: usize, cols: usize| {
                load_linear(s, &format!("{a}.{name}"), rows, cols, dense, false)
            };
            let nv = d.value_heads;
            // A GGUF's DeltaNet: `A` is llama.cpp's `ssm_a` (its converter's -exp(A_log)),
            // the conv's taps squeezed to (channels, taps), and every value-head-indexed
            // tensor in its tiled head order (`gguf::qwen35`).
            let gguf = s.contains(&format!("{a}.A"));
            let (neg_a, conv_shape) = match gguf {
                true => (
                    s.read_f32(&format!("{a}.A"), &[nv])?,
                    vec![d.conv_dim(), d.conv_kernel],
                ),
                false => (
                    s.read_f32(&format!("{a}.A_log"), &[nv])?
                        .iter()
                        .map(|x| -x.exp())
                        .collect(),
                    vec![d.conv_dim(), 1, d.conv_kernel],
                ),
            };
            Attention::Delta(Box::new(DeltaNet {
                in_qkv: lin("in_proj_qkv", d.conv_dim(), h)?,
                in_z: lin("in_proj_z", d.value_dim(), h)?,
                in_b: lin("in_proj_b", nv, h)?,
                in_a: lin("in_proj_a", nv, h)?,
                conv: s.read_f32(&format!("{a}.conv1d.weight"), &conv_shape)?,
                dt_bias: s.read_f32(&format!("{a}.dt_bias"), &[nv])?,
                neg_a,
                tiled: gguf,
                norm: s.read_f32(&format!("{a}.norm.weight"), &[d.value_head_dim])?,
                out: lin("out_proj", h, d.value_dim())?,
                cfg: d,
                eps: c.rms_norm_eps,
                scratch: Default::default(),
            }))
        }
    };
    let mlp = |prefix: &str, inter: usize| -> Result<Mlp, EngineError> {
        Ok(Mlp {
            gate: load_linear(s, &format!("{prefix}.gate_proj"), inter, h, dense, false)?,
            up: load_linear(s, &format!("{prefix}.up_proj"), inter, h, dense, false)?,
            down: load_linear(s, &format!("{prefix}.down_proj"), h, inter, dense, false)?,
        })
    };
    let ne = c.n_routed_experts;
    let ffn = Ffn::Moe(Moe {
        router: Router {
            weight: QMatrix::from_f32(
                s.read_f32(&format!("{p}.mlp.gate.weight"), &[ne, h])?,
                ne,
                h,
            ),
            bias: vec![0.0; ne],
            kind: RouterKind::Softmax,
            top_k: c.num_experts_per_tok,
            n_group: 1,
            topk_group: 1,
            norm_topk_prob: true,
            scaling: 1.0,
        },
        shared: Some(mlp(&format!("{p}.mlp.shared_expert"), hy.shared_inter)?),
        shared_gate: Some(s.read_f32(&format!("{p}.mlp.shared_expert_gate.weight"), &[1, h])?),
    });
    Ok(Layer {
        input_norm: centred_norm(s, &format!("{p}.input_layernorm"), h)?,
        post_norm: centred_norm(s, &format!("{p}.post_attention_layernorm"), h)?,
        attn,
        ffn,
    })
}
