//! `--pilot auto` (the command line's default): whether the pilot reads guesses ahead.
//!
//! The pilot only pays when decoding reads experts from disk: its guesses hide those reads
//! behind the layer before. On real shapes streamed from disk it decoded 1.36x faster cold on
//! GLM-4.5-Air (46 layers, int3, 21.5 GB budget), 1.17x on Qwen3-30B-A3B (int4, 8 GB) and
//! level (1.02x) on DeepSeek-V3 (8 layers, int2, 10 GB), where the dense part binds. When every
//! routed expert fits the RAM the tiers give them there is nothing to hide after the first
//! tokens, and without an I/O pool (`--pipe 0`) there is no worker to read a guess on. So
//! `auto` is on exactly when the budget split of [`super::ExpertStore::start`] (its pinned set
//! and its LRU cap) leaves some routed expert to be read from disk, and there is a pool.

use std::fmt;

use super::args::PilotMode;

/// What [`choose_pilot`] decides from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PilotFacts {
    /// Routed experts of the model (every sparse layer's).
    pub experts: u64,
    /// Of them, those the tiers hold at once: pinned, in VRAM, or in a layer's LRU slots.
    pub held: u64,
    /// Of the held ones, those in VRAM (the rest are in RAM).
    pub in_vram: u64,
    /// Resident bytes of one expert (the widest).
    pub expert_bytes: u64,
    /// I/O workers (`--pipe`; 0: none).
    pub pipe: usize,
}

/// Why the pilot is on or off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PilotReason {
    /// The user named it (`--pilot on|off`).
    Asked,
    /// `auto`: some experts are not held, so decoding reads them from disk.
    Streams,
    /// `auto`: every routed expert is held: nothing to read ahead.
    AllHeld,
    /// `auto`: no I/O pool to read guesses on (`--pipe 0`).
    NoPipe,
}

/// Whether the pilot reads guesses ahead, and why: [`choose_pilot`]'s answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PilotChoice {
    pub on: bool,
    pub reason: PilotReason,
    pub facts: PilotFacts,
}

/// The pilot for `asked`: `on` and `off` as asked (`on` still needs the I/O pool its
/// option implies); `auto` on exactly when there is a pool and `held < experts`.
pub fn choose_pilot(asked: PilotMode, facts: PilotFacts) -> PilotChoice {
    let (on, reason) = match asked {
        PilotMode::On => (facts.pipe > 0, PilotReason::Asked),
        PilotMode::Off => (false, PilotReason::Asked),
        PilotMode::Auto if facts.pipe == 0 => (false, PilotReason::NoPipe),
        PilotMode::Auto if facts.held >= facts.experts => (false, PilotReason::AllHeld),
        PilotMode::Auto => (true, PilotReason::Streams),
    };
    PilotChoice { on, reason, facts }
}

impl fmt::Display for PilotChoice {
    /// The start line's decision and reason, e.g. `auto: on: routed experts 45.10 GB, 8.50 GB
    /// of them held in RAM (1920 of 11776): the rest are read from disk while decoding`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use crate::engine::facts::bytes;
        let p = &self.facts;
        let state = if self.on { "on" } else { "off" };
        let total = bytes(p.experts * p.expert_bytes);
        let in_ram = bytes(p.held.saturating_sub(p.in_vram) * p.expert_bytes);
        let vram = match p.in_vram {
            0 => String::new(),
            n => format!(" and {n} in VRAM"),
        };
        match self.reason {
            PilotReason::Asked => write!(f, "{state} (--pilot {state})"),
            PilotReason::NoPipe => write!(f, "auto: off: no I/O pool to read guesses on (--pipe 0)"),
            PilotReason::AllHeld => write!(
                f,
                "auto: off: every routed expert ({total}) is held in RAM{vram}: nothing to read ahead"
            ),
            PilotReason::Streams => write!(
                f,
                "auto: on: routed experts {total}, {in_ram} of them held in RAM{vram} ({} of {}): \
                 the rest are read from disk while decoding",
                p.held, p.experts
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(experts: u64, held: u64, pipe: usize) -> PilotFacts {
        PilotFacts {
            experts,
            held,
            in_vram: 0,
            expert_bytes: 10_000_000,
            pipe,
        }
    }

    /// `auto` is on exactly when some expert is not held and there is a pool: one expert
    /// short of all turns it on, all held (or more slots than experts) turns it off, and
    /// `--pipe 0` keeps it off whatever the split.
    #[test]
    fn auto_is_on_exactly_when_decoding_reads_from_disk() {
        let auto = |f| choose_pilot(PilotMode::Auto, f);
        let c = auto(facts(1536, 1535, 4));
        assert!(c.on);
        assert_eq!(c.reason, PilotReason::Streams);
        let line = c.to_string();
        assert!(
            line.starts_with("auto: on: routed experts 15.36 GB"),
            "{line}"
        );
        assert!(
            line.contains("15.35 GB of them held in RAM (1535 of 1536)"),
            "{line}"
        );
        for held in [1536, 2000] {
            let c = auto(facts(1536, held, 4));
            assert!(!c.on, "{held}");
            assert_eq!(c.reason, PilotReason::AllHeld);
            assert!(
                c.to_string().starts_with("auto: off: every routed expert"),
                "{c}"
            );
        }
        for held in [0, 100, 1536] {
            let c = auto(facts(1536, held, 0));
            assert!(!c.on, "{held}");
            assert_eq!(c.reason, PilotReason::NoPipe);
            assert!(c.to_string().contains("--pipe 0"), "{c}");
        }
    }

    /// `on` and `off` are what was asked, whatever the split (`on` with a pool).
    #[test]
    fn asked_modes_are_kept() {
        for held in [0, 1536] {
            let on = choose_pilot(PilotMode::On, facts(1536, held, 2));
            assert_eq!((on.on, on.reason), (true, PilotReason::Asked));
            assert_eq!(on.to_string(), "on (--pilot on)");
            let off = choose_pilot(PilotMode::Off, facts(1536, held, 2));
            assert_eq!((off.on, off.reason), (false, PilotReason::Asked));
        }
        assert!(!choose_pilot(PilotMode::On, facts(1536, 0, 0)).on);
    }

    /// Experts in VRAM count as held (they are never read from disk) and are named apart.
    #[test]
    fn vram_experts_count_as_held() {
        let f = PilotFacts {
            in_vram: 36,
            ..facts(1536, 1536, 4)
        };
        let c = choose_pilot(PilotMode::Auto, f);
        assert!(!c.on);
        assert!(c.to_string().contains("and 36 in VRAM"), "{c}");
    }
}
