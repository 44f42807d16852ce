//! The one event type every input is turned into (see `io.rs` for who sends what).

use std::fmt;
use std::time::Instant;

use crossterm::event::KeyEvent;
use protocol::{MuxReply, Reply, Telemetry};

/// Everything the main loop reacts to, merged into one channel.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A key press (or repeat) on the terminal.
    Key(KeyEvent),
    /// A bracketed paste.
    Paste(String),
    /// The terminal was resized to (columns, rows).
    Resize(u16, u16),
    /// A reply decoded from the daemon's stdout.
    Reply(Reply),
    /// A frame decoded from the daemon's stdout in mux mode.
    Mux(MuxReply),
    /// A line from the telemetry descriptor.
    Telemetry(Telemetry),
    /// A line of the daemon's stderr (lossily UTF-8, without its line end).
    Stderr(String),
    /// The clock (every 100 ms).
    Tick(Instant),
    /// The daemon exited; sent after its output has been read to the end.
    DaemonExited(ExitInfo),
    /// The daemon could not be started.
    SpawnFailed(String),
}

/// How a process ended: an exit code or a signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitInfo {
    /// The exit code, when it exited.
    pub code: Option<i32>,
    /// The signal number, when a signal killed it.
    pub signal: Option<i32>,
}

/// Signal numbers are the same on every Linux and BSD for these.
const SIGKILL: i32 = 9;

impl ExitInfo {
    /// Exited with `code`.
    pub fn code(code: i32) -> ExitInfo {
        ExitInfo {
            code: Some(code),
            signal: None,
        }
    }

    /// Killed by signal `sig`.
    pub fn signal(sig: i32) -> ExitInfo {
        ExitInfo {
            code: None,
            signal: Some(sig),
        }
    }

    /// From the standard library's status.
    pub fn from_status(status: std::process::ExitStatus) -> ExitInfo {
        use std::os::unix::process::ExitStatusExt;
        ExitInfo {
            code: status.code(),
            signal: status.signal(),
        }
    }

    /// "exited with status 1", "killed by SIGKILL".
    pub fn describe(&self) -> String {
        self.to_string()
    }

    /// The explanation for a SIGKILL nobody asked for.
    pub fn oom_hint(&self) -> Option<&'static str> {
        (self.signal == Some(SIGKILL))
            .then_some("most likely the kernel's out-of-memory killer; lower --cache or --ram-gb")
    }
}

impl fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.code, self.signal) {
            (Some(c), _) => write!(f, "exited with status {c}"),
            (None, Some(s)) => match nix::sys::signal::Signal::try_from(s) {
                Ok(sig) => write!(f, "killed by {}", sig.as_str()),
                Err(_) => write!(f, "killed by signal {s}"),
            },
            (None, None) => write!(f, "ended"),
        }
    }
}
