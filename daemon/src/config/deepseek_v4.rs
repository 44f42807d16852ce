//! `deepseek_v4` (DeepSeek-V4-Flash, V4-Pro): transformers' `DeepseekV4Config`. Every layer's
//! attention is one shared key=value head (`head_dim` wide, rotary on its last
//! `qk_rope_head_dim` values) over a sliding window, and, by `layer_types`, either that alone
//! (`sliding_attention`), plus entries compressed from every `compress_rates` tokens and picked
//! by a small indexer (`compressed_sparse_attention`, CSA) or plus all entries compressed
//! from every much larger block (`heavily_compressed_attention`, HCA). The output projection
//! is grouped low-rank (`o_groups`, `o_lora_rank`). The residual is `hc_mult` streams mixed
//! by hyper-connections (Sinkhorn-normalised). Every feed-forward is a mixture of experts
//! with one shared expert and the clamped SwiGLU (`swiglu_limit`); its router picks experts
//! by token id (`hash_moe`, the first `num_hash_layers`) or by score (`moe`), the scores
//! `sqrt(softplus(logit))` (`scoring_func`).
//!
//! Published files write the per-layer schedule the reference way (`compress_ratios`, one
//! 0/4/128 per layer, and `num_hash_layers`); transformers folds those into `layer_types` and
//! `mlp_layer_types`, and reads either. Their `rope_scaling` (YaRN) applies to the compressed
//! layers only (`compress_rope_theta`), the sliding ones keep plain `rope_theta`.

use serde_json::{Map, Value};

use super::*;

/// A layer's attention kind (`layer_types`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dsv4Attn {
    /// The sliding window alone.
    Sliding,
    /// Compressed sparse attention: overlapping compressed blocks picked by the indexer.
    Csa,
    /// Heavily compressed attention: every compressed block.
    Hca,
}

impl Dsv4Attn {
    const NAMES: [(&'static str, Dsv4Attn); 3] = [
        ("sliding_attention", Dsv4Attn::Sliding),
        ("compressed_sparse_attention", Dsv4Attn::Csa),
        ("heavily_compressed_attention", Dsv4Attn::Hca),
    ];
}

/// What DeepSeek-V4 adds to the common keys.
#[derive(Clone, Debug, PartialEq)]
pub struct Dsv4Config {
    /// The one key=value head's width (and every query head's).
    pub head_dim: usize,
    /// The rotated tail of a head (`head_dim * partial_rotary_factor`, or `qk_rope_head_dim`).
    pub rope_dim: usize,
    pub q_lora_rank: usize,
    pub o_groups: usize,
    pub o_lora_rank: usize,
    /// A query sees itself and the `sliding_window - 1` keys before it.
    pub sliding_window: usize,
    /// One entry per layer.
    pub layer_types: Vec<Dsv4Attn>,
    /// Tokens per compressed entry of the CSA and HCA layers.
    pub csa_rate: usize,
    pub hca_rate: usize,
    /// One entry per layer: whether its router picks experts by token id (`hash_moe`).
    pub hash: Vec<bool>,
    pub hc_mult: usize,
    pub hc_sinkhorn_iters: usize,
    pub hc_eps: f32,
    pub index_n_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    /// The clamp of the SwiGLU's gate (above) and up (both sides) projections.
    pub swiglu_limit: f32,
    /// The compressed layers' rotary (the sliding ones use the config's `rope_theta`, plain).
    pub compress_rope_theta: f64,
    pub compress_yarn: Option<Yarn>,
}

impl Dsv4Config {
    /// Tokens per compressed entry of layer `l` (0: a sliding layer, nothing compressed).
    pub fn rate(&self, l: usize) -> usize {
        match self.layer_types.get(l) {
            Some(Dsv4Attn::Csa) => self.csa_rate,
            Some(Dsv4Attn::Hca) => self.hca_rate,
            _ => 0,
        }
    }

