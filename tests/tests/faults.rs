//! Injected expert-read faults (`COLI_FAULT_READ`, a test aid) and a shard cut short under a
//! running daemon, in both protocols: the failing request ends with a clear error (legacy:
//! END + zero STAT and a stderr line naming shard, offset and errno; mux: `ERROR <id>
//! ENGINE_ERROR`), the conversation file stays byte for byte as before the request, the
//! sessions batched with it go on, and the next request answers as a fresh daemon would.

use std::path::{Path, PathBuf};
use std::process::Command;

use colibri_e2e::mux::{data_of, error_of, submit_bytes, MuxDaemon};
use colibri_e2e::{colibri, fixture, greedy_answer, temp_dir, Daemon};
use protocol::mux::ErrorCode;

/// The MoE fixture (experts are read from its shards); a 3-expert LRU and no pins keep every
/// request reading from disk.
const MODEL: &str = "tiny-moe-bias";

fn daemon(state: &Path, snap: &Path, fault: Option<&str>) -> Command {
    let mut c = colibri();
    c.env("CAP", "3")
        .env("AUTOPIN", "0")
        .env_remove("COLI_FAULT_READ");
    if let Some(f) = fault {
        c.env("COLI_FAULT_READ", f);
    }
    c.args(["serve", "--snap"])
        .arg(snap)
        .args(["--ctx", "512", "--ngen", "24", "--temp", "0", "--state-dir"])
        .arg(state);
    c
}

fn legacy(state: &Path, snap: &Path, fault: Option<&str>) -> Daemon {
    let stderr_path = state.join(format!("stderr-{}.log", fault.unwrap_or("none")));
    Daemon::spawn(&mut daemon(state, snap, fault), stderr_path).0
}

fn assert_zero_stat(stat: &str) {
    let f: Vec<&str> = stat.trim_end().split(' ').collect();
    assert_eq!(f[0], "STAT", "{stat:?}");
    assert_eq!(&f[1..4], ["0", "0.00", "0.0"], "{stat:?}");
    assert_eq!(&f[5..], ["0", "0"], "{stat:?}");
}

fn p1() -> &'static str {
    "[gMASK]<sop><|user|>Tell me about the sea.<|assistant|><think></think>"
}

/// A saved conversation of `p1` (no faults), and the follow-up prompt that continues it.
fn saved_conversation() -> (PathBuf, String) {
    let snap = fixture(MODEL);
    let state = temp_dir("fault-src");
    let mut d = legacy(&state, &snap, None);
    let (ans, _) = d.prompt(p1(), 6, None);
    assert!(d.finish().success());
    let p2 = format!(
        "{}{}<|user|>And the sky?<|assistant|><think></think>",
        p1(),
        String::from_utf8_lossy(&ans)
    );
    (state, p2)
}

fn copy_state(from: &Path, tag: &str) -> PathBuf {
    let to = temp_dir(tag);
    std::fs::copy(from.join(".coli_kv"), to.join(".coli_kv")).unwrap();
    to
}

