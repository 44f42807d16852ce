//! Telemetry lines: upstream's (`HWINFO`, `TIERS`, `EMAP`, `HITS`, `PROF`, byte-compatible)
//! and ours for the `--telemetry-fd` channel (`PROGRESS`, `LIVE`, `REPIN`, `DISKCLASS`,
//! `STATE`, `SESSIONS`, `SPEC`, `KVSAVE`, `GRAMMAR`). Every line is `KIND field...` separated by single spaces; `protocol/README.md`
//! lists the fields. Parsing is forward-compatible: an unknown kind is
//! [`Telemetry::Unknown`] and trailing extra fields of a known kind are ignored.
//!
//! This file holds the line types; writing them is `telemetry/format.rs` (upstream's
//! `printf` formats, byte for byte) and reading them `telemetry/parse.rs` (never panics).

mod format;
mod parse;
#[cfg(test)]
mod tests;

pub use parse::parse_telemetry_line;

/// One telemetry line.
#[derive(Clone, Debug, PartialEq)]
pub enum Telemetry {
    /// *upstream* `HWINFO`.
    HwInfo(HwInfo),
    /// *upstream* `TIERS`.
    Tiers(Tiers),
    /// *upstream* `EMAP`.
    Emap(Emap),
    /// *upstream* `HITS`.
    Hits(Hits),
    /// *upstream* `PROF`.
    Prof(Prof),
    /// *ours* `PROGRESS`.
    Progress(Progress),
    /// *ours* `LIVE`.
    Live(Live),
    /// *ours* `REPIN`.
    Repin(Repin),
    /// *ours* `DISKCLASS`.
    DiskClass(DiskClass),
    /// *ours* `STATE`.
    State(EngineState),
    /// *ours* `SESSIONS`: every listed KV slot's session (mux mode).
    Sessions(Vec<SessionInfo>),
    /// *ours* `SPEC`: one request's speculative-decoding figures.
    Spec(Spec),
    /// *ours* `KVSAVE`: a conversation's save failed.
    KvSave(KvSave),
    /// *ours* `GRAMMAR`: whether a grammar-constrained mux request ended on a whole sentence.
    Grammar(GrammarEnd),
    /// A line of a kind this version does not know (the whole line, lossily UTF-8, without
    /// its line end). Ignore it.
    Unknown(String),
}

/// `HWINFO %d %.1f %.1f %d %.1f %s|%s`.
#[derive(Clone, Debug, PartialEq)]
pub struct HwInfo {
    /// Logical cores.
    pub cores: u32,
    /// Total RAM, GB (1e9 bytes).
    pub ram_total_gb: f64,
    /// Available RAM, GB.
    pub ram_avail_gb: f64,
    /// Number of GPUs (0 on a CPU build).
    pub ngpu: u32,
    /// Total VRAM, GB.
    pub vram_total_gb: f64,
    /// CPU model name (may contain spaces; must not contain `|` or `\n`).
    pub cpu_name: String,
    /// GPU name (empty on a CPU build; must not contain `\n`).
    pub gpu_name: String,
}

/// `TIERS %d %d %d %.2f %.2f`.
#[derive(Clone, Debug, PartialEq)]
pub struct Tiers {
    /// Experts resident in VRAM.
    pub vram_experts: u32,
    /// Experts resident in RAM (pinned or in an LRU).
    pub ram_experts: u32,
    /// Experts only on disk.
    pub disk_experts: u32,
    /// VRAM tier size, GB.
    pub vram_gb: f64,
    /// RAM tier size, GB.
    pub ram_gb: f64,
}

/// Tier codes of an [`Emap`] cell.
pub mod tier {
    /// On disk only.
    pub const DISK: u8 = 0;
    /// In RAM (pinned or in the LRU).
    pub const RAM: u8 = 1;
    /// In VRAM.
    pub const VRAM: u8 = 2;
}

/// `EMAP %d %d %s`: `rows cols hex`, one byte `(tier << 6) | heat` per expert, row-major.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Emap {
    /// Sparse layers (+1 for an MTP row).
    pub rows: u32,
    /// Experts per layer.
    pub cols: u32,
    /// `rows * cols` cells.
    pub cells: Vec<u8>,
}

impl Emap {
    /// An all-disk, zero-heat map.
    pub fn new(rows: u32, cols: u32) -> Emap {
        Emap {
            rows,
            cols,
            cells: vec![0; rows as usize * cols as usize],
        }
    }

