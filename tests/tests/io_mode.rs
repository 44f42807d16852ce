//! `--direct auto|on|off` (env `DIRECT`): every value parses, a bad one is refused with exit 2
//! naming the allowed ones, the choice and its reason are said once at start (`[IO] expert
//! reads: ...`), and the read mode never changes a token.

use std::process::Output;

use colibri_e2e::{colibri, fixture, stderr, temp_dir};

const MODEL: &str = "tiny-glm4-moe";

/// `colibri run` of a short greedy answer on the fixture with `args` and `env`.
fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = colibri();
    cmd.arg("run")
        .arg("--snap")
        .arg(fixture(MODEL))
        .args(["--max-tokens", "6", "--temp", "0", "--state-dir"])
        .arg(temp_dir("io-mode"))
        .arg("Tell me about the sea.")
        .args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("spawning colibri run")
}

/// The `[IO] expert reads: ` line of a run's stderr (exactly one).
fn io_line(o: &Output) -> String {
    let err = stderr(o);
    assert!(o.status.success(), "{err}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("[IO] expert reads: "))
        .collect();
    assert_eq!(lines.len(), 1, "one [IO] line: {err}");
    lines[0]
        .trim_start_matches("[IO] expert reads: ")
        .to_string()
}

#[test]
fn a_bad_value_exits_2_naming_the_allowed_ones() {
    for (args, env) in [
        (&["--direct", "bogus"][..], &[][..]),
        (&["--direct=maybe"], &[]),
        (&[], &[("DIRECT", "sometimes")]),
    ] {
        let o = run(args, env);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?} {env:?}: {err}");
        assert!(err.contains("--direct (DIRECT)"), "{err}");
        assert!(err.contains("expected auto, on or off"), "{err}");
        assert!(o.stdout.is_empty());
    }
    // O_DIRECT and the memory map are two ways of reading: naming both is refused.
    for (args, env) in [
        (&["--mmap", "--direct", "on"][..], &[][..]),
        (&["--mmap"], &[("DIRECT", "1")]),
    ] {
        let o = run(args, env);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?} {env:?}: {err}");
        assert!(err.contains("--mmap"), "{err}");
    }
}

/// Every way of naming the mode reads as it says and answers with the same bytes; `--cache 1`
/// makes the fixture read its experts again and again.
#[test]
fn every_mode_gives_the_same_tokens() {
    let want = run(&["--cache", "1", "--direct", "off"], &[]);
    assert_eq!(io_line(&want), "buffered (--direct off)");
    assert!(!want.stdout.is_empty());
    for (args, env, line) in [
        (&["--direct", "on"][..], &[][..], "O_DIRECT (--direct on)"),
        (&["--direct"], &[], "O_DIRECT (--direct on)"),
        (&[], &[("DIRECT", "1")], "O_DIRECT (--direct on)"),
        (&[], &[("DIRECT", "off")], "buffered (--direct off)"),
        (
            &["--direct", "no"],
            &[("DIRECT", "on")],
            "buffered (--direct off)",
        ),
        (&["--mmap"], &[], "mmap (--mmap)"),
        (&["--mmap", "--direct", "auto"], &[], "mmap (--mmap)"),
        (&["--direct", "auto"], &[], "auto: "),
        (&[], &[], "auto: "),
    ] {
        let mut all = vec!["--cache", "1"];
        all.extend_from_slice(args);
        let o = run(&all, env);
        let said = io_line(&o);
        assert!(said.contains(line), "{args:?} {env:?}: {said}");
        assert_eq!(o.stdout, want.stdout, "{args:?} {env:?}");
    }
}

/// Whether this test runs with over 1 GB of memory and no tighter cgroup: the page cache then
/// has room for the fixture whatever the budget, which the `auto` tests below rely on.
fn roomy() -> bool {
    colibri::telemetry::cgroup_memory_limit().is_none_or(|l| l > 1_000_000_000)
        && colibri::telemetry::meminfo().0 > 1_000_000_000
}

