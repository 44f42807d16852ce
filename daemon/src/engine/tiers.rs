//! What the expert store needs to know about the rest of memory before it places experts:
//! computed here, from the model, so `experts` never reaches up into `model`.

use std::path::PathBuf;

use crate::experts::TierStart;
use crate::model::Model;

/// The tier start for `model` serving `sessions` sessions of `ctx` tokens: dense bytes, the
/// KV pool of every session (recurrent states and their saved copies for the drafts it was
/// loaded for included) and the k/v reconstruction buffer count against the RAM budget.
pub fn tier_start<'a>(
    model: &Model,
    sessions: usize,
    ctx: usize,
    usage_path: Option<PathBuf>,
) -> TierStart<'a> {
    let c = &model.cfg;
    TierStart {
        usage_path,
        weights: None,
        dense_bytes: model.dense_bytes() as u64,
        kv_pool: kv_pool(model, sessions, ctx, model.opts.draft),
        kvb: (ctx * c.kvb_bytes_per_position()) as u64,
        prefill_row_bytes: crate::model::batch_row_bytes(c),
        progress: None,
    }
}

/// Bytes the caches of `sessions` sessions of `ctx` tokens may take at most.
pub fn kv_pool(model: &Model, sessions: usize, ctx: usize, max_draft: usize) -> u64 {
    (sessions * model.new_cache().session_bytes(ctx, max_draft)) as u64
}
