//! llama.cpp's `deepseek2` (DeepSeek-V3/R1, Kimi K2): its MLA hyper-parameters as
//! DeepSeek-V3's config.json keys, and `kv_b_proj` rebuilt from the two halves the converter
//! splits it into.
//!
//! llama.cpp computes MLA absorbed, so its converter (`DeepseekV2Model.modify_tensors`) cuts
//! `kv_b_proj` ([heads * (nope + v), kv_lora]) per head into `attn_k_b`, the key half
//! transposed ([heads, kv_lora, nope]), and `attn_v_b`, the value half ([heads, v, kv_lora]).
//! The engine's MLA reads `kv_b_proj` (and absorbs it itself), so the load puts it back
//! together: per head, k_b's transpose then v_b.

use serde_json::{json, Value};

use super::config::Keys;
use super::{GgufError, GgufModel};
use crate::error::EngineError;
use crate::model::linear::Linear;
use crate::quant::{QFormat, QMatrix};
use crate::weights::ShardSet;

/// DeepSeek-V3's config keys from deepseek2's metadata (`experts`: `expert_count`).
pub(super) fn config_keys(
    k: &Keys,
    m: &GgufModel,
    experts: u64,
    put: &mut dyn FnMut(&str, Value),
) -> Result<(), GgufError> {
    put("n_routed_experts", json!(experts));
    put(
        "n_shared_experts",
        json!(k.u64_opt("expert_shared_count")?.unwrap_or(0)),
    );
    let dense = k.u64_opt("leading_dense_block_count")?.unwrap_or(0);
    put("first_k_dense_replace", json!(dense));
    put(
        "routed_scaling_factor",
        json!(k.f64_opt("expert_weights_scale")?.unwrap_or(1.0)),
    );
    put(
        "n_group",
        json!(k.u64_opt("expert_group_count")?.unwrap_or(1)),
    );
    put(
        "topk_group",
        json!(k.u64_opt("expert_group_used_count")?.unwrap_or(1)),
    );
    // DeepSeek-V3 routes with a sigmoid and a correction bias (gating func 2); V2's softmax
    // routing (a GGUF without the key, made before it existed, and without the bias) is not
    // what colibri's deepseek_v3 computes.
    let bias = m.tensor(&format!("blk.{dense}.exp_probs_b.bias")).is_some();
    k.sigmoid_router(
        bias,
        "colibri runs deepseek2 as DeepSeek-V3, whose router is a sigmoid with a correction \
         bias (exp_probs_b.bias)",
    )?;
    put("scoring_func", json!("sigmoid"));
    put("topk_method", json!("noaux_tc"));
    let rope = k.u64("rope.dimension_count")?;
    put("qk_rope_head_dim", json!(rope));
    put("head_dim", json!(rope));
    // The per-head dims: `*_length_mla` since llama.cpp split kv_b; older files wrote them
    // as `key_length` / `value_length`.
    let key = match k.u64_opt("attention.key_length_mla")? {
        Some(n) => n,
        None => k.u64("attention.key_length")?,
    };
    let v = match k.u64_opt("attention.value_length_mla")? {
        Some(n) => n,
        None => k.u64("attention.value_length")?,
    };
    let nope = key.checked_sub(rope).filter(|&n| n > 0).ok_or_else(|| {
        k.bad(
            &k.key("attention.key_length_mla"),
            format!("{key}: not more than the {rope} rotary dimensions"),
        )
    })?;
    put("qk_nope_head_dim", json!(nope));
    put("v_head_dim", json!(v));
    put("kv_lora_rank", json!(k.u64("attention.kv_lora_rank")?));
    put(
        "q_lora_rank",
        k.u64_opt("attention.q_lora_rank")?
            .map_or(Value::Null, |r| json!(r)),
    );
    // llama.cpp's deepseek2 rotates interleaved pairs (its "norm" rope), as DeepSeek does.
    put("rope_interleave", json!(true));
    Ok(())
}

/// `kv_b_proj` of attention `attn` (`model.layers.N.self_attn`) rebuilt from a GGUF's
/// `k_b_proj` / `v_b_proj` halves, in format `fmt` as the loader would quantize it; `None`
/// when the model has no such halves (it stores `kv_b_proj` whole).
pub fn kv_b(
    s: &ShardSet,
    attn: &str,
    heads: usize,
    (nope, v, kv_lora): (usize, usize, usize),
    fmt: QFormat,
) -> Result<Option<Linear>, EngineError> {
    let (kb, vb) = (
        format!("{attn}.k_b_proj.weight"),
        format!("{attn}.v_b_proj.weight"),
    );
    if s.get(&kb).is_none() || s.get(&format!("{attn}.kv_b_proj.weight")).is_some() {
        return Ok(None);
    }
    let k = s.read_f32(&kb, &[heads, kv_lora, nope])?;
    let vw = s.read_f32(&vb, &[heads, v, kv_lora])?;
    let w = assemble(&k, &vw, heads, nope, v, kv_lora);
    let rows = heads * (nope + v);
    let w = if fmt == QFormat::F32 {
        QMatrix::from_f32(w, rows, kv_lora)
    } else {
        QMatrix::quantize(&w, rows, kv_lora, fmt)
    };
    Ok(Some(Linear {
        w,
        bias: None,
        slot: Default::default(),
    }))
}

/// kv_b's rows ([heads * (nope + v), kv_lora]) from k_b ([heads, kv_lora, nope]) and v_b
/// ([heads, v, kv_lora]): head h's nope key rows are k_b[h] transposed, its v rows v_b[h].
fn assemble(k: &[f32], v: &[f32], heads: usize, nope: usize, vd: usize, l: usize) -> Vec<f32> {
    let mut w = Vec::with_capacity(heads * (nope + vd) * l);
    for h in 0..heads {
        let kh = &k[h * l * nope..(h + 1) * l * nope];
        for i in 0..nope {
            w.extend((0..l).map(|j| kh[j * nope + i]));
        }
        w.extend_from_slice(&v[h * vd * l..(h + 1) * vd * l]);
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The converter's split, in Python terms: `kv_b.view(H, nope + v, L)`, split on dim 1,
    /// k_b transposed (1, 2); assembling its outputs gives kv_b back.
    #[test]
    fn assemble_inverts_the_converters_split() {
        let (h, nope, v, l) = (3, 4, 2, 5);
        let kv_b: Vec<f32> = (0..h * (nope + v) * l).map(|i| i as f32).collect();
        let at = |hh: usize, r: usize, c: usize| kv_b[(hh * (nope + v) + r) * l + c];
        let mut k_b = Vec::new(); // [h, l, nope]
        let mut v_b = Vec::new(); // [h, v, l]
        for hh in 0..h {
            for c in 0..l {
                for r in 0..nope {
                    k_b.push(at(hh, r, c));
                }
            }
            for r in nope..nope + v {
                for c in 0..l {
                    v_b.push(at(hh, r, c));
                }
            }
        }
        assert_eq!(assemble(&k_b, &v_b, h, nope, v, l), kv_b);
    }
}
