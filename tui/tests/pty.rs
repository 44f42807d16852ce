//! End to end: the real `coli` binary in a pseudo-terminal, driving a daemon.
//!
//! Against `tests/fake-colibri` (a bash stand-in speaking the same protocol) these always
//! run; against the real `colibri serve` they run when a `colibri` next to `coli` (or
//! `$COLIBRI_BIN`) answers READY, and are skipped with a note otherwise. The screen is
//! rebuilt from the bytes `coli` writes by a small terminal model that knows what ratatui's
//! crossterm backend emits (cursor moves, clears, colours). Waits are bounded reads of the
//! pty, never sleeps.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

const COLS: u16 = 100;
const ROWS: u16 = 30;

/// Just enough of a terminal to read ratatui's output back.
struct Screen {
    cells: Vec<Vec<char>>,
    row: usize,
    col: usize,
    pending: Vec<u8>,
}

impl Screen {
    fn new() -> Screen {
        Screen {
            cells: vec![vec![' '; COLS as usize]; ROWS as usize],
            row: 0,
            col: 0,
            pending: Vec::new(),
        }
    }

    fn feed(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
        let buf = std::mem::take(&mut self.pending);
        let mut i = 0;
        while i < buf.len() {
            let b = buf[i];
            if b == 0x1b {
                let Some(&next) = buf.get(i + 1) else { break };
                if next == b'[' {
                    // CSI: parameters, then a final byte in 0x40..=0x7e.
                    let Some(end) = buf[i + 2..].iter().position(|c| (0x40..=0x7e).contains(c))
                    else {
                        break;
                    };
                    let params = String::from_utf8_lossy(&buf[i + 2..i + 2 + end]).into_owned();
                    self.csi(&params, buf[i + 2 + end]);
                    i += 3 + end;
                } else {
                    i += 2;
                }
                continue;
            }
            if b < 0x20 {
                match b {
                    b'\r' => self.col = 0,
                    b'\n' => self.row = (self.row + 1).min(ROWS as usize - 1),
                    _ => {}
                }
                i += 1;
                continue;
            }
            let len = match b {
                0xf0.. => 4,
                0xe0.. => 3,
                0xc0.. => 2,
                _ => 1,
            };
            if i + len > buf.len() {
                break;
            }
            let c = std::str::from_utf8(&buf[i..i + len])
                .ok()
                .and_then(|s| s.chars().next())
                .unwrap_or('?');
            if self.row < ROWS as usize && self.col < COLS as usize {
                self.cells[self.row][self.col] = c;
            }
            self.col += 1;
            i += len;
        }
        self.pending = buf[i..].to_vec();
    }

    fn csi(&mut self, params: &str, fin: u8) {
        let nums: Vec<usize> = params
            .split(';')
            .map(|p| p.trim_start_matches('?').parse().unwrap_or(0))
            .collect();
        match fin {
            b'H' => {
                self.row = nums.first().copied().unwrap_or(1).max(1) - 1;
                self.col = nums.get(1).copied().unwrap_or(1).max(1) - 1;
            }
            b'J' if nums.first() == Some(&2) => {
                for r in &mut self.cells {
                    r.fill(' ');
                }
            }
            _ => {}
        }
    }