    /// The parameters of one decoder layer of attention kind `kind` (everything but its
    /// routed experts and its router's selection table), as transformers builds it.
    fn layer_params(&self, c: &ModelConfig, kind: Dsv4Attn) -> u64 {
        let h = c.hidden_size as u64;
        let heads = c.num_attention_heads as u64;
        let (hd, ql) = (self.head_dim as u64, self.q_lora_rank as u64);
        let (g, olr) = (self.o_groups as u64, self.o_lora_rank as u64);
        // q_a_proj, q_a_norm, q_b_proj, kv_proj, kv_norm, o_a_proj, o_b_proj, sinks.
        let mut n = h * ql + ql + ql * heads * hd + h * hd + hd;
        n += heads * hd / g * g * olr + g * olr * h + heads;
        let (ihd, ih) = (self.index_head_dim as u64, self.index_n_heads as u64);
        n += match kind {
            Dsv4Attn::Sliding => 0,
            // kv_proj, gate_proj, position_bias, kv_norm.
            Dsv4Attn::Hca => 2 * h * hd + self.hca_rate as u64 * hd + hd,
            // The same over two series, and the indexer: its own compressor at index_head_dim,
            // q_b_proj and weights_proj.
            Dsv4Attn::Csa => {
                let rate = self.csa_rate as u64;
                4 * h * hd
                    + rate * 2 * hd
                    + hd
                    + 4 * h * ihd
                    + rate * 2 * ihd
                    + ihd
                    + ql * ih * ihd
                    + h * ih
            }
        };
        // input_layernorm, post_attention_layernorm, and two hyper-connections.
        let m = self.hc_mult as u64;
        n += 2 * h + 2 * ((2 + m) * m * m * h + (2 + m) * m + 3);
        // The router's weight and the shared expert.
        let inter = c.moe_intermediate_size as u64;
        n + c.n_routed_experts as u64 * h + 3 * h * inter
    }

