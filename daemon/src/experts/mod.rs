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
//! experts for a batch of rows, fetch to weighted sum), `vram` (the GPU tier's placement).

pub mod args;
mod check;
pub mod chunk;
pub mod drives;
pub mod fault;
mod gate_up;
mod io;
pub mod io_auto;
pub mod layout;
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

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, Select, TryRecvError};
use parking_lot::Mutex;

pub use args::{IoMode, PilotMode, PinGb, PinSource, TierArgs, TierConfig};
pub use probe::Probe;
pub use start::{usage_path, TierStart};
pub use stats::Snapshot;
pub use turn::SafePoint;

use crate::error::EngineError;
use crate::quant::{QFormat, QMatrix, SharedBytes};
use crate::routing::Routing;
use crate::weights::ShardSet;
use layout::{ExpertLayout, Geometry};
use lru::Lru;
use pipe::{Pipe, Reply};
use stats::{Class, Stats};
use track::Track;

pub struct Expert {
    pub gate: QMatrix,
    pub up: QMatrix,
    pub down: QMatrix,
    /// gpt-oss: the expert's biases and clamped SwiGLU; `None`: plain SwiGLU, no biases.
    pub oss: Option<Box<OssExpert>>,
}

/// What a gpt-oss expert adds to its matrices: read with them, so an expert from disk brings
/// its biases.
pub struct OssExpert {
    pub gate_bias: Vec<f32>,
    pub up_bias: Vec<f32>,
    pub down_bias: Vec<f32>,
    pub alpha: f32,
    pub limit: f32,
    /// DeepSeek-V4's SwiGLU (`silu(gate.clamp(max = limit)) * up.clamp(-limit, limit)`, no
    /// `alpha`, no `+ 1`) with zero biases: the store's one hook for a clamped activation.
    pub dsv4: bool,
}

impl OssExpert {
    /// DeepSeek-V4's expert activation (see [`OssExpert::dsv4`]'s field): adding the zero
    /// biases leaves every value as it was.
    pub fn dsv4(inter: usize, hidden: usize, limit: f32) -> OssExpert {
        OssExpert {
            gate_bias: vec![0.0; inter],
            up_bias: vec![0.0; inter],
            down_bias: vec![0.0; hidden],
            alpha: 0.0,
            limit,
            dsv4: true,
        }
    }

    /// `g` (gate rows) becomes the clamped SwiGLU of `g + gate_bias` and `u + up_bias`, as
    /// transformers' GptOssExperts: `gate.clamp(max = limit)`, `up.clamp(-limit, limit)`,
    /// `(up + 1) * gate * sigmoid(alpha * gate)`. `g` and `u` hold whole rows of `inter`.
    pub fn glu(&self, g: &mut [f32], u: &[f32]) {
        let inter = self.gate_bias.len();
        for (gr, ur) in g.chunks_exact_mut(inter).zip(u.chunks_exact(inter)) {
            for i in 0..inter {
                let gate = (gr[i] + self.gate_bias[i]).min(self.limit);
                let up = (ur[i] + self.up_bias[i]).clamp(-self.limit, self.limit);
                if self.dsv4 {
                    gr[i] = gate / (1.0 + (-gate).exp()) * up;
                    continue;
                }
                let glu = gate * (1.0 / (1.0 + (-(gate * self.alpha)).exp()));
                gr[i] = (up + 1.0) * glu;
            }
        }
    }

    /// [`OssExpert::glu`] into `out`, the inputs left as they are.
    pub fn glu_into(&self, out: &mut [f32], g: &[f32], u: &[f32]) {
        out.copy_from_slice(&g[..out.len()]);
        self.glu(out, u);
    }

    /// Adds the down projection's bias to each output row of `y` (rows of `hidden`).
    pub fn add_down_bias(&self, y: &mut [f32]) {
        for row in y.chunks_exact_mut(self.down_bias.len()) {
            row.iter_mut()
                .zip(&self.down_bias)
                .for_each(|(v, b)| *v += b);
        }
    }
}

/// A dropped expert's packed bytes go to the next loads ([`recycle`]).
impl Drop for Expert {
    fn drop(&mut self) {
        for m in [&mut self.gate, &mut self.up, &mut self.down] {
            if let Some(b) = m.take_packed() {
                recycle::give(b);
            }
        }
    }
}

