//! Process-wide knobs of how matmuls run: threading, weight prefetch, tiling and the work
//! thresholds for going parallel.  They only move time, never results, so they live apart from
//! the arithmetic, where the kernel benchmark can sweep them.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// How matmuls split their rows across threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Threading {
    /// rayon's global pool (work stealing; idle workers sleep).
    Rayon,
    /// [`pool::SpinPool::global`](super::pool::SpinPool::global) (workers spin briefly between calls).
    Spin,
}

static SPIN_THREADING: AtomicBool = AtomicBool::new(false);

/// Choose the threading of all later matmuls (default [`Threading::Rayon`]).
pub fn set_threading(t: Threading) {
    SPIN_THREADING.store(t == Threading::Spin, Ordering::Relaxed);
}

/// The threading in use.
pub fn threading() -> Threading {
    if SPIN_THREADING.load(Ordering::Relaxed) {
        Threading::Spin
    } else {
        Threading::Rayon
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
    /// The one-row path prefetches into L2 (`prefetcht1`) instead of L1
    /// (`prefetcht0`); the tiles always ask for L1.
    pub prefetch_l2: bool,
}

/// The values `cargo bench --bench kernels -- tune` picked on the development
/// machine (2 cores, AVX-512 VNNI): 8 KiB ahead into L1, tiles from 256-byte
/// rows.
const DEFAULT_TUNING: DecodeTuning = DecodeTuning {
    prefetch_bytes: 8192,
    tile_min_row_bytes: 256,
    prefetch_l2: false,
};

impl Default for DecodeTuning {
    fn default() -> Self {
        DEFAULT_TUNING
    }
}

static PREFETCH_BYTES: AtomicUsize = AtomicUsize::new(DEFAULT_TUNING.prefetch_bytes);
static TILE_MIN_ROW_BYTES: AtomicUsize = AtomicUsize::new(DEFAULT_TUNING.tile_min_row_bytes);
static PREFETCH_L2: AtomicBool = AtomicBool::new(DEFAULT_TUNING.prefetch_l2);

/// The decode tuning in use ([`DecodeTuning::default`] unless set).
pub fn decode_tuning() -> DecodeTuning {
    DecodeTuning {
        prefetch_bytes: PREFETCH_BYTES.load(Ordering::Relaxed),
        tile_min_row_bytes: TILE_MIN_ROW_BYTES.load(Ordering::Relaxed),
        prefetch_l2: PREFETCH_L2.load(Ordering::Relaxed),
    }
}

/// Change the decode tuning of all later matmuls (the benchmark's sweep).
pub fn set_decode_tuning(t: DecodeTuning) {
    PREFETCH_BYTES.store(t.prefetch_bytes, Ordering::Relaxed);
    TILE_MIN_ROW_BYTES.store(t.tile_min_row_bytes, Ordering::Relaxed);
    PREFETCH_L2.store(t.prefetch_l2, Ordering::Relaxed);
}

/// Below this many multiply-adds a matmul runs on the calling thread.
pub(super) const PAR_MIN_WORK: usize = 1 << 16;
/// Minimum multiply-adds per parallel chunk.
pub(super) const CHUNK_MIN_WORK: usize = 1 << 14;
