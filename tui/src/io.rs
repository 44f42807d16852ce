//! The daemon child and the threads that turn every input into an [`Event`] on one channel.
//!
//! Threads per daemon: a stdin writer (requests from a channel, so the UI never blocks on a
//! full pipe), a stdout reader (bytes -> [`ReplyDecoder`] -> `Event::Reply`, or in mux mode
//! [`MuxReplyDecoder`] -> `Event::Mux`), a telemetry
//! reader (fd 3 of the child, lines -> `Event::Telemetry`), a stderr reader (lines ->
//! `Event::Stderr`) and a waiter that reaps the child and sends `Event::DaemonExited` once the
//! readers are done (so the last stderr lines arrive before the exit). Threads for the
//! terminal: keys/paste/resize, and a 100 ms tick.
//!
//! Shutdown: dropping the stdin sender closes the daemon's stdin (EOF: it saves and exits 0);
//! [`Daemon::shutdown`] waits for that briefly and then sends SIGKILL.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use protocol::{parse_telemetry_line, MuxReplyDecoder, ReplyDecoder, Telemetry};

use crate::event::{Event, ExitInfo};

/// The descriptor number the daemon gets its telemetry pipe on.
pub const TELEMETRY_FD: i32 = 3;

/// How to start the daemon.
#[derive(Clone, Debug)]
pub struct DaemonSpec {
    /// The `colibri` executable.
    pub program: PathBuf,
    /// Arguments after `serve` (options passed through, e.g. `--snap DIR`).
    pub args: Vec<OsString>,
    /// Pass `--telemetry-fd 3` and read the pipe.
    pub telemetry: bool,
    /// Pass `--mux` and decode stdout as the multiplexed protocol.
    pub mux: bool,
}

impl DaemonSpec {
    /// The full argument list: `serve [--mux] [args...] [--telemetry-fd 3]`.
    pub fn argv(&self) -> Vec<OsString> {
        let mut v: Vec<OsString> = vec!["serve".into()];
        if self.mux {
            v.push("--mux".into());
        }
        v.extend(self.args.iter().cloned());
        if self.telemetry {
            v.push("--telemetry-fd".into());
            v.push(TELEMETRY_FD.to_string().into());
        }
        v
    }

    /// `colibri serve --snap ...` for the title line.
    pub fn describe(&self) -> String {
        let mut s = self.program.display().to_string();
        for a in self.argv() {
            s.push(' ');
            s.push_str(&a.to_string_lossy());
        }
        s
    }
}

/// The default daemon: `colibri` next to the running `coli`.
pub fn default_daemon_path() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("colibri")))
        .unwrap_or_else(|| PathBuf::from("colibri"))
}

/// A running daemon.
pub struct Daemon {
    pid: Pid,
    /// Requests to write; dropping it closes the daemon's stdin.
    stdin: Option<Sender<Vec<u8>>>,
    /// Set by the waiter thread once the child is reaped (no signals after that: the pid
    /// may be reused).
    exited: Arc<AtomicBool>,
}

