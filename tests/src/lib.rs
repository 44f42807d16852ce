//! Helpers shared by the end-to-end tests: locating (and if needed building) the real
//! binaries, the fixture paths, and running a command to completion.

pub mod gguf_edit;
pub mod gpu;
pub mod http;
pub mod mux;
pub mod oracle;
pub mod state;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The workspace root (the parent of this crate).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

pub fn fixture(name: &str) -> PathBuf {
    root().join("tests").join("fixtures").join(name)
}

/// `target/<profile>/` of the running test binary (it lives in `target/<profile>/deps/`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(|deps| deps.parent())
        .expect("test binary lives in target/<profile>/deps")
        .to_path_buf()
}

/// Path of a workspace binary, built once per test process with the same profile so the test
/// never runs a stale binary.
pub fn bin(name: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    let dir = profile_dir();
    BUILT.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(root())
            .args(["build", "--quiet", "--bin", "colibri", "--bin", "coli"]);
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd
            .status()
            .expect("running cargo build for the end-to-end binaries");
        assert!(status.success(), "cargo build of the binaries failed");
    });
    dir.join(name)
}

/// Path of one of the daemon package's examples (`daemon/examples/<name>.rs`), built once per
/// name with the test's profile.
pub fn example(name: &str) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let dir = profile_dir();
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if !built.iter().any(|n| n == name) {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(root())
            .args(["build", "--quiet", "-p", "colibri", "--example", name]);
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("running cargo build for an example");
        assert!(status.success(), "cargo build of example {name} failed");
        built.push(name.to_string());
    }
    dir.join("examples").join(name)
}

pub fn colibri() -> Command {
    let mut c = Command::new(bin("colibri"));
    // Keep the user's environment from changing what the tests see.
    for var in [
        "SNAP",
        "EXPERT_BITS",
        "DENSE_BITS",
        "GROUP_SIZE",
        "TEMP",
        "NUCLEUS",
        "SEED",
        "NGEN",
        "THINK",
        "COLI_ACT",
        "COLI_ATTN",
        "THREADS",
        "OMP_NUM_THREADS",
        "COLI_TEMP",
        "SERVE",
        "SERVE_BATCH",
        "KV_SLOTS",
        "COLI_KV_SHARE",
        "REF",
        "CTX",
        // The read mode: `--direct auto` is the default the tests expect.
        "DIRECT",
    ] {
        c.env_remove(var);
    }
    c
}

pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("spawning the binary");
    assert!(
        out.status.success(),
        "{:?} failed with {}\nstdout:\n{}\nstderr:\n{}",
        cmd,
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `validate --case short` of `snap` against the oracle file `reference`, which must refuse
/// the model before any weight is used: asserts exit 2 and returns stderr for the caller to
/// check that the refusal names the key or tensor.
pub fn validate_refused(snap: &Path, reference: &Path) -> String {
    let o = colibri()
        .arg("validate")
        .arg("--snap")
        .arg(snap)
        .arg("--ref")
        .arg(reference)
        .args(["--case", "short"])
        .output()
        .expect("spawning colibri validate");
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{}: {err}", snap.display());
    err
}

/// `run` of `snap` with a two-token prompt, which must refuse the model before any weight is
/// used: asserts exit 2 and returns stderr for the caller to check what the refusal names.
pub fn run_refused(snap: &Path) -> String {
    let o = colibri()
        .arg("run")
        .arg("--snap")
        .arg(snap)
        .args(["--max-tokens", "2", "--temp", "0", "hi"])
        .output()
        .expect("spawning colibri run");
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{}: {err}", snap.display());
    err
}

/// A command's stderr as text, for failure messages.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn last_line(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .lines()
        .last()
        .unwrap_or("")
        .to_string()
}

/// A running `colibri serve` with piped stdio, read frame by frame.
pub struct Daemon {
    pub child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    stderr_path: PathBuf,
}

