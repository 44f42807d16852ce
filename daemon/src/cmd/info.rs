//! `colibri info`: which model a directory holds and whether it fits this machine, from its
//! config and shard headers only (no weights are loaded, so it answers at once even for a
//! model far bigger than RAM). `serve` and `run` print the same facts on one `[MODEL]` line.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::cli::InfoArgs;
use crate::config::{Attn, MlpKind, ModelConfig};
use crate::error::EngineError;
use crate::experts::ram::auto_budget;
use crate::model::LoadOptions;
use crate::weights::ShardSet;

/// What `info` reports.
#[derive(Clone, Debug)]
pub struct ModelFacts {
    pub dirs: Vec<PathBuf>,
    pub family: &'static str,
    /// Parameters from the config's shapes: all of them, and those one token uses.
    pub params: u64,
    pub active_params: u64,
    /// The MTP layers' own parameters, on top of `params`.
    pub mtp_params: u64,
    /// Compute formats of the routed experts and of the other matrices, each with where it
    /// comes from: `(stored)` when the container holds them quantized (the engine computes in
    /// the stored format whatever the flags say), `(at load)` when the flags' format is made
    /// from f32/bf16/fp8 weights as they load.
    pub expert_format: String,
    pub dense_format: String,
    /// Where the chat template comes from (its file, or the family's built-in one).
    pub template: String,
    pub layers: usize,
    pub sparse_layers: usize,
    pub experts_per_layer: usize,
    pub experts_per_token: usize,
    /// One routed expert's bytes as stored.
    pub expert_bytes: u64,
    /// The shard files' bytes.
    pub disk_bytes: u64,
    pub context: usize,
    pub state_dir: Option<PathBuf>,
    /// The RAM budget (`--ram-gb`, else 88% of MemAvailable or of the cgroup's limit) and what a start needs at least:
    /// the dense weights, the fixed reserve and one expert per sparse layer.
    pub budget: u64,
    pub min_need: u64,
    /// Every expert in RAM as well.
    pub all_need: u64,
}

impl ModelFacts {
    pub fn gather(
        dirs: &[PathBuf],
        opts: &LoadOptions,
        state_dir: Option<&Path>,
    ) -> Result<ModelFacts, EngineError> {
        let find = |name: &str| -> PathBuf {
            dirs.iter()
                .map(|d| d.join(name))
                .find(|p| p.exists())
                .unwrap_or_else(|| dirs[0].join(name))
        };
        let cfg = ModelConfig::load(find("config.json").parent().unwrap_or(Path::new(".")))?;
        let template = crate::engine::template_origin(dirs, cfg.family);
        let shards = ShardSet::open(dirs)?;
        let disk_bytes = shard_bytes(&shards);
        let sparse: Vec<usize> = (0..cfg.num_hidden_layers)
            .filter(|&l| cfg.mlp_layer_types.get(l) == Some(&MlpKind::Sparse))
            .collect();
        let expert_bytes = stored_expert(&shards, &cfg).map_or(0, |e| e.bytes);
        // The MTP layers the config declares, if the checkpoint holds them (fixtures and
        // conversions may leave them out).
        let mtp_prefix = format!("model.layers.{}.", cfg.num_hidden_layers);
        let mtp = match shards.names().any(|n| n.starts_with(&mtp_prefix)) {
            true => std::fs::read_to_string(find("config.json")).map_or(0, |t| mtp_layers(&t)),
            false => 0,
        };
        let counts = count_params(&cfg, mtp);
        let dense = crate::engine::projected_dense_bytes(&shards, opts);
        let budget = match opts.tiers.ram_gb {
            Some(g) => (g * 1e9) as u64,
            None => {
                auto_budget(
                    crate::telemetry::meminfo().1,
                    crate::telemetry::cgroup_memory_limit(),
                )
                .0
            }
        };
        let reserve = opts.tiers.reserve(budget);
        let layer_bytes = sparse.len() as u64 * expert_bytes;
        Ok(ModelFacts {
            dirs: dirs.to_vec(),
            family: cfg.family.model_type(),
            params: counts.total,
            active_params: counts.active,
            mtp_params: counts.mtp,
            expert_format: sparse.first().map_or_else(
                || "(no routed experts)".to_string(),
                |l| {
                    let mut name = format!("model.layers.{l}.mlp.experts.0.gate_proj.weight");
                    // gpt-oss's published MXFP4, read in place: gate and up fused.
                    let fused = format!("model.layers.{l}.mlp.experts.0.gate_up_proj.weight");
                    if !shards.contains(&name) && shards.contains(&fused) {
                        name = fused;
                    }
                    format_of(
                        &shards,
                        &name,
                        cfg.moe_intermediate_size,
                        cfg.hidden_size,
                        opts.expert_fmt,
                    )
                },
            ),
            dense_format: {
                // Layer 0's o_proj: every family has one, and the engine reads the dense
                // format off it too.
                // A hybrid stack whose layer 0 is a DeltaNet one: its out_proj stands in.
                let delta0 = cfg
                    .hybrid()
                    .filter(|hy| hy.mixer(0) == crate::config::MixerKind::Linear);
                let cols = match (&cfg.attn, delta0) {
                    (_, Some(hy)) => hy.delta.value_dim(),
                    (Attn::Gqa(g), _) => cfg.num_attention_heads * g.head_dim,
                    (Attn::Hybrid(hy), _) => cfg.num_attention_heads * hy.gqa.head_dim,
                    (Attn::Mla(m), _) => cfg.num_attention_heads * m.v_head_dim,
                };
                let name = match delta0 {
                    Some(_) => "model.layers.0.linear_attn.out_proj.weight",
                    None => "model.layers.0.self_attn.o_proj.weight",
                };
                format_of(&shards, name, cfg.hidden_size, cols, opts.dense_fmt)
            },
            template,
            layers: cfg.num_hidden_layers,
            sparse_layers: sparse.len(),
            experts_per_layer: cfg.n_routed_experts,
            experts_per_token: cfg.num_experts_per_tok,
            expert_bytes,
            disk_bytes,
            context: cfg.max_position_embeddings,
            state_dir: state_dir.map(Path::to_path_buf),
            budget,
            min_need: dense + reserve + layer_bytes,
            all_need: dense + reserve + layer_bytes * cfg.n_routed_experts as u64,
        })
    }

