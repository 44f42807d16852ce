//! Prefill then step-by-step decode over a KV cache, pushing each token into a sink.
//!
//! The engine never sees stdout: the serve loop's sink writes protocol frames, `run` writes
//! raw bytes, `validate` collects ids, and a sink that returns `false` stops the turn.

use std::time::Instant;

use crate::error::EngineError;
use crate::model::{KvCache, Logits, Model};
use crate::sampling::Sampler;

pub trait TokenSink {
    /// Receives one generated (non-stop) token; `Ok(false)` ends the generation.
    fn token(&mut self, id: u32) -> Result<bool, EngineError>;

    /// Prefill progress: `done` of `total` prompt tokens are in the cache.
    fn prefill_progress(&mut self, _done: usize, _total: usize) {}
}

/// Prompt tokens per prefill forward. Bounds the batch working set (activations, per-expert
/// products, the k/v reconstruction) whatever the prompt length, and gives progress ticks.
pub const PREFILL_CHUNK: usize = 256;

/// Feeds `tokens` after what `kv` holds, in chunks of `PREFILL_CHUNK`, and leaves the logits
/// of the last one in `logits`.
pub fn prefill(
    model: &Model,
    kv: &mut KvCache,
    tokens: &[u32],
    sink: &mut dyn TokenSink,
    logits: &mut Vec<f32>,
) -> Result<(), EngineError> {
    let mut done = 0;
    for chunk in tokens.chunks(PREFILL_CHUNK) {
        model.forward_into(kv, chunk, Logits::Last, logits)?;
        done += chunk.len();
        sink.prefill_progress(done, tokens.len());
    }
    Ok(())
}

/// Collects ids (validate, tests).
impl TokenSink for Vec<u32> {
    fn token(&mut self, id: u32) -> Result<bool, EngineError> {
        self.push(id);
        Ok(true)
    }
}

#[derive(Clone, Debug, Default)]
pub struct GenStats {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub prefill_s: f64,
    pub decode_s: f64,
    /// Generation stopped because it reached `max_new` (not a stop token or the sink).
    pub length_limited: bool,
    /// The last emitted token when it was not fed back into the cache (the turn ended on the
    /// token limit or by the sink): the next turn must feed it first.
    pub unfed: Option<u32>,
}

impl GenStats {
    pub fn decode_tok_s(&self) -> f64 {
        if self.decode_s > 0.0 {
            self.completion_tokens.saturating_sub(1) as f64 / self.decode_s
        } else {
            0.0
        }
    }

    /// Completion tokens over the whole turn, prefill included (upstream's STAT tok/s).
    pub fn turn_tok_s(&self) -> f64 {
        let t = self.prefill_s + self.decode_s;
        if t > 0.0 {
            self.completion_tokens as f64 / t
        } else {
            0.0
        }
    }
}

/// Feeds `prompt` after what `kv` already holds, then samples up to `max_new` tokens. Stop
/// tokens end the turn and are not passed to the sink. The last sampled token is not fed back
/// (it has no successor yet), so `kv.tokens` stays the exact history of fed tokens.
///
/// The cache and the model's working memory are sized for the whole turn up front, so the
/// decode loop (forward, sample) does not allocate.
pub fn generate(
    model: &Model,
    kv: &mut KvCache,
    prompt: &[u32],
    max_new: usize,
    stops: &[u32],
    sampler: &mut Sampler,
    sink: &mut dyn TokenSink,
) -> Result<GenStats, EngineError> {
    let mut stats = GenStats {
        prompt_tokens: prompt.len(),
        ..Default::default()
    };
    let t0 = Instant::now();
    // The turn never runs past the model's context (the caller clamps `max_new`; `run` may
    // pass a huge one), and a reservation is address space until a step reaches it.
    let fed = kv.len() + prompt.len();
    let limit = model.cfg.max_position_embeddings.max(fed);
    model.reserve(kv, fed.saturating_add(max_new).min(limit));
    let mut logits = Vec::with_capacity(model.cfg.vocab_size);
    prefill(model, kv, prompt, sink, &mut logits)?;
    stats.prefill_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    while stats.completion_tokens < max_new {
        let tok = sampler.sample(&logits);
        if stops.contains(&tok) {
            break;
        }
        stats.completion_tokens += 1;
        if !sink.token(tok)? {
            stats.unfed = Some(tok);
            break;
        }
        if stats.completion_tokens == max_new {
            stats.length_limited = true;
            stats.unfed = Some(tok);
            break;
        }
        model.forward_into(kv, &[tok], Logits::Last, &mut logits)?;
    }
    stats.decode_s = t1.elapsed().as_secs_f64();
    Ok(stats)
}
