//! Bad input gives the CONTRACT's exit codes and a message that names what is wrong:
//! 2 for refused usage or configuration, 1 for runtime failures naming the file or tensor.

use std::path::Path;

use colibri_e2e::{colibri, fixture, temp_dir};

/// A copy of a fixture model in a temp dir, to break.
fn copy_model(name: &str, tag: &str) -> std::path::PathBuf {
    let dir = temp_dir(tag);
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    dir
}

fn run_prompt(dir: &Path) -> (Option<i32>, String) {
    let out = colibri()
        .args([
            "run",
            "--raw",
            "--prompt",
            "hi",
            "--max-tokens",
            "2",
            "--snap",
        ])
        .arg(dir)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn out_of_range_config_exits_2_naming_key_and_range() {
    let dir = copy_model("tiny-dense-shared", "cfg");
    let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap();
    std::fs::write(
        dir.join("config.json"),
        cfg.replace("\"hidden_size\": 64", "\"hidden_size\": 0"),
    )
    .unwrap();
    let (code, err) = run_prompt(&dir);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("hidden_size") && err.contains("1..="), "{err}");
}

#[test]
fn unsupported_config_is_refused_by_name() {
    let dir = copy_model("tiny-dense-shared", "ngroup");
    let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap();
    std::fs::write(
        dir.join("config.json"),
        cfg.replace("\"n_group\": 1", "\"n_group\": 2"),
    )
    .unwrap();
    let (code, err) = run_prompt(&dir);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("n_group"), "{err}");
}

#[test]
fn truncated_shard_names_the_file() {
    let dir = copy_model("tiny-dense-shared", "trunc");
    let f = dir.join("model.safetensors");
    let len = std::fs::metadata(&f).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let (code, err) = run_prompt(&dir);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("model.safetensors"), "{err}");
}

#[test]
fn broken_header_names_the_file() {
    let dir = copy_model("tiny-moe-bias", "header");
    let f = dir.join("model-00002-of-00004.safetensors");
    let mut bytes = std::fs::read(&f).unwrap();
    bytes[8] = b'#'; // the JSON header no longer parses
    std::fs::write(&f, bytes).unwrap();
    let (code, err) = run_prompt(&dir);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("model-00002-of-00004.safetensors"), "{err}");
}

#[test]
fn missing_tensor_is_named() {
    // Drop the shard holding lm_head: the loader must name the tensor it could not find.
    let dir = copy_model("tiny-moe-bias", "missing");
    let index = std::fs::read_to_string(dir.join("model.safetensors.index.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&index).unwrap();
    let shard = v["weight_map"]["lm_head.weight"]
        .as_str()
        .unwrap()
        .to_string();
    std::fs::remove_file(dir.join(&shard)).unwrap();
    let (code, err) = run_prompt(&dir);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("\"model.embed_tokens.weight\" is not in any shard"),
        "{err}"
    );
}

#[test]
fn bad_bits_exit_2_naming_the_allowed_values() {
    let out = colibri()
        .args(["run", "--prompt", "hi", "--expert-bits", "5"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--expert-bits") && err.contains("16"), "{err}");
}

#[test]
fn a_bad_reference_file_is_a_usage_error() {
    let dir = temp_dir("ref");
    std::fs::write(
        dir.join("ref.json"),
        b"{\"prompt_ids\": [1, 2], \"full_ids\": [3]}",
    )
    .unwrap();
    let out = colibri()
        .arg("validate")
        .arg("--snap")
        .arg(fixture("tiny-dense-shared"))
        .arg("--ref")
        .arg(dir.join("ref.json"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("full_ids"));
}
