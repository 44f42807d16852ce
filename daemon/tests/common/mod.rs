//! Shared by the engine-level tests: running batched turns to their end.

use std::path::PathBuf;

use colibri::engine::{Engine, Event, StepReport, TurnSpec};
use colibri::experts::TierConfig;
use colibri::model::{ActMode, LoadOptions};
use colibri::quant::QFormat;
use colibri::sampling::Sampler;

/// Begins `turns[i]` (prompt, tokens to generate, sampler; stop tokens ignored) on slot `i` and
/// steps the batch until every turn ended: the tokens each slot emitted.
pub fn run_to_end(engine: &mut Engine, turns: Vec<(Vec<u32>, usize, Sampler)>) -> Vec<Vec<u32>> {
    let slots = turns.len();
    for (i, (prompt, max_new, sampler)) in turns.into_iter().enumerate() {
        engine
            .begin(
                i,
                TurnSpec {
                    use_stops: false,
                    ..TurnSpec::new(prompt, max_new, sampler)
                },
            )
            .unwrap();
    }
    let mut out = vec![Vec::new(); slots];
    let mut report = StepReport::default();
    while engine.any_active() {
        engine.step(&mut report).unwrap();
        for e in &report.events {
            if let Event::Token { slot, id } = e {
                out[*slot].push(*id);
            }
        }
    }
    out
}

/// The fixture folder `name` (tests/fixtures).
#[allow(dead_code)]
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

/// Four sessions of the model in `dir` (int8 dense weights and activations, `expert_bits`
/// experts, `tiers`, a context of `ctx`) decoded together to the end: their tokens, and the
/// engine.
#[allow(dead_code)]
pub fn run_batch(
    dir: PathBuf,
    tiers: TierConfig,
    expert_bits: QFormat,
    ctx: usize,
) -> (Vec<Vec<u32>>, Engine) {
    let opts = LoadOptions {
        expert_fmt: expert_bits,
        dense_fmt: QFormat::I8Row,
        act: ActMode::Int8,
        tiers,
        ..LoadOptions::default()
    };
    let mut engine = Engine::open(vec![dir], opts).unwrap();
    engine.start_sessions(4, ctx, None, false, None).unwrap();
    let prompts: [&[u32]; 4] = [&[5, 9, 14, 2], &[7, 7, 7], &[21, 3, 8, 40, 11], &[1]];
    let turns = (prompts.iter().enumerate())
        .map(|(i, p)| (p.to_vec(), 12 + 3 * i, Sampler::greedy()))
        .collect();
    let out = run_to_end(&mut engine, turns);
    (out, engine)
}
