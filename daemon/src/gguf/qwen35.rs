//! llama.cpp's `qwen35moe` (Qwen3.5/3.6-MoE): its hyper-parameters as `Qwen3_5MoeTextConfig`'s
//! keys, and its tensor names, which differ from the other architectures' (the DeltaNet's
//! `ssm_*`, the singular shared expert and its gate).
//!
//! Its converter (`Qwen3NextModel` and `_LinearAttentionVReorderBase.modify_tensors`) writes
//! three things transformers does not hold, and the load takes each as written rather than
//! undoing it, so that no tensor is copied or re-quantized:
//! - every zero-centred RMSNorm weight with its 1 added (`w + 1`, in f32 as transformers
//!   adds it): mapped to `*.centred_weight`, which the loader uses as it is instead of adding
//!   the 1 again (`model::qwen35`);
//! - `ssm_a`, `-exp(A_log)` as torch computes it (transformers computes the same product in
//!   its forward): mapped to `linear_attn.A`, used as the decay rate directly;
//! - the DeltaNet's value heads in "tiled" order (`[G0v0, G1v0, ..., G0v1, G1v1, ...]` for
//!   key-head groups G) rather than transformers' grouped one (`[G0v0, G0v1, ..., G1v0, ...]`)
//!   in every tensor indexed by value head: the value rows of `attn_qkv` and of the conv,
//!   `attn_gate`, `ssm_alpha`, `ssm_beta`, `ssm_a`, `ssm_dt` and `ssm_out`'s columns. Undoing
//!   it would move `ssm_out`'s columns in steps of a head (128 wide in the published models),
//!   which a 256-wide K-quant block cannot be cut at; instead the DeltaNet runs in the tiled
//!   order, where value head `j` reads key head `j % key_heads` (`DeltaNet::tiled`), the same
//!   products in another order. `linear_attn.A` is how the loader knows.

use serde_json::{json, Value};

use super::config::Keys;
use super::meta::GgufValue;
use super::GgufError;

/// qwen35moe's per-block tensors, llama.cpp's suffix to ours (after `model.layers.N.`).
/// Looked up before the shared table, whose norms and shared experts mean otherwise here.
pub(super) const BLOCK: &[(&str, &str)] = &[
    ("attn_norm.weight", "input_layernorm.centred_weight"),
    (
        "post_attention_norm.weight",
        "post_attention_layernorm.centred_weight",
    ),
    ("attn_q_norm.weight", "self_attn.q_norm.centred_weight"),
    ("attn_k_norm.weight", "self_attn.k_norm.centred_weight"),
    ("attn_qkv.weight", "linear_attn.in_proj_qkv.weight"),
    ("attn_gate.weight", "linear_attn.in_proj_z.weight"),
    ("ssm_alpha.weight", "linear_attn.in_proj_a.weight"),
    ("ssm_beta.weight", "linear_attn.in_proj_b.weight"),
    ("ssm_conv1d.weight", "linear_attn.conv1d.weight"),
    ("ssm_dt.bias", "linear_attn.dt_bias"),
    ("ssm_a", "linear_attn.A"),
    ("ssm_norm.weight", "linear_attn.norm.weight"),
    ("ssm_out.weight", "linear_attn.out_proj.weight"),
    ("ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight"),
    (
        "ffn_gate_shexp.weight",
        "mlp.shared_expert.gate_proj.weight",
    ),
    ("ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"),
    (
        "ffn_down_shexp.weight",
        "mlp.shared_expert.down_proj.weight",
    ),
];

/// The final norm, zero-centred too (the whole-model tensors are otherwise the shared ones).
pub(super) const FINAL_NORM: (&str, &str) = ("output_norm.weight", "model.norm.centred_weight");

