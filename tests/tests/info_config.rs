//! `colibri info --config FILE`: a bare `config.json`'s total and active parameters, counted
//! from its shapes. Checked against the tensors of every oracle fixture (each family, biases,
//! q/k norms, the DSA indexer, an unfactored query, tied embeddings: the count must be the
//! sum of their element counts, the MTP layers left out) and against the published figures of
//! every checkpoint whose config.json is in tests/fixtures/configs (SOURCES.md there says where
//! each file and each figure comes from).

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
            // DeepSeek-V4's published names have no `model.` prefix.
            let layer = name
                .strip_prefix("model.layers.")
                .or_else(|| name.strip_prefix("layers."))
                .and_then(|r| r.split('.').next())
                .and_then(|l| l.parse::<u64>().ok());
            if layer.is_some_and(|l| l >= layers) {
                continue;
            }
            // MXFP4 (gpt-oss): a `_blocks` byte holds two values, its `_scales` are no
            // parameters of their own; nor are the `F8_E8M0` scales of DeepSeek-V4's
            // published checkpoint, whose `I8` experts hold two FP4 values a byte.
            if name.ends_with("_scales") || t["dtype"] == "F8_E8M0" {
                continue;
            }
            if t["dtype"] == "I8" {
                total += 2 * t["shape"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap())
                    .product::<u64>();
                continue;
            }
            if name.ends_with("_blocks") {
                total += 2 * t["shape"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap())
                    .product::<u64>();
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
        // A text-only Qwen3.5 config says `qwen3_5_moe_text`: the language model of its family.
        let family = config["model_type"]
            .as_str()
            .unwrap()
            .trim_end_matches("_text");
        assert_eq!(got["family"], family, "{name}");
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} fixtures");
}

/// How a vendor counts the parameters one token activates, against `info`'s `active` (every
/// weight the token's forward pass multiplies by, the output head included, the input
/// embedding table not: DeepSeek's definition).
#[derive(Clone, Copy, Debug)]
enum Counting {
    /// As `info`: DeepSeek's README_WEIGHTS.md, "36.6B (including 0.9B for the output Head)".
    OutputHead,
    /// Both vocabulary tables in (Qwen3: 3.3B activated in a 30.5B model whose non-embedding
    /// total is 29.9B; without the input table it would be 3.0B).
    BothTables,
    /// Neither table (GLM: 32B, 12B and 40B match only without the output head).
    NoTables,
}

struct Published {
    file: &'static str,
    family: &'static str,
    total: &'static str,
    active: &'static str,
    counting: Counting,
    /// Where the two figures are published.
    source: &'static str,
}

const DEEPSEEK: &str = "deepseek-ai model cards (671B total, 37B activated) and \
    README_WEIGHTS.md (36.6B activated, including the 0.9B output head)";
const GLM45: &str = "GLM-4.5 model card and the GLM-5 technical report's table (355B / 32B; \
    GLM-4.6 and 4.7 share GLM-4.5's architecture and publish no figure of their own)";

const MINIMAX: &str = "MiniMax-M2 model card and transformers' minimax_m2 docs (230B total, \
    10B active; M2.1, M2.5 and M2.7 share M2's architecture)";
const GPT_OSS: &str = "OpenAI's gpt-oss model card (arXiv 2508.10925, table 1: 116.83B total \
    / 5.13B active, 20.91B / 3.61B; active counts the unembedding, not the embedding)";

