//! `colibri serve`: upstream's stdin/stdout protocols over the engine's sessions.
//!
//! * the legacy line protocol (`legacy`, CONTRACT.md §3): one request at a time, plain chat
//!   lines and `\x02PROMPT` / `\x02MORE` / `\x02RESET` for `--kv-slots` conversations;
//! * the multiplexed protocol (`mux`, `--mux` or upstream's `SERVE_BATCH=1`): SUBMIT / STOP /
//!   CANCEL for up to 512 sessions, every active one advanced in one batched step.
//!
//! Both only translate: frames in become engine calls, the engine's step reports become frames
//! out. Loading, the tier start and the sessions' saved conversations are the engine's
//! (`Engine::start`), and so is the start-up both daemons share (`engine::start`). How an
//! answer reaches the wire (`--stop` strings, the UTF-8 hold) is the engine's
//! (`engine::answer`), shared by every front.

mod discard;
mod legacy;
mod mux;
mod signal;

use std::process::ExitCode;

use crate::cli::ServeArgs;
use crate::error::EngineError;

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
    let crate::engine::start::Daemon {
        engine,
        lock,
        telemetry,
        ctx,
    } = crate::engine::start::start_daemon(args.daemon_start())?;
    args.ctx = ctx;
    let served = if args.mux {
        mux::serve(engine, args, telemetry)
    } else {
        legacy::serve(engine, args, telemetry)
    };
    drop(lock);
    served
}
