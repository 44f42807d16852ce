//! `colibri bench` replays a reference exactly and ends with the BENCH line.

use colibri_e2e::{colibri, fixture, last_line, run_ok};

#[test]
fn bench_prints_the_bench_line() {
    let dir = fixture("tiny-dense-shared");
    let out = run_ok(
        colibri()
            .args(["bench", "--no-membw", "--case", "long", "--snap"])
            .arg(&dir)
            .arg("--ref")
            .arg(dir.join("ref.json")),
    );
    let line = last_line(&out.stdout);
    let fields: Vec<(&str, f64)> = line
        .strip_prefix("BENCH ")
        .unwrap_or_else(|| panic!("{line}"))
        .split(' ')
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k, v.parse().unwrap())
        })
        .collect();
    let keys: Vec<&str> = fields.iter().map(|f| f.0).collect();
    assert_eq!(
        keys,
        ["prefill_pos_s", "decode_tok_s", "hit_pct", "read_gbs"]
    );
    assert!(fields[0].1 > 0.0 && fields[1].1 > 0.0);
    assert!((0.0..=100.0).contains(&fields[2].1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("63 prefill positions") && err.contains("17 decode steps"),
        "{err}"
    );
}

/// `BENCH` fields by name.
fn bench_fields(stdout: &[u8]) -> Vec<(String, f64)> {
    let line = last_line(stdout);
    line.strip_prefix("BENCH ")
        .unwrap_or_else(|| panic!("{line}"))
        .split(' ')
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

#[test]
fn warmup_replays_the_replay_untimed_so_every_expert_it_routes_to_is_resident() {
    let dir = fixture("tiny-moe-bias");
    let bench = |warm: bool| {
        let mut cmd = colibri();
        cmd.args([
            "bench",
            "--no-membw",
            "--usage-save",
            "0",
            "--case",
            "long",
            "--snap",
        ])
        .arg(&dir)
        .arg("--ref")
        .arg(dir.join("ref.json"));
        if warm {
            cmd.arg("--warmup");
        }
        run_ok(&mut cmd)
    };
    let (cold, warm) = (bench(false), bench(true));
    let hit = |out: &std::process::Output| bench_fields(&out.stdout)[2].1;
    let err = String::from_utf8_lossy(&warm.stderr);
    assert!(err.contains("[bench] warm-up:"), "{err}");
    // The cold run loads every expert on first use; the warm-up ran the very same
    // (deterministic) steps, so the timed replay, prefill and decode, finds every one it
    // routes to resident (the fixture's experts all fit the cache).
    assert!(hit(&cold) < 100.0, "cold {}", hit(&cold));
    assert_eq!(hit(&warm), 100.0, "{err}");
    assert!(err.contains("0.00 expert loads/token"), "{err}");
    assert!(!String::from_utf8_lossy(&cold.stderr).contains("warm-up"));
}

#[test]
fn streams_replay_concurrently_beside_one_stream() {
    let dir = fixture("tiny-moe-bias");
    let out = run_ok(
        colibri()
            .args([
                "bench",
                "--no-membw",
                "--case",
                "long",
                "--streams",
                "3",
                "--snap",
            ])
            .arg(&dir)
            .arg("--ref")
            .arg(dir.join("ref.json")),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let streams: Vec<Vec<(&str, f64)>> = text
        .lines()
        .filter_map(|l| l.strip_prefix("STREAMS "))
        .map(|l| {
            l.split(' ')
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap();
                    (k, v.parse().unwrap())
                })
                .collect()
        })
        .collect();
    assert_eq!(streams.len(), 2, "{text}");
    let get = |s: &[(&str, f64)], k: &str| s.iter().find(|f| f.0 == k).unwrap().1;
    assert_eq!(get(&streams[0], "n"), 1.0);
    assert_eq!(get(&streams[1], "n"), 3.0);
    for s in &streams {
        assert!(get(s, "aggregate_tok_s") > 0.0 && get(s, "per_stream_tok_s") > 0.0);
    }
    // Three streams routed differently need at least the experts of one, at most top_k x 3
    // per layer; each generated token's share of the expert bytes shrinks.
    let (u1, u3) = (
        get(&streams[0], "union_per_layer"),
        get(&streams[1], "union_per_layer"),
    );
    assert!(u3 >= u1 && u3 <= 3.0 * u1 + 1e-9, "union {u1} -> {u3}");
    assert!(get(&streams[1], "expert_mb_per_tok") <= get(&streams[0], "expert_mb_per_tok"));
    assert!(last_line(&out.stdout).starts_with("BENCH "), "{text}");
}

