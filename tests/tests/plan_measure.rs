//! `colibri plan --measure DIR`: a random-weight model of a config's shapes written, run by
//! `colibri bench` children and reported beside the prediction (CONTRACT §9's keys); a second
//! run reuses it; the refusals before writing (a folder not empty, a disk without room) and a
//! half-written model refused at load.

use std::path::Path;
use std::process::Output;

use colibri_e2e::{colibri, fixture, stderr, temp_dir};
use serde_json::Value;

/// Given speeds: the figures of the prediction do not depend on this machine's probes.
const SPEEDS: [&str; 14] = [
    "--disk-gbs",
    "2",
    "--mem-gbs",
    "20",
    "--dense-gbs",
    "20",
    "--expert-decode-gbs",
    "20",
    "--prefill-gmacs",
    "100",
    "--expert-gmacs",
    "50",
    "--attention-gmacs",
    "10",
];

fn tiny(family: &str) -> std::path::PathBuf {
    fixture(family).join("config.json")
}

fn measure(config: &Path, dir: &Path, extra: &[&str]) -> Output {
    colibri()
        .args(["plan", "--json", "--config"])
        .arg(config)
        .arg("--measure")
        .arg(dir)
        .args(SPEEDS)
        .args(["--ram-gb", "4", "--measure-tokens", "8"])
        .args(extra)
        .env("COLI_STATE_DIR", dir.join(".state"))
        .output()
        .unwrap()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn a_tiny_shape_is_written_run_and_reported_then_reused() {
    let dir = temp_dir("measure").join("model");
    let out = measure(&tiny("tiny-glm4-moe"), &dir, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["measure"]["reused"], false);
    assert_eq!(v["measure"]["skew"], 0.08);
    let disk = v["measure"]["bytes"].as_u64().unwrap();
    let on_disk: u64 = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert_eq!(disk, on_disk);
    let m = &v["measured"];
    // CONTRACT §9's keys, each a real figure of the runs.
    assert!(f(&v["predicted"]["decode_tok_s"]) > 0.0);
    assert!(f(&m["decode_tok_s"]) > 0.0, "{m}");
    assert!(f(&m["warm"]["decode_tok_s"]) > 0.0, "{m}");
    assert!(f(&m["ready_s"]) > 0.0, "{m}");
    assert!(f(&m["ttft_s"]) > 0.0, "{m}");
    assert!(m["bytes_per_token"].as_u64().is_some(), "{m}");
    assert!(f(&m["disk_gb_s"]) >= 0.0, "{m}");
    // The cold run starts with an empty expert cache: it reads experts from the disk.
    assert!(m["bytes_per_token"].as_u64().unwrap() > 0, "{m}");
    assert_eq!(m["runs"]["cold"]["decode_steps"], 8);
    assert_eq!(m["runs"]["first_token"]["prefill_positions"], 1000);
    // Its prefill starts from an empty cache too: the experts it meets are read.
    assert!(
        m["runs"]["first_token"]["prefill_bytes_read"]
            .as_u64()
            .unwrap()
            > 0,
        "{m}"
    );
    // The cold run's selections, written beside the model (not as its history: the later
    // runs start cold), give a second prediction; 4 GB holds every expert of this shape.
    let routed = &v["predicted_run_routing"];
    let usage = Path::new(routed["usage"].as_str().unwrap());
    assert!(usage.starts_with(&dir) && !dir.join(".coli_usage").exists());
    let counts: u64 = std::fs::read_to_string(usage)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('-'))
        .filter_map(|l| l.split_whitespace().nth(2)?.parse::<u64>().ok())
        .sum();
    assert!(counts > 0, "{usage:?}");
    assert_eq!(f(&routed["hit_rate"]), 1.0, "{routed}");
    assert!(f(&routed["warm"]["decode_tok_s"]) > 0.0, "{routed}");
    assert!(m["peak_rss_bytes"].as_u64().unwrap() > 0);
    assert_eq!(m["budget_bytes"], 4_000_000_000u64);
    // Every child held the experts per layer the plan holds (its own KV, sized to its few
    // tokens, would leave room for more): the figure is the plan's, each run's from its
    // [RAM] line, and none differs.
    let held = &m["experts_per_layer"];
    let planned = held["planned"].as_u64().unwrap();
    assert_eq!(
        planned,
        v["ram"]["experts_in_ram_per_layer"].as_u64().unwrap()
    );
    assert!(planned > 0, "{held}");
    for run in ["cold", "first_token", "warm", "pilot"] {
        assert_eq!(held[run].as_u64(), Some(planned), "{run}: {held}");
        assert_eq!(m["runs"][run]["experts_per_layer"], planned, "{run}");
    }
    // The cold runs never let `--pilot auto` decide; the pilot run asked for it.
    let err = stderr(&out);
    assert_eq!(err.matches("--pilot off --cache").count(), 3, "{err}");
    assert_eq!(err.matches("--pilot on --cache").count(), 1, "{err}");

    // The same parameters again: the model is reused, not rewritten.
    let before = std::fs::metadata(dir.join("colibri-measure.json"))
        .unwrap()
        .modified()
        .unwrap();
    let out = measure(&tiny("tiny-glm4-moe"), &dir, &["--write-only"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["measure"]["reused"], true);
    assert!(v.get("measured").is_none());
    let after = std::fs::metadata(dir.join("colibri-measure.json"))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(before, after);
    // Other parameters into the same folder are refused.
    let out = measure(
        &tiny("tiny-glm4-moe"),
        &dir,
        &["--write-only", "--skew", "0.3"],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("other parameters"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_folder_that_is_not_empty_is_refused_before_writing() {
    let dir = temp_dir("measure-full");
    std::fs::write(dir.join("mine.txt"), "keep me").unwrap();
    let out = measure(&tiny("tiny-qwen3-moe"), &dir, &["--write-only"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("not empty"), "{}", stderr(&out));
    let names: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert_eq!(names.len(), 1);
}

#[test]
fn a_shape_bigger_than_the_disk_is_refused_stating_the_bytes() {
    // DeepSeek-V3's shapes at int8: ~700 GB, more than any test machine's free disk.
    let dir = temp_dir("measure-big").join("model");
    let out = measure(
        &fixture("configs").join("deepseek-v3.json"),
        &dir,
        &["--write-only", "--expert-bits", "8"],
    );
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(
        e.contains("the model needs ") && e.contains(" bytes"),
        "{e}"
    );
    assert!(
        e.contains("free") && e.contains("Nothing was written"),
        "{e}"
    );
    assert!(!dir.exists());
}

#[test]
fn a_half_written_model_does_not_load() {
    let dir = temp_dir("measure-half").join("model");
    let out = measure(&tiny("tiny-qwen3-moe"), &dir, &["--write-only"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // As a kill during the write leaves the folder: the marker is removed only at the end.
    std::fs::write(dir.join(".colibri-unfinished"), "").unwrap();
    let out = colibri()
        .args([
            "bench",
            "--prompt-tokens",
            "2",
            "--gen-tokens",
            "2",
            "--snap",
        ])
        .arg(&dir)
        .env("COLI_STATE_DIR", dir.join(".state"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(
        e.contains("interrupted `colibri plan --measure`") && e.contains("delete the folder"),
        "{e}"
    );
    let out = measure(&tiny("tiny-qwen3-moe"), &dir, &["--write-only"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("half-written"), "{}", stderr(&out));
}

#[test]
fn another_family_is_refused_naming_it() {
    let dir = temp_dir("measure-family").join("model");
    let out = measure(
        &fixture("configs").join("gpt-oss-20b.json"),
        &dir,
        &["--write-only"],
    );
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(e.contains("\"gpt_oss\"") && e.contains("glm4_moe"), "{e}");
    assert!(!dir.exists());
}
