//! `make_synthetic --family gpt_oss|minimax_m2|qwen3_5_moe|deepseek_v4`: the newer families at
//! the medium model's proportions (hidden, layers, experts, expert size, top-k), each with its
//! own attention and router as its published config has them, attention dims following the
//! published head width and head-to-hidden ratio so they scale with `--hidden`:
//!
//! - `gpt_oss` (gpt-oss-20b/120b): query heads of 64 (`hidden / 64` of them, 8 per key-value
//!   head), q/k/v/o biases, a sink per head, `sliding_attention` (window 128) and
//!   `full_attention` alternating from the first layer, YaRN (factor 32 over 4096), a router
//!   with a bias (softmax over its top k), experts with biases and the clamped SwiGLU (7.0).
//! - `minimax_m2` (MiniMax-M2.5): query heads of 128 (`hidden / 128`, 4 per key-value head), q/k
//!   norms over the whole projection, rotary on 64 of each head, a sigmoid router with
//!   `e_score_correction_bias`, no shared expert.
//! - `qwen3_5_moe` (Qwen3.6-35B-A3B, whose hidden is the medium model's 2048): three Gated
//!   DeltaNet layers (`linear_attention`: `hidden / 128` key heads and twice as many value heads,
//!   all 128 wide, a 4-tap convolution) to one gated full-attention layer (`hidden / 128` query
//!   heads of 256, 8 per key-value head, q/k norms, rotary on a quarter), a softmax router
//!   without bias, a gated shared expert as wide as a routed one.
//! - `deepseek_v4` (DeepSeek-V4-Flash's config): one shared key=value head of 512 under
//!   `hidden / 128` query heads (q_lora and o_lora `hidden / 4`, 8 heads per output group, a
//!   sink per head, rotary on 64), two `sliding_attention` layers first (window 128) then
//!   compressed-sparse (rate 4, with its indexer: `hidden / 64` heads of 128, top 512) and
//!   heavily-compressed (rate 128) alternating, written the published way (`compress_ratios`,
//!   `num_hash_layers`: the first 3 layers route by token id through `tid2eid`, the rest by
//!   `sqrtsoftplus` scores plus a bias), hyper-connections of 4 streams, a shared expert, the
//!   clamped SwiGLU (10.0), no MTP layer.
//!
//! Routed experts are int4 (`--expert-format`) under the names `colibri convert` writes for
//! every family (`model.layers.{l}.mlp.experts.{e}.{gate,up,down}_proj.weight` + `.qs`, and
//! gpt-oss's `.bias` beside each), or for gpt-oss with `--expert-format mxfp4` as it ships them
//! (fused per layer, MXFP4 code blocks and e8m0 scales, read in place); everything else is f32
//! under the family's own names. The
//! routers that take a bias get the skew of `--skew` (Qwen3.5's softmax router has none, so its
//! routing is as random as its weights). None of these families has dense layers.

use std::path::Path;

use serde_json::{json, Value};

use super::{f32t, write_shard, Gen, Rng, Tensor};

/// The families this module writes.
pub const NAMES: [&str; 4] = ["gpt_oss", "minimax_m2", "qwen3_5_moe", "deepseek_v4"];

/// What every family shares, as `main` parsed it.
pub struct Common<'a> {
    pub family: &'a str,
    pub out: &'a Path,
    pub layers: usize,
    pub n_exp: usize,
    pub top_k: usize,
    pub h: usize,
    pub inter: usize,
    pub skew: f32,
    pub shard_gb: f64,
    pub per_row: bool,
    /// gpt-oss's experts as published: MXFP4, fused per layer (`--expert-format mxfp4`).
    pub mxfp4: bool,
    pub vocab: usize,
    pub max_pos: usize,
    pub eos: Vec<u64>,
}

/// `1 / sqrt(fan_in)`: the scale of a random matrix whose outputs keep the input's size.
fn s(fan_in: usize) -> f32 {
    1.0 / (fan_in as f32).sqrt()
}

