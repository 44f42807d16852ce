//! `colibri score` against a perplexity computed in Python from transformers' logits on the
//! trained demo model (scripts/demo/make_fixture.py writes score.txt and score.json).

use colibri_e2e::{colibri, fixture, last_line, root, run_ok};
use serde_json::Value;

/// The agreement asked of the engine's mean NLL (nats per token), bits per byte, and relative
/// perplexity. The windows are the same and the fixture's text has no router top-k boundary
/// closer than 1e-5 (make_fixture.py), so only float rounding differs (transformers runs a
/// window in one forward, the engine its unscored head and scored tail as two): ~1e-6 in
/// practice, and the printed figures carry six decimals.
const TOLERANCE: f64 = 1e-5;

fn parse(line: &str) -> Vec<(String, f64)> {
    assert!(line.starts_with("SCORE "), "{line}");
    line.split_whitespace()
        .skip(1)
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or_else(|| panic!("{line}"));
            (
                k.to_string(),
                v.parse().unwrap_or_else(|_| panic!("{line}")),
            )
        })
        .collect()
}

#[test]
fn score_matches_transformers_on_the_demo_model() {
    let dir = fixture("demo-trained");
    let want: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("score.json")).unwrap()).unwrap();
    let out = run_ok(
        colibri()
            .arg("score")
            .arg("--snap")
            .arg(root().join("daemon").join("demo"))
            .arg("--text")
            .arg(dir.join("score.txt"))
            .args(["--ctx", &want["ctx"].to_string()])
            .args(["--stride", &want["stride"].to_string()]),
    );
    let line = last_line(&out.stdout);
    let got = parse(&line);
    let keys: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["tokens", "nll", "ppl", "bpb"], "{line}");
    assert_eq!(got[0].1, want["tokens"].as_f64().unwrap(), "{line}");
    let nll = want["nll"].as_f64().unwrap();
    assert!(
        (got[1].1 - nll).abs() < TOLERANCE,
        "nll {} vs {nll}: {line}",
        got[1].1
    );
    let ppl = want["ppl"].as_f64().unwrap();
    assert!(
        ((got[2].1 - ppl) / ppl).abs() < TOLERANCE,
        "ppl {} vs {ppl}: {line}",
        got[2].1
    );
    let bpb = want["bpb"].as_f64().unwrap();
    assert!(
        (got[3].1 - bpb).abs() < TOLERANCE,
        "bpb {} vs {bpb}: {line}",
        got[3].1
    );
    // Progress goes to stderr, one line per window.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("[score] window 1/"), "{err}");
}

#[test]
fn score_stride_equal_to_context_skips_window_starts() {
    // Non-overlapping windows score every token but the first of each window.
    let dir = fixture("demo-trained");
    let want: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("score.json")).unwrap()).unwrap();
    let n = want["text_tokens"].as_u64().unwrap();
    let out = run_ok(
        colibri()
            .arg("score")
            .arg("--snap")
            .arg(root().join("daemon").join("demo"))
            .arg("--text")
            .arg(dir.join("score.txt"))
            .args(["--ctx", "100", "--stride", "100"]),
    );
    let got = parse(&last_line(&out.stdout));
    assert_eq!(got[0].1 as u64, n - n.div_ceil(100));
}

#[test]
fn score_rejects_bad_input() {
    let dir = fixture("demo-trained");
    let text = dir.join("score.txt");
    let out = colibri()
        .arg("score")
        .arg("--snap")
        .arg(root().join("daemon").join("demo"))
        .arg("--text")
        .arg(&text)
        .args(["--ctx", "64", "--stride", "65"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--stride 65") && err.contains("1..=64"),
        "{err}"
    );

    let missing = colibri()
        .args(["score", "--text", "/nonexistent/colibri-score.txt"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/colibri-score.txt"));

    let tmp = colibri_e2e::temp_dir("score-short");
    let one = tmp.join("one.txt");
    std::fs::write(&one, "a").unwrap();
    let short = colibri()
        .arg("score")
        .arg("--snap")
        .arg(root().join("daemon").join("demo"))
        .arg("--text")
        .arg(&one)
        .output()
        .unwrap();
    assert_eq!(short.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&short.stderr).contains("at least 2"));
}
