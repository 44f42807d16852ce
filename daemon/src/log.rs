//! Diagnostic lines on stderr that never take the process down.
//!
//! `eprintln!` panics when stderr is a broken pipe (`colibri api 2>&1 | tee log` and `tee`
//! dies, a supervisor restarting its log pipe): the next request's log line would end the
//! server. [`elog!`](crate::elog) writes the same line and, when the write fails, drops it
//! and counts it instead; `/metrics` reports the count, so a lost log is visible somewhere.

use std::fmt::Arguments;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Writes `args` and a newline to stderr as one write under the lock; a failure is counted.
pub fn line(args: Arguments<'_>) {
    // One buffer, one write: concurrent threads' lines do not interleave mid-line.
    let mut buf = Vec::with_capacity(128);
    let _ = buf.write_fmt(args);
    buf.push(b'\n');
    write_all(&buf);
}

/// Writes `args` to stderr without a newline (progress that a later line completes).
pub fn part(args: Arguments<'_>) {
    let mut buf = Vec::with_capacity(64);
    let _ = buf.write_fmt(args);
    write_all(&buf);
}

fn write_all(buf: &[u8]) {
    let mut err = std::io::stderr().lock();
    if err.write_all(buf).and_then(|()| err.flush()).is_err() {
        DROPPED.fetch_add(1, Ordering::Relaxed);
    }
}

/// Lines that could not be written since the process started.
pub fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// `eprintln!` that drops (and counts) a line it cannot write instead of panicking.
#[macro_export]
macro_rules! elog {
    () => { $crate::log::line(format_args!("")) };
    ($($arg:tt)*) => { $crate::log::line(format_args!($($arg)*)) };
}

/// `eprint!` that drops (and counts) what it cannot write instead of panicking.
#[macro_export]
macro_rules! elog_part {
    ($($arg:tt)*) => { $crate::log::part(format_args!($($arg)*)) };
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_line_formats_like_eprintln() {
        // Only the formatting can be checked in-process (stderr is the test harness's);
        // the broken pipe itself is the end-to-end test `a_broken_stderr_does_not_stop_the_server`.
        let mut buf = Vec::new();
        std::io::Write::write_fmt(&mut buf, format_args!("[api] {} {}", 1, "x")).unwrap();
        assert_eq!(buf, b"[api] 1 x");
        crate::elog!("[test] a line");
        crate::elog_part!("[test] a part\n");
    }
}