    fn path(&self) -> String {
        self.dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    }

    fn fits(&self) -> &'static str {
        if self.all_need <= self.budget {
            "yes, every expert too"
        } else if self.min_need <= self.budget {
            "yes, experts stream from disk"
        } else {
            "no"
        }
    }

    /// The one stderr line `serve` and `run` print at start.
    pub fn stderr_line(&self) -> String {
        format!(
            "[MODEL] {} | {} | {} params ({} active) | experts {} dense {} | {} experts/layer x {} layers, {} each | context {} | state {}",
            self.path(),
            self.family,
            count(self.params),
            count(self.active_params),
            self.expert_format,
            self.dense_format,
            self.experts_per_layer,
            self.sparse_layers,
            bytes(self.expert_bytes),
            self.context,
            self.state(),
        )
    }

    /// The state folder, or `(none)`.
    fn state(&self) -> String {
        self.state_dir
            .as_ref()
            .map_or("(none)".into(), |d| d.display().to_string())
    }

    pub fn text(&self) -> String {
        format!(
            "model        {}\nfamily       {}\nparameters   {} ({} active per token)\n{}formats      experts {}, dense {}\nlayers       {} ({} with routed experts)\nexperts      {} per layer, {} per token, {} each\ndisk         {}\ncontext      {} tokens\ntemplate     {}\nstate        {}\nram budget   {} (needs {} to start, {} with every expert in RAM)\nfits         {}\n",
            self.path(),
            self.family,
            count(self.params),
            count(self.active_params),
            mtp_line(self.mtp_params),
            self.expert_format,
            self.dense_format,
            self.layers,
            self.sparse_layers,
            self.experts_per_layer,
            self.experts_per_token,
            bytes(self.expert_bytes),
            bytes(self.disk_bytes),
            self.context,
            self.template,
            self.state(),
            bytes(self.budget),
            bytes(self.min_need),
            bytes(self.all_need),
            self.fits(),
        )
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "model": self.dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>(),
            "family": self.family,
            "parameters": self.params,
            "active_parameters": self.active_params,
            "params": self.params,
            "active": self.active_params,
            "mtp": self.mtp_params,
            "expert_format": self.expert_format,
            "dense_format": self.dense_format,
            "layers": self.layers,
            "sparse_layers": self.sparse_layers,
            "experts_per_layer": self.experts_per_layer,
            "experts_per_token": self.experts_per_token,
            "expert_bytes": self.expert_bytes,
            "disk_bytes": self.disk_bytes,
            "context": self.context,
            "chat_template": self.template,
            "state_dir": self.state_dir.as_ref().map(|d| d.display().to_string()),
            "ram_budget_bytes": self.budget,
            "ram_needed_bytes": self.min_need,
            "ram_all_experts_bytes": self.all_need,
            "fits": self.min_need <= self.budget,
            "fits_all_experts": self.all_need <= self.budget,
        })
    }
}

