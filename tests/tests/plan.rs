//! `colibri plan`: the RAM split and predicted speeds of a published shape (Qwen3-30B-A3B's
//! config.json) with the machine's speeds given, so the figures follow from the shapes alone;
//! the real probes on a tiny model on disk; a usage history replacing the uniform routing;
//! and the refusals.

use std::path::Path;
use std::process::Output;

use colibri_e2e::{colibri, fixture, temp_dir};
use serde_json::Value;

/// The machine every figure below is predicted for.
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

fn qwen3_30b() -> std::path::PathBuf {
    fixture("configs").join("qwen3-30b-a3b.json")
}

fn plan(args: &[&str]) -> Output {
    colibri().arg("plan").args(args).output().unwrap()
}

fn plan_json(config: &Path, args: &[&str]) -> Value {
    let out = colibri()
        .args(["plan", "--json", "--config"])
        .arg(config)
        .args(SPEEDS)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn a_published_shape_in_ram_decodes_at_the_memory_limit() {
    let v = plan_json(&qwen3_30b(), &["--ram-gb", "64"]);
    assert_eq!(v["family"], "qwen3_moe");
    assert_eq!(v["fits"], true);
    assert_eq!(v["ram"]["experts_in_ram_per_layer"], 128);
    let p = &v["predicted"];
    assert_eq!(f(&p["warm"]["hit_rate"]), 1.0);
    assert_eq!(p["warm"]["disk_bytes_per_token"], 0);
    assert_eq!(p["limit"], "memory bandwidth");
    // Warm: the bytes a token computes from at 0.83 of the memory probe.
    let want = 20e9 * 0.83 / f(&p["bytes_per_token"]);
    assert!((f(&p["warm"]["decode_tok_s"]) - want).abs() < 1e-6 * want);
    // Cold: top 8 of 48 layers' experts read at 2 GB/s on top.
    let cold_disk = 48.0 * 8.0 * f(&v["expert_bytes"]);
    assert_eq!(f(&p["disk_bytes_per_token"]), cold_disk.floor());
    // The experts' products and their reads overlap by half the shorter (plan's
    // READ_OVERLAP); the dense part runs before a layer's router names its experts, alone.
    let per_byte = 1.0 / (20e9 * 0.83);
    let expert_s = cold_disk * per_byte;
    let dense_s = (f(&p["bytes_per_token"]) - cold_disk) * per_byte;
    let read_s = cold_disk / 2e9;
    let cold = 1.0 / (dense_s + expert_s.max(read_s) + 0.5 * expert_s.min(read_s));
    assert!((f(&p["decode_tok_s"]) - cold).abs() < 1e-6 * cold);
    // int4 with a scale per 64 inputs is 4.5 bits a weight: about 17 GB of experts.
    let experts = 48.0 * 128.0 * 3.0 * 2048.0 * 768.0 * 4.5 / 8.0;
    assert_eq!(f(&v["expert_bytes"]) * 48.0 * 128.0, experts);
    assert!(f(&v["disk_bytes"]) > experts && f(&v["disk_bytes"]) < experts * 1.15);
    // The split adds up to no more than the budget.
    let r = &v["ram"];
    let used: f64 = [
        "dense_bytes",
        "kv_bytes",
        "reserve_bytes",
        "working_set_bytes",
        "expert_bytes",
    ]
    .iter()
    .map(|k| f(&r[k]))
    .sum();
    assert!(
        used <= f(&r["budget_bytes"]),
        "{used} > {}",
        r["budget_bytes"]
    );
}

#[test]
fn less_ram_holds_fewer_experts_and_names_what_would_help() {
    let big = plan_json(&qwen3_30b(), &["--ram-gb", "64"]);
    let small = plan_json(&qwen3_30b(), &["--ram-gb", "10"]);
    let held = small["ram"]["experts_in_ram_per_layer"].as_u64().unwrap();
    assert!(held > 0 && held < 128, "{held}");
    let p = &small["predicted"];
    assert!((f(&p["warm"]["hit_rate"]) - held as f64 / 128.0).abs() < 1e-12);
    assert!(f(&p["warm"]["decode_tok_s"]) < f(&big["predicted"]["warm"]["decode_tok_s"]));
    let moves: Vec<&str> = small["would_move"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["what"].as_str().unwrap())
        .collect();
    assert!(moves.iter().any(|m| m.contains("of RAM")), "{moves:?}");
    assert!(
        moves.iter().any(|m| m.contains("second drive")),
        "{moves:?}"
    );
    assert!(
        moves.iter().any(|m| m.contains("--expert-bits 3")),
        "{moves:?}"
    );
    // More context per slot takes RAM from the experts.
    let long = plan_json(&qwen3_30b(), &["--ram-gb", "10", "--ctx", "32768"]);
    assert!(long["ram"]["experts_in_ram_per_layer"].as_u64().unwrap() < held);
    // Too little RAM: refused as a prediction, not an error.
    let tiny = plan_json(&qwen3_30b(), &["--ram-gb", "2"]);
    assert_eq!(tiny["fits"], false);
    assert_eq!(tiny["predicted"]["limit"], "RAM");
}

#[test]
fn a_usage_history_replaces_the_uniform_assumption() {
    let dir = temp_dir("plan-usage");
    // Upstream's format, unverified (no checksum record): layer expert count, each layer's
    // selections falling off as 1/(rank+1).
    let mut text = format!("-1 48 128\n-2 1 {}\n", fnv1a32("glm_moe_dsa"));
    for l in 0..48 {
        for e in 0..128u64 {
            text.push_str(&format!("{l} {e} {}\n", 10_000 / (e + 1)));
        }
    }
    let usage = dir.join(".coli_usage");
    std::fs::write(&usage, text).unwrap();
    let uniform = plan_json(&qwen3_30b(), &["--ram-gb", "10"]);
    let skewed = plan_json(
        &qwen3_30b(),
        &["--ram-gb", "10", "--usage", usage.to_str().unwrap()],
    );
    assert!(skewed["routing"]
        .as_str()
        .unwrap()
        .contains("usage history"));
    let (u, s) = (&uniform["predicted"]["warm"], &skewed["predicted"]["warm"]);
    assert!(f(&s["hit_rate"]) > f(&u["hit_rate"]) + 0.1, "{s} vs {u}");
    assert!(f(&s["decode_tok_s"]) > f(&u["decode_tok_s"]));
}

fn fnv1a32(s: &str) -> u32 {
    s.bytes().fold(2_166_136_261u32, |h, b| {
        (h ^ b as u32).wrapping_mul(16_777_619)
    })
}

#[test]
fn a_model_on_disk_is_probed_for_real() {
    let probe = temp_dir("plan-probe");
    let out = plan(&[
        "--snap",
        fixture("tiny-qwen3-moe").to_str().unwrap(),
        "--probe-dir",
        probe.to_str().unwrap(),
        "--ram-gb",
        "8",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    for k in [
        "disk_gb_s",
        "memory_gb_s",
        "expert_decode_gb_s",
        "prefill_gmac_s",
        "expert_gmac_s",
        "attention_gmac_s",
    ] {
        assert!(f(&v["probes"][k]) > 0.0, "{k}: {}", v["probes"]);
    }
    assert_eq!(v["fits"], true);
    assert!(f(&v["predicted"]["warm"]["decode_tok_s"]) > 0.0);
    // The probe's scratch file is gone.
    assert_eq!(std::fs::read_dir(&probe).unwrap().count(), 0);
}

#[test]
fn bad_input_is_refused_by_name() {
    let none = plan(&SPEEDS);
    assert_eq!(none.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&none.stderr).contains("--config FILE"));

    let missing = plan(&["--config", "/nonexistent/config.json"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/config.json"));

    let dir = temp_dir("plan-bad");
    let cfg = dir.join("config.json");
    std::fs::write(
        &cfg,
        r#"{"model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 9}"#,
    )
    .unwrap();
    let out = plan(&["--config", cfg.to_str().unwrap(), "--disk-gbs", "1"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("\"num_experts_per_tok\" = 9"), "{err}");

    let out = plan(&["--config", qwen3_30b().to_str().unwrap(), "--ram-gb", "-3"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--ram-gb"));

    let out = plan(&[
        "--config",
        qwen3_30b().to_str().unwrap(),
        "--expert-bits",
        "5",
        "--disk-gbs",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--expert-bits 5"));
}
