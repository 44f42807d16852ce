//! A synthetic medium `glm_moe_dsa` model for the tier benchmarks: random weights, routed
//! experts in the pre-quantized int4-g64 container (U8 blob + `.qs` f32 scales, gate|up|down
//! adjacent so one read covers an expert), and a router bias that makes routing skewed the way
//! real models are (a few experts per layer take most selections).
//!
//! ```text
//! cargo run --release -p colibri --example make_synthetic -- --out /work/synth --expert-gb 4
//! ```
//!
//! Options: `--out DIR` (required), `--expert-gb G` (4), `--experts N` per layer (128),
//! `--top-k K` (8), `--hidden H` (2048), `--inter I` (1024), `--skew S` (0.08: bias of the
//! expert ranked r is `-S * ln(1 + r)`), `--shard-gb G` (1), `--seed N` (1), `--attn glm5`
//! (GLM-5's attention dims: 64 heads, q_lora 2048, kv_lora 512, nope 192, rope 64, v 256),
//! `--bf16` (routed experts as plain BF16 matrices, a Hugging Face checkpoint for
//! `colibri convert`; `--expert-gb` then counts BF16 bytes), `--fp8` (routed experts as FP8
//! e4m3 with F32 `_scale_inv` per 128x128 block, as GLM-5-FP8 ships them), `--dense-layers N`
//! (0: the first N layers get a dense MLP of `2 * --inter` and no routed experts), `--heads N`
//! (attention heads; 8, or 64 with `--attn glm5`), `--vocab N` (the demo tokenizer's size by
//! default; larger pads embedding and lm_head with ids the tokenizer never produces),
//! `--expert-format i4g64|i4row|mxfp4` (int4 with a scale per 64 inputs, or one per row; or,
//! for `--family gpt_oss`, its published fused MXFP4), `--layers N`
//! (all layers, dense ones included; by default the sparse layers are as many as `--expert-gb`
//! holds), `--max-pos N` (`max_position_embeddings`, 4096), `--mtp` (also an MTP head as GLM-5
//! stores it: layer `num_hidden_layers` with `enorm`, `hnorm`, `eh_proj`, a full MoE decoder
//! layer with its own indexer, `shared_head.norm`, and `num_nextn_predict_layers: 1` in
//! config.json; its routed experts are int8 per row, in `model-mtp-experts-00001.safetensors`,
//! since the head is kept at 8 bits), `--family qwen3_moe` (Qwen3-MoE's layout instead of
//! GLM-5's: grouped-query attention of `--heads` query heads over `--kv-heads` (4) key-value
//! heads of 128 with q/k norms, a softmax router without bias, so routing is not skewed, no
//! shared expert, dense layers as `mlp_only_layers`) or `--family glm4_moe` (GLM-4.5's:
//! grouped-query attention with q/k/v biases and rotary on half of each head, the sigmoid
//! router with its skewing bias, a shared expert), `--family deepseek_v3` (GLM-5's MLA without
//! the indexer, DeepSeek-V3's config: YaRN, 8 expert groups of which 4 are routed to) or
//! `--family deepseek_v32` (the same with an indexer on every layer), or `--family gpt_oss`,
//! `minimax_m2`, `qwen3_5_moe`, `deepseek_v4` (each its own attention and router, int4 experts
//! or gpt-oss's MXFP4, no dense layers: see `make_synthetic/families.rs`). The tokenizer is the demo model's
//! (`daemon/demo/tokenizer.json`), and so are the stop tokens.
//!
//! The "medium model" of the speed issues (24 layers, 1 dense, hidden 2048, 16 heads, 128 experts
//! of moe_inter 768 in int4 per row = 2.37 MB each, top-8, vocab 16384):
//!
//! ```text
//! make_synthetic --out /work/medium --layers 24 --dense-layers 1 --heads 16 --inter 768 \
//!     --expert-format i4row --vocab 16384
//! ```

#![recursion_limit = "256"]

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

// Beside this file (a crate root looks for its modules in its own folder, where cargo would
// take it for an example of its own).
#[path = "make_synthetic/families.rs"]
mod families;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