    /// The counts `info` reports, with `mtp_layers` MTP layers.
    pub(crate) fn count(&self, c: &ModelConfig, mtp_layers: u64) -> super::params::ParamCount {
        let h = c.hidden_size as u64;
        let experts = c.n_routed_experts as u64;
        let expert = 3 * h * c.moe_intermediate_size as u64;
        let top_k = c.num_experts_per_tok as u64;
        let (mut total, mut active) = (0u64, 0u64);
        for l in 0..c.num_hidden_layers {
            let layer = self.layer_params(c, self.layer_types[l]);
            // A hash layer's token-id table (a token reads one row, like the embedding's), a
            // learned one's correction bias.
            let (table, bias) = match self.hash[l] {
                true => (c.vocab_size as u64 * top_k, 0),
                false => (0, experts),
            };
            total += layer + bias + table + experts * expert;
            active += layer + bias + top_k * expert;
        }
        let embedding = c.vocab_size as u64 * h;
        let head = if c.tie_word_embeddings { 0 } else { embedding };
        let m = self.hc_mult as u64;
        // The final norm and the hyper-head that folds the streams into one.
        let tail = h + m * m * h + m + 1;
        // The reference's MTP layer: a sliding, score-routed layer with its experts, e_proj and
        // h_proj (h x h each), enorm, hnorm, its norm and its own hyper-head.
        let mtp_layer = self.layer_params(c, Dsv4Attn::Sliding)
            + experts
            + experts * expert
            + 2 * h * h
            + 3 * h
            + m * m * h
            + m
            + 1;
        super::params::ParamCount {
            total: total + embedding + head + tail,
            active: active + embedding + tail,
            embedding,
            mtp: mtp_layers * mtp_layer,
        }
    }
}

pub(super) fn parse(c: &Keys<'_>) -> Result<ModelConfig, ConfigError> {
    let mut common = Common::parse(
        c,
        &Defaults {
            vocab: 129280,
            hidden: 4096,
            intermediate: 2048,
            moe_intermediate: 2048,
            layers: 43,
            heads: 64,
            experts: 256,
            norm_topk_prob: true,
            eps: 1e-6,
            max_positions: 1048576,
            bos: Some(0),
        },
    )?;
    // DeepseekV4Config maps `intermediate_size` onto `moe_intermediate_size`: the shared
    // expert is as wide as a routed one. Its default is 6 experts a token.
    common.intermediate_size = common.moe_intermediate_size;
    common.num_experts_per_tok =
        c.usize_in("num_experts_per_tok", 6, 1, common.n_routed_experts)?;
    // The router always normalises its k weights (DeepseekV4TopKRouter ignores the key).
    common.norm_topk_prob = true;
    // No projection of this family has a bias.
    common.attention_bias = false;
    let heads = common.num_attention_heads;
    let layers = common.num_hidden_layers;
    if let Some(v) = c.get("num_key_value_heads").filter(|v| !v.is_null()) {
        if c.uint("num_key_value_heads", v)? != 1 {
            return Err(unsupported(
                "num_key_value_heads",
                v,
                "DeepSeek-V4's attention has exactly one key=value head",
            ));
        }
    }
    let shared = c.usize_in("n_shared_experts", 1, 0, MAX_SHARED_EXPERTS)?;
    if shared != 1 {
        return Err(ConfigError::Unsupported {
            key: "n_shared_experts".into(),
            value: shared.to_string(),
            why: "DeepSeek-V4 builds exactly one shared expert (DeepseekV4MLP), so it must be 1"
                .into(),
        });
    }
    let head_dim = c.usize_in("head_dim", 512, 2, MAX_HEAD_DIM)?;
    let rope_dim = rope_dim(c, head_dim)?;
    let q_lora_rank = c.usize_in("q_lora_rank", 1024, 1, MAX_LORA_RANK)?;
    let o_groups = c.usize_in("o_groups", 8, 1, MAX_HEADS)?;
    if !heads.is_multiple_of(o_groups) {
        return Err(ConfigError::Invalid {
            key: "o_groups".into(),
            value: o_groups.to_string(),
            why: format!(
                "the grouped output projection splits the heads into o_groups groups, so it \
                 must divide num_attention_heads ({heads})"
            ),
        });
    }
    let o_lora_rank = c.usize_in("o_lora_rank", 1024, 1, MAX_LORA_RANK)?;
    let sliding_window = c.usize_in("sliding_window", 128, 1, MAX_POSITIONS)?;
    let (csa_rate, hca_rate) = compress_rates(c)?;
    let layer_types = layer_types(c, layers)?;
    let hash = mlp_layer_types(c, layers)?;
    let hc_mult = c.usize_in("hc_mult", 4, 1, 64)?;
    let hc_sinkhorn_iters = c.usize_in("hc_sinkhorn_iters", 20, 1, 10000)?;
    let hc_eps = c.f64_in("hc_eps", 1e-6, "a finite number in (0, 1)", |x| {
        x > 0.0 && x < 1.0
    })? as f32;
    let index_n_heads = c.usize_in("index_n_heads", 64, 1, MAX_HEADS)?;
    let index_head_dim = c.usize_in("index_head_dim", 128, 2, MAX_HEAD_DIM)?;
    if index_head_dim < rope_dim {
        return Err(ConfigError::Invalid {
            key: "index_head_dim".into(),
            value: index_head_dim.to_string(),
            why: format!(
                "the indexer rotates the last qk_rope_head_dim ({rope_dim}) values of its \
                 heads, so it must be at least that"
            ),
        });
    }
    let index_topk = c.usize_in("index_topk", 512, 1, MAX_INDEX_TOPK)?;
    let swiglu_limit = c.f64_in("swiglu_limit", 10.0, "a finite number >= 0", |x| x >= 0.0)? as f32;
    let router = match c.get("scoring_func").filter(|v| !v.is_null()) {
        None => RouterKind::SqrtSoftplus,
        Some(v) => match c.string("scoring_func", v)? {
            "sqrtsoftplus" => RouterKind::SqrtSoftplus,
            "sigmoid" => RouterKind::SigmoidBias,
            _ => {
                return Err(unsupported(
                    "scoring_func",
                    v,
                    "DeepSeek-V4's router scores are \"sqrtsoftplus\" or \"sigmoid\"",
                ))
            }
        },
    };
    let rope_theta = main_rope_theta(c)?;
    let (compress_rope_theta, compress_yarn) = compress_rope(c, common.max_position_embeddings)?;
    let routed_scaling_factor = scaling(c, 1.5)?;
    let dsv4 = Dsv4Config {
        head_dim,
        rope_dim,
        q_lora_rank,
        o_groups,
        o_lora_rank,
        sliding_window,
        layer_types,
        csa_rate,
        hca_rate,
        hash,
        hc_mult,
        hc_sinkhorn_iters,
        hc_eps,
        index_n_heads,
        index_head_dim,
        index_topk,
        swiglu_limit,
        compress_rope_theta,
        compress_yarn,
    };
    Ok(common.finish(Parts {
        family: Family::DeepseekV4,
        attn: Attn::Dsv4(dsv4),
        router,
        n_shared_experts: 1,
        routed_scaling_factor,
        n_group: 1,
        topk_group: 1,
        rope_theta,
        yarn: None,
        mlp_layer_types: vec![MlpKind::Sparse; layers],
    }))
}

/// The rotated width: `partial_rotary_factor * head_dim`, or the legacy `qk_rope_head_dim`
/// (DeepseekV4Config's default: 64 of 512).
fn rope_dim(c: &Keys<'_>, head_dim: usize) -> Result<usize, ConfigError> {
    let factor = c.get("partial_rotary_factor").filter(|v| !v.is_null());
    let dim = match (factor, c.get("qk_rope_head_dim").filter(|v| !v.is_null())) {
        (Some(v), _) => {
            let f = c.f64_value("partial_rotary_factor", v, "a number in (0, 1]", |x| {
                x > 0.0 && x <= 1.0
            })?;
            (head_dim as f64 * f) as usize
        }
        (None, Some(v)) => c.usize_value("qk_rope_head_dim", v, 2, head_dim)?,
        (None, None) => head_dim / 8,
    };
    if dim == 0 || !dim.is_multiple_of(2) || dim > head_dim {
        return Err(ConfigError::Invalid {
            key: "qk_rope_head_dim".into(),
            value: dim.to_string(),
            why: format!("RoPE rotates pairs of a head, so it must be even and in 2..={head_dim}"),
        });
    }
    Ok(dim)
}

/// `compress_rates` (`{"compressed_sparse_attention": m, "heavily_compressed_attention": m'}`),
/// the legacy `compress_rate_csa` / `compress_rate_hca` over it; default 4 and 128.
fn compress_rates(c: &Keys<'_>) -> Result<(usize, usize), ConfigError> {
    const KEY: &str = "compress_rates";
    let (mut csa, mut hca) = (4, 128);
    match c.get(KEY) {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            for (k, v) in m {
                let key = format!("{KEY}.{k}");
                let n = c.usize_value(&key, v, 1, MAX_POSITIONS)?;
                match k.as_str() {
                    "compressed_sparse_attention" => csa = n,
                    "heavily_compressed_attention" => hca = n,
                    _ => {
                        return Err(unsupported(
                            &key,
                            v,
                            "the compressed layer types are \"compressed_sparse_attention\" and \
                             \"heavily_compressed_attention\"",
                        ))
                    }
                }
            }
        }
        Some(_) => return Err(wrong_type(KEY, "an object")),
    }
    csa = c.usize_in("compress_rate_csa", csa, 1, MAX_POSITIONS)?;
    hca = c.usize_in("compress_rate_hca", hca, 1, MAX_POSITIONS)?;
    Ok((csa, hca))
}

