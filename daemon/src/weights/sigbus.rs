//! A shard cut short while mapped: turned from a silent SIGBUS death into an error that names
//! the file.
//!
//! Touching a mapped page past a file's new end raises SIGBUS. Every shard map registers its
//! address range here; the handler, when the faulting address is inside one, maps a zero page
//! over the faulting page (so the instruction completes, reading zeros), records which shard
//! faulted and returns. The engine checks [`take_fault`] after every forward and turns a fault
//! into a fatal error: that forward's numbers are garbage, so its conversations are not saved
//! (their files still hold the last durable turn) and the daemon exits 1 naming the file. A
//! SIGBUS anywhere else gets the default action, as before.

#![deny(clippy::undocumented_unsafe_blocks)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;

use nix::libc;
use parking_lot::Mutex;

/// Most maps registered at once (shards of one model; more are simply not covered).
const SLOTS: usize = 4096;

struct Range {
    start: AtomicUsize,
    /// 0: the slot is free.
    len: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Range = Range {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
};
static RANGES: [Range; SLOTS] = [FREE; SLOTS];
/// The file of each slot (read outside the handler only).
static PATHS: Mutex<Vec<Option<PathBuf>>> = Mutex::new(Vec::new());
/// Slot + 1 of the first fault not yet taken (0: none), and its offset in the file.
static FAULTED: AtomicUsize = AtomicUsize::new(0);
static FAULT_OFFSET: AtomicUsize = AtomicUsize::new(0);
static PAGE: AtomicUsize = AtomicUsize::new(4096);
static INSTALL: Once = Once::new();

type Handler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

/// A fault the handler absorbed: which shard, at which byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapFault {
    pub path: PathBuf,
    pub offset: u64,
}

/// Covers `start..start + len` (a shard's map of `path`). Returns the slot to release with
/// [`unregister`], or `None` when every slot is taken (that map is then not covered).
pub(crate) fn register(start: usize, len: usize, path: &std::path::Path) -> Option<usize> {
    INSTALL.call_once(install);
    let mut paths = PATHS.lock();
    for (i, r) in RANGES.iter().enumerate() {
        if r.len.load(Ordering::Acquire) != 0 {
            continue;
        }
        if paths.len() <= i {
            paths.resize(i + 1, None);
        }
        paths[i] = Some(path.to_path_buf());
        r.start.store(start, Ordering::Release);
        r.len.store(len, Ordering::Release);
        return Some(i);
    }
    None
}

/// The map of slot `i` is going away.
pub(crate) fn unregister(i: usize) {
    RANGES[i].len.store(0, Ordering::Release);
}

/// The first shard fault since the last call, if any.
pub fn take_fault() -> Option<MapFault> {
    let slot = FAULTED.swap(0, Ordering::AcqRel);
    if slot == 0 {
        return None;
    }
    let path = PATHS
        .lock()
        .get(slot - 1)
        .cloned()
        .flatten()
        .unwrap_or_else(|| PathBuf::from("<a shard>"));
    Some(MapFault {
        path,
        offset: FAULT_OFFSET.load(Ordering::Acquire) as u64,
    })
}

fn install() {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if page > 0 {
        PAGE.store(page as usize, Ordering::Relaxed);
    }
    // SAFETY: a zeroed sigaction is a valid starting value; the fields that matter are set
    // below, and the handler only does what a signal handler may (see `on_sigbus`).
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        let handler: Handler = on_sigbus;
        act.sa_sigaction = handler as usize;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut act.sa_mask);
        if libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut()) != 0 {
            crate::elog!("[weights] cannot install the SIGBUS handler: a shard cut short while mapped ends the process silently");
        }
    }
}

/// Runs on the faulting thread. Only atomics and async-signal-safe system calls (mmap,
/// write, sigaction): no allocation, no locks.
extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler; si_addr is the
    // faulting address for SIGBUS.
    let addr = unsafe { (*info).si_addr() } as usize;
    let hit = RANGES.iter().position(|r| {
        let len = r.len.load(Ordering::Acquire);
        let start = r.start.load(Ordering::Acquire);
        len != 0 && addr >= start && addr - start < len
    });
    let page = PAGE.load(Ordering::Relaxed);
    let base = addr & !(page - 1);
    let patched = hit.is_some_and(|_| {
        // SAFETY: `base` is a page of a live, registered read-only shard map (the slot is
        // released before the map is dropped). Replacing that one page with anonymous zeros
        // keeps every address valid; the map's owner unmaps the whole range, this page with
        // it, when it drops. Nothing ever writes through the map.
        let p = unsafe {
            libc::mmap(
                base as *mut libc::c_void,
                page,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        p != libc::MAP_FAILED
    });
    match hit {
        Some(i) if patched => {
            if FAULTED
                .compare_exchange(0, i + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                let start = RANGES[i].start.load(Ordering::Acquire);
                FAULT_OFFSET.store(addr - start, Ordering::Release);
                const MSG: &[u8] =
                    b"[weights] SIGBUS: a mapped shard was cut short under the daemon\n";
                // SAFETY: write(2) is async-signal-safe; MSG is a valid buffer.
                unsafe { libc::write(2, MSG.as_ptr() as *const libc::c_void, MSG.len()) };
            }
        }
        _ => {
            // Not ours: the default action when the instruction faults again.
            // SAFETY: resetting a disposition with sigaction is async-signal-safe.
            unsafe {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
            }
        }
    }
}