    fn index(&self, row: u32, e: u32) -> Option<usize> {
        (row < self.rows && e < self.cols).then(|| row as usize * self.cols as usize + e as usize)
    }

    /// The raw cell byte, `None` when out of range.
    pub fn cell(&self, row: u32, e: u32) -> Option<u8> {
        self.cells.get(self.index(row, e)?).copied()
    }

    /// The tier (see [`tier`]) of expert `e` in `row`.
    pub fn tier(&self, row: u32, e: u32) -> Option<u8> {
        self.cell(row, e).map(|c| c >> 6)
    }

    /// The heat (bit length of the usage count, 0..=63) of expert `e` in `row`.
    pub fn heat(&self, row: u32, e: u32) -> Option<u8> {
        self.cell(row, e).map(|c| c & 0x3f)
    }

    /// Sets one cell; out-of-range coordinates are ignored. `tier` is taken mod 4 and
    /// `heat` capped at 63.
    pub fn set(&mut self, row: u32, e: u32, tier: u8, heat: u8) {
        if let Some(i) = self.index(row, e) {
            if let Some(c) = self.cells.get_mut(i) {
                *c = ((tier & 3) << 6) | heat.min(63);
            }
        }
    }
}

/// `HITS %d %d %s`: `rows cols hex`, one bit per expert, bit index `row * cols + e`,
/// LSB-first within each byte.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hits {
    /// Rows, as in [`Emap`].
    pub rows: u32,
    /// Experts per row.
    pub cols: u32,
    /// `ceil(rows * cols / 8)` bytes.
    pub bits: Vec<u8>,
}

impl Hits {
    /// No expert hit.
    pub fn new(rows: u32, cols: u32) -> Hits {
        Hits {
            rows,
            cols,
            bits: vec![0; (rows as usize * cols as usize).div_ceil(8)],
        }
    }

    fn index(&self, row: u32, e: u32) -> Option<usize> {
        (row < self.rows && e < self.cols).then(|| row as usize * self.cols as usize + e as usize)
    }

    /// Whether expert `e` of `row` was routed since the previous `HITS`.
    pub fn hit(&self, row: u32, e: u32) -> Option<bool> {
        let i = self.index(row, e)?;
        self.bits.get(i / 8).map(|b| b >> (i % 8) & 1 == 1)
    }

    /// Marks expert `e` of `row` as hit; out-of-range coordinates are ignored.
    pub fn set(&mut self, row: u32, e: u32) {
        if let Some(i) = self.index(row, e) {
            if let Some(b) = self.bits.get_mut(i / 8) {
                *b |= 1 << (i % 8);
            }
        }
    }
}

/// `PROF %.3f %d %d %.3f %.3f %.3f %.3f %.3f %llu` (deltas over one request).
#[derive(Clone, Debug, PartialEq)]
pub struct Prof {
    /// Wall seconds.
    pub wall_s: f64,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Completion tokens.
    pub completion_tokens: u32,
    /// Expert loads, thread-seconds of service.
    pub expert_disk_s: f64,
    /// Expert loads, seconds the compute thread waited.
    pub expert_wait_s: f64,
    /// Expert matmul seconds.
    pub expert_matmul_s: f64,
    /// Attention seconds.
    pub attention_s: f64,
    /// LM-head seconds.
    pub lm_head_s: f64,
    /// Forward passes.
    pub forwards: u64,
}

/// The phase of a [`Progress`] line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgressPhase {
    /// Loading weights (`done`/`total` in tensors or bytes, the daemon's choice).
    Load,
    /// Pinning experts.
    Pin,
    /// Prefilling a prompt (`done`/`total` in tokens).
    Prefill,
}

impl ProgressPhase {
    /// The wire word: `load`, `pin`, `prefill`.
    pub fn as_str(self) -> &'static str {
        match self {
            ProgressPhase::Load => "load",
            ProgressPhase::Pin => "pin",
            ProgressPhase::Prefill => "prefill",
        }
    }

    fn parse(w: &[u8]) -> Option<Self> {
        match w {
            b"load" => Some(ProgressPhase::Load),
            b"pin" => Some(ProgressPhase::Pin),
            b"prefill" => Some(ProgressPhase::Prefill),
            _ => None,
        }
    }
}

/// *ours* `PROGRESS <phase> <done> <total>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Progress {
    /// What is progressing.
    pub phase: ProgressPhase,
    /// Units done.
    pub done: u64,
    /// Units in all (0 when unknown).
    pub total: u64,
}