impl Daemon {
    /// Starts the daemon; its events go to `events`.
    pub fn spawn(spec: &DaemonSpec, events: Sender<Event>) -> std::io::Result<Daemon> {
        let mut cmd = Command::new(&spec.program);
        cmd.args(spec.argv())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group: signals meant for the terminal's foreground group
            // never reach it; we decide when it gets SIGINT.
            .process_group(0);
        let telemetry = if spec.telemetry {
            let (read_end, write_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
            let wfd = write_end.as_raw_fd();
            // SAFETY: the closure runs in the child between fork and exec, where only
            // async-signal-safe functions may be called. It calls `dup2` and `fcntl`, both
            // async-signal-safe per POSIX, through nix's thin wrappers, which neither
            // allocate nor lock; on failure it builds an `io::Error` from a raw errno, which
            // does not allocate either. `wfd` is an open descriptor owned by the parent's
            // `write_end`, which outlives `spawn`.
            unsafe {
                cmd.pre_exec(move || {
                    if wfd == TELEMETRY_FD {
                        // dup2 onto itself would keep O_CLOEXEC: clear it instead.
                        nix::fcntl::fcntl(
                            wfd,
                            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
                        )
                        .map_err(|e| std::io::Error::from_raw_os_error(e as i32))?;
                    } else {
                        // The duplicate does not inherit O_CLOEXEC.
                        nix::unistd::dup2(wfd, TELEMETRY_FD)
                            .map_err(|e| std::io::Error::from_raw_os_error(e as i32))?;
                    }
                    Ok(())
                });
            }
            Some((read_end, write_end))
        } else {
            None
        };
        let mut child = cmd.spawn()?;
        // Our copy of the write end must go, or the reader never sees EOF.
        let telemetry_read: Option<OwnedFd> = telemetry.map(|(r, w)| {
            drop(w);
            r
        });
        let pid = Pid::from_raw(child.id() as i32);

        let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(0);
        let mut stdin = child.stdin.take().expect("stdin was piped above");
        let stdout = child.stdout.take().expect("stdout was piped above");
        let stderr = child.stderr.take().expect("stderr was piped above");

        let (req_tx, req_rx) = crossbeam_channel::unbounded::<Vec<u8>>();
        thread::Builder::new()
            .name("daemon-stdin".into())
            .spawn(move || {
                for bytes in req_rx {
                    if stdin.write_all(&bytes).and_then(|_| stdin.flush()).is_err() {
                        break;
                    }
                }
                // Dropping `stdin` closes the pipe: EOF for the daemon.
            })?;

        let ev = events.clone();
        let done = done_tx.clone();
        let mux = spec.mux;
        thread::Builder::new()
            .name("daemon-stdout".into())
            .spawn(move || {
                if mux {
                    read_mux_replies(stdout, &ev);
                } else {
                    read_replies(stdout, &ev);
                }
                drop(done);
            })?;

        let ev = events.clone();
        let done = done_tx.clone();
        thread::Builder::new()
            .name("daemon-stderr".into())
            .spawn(move || {
                read_lines(stderr, |line| {
                    ev.send(Event::Stderr(String::from_utf8_lossy(line).into_owned()))
                        .is_ok()
                });
                drop(done);
            })?;

        if let Some(fd) = telemetry_read {
            let ev = events.clone();
            let done = done_tx.clone();
            thread::Builder::new()
                .name("daemon-telemetry".into())
                .spawn(move || {
                    read_telemetry(std::fs::File::from(fd), &ev);
                    drop(done);
                })?;
        }
        drop(done_tx);

        let exited = Arc::new(AtomicBool::new(false));
        let flag = exited.clone();
        thread::Builder::new()
            .name("daemon-wait".into())
            .spawn(move || {
                let info = match child.wait() {
                    Ok(status) => ExitInfo::from_status(status),
                    Err(_) => ExitInfo {
                        code: None,
                        signal: None,
                    },
                };
                flag.store(true, Ordering::SeqCst);
                // Let the readers finish (they see EOF now), unless something else holds
                // the pipes open (a grandchild): then do not wait for ever.
                // Nothing is ever sent on `done_rx`: it disconnects when the last reader
                // drops its sender.
                let _ = done_rx.recv_timeout(Duration::from_secs(2));
                let _ = events.send(Event::DaemonExited(info));
            })?;

        Ok(Daemon {
            pid,
            stdin: Some(req_tx),
            exited,
        })
    }

    /// Queues bytes for the daemon's stdin.
    pub fn send(&self, bytes: Vec<u8>) {
        if let Some(tx) = &self.stdin {
            let _ = tx.send(bytes);
        }
    }

    /// SIGINT: the daemon stops the current turn through END + STAT.
    pub fn interrupt(&self) {
        self.signal(Signal::SIGINT);
    }

    fn signal(&self, sig: Signal) {
        if !self.exited.load(Ordering::SeqCst) {
            let _ = kill(self.pid, sig);
        }
    }

    /// Whether the child has been reaped.
    pub fn has_exited(&self) -> bool {
        self.exited.load(Ordering::SeqCst)
    }

    /// Closes stdin (the daemon saves and exits), waits up to `grace`, then SIGKILL.
    /// Returns whether it exited on its own.
    pub fn shutdown(&mut self, grace: Duration) -> bool {
        self.stdin = None;
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.has_exited() {
                return true;
            }
            thread::sleep(Duration::from_millis(20));
        }
        self.signal(Signal::SIGKILL);
        false
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // Never leave an orphan holding the model's memory.
        self.stdin = None;
        self.signal(Signal::SIGKILL);
    }
}

/// Reads the daemon's stdout to EOF, decoding replies.
fn read_replies(stdout: impl Read, events: &Sender<Event>) {
    let mut dec = ReplyDecoder::new();
    read_chunks(stdout, |chunk| {
        dec.feed(chunk);
        while let Some(r) = dec.next_reply() {
            if events.send(Event::Reply(r)).is_err() {
                return false;
            }
        }
        true
    });
    for r in dec.finish() {
        let _ = events.send(Event::Reply(r));
    }
}

/// Reads the daemon's stdout to EOF in mux mode, decoding frames.
fn read_mux_replies(stdout: impl Read, events: &Sender<Event>) {
    let mut dec = MuxReplyDecoder::new();
    read_chunks(stdout, |chunk| {
        dec.feed(chunk);
        while let Some(r) = dec.next_reply() {
            if events.send(Event::Mux(r)).is_err() {
                return false;
            }
        }
        true
    });
    for r in dec.finish() {
        let _ = events.send(Event::Mux(r));
    }
}