impl Expert {
    pub fn resident_bytes(&self) -> usize {
        self.gate.resident_bytes() + self.up.resident_bytes() + self.down.resident_bytes()
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct ExpertCounters {
    /// Pinned + LRU hits.
    pub hits: u64,
    pub misses: u64,
    pub bytes_read: u64,
    pub hits_pin: u64,
    pub hits_lru: u64,
    /// Cache-aware routing's counters (`on: false` without it).
    pub route: crate::cache_route::RouteCounts,
    /// What the pilot's reads ahead became (all zero without `--pilot`).
    pub prefetch: stats::PrefetchCounts,
}

impl ExpertCounters {
    /// Expert hit rate in percent over what happened since `before` (0 when nothing was asked).
    pub fn hit_pct_since(&self, before: &ExpertCounters) -> f64 {
        let (h, m) = (self.hits - before.hits, self.misses - before.misses);
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

/// What the I/O workers share with the store: how to find, read and decode an expert.
pub(crate) struct Core {
    geom: Geometry,
    /// Indexed by layer; `None` for dense layers.
    layouts: Vec<Option<Vec<ExpertLayout>>>,
    io: io::Io,
    stats: Stats,
    /// `--verify-reads`: the checksum of every expert tensor.
    sums: Option<check::ReadSums>,
}

impl Core {
    fn layout(&self, layer: usize, e: usize) -> Result<&ExpertLayout, EngineError> {
        self.layouts
            .get(layer)
            .and_then(|l| l.as_ref())
            .and_then(|l| l.get(e))
            .ok_or_else(|| EngineError::Load(format!("no routed expert {e} in layer {layer}")))
    }

    /// Reads and decodes one expert. `class` is set for demand loads (DISK-CLASS).
    pub(crate) fn load(
        &self,
        layer: usize,
        e: usize,
        class: Option<Class>,
    ) -> Result<Expert, EngineError> {
        let layout = self.layout(layer, e)?;
        if let Some(c) = class {
            self.stats.dc_begin(c);
        }
        let t0 = Instant::now();
        let (result, direct, read_ns) = match self.io.read(layout, layer, e) {
            Ok(mut loaded) => {
                let (direct, read_ns) = (loaded.direct, loaded.read_ns);
                let x = check::loaded(&self.io, self.sums.as_ref(), layout, &loaded, layer, e)
                    .and_then(|()| self.decode(layout, &mut loaded, layer, e));
                self.io.recycle(loaded);
                (x, direct, read_ns)
            }
            Err(err) => (Err(err), false, t0.elapsed().as_nanos() as u64),
        };
        let ok = result.is_ok();
        let bytes = if ok { layout.payload } else { 0 };
        if let Some(c) = class {
            self.stats.dc_end(c, bytes, read_ns, direct && ok);
        }
        let s = &self.stats;
        s.load_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if ok {
            s.bytes_read.fetch_add(bytes, Ordering::Relaxed);
            if class.is_some() {
                s.loads.fetch_add(1, Ordering::Relaxed);
            } else {
                s.other_loads.fetch_add(1, Ordering::Relaxed);
            }
            if direct {
                s.direct_loads.fetch_add(1, Ordering::Relaxed);
            }
        }
        result
    }

    fn decode(
        &self,
        layout: &ExpertLayout,
        loaded: &mut io::Loaded,
        layer: usize,
        e: usize,
    ) -> Result<Expert, EngineError> {
        // Packed matrices read into buffers of their own keep them as storage (no copy), and
        // those read as handles into the map use the map's pages (zero-copy).
        let mut owned: [Option<Vec<u8>>; 3] = [None, None, None];
        let mut shared: [Option<Arc<dyn SharedBytes>>; 3] = [None, None, None];
        for (ri, run) in layout.runs.iter().enumerate() {
            for (pi, part) in run.parts.iter().enumerate() {
                let p = part.proj as usize;
                // Parts past the three matrices (biases, gpt-oss's fused gate_up) have no
                // dtype slot of their own: only a matrix is kept as stored.
                if p >= 3 || part.scales {
                    continue;
                }
                let as_stored = layout.dtypes[p].is_packed()
                    || matches!(layout.dtypes[p], crate::weights::Dtype::Ggml(_));
                if as_stored {
                    owned[p] = loaded.take_part(ri, pi);
                    shared[p] = loaded.shared_part(ri, pi);
                }
            }
        }
        let loaded = &*loaded;
        let mut raw: [Option<&[u8]>; 3] = [None; 3];
        let mut scales: [Option<&[u8]>; 3] = [None; 3];
        let mut biases: [Option<&[u8]>; 3] = [None; 3];
        // gpt-oss's published interleaved gate_up: (blocks, scales, bias).
        let mut fused: [Option<&[u8]>; 3] = [None; 3];
        for (ri, run) in layout.runs.iter().enumerate() {
            for (pi, part) in run.parts.iter().enumerate() {
                let b = loaded.part(ri, pi, part);
                let p = part.proj as usize;
                if part.proj == layout::GATE_UP {
                    fused[part.scales as usize] = Some(b);
                } else if part.proj == layout::GATE_UP_BIAS {
                    fused[2] = Some(b);
                } else if p >= 3 {
                    biases[p - 3] = Some(b);
                } else if part.scales {
                    scales[p] = Some(b);
                } else {
                    raw[p] = Some(b);
                }
            }
        }
        let mut m = |p: usize| {
            // A GGUF's quantized expert: its blocks as read, computed as stored.
            if let crate::weights::Dtype::Ggml(ty) = layout.dtypes[p] {
                let (rows, cols) = self.geom.shape(p);
                let built = match (owned[p].take(), shared[p].take(), raw[p]) {
                    (Some(b), _, _) => QMatrix::from_ggml(ty, rows, cols, b),
                    (None, Some(s), _) => QMatrix::from_ggml_shared(ty, rows, cols, s),
                    (None, None, r) => QMatrix::from_ggml(
                        ty,
                        rows,
                        cols,
                        r.map(<[u8]>::to_vec).unwrap_or_default(),
                    ),
                };
                return built.map_err(|err| {
                    EngineError::Load(format!(
                        "tensor {}: {err}",
                        layout::tensor_name(layer, e, p, false)
                    ))
                });
            }
            if layout.scale_dtypes[p] == crate::weights::Dtype::U8 {
                let bytes = match (owned[p].take(), shared[p].take(), raw[p]) {
                    (Some(b), _, _) => b,
                    (None, Some(s), _) => s.bytes().to_vec(),
                    (None, None, r) => r.map(<[u8]>::to_vec).unwrap_or_default(),
                };
                return layout::decode_mxfp4(&self.geom, layer, e, p, bytes, scales[p]);
            }
            if let Some(bytes) = owned[p].take() {
                return layout::decode_packed(&self.geom, layer, e, p, bytes, scales[p]);
            }
            if let Some(bytes) = shared[p].take() {
                return layout::decode_shared(&self.geom, layer, e, p, bytes, scales[p]);
            }
            let r = raw[p].ok_or_else(|| {
                EngineError::Load(format!(
                    "no bytes planned for {}",
                    layout::tensor_name(layer, e, p, false)
                ))
            })?;
            layout::decode_matrix(
                &self.geom,
                layer,
                e,
                p,
                layout.dtypes[p],
                layout.scale_dtypes[p],
                r,
                scales[p],
            )
        };
        let (gate, up, down) = if layout.gate_up {
            let no = |scales| {
                let name = layout::tensor_name(layer, e, layout::GATE_UP as usize, scales);
                EngineError::Load(format!("no bytes planned for {name}"))
            };
            let (blocks, scales) = (
                fused[0].ok_or_else(|| no(false))?,
                fused[1].ok_or_else(|| no(true))?,
            );
            let (gate, up) = gate_up::split(&self.geom, layer, e, blocks, scales)?;
            (gate, up, m(2)?)
        } else {
            (m(0)?, m(1)?, m(2)?)
        };
        let oss = match self.geom.oss {
            None => None,
            Some((alpha, limit)) => {
                let bias = |proj: usize, rows: usize| -> Result<Vec<f32>, EngineError> {
                    let name = layout::tensor_name(layer, e, proj, false);
                    let bytes = match proj {
                        p if p == layout::GATE_UP_BIAS as usize => fused[2],
                        _ => biases[proj - 3],
                    };
                    bytes
                        .and_then(|b| layout.bias_dtype.to_f32(b))
                        .filter(|v| v.len() == rows)
                        .ok_or_else(|| {
                            EngineError::Load(format!("tensor {name}: not {rows} values"))
                        })
                };
                let (gate_bias, up_bias) = if layout.gate_up {
                    let both = bias(layout::GATE_UP_BIAS as usize, 2 * self.geom.inter)?;
                    gate_up::split_bias(&both)
                } else {
                    (bias(3, self.geom.inter)?, bias(4, self.geom.inter)?)
                };
                Some(Box::new(OssExpert {
                    gate_bias,
                    up_bias,
                    down_bias: bias(5, self.geom.hidden)?,
                    alpha,
                    limit,
                    dsv4: false,
                }))
            }
        };
        let oss = match (oss, self.geom.dsv4_limit) {
            (None, Some(limit)) => Some(Box::new(OssExpert::dsv4(
                self.geom.inter,
                self.geom.hidden,
                limit,
            ))),
            (oss, _) => oss,
        };
        Ok(Expert {
            gate,
            up,
            down,
            oss,
        })
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
            hits: s.hits_pin + s.hits_lru,
            misses: s.misses,
            bytes_read: s.bytes_read,
            hits_pin: s.hits_pin,
            hits_lru: s.hits_lru,
            route: self.route_counts(),
            prefetch: self.prefetch_counts(),
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

    /// The experts `wanted` (ascending, distinct) of `layer`, yielded as they become ready:
    /// resident ones first, then loads as they complete (on the I/O pool with `--pipe`,
    /// otherwise read here in order). Hits, misses and LRU recency are settled now, in
    /// `wanted` order.
    pub fn fetch_layer(&self, layer: usize, wanted: &[usize]) -> Fetch<'_> {
        // The queues of the previous fetch, emptied: a batch served from RAM allocates nothing.
        let bufs = std::mem::take(&mut *self.spare.lock());
        let mut f = Fetch {
            store: self,
            layer,
            bufs,
            last_yield: None,
            error: None,
            done: false,
        };
        let lstate = match self.layer(layer) {
            Ok(l) => l,
            Err(e) => {
                f.error = Some(e);
                return f;
            }
        };
        if let Some(&bad) = wanted.iter().find(|&&e| e >= self.n_experts) {
            f.error = Some(EngineError::Load(format!(
                "no routed expert {bad} in layer {layer}"
            )));
            return f;
        }
        let FetchBufs {
            classes,
            ready,
            pending,
            lazy,
        } = &mut f.bufs;
        {
            let t = self.track.lock();
            let w = self.window();
            classes.clear();
            classes.extend(
                wanted
                    .iter()
                    .map(|&e| stats::classify(t.dc_pre(layer, e), t.dc_clock, w)),
            );
        }
        let s = &self.core.stats;
        let mut st = lstate.lock();
        if self.pilot_enabled() {
            self.score_pilot(layer, &mut st, wanted);
        }
        let mut cache_requests = 0;
        for (&e, &class) in wanted.iter().zip(classes.iter()) {
            if let Some(x) = &st.pinned[e] {
                s.hits_pin.fetch_add(1, Ordering::Relaxed);
                ready.push_back((e, x.clone()));
                continue;
            }
            cache_requests += 1;
            if let Some(x) = st.lru.get(e) {
                s.hits_lru.fetch_add(1, Ordering::Relaxed);
                ready.push_back((e, x.clone()));
                continue;
            }
            let stamp = st.lru.request(e);
            if let Some(pos) = st.staged.iter().position(|(s, _, _)| *s == e) {
                let (_, rx, claim) = st.staged.swap_remove(pos);
                match rx.try_recv() {
                    Ok(Ok(x)) => {
                        // The pilot read it in time: served from RAM.
                        st.pilot.read_used += 1;
                        st.pilot.in_time += 1;
                        s.hits_lru.fetch_add(1, Ordering::Relaxed);
                        st.lru.insert(e, x.clone(), stamp);
                        ready.push_back((e, x));
                        continue;
                    }
                    // Being read: wait for it rather than read it twice.
                    Err(TryRecvError::Empty) if !self.withdraw_guess(&claim) => {
                        st.pilot.read_used += 1;
                        s.misses.fetch_add(1, Ordering::Relaxed);
                        pending.push((e, stamp, rx));
                        continue;
                    }
                    // Still queued behind other guesses (now withdrawn), or a failed
                    // prefetch: read it as a demand load.
                    _ => {}
                }
            }
            s.misses.fetch_add(1, Ordering::Relaxed);
            match &self.pipe {
                Some(p) => pending.push((e, stamp, p.submit(layer, e, Some(class)))),
                None => lazy.push_back((e, stamp, class)),
            }
        }
        // Guesses for this layer that were not needed: a worker that has not started one
        // skips it.
        st.pilot.cancelled += st.staged.len() as u64;
        for (_, _, claim) in st.staged.drain(..) {
            self.withdraw_guess(&claim);
        }
        if self.shares.is_some() {
            self.share_requests
                .fetch_add(cache_requests, Ordering::Relaxed);
        }
        f
    }

    fn admit(&self, layer: usize, e: usize, x: &Arc<Expert>, stamp: u64) {
        if let Ok(l) = self.layer(layer) {
            l.lock().lru.insert(e, x.clone(), stamp);
        }
    }
}

/// The experts of one layer's batch as they become ready (see [`ExpertStore::fetch_layer`]).
/// Measures how long the compute thread waits for loads and how long it spends on each
/// expert between two `next` calls (PROF `expert_wait_s` / `expert_matmul_s`).
pub struct Fetch<'a> {
    store: &'a ExpertStore,
    layer: usize,
    bufs: FetchBufs,
    last_yield: Option<Instant>,
    error: Option<EngineError>,
    done: bool,
}

/// The queues of one [`Fetch`], kept by the store between fetches (`ExpertStore::spare`) so
/// their capacity is reused.
#[derive(Default)]
struct FetchBufs {
    /// DISK-CLASS of each wanted expert, computed before the LRU decisions.
    classes: Vec<Class>,
    ready: VecDeque<(usize, Arc<Expert>)>,
    pending: Vec<(usize, u64, Receiver<Reply>)>,
    lazy: VecDeque<(usize, u64, Class)>,
}

impl Drop for Fetch<'_> {
    /// Hands the emptied queues back to the store. What is still queued is dropped here as it
    /// always was: in-flight loads are abandoned, nothing half-read is admitted.
    fn drop(&mut self) {
        let mut b = std::mem::take(&mut self.bufs);
        b.ready.clear();
        b.pending.clear();
        b.lazy.clear();
        *self.store.spare.lock() = b;
    }
}

impl Fetch<'_> {
    /// The next expert if it can be had without waiting (resident, or its load has already
    /// completed), else `None` (which does not mean the fetch is over: `next` then waits). Lets
    /// the caller gather what is ready into one batch while loads are still in flight.
    pub fn next_ready(&mut self) -> Option<<Self as Iterator>::Item> {
        let b = &self.bufs;
        let now = self.error.is_some()
            || !b.ready.is_empty()
            || b.pending.iter().any(|(_, _, rx)| !rx.is_empty());
        if now && !self.done {
            self.next()
        } else {
            None
        }
    }
}

impl Iterator for Fetch<'_> {
    type Item = Result<(usize, Arc<Expert>), EngineError>;

