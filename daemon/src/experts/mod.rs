//! The routed-expert tiers: where the MoE layers get an expert's gate/up/down weights.
//!
//! ```text
//! pinned hot store   per layer, loaded at start from the usage history (--pin / autopin),
//!                    swapped live by re-pin (--repin)
//! LRU                per layer, --cache N experts, clamped to the RAM budget (--ram-gb),
//!                    split between the layers by their measured reuse (--cache-shares)
//! disk               one positional read per expert when its tensors are adjacent
//!                    (buffered, --direct, --mmap), on the compute thread or on the I/O
//!                    pool (--pipe), possibly a layer ahead (--pilot)
//! ```
//!
//! The model hands a layer's routed rows to [`ExpertStore::run_layer`] (`run`), which fetches
//! the experts in ascending order ([`ExpertStore::fetch_layer`]) and computes them;
//! every LRU decision is taken at that moment, in that order, so which experts are cached and
//! the hit rate do not depend on when the I/O workers finish. The forward sums the expert
//! products in ascending order whatever order they arrive in, so no tier setting changes an
//! output byte.
//!
//! Module map: `args` (options), `layout` (reads plan, decode), `io` (pread / O_DIRECT / mmap),
//! `check` (finite values, `--verify-reads` checksums), `lru`, `pipe` (worker pool), `pin`
//! (selection, mlock), `repin` (live swaps), `ram` (budget clamp), `usage` (`.coli_usage`),
//! `track` (routing observations), `stats` (counters, DISK-CLASS), `start` (pins + clamp at
//! start), `turn` (safe points, telemetry), `pilot` (per-layer guess depth), `regime` (whether
//! guesses pay at all), `prefetch` (the store's side of the pilot: reading guesses ahead,
//! scoring them, its report), `shares` (per-layer capacities from measured reuse), `sim` (the
//! policies against Belady's optimum on route traces), `run` (the expert seam: a layer's
//! experts for a batch of rows, fetch to weighted sum), `vram` (the GPU tier's placement),
//! `expert` (one expert's matrices and biases), `load` (reading and decoding one expert,
//! shared with the I/O workers), `fetch` (a layer's batch as it becomes ready).

pub mod args;
mod check;
pub mod chunk;
pub mod drives;
mod expert;
pub mod fault;
mod fetch;
mod gate_up;
mod io;
pub mod io_auto;
pub mod layout;
mod load;
pub mod lru;
pub mod pilot;
pub mod pilot_auto;
pub mod pin;
mod pipe;
pub mod policy;
mod prefetch;
#[cfg(test)]
mod prefetch_tests;
mod probe;
pub mod ram;
mod recycle;
mod regime;
pub mod repin;
mod residency;
pub mod run;
#[cfg(test)]
mod run_tests;
pub mod shares;
pub mod sim;
mod start;
pub mod stats;
mod track;
mod turn;
pub mod usage;
mod vram;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_channel::Receiver;
use parking_lot::Mutex;

pub use args::{IoMode, PilotMode, PinGb, PinSource, TierArgs, TierConfig};
pub use expert::{Expert, OssExpert};
pub use fetch::Fetch;
pub(crate) use load::Core;
pub use probe::Probe;
pub use start::{usage_path, TierStart};
pub use stats::Snapshot;
pub use turn::SafePoint;

use crate::error::EngineError;
use crate::quant::QFormat;
use crate::routing::Routing;
use crate::weights::ShardSet;
use fetch::FetchBufs;
use layout::Geometry;
use lru::Lru;
use pipe::{Pipe, Reply};
use stats::Stats;
use track::Track;

#[derive(Clone, Copy, Debug, Default)]
pub struct ExpertCounters {
    /// Every counter of the store (hits, misses, bytes read, loads and their times).
    pub store: Snapshot,
    /// Cache-aware routing's counters (`on: false` without it).
    pub route: crate::cache_route::RouteCounts,
    /// What the pilot's reads ahead became (all zero without `--pilot`).
    pub prefetch: stats::PrefetchCounts,
}

impl ExpertCounters {
    /// Pinned + LRU hits.
    pub fn hits(&self) -> u64 {
        self.store.hits_pin + self.store.hits_lru
    }

    /// Expert hit rate in percent over what happened since `before` (0 when nothing was asked).
    pub fn hit_pct_since(&self, before: &ExpertCounters) -> f64 {
        let (h, m) = (
            self.hits() - before.hits(),
            self.store.misses - before.store.misses,
        );
        if h + m > 0 {
            100.0 * h as f64 / (h + m) as f64
        } else {
            0.0
        }
    }

    /// Cache-aware routing since `before`, as the STAT suffix reports it (`None`: off).
    pub fn route_since(&self, before: &ExpertCounters) -> Option<protocol::RouteAgree> {
        self.route.since(&before.route)
    }
}

