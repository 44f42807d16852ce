//! A decode token's time from its parts, and the page cache beneath our expert cache.
//!
//! A token spends its dense part (attention, the dense matrices, the output head) alone and
//! its experts' products overlapped with their reads ([`token_s`]); a read comes from disk at
//! the disk probe's rate, or, read buffered, from the page cache when it holds the expert:
//! room for the next most used experts after ours ([`page_cache_room`], the room `--direct
//! auto` judged by), every expert's first read from disk ([`cold_window`]). A buffered read
//! ends in the kernel's copy to our buffer, work on the cores the products need ([`Loads`]).

use super::{Prediction, Probes, Shape, Sizes, WHOLE_TOKEN_OF_PROBE};
use crate::experts::io_auto::IoChoice;
use crate::experts::IoMode;

/// The share of the shorter of a token's reads and its experts' products that the engine
/// hides behind the longer (the dense part does not overlap them, see [`token_s`]): a layer's
/// experts are computed as their reads land and the next layer's are only known after its
/// router, so the two overlap, but not entirely. Measured, when this overlapped the whole
/// token's computation
/// (`scripts/plan_measure.out.md`, quiet machine): Qwen3-30B-A3B in 8 and 4 GB cgroups and
/// GLM-4.5-Air at all 46 layers decoded and prefilled between the sum of the two times and
/// their maximum; with each run's own bytes read, predicted over measured decode was
/// 0.91-1.07 for max + half the shorter (the 4 GB warm run 1.20), 0.72-1.10 for the sum,
/// 1.09-1.32 for the maximum; the first token 0.86-1.10 for max + half, 1.03-1.33 summed.
pub const READ_OVERLAP: f64 = 0.5;

/// Seconds for work that computes for `compute_s` and reads for `read_s` (see
/// [`READ_OVERLAP`]).
pub fn overlapped(compute_s: f64, read_s: f64) -> f64 {
    compute_s.max(read_s) + (1.0 - READ_OVERLAP) * compute_s.min(read_s)
}

/// Seconds of a decode token (or a prefill chunk) that spends `dense_s` on attention and the
/// dense matrices, `expert_s` on its experts' products and `read_s` on their reads: only the
/// expert products overlap the reads. A layer's reads start when its router has named the
/// experts, after its attention and dense matrices; the store then computes the experts it
/// holds and each missed one as it lands, so the I/O pool is idle while the next layer's
/// attention runs (the pilot's guesses aside, which the cold and warm runs leave off). The
/// profiles agree: GLM-4.5-Air's first token (`scripts/plan_measure.glm-4.5-air-46l-chunk.json`, O_DIRECT, one chunk) spent 50.9 s
/// in its experts and their reads against 52.4 s overlapped here (35.8 s of products, 33.2 s
/// of reads; 69.0 s summed), its warm token 0.88 s there against 0.91, while its attention ran
/// beside nothing. Overlapping the whole token's compute with the reads instead (the rule
/// before) put GLM's cold window at 1.33x the measured speed and DeepSeek-V3's first token at
/// 1.39x its time; with this and the page cache tier, predicted over measured with each run's
/// routing (hit rates 0.586 and 0.542): GLM-4.5-Air cold window 1.18, warm 0.93, first token
/// 0.88 (seconds over seconds); DeepSeek-V3 8 layers read buffered, 1.02, 1.01, 0.89. The
/// first tokens' shortfall is attention's (GLM 10.7 s predicted, 38.9 s measured).
pub fn token_s(dense_s: f64, expert_s: f64, read_s: f64) -> f64 {
    dense_s + overlapped(expert_s, read_s)
}

/// Where a token's (or a prompt chunk's) expert loads spend their time: the disk reading,
/// and the cores copying. A buffered read, from the disk or from the page cache, ends in the
/// kernel copying the expert to our buffer on the I/O thread that asked, which takes a core
/// from the products: the copies count as compute, not beside it. DeepSeek-V3's first token
/// (`scripts/plan_measure.deepseek-v3-8l-pagecache.json`, 38 GB from the page cache) spent
/// 39.8 s in its experts and their loads where overlapping the copies with the products
/// predicted 27.5 s. O_DIRECT reads land by DMA: no copy.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Loads {
    /// Seconds the disk reads.
    pub read_s: f64,
    /// Seconds the cores copy (at the copy probe's rate, all cores copying).
    pub copy_s: f64,
}

impl Loads {
    /// `disk` bytes read from the disk and `page_cache` bytes found in the page cache, the
    /// each load `copied` to our buffer or not (read buffered; mapped and O_DIRECT loads are
    /// not).
    pub fn of(disk: f64, page_cache: f64, copied: bool, probes: &Probes) -> Loads {
        Loads::at(
            disk,
            page_cache,
            probes.disk_gbs,
            copied.then_some(probes.copy_gbs),
        )
    }