fn mat(name: String, rows: usize, cols: usize) -> Tensor {
    f32t(name, vec![rows, cols], Gen::Uniform(s(cols)))
}

fn ones(name: String, n: usize) -> Tensor {
    f32t(name, vec![n], Gen::Const(1.0))
}

fn zeros(name: String, n: usize) -> Tensor {
    f32t(name, vec![n], Gen::Const(0.0))
}

/// Layer `l`'s two norms and its grouped-query projections (`heads`, `kv` heads, `hd` wide),
/// each followed by its zero bias when `biased`; returns the layer's and its attention's prefix.
fn gqa_layer(
    t: &mut Vec<Tensor>,
    c: &Common,
    l: usize,
    (heads, kv, hd): (usize, usize, usize),
    biased: bool,
) -> (String, String) {
    let p = format!("model.layers.{l}");
    let a = format!("{p}.self_attn");
    t.push(ones(format!("{p}.input_layernorm.weight"), c.h));
    t.push(ones(format!("{p}.post_attention_layernorm.weight"), c.h));
    for (proj, rows, cols) in [
        ("q_proj", heads * hd, c.h),
        ("k_proj", kv * hd, c.h),
        ("v_proj", kv * hd, c.h),
        ("o_proj", c.h, heads * hd),
    ] {
        t.push(mat(format!("{a}.{proj}.weight"), rows, cols));
        if biased {
            t.push(zeros(format!("{a}.{proj}.bias"), rows));
        }
    }
    (p, a)
}