    fn text(&self) -> String {
        self.cells
            .iter()
            .map(|r| r.iter().collect::<String>())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

struct Session {
    _serial: std::sync::MutexGuard<'static, ()>,
    pid: nix::unistd::Pid,
    exited: Receiver<Option<i32>>,
    reaped: bool,
    master: File,
    output: Receiver<Vec<u8>>,
    screen: Screen,
}

impl Session {
    fn start(daemon: &Path, extra: &[&str]) -> Session {
        Session::start_with_cache(daemon, extra, None)
    }

    /// [`Session::start`] with `XDG_CACHE_HOME` set for `coli` (and so its daemon) alone:
    /// tests run in parallel, and a process-wide `set_var` by one would reach another's child.
    fn start_with_cache(daemon: &Path, extra: &[&str], cache: Option<&Path>) -> Session {
        let mut args: Vec<std::ffi::OsString> = vec!["--daemon".into(), daemon.into()];
        args.extend(["--quit-grace", "5"].iter().chain(extra).map(Into::into));
        Session::spawn(&args, cache)
    }

    /// `coli ARGS` in a new pseudo-terminal.
    fn spawn(args: &[std::ffi::OsString], cache: Option<&Path>) -> Session {
        // One session at a time: a 2-core machine, and fds opened by one test must not leak
        // into another's children between openpty and the close-on-exec flags.
        static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let ws = nix::pty::Winsize {
            ws_row: ROWS,
            ws_col: COLS,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = nix::pty::openpty(Some(&ws), None).expect("openpty");
        // openpty(3) does not set close-on-exec: without it, another test's `coli` (and its
        // daemon) would inherit this pty and keep it open after our `coli` exits.
        for fd in [&pty.master, &pty.slave] {
            use nix::fcntl::{fcntl, FcntlArg, FdFlag};
            use std::os::fd::AsRawFd;
            fcntl(fd.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)).expect("cloexec");
        }
        let slave: OwnedFd = pty.slave;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_coli"));
        if let Some(cache) = cache {
            cmd.env("XDG_CACHE_HOME", cache);
        }
        let child = cmd
            .args(args)
            .stdin(Stdio::from(slave.try_clone().expect("dup")))
            .stdout(Stdio::from(slave.try_clone().expect("dup")))
            .stderr(Stdio::from(slave))
            .env("TERM", "xterm-256color")
            .spawn()
            .expect("spawn coli");
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let (exit_tx, exited) = crossbeam_channel::bounded(1);
        std::thread::spawn(move || {
            let mut child: Child = child;
            let code = child.wait().ok().and_then(|s| s.code());
            let _ = exit_tx.send(code);
        });
        let master = File::from(pty.master);
        let mut reader = master.try_clone().expect("dup master");
        let (tx, rx) = crossbeam_channel::unbounded();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) | Err(_) => return, // EIO once coli has exited
                    Ok(n) => {
                        if tx.send(buf[..n].to_vec()).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Session {
            _serial: serial,
            pid,
            exited,
            reaped: false,
            master,
            output: rx,
            screen: Screen::new(),
        }
    }

    fn write(&mut self, bytes: &[u8]) {
        self.master.write_all(bytes).expect("write to pty");
    }

    /// Reads until the screen contains `needle`, or panics after `secs` with the screen.
    fn wait_for(&mut self, needle: &str, secs: u64) {
        self.wait_for_n(needle, 1, secs);
    }

    /// Reads until `pred` holds for the screen text.
    fn wait_until(&mut self, what: &str, secs: u64, pred: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !pred(&self.screen.text()) {
            match self.output.recv_deadline(deadline) {
                Ok(bytes) => self.screen.feed(&bytes),
                Err(_) => panic!("{what}: not after {secs}s:\n{}", self.screen.text()),
            }
        }
    }

    /// Reads until the screen contains `needle` at least `n` times.
    fn wait_for_n(&mut self, needle: &str, n: usize, secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if self.screen.text().matches(needle).count() >= n {
                return;
            }
            match self.output.recv_deadline(deadline) {
                Ok(bytes) => self.screen.feed(&bytes),
                Err(_) => panic!(
                    "{needle:?} not on screen after {secs}s:\n{}",
                    self.screen.text()
                ),
            }
        }
    }

    /// Waits for `coli` to exit; returns its exit code.
    fn wait_exit(&mut self, secs: u64) -> Option<i32> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        // The pty reports EOF (EIO) once coli and the daemon have closed it.
        while let Ok(bytes) = self.output.recv_deadline(deadline) {
            self.screen.feed(&bytes);
        }
        match self.exited.recv_deadline(deadline + Duration::from_secs(2)) {
            Ok(code) => {
                self.reaped = true;
                code
            }
            Err(_) => panic!("coli did not exit within {secs}s:\n{}", self.screen.text()),
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // A test that failed half-way leaves `coli` running: end it (and, through its
        // stdin/Drop, its daemon). Never signal a pid that was reaped.
        if !self.reaped && self.exited.try_recv().is_err() {
            let _ = nix::sys::signal::kill(self.pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// A scripted `colibri api` on a local socket, a thread per connection: `/health`,
/// `/v1/models`, a telemetry stream that sends the tiers and the map and stays open, and a
/// chat stream answering "Hi from the server". Its URL.
fn scripted_api() -> String {
    use std::io::BufRead;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut s) = conn else { return };
            std::thread::spawn(move || {
                let mut r = std::io::BufReader::new(s.try_clone().unwrap());
                let mut first = String::new();
                let _ = r.read_line(&mut first);
                let mut len = 0;
                loop {
                    let mut h = String::new();
                    if r.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                        break;
                    }
                    if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                }
                let mut body = vec![0; len];
                let _ = r.read_exact(&mut body);
                let chunk = |d: &str| format!("{:x}\r\n{d}\r\n", d.len());
                let sse = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
                let json =
                    |b: &str| format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{b}", b.len());
                let path = first.split(' ').nth(1).unwrap_or("").to_string();
                let _ = match path.as_str() {
                    "/health" => s.write_all(json(r#"{"status":"ok"}"#).as_bytes()),
                    "/v1/models" => s.write_all(json(r#"{"data":[{"id":"scripted"}]}"#).as_bytes()),
                    "/v1/colibri/telemetry" => {
                        let emap = "40".repeat(48);
                        let mut out = sse.to_string();
                        for line in [
                            "TIERS 0 12 36 0.00 0.01".to_string(),
                            format!("EMAP 3 16 {emap}"),
                            "STATE idle".into(),
                        ] {
                            out += &chunk(&format!("event: telemetry\ndata: {line}\n\n"));
                        }
                        let _ = s.write_all(out.as_bytes());
                        // Open until coli goes.
                        while s.write_all(chunk(": keep-alive\n\n").as_bytes()).is_ok() {
                            std::thread::sleep(Duration::from_millis(200));
                        }
                        Ok(())
                    }
                    "/v1/chat/completions" => {
                        let mut out = sse.to_string();
                        for d in [
                            r#"{"choices":[{"index":0,"delta":{"content":"Hi from"}}]}"#,
                            r#"{"choices":[{"index":0,"delta":{"content":" the server"},"finish_reason":"stop"}]}"#,
                            r#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":5}}"#,
                            "[DONE]",
                        ] {
                            out += &chunk(&format!("data: {d}\n\n"));
                        }
                        out += "0\r\n\r\n";
                        s.write_all(out.as_bytes())
                    }
                    _ => s.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"),
                };
            });
        }
    });
    url
}

/// `coli --attach URL` on a scripted server: no daemon; the dashboard from its telemetry
/// stream, a turn's answer streamed from its chat endpoint with its footer, `:slot` saying
/// it does not apply, Ctrl-C quitting when idle.
#[test]
fn attached_to_a_server() {
    let url = scripted_api();
    let mut s = Session::spawn(&["--attach".into(), url.into()], None);
    s.wait_for("colibri is ready", 20);
    s.wait_for("RAM 12", 10);
    s.write(b"hello\r");
    s.wait_for("Hi from the server", 10);
    s.wait_for("└─ 5 tok", 10);
    s.wait_until("the status bar says attached", 5, |t| {
        t.contains("│ attached") || t.contains("│attached")
    });
    s.write(b":slot 1\r");
    s.wait_for(":slot does not apply", 5);
    s.write(b"\x03");
    assert_eq!(s.wait_exit(15), Some(0));
}

fn fake_daemon() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-colibri")
}

#[test]
fn chat_turn_then_ctrl_c_quits_cleanly() {
    let mut s = Session::start(&fake_daemon(), &[]);
    s.wait_for("colibri is ready", 20);
    s.wait_for("idle", 5);
    s.write(b"hello world\r");
    s.wait_for("you said: hello world", 10);
    s.wait_for("└─ 4 tok", 10);
    s.wait_for("prompt 2 · tok 4", 5);
    // The dashboard summary (100 columns, 30 rows: collapsed to one line).
    s.wait_for("RAM 6", 5);
    // Idle: Ctrl-C quits, closing the daemon's stdin (it exits 0 on EOF).
    s.write(b"\x03");
    assert_eq!(s.wait_exit(15), Some(0));
}

#[test]
fn ctrl_c_stops_an_answer_and_slots_use_prompt() {
    let mut s = Session::start(&fake_daemon(), &[]);
    s.wait_for("colibri is ready", 20);
    let long = "word ".repeat(60);
    s.write(format!("{long}\r").as_bytes());
    s.wait_for("you said: word", 10);
    s.write(b"\x03");
    s.wait_for("stopped by you; :more continues", 10);
    s.write(b":slot 2\r");
    s.wait_for("slot 2", 5);
    s.write(b"on two\r");
    s.wait_for("you said: on two", 10);
    s.write(b":q\r");
    assert_eq!(s.wait_exit(15), Some(0));
}

#[test]
fn a_killed_daemon_is_explained_and_can_be_restarted() {
    let mut s = Session::start(&fake_daemon(), &["--", "--die-after-load", "KILL"]);
    s.wait_for("killed by SIGKILL", 20);
    s.wait_for("out-of-memory killer", 5);
    s.wait_for("[fake] dying by KILL as asked", 5);
    s.write(b"r");
    s.wait_for("restarting colibri", 10);
    // The restarted daemon dies the same way.
    s.wait_for_n("• colibri killed by SIGKILL", 2, 20);
    s.write(b"q");
    assert_eq!(s.wait_exit(15), Some(0));
}

#[test]
fn mux_mode_sends_submit_and_shows_the_sessions() {
    let mut s = Session::start(&fake_daemon(), &["--mux"]);
    s.wait_for("colibri is ready", 20);
    s.write(b"hello world\r");
    s.wait_for("[0] you said: hello world", 10);
    s.wait_for("└─ 4 tok", 10);
    // SESSIONS on the telemetry fd: the summary line (100x30) counts them.
    s.wait_for("sessions idle 2", 10);
    s.write(b"\x03");
    assert_eq!(s.wait_exit(15), Some(0));
}

/// The real daemon, when one that serves has been built.
/// The real `colibri` beside `coli` (or `$COLIBRI_BIN`), built first when a `cargo test -p coli`
/// run did not build it.
fn real_daemon() -> PathBuf {
    if let Some(p) = std::env::var_os("COLIBRI_BIN") {
        return PathBuf::from(p);
    }
    let dir = Path::new(env!("CARGO_BIN_EXE_coli"))
        .parent()
        .expect("target dir");
    let path = dir.join("colibri");
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--quiet", "-p", "colibri", "--bin", "colibri"]);
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        assert!(
            cmd.status().expect("cargo build").success(),
            "building colibri failed"
        );
    }
    path
}

#[test]
fn real_colibri_serve_end_to_end() {
    let daemon = real_daemon();
    // A private cache directory: the demo model is written there afresh, with no usage
    // history from earlier runs (which would pin experts at start).
    let cache = std::env::temp_dir().join(format!("coli-pty-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let mut s = Session::start_with_cache(&daemon, &[], Some(&cache));
    s.wait_for("colibri is ready", 180);
    // Before any turn no routed expert is in RAM: the summary line says so.
    s.wait_for("■RAM 0 ", 10);
    s.write(b"Hello\r");
    // The answer streams and ends with its footer; the tier figures change as experts load.
    s.wait_for("└─ ", 300);
    s.wait_for("idle", 10);
    // TIERS comes on the telemetry fd, which may trail stdout's END/STAT a little.
    s.wait_until("the tier figures change", 10, |t| !t.contains("■RAM 0 "));
    let screen = s.screen.text();
    assert!(screen.contains("› Hello"), "{screen}");
    assert!(screen.contains("hit "), "{screen}");
    s.write(b"\x03");
    assert_eq!(s.wait_exit(30), Some(0));
}

#[test]
fn real_colibri_serve_mux_end_to_end() {
    let daemon = real_daemon();
    let cache = std::env::temp_dir().join(format!("coli-pty-mux-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let mut s =
        Session::start_with_cache(&daemon, &["--mux", "--", "--kv-slots", "2"], Some(&cache));
    s.wait_for("colibri is ready", 180);
    s.write(b"Hello\r");
    // The answer streams over DATA frames and ends with DONE's footer.
    s.wait_for("└─ ", 300);
    // The daemon's SESSIONS line: slot 0 now holds a conversation.
    s.wait_until("the sessions summary", 20, |t| t.contains("sessions"));
    s.write(b"\x03");
    assert_eq!(s.wait_exit(30), Some(0));
}

/// Outside a terminal (a pipe, a script) `coli` says in one line where to go and exits 2,
/// before it starts a daemon.
#[test]
fn outside_a_terminal_it_points_at_colibri_run_and_exits_2() {
    let out = Command::new(env!("CARGO_BIN_EXE_coli"))
        .arg("--daemon")
        .arg("/nonexistent/colibri")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("run coli");
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "coli: needs a terminal (its stdin and stdout are not one); for scripts and pipes use \
         `colibri run`, e.g. `echo 'Why is the sky blue?' | colibri run`\n"
    );
}

/// A daemon that cannot be started: `coli` shows why, and once quit exits 1 with the reason
/// on stderr (the terminal is back by then).
#[test]
fn a_daemon_that_cannot_start_makes_coli_exit_1() {
    let mut s = Session::start(Path::new("/nonexistent/colibri"), &[]);
    s.wait_for("could not start colibri", 20);
    s.write(b"q");
    assert_eq!(s.wait_exit(15), Some(1));
    s.wait_for("coli: could not start /nonexistent/colibri", 5);
}

/// `coli --snap FILE.gguf`: the daemon it starts runs a GGUF model (issue 49) and answers.
#[test]
fn real_colibri_serve_on_a_gguf() {
    let daemon = real_daemon();
    let gguf =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gguf/tiny-glm4-moe-f32.gguf");
    let state = std::env::temp_dir().join(format!("coli-pty-gguf-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    let (snap, state) = (gguf.to_str().unwrap(), state.to_str().unwrap());
    let mut s = Session::start(&daemon, &["--snap", snap, "--", "--state-dir", state]);
    s.wait_for("colibri is ready", 180);
    s.write(b"Hello\r");
    s.wait_for("└─ ", 300);
    assert!(s.screen.text().contains("› Hello"), "{}", s.screen.text());
    s.write(b"\x03");
    assert_eq!(s.wait_exit(30), Some(0));
    // The daemon it started served the GGUF: the state folder's fingerprint names the file.
    let fp = std::fs::read_to_string(Path::new(state).join(".coli_fingerprint")).unwrap();
    assert!(fp.contains("tiny-glm4-moe-f32.gguf"), "{fp}");
}
