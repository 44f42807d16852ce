//! Shared by the engine-level tests: running batched turns to their end.

use colibri::engine::{Engine, Event, StepReport, TurnSpec};
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
