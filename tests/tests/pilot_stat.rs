//! The pilot's prefetch bytes on the legacy STAT line (`--pilot`): our ` prefetch_in_time=...
//! prefetch_late=... prefetch_unused=...` suffix, bytes since the daemon started, present only
//! with the pilot asked for by name (without it, and with the default `--pilot auto`, the line
//! is upstream's), growing turn by turn. And `auto`'s decision, said at start: on where the
//! tiers leave experts to read from disk, off where they hold them all or there is no pool.

use colibri_e2e::{fixture, temp_dir, Daemon};
use protocol::{parse_stat_line, PrefetchBytes};

/// 16 routed experts, top 3, three sparse layers.
const MODEL: &str = "tiny-deepseek-v3";

/// Two greedy turns on one daemon: their STAT lines and its stderr.
fn two_turns(tag: &str, extra: &[&str]) -> ([String; 2], String) {
    let (mut d, _) = Daemon::greedy(&fixture(MODEL), &temp_dir(tag), extra);
    let (_, first) = d.prompt("Once upon a time in a small village", 12, None);
    let (_, second) = d.prompt("The river ran past the mill and", 12, None);
    let err = d.stderr();
    assert!(d.finish().success(), "{err}");
    ([first, second], err)
}

fn prefetch_of(stat: &str) -> Option<PrefetchBytes> {
    parse_stat_line(stat.as_bytes())
        .unwrap_or_else(|| panic!("not a STAT line: {stat:?}"))
        .prefetch
}

#[test]
fn with_the_pilot_the_stat_line_carries_its_prefetch_bytes() {
    // One expert cached per layer and the first guess of each row read ahead: most of the
    // experts asked for are not resident, so the pilot reads.
    let pilot = [
        "--pilot",
        "--pilot-depth",
        "1",
        "--cache",
        "1",
        "--autopin",
        "0",
    ];
    let ([a, b], err) = two_turns("pilot-stat", &pilot);
    assert!(
        !err.contains("[PILOT] auto"),
        "asked for: no auto line: {err}"
    );
    let (pa, pb) = (prefetch_of(&a), prefetch_of(&b));
    let (pa, pb) = (
        pa.unwrap_or_else(|| panic!("no suffix on {a:?}")),
        pb.unwrap_or_else(|| panic!("no suffix on {b:?}")),
    );
    assert!(
        pa.read() > 0,
        "the pilot read ahead in the first turn: {a:?}"
    );
    // Cumulative: each kind only grows.
    assert!(
        pb.in_time >= pa.in_time && pb.late >= pa.late && pb.unused >= pa.unused,
        "{a:?} then {b:?}"
    );
    assert!(
        pb.read() > pa.read(),
        "the second turn read ahead too: {b:?}"
    );
    // Our suffix follows upstream's six fields.
    let fields: Vec<&str> = b.trim_end().split(' ').collect();
    assert_eq!(fields.len(), 10, "{b:?}");
    assert!(fields[7].starts_with("prefetch_in_time="), "{b:?}");
}

#[test]
fn without_the_pilot_the_stat_line_is_upstreams() {
    for pilot in ["auto", "off"] {
        let tiers = ["--cache", "1", "--autopin", "0", "--pilot", pilot];
        let ([a, _], err) = two_turns(&format!("pilot-stat-{pilot}"), &tiers);
        assert_eq!(prefetch_of(&a), None, "{a:?}");
        assert!(!a.contains("prefetch_"), "{a:?}");
        assert_eq!(a.trim_end().split(' ').count(), 7, "{a:?}");
        // One expert per layer held of 16: `auto` reads ahead (and says so), `off` does not.
        let on = pilot == "auto";
        assert_eq!(
            err.contains("[PILOT] auto: on: routed experts"),
            on,
            "{err}"
        );
    }
}

/// `--pilot auto` (the default) is on when the tiers leave experts to read from disk (a cap of
/// 1 of 16 per layer), off when they hold every expert (no --cache: the budget holds the
/// tiny model) or when there is no I/O pool (`--pipe 0`); one `[PILOT] auto` line says which
/// and why.
#[test]
fn the_pilot_by_default_reads_ahead_only_where_decode_reads_the_disk() {
    let line = |tag: &str, tiers: &[&str]| {
        let (_, err) = two_turns(tag, tiers);
        // The start's decision (the regime trial's and the depths' own [PILOT] lines aside).
        let said: Vec<&str> = err
            .lines()
            .filter(|l| l.starts_with("[PILOT] auto"))
            .collect();
        assert_eq!(said.len(), 1, "{err}");
        said[0].to_string()
    };
    let on = line("pilot-auto-on", &["--cache", "1", "--autopin", "0"]);
    assert!(on.starts_with("[PILOT] auto: on: routed experts"), "{on}");
    assert!(on.contains("(3 of 48)"), "{on}");
    let fits = line("pilot-auto-fits", &["--autopin", "0"]);
    assert!(
        fits.starts_with("[PILOT] auto: off: every routed expert"),
        "{fits}"
    );
    let no_pool = line("pilot-auto-pipe0", &["--cache", "1", "--pipe", "0"]);
    assert!(no_pool.contains("auto: off: no I/O pool"), "{no_pool}");
}
