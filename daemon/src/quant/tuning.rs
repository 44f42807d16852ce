//! Process-wide knobs of how matmuls run: threading, weight prefetch, tiling and the work
//! thresholds for going parallel.  They only move time, never results, so they live apart from
//! the arithmetic, where the kernel benchmark can sweep them.

use super::pool::SpinPool;
use rayon::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// How matmuls split their rows across threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Threading {
    /// The spin pool for products at one position (a decode step's many short matmuls, back
    /// to back: a worker that spins between them is there at once, where a sleeping rayon
    /// worker takes a wake-up each), rayon for several positions (prefill's long products,
    /// whose GEMM path is tuned on rayon).  The default.
    Auto,
    /// rayon's global pool (work stealing; idle workers sleep).
    Rayon,
    /// [`pool::SpinPool::global`](super::pool::SpinPool::global) (workers spin briefly between calls).
    Spin,
}

/// 0 = Auto, 1 = Rayon, 2 = Spin.
static THREADING: AtomicUsize = AtomicUsize::new(0);

/// Choose the threading of all later matmuls (default [`Threading::Auto`]).
pub fn set_threading(t: Threading) {
    let v = match t {
        Threading::Auto => 0,
        Threading::Rayon => 1,
        Threading::Spin => 2,
    };
    THREADING.store(v, Ordering::Relaxed);
}

/// The threading in use.
pub fn threading() -> Threading {
    match THREADING.load(Ordering::Relaxed) {
        1 => Threading::Rayon,
        2 => Threading::Spin,
        _ => Threading::Auto,
    }
}

/// `f(i, chunk)` over `buf`'s chunks of `chunk` elements in parallel, on the pool the
/// products of `positions` positions use: a decode step's attention then forks onto the same
/// spinning workers as its matmuls, instead of waking rayon's between them (two pools busy at
/// once would ask more threads than cores).
pub fn par_chunks_mut<T: Send>(
    buf: &mut [T],
    chunk: usize,
    positions: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    match pool_for(positions) {
        Threading::Spin => {
            SpinPool::global().for_each_chunk_mut2(buf, &mut [], chunk, |_, i, c| f(i, c))
        }
        _ => buf
            .par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| f(i, c)),
    }
}

/// [`par_chunks_mut`] over two slices cut in step: `f(i, a_i, b_i)` for each chunk of `a`.
pub fn par_chunk_pairs<T: Send, U: Send>(
    a: &mut [T],
    a_chunk: usize,
    b: &mut [U],
    b_chunk: usize,
    positions: usize,
    f: impl Fn(usize, &mut [T], &mut [U]) + Sync + Send,
) {
    match pool_for(positions) {
        Threading::Spin => SpinPool::global().for_each_chunk_pair(a, a_chunk, b, b_chunk, f),
        _ => a
            .par_chunks_mut(a_chunk)
            .zip(b.par_chunks_mut(b_chunk))
            .enumerate()
            .for_each(|(i, (x, y))| f(i, x, y)),
    }
}

/// Threads a call on `pool` (as [`pool_for`] gives) splits over, the caller included.
pub(super) fn pool_threads(pool: Threading) -> usize {
    match pool {
        Threading::Spin => SpinPool::global().threads(),
        _ => rayon::current_num_threads(),
    }
}

/// The pool a product at `positions` positions runs on: [`Threading::Rayon`] or
/// [`Threading::Spin`], never `Auto`.
pub(super) fn pool_for(positions: usize) -> Threading {
    match threading() {
        Threading::Auto if positions <= 1 => Threading::Spin,
        Threading::Auto => Threading::Rayon,
        t => t,
    }
}

/// How decode streams weights: both only move time, never results.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeTuning {
    /// Bytes of weights requested ahead of the ones being read (0: none).
    /// The four-row decode tiles ask for each line a whole number of tiles
    /// (at least this many bytes) ahead, one line per line read; the one-row
    /// path asks for whole rows, for rows shorter than this (longer ones are
    /// left to the hardware prefetcher).  Without it each thread's stream
    /// stalls on memory latency at every row: the hardware prefetcher alone
    /// read 0.45-0.7 of the bandwidth on rows of 0.5-3 KB.
    pub prefetch_bytes: usize,
    /// Shortest packed row for which decode reads four rows per kernel
    /// call (sharing each activation load); shorter rows go one at a time.
    pub tile_min_row_bytes: usize,
    /// Decode regions on the spin pool split their rows guided (long tasks first, short
    /// last: `pool::Guided`) rather than into equal tasks.
    pub guided: bool,
    /// The one-row path prefetches into L2 (`prefetcht1`) instead of L1
    /// (`prefetcht0`); the tiles always ask for L1.
    pub prefetch_l2: bool,
    /// A decode step's batch of experts runs in one region, each member's down once its own
    /// gate/up rows are done (`quant/chain.rs`), rather than two (every gate/up, a join, every
    /// down). The same bits either way.
    pub one_region: bool,
    /// In the one region, how long (microseconds) a worker with nothing to claim waits for a
    /// member's gate/up rows before it leaves the region to the threads computing them.
    pub one_region_leave_us: usize,
    /// In the one region, the pieces each member's gate and up rows are claimed in (0: as
    /// many as pieces of `chain::PIECE_WORK` multiply-adds make).
    pub one_region_pieces: usize,
}