/// The shard files' bytes on disk.
pub(crate) fn shard_bytes(shards: &ShardSet) -> u64 {
    (0..shards.num_files())
        .filter_map(|i| std::fs::metadata(shards.file_path(i)).ok())
        .map(|m| m.len())
        .sum()
}

/// One routed expert as stored: expert 0 of the first sparse layer.
pub(crate) struct StoredExpert {
    pub bytes: u64,
    /// Packed by `convert` (its bytes are what RAM holds too), not quantized at load.
    pub prequantized: bool,
}

/// [`StoredExpert`] of a model, `None` without routed experts.
pub(crate) fn stored_expert(shards: &ShardSet, cfg: &ModelConfig) -> Option<StoredExpert> {
    let l = (0..cfg.num_hidden_layers)
        .find(|&l| cfg.mlp_layer_types.get(l) == Some(&MlpKind::Sparse))?;
    let prefix = format!("model.layers.{l}.mlp.experts.0.");
    let tensors: Vec<_> = shards
        .names()
        .filter(|n| n.starts_with(&prefix))
        .filter_map(|n| shards.get(n))
        .collect();
    Some(StoredExpert {
        bytes: tensors.iter().map(|t| t.len).sum(),
        prequantized: tensors.iter().any(|t| {
            matches!(
                t.dtype,
                crate::weights::Dtype::U8 | crate::weights::Dtype::I8
            )
        }),
    })
}

/// Parameter counts from a config's shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamCount {
    /// Every tensor of the model as transformers builds it (embeddings, norms, attention with
    /// its biases and the DSA indexer, dense and routed MLPs, routers), without the MTP layers.
    pub total: u64,
    /// What one token's forward pass multiplies by: `top_k` of each layer's routed experts and
    /// everything that is not a routed expert, the output head included but not the input
    /// embedding table, of which a token reads one row. This is DeepSeek's definition (its
    /// README_WEIGHTS.md: "36.6B activated, including 0.9B for the output head"); vendors who
    /// count the input table too, or neither table, differ from it by `embedding`.
    pub active: u64,
    /// The input embedding table (`vocab_size x hidden_size`; with tied embeddings it is also
    /// the output head).
    pub embedding: u64,
    /// The MTP layers (`num_nextn_predict_layers`) on top of `total`, without the embedding
    /// and output head they share with the main model. Published totals leave them out
    /// (DeepSeek-V3's 671B does; the 685B of its Hugging Face page counts them).
    pub mtp: u64,
}

