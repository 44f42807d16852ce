//! The RAM budget clamp (upstream `cap_for_ram`, §3.2): pure arithmetic, unit tested.
//!
//! ```text
//! slack  = reserve (1.2 GB + 2.5 GB page cache) + working set + KV pool of all slots + k/v buffer
//!          + a prefill chunk's rows past 256 (`chunk.rs`; 0 at the default chunk)
//! capmax = (budget - dense - pinned - slack) / (sparse_layers x expert_bytes)
//! peak   = dense + pinned + slack + cap x sparse_layers x expert_bytes
//! guard  = RSS above guard budget x 1.02 + 0.3 GB x reserve / 3.7 GB drops cached experts
//! ```
//!
//! The fixed reserve is upstream's 3.7 GB unless `--ram-reserve-gb` says otherwise (a small
//! model on a small machine, or the RSS soak test, which scales the whole budget down).

pub const GB: f64 = 1e9;
/// Fixed reserve for the process itself (allocator, tokenizer, stacks).
pub const BASE_RESERVE: u64 = 1_200_000_000;
/// Page cache left to the kernel for the shards' dense pages and read-ahead.
pub const PAGE_CACHE_RESERVE: u64 = 2_500_000_000;
/// Upstream's fixed reserve: [`BASE_RESERVE`] + [`PAGE_CACHE_RESERVE`].
pub const DEFAULT_RESERVE: u64 = BASE_RESERVE + PAGE_CACHE_RESERVE;
/// Below this budget the default reserve is a share of the budget instead of the fixed
/// 3.7 GB, which alone would refuse any `--ram-gb` under it (a small model on a small machine).
pub const RESERVE_SHARE: f64 = 0.25;

/// The reserve without `--ram-reserve-gb`, whether the budget is `--ram-gb` or the memory at
/// start: upstream's 3.7 GB, or a quarter of the budget when that is less (budgets under
/// 14.8 GB, where 3.7 GB alone would refuse a 1 GB cgroup).
pub fn scaled_reserve(budget: u64) -> u64 {
    DEFAULT_RESERVE.min((budget as f64 * RESERVE_SHARE) as u64)
}

/// The RSS guard's tolerance above budget x 1.02 at the default reserve (upstream 0.3 GB).
pub const GUARD_SLACK: u64 = 300_000_000;
/// Transient memory (a prompt being tokenized) the default reserve's share for the process
/// itself covers whatever the resident set: 256 MiB, about 0.8 MB of text.
pub const TRANSIENT_COVERED: u64 = 256 << 20;
/// Experts one layer may hold outside the LRU while a batch is multiplied (upstream 64).
pub const WORKING_SET_EXPERTS: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RamInputs {
    /// The budget, bytes.
    pub budget: u64,
    /// Dense (non-expert) resident bytes.
    pub dense: u64,
    /// Pinned experts, bytes.
    pub pinned: u64,
    /// Resident bytes of the widest expert.
    pub expert_bytes: u64,
    pub sparse_layers: usize,
    pub n_experts: usize,
    /// `kv_slots * ctx * bytes_per_position`.
    pub kv_pool: u64,
    /// `ctx * heads * (qk_nope + v_head) * 4`.
    pub kvb: u64,
    /// Fixed reserve for the process and the page cache ([`scaled_reserve`] of the budget by
    /// default).
    pub reserve: u64,
    /// The working set of a prefill chunk's rows past [`super::chunk::DECODE_CHUNK`]'s
    /// ([`super::chunk::choose`]; 0 at that chunk, whose rows the reserve covers): counted in
    /// the split of the steps that run such a chunk (the cache's slots while they run).
    pub prefill_ws: u64,
}

impl RamInputs {
    /// Everything but the experts: fixed reserves, the batch working set and the KV buffers.
    pub fn slack(&self) -> u64 {
        self.reserve
            + WORKING_SET_EXPERTS.min(self.n_experts) as u64 * self.expert_bytes
            + self.kv_pool
            + self.kvb
            + self.prefill_ws
    }

    /// Bytes left for experts (pinned and cached) once dense weights and slack are taken.
    pub fn expert_room(&self) -> i128 {
        self.budget as i128 - self.dense as i128 - self.slack() as i128
    }

