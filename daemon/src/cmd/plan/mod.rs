//! `colibri plan`: before a user downloads 400 GB, will the model run on this machine and how
//! fast? From the shapes alone (a published `config.json`, or a model on disk) and three probes
//! of this machine (disk reads of one expert's size through O_DIRECT at the I/O pool's depth,
//! the memory-read probe the benchmarks use, the prefill kernels at a chunk's shapes), it
//! splits the RAM budget as the engine would (dense weights, KV, reserve, experts) and predicts
//! decode tok/s cold (nothing cached yet) and warm (the cache holding what it can), time to
//! first token for a 1k-token prompt, the limit that binds and what would move it.
//!
//! The model of a token, kept deliberately simple so that `--measure` can check it:
//! ```text
//! expert time  = top_k experts per sparse layer / (memory probe x WHOLE_TOKEN_OF_PROBE)
//! dense time   = dense bytes read / min(memory probe x WHOLE_TOKEN_OF_PROBE,
//!                                       dense decode probe)
//! read time    = experts missed per token x stored bytes per expert / disk probe
//!                (read buffered: the misses the page cache holds / its copy's rate instead)
//! decode tok/s = 1 / (dense time + overlapped(expert time, read time))
//! hit rate     = experts per layer the RAM holds / experts per layer        (uniform routing)
//!              = share of the selections the most used experts took         (usage history)
//! page cache   = read buffered (`--direct auto` when the experts fit beside the budget):
//!                the next most used experts after ours, as many as its room holds; an
//!                expert's first read comes from disk, later ones from there while it holds it
//! first token  = expert MACs / expert probe (at a chunk's rows per expert)
//!              + other MACs / dense probe + attention's quadratic part / attention probe
//!                (MLA: with each chunk's rebuild of the keys and values, probed on the
//!                engine's MLA core at the model's widths)
//!              + experts each chunk reads / disk probe (or copies from the page cache)
//!                (each chunk's expert time and reads overlapped as a token's are) (`prefill`)
//! overlapped(a, b) = max(a, b) + (1 - READ_OVERLAP) x min(a, b)
//! ```

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::cli::PlanArgs;
use crate::config::{MlpKind, ModelConfig};
use crate::error::EngineError;
use crate::experts::io_auto::{choose_io, IoChoice, IoFacts};
use crate::experts::ram::{auto_budget, scaled_reserve, RamInputs};
use crate::experts::usage::Usage;
use crate::experts::IoMode;
use crate::quant::QFormat;

mod decode;
pub mod measure;
pub mod prefill;
mod probe;
mod report;
#[cfg(test)]
mod tests;
pub mod write;
#[cfg(test)]
mod write_tests;

pub use decode::{
    cold_window, overlapped, page_cache_copy_gbs, page_cache_room, token_compute_parts, token_s,
    Window, READ_OVERLAP,
};
use probe::{probe_attention, probe_dense_decode, probe_disk, probe_experts, probe_prefill};
use report::{gb, json, text};

/// The whole decode token's share of the memory probe that the engine reaches when every
/// expert it needs is in RAM: 0.83 on the medium model (README, "Warm decode"), the figure the
/// speed work measures in the same process.
pub const WHOLE_TOKEN_OF_PROBE: f64 = 0.83;

/// Reads the I/O pool keeps in flight by default (`--pipe` without a number).
pub const IO_DEPTH: usize = 4;
/// Prompt length the time-to-first-token figure is for.
pub const TTFT_PROMPT: usize = 1000;

/// The model's shapes, in what the prediction needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    pub family: &'static str,
    pub params: u64,
    pub active: u64,
    pub layers: usize,
    pub sparse_layers: usize,
    pub experts: usize,
    pub top_k: usize,
    pub hidden: usize,
    pub moe_intermediate: usize,
    pub vocab: usize,
    pub tied_embeddings: bool,
    pub max_positions: usize,
    /// KV cache bytes of one position in one session (as the engine stores it, f32).
    pub kv_bytes_per_position: u64,
    /// The k/v reconstruction buffer per context position (MLA; 0 for grouped-query).
    pub kvb_bytes_per_position: u64,
    /// Multiply-adds of one query-key pair over every layer (scores and values): attention's
    /// quadratic part of a prefill.
    pub attn_macs_per_pair: u64,
    /// Multiply-adds a prefill chunk spends per cached position, over every layer (MLA's
    /// rebuild of the keys and values; 0 for grouped-query).
    pub attn_macs_per_cached_position: u64,
    /// The MLA widths the attention probe runs at (`None`: grouped-query's probe).
    pub mla: Option<prefill::MlaWidths>,
    /// Working-set bytes of one prefill row (`model::batch_row_bytes`): the engine's chunk
    /// rule weighs them against the budget.
    pub prefill_row_bytes: u64,
}

