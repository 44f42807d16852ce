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

/// `colibri run` on the demo model: the output.
fn demo_run(tag: &str, args: &[&str]) -> std::process::Output {
    let home = temp_dir(tag);
    colibri()
        .env("XDG_CACHE_HOME", &home)
        .arg("run")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn run_takes_the_prompt_as_a_positional_argument() {
    let a = demo_run(
        "pos-a",
        &["Why is the sky blue?", "--max-tokens", "6", "--seed", "3"],
    );
    let b = demo_run(
        "pos-b",
        &[
            "--prompt",
            "Why is the sky blue?",
            "--max-tokens",
            "6",
            "--seed",
            "3",
        ],
    );
    assert_eq!(a.status.code(), Some(0), "{}", colibri_e2e::stderr(&a));
    assert!(!a.stdout.is_empty());
    assert_eq!(a.stdout, b.stdout);
    // Both at once is a usage error.
    let both = demo_run("pos-both", &["hi", "--prompt", "hi"]);
    assert_eq!(both.status.code(), Some(2));
}

#[test]
fn run_refuses_a_prompt_that_does_not_fit_ctx_with_the_sizes() {
    let out = demo_run("ctx-refuse", &["hi", "--ctx", "64", "--max-tokens", "60"]);
    assert_eq!(out.status.code(), Some(2));
    let err = colibri_e2e::stderr(&out);
    assert!(
        err.contains("the prompt is 7 tokens and --max-tokens is 60: 67 positions do not fit --ctx 64 (the model's maximum: 4096); nothing was computed; lower --max-tokens to 57, raise --ctx (up to 4096) or shorten the prompt"),
        "{err}"
    );
    assert!(!err.contains("[run]"), "refused before generating: {err}");
    let out = demo_run("ctx-over", &["hi", "--ctx", "8192"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        colibri_e2e::stderr(&out).contains("--ctx 8192 is more than the model's 4096 positions (max_position_embeddings); the allowed range is 16..=4096"),
        "{}",
        colibri_e2e::stderr(&out)
    );
    // At the limit it runs.
    let ok = demo_run("ctx-fit", &["hi", "--ctx", "64", "--max-tokens", "57"]);
    assert_eq!(ok.status.code(), Some(0), "{}", colibri_e2e::stderr(&ok));
}

#[test]
fn run_prints_prefill_progress_off_a_terminal() {
    let long = "the quick brown fox jumps over the lazy dog ".repeat(60);
    let out = demo_run("prefill-lines", &[&long, "--max-tokens", "2"]);
    let err = colibri_e2e::stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("[prefill] "))
        .collect();
    let last = lines.last().unwrap_or_else(|| panic!("{err}"));
    let (done, total) = last
        .trim_start_matches("[prefill] ")
        .trim_end_matches(" tokens")
        .split_once('/')
        .unwrap();
    assert_eq!(done, total, "the last line is the whole prompt: {err}");
}

#[test]
fn run_summary_is_one_line_and_verbose_adds_the_profile() {
    let quiet = demo_run("quiet", &["hi", "--max-tokens", "5", "--seed", "1"]);
    let err = colibri_e2e::stderr(&quiet);
    assert_eq!(
        err.lines().filter(|l| l.starts_with("[run] ")).count(),
        1,
        "{err}"
    );
    assert!(
        !err.contains("[PROF]") && !err.contains("DISK-CLASS"),
        "{err}"
    );
    assert_eq!(
        err.lines().filter(|l| l.starts_with("[MODEL] ")).count(),
        1,
        "{err}"
    );
    let loud = demo_run("loud", &["hi", "--max-tokens", "5", "--seed", "1", "-v"]);
    let err = colibri_e2e::stderr(&loud);
    assert!(
        err.contains("[PROF] expert I/O") && err.contains("DISK-CLASS"),
        "{err}"
    );
    assert!(err.contains("tokens/forward"), "{err}");
    assert_eq!(quiet.stdout, loud.stdout);
    // No terminal: the answer's bytes only, no final newline added.
    assert_ne!(quiet.stdout.last(), Some(&b'\n'));
}

#[test]
fn run_exits_3_when_a_schema_answer_is_cut_short() {
    let dir = temp_dir("exit3");
    let schema = dir.join("schema.json");
    std::fs::write(
        &schema,
        br#"{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}"#,
    )
    .unwrap();
    let s = schema.to_str().unwrap();
    let out = demo_run(
        "exit3-run",
        &["x", "--json-schema", s, "--max-tokens", "3", "--temp", "0"],
    );
    assert_eq!(out.status.code(), Some(3), "{}", colibri_e2e::stderr(&out));
    assert!(colibri_e2e::stderr(&out).contains(
        "[run] incomplete: stopped at --max-tokens before the --json-schema sentence was complete; the output does not match it (exit 3)"
    ));
    assert!(!out.stdout.is_empty());
}

#[test]
fn neutral_sampling_options_leave_greedy_and_seeded_output_unchanged() {
    let neutral = ["--top-k", "0", "--min-p", "0", "--repeat-penalty", "1"];
    for base in [
        &["hello there", "--max-tokens", "24", "--temp", "0"][..],
        &[
            "hello there",
            "--max-tokens",
            "24",
            "--temp",
            "1",
            "--seed",
            "7",
        ][..],
    ] {
        let plain = demo_run("neutral-a", base);
        let with = demo_run("neutral-b", &[base, &neutral[..]].concat());
        assert_eq!(plain.status.code(), Some(0));
        assert_eq!(plain.stdout, with.stdout, "{base:?}");
    }
    // And a real setting changes the seeded answer.
    let a = demo_run(
        "rp-a",
        &["hello there", "--max-tokens", "24", "--temp", "0"],
    );
    let b = demo_run(
        "rp-b",
        &[
            "hello there",
            "--max-tokens",
            "24",
            "--temp",
            "0",
            "--repeat-penalty",
            "3",
        ],
    );
    assert_ne!(a.stdout, b.stdout);
}

#[test]
fn stop_cuts_the_answer_exactly_before_the_stop_string() {
    let full = demo_run(
        "stop-full",
        &["hello there", "--max-tokens", "24", "--temp", "0"],
    );
    let text = full.stdout.clone();
    assert!(text.len() > 8, "{text:?}");
    // A stop string from the middle of the greedy answer, spanning whatever tokens it spans.
    let at = text.len() / 2;
    let stop = String::from_utf8_lossy(&text[at..at + 3]).into_owned();
    let want = &text[..text.windows(3).position(|w| w == stop.as_bytes()).unwrap()];
    let cut = demo_run(
        "stop-cut",
        &[
            "hello there",
            "--max-tokens",
            "24",
            "--temp",
            "0",
            "--stop",
            &stop,
            "--stop",
            "never-said",
        ],
    );
    assert_eq!(cut.status.code(), Some(0));
    assert_eq!(cut.stdout, want, "stop {stop:?}");
    assert!(
        colibri_e2e::stderr(&cut).contains("| stopped at --stop"),
        "{}",
        colibri_e2e::stderr(&cut)
    );
}

#[test]
fn system_prompt_changes_the_conversation() {
    let a = demo_run("sys-a", &["hello", "--max-tokens", "12", "--temp", "0"]);
    let b = demo_run(
        "sys-b",
        &[
            "hello",
            "--max-tokens",
            "12",
            "--temp",
            "0",
            "--system",
            "Be terse.",
        ],
    );
    let prompt = |o: &std::process::Output| {
        let err = colibri_e2e::stderr(o);
        err.lines()
            .find(|l| l.starts_with("[run] "))
            .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
            .unwrap()
    };
    // `<|system|>Be terse.` adds tokens before the user turn.
    assert!(prompt(&b).parse::<u32>().unwrap() > prompt(&a).parse::<u32>().unwrap());
}

#[test]
fn info_reports_the_model_in_text_and_json() {
    let snap = fixture("tiny-dense-shared");
    let state = temp_dir("info-state");
    let out = run_ok(
        colibri()
            .args(["info", "--state-dir"])
            .arg(&state)
            .arg("--snap")
            .arg(&snap),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        "family       glm_moe_dsa\n",
        "context      4096 tokens\n",
        "formats      experts f32 (at load), dense f32 (at load)\n",
    ] {
        assert!(text.contains(want), "{want:?} in\n{text}");
    }
    assert!(
        text.contains(&format!("state        {}\n", state.display())),
        "{text}"
    );
    let out = run_ok(
        colibri()
            .args(["info", "--json", "--state-dir"])
            .arg(&state)
            .arg("--snap")
            .arg(&snap),
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["family"], "glm_moe_dsa");
    assert_eq!(v["context"], 4096);
    assert_eq!(v["model"][0], snap.display().to_string());
    for key in [
        "parameters",
        "experts_per_layer",
        "expert_bytes",
        "disk_bytes",
        "ram_budget_bytes",
    ] {
        assert!(v[key].as_u64().is_some_and(|n| n > 0), "{key}: {v}");
    }
    assert!(v["fits"].is_boolean());
}

#[test]
fn serve_names_the_model_on_stderr_before_ready() {
    let home = temp_dir("serve-model-line");
    let out = colibri()
        .env("XDG_CACHE_HOME", &home)
        .args(["serve", "--kv-save", "0"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stdout.starts_with(b"\x01\x01READY\x01\x01\n"));
    let err = colibri_e2e::stderr(&out);
    let line = err
        .lines()
        .find(|l| l.starts_with("[MODEL] "))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        line.contains("| glm_moe_dsa |") && line.contains("context 4096"),
        "{line}"
    );
}
