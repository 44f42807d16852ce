//! Saved state a user can trust (CONTRACT.md §4): one daemon per state folder, conversations
//! bound to the weights and formats that made them, saves that survive a deleted file or
//! folder, a failed save said on the telemetry channel, legacy SIGTERM/SIGHUP finishing the
//! turn, and a shard cut short under `--mmap` naming the file instead of a silent SIGBUS.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use colibri_e2e::mux::{data_of, MuxDaemon};
use colibri_e2e::{colibri, fixture, temp_dir, Daemon};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use protocol::mux::MuxReply;

const MODEL: &str = "tiny-moe-bias";
const P1: &str = "[gMASK]<sop><|user|>Tell me about the sea.<|assistant|><think></think>";

fn serve_args(snap: &Path) -> Vec<String> {
    ["--snap", snap.to_str().unwrap(), "--temp", "0"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// A legacy daemon whose stderr goes to a file outside `state` (tests here delete `state`).
fn legacy(snap: &Path, state: &Path, extra: &[&str]) -> (Daemon, PathBuf) {
    let log = temp_dir("state-log").join("stderr.log");
    let mut cmd = colibri();
    cmd.arg("serve")
        .args(serve_args(snap))
        .args(extra)
        .arg("--state-dir")
        .arg(state);
    let (d, _) = Daemon::spawn(&mut cmd, log.clone());
    (d, log)
}

/// `colibri serve` on `state` run to completion with no input: (exit code, stderr).
fn second(snap: &Path, state: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let out = colibri()
        .arg("serve")
        .args(serve_args(snap))
        .args(extra)
        .arg("--state-dir")
        .arg(state)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The `resumed conversation from disk: N tokens` count in a daemon's stderr (0 if none).
fn resumed(stderr: &str) -> usize {
    stderr
        .lines()
        .find_map(|l| {
            l.split("resumed conversation from disk: ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// Prompt + completion tokens of a 6-field STAT.
fn turn_tokens(stat: &str) -> usize {
    let f: Vec<&str> = stat.split_whitespace().collect();
    f[1].parse::<usize>().unwrap() + f[5].parse::<usize>().unwrap()
}

fn aside_files(state: &Path, name: &str) -> Vec<PathBuf> {
    let prefix = format!("{name}.aside-");
    std::fs::read_dir(state)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&prefix)
        })
        .collect()
}

#[test]
fn a_second_daemon_on_a_state_folder_is_refused_naming_the_holder() {
    let snap = fixture(MODEL);
    for (first_mux, second_mux) in [(false, false), (true, true), (false, true), (true, false)] {
        let state = temp_dir("lock");
        // The holder, with one turn saved (kept whole: its stdin open), and the tokens it
        // saved when the count is known.
        let (mut mux_holder, mut legacy_holder, tokens) = (None, None, None);
        let tokens = if first_mux {
            let args = serve_args(&snap);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let (mut d, _) = MuxDaemon::start(&args, &state);
            d.submit(1, 0, P1, 6);
            let r = d.until_end_of(1);
            assert!(!data_of(&r, 1).is_empty());
            mux_holder = Some(d);
            tokens
        } else {
            let (mut d, _) = legacy(&snap, &state, &[]);
            let (_, stat) = d.prompt(P1, 6, None);
            legacy_holder = Some(d);
            Some(turn_tokens(&stat))
        };
        let pid = match (&mux_holder, &legacy_holder) {
            (Some(d), _) => d.child.id(),
            (_, Some(d)) => d.child.id(),
            _ => unreachable!(),
        };
        let mode: &[&str] = if second_mux { &["--mux"] } else { &[] };
        let (code, err) = second(&snap, &state, mode);
        let what = format!("first mux {first_mux}, second mux {second_mux}");
        assert_eq!(code, Some(2), "{what}: {err}");
        assert!(err.contains(&format!("pid {pid}")), "{what}: {err}");
        assert!(
            err.contains("--state-dir") && err.contains("--kv-save 0"),
            "{what}: {err}"
        );
        // The way out that shares the folder: no saving, the holder's state untouched.
        let before = std::fs::read(state.join(".coli_kv")).unwrap();
        let mut both: Vec<&str> = mode.to_vec();
        both.extend(["--kv-save", "0"]);
        let (code, err) = second(&snap, &state, &both);
        assert_eq!(code, Some(0), "{what}: {err}");
        assert!(err.contains("writes none of it"), "{what}: {err}");
        assert!(
            std::fs::read(state.join(".coli_kv")).unwrap() == before,
            "{what}"
        );
        // The holder dies without a word: its lock goes with it, never stale.
        if let Some(d) = mux_holder {
            d.kill9();
        }
        if let Some(d) = legacy_holder {
            d.kill9();
        }
        let (mut d, _) = legacy(&snap, &state, &[]);
        let got = resumed(&d.stderr());
        if let Some(t) = tokens {
            // The last sampled token is fed by the next turn, not kept.
            assert!(
                got == t || got + 1 == t,
                "{what}: {got} of {t} ({} bytes saved): {}",
                std::fs::metadata(state.join(".coli_kv")).unwrap().len(),
                d.stderr()
            );
        } else {
            assert!(got > 0, "{what}: {}", d.stderr());
        }
        d.prompt(P1, 2, None);
        assert!(d.finish().success());
    }
}

#[test]
fn a_deleted_state_file_or_folder_is_made_anew_by_the_next_save() {
    let snap = fixture(MODEL);
    let state = temp_dir("deleted").join("state");
    std::fs::create_dir_all(&state).unwrap();
    let (mut d, log) = legacy(&snap, &state, &[]);
    d.prompt(P1, 6, None);
    std::fs::remove_file(state.join(".coli_kv")).unwrap();
    let (_, stat) = d.prompt(P1, 6, Some(0));
    let after_file = turn_tokens(&stat);
    let err = std::fs::read_to_string(&log).unwrap();
    assert!(
        err.contains(".coli_kv was deleted while the daemon ran"),
        "{err}"
    );
    // The whole folder goes (the turn's usage save may still be landing in it).
    while std::fs::remove_dir_all(&state).is_err() {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (_, stat) = d.prompt(P1, 4, Some(0));
    let after_folder = turn_tokens(&stat);
    assert!(d.finish().success());
    assert!(state.join(".coli_kv").is_file());
    // The usage history came back with the folder too.
    assert!(state.join(".coli_usage").is_file());
    let (d, log2) = legacy(&snap, &state, &[]);
    let err = std::fs::read_to_string(&log2).unwrap();
    let got = resumed(&err);
    assert!(
        got == after_folder || got + 1 == after_folder,
        "{got} of {after_folder}: {err}"
    );
    assert!(after_file > 0);
    d.kill9();
}

/// A copy of the fixture this test may change.
fn model_copy(tag: &str) -> PathBuf {
    let dir = temp_dir(tag).join("model");
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(fixture(MODEL)).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    dir
}

#[test]
fn other_weights_or_formats_never_resume_and_the_file_is_kept_aside() {
    let snap = model_copy("rebind");
    let state = temp_dir("rebind-state");
    let (mut d, _) = legacy(&snap, &state, &[]);
    d.prompt(P1, 6, None);
    assert!(d.finish().success());
    let saved = std::fs::read(state.join(".coli_kv")).unwrap();
    let usage = std::fs::read(state.join(".coli_usage")).unwrap();
    // Same weights, other expert format: set aside, never resumed.
    let (d, log) = legacy(&snap, &state, &["--expert-bits", "4"]);
    let err = std::fs::read_to_string(&log).unwrap();
    assert!(err.contains("saved with other compute formats"), "{err}");
    assert!(err.contains("kept as "), "{err}");
    assert_eq!(resumed(&err), 0, "{err}");
    d.kill9();
    let aside = aside_files(&state, ".coli_kv");
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert!(std::fs::read(&aside[0]).unwrap() == saved);
    // Put it back and resume under the same formats: it still belongs there.
    std::fs::rename(&aside[0], state.join(".coli_kv")).unwrap();
    let (d, log) = legacy(&snap, &state, &[]);
    assert!(resumed(&std::fs::read_to_string(&log).unwrap()) > 0);
    d.kill9();
    // Same shapes, other weights: one mantissa bit of the last value of a shard.
    let shard = std::fs::read_dir(&snap)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .max()
        .unwrap();
    let mut bytes = std::fs::read(&shard).unwrap();
    let n = bytes.len();
    bytes[n - 2] ^= 1;
    std::fs::write(&shard, &bytes).unwrap();
    let (d, log) = legacy(&snap, &state, &[]);
    let err = std::fs::read_to_string(&log).unwrap();
    assert!(err.contains("saved under other weights"), "{err}");
    assert!(err.contains("counted on other weights"), "{err}");
    assert_eq!(resumed(&err), 0, "{err}");
    d.kill9();
    assert_eq!(aside_files(&state, ".coli_kv").len(), 1);
    let usage_aside = aside_files(&state, ".coli_usage");
    assert_eq!(usage_aside.len(), 1, "{usage_aside:?}");
    assert!(std::fs::read(&usage_aside[0]).unwrap() == usage);
}

#[test]
fn legacy_sigterm_and_sighup_mid_turn_finish_the_turn_and_save_it() {
    let snap = fixture(MODEL);
    for sig in [Signal::SIGTERM, Signal::SIGHUP] {
        let state = temp_dir("term");
        let (mut d, log) = legacy(&snap, &state, &["--ctx", "4096"]);
        // Long enough that the signal lands mid-answer; the first streamed byte says it began.
        let req = format!("\x02PROMPT {} 3000 0 1\n{P1}\n", P1.len());
        d.send(req.as_bytes());
        d.read_line_partial();
        kill(Pid::from_raw(d.child.id() as i32), sig).unwrap();
        let (_, _, stat) = d.read_turn();
        assert!(stat.starts_with("STAT "), "{sig}: {stat:?}");
        let tokens = turn_tokens(&stat);
        assert!(tokens < 3000, "{sig}: the turn was cut short: {stat}");
        let status = d.child.wait().unwrap();
        assert!(status.success(), "{sig}: {status}");
        let err = std::fs::read_to_string(&log).unwrap();
        assert!(err.contains("SIGTERM/SIGHUP"), "{sig}: {err}");
        let (d, log) = legacy(&snap, &state, &["--ctx", "4096"]);
        let got = resumed(&std::fs::read_to_string(&log).unwrap());
        assert!(
            got == tokens || got + 1 == tokens,
            "{sig}: the finished turn was saved: {got} of {tokens}"
        );
        // Idle: the signal ends the daemon at once, 0.
        kill(Pid::from_raw(d.child.id() as i32), sig).unwrap();
        let mut d = d;
        assert!(d.child.wait().unwrap().success(), "{sig} while idle");
    }
}

#[test]
fn a_failed_save_is_said_on_the_telemetry_channel_and_done_still_follows() {
    let snap = fixture(MODEL);
    let base = temp_dir("kvsave-fail");
    let state = base.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let tele = base.join("telemetry.log");
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("exec \"$0\" serve --mux --snap \"$1\" --ctx 512 --temp 0 --state-dir \"$2\" --telemetry-fd 3 3>\"$3\"")
        .arg(colibri_e2e::bin("colibri"))
        .arg(&snap)
        .arg(&state)
        .arg(&tele);
    let (mut d, _) = MuxDaemon::start_with(&mut cmd, &base);
    d.submit(1, 0, P1, 4);
    d.until_end_of(1);
    assert!(!std::fs::read_to_string(&tele).unwrap().contains("KVSAVE"));
    // The folder goes, and a plain file takes its name: the save cannot make it anew.
    std::fs::remove_dir_all(&state).unwrap();
    std::fs::write(&state, b"in the way").unwrap();
    d.submit(2, 0, P1, 4);
    let r = d.until_end_of(2);
    assert!(
        r.iter().any(|x| matches!(x, MuxReply::Done { id: 2, .. })),
        "{r:?}"
    );
    let t = std::fs::read_to_string(&tele).unwrap();
    let line = t
        .lines()
        .find(|l| l.starts_with("KVSAVE "))
        .unwrap_or_default();
    assert!(line.starts_with("KVSAVE 0 fail saving to "), "{t}");
    assert!(line.contains(".coli_kv"), "{line}");
    d.kill9();
}

/// Every shard cut short under a daemon whose experts are mapped (`--mmap`) and cached: the
/// next turn fails before reading a byte past the cut (each forward checks the shards'
/// lengths: the dense weights are read in place from the maps), naming the file; the saved
/// conversation is intact, and once the files are restored the daemon answers again and exits
/// 0. A cut landing mid-forward instead (SIGBUS) is `daemon/tests/sigbus.rs`'s.
#[test]
fn a_shard_cut_short_under_mmap_fails_the_turn_naming_the_file_and_keeps_the_saved_one() {
    let base = temp_dir("sigbus");
    let snap = base.join("model");
    let out = colibri()
        .args(["convert", "--from"])
        .arg(fixture(MODEL))
        .arg("--to")
        .arg(&snap)
        .args(["--expert-bits", "4"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let state = base.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let (mut d, log) = legacy(&snap, &state, &["--mmap"]);
    let (ans, stat) = d.prompt(P1, 6, None);
    let saved = std::fs::read(state.join(".coli_kv")).unwrap();
    // The next prompt continues the conversation, so nothing saved is given up at its start.
    let p2 = format!(
        "{P1}{}<|user|>And the sky?<|assistant|><think></think>",
        String::from_utf8_lossy(&ans)
    );
    let mut shards = Vec::new();
    for e in std::fs::read_dir(&snap).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|e| e == "safetensors") {
            shards.push((p.clone(), std::fs::read(&p).unwrap()));
            std::fs::OpenOptions::new()
                .write(true)
                .open(&p)
                .unwrap()
                .set_len(4096)
                .unwrap();
        }
    }
    let (body, _) = d.prompt(&p2, 6, None);
    assert!(body.is_empty(), "{body:?}");
    let err = std::fs::read_to_string(&log).unwrap();
    assert!(err.contains("[serve] turn failed: "), "{err}");
    assert!(err.contains("out-00000.safetensors: reading "), "{err}");
    assert!(err.contains("shorter than"), "{err}");
    assert!(!err.contains("SIGBUS"), "{err}");
    // The conversation saved before the failed turn is intact: the records are the same
    // bytes; at most the durable count went down to the prefix the new prompt shared with it
    // (made durable as that turn began), never below the first prompt.
    let after = std::fs::read(state.join(".coli_kv")).unwrap();
    let count = |b: &[u8]| u32::from_le_bytes(b[32..36].try_into().unwrap()) as usize;
    assert_eq!(after.len(), saved.len());
    assert!(after[40..] == saved[40..] && after[..32] == saved[..32]);
    let prompt_tokens: usize = stat.split_whitespace().nth(5).unwrap().parse().unwrap();
    assert!(
        (prompt_tokens..=count(&saved)).contains(&count(&after)),
        "{} of {}",
        count(&after),
        count(&saved)
    );
    for (p, bytes) in &shards {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
        f.write_all_at(bytes, 0).unwrap();
    }
    let (again, stat) = d.prompt(&p2, 6, None);
    assert!(!again.is_empty(), "{stat}");
    assert!(
        d.finish().success(),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
}

#[test]
fn a_closed_stdout_ends_the_turn_saves_it_and_says_so() {
    use std::io::{Read, Write};
    let snap = fixture(MODEL);
    let state = temp_dir("epipe");
    let log = temp_dir("epipe-log").join("stderr.log");
    let mut child = colibri()
        .arg("serve")
        .args(serve_args(&snap))
        .arg("--state-dir")
        .arg(&state)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let req = format!("\x02PROMPT {} 3000 0 1\n{P1}\n", P1.len());
    stdin.write_all(req.as_bytes()).unwrap();
    // READY, the start-up lines, then the answer's first bytes: the turn is under way.
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    let started = |s: &[u8]| {
        let lines = s.iter().filter(|&&b| b == b'\n').count();
        lines > 3 || (lines == 3 && !s.ends_with(b"\n"))
    };
    while !started(&seen) {
        let n = stdout.read(&mut buf).unwrap();
        assert!(n > 0);
        seen.extend_from_slice(&buf[..n]);
    }
    drop(stdout);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    let err = std::fs::read_to_string(&log).unwrap();
    assert!(err.contains("stdout was closed"), "{err}");
    // What was answered before the pipe closed is saved and resumes.
    let (d, log) = legacy(&snap, &state, &[]);
    let got = resumed(&std::fs::read_to_string(&log).unwrap());
    assert!(got > P1.len() / 8, "resumed {got} tokens");
    d.kill9();
    drop(stdin);
}
