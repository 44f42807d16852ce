//! `colibri validate` in full precision must match transformers token for token on every
//! fixture and case: short, long with the DSA sparse path active, and long with sparsity off.

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
    let line = validate(model, case, extra);
    let v: Vec<&str> = line.split([' ', '=', '/']).collect();
    // VALIDATE tf=a/b gen=c/d
    assert_eq!(v[0], "VALIDATE", "{line}");
    assert_eq!(v[2], v[3], "teacher forcing not exact: {line}");
    assert_eq!(v[5], v[6], "generation not exact: {line}");
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