/// `Qwen3_5MoeTextConfig`'s keys from qwen35moe's metadata (`experts`: `expert_count`).
pub(super) fn config_keys(
    k: &Keys,
    experts: u64,
    layers: u64,
    put: &mut dyn FnMut(&str, Value),
) -> Result<(), GgufError> {
    put("num_experts", json!(experts));
    put(
        "shared_expert_intermediate_size",
        json!(k.u64("expert_shared_feed_forward_length")?),
    );
    // The converter's ssm keys (Qwen3NextModel.set_gguf_parameters).
    put("linear_conv_kernel_dim", json!(k.u64("ssm.conv_kernel")?));
    put("linear_key_head_dim", json!(k.u64("ssm.state_size")?));
    put("linear_num_key_heads", json!(k.u64("ssm.group_count")?));
    let v_heads = k.u64("ssm.time_step_rank")?;
    put("linear_num_value_heads", json!(v_heads));
    let inner = k.u64("ssm.inner_size")?;
    if v_heads == 0 || !inner.is_multiple_of(v_heads) {
        return Err(k.bad(
            &k.key("ssm.inner_size"),
            format!("{inner}: not a whole number of heads of the {v_heads} value heads"),
        ));
    }
    put("linear_value_head_dim", json!(inner / v_heads));
    check_delta_shapes(k, layers, v_heads, inner)?;
    // `recurrent_layers` is layer_types (true: linear attention); without it transformers'
    // default from full_attention_interval applies, which the converter writes anyway.
    let key = k.key("attention.recurrent_layers");
    match k.m().get(&key) {
        Some(GgufValue::Array(_, v)) => {
            // The converter appends the MTP blocks as not recurrent; they are not layers.
            let types: Option<Vec<&str>> = v
                .iter()
                .take(layers as usize)
                .map(|b| match b {
                    GgufValue::Bool(true) => Some("linear_attention"),
                    GgufValue::Bool(false) => Some("full_attention"),
                    _ => None,
                })
                .collect();
            let types = types
                .filter(|t| t.len() == layers as usize)
                .ok_or_else(|| {
                    k.bad(
                        &key,
                        format!("expected at least {layers} bools, found {:?}", v),
                    )
                })?;
            put("layer_types", json!(types));
        }
        Some(v) => return Err(k.bad(&key, format!("expected an array of bools, found {v:?}"))),
        None => {
            if let Some(n) = k.u64_opt("full_attention_interval")? {
                put("full_attention_interval", json!(n));
            }
        }
    }
    Ok(())
}

/// Refuses ssm keys that contradict the first DeltaNet block's tensors, naming the key:
/// `ssm.time_step_rank` (value heads) against `ssm_a`, `ssm.inner_size` against `ssm_out`'s
/// columns, `ssm.conv_kernel` against the conv's taps, and the q/k/v channels
/// (`2 * ssm.group_count * ssm.state_size + inner`) against the conv's channels.
fn check_delta_shapes(k: &Keys, layers: u64, v_heads: u64, inner: u64) -> Result<(), GgufError> {
    let m = k.m();
    let Some(l) = (0..layers).find(|l| m.tensor(&format!("blk.{l}.ssm_a")).is_some()) else {
        return Ok(());
    };
    let channels = 2 * k.u64("ssm.group_count")? * k.u64("ssm.state_size")? + inner;
    for (key, tensor, dim, want) in [
        ("ssm.time_step_rank", "ssm_a", 0, v_heads),
        ("ssm.inner_size", "ssm_out.weight", 0, inner),
        (
            "ssm.conv_kernel",
            "ssm_conv1d.weight",
            0,
            k.u64("ssm.conv_kernel")?,
        ),
        ("ssm.state_size", "ssm_conv1d.weight", 1, channels),
    ] {
        let name = format!("blk.{l}.{tensor}");
        let Some(t) = m.tensor(&name) else { continue };
        let found = t.ne.get(dim).copied();
        if found != Some(want) {
            return Err(GgufError::Contradiction {
                path: m.parts[0].path().to_path_buf(),
                key: k.key(key),
                tensor: name,
                reason: format!("the keys give {want}, the tensor's ne[{dim}] is {found:?}"),
            });
        }
    }
    Ok(())
}
