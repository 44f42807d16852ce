//! Telemetry lines: upstream's (`HWINFO`, `TIERS`, `EMAP`, `HITS`, `PROF`, byte-compatible)
//! and ours for the `--telemetry-fd` channel (`PROGRESS`, `LIVE`, `REPIN`, `DISKCLASS`,
//! `STATE`, `SESSIONS`, `SPEC`, `KVSAVE`, `GRAMMAR`). Every line is `KIND field...` separated by single spaces; `protocol/README.md`
//! lists the fields. Parsing is forward-compatible: an unknown kind is
//! [`Telemetry::Unknown`] and trailing extra fields of a known kind are ignored.

use std::fmt::Write as _;

use crate::num::{parse_f64, parse_u32, parse_u64, push_fixed};

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

impl Telemetry {
    /// The line's kind word (`None` for [`Telemetry::Unknown`]).
    pub fn kind(&self) -> Option<&'static str> {
        Some(match self {
            Telemetry::HwInfo(_) => "HWINFO",
            Telemetry::Tiers(_) => "TIERS",
            Telemetry::Emap(_) => "EMAP",
            Telemetry::Hits(_) => "HITS",
            Telemetry::Prof(_) => "PROF",
            Telemetry::Progress(_) => "PROGRESS",
            Telemetry::Live(_) => "LIVE",
            Telemetry::Repin(_) => "REPIN",
            Telemetry::DiskClass(_) => "DISKCLASS",
            Telemetry::State(_) => "STATE",
            Telemetry::Sessions(_) => "SESSIONS",
            Telemetry::Spec(_) => "SPEC",
            Telemetry::KvSave(_) => "KVSAVE",
            Telemetry::Grammar(_) => "GRAMMAR",
            Telemetry::Unknown(_) => return None,
        })
    }

    /// The line without its `\n`, exactly as upstream's `printf` formats it.
    pub fn to_line(&self) -> String {
        let mut s = String::new();
        // Writing into a String cannot fail.
        let _ = self.write_line(&mut s);
        s
    }

    /// Appends the line and its `\n` to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.to_line().as_bytes());
        out.push(b'\n');
    }

    fn write_line(&self, s: &mut String) -> std::fmt::Result {
        match self {
            Telemetry::HwInfo(h) => {
                write!(s, "HWINFO {} ", h.cores)?;
                push_fixed(s, h.ram_total_gb, 1);
                s.push(' ');
                push_fixed(s, h.ram_avail_gb, 1);
                write!(s, " {} ", h.ngpu)?;
                push_fixed(s, h.vram_total_gb, 1);
                write!(s, " {}|{}", h.cpu_name, h.gpu_name)?;
            }
            Telemetry::Tiers(t) => {
                write!(
                    s,
                    "TIERS {} {} {} ",
                    t.vram_experts, t.ram_experts, t.disk_experts
                )?;
                push_fixed(s, t.vram_gb, 2);
                s.push(' ');
                push_fixed(s, t.ram_gb, 2);
            }
            Telemetry::Emap(m) => {
                write!(s, "EMAP {} {} ", m.rows, m.cols)?;
                push_hex(s, &m.cells);
            }
            Telemetry::Hits(h) => {
                write!(s, "HITS {} {} ", h.rows, h.cols)?;
                push_hex(s, &h.bits);
            }
            Telemetry::Prof(p) => {
                s.push_str("PROF ");
                push_fixed(s, p.wall_s, 3);
                write!(s, " {} {}", p.prompt_tokens, p.completion_tokens)?;
                for x in [
                    p.expert_disk_s,
                    p.expert_wait_s,
                    p.expert_matmul_s,
                    p.attention_s,
                    p.lm_head_s,
                ] {
                    s.push(' ');
                    push_fixed(s, x, 3);
                }
                write!(s, " {}", p.forwards)?;
            }
            Telemetry::Progress(p) => {
                write!(s, "PROGRESS {} {} {}", p.phase.as_str(), p.done, p.total)?;
            }
            Telemetry::Live(l) => {
                write!(s, "LIVE {} ", l.tokens)?;
                push_fixed(s, l.tok_per_s, 2);
                s.push(' ');
                push_fixed(s, l.hit_pct, 1);
                s.push(' ');
                push_fixed(s, l.rss_gb, 2);
                write!(s, " {}", l.slot)?;
                if let Some(tpf) = l.tokens_per_forward {
                    s.push(' ');
                    push_fixed(s, tpf, 2);
                }
            }
            Telemetry::Repin(r) => {
                write!(
                    s,
                    "REPIN {} {} {} {} {} ",
                    r.layer, r.evicted, r.evicted_heat, r.admitted, r.admitted_heat
                )?;
                push_fixed(s, r.ms, 1);
            }
            Telemetry::DiskClass(d) => {
                s.push_str("DISKCLASS");
                for (name, f) in [("cold", &d.cold), ("warm", &d.warm)] {
                    write!(s, " {name} {} {} ", f.count, f.bytes)?;
                    push_fixed(s, f.thread_s, 3);
                    s.push(' ');
                    push_fixed(s, f.busy_s, 3);
                    write!(s, " {}", f.direct)?;
                }
                crate::drives::push_drives(s, &d.drives);
            }
            Telemetry::State(st) => write!(s, "STATE {}", st.as_str())?,
            Telemetry::Sessions(list) => {
                write!(s, "SESSIONS {}", list.len())?;
                for x in list {
                    write!(
                        s,
                        " {} {} {} {} {}",
                        x.slot,
                        x.state.as_str(),
                        x.id,
                        x.ctx_tokens,
                        x.generated
                    )?;
                }
            }
            Telemetry::Spec(x) => {
                write!(s, "SPEC {} {} {} ", x.slot, x.tokens, x.forwards)?;
                push_fixed(s, x.tokens_per_forward(), 2);
                write!(s, " {} ", x.max_draft)?;
                push_fixed(s, x.mean_draft(), 2);
                write!(s, " {}", x.drafting_forwards)?;
                for (name, src) in x.sources() {
                    write!(s, " {name} {} {} ", src.proposed, src.accepted)?;
                    push_fixed(s, src.acceptance_pct().unwrap_or(0.0), 1);
                }
            }
            Telemetry::KvSave(k) => {
                // One line whatever the reason says.
                let reason: String = k
                    .reason
                    .chars()
                    .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
                    .collect();
                write!(s, "KVSAVE {} fail {reason}", k.slot)?;
            }
            Telemetry::Grammar(g) => write!(s, "GRAMMAR {} {}", g.id, g.as_str())?,
            Telemetry::Unknown(line) => s.push_str(line),
        }
        Ok(())
    }
}

