//! The tier options on the command line (`TierArgs`, flattened into every subcommand's model
//! options) and the validated `TierConfig` the store is built from.

use std::path::PathBuf;

use clap::Args;

use super::policy::CachePolicy;
use crate::error::EngineError;

/// How demand loads read an expert's bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IoMode {
    /// `--direct auto`: [`Direct`](IoMode::Direct) where the page cache cannot keep the
    /// experts, [`Buffered`](IoMode::Buffered) where it can, decided when the store is made
    /// ([`super::io_auto::choose_io`]); the reads themselves never see it.
    #[default]
    Auto,
    /// `pread` through the page cache.
    Buffered,
    /// `pread` on an `O_DIRECT` descriptor into aligned buffers (buffered where refused).
    Direct,
    /// Handles into the shard's memory map, pages faulted in (packed matrices: no copy).
    Mmap,
}

/// Whether the pilot reads the next layer's guessed experts ahead (`--pilot`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PilotMode {
    /// `--pilot auto` (the command line's default): on exactly when decoding will read experts
    /// from disk, decided at start from the RAM split ([`super::pilot_auto::choose_pilot`]).
    Auto,
    /// `--pilot on` (also `--pilot` alone, 1, true, yes): always (an I/O pool is implied).
    On,
    /// `--pilot off` (0, false, no): never.
    Off,
}

/// Where the pinned set comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum PinSource {
    /// The model's own `.coli_usage` history.
    Auto,
    /// A usage file the user named (trusted: a foreign engine id only warns).
    File(PathBuf),
}

/// How much RAM the pinned set may take.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PinGb {
    Gb(f64),
    /// As many as the RAM budget allows (leaving one LRU slot per layer).
    All,
}

/// Validated tier options (see [`TierArgs`] for their meaning).
#[derive(Clone, Debug)]
pub struct TierConfig {
    pub cache: Option<usize>,
    pub cache_policy: CachePolicy,
    /// `COLI_CACHE_SHARES`: split the cached slots between layers by measured reuse.
    pub cache_shares: bool,
    /// Requests per sparse layer between two splits of the shares (default
    /// [`super::shares::RESPLIT_EVERY`]; the tests use fewer, to split on tiny models).
    pub share_every: u64,
    /// `CAP_RAISE`: grow a default cap to what the budget allows.
    pub cap_raise: bool,
    /// `--prefill-chunk`: prompt positions a prefill forward takes when no session decodes.
    pub prefill_chunk: super::chunk::ChunkRequest,
    pub ram_gb: Option<f64>,
    /// `--ram-reserve-gb`: the fixed reserve in bytes (default: [`TierConfig::reserve`]).
    pub ram_reserve: Option<u64>,
    /// `RSS_GUARD_GB`: the guard's own budget in bytes (default: the RAM budget).
    pub rss_guard: Option<u64>,
    pub pin: Option<PinSource>,
    pub pin_gb: PinGb,
    pub autopin: bool,
    /// `PIN_FILL`: experts never selected may be pinned too (count 0, after the seen ones).
    pub pin_fill: bool,
    pub repin: usize,
    pub io: IoMode,
    pub drop_after: bool,
    /// I/O worker threads; 0 = loads on the compute thread.
    pub pipe: usize,
    pub pilot: PilotMode,
    /// `--pilot-depth N`: read the first N ranks of every guess (None: chosen per layer from
    /// each rank's measured precision).
    pub pilot_depth: Option<usize>,
    /// `--pilot-inflight N`: pilot guesses the I/O pool reads at once; the other workers are
    /// kept for demand loads (a read in flight cannot be preempted).
    pub pilot_inflight: usize,
    pub mlock: bool,
    pub route_trace: Option<PathBuf>,
    pub usage_save: bool,
    /// `COLI_USAGE_DECAY`: factor (0, 1) applied to the usage history at each save.
    pub usage_decay: Option<f64>,
    pub diskclass_window: Option<u64>,
    /// `--mirror`: a second copy of the shards on another drive.
    pub mirror: Option<PathBuf>,
    /// `--model-dirs`: directories on several drives, each holding copies or a share of the
    /// model's shards; one drive each ([`super::drives::Drives`]).
    pub model_dirs: Vec<PathBuf>,
    /// `--verify-reads`: every expert read checked against `colibri-checksums.json`.
    pub verify_reads: bool,
    /// `--gpu`: the adapter the VRAM tier may use.
    pub gpu: crate::gpu::GpuChoice,
    /// `--vram-gb`: device memory for the VRAM expert tier (None or 0: no tier).
    pub vram_gb: Option<f64>,
    /// `--cache-route` (`CACHE_ROUTE=1`): cache-aware routing, off (`None`) by default.
    pub cache_route: Option<crate::cache_route::CacheRouteConfig>,
}

