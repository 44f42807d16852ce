//! The pilot's prefetch bytes on the legacy STAT line (`--pilot`): our ` prefetch_in_time=...
//! prefetch_late=... prefetch_unused=...` suffix, bytes since the daemon started, present only
//! with the pilot (without it the line is upstream's), growing turn by turn.

use colibri_e2e::{fixture, temp_dir, Daemon};
use protocol::{parse_stat_line, PrefetchBytes};

/// 16 routed experts, top 3, three sparse layers.
const MODEL: &str = "tiny-deepseek-v3";

/// Two greedy turns on one daemon: their STAT lines.
fn two_turns(tag: &str, extra: &[&str]) -> [String; 2] {
    let (mut d, _) = Daemon::greedy(&fixture(MODEL), &temp_dir(tag), extra);
    let (_, first) = d.prompt("Once upon a time in a small village", 12, None);
    let (_, second) = d.prompt("The river ran past the mill and", 12, None);
    let err = d.stderr();
    assert!(d.finish().success(), "{err}");
    [first, second]
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
    let [a, b] = two_turns("pilot-stat", &pilot);
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
    let [a, _] = two_turns("pilot-stat-off", &["--cache", "1", "--autopin", "0"]);
    assert_eq!(prefetch_of(&a), None, "{a:?}");
    assert!(!a.contains("prefetch_"), "{a:?}");
    assert_eq!(a.trim_end().split(' ').count(), 7, "{a:?}");
}