const GB_F: f64 = 1e9;

/// One sparse layer's resident experts.
struct LayerState {
    pinned: Vec<Option<Arc<Expert>>>,
    lru: Lru<Arc<Expert>>,
    /// Pilot prefetches not yet asked for, with their claims.
    staged: Vec<(usize, Receiver<Reply>, Arc<pipe::Claim>)>,
    pilot: pilot::LayerPilot,
}

/// Start-time and safe-point state.
#[derive(Default)]
struct Runtime {
    guard: Option<ram::Guard>,
    usage_path: Option<std::path::PathBuf>,
    since_repin: usize,
    since_guard: usize,
}

pub struct ExpertStore {
    core: Arc<Core>,
    cfg: TierConfig,
    /// The read mode `cfg.io` resolved to, and why ([`io_auto`]).
    io_choice: io_auto::IoChoice,
    n_experts: usize,
    top_k: usize,
    sparse: Vec<bool>,
    layers: Vec<Option<Mutex<LayerState>>>,
    track: Mutex<Track>,
    runtime: Mutex<Runtime>,
    /// Resident bytes of the widest expert.
    expert_bytes: u64,
    /// The I/O workers; they hold their own `Arc<Core>`, and dropping this joins them.
    pipe: Option<Pipe>,
    /// The queues of the last finished [`Fetch`], reused by the next one.
    spare: Mutex<FetchBufs>,
    /// Whether the pilot reads guesses ahead: `--pilot on` with the I/O pool from the
    /// start, `--pilot auto` as [`ExpertStore::start`] decides from its RAM split
    /// ([`pilot_auto`]).
    pilot_active: std::sync::atomic::AtomicBool,
    /// Whether the tiers' split leaves some routed expert to be read from disk while decoding
    /// (set by [`ExpertStore::start`] beside the pilot's decision).
    streams: std::sync::atomic::AtomicBool,
    /// Prompt positions of a prefill chunk while no session decodes, chosen by
    /// [`ExpertStore::start`] (`chunk.rs`); the decode chunk until then.
    prefill_chunk: AtomicUsize,
    /// LRU slots a layer gives up while a prefill chunk longer than
    /// [`chunk::DECODE_CHUNK`] runs, for its rows' working set (`chunk.rs`); set at start.
    chunk_slots: AtomicUsize,
    /// Whether those slots are given up now ([`ExpertStore::long_chunk`]).
    chunk_held: std::sync::atomic::AtomicBool,
    /// Sparse layers whose pilot guesses pay (are read); the pilot says when this hits 0.
    pilot_on: AtomicUsize,
    /// Read rounds the batches needed: per batch, its experts needed from disk (wanted,
    /// neither pinned nor cached) over the I/O workers, rounded up; for the regime trial
    /// ([`regime`]).
    pilot_rounds: AtomicU64,
    /// Whether guesses are read in this regime ([`regime`]).
    regime: Mutex<regime::Regime>,
    /// `--cache-shares`: the slots of every layer cache, split by measured reuse
    /// ([`shares`]); `None` keeps one flat cap.
    shares: Option<Mutex<start::ShareState>>,
    /// Requests that reached a layer cache (hit or miss) since the last split.
    share_requests: AtomicU64,
    /// The VRAM tier, placed at start when `--vram-gb` and a GPU allow one ([`vram`]).
    vram: std::sync::OnceLock<crate::gpu::VramTier>,
    /// The dense weights the model put in VRAM before the tier: they come off `--vram-gb`.
    dense_vram: crate::gpu::DensePlaced,
    /// `--cache-route`: the routing that prefers resident experts ([`residency`]).
    cache_route: Option<crate::cache_route::CacheRoute>,
}

/// The shape of the routed experts, as the model config gives it.
#[derive(Clone, Copy, Debug)]
pub struct ExpertShape {
    pub n_experts: usize,
    pub top_k: usize,
    pub hidden: usize,
    pub inter: usize,
    /// gpt-oss's biased experts and clamped SwiGLU `(alpha, limit)`; `None`: plain SwiGLU.
    pub oss: Option<(f32, f32)>,
    /// DeepSeek-V4's unbiased experts, their SwiGLU clamped at this limit.
    pub dsv4_limit: Option<f32>,
}

