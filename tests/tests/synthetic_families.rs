//! `make_synthetic --family gpt_oss|minimax_m2|qwen3_5_moe|deepseek_v4` (the medium-model
//! writer of scripts/bench_families.sh) writes a model of each family that `colibri` loads and
//! decodes: a small one per family (4 layers, so Qwen3.5 has its full-attention layer and
//! DeepSeek-V4 a sliding, a compressed-sparse and a heavily-compressed one; 8 experts of
//! top 2; gpt-oss also with its published MXFP4 experts) goes through `colibri bench` with
//! synthetic ids, with every expert resident and with a two-expert cache that reads experts
//! from the shards.

use std::path::{Path, PathBuf};

use colibri_e2e::{colibri, example, run_ok, temp_dir};
use serde_json::Value;

const FAMILIES: [&str; 4] = ["gpt_oss", "minimax_m2", "qwen3_5_moe", "deepseek_v4"];

/// A small model of `family` with its experts in `format` in a fresh folder.
fn make(family: &str, format: &str) -> PathBuf {
    let out = temp_dir(&format!("synth-{family}-{format}")).join("m");
    run_ok(std::process::Command::new(example("make_synthetic")).args([
        "--out",
        out.to_str().unwrap(),
        "--family",
        family,
        "--layers",
        "4",
        "--experts",
        "8",
        "--top-k",
        "2",
        "--hidden",
        "256",
        "--inter",
        "128",
        "--expert-format",
        format,
    ]));
    out
}

/// `colibri bench` on `dir` with 4 prompt positions and 4 decode steps: the BENCH fields.
fn bench(dir: &Path, extra: &[&str]) -> (Vec<(String, f64)>, String) {
    let out = run_ok(
        colibri()
            .args(["bench", "--no-membw", "--no-disk-probe", "--snap"])
            .arg(dir)
            .args([
                "--prompt-tokens",
                "4",
                "--gen-tokens",
                "4",
                "--usage-save",
                "0",
            ])
            .args(extra),
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text
        .lines()
        .find(|l| l.starts_with("BENCH "))
        .unwrap_or_else(|| panic!("no BENCH line in {text}"));
    let fields = line["BENCH ".len()..]
        .split(' ')
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect();
    (fields, String::from_utf8_lossy(&out.stderr).into_owned())
}

fn get(fields: &[(String, f64)], key: &str) -> f64 {
    fields
        .iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("no {key} in {fields:?}"))
        .1
}

#[test]
fn each_new_family_loads_and_decodes_through_bench() {
    let cases = FAMILIES
        .iter()
        .map(|f| (*f, "i4row"))
        .chain([("gpt_oss", "mxfp4")]);
    for (family, format) in cases {
        let dir = make(family, format);
        let config: Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        let model_type = config["model_type"].as_str().unwrap();
        assert!(model_type.starts_with(family), "{family}: {model_type}");
        // `info` names the experts' format as the loader reads it.
        let info = run_ok(colibri().arg("info").arg("--snap").arg(&dir));
        let info = String::from_utf8_lossy(&info.stdout);
        let stored = if format == "mxfp4" {
            "mxfp4 (stored)"
        } else {
            "experts int4 (stored)"
        };
        assert!(info.contains(stored), "{family} {format}: {info}");
        let named = info
            .lines()
            .any(|l| l.starts_with("family") && l.trim_end().ends_with(family));
        assert!(named, "{family}: {info}");
        // Warm: every expert resident after the untimed replay.
        let (warm, err) = bench(&dir, &["--warmup"]);
        assert!(
            err.contains("4 prompt positions prefilled, 4 decode steps"),
            "{family}: {err}"
        );
        assert!(get(&warm, "decode_tok_s") > 0.0, "{family}: {warm:?}");
        assert!(get(&warm, "prefill_pos_s") > 0.0, "{family}: {warm:?}");
        assert_eq!(get(&warm, "hit_pct"), 100.0, "{family}: {warm:?}\n{err}");
        // Cold with two experts a layer: the top-2 picks of 8 miss and are read from disk.
        let (cold, err) = bench(&dir, &["--cache", "2"]);
        assert!(get(&cold, "decode_tok_s") > 0.0, "{family}: {cold:?}");
        assert!(get(&cold, "hit_pct") < 100.0, "{family}: {cold:?}\n{err}");
        assert!(get(&cold, "read_gbs") > 0.0, "{family}: {cold:?}\n{err}");
    }
}

/// The family's own structure is what the config says: gpt-oss alternates sliding and full
/// attention, Qwen3.5 has three DeltaNet layers to one full-attention layer, DeepSeek-V4 routes
/// its first layers by token id and has all three attention kinds, MiniMax-M2 rotates part of
/// each head; and each writes its experts in the int4 container with their names.
#[test]
fn each_family_has_its_published_structure() {
    for family in FAMILIES {
        let dir = make(family, "i4row");
        let c: Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        match family {
            "gpt_oss" => {
                let t: Vec<&str> = c["layer_types"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap())
                    .collect();
                assert_eq!(
                    t,
                    [
                        "sliding_attention",
                        "full_attention",
                        "sliding_attention",
                        "full_attention"
                    ]
                );
            }
            "qwen3_5_moe" => {
                let full = c["layer_types"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|v| *v == "full_attention")
                    .count();
                assert_eq!(full, 1, "{c}");
            }
            "deepseek_v4" => {
                assert_eq!(c["compress_ratios"], serde_json::json!([0, 4, 128, 4]));
                assert_eq!(c["num_hash_layers"], 2);
            }
            _ => assert_eq!(c["rotary_dim"], 64),
        }
        // One expert's gate projection: int4 per row (hidden 256 -> 128 bytes a row).
        let shard = std::fs::read(dir.join("model-experts-00001.safetensors")).unwrap();
        let n = u64::from_le_bytes(shard[..8].try_into().unwrap()) as usize;
        let header: Value = serde_json::from_slice(&shard[8..8 + n]).unwrap();
        let gate = &header["model.layers.0.mlp.experts.0.gate_proj.weight"];
        assert_eq!(gate["dtype"], "U8", "{family}");
        assert_eq!(gate["shape"], serde_json::json!([128, 128]), "{family}");
        let bias = header
            .get("model.layers.0.mlp.experts.0.gate_proj.bias")
            .is_some();
        assert_eq!(bias, family == "gpt_oss", "{family}");
    }
}
