//! `--direct auto` (the default): whether expert reads go through the page cache or around it.
//!
//! Buffered reads only pay when the page cache can keep the experts it reads: a model whose
//! experts fit beside the engine is then read from memory after its first pass. When it cannot,
//! every read fills pages the kernel must take back at once, and inside a memory cgroup the
//! page cache is charged to the cgroup and reclaimed in the read path itself: a 20-layer
//! Qwen3-30B-shaped model in a 3.33 GB cgroup read 0.73 GB/s buffered against 1.94 GB/s with
//! O_DIRECT (decode 2.04 against 5.45 tok/s). So `auto` reads with O_DIRECT exactly when the
//! experts do not fit in the memory the engine itself leaves for the page cache: its budget,
//! or less when the whole model fits in it (a model that fits the engine's budget several
//! times over keeps its page cache, so a fresh process starts warm).
//!
//! Where the experts fit the page cache but the model exceeds the budget, the engine's cache
//! gives experts up and loads them again from the page cache every few tokens. Read
//! buffered, each such load is a kernel copy on the cores the products need; mapped
//! (`--mmap`), it is a page-table update. On DeepSeek-V3's shapes (8 layers, int2, 10 GB
//! budget) a warm load took 6.2 ms buffered against 1.0 ms mapped and decode ran 9-13%
//! faster; with the caches dropped, mapped loads read the device at 0.41 GB/s against
//! buffered's 0.25. So `auto` maps the experts there, unless the shards have copies on
//! several drives (mapped loads read one copy, not the least busy) or `--drop` asks that
//! read pages leave the page cache.

use std::fmt;

use super::args::{IoMode, TierConfig};
use super::ram::{auto_budget, GB};

/// What [`choose_io`] decides from, all in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoFacts {
    /// Every routed expert as stored on disk: what the page cache would have to hold.
    pub expert_bytes: u64,
    /// The engine's RAM budget (dense weights, KV, pinned and cached experts, reserve).
    pub budget: u64,
    /// The dense part and every routed expert as the engine holds them: what it takes of
    /// the budget at most when the budget holds it all.
    pub whole_model: u64,
    /// The tightest memory limit of the process's cgroup, if any: the page cache is charged
    /// to it.
    pub cgroup_limit: Option<u64>,
    /// `MemTotal` (0: unknown).
    pub mem_total: u64,
    /// Whether `auto` may map the experts: each shard has one copy to read (no
    /// `--model-dirs` or `--mirror` to spread the reads over) and `--drop` is off.
    pub mappable: bool,
}

impl IoFacts {
    /// The facts of this machine now for `cfg` (its budget as [`super::ExpertStore::start`]
    /// will compute it), `expert_bytes` on disk and the `whole_model` held.
    pub fn now(cfg: &TierConfig, expert_bytes: u64, whole_model: u64) -> IoFacts {
        let mappable = cfg.model_dirs.len() <= 1 && cfg.mirror.is_none() && !cfg.drop_after;
        let (mem_total, mem_available) = crate::telemetry::meminfo();
        let cgroup_limit = crate::telemetry::cgroup_memory_limit();
        let budget = match cfg.ram_gb {
            Some(g) => (g * GB) as u64,
            None => auto_budget(mem_available, cgroup_limit).0,
        };
        IoFacts {
            expert_bytes,
            budget,
            whole_model,
            cgroup_limit,
            mem_total,
            mappable,
        }
    }

    /// Whether the engine gives experts up and loads them again: the model exceeds its
    /// budget (one the budget holds whole loads each expert once).
    pub fn streams(&self) -> bool {
        self.whole_model > self.budget
    }

    /// What the engine holds at most: its budget, or the whole model when that is less.
    pub fn held(&self) -> u64 {
        self.budget.min(self.whole_model)
    }
}

/// Why the reads use the mode they use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoReason {
    /// The user named the mode (`--direct on|off`, `--mmap`).
    Asked,
    /// `auto`: the experts fit in what the budget leaves of `room` (the cgroup's limit or
    /// MemTotal, whichever is smaller): the page cache can keep them.
    Fits { room: u64, cgroup: bool },
    /// `auto`: the experts exceed what the budget leaves of `room`.
    TooBig { room: u64, cgroup: bool },
    /// `auto`: MemTotal unreadable and no cgroup limit: nothing to judge by, buffered as before.
    Unknown,
}

/// The mode the reads use and why: [`choose_io`]'s answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoChoice {
    /// Never [`IoMode::Auto`].
    pub mode: IoMode,
    pub reason: IoReason,
    pub facts: IoFacts,
}