    /// [`Loads::of`] at a disk of `disk_gbs` and copies at `copy_gbs` (`None`: O_DIRECT,
    /// nothing copied), billions of bytes a second.
    pub fn at(disk: f64, page_cache: f64, disk_gbs: f64, copy_gbs: Option<f64>) -> Loads {
        Loads {
            read_s: disk / (disk_gbs * 1e9),
            copy_s: copy_gbs.map_or(0.0, |g| (disk + page_cache) / (g * 1e9)),
        }
    }
}

/// The page cache's room for expert reads under `io`: what [`choose_io`](crate::experts::io_auto::choose_io) computed beside the
/// budget (MemTotal or the cgroup's limit, less what the engine holds) when the reads go
/// through it, 0 when they do not or when the room is unknown.
pub fn page_cache_room(io: &IoChoice) -> u64 {
    use crate::experts::io_auto::IoReason;
    match (io.mode, io.reason) {
        (IoMode::Buffered | IoMode::Mmap, IoReason::Fits { room, .. })
        | (IoMode::Buffered | IoMode::Mmap, IoReason::TooBig { room, .. }) => room,
        _ => 0,
    }
}

/// Seconds a decode token computes from `dense` bytes of dense matrices and `experts` bytes
/// of experts in RAM: the whole token at [`WHOLE_TOKEN_OF_PROBE`] of the memory probe, except
/// that each part goes no faster than its format's product alone runs (the dense and expert
/// decode probes: an int2 or int3 product can be bound by its unpacking rather than the
/// memory; DeepSeek-V3's int2 experts ran at about half the memory probe). The
/// probe's own rate is not scaled down again: the share already covers a product a little
/// slower than the memory. Returns the two apart, (the dense part's, the experts'), since
/// only the experts' overlap their reads ([`token_s`]).
pub fn token_compute_parts(dense: u64, experts: u64, probes: &Probes) -> (f64, f64) {
    let whole = probes.mem_gbs * 1e9 * WHOLE_TOKEN_OF_PROBE;
    (
        dense as f64 / whole.min(probes.dense_gbs * 1e9),
        experts as f64 / whole.min(probes.expert_decode_gbs * 1e9),
    )
}

/// A window of decode tokens: its speed and what a token loaded on average.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Window {
    pub tok_s: f64,
    /// Expert bytes a token read from disk and copied from the page cache.
    pub disk_bytes: f64,
    pub page_cache_bytes: f64,
}

impl Window {
    /// Every expert byte a token loaded, from wherever: what the engine's own count is.
    pub fn loaded_bytes(&self) -> f64 {
        self.disk_bytes + self.page_cache_bytes
    }
}

/// The first `n` decode tokens from an empty expert cache (what `--measure`'s cold run times):
/// until the cache is full every expert a token touches for the first time is read (uniform
/// routing touches `E(1-(1-k/E)^t)` distinct experts per layer in `t` tokens), after that the
/// share of the picks the cache misses (`1 - held/E` uniform, less with a usage history).
/// Read buffered, a miss of an expert touched before comes from the page cache for its share
/// of the misses ([`Prediction::page_cache_share`]), a first touch from disk; every buffered
/// load is copied ([`Loads`]).
pub fn cold_window(
    shape: &Shape,
    sizes: &Sizes,
    probes: &Probes,
    p: &Prediction,
    loads_copied: bool,
    n: usize,
) -> Window {
    let (e, k) = (shape.experts.max(1) as f64, shape.top_k as f64);
    let held = (p.split.experts_in_ram + p.split.experts_in_vram) as f64;
    let distinct = |t: usize| e * (1.0 - (1.0 - k / e).powi(t as i32));
    let dense = sizes.dense_per_token.min(p.bytes_per_token);
    let (dense_s, expert_s) = token_compute_parts(dense, p.bytes_per_token - dense, probes);
    let per_layer = shape.sparse_layers as f64 * sizes.expert_disk as f64;
    let (mut secs, mut disk, mut copied) = (0.0, 0.0, 0.0);
    for t in 1..=n.max(1) {
        let first = distinct(t) - distinct(t - 1);
        let loads = if distinct(t) <= held {
            first
        } else {
            k * (1.0 - p.hit_rate)
        };
        let first = first.min(loads);
        let again = (loads - first) * p.page_cache_share;
        let (d, c) = ((loads - again) * per_layer, again * per_layer);
        disk += d;
        copied += c;
        let loads = Loads::of(d, c, loads_copied, probes);
        secs += token_s(dense_s, expert_s + loads.copy_s, loads.read_s);
    }
    let n = n.max(1) as f64;
    Window {
        tok_s: n / secs,
        disk_bytes: disk / n,
        page_cache_bytes: copied / n,
    }
}
