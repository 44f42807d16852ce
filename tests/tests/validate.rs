//! `colibri validate` in full precision must match transformers token for token on every
//! fixture and case: short, long with the DSA sparse path active, and long with sparsity off.

use colibri_e2e::oracle::assert_exact;
use colibri_e2e::{colibri, fixture, last_line, root, run_ok};

/// The weights of a fixture: its own directory, except the trained demo model's reference,
/// which is checked against the very files the binary embeds (daemon/demo).
fn snap(model: &str) -> std::path::PathBuf {
    match model {
        "demo-trained" => root().join("daemon").join("demo"),
        _ => fixture(model),
    }
}

fn validate(model: &str, case: &str, extra: &[&str]) -> String {
    let dir = fixture(model);
    let mut cmd = colibri();
    cmd.arg("validate")
        .arg("--snap")
        .arg(snap(model))
        .arg("--ref")
        .arg(dir.join("ref.json"))
        .args(["--case", case])
        .args(extra);
    let out = run_ok(&mut cmd);
    last_line(&out.stdout)
}

fn expect_exact(model: &str, case: &str, extra: &[&str]) {
    assert_exact(&validate(model, case, extra), &format!("{model} {case}"));
}

#[test]
fn dense_shared_short() {
    expect_exact("tiny-dense-shared", "short", &[]);
}

#[test]
fn dense_shared_long_sparse() {
    expect_exact("tiny-dense-shared", "long", &[]);
}

#[test]
fn dense_shared_long_dense() {
    expect_exact("tiny-dense-shared", "long_dense", &["--index-topk", "4096"]);
}

#[test]
fn moe_bias_short() {
    expect_exact("tiny-moe-bias", "short", &[]);
}

#[test]
fn moe_bias_long_sparse() {
    expect_exact("tiny-moe-bias", "long", &[]);
}

#[test]
fn moe_bias_long_dense() {
    expect_exact("tiny-moe-bias", "long_dense", &["--index-topk", "4096"]);
}

#[test]
fn qwen3_moe_short() {
    expect_exact("tiny-qwen3-moe", "short", &[]);
}

#[test]
fn qwen3_moe_long() {
    expect_exact("tiny-qwen3-moe", "long", &[]);
}

#[test]
fn qwen3_moe_sparse_step_tied_short() {
    expect_exact("tiny-qwen3-moe-step", "short", &[]);
}

#[test]
fn qwen3_moe_sparse_step_tied_long() {
    expect_exact("tiny-qwen3-moe-step", "long", &[]);
}

#[test]
fn glm4_moe_short() {
    expect_exact("tiny-glm4-moe", "short", &[]);
}

#[test]
fn glm4_moe_long() {
    expect_exact("tiny-glm4-moe", "long", &[]);
}

/// `attention_bias` on Qwen3-MoE biases o_proj too; without that bias the teacher-forced
/// tokens were 10/44 and 40/60.
#[test]
fn qwen3_moe_attention_bias_short() {
    expect_exact("tiny-qwen3-moe-bias", "short", &[]);
}

#[test]
fn qwen3_moe_attention_bias_long() {
    expect_exact("tiny-qwen3-moe-bias", "long", &[]);
}

/// The model card's YaRN (legacy `rope_scaling` with `rope_type`, factor 4) over an original
/// context of 64 that the long case runs past; plain RoPE would give 23/44 and 53/72.
#[test]
fn qwen3_moe_yarn_short() {
    expect_exact("tiny-qwen3-moe-yarn", "short", &[]);
}

#[test]
fn qwen3_moe_yarn_long() {
    expect_exact("tiny-qwen3-moe-yarn", "long", &[]);
}

#[test]
fn glm4_moe_groups_qk_norm_short() {
    expect_exact("tiny-glm4-moe-groups", "short", &[]);
}

#[test]
fn glm4_moe_groups_qk_norm_long() {
    expect_exact("tiny-glm4-moe-groups", "long", &[]);
}

