//! `--snap FILE.gguf` beyond `run` and `validate` (issue 49): `score` and `bench` on a GGUF,
//! its experts through the tiers (a tiny cache, the memory-mapped and O_DIRECT read paths),
//! and llama.cpp's deepseek2 (DeepSeek-V3, `kv_b_proj` split in two) validating token-exact
//! against the transformers oracle, directly and once converted.

use std::path::{Path, PathBuf};

use colibri_e2e::oracle::{self, assert_exact};
use colibri_e2e::{colibri, fixture, last_line, run_ok, stderr, temp_dir, validate_refused};

const GLM: &str = "tiny-glm4-moe";
const DSV3: &str = "tiny-deepseek-v3";

fn gguf(model: &str) -> PathBuf {
    fixture("gguf").join(format!("{model}-f32.gguf"))
}

/// `colibri score` of a short text: its SCORE line.
fn score(snap: &Path) -> String {
    let text = temp_dir("gguf-score").join("text.txt");
    std::fs::write(
        &text,
        "The sea is wide, the sea is deep, it sings the sailors into sleep. ".repeat(4),
    )
    .unwrap();
    let mut cmd = colibri();
    cmd.arg("score")
        .arg("--text")
        .arg(&text)
        .args(["--ctx", "32", "--stride", "16", "--snap"])
        .arg(snap);
    last_line(&run_ok(&mut cmd).stdout)
}

#[test]
fn score_and_bench_run_on_a_gguf() {
    // The F32 GGUF is the fixture's weights: the same perplexity to the last digit.
    let line = score(&gguf(GLM));
    assert!(line.starts_with("SCORE tokens="), "{line}");
    assert_eq!(line, score(&fixture(GLM)));
    let mut cmd = colibri();
    cmd.arg("bench")
        .arg("--ref")
        .arg(fixture(GLM).join("ref.json"))
        .args(["--case", "short", "--no-membw", "--snap"])
        .arg(gguf(GLM));
    let last = last_line(&run_ok(&mut cmd).stdout);
    assert!(last.starts_with("BENCH prefill_pos_s="), "{last}");
}

#[test]
fn a_gguf_streams_its_experts_through_every_read_path() {
    let want = oracle::run_greedy(&fixture(GLM), &["Tell me about the sea."]);
    for extra in [
        &["--cache", "1"][..],
        &["--mmap"][..],
        &["--direct"][..],
        &["--cache", "2", "--direct"][..],
    ] {
        let mut args = vec!["Tell me about the sea."];
        args.extend_from_slice(extra);
        assert_eq!(oracle::run_greedy(&gguf(GLM), &args), want, "{extra:?}");
    }
}

#[test]
fn a_deepseek2_gguf_validates_token_exact_and_converts() {
    let file = gguf(DSV3);
    for case in ["short", "long"] {
        let line = oracle::expect_exact(&file, DSV3, case, &[]);
        // The same figures as the safetensors fixture it was made from.
        let want = last_line(oracle::validate(&fixture(DSV3), DSV3, case, &[]).as_bytes());
        assert_eq!(line, want, "{case}");
    }
    let to = temp_dir("gguf-dsv3-convert").join("c");
    let o = colibri()
        .arg("convert")
        .arg("--from")
        .arg(&file)
        .arg("--to")
        .arg(&to)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let line = last_line(oracle::validate(&to, DSV3, "short", &[]).as_bytes());
    assert_exact(&line, "converted deepseek2");
    let args = ["Tell me about the sea.", "--raw"];
    assert_eq!(
        oracle::run_greedy(&to, &args),
        oracle::run_greedy(&file, &args)
    );
}

#[test]
fn a_deepseek2_gguf_routed_by_softmax_is_refused_naming_the_key() {
    // expert_gating_func 2 (sigmoid) -> 1 (softmax, DeepSeek-V2's routing).
    let mut bytes = std::fs::read(gguf(DSV3)).unwrap();
    colibri_e2e::gguf_edit::set_u32_key(&mut bytes, "deepseek2.expert_gating_func", 2, 1);
    let p = temp_dir("gguf-dsv3-softmax").join("softmax.gguf");
    std::fs::write(&p, bytes).unwrap();
    let err = validate_refused(&p, &fixture(DSV3).join("ref.json"));
    assert!(
        err.contains("deepseek2.expert_gating_func") && err.contains("sigmoid"),
        "{err}"
    );
}