impl TierConfig {
    /// The fixed reserve under `budget`: `--ram-reserve-gb`, else [`super::ram::scaled_reserve`]
    /// of it (the budget may be known only at start, from the memory there).
    pub fn reserve(&self, budget: u64) -> u64 {
        self.ram_reserve
            .unwrap_or_else(|| super::ram::scaled_reserve(budget))
    }
}

impl Default for TierConfig {
    fn default() -> Self {
        TierConfig {
            cache: None,
            cache_policy: CachePolicy::default(),
            cache_shares: true,
            share_every: super::shares::RESPLIT_EVERY,
            cap_raise: true,
            prefill_chunk: super::chunk::ChunkRequest::Auto,
            ram_gb: None,
            ram_reserve: None,
            rss_guard: None,
            pin: None,
            pin_gb: PinGb::Gb(10.0),
            autopin: true,
            pin_fill: false,
            repin: 0,
            io: IoMode::Auto,
            drop_after: false,
            pipe: 0,
            // The library's default stays off (as its `pipe: 0` is): a caller opts in. The
            // command line's default is `auto` ([`TierArgs::pilot`]).
            pilot: PilotMode::Off,
            pilot_depth: None,
            pilot_inflight: DEFAULT_PILOT_INFLIGHT,
            mlock: false,
            route_trace: None,
            usage_save: true,
            usage_decay: None,
            diskclass_window: None,
            mirror: None,
            model_dirs: Vec::new(),
            verify_reads: false,
            gpu: crate::gpu::GpuChoice::Auto,
            vram_gb: None,
            cache_route: None,
        }
    }
}

/// I/O workers without `--pipe`, or with `--pipe` given without a number. Loads overlap the
/// products and each other: a fresh process's 64-position prefill on the medium model (page
/// cache warm) ran at 69-76 pos/s with 2 or 4 workers against 18-22 with none, alternated;
/// cold decode from the disk was level or better.
pub const DEFAULT_PIPE_WORKERS: usize = 4;
/// Pilot guesses in flight at once (`--pilot-inflight`). Measured on a cold, disk-bound run
/// (medium model, cache 2, 4 workers, alternated): 2 read 1.17-1.9x faster than 1, whose
/// guesses came too late to cut the wait and so were turned off; either leaves demand loads
/// free workers, where uncapped guesses made them wait 26-34 ms per load instead of 5-8.
pub const DEFAULT_PILOT_INFLIGHT: usize = 2;

fn boolish() -> clap::builder::BoolishValueParser {
    clap::builder::BoolishValueParser::new()
}

