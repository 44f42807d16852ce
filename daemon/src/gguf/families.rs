//! The `config.json` keys of the GGUF architectures whose Hugging Face config has keys of its
//! own beyond the shared ones `config::config_json` writes: gpt-oss (llama.cpp's
//! `gpt-oss`, LLM_ARCH_OPENAI_MOE) and MiniMax-M2 (`minimax-m2`). Each is what llama.cpp's
//! loader reads for that architecture (`src/models/openai-moe.cpp`, `minimax-m2.cpp`), and
//! a key that would make llama.cpp compute something colibri's family does not is refused
//! naming it.

use serde_json::{json, Value};

use super::config::Keys;
use super::meta::GgufValue;
use super::{GgufError, GgufModel};

/// gpt-oss: its experts are `intermediate_size` wide; the window and which layers slide
/// (`attention.sliding_window_pattern`: a bool per layer, or every `n`-th layer full, as
/// llama.cpp's `load_swa_pattern` reads it, its default 2: even layers slide, transformers'
/// default `layer_types` too). The swiglu's alpha and limit have no key (llama.cpp computes
/// with gpt-oss's 1.702 and 7.0, GptOssConfig's defaults).
pub(super) fn gpt_oss_keys(
    k: &Keys,
    m: &GgufModel,
    experts: u64,
    blocks: u64,
    put: &mut dyn FnMut(&str, Value),
) -> Result<(), GgufError> {
    put("num_local_experts", json!(experts));
    put(
        "intermediate_size",
        json!(k.u64("expert_feed_forward_length")?),
    );
    put("sliding_window", json!(k.u64("attention.sliding_window")?));
    let key = k.key("attention.sliding_window_pattern");
    let sliding: Vec<bool> = match m.get(&key) {
        None => (0..blocks).map(|l| l % 2 == 0).collect(),
        Some(GgufValue::Array(_, v)) => {
            if v.len() as u64 != blocks {
                return Err(k.bad(
                    &key,
                    format!("{} entries for {blocks} layers; one per layer", v.len()),
                ));
            }
            v.iter()
                .enumerate()
                .map(|(i, x)| match x {
                    GgufValue::Bool(b) => Ok(*b),
                    other => Err(k.bad(&key, format!("entry {i} is {other:?}, not a bool"))),
                })
                .collect::<Result<_, _>>()?
        }
        Some(v) => {
            let n = v.as_u64().ok_or_else(|| {
                k.bad(
                    &key,
                    format!("expected a bool per layer or a period, found {v:?}"),
                )
            })?;
            // llama_hparams::set_swa_pattern: every n-th layer is a full one (0: none is).
            (0..blocks).map(|l| n == 0 || l % n < n - 1).collect()
        }
    };
    let types: Vec<&str> = sliding
        .iter()
        .map(|&s| match s {
            true => "sliding_attention",
            false => "full_attention",
        })
        .collect();
    put("layer_types", json!(types));
    // colibri's gpt-oss has one rope base for both kinds of layer, as every published one.
    if let Some(swa) = k.f64_opt("rope.freq_base_swa")? {
        let base = k.f64_opt("rope.freq_base")?.unwrap_or(10000.0);
        if swa != base {
            return Err(k.bad(
                &k.key("rope.freq_base_swa"),
                format!("{swa}; colibri's gpt-oss rotates every layer with rope.freq_base {base}"),
            ));
        }
    }
    Ok(())
}

/// MiniMax-M2: experts `intermediate_size` wide, rotary on the first `rotary_dim` values of a
/// head (`rope.dimension_count`), and a sigmoid router, which llama.cpp reads from
/// `expert_gating_func` (it has no default for this architecture: without the key it does not
/// run the model, so neither does colibri).
pub(super) fn minimax_m2_keys(
    k: &Keys,
    m: &GgufModel,
    experts: u64,
    head_dim: Option<u64>,
    put: &mut dyn FnMut(&str, Value),
) -> Result<(), GgufError> {
    put("num_local_experts", json!(experts));
    put(
        "intermediate_size",
        json!(k.u64("expert_feed_forward_length")?),
    );
    // MiniMaxM2Config's own default bos is the published vocabulary's; a GGUF says its own
    // (or none), as its config.json did.
    let bos = m
        .get("tokenizer.ggml.bos_token_id")
        .and_then(GgufValue::as_u64);
    put("bos_token_id", json!(bos));
    if let Some(d) = k.u64_opt("rope.dimension_count")? {
        if head_dim.is_some_and(|h| d > h) {
            return Err(k.bad(
                &k.key("rope.dimension_count"),
                format!("{d} is wider than a head ({head_dim:?})"),
            ));
        }
        put("rotary_dim", json!(d));
    }
    // llama.cpp has no default for this architecture: without the key it does not run.
    k.sigmoid_router(false, "MiniMax-M2 routes with a sigmoid")?;
    put("scoring_func", json!("sigmoid"));
    Ok(())
}