/// Every checkpoint of tests/fixtures/configs and its published figures.
const PUBLISHED: [Published; 20] = [
    Published {
        file: "deepseek-v3.json",
        family: "deepseek_v3",
        total: "671B",
        active: "36.6B",
        counting: Counting::OutputHead,
        source: DEEPSEEK,
    },
    Published {
        file: "deepseek-r1.json",
        family: "deepseek_v3",
        total: "671B",
        active: "36.6B",
        counting: Counting::OutputHead,
        source: DEEPSEEK,
    },
    Published {
        file: "deepseek-v3.1.json",
        family: "deepseek_v3",
        total: "671B",
        active: "36.6B",
        counting: Counting::OutputHead,
        source: DEEPSEEK,
    },
    // No figure of its own: V3.1-Terminus's architecture plus the indexer (0.85B, all active).
    Published {
        file: "deepseek-v3.2.json",
        family: "deepseek_v32",
        total: "671B",
        active: "37B",
        counting: Counting::OutputHead,
        source: DEEPSEEK,
    },
    Published {
        file: "kimi-k2-instruct.json",
        family: "deepseek_v3",
        total: "1T",
        active: "32B",
        counting: Counting::OutputHead,
        source: "moonshotai/Kimi-K2-Instruct model card",
    },
    Published {
        file: "qwen3-30b-a3b.json",
        family: "qwen3_moe",
        total: "30.5B",
        active: "3.3B",
        counting: Counting::BothTables,
        source: "Qwen/Qwen3-30B-A3B model card",
    },
    Published {
        file: "qwen3-235b-a22b.json",
        family: "qwen3_moe",
        total: "235B",
        active: "22B",
        counting: Counting::BothTables,
        source: "Qwen/Qwen3-235B-A22B model card",
    },
    Published {
        file: "qwen3-coder-480b-a35b-instruct.json",
        family: "qwen3_moe",
        total: "480B",
        active: "35B",
        counting: Counting::BothTables,
        source: "Qwen/Qwen3-Coder-480B-A35B-Instruct model card",
    },
    Published {
        file: "glm-4.5.json",
        family: "glm4_moe",
        total: "355B",
        active: "32B",
        counting: Counting::NoTables,
        source: GLM45,
    },
    Published {
        file: "glm-4.5-air.json",
        family: "glm4_moe",
        total: "106B",
        active: "12B",
        counting: Counting::NoTables,
        source: "GLM-4.5 model card (GLM-4.5-Air: 106B / 12B)",
    },
    Published {
        file: "glm-4.6.json",
        family: "glm4_moe",
        total: "355B",
        active: "32B",
        counting: Counting::NoTables,
        source: GLM45,
    },
    Published {
        file: "glm-4.7.json",
        family: "glm4_moe",
        total: "355B",
        active: "32B",
        counting: Counting::NoTables,
        source: GLM45,
    },
    Published {
        file: "glm-5.json",
        family: "glm_moe_dsa",
        total: "744B",
        active: "40B",
        counting: Counting::NoTables,
        source: "zai-org/GLM-5 model card and technical report (744B / 40B)",
    },
    Published {
        file: "minimax-m2.5.json",
        family: "minimax_m2",
        total: "230B",
        active: "10B",
        counting: Counting::NoTables,
        source: MINIMAX,
    },
    Published {
        file: "minimax-m2.7.json",
        family: "minimax_m2",
        total: "230B",
        active: "10B",
        counting: Counting::NoTables,
        source: MINIMAX,
    },
    Published {
        file: "gpt-oss-20b.json",
        family: "gpt_oss",
        total: "20.9B",
        active: "3.6B",
        counting: Counting::OutputHead,
        source: GPT_OSS,
    },
    Published {
        file: "gpt-oss-120b.json",
        family: "gpt_oss",
        total: "116.8B",
        active: "5.1B",
        counting: Counting::OutputHead,
        source: GPT_OSS,
    },
    // Qwen's Qwen3.5 active figures fit no single convention (SOURCES.md): 17B is both
    // tables in (17.35B; the output head alone gives 16.33B), 3B the output head alone
    // (2.95B; both tables give 3.45B).
    Published {
        file: "qwen3.5-397b-a17b.json",
        family: "qwen3_5_moe",
        total: "397B",
        active: "17B",
        counting: Counting::BothTables,
        source: "Qwen/Qwen3.5-397B-A17B model card (397B in total, 17B activated)",
    },
    Published {
        file: "qwen3.6-35b-a3b.json",
        family: "qwen3_5_moe",
        total: "35B",
        active: "3B",
        counting: Counting::OutputHead,
        source: "Qwen/Qwen3.6-35B-A3B model card (35B in total, 3B activated)",
    },
    // 284.33B and 13.27B (with the output head: DeepSeek's definition), the same as
    // transformers' DeepseekV4ForCausalLM built on the meta device counts.
    Published {
        file: "deepseek-v4-flash.json",
        family: "deepseek_v4",
        total: "284B",
        active: "13B",
        counting: Counting::OutputHead,
        source: "DeepSeek-V4 technical report and model card (DeepSeek-V4-Flash with 284B \
            parameters, 13B activated)",
    },
];

