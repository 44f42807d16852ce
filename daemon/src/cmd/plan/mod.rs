//! `colibri plan`: before a user downloads 400 GB, will the model run on this machine and how
//! fast? From the shapes alone (a published `config.json`, or a model on disk) and probes of
//! this machine (disk reads of one expert's size through O_DIRECT at the I/O pool's depth,
//! the same reads from the page cache, the memory-read probe the benchmarks use, the decode
//! and prefill kernels at the model's shapes), it
//! splits the RAM budget as the engine would (dense weights, KV, reserve, experts) and predicts
//! decode tok/s cold (nothing cached yet) and warm (the cache holding what it can), time to
//! first token for a 1k-token prompt, the limit that binds and what would move it.
//!
//! The model of a token, kept deliberately simple so that `--measure` can check it:
//! ```text
//! expert time  = top_k experts per sparse layer / min(memory probe x WHOLE_TOKEN_OF_PROBE,
//!                                                    expert decode probe)
//! dense time   = dense bytes read / min(memory probe x WHOLE_TOKEN_OF_PROBE,
//!                                       dense decode probe)
//! read time    = experts missed per token x stored bytes per expert / disk probe
//!                (through the page cache: less the misses it holds)
//! copy time    = read buffered, every miss's bytes / the copy probe: the kernel's copy to
//!                our buffer runs on the cores the products need (`Loads`); mapped
//!                (`auto` where the model exceeds the budget) or O_DIRECT, none
//! decode tok/s = 1 / (dense time + overlapped(expert time + copy time, read time))
//! hit rate     = experts per layer the RAM holds / experts per layer        (uniform routing)
//!              = share of the selections the most used experts took         (usage history)
//! page cache   = read through it (`--direct auto` when the experts fit beside the budget):
//!                the next most used experts after ours, as many as its room holds; an
//!                expert's first read comes from disk, later ones from there while it holds it
//! first token  = expert MACs / expert probe (at a chunk's rows per expert)
//!              + other MACs / dense probe + attention's quadratic part / attention probe
//!                (MLA: with each chunk's rebuild of the keys and values, probed on the
//!                engine's MLA core at the model's widths)
//!              + experts each chunk reads / disk probe (and read buffered, its copies)
//!                (each chunk's expert and copy time and reads overlapped as a token's are)
//!                (`prefill`)
//! overlapped(a, b) = max(a, b) + (1 - READ_OVERLAP) x min(a, b)
//! ```

use std::path::PathBuf;

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
mod run;
#[cfg(test)]
mod tests;
pub mod write;
#[cfg(test)]
mod write_tests;

pub use decode::{
    cold_window, overlapped, page_cache_room, token_compute_parts, token_s, Loads, Window,
    READ_OVERLAP,
};
#[cfg(test)]
use run::reads_line;
pub use run::{run, MeasureModel};
use run::{Move, Subject};

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
    /// Bytes per second a read the page cache holds lands in our buffer at, all cores
    /// copying, billions (`probe::probe_copy`).
    pub copy_gbs: f64,
    pub copy_how: String,
    /// Weight bytes per second of the dense format's matrix-vector product (a decode
    /// token's dense part), over more weights than a cache holds, billions.
    pub dense_gbs: f64,
    pub dense_how: String,
    /// The same of a decode token's routed experts in their format, `top_k` to a region as
    /// the engine runs them: an int2 or int3 expert's unpacking can bound it below memory.
    pub expert_decode_gbs: f64,
    pub expert_decode_how: String,
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
    /// Bytes the page cache keeps of the experts read through it: the room `--direct auto`
    /// judges by ([`page_cache_room`]); 0 when the reads go around it (O_DIRECT).
    pub page_cache: u64,
    /// Each load is copied from the page cache to our buffer ([`Loads`]): read buffered.
    /// Mapped loads use the page cache's pages and O_DIRECT ones land in our buffer.
    pub copied: bool,
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
    /// Experts per layer the page cache holds beside ours (0 with O_DIRECT), and the
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
    let warm_loads = Loads::of(disk_warm, copied_warm, budget.copied, probes);
    let warm = 1.0 / token_s(dense_s, expert_s + warm_loads.copy_s, warm_loads.read_s);
    // A cold token reads every expert it meets, each for the first time: from disk, page
    // cache or not.
    let cold_loads = Loads::of(disk_cold, 0.0, budget.copied, probes);
    let cold = 1.0 / token_s(dense_s, expert_s + cold_loads.copy_s, cold_loads.read_s);

    // The first token of a 1k prompt, chunk by chunk (`prefill`).
    let speeds = prefill::PrefillSpeeds {
        dense_gmacs: probes.prefill_gmacs,
        expert_gmacs: probes.expert_gmacs,
        attention_gmacs: probes.attention_gmacs,
        disk_gbs: probes.disk_gbs,
        copy_gbs: budget.copied.then_some(probes.copy_gbs),
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
    } else if warm_loads.read_s > mem_s + warm_loads.copy_s {
        "disk"
    } else if warm_loads.copy_s > mem_s {
        "the page cache's copies"
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