    /// Peak resident bytes with `cap` experts per layer in the LRU.
    pub fn projected_peak(&self, cap: usize) -> u64 {
        self.dense
            + self.pinned
            + self.slack()
            + cap as u64 * self.sparse_layers as u64 * self.expert_bytes
    }

    /// The largest LRU capacity per layer the budget allows (may be < 1).
    pub fn capmax(&self) -> i128 {
        let per_cap = (self.sparse_layers as i128 * self.expert_bytes as i128).max(1);
        (self.expert_room() - self.pinned as i128).div_euclid(per_cap)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapChange {
    Kept,
    Lowered { from: usize },
    Raised { from: usize },
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RamPlan {
    pub cap: usize,
    pub change: CapChange,
    pub projected_peak: u64,
}

/// Not even one expert per layer fits.
#[derive(Clone, Debug, PartialEq)]
pub struct RamRefusal {
    pub inputs: RamInputs,
}

impl std::fmt::Display for RamRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = &self.inputs;
        write!(
            f,
            "--ram-gb {:.2}: one expert per layer does not fit: dense {:.2} GB + pinned {:.2} GB + \
             reserve {:.2} GB (fixed {:.3} GB of --ram-reserve-gb, KV pool {:.2} GB, k/v buffer {:.2} GB, prefill chunk {:.2} GB) + {} layers x {:.1} MB = \
             projected peak {:.2} GB; raise --ram-gb, lower --ram-reserve-gb, lower --ctx/--kv-slots or --pin-gb",
            i.budget as f64 / GB,
            i.dense as f64 / GB,
            i.pinned as f64 / GB,
            i.slack() as f64 / GB,
            i.reserve as f64 / GB,
            i.kv_pool as f64 / GB,
            i.kvb as f64 / GB,
            i.prefill_ws as f64 / GB,
            i.sparse_layers,
            i.expert_bytes as f64 / 1e6,
            i.projected_peak(1) as f64 / GB
        )
    }
}

/// The LRU capacity per layer a session starts from when `--cache` is not given (upstream
/// coli's historic default); `CAP_RAISE` then grows it to what the budget allows.
pub const DEFAULT_CAP: usize = 8;

/// The cap before the budget is looked at: `--cache`, else [`DEFAULT_CAP`] (never more than
/// the layer has).
pub fn start_cap(requested: Option<usize>, n_experts: usize) -> usize {
    requested
        .unwrap_or(DEFAULT_CAP)
        .min(n_experts.max(1))
        .max(1)
}

/// The LRU capacity for `inputs` (upstream `cap_for_ram`): the start cap ([`start_cap`])
/// lowered to what fits; when it fits and `raise` (`CAP_RAISE`, default on) is set, a default
/// cap grows to as many as fit, up to every expert. An explicit `--cache` is never raised:
/// a number the user typed is the cache they asked for (upstream's explicit-cap precedence).
pub fn plan(
    inputs: &RamInputs,
    requested: Option<usize>,
    raise: bool,
) -> Result<RamPlan, RamRefusal> {
    let capmax = inputs.capmax();
    if capmax < 1 {
        return Err(RamRefusal { inputs: *inputs });
    }
    let fit = (capmax.min(inputs.n_experts as i128)) as usize;
    let start = start_cap(requested, inputs.n_experts);
    let (cap, change) = if fit < start {
        (fit, CapChange::Lowered { from: start })
    } else if raise && requested.is_none() && fit > start {
        (fit, CapChange::Raised { from: start })
    } else {
        (start, CapChange::Kept)
    };
    Ok(RamPlan {
        cap,
        change,
        projected_peak: inputs.projected_peak(cap),
    })
}

/// The LRU capacity autopin must leave room for: the start cap as far as it fits with
/// nothing pinned (upstream `autopin_lru_reserve`). Pins planned from the usage history may
/// only take what is left over, so they never lower the cap a run without pins would get.
pub fn no_pin_cap(inputs: &RamInputs, requested: Option<usize>) -> usize {
    let nopin = RamInputs {
        pinned: 0,
        ..*inputs
    };
    let fit = nopin.capmax().clamp(1, inputs.n_experts.max(1) as i128) as usize;
    start_cap(requested, inputs.n_experts).min(fit)
}

/// Bytes autopin may take once [`no_pin_cap`] experts per layer are reserved (0 if none).
pub fn autopin_room(inputs: &RamInputs, requested: Option<usize>) -> u64 {
    let reserve = no_pin_cap(inputs, requested) as i128
        * inputs.sparse_layers as i128
        * inputs.expert_bytes as i128;
    (inputs.expert_room() - reserve).max(0) as u64
}

/// Budget from the memory at start when `--ram-gb` is not given: 88% of `MemAvailable`, or
/// of the cgroup's memory limit when that is lower (a container, or `systemd-run -p
/// MemoryMax=`, still sees the host's MemAvailable, and a budget above the limit ends in the
/// OOM killer rather than in evictions); 8 GB (with a warning) when MemAvailable alone gives
/// under 4 GB, which on a host means /proc/meminfo is wrong, while a cgroup's limit is real.
pub fn auto_budget(mem_available: u64, cgroup_limit: Option<u64>) -> (u64, Option<String>) {
    if let Some(limit) = cgroup_limit.filter(|&l| l < mem_available) {
        let b = (limit as f64 * 0.88) as u64;
        return (
            b,
            Some(format!(
                "[RAM] budget {:.2} GB: 88% of the cgroup's memory limit {:.2} GB (below MemAvailable {:.1} GB)",
                b as f64 / GB,
                limit as f64 / GB,
                mem_available as f64 / GB
            )),
        );
    }
    let b = (mem_available as f64 * 0.88) as u64;
    if b < 4_000_000_000 {
        (
            8_000_000_000,
            Some(format!(
                "[RAM] MemAvailable {:.1} GB looks wrong: assuming an 8 GB budget (set --ram-gb)",
                mem_available as f64 / GB
            )),
        )
    } else {
        (b, None)
    }
}

/// The runtime RSS guard (upstream `rss_guard`, #403): its budget (`RSS_GUARD_GB`, else the
/// RAM budget) and its tolerance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Guard {
    pub budget: u64,
    /// Tolerance above `budget x 1.02`: [`GUARD_SLACK`] scaled by the fixed reserve, so
    /// upstream's 0.3 GB at the default 3.7 GB reserve and proportionally less below it.
    pub slack: u64,
    /// A transient allocation this small is covered by the reserve, whatever the resident
    /// set: [`TRANSIENT_COVERED`] scaled by the fixed reserve, as `slack` is.
    pub covered: u64,
}

