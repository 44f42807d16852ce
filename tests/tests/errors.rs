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
    // (GLM-5's n_group > 1, refused before, is read now: group-limited routing.)
    let dir = copy_model("tiny-dense-shared", "act");
    let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let edited = cfg.replace("\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"");
    assert_ne!(edited, cfg);
    std::fs::write(dir.join("config.json"), edited).unwrap();
    let (code, err) = run_prompt(&dir);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("\"hidden_act\" = \"gelu\""), "{err}");
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

/// `colibri <args>` on the demo model with `env`: (exit code, stderr).
fn demo(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let home = temp_dir("err-demo-home");
    let mut cmd = colibri();
    cmd.env("XDG_CACHE_HOME", &home).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.stdin(std::process::Stdio::null()).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_refused(got: (Option<i32>, String), code: i32, fragment: &str) {
    let (c, err) = got;
    assert_eq!(c, Some(code), "{err}");
    assert!(err.contains(fragment), "wanted {fragment:?} in:\n{err}");
}

#[test]
fn serve_negative_ctx_names_ctx_and_its_range() {
    assert_refused(
        demo(&["serve", "--ctx", "-5"], &[]),
        2,
        "invalid value '-5' for '--ctx <CTX>': -5 is not in 16..=1048576",
    );
}

#[test]
fn bad_values_from_the_environment_name_the_variable() {
    assert_refused(
        demo(&["run", "hi"], &[("NGEN", "abc")]),
        2,
        "invalid value 'abc' for NGEN (environment, for --max-tokens)",
    );
    assert_refused(
        demo(&["run", "hi"], &[("SNAP", "/nonexistent-colibri-model")]),
        2,
        "SNAP (environment, for --snap): /nonexistent-colibri-model is not a directory",
    );
    // The flag wins and is the one named.
    assert_refused(
        demo(&["run", "hi", "--max-tokens", "x"], &[("NGEN", "abc")]),
        2,
        "invalid value 'x' for '--max-tokens <MAX_TOKENS>'",
    );
}

#[test]
fn run_state_dir_that_is_a_file_is_a_usage_error() {
    let dir = temp_dir("err-state-file");
    let file = dir.join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let f = file.to_str().unwrap();
    assert_refused(
        demo(&["run", "hi", "--state-dir", f], &[]),
        2,
        &format!("--state-dir {f}: not a directory (a file of that name is in the way)"),
    );
}

#[test]
fn run_grammar_errors_name_the_option_and_suggest_json_schema() {
    let dir = temp_dir("err-grammar");
    let missing = dir.join("missing.gbnf");
    let m = missing.to_str().unwrap();
    assert_refused(
        demo(&["run", "hi", "--grammar", m], &[]),
        2,
        &format!("--grammar {m}: cannot read it: No such file or directory"),
    );
    let schema = dir.join("schema.json");
    std::fs::write(&schema, br#"{"type":"object"}"#).unwrap();
    let s = schema.to_str().unwrap();
    assert_refused(
        demo(&["run", "hi", "--grammar", s], &[]),
        2,
        "expected a rule name ([A-Za-z0-9_-]+); this looks like a JSON Schema: pass it with --json-schema",
    );
}

#[test]
fn ram_advice_names_the_reserve_and_a_small_budget_scales_it() {
    assert_refused(
        demo(&["run", "hi", "--ram-gb", "0.01"], &[]),
        2,
        "(fixed 0.003 GB of --ram-reserve-gb,",
    );
    let (c, err) = demo(&["run", "hi", "--ram-gb", "0.01"], &[]);
    assert_eq!(c, Some(2));
    assert!(err.contains("lower --ram-reserve-gb"), "{err}");
    // 1 GB was impossible with the fixed 3.7 GB reserve; a quarter of it leaves room.
    let (c, err) = demo(&["run", "hi", "--ram-gb", "1", "--max-tokens", "2"], &[]);
    assert_eq!(c, Some(0), "{err}");
}

#[test]
fn bench_ref_with_cases_suggests_case() {
    let snap = fixture("tiny-dense-shared");
    let r = snap.join("ref.json");
    let out = colibri()
        .args(["bench", "--no-membw", "--no-disk-probe", "--snap"])
        .arg(&snap)
        .arg("--ref")
        .arg(&r)
        .output()
        .unwrap();
    assert_refused(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ),
        2,
        "missing \"prompt_ids\"; the file holds cases: pick one with --case (short, long, long_dense)",
    );
}

#[test]
fn legacy_refusals_write_ranges_as_lo_to_hi_inclusive() {
    use std::io::Write;
    let home = temp_dir("err-legacy-home");
    let mut child = colibri()
        .env("XDG_CACHE_HOME", &home)
        .args(["serve", "--kv-save", "0"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"\x02PROMPT 2 99999999999 0 1\nhi\n\x02PROMPT 2 4 0 1 3\nhi\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("max_tokens must be an integer in 1..=2147483647"),
        "{err}"
    );
    assert!(
        err.contains("slot must be in 0..=0 (--kv-slots 1)"),
        "{err}"
    );
}
