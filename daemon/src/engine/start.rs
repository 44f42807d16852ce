//! The daemons' start-up, which the legacy/mux front (`serve`) and the HTTP front (`api`)
//! share: the telemetry channel, the state folder and its lock (refused before any load when
//! another daemon holds it), the model facts line, then the engine with its sessions and the
//! prefix cache. Engine-side so that both fronts sit on it side by side, neither importing
//! the other.

use std::path::{Path, PathBuf};

use protocol::{EngineState, Progress, ProgressPhase, Telemetry};

use super::{ctx, facts::ModelFacts, state, Engine, PrefixCacheOptions};
use crate::error::EngineError;
use crate::model::LoadOptions;
use crate::telemetry::TelemetryOut;

/// Where the model comes from: the command line's model options (`cli::ModelArgs`). A trait,
/// not the values, because start-up asks for them in an order the fronts' messages depend on:
/// the directories after the LOADING state is sent (the demo model is written then), the load
/// options after the state folder is locked.
pub trait ModelSource {
    /// The model directories (the first holds config.json and tokenizer.json).
    fn dirs(&self) -> Result<Vec<PathBuf>, EngineError>;
    /// How the weights load (formats, tiers).
    fn load_options(&self) -> Result<LoadOptions, EngineError>;
}

/// What [`start_daemon`] needs: the daemon options both fronts take (`cli::ServeArgs`).
pub struct DaemonStart<'a> {
    pub model: &'a dyn ModelSource,
    /// `--telemetry-fd`: telemetry lines also go there.
    pub telemetry_fd: Option<i32>,
    /// `--state-dir` (None: next to the model, or the user state folder).
    pub state_dir: Option<&'a Path>,
    /// `--kv-save`.
    pub kv_save: bool,
    /// `--kv-slots`.
    pub kv_slots: u32,
    /// `--ctx` as given (None: chosen by [`ctx::choose`]).
    pub ctx_given: Option<u32>,
    /// `--prefix-cache-gb` (0: off) and `--prefix-cache-min-tokens`.
    pub prefix_cache_gb: f64,
    pub prefix_cache_min_tokens: u32,
}

/// A started daemon's engine and what the front keeps beside it.
pub struct Daemon {
    pub engine: Engine,
    /// The state folder's lock, held until the caller drops it (`None`: another daemon holds
    /// it or it could not be taken; nothing is saved).
    pub lock: Option<state::StateLock>,
    pub telemetry: TelemetryOut,
    /// The context chosen ([`ctx::choose`]).
    pub ctx: u32,
}

/// Starts the engine of a daemon (`serve`, `api`): see the module's comment for the order.
pub fn start_daemon(opts: DaemonStart<'_>) -> Result<Daemon, EngineError> {
    let mut telemetry = match opts.telemetry_fd {
        Some(fd) => TelemetryOut::from_fd(fd).map_err(EngineError::Usage)?,
        None => TelemetryOut::default(),
    };
    telemetry.send(&Telemetry::State(EngineState::Loading));
    let dirs = opts.model.dirs()?;
    let state_dir = state::resolve(&dirs[0], opts.state_dir)?;
    // Held until the daemon exits: one daemon per state folder, refused before any load.
    let lock = state::lock_state(&state_dir, opts.kv_save)?;
    let mut load = opts.model.load_options()?;
    let kv_save = opts.kv_save && lock.is_some();
    if lock.is_none() {
        load.tiers.usage_save = false;
    }
    // Which model this is, before anything slow (stdout stays untouched until READY).
    let facts = ModelFacts::gather(&dirs, &load, Some(&state_dir))?;
    crate::elog!("{}", facts.stderr_line());
    let chosen;
    let engine = {
        // Pinned experts load with PROGRESS pin lines.
        let mut progress = |done, total| {
            telemetry.send(&Telemetry::Progress(Progress {
                phase: ProgressPhase::Pin,
                done,
                total,
            }))
        };
        // Opened first: the default context needs the model's maximum and its KV bytes a
        // position, and the tiers' RAM plan needs the context.
        let budget = ctx::ram_budget(load.tiers.ram_gb);
        let mut engine = Engine::open(dirs, load)?;
        let choice = ctx::choose(
            opts.ctx_given,
            engine.model.cfg.max_position_embeddings,
            opts.kv_slots as usize,
            engine.kv_bytes_per_position(),
            budget,
        );
        chosen = choice.ctx as u32;
        crate::elog!("[KV] ctx {} ({})", choice.ctx, choice.why);
        engine.start_sessions(
            opts.kv_slots as usize,
            choice.ctx,
            Some(&state_dir),
            kv_save,
            Some(&mut progress),
        )?;
        if opts.prefix_cache_gb > 0.0 {
            if lock.is_some() {
                engine.open_prefix_cache(
                    &state_dir,
                    PrefixCacheOptions {
                        max_bytes: (opts.prefix_cache_gb * 1e9) as u64,
                        min_tokens: opts.prefix_cache_min_tokens as usize,
                    },
                )?;
            } else {
                crate::elog!("[KV] the state folder is not this daemon's: no prefix cache");
            }
        }
        engine
    };
    let per_pos = engine.kv_bytes_per_position();
    crate::elog!(
        "[KV] context slots: {} x {} tokens, {:.1} kB per token, projected pool {:.2} GB",
        opts.kv_slots,
        chosen,
        per_pos as f64 / 1e3,
        engine.kv_pool_bytes(opts.kv_slots as usize, chosen as usize) as f64 / 1e9
    );
    Ok(Daemon {
        engine,
        lock,
        telemetry,
        ctx: chosen,
    })
}