#[test]
fn legacy_eio_and_short_reads_end_the_turn_cleanly_and_the_next_one_works() {
    let snap = fixture(MODEL);
    let (src, p2) = saved_conversation();
    let before = std::fs::read(src.join(".coli_kv")).unwrap();
    // Reference: the same conversation continued by a daemon that never fails.
    let clean = copy_state(&src, "fault-ref");
    let mut d = legacy(&clean, &snap, None);
    let (want, _) = d.prompt(&p2, 8, None);
    assert!(d.finish().success());
    let after_clean = std::fs::read(clean.join(".coli_kv")).unwrap();
    assert_eq!(want, greedy_answer(&snap, &p2, 8, false).1);

    for (fault, errno) in [
        ("1:eio", "Input/output error (os error 5)"),
        ("1:short", "short read: "),
    ] {
        let state = copy_state(&src, "fault");
        let mut d = legacy(&state, &snap, Some(fault));
        let (body, stat) = d.prompt(&p2, 8, None);
        assert!(body.is_empty(), "{fault}: {body:?}");
        assert_zero_stat(&stat);
        let err = d.stderr();
        let line = err
            .lines()
            .find(|l| l.starts_with("[serve] turn failed: "))
            .unwrap_or_else(|| panic!("{fault}: no failure line in\n{err}"));
        assert!(line.contains(".safetensors: reading "), "{line}");
        assert!(line.contains(" bytes at offset "), "{line}");
        assert!(line.contains(errno), "{fault}: {line}");
        // The failed turn left the saved conversation exactly as it was.
        let now = std::fs::read(state.join(".coli_kv")).unwrap();
        assert!(
            now == before,
            "{fault}: {} bytes now, {} before; {}",
            now.len(),
            before.len(),
            d.stderr()
        );
        // The fault is spent: the same request now answers as the clean daemon did.
        let (again, stat) = d.prompt(&p2, 8, None);
        assert!(!stat.starts_with("STAT 0 "), "{stat:?}");
        assert_eq!(again, want, "{fault}");
        assert!(d.finish().success());
        assert!(
            std::fs::read(state.join(".coli_kv")).unwrap() == after_clean,
            "{fault}"
        );
    }
}

fn mux(state: &Path, snap: &Path, fault: Option<&str>) -> MuxDaemon {
    let mut c = daemon(state, snap, fault);
    c.args(["--mux", "--kv-slots", "4"]);
    MuxDaemon::start_with(&mut c, state).0
}

fn chat(text: &str) -> String {
    format!("[gMASK]<sop><|user|>{text}<|assistant|><think></think>")
}

#[test]
fn mux_a_failed_read_is_an_engine_error_and_the_next_request_works() {
    let snap = fixture(MODEL);
    let a = chat("Tell me about the sea.");
    let want = greedy_answer(&snap, &a, 8, true).1;
    for fault in ["1:eio", "1:short"] {
        let state = temp_dir("mux-fault");
        let mut d = mux(&state, &snap, Some(fault));
        d.submit(1, 0, &a, 8);
        let r = d.until_end_of(1);
        assert_eq!(error_of(&r, 1), Some(ErrorCode::EngineError), "{r:?}");
        assert!(
            d.stderr().contains("request 1 (slot 0) failed: "),
            "{}",
            d.stderr()
        );
        d.submit(2, 0, &a, 8);
        let r = d.until_end_of(2);
        assert_eq!(error_of(&r, 2), None, "{r:?}");
        assert_eq!(data_of(&r, 2), want, "{fault}");
        let (status, _) = d.finish();
        assert!(status.success());
    }
}

/// Two requests sent in one write (both are decoded before the first step, so they share
/// its forward) to a mux daemon of `snap` whose `fault` read fails: the batch is retried one
/// by one, both go on and each answers `max_new` tokens as it does alone.
fn assert_batched_with_a_failed_read_go_on(
    snap: &Path,
    a: &str,
    b: &str,
    fault: &str,
    max_new: u32,
) {
    let want_a = greedy_answer(snap, a, max_new as usize, true).1;
    let want_b = greedy_answer(snap, b, max_new as usize, true).1;
    let state = temp_dir(&format!("mux-batch-fault-{}", fault.replace(':', "-")));
    let mut d = mux(&state, snap, Some(fault));
    let mut both = submit_bytes(1, 0, a, max_new);
    both.extend(submit_bytes(2, 1, b, max_new));
    d.send(&both);
    let mut r = d.until_end_of(1);
    r.extend(d.until_end_of(2));
    let err = d.stderr();
    assert!(
        err.contains("failed batch of 2 retried one by one: 2 went on, 0 failed"),
        "{err}"
    );
    assert_eq!(error_of(&r, 1), None, "{r:?}");
    assert_eq!(error_of(&r, 2), None, "{r:?}");
    assert_eq!(data_of(&r, 1), want_a);
    assert_eq!(data_of(&r, 2), want_b);
    let (status, _) = d.finish();
    assert!(status.success());
}

