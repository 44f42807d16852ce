//! `qwen3_5_moe` (Qwen3.5 / Qwen3.6: Gated DeltaNet layers beside gated full attention)
//! through the real binaries, on `tests/fixtures/tiny-qwen35-moe`
//! (`scripts/make_fixture_qwen35.py`): token-exact against transformers (teacher-forced and
//! greedy, a short case and a long one past the chunked delta rule's 64-position chunk), the
//! daemon's answers equal to a fresh in-process greedy run in both protocols, the
//! conversation's recurrent state saved and resumed exactly after a kill (and not resumed
//! at all when its snapshot is missing or damaged), prefix reuse and drafts exact.

use colibri_e2e::mux::{data_of, MuxDaemon};
use colibri_e2e::{
    colibri, fixture, greedy_answer, last_line, oracle, run_ok, run_refused, temp_dir,
};

const MODEL: &str = "tiny-qwen35-moe";
const P1: &str = "<|im_start|>user\nTell me about the sea.<|im_end|>\n<|im_start|>assistant\n";
const MORE: &str = "<|im_end|>\n<|im_start|>user\nAnd the sky?<|im_end|>\n<|im_start|>assistant\n";

fn expect_exact(case: &str) {
    oracle::expect_exact(&fixture(MODEL), MODEL, case, &[]);
}

#[test]
fn qwen35_short_is_token_exact() {
    expect_exact("short");
}

/// 72 prompt positions: transformers' chunked delta rule crosses its 64-position chunk, the
/// engine's recurrent form runs position by position.
#[test]
fn qwen35_long_is_token_exact() {
    expect_exact("long");
}

fn args(snap: &std::path::Path) -> Vec<String> {
    [
        "--snap",
        snap.to_str().unwrap(),
        "--ctx",
        "512",
        "--temp",
        "0",
    ]
    .map(String::from)
    .to_vec()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn qwen35_answers_as_the_in_process_greedy_run_in_both_protocols() {
    let snap = fixture(MODEL);
    let a = args(&snap);
    oracle::serves_greedy_in_both_protocols(&snap, &strs(&a), P1, "qwen35");
}

/// Two turns: killed after the first and resumed from `.coli_kv` plus its recurrent-state
/// snapshot, the daemon answers the second turn as one that never stopped; with the
/// snapshot damaged it resumes nothing and still answers the same (computed again).
#[test]
fn a_qwen35_conversation_resumes_after_a_kill_exactly() {
    let a = args(&fixture(MODEL));
    colibri_e2e::state::assert_resumes_after_a_kill(&strs(&a), P1, MORE, "qwen35");
}

/// A prompt that shares only part of the cached conversation (the recurrent state cannot be
/// cut back to it): the daemon computes it again and answers as a fresh run does; the first
/// conversation asked again answers as before.
#[test]
fn qwen35_prefix_reuse_is_exact() {
    let snap = fixture(MODEL);
    let a = args(&snap);
    let other = "<|im_start|>user\nTell me about the sky.<|im_end|>\n<|im_start|>assistant\n";
    colibri_e2e::state::assert_partial_prefix_is_recomputed(&snap, &strs(&a), P1, other, "qwen35");
}

/// `--draft` drafts for this family too (a rejected draft is cut from the recurrent state by
/// the verify trail, `model/kv_snap.rs`): the answer is the plain greedy one.
#[test]
fn qwen35_drafts_do_not_change_the_answer() {
    let snap = fixture(MODEL);
    let prompt = format!("{P1}the sea the sea the sea the sea");
    let out = colibri()
        .arg("run")
        .arg("--snap")
        .arg(&snap)
        .args([
            "--max-tokens",
            "10",
            "--temp",
            "0",
            "--draft",
            "4",
            "--raw",
            "--prompt",
        ])
        .arg(&prompt)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, greedy_answer(&snap, &prompt, 10, false).1);
}

#[test]
fn qwen35_scores_and_benches() {
    oracle::scores_and_benches(&fixture(MODEL));
}