/// The values `cargo bench --bench kernels -- tune` picked on the development
/// machine (2 cores, AVX-512 VNNI): 8 KiB ahead into L1, tiles from 256-byte
/// rows.
const DEFAULT_TUNING: DecodeTuning = DecodeTuning {
    prefetch_bytes: 8192,
    tile_min_row_bytes: 256,
    guided: true,
    prefetch_l2: false,
    // Off until a quiet host shows it ahead. Alternated with the two-region form in one
    // process on the 2-core development host (small synthetic model, best of 6 a side):
    // load 1-2 0.985x, load 4-7 1.027x, beside a busy core 1.093x (load 2-4) and 0.898x,
    // 0.998x (load 6-8), but 0.68-0.79x at load 9-14. Before its workers left a long wait
    // instead of spinning or yielding inside the region: 0.44-0.69x loaded.
    // With its gate/up rows claimed in two pieces a member (below), alternated with the
    // two-region form on the medium model (`BENCH_AB=one_region=0,1`, best of 4 a side):
    // 1.069x (load 6.5-8.3), 1.152x (load 6.0-6.2), 1.013x (load 4.8-6.1), 0.997x (load
    // 4.1): ahead only where the worker is often off its core; quiet (load 2, best of 6 a
    // side) 0.976x, where the form with 12 pieces a member measured 0.945x.
    one_region: false,
    // Alternated 50 against 0 us: 1.030x, against 500 us: 0.958x (load 6-8): noise.
    one_region_leave_us: 50,
    // A member's gate, then its up: against pieces of `PIECE_WORK` (12 a member of the
    // medium model) 1.12x and 1.094x, against 4 pieces 1.054x the other way (the same
    // minutes' pairs split 3 to 1 for 2 pieces), loads 5-8: each piece restarts a stream.
    one_region_pieces: 2,
};

impl Default for DecodeTuning {
    fn default() -> Self {
        DEFAULT_TUNING
    }
}

static PREFETCH_BYTES: AtomicUsize = AtomicUsize::new(DEFAULT_TUNING.prefetch_bytes);
static TILE_MIN_ROW_BYTES: AtomicUsize = AtomicUsize::new(DEFAULT_TUNING.tile_min_row_bytes);
static PREFETCH_L2: AtomicBool = AtomicBool::new(DEFAULT_TUNING.prefetch_l2);
static GUIDED: AtomicBool = AtomicBool::new(DEFAULT_TUNING.guided);
static ONE_REGION: AtomicBool = AtomicBool::new(DEFAULT_TUNING.one_region);
static LEAVE_US: AtomicUsize = AtomicUsize::new(DEFAULT_TUNING.one_region_leave_us);
static PIECES: AtomicUsize = AtomicUsize::new(DEFAULT_TUNING.one_region_pieces);

/// The decode tuning in use ([`DecodeTuning::default`] unless set).
pub fn decode_tuning() -> DecodeTuning {
    DecodeTuning {
        prefetch_bytes: PREFETCH_BYTES.load(Ordering::Relaxed),
        tile_min_row_bytes: TILE_MIN_ROW_BYTES.load(Ordering::Relaxed),
        prefetch_l2: PREFETCH_L2.load(Ordering::Relaxed),
        guided: GUIDED.load(Ordering::Relaxed),
        one_region: ONE_REGION.load(Ordering::Relaxed),
        one_region_leave_us: LEAVE_US.load(Ordering::Relaxed),
        one_region_pieces: PIECES.load(Ordering::Relaxed),
    }
}

/// Change the decode tuning of all later matmuls (the benchmark's sweep).
pub fn set_decode_tuning(t: DecodeTuning) {
    PREFETCH_BYTES.store(t.prefetch_bytes, Ordering::Relaxed);
    TILE_MIN_ROW_BYTES.store(t.tile_min_row_bytes, Ordering::Relaxed);
    PREFETCH_L2.store(t.prefetch_l2, Ordering::Relaxed);
    GUIDED.store(t.guided, Ordering::Relaxed);
    ONE_REGION.store(t.one_region, Ordering::Relaxed);
    LEAVE_US.store(t.one_region_leave_us, Ordering::Relaxed);
    PIECES.store(t.one_region_pieces, Ordering::Relaxed);
}

/// Below this many multiply-adds a matmul runs on the calling thread.
pub(super) const PAR_MIN_WORK: usize = 1 << 16;
/// Minimum multiply-adds per parallel chunk.
pub(super) const CHUNK_MIN_WORK: usize = 1 << 14;
/// Minimum multiply-adds of a guided decode task (its last, shortest ones): 32-64 KB of
/// packed weights, long enough that the stream's prefetch gets ahead.
pub(super) const GUIDED_MIN_WORK: usize = 1 << 16;
