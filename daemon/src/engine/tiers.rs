//! What the expert store needs to know about the rest of memory before it places experts:
//! computed here, from the model, so `experts` never reaches up into `model`.

use std::path::PathBuf;

use crate::experts::TierStart;
use crate::model::Model;

/// The tier start for `model` serving `sessions` sessions of `ctx` tokens: dense bytes, the
/// KV pool of every session and the k/v reconstruction buffer count against the RAM budget.
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
        kv_pool: (sessions * ctx * model.new_cache().bytes_per_position()) as u64,
        kvb: (ctx * c.kvb_bytes_per_position()) as u64,
        progress: None,
    }
}