/// A published figure ("671B", "3.3B", "1T") as a count, and how far a count may be from it:
/// one unit of its last digit (vendors round and truncate), at least 1% and at most 3% (so
/// that a figure as coarse as "1T" still says something).
fn figure(s: &str) -> (f64, f64) {
    let (digits, unit) = s.split_at(s.len() - 1);
    let scale = match unit {
        "B" => 1e9,
        "T" => 1e12,
        _ => panic!("{s}: not a published figure"),
    };
    let value: f64 = digits.parse().unwrap();
    let decimals = digits.split('.').nth(1).map_or(0, str::len) as i32;
    let tol = (10f64.powi(-decimals) / value).clamp(0.01, 0.03);
    (value * scale, tol)
}

#[test]
fn published_checkpoints_count_as_their_vendors_publish() {
    let dir = root().join("tests/fixtures/configs");
    let files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    // Every file there has its figures here, and every row its file.
    assert_eq!(files.len(), PUBLISHED.len(), "{files:?}");
    for p in &PUBLISHED {
        assert!(files.iter().any(|f| f == p.file), "{} missing", p.file);
        let got = info_config(&dir.join(p.file));
        assert_eq!(got["family"], p.family, "{}", p.file);
        let n = |k: &str| {
            got[k]
                .as_u64()
                .unwrap_or_else(|| panic!("{}: {k} in {got}", p.file)) as f64
        };
        let (total, total_tol) = figure(p.total);
        assert!(
            (n("params") / total - 1.0).abs() <= total_tol,
            "{}: {} params against {} published ({})",
            p.file,
            n("params"),
            p.total,
            p.source
        );
        let active = match p.counting {
            Counting::OutputHead => n("active"),
            Counting::BothTables => n("active") + n("embedding"),
            Counting::NoTables => n("active") - n("embedding"),
        };
        let (published, active_tol) = figure(p.active);
        assert!(
            (active / published - 1.0).abs() <= active_tol,
            "{}: {active} active ({:?}) against {} published ({})",
            p.file,
            p.counting,
            p.active,
            p.source
        );
        // The MTP layers are counted apart: the published totals leave them out.
        let config: Value =
            serde_json::from_slice(&std::fs::read(dir.join(p.file)).unwrap()).unwrap();
        let mtp_layers = config["num_nextn_predict_layers"].as_u64().unwrap_or(0);
        assert_eq!(n("mtp") > 0.0, mtp_layers > 0, "{}: {got}", p.file);
    }
}

#[test]
fn deepseek_v3_text_names_its_mtp_head_apart() {
    let path = root().join("tests/fixtures/configs/deepseek-v3.json");
    let out = colibri()
        .args(["info", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("parameters   671.0B (36.6B active per token)\n"),
        "{text}"
    );
    // DeepSeek's README_WEIGHTS.md: "11.5B unique parameters" in the MTP module, without the
    // embedding and output head it shares with the main model.
    assert!(
        text.contains("mtp head     11.6B more (not in the parameters above)\n"),
        "{text}"
    );
    // The checkpoint stores the module with copies of both (layers.61.embed_tokens and
    // shared_head.head): with them, the 685B its Hugging Face page counts.
    let got = info_config(&path);
    let n = |k: &str| got[k].as_f64().unwrap();
    let stored = n("params") + n("mtp") + 2.0 * n("embedding");
    assert!((stored / 685e9 - 1.0).abs() < 0.005, "{got}");
    // --config and --snap are one or the other.
    let out = colibri()
        .args(["info", "--snap", "x", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