#[derive(Args, Debug, Clone)]
pub struct TierArgs {
    /// Experts kept per layer in the LRU (default: as many as the RAM budget allows, up to
    /// all). Lowered, with a [RAM] line, when it would not fit the budget.
    #[arg(long, env = "CAP", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub cache: Option<u32>,
    /// Which cached expert a full layer gives up: `lfu` (least selected this session, counts
    /// halving as they age; an expert colder than all cached ones is used and not kept),
    /// `lru` (least recently used) or `slru` (LRU with a prefill's reads on probation).
    #[arg(long, env = "COLI_CACHE_POLICY", default_value = "lfu")]
    pub cache_policy: String,
    /// Split the cached experts between the layers by each one's measured reuse (1): the
    /// same total as --cache x layers, more slots where another slot hits more; re-split every
    /// 256 requests per layer. 0 gives every layer the same cap.
    #[arg(long, env = "COLI_CACHE_SHARES", default_value = "1", value_parser = boolish(), action = clap::ArgAction::Set)]
    pub cache_shares: bool,
    /// Without --cache, grow the LRU from 8 per layer to as many as the RAM budget allows (1)
    /// or keep 8 (0). An explicit --cache is never raised.
    #[arg(long, env = "CAP_RAISE", default_value = "1", value_parser = boolish(), action = clap::ArgAction::Set)]
    pub cap_raise: bool,
    /// Prompt positions one prefill forward takes while no other session decodes. Each chunk
    /// fetches every expert its rows touch (at 256 positions nearly all of them), so when the
    /// routed experts stream from disk a prompt reads them once a chunk: `auto` takes up to
    /// 2048 positions then, as many as the RAM budget's room for experts holds the rows'
    /// working set within an eighth of it (the cache gives that up); when every expert fits
    /// in RAM, up to 2048 as the room they leave holds (a cold model's first prompt then
    /// spreads its reads over the whole prompt); N (1 to 8192) takes N, its working set
    /// counted in the budget. A [PREFILL] line at start says which and why. While a session
    /// decodes, a chunk joining its step stays at most 256, so no stream freezes. The logits
    /// and cache do not depend on the chunk.
    #[arg(
        long,
        env = "PREFILL_CHUNK",
        default_value = "auto",
        value_name = "auto|N"
    )]
    pub prefill_chunk: String,
    /// RAM budget in GB for dense weights, KV, pinned and cached experts (default: 88% of
    /// MemAvailable at start).
    #[arg(long, env = "RAM_GB")]
    pub ram_gb: Option<f64>,
    /// Fixed part of the RAM budget kept for the process and the page cache, in GB (upstream's
    /// 1.2 + 2.5); the RSS guard's 0.3 GB tolerance scales with it. For small models.
    #[arg(long, env = "COLI_RAM_RESERVE_GB")]
    pub ram_reserve_gb: Option<f64>,
    /// The RSS guard's budget in GB (default: the RAM budget): above it x 1.02 plus the
    /// tolerance, cached experts are dropped and the cap lowered.
    #[arg(long, env = "RSS_GUARD_GB")]
    pub rss_guard_gb: Option<f64>,
    /// Pin experts at start: `auto` (from the model's .coli_usage history) or a usage FILE.
    #[arg(long, env = "PIN")]
    pub pin: Option<String>,
    /// RAM for pinned experts, in GB, or `all` (what the budget allows).
    #[arg(long, env = "PIN_GB", default_value = "10")]
    pub pin_gb: String,
    /// Without --pin, pin from the usage history once it holds >= 5000 selections (1) or never (0).
    #[arg(long, env = "AUTOPIN", default_value = "1", value_parser = boolish(), action = clap::ArgAction::Set)]
    pub autopin: bool,
    /// Let --pin / autopin also pin experts the history never saw (after the seen ones), so a
    /// large --pin-gb is filled (1) rather than stopping at the seen ones (0).
    #[arg(long, env = "PIN_FILL", default_value = "0", value_parser = boolish(), action = clap::ArgAction::Set)]
    pub pin_fill: bool,
    /// Live re-pin: swap cold pinned experts for hot unpinned ones every N emitted tokens (0 = off).
    #[arg(long, env = "REPIN", default_value_t = 0)]
    pub repin: u32,
    /// Read experts with O_DIRECT (aligned buffers; buffered where the filesystem refuses):
    /// `auto` (O_DIRECT when the page cache cannot keep the experts beside the engine: the
    /// cgroup's memory limit or MemTotal, less the RAM budget or the whole model if smaller,
    /// is less than the experts on disk; where it can, mapped as `--mmap` when the model
    /// exceeds the budget, unless --model-dirs, --mirror or --drop, else buffered), `on` (also
    /// `--direct` alone, 1, true, yes) or `off` (0, false, no: buffered).
    #[arg(long, env = "DIRECT", num_args = 0..=1, default_missing_value = "on", default_value = "auto")]
    pub direct: String,
    /// Use experts straight out of the shards' memory maps instead of reading them with pread:
    /// a load faults the pages in (MADV_POPULATE_READ) and packed matrices compute on the page
    /// cache's pages, no copy; an evicted expert lets go of them. Fastest when the page cache
    /// holds the model; the shards must not be truncated while mapped.
    #[arg(long, env = "COLI_MMAP", value_parser = boolish(), action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub mmap: bool,
    /// Drop an expert's pages from the page cache after reading it (posix_fadvise DONTNEED).
    #[arg(long = "drop", env = "COLI_DROP", value_parser = boolish(), action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub drop_pages: bool,
    /// I/O worker pool reading a layer's missing experts while the ready ones are multiplied
    /// (default 4 workers; `--pipe N`; 0 = every load on the compute thread, in order).
    #[arg(long, env = "PIPE", num_args = 0..=1, default_missing_value = "4", value_parser = clap::value_parser!(u32).range(0..=64))]
    pub pipe: Option<u32>,
    /// Predict the next layer's experts with its router and read them ahead: `auto` (on when
    /// the routed experts do not all fit the RAM the tiers give them, so decoding reads them
    /// from disk, and there is an I/O pool; off when they all fit or with --pipe 0; a [PILOT]
    /// line at start says which and why), `on` (also --pilot alone, 1, true, yes: always,
    /// implies --pipe) or `off` (0, false, no: never).
    #[arg(long, env = "PILOT", num_args = 0..=1, default_missing_value = "on", default_value = "auto")]
    pub pilot: String,
    /// How many of each row's ranked guesses the pilot reads: `auto` (per layer, the leading
    /// ranks whose measured precision is at least 50%, so wrong guesses never read more bytes
    /// than right ones save) or a fixed N (1..=top-k; for comparisons).
    #[arg(long, env = "PILOT_DEPTH", default_value = "auto")]
    pub pilot_depth: String,
    /// Pilot guesses read at once by the I/O pool (default 2): the other workers stay free for
    /// the loads the compute thread waits for.
    #[arg(long, env = "PILOT_INFLIGHT", default_value_t = DEFAULT_PILOT_INFLIGHT as u32, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub pilot_inflight: u32,
    /// mlock the pinned experts (a warning if the system refuses).
    #[arg(long, env = "COLI_MLOCK", value_parser = boolish(), action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub mlock: bool,
    /// Write every routing decision to FILE: `<call> <row> <layer> <id>:<gate> ...`.
    #[arg(long, env = "ROUTE_TRACE")]
    pub route_trace: Option<PathBuf>,
    /// Save the expert usage history (.coli_usage) at each turn end (1) or not (0).
    #[arg(long, env = "USAGE_SAVE", default_value = "1", value_parser = boolish(), action = clap::ArgAction::Set)]
    pub usage_save: bool,
    /// Multiply the usage history by D (0 < D < 1) at each save so old habits fade.
    #[arg(long, env = "COLI_USAGE_DECAY")]
    pub usage_decay: Option<f64>,
    /// DISK-CLASS recency window in routing selections (default: top-k x layers x 8).
    #[arg(long, env = "COLI_DISKCLASS_WINDOW")]
    pub diskclass_window: Option<u64>,
    /// A copy of the model's shard files on another drive: expert reads are spread over both
    /// in proportion to each drive's measured speed, and a failed read is retried on the other.
    #[arg(long, env = "COLI_MODEL_MIRROR")]
    pub mirror: Option<PathBuf>,
    /// The model on several drives: directories separated by `,` (or `;`), each holding full
    /// copies of the shard files or a share of them. A shard found in several is read from the
    /// least busy one (bytes spread by each drive's measured speed); one found in one is read
    /// there. The first directory is the model's home (config, tokenizer); --snap may then be
    /// left out (given, its directories come first).
    #[arg(long, env = "COLI_MODEL_DIRS", value_name = "DIR,DIR")]
    pub model_dirs: Option<String>,
    /// Check every expert read from disk against the checksums colibri convert wrote
    /// (colibri-checksums.json): bytes that differ fail the request, naming the tensor, and
    /// the expert is not kept. Refused (exit 2) when the model has no checksums.
    #[arg(long, env = "COLI_VERIFY_READS", value_parser = boolish(), action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub verify_reads: bool,
    /// GPU for the VRAM expert tier: auto (a hardware GPU through Vulkan, Metal or DX12; never
    /// a software rasterizer), vulkan, metal, dx12 (that backend, software adapters included),
    /// or off. Without an adapter, or when the device fails, experts run on the CPU with a
    /// [GPU] line saying why.
    #[arg(long, env = "COLI_GPU", default_value = "auto")]
    pub gpu: String,
    /// Device memory in GB for the GPU: the dense weights first (attention, shared experts,
    /// dense MLPs, lm_head) while they fit, then the experts the usage history ranks hottest
    /// in what is left, computed on the GPU bit for bit as on the CPU (quantized experts; f32
    /// ones stay on the CPU). 0 or unset: nothing on the GPU.
    #[arg(long, env = "VRAM_GB")]
    pub vram_gb: Option<f64>,
    #[command(flatten)]
    pub route: crate::cache_route::CacheRouteArgs,
}