/// `auto` keeps a model the page cache can hold beside the engine buffered (the fixture's
/// few kilobytes, whatever the budget: the engine holds at most the whole model), unless this
/// test itself runs in a cgroup too small for that. `-v`'s profile names the mode in use with
/// "(auto)". (Its O_DIRECT side needs experts bigger than the memory: the unit tests of
/// `experts::io_auto` and `plan --cgroup-gb` below show it.)
#[test]
fn auto_keeps_a_model_that_fits_buffered() {
    if !roomy() {
        return;
    }
    let mut last = None;
    for budget in ["1", "1000000"] {
        let o = run(&["--cache", "1", "--ram-gb", budget, "-v"], &[]);
        let said = io_line(&o);
        assert!(said.starts_with("buffered (auto: experts "), "{said}");
        assert!(
            said.contains(" held (the whole model, under its "),
            "{said}"
        );
        assert!(stderr(&o).contains("reads: buffered (auto)"));
        if let Some(prev) = last.replace(o.stdout.clone()) {
            assert_eq!(o.stdout, prev);
        }
    }
}

/// A model over its budget whose experts fit the page cache is mapped by `auto` (its experts
/// are loaded again and again: mapped loads copy nothing), unless `--drop` asks that read
/// pages leave the page cache; the tokens are those of buffered reads either way.
#[test]
fn auto_maps_a_model_over_its_budget() {
    if !roomy() {
        return;
    }
    // 1.1 MB, under the fixture's 1.25 MB (and over what one expert a layer needs beside the
    // dense part, without a reserve).
    let over = [
        "--cache",
        "1",
        "--ram-gb",
        "0.0011",
        "--ram-reserve-gb",
        "0",
    ];
    let buffered = run(&[&over[..], &["--direct", "off"]].concat(), &[]);
    assert_eq!(io_line(&buffered), "buffered (--direct off)");
    let o = run(&[&over[..], &["-v"]].concat(), &[]);
    let said = io_line(&o);
    assert!(said.starts_with("mmap (auto: experts "), "{said}");
    assert!(
        said.ends_with(" exceeds it, so experts are loaded again and again: mapped, not copied)"),
        "{said}"
    );
    assert!(stderr(&o).contains("reads: mmap (auto)"), "{}", stderr(&o));
    assert_eq!(o.stdout, buffered.stdout);
    let dropped = run(&[&over[..], &["--drop"]].concat(), &[]);
    assert!(
        io_line(&dropped).starts_with("buffered (auto: experts "),
        "{}",
        io_line(&dropped)
    );
    assert_eq!(dropped.stdout, buffered.stdout);
}

/// `plan` states the read mode `auto` would pick for the budget it plans: in a 4 GB cgroup
/// (budget 3.52 GB) Qwen3-30B-A3B's 16.5 GB of int4 experts cannot stay in the page cache:
/// O_DIRECT, with the reason, in the JSON and on the text's `reads` line.
#[test]
fn plan_states_the_read_mode_it_assumes() {
    let plan = |json: bool| {
        let mut cmd = colibri();
        cmd.arg("plan")
            .arg("--config")
            .arg(fixture("configs").join("qwen3-30b-a3b.json"))
            .args(["--cgroup-gb", "4", "--disk-gbs", "2", "--mem-gbs", "20"])
            .args(["--prefill-gmacs", "100", "--expert-gmacs", "50"])
            .args(["--attention-gmacs", "10", "--dense-gbs", "20"])
            .args(["--expert-decode-gbs", "20"]);
        if json {
            cmd.arg("--json");
        }
        let o = cmd.output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8(o.stdout).unwrap()
    };
    let v: serde_json::Value = serde_json::from_str(&plan(true)).unwrap();
    assert_eq!(v["reads"]["mode"], "O_DIRECT", "{v}");
    let why = v["reads"]["why"].as_str().unwrap();
    assert!(why.starts_with("O_DIRECT (auto: experts "), "{why}");
    assert!(
        why.ends_with("= the cgroup's memory limit 4.00 GB - 3.52 GB held (its budget))"),
        "{why}"
    );
    let text = plan(false);
    let line = text
        .lines()
        .find(|l| l.starts_with("reads "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains("O_DIRECT (auto: ") && line.ends_with("reads at the disk probe's rate"),
        "{line}"
    );
}
