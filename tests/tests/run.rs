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

/// `colibri run` on the dense fixture with `env` set: (stdout, stderr, exit code).
fn run_with_env(env: &[(&str, &str)], extra: &[&str]) -> (Vec<u8>, String, Option<i32>) {
    let state = temp_dir("temp-env");
    let mut cmd = colibri();
    cmd.args([
        "run",
        "--raw",
        "--prompt",
        "Once upon a time",
        "--max-tokens",
        "12",
        "--seed",
        "7",
    ])
    .arg("--snap")
    .arg(fixture("tiny-dense-shared"))
    .arg("--state-dir")
    .arg(&state)
    .args(extra)
    .env_remove("COLI_TEMP");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.code(),
    )
}

#[test]
fn coli_temp_wins_over_temp_and_a_directory_temp_is_ignored() {
    let (greedy, _, code) = run_with_env(&[], &["--temp", "0"]);
    assert_eq!(code, Some(0));
    let (default, _, _) = run_with_env(&[], &[]);
    // upstream's `coli --temp 0` exports COLI_TEMP=0; TEMP may be anything.
    let (out, _, code) = run_with_env(&[("COLI_TEMP", "0"), ("TEMP", "1.5")], &[]);
    assert_eq!(code, Some(0));
    assert_eq!(out, greedy, "COLI_TEMP=0 is greedy whatever TEMP says");
    // Windows and MSYS export TEMP as a directory: ignored with a warning, default temperature.
    let (out, err, code) = run_with_env(&[("TEMP", "/tmp")], &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("TEMP=\"/tmp\" is not a number"), "{err}");
    assert_eq!(
        out, default,
        "a directory TEMP leaves the default temperature"
    );
    // A numeric TEMP still counts; a bad COLI_TEMP is refused with its name.
    let (out, _, _) = run_with_env(&[("TEMP", "0")], &[]);
    assert_eq!(out, greedy);
    let (_, err, code) = run_with_env(&[("COLI_TEMP", "hot")], &[]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("COLI_TEMP") && err.contains("not a number"),
        "{err}"
    );
    let (_, err, code) = run_with_env(&[("COLI_TEMP", "3")], &[]);
    assert_eq!(code, Some(2));
    assert!(err.contains("0..=2"), "{err}");
}

#[test]
fn omp_num_threads_sets_the_thread_count_when_threads_is_absent() {
    let (_, err, code) = run_with_env(&[("OMP_NUM_THREADS", "1")], &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("[threads] 1 (OMP_NUM_THREADS)"), "{err}");
    let (_, err, _) = run_with_env(&[("OMP_NUM_THREADS", "1"), ("THREADS", "2")], &[]);
    assert!(err.contains("[threads] 2 (THREADS / --threads)"), "{err}");
    let (_, err, code) = run_with_env(&[("OMP_NUM_THREADS", "lots")], &[]);
    assert_eq!(code, Some(0));
    assert!(
        err.contains("OMP_NUM_THREADS=\"lots\" is not a thread count"),
        "{err}"
    );
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