impl Shape {
    pub fn from_config(c: &ModelConfig) -> Shape {
        let count = crate::engine::facts::count_params(c, 0);
        let (params, active) = (count.total, count.active);
        let sparse_layers = c
            .mlp_layer_types
            .iter()
            .filter(|k| **k == MlpKind::Sparse)
            .count();
        Shape {
            family: c.family.model_type(),
            params,
            active,
            layers: c.num_hidden_layers,
            sparse_layers,
            experts: c.n_routed_experts,
            top_k: c.num_experts_per_tok,
            hidden: c.hidden_size,
            moe_intermediate: c.moe_intermediate_size,
            vocab: c.vocab_size,
            tied_embeddings: c.tie_word_embeddings,
            max_positions: c.max_position_embeddings,
            kv_bytes_per_position: crate::model::KvCache::new(c).bytes_per_position() as u64,
            kvb_bytes_per_position: c.kvb_bytes_per_position() as u64,
            prefill_row_bytes: crate::model::batch_row_bytes(c),
            attn_macs_per_pair: prefill::attn_macs_per_pair(c),
            attn_macs_per_cached_position: prefill::attn_macs_per_cached_position(c),
            mla: prefill::mla_widths(c),
        }
    }

    /// Parameters of one routed expert (gate, up, down).
    pub fn expert_params(&self) -> u64 {
        3 * self.hidden as u64 * self.moe_intermediate as u64
    }

    /// Parameters of the input embedding table (and of the lm_head, untied).
    pub fn embed_params(&self) -> u64 {
        self.vocab as u64 * self.hidden as u64
    }

    /// Parameters outside the routed experts, embeddings and lm_head excluded.
    pub fn dense_matrix_params(&self) -> u64 {
        let routed = self.sparse_layers as u64 * self.experts as u64 * self.expert_params();
        let io = self.embed_params() * if self.tied_embeddings { 1 } else { 2 };
        self.params.saturating_sub(routed + io)
    }
}

/// Bytes of the model as it would be stored and held.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sizes {
    /// One routed expert as read from disk.
    pub expert_disk: u64,
    /// One routed expert as held in RAM (its compute format).
    pub expert_ram: u64,
    /// Everything outside the routed experts, as held in RAM.
    pub dense: u64,
    /// What of the dense part one decode token reads (one embedding row, not the table).
    pub dense_per_token: u64,
    /// The whole model on disk.
    pub disk: u64,
}

/// Bytes of a `[rows, cols]` matrix in `fmt`, scales included.
fn matrix_bytes(fmt: QFormat, rows: usize, cols: usize) -> u64 {
    (fmt.data_len(rows, cols) + 4 * fmt.scales_len(rows, cols)) as u64
}

impl Sizes {
    /// Sizes of a model converted with these formats (what `colibri convert` would write).
    pub fn converted(s: &Shape, expert_fmt: QFormat, dense_fmt: QFormat) -> Sizes {
        let (h, inter) = (s.hidden, s.moe_intermediate);
        let expert = 2 * matrix_bytes(expert_fmt, inter, h) + matrix_bytes(expert_fmt, h, inter);
        // The dense matrices' rows are not known from the totals: per-weight bits plus the
        // grouped formats' one f32 scale per 64 (per-row scales are negligible).
        let per_weight = dense_fmt.bits() as f64 / 8.0
            + if dense_fmt.group_size() > 0 {
                4.0 / 64.0
            } else {
                0.0
            };
        // Embedding and lm_head keep at least 8 bits (the engine's rule).
        let io_fmt = if dense_fmt.bits() < 8 {
            QFormat::I8Row
        } else {
            dense_fmt
        };
        let table = matrix_bytes(io_fmt, s.vocab, h);
        let head = if s.tied_embeddings { 0 } else { table };
        let dense = (s.dense_matrix_params() as f64 * per_weight) as u64 + table + head;
        let row = matrix_bytes(io_fmt, 1, h);
        let dense_per_token = if s.tied_embeddings {
            dense
        } else {
            dense - table + row
        };
        let routed = s.sparse_layers as u64 * s.experts as u64 * expert;
        Sizes {
            expert_disk: expert,
            expert_ram: expert,
            dense,
            dense_per_token,
            disk: dense + routed,
        }
    }
}

/// This machine's speeds, measured or given.
#[derive(Clone, Debug, PartialEq)]
pub struct Probes {
    pub disk_gbs: f64,
    pub disk_how: String,
    pub mem_gbs: f64,
    pub mem_how: String,
    /// Weight bytes per second of the dense format's matrix-vector product (a decode
    /// token's dense part), over more weights than a cache holds, billions.
    pub dense_gbs: f64,
    pub dense_how: String,
    /// Multiply-accumulates per second of the dense prefill kernel at a chunk's rows,
    /// billions.
    pub prefill_gmacs: f64,
    pub prefill_how: String,
    /// The same of the expert products at the rows one expert gets in a chunk.
    pub expert_gmacs: f64,
    pub expert_how: String,
    /// The same of attention's core: its f32 query-key pairs (and an MLA model's rebuild of
    /// the keys and values, on its own core).
    pub attention_gmacs: f64,
    pub attention_how: String,
}