fn push_hex(s: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    s.reserve(bytes.len() * 2);
    for &b in bytes {
        s.push(HEX[usize::from(b >> 4)] as char);
        s.push(HEX[usize::from(b & 15)] as char);
    }
}

fn parse_hex(h: &[u8]) -> Option<Vec<u8>> {
    fn nib(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    if !h.len().is_multiple_of(2) {
        return None;
    }
    h.chunks_exact(2)
        .map(|p| Some(nib(p[0])? << 4 | nib(p[1])?))
        .collect()
}

/// Space-separated fields of a line (runs of spaces count as one separator).
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn new(line: &'a [u8]) -> Self {
        Fields(line)
    }
    fn word(&mut self) -> Option<&'a [u8]> {
        let start = self.0.iter().position(|&b| b != b' ')?;
        let rest = &self.0[start..];
        let len = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
        self.0 = &rest[len..];
        Some(&rest[..len])
    }
    fn u32(&mut self) -> Option<u32> {
        parse_u32(self.word()?)
    }
    fn u64(&mut self) -> Option<u64> {
        parse_u64(self.word()?)
    }
    fn f64(&mut self) -> Option<f64> {
        parse_f64(self.word()?)
    }
    fn expect(&mut self, w: &[u8]) -> Option<()> {
        (self.word()? == w).then_some(())
    }
}