/// `--direct`'s values, in words for a refusal.
pub const DIRECT_VALUES: &str = "expected auto, on or off (also 1, true, yes / 0, false, no)";

/// `--direct`'s value: `None` for auto, else whether O_DIRECT is asked for; `Err` for any
/// other word (case and surrounding spaces aside).
pub fn parse_direct(value: &str) -> Result<Option<bool>, ()> {
    match value.trim().to_ascii_lowercase().as_str() {
        "auto" => Ok(None),
        "on" | "1" | "true" | "yes" | "y" | "t" => Ok(Some(true)),
        "off" | "0" | "false" | "no" | "n" | "f" => Ok(Some(false)),
        _ => Err(()),
    }
}

/// `--pilot`'s values, in words for a refusal.
pub const PILOT_VALUES: &str = "expected auto, on or off (also 1, true, yes / 0, false, no)";

/// `--pilot`'s value; `Err` for any other word (case and surrounding spaces aside).
pub fn parse_pilot(value: &str) -> Result<PilotMode, ()> {
    Ok(match parse_direct(value)? {
        None => PilotMode::Auto,
        Some(true) => PilotMode::On,
        Some(false) => PilotMode::Off,
    })
}

impl TierArgs {
    /// The read mode asked for: `--mmap` unless `--direct on` too (refused), else `--direct`'s.
    fn io_mode(&self) -> Result<IoMode, EngineError> {
        let direct = parse_direct(&self.direct).map_err(|()| {
            EngineError::bad_option(
                "--direct (DIRECT)",
                format!("{:?}", self.direct),
                DIRECT_VALUES,
            )
        })?;
        Ok(match (direct, self.mmap) {
            (Some(true), true) => {
                return Err(EngineError::Usage(
                    "--direct on and --mmap: choose one (O_DIRECT reads bypass the page cache \
                     the memory map reads from)"
                        .into(),
                ))
            }
            (_, true) => IoMode::Mmap,
            (None, false) => IoMode::Auto,
            (Some(true), false) => IoMode::Direct,
            (Some(false), false) => IoMode::Buffered,
        })
    }