/// How to produce a tensor's bytes.
enum Gen {
    /// f32 uniform in [-a, a).
    Uniform(f32),
    /// f32 constant.
    Const(f32),
    /// f32 values given.
    Values(Vec<f32>),
    /// random bytes (packed int4 nibbles).
    Bytes,
    /// bf16 uniform in [-a, a).
    Bf16Uniform(f32),
    /// random e4m3 codes (never NaN).
    Fp8,
    /// u8, every byte the same (MXFP4's e8m0 scales).
    ByteConst(u8),
}

struct Tensor {
    name: String,
    dtype: &'static str,
    shape: Vec<usize>,
    gen: Gen,
}

impl Tensor {
    fn len(&self) -> usize {
        let n: usize = self.shape.iter().product();
        match self.dtype {
            "U8" | "F8_E4M3" => n,
            "BF16" => n * 2,
            _ => n * 4,
        }
    }
}

fn f32t(name: String, shape: Vec<usize>, gen: Gen) -> Tensor {
    Tensor {
        name,
        dtype: "F32",
        shape,
        gen,
    }
}

fn write_shard(path: &Path, tensors: &[Tensor], rng: &mut Rng) -> std::io::Result<u64> {
    let mut header = Map::new();
    let mut off = 0usize;
    for t in tensors {
        let len = t.len();
        header.insert(
            t.name.clone(),
            json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [off, off + len]}),
        );
        off += len;
    }
    let mut h = serde_json::to_string(&Value::Object(header))?.into_bytes();
    while (8 + h.len()) % 8 != 0 {
        h.push(b' ');
    }
    let mut w = BufWriter::with_capacity(8 << 20, File::create(path)?);
    w.write_all(&(h.len() as u64).to_le_bytes())?;
    w.write_all(&h)?;
    let mut buf = Vec::new();
    for t in tensors {
        buf.clear();
        match &t.gen {
            Gen::Bytes => {
                buf.resize(t.len(), 0);
                rng.fill(&mut buf);
            }
            Gen::Uniform(a) => {
                for _ in 0..t.len() / 4 {
                    buf.extend_from_slice(&(rng.unit() * a).to_le_bytes());
                }
            }
            Gen::Const(c) => {
                for _ in 0..t.len() / 4 {
                    buf.extend_from_slice(&c.to_le_bytes());
                }
            }
            Gen::Values(v) => v
                .iter()
                .for_each(|x| buf.extend_from_slice(&x.to_le_bytes())),
            Gen::ByteConst(b) => buf.resize(t.len(), *b),
            Gen::Fp8 => {
                buf.resize(t.len(), 0);
                rng.fill(&mut buf);
                for b in buf.iter_mut().filter(|b| **b & 0x7F == 0x7F) {
                    *b = 0x38;
                }
            }
            Gen::Bf16Uniform(a) => {
                for _ in 0..t.len() / 2 {
                    let bits = (rng.unit() * a).to_bits();
                    buf.extend_from_slice(&((bits >> 16) as u16).to_le_bytes());
                }
            }
        }
        w.write_all(&buf)?;
    }
    w.flush()?;
    Ok((8 + h.len() + off) as u64)
}

