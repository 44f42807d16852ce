//! SIGINT as a soft stop: the current turn (legacy) or every active request (mux) ends through
//! the normal END/STAT or DONE path. SIGTERM and SIGHUP do the same, then the daemon saves and
//! exits, as upstream's later revisions do for SIGTERM: a service manager's stop or a closed
//! terminal never loses the turn in progress.

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

/// SIGTERM and SIGHUP as a graceful shutdown: the turn in progress ends through its normal
/// frames and is saved, then the daemon exits 0. Waits for input must wake up to see it
/// (mux's loop ticks; legacy polls stdin, [`wait_readable`]).
pub fn install_sigterm() {
    let action = SigAction::new(
        SigHandler::Handler(on_sigterm),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in [Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: as for SIGINT: the handler only stores to an atomic.
        if let Err(e) = unsafe { sigaction(sig, &action) } {
            crate::elog!("[serve] cannot install the {sig} handler ({e})");
        }
    }
}

/// Which of SIGTERM and SIGHUP asked the daemon to stop, for its last stderr line.
pub fn terminated() -> bool {
    TERMINATED.load(Ordering::Relaxed)
}

/// Waits until stdin has bytes (or EOF) to read: `true`; `false` once SIGTERM or SIGHUP has
/// come. A blocking read would sleep through the signal (the handlers restart it), so an idle
/// legacy daemon would never exit on it.
pub fn wait_readable() -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let stdin = std::io::stdin();
    loop {
        if terminated() {
            return false;
        }
        let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(100u8)) {
            Ok(0) => continue,
            // Readable, or hung up / in error: the read says which.
            Ok(_) => return true,
            Err(nix::errno::Errno::EINTR) => continue,
            // poll itself failing: fall back to the blocking read.
            Err(_) => return true,
        }
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
        crate::elog!(
            "[serve] cannot install the SIGINT handler ({e}): Ctrl-C will kill the daemon"
        );
    }
}

/// Interrupts that arrive between turns are dropped, as upstream does.
pub fn clear() {
    INTERRUPTED.store(false, Ordering::Relaxed);
}