/// Strips one trailing `\n` and then one `\r`.
fn strip_eol(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Parses one telemetry line (with or without its `\n`). `None` for an empty line or a
/// malformed line of a known kind; [`Telemetry::Unknown`] for any other kind. Extra fields
/// after the documented ones are ignored (upstream adds optional fields at the end, e.g. to
/// `PROF`). Never panics.
pub fn parse_telemetry_line(line: &[u8]) -> Option<Telemetry> {
    let line = strip_eol(line);
    let kind_end = line.iter().position(|&b| b == b' ').unwrap_or(line.len());
    let kind = &line[..kind_end];
    let mut f = Fields::new(&line[kind_end..]);
    let t = match kind {
        b"" => return None,
        b"HWINFO" => return parse_hwinfo(line).map(Telemetry::HwInfo),
        b"TIERS" => Telemetry::Tiers(Tiers {
            vram_experts: f.u32()?,
            ram_experts: f.u32()?,
            disk_experts: f.u32()?,
            vram_gb: f.f64()?,
            ram_gb: f.f64()?,
        }),
        b"EMAP" => {
            let (rows, cols) = (f.u32()?, f.u32()?);
            let cells = parse_hex(f.word().unwrap_or(b""))?;
            let n = u64::from(rows) * u64::from(cols);
            (cells.len() as u64 == n).then_some(())?;
            Telemetry::Emap(Emap { rows, cols, cells })
        }
        b"HITS" => {
            let (rows, cols) = (f.u32()?, f.u32()?);
            let bits = parse_hex(f.word().unwrap_or(b""))?;
            let n = u64::from(rows) * u64::from(cols);
            (bits.len() as u64 == n.div_ceil(8)).then_some(())?;
            Telemetry::Hits(Hits { rows, cols, bits })
        }
        b"PROF" => Telemetry::Prof(Prof {
            wall_s: f.f64()?,
            prompt_tokens: f.u32()?,
            completion_tokens: f.u32()?,
            expert_disk_s: f.f64()?,
            expert_wait_s: f.f64()?,
            expert_matmul_s: f.f64()?,
            attention_s: f.f64()?,
            lm_head_s: f.f64()?,
            forwards: f.u64()?,
        }),
        b"PROGRESS" => Telemetry::Progress(Progress {
            phase: ProgressPhase::parse(f.word()?)?,
            done: f.u64()?,
            total: f.u64()?,
        }),
        b"LIVE" => Telemetry::Live(Live {
            tokens: f.u32()?,
            tok_per_s: f.f64()?,
            hit_pct: f.f64()?,
            rss_gb: f.f64()?,
            slot: f.u32()?,
            // Older daemons end the line at the slot.
            tokens_per_forward: match f.word() {
                None => None,
                Some(w) => Some(parse_f64(w)?),
            },
        }),
        b"REPIN" => Telemetry::Repin(Repin {
            layer: f.u32()?,
            evicted: f.u32()?,
            evicted_heat: f.u32()?,
            admitted: f.u32()?,
            admitted_heat: f.u32()?,
            ms: f.f64()?,
        }),
        b"DISKCLASS" => {
            let mut class = |name: &[u8]| {
                f.expect(name)?;
                Some(DiskClassFigures {
                    count: f.u64()?,
                    bytes: f.u64()?,
                    thread_s: f.f64()?,
                    busy_s: f.f64()?,
                    direct: f.u64()?,
                })
            };
            let cold = class(b"cold")?;
            let warm = class(b"warm")?;
            let drives = crate::drives::parse_drives(|| f.word())?;
            Telemetry::DiskClass(DiskClass { cold, warm, drives })
        }
        b"STATE" => Telemetry::State(EngineState::parse(f.word()?)?),
        b"SESSIONS" => {
            let n = f.u32()?;
            // Grown as groups parse: a bogus count cannot allocate more than the line holds.
            let mut list = Vec::new();
            for _ in 0..n {
                list.push(SessionInfo {
                    slot: f.u32()?,
                    state: SessionState::parse(f.word()?)?,
                    id: f.u64()?,
                    ctx_tokens: f.u64()?,
                    generated: f.u64()?,
                });
            }
            Telemetry::Sessions(list)
        }
        b"KVSAVE" => {
            let slot = f.u32()?;
            f.expect(b"fail")?;
            let reason = String::from_utf8_lossy(f.0).trim_start().to_string();
            Telemetry::KvSave(KvSave { slot, reason })
        }
        b"GRAMMAR" => {
            let id = f.u64()?;
            let complete = match f.word()? {
                b"complete" => true,
                b"incomplete" => false,
                _ => return None,
            };
            Telemetry::Grammar(GrammarEnd { id, complete })
        }
        b"SPEC" => {
            let (slot, tokens, forwards) = (f.u32()?, f.u64()?, f.u64()?);
            f.f64()?; // tokens per forward, derived
            let max_draft = f.u32()?;
            f.f64()?; // mean draft length, derived
            let drafting_forwards = f.u64()?;
            let mut source = |name: &[u8]| {
                f.expect(name)?;
                let src = SpecSource {
                    proposed: f.u64()?,
                    accepted: f.u64()?,
                };
                f.f64()?; // acceptance, derived
                (src.accepted <= src.proposed).then_some(src)
            };
            let mtp = source(b"mtp")?;
            let ngram = source(b"ngram")?;
            let grammar = source(b"grammar")?;
            Telemetry::Spec(Spec {
                slot,
                tokens,
                forwards,
                max_draft,
                drafting_forwards,
                mtp,
                ngram,
                grammar,
            })
        }
        _ => Telemetry::Unknown(String::from_utf8_lossy(line).into_owned()),
    };
    Some(t)
}

/// `HWINFO` fields 1-5 are single-space separated numbers; the rest of the line (which may
/// contain spaces) is `cpu_name|gpu_name`, split at the first `|`.
fn parse_hwinfo(line: &[u8]) -> Option<HwInfo> {
    let mut parts = line.splitn(7, |&b| b == b' ');
    parts.next()?; // "HWINFO"
    let cores = parse_u32(parts.next()?)?;
    let ram_total_gb = parse_f64(parts.next()?)?;
    let ram_avail_gb = parse_f64(parts.next()?)?;
    let ngpu = parse_u32(parts.next()?)?;
    let vram_total_gb = parse_f64(parts.next()?)?;
    let names = parts.next()?;
    let bar = names.iter().position(|&b| b == b'|')?;
    Some(HwInfo {
        cores,
        ram_total_gb,
        ram_avail_gb,
        ngpu,
        vram_total_gb,
        cpu_name: String::from_utf8_lossy(&names[..bar]).into_owned(),
        gpu_name: String::from_utf8_lossy(&names[bar + 1..]).into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_transcript() {
        let t = Telemetry::Sessions(vec![
            SessionInfo {
                slot: 0,
                state: SessionState::Decode,
                id: 7,
                ctx_tokens: 130,
                generated: 12,
            },
            SessionInfo {
                slot: 1,
                state: SessionState::Prefill,
                id: 8,
                ctx_tokens: 2048,
                generated: 0,
            },
            SessionInfo {
                slot: 3,
                state: SessionState::Idle,
                id: 0,
                ctx_tokens: 77,
                generated: 5,
            },
        ]);
        let line = "SESSIONS 3 0 decode 7 130 12 1 prefill 8 2048 0 3 idle 0 77 5";
        assert_eq!(t.to_line(), line);
        assert_eq!(parse_telemetry_line(line.as_bytes()), Some(t));
        assert_eq!(
            parse_telemetry_line(b"SESSIONS 0\n"),
            Some(Telemetry::Sessions(vec![]))
        );
        // Fields after the n groups are ignored (additive extensions).
        assert!(matches!(
            parse_telemetry_line(b"SESSIONS 1 2 idle 0 0 0 future=1"),
            Some(Telemetry::Sessions(v)) if v.len() == 1 && v[0].slot == 2
        ));
    }

    #[test]
    fn spec_transcript() {
        let t = Telemetry::Spec(Spec {
            slot: 2,
            tokens: 90,
            forwards: 40,
            max_draft: 3,
            drafting_forwards: 30,
            mtp: SpecSource {
                proposed: 60,
                accepted: 33,
            },
            ngram: SpecSource {
                proposed: 12,
                accepted: 3,
            },
            grammar: SpecSource::default(),
        });
        let line = "SPEC 2 90 40 2.25 3 2.40 30 mtp 60 33 55.0 ngram 12 3 25.0 grammar 0 0 0.0";
        assert_eq!(t.to_line(), line);
        assert_eq!(parse_telemetry_line(line.as_bytes()), Some(t));
        // The derived figures are recomputed from the counts, not trusted.
        let Some(Telemetry::Spec(x)) = parse_telemetry_line(
            b"SPEC 0 10 10 9.99 0 9.99 0 mtp 0 0 50.0 ngram 0 0 0.0 grammar 4 4 0.0 more=1\n",
        ) else {
            panic!("SPEC line with a trailing field did not parse");
        };
        assert_eq!(x.tokens_per_forward(), 1.0);
        assert_eq!(x.mean_draft(), 0.0);
        assert_eq!(x.grammar.acceptance_pct(), Some(100.0));
        assert_eq!(x.mtp.acceptance_pct(), None);
    }

    #[test]
    fn malformed_spec_lines() {
        let good = "SPEC 0 3 2 1.50 2 1.00 1 mtp 1 1 100.0 ngram 0 0 0.0 grammar 0 0 0.0";
        assert!(parse_telemetry_line(good.as_bytes()).is_some());
        for bad in [
            "SPEC",
            "SPEC 0 3 2 1.50 2 1.00 1 mtp 1 1 100.0 ngram 0 0 0.0",
            "SPEC 0 3 2 1.50 2 1.00 1 ngram 1 1 100.0 mtp 0 0 0.0 grammar 0 0 0.0",
            "SPEC 0 3 2 x 2 1.00 1 mtp 1 1 100.0 ngram 0 0 0.0 grammar 0 0 0.0",
            // More accepted than proposed.
            "SPEC 0 3 2 1.50 2 1.00 1 mtp 1 2 200.0 ngram 0 0 0.0 grammar 0 0 0.0",
            "SPEC -1 3 2 1.50 2 1.00 1 mtp 1 1 100.0 ngram 0 0 0.0 grammar 0 0 0.0",
        ] {
            assert_eq!(parse_telemetry_line(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn live_tokens_per_forward_is_optional() {
        let old = parse_telemetry_line(b"LIVE 3 6.00 50.0 1.30 0");
        let Some(Telemetry::Live(l)) = &old else {
            panic!("{old:?}")
        };
        assert_eq!(l.tokens_per_forward, None);
        assert_eq!(old.unwrap().to_line(), "LIVE 3 6.00 50.0 1.30 0");
        let new = Telemetry::Live(Live {
            tokens: 3,
            tok_per_s: 6.0,
            hit_pct: 50.0,
            rss_gb: 1.3,
            slot: 0,
            tokens_per_forward: Some(2.5),
        });
        assert_eq!(new.to_line(), "LIVE 3 6.00 50.0 1.30 0 2.50");
        assert_eq!(
            parse_telemetry_line(b"LIVE 3 6.00 50.0 1.30 0 2.50"),
            Some(new)
        );
        assert_eq!(parse_telemetry_line(b"LIVE 3 6.00 50.0 1.30 0 x"), None);
    }

    #[test]
    fn grammar_transcript() {
        let t = Telemetry::Grammar(GrammarEnd {
            id: 18446744073709551615,
            complete: false,
        });
        assert_eq!(t.to_line(), "GRAMMAR 18446744073709551615 incomplete");
        assert_eq!(
            parse_telemetry_line(b"GRAMMAR 18446744073709551615 incomplete\n"),
            Some(t)
        );
        assert_eq!(
            parse_telemetry_line(b"GRAMMAR 7 complete later=1"),
            Some(Telemetry::Grammar(GrammarEnd {
                id: 7,
                complete: true
            }))
        );
        for bad in [
            &b"GRAMMAR"[..],
            b"GRAMMAR 7",
            b"GRAMMAR x complete",
            b"GRAMMAR -1 complete",
            b"GRAMMAR 7 done",
        ] {
            assert_eq!(parse_telemetry_line(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn malformed_sessions_lines() {
        for bad in [
            &b"SESSIONS"[..],
            b"SESSIONS x",
            b"SESSIONS 2 0 idle 0 0 0",
            b"SESSIONS 1 0 busy 0 0 0",
            b"SESSIONS 1 0 decode 7 130",
            b"SESSIONS 1 -1 decode 7 130 1",
            b"SESSIONS 4294967295 0 idle 0 0 0",
        ] {
            assert_eq!(parse_telemetry_line(bad), None, "{bad:?}");
        }
    }
}
