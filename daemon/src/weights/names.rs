//! Tensor names as the engine reads them. Checkpoints that store a mixture of experts in
//! Mixtral's layout (MiniMax-M2: `block_sparse_moe.gate`, `block_sparse_moe.experts.{e}.w1`
//! / `w3` / `w2`, `block_sparse_moe.e_score_correction_bias`) are indexed under the names
//! transformers' own modules give the same weights (`mlp.gate`, `mlp.experts.{e}.gate_proj` /
//! `up_proj` / `down_proj`, `mlp.gate.e_score_correction_bias`), the names every loader, the
//! expert store and `convert` read. transformers renames them the same way when it loads such
//! a checkpoint (its `conversion_mapping.py`, `mixtral` and `minimax_m2`). A name in neither
//! layout is kept as it is; a checkpoint holding one weight under both names is refused as a
//! duplicate when the set is opened.

use std::borrow::Cow;

const MOE: &str = ".block_sparse_moe.";
/// DeepSeek-V4's routed experts (`{layer}.ffn.experts.{e}.w1` / `w3` / `w2`): indexed under
/// `model.layers.{l}.mlp.experts.{e}.gate_proj` / `up_proj` / `down_proj`, where the expert
/// store reads every family's. Its other tensors keep the reference's names.
const V4_EXPERTS: &str = ".ffn.experts.";

/// `name` under the engine's naming (see the module's note).
pub fn canonical(name: &str) -> Cow<'_, str> {
    if let Some(at) = name.find(V4_EXPERTS) {
        let (head, rest) = (&name[..at], &name[at + V4_EXPERTS.len()..]);
        let mut parts = rest.splitn(3, '.');
        let proj = |w: &str| match w {
            "w1" => Some("gate_proj"),
            "w3" => Some("up_proj"),
            "w2" => Some("down_proj"),
            _ => None,
        };
        if let (Some(e), Some(Some(p)), Some(tail)) =
            (parts.next(), parts.next().map(proj), parts.next())
        {
            if e.parse::<u32>().is_ok() {
                // The published files name layers `layers.{l}`, transformers `model.layers.{l}`.
                let model = if head.starts_with("layers.") {
                    "model."
                } else {
                    ""
                };
                return Cow::Owned(format!("{model}{head}.mlp.experts.{e}.{p}.{tail}"));
            }
        }
    }
    let Some(at) = name.find(MOE) else {
        return Cow::Borrowed(name);
    };
    let (head, rest) = (&name[..at], &name[at + MOE.len()..]);
    let rest = if rest == "e_score_correction_bias" {
        "gate.e_score_correction_bias".to_string()
    } else if let Some(expert) = rest.strip_prefix("experts.") {
        // `{e}.w1.weight` (or `.weight_scale_inv`): the projection after the expert's index.
        let mut parts = expert.splitn(3, '.');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(e), Some(w), Some(tail)) if e.parse::<u32>().is_ok() => {
                let proj = match w {
                    "w1" => "gate_proj",
                    "w3" => "up_proj",
                    "w2" => "down_proj",
                    other => other,
                };
                format!("experts.{e}.{proj}.{tail}")
            }
            _ => rest.to_string(),
        }
    } else {
        rest.to_string()
    };
    Cow::Owned(format!("{head}.mlp.{rest}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixtral_layout_names_read_as_transformers_names_them() {
        let l = "model.layers.3";
        for (from, to) in [
            ("block_sparse_moe.gate.weight", "mlp.gate.weight"),
            (
                "block_sparse_moe.e_score_correction_bias",
                "mlp.gate.e_score_correction_bias",
            ),
            (
                "block_sparse_moe.experts.17.w1.weight",
                "mlp.experts.17.gate_proj.weight",
            ),
            (
                "block_sparse_moe.experts.0.w3.weight",
                "mlp.experts.0.up_proj.weight",
            ),
            (
                "block_sparse_moe.experts.255.w2.weight_scale_inv",
                "mlp.experts.255.down_proj.weight_scale_inv",
            ),
        ] {
            assert_eq!(canonical(&format!("{l}.{from}")), format!("{l}.{to}"));
        }
        for kept in [
            "model.layers.3.mlp.experts.1.gate_proj.weight",
            "model.layers.3.self_attn.q_norm.weight",
            "lm_head.weight",
        ] {
            assert!(matches!(canonical(kept), Cow::Borrowed(k) if k == kept));
        }
    }

    #[test]
    fn deepseek_v4_experts_read_where_the_store_reads_them() {
        for (from, to) in [
            (
                "model.layers.2.ffn.experts.7.w1.weight",
                "model.layers.2.mlp.experts.7.gate_proj.weight",
            ),
            (
                "layers.0.ffn.experts.255.w2.scale",
                "model.layers.0.mlp.experts.255.down_proj.scale",
            ),
            (
                "layers.1.ffn.experts.3.w3.weight",
                "model.layers.1.mlp.experts.3.up_proj.weight",
            ),
        ] {
            assert_eq!(canonical(from), to);
        }
        // The shared expert and the router keep their names.
        for kept in [
            "model.layers.2.ffn.shared_experts.w1.weight",
            "layers.2.ffn.gate.tid2eid",
        ] {
            assert!(matches!(canonical(kept), Cow::Borrowed(k) if k == kept));
        }
    }
}
