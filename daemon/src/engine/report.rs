//! The telemetry a finished request reports (TIERS, EMAP, HITS, PROF, DISK-CLASS, SPEC, REPIN): one
//! builder for the legacy protocol's telemetry channel and the multiplexed protocol's
//! per-request block.

use protocol::{Spec, SpecSource, Telemetry, Tiers};

use crate::engine::spec::{DraftSource, SpecCounts};
use crate::engine::Engine;
use crate::experts::Snapshot;
use crate::model::profile::{ProfileSnapshot, Stage};

/// The store's and the profile's counters, and the request's session's speculation
/// counters, when a request (or a window) began.
pub struct Baseline {
    experts: Snapshot,
    stages: ProfileSnapshot,
    slot: usize,
    spec: SpecCounts,
}

impl Baseline {
    pub fn now(engine: &Engine, slot: usize) -> Baseline {
        Baseline {
            experts: engine.experts().snapshot(),
            stages: engine.profile().snapshot(),
            slot,
            spec: slot_counts(engine, slot),
        }
    }
}

fn slot_counts(engine: &Engine, slot: usize) -> SpecCounts {
    engine
        .sessions()
        .get(slot)
        .map(|s| s.spec.counts)
        .unwrap_or_default()
}

/// The `SPEC` figures of `base`'s session since `base`.
pub fn spec_since(engine: &Engine, base: &Baseline) -> Spec {
    let c = slot_counts(engine, base.slot).since(&base.spec);
    let source = |src: DraftSource| SpecSource {
        proposed: c.proposed[src.index()],
        accepted: c.accepted[src.index()],
    };
    Spec {
        slot: base.slot as u32,
        tokens: c.tokens,
        forwards: c.forwards,
        max_draft: engine.spec.max_draft as u32,
        drafting_forwards: c.drafting_forwards,
        mtp: source(DraftSource::Mtp),
        ngram: source(DraftSource::NGram),
        grammar: SpecSource {
            proposed: c.forced_proposed,
            accepted: c.forced_accepted,
        },
    }
}

pub fn tiers(engine: &Engine) -> Tiers {
    let experts = engine.experts();
    let total = (experts.n_sparse() * experts.n_experts()) as u32;
    let (resident, bytes) = experts.resident();
    Tiers {
        vram_experts: 0,
        ram_experts: resident as u32,
        disk_experts: total.saturating_sub(resident as u32),
        vram_gb: 0.0,
        ram_gb: bytes as f64 / 1e9,
    }
}

/// The end-of-request block since `base`: TIERS, EMAP, HITS (which clears the hit map), PROF
/// over `wall` seconds, DISK-CLASS, SPEC.
pub fn turn_block(
    engine: &Engine,
    base: &Baseline,
    wall: f64,
    prompt_tokens: u32,
    completion_tokens: u32,
) -> Vec<Telemetry> {
    let experts = &engine.experts();
    let mut prof =
        experts
            .snapshot()
            .since(&base.experts)
            .prof(wall, prompt_tokens, completion_tokens);
    let stages = engine.profile().snapshot();
    prof.attention_s = stages.get(Stage::Attention) - base.stages.get(Stage::Attention);
    prof.lm_head_s = stages.get(Stage::LmHead) - base.stages.get(Stage::LmHead);
    vec![
        Telemetry::Tiers(tiers(engine)),
        Telemetry::Emap(experts.emap()),
        Telemetry::Hits(experts.take_hits()),
        Telemetry::Prof(prof),
        Telemetry::DiskClass(experts.disk_class()),
        Telemetry::Spec(spec_since(engine, base)),
    ]
}