/// `--context` decodes after synthetic caches of each length: one CONTEXT line per length, in
/// order, the first its own baseline, and the BENCH line still last.
#[test]
fn context_points_print_one_line_per_length() {
    let dir = fixture("tiny-moe-bias");
    let out = run_ok(
        colibri()
            .args([
                "bench",
                "--no-membw",
                "--case",
                "long",
                "--context",
                "40,300",
                "--context-steps",
                "3",
                "--snap",
            ])
            .arg(&dir)
            .arg("--ref")
            .arg(dir.join("ref.json")),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("CONTEXT "))
        .collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    for (line, n) in lines.iter().zip(["40", "300"]) {
        let fields: Vec<(&str, &str)> = line["CONTEXT ".len()..]
            .split(' ')
            .map(|kv| kv.split_once('=').unwrap())
            .collect();
        let keys: Vec<&str> = fields.iter().map(|f| f.0).collect();
        assert_eq!(
            keys,
            ["n", "decode_tok_s", "attention_ms_per_tok", "cost_vs_first"]
        );
        assert_eq!(fields[0].1, n);
        assert!(fields[1].1.parse::<f64>().unwrap() > 0.0, "{line}");
    }
    assert!(lines[0].ends_with("cost_vs_first=1.00"), "{}", lines[0]);
    assert!(last_line(&out.stdout).starts_with("BENCH "));
}

/// bench starts its tiers as `run` does: the usage history in `--state-dir` drives autopin,
/// and bench leaves that history byte for byte alone.
#[test]
fn bench_autopins_from_the_usage_history_and_never_writes_it() {
    let dir = fixture("tiny-moe-bias");
    let state = colibri_e2e::temp_dir("bench-autopin");
    // A history long enough for autopin (at least 5000 selections), as serve would save it.
    let cfg = colibri::config::ModelConfig::load(&dir).unwrap();
    let mut u = colibri::experts::usage::Usage::new(cfg.num_hidden_layers, cfg.n_routed_experts);
    for layer in 0..cfg.num_hidden_layers {
        for e in 0..cfg.n_routed_experts {
            u.add(layer, e, 1000 * (e as u64 + 1));
        }
    }
    let usage = state.join(".coli_usage");
    u.save(&usage).unwrap();
    let history = std::fs::read(&usage).unwrap();
    let out = run_ok(
        colibri()
            .args([
                "bench",
                "--no-membw",
                "--no-disk-probe",
                "--case",
                "long",
                "--snap",
            ])
            .arg(&dir)
            .arg("--ref")
            .arg(dir.join("ref.json"))
            .arg("--state-dir")
            .arg(&state),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("[PIN] auto: ") && err.contains("selections of history, pinning"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&usage).unwrap(),
        history,
        "bench wrote the history"
    );
    let line = last_line(&out.stdout);
    assert!(line.starts_with("BENCH "), "{line}");
    assert!(
        !line.contains("decode_membw_ratio"),
        "no probe, no ratio: {line}"
    );
}

#[test]
fn rounds_time_the_warm_replay_several_times_and_need_the_warmup() {
    let dir = fixture("tiny-moe-bias");
    let base = |rounds: &str| {
        let mut cmd = colibri();
        cmd.args(["bench", "--no-membw", "--usage-save", "0", "--case", "long"])
            .args(["--rounds", rounds, "--snap"])
            .arg(&dir)
            .arg("--ref")
            .arg(dir.join("ref.json"));
        cmd
    };
    // Without --warmup the first round would load what the later ones find resident.
    let refused = base("3").output().unwrap();
    assert!(!refused.status.success());
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("--warmup"), "{why}");
    let out = run_ok(base("3").arg("--warmup"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("[bench] 3 timed replays"), "{err}");
    // Every round replays the same steps over the same resident experts.
    assert_eq!(bench_fields(&out.stdout)[2].1, 100.0, "{err}");
    let over = base("21").arg("--warmup").output().unwrap();
    assert!(!over.status.success());
    assert!(String::from_utf8_lossy(&over.stderr).contains("1..=20"));
}

#[test]
fn bench_ab_alternates_a_decode_knob_across_the_rounds() {
    let dir = fixture("tiny-moe-bias");
    let bench = |ab: &str| {
        let mut cmd = colibri();
        cmd.env("BENCH_AB", ab)
            .args(["bench", "--no-membw", "--usage-save", "0", "--case", "long"])
            .args(["--warmup", "--rounds", "2", "--snap"])
            .arg(&dir)
            .arg("--ref")
            .arg(dir.join("ref.json"));
        cmd.output().unwrap()
    };
    let out = bench("guided=0,1");
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for side in ["[bench] A/B guided=0: best", "[bench] A/B guided=1: best"] {
        assert!(err.contains(side), "{err}");
    }
    assert!(
        err.contains("[bench] A/B guided: decode guided=1 / guided=0 = "),
        "{err}"
    );
    // Each round says which side it ran and its decode speed.
    for round in [
        "[bench] A/B round 0: guided=0: decode ",
        "[bench] A/B round 1: guided=1: decode ",
    ] {
        assert!(err.contains(round), "{err}");
    }
    // An unknown knob or a value it cannot take is refused, naming what it can be.
    for bad in ["fast=0,1", "guided=0,2", "guided"] {
        let out = bench(bad);
        assert!(!out.status.success(), "{bad}");
        let why = String::from_utf8_lossy(&out.stderr);
        assert!(
            why.contains("prefetch_bytes, tile_min_row_bytes, guided"),
            "{why}"
        );
    }
}

