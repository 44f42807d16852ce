//! `--snap FILE.gguf` for llama.cpp's glm-dsa (GLM-5) and deepseek32 (DeepSeek-V3.2): MLA with
//! the DSA indexer. The GGUFs its converter made of the tiny fixtures
//! (scripts/make_gguf_fixtures.sh) validate token-exact against the transformers oracle with
//! the safetensors folder's own figures (the long case past index_topk keys, so the indexer's
//! selection decides), `run` answers as the folder does, drafting without an MTP head or from
//! the MTP block llama.cpp keeps is the plain greedy answer, `info` names the family, and a file whose indexer types contradict
//! its tensors is refused (exit 2) naming the key.

use std::path::PathBuf;

use colibri_e2e::oracle::{self, expect_exact};
use colibri_e2e::{colibri, fixture, last_line, run_ok, temp_dir, validate_refused};

/// GLM-5 with attention biases (every indexer full), GLM-5 with a dense layer and shared
/// indexers, DeepSeek-V3.2 (YaRN, grouped routing, an indexer on every layer).
const FIXTURES: [&str; 3] = ["tiny-moe-bias", "tiny-dense-shared", "tiny-deepseek-v32"];

fn gguf(model: &str) -> PathBuf {
    fixture("gguf").join(format!("{model}-f32.gguf"))
}

#[test]
fn dsa_ggufs_validate_token_exact_as_their_safetensors_do() {
    for model in FIXTURES {
        for case in ["short", "long"] {
            let line = expect_exact(&gguf(model), model, case, &[]);
            let want = last_line(oracle::validate(&fixture(model), model, case, &[]).as_bytes());
            assert_eq!(line, want, "{model} {case}");
        }
    }
}

#[test]
fn run_answers_as_the_safetensors_fixture_does() {
    for model in FIXTURES {
        let args = ["Tell me about the sea.", "--raw"];
        let want = oracle::run_greedy(&fixture(model), &args);
        assert!(!want.is_empty(), "{model}");
        assert_eq!(oracle::run_greedy(&gguf(model), &args), want, "{model}");
        // The fixtures have no MTP block (llama.cpp's converter keeps one where the
        // checkpoint has it): drafting falls back to prompt lookup, greedy output unchanged.
        let drafted = [
            "Tell me about the sea.",
            "--raw",
            "--draft",
            "2",
            "--mtp",
            "1",
        ];
        assert_eq!(oracle::run_greedy(&gguf(model), &drafted), want, "{model}");
    }
}

#[test]
fn an_mtp_block_llama_cpp_kept_is_the_mtp_head() {
    // tiny-moe-bias with an MTP block (make_gguf_fixtures.sh): blk.3 past the 3-layer trunk,
    // its nextn.* beside a whole layer (mapped as the head's loader reads it: gguf::dsa_tests).
    // Drafting from it leaves the greedy answer the trunk's, which is tiny-moe-bias's.
    let file = fixture("gguf").join("tiny-moe-bias-mtp-f32.gguf");
    let want = oracle::run_greedy(
        &fixture("tiny-moe-bias"),
        &["Tell me about the sea.", "--raw"],
    );
    for draft in ["0", "2"] {
        let args = ["Tell me about the sea.", "--raw", "--draft", draft];
        assert_eq!(oracle::run_greedy(&file, &args), want, "--draft {draft}");
    }
    // `info` counts the head from the GGUF's metadata (`nextn_predict_layers`), as from a
    // config.json's `num_nextn_predict_layers`; the trunk's GGUF has none.
    for (f, has) in [(file, true), (gguf("tiny-moe-bias"), false)] {
        let out = run_ok(
            colibri()
                .arg("info")
                .arg("--snap")
                .arg(&f)
                .arg("--state-dir")
                .arg(temp_dir("gguf-dsa-mtp-info")),
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text.contains("mtp head"), has, "{}: {text}", f.display());
    }
}

#[test]
fn info_names_the_family() {
    for (model, ty) in [
        ("tiny-dense-shared", "glm_moe_dsa"),
        ("tiny-deepseek-v32", "deepseek_v32"),
    ] {
        let out = run_ok(
            colibri()
                .arg("info")
                .arg("--snap")
                .arg(gguf(model))
                .arg("--state-dir")
                .arg(temp_dir("gguf-dsa-info")),
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(ty), "{model}: {text}");
    }
}

#[test]
fn indexer_types_contradicting_the_tensors_are_refused_naming_the_key() {
    let mut bytes = std::fs::read(gguf("tiny-dense-shared")).unwrap();
    // Its u32 type (array), the u32 element type, the u64 count, then a byte per layer:
    // [full, shared, full, shared] -> layer 3 full, which has no indexer tensors.
    let v = colibri_e2e::gguf_edit::after_name(&bytes, "glm-dsa.attention.indexer.types") + 16;
    assert_eq!(bytes[v..v + 4], [1, 0, 1, 0]);
    bytes[v + 3] = 1;
    let p = temp_dir("gguf-dsa-types").join("types.gguf");
    std::fs::write(&p, bytes).unwrap();
    let err = validate_refused(&p, &fixture("tiny-dense-shared").join("ref.json"));
    assert!(
        err.contains("glm-dsa.attention.indexer.types") && err.contains("layer 3 is full"),
        "{err}"
    );
}
