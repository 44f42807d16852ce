//! What the fronts read of the expert tiers, and nothing more: counters, the tier map, the
//! disk classes, snapshots, sizes and the disk probe for `bench`. A read-only view over the
//! engine's `ExpertStore`, so no front reaches the store itself (loading, pinning, the
//! turn-end safe point stay the engine's: [`super::Engine::turn_end`]).

use protocol::{DiskClass, Emap};

use crate::experts::{ExpertCounters, ExpertStore, Probe, Snapshot, TierConfig};

/// See the module's comment. Borrowed from [`super::Engine::tiers`].
#[derive(Clone, Copy)]
pub struct TiersReport<'a> {
    store: &'a ExpertStore,
}

impl<'a> TiersReport<'a> {
    pub(super) fn of(store: &'a ExpertStore) -> TiersReport<'a> {
        TiersReport { store }
    }

    /// Hits and misses per tier, bytes read, since the start.
    pub fn counters(&self) -> ExpertCounters {
        self.store.counters()
    }

    /// Every counter at once, to subtract a later snapshot from (`Snapshot::since`).
    pub fn snapshot(&self) -> Snapshot {
        self.store.snapshot()
    }

    /// The tier map (EMAP): where each expert is.
    pub fn emap(&self) -> Emap {
        self.store.emap()
    }

    /// The drives' classes (DISK-CLASS).
    pub fn disk_class(&self) -> DiskClass {
        self.store.disk_class()
    }

    /// The expert selections counted so far, in `.coli_usage`'s form (`bench --usage-out`).
    pub fn usage_now(&self) -> crate::experts::usage::Usage {
        self.store.usage_now()
    }

    /// One routed expert's bytes as stored.
    pub fn expert_bytes(&self) -> u64 {
        self.store.expert_bytes()
    }

    /// Routed experts per sparse layer.
    pub fn n_experts(&self) -> usize {
        self.store.n_experts()
    }

    /// Layers with routed experts.
    pub fn n_sparse(&self) -> usize {
        self.store.n_sparse()
    }

    /// Experts resident in RAM and their bytes.
    pub fn resident(&self) -> (usize, usize) {
        self.store.resident()
    }

    /// Experts resident in VRAM and their bytes.
    pub fn vram_resident(&self) -> (usize, u64) {
        self.store.vram_resident()
    }

    /// The tier settings in use.
    pub fn config(&self) -> &'a TierConfig {
        self.store.config()
    }

    /// Whether the prefetch pilot reads guesses ahead (`--pilot` with an I/O pool).
    pub fn pilot_enabled(&self) -> bool {
        self.store.pilot_enabled()
    }

    /// What the pilot's reads ahead became, in bytes since the start (the STAT suffix);
    /// `None` without the pilot.
    pub fn prefetch_bytes(&self) -> Option<protocol::PrefetchBytes> {
        self.store.prefetch_bytes()
    }

    /// The prefetch pilot's line, when it ran.
    pub fn pilot_report(&self) -> Option<String> {
        self.store.pilot_report()
    }

    /// The `[PROF]` lines of a run over `d` (counters since a snapshot), `tokens` in `wall_s`.
    pub fn report_lines(&self, d: &Snapshot, tokens: usize, wall_s: f64) -> Vec<String> {
        self.store.report_lines(d, tokens, wall_s)
    }

    /// Reads in flight the loader keeps.
    pub fn queue_depth(&self) -> usize {
        self.store.queue_depth()
    }

    /// Times `reads` random reads of one expert at queue depth `depth` (`bench`'s ceiling).
    pub fn disk_probe(&self, reads: usize, depth: usize) -> Option<Probe> {
        self.store.disk_probe(reads, depth)
    }
}