#[test]
fn mux_sessions_batched_with_a_failed_read_go_on() {
    let a = chat("Tell me about the sea.");
    let b = chat("How many legs does a spider have?");
    assert_batched_with_a_failed_read_go_on(&fixture(MODEL), &a, &b, "1:eio", 8);
}

/// Qwen3.5-MoE keeps a recurrent state per conversation that a failed forward has already
/// advanced in the layers before the failing read. The batch's retry must start from the
/// state the batch started from: the cache goes back to a saved state (or to 0) and feeds
/// the positions it lost again, so both answers are the ones each gets alone. Read 40 falls
/// in a decode step, after the batched prefill: the states are past 0.
#[test]
fn mux_recurrent_sessions_batched_with_a_failed_decode_read_go_on_exactly() {
    let snap = fixture("tiny-qwen35-moe");
    let (a, b) = ("The sea is wide and", "Spiders have eight legs, and");
    assert_batched_with_a_failed_read_go_on(&snap, a, b, "40:eio", 12);
}

/// A copy of the fixture whose expert shards can be cut and restored.
fn model_copy() -> PathBuf {
    let dir = temp_dir("shard-copy");
    for e in std::fs::read_dir(fixture(MODEL)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    dir
}

#[test]
fn a_shard_cut_short_under_a_running_daemon_fails_requests_until_restored() {
    let snap = model_copy();
    let a = chat("Tell me about the sea.");
    let want = greedy_answer(&fixture(MODEL), &a, 8, false).1;
    let state = temp_dir("shard-cut");
    let mut d = legacy(&state, &snap, None);
    let shards: Vec<PathBuf> = std::fs::read_dir(&snap)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    let originals: Vec<Vec<u8>> = shards.iter().map(|p| std::fs::read(p).unwrap()).collect();
    // Cut in place (same inode the daemon has open): every expert read past the cut fails.
    for (p, bytes) in shards.iter().zip(&originals) {
        let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
        f.set_len(bytes.len() as u64 / 4).unwrap();
    }
    let (body, stat) = d.prompt(&a, 8, None);
    assert!(body.is_empty(), "{body:?}");
    assert_zero_stat(&stat);
    let err = d.stderr();
    assert!(err.contains("[serve] turn failed: "), "{err}");
    assert!(err.contains(".safetensors: reading "), "{err}");
    for (p, bytes) in shards.iter().zip(&originals) {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
        f.write_all_at(bytes, 0).unwrap();
    }
    let (again, _) = d.prompt(&a, 8, None);
    assert_eq!(again, want);
    assert!(d.finish().success());
}

/// Cuts every shard of `snap` to a quarter in place (the inode the daemon has open); returns
/// what restores them.
fn cut_shards(snap: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let shards: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(snap)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect();
    for (p, bytes) in &shards {
        let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
        f.set_len(bytes.len() as u64 / 4).unwrap();
    }
    shards
}

fn restore_shards(shards: &[(PathBuf, Vec<u8>)]) {
    use std::os::unix::fs::FileExt;
    for (p, bytes) in shards {
        let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
        f.write_all_at(bytes, 0).unwrap();
    }
}

#[test]
fn mux_a_shard_cut_short_fails_the_request_and_the_next_works_once_restored() {
    let snap = model_copy();
    let a = chat("Tell me about the sea.");
    let b = chat("How many legs does a spider have?");
    let want_a = greedy_answer(&fixture(MODEL), &a, 8, true).1;
    let want_b = greedy_answer(&fixture(MODEL), &b, 8, true).1;
    let state = temp_dir("mux-shard-cut");
    let mut d = mux(&state, &snap, None);
    // Slot 1 holds a finished conversation; the cut must leave its saved file alone.
    d.submit(1, 1, &b, 8);
    let r = d.until_end_of(1);
    assert_eq!(data_of(&r, 1), want_b);
    let saved: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&state)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(".coli_kv")
        })
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect();
    assert!(!saved.is_empty(), "slot 1 was saved");
    let shards = cut_shards(&snap);
    d.submit(2, 0, &a, 8);
    let r = d.until_end_of(2);
    assert_eq!(error_of(&r, 2), Some(ErrorCode::EngineError), "{r:?}");
    let err = d.stderr();
    assert!(err.contains("request 2 (slot 0) failed: "), "{err}");
    assert!(err.contains(".safetensors: reading "), "{err}");
    // Slot 0 had no conversation and still has none: its file holds no record (before, the
    // daemon had only created it). Rows slot 0 adopted from slot 1 for the failed prompt are
    // not kept.
    let slot0 = std::fs::read(state.join(".coli_kv")).unwrap();
    assert!(
        slot0.is_empty() || (slot0.starts_with(b"COLIKV2\0") && slot0[32..36] == [0; 4]),
        "slot 0 holds no record: {slot0:02x?}"
    );
    for (p, bytes) in saved.iter().filter(|(p, _)| p.ends_with(".coli_kv.1")) {
        let now = std::fs::read(p).unwrap();
        assert!(
            &now == bytes,
            "{} changed: {:02x?} before, {:02x?} now",
            p.display(),
            &bytes[..bytes.len().min(48)],
            &now[..now.len().min(48)]
        );
    }
    restore_shards(&shards);
    d.submit(3, 0, &a, 8);
    let r = d.until_end_of(3);
    assert_eq!(error_of(&r, 3), None, "{r:?}");
    assert_eq!(data_of(&r, 3), want_a);
    let (status, _) = d.finish();
    assert!(status.success());
}

