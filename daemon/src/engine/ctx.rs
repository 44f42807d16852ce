//! The default context of `serve` and `api`: the model's own (`max_position_embeddings`),
//! bounded by what the sessions' KV may take of the RAM budget. A fixed 4096 refused the long
//! prompts of coding agents on models made for 128k; the whole of a 128k context for 8
//! sessions, on the other hand, would reserve the budget the expert cache lives on.

/// The share of the RAM budget the KV pool (every session's full context) may take when
/// `--ctx` is not given: a quarter leaves three quarters to the dense weights and the
/// expert cache, which is what decode speed depends on. `--ctx` overrides it.
pub const KV_SHARE: f64 = 0.25;

/// Below this the bound does not go (upstream's fixed default, and what the RAM plan always
/// took), unless the model itself holds fewer positions.
pub const FLOOR: usize = 4096;

/// A bounded context is a multiple of this (whole attention blocks, a round figure).
const STEP: usize = 256;

/// The chosen context and why, for the start line.
#[derive(Clone, Debug, PartialEq)]
pub struct CtxChoice {
    pub ctx: usize,
    pub why: String,
}

/// `given` (`--ctx`) as is; otherwise the model's `model_max` positions, lowered to what
/// `sessions` KV pools of `per_pos` bytes a position fit in [`KV_SHARE`] of `budget` bytes
/// (not below [`FLOOR`] or the model's maximum, whichever is less).
pub fn choose(
    given: Option<u32>,
    model_max: usize,
    sessions: usize,
    per_pos: usize,
    budget: u64,
) -> CtxChoice {
    let gb = |b: f64| b / 1e9;
    if let Some(c) = given {
        return CtxChoice {
            ctx: c as usize,
            why: format!("--ctx; model max {model_max}"),
        };
    }
    let share = budget as f64 * KV_SHARE;
    let per_ctx_pos = (sessions.max(1) * per_pos.max(1)) as f64;
    let fits = ((share / per_ctx_pos) as usize) / STEP * STEP;
    let floor = FLOOR.min(model_max);
    let ctx = model_max.min(fits).max(floor);
    let pool = ctx as f64 * per_ctx_pos;
    let why = if ctx == model_max {
        format!(
            "model max {model_max}; KV {:.1} GB of {:.1} GB RAM budget",
            gb(pool),
            gb(budget as f64)
        )
    } else {
        format!(
            "model max {model_max}, bounded by KV RAM {:.1} GB of {:.1} GB budget ({}% for the KV; --ctx to choose)",
            gb(pool),
            gb(budget as f64),
            (KV_SHARE * 100.0) as u32
        )
    };
    CtxChoice { ctx, why }
}

/// The RAM budget the tiers will use: `--ram-gb`, else their default from the memory at
/// start (the same function, without its warning, which the tier start prints).
pub fn ram_budget(ram_gb: Option<f64>) -> u64 {
    match ram_gb {
        Some(g) => (g * 1e9) as u64,
        None => {
            let avail = crate::telemetry::meminfo().1;
            let limit = crate::telemetry::cgroup_memory_limit();
            crate::experts::ram::auto_budget(avail, limit).0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_max_when_its_kv_fits_the_share() {
        // 8 sessions x 131072 x 1 kB = 1.07 GB, under a quarter of 24 GB.
        let c = choose(None, 131072, 8, 1000, 24_000_000_000);
        assert_eq!(c.ctx, 131072);
        assert!(c.why.starts_with("model max 131072"), "{}", c.why);
    }

    #[test]
    fn bounded_by_the_kv_share_in_whole_steps() {
        // A quarter of 24 GB over 8 sessions of 100 kB a position: 7500 positions, so 7424.
        let c = choose(None, 131072, 8, 100_000, 24_000_000_000);
        assert_eq!(c.ctx, 7424);
        assert!(
            c.why.contains("bounded by KV RAM 5.9 GB of 24.0 GB"),
            "{}",
            c.why
        );
    }

    #[test]
    fn never_below_the_old_default_nor_above_the_model() {
        assert_eq!(choose(None, 131072, 512, 100_000, 1_000_000_000).ctx, 4096);
        assert_eq!(choose(None, 256, 512, 100_000, 1_000_000_000).ctx, 256);
        assert_eq!(choose(Some(64), 131072, 1, 1, 1).ctx, 64);
    }
}