impl ExpertStore {
    /// Checks every expert tensor (a missing or mis-shaped one is a load error now, not in the
    /// middle of a turn) and plans its reads. Nothing is read yet: see [`ExpertStore::start`].
    pub fn new(
        shards: Arc<ShardSet>,
        sparse_layers: &[bool],
        shape: ExpertShape,
        fmt: QFormat,
        fake_quant: bool,
        cfg: &TierConfig,
    ) -> Result<ExpertStore, EngineError> {
        let geom = Geometry {
            hidden: shape.hidden,
            inter: shape.inter,
            fmt,
            fake_quant,
            oss: shape.oss,
            dsv4_limit: shape.dsv4_limit,
        };
        let n_experts = shape.n_experts;
        let mut layouts = Vec::with_capacity(sparse_layers.len());
        let mut expert_bytes = 0u64;
        for (layer, &sparse) in sparse_layers.iter().enumerate() {
            if !sparse {
                layouts.push(None);
                continue;
            }
            let mut l = Vec::with_capacity(n_experts);
            for e in 0..n_experts {
                let lay = layout::plan(&shards, &geom, layer, e)?;
                expert_bytes = expert_bytes.max(layout::resident_bytes(&geom, &lay));
                l.push(lay);
            }
            layouts.push(Some(l));
        }
        let cap = cfg.cache.unwrap_or(n_experts).clamp(1, n_experts.max(1));
        let layers = sparse_layers
            .iter()
            .map(|&s| {
                s.then(|| {
                    let mut lru = Lru::with_policy(n_experts, cap, cfg.cache_policy);
                    if cfg.cache_shares {
                        lru.measure_reuse();
                    }
                    Mutex::new(LayerState {
                        pinned: (0..n_experts).map(|_| None).collect(),
                        lru,
                        staged: Vec::new(),
                        pilot: pilot::LayerPilot::default(),
                    })
                })
            })
            .collect();
        let mut track = Track::new(sparse_layers.len(), n_experts);
        if let Some(path) = &cfg.route_trace {
            let f = std::fs::File::create(path)
                .map_err(|e| EngineError::io(format!("--route-trace {}", path.display()), e))?;
            track.trace = Some(std::io::BufWriter::new(f));
        }
        let sums = if cfg.verify_reads {
            Some(check::ReadSums::load(&shards, &layouts)?)
        } else {
            None
        };
        let on_disk: u64 = layouts
            .iter()
            .flatten()
            .flatten()
            .flat_map(|l| &l.runs)
            .map(|r| r.len)
            .sum();
        // The dense part as stored stands for the dense part held (what the files hold besides
        // the experts), every expert as held beside it.
        let dense = crate::engine::facts::shard_bytes(&shards).saturating_sub(on_disk);
        let n_sparse = sparse_layers.iter().filter(|s| **s).count() as u64;
        let whole_model = dense + n_sparse * n_experts as u64 * expert_bytes;
        let io_choice =
            io_auto::choose_io(cfg.io, io_auto::IoFacts::now(cfg, on_disk, whole_model));
        if on_disk > 0 {
            crate::elog!("[IO] expert reads: {io_choice}");
        }
        let io = io::Io::new(
            shards,
            io_choice.mode,
            cfg.drop_after,
            &cfg.model_dirs,
            cfg.mirror.as_deref(),
        )?;
        let core = Arc::new(Core {
            geom,
            layouts,
            io,
            stats: Stats::default(),
            sums,
        });
        let pipe = (cfg.pipe > 0).then(|| Pipe::new(core.clone(), cfg.pipe, cfg.pilot_inflight));
        Ok(ExpertStore {
            core,
            cfg: cfg.clone(),
            io_choice,
            n_experts,
            top_k: shape.top_k,
            sparse: sparse_layers.to_vec(),
            layers,
            track: Mutex::new(track),
            runtime: Mutex::new(Runtime::default()),
            expert_bytes,
            pipe,
            spare: Mutex::new(FetchBufs::default()),
            pilot_active: std::sync::atomic::AtomicBool::new(
                cfg.pilot == args::PilotMode::On && cfg.pipe > 0,
            ),
            streams: std::sync::atomic::AtomicBool::new(true),
            prefill_chunk: AtomicUsize::new(chunk::DECODE_CHUNK),
            chunk_slots: AtomicUsize::new(0),
            chunk_held: std::sync::atomic::AtomicBool::new(false),
            pilot_on: AtomicUsize::new(sparse_layers.iter().filter(|s| **s).count()),
            pilot_rounds: AtomicU64::new(0),
            regime: Mutex::new(Default::default()),
            shares: cfg.cache_shares.then(|| {
                let n_sparse = sparse_layers.iter().filter(|s| **s).count();
                Mutex::new(start::ShareState::new(cap, n_sparse, n_experts))
            }),
            share_requests: AtomicU64::new(0),
            vram: std::sync::OnceLock::new(),
            dense_vram: Default::default(),
            cache_route: cfg
                .cache_route
                .map(|c| crate::cache_route::CacheRoute::new(c, shape.top_k, n_experts))
                .transpose()?,
        })
    }

    pub fn n_experts(&self) -> usize {
        self.n_experts
    }

    pub fn config(&self) -> &TierConfig {
        &self.cfg
    }

    /// The read mode in use (`--direct auto` resolved) and why.
    pub fn io_choice(&self) -> &io_auto::IoChoice {
        &self.io_choice
    }

