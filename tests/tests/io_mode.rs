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

/// `auto` reads around the page cache when the budget leaves it no room (a budget beyond any
/// machine's memory), and through it when the model's few kilobytes fit beside a 1 GB budget
/// (unless this test itself runs in a cgroup of about that size). `-v`'s profile names the
/// mode in use with "(auto)".
#[test]
fn auto_follows_the_room_the_budget_leaves_the_page_cache() {
    let big = run(&["--cache", "1", "--ram-gb", "1000000", "-v"], &[]);
    let said = io_line(&big);
    assert!(
        said.starts_with("O_DIRECT (auto: experts ") && said.contains("page cache room 0.0 kB"),
        "{said}"
    );
    let err = stderr(&big);
    assert!(
        err.contains("reads: O_DIRECT (auto)")
            || err.contains("reads: buffered (O_DIRECT refused) (auto)"),
        "{err}"
    );
    let roomy = colibri::telemetry::cgroup_memory_limit().is_none_or(|l| l > 2_000_000_000)
        && colibri::telemetry::meminfo().0 > 2_000_000_000;
    if roomy {
        let small = run(&["--cache", "1", "--ram-gb", "1", "-v"], &[]);
        let said = io_line(&small);
        assert!(said.starts_with("buffered (auto: experts "), "{said}");
        assert!(stderr(&small).contains("reads: buffered (auto)"));
        assert_eq!(small.stdout, big.stdout);
    }
}