impl Guard {
    pub fn new(budget: u64, reserve: u64) -> Guard {
        let scaled = |v: u64| (v as u128 * reserve as u128 / DEFAULT_RESERVE as u128) as u64;
        Guard {
            budget,
            slack: scaled(GUARD_SLACK),
            covered: scaled(TRANSIENT_COVERED),
        }
    }

    /// Whether a transient allocation of `need` bytes fits at resident set `rss`: covered by
    /// the reserve, or under the threshold.
    pub fn transient_fits(&self, need: u64, rss: u64) -> bool {
        need <= self.covered || rss.saturating_add(need) <= self.threshold()
    }

    /// The RSS above which the guard drops cached experts: budget x 1.02 + slack.
    pub fn threshold(&self) -> u64 {
        (self.budget as f64 * 1.02) as u64 + self.slack
    }

    /// The new LRU capacity after the guard saw `rss` bytes: enough whole layers' worth of
    /// experts dropped to come back under the threshold, never below 1.
    pub fn cap(&self, rss: u64, cap: usize, sparse_layers: usize, expert_bytes: u64) -> usize {
        let limit = self.threshold();
        if rss <= limit || cap <= 1 {
            return cap;
        }
        let per_cap = (sparse_layers as u64 * expert_bytes).max(1);
        let drop = (rss - limit).div_ceil(per_cap) as usize;
        cap.saturating_sub(drop.max(1)).max(1)
    }
}