/// A layer type the engine does not know is refused before any weight is read: exit 2,
/// naming the key, the value and what is allowed.
#[test]
fn an_unknown_layer_type_is_refused_naming_it() {
    let dir = temp_dir("qwen35-bad");
    let src = fixture(MODEL);
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
    cfg["layer_types"][1] = "sliding_attention".into();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    // No weights at all: the refusal must come first.
    let err = run_refused(&dir);
    assert!(
        err.contains("\"layer_types\" = \"sliding_attention\"")
            && err.contains("\"linear_attention\" or \"full_attention\""),
        "{err}"
    );
}

/// `colibri validate --case long` on `snap` with `extra`: its stdout (quantized, it need not
/// be exact, so its exit status is not checked).
fn validate_long(snap: &std::path::Path, extra: &[&str]) -> String {
    let reference = fixture(MODEL).join("ref.json");
    let mut cmd = colibri();
    cmd.arg("validate")
        .arg("--snap")
        .arg(snap)
        .arg("--ref")
        .arg(&reference)
        .args(["--case", "long"])
        .args(extra);
    let o = cmd.output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        out.contains("VALIDATE tf="),
        "{out} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// The f32 checkpoint converted (int4 experts, int8 dense: the DeltaNet's projections
/// quantized, its conv, decay and norm kept f32, the shared expert's gate f32 like a router)
/// validates exactly as the same formats quantized at load.
#[test]
fn qwen35_converted_validates_as_quantized_at_load() {
    let from = fixture(MODEL);
    let out = temp_dir("qwen35-convert");
    let to = out.join("c");
    let args = [
        "--expert-bits",
        "4",
        "--dense-bits",
        "8",
        "--group-size",
        "64",
    ];
    let mut cmd = colibri();
    cmd.arg("convert")
        .arg("--from")
        .arg(&from)
        .arg("--to")
        .arg(&to)
        .args(args)
        .env_remove("COLI_CONVERT_STOP_AFTER")
        .env_remove("COLI_CONVERT_FREE_BYTES");
    run_ok(&mut cmd);
    let converted = validate_long(&to, &[]);
    let at_load = validate_long(&from, &args);
    assert_eq!(converted, at_load);
    assert!(converted.contains("LOGITS"), "{converted}");
    let _ = std::fs::remove_dir_all(&out);
}

/// The API renders Qwen3.5's template (thinking off by default: the empty thinking block),
/// and a forced call parses and goes back into the template in the XML form.
#[test]
fn qwen35_api_speaks_its_template_and_forced_calls() {
    use colibri_e2e::http::ApiServer;
    use serde_json::{json, Value};
    let snap = fixture(MODEL);
    let s = ApiServer::start("api-qwen35", &["--snap", snap.to_str().unwrap()]);
    let req = json!({"model": MODEL, "max_tokens": 8, "temperature": 0,
                     "messages": [{"role": "user", "content": "Hi"}]});
    let v = s.post("/v1/chat/completions", &req).json();
    let prompt = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
    let raw = s
        .post(
            "/v1/completions",
            &json!({"model": MODEL, "max_tokens": 8, "temperature": 0, "prompt": prompt}),
        )
        .json();
    assert_eq!(
        raw["usage"]["prompt_tokens"], v["usage"]["prompt_tokens"],
        "{raw} {v}"
    );
    assert_eq!(
        raw["choices"][0]["text"],
        v.pointer("/choices/0/message/content")
            .cloned()
            .unwrap_or(Value::Null),
        "{raw} {v}"
    );
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object",
                       "properties": {"city": {"enum": ["Paris", "Rome"]}},
                       "required": ["city"]}}}]);
    let req = json!({"model": MODEL, "max_tokens": 200, "temperature": 0, "tools": tools,
        "tool_choice": "required", "messages": [{"role": "user", "content": "Weather?"}]});
    let v = s.post("/v1/chat/completions", &req).json();
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    let call = &v["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather", "{v}");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"] == "Paris" || args["city"] == "Rome", "{args}");
    let back = json!({"model": MODEL, "max_tokens": 4, "temperature": 0, "tools": tools,
        "messages": [{"role": "user", "content": "Weather?"},
                     {"role": "assistant", "content": null, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]});
    assert_eq!(s.post("/v1/chat/completions", &back).status, 200);
}