/// The read mode for `asked` (the option's value): itself unless it is [`IoMode::Auto`], which
/// is O_DIRECT exactly when `expert_bytes > min(cgroup limit, MemTotal) - held` (`held`: the
/// budget, or the whole model when less; the page cache cannot keep the experts beside the
/// engine). Otherwise the page cache keeps them: mapped where the model exceeds the budget and
/// the facts allow it ([`IoFacts::mappable`]), since the engine then loads experts again
/// and again, buffered where it does not (each expert loaded once; the tests' small models).
pub fn choose_io(asked: IoMode, facts: IoFacts) -> IoChoice {
    let answer = |mode, reason| IoChoice {
        mode,
        reason,
        facts,
    };
    if asked != IoMode::Auto {
        return answer(asked, IoReason::Asked);
    }
    let known_total = (facts.mem_total > 0).then_some(facts.mem_total);
    let (memory, cgroup) = match (facts.cgroup_limit, known_total) {
        (Some(l), Some(t)) if t <= l => (t, false),
        (Some(l), _) => (l, true),
        (None, Some(t)) => (t, false),
        (None, None) => return answer(IoMode::Buffered, IoReason::Unknown),
    };
    let room = memory.saturating_sub(facts.held());
    if facts.expert_bytes > room {
        answer(IoMode::Direct, IoReason::TooBig { room, cgroup })
    } else if facts.streams() && facts.mappable {
        answer(IoMode::Mmap, IoReason::Fits { room, cgroup })
    } else {
        answer(IoMode::Buffered, IoReason::Fits { room, cgroup })
    }
}

impl IoChoice {
    /// Whether the dense matrices may be read in place from the page cache beside these
    /// expert reads (`weights::in_place`): not when the experts stream through the page cache
    /// (read buffered or mapped while the model exceeds the budget), whose fresh pages push
    /// the dense ones out so that tokens read them from disk again. O_DIRECT reads leave the
    /// page cache alone, and a model the budget holds whole reads each expert once.
    pub fn keeps_dense_pages(&self) -> bool {
        self.mode == IoMode::Direct
            || self.facts.expert_bytes == 0
            || self.facts.whole_model <= self.facts.budget
    }

    /// Why [`IoChoice::keeps_dense_pages`] said no, for the load's log line.
    pub fn why_dense_is_copied(&self) -> String {
        use crate::engine::facts::bytes;
        format!(
            "expert reads {} stream through the page cache (the model {} over its {} budget), \
             whose pages would evict them; --direct on keeps them in place",
            self.mode.label(),
            bytes(self.facts.whole_model),
            bytes(self.facts.budget)
        )
    }
}

impl IoMode {
    /// How the reads are named in the `[IO]` and `[PROF]` lines.
    pub fn label(self) -> &'static str {
        match self {
            IoMode::Auto => "auto",
            IoMode::Buffered => "buffered",
            IoMode::Direct => "O_DIRECT",
            IoMode::Mmap => "mmap",
        }
    }
}