/// `layer_types`, else the legacy `compress_ratios` (0, 4 or 128 a layer; the published files
/// list more entries than layers, the MTP layer's after them, and transformers keeps the first
/// `num_hidden_layers`), else DeepseekV4Config's default (two HCA layers, then CSA and HCA
/// alternating).
fn layer_types(c: &Keys<'_>, layers: usize) -> Result<Vec<Dsv4Attn>, ConfigError> {
    if let Some(v) = c.get("layer_types").filter(|v| !v.is_null()) {
        const KEY: &str = "layer_types";
        return list_of_len(KEY, v, layers)?
            .iter()
            .map(|item| {
                Dsv4Attn::NAMES
                    .iter()
                    .find(|(name, _)| item.as_str() == Some(name))
                    .map(|(_, kind)| *kind)
                    .ok_or_else(|| {
                        unsupported(
                            KEY,
                            item,
                            "entries must be \"sliding_attention\", \
                             \"compressed_sparse_attention\" or \"heavily_compressed_attention\"",
                        )
                    })
            })
            .collect();
    }
    if let Some(v) = c.get("compress_ratios").filter(|v| !v.is_null()) {
        const KEY: &str = "compress_ratios";
        let Value::Array(items) = v else {
            return Err(wrong_type(KEY, "a list"));
        };
        if items.len() < layers {
            return Err(ConfigError::Invalid {
                key: KEY.into(),
                value: format!("({} entries)", items.len()),
                why: format!("it needs an entry per layer (num_hidden_layers = {layers})"),
            });
        }
        return items[..layers]
            .iter()
            .map(|item| match item.as_u64() {
                Some(0) => Ok(Dsv4Attn::Sliding),
                Some(4) => Ok(Dsv4Attn::Csa),
                Some(128) => Ok(Dsv4Attn::Hca),
                _ => Err(unsupported(
                    KEY,
                    item,
                    "entries must be 0 (sliding), 4 (compressed sparse) or 128 (heavily \
                     compressed); the rates themselves are compress_rates'",
                )),
            })
            .collect();
    }
    Ok((0..layers)
        .map(|i| match i {
            0 | 1 => Dsv4Attn::Hca,
            _ if (i - 2) % 2 == 1 => Dsv4Attn::Csa,
            _ => Dsv4Attn::Hca,
        })
        .collect())
}

