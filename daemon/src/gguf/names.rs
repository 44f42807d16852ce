//! llama.cpp's tensor names mapped onto the engine's (the Hugging Face names the model loader
//! reads), as [`crate::weights::TensorInfo`]s pointing into the GGUF's own bytes: nothing is
//! copied. A stacked experts tensor (`blk.N.ffn_{gate,up,down}_exps`, or the fused
//! `ffn_gate_up_exps`) becomes one tensor per expert at that expert's byte range, so the
//! expert store reads each expert by positional reads as from a safetensors shard.
//!
//! The architectures mapped here (glm4moe, qwen3moe, qwen35moe, gpt-oss, minimax-m2:
//! NeoX-ordered rope; deepseek2, glm-dsa, deepseek32: interleaved, as DeepSeek's own) have
//! their q/k rows written as transformers holds them (llama.cpp's converter permutes only the
//! llama family's), so no row is reordered; qwen35moe's names and the layouts its DeltaNet
//! keeps are in `qwen35`, deepseek4's names (DeepSeek-V4's published ones) in `dsv4`.
//! gpt-oss's stacked experts carry biases (`ffn_*_exps.bias`, one row per expert), mapped per
//! expert beside the weights.

use super::file::TensorInfo as GgufTensor;
use super::types::GgmlType;
use super::{expert_range, GgufError, GgufModel};
use crate::weights::{Dtype, TensorInfo};