fn arg<T: std::str::FromStr>(args: &[String], key: &str, default: T) -> T {
    args.iter()
        .position(|a| a == key)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{key} {v}: not a valid value"))
        })
        .unwrap_or(default)
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let out: PathBuf = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from)
        .expect("--out DIR is required");
    let expert_gb: f64 = arg(&args, "--expert-gb", 4.0);
    let n_exp: usize = arg(&args, "--experts", 128);
    let top_k: usize = arg(&args, "--top-k", 8);
    let h: usize = arg(&args, "--hidden", 2048);
    let inter: usize = arg(&args, "--inter", 1024);
    let skew: f32 = arg(&args, "--skew", 0.08);
    let shard_gb: f64 = arg(&args, "--shard-gb", 1.0);
    let mut rng = Rng(arg::<u64>(&args, "--seed", 1).max(1) * 0x9e37_79b9_7f4a_7c15);
    assert!(
        h.is_multiple_of(64) && inter.is_multiple_of(64),
        "--hidden and --inter must be multiples of 64"
    );

    let dense_layers: usize = arg(&args, "--dense-layers", 0);
    let max_pos: usize = arg(&args, "--max-pos", 4096);
    let expert_format = arg(&args, "--expert-format", "i4g64".to_string());
    // gpt-oss's published MXFP4 (written by `families`, for that family only).
    let mxfp4 = expert_format == "mxfp4";
    let per_row = match expert_format.as_str() {
        "i4g64" | "mxfp4" => false,
        "i4row" => true,
        other => panic!("--expert-format {other}: allowed are i4g64, i4row and mxfp4 (gpt_oss)"),
    };
    let family = arg(&args, "--family", "glm_moe_dsa".to_string());
    let (qwen, glm4) = match family.as_str() {
        "glm_moe_dsa" | "deepseek_v3" | "deepseek_v32" => (false, false),
        "qwen3_moe" => (true, false),
        "glm4_moe" => (false, true),
        // Written by `families`, after the arguments every family shares.
        f if families::NAMES.contains(&f) => (false, false),
        other => panic!(
            "--family {other}: allowed are glm_moe_dsa, deepseek_v3, deepseek_v32, qwen3_moe, \
             glm4_moe, {}",
            families::NAMES.join(", ")
        ),
    };
    // DeepSeek-V3: GLM-5's MLA without an indexer; V3.2: with one on every layer.
    let (deepseek, v32) = (family.starts_with("deepseek"), family == "deepseek_v32");
    // Grouped-query attention (Qwen3-MoE, GLM-4.5) instead of MLA.
    let gqa = qwen || glm4;
    let kv_heads: usize = arg(&args, "--kv-heads", 4);
    let head_dim = 128;
    let bf16 = args.iter().any(|a| a == "--bf16");
    let mtp = args.iter().any(|a| a == "--mtp");
    let fp8 = args.iter().any(|a| a == "--fp8");
    // int4 scales per row: one, or one per 64 inputs.
    let scales_per_row = |cols: usize| if per_row { 1 } else { cols / 64 };
    // int4: rows * cols/2 bytes + rows * cols/64 scales; bf16: 2 bytes a weight; fp8: 1
    // byte a weight and an f32 per 128x128 block.
    let mat = |rows: usize, cols: usize| {
        if fp8 {
            rows * cols + rows.div_ceil(128) * cols.div_ceil(128) * 4
        } else if bf16 {
            rows * cols * 2
        } else {
            rows * cols / 2 + rows * scales_per_row(cols) * 4
        }
    };

    let expert_bytes = 2 * mat(inter, h) + mat(h, inter);
    let layers = match args.iter().position(|a| a == "--layers") {
        Some(_) => arg(&args, "--layers", 0usize),
        None => {
            ((expert_gb * 1e9 / (n_exp * expert_bytes) as f64).round() as usize).max(1)
                + dense_layers
        }
    };
    assert!(
        dense_layers < layers,
        "--dense-layers {dense_layers}: must be below the layer count {layers}"
    );
    let is_dense = |l: usize| l < dense_layers;
    // Attention dims: small by default, or GLM-5's own (`--attn glm5`), for measuring the
    // attention of a real-sized layer.
    let glm5 = args.windows(2).any(|w| w[0] == "--attn" && w[1] == "glm5");
    let (heads, q_lora, kv_lora, nope, rope, v) = if glm5 {
        (64, 2048, 512, 192, 64, 256)
    } else {
        (8, 256, 128, 32, 16, 32)
    };
    let heads: usize = arg(&args, "--heads", heads);
    let (hi, di) = if glm5 { (32, 128) } else { (4, 32) };
    std::fs::create_dir_all(&out)?;
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("demo");
    std::fs::copy(demo.join("tokenizer.json"), out.join("tokenizer.json"))?;
    // The vocabulary and stop tokens are the demo tokenizer's, whatever it is.
    let tok: Value = serde_json::from_slice(&std::fs::read(demo.join("tokenizer.json"))?)?;
    let id_of = |name: &str| -> Option<u64> {
        tok["added_tokens"]
            .as_array()?
            .iter()
            .find(|t| t["content"] == name)
            .and_then(|t| t["id"].as_u64())
    };
    let max_vocab = tok["model"]["vocab"]
        .as_object()
        .map(|m| m.values().filter_map(Value::as_u64).max().unwrap_or(0))
        .unwrap_or(0);
    let max_added = tok["added_tokens"]
        .as_array()
        .map(|a| a.iter().filter_map(|t| t["id"].as_u64()).max().unwrap_or(0))
        .unwrap_or(0);
    let tok_vocab = (max_vocab.max(max_added) + 1) as usize;
    let vocab: usize = arg(&args, "--vocab", tok_vocab);
    assert!(
        vocab >= tok_vocab,
        "--vocab {vocab}: must be at least the tokenizer's {tok_vocab}"
    );
    let eos: Vec<u64> = ["<|endoftext|>", "<|user|>", "<|observation|>"]
        .iter()
        .filter_map(|n| id_of(n))
        .collect();
    if families::NAMES.contains(&family.as_str()) {
        assert!(
            dense_layers == 0,
            "--dense-layers {dense_layers}: --family {family} has no dense layers"
        );
        assert!(
            !(bf16 || fp8 || mtp),
            "--family {family}: writes quantized experts only, without an MTP head (no --bf16, --fp8, \
             --mtp)"
        );
        let c = families::Common {
            family: &family,
            out: &out,
            layers,
            n_exp,
            top_k,
            h,
            inter,
            skew,
            shard_gb,
            per_row,
            mxfp4,
            vocab,
            max_pos,
            eos,
        };
        let total = families::write(&c, &mut rng)?;
        println!(
            "synthetic {family}: {layers} layers, {n_exp} experts (top-{top_k}), hidden {h}, \
             expert {:.2} MB {}, {:.2} GB on disk in {}",
            families::expert_bytes(&c, &family) as f64 / 1e6,
            if mxfp4 {
                "mxfp4"
            } else if per_row {
                "int4-row"
            } else {
                "int4-g64"
            },
            total as f64 / 1e9,
            out.display()
        );
        return Ok(());
    }
    assert!(
        !mxfp4,
        "--expert-format mxfp4: only --family gpt_oss ships MXFP4 experts"
    );
    let config = json!({
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
        "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": null,
        "dtype": "bfloat16", "eos_token_id": eos, "first_k_dense_replace": dense_layers,
        "head_dim": rope, "hidden_act": "silu", "hidden_size": h,
        "index_head_dim": di, "index_n_heads": hi, "index_topk": 2048,
        "indexer_types": (0..layers).map(|l| if l == 0 { "full" } else { "shared" }).collect::<Vec<_>>(),
        "initializer_range": 0.02, "intermediate_size": 2 * inter,
        "kv_lora_rank": kv_lora,
        "layer_types": vec!["indexed_attention"; layers],
        "max_position_embeddings": max_pos, "mlp_bias": false,
        "mlp_layer_types": (0..layers).map(|l| if is_dense(l) { "dense" } else { "sparse" }).collect::<Vec<_>>(),
        "moe_intermediate_size": inter, "n_group": 1, "n_routed_experts": n_exp,
        "n_shared_experts": 1, "norm_topk_prob": true, "num_attention_heads": heads,
        "num_experts_per_tok": top_k, "num_hidden_layers": layers, "num_key_value_heads": heads,
        "pad_token_id": null, "q_lora_rank": q_lora, "qk_head_dim": nope + rope,
        "qk_nope_head_dim": nope, "qk_rope_head_dim": rope, "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "routed_scaling_factor": 2.5, "tie_word_embeddings": false, "topk_group": 1,
        "use_cache": true, "v_head_dim": v, "vocab_size": vocab,
        "num_nextn_predict_layers": usize::from(mtp)
    });
    let config = if deepseek {
        // DeepSeek-V3's published shape of config (YaRN factor 40 over 4096 positions, expert
        // groups, FP8-free) at these sizes; V3.2 adds its indexer's three keys.
        let mut c = json!({
            "architectures": [if v32 { "DeepseekV32ForCausalLM" } else { "DeepseekV3ForCausalLM" }],
            "model_type": family, "attention_bias": false, "bos_token_id": null,
            "eos_token_id": eos, "first_k_dense_replace": dense_layers, "hidden_act": "silu",
            "hidden_size": h, "intermediate_size": 2 * inter, "kv_lora_rank": kv_lora,
            "max_position_embeddings": 163840, "moe_intermediate_size": inter,
            "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": n_exp, "n_shared_experts": 1,
            "norm_topk_prob": true, "num_attention_heads": heads, "num_experts_per_tok": top_k,
            "num_hidden_layers": layers, "num_key_value_heads": heads,
            "num_nextn_predict_layers": usize::from(mtp), "q_lora_rank": q_lora,
            "qk_nope_head_dim": nope, "qk_rope_head_dim": rope, "rms_norm_eps": 1e-6,
            "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
            "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
            "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc",
            "v_head_dim": v, "vocab_size": vocab
        });
        if v32 {
            c["index_topk"] = json!(2048);
            c["index_head_dim"] = json!(di);
            c["index_n_heads"] = json!(hi);
        }
        c
    } else if glm4 {
        json!({
            "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
            "attention_bias": true, "bos_token_id": null, "eos_token_id": eos,
            "first_k_dense_replace": dense_layers, "head_dim": head_dim, "hidden_act": "silu",
            "hidden_size": h, "intermediate_size": 2 * inter,
            "max_position_embeddings": max_pos, "moe_intermediate_size": inter,
            "n_group": 1, "n_routed_experts": n_exp, "n_shared_experts": 1,
            "norm_topk_prob": true, "num_attention_heads": heads, "num_experts_per_tok": top_k,
            "num_hidden_layers": layers, "num_key_value_heads": kv_heads,
            "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0,
            "routed_scaling_factor": 2.5, "tie_word_embeddings": false, "topk_group": 1,
            "use_qk_norm": false, "vocab_size": vocab
        })
    } else if qwen {
        json!({
            "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "attention_bias": false, "bos_token_id": null, "decoder_sparse_step": 1,
            "eos_token_id": eos, "head_dim": head_dim, "hidden_act": "silu", "hidden_size": h,
            "intermediate_size": 2 * inter, "max_position_embeddings": max_pos,
            "mlp_only_layers": (0..dense_layers).collect::<Vec<_>>(),
            "moe_intermediate_size": inter, "norm_topk_prob": true,
            "num_attention_heads": heads, "num_experts": n_exp, "num_experts_per_tok": top_k,
            "num_hidden_layers": layers, "num_key_value_heads": kv_heads, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "tie_word_embeddings": false, "use_sliding_window": false,
            "vocab_size": vocab
        })
    } else {
        config
    };
    std::fs::write(
        out.join("config.json"),
        serde_json::to_string_pretty(&config)?,
    )?;

    let s = |fan_in: usize| 1.0 / (fan_in as f32).sqrt();
    let mut dense = vec![
        f32t(
            "model.embed_tokens.weight".into(),
            vec![vocab, h],
            Gen::Uniform(1.0),
        ),
        f32t("lm_head.weight".into(), vec![vocab, h], Gen::Uniform(s(h))),
        f32t("model.norm.weight".into(), vec![h], Gen::Const(1.0)),
    ];
    // The MTP head is layer `layers`: a sparse layer with its own indexer, plus its own parts.
    for l in 0..layers + usize::from(mtp) {
        let p = format!("model.layers.{l}");
        let a = format!("{p}.self_attn");
        let w = |name: String, rows: usize, cols: usize| {
            f32t(name, vec![rows, cols], Gen::Uniform(s(cols)))
        };
        dense.push(f32t(
            format!("{p}.input_layernorm.weight"),
            vec![h],
            Gen::Const(1.0),
        ));
        dense.push(f32t(
            format!("{p}.post_attention_layernorm.weight"),
            vec![h],
            Gen::Const(1.0),
        ));
        if gqa {
            dense.push(w(format!("{a}.q_proj.weight"), heads * head_dim, h));
            dense.push(w(format!("{a}.k_proj.weight"), kv_heads * head_dim, h));
            dense.push(w(format!("{a}.v_proj.weight"), kv_heads * head_dim, h));
            dense.push(w(format!("{a}.o_proj.weight"), h, heads * head_dim));
        }
        if qwen {
            for norm in ["q_norm", "k_norm"] {
                dense.push(f32t(
                    format!("{a}.{norm}.weight"),
                    vec![head_dim],
                    Gen::Const(1.0),
                ));
            }
        }
        if glm4 {
            for (proj, n) in [
                ("q_proj", heads * head_dim),
                ("k_proj", kv_heads * head_dim),
                ("v_proj", kv_heads * head_dim),
            ] {
                dense.push(f32t(format!("{a}.{proj}.bias"), vec![n], Gen::Const(0.0)));
            }
        }
        if gqa && is_dense(l) {
            for (proj, rows, cols) in [
                ("gate_proj", 2 * inter, h),
                ("up_proj", 2 * inter, h),
                ("down_proj", h, 2 * inter),
            ] {
                dense.push(w(format!("{p}.mlp.{proj}.weight"), rows, cols));
            }
            continue;
        }
        if qwen {
            dense.push(f32t(
                format!("{p}.mlp.gate.weight"),
                vec![n_exp, h],
                Gen::Uniform(0.02),
            ));
            continue;
        }
        if !glm4 {
            dense.push(w(format!("{a}.q_a_proj.weight"), q_lora, h));
            dense.push(f32t(
                format!("{a}.q_a_layernorm.weight"),
                vec![q_lora],
                Gen::Const(1.0),
            ));
            dense.push(w(
                format!("{a}.q_b_proj.weight"),
                heads * (nope + rope),
                q_lora,
            ));
            dense.push(w(
                format!("{a}.kv_a_proj_with_mqa.weight"),
                kv_lora + rope,
                h,
            ));
            dense.push(f32t(
                format!("{a}.kv_a_layernorm.weight"),
                vec![kv_lora],
                Gen::Const(1.0),
            ));
            dense.push(w(
                format!("{a}.kv_b_proj.weight"),
                heads * (nope + v),
                kv_lora,
            ));
            dense.push(w(format!("{a}.o_proj.weight"), h, heads * v));
            if l == layers {
                for norm in ["enorm", "hnorm", "shared_head.norm"] {
                    dense.push(f32t(format!("{p}.{norm}.weight"), vec![h], Gen::Const(1.0)));
                }
                dense.push(w(format!("{p}.eh_proj.weight"), h, 2 * h));
            }
            // GLM-5 keeps an indexer on its first layer (the rest share its selection) and in
            // the MTP head; V3.2 on every layer; V3 none.
            let indexed = if deepseek { v32 } else { l == 0 || l == layers };
            if indexed {
                dense.push(w(format!("{a}.indexer.wq_b.weight"), hi * di, q_lora));
                dense.push(w(format!("{a}.indexer.wk.weight"), di, h));
                dense.push(f32t(
                    format!("{a}.indexer.k_norm.weight"),
                    vec![di],
                    Gen::Const(1.0),
                ));
                dense.push(f32t(
                    format!("{a}.indexer.k_norm.bias"),
                    vec![di],
                    Gen::Const(0.0),
                ));
                dense.push(w(format!("{a}.indexer.weights_proj.weight"), hi, h));
            }
        }
        if is_dense(l) {
            for (proj, rows, cols) in [
                ("gate_proj", 2 * inter, h),
                ("up_proj", 2 * inter, h),
                ("down_proj", h, 2 * inter),
            ] {
                dense.push(w(format!("{p}.mlp.{proj}.weight"), rows, cols));
            }
            continue;
        }
        dense.push(f32t(
            format!("{p}.mlp.gate.weight"),
            vec![n_exp, h],
            Gen::Uniform(0.02),
        ));
        // Skew: a random ranking of the experts; the bias falls with the log of the rank.
        let mut order: Vec<usize> = (0..n_exp).collect();
        for i in (1..n_exp).rev() {
            order.swap(i, (rng.next() % (i as u64 + 1)) as usize);
        }
        let mut bias = vec![0f32; n_exp];
        for (rank, &e) in order.iter().enumerate() {
            bias[e] = -skew * (1.0 + rank as f32).ln();
        }
        dense.push(f32t(
            format!("{p}.mlp.gate.e_score_correction_bias"),
            vec![n_exp],
            Gen::Values(bias),
        ));
        for (proj, rows, cols) in [
            ("gate_proj", inter, h),
            ("up_proj", inter, h),
            ("down_proj", h, inter),
        ] {
            dense.push(w(
                format!("{p}.mlp.shared_experts.{proj}.weight"),
                rows,
                cols,
            ));
        }
    }
    let dense_bytes = write_shard(&out.join("model-dense.safetensors"), &dense, &mut rng)?;

    // Experts: gate, gate.qs, up, up.qs, down, down.qs back to back; shards of ~--shard-gb.
    let per_shard = ((shard_gb * 1e9) as usize / expert_bytes).max(1);
    let all: Vec<(usize, usize)> = (0..layers)
        .filter(|&l| !is_dense(l))
        .flat_map(|l| (0..n_exp).map(move |e| (l, e)))
        .collect();
    let mut total = dense_bytes;
    for (i, chunk) in all.chunks(per_shard).enumerate() {
        let mut ts = Vec::with_capacity(chunk.len() * 6);
        for &(l, e) in chunk {
            for (proj, rows, cols) in [
                ("gate_proj", inter, h),
                ("up_proj", inter, h),
                ("down_proj", h, inter),
            ] {
                let name = format!("model.layers.{l}.mlp.experts.{e}.{proj}.weight");
                if fp8 {
                    let grid = vec![rows.div_ceil(128), cols.div_ceil(128)];
                    let n = grid[0] * grid[1];
                    ts.push(Tensor {
                        name: name.clone(),
                        dtype: "F8_E4M3",
                        shape: vec![rows, cols],
                        gen: Gen::Fp8,
                    });
                    // Codes reach 448: scale so the weights are ~1/sqrt(fan_in).
                    let sc = s(cols) / 100.0;
                    ts.push(f32t(
                        format!("{name}_scale_inv"),
                        grid,
                        Gen::Values(vec![sc; n]),
                    ));
                    continue;
                }
                if bf16 {
                    ts.push(Tensor {
                        name,
                        dtype: "BF16",
                        shape: vec![rows, cols],
                        gen: Gen::Bf16Uniform(s(cols) * 3f32.sqrt()),
                    });
                    continue;
                }
                // Nibbles are uniform in [-8, 7] (std ~4.6): scale to ~1/sqrt(fan_in).
                let sc = s(cols) / 4.6;
                ts.push(Tensor {
                    name: name.clone(),
                    dtype: "U8",
                    shape: vec![rows, cols / 2],
                    gen: Gen::Bytes,
                });
                let spr = scales_per_row(cols);
                ts.push(f32t(
                    format!("{name}.qs"),
                    vec![rows, spr],
                    Gen::Values(
                        (0..rows * spr)
                            .map(|_| sc * (1.0 + 0.25 * rng.unit()))
                            .collect(),
                    ),
                ));
            }
        }
        let path = out.join(format!("model-experts-{:05}.safetensors", i + 1));
        total += write_shard(&path, &ts, &mut rng)?;
        eprintln!("wrote {} ({} experts)", path.display(), chunk.len());
    }
    if mtp {
        // The head's experts, int8 per row (U8 blob + one f32 scale a row): the loader keeps
        // them as stored, at the 8 bits the head needs.
        let mut ts = Vec::with_capacity(n_exp * 6);
        for e in 0..n_exp {
            for (proj, rows, cols) in [
                ("gate_proj", inter, h),
                ("up_proj", inter, h),
                ("down_proj", h, inter),
            ] {
                let name = format!("model.layers.{layers}.mlp.experts.{e}.{proj}.weight");
                ts.push(Tensor {
                    name: name.clone(),
                    dtype: "U8",
                    shape: vec![rows, cols],
                    gen: Gen::Bytes,
                });
                // Bytes are uniform in [-128, 127] (std ~74): scale to ~1/sqrt(fan_in).
                let sc = s(cols) / 74.0;
                ts.push(f32t(
                    format!("{name}.qs"),
                    vec![rows, 1],
                    Gen::Values((0..rows).map(|_| sc * (1.0 + 0.25 * rng.unit())).collect()),
                ));
            }
        }
        let path = out.join("model-mtp-experts-00001.safetensors");
        total += write_shard(&path, &ts, &mut rng)?;
        eprintln!("wrote {} (the MTP head's {n_exp} experts)", path.display());
    }
    println!(
        "synthetic {}: {layers} layers ({dense_layers} dense){}, {n_exp} experts (top-{top_k}), hidden {h}, \
         expert {:.2} MB {}, {:.2} GB on disk in {}",
        family,
        if mtp { " + an MTP head" } else { "" },
        expert_bytes as f64 / 1e6,
        if fp8 {
            "fp8"
        } else if bf16 {
            "bf16"
        } else if per_row {
            "int4-row"
        } else {
            "int4-g64"
        },
        total as f64 / 1e9,
        out.display()
    );
    Ok(())
}