/// YaRN in `rope_parameters` over the rotated half of each head, untruncated ramp; plain
/// RoPE would give 21/38 and 20/72.
#[test]
fn glm4_moe_yarn_short() {
    expect_exact("tiny-glm4-moe-yarn", "short", &[]);
}

#[test]
fn glm4_moe_yarn_long() {
    expect_exact("tiny-glm4-moe-yarn", "long", &[]);
}

#[test]
fn deepseek_v3_yarn_groups_short() {
    expect_exact("tiny-deepseek-v3", "short", &[]);
}

#[test]
fn deepseek_v3_yarn_groups_long() {
    expect_exact("tiny-deepseek-v3", "long", &[]);
}

#[test]
fn deepseek_v32_indexer_short() {
    expect_exact("tiny-deepseek-v32", "short", &[]);
}

/// Rows past index_topk (16) attend only to the indexer's selection: 192 sparse rows.
#[test]
fn deepseek_v32_indexer_long_sparse() {
    expect_exact("tiny-deepseek-v32", "long", &[]);
}

/// The same prompt with every key attended (`--index-topk` past the context) is not the
/// reference: the selection is what makes the long case exact.
#[test]
fn deepseek_v32_sparsity_matters() {
    let dir = fixture("tiny-deepseek-v32");
    let out = colibri()
        .arg("validate")
        .arg("--snap")
        .arg(&dir)
        .arg("--ref")
        .arg(dir.join("ref.json"))
        .args(["--case", "long", "--index-topk", "4096"])
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "dense attention matched the sparse oracle exactly"
    );
    assert!(last_line(&out.stdout).starts_with("VALIDATE tf="));
}

#[test]
fn trained_demo_short() {
    expect_exact("demo-trained", "short", &[]);
}

#[test]
fn trained_demo_long_sparse() {
    expect_exact("demo-trained", "long", &[]);
}

#[test]
fn trained_demo_logits_are_close() {
    // Exact argmax is the contract; the distance of the logits themselves shows how close.
    let dir = fixture("demo-trained");
    let out = run_ok(
        colibri()
            .arg("validate")
            .arg("--snap")
            .arg(snap("demo-trained"))
            .arg("--ref")
            .arg(dir.join("ref.json"))
            .args(["--case", "long"]),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("LOGITS "))
        .unwrap_or_else(|| panic!("no LOGITS line: {text}"));
    let max_abs: f64 = line
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("max_abs="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(max_abs < 1e-4, "{line}");
}

#[test]
fn both_attention_paths_validate() {
    for path in ["reconstruct", "absorbed"] {
        expect_exact("tiny-dense-shared", "long", &["--attn", path]);
        expect_exact("tiny-moe-bias", "long", &["--attn", path]);
        expect_exact("demo-trained", "long", &["--attn", path]);
    }
}

#[test]
fn sparsity_matters_on_the_long_case() {
    // The sparse reference must differ from the dense one somewhere, or the long case would not
    // be exercising the indexer at all; and running it dense must then fail the check.
    let dir = fixture("tiny-dense-shared");
    let mut cmd = colibri();
    cmd.arg("validate")
        .arg("--snap")
        .arg(&dir)
        .arg("--ref")
        .arg(dir.join("ref.json"))
        .args(["--case", "long", "--index-topk", "4096"]);
    let out = cmd.output().unwrap();
    assert!(
        !out.status.success(),
        "dense attention matched the sparse oracle exactly"
    );
}

/// `q_lora_rank: null` (Moonlight-16B-A3B, DeepSeek-V2-Lite): one q_proj in place of
/// q_a_proj, q_a_layernorm and q_b_proj. Refused before ("q_lora_rank" = null).
#[test]
fn deepseek_v3_unfactored_q_proj_short() {
    expect_exact("tiny-deepseek-v3-q-proj", "short", &[]);
}

#[test]
fn deepseek_v3_unfactored_q_proj_long() {
    expect_exact("tiny-deepseek-v3-q-proj", "long", &[]);
}

/// DeepSeek-V3.2 whose mlp_layer_types puts the dense layer in the middle (first_k_dense_replace
/// 1 is not read then). Before: refused, naming the dense MLP's missing tensor of layer 0.
#[test]
fn deepseek_v32_mlp_layer_types_short() {
    expect_exact("tiny-deepseek-v32-mlp-types", "short", &[]);
}

#[test]
fn deepseek_v32_mlp_layer_types_long() {
    expect_exact("tiny-deepseek-v32-mlp-types", "long", &[]);
}

/// A copy of `model`'s fixture whose config.json is edited by `edit`.
fn with_config(
    model: &str,
    tag: &str,
    edit: impl FnOnce(&mut serde_json::Value),
) -> std::path::PathBuf {
    let dir = colibri_e2e::temp_dir(tag).join("model");
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(fixture(model)).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
        }
    }
    let path = dir.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(&path, cfg.to_string()).unwrap();
    dir
}