/// Where the routing assumption comes from.
#[derive(Clone, Debug)]
pub enum Routing {
    /// Every expert equally likely: the worst case for a cache.
    Uniform,
    /// A usage history: per sparse layer, the selection counts sorted from most used.
    History {
        path: PathBuf,
        per_layer: Vec<Vec<u64>>,
    },
}

impl Routing {
    /// The share of selections that land on the `held` experts per layer a cache keeps (the
    /// most used ones, which the pinned tier and the LRU converge on).
    pub fn hit_rate(&self, held: usize, experts: usize) -> f64 {
        if experts == 0 {
            return 1.0;
        }
        match self {
            Routing::Uniform => (held.min(experts) as f64) / experts as f64,
            Routing::History { per_layer, .. } => {
                let rates: Vec<f64> = per_layer
                    .iter()
                    .filter_map(|counts| {
                        let total: u64 = counts.iter().sum();
                        (total > 0)
                            .then(|| counts.iter().take(held).sum::<u64>() as f64 / total as f64)
                    })
                    .collect();
                if rates.is_empty() {
                    Routing::Uniform.hit_rate(held, experts)
                } else {
                    rates.iter().sum::<f64>() / rates.len() as f64
                }
            }
        }
    }

    fn describe(&self) -> String {
        match self {
            Routing::Uniform => {
                "uniform (assumed: no usage history; a real model's skew only raises the hit rate)"
                    .into()
            }
            Routing::History { path, .. } => format!("usage history {}", path.display()),
        }
    }
}

/// The RAM split and the machine's limits the prediction works under.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Budget {
    pub ram: u64,
    pub vram: u64,
    pub ctx: usize,
    pub kv_slots: usize,
    /// Bytes the page cache keeps of the experts read buffered: the room `--direct auto`
    /// judges by ([`page_cache_room`]); 0 when the reads go around it (O_DIRECT).
    pub page_cache: u64,
}

/// Where the bytes of the budget go.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RamSplit {
    pub budget: u64,
    pub dense: u64,
    pub kv: u64,
    pub kv_per_1k: u64,
    pub kvb: u64,
    pub reserve: u64,
    pub working_set: u64,
    /// Experts the RAM holds per sparse layer (pinned and cached together), and in VRAM.
    pub experts_in_ram: usize,
    pub experts_in_vram: usize,
    pub expert_ram_bytes: u64,
}

/// One prediction.
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    pub split: RamSplit,
    pub fits: bool,
    pub hit_rate: f64,
    /// Experts per layer the page cache holds beside ours (0 unless read buffered), and the
    /// share of our cache's misses it serves warm.
    pub page_cache_experts: usize,
    pub page_cache_share: f64,
    /// Bytes a decode token computes from (dense part and its experts).
    pub bytes_per_token: u64,
    /// Expert bytes read from disk per token, warm and cold.
    pub disk_bytes_per_token: u64,
    pub cold_disk_bytes_per_token: u64,
    /// Expert bytes copied from the page cache per token, warm.
    pub page_cache_bytes_per_token: u64,
    pub decode_tok_s: f64,
    pub warm_decode_tok_s: f64,
    pub ttft_s: f64,
    /// Its terms.
    pub ttft: prefill::Ttft,
    /// The prefill chunk the engine would choose here (`experts::chunk::choose`), positions.
    pub prefill_chunk: usize,
    /// What binds warm decode: "memory bandwidth", "disk" or "RAM" (does not start).
    pub limit: &'static str,
    pub prefill_limit: &'static str,
}

