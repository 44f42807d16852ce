//! `colibri info --config FILE`: a bare `config.json`'s total and active parameters, counted
//! from its shapes. Checked against the tensors of every oracle fixture (each family, biases,
//! q/k norms, the DSA indexer, an unfactored query, tied embeddings: the count must be the
//! sum of their element counts, the MTP layers left out) and against DeepSeek-V3's published
//! figures (671B total, 37B activated).

use std::path::Path;

use colibri_e2e::{colibri, root};
use serde_json::Value;

fn info_config(path: &Path) -> Value {
    let out = colibri()
        .args(["info", "--json", "--config"])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The elements of every tensor in `dir`'s safetensors files, without the layers at or past
/// `layers` (the MTP heads).
fn tensor_elements(dir: &Path, layers: u64) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "safetensors") {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        for (name, t) in header.as_object().unwrap() {
            if name == "__metadata__" {
                continue;
            }
            let layer = name
                .strip_prefix("model.layers.")
                .and_then(|r| r.split('.').next())
                .and_then(|l| l.parse::<u64>().ok());
            if layer.is_some_and(|l| l >= layers) {
                continue;
            }
            total += t["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .product::<u64>();
        }
    }
    total
}

#[test]
fn the_count_is_every_tensor_of_every_fixture() {
    let mut checked = 0;
    for entry in std::fs::read_dir(root().join("tests/fixtures")).unwrap() {
        let dir = entry.unwrap().path();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("tiny-") {
            continue;
        }
        let config: Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        let layers = config["num_hidden_layers"].as_u64().unwrap();
        let got = info_config(&dir.join("config.json"));
        assert_eq!(
            got["params"].as_u64().unwrap(),
            tensor_elements(&dir, layers),
            "{name}: {got}"
        );
        assert!(got["active"].as_u64().unwrap() <= got["params"].as_u64().unwrap());
        assert_eq!(got["family"], config["model_type"], "{name}");
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} fixtures");
}

/// The shape keys of deepseek-ai/DeepSeek-V3's `config.json`.
const DEEPSEEK_V3: &str = r#"{"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "attention_bias": false, "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
  "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
  "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
  "n_shared_experts": 1, "norm_topk_prob": true, "num_attention_heads": 128,
  "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
  "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06, "rope_theta": 10000,
  "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": false,
  "topk_group": 4, "topk_method": "noaux_tc", "v_head_dim": 128, "vocab_size": 129280,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
    "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"}}"#;

#[test]
fn deepseek_v3_is_671b_with_37b_active() {
    let dir = colibri_e2e::temp_dir("info-config");
    let path = dir.join("config.json");
    std::fs::write(&path, DEEPSEEK_V3).unwrap();
    let got = info_config(&path);
    let (params, active) = (
        got["params"].as_f64().unwrap(),
        got["active"].as_f64().unwrap(),
    );
    assert!((params / 671e9 - 1.0).abs() < 0.01, "{got}");
    // Published as "37B activated", a rounded figure: within 2%.
    assert!((active / 37e9 - 1.0).abs() < 0.02, "{got}");
    let text = colibri()
        .args(["info", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("parameters   671.0B (37.6B active per token)"),
        "{text}"
    );
    // --config and --snap are one or the other.
    let out = colibri()
        .args(["info", "--snap", "x", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