/// A dense/sparse pattern the weights do not have is refused naming the config key and the
/// layer, not the first tensor found missing.
#[test]
fn a_layer_pattern_the_weights_lack_names_the_config_key() {
    let model = "tiny-deepseek-v32-mlp-types";
    let snap = with_config(model, "mlp-types-wrong", |c| {
        c["mlp_layer_types"] = serde_json::json!(["dense", "sparse", "sparse"]);
    });
    let out = validate_against(&snap, model, "short").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("\"mlp_layer_types\"")
            && err.contains("layer 0 dense")
            && err.contains("model.layers.0.mlp.gate.weight"),
        "{err}"
    );
}

/// The value of `key=` in `line`.
/// `colibri validate` of the model at `snap` against `model`'s reference, one case.
fn validate_against(snap: &std::path::Path, model: &str, case: &str) -> std::process::Command {
    let mut cmd = colibri();
    cmd.arg("validate")
        .arg("--snap")
        .arg(snap)
        .arg("--ref")
        .arg(fixture(model).join("ref.json"))
        .args(["--case", case]);
    cmd
}

fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

/// DeepSeek-V3.2 with 4 indexer heads, whose long case cuts inside ties of index scores (keys
/// every head scores at or below zero score exactly 0.0). Its reference keeps the earliest
/// keys of a tie, colibri's rule (transformers' torch.topk keeps an unspecified subset there),
/// so it matches exactly; `validate` counts the rows whose cut fell inside a tie, as many as
/// the reference saw.
#[test]
fn deepseek_v32_ties_at_the_cut_are_counted_and_follow_the_stated_rule() {
    let model = "tiny-deepseek-v32-ties";
    let reference: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture(model).join("ref.json")).unwrap()).unwrap();
    for case in ["short", "long"] {
        expect_exact(model, case, &[]);
        let out = run_ok(&mut validate_against(&fixture(model), model, case));
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .find(|l| l.starts_with("INDEXER "))
            .unwrap_or_else(|| panic!("no INDEXER line: {text}"));
        let want = &reference[case];
        assert_eq!(reference[case]["tie_rule"], "earliest");
        assert!(line.ends_with("tie_rule=earliest"), "{line}");
        assert_eq!(
            field(line, "sparse_rows"),
            want["sparse_rows"].as_u64().unwrap(),
            "{line}"
        );
        assert_eq!(
            field(line, "boundary_ties"),
            want["index_boundary_ties"].as_u64().unwrap(),
            "{case}: {line}"
        );
    }
    assert!(reference["long"]["index_boundary_ties"].as_u64().unwrap() > 0);
}

/// `validate` on a converted int8 container names the format its experts and dense
/// matrices are stored in (it printed "experts f32", the default of --expert-bits).
#[test]
fn validate_names_a_containers_stored_formats() {
    let model = "tiny-deepseek-v3-q-proj";
    let to = colibri_e2e::temp_dir("int8-container").join("c");
    let out = colibri()
        .arg("convert")
        .arg("--from")
        .arg(fixture(model))
        .arg("--to")
        .arg(&to)
        .args(["--expert-bits", "8", "--dense-bits", "8"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = validate_against(&to, model, "short").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("experts int8 / dense int8"), "{err}");
}
