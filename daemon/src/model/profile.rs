//! Where the forward's time goes: nanoseconds per stage, summed across calls. Counters are
//! atomics so the model stays `&self` during a forward.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Attention,
    DenseMlp,
    Moe,
    LmHead,
    Other,
}

const STAGES: [Stage; 5] = [
    Stage::Attention,
    Stage::DenseMlp,
    Stage::Moe,
    Stage::LmHead,
    Stage::Other,
];

#[derive(Default)]
pub struct Profile {
    ns: [AtomicU64; 5],
}

#[derive(Clone, Copy, Debug, Default)]
pub struct ProfileSnapshot {
    pub secs: [f64; 5],
}

impl Profile {
    pub fn add(&self, stage: Stage, since: Instant) {
        self.ns[stage as usize].fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    pub fn reset(&self) {
        for n in &self.ns {
            n.store(0, Ordering::Relaxed);
        }
    }

    pub fn snapshot(&self) -> ProfileSnapshot {
        let mut s = ProfileSnapshot::default();
        for (i, n) in self.ns.iter().enumerate() {
            s.secs[i] = n.load(Ordering::Relaxed) as f64 / 1e9;
        }
        s
    }
}

impl ProfileSnapshot {
    pub fn get(&self, stage: Stage) -> f64 {
        self.secs[stage as usize]
    }

    /// `attention 1.2s (40%) | dense-mlp ... | moe ... | lm_head ... | other ...` over `wall`.
    pub fn describe(&self, wall: f64) -> String {
        let named: f64 = self.secs.iter().sum();
        let other = self.get(Stage::Other) + (wall - named).max(0.0);
        STAGES
            .iter()
            .map(|&s| {
                let v = if s == Stage::Other {
                    other
                } else {
                    self.get(s)
                };
                let name = match s {
                    Stage::Attention => "attention",
                    Stage::DenseMlp => "dense-mlp",
                    Stage::Moe => "moe (router+experts)",
                    Stage::LmHead => "lm_head",
                    Stage::Other => "other",
                };
                format!("{name} {v:.3}s ({:.0}%)", 100.0 * v / wall.max(1e-9))
            })
            .collect::<Vec<_>>()
            .join(" | ")
    }
}