    /// Resident bytes of the widest expert.
    pub fn expert_bytes(&self) -> u64 {
        self.expert_bytes
    }

    /// The format the routed experts compute in: a pre-quantized container's stored one
    /// (from the first expert's gate_proj lengths, the rule loading reads it by), else the
    /// one they are quantized to at load (`--expert-bits`).
    pub fn format(&self) -> QFormat {
        let g = &self.core.geom;
        let Some(first) = self.core.layouts.iter().flatten().flatten().next() else {
            return g.fmt;
        };
        if let crate::weights::Dtype::Ggml(t) = first.dtypes[0] {
            return QFormat::Ggml(t);
        }
        if !first.dtypes[0].is_packed() {
            return g.fmt;
        }
        if first.scale_dtypes[0] == crate::weights::Dtype::U8 {
            return QFormat::Mxfp4;
        }
        let (rows, cols) = g.shape(0);
        let part = |scales: bool| {
            first
                .runs
                .iter()
                .flat_map(|r| &r.parts)
                .find(|p| p.proj == 0 && p.scales == scales)
                .map_or(0, |p| p.len as usize)
        };
        QFormat::infer(rows, cols, part(false), part(true) / 4).map_or(g.fmt, |f| f.canonical(cols))
    }

    /// Layers with routed experts.
    pub fn n_sparse(&self) -> usize {
        self.sparse.iter().filter(|s| **s).count()
    }

    fn layer(&self, layer: usize) -> Result<&Mutex<LayerState>, EngineError> {
        self.layers
            .get(layer)
            .and_then(|l| l.as_ref())
            .ok_or_else(|| EngineError::Load(format!("layer {layer} has no routed experts")))
    }

    pub fn counters(&self) -> ExpertCounters {
        let s = self.core.stats.snapshot();
        ExpertCounters {
            route: self.route_counts(),
            prefetch: self.prefetch_counts(),
            store: s,
        }
    }

    /// Every counter, for deltas over a turn or a run.
    pub fn snapshot(&self) -> Snapshot {
        self.core.stats.snapshot()
    }

    /// The LRU capacity per layer now (with `--cache-shares`, the mean of the layers' shares).
    pub fn cap(&self) -> usize {
        if let Some(s) = &self.shares {
            return s.lock().flat;
        }
        self.layers
            .iter()
            .flatten()
            .next()
            .map_or(0, |l| l.lock().lru.cap())
    }

    /// `(pinned, in LRU)` expert counts and their bytes.
    pub fn resident_split(&self) -> ((usize, usize), (usize, usize)) {
        let (mut np, mut bp, mut nl, mut bl) = (0, 0, 0, 0);
        for l in self.layers.iter().flatten() {
            let st = l.lock();
            for x in st.pinned.iter().flatten() {
                np += 1;
                bp += x.resident_bytes();
            }
            for x in st.lru.values() {
                nl += 1;
                bl += x.resident_bytes();
            }
        }
        ((np, bp), (nl, bl))
    }

    /// Experts resident in RAM (pinned or cached) and their bytes.
    pub fn resident(&self) -> (usize, usize) {
        let ((np, bp), (nl, bl)) = self.resident_split();
        (np + nl, bp + bl)
    }

    /// Whether expert `e` of `layer` is pinned.
    pub fn is_pinned(&self, layer: usize, e: usize) -> bool {
        self.layer(layer)
            .map(|l| l.lock().pinned.get(e).is_some_and(|p| p.is_some()))
            .unwrap_or(false)
    }

    /// A forward over `rows` positions begins (route-trace call number, recency clock).
    pub fn begin_forward(&self, rows: usize) {
        self.core.stats.forwards.fetch_add(1, Ordering::Relaxed);
        self.regime_begin(rows);
        self.resplit_when_due();
        self.track.lock().begin_forward(rows);
    }

    /// The routing of every row of one layer's batch: usage history, heat, recency, HITS and
    /// the route trace.
    pub fn observe(&self, layer: usize, routes: &[Routing]) {
        self.track.lock().observe(layer, routes);
        if let Ok(l) = self.layer(layer) {
            l.lock().lru.begin_batch(routes.len());
        }
    }

    fn window(&self) -> u64 {
        self.cfg
            .diskclass_window
            .unwrap_or((self.top_k * self.n_sparse() * 8).max(1) as u64)
    }

    /// The weights of expert `e` of `layer`, read from disk when not resident.
    pub fn get(&self, layer: usize, e: usize) -> Result<Arc<Expert>, EngineError> {
        match self.fetch_layer(layer, &[e]).next() {
            Some(r) => r.map(|(_, x)| x),
            None => Err(EngineError::Load(format!(
                "no routed expert {e} in layer {layer}"
            ))),
        }
    }
}