/// The fixture in the published checkpoints' layout: config.json nesting the language model
/// in `text_config` of a `qwen3_5_moe` vision-language config, tensors named
/// `model.language_model.*`. It validates exactly as the text-only layout.
#[test]
fn the_vision_language_layout_validates_exactly() {
    use serde_json::{json, Value};
    let src = fixture(MODEL);
    let dir = temp_dir("qwen35-vl");
    let text: Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
    let mut inner = text.clone();
    inner["model_type"] = "qwen3_5_moe_text".into();
    let vl = json!({"architectures": ["Qwen3_5MoeForConditionalGeneration"],
                    "model_type": "qwen3_5_moe", "text_config": inner,
                    "vision_config": {"depth": 2, "model_type": "qwen3_5_moe"},
                    "tie_word_embeddings": false});
    std::fs::write(dir.join("config.json"), vl.to_string()).unwrap();
    for f in [
        "tokenizer.json",
        "ref.json",
        "logits_short.f32",
        "logits_long.f32",
    ] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    // The same tensors under the vision-language names: only the header changes (offsets
    // are relative to the data).
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let renamed: serde_json::Map<String, Value> = header
        .into_iter()
        .map(|(k, v)| match k.strip_prefix("model.") {
            Some(rest) => (format!("model.language_model.{rest}"), v),
            None => (k, v),
        })
        .collect();
    let mut h = Value::Object(renamed).to_string().into_bytes();
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(dir.join("model.safetensors"), out).unwrap();
    for case in ["short", "long"] {
        let mut cmd = colibri();
        cmd.arg("validate")
            .arg("--snap")
            .arg(&dir)
            .arg("--ref")
            .arg(dir.join("ref.json"))
            .args(["--case", case]);
        let line = last_line(&run_ok(&mut cmd).stdout);
        oracle::assert_exact(&line, case);
    }
}

/// Three sessions decoded in one batch (each DeltaNet state advanced by its own rows, the
/// attention rows against its own keys) answer as three single runs; prompts that share only
/// part of another session's history (no whole cache to adopt) are computed from scratch.
#[test]
fn qwen35_batched_sessions_answer_as_single_runs() {
    let snap = fixture(MODEL);
    let mut a = args(&snap);
    a.extend(["--kv-slots", "3"].map(String::from));
    let (mut d, _) = MuxDaemon::start(&strs(&a), &temp_dir("qwen35-batch"));
    let prompts = [
        P1.to_string(),
        "<|im_start|>user\nTell me about the sky.<|im_end|>\n<|im_start|>assistant\n".into(),
        "<|im_start|>user\nHello! How are you today?<|im_end|>\n<|im_start|>assistant\n".into(),
    ];
    let mut batch = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        batch.extend(colibri_e2e::mux::submit_bytes(i as u64 + 1, i as u32, p, 8));
    }
    d.send(&batch);
    // The replies of all three interleave, in any order: all are kept until three ended.
    let mut replies = Vec::new();
    let mut ended = 0;
    while ended < 3 {
        let r = d.next();
        if matches!(
            r,
            protocol::mux::MuxReply::Done { .. } | protocol::mux::MuxReply::Error { .. }
        ) {
            ended += 1;
        }
        replies.push(r);
    }
    for (i, p) in prompts.iter().enumerate() {
        let id = i as u64 + 1;
        assert_eq!(
            data_of(&replies, id),
            greedy_answer(&snap, p, 8, true).1,
            "slot {i}"
        );
    }
    d.kill9();
}

/// llama.cpp's GGUF of the fixture (`scripts/make_gguf_fixtures.sh`: qwen35moe, its norms
/// with the 1 added, `ssm_a` for A_log, the DeltaNet's value heads tiled).
fn gguf() -> std::path::PathBuf {
    fixture("gguf").join(format!("{MODEL}-f32.gguf"))
}

/// `--snap FILE.gguf` validates token-exact against the same transformers oracle, with the
/// same agreement as the safetensors it was converted from (both cases: the long one runs
/// past the chunked delta rule's 64-position chunk).
#[test]
fn the_gguf_validates_token_exact_as_the_safetensors_do() {
    for case in ["short", "long"] {
        let line = oracle::expect_exact(&gguf(), MODEL, case, &[]);
        assert_eq!(
            line,
            oracle::expect_exact(&fixture(MODEL), MODEL, case, &[]),
            "{case}"
        );
    }
}