/// Per-block tensors, llama.cpp's suffix to ours (after `model.layers.N.`). `ffn_norm` and
/// `post_attention_norm` are the same tensor under the names different architectures give
/// transformers' `post_attention_layernorm`.
const BLOCK: [(&str, &str); 24] = [
    ("attn_norm.weight", "input_layernorm.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
    (
        "post_attention_norm.weight",
        "post_attention_layernorm.weight",
    ),
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    ("attn_q.bias", "self_attn.q_proj.bias"),
    ("attn_k.bias", "self_attn.k_proj.bias"),
    ("attn_v.bias", "self_attn.v_proj.bias"),
    ("attn_output.bias", "self_attn.o_proj.bias"),
    // gpt-oss's learned sink logit per head.
    ("attn_sinks.weight", "self_attn.sinks"),
    ("attn_q_norm.weight", "self_attn.q_norm.weight"),
    ("attn_k_norm.weight", "self_attn.k_norm.weight"),
    ("ffn_gate.weight", "mlp.gate_proj.weight"),
    ("ffn_up.weight", "mlp.up_proj.weight"),
    ("ffn_down.weight", "mlp.down_proj.weight"),
    ("ffn_gate_inp.weight", "mlp.gate.weight"),
    ("exp_probs_b.bias", "mlp.gate.e_score_correction_bias"),
    (
        "ffn_gate_shexp.weight",
        "mlp.shared_experts.gate_proj.weight",
    ),
    ("ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight"),
    (
        "ffn_down_shexp.weight",
        "mlp.shared_experts.down_proj.weight",
    ),
    // GLM-4.5's MTP block (llama.cpp's `nextn.*`), read by the MTP head's loader.
    ("nextn.eh_proj.weight", "eh_proj.weight"),
    ("nextn.enorm.weight", "enorm.weight"),
];

/// More of the MTP block (kept apart to keep the table above readable).
const NEXTN: [(&str, &str); 4] = [
    ("nextn.hnorm.weight", "hnorm.weight"),
    ("nextn.shared_head_norm.weight", "shared_head.norm.weight"),
    ("nextn.shared_head_head.weight", "shared_head.head.weight"),
    ("nextn.embed_tokens.weight", "embed_tokens.weight"),
];

/// deepseek2's MLA attention. `attn_k_b` / `attn_v_b` are the two halves of `kv_b_proj`,
/// mapped under names of their own that `mla::kv_b` puts back together at load.
const MLA: [(&str, &str); 8] = [
    ("attn_q_a.weight", "self_attn.q_a_proj.weight"),
    ("attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight"),
    ("attn_q_b.weight", "self_attn.q_b_proj.weight"),
    (
        "attn_kv_a_mqa.weight",
        "self_attn.kv_a_proj_with_mqa.weight",
    ),
    ("attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight"),
    ("attn_kv_b.weight", "self_attn.kv_b_proj.weight"),
    ("attn_k_b.weight", "self_attn.k_b_proj.weight"),
    ("attn_v_b.weight", "self_attn.v_b_proj.weight"),
];

/// gpt-oss's biased router, which transformers calls `mlp.router` (every other family's
/// `ffn_gate_inp` is `mlp.gate`).
const OSS_ROUTER: [(&str, &str); 2] = [
    ("ffn_gate_inp.weight", "mlp.router.weight"),
    ("ffn_gate_inp.bias", "mlp.router.bias"),
];

/// Whole-model tensors.
const GLOBAL: [(&str, &str); 3] = [
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

/// Stacked experts: llama.cpp's suffix and our projection names (the fused gate_up holds
/// gate's rows then up's, per expert).
const EXPS: [(&str, &[&str]); 4] = [
    ("ffn_gate_exps.weight", &["gate_proj"]),
    ("ffn_up_exps.weight", &["up_proj"]),
    ("ffn_down_exps.weight", &["down_proj"]),
    ("ffn_gate_up_exps.weight", &["gate_proj", "up_proj"]),
];

/// The stacked experts' biases (gpt-oss's; ne = [rows, experts]): llama.cpp's converter
/// de-interleaves the published gate_up bias into gate's and up's, as it does their rows.
const EXPS_BIAS: [(&str, &str); 3] = [
    ("ffn_gate_exps.bias", "gate_proj"),
    ("ffn_up_exps.bias", "up_proj"),
    ("ffn_down_exps.bias", "down_proj"),
];

/// The engine's dtype of a GGUF type: the float types as themselves, the quantized types
/// colibri computes as stored as their blocks (`None`: a type it does not read).
fn dtype(ty: GgmlType) -> Option<Dtype> {
    match ty {
        GgmlType::F32 => Some(Dtype::F32),
        GgmlType::F16 => Some(Dtype::F16),
        GgmlType::BF16 => Some(Dtype::BF16),
        t if crate::quant::ggml::act_kind(t).is_some() => Some(Dtype::Ggml(t)),
        _ => None,
    }
}

/// Every tensor of `m` under the engine's names. A tensor of a name llama.cpp's mapped
/// architectures do not write, or of a type colibri does not read yet, is refused by name.
pub fn tensors(m: &GgufModel) -> Result<Vec<TensorInfo>, GgufError> {
    // Names an architecture gives its own meaning, looked up before the shared tables.
    let keys = super::config::Keys::of(m)?;
    let (arch_block, arch_global): (&[(&str, &str)], &[(&str, &str)]) = match keys.arch {
        "gpt-oss" => (&OSS_ROUTER, &[]),
        "qwen35moe" => (super::qwen35::BLOCK, &[super::qwen35::FINAL_NORM]),
        "deepseek4" => (super::dsv4::BLOCK, super::dsv4::GLOBAL),
        _ => (&[], &[]),
    };
    // Qwen3.5's MTP block (the converter writes it unless `--no-mtp`) is left unread:
    // colibri has no Qwen3.5 draft head (the checkpoint's `mtp.*` are not read either), and
    // under the engine's names GLM's MTP loader would take it for its own.
    let unread_from = match keys.arch {
        "qwen35moe" => Some(keys.trunk_and_mtp()?.0 as usize),
        _ => None,
    };
    let mut out = Vec::new();
    for t in m.tensors() {
        let refuse = |reason: String| GgufError::Tensor {
            path: m.tensor_path(t).to_path_buf(),
            tensor: t.name.clone(),
            reason,
        };
        // DeepSeek-V4's hash routing table is the one integer tensor read (as numbers).
        let hash_table = t.ty == GgmlType::I32 && t.name.ends_with(super::dsv4::HASH_TABLE);
        let dt = hash_table
            .then_some(Dtype::I32)
            .or_else(|| dtype(t.ty))
            .ok_or_else(|| {
                refuse(format!(
                    "type {}: colibri reads GGUF tensors of F32, F16, BF16 and {}",
                    t.ty.name(),
                    crate::quant::ggml::COMPUTED.map(|t| t.name()).join(", ")
                ))
            })?;
        let shape: Vec<usize> = t.ne.iter().rev().map(|&n| n as usize).collect();
        let plain = |name: String| TensorInfo {
            name,
            dtype: dt,
            shape: shape.clone(),
            file: t.part,
            offset: t.offset,
            len: t.n_bytes,
        };
        if let Some((_, ours)) = arch_global
            .iter()
            .chain(GLOBAL.iter())
            .find(|(g, _)| *g == t.name)
        {
            out.push(plain(ours.to_string()));
            continue;
        }
        let Some((layer, suffix)) = block_of(&t.name) else {
            return Err(refuse(
                "not a tensor colibri maps from llama.cpp's names".into(),
            ));
        };
        if unread_from.is_some_and(|n| layer >= n) {
            continue;
        }
        if let Some((_, ours)) = arch_block
            .iter()
            .chain(BLOCK.iter())
            .chain(NEXTN.iter())
            .chain(MLA.iter())
            .chain(super::dsa::NAMES.iter())
            .find(|(g, _)| *g == suffix)
        {
            out.push(plain(format!("model.layers.{layer}.{ours}")));
            continue;
        }
        if let Some((_, proj)) = EXPS_BIAS.iter().find(|(g, _)| *g == suffix) {
            out.extend(expert_biases(t, layer, proj, dt)?);
            continue;
        }
        let Some((_, projs)) = EXPS.iter().find(|(g, _)| *g == suffix) else {
            return Err(refuse(
                "not a tensor colibri maps from llama.cpp's names".into(),
            ));
        };
        out.extend(experts(t, layer, projs, dt)?);
    }
    Ok(out)
}

/// `blk.N.rest` as (N, rest).
fn block_of(name: &str) -> Option<(usize, &str)> {
    let rest = name.strip_prefix("blk.")?;
    let (n, suffix) = rest.split_once('.')?;
    Some((n.parse().ok()?, suffix))
}

/// One tensor per expert and projection of stacked experts tensor `t` (ne = [cols, rows,
/// experts]; a fused gate_up has 2 x rows, gate's first), each at its byte range.
fn experts(
    t: &GgufTensor,
    layer: usize,
    projs: &[&str],
    dt: Dtype,
) -> Result<Vec<TensorInfo>, GgufError> {
    if t.ne.len() != 3 || t.ne[1] % projs.len() as u64 != 0 {
        return Err(GgufError::NotExperts {
            tensor: t.name.clone(),
            reason: format!(
                "shape {:?}; expected [cols, rows, experts] with rows a multiple of {}",
                t.ne,
                projs.len()
            ),
        });
    }
    let rows = t.ne[1] / projs.len() as u64;
    let part_bytes = rows * t.row_bytes();
    let mut out = Vec::with_capacity(t.ne[2] as usize * projs.len());
    for e in 0..t.ne[2] {
        let r = expert_range(t, e)?;
        for (i, p) in projs.iter().enumerate() {
            out.push(TensorInfo {
                name: format!("model.layers.{layer}.mlp.experts.{e}.{p}.weight"),
                dtype: dt,
                shape: vec![rows as usize, t.ne[0] as usize],
                file: t.part,
                offset: r.start + i as u64 * part_bytes,
                len: part_bytes,
            });
        }
    }
    Ok(out)
}

/// One bias per expert of stacked bias tensor `t` (ne = [rows, experts]; expert `e`'s
/// values are row `e`, contiguous).
fn expert_biases(
    t: &GgufTensor,
    layer: usize,
    proj: &str,
    dt: Dtype,
) -> Result<Vec<TensorInfo>, GgufError> {
    if t.ne.len() != 2 || !matches!(dt, Dtype::F32 | Dtype::F16 | Dtype::BF16) {
        return Err(GgufError::NotExperts {
            tensor: t.name.clone(),
            reason: format!(
                "{} {:?}; expected a float [rows, experts] of the experts' biases",
                t.ty.name(),
                t.ne
            ),
        });
    }
    let per = t.row_bytes();
    Ok((0..t.ne[1])
        .map(|e| TensorInfo {
            name: format!("model.layers.{layer}.mlp.experts.{e}.{proj}.bias"),
            dtype: dt,
            shape: vec![t.ne[0] as usize],
            file: t.part,
            offset: t.offset + e * per,
            len: per,
        })
        .collect())
}