/// A split for tests at `budget`: 10 sparse layers of 256 experts of 20 MB (51.2 GB), 2 GB of
/// dense weights, 1.1 GB of KV, the default reserve.
#[cfg(test)]
pub(crate) fn test_inputs(budget: u64) -> RamInputs {
    RamInputs {
        budget,
        dense: 2_000_000_000,
        pinned: 0,
        expert_bytes: 20_000_000,
        sparse_layers: 10,
        n_experts: 256,
        kv_pool: 1_000_000_000,
        kvb: 100_000_000,
        reserve: DEFAULT_RESERVE,
        prefill_ws: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs() -> RamInputs {
        test_inputs(20_000_000_000)
    }

    #[test]
    fn slack_counts_every_reserve() {
        let i = inputs();
        // 1.2 + 2.5 GB + 64 x 20 MB working set + 1 GB KV + 0.1 GB k/v buffer
        assert_eq!(
            i.slack(),
            1_200_000_000 + 2_500_000_000 + 1_280_000_000 + 1_100_000_000
        );
        // room = 20 - 2 - 6.08 = 11.92 GB; per cap = 10 x 20 MB = 200 MB -> 59
        assert_eq!(i.capmax(), 59);
    }

    #[test]
    fn default_cap_is_what_fits_and_explicit_is_lowered() {
        let i = inputs();
        let p = plan(&i, None, true).unwrap();
        assert_eq!(p.cap, 59);
        assert_eq!(p.change, CapChange::Raised { from: 8 });
        assert_eq!(
            p.projected_peak,
            2_000_000_000 + i.slack() + 59 * 200_000_000
        );
        assert!(p.projected_peak <= i.budget);
        assert_eq!(plan(&i, Some(8), true).unwrap().cap, 8);
        assert_eq!(
            plan(&i, Some(100), true).unwrap().change,
            CapChange::Lowered { from: 100 }
        );
        // A big budget holds everything.
        let big = RamInputs {
            budget: 1_000_000_000_000,
            ..i
        };
        let p = plan(&big, None, true).unwrap();
        assert_eq!((p.cap, p.change), (256, CapChange::Raised { from: 8 }));
    }

    #[test]
    fn pins_come_out_of_the_lru() {
        let i = RamInputs {
            pinned: 4_000_000_000,
            ..inputs()
        };
        assert_eq!(i.capmax(), 39); // (11.92 - 4) GB / 200 MB
    }

    #[test]
    fn refuses_when_one_per_layer_does_not_fit() {
        let i = RamInputs {
            budget: 6_000_000_000,
            ..inputs()
        };
        let err = plan(&i, Some(1), true).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("--ram-gb 6.00"), "{msg}");
        assert!(msg.contains("projected peak"), "{msg}");
    }

    #[test]
    fn cap_raise_grows_only_the_default_cap() {
        let i = inputs(); // 59 fit per layer
                          // CAP_RAISE=1 (default): the default 8 grows to what fits ("cap raised 8->59").
        let p = plan(&i, None, true).unwrap();
        assert_eq!((p.cap, p.change), (59, CapChange::Raised { from: 8 }));
        // CAP_RAISE=0: the default 8 stays ("cap=8 ok").
        let p = plan(&i, None, false).unwrap();
        assert_eq!((p.cap, p.change), (8, CapChange::Kept));
        assert_eq!(p.projected_peak, i.projected_peak(8));
        // Either way a default that does not fit is lowered.
        let small = RamInputs {
            budget: 8_880_000_000, // room 0.8 GB: 4 per layer
            ..i
        };
        for raise in [true, false] {
            let p = plan(&small, None, raise).unwrap();
            assert_eq!((p.cap, p.change), (4, CapChange::Lowered { from: 8 }));
        }
        // An explicit --cache is neither raised nor, when it fits, changed.
        for raise in [true, false] {
            assert_eq!(
                plan(&i, Some(3), raise).unwrap().change,
                CapChange::Kept,
                "raise={raise}"
            );
        }
        // Fewer experts than the default: the start cap is all of them, nothing to raise.
        let few = RamInputs { n_experts: 4, ..i };
        let p = plan(&few, None, true).unwrap();
        assert_eq!((p.cap, p.change), (4, CapChange::Kept));
    }

    #[test]
    fn autopin_leaves_the_no_pin_cap_its_room() {
        let i = inputs(); // room 11.92 GB, 200 MB per cap
                          // Default start cap 8 fits: 8 x 200 MB reserved, the rest may be pinned.
        assert_eq!(no_pin_cap(&i, None), 8);
        assert_eq!(autopin_room(&i, None), 11_920_000_000 - 1_600_000_000);
        // --cache 12: 12 reserved.
        assert_eq!(no_pin_cap(&i, Some(12)), 12);
        assert_eq!(autopin_room(&i, Some(12)), 11_920_000_000 - 2_400_000_000);
        // A cap bigger than what fits reserves all the room: nothing left to pin.
        assert_eq!(no_pin_cap(&i, Some(100)), 59);
        assert_eq!(autopin_room(&i, Some(100)), 120_000_000); // 11.92 - 59 x 0.2
                                                              // Already-planned pins do not shrink the reserve (it is the cap *without* pins).
        let pinned = RamInputs {
            pinned: 5_000_000_000,
            ..i
        };
        assert_eq!(no_pin_cap(&pinned, Some(12)), 12);
        // With the pins autopin may take, the LRU still gets its no-pin cap.
        let room = autopin_room(&i, Some(12));
        let after = RamInputs { pinned: room, ..i };
        assert_eq!(plan(&after, Some(12), true).unwrap().cap, 12);
        assert_eq!(after.capmax(), 12);
    }

    #[test]
    fn guard_lowers_the_cap_in_whole_layers() {
        let budget = 10_000_000_000;
        let g = Guard::new(budget, DEFAULT_RESERVE);
        let limit = g.threshold();
        assert_eq!(limit, 10_500_000_000);
        assert_eq!(g.cap(limit, 8, 10, 20_000_000), 8);
        // 250 MB over: two caps of 200 MB each
        assert_eq!(g.cap(limit + 250_000_000, 8, 10, 20_000_000), 6);
        assert_eq!(g.cap(limit + 50_000_000_000, 8, 10, 20_000_000), 1);
        assert_eq!(auto_budget(100_000_000_000, None).0, 88_000_000_000);
        assert_eq!(auto_budget(1_000_000_000, None).0, 8_000_000_000);
    }

    #[test]
    fn a_cgroup_limit_below_mem_available_sets_the_budget_and_the_reserve_scales_with_it() {
        // 0.5x of a 2.08 GB model on a host with 20 GB available.
        let (b, note) = auto_budget(20_000_000_000, Some(1_040_000_000));
        assert_eq!(b, 915_200_000);
        assert!(note.unwrap().contains("cgroup"));
        // Under 4 GB, but a limit is no misreading of /proc/meminfo: no 8 GB fallback.
        assert_eq!(
            auto_budget(20_000_000_000, Some(1_000_000_000)).0,
            880_000_000
        );
        // A limit above MemAvailable (or none) leaves MemAvailable's budget.
        assert_eq!(
            auto_budget(20_000_000_000, Some(64_000_000_000)).0,
            17_600_000_000
        );
        assert!(auto_budget(20_000_000_000, None).1.is_none());
        // The reserve a 1 GB budget gets leaves room for a small model's experts.
        assert_eq!(scaled_reserve(880_000_000), 220_000_000);
        assert_eq!(scaled_reserve(100_000_000_000), DEFAULT_RESERVE);
    }

    #[test]
    fn a_smaller_reserve_shrinks_the_slack_and_the_guard_tolerance() {
        let i = RamInputs {
            reserve: 370_000_000,
            ..inputs()
        };
        // 3.33 GB less slack: room 11.92 + 3.33 = 15.25 GB, 76 caps of 200 MB.
        assert_eq!(i.slack(), inputs().slack() - 3_330_000_000);
        assert_eq!(i.capmax(), 76);
        // The guard's 0.3 GB scales with the reserve: 30 MB at a tenth of it.
        let g = Guard::new(200_000_000, 370_000_000);
        assert_eq!(g.slack, 30_000_000);
        assert_eq!(g.covered, TRANSIENT_COVERED / 10);
        assert_eq!(g.threshold(), 204_000_000 + 30_000_000);
        assert_eq!(Guard::new(0, 0).threshold(), 0);
    }
}