/// `mlp_layer_types` (`"hash_moe"` / `"moe"`), else `num_hash_layers` (default 3) hash layers
/// then learned ones: whether each layer routes by token id.
fn mlp_layer_types(c: &Keys<'_>, layers: usize) -> Result<Vec<bool>, ConfigError> {
    const KEY: &str = "mlp_layer_types";
    if let Some(v) = c.get(KEY).filter(|v| !v.is_null()) {
        return list_of_len(KEY, v, layers)?
            .iter()
            .map(|item| match item.as_str() {
                Some("hash_moe") => Ok(true),
                Some("moe") => Ok(false),
                _ => Err(unsupported(
                    KEY,
                    item,
                    "entries must be \"hash_moe\" or \"moe\"",
                )),
            })
            .collect();
    }
    let n = c.usize_in("num_hash_layers", 3, 0, MAX_LAYERS)?;
    Ok((0..layers).map(|i| i < n).collect())
}

/// The sliding layers' rotary base: transformers 5's nested `rope_parameters.main` (plain
/// RoPE only: YaRN applies to the compressed layers), else `rope_theta`.
fn main_rope_theta(c: &Keys<'_>) -> Result<f64, ConfigError> {
    const RULE: &str = "a finite number > 0";
    let Some(main) = c
        .get("rope_parameters")
        .and_then(|p| p.get("main"))
        .filter(|v| !v.is_null())
    else {
        return c.f64_in("rope_theta", 10000.0, RULE, |x| x > 0.0);
    };
    let Value::Object(m) = main else {
        return Err(wrong_type("rope_parameters.main", "an object"));
    };
    if let Some(t) = m.get("rope_type").filter(|t| t.as_str() != Some("default")) {
        return Err(unsupported(
            "rope_parameters.main.rope_type",
            t,
            "DeepSeek-V4's sliding layers rotate by plain RoPE (\"default\")",
        ));
    }
    match m.get("rope_theta") {
        Some(v) => c.f64_value("rope_parameters.main.rope_theta", v, RULE, |x| x > 0.0),
        None => c.f64_in("rope_theta", 10000.0, RULE, |x| x > 0.0),
    }
}