#[test]
fn mmap_reads_of_a_shard_cut_short_fail_cleanly_instead_of_sigbus() {
    let snap = model_copy();
    let a = chat("Tell me about the sea.");
    let want = greedy_answer(&fixture(MODEL), &a, 8, false).1;
    let state = temp_dir("mmap-shard-cut");
    let mut cmd = daemon(&state, &snap, None);
    cmd.arg("--mmap");
    let mut d = Daemon::spawn(&mut cmd, state.join("stderr-mmap.log")).0;
    let shards = cut_shards(&snap);
    let (body, stat) = d.prompt(&a, 8, None);
    assert!(body.is_empty(), "{body:?}");
    assert_zero_stat(&stat);
    let err = d.stderr();
    assert!(err.contains("[serve] turn failed: "), "{err}");
    assert!(err.contains(".safetensors"), "{err}");
    restore_shards(&shards);
    let (again, _) = d.prompt(&a, 8, None);
    assert_eq!(again, want);
    // A SIGBUS would have ended the daemon by a signal, not with status 0.
    assert!(d.finish().success());
}

/// Shards unlinked under a running daemon: the open descriptors (and maps) keep the files'
/// bytes, so requests go on answering exactly (nothing is reopened by name while serving); a
/// restart then refuses the directory cleanly.
#[test]
fn shards_unlinked_under_a_running_daemon_keep_serving_from_the_open_files() {
    for mmap in [false, true] {
        let snap = model_copy();
        let a = chat("Tell me about the sea.");
        let want = greedy_answer(&fixture(MODEL), &a, 8, false).1;
        let state = temp_dir("shard-unlink");
        let mut cmd = daemon(&state, &snap, None);
        if mmap {
            cmd.arg("--mmap");
        }
        let mut d = Daemon::spawn(&mut cmd, state.join("stderr-unlink.log")).0;
        for e in std::fs::read_dir(&snap).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "safetensors") {
                std::fs::remove_file(p).unwrap();
            }
        }
        let (body, _) = d.prompt(&a, 8, None);
        assert_eq!(body, want, "mmap {mmap}: {}", d.stderr());
        assert!(d.finish().success());
        let out = daemon(&temp_dir("shard-unlink-restart"), &snap, None)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        // A runtime failure naming the directory (CONTRACT §2: exit 1), never a READY.
        assert_eq!(out.status.code(), Some(1), "mmap {mmap}");
        assert!(out.stdout.is_empty());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("no *.safetensors files in") && err.contains(snap.to_str().unwrap()),
            "{err}"
        );
    }
}