/// The prediction for `shape` stored at `sizes` on a machine with `probes` and `budget`.
pub fn predict(
    shape: &Shape,
    sizes: &Sizes,
    probes: &Probes,
    budget: &Budget,
    routing: &Routing,
) -> Prediction {
    let mut inputs = ram_inputs(shape, sizes, budget);
    let (kv, kvb, reserve) = (inputs.kv_pool, inputs.kvb, inputs.reserve);
    let per_held = (shape.sparse_layers as u64 * sizes.expert_ram).max(1) as i128;
    // Experts (a layer's worth each) the VRAM tier would hold, at 90% of the device.
    let vram_room = (budget.vram as f64 * 0.9) as u64 / per_held as u64;
    // The engine's chunk rule, before the room is shared out; what the VRAM tier would hold
    // needs no RAM, as in `ExpertStore::start`.
    let vram_experts = vram_room.min(shape.experts as u64);
    let all_experts = (shape.experts as u64 - vram_experts) * per_held as u64;
    let chunk = crate::experts::chunk::choose(
        crate::experts::chunk::ChunkRequest::Auto,
        &inputs,
        all_experts,
        shape.prefill_row_bytes,
    );
    // The chunk's working set comes out of the cache only while a long chunk runs (as in
    // `ExpertStore::long_chunk`): decode holds what the budget gives without it, the first
    // token's prefill what it gives with it.
    let held_in = |inputs: &RamInputs| {
        let room = inputs.expert_room();
        let in_ram = (room.max(0) / per_held).min(shape.experts as i128) as usize;
        (
            room,
            in_ram,
            in_ram + (vram_room as usize).min(shape.experts - in_ram),
        )
    };
    let working_set = inputs.slack() - reserve - kv - kvb;
    let (room, in_ram, held) = held_in(&inputs);
    inputs.prefill_ws = chunk.extra_bytes;
    let prefill_held = held_in(&inputs).2;
    let fits = room >= per_held && inputs.expert_room() >= per_held;
    let in_vram = held - in_ram;
    let hit = routing.hit_rate(held, shape.experts);
    // The page cache keeps what it has room for of the experts we let go, the most used
    // first (it drops the least recently used pages as we do).
    let per_layer_disk = (shape.sparse_layers as u64 * sizes.expert_disk).max(1);
    let page_cache_holds = |held: usize| {
        ((budget.page_cache / per_layer_disk) as usize).min(shape.experts - held.min(shape.experts))
    };
    let in_page_cache = page_cache_holds(held);
    let hit_or_page_cache = routing.hit_rate(held + in_page_cache, shape.experts);
    let page_cache_share = if hit < 1.0 {
        ((hit_or_page_cache - hit) / (1.0 - hit)).clamp(0.0, 1.0)
    } else {
        0.0
    };

    let picks = (shape.sparse_layers * shape.top_k) as f64;
    let bytes_per_token = sizes.dense_per_token + (picks * sizes.expert_ram as f64) as u64;
    let (dense_s, expert_s) = token_compute_parts(
        sizes.dense_per_token,
        bytes_per_token - sizes.dense_per_token,
        probes,
    );
    let mem_s = dense_s + expert_s;
    let misses = picks * (1.0 - hit) * sizes.expert_disk as f64;
    let copied_warm = misses * page_cache_share;
    let disk_warm = misses - copied_warm;
    let disk_cold = picks * sizes.expert_disk as f64;
    let disk_s = |b: f64| b / (probes.disk_gbs * 1e9);
    let copy_s = copied_warm / (page_cache_copy_gbs(probes) * 1e9);
    let warm = 1.0 / token_s(dense_s, expert_s, disk_s(disk_warm) + copy_s);
    // A cold token reads every expert it meets, each for the first time: from disk, page
    // cache or not.
    let cold = 1.0 / token_s(dense_s, expert_s, disk_s(disk_cold));

    // The first token of a 1k prompt, chunk by chunk (`prefill`).
    let speeds = prefill::PrefillSpeeds {
        dense_gmacs: probes.prefill_gmacs,
        expert_gmacs: probes.expert_gmacs,
        attention_gmacs: probes.attention_gmacs,
        disk_gbs: probes.disk_gbs,
        copy_gbs: page_cache_copy_gbs(probes),
    };
    let ttft = prefill::ttft(
        &shape.prefill(),
        &speeds,
        (prefill_held, page_cache_holds(prefill_held)),
        sizes.expert_disk,
        TTFT_PROMPT,
        chunk.rows,
    );

    let limit = if !fits {
        "RAM"
    } else if disk_s(disk_warm) + copy_s > mem_s {
        if disk_s(disk_warm) > copy_s {
            "disk"
        } else {
            "the page cache's copies"
        }
    } else {
        "memory bandwidth"
    };
    Prediction {
        split: RamSplit {
            budget: budget.ram,
            dense: sizes.dense,
            kv,
            kv_per_1k: 1000 * shape.kv_bytes_per_position,
            kvb,
            reserve,
            working_set,
            experts_in_ram: in_ram,
            experts_in_vram: in_vram,
            expert_ram_bytes: in_ram as u64 * shape.sparse_layers as u64 * sizes.expert_ram,
        },
        fits,
        hit_rate: hit,
        page_cache_experts: in_page_cache,
        page_cache_share,
        bytes_per_token,
        disk_bytes_per_token: disk_warm as u64,
        cold_disk_bytes_per_token: disk_cold as u64,
        page_cache_bytes_per_token: copied_warm as u64,
        decode_tok_s: if fits { cold } else { 0.0 },
        warm_decode_tok_s: if fits { warm } else { 0.0 },
        ttft_s: ttft.total_s(),
        ttft,
        prefill_chunk: chunk.rows,
        limit,
        prefill_limit: if ttft.read_s > ttft.compute_s() {
            "disk"
        } else {
            "compute"
        },
    }
}

