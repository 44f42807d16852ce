//! The `deepseek_v4` family (DeepSeek-V4-Flash / Pro) end to end on its tiny fixture
//! (scripts/make_fixture_deepseek_v4.py: sliding, compressed-sparse and heavily-compressed
//! layers, CSA rate 4 and HCA rate 8 under a window of 8, an indexer keeping 4 entries, three
//! hyper-connection streams, hash-routed and sqrt-softplus-routed experts with the clamped
//! SwiGLU, a grouped output projection, YaRN on the compressed layers). `colibri validate`
//! finds it transformers' token for token, teacher-forced and greedy, on a short case and a
//! long one past the window, several HCA blocks and more CSA entries than the indexer keeps.
//! A config the family cannot run is refused naming the key, the value and what is allowed,
//! with exit 2, before any weight is read or any shard converted.

use std::path::Path;
use std::process::Output;

use colibri_e2e::oracle::{self, copy_with_config};
use colibri_e2e::{colibri, fixture, last_line};

const HF: &str = "tiny-deepseek-v4";

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `colibri validate` of the fixture against its reference `case`: the last line of stdout.
fn validate(case: &str) -> String {
    let snap = fixture(HF);
    let o = colibri()
        .arg("validate")
        .arg("--snap")
        .arg(&snap)
        .arg("--ref")
        .arg(snap.join("ref.json"))
        .args(["--case", case])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(out.contains("VALIDATE tf="), "no result: {}", stderr(&o));
    assert!(o.status.success(), "{out}{}", stderr(&o));
    let logits = out.lines().find(|l| l.starts_with("LOGITS ")).unwrap_or("");
    // f32 against f32: the logits agree to rounding, far inside the smallest top-1/top-2
    // gap the fixture script accepted (1e-4).
    let max_abs: f64 = logits
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("max_abs="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no LOGITS line: {out}"));
    assert!(max_abs < 1e-4, "{case}: {logits}");
    last_line(out.as_bytes())
}

fn assert_exact(line: &str) {
    let v: Vec<&str> = line.split([' ', '=', '/']).collect();
    assert_eq!(v[0], "VALIDATE", "{line}");
    assert_eq!(v[2], v[3], "teacher forcing not exact: {line}");
    assert_eq!(v[5], v[6], "generation not exact: {line}");
    assert!(v[3].parse::<usize>().unwrap() > 0, "{line}");
}

#[test]
fn it_is_transformers_token_for_token_short_and_long() {
    for case in ["short", "long"] {
        assert_exact(&validate(case));
    }
}

/// `run` and `convert` on `bad` both exit 2 naming `named`, and convert writes nothing.
fn refused_by_run_and_convert(bad: &Path, tag: &str, named: &[&str]) {
    let o = colibri()
        .arg("run")
        .arg("--snap")
        .arg(bad)
        .args(["--max-tokens", "2", "--temp", "0", "hi"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    for n in named {
        assert!(stderr(&o).contains(n), "{n}: {}", stderr(&o));
    }
    let (e, to) = oracle::convert_refused(bad, tag);
    assert!(e.contains(named[0]), "{e}");
    assert!(
        !to.exists() || std::fs::read_dir(&to).unwrap().next().is_none(),
        "convert wrote something"
    );
}

#[test]
fn an_unknown_layer_type_is_refused_by_run_and_convert() {
    let bad = copy_with_config(&fixture(HF), "dsv4-bad-type", |v| {
        v["layer_types"][2] = "linear_attention".into();
    });
    refused_by_run_and_convert(
        &bad,
        "dsv4-bad-type-out",
        &[
            "\"layer_types\" = \"linear_attention\"",
            "\"heavily_compressed_attention\"",
        ],
    );
}

#[test]
fn groups_that_do_not_divide_the_heads_are_refused() {
    let bad = copy_with_config(&fixture(HF), "dsv4-bad-groups", |v| {
        v["o_groups"] = 3.into();
    });
    refused_by_run_and_convert(
        &bad,
        "dsv4-bad-groups-out",
        &["\"o_groups\" = 3", "must divide num_attention_heads (4)"],
    );
}

#[test]
fn a_compress_ratio_it_does_not_know_is_refused() {
    let bad = copy_with_config(&fixture(HF), "dsv4-bad-ratio", |v| {
        v.as_object_mut().unwrap().remove("layer_types");
        v["compress_ratios"] = serde_json::json!([0, 4, 8, 4]);
    });
    refused_by_run_and_convert(&bad, "dsv4-bad-ratio-out", &["\"compress_ratios\" = 8"]);
}

/// `info` on the fixture names the family and counts every tensor it holds (the hash
/// layers' token-id tables included).
#[test]
fn info_reads_the_fixture() {
    let o = colibri()
        .args(["info", "--json", "--snap"])
        .arg(fixture(HF))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["family"], "deepseek_v4", "{v}");
}
