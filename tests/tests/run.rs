//! `colibri run` and the upstream-style launch: the demo model with no files, raw bytes on
//! stdout, and `SERVE=1 colibri <cap> <ebits> <dbits>` behaving as `colibri serve`.

use std::io::Write;
use std::process::Stdio;

use colibri_e2e::{colibri, fixture, run_ok, temp_dir};

#[test]
fn run_works_on_the_bundled_demo_model() {
    let home = temp_dir("demo-home");
    let out = run_ok(colibri().env("XDG_CACHE_HOME", &home).args([
        "run",
        "--prompt",
        "hi",
        "--max-tokens",
        "8",
        "--seed",
        "1",
    ]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("completion tokens"), "{err}");
    // Same seed, same bytes.
    let again = run_ok(colibri().env("XDG_CACHE_HOME", &home).args([
        "run",
        "--prompt",
        "hi",
        "--max-tokens",
        "8",
        "--seed",
        "1",
    ]));
    assert_eq!(out.stdout, again.stdout);
}

#[test]
fn run_reads_the_prompt_from_stdin() {
    let snap = fixture("tiny-dense-shared");
    // The usage history goes to a temp dir, not into the repository's fixture.
    let state = temp_dir("run-state");
    let mut child = colibri()
        .args(["run", "--raw", "--temp", "0", "--max-tokens", "6", "--snap"])
        .arg(&snap)
        .arg("--state-dir")
        .arg(&state)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"[gMASK]<sop><|user|>Hi<|assistant|>")
        .unwrap();
    let piped = child.wait_with_output().unwrap();
    assert!(piped.status.success());
    let flag = run_ok(
        colibri()
            .args([
                "run",
                "--raw",
                "--temp",
                "0",
                "--max-tokens",
                "6",
                "--prompt",
                "[gMASK]<sop><|user|>Hi<|assistant|>",
                "--snap",
            ])
            .arg(&snap)
            .arg("--state-dir")
            .arg(&state),
    );
    assert_eq!(piped.stdout, flag.stdout);
}

#[test]
fn upstream_style_launch_serves() {
    let state = temp_dir("upstream");
    let mut child = colibri()
        .args(["0", "16", "16"])
        .env("SERVE", "1")
        .env("SNAP", fixture("tiny-dense-shared"))
        .env("COLI_STATE_DIR", &state)
        .env("TEMP", "0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"Hello\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert!(out
        .stdout
        .starts_with(b"\x01\x01READY\x01\x01\nSTAT 0 0.00 0.0 "));
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("\x01\x01END\x01\x01\nSTAT "), "{s:?}");
}

/// A fixed raw prompt for the bundled demo model (trained on the King James Bible).
const DEMO_PROMPT: &str = "And God said";

fn demo_greedy(home: &std::path::Path, extra: &[&str], n: u32) -> Vec<u8> {
    let out = run_ok(
        colibri()
            .env("XDG_CACHE_HOME", home)
            .args(["run", "--raw", "--temp", "0", "--prompt", DEMO_PROMPT])
            .args(["--max-tokens", &n.to_string()])
            .args(extra),
    );
    out.stdout
}

#[test]
fn the_demo_model_writes_its_pinned_greedy_text() {
    // Pinned bytes: an accidental change of the embedded weights or of the engine's arithmetic
    // shows here. The text is the trained demo's greedy continuation at full precision.
    let home = temp_dir("demo-pinned");
    let got = demo_greedy(&home, &[], 24);
    assert_eq!(String::from_utf8_lossy(&got), DEMO_GREEDY);
}

const DEMO_GREEDY: &str =
    ", I will not be a man of man, and he shall not be done. And he said, I will not";

#[test]
fn every_format_loads_the_demo_model() {
    let home = temp_dir("demo-formats");
    let exact = demo_greedy(&home, &[], 8);
    for (bits, group) in [
        ("16", "64"),
        ("8", "64"),
        ("4", "64"),
        ("4", "0"),
        ("3", "64"),
        ("2", "64"),
    ] {
        let got = demo_greedy(
            &home,
            &[
                "--expert-bits",
                bits,
                "--dense-bits",
                bits,
                "--group-size",
                group,
            ],
            8,
        );
        assert!(!got.is_empty(), "{bits} bits, group {group}: no output");
        if bits == "16" {
            assert_eq!(got, exact);
        }
    }
}