/// *ours* `LIVE <tokens> <tok_s %.2f> <hit_pct %.1f> <rss_gb %.2f> <slot>`: decode
/// heartbeat, at least every 250 ms while generating.
#[derive(Clone, Debug, PartialEq)]
pub struct Live {
    /// Tokens generated so far in this turn.
    pub tokens: u32,
    /// Tokens per second so far.
    pub tok_per_s: f64,
    /// Expert hit rate so far, percent.
    pub hit_pct: f64,
    /// Resident set, GB.
    pub rss_gb: f64,
    /// The KV slot being decoded.
    pub slot: u32,
    /// Tokens per forward so far in this turn (`%.2f`, a sixth field added after the first
    /// release: `None` when a daemon does not send it).
    pub tokens_per_forward: Option<f64>,
}

/// Drafts of one source in a [`Spec`] line: ` <name> <proposed> <accepted> <acceptance %.1f>`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecSource {
    /// Drafted tokens the verify forward checked.
    pub proposed: u64,
    /// Of those, the ones the target model took.
    pub accepted: u64,
}

impl SpecSource {
    /// Accepted drafts in percent of the proposed ones (`None` before any draft).
    pub fn acceptance_pct(&self) -> Option<f64> {
        (self.proposed > 0).then(|| 100.0 * self.accepted as f64 / self.proposed as f64)
    }
}

/// *ours* `SPEC <slot> <tokens> <forwards> <tokens_per_forward %.2f> <max_draft> <mean_draft
/// %.2f> <drafting_forwards> mtp <p> <a> <pct %.1f> ngram <p> <a> <pct> grammar <p> <a> <pct>`: one request's
/// speculative decoding, at its end. The `%.2f`/`%.1f` figures are derived from the counts
/// (written for people and scripts reading the line; a parser recomputes them): tokens per
/// forward `tokens / forwards`, the mean draft length `drafted / drafting forwards`, and each
/// source's acceptance `100 * accepted / proposed` (0.0 with nothing proposed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spec {
    /// The KV slot the request ran on.
    pub slot: u32,
    /// Tokens sampled.
    pub tokens: u64,
    /// Forwards that sampled them (a verify forward counts once).
    pub forwards: u64,
    /// `--draft N`: most drafted tokens per forward (0: drafting off).
    pub max_draft: u32,
    /// Forwards that carried at least one draft.
    pub drafting_forwards: u64,
    /// The MTP head's drafts.
    pub mtp: SpecSource,
    /// n-gram prompt-lookup drafts.
    pub ngram: SpecSource,
    /// Grammar-forced spans drafted by a constrained request.
    pub grammar: SpecSource,
}

impl Spec {
    /// Tokens per forward (0 before any forward).
    pub fn tokens_per_forward(&self) -> f64 {
        ratio(self.tokens, self.forwards)
    }

    /// Drafted tokens per forward that drafted: the draft length in use (0 when none did).
    pub fn mean_draft(&self) -> f64 {
        let drafted = self.mtp.proposed + self.ngram.proposed + self.grammar.proposed;
        ratio(drafted, self.drafting_forwards)
    }