/// The skewed router bias: a random ranking of the experts, the bias of rank r `-skew ln(1+r)`
/// (as the GLM-5 layout's `e_score_correction_bias`).
fn skew_bias(n_exp: usize, skew: f32, rng: &mut Rng) -> Vec<f32> {
    let mut order: Vec<usize> = (0..n_exp).collect();
    for i in (1..n_exp).rev() {
        order.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    let mut bias = vec![0f32; n_exp];
    for (rank, &e) in order.iter().enumerate() {
        bias[e] = -skew * (1.0 + rank as f32).ln();
    }
    bias
}

/// One routed expert's tensors: gate, up, down (each int4 + scales, gpt-oss's bias first), in
/// the order `colibri convert` writes them, so one read covers the expert.
fn expert(c: &Common, l: usize, e: usize, bias: bool, rng: &mut Rng) -> Vec<Tensor> {
    let mut ts = Vec::with_capacity(9);
    for (proj, rows, cols) in [
        ("gate_proj", c.inter, c.h),
        ("up_proj", c.inter, c.h),
        ("down_proj", c.h, c.inter),
    ] {
        let name = format!("model.layers.{l}.mlp.experts.{e}.{proj}");
        if bias {
            ts.push(f32t(format!("{name}.bias"), vec![rows], Gen::Uniform(0.01)));
        }
        ts.push(Tensor {
            name: format!("{name}.weight"),
            dtype: "U8",
            shape: vec![rows, cols / 2],
            gen: Gen::Bytes,
        });
        // Nibbles are uniform in [-8, 7] (std ~4.6): scale to ~1/sqrt(fan_in).
        let spr = if c.per_row { 1 } else { cols / 64 };
        let sc = s(cols) / 4.6;
        ts.push(f32t(
            format!("{name}.weight.qs"),
            vec![rows, spr],
            Gen::Values(
                (0..rows * spr)
                    .map(|_| sc * (1.0 + 0.25 * rng.unit()))
                    .collect(),
            ),
        ));
    }
    ts
}

/// Bytes of one routed expert as [`expert`] (or [`mxfp4_layer`]) writes it.
pub fn expert_bytes(c: &Common, family: &str) -> usize {
    if c.mxfp4 {
        // 32 e2m1 codes in 16 bytes and one e8m0 scale a group, the biases in f32.
        let n = 3 * c.inter * c.h;
        return n / 2 + n / 32 + (2 * c.inter + c.h) * 4;
    }
    let spr = |cols: usize| if c.per_row { 1 } else { cols / 64 };
    let m = |rows: usize, cols: usize| rows * cols / 2 + rows * spr(cols) * 4;
    let bias = if family == "gpt_oss" {
        (2 * c.inter + c.h) * 4
    } else {
        0
    };
    2 * m(c.inter, c.h) + m(c.h, c.inter) + bias
}

/// Writes the model: config.json, the dense shard, the expert shards. Returns the bytes of the
/// safetensors written.
pub fn write(c: &Common, rng: &mut Rng) -> std::io::Result<u64> {
    let (config, dense) = match c.family {
        "gpt_oss" => gpt_oss(c, rng),
        "minimax_m2" => minimax(c, rng),
        "qwen3_5_moe" => qwen35(c),
        "deepseek_v4" => deepseek_v4(c, rng),
        other => unreachable!("main admits only NAMES, not {other}"),
    };
    std::fs::write(
        c.out.join("config.json"),
        serde_json::to_string_pretty(&config)?,
    )?;
    let mut total = write_shard(&c.out.join("model-dense.safetensors"), &dense, rng)?;
    if c.mxfp4 {
        assert!(
            c.family == "gpt_oss",
            "--expert-format mxfp4: only --family gpt_oss ships MXFP4 experts"
        );
        assert!(
            c.h.is_multiple_of(32) && c.inter.is_multiple_of(32),
            "--expert-format mxfp4: --hidden and --inter must be multiples of 32"
        );
        // Whole layers a shard, as the published files hold them.
        let per_shard = ((c.shard_gb * 1e9) as usize / (eb_layer(c))).max(1);
        let layers: Vec<usize> = (0..c.layers).collect();
        for (i, chunk) in layers.chunks(per_shard).enumerate() {
            let ts: Vec<Tensor> = chunk.iter().flat_map(|&l| mxfp4_layer(c, l)).collect();
            let path = c
                .out
                .join(format!("model-experts-{:05}.safetensors", i + 1));
            total += write_shard(&path, &ts, rng)?;
            eprintln!(
                "wrote {} ({} layers of experts)",
                path.display(),
                chunk.len()
            );
        }
        return Ok(total);
    }
    let eb = expert_bytes(c, c.family);
    let per_shard = ((c.shard_gb * 1e9) as usize / eb).max(1);
    let all: Vec<(usize, usize)> = (0..c.layers)
        .flat_map(|l| (0..c.n_exp).map(move |e| (l, e)))
        .collect();
    let bias = c.family == "gpt_oss";
    for (i, chunk) in all.chunks(per_shard).enumerate() {
        let mut ts = Vec::with_capacity(chunk.len() * 9);
        for &(l, e) in chunk {
            ts.extend(expert(c, l, e, bias, rng));
        }
        let path = c
            .out
            .join(format!("model-experts-{:05}.safetensors", i + 1));
        total += write_shard(&path, &ts, rng)?;
        eprintln!("wrote {} ({} experts)", path.display(), chunk.len());
    }
    Ok(total)
}

fn eb_layer(c: &Common) -> usize {
    c.n_exp * expert_bytes(c, c.family)
}

/// One layer's experts as gpt-oss publishes them: gate and up fused with their rows
/// interleaved, `[E, rows, groups, 16]` code blocks beside `[E, rows, groups]` e8m0 scales, and
/// the fused biases. Random codes (e2m1: magnitudes 0..6, root mean square ~2.9) under the
/// power-of-two scale nearest ~1/sqrt(fan_in) / 2.9.
fn mxfp4_layer(c: &Common, l: usize) -> Vec<Tensor> {
    let p = format!("model.layers.{l}.mlp.experts");
    let e8m0 = |fan_in: usize| (127.0 + (s(fan_in) / 2.9).log2().round()) as u8;
    let mut t = Vec::with_capacity(6);
    for (name, rows, cols) in [
        ("gate_up_proj", 2 * c.inter, c.h),
        ("down_proj", c.h, c.inter),
    ] {
        t.push(Tensor {
            name: format!("{p}.{name}_blocks"),
            dtype: "U8",
            shape: vec![c.n_exp, rows, cols / 32, 16],
            gen: Gen::Bytes,
        });
        t.push(Tensor {
            name: format!("{p}.{name}_scales"),
            dtype: "U8",
            shape: vec![c.n_exp, rows, cols / 32],
            gen: Gen::ByteConst(e8m0(cols)),
        });
        t.push(f32t(
            format!("{p}.{name}_bias"),
            vec![c.n_exp, rows],
            Gen::Uniform(0.01),
        ));
    }
    t
}

/// Embedding, final norm and (under `head`) the output projection.
fn ends(c: &Common, head: &str) -> Vec<Tensor> {
    vec![
        f32t(
            "model.embed_tokens.weight".into(),
            vec![c.vocab, c.h],
            Gen::Uniform(1.0),
        ),
        mat(head.into(), c.vocab, c.h),
        ones("model.norm.weight".into(), c.h),
    ]
}

fn gpt_oss(c: &Common, rng: &mut Rng) -> (Value, Vec<Tensor>) {
    let (hd, heads) = (64, (c.h / 64).max(1));
    let kv = (heads / 8).max(1);
    let layer_types: Vec<&str> = (0..c.layers)
        .map(|l| {
            if l % 2 == 0 {
                "sliding_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    let config = json!({
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
        "attention_bias": true, "attention_dropout": 0.0, "bos_token_id": null,
        "eos_token_id": c.eos, "head_dim": hd, "hidden_act": "silu", "hidden_size": c.h,
        "intermediate_size": c.inter, "layer_types": layer_types,
        "max_position_embeddings": c.max_pos, "num_attention_heads": heads,
        "num_experts_per_tok": c.top_k, "num_hidden_layers": c.layers,
        "num_key_value_heads": kv, "num_local_experts": c.n_exp, "pad_token_id": null,
        "rms_norm_eps": 1e-5,
        "rope_parameters": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
            "original_max_position_embeddings": 4096, "rope_theta": 150000.0,
            "rope_type": "yarn", "truncate": false},
        "sliding_window": 128, "swiglu_limit": 7.0, "tie_word_embeddings": false,
        "vocab_size": c.vocab
    });
    let mut config = config;
    if c.mxfp4 {
        config["quantization_config"] = json!({"quant_method": "mxfp4",
            "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                "model.embed_tokens", "lm_head"]});
    }
    let mut t = ends(c, "lm_head.weight");
    for l in 0..c.layers {
        let (p, a) = gqa_layer(&mut t, c, l, (heads, kv, hd), true);
        t.push(zeros(format!("{a}.sinks"), heads));
        t.push(f32t(
            format!("{p}.mlp.router.weight"),
            vec![c.n_exp, c.h],
            Gen::Uniform(0.02),
        ));
        let bias = skew_bias(c.n_exp, c.skew, rng);
        t.push(f32t(
            format!("{p}.mlp.router.bias"),
            vec![c.n_exp],
            Gen::Values(bias),
        ));
    }
    (config, t)
}

fn minimax(c: &Common, rng: &mut Rng) -> (Value, Vec<Tensor>) {
    let (hd, heads) = (128, (c.h / 128).max(1));
    let kv = (heads / 4).max(1);
    let config = json!({
        "architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2",
        "attention_dropout": 0.0, "bos_token_id": null, "eos_token_id": c.eos,
        "head_dim": hd, "hidden_act": "silu", "hidden_size": c.h,
        "intermediate_size": c.inter, "max_position_embeddings": c.max_pos,
        "num_attention_heads": heads, "num_experts_per_tok": c.top_k,
        "num_hidden_layers": c.layers, "num_key_value_heads": kv,
        "num_local_experts": c.n_exp, "pad_token_id": null, "rms_norm_eps": 1e-6,
        "rope_parameters": {"partial_rotary_factor": 0.5, "rope_theta": 5000000.0,
            "rope_type": "default"},
        "rotary_dim": 64, "tie_word_embeddings": false, "vocab_size": c.vocab
    });
    let mut t = ends(c, "lm_head.weight");
    for l in 0..c.layers {
        let (p, a) = gqa_layer(&mut t, c, l, (heads, kv, hd), false);
        t.push(ones(format!("{a}.q_norm.weight"), heads * hd));
        t.push(ones(format!("{a}.k_norm.weight"), kv * hd));
        t.push(f32t(
            format!("{p}.mlp.gate.weight"),
            vec![c.n_exp, c.h],
            Gen::Uniform(0.02),
        ));
        let bias = skew_bias(c.n_exp, c.skew, rng);
        t.push(f32t(
            format!("{p}.mlp.gate.e_score_correction_bias"),
            vec![c.n_exp],
            Gen::Values(bias),
        ));
    }
    (config, t)
}

fn qwen35(c: &Common) -> (Value, Vec<Tensor>) {
    let (hd, heads) = (256, (c.h / 128).max(1));
    let kv = (heads / 8).max(1);
    let (kd, vd, kh) = (128, 128, (c.h / 128).max(1));
    let vh = 2 * kh;
    let conv_dim = 2 * kh * kd + vh * vd;
    let layer_types: Vec<&str> = (0..c.layers)
        .map(|l| {
            if l % 4 == 3 {
                "full_attention"
            } else {
                "linear_attention"
            }
        })
        .collect();
    let config = json!({
        "architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text",
        "attention_bias": false, "attention_dropout": 0.0, "attn_output_gate": true,
        "bos_token_id": null, "eos_token_id": c.eos, "full_attention_interval": 4,
        "head_dim": hd, "hidden_act": "silu", "hidden_size": c.h, "layer_types": layer_types,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": kd, "linear_num_key_heads": kh,
        "linear_num_value_heads": vh, "linear_value_head_dim": vd,
        "max_position_embeddings": c.max_pos, "moe_intermediate_size": c.inter,
        "num_attention_heads": heads, "num_experts": c.n_exp, "num_experts_per_tok": c.top_k,
        "num_hidden_layers": c.layers, "num_key_value_heads": kv, "pad_token_id": null,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"mrope_interleaved": true, "mrope_section": [11, 11, 10],
            "partial_rotary_factor": 0.25, "rope_theta": 10000000.0, "rope_type": "default"},
        "shared_expert_intermediate_size": c.inter, "tie_word_embeddings": false,
        "vocab_size": c.vocab
    });
    let mut t = ends(c, "lm_head.weight");
    for (l, kind) in layer_types.iter().enumerate() {
        let p = format!("model.layers.{l}");
        t.push(ones(format!("{p}.input_layernorm.weight"), c.h));
        t.push(ones(format!("{p}.post_attention_layernorm.weight"), c.h));
        if *kind == "full_attention" {
            let a = format!("{p}.self_attn");
            // The query projection also gives the output gate: twice the heads' width.
            t.push(mat(format!("{a}.q_proj.weight"), 2 * heads * hd, c.h));
            t.push(mat(format!("{a}.k_proj.weight"), kv * hd, c.h));
            t.push(mat(format!("{a}.v_proj.weight"), kv * hd, c.h));
            t.push(mat(format!("{a}.o_proj.weight"), c.h, heads * hd));
            t.push(ones(format!("{a}.q_norm.weight"), hd));
            t.push(ones(format!("{a}.k_norm.weight"), hd));
        } else {
            let a = format!("{p}.linear_attn");
            // A = -exp(A_log): a decay per value head in (0, 1) once scaled by dt.
            t.push(f32t(format!("{a}.A_log"), vec![vh], Gen::Uniform(1.0)));
            t.push(f32t(
                format!("{a}.conv1d.weight"),
                vec![conv_dim, 1, 4],
                Gen::Uniform(0.5),
            ));
            t.push(zeros(format!("{a}.dt_bias"), vh));
            t.push(mat(format!("{a}.in_proj_a.weight"), vh, c.h));
            t.push(mat(format!("{a}.in_proj_b.weight"), vh, c.h));
            t.push(mat(format!("{a}.in_proj_qkv.weight"), conv_dim, c.h));
            t.push(mat(format!("{a}.in_proj_z.weight"), vh * vd, c.h));
            t.push(ones(format!("{a}.norm.weight"), vd));
            t.push(mat(format!("{a}.out_proj.weight"), c.h, vh * vd));
        }
        let m = format!("{p}.mlp");
        t.push(f32t(
            format!("{m}.gate.weight"),
            vec![c.n_exp, c.h],
            Gen::Uniform(0.02),
        ));
        t.push(mat(
            format!("{m}.shared_expert.gate_proj.weight"),
            c.inter,
            c.h,
        ));
        t.push(mat(
            format!("{m}.shared_expert.up_proj.weight"),
            c.inter,
            c.h,
        ));
        t.push(mat(
            format!("{m}.shared_expert.down_proj.weight"),
            c.h,
            c.inter,
        ));
        t.push(mat(format!("{m}.shared_expert_gate.weight"), 1, c.h));
    }
    (config, t)
}

fn deepseek_v4(c: &Common, rng: &mut Rng) -> (Value, Vec<Tensor>) {
    let (hd, rope, heads) = (512, 64, (c.h / 128).max(1));
    let (q_lora, o_lora, o_groups) = (c.h / 4, c.h / 4, (heads / 8).max(1));
    let (ih, ihd) = ((c.h / 64).max(1), 128);
    let (hc, hash_layers) = (4, 3.min(c.layers / 2));
    let (csa_rate, hca_rate) = (4, 128);
    // The published schedule: two sliding layers, then CSA and HCA alternating (a short model
    // keeps one sliding layer, or none, so it still has both compressed kinds).
    let sliding = match c.layers {
        0..=2 => 0,
        3..=7 => 1,
        _ => 2,
    };
    let ratios: Vec<usize> = (0..c.layers)
        .map(|l| match l {
            l if l < sliding => 0,
            l if (l - sliding) % 2 == 0 => csa_rate,
            _ => hca_rate,
        })
        .collect();
    let config = json!({
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
        "attention_bias": false, "bos_token_id": null, "eos_token_id": c.eos,
        "compress_ratios": ratios, "compress_rope_theta": 160000,
        "hc_eps": 1e-6, "hc_mult": hc, "hc_sinkhorn_iters": 20, "head_dim": hd,
        "hidden_act": "silu", "hidden_size": c.h, "index_head_dim": ihd, "index_n_heads": ih,
        "index_topk": 512, "max_position_embeddings": c.max_pos,
        "moe_intermediate_size": c.inter, "n_routed_experts": c.n_exp, "n_shared_experts": 1,
        "norm_topk_prob": true, "num_attention_heads": heads,
        "num_experts_per_tok": c.top_k, "num_hidden_layers": c.layers,
        "num_hash_layers": hash_layers, "num_key_value_heads": 1,
        "num_nextn_predict_layers": 0, "o_groups": o_groups, "o_lora_rank": o_lora,
        "q_lora_rank": q_lora, "qk_rope_head_dim": rope, "rms_norm_eps": 1e-6,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16,
            "original_max_position_embeddings": 65536, "type": "yarn"},
        "rope_theta": 10000, "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus",
        "sliding_window": 128, "swiglu_limit": 10.0, "tie_word_embeddings": false,
        "topk_method": "noaux_tc", "vocab_size": c.vocab
    });
    let mut t = ends(c, "head.weight");
    // The hyper-head folds the hc streams into one.
    t.push(f32t(
        "model.hc_head.hc_base".into(),
        vec![hc],
        Gen::Const(0.0),
    ));
    t.push(f32t(
        "model.hc_head.hc_fn".into(),
        vec![hc, hc * c.h],
        Gen::Uniform(0.01),
    ));
    t.push(f32t(
        "model.hc_head.hc_scale".into(),
        vec![1],
        Gen::Const(1.0),
    ));
    let mix = (2 + hc) * hc;
    for (l, &rate) in ratios.iter().enumerate() {
        let p = format!("model.layers.{l}");
        let a = format!("{p}.attn");
        t.push(ones(format!("{p}.attn_norm.weight"), c.h));
        t.push(ones(format!("{p}.ffn_norm.weight"), c.h));
        for part in ["attn", "ffn"] {
            t.push(f32t(
                format!("{p}.hc_{part}_base"),
                vec![mix],
                Gen::Const(0.0),
            ));
            t.push(f32t(
                format!("{p}.hc_{part}_fn"),
                vec![mix, hc * c.h],
                Gen::Uniform(0.01),
            ));
            t.push(f32t(
                format!("{p}.hc_{part}_scale"),
                vec![3],
                Gen::Const(1.0),
            ));
        }
        t.push(zeros(format!("{a}.attn_sink"), heads));
        t.push(ones(format!("{a}.norm.weight"), hd));
        t.push(ones(format!("{a}.q_norm.weight"), q_lora));
        t.push(mat(format!("{a}.wq_a.weight"), q_lora, c.h));
        t.push(mat(format!("{a}.wq_b.weight"), heads * hd, q_lora));
        t.push(mat(format!("{a}.wkv.weight"), hd, c.h));
        t.push(mat(
            format!("{a}.wo_a.weight"),
            o_groups * o_lora,
            heads * hd / o_groups,
        ));
        t.push(mat(format!("{a}.wo_b.weight"), c.h, o_groups * o_lora));
        // A compressor over blocks of `rate` tokens: CSA's blocks overlap (two series, twice
        // the width), HCA's do not.
        let compressor = |t: &mut Vec<Tensor>, pre: String, width: usize, overlap: bool| {
            let w = if overlap { 2 * width } else { width };
            t.push(f32t(
                format!("{pre}.ape"),
                vec![rate, w],
                Gen::Uniform(0.01),
            ));
            t.push(ones(format!("{pre}.norm.weight"), width));
            t.push(mat(format!("{pre}.wgate.weight"), w, c.h));
            t.push(mat(format!("{pre}.wkv.weight"), w, c.h));
        };
        if rate == csa_rate {
            compressor(&mut t, format!("{a}.compressor"), hd, true);
            compressor(&mut t, format!("{a}.indexer.compressor"), ihd, true);
            t.push(mat(format!("{a}.indexer.weights_proj.weight"), ih, c.h));
            t.push(mat(format!("{a}.indexer.wq_b.weight"), ih * ihd, q_lora));
        } else if rate == hca_rate {
            compressor(&mut t, format!("{a}.compressor"), hd, false);
        }
        let f = format!("{p}.ffn");
        t.push(f32t(
            format!("{f}.gate.weight"),
            vec![c.n_exp, c.h],
            Gen::Uniform(0.02),
        ));
        if l < hash_layers {
            // Each token id's experts: top_k distinct ids, drawn at random.
            let mut ids = Vec::with_capacity(c.vocab * c.top_k);
            for _ in 0..c.vocab {
                let mut row: Vec<usize> = Vec::with_capacity(c.top_k);
                while row.len() < c.top_k.min(c.n_exp) {
                    let e = (rng.next() % c.n_exp as u64) as usize;
                    if !row.contains(&e) {
                        row.push(e);
                    }
                }
                ids.extend(row.into_iter().map(|e| e as f32));
            }
            t.push(f32t(
                format!("{f}.gate.tid2eid"),
                vec![c.vocab, c.top_k],
                Gen::Values(ids),
            ));
        } else {
            let bias = skew_bias(c.n_exp, c.skew, rng);
            t.push(f32t(
                format!("{f}.gate.bias"),
                vec![c.n_exp],
                Gen::Values(bias),
            ));
        }
        for (w, rows, cols) in [
            ("w1", c.inter, c.h),
            ("w2", c.h, c.inter),
            ("w3", c.inter, c.h),
        ] {
            t.push(mat(format!("{f}.shared_experts.{w}.weight"), rows, cols));
        }
    }
    (config, t)
}
