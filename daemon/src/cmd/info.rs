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
    /// Compute formats of the routed experts and of the other matrices.
    pub expert_format: String,
    pub dense_format: String,
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
        let shards = ShardSet::open(dirs)?;
        let disk_bytes = (0..shards.num_files())
            .filter_map(|i| std::fs::metadata(shards.file_path(i)).ok())
            .map(|m| m.len())
            .sum();
        let sparse: Vec<usize> = (0..cfg.num_hidden_layers)
            .filter(|&l| cfg.mlp_layer_types.get(l) == Some(&MlpKind::Sparse))
            .collect();
        let expert_bytes = sparse.first().map_or(0, |l| {
            let prefix = format!("model.layers.{l}.mlp.experts.0.");
            shards
                .names()
                .filter(|n| n.starts_with(&prefix))
                .filter_map(|n| shards.get(n))
                .map(|t| t.len)
                .sum()
        });
        let (params, active_params) = count_params(&cfg);
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
            params,
            active_params,
            expert_format: format!("{:?}", opts.expert_fmt),
            dense_format: format!("{:?}", opts.dense_fmt),
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
            "model        {}\nfamily       {}\nparameters   {} ({} active per token)\nformats      experts {}, dense {}\nlayers       {} ({} with routed experts)\nexperts      {} per layer, {} per token, {} each\ndisk         {}\ncontext      {} tokens\nstate        {}\nram budget   {} (needs {} to start, {} with every expert in RAM)\nfits         {}\n",
            self.path(),
            self.family,
            count(self.params),
            count(self.active_params),
            self.expert_format,
            self.dense_format,
            self.layers,
            self.sparse_layers,
            self.experts_per_layer,
            self.experts_per_token,
            bytes(self.expert_bytes),
            bytes(self.disk_bytes),
            self.context,
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
            "expert_format": self.expert_format,
            "dense_format": self.dense_format,
            "layers": self.layers,
            "sparse_layers": self.sparse_layers,
            "experts_per_layer": self.experts_per_layer,
            "experts_per_token": self.experts_per_token,
            "expert_bytes": self.expert_bytes,
            "disk_bytes": self.disk_bytes,
            "context": self.context,
            "state_dir": self.state_dir.as_ref().map(|d| d.display().to_string()),
            "ram_budget_bytes": self.budget,
            "ram_needed_bytes": self.min_need,
            "ram_all_experts_bytes": self.all_need,
            "fits": self.min_need <= self.budget,
            "fits_all_experts": self.all_need <= self.budget,
        })
    }
}

/// Parameters from the config's shapes, every tensor of the model as transformers builds it
/// (embeddings, norms, attention with its biases and the DSA indexer, dense and routed MLPs,
/// routers), without the MTP layers: (total, used by one token, which counts `top_k` of each
/// layer's routed experts). A test checks it against the tensors of every oracle fixture.
pub fn count_params(c: &ModelConfig) -> (u64, u64) {
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
                n += 2 * hd;
            }
            n
        }
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
    let expert = 3 * h * c.moe_intermediate_size as u64;
    let experts = c.n_routed_experts as u64;
    let router = experts * h
        + match c.router {
            crate::config::RouterKind::SigmoidBias => experts,
            crate::config::RouterKind::Softmax => 0,
        };
    let (mut total, mut active) = (0u64, 0u64);
    for l in 0..c.num_hidden_layers {
        let mut layer = norms + attn;
        if c.indexer_kind(l) == crate::config::IndexerKind::Full {
            layer += indexer;
        }
        if c.mlp_layer_types.get(l) == Some(&MlpKind::Sparse) {
            layer += router + c.n_shared_experts as u64 * expert;
            total += layer + experts * expert;
            active += layer + c.num_experts_per_tok as u64 * expert;
        } else {
            layer += 3 * h * c.intermediate_size as u64;
            total += layer;
            active += layer;
        }
    }
    let embed = c.vocab_size as u64 * h * if c.tie_word_embeddings { 1 } else { 2 };
    (total + embed + h, active + embed + h)
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
    let (params, active) = count_params(&cfg);
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
                "params": params,
                "active": active,
                "layers": cfg.num_hidden_layers,
                "sparse_layers": sparse,
                "experts_per_layer": cfg.n_routed_experts,
                "experts_per_token": cfg.num_experts_per_tok,
                "context": cfg.max_position_embeddings,
            })
        );
    } else {
        print!(
            "config       {}\nfamily       {}\nparameters   {} ({} active per token)\nlayers       {} ({} with routed experts)\nexperts      {} per layer, {} per token\ncontext      {} tokens\n",
            path.display(),
            cfg.family.model_type(),
            count(params),
            count(active),
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
