//! What a model directory holds and whether it fits this machine, from its config and shard
//! headers only (no weights are loaded). `info` prints it whole; the daemons' start-up
//! (`engine::start`) and `run` print it on one `[MODEL]` line; `plan` counts parameters with
//! it. Engine-side so that every front reads it from here, none from another front.

use std::path::{Path, PathBuf};

pub use crate::config::params::{count_params, mtp_layers, ParamCount};
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
            true if crate::gguf::snap::is_gguf(&dirs[0]) => crate::gguf::snap::mtp_layers(&dirs[0]),
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
                    // DeepSeek-V4's o_b_proj mixes the groups' low-rank outputs.
                    (Attn::Dsv4(d), _) => d.o_groups * d.o_lora_rank,
                };
                let name = match (delta0, &cfg.attn) {
                    (Some(_), _) => "model.layers.0.linear_attn.out_proj.weight",
                    (None, Attn::Dsv4(_)) => "model.layers.0.self_attn.o_b_proj.weight",
                    (None, _) => "model.layers.0.self_attn.o_proj.weight",
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
    // A GGUF tensor whose ggml type a kernel computes as stored keeps that type; the others
    // are read as f32 and go the flag's way, as loading does.
    if let Some(crate::weights::Dtype::Ggml(t)) = shards.get(name).map(|t| t.dtype) {
        if crate::quant::ggml::COMPUTED.contains(&t) {
            return format!("{} (stored)", t.name());
        }
    }
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
pub(crate) fn mtp_line(mtp: u64) -> String {
    if mtp == 0 {
        String::new()
    } else {
        format!(
            "mtp head     {} more (not in the parameters above)\n",
            count(mtp)
        )
    }
}

pub(crate) fn count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.1}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1}k", n as f64 / 1e3),
        n => n.to_string(),
    }
}

pub(crate) fn bytes(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2} GB", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.2} MB", n as f64 / 1e6),
        n => format!("{:.1} kB", n as f64 / 1e3),
    }
}