/// The compressed layers' rotary: transformers 5's nested `rope_parameters.compress`, else
/// `compress_rope_theta` with the top-level `rope_scaling`. YaRN here leaves cos and sin
/// unscaled unless the file says otherwise (DeepseekV4Config sets `attention_factor` 1).
fn compress_rope(c: &Keys<'_>, max_positions: usize) -> Result<(f64, Option<Yarn>), ConfigError> {
    let mut map = Map::new();
    let nested = c
        .get("rope_parameters")
        .and_then(|p| p.get("compress"))
        .filter(|v| !v.is_null());
    let params = match nested {
        Some(Value::Object(p)) => {
            map.insert("rope_parameters".into(), Value::Object(p.clone()));
            Some(p)
        }
        Some(_) => return Err(wrong_type("rope_parameters.compress", "an object")),
        None => {
            let theta = c.f64_in(
                "compress_rope_theta",
                160000.0,
                "a finite number > 0",
                |x| x > 0.0,
            )?;
            map.insert("rope_theta".into(), Value::from(theta));
            match c.get("rope_scaling").filter(|v| !v.is_null()) {
                Some(Value::Object(p)) => {
                    map.insert("rope_scaling".into(), Value::Object(p.clone()));
                    c.get("rope_scaling").and_then(Value::as_object)
                }
                Some(_) => return Err(wrong_type("rope_scaling", "an object or null")),
                None => None,
            }
        }
    };
    let (theta, mut yarn) = rope(&Keys(&map), max_positions)?;
    let explicit = params.is_some_and(|p| p.get("attention_factor").is_some_and(|v| !v.is_null()));
    if let (Some(y), false) = (yarn.as_mut(), explicit) {
        y.attention_factor = 1.0;
    }
    Ok((theta, yarn))
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use super::Dsv4Attn;

    const FLASH: &str = include_str!("../../../tests/fixtures/configs/deepseek-v4-flash.json");

    fn with(key: &str, value: &str) -> Result<ModelConfig, ConfigError> {
        let mut v: serde_json::Value = serde_json::from_str(FLASH).unwrap();
        v[key] = serde_json::from_str(value).unwrap();
        ModelConfig::from_json(&v.to_string())
    }

    fn refused(key: &str, value: &str, named: &str) {
        let e = with(key, value).unwrap_err().to_string();
        assert!(e.contains(named), "{key} = {value}: {e}");
    }

    #[test]
    fn the_published_flash_config_parses() {
        let c = ModelConfig::from_json(FLASH).unwrap();
        assert_eq!(c.family, Family::DeepseekV4);
        let Attn::Dsv4(d) = &c.attn else {
            panic!("{:?}", c.attn)
        };
        assert_eq!((d.head_dim, d.rope_dim, d.q_lora_rank), (512, 64, 1024));
        assert_eq!(
            (d.o_groups, d.o_lora_rank, d.sliding_window),
            (8, 1024, 128)
        );
        assert_eq!(d.layer_types.len(), 43);
        assert_eq!(
            &d.layer_types[..4],
            &[
                Dsv4Attn::Sliding,
                Dsv4Attn::Sliding,
                Dsv4Attn::Csa,
                Dsv4Attn::Hca
            ]
        );
        assert_eq!(d.layer_types[42], Dsv4Attn::Csa);
        assert_eq!((d.rate(0), d.rate(2), d.rate(3)), (0, 4, 128));
        assert_eq!(d.hash.iter().filter(|h| **h).count(), 3);
        assert!(d.hash[2] && !d.hash[3]);
        assert_eq!((d.hc_mult, d.hc_sinkhorn_iters), (4, 20));
        assert_eq!(
            (d.index_n_heads, d.index_head_dim, d.index_topk),
            (64, 128, 512)
        );
        assert_eq!(d.swiglu_limit, 10.0);
        assert_eq!(c.rope_theta, 10000.0);
        assert!(c.yarn.is_none());
        assert_eq!(d.compress_rope_theta, 160000.0);
        let y = d.compress_yarn.unwrap();
        assert_eq!(
            (y.factor, y.original_max_position_embeddings),
            (16.0, 65536.0)
        );
        assert_eq!(y.attention_factor, 1.0);
        assert_eq!(c.router, RouterKind::SqrtSoftplus);
        assert_eq!((c.n_routed_experts, c.num_experts_per_tok), (256, 6));
        assert_eq!((c.moe_intermediate_size, c.intermediate_size), (2048, 2048));
        assert_eq!(c.routed_scaling_factor, 1.5);
        assert_eq!(c.eos_token_ids, vec![1]);
    }

    #[test]
    fn configs_it_cannot_run_are_refused_by_key_value_and_rule() {
        refused("layer_types", "[\"full_attention\"]", "\"layer_types\"");
        let mut types = vec!["\"sliding_attention\""; 42];
        types.push("\"linear_attention\"");
        let e = with("layer_types", &format!("[{}]", types.join(",")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"layer_types\" = \"linear_attention\""), "{e}");
        assert!(e.contains("compressed_sparse_attention"), "{e}");
        refused("compress_ratios", "[0, 8]", "\"compress_ratios\"");
        let mut ratios = vec!["0"; 43];
        ratios[5] = "8";
        let e = with("compress_ratios", &format!("[{}]", ratios.join(",")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"compress_ratios\" = 8") && e.contains("128"),
            "{e}"
        );
        refused("o_groups", "7", "must divide num_attention_heads (64)");
        refused("num_key_value_heads", "8", "exactly one key=value head");
        refused("n_shared_experts", "2", "\"n_shared_experts\" = 2");
        refused(
            "scoring_func",
            "\"softmax\"",
            "\"scoring_func\" = \"softmax\"",
        );
        refused(
            "compress_rates",
            "{\"compressed_sparse_attention\": 0}",
            "compress_rates.compressed_sparse_attention",
        );
        refused(
            "compress_rates",
            "{\"sliding_attention\": 4}",
            "compress_rates.sliding_attention",
        );
        refused("qk_rope_head_dim", "63", "qk_rope_head_dim");
        refused("index_head_dim", "32", "\"index_head_dim\" = 32");
        refused("mlp_layer_types", "[\"dense\"]", "\"mlp_layer_types\"");
        refused("hc_mult", "0", "\"hc_mult\"");
    }

    #[test]
    fn the_transformers_forms_of_the_schedule_are_read_too() {
        let c = with("layer_types", &{
            let mut t = vec!["\"heavily_compressed_attention\""; 43];
            t[0] = "\"sliding_attention\"";
            format!("[{}]", t.join(","))
        })
        .unwrap();
        let Attn::Dsv4(d) = &c.attn else { panic!() };
        assert_eq!(
            (d.layer_types[0], d.layer_types[1]),
            (Dsv4Attn::Sliding, Dsv4Attn::Hca)
        );
        let c = with("compress_rates", "{\"compressed_sparse_attention\": 2}").unwrap();
        let Attn::Dsv4(d) = &c.attn else { panic!() };
        assert_eq!((d.csa_rate, d.hca_rate), (2, 128));
    }
}