    fn next(&mut self) -> Option<Self::Item> {
        let stats = &self.store.core.stats;
        if let Some(t) = self.last_yield.take() {
            stats
                .matmul_ns
                .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        if self.done {
            return None;
        }
        if let Some(e) = self.error.take() {
            self.done = true;
            return Some(Err(e));
        }
        let item = if let Some(x) = self.bufs.ready.pop_front() {
            Ok(x)
        } else if !self.bufs.pending.is_empty() {
            let t0 = Instant::now();
            let (i, got) = {
                let mut sel = Select::new();
                for (_, _, rx) in &self.bufs.pending {
                    sel.recv(rx);
                }
                let op = sel.select();
                let i = op.index();
                (i, op.recv(&self.bufs.pending[i].2))
            };
            let (e, stamp, _) = self.bufs.pending.swap_remove(i);
            stats
                .wait_ns
                .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
            match got {
                Ok(Ok(x)) => {
                    self.store.admit(self.layer, e, &x, stamp);
                    Ok((e, x))
                }
                Ok(Err(err)) => Err(err),
                Err(_) => Err(EngineError::Load(format!(
                    "the I/O worker loading expert {e} of layer {} stopped",
                    self.layer
                ))),
            }
        } else if let Some((e, stamp, class)) = self.bufs.lazy.pop_front() {
            let t0 = Instant::now();
            let r = self.store.core.load(self.layer, e, Some(class));
            stats
                .wait_ns
                .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
            r.map(|x| {
                let x = Arc::new(x);
                self.store.admit(self.layer, e, &x, stamp);
                (e, x)
            })
        } else {
            self.done = true;
            return None;
        };
        if item.is_err() {
            // Nothing more from this batch: what is in flight is dropped, nothing half-read
            // was admitted.
            self.done = true;
            self.bufs.pending.clear();
            self.bufs.lazy.clear();
        } else {
            self.last_yield = Some(Instant::now());
        }
        Some(item)
    }
}