    /// The three sources with their wire names, in line order.
    pub fn sources(&self) -> [(&'static str, SpecSource); 3] {
        [
            ("mtp", self.mtp),
            ("ngram", self.ngram),
            ("grammar", self.grammar),
        ]
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// *ours* `REPIN <layer> <evicted> <evicted_heat> <admitted> <admitted_heat> <ms %.1f>`:
/// one live re-pin swap.
#[derive(Clone, Debug, PartialEq)]
pub struct Repin {
    /// Layer index.
    pub layer: u32,
    /// Expert evicted from the pinned set.
    pub evicted: u32,
    /// Its session heat.
    pub evicted_heat: u32,
    /// Expert admitted.
    pub admitted: u32,
    /// Its session heat.
    pub admitted_heat: u32,
    /// Milliseconds the swap took.
    pub ms: f64,
}

/// One recency class of [`DiskClass`].
#[derive(Clone, Debug, PartialEq)]
pub struct DiskClassFigures {
    /// Demand loads.
    pub count: u64,
    /// Bytes read (weights + scales).
    pub bytes: u64,
    /// Thread-seconds spent in these loads.
    pub thread_s: f64,
    /// Wall seconds with at least one load of this class in flight.
    pub busy_s: f64,
    /// Loads served through the `O_DIRECT` descriptor.
    pub direct: u64,
}

/// *ours* `DISKCLASS cold <count> <bytes> <thread_s %.3f> <busy_s %.3f> <direct> warm <count>
/// <bytes> <thread_s %.3f> <busy_s %.3f> <direct> [drives <n> ...]`: cumulative DISK-CLASS
/// figures, then optionally per drive ([`crate::drives`]).
#[derive(Clone, Debug, PartialEq)]
pub struct DiskClass {
    /// Loads of experts not touched within the recency window.
    pub cold: DiskClassFigures,
    /// Loads of recently touched experts.
    pub warm: DiskClassFigures,
    /// Per drive (empty when the line has no `drives` tail).
    pub drives: Vec<crate::DriveFigures>,
}

/// *ours* `KVSAVE <slot> fail <reason...>`: saving a slot's conversation failed (disk full,
/// read-only, ...). The turn was answered (DONE or END/STAT went out as usual) but is not
/// durable; the reason runs to the end of the line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvSave {
    /// The KV slot whose conversation was not saved.
    pub slot: u32,
    /// Why, in words (the file and the error).
    pub reason: String,
}

/// *ours* `GRAMMAR <id> complete|incomplete`: a mux request that carried a grammar ended
/// (DONE follows): `complete` when its output is a whole sentence of the grammar,
/// `incomplete` when `max_tokens`, the context, STOP or a `--stop` string cut it short, so
/// the output does not match the grammar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrammarEnd {
    /// The mux request.
    pub id: u64,
    /// Whether the output is a whole sentence of its grammar.
    pub complete: bool,
}

impl GrammarEnd {
    /// The wire word: `complete` or `incomplete`.
    pub fn as_str(self) -> &'static str {
        if self.complete {
            "complete"
        } else {
            "incomplete"
        }
    }
}

/// *ours* `STATE <phase>`: what the daemon is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineState {
    /// Before READY.
    Loading,
    /// Waiting for a request.
    Idle,
    /// Prefilling a prompt.
    Prefill,
    /// Decoding.
    Generating,
}

impl EngineState {
    /// The wire word: `loading`, `idle`, `prefill`, `generating`.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineState::Loading => "loading",
            EngineState::Idle => "idle",
            EngineState::Prefill => "prefill",
            EngineState::Generating => "generating",
        }
    }

    fn parse(w: &[u8]) -> Option<Self> {
        match w {
            b"loading" => Some(EngineState::Loading),
            b"idle" => Some(EngineState::Idle),
            b"prefill" => Some(EngineState::Prefill),
            b"generating" => Some(EngineState::Generating),
            _ => None,
        }
    }
}

/// One session of a [`Telemetry::Sessions`] line: ` <slot> <state> <id> <ctx_tokens>
/// <generated>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionInfo {
    /// The KV slot.
    pub slot: u32,
    /// What the session is doing.
    pub state: SessionState,
    /// The mux request being served (0 when idle).
    pub id: u64,
    /// Tokens in the slot's KV (its conversation so far, prompt being prefilled included).
    pub ctx_tokens: u64,
    /// Tokens generated for the current request (or the last one, when idle).
    pub generated: u64,
}

/// The state word of a [`SessionInfo`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionState {
    /// No request in flight.
    Idle,
    /// Prefilling a request's prompt.
    Prefill,
    /// Decoding a request.
    Decode,
}

impl SessionState {
    /// The wire word: `idle`, `prefill`, `decode`.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionState::Idle => "idle",
            SessionState::Prefill => "prefill",
            SessionState::Decode => "decode",
        }
    }

    fn parse(w: &[u8]) -> Option<Self> {
        match w {
            b"idle" => Some(SessionState::Idle),
            b"prefill" => Some(SessionState::Prefill),
            b"decode" => Some(SessionState::Decode),
            _ => None,
        }
    }
}

/// The line kinds upstream writes to stdout (and the reply decoder recognises there).
pub const UPSTREAM_KINDS: [&str; 5] = ["HWINFO", "TIERS", "EMAP", "HITS", "PROF"];

/// Our own line kinds (telemetry fd only).
pub const OUR_KINDS: [&str; 9] = [
    "PROGRESS",
    "LIVE",
    "REPIN",
    "DISKCLASS",
    "STATE",
    "SESSIONS",
    "SPEC",
    "KVSAVE",
    "GRAMMAR",
];