/// The engine's RAM clamp inputs for `shape` at `sizes` under `budget`: nothing pinned (the
/// pinned and cached experts share one room), the default reserve.
fn ram_inputs(shape: &Shape, sizes: &Sizes, budget: &Budget) -> RamInputs {
    RamInputs {
        budget: budget.ram,
        dense: sizes.dense,
        pinned: 0,
        expert_bytes: sizes.expert_ram,
        sparse_layers: shape.sparse_layers,
        n_experts: shape.experts,
        kv_pool: (budget.kv_slots * budget.ctx) as u64 * shape.kv_bytes_per_position,
        kvb: budget.ctx as u64 * shape.kvb_bytes_per_position,
        reserve: scaled_reserve(budget.ram),
        prefill_ws: 0,
    }
}

/// The RAM that holds every expert of `shape` at `sizes` (what a "fits entirely" needs).
pub fn ram_for_all(shape: &Shape, sizes: &Sizes, budget: &Budget) -> u64 {
    // The reserve scales with the budget below 14.8 GB; search the smallest budget that fits.
    let need = |ram: u64| {
        let inputs = ram_inputs(shape, sizes, &Budget { ram, ..*budget });
        sizes.dense
            + inputs.slack()
            + shape.sparse_layers as u64 * shape.experts as u64 * sizes.expert_ram
    };
    let mut ram = need(u64::MAX / 4);
    // Converges in a step or two: the reserve is capped at 3.7 GB.
    for _ in 0..4 {
        ram = need(ram);
    }
    ram
}

/// What the user asked about: shapes, sizes and where its files would live.
struct Subject {
    name: String,
    cfg: ModelConfig,
    shape: Shape,
    sizes: Sizes,
    formats: (String, String),
    usage: Option<PathBuf>,
    probe_dir: PathBuf,
    /// The config.json as `--measure` writes it (`--config` only).
    config_json: Option<serde_json::Value>,
}

fn subject(args: &PlanArgs) -> Result<Subject, EngineError> {
    let expert_fmt = QFormat::from_bits(args.expert_bits, 64)
        .map_err(|e| EngineError::Usage(format!("--expert-bits {}: {e}", args.expert_bits)))?;
    let dense_fmt = QFormat::from_bits(args.dense_bits, 64)
        .map_err(|e| EngineError::Usage(format!("--dense-bits {}: {e}", args.dense_bits)))?;
    match (&args.config, &args.snap) {
        (Some(path), None) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| EngineError::Usage(format!("--config {}: {e}", path.display())))?;
            // The shapes predicted are the ones `--measure` writes: fewer layers with
            // --layers, no MTP head.
            let config_json = write::measured_config(&text, args.layers.map(|n| n as usize))
                .map_err(|e| EngineError::Usage(format!("--config {}: {e}", path.display())))?;
            let cfg = ModelConfig::from_json(&config_json.to_string())
                .map_err(|e| EngineError::Usage(format!("--config {}: {e}", path.display())))?;
            let shape = Shape::from_config(&cfg);
            let sizes = Sizes::converted(&shape, expert_fmt, dense_fmt);
            Ok(Subject {
                name: path.display().to_string(),
                cfg,
                shape,
                sizes,
                formats: (expert_fmt.name().into(), dense_fmt.name().into()),
                usage: None,
                probe_dir: args
                    .probe_dir
                    .clone()
                    .or_else(|| args.measure.clone())
                    .unwrap_or_else(|| PathBuf::from(".")),
                config_json: Some(config_json),
            })
        }
        (None, Some(dir)) => {
            let cfg = ModelConfig::load(dir)?;
            let shape = Shape::from_config(&cfg);
            let mut sizes = Sizes::converted(&shape, expert_fmt, dense_fmt);
            // A model on disk: its stored expert and file sizes replace the computed ones
            // (a pre-quantized container keeps its format; a checkpoint quantizes at load).
            let shards = crate::weights::ShardSet::open(std::slice::from_ref(dir))?;
            sizes.disk = crate::engine::facts::shard_bytes(&shards);
            if let Some(e) = crate::engine::facts::stored_expert(&shards, &cfg) {
                sizes.expert_disk = e.bytes;
                if e.prequantized {
                    sizes.expert_ram = e.bytes;
                }
            }
            let state = crate::engine::state::resolve(dir, args.state_dir.as_deref())?;
            let usage = state.join(".coli_usage");
            Ok(Subject {
                name: dir.display().to_string(),
                cfg,
                shape,
                sizes,
                formats: (expert_fmt.name().into(), dense_fmt.name().into()),
                usage: usage.exists().then_some(usage),
                probe_dir: args.probe_dir.clone().unwrap_or_else(|| dir.clone()),
                config_json: None,
            })
        }
        _ => Err(EngineError::Usage(
            "plan needs --config FILE (a published config.json) or --snap DIR (a model on disk)"
                .into(),
        )),
    }
}