/// A fresh, empty temporary directory unique to this test.
///
/// Directories are kept after the test (a failure's files stay there to be read), and the
/// first call of each test process removes those left by earlier processes that have exited,
/// so repeated `cargo test` runs do not fill the temporary directory.
pub fn temp_dir(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    static SWEEP: std::sync::Once = std::sync::Once::new();
    SWEEP.call_once(sweep_stale_temp_dirs);
    let dir = std::env::temp_dir().join(format!(
        "colibri-e2e-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating a temp dir");
    dir
}

/// Removes `colibri-e2e-<tag>-<pid>-<n>` directories whose process is gone (no `/proc/<pid>`;
/// where `/proc` is missing nothing is removed).
fn sweep_stale_temp_dirs() {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with("colibri-e2e-") {
            continue;
        }
        // The pid is the second number from the end: the tag itself may hold dashes.
        let mut parts = name.rsplit('-');
        let (Some(n), Some(pid)) = (parts.next(), parts.next()) else {
            continue;
        };
        let (Ok(_), Ok(pid)) = (n.parse::<usize>(), pid.parse::<u32>()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl Daemon {
    /// Starts `colibri serve <args>` and reads its startup frames (READY, STAT, TIERS).
    /// Returns the daemon and the startup bytes.
    pub fn start(args: &[&str], state: &Path) -> (Daemon, Vec<u8>) {
        let stderr_path = state.join(format!(
            "stderr-{}.log",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let mut cmd = colibri();
        cmd.arg("serve").args(args).arg("--state-dir").arg(state);
        Daemon::spawn(&mut cmd, stderr_path)
    }

    /// Starts a greedy daemon on `snap`: `colibri serve --snap snap --ctx 512 --temp 0
    /// <extra>`, the setting most protocol tests compare answers under.
    pub fn greedy(snap: &Path, state: &Path, extra: &[&str]) -> (Daemon, Vec<u8>) {
        let snap = snap.to_str().expect("a UTF-8 fixture path");
        let mut args = vec!["--snap", snap, "--ctx", "512", "--temp", "0"];
        args.extend_from_slice(extra);
        Daemon::start(&args, state)
    }

    /// Starts an already configured `colibri serve` command, its stderr going to
    /// `stderr_path`, and reads its startup frames (READY, STAT, TIERS).
    pub fn spawn(cmd: &mut Command, stderr_path: PathBuf) -> (Daemon, Vec<u8>) {
        use std::process::Stdio;
        let stderr = std::fs::File::create(&stderr_path).expect("stderr log");
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawning colibri serve");
        let stdin = child.stdin.take();
        let stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        let mut d = Daemon {
            child,
            stdin,
            stdout,
            stderr_path,
        };
        let mut startup = Vec::new();
        for _ in 0..3 {
            startup.extend(d.read_line());
        }
        (d, startup)
    }

    pub fn read_line(&mut self) -> Vec<u8> {
        use std::io::BufRead;
        let mut line = Vec::new();
        let n = self
            .stdout
            .read_until(b'\n', &mut line)
            .expect("reading daemon stdout");
        assert!(
            n > 0,
            "daemon stdout closed early; stderr:\n{}",
            self.stderr()
        );
        line
    }

    pub fn send(&mut self, bytes: &[u8]) {
        use std::io::Write;
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(bytes).expect("writing daemon stdin");
        stdin.flush().expect("flushing daemon stdin");
    }

    /// Reads one turn's reply: everything up to and including the END sentinel and the STAT
    /// line after it. Returns (bytes before END, the END framing as sent, the STAT line).
    pub fn read_turn(&mut self) -> (Vec<u8>, Vec<u8>, String) {
        use std::io::Read;
        let end = b"\x01\x01END\x01\x01\n";
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        while !buf.ends_with(end) {
            let n = self.stdout.read(&mut byte).expect("reading daemon stdout");
            assert!(
                n > 0,
                "daemon stdout closed mid-turn after {:?}; stderr:\n{}",
                String::from_utf8_lossy(&buf),
                self.stderr()
            );
            buf.push(byte[0]);
        }
        buf.truncate(buf.len() - end.len());
        let stat = String::from_utf8(self.read_line()).expect("STAT is text");
        (buf, end.to_vec(), stat)
    }

    /// Sends a `\x02PROMPT` and returns (streamed text, STAT line).
    pub fn prompt(&mut self, text: &str, max_tokens: u32, slot: Option<u32>) -> (Vec<u8>, String) {
        let mut req = format!("\x02PROMPT {} {max_tokens} 0 1", text.len());
        if let Some(s) = slot {
            req.push_str(&format!(" {s}"));
        }
        req.push('\n');
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(text.as_bytes());
        bytes.push(b'\n');
        self.send(&bytes);
        let (text, _, stat) = self.read_turn();
        (text, stat)
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Closes stdin and waits for a clean exit.
    pub fn finish(mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        self.child.wait().expect("waiting for the daemon")
    }

    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    /// Reads whatever part of a line is available (used to wait until streaming started).
    pub fn read_line_partial(&mut self) -> Vec<u8> {
        use std::io::Read;
        let mut b = [0u8; 1];
        let _ = self.stdout.read(&mut b);
        b.to_vec()
    }
}

/// What a fresh greedy engine on `snap` answers to `prompt` (raw, no template), in process:
/// the ids and their bytes. `endoftext_only` uses the multiplexed protocol's stop set (only
/// `<|endoftext|>`) instead of the model's.
pub fn greedy_answer(
    snap: &Path,
    prompt: &str,
    max_new: usize,
    endoftext_only: bool,
) -> (Vec<u32>, Vec<u8>) {
    let mut engine = colibri::engine::Engine::open(
        vec![snap.to_path_buf()],
        colibri::model::LoadOptions::default(),
    )
    .expect("loading the model");
    if endoftext_only {
        engine.stop_on_end_of_text_only();
    }
    let ids = engine.tokenizer().encode(prompt).expect("tokenizing");
    greedy_on(&mut engine, ids, max_new)
}

/// What a fresh greedy engine on `snap` answers to the prompt `ids` (already tokenized), in
/// process: the ids and their bytes.
pub fn greedy_answer_ids(snap: &Path, ids: &[u32], max_new: usize) -> (Vec<u32>, Vec<u8>) {
    let mut engine = colibri::engine::Engine::open(
        vec![snap.to_path_buf()],
        colibri::model::LoadOptions::default(),
    )
    .expect("loading the model");
    greedy_on(&mut engine, ids.to_vec(), max_new)
}

fn greedy_on(
    engine: &mut colibri::engine::Engine,
    ids: Vec<u32>,
    max_new: usize,
) -> (Vec<u32>, Vec<u8>) {
    use colibri::engine::{Event, TurnSpec};
    engine
        .begin(
            0,
            TurnSpec::new(ids, max_new, colibri::sampling::Sampler::greedy()),
        )
        .expect("begin");
    let mut out = Vec::new();
    engine
        .finish_turn(0, |_, e, _| {
            if let Event::Token { id, .. } = e {
                out.push(*id);
            }
            true
        })
        .expect("generation");
    let bytes = engine.tokenizer().decode_bytes(&out);
    (out, bytes)
}

/// The bytes of tensor `name` in the safetensors files of `dir`.
pub fn tensor_bytes(dir: &std::path::Path, name: &str) -> Vec<u8> {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "safetensors") {
            continue;
        }
        let bytes = std::fs::read(&p).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        if let Some(t) = header.get(name) {
            let off = t["data_offsets"].as_array().unwrap();
            let (a, b) = (
                off[0].as_u64().unwrap() as usize,
                off[1].as_u64().unwrap() as usize,
            );
            return bytes[8 + n + a..8 + n + b].to_vec();
        }
    }
    panic!("no {name} in {}", dir.display())
}