/// `run` answers from the GGUF as from the safetensors fixture, in process too, and `info`
/// describes it as the family it is.
#[test]
fn the_gguf_runs_and_is_described_as_the_safetensors_fixture() {
    let want = oracle::run_greedy(&fixture(MODEL), &["Tell me about the sea."]);
    assert!(!want.is_empty());
    assert_eq!(
        oracle::run_greedy(&gguf(), &["Tell me about the sea."]),
        want
    );
    assert_eq!(
        greedy_answer(&gguf(), P1, 8, false),
        greedy_answer(&fixture(MODEL), P1, 8, false)
    );
    let out = run_ok(
        colibri()
            .arg("info")
            .arg("--snap")
            .arg(gguf())
            .arg("--state-dir")
            .arg(temp_dir("qwen35-gguf-info")),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("qwen3_5_moe"), "{text}");
}

/// A GGUF whose ssm keys contradict its DeltaNet tensors is refused before any weight is
/// read: exit 2, naming the key and the tensor.
#[test]
fn a_qwen35_gguf_whose_keys_contradict_its_tensors_is_refused_naming_the_key() {
    let mut bytes = std::fs::read(gguf()).unwrap();
    // 4 value heads made 8.
    colibri_e2e::gguf_edit::set_u32_key(&mut bytes, "qwen35moe.ssm.time_step_rank", 4, 8);
    let p = temp_dir("qwen35-gguf-bad").join("heads.gguf");
    std::fs::write(&p, bytes).unwrap();
    let err = run_refused(&p);
    assert!(
        err.contains("qwen35moe.ssm.time_step_rank") && err.contains("blk.0.ssm_a"),
        "{err}"
    );
}

/// The converter's Q8_0 GGUF (the DeltaNet's and attention's projections, experts and shared
/// expert in Q8_0 blocks, `ssm_out`'s columns still tiled) computes as stored and agrees with
/// the f32 oracle as 8-bit weights do on this 64-wide random model: measured tf 34/42 and
/// 75/84, where the safetensors quantized at load to int8 per row give 35/42 and 71/84.
#[test]
fn the_q8_0_gguf_agrees_with_the_oracle_as_8_bit_weights_do() {
    let file = fixture("gguf").join(format!("{MODEL}-q8_0.gguf"));
    for case in ["short", "long"] {
        let out = colibri()
            .arg("validate")
            .arg("--snap")
            .arg(&file)
            .arg("--ref")
            .arg(fixture(MODEL).join("ref.json"))
            .args(["--case", case])
            .output()
            .unwrap();
        let line = last_line(&out.stdout);
        let v: Vec<&str> = line.split([' ', '=', '/']).collect();
        assert_eq!(v[0], "VALIDATE", "{line}");
        let tf = v[2].parse::<f64>().unwrap() / v[3].parse::<f64>().unwrap();
        assert!(tf >= 0.75, "{case}: {line} (bound tf >= 0.75)");
    }
}

/// A GGUF that kept Qwen3.5's MTP block (`scripts/make_gguf_fixtures.sh`: the converter
/// without `--no-mtp`) runs its trunk: token-exact against the same oracle, the same answer
/// with `--draft 2 --mtp 1` (no Qwen3.5 draft head is loaded, so the drafts are n-grams),
/// and `info` reports no MTP head (none that colibri runs).
#[test]
fn a_gguf_with_the_mtp_block_runs_its_trunk() {
    let file = fixture("gguf").join(format!("{MODEL}-mtp-f32.gguf"));
    assert_eq!(
        oracle::expect_exact(&file, MODEL, "short", &[]),
        oracle::expect_exact(&gguf(), MODEL, "short", &[])
    );
    let want = oracle::run_greedy(&gguf(), &["Tell me about the sea.", "--raw"]);
    for extra in [&[][..], &["--draft", "2", "--mtp", "1"][..]] {
        let mut args = vec!["Tell me about the sea.", "--raw"];
        args.extend_from_slice(extra);
        assert_eq!(oracle::run_greedy(&file, &args), want, "{extra:?}");
    }
    let out = run_ok(
        colibri()
            .arg("info")
            .arg("--snap")
            .arg(&file)
            .arg("--state-dir")
            .arg(temp_dir("qwen35-gguf-mtp-info")),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("qwen3_5_moe") && !text.contains("mtp head"),
        "{text}"
    );
}