fn routing(s: &Subject, explicit: Option<&Path>) -> Result<Routing, EngineError> {
    let Some(path) = explicit.map(Path::to_path_buf).or_else(|| s.usage.clone()) else {
        return Ok(Routing::Uniform);
    };
    let (usage, _) = Usage::load(
        &path,
        s.cfg.num_hidden_layers,
        s.cfg.n_routed_experts,
        false,
    )
    .map_err(|e| EngineError::Usage(format!("--usage: {e}")))?;
    if usage.total() == 0 {
        return Ok(Routing::Uniform);
    }
    let per_layer = (0..s.cfg.num_hidden_layers)
        .filter(|&l| s.cfg.mlp_layer_types.get(l) == Some(&MlpKind::Sparse))
        .map(|l| {
            let mut counts: Vec<u64> = (0..usage.n_experts).map(|e| usage.get(l, e)).collect();
            counts.sort_unstable_by(|a, b| b.cmp(a));
            counts
        })
        .collect();
    Ok(Routing::History { path, per_layer })
}

pub fn run(args: PlanArgs) -> Result<ExitCode, EngineError> {
    let s = subject(&args)?;
    let assumed = routing(&s, args.usage.as_deref())?;
    // The model first: the disk probe then runs on the drive it was written to.
    let model = match &args.measure {
        Some(dir) => Some(measure_model(&args, &s, dir)?),
        None => None,
    };
    let cgroup_bytes = args.cgroup_gb.map(|g| (g * 1e9) as u64);
    let ram = match args.ram_gb {
        Some(g) => (g * 1e9) as u64,
        None => {
            auto_budget(
                crate::telemetry::meminfo().1,
                cgroup_bytes.or_else(crate::telemetry::cgroup_memory_limit),
            )
            .0
        }
    };
    let io = reads_assumed(&s, ram, cgroup_bytes);
    let budget = Budget {
        ram,
        vram: (args.vram_gb.unwrap_or(0.0) * 1e9) as u64,
        ctx: (args.ctx as usize).min(s.shape.max_positions.max(1)),
        kv_slots: args.kv_slots as usize,
        page_cache: page_cache_room(&io),
    };
    let probes = {
        let (disk_gbs, disk_how) = match args.disk_gbs {
            Some(g) => (g, "given (--disk-gbs)".to_string()),
            None => {
                crate::elog!("[PLAN] probing the disk in {} ...", s.probe_dir.display());
                probe_disk(&s.probe_dir, s.sizes.expert_disk)?
            }
        };
        let (mem_gbs, mem_how) = match args.mem_gbs {
            Some(g) => (g, "given (--mem-gbs)".to_string()),
            None => (
                crate::membw::read_bandwidth_gbs(1024, 3),
                format!("1 GiB read, {} threads", rayon::current_num_threads()),
            ),
        };
        let (dense_gbs, dense_how) = match args.dense_gbs {
            Some(g) => (g, "given (--dense-gbs)".to_string()),
            None => {
                let fmt = QFormat::from_bits(args.dense_bits, 64).unwrap_or(QFormat::I8Row);
                probe_dense_decode(fmt, s.shape.hidden, probe::DENSE_DECODE_BYTES)
            }
        };
        let (prefill_gmacs, prefill_how) = match args.prefill_gmacs {
            Some(g) => (g, "given (--prefill-gmacs)".to_string()),
            None => {
                let fmt = QFormat::from_bits(args.dense_bits, 64).unwrap_or(QFormat::I8Row);
                probe_prefill(fmt)
            }
        };
        let (expert_gmacs, expert_how) = match args.expert_gmacs {
            Some(g) => (g, "given (--expert-gmacs)".to_string()),
            None => {
                let fmt = QFormat::from_bits(args.expert_bits, 64).unwrap_or(QFormat::I4G64);
                let sh = &s.shape;
                // At the decode chunk's rows, whatever chunk a budget gets: an expert's rows
                // grow with a longer chunk, so the rate is a floor there.
                let chunk = TTFT_PROMPT.min(crate::engine::PREFILL_CHUNK);
                let rows = prefill::rows_per_expert(sh.experts, sh.top_k, chunk);
                probe_experts(fmt, sh.hidden, sh.moe_intermediate, rows)
            }
        };
        let (attention_gmacs, attention_how) = match args.attention_gmacs {
            Some(g) => (g, "given (--attention-gmacs)".to_string()),
            // An MLA model's kv_b_proj is in the dense format.
            None => {
                let dense = QFormat::from_bits(args.dense_bits, 64).unwrap_or(QFormat::I8Row);
                probe_attention(TTFT_PROMPT, s.shape.mla.map(|m| (m, dense)))
            }
        };
        Probes {
            disk_gbs,
            disk_how,
            mem_gbs,
            mem_how,
            dense_gbs,
            dense_how,
            prefill_gmacs,
            prefill_how,
            expert_gmacs,
            expert_how,
            attention_gmacs,
            attention_how,
        }
    };
    for (name, v) in [
        ("--disk-gbs", probes.disk_gbs),
        ("--mem-gbs", probes.mem_gbs),
        ("--dense-gbs", probes.dense_gbs),
        ("--prefill-gmacs", probes.prefill_gmacs),
        ("--expert-gmacs", probes.expert_gmacs),
        ("--attention-gmacs", probes.attention_gmacs),
    ] {
        if !(v.is_finite() && v > 0.0) {
            return Err(EngineError::Usage(format!(
                "{name} {v}: a speed must be a positive number"
            )));
        }
    }
    let p = predict(&s.shape, &s.sizes, &probes, &budget, &assumed);
    let moves = moves(&s, &probes, &budget, &assumed, &p, &args);
    let measured = match (&args.measure, &model) {
        (Some(dir), Some(m)) if !args.write_only => Some((
            m,
            measure::measure(
                dir,
                s.sizes.expert_disk,
                budget.ram,
                p.split.experts_in_ram,
                args.measure_tokens as usize,
                TTFT_PROMPT,
                cgroup_bytes,
            )?,
        )),
        _ => None,
    };
    // The same prediction with the cold run's own routing in place of the assumption: how far
    // the speed model is off once the hit rate is the one the run saw.
    let routed = match &measured {
        Some((_, m)) => match &m.usage {
            Some(path) => {
                let r = routing(&s, Some(path))?;
                let q = predict(&s.shape, &s.sizes, &probes, &budget, &r);
                let window = cold_window(&s.shape, &s.sizes, &probes, &q, m.tokens);
                Some((q, window))
            }
            None => None,
        },
        None => None,
    };
    if args.json {
        let mut v = json(&s, &probes, &budget, &assumed, &p, &moves);
        v["reads"] = serde_json::json!({
            "mode": io.mode.label(),
            "why": io.to_string(),
        });
        if let Some(m) = &model {
            v["measure"] = report::model_json(m);
        }
        if let Some((_, m)) = &measured {
            v["measured"] = report::measured_json(&probes, &budget, m);
            let w = cold_window(&s.shape, &s.sizes, &probes, &p, m.tokens);
            v["predicted"]["cold_window"] = report::window_json(m.tokens, &w);
            if let (Some((q, w)), Some(path)) = (&routed, &m.usage) {
                v["predicted_run_routing"] = serde_json::json!({
                    "usage": path.display().to_string(),
                    "hit_rate": q.hit_rate,
                    "decode_tok_s": q.decode_tok_s,
                    "page_cache_share": q.page_cache_share,
                    "warm": {
                        "decode_tok_s": q.warm_decode_tok_s,
                        "disk_bytes_per_token": q.disk_bytes_per_token,
                        "page_cache_bytes_per_token": q.page_cache_bytes_per_token,
                    },
                    "ttft_s": q.ttft_s,
                    "ttft_read_bytes": q.ttft.read_bytes,
                    "ttft_page_cache_bytes": q.ttft.page_cache_bytes,
                    "cold_window": report::window_json(m.tokens, w),
                });
            }
        }
        println!("{v}");
    } else {
        let reads = reads_line(&io);
        print!(
            "{}",
            text(&s, &probes, &budget, &assumed, &reads, &p, &moves)
        );
        if let Some(m) = &model {
            print!("{}", report::model_text(m));
        }
        if let Some((_, m)) = &measured {
            let window = cold_window(&s.shape, &s.sizes, &probes, &p, m.tokens);
            print!(
                "{}",
                report::measured_text(&probes, &budget, (&p, window), routed.as_ref(), m)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The read mode `--direct auto` (the default) would pick for `s`'s experts under a `ram`
/// budget on this machine (in a cgroup of `cgroup_bytes`, else this process's own limit).
fn reads_assumed(s: &Subject, ram: u64, cgroup_bytes: Option<u64>) -> IoChoice {
    let count = s.shape.sparse_layers as u64 * s.shape.experts as u64;
    let facts = IoFacts {
        expert_bytes: count * s.sizes.expert_disk,
        budget: ram,
        whole_model: s.sizes.dense + count * s.sizes.expert_ram,
        cgroup_limit: cgroup_bytes.or_else(crate::telemetry::cgroup_memory_limit),
        mem_total: crate::telemetry::meminfo().0,
    };
    choose_io(IoMode::Auto, facts)
}

/// The plan's `reads` line: the mode and why, and what it means for the figures (the disk
/// probe reads with O_DIRECT either way).
fn reads_line(io: &IoChoice) -> String {
    match (io.mode, page_cache_room(io)) {
        (IoMode::Direct, _) => format!("{io}: reads at the disk probe's rate"),
        (_, 0) => format!("{io}: reads at the disk probe's rate (the page cache's room unknown)"),
        _ => format!(
            "{io}: first reads at the disk probe's rate, later ones from the page cache while \
             it holds them (the `page cache` line)"
        ),
    }
}

/// The model `--measure` runs: written now, or found finished from an earlier run.
pub struct MeasureModel {
    pub dir: PathBuf,
    pub bytes: u64,
    /// The write's time; `None` when an earlier run's model was reused.
    pub written: Option<write::Written>,
    pub skew: Option<f32>,
    pub layers: usize,
}

fn measure_model(args: &PlanArgs, s: &Subject, dir: &Path) -> Result<MeasureModel, EngineError> {
    let config = s.config_json.as_ref().ok_or_else(|| {
        EngineError::Usage("--measure needs --config FILE (a published config.json)".into())
    })?;
    write::check_family(&s.cfg)?;
    if !(args.skew.is_finite() && (0.0..=10.0).contains(&args.skew)) {
        return Err(EngineError::Usage(format!(
            "--skew {}: allowed 0..=10 (the bias of the expert ranked r is -skew * ln(1 + r))",
            args.skew
        )));
    }
    let fmt = |bits: u32, flag: &str| {
        QFormat::from_bits(bits, 64).map_err(|e| EngineError::Usage(format!("{flag} {bits}: {e}")))
    };
    let expert = fmt(args.expert_bits, "--expert-bits")?;
    if expert == QFormat::F32 {
        return Err(EngineError::Usage(
            "--expert-bits 16: the measure writes routed experts quantized; allowed: 8, 4, 3, 2"
                .into(),
        ));
    }
    let f = write::Formats::new(expert, fmt(args.dense_bits, "--dense-bits")?);
    let tokenizer = write::tokenizer_for(args.config.as_deref(), s.cfg.vocab_size)?;
    let units = write::tensors(&s.cfg, &f, args.skew, args.seed)?;
    let shards = write::shards(units, write::shard_bytes())?;
    let bytes = write::total_bytes(&shards);
    let params = write::params(config, &f, args.skew, args.seed);
    let skew = (s.cfg.router == crate::config::RouterKind::SigmoidBias).then_some(args.skew);
    let model = |written| MeasureModel {
        dir: dir.to_path_buf(),
        bytes,
        written,
        skew,
        layers: s.cfg.num_hidden_layers,
    };
    match write::inspect(dir, &params)? {
        write::Found::Same => {
            crate::elog!(
                "[measure] {} holds this model already ({:.2} GB): reused",
                dir.display(),
                bytes as f64 / 1e9
            );
            Ok(model(None))
        }
        write::Found::Empty => {
            write::check_room(dir, bytes)?;
            crate::elog!(
                "[measure] writing {:.2} GB ({} layers, experts {}, dense {}) to {}",
                bytes as f64 / 1e9,
                s.cfg.num_hidden_layers,
                f.expert.name(),
                f.dense.name(),
                dir.display()
            );
            let w = write::write(dir, config, &tokenizer, &shards, &params, args.seed)?;
            Ok(model(Some(w)))
        }
    }
}

/// One thing that would change the figure, and the figure with it.
#[derive(Clone, Debug)]
struct Move {
    what: String,
    decode_tok_s: f64,
}

fn moves(
    s: &Subject,
    probes: &Probes,
    budget: &Budget,
    routing: &Routing,
    p: &Prediction,
    args: &PlanArgs,
) -> Vec<Move> {
    let mut out = Vec::new();
    let all = ram_for_all(&s.shape, &s.sizes, budget);
    if all > budget.ram {
        let b = Budget {
            ram: all,
            ..*budget
        };
        let q = predict(&s.shape, &s.sizes, probes, &b, routing);
        out.push(Move {
            what: format!("{} of RAM (every expert in memory)", gb(all)),
            decode_tok_s: q.warm_decode_tok_s,
        });
    }
    if p.disk_bytes_per_token > 0 {
        let faster = Probes {
            disk_gbs: probes.disk_gbs * 2.0,
            ..probes.clone()
        };
        let q = predict(&s.shape, &s.sizes, &faster, budget, routing);
        out.push(Move {
            what: "a second drive (--model-dirs, reads spread over both)".into(),
            decode_tok_s: q.warm_decode_tok_s,
        });
    }
    let fewer = match args.expert_bits {
        16 => Some(8),
        8 => Some(4),
        4 => Some(3),
        3 => Some(2),
        _ => None,
    };
    if let (Some(bits), None) = (fewer, &args.snap) {
        if let (Ok(ef), Ok(df)) = (
            QFormat::from_bits(bits, 64),
            QFormat::from_bits(args.dense_bits, 64),
        ) {
            let sizes = Sizes::converted(&s.shape, ef, df);
            let q = predict(&s.shape, &sizes, probes, budget, routing);
            out.push(Move {
                what: format!("--expert-bits {bits} ({} on disk)", gb(sizes.disk)),
                decode_tok_s: q.warm_decode_tok_s,
            });
        }
    }
    out
}