impl fmt::Display for IoChoice {
    /// The start line's mode and reason, e.g. `O_DIRECT (auto: experts 7.00 GB on disk, page
    /// cache room 399.60 MB = the cgroup's memory limit 3.33 GB - 2.93 GB held (its budget))`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use crate::engine::facts::bytes;
        let facts = &self.facts;
        write!(f, "{}", self.mode.label())?;
        let (room, cgroup, cmp) = match self.reason {
            IoReason::Asked if self.mode == IoMode::Mmap => return write!(f, " (--mmap)"),
            IoReason::Asked if self.mode == IoMode::Direct => return write!(f, " (--direct on)"),
            IoReason::Asked => return write!(f, " (--direct off)"),
            IoReason::Unknown => {
                return write!(f, " (auto: MemTotal unknown and no cgroup memory limit)")
            }
            IoReason::TooBig { room, cgroup } => (room, cgroup, ">"),
            IoReason::Fits { room, cgroup } => (room, cgroup, "<="),
        };
        let memory = match (cgroup, facts.cgroup_limit) {
            (true, Some(l)) => format!("the cgroup's memory limit {}", bytes(l)),
            _ => format!("MemTotal {}", bytes(facts.mem_total)),
        };
        write!(
            f,
            " (auto: experts {} on disk {cmp} page cache room {} = {memory} - {} held ({}){})",
            bytes(facts.expert_bytes),
            bytes(room),
            bytes(facts.held()),
            if facts.whole_model < facts.budget {
                format!("the whole model, under its {} budget", bytes(facts.budget))
            } else {
                "its budget".to_string()
            },
            if self.mode == IoMode::Mmap {
                format!(
                    "; the model {} exceeds it, so experts are loaded again and again: mapped, \
                     not copied",
                    bytes(facts.whole_model)
                )
            } else {
                String::new()
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1_000_000_000;

    /// Facts for a model of `expert_bytes` experts and 1 GB of dense weights.
    fn facts(expert_bytes: u64, budget: u64, cgroup_limit: Option<u64>, mem_total: u64) -> IoFacts {
        IoFacts {
            expert_bytes,
            budget,
            whole_model: expert_bytes + G,
            cgroup_limit,
            mem_total,
            mappable: true,
        }
    }

    /// The dense part stays in the page cache's pages unless the experts stream through it:
    /// read buffered or mapped while the model exceeds the budget (DeepSeek-V3's 8 layers in a
    /// 10 GB budget, read buffered, the measured case).
    #[test]
    fn dense_pages_stay_unless_experts_stream_through_the_page_cache() {
        let streaming = facts(14 * G, 10 * G, None, 25 * G);
        let whole = facts(6 * G, 10 * G, None, 25 * G);
        let no_experts = IoFacts {
            expert_bytes: 0,
            whole_model: 30 * G,
            ..whole
        };
        for (asked, f, keeps) in [
            (IoMode::Buffered, streaming, false),
            (IoMode::Mmap, streaming, false),
            (IoMode::Direct, streaming, true),
            (IoMode::Buffered, whole, true),
            (IoMode::Mmap, whole, true),
            (IoMode::Buffered, no_experts, true),
        ] {
            let c = choose_io(asked, f);
            assert_eq!(c.keeps_dense_pages(), keeps, "{asked:?} {f:?}");
        }
        // `auto` on the measured case: 14 GB of experts fit the 15 GB left beside the budget,
        // so it maps them, and the dense part is copied.
        let c = choose_io(IoMode::Auto, streaming);
        assert_eq!(c.mode, IoMode::Mmap);
        assert!(!c.keeps_dense_pages());
        assert!(
            c.why_dense_is_copied().contains("mmap"),
            "{}",
            c.why_dense_is_copied()
        );
    }

    /// Where the experts fit the page cache, `auto` maps them exactly when the model exceeds
    /// the budget (the measured case: DeepSeek-V3's 8 layers, 14.15 GB of experts, in a 10 GB
    /// budget on 25.28 GB), and only with one copy of the shards and no `--drop`; a model the
    /// budget holds stays buffered, one byte over it is mapped.
    #[test]
    fn experts_that_fit_the_page_cache_are_mapped_when_the_model_streams() {
        let ds = IoFacts {
            expert_bytes: 14_150_000_000,
            budget: 10 * G,
            whole_model: 18_950_000_000,
            cgroup_limit: None,
            mem_total: 25_280_000_000,
            mappable: true,
        };
        let c = choose_io(IoMode::Auto, ds);
        assert_eq!(
            (c.mode, c.reason),
            (
                IoMode::Mmap,
                IoReason::Fits {
                    room: 15_280_000_000,
                    cgroup: false
                }
            )
        );
        assert_eq!(
            c.to_string(),
            "mmap (auto: experts 14.15 GB on disk <= page cache room 15.28 GB = MemTotal 25.28 GB \
             - 10.00 GB held (its budget); the model 18.95 GB exceeds it, so experts are loaded \
             again and again: mapped, not copied)"
        );
        // Copies on several drives, or --drop: buffered, as before.
        let one_copy_only = IoFacts {
            mappable: false,
            ..ds
        };
        assert_eq!(
            choose_io(IoMode::Auto, one_copy_only).mode,
            IoMode::Buffered
        );
        // The budget's edge: the whole model held is buffered, one byte more is mapped.
        let at = IoFacts {
            whole_model: ds.budget,
            ..ds
        };
        assert_eq!(choose_io(IoMode::Auto, at).mode, IoMode::Buffered);
        let over = IoFacts {
            whole_model: ds.budget + 1,
            ..ds
        };
        assert_eq!(choose_io(IoMode::Auto, over).mode, IoMode::Mmap);
        // Experts past the room read with O_DIRECT whatever else holds.
        let big = IoFacts {
            expert_bytes: 15_280_000_001,
            ..ds
        };
        assert_eq!(choose_io(IoMode::Auto, big).mode, IoMode::Direct);
    }

    /// A named mode is kept whatever the machine.
    #[test]
    fn a_named_mode_is_kept() {
        let tight = facts(100 * G, 20 * G, Some(4 * G), 24 * G);
        let roomy = facts(G, 2 * G, None, 24 * G);
        for asked in [IoMode::Buffered, IoMode::Direct, IoMode::Mmap] {
            for f in [tight, roomy] {
                let c = choose_io(asked, f);
                assert_eq!((c.mode, c.reason), (asked, IoReason::Asked), "{f:?}");
            }
        }
    }

    /// In a cgroup the room is its limit less what the engine holds: the measured case (a
    /// 20-layer Qwen3-30B shape, about 7 GB of experts, in a 3.33 GB cgroup, the engine holding
    /// its whole 2.93 GB budget) reads with O_DIRECT; at the boundary the experts exactly fill
    /// the room and stay buffered, one byte more does not.
    #[test]
    fn a_cgroup_too_small_for_the_experts_reads_around_the_page_cache() {
        let limit = 3_330_000_000;
        let budget = (limit as f64 * 0.88) as u64;
        let c = choose_io(IoMode::Auto, facts(7 * G, budget, Some(limit), 24 * G));
        let room = limit - budget;
        assert_eq!(c.mode, IoMode::Direct);
        assert_eq!(c.reason, IoReason::TooBig { room, cgroup: true });
        assert_eq!(
            c.to_string(),
            "O_DIRECT (auto: experts 7.00 GB on disk > page cache room 399.60 MB = the cgroup's \
             memory limit 3.33 GB - 2.93 GB held (its budget))"
        );
        // A model bigger than the budget, its experts exactly the room, then one byte more.
        let edge = |experts| IoFacts {
            whole_model: u64::MAX,
            ..facts(experts, budget, Some(limit), 24 * G)
        };
        let at = choose_io(IoMode::Auto, edge(room));
        assert_eq!(at.mode, IoMode::Mmap);
        assert_eq!(at.reason, IoReason::Fits { room, cgroup: true });
        assert_eq!(choose_io(IoMode::Auto, edge(room + 1)).mode, IoMode::Direct);
    }

    /// A budget above the cgroup's limit leaves the page cache nothing: a model bigger than
    /// the limit reads with O_DIRECT.
    #[test]
    fn a_budget_over_the_limit_leaves_no_room() {
        let c = choose_io(IoMode::Auto, facts(5 * G, 6 * G, Some(4 * G), 24 * G));
        assert_eq!(
            c.reason,
            IoReason::TooBig {
                room: 0,
                cgroup: true
            }
        );
        assert_eq!(c.mode, IoMode::Direct);
    }

    /// A model the budget holds whole takes only its own size: the 8 GB medium model under a
    /// 20 GB budget on a 24 GB machine leaves the page cache 15 GB and stays buffered (a fresh
    /// process then starts warm); a 16 GB one leaves 7 GB and reads with O_DIRECT. Without a
    /// cgroup, or with one looser than the machine, MemTotal bounds the room.
    #[test]
    fn without_a_binding_cgroup_memtotal_bounds_the_page_cache() {
        for limit in [None, Some(64 * G), Some(24 * G)] {
            let fits = choose_io(IoMode::Auto, facts(8 * G, 20 * G, limit, 24 * G));
            assert_eq!(fits.mode, IoMode::Buffered, "{limit:?}");
            let room = 15 * G;
            assert_eq!(
                fits.reason,
                IoReason::Fits {
                    room,
                    cgroup: false
                }
            );
            assert_eq!(
                fits.to_string(),
                "buffered (auto: experts 8.00 GB on disk <= page cache room 15.00 GB = MemTotal \
                 24.00 GB - 9.00 GB held (the whole model, under its 20.00 GB budget))"
            );
            let big = choose_io(IoMode::Auto, facts(16 * G, 20 * G, limit, 24 * G));
            assert_eq!(big.mode, IoMode::Direct, "{limit:?}");
            assert_eq!(
                big.reason,
                IoReason::TooBig {
                    room: 7 * G,
                    cgroup: false
                }
            );
            // The boundary, the budget binding: experts equal to the room stay in the page
            // cache (mapped: the 13 GB model exceeds its 12 GB budget).
            let at = choose_io(IoMode::Auto, facts(12 * G, 12 * G, limit, 24 * G));
            assert_eq!(at.mode, IoMode::Mmap, "{limit:?}");
            let over = choose_io(IoMode::Auto, facts(12 * G + 1, 12 * G, limit, 24 * G));
            assert_eq!(over.mode, IoMode::Direct, "{limit:?}");
        }
        // A model bigger than the machine, whatever the budget.
        let huge = choose_io(IoMode::Auto, facts(60 * G, G, None, 24 * G));
        assert_eq!(huge.mode, IoMode::Direct);
    }

    /// A cgroup tighter than MemTotal binds even when MemTotal is unknown; with neither, the
    /// reads stay buffered (nothing to judge by).
    #[test]
    fn unknown_memory() {
        let c = choose_io(IoMode::Auto, facts(3 * G, G, Some(2 * G), 0));
        // Held: the 1 GB budget (the model is 4 GB).
        assert_eq!(
            c.reason,
            IoReason::TooBig {
                room: G,
                cgroup: true
            }
        );
        let c = choose_io(IoMode::Auto, facts(100 * G, G, None, 0));
        assert_eq!((c.mode, c.reason), (IoMode::Buffered, IoReason::Unknown));
    }
}
