//! SIGINT as a soft stop: the current turn (legacy) or every active request (mux) ends through
//! the normal END/STAT or DONE path. SIGTERM (mux) does the same, then the daemon saves and
//! exits, as upstream's later revisions do.

use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

pub static INTERRUPTED: AtomicBool = AtomicBool::new(false);
pub static TERMINATED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: nix::libc::c_int) {
    // Only an atomic store: async-signal-safe.
    INTERRUPTED.store(true, Ordering::Relaxed);
}

extern "C" fn on_sigterm(_: nix::libc::c_int) {
    // Only an atomic store: async-signal-safe.
    TERMINATED.store(true, Ordering::Relaxed);
}

/// SIGTERM as a graceful shutdown (mux mode only: legacy keeps the default, as upstream).
pub fn install_sigterm() {
    let action = SigAction::new(
        SigHandler::Handler(on_sigterm),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    // SAFETY: as for SIGINT: the handler only stores to an atomic.
    if let Err(e) = unsafe { sigaction(Signal::SIGTERM, &action) } {
        eprintln!("[serve] cannot install the SIGTERM handler ({e})");
    }
}

pub fn install() {
    let action = SigAction::new(
        SigHandler::Handler(on_sigint),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe, and it replaces
    // the default action for SIGINT alone. SA_RESTART keeps blocking stdin reads going.
    if let Err(e) = unsafe { sigaction(Signal::SIGINT, &action) } {
        eprintln!("[serve] cannot install the SIGINT handler ({e}): Ctrl-C will kill the daemon");
    }
}

/// Interrupts that arrive between turns are dropped, as upstream does.
pub fn clear() {
    INTERRUPTED.store(false, Ordering::Relaxed);
}