/// The counts of `c`, with `mtp_layers` MTP layers (config.json's `num_nextn_predict_layers`).
/// A test checks them against the tensors of every oracle fixture.
pub fn count_params(c: &ModelConfig, mtp_layers: u64) -> ParamCount {
    let (h, heads) = (c.hidden_size as u64, c.num_attention_heads as u64);
    let norms = 2 * h;
    let attn = match &c.attn {
        Attn::Gqa(g) => {
            let (kv, hd) = (g.kv_heads as u64, g.head_dim as u64);
            let (q, k) = (heads * hd, kv * hd);
            let mut n = h * q + 2 * h * k + q * h;
            if c.attention_bias {
                n += q + 2 * k;
                // Qwen3-MoE biases o_proj too; GLM-4.x does not.
                if c.family.spec().o_proj_bias {
                    n += h;
                }
            }
            if g.qk_norm {
                // Per head, or over the whole q and k projections (MiniMax-M2).
                n += if g.qk_norm_whole { q + k } else { 2 * hd };
            }
            // gpt-oss: one learned sink logit per query head.
            if c.oss.is_some() {
                n += heads;
            }
            n
        }
        // Per layer, below.
        Attn::Hybrid(_) => 0,
        Attn::Mla(m) => {
            let qk = m.qk_head_dim() as u64;
            let (ql, kvl) = (m.q_lora_rank.unwrap_or(0) as u64, m.kv_lora_rank as u64);
            let q = if ql > 0 {
                h * ql + ql + ql * heads * qk
            } else {
                h * heads * qk
            };
            // `attention_bias` biases q_a_proj, kv_a_proj_with_mqa and o_proj (never the
            // unfactored q_proj, q_b_proj or kv_b_proj), as transformers builds MLA.
            let bias = if c.attention_bias {
                ql + kvl + m.qk_rope_head_dim as u64 + h
            } else {
                0
            };
            q + h * (kvl + m.qk_rope_head_dim as u64)
                + kvl
                + kvl * heads * (m.qk_nope_head_dim + m.v_head_dim) as u64
                + heads * m.v_head_dim as u64 * h
                + bias
        }
    };
    let q_lora = c.mla().and_then(|m| m.q_lora_rank).unwrap_or(0) as u64;
    let indexer = c.indexer().map_or(0, |ix| {
        let (idx_heads, idx_dim) = (ix.index_n_heads as u64, ix.index_head_dim as u64);
        q_lora * idx_heads * idx_dim + h * idx_dim + 2 * idx_dim + h * idx_heads
    });
    let mut expert = 3 * h * c.moe_intermediate_size as u64;
    // gpt-oss's experts carry biases: gate and up (the fused gate_up_proj_bias), and down.
    if c.oss.is_some() {
        expert += 2 * c.moe_intermediate_size as u64 + h;
    }
    let experts = c.n_routed_experts as u64;
    let router = experts * h
        + match c.router {
            crate::config::RouterKind::SigmoidBias => experts,
            crate::config::RouterKind::Softmax => 0,
            // gpt-oss's router is a biased linear layer.
            crate::config::RouterKind::SoftmaxTopk => experts,
        };
    // Qwen3.5-MoE: each layer's own mixer, and a gated shared expert of its own width.
    let attn_at = |l: usize| {
        c.hybrid()
            .map_or(attn, |hy| hy.mixer_params(l, h, heads, c.attention_bias))
    };
    let shared = c
        .hybrid()
        .map_or(c.n_shared_experts as u64 * expert, |hy| hy.shared_params(h));
    let (mut total, mut active) = (0u64, 0u64);
    for l in 0..c.num_hidden_layers {
        let mut layer = norms + attn_at(l);
        if c.indexer_kind(l) == crate::config::IndexerKind::Full {
            layer += indexer;
        }
        if c.mlp_layer_types.get(l) == Some(&MlpKind::Sparse) {
            layer += router + shared;
            total += layer + experts * expert;
            active += layer + c.num_experts_per_tok as u64 * expert;
        } else {
            layer += 3 * h * c.intermediate_size as u64;
            total += layer;
            active += layer;
        }
    }
    let embedding = c.vocab_size as u64 * h;
    let head = if c.tie_word_embeddings { 0 } else { embedding };
    // An MTP layer is one more sparse decoder layer (with an indexer where the family has one)
    // plus enorm, hnorm, eh_proj (2h -> h) and shared_head.norm; it reuses embed_tokens and
    // the output head.
    let mtp_indexer = match c.indexer_kind(0) {
        crate::config::IndexerKind::Full => indexer,
        _ => 0,
    };
    let mtp_layer = norms
        + attn
        + mtp_indexer
        + router
        + (c.n_shared_experts as u64 + experts) * expert
        + 2 * h
        + 2 * h * h
        + h;
    ParamCount {
        // + the final norm
        total: total + embedding + head + h,
        // The output head is one table whether or not it is tied to the input embedding.
        active: active + embedding + h,
        embedding,
        mtp: mtp_layers * mtp_layer,
    }
}

/// `num_nextn_predict_layers` of a config.json (0 when absent or not a count): the engine's
/// config parser does not keep it, and info only needs it to say how big the MTP head is.
pub fn mtp_layers(config_json: &str) -> u64 {
    serde_json::from_str::<serde_json::Value>(config_json)
        .ok()
        .and_then(|v| v.get("num_nextn_predict_layers")?.as_u64())
        .unwrap_or(0)
}

