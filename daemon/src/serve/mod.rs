//! `colibri serve`: upstream's stdin/stdout protocols over the engine's sessions.
//!
//! * the legacy line protocol (`legacy`, CONTRACT.md §3): one request at a time, plain chat
//!   lines and `\x02PROMPT` / `\x02MORE` / `\x02RESET` for `--kv-slots` conversations;
//! * the multiplexed protocol (`mux`, `--mux` or upstream's `SERVE_BATCH=1`): SUBMIT / STOP /
//!   CANCEL for up to 512 sessions, every active one advanced in one batched step.
//!
//! Both only translate: frames in become engine calls, the engine's step reports become frames
//! out. Loading, the tier start and the sessions' saved conversations are the engine's
//! (`Engine::start`); what is shared here is the start-up and the telemetry channel. How an
//! answer reaches the wire (`--stop` strings, the UTF-8 hold) is the engine's
//! (`engine::answer`), shared by every front.

mod discard;
mod legacy;
mod mux;
mod signal;

use std::process::ExitCode;

use protocol::{EngineState, Progress, ProgressPhase, Telemetry};

use crate::cli::ServeArgs;
use crate::engine::{ctx, state, Engine};
use crate::error::EngineError;
use crate::telemetry::TelemetryOut;

/// Most sessions of the legacy protocol (upstream's bound) and of the multiplexed one.
pub const LEGACY_MAX_SLOTS: u32 = 16;
pub const MUX_MAX_SLOTS: u32 = 512;

pub fn run(mut args: ServeArgs) -> Result<ExitCode, EngineError> {
    // Resolved (and refused, or warned about) once, before anything loads.
    args.sampling.temp = Some(args.sampling.temperature()?);
    let max = if args.mux {
        MUX_MAX_SLOTS
    } else {
        LEGACY_MAX_SLOTS
    };
    if args.kv_slots > max {
        return Err(EngineError::Usage(format!(
            "KV_SLOTS must be between 1 and {max}: --kv-slots {} is outside 1..={max}{}",
            args.kv_slots,
            if args.mux {
                ""
            } else {
                " (up to 512 with --mux, upstream's SERVE_BATCH=1)"
            },
        )));
    }
    signal::install();
    let (engine, lock, telemetry) = start_engine(&mut args)?;
    let served = if args.mux {
        mux::serve(engine, args, telemetry)
    } else {
        legacy::serve(engine, args, telemetry)
    };
    drop(lock);
    served
}

/// The start-up `serve` and `api` share: the telemetry channel, the state folder and its lock
/// (refused before any load when another daemon holds it), the model facts line, then the
/// engine with its sessions. The lock is held until the caller drops it. `args.ctx` is set
/// to the context chosen ([`ctx::choose`]).
pub(crate) fn start_engine(
    args: &mut ServeArgs,
) -> Result<(Engine, Option<state::StateLock>, TelemetryOut), EngineError> {
    let mut telemetry = match args.telemetry_fd {
        Some(fd) => TelemetryOut::from_fd(fd).map_err(EngineError::Usage)?,
        None => TelemetryOut::default(),
    };
    telemetry.send(&Telemetry::State(EngineState::Loading));
    let dirs = args.model.dirs()?;
    let state_dir = state::resolve(&dirs[0], args.state_dir.as_deref())?;
    // Held until the daemon exits: one daemon per state folder, refused before any load.
    let lock = state::lock_state(&state_dir, args.kv_save)?;
    let mut load = args.model.load_options()?;
    let kv_save = args.kv_save && lock.is_some();
    if lock.is_none() {
        load.tiers.usage_save = false;
    }
    // Which model this is, before anything slow (stdout stays untouched until READY).
    let facts = crate::cmd::info::ModelFacts::gather(&dirs, &load, Some(&state_dir))?;
    crate::elog!("{}", facts.stderr_line());
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
            args.ctx_given,
            engine.model.cfg.max_position_embeddings,
            args.kv_slots as usize,
            engine.kv_bytes_per_position(),
            budget,
        );
        args.ctx = choice.ctx as u32;
        crate::elog!("[KV] ctx {} ({})", choice.ctx, choice.why);
        engine.start_sessions(
            args.kv_slots as usize,
            choice.ctx,
            Some(&state_dir),
            kv_save,
            Some(&mut progress),
        )?;
        if args.prefix_cache_gb > 0.0 {
            if lock.is_some() {
                engine.open_prefix_cache(
                    &state_dir,
                    crate::engine::PrefixCacheOptions {
                        max_bytes: (args.prefix_cache_gb * 1e9) as u64,
                        min_tokens: args.prefix_cache_min_tokens as usize,
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
        args.kv_slots,
        args.ctx,
        per_pos as f64 / 1e3,
        (args.kv_slots as usize * args.ctx as usize * per_pos) as f64 / 1e9
    );
    Ok((engine, lock, telemetry))
}