    /// `--model-dirs` as directories (none when not given); one that is not a directory is
    /// refused, naming it.
    pub fn model_dirs(&self) -> Result<Vec<PathBuf>, EngineError> {
        let Some(list) = &self.model_dirs else {
            return Ok(Vec::new());
        };
        let mut dirs: Vec<PathBuf> = Vec::new();
        for d in list
            .split([',', ';'])
            .map(str::trim)
            .filter(|d| !d.is_empty())
        {
            let p = PathBuf::from(d);
            if !p.is_dir() {
                return Err(EngineError::Usage(format!(
                    "--model-dirs (COLI_MODEL_DIRS) {list:?}: {d} is not a directory"
                )));
            }
            if !dirs.contains(&p) {
                dirs.push(p);
            }
        }
        if dirs.is_empty() {
            return Err(EngineError::Usage(format!(
                "--model-dirs (COLI_MODEL_DIRS) {list:?}: no directory in it"
            )));
        }
        Ok(dirs)
    }

    pub fn config(&self) -> Result<TierConfig, EngineError> {
        let pin_gb = match self.pin_gb.trim() {
            "all" => PinGb::All,
            s => match s.parse::<f64>() {
                Ok(v) if v.is_finite() && v >= 0.0 => PinGb::Gb(v),
                _ => {
                    return Err(EngineError::bad_option(
                        "--pin-gb",
                        format!("{s:?}"),
                        "expected a number of GB >= 0 or `all`",
                    ))
                }
            },
        };
        if let Some(g) = self.ram_gb {
            if !(g.is_finite() && g > 0.0) {
                return Err(EngineError::bad_option(
                    "--ram-gb",
                    g,
                    "expected a positive number of GB",
                ));
            }
        }
        for (name, v) in [
            (
                "--ram-reserve-gb (COLI_RAM_RESERVE_GB)",
                self.ram_reserve_gb,
            ),
            ("--rss-guard-gb (RSS_GUARD_GB)", self.rss_guard_gb),
        ] {
            if let Some(g) = v {
                if !(g.is_finite() && g >= 0.0) {
                    return Err(EngineError::bad_option(
                        name,
                        g,
                        "expected a number of GB >= 0",
                    ));
                }
            }
        }
        if let Some(d) = self.usage_decay {
            if !(d.is_finite() && d > 0.0 && d < 1.0) {
                return Err(EngineError::bad_option(
                    "--usage-decay (COLI_USAGE_DECAY)",
                    d,
                    "expected a factor between 0 and 1, both excluded",
                ));
            }
        }
        if let Some(m) = &self.mirror {
            if !m.is_dir() {
                return Err(EngineError::Usage(format!(
                    "--mirror {}: not a directory (expected a copy of the model's shard files)",
                    m.display()
                )));
            }
        }
        let cache_policy =
            CachePolicy::parse(self.cache_policy.trim()).map_err(EngineError::Usage)?;
        let pin = match self.pin.as_deref() {
            None | Some("") | Some("0") => None,
            Some("auto") => Some(PinSource::Auto),
            Some(path) => {
                let p = PathBuf::from(path);
                if !p.is_file() {
                    return Err(EngineError::Usage(format!(
                        "--pin {path}: not `auto` and not a readable usage file"
                    )));
                }
                Some(PinSource::File(p))
            }
        };
        let pilot_depth = match self.pilot_depth.trim() {
            "auto" | "" => None,
            d => match d.parse::<usize>() {
                Ok(n) if n >= 1 => Some(n),
                _ => {
                    return Err(EngineError::bad_option(
                        "--pilot-depth (PILOT_DEPTH)",
                        format!("{d:?}"),
                        "expected `auto` or a number of ranks >= 1",
                    ))
                }
            },
        };
        let pilot = parse_pilot(&self.pilot).map_err(|()| {
            EngineError::bad_option("--pilot (PILOT)", format!("{:?}", self.pilot), PILOT_VALUES)
        })?;
        let mut pipe = self.pipe.map_or(DEFAULT_PIPE_WORKERS, |p| p as usize);
        if pilot == PilotMode::On && pipe == 0 {
            pipe = DEFAULT_PIPE_WORKERS;
        }
        let tiers = TierConfig {
            cache: self.cache.map(|c| c as usize),
            cache_policy,
            cache_shares: self.cache_shares,
            share_every: super::shares::RESPLIT_EVERY,
            cap_raise: self.cap_raise,
            prefill_chunk: super::chunk::ChunkRequest::parse(&self.prefill_chunk).map_err(
                |allowed| {
                    EngineError::bad_option(
                        "--prefill-chunk (PREFILL_CHUNK)",
                        format!("{:?}", self.prefill_chunk),
                        allowed,
                    )
                },
            )?,
            ram_gb: self.ram_gb,
            ram_reserve: self.ram_reserve_gb.map(|g| (g * 1e9) as u64),
            rss_guard: self.rss_guard_gb.map(|g| (g * 1e9) as u64),
            pin,
            pin_gb,
            autopin: self.autopin,
            pin_fill: self.pin_fill,
            repin: self.repin as usize,
            io: self.io_mode()?,
            drop_after: self.drop_pages,
            pipe,
            pilot,
            pilot_depth,
            pilot_inflight: self.pilot_inflight as usize,
            mlock: self.mlock,
            route_trace: self.route_trace.clone(),
            usage_save: self.usage_save,
            usage_decay: self.usage_decay,
            diskclass_window: self.diskclass_window.filter(|&w| w > 0),
            mirror: self.mirror.clone(),
            model_dirs: self.model_dirs()?,
            verify_reads: self.verify_reads,
            gpu: crate::gpu::GpuChoice::parse(&self.gpu)
                .map_err(|e| EngineError::Usage(format!("--gpu {}: {e}", self.gpu)))?,
            vram_gb: match self.vram_gb {
                Some(g) if !(g.is_finite() && (0.0..=1e6).contains(&g)) => {
                    return Err(EngineError::bad_option(
                        "--vram-gb",
                        g,
                        "must be a number of GB from 0 to 1000000",
                    ))
                }
                g => g.filter(|&g| g > 0.0),
            },
            cache_route: self.route.config()?,
        };
        crate::gpu::refuse_without_gpu(crate::gpu::BUILT_IN, tiers.gpu, tiers.vram_gb)
            .map_err(EngineError::Usage)?;
        Ok(tiers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        tiers: TierArgs,
    }

    /// The tiers' configuration from a command line of tier options alone.
    fn config(args: &[&str]) -> Result<TierConfig, EngineError> {
        let argv = std::iter::once("colibri").chain(args.iter().copied());
        Cli::try_parse_from(argv).unwrap().tiers.config()
    }

    /// `--gpu vulkan` and `--vram-gb` are refused (exit 2, naming the option) exactly when
    /// this build has no GPU; the default `--gpu auto` without a budget starts either way.
    #[test]
    fn gpu_options_follow_the_build() {
        for (args, named) in [
            (&["--gpu", "vulkan"][..], "--gpu (COLI_GPU)"),
            (&["--vram-gb", "2"][..], "--vram-gb (VRAM_GB)"),
        ] {
            match config(args) {
                Ok(_) => assert!(crate::gpu::BUILT_IN, "{args:?} accepted without the GPU"),
                Err(e) => {
                    assert!(!crate::gpu::BUILT_IN, "{args:?} refused with the GPU: {e}");
                    assert_eq!(e.exit_code(), 2);
                    assert!(e.to_string().contains(named), "{e}");
                }
            }
        }
        assert!(config(&[]).is_ok());
        assert!(config(&["--gpu", "off", "--vram-gb", "2"]).is_ok());
    }

    /// `--direct` takes auto (the default), on (also alone) or off and the boolish words; any
    /// other value is refused with exit 2 naming the allowed ones. `--mmap` wins over auto and
    /// off, and refuses on.
    #[test]
    fn direct_is_auto_on_or_off() {
        let io = |args: &[&str]| config(args).map(|c| c.io);
        assert_eq!(io(&[]).unwrap(), IoMode::Auto);
        assert_eq!(TierConfig::default().io, IoMode::Auto);
        for (args, want) in [
            (&["--direct"][..], IoMode::Direct),
            (&["--direct", "auto"], IoMode::Auto),
            (&["--direct", "AUTO"], IoMode::Auto),
            (&["--direct", "on"], IoMode::Direct),
            (&["--direct=1"], IoMode::Direct),
            (&["--direct", "true"], IoMode::Direct),
            (&["--direct", "yes"], IoMode::Direct),
            (&["--direct", "off"], IoMode::Buffered),
            (&["--direct", "0"], IoMode::Buffered),
            (&["--direct", "false"], IoMode::Buffered),
            (&["--direct", "no"], IoMode::Buffered),
            (&["--mmap"], IoMode::Mmap),
            (&["--mmap", "--direct", "auto"], IoMode::Mmap),
            (&["--mmap", "--direct", "off"], IoMode::Mmap),
        ] {
            assert_eq!(io(args).unwrap(), want, "{args:?}");
        }
        for args in [&["--direct", "bogus"][..], &["--direct="]] {
            let e = io(args).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{args:?}");
            let text = e.to_string();
            assert!(text.contains("--direct (DIRECT)"), "{text}");
            assert!(text.contains("auto, on or off"), "{text}");
        }
        let e = io(&["--mmap", "--direct", "on"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("--mmap"), "{e}");
    }

    /// `--pilot` takes auto (the default), on (also alone) or off and the boolish words; `on`
    /// brings an I/O pool even with `--pipe 0`, `auto` does not (it is then off); any other
    /// value is refused with exit 2 naming the allowed ones.
    #[test]
    fn pilot_is_auto_on_or_off() {
        let pilot = |args: &[&str]| config(args).map(|c| c.pilot);
        assert_eq!(pilot(&[]).unwrap(), PilotMode::Auto);
        for (args, want) in [
            (&["--pilot"][..], PilotMode::On),
            (&["--pilot", "auto"], PilotMode::Auto),
            (&["--pilot", " Auto "], PilotMode::Auto),
            (&["--pilot", "on"], PilotMode::On),
            (&["--pilot=1"], PilotMode::On),
            (&["--pilot", "true"], PilotMode::On),
            (&["--pilot", "yes"], PilotMode::On),
            (&["--pilot", "off"], PilotMode::Off),
            (&["--pilot", "0"], PilotMode::Off),
            (&["--pilot", "false"], PilotMode::Off),
            (&["--pilot", "no"], PilotMode::Off),
        ] {
            assert_eq!(pilot(args).unwrap(), want, "{args:?}");
        }
        let pipe = |args: &[&str]| config(args).unwrap().pipe;
        assert_eq!(pipe(&["--pipe", "0", "--pilot"]), DEFAULT_PIPE_WORKERS);
        assert_eq!(pipe(&["--pipe", "0"]), 0);
        assert_eq!(pipe(&["--pipe", "0", "--pilot", "auto"]), 0);
        assert_eq!(pipe(&["--pipe", "0", "--pilot", "off"]), 0);
        for args in [&["--pilot", "sometimes"][..], &["--pilot="]] {
            let e = config(args).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{args:?}");
            let text = e.to_string();
            assert!(text.contains("--pilot (PILOT)"), "{text}");
            assert!(text.contains("auto, on or off"), "{text}");
        }
    }
}