/// The format `name` (a `[rows, cols]` matrix) computes in, as loading decides it: a packed
/// container tensor's stored format (inferred from its lengths, the rule loading reads it by),
/// else `flag`, the format the weights are quantized to at load.
fn format_of(
    shards: &ShardSet,
    name: &str,
    rows: usize,
    cols: usize,
    flag: crate::quant::QFormat,
) -> String {
    let stored = shards
        .get(name)
        .filter(|t| t.dtype.is_packed())
        .and_then(|t| {
            let scales = shards.get(&format!("{name}.qs"))?;
            // gpt-oss's MXFP4 keeps its e8m0 scales as bytes.
            if scales.dtype == crate::weights::Dtype::U8 {
                return Some(crate::quant::QFormat::Mxfp4);
            }
            crate::quant::QFormat::infer(rows, cols, t.len as usize, scales.len as usize / 4)
        })
        .map(|f| f.canonical(cols));
    match stored {
        Some(f) => format!("{} (stored)", f.name()),
        // int4-g64 over at most 64 inputs is int4 per row, the same bits either way.
        None => format!("{} (at load)", flag.canonical(cols).name()),
    }
}

/// The text line for the MTP head, or nothing when the model has none.
fn mtp_line(mtp: u64) -> String {
    if mtp == 0 {
        String::new()
    } else {
        format!(
            "mtp head     {} more (not in the parameters above)\n",
            count(mtp)
        )
    }
}

fn count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.1}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1}k", n as f64 / 1e3),
        n => n.to_string(),
    }
}

fn bytes(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2} GB", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.2} MB", n as f64 / 1e6),
        n => format!("{:.1} kB", n as f64 / 1e3),
    }
}

/// The adapter `--gpu` opens (name, backend, driver, largest buffer), or why none.
fn gpu_line(choice: crate::gpu::GpuChoice) -> String {
    if choice == crate::gpu::GpuChoice::Off {
        return "[GPU] off (--gpu off)".into();
    }
    match crate::gpu::shared(choice) {
        Ok(g) => format!("[GPU] {}: largest buffer {}", g.name, bytes(g.max_buffer)),
        Err(e) => format!("[GPU] {e}"),
    }
}

/// `info --config FILE`: what a published `config.json` describes, without weights.
fn config_only(path: &Path, json: bool) -> Result<ExitCode, EngineError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| EngineError::Usage(format!("--config {}: {e}", path.display())))?;
    let cfg = ModelConfig::from_json(&text)
        .map_err(|e| EngineError::Usage(format!("--config {}: {e}", path.display())))?;
    let counts = count_params(&cfg, mtp_layers(&text));
    let sparse = cfg
        .mlp_layer_types
        .iter()
        .filter(|k| **k == MlpKind::Sparse)
        .count();
    if json {
        println!(
            "{}",
            serde_json::json!({
                "config": path.display().to_string(),
                "family": cfg.family.model_type(),
                "params": counts.total,
                "active": counts.active,
                "embedding": counts.embedding,
                "mtp": counts.mtp,
                "layers": cfg.num_hidden_layers,
                "sparse_layers": sparse,
                "experts_per_layer": cfg.n_routed_experts,
                "experts_per_token": cfg.num_experts_per_tok,
                "context": cfg.max_position_embeddings,
            })
        );
    } else {
        print!(
            "config       {}\nfamily       {}\nparameters   {} ({} active per token)\n{}layers       {} ({} with routed experts)\nexperts      {} per layer, {} per token\ncontext      {} tokens\n",
            path.display(),
            cfg.family.model_type(),
            count(counts.total),
            count(counts.active),
            mtp_line(counts.mtp),
            cfg.num_hidden_layers,
            sparse,
            cfg.n_routed_experts,
            cfg.num_experts_per_tok,
            cfg.max_position_embeddings,
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run(args: InfoArgs) -> Result<ExitCode, EngineError> {
    if let Some(path) = &args.config {
        return config_only(path, args.json);
    }
    let dirs = args.model.dirs()?;
    let opts = args.model.load_options()?;
    let state_dir = crate::engine::state::resolve(&dirs[0], args.state_dir.as_deref())?;
    let facts = ModelFacts::gather(&dirs, &opts, Some(&state_dir))?;
    let gpu = gpu_line(opts.tiers.gpu);
    crate::elog!("{gpu}");
    if args.json {
        let mut v = facts.json();
        v["gpu"] = serde_json::Value::String(gpu.trim_start_matches("[GPU] ").to_string());
        println!("{v}");
    } else {
        print!("{}", facts.text());
    }
    // The reserve the budget line counts, said once so a "no" can be acted on.
    if facts.min_need > facts.budget && opts.tiers.ram_reserve.is_none() {
        crate::elog!(
            "[RAM] the fixed reserve is {:.2} GB (--ram-reserve-gb)",
            opts.tiers.reserve(facts.budget) as f64 / 1e9
        );
    }
    Ok(ExitCode::SUCCESS)
}