#[test]
fn prompt_and_gen_tokens_replay_synthetic_ids_without_a_reference() {
    // llama-bench's -p/-n: on a fixture, and on the demo model built into the binary.
    let dir = fixture("tiny-moe-bias");
    let snap = ["--snap".as_ref(), dir.as_os_str()];
    for model in [&snap[..], &[][..]] {
        let out = run_ok(colibri().args(["bench"]).args(model).args([
            "--no-membw",
            "--usage-save",
            "0",
            "--warmup",
            "--rounds",
            "2",
            "--prompt-tokens",
            "9",
            "--gen-tokens",
            "5",
        ]));
        let fields = bench_fields(&out.stdout);
        let keys: Vec<&str> = fields.iter().map(|f| f.0.as_str()).collect();
        assert_eq!(
            keys,
            ["prefill_pos_s", "decode_tok_s", "hit_pct", "read_gbs"]
        );
        assert!(fields[0].1 > 0.0 && fields[1].1 > 0.0, "{fields:?}");
        // Warm: the warm-up replayed the same ids, so every expert is resident.
        assert_eq!(fields[2].1, 100.0);
        let err = String::from_utf8_lossy(&out.stderr);
        for figure in [
            "9 prefill positions",
            "5 decode steps",
            "[bench] warm-up:",
            "[bench] prefill profile:",
            "[bench] decode profile:",
            "tokens/forward",
            "expert loads/token",
            "[bench] disk:",
        ] {
            assert!(err.contains(figure), "{figure:?} missing: {err}");
        }
    }
    // Either alone sets the other to 1.
    let out = run_ok(colibri().args(["bench", "--no-membw", "--prompt-tokens", "6"]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("6 prefill positions") && err.contains("1 decode steps"),
        "{err}"
    );
}

#[test]
fn bench_needs_a_reference_or_token_counts_and_not_both() {
    let dir = fixture("tiny-moe-bias");
    for extra in [&[][..], &["--prompt-tokens", "4"][..]] {
        let out = colibri()
            .args(["bench", "--no-membw", "--snap"])
            .arg(&dir)
            .args(if extra.is_empty() {
                &[][..]
            } else {
                &["--ref", "ref.json"][..]
            })
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{out:?}");
    }
}

/// `--pool-times` adds the decode's thread-pool line: regions per token, and per thread its
/// share of the task time (the shares add up to the whole), the caller's waits at joins and
/// each worker's idle time. Without the flag there is no such line.
#[test]
fn pool_times_report_each_threads_share_of_the_decode() {
    let bench = |extra: &[&str]| {
        let out = run_ok(
            colibri()
                .args(["bench", "--no-membw", "--usage-save", "0", "--threads", "2"])
                .args(["--warmup", "--prompt-tokens", "8", "--gen-tokens", "24"])
                .args(extra),
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(!bench(&[]).contains("[bench] pool:"));
    let err = bench(&["--pool-times"]);
    let line = err
        .lines()
        .find_map(|l| l.strip_prefix("[bench] pool: "))
        .unwrap_or_else(|| panic!("no pool line: {err}"));
    let number = |s: &str| -> f64 { s.trim_end_matches('%').parse().unwrap() };
    let mut parts = line.split(" | ");
    let regions = number(parts.next().unwrap().split(' ').next().unwrap());
    assert!(regions > 0.0, "the demo's decode forks: {line}");
    let threads: Vec<&str> = parts.collect();
    assert_eq!(threads.len(), 2, "the caller and one worker: {line}");
    assert!(threads[0].starts_with("caller ") && threads[0].contains("waits at joins"));
    assert!(threads[1].starts_with("worker 1 ") && threads[1].contains("idle"));
    let share = |t: &str| number(t.split(' ').find(|w| w.ends_with('%')).unwrap());
    let sum: f64 = threads.iter().map(|t| share(t)).sum();
    assert!(
        (sum - 100.0).abs() <= 1.0,
        "shares of the task time add up: {line}"
    );
}
