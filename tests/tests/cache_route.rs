//! Cache-aware routing (`--cache-route`, upstream's `CACHE_ROUTE=1`) end to end: off by
//! default and then without a trace on the wire; with every expert resident the same answer
//! as exact routing; with a one-expert LRU the routing is reported as approximate (swaps,
//! agreement under 100%) on the legacy STAT line, on the mux protocol's DONE and in the API's
//! usage, and the answer is still produced; bad values refused naming the option and range.

use std::path::{Path, PathBuf};

use colibri_e2e::http::ApiServer;
use colibri_e2e::mux::{data_of, MuxDaemon};
use colibri_e2e::{colibri, fixture, temp_dir, Daemon};
use protocol::mux::MuxReply;
use protocol::{parse_stat_line, RouteAgree};
use serde_json::json;

/// 16 routed experts, top 3, three sparse layers.
const MODEL: &str = "tiny-deepseek-v3";
const PROMPT: &str = "Once upon a time in a small village";

fn snap() -> PathBuf {
    fixture(MODEL)
}

/// One `\x02PROMPT` turn on a fresh greedy daemon: (text, STAT line, stderr).
fn turn(state: &Path, extra: &[&str]) -> (Vec<u8>, String, String) {
    let (mut d, _) = Daemon::greedy(&snap(), state, extra);
    let (text, stat) = d.prompt(PROMPT, 16, None);
    let err = d.stderr();
    assert!(d.finish().success(), "{err}");
    (text, stat, err)
}

fn route_of(stat: &str) -> Option<RouteAgree> {
    parse_stat_line(stat.as_bytes())
        .unwrap_or_else(|| panic!("not a STAT line: {stat:?}"))
        .route
}

#[test]
fn off_by_default_the_stat_line_has_no_suffix() {
    let (text, stat, _) = turn(&temp_dir("cr-off"), &[]);
    assert!(!text.is_empty());
    assert!(!stat.contains("swap_pct="), "{stat:?}");
    assert_eq!(route_of(&stat), None);
}

/// `colibri run -v` on a greedy prompt: (answer, stderr).
fn run(state: &Path, extra: &[&str]) -> (Vec<u8>, String) {
    let out = colibri()
        .args([
            "run",
            "--raw",
            "-v",
            "--temp",
            "0",
            "--max-tokens",
            "16",
            "--prompt",
            PROMPT,
        ])
        .arg("--snap")
        .arg(snap())
        .arg("--state-dir")
        .arg(state)
        .args(extra)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{err}");
    (out.stdout, err)
}

#[test]
fn with_every_expert_resident_the_answer_is_exact_routing_s() {
    // A first run (exact routing) writes the usage history; the second pins every expert
    // from it (--pin-fill adds the ones never seen), so cache-aware routing has nothing to swap.
    let state = temp_dir("cr-all-resident");
    let (exact, err) = run(&state, &[]);
    assert!(!err.contains("[PROF] cache-route"), "{err}");
    let pin_all = [
        "--pin",
        "auto",
        "--pin-gb",
        "all",
        "--pin-fill",
        "1",
        "--cache-route",
        "--route-j",
        "0",
    ];
    let (routed, err) = run(&state, &pin_all);
    // 3 sparse layers x 16 experts.
    assert!(err.contains("resident experts: 48 pinned"), "{err}");
    assert_eq!(
        String::from_utf8_lossy(&routed),
        String::from_utf8_lossy(&exact),
        "every expert resident: nothing to swap, the same answer"
    );
    assert!(
        err.contains("| 0 of ")
            && err.contains("agreement with exact routing 100.0% | route_kl 0.0000"),
        "{err}"
    );
}

const ONE_SLOT: [&str; 7] = [
    "--cache",
    "1",
    "--cache-route",
    "--route-j",
    "0",
    "--autopin",
    "0",
];