/// Passes `stdout`'s bytes to `f` as they come, until EOF, an error, or `f` returns false.
fn read_chunks(mut stdout: impl Read, mut f: impl FnMut(&[u8]) -> bool) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match stdout.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if !f(&buf[..n]) {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
}

/// Calls `f` for each line (split at `\n` or `\r`, without them, empty lines skipped) until
/// EOF or until `f` returns false.
pub fn read_lines(r: impl Read, mut f: impl FnMut(&[u8]) -> bool) {
    let mut r = BufReader::new(r);
    let mut line = Vec::new();
    loop {
        line.clear();
        match r.read_until(b'\n', &mut line) {
            Ok(0) => return,
            Ok(_) => {
                let l = line.strip_suffix(b"\n").unwrap_or(&line);
                for part in l.split(|&b| b == b'\r') {
                    if !part.is_empty() && !f(part) {
                        return;
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

fn read_telemetry(r: impl Read, events: &Sender<Event>) {
    read_lines(r, |line| match parse_telemetry_line(line) {
        Some(Telemetry::Unknown(_)) => true,
        Some(t) => events.send(Event::Telemetry(t)).is_ok(),
        None => events
            .send(Event::Stderr(format!(
                "[coli] malformed telemetry line: {}",
                String::from_utf8_lossy(line)
            )))
            .is_ok(),
    });
}

/// Starts the terminal threads: crossterm events and the 100 ms tick.
pub fn spawn_terminal_threads(events: Sender<Event>) -> std::io::Result<()> {
    let ev = events.clone();
    thread::Builder::new().name("keys".into()).spawn(move || {
        use crossterm::event::{self as ct, KeyEventKind};
        loop {
            let e = match ct::read() {
                Ok(e) => e,
                Err(_) => return,
            };
            let out = match e {
                ct::Event::Key(k) if k.kind != KeyEventKind::Release => Event::Key(k),
                ct::Event::Paste(s) => Event::Paste(s),
                ct::Event::Resize(w, h) => Event::Resize(w, h),
                _ => continue,
            };
            if ev.send(out).is_err() {
                return;
            }
        }
    })?;
    thread::Builder::new()
        .name("tick".into())
        .spawn(move || loop {
            thread::sleep(Duration::from_millis(100));
            if events.send(Event::Tick(Instant::now())).is_err() {
                return;
            }
        })?;
    Ok(())
}

/// What the main loop needs from the daemon side (a fake in tests).
pub trait Control {
    /// Write a request.
    fn send(&mut self, bytes: Vec<u8>);
    /// Attached: send a chat turn to the server.
    fn chat(&mut self, req: crate::app::ChatRequest);
    /// SIGINT.
    fn interrupt(&mut self);
    /// Start a fresh daemon; `false` when it could not be started (a `SpawnFailed` event
    /// has been sent).
    fn restart(&mut self) -> bool;
}

/// The real daemon, restartable.
pub struct Supervisor {
    spec: DaemonSpec,
    events: Sender<Event>,
    /// The current daemon, if it could be started.
    pub daemon: Option<Daemon>,
}

impl Supervisor {
    /// Starts the first daemon (a failure becomes a `SpawnFailed` event).
    pub fn start(spec: DaemonSpec, events: Sender<Event>) -> Supervisor {
        let mut s = Supervisor {
            spec,
            events,
            daemon: None,
        };
        s.restart();
        s
    }

    /// Closes stdin, waits up to `grace`, kills.
    pub fn shutdown(&mut self, grace: Duration) -> bool {
        match &mut self.daemon {
            Some(d) => d.shutdown(grace),
            None => true,
        }
    }
}

impl Control for Supervisor {
    fn send(&mut self, bytes: Vec<u8>) {
        if let Some(d) = &self.daemon {
            d.send(bytes);
        }
    }

    fn chat(&mut self, _req: crate::app::ChatRequest) {
        // Only an attached client makes chat turns; a daemon's are protocol requests.
        let _ = self.events.send(Event::Stderr(
            "[coli] a chat turn for a server, but coli runs a daemon of its own: dropped".into(),
        ));
    }

    fn interrupt(&mut self) {
        if let Some(d) = &self.daemon {
            d.interrupt();
        }
    }

    fn restart(&mut self) -> bool {
        if let Some(mut old) = self.daemon.take() {
            old.shutdown(Duration::from_millis(0));
        }
        match Daemon::spawn(&self.spec, self.events.clone()) {
            Ok(d) => {
                self.daemon = Some(d);
                true
            }
            Err(e) => {
                let _ = self.events.send(Event::SpawnFailed(format!(
                    "{}: {e}",
                    self.spec.program.display()
                )));
                false
            }
        }
    }
}

/// Drains a receiver without blocking (tests and the main loop).
pub fn drain(rx: &Receiver<Event>) -> Vec<Event> {
    rx.try_iter().collect()
}