#[test]
fn a_one_expert_lru_swaps_and_says_so_on_the_legacy_stat() {
    let (text, stat, _) = turn(&temp_dir("cr-one"), &ONE_SLOT);
    assert!(!text.is_empty(), "the answer is still produced");
    let r = route_of(&stat).unwrap_or_else(|| panic!("no suffix on {stat:?}"));
    assert!(r.swaps > 0 && r.swaps <= r.slots, "{stat:?}");
    assert!(r.agree_pct < 100.0, "{stat:?}");
    assert!((r.agree_pct + r.swap_pct - 100.0).abs() < 0.11, "{stat:?}");
    assert!(r.kl > 0.0, "{stat:?}");
    // Upstream's bytes: ` swap_pct=%.1f route_swaps=%llu route_slots=%llu route_agree=%.1f
    // route_kl=%.4f` after the six fields.
    let fields: Vec<&str> = stat.trim_end().split(' ').collect();
    assert_eq!(fields.len(), 12, "{stat:?}");
    let keys: Vec<&str> = fields[7..]
        .iter()
        .map(|f| f.split('=').next().unwrap())
        .collect();
    assert_eq!(
        keys,
        [
            "swap_pct",
            "route_swaps",
            "route_slots",
            "route_agree",
            "route_kl"
        ]
    );
    assert_eq!(
        fields[11].split('.').nth(1).map(str::len),
        Some(4),
        "{stat:?}"
    );
    // And `colibri run -v` says it in its profile.
    let (text, err) = run(&temp_dir("cr-one-run"), &ONE_SLOT);
    assert!(!text.is_empty());
    assert!(
        err.contains(
            "[PROF] cache-route (approximate routing, outputs differ from exact): M=12 J=0"
        ),
        "{err}"
    );
    assert!(
        !err.contains("agreement with exact routing 100.0%"),
        "{err}"
    );
}

#[test]
fn the_mux_protocol_reports_it_on_done() {
    let state = temp_dir("cr-mux");
    let snap = snap();
    let mut args = vec!["--snap", snap.to_str().unwrap(), "--temp", "0"];
    args.extend_from_slice(&ONE_SLOT);
    let (mut d, _) = MuxDaemon::start(&args, &state);
    d.submit(3, 0, PROMPT, 12);
    let replies = d.until_end_of(3);
    assert!(!data_of(&replies, 3).is_empty());
    let stat = replies
        .iter()
        .find_map(|r| match r {
            MuxReply::Done { id: 3, stat } => Some(stat.clone()),
            _ => None,
        })
        .expect("DONE 3");
    let r = stat
        .route
        .unwrap_or_else(|| panic!("no suffix on {stat:?}"));
    assert!(r.swaps > 0 && r.agree_pct < 100.0, "{r:?}");
    let done = String::from_utf8_lossy(&d.raw).into_owned();
    assert!(done.contains(" swap_pct="), "{done}");
}

#[test]
fn the_api_usage_says_the_routing_was_approximate() {
    let snap = snap();
    let mut args = vec!["--snap", snap.to_str().unwrap()];
    args.extend_from_slice(&ONE_SLOT);
    let s = ApiServer::start("cr-api", &args);
    let req = json!({"model": MODEL, "max_tokens": 12, "temperature": 0,
                     "messages": [{"role": "user", "content": "Hi"}]});
    let r = s.post("/v1/chat/completions", &req);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let c = &v["usage"]["colibri"]["cache_route"];
    assert_eq!(c["cache_route"], 12, "{v}");
    assert_eq!(c["route_j"], 0, "{v}");
    let agree = c["route_agree"].as_f64().unwrap_or_else(|| panic!("{v}"));
    assert!(agree < 1.0 && agree >= 0.0, "{v}");
    assert!(c["route_swaps"].as_u64().unwrap() > 0, "{v}");
    // Off: no such field.
    let s = ApiServer::start("cr-api-off", &["--snap", snap.to_str().unwrap()]);
    let v = s.post("/v1/chat/completions", &req).json();
    assert!(v["usage"].get("colibri").is_none(), "{v}");
}

#[test]
fn bad_values_are_refused_naming_the_option_and_range() {
    let snap = snap();
    for (args, want) in [
        (
            &["--cache-route", "--route-m", "2"][..],
            "from top_k (3) to the number of experts (16)",
        ),
        (&["--cache-route", "--route-m", "17"][..], "--route-m"),
        (
            &["--cache-route", "--route-j", "4"][..],
            "from 0 to top_k (3)",
        ),
        (&["--route-m", "8"][..], "without --cache-route"),
    ] {
        let out = colibri()
            .args([
                "run",
                "--raw",
                "--prompt",
                "Hi",
                "--max-tokens",
                "2",
                "--snap",
            ])
            .arg(&snap)
            .arg("--state-dir")
            .arg(temp_dir("cr-bad"))
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(err.contains("--route-"), "{args:?}: {err}");
    }
}
