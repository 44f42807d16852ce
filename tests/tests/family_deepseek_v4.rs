//! The `deepseek_v4` family (DeepSeek-V4-Flash / Pro) end to end on its tiny fixture
//! (scripts/make_fixture_deepseek_v4.py: sliding, compressed-sparse and heavily-compressed
//! layers, CSA rate 4 and HCA rate 8 under a window of 8, an indexer keeping 4 entries, three
//! hyper-connection streams, hash-routed and sqrt-softplus-routed experts with the clamped
//! SwiGLU, a grouped output projection, YaRN on the compressed layers). `colibri validate`
//! finds it transformers' token for token, teacher-forced and greedy, on a short case and a
//! long one past the window, several HCA blocks and more CSA entries than the indexer keeps.
//! A config the family cannot run is refused naming the key, the value and what is allowed,
//! with exit 2, before any weight is read or any shard converted.

use std::path::Path;
use std::process::Output;

use colibri_e2e::oracle::{self, copy_with_config};
use colibri_e2e::{colibri, fixture, last_line};

const HF: &str = "tiny-deepseek-v4";

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `colibri validate` of the fixture against its reference `case`: the last line of stdout.
fn validate(case: &str) -> String {
    let snap = fixture(HF);
    let o = colibri()
        .arg("validate")
        .arg("--snap")
        .arg(&snap)
        .arg("--ref")
        .arg(snap.join("ref.json"))
        .args(["--case", case])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(out.contains("VALIDATE tf="), "no result: {}", stderr(&o));
    assert!(o.status.success(), "{out}{}", stderr(&o));
    let logits = out.lines().find(|l| l.starts_with("LOGITS ")).unwrap_or("");
    // f32 against f32: the logits agree to rounding, far inside the smallest top-1/top-2
    // gap the fixture script accepted (1e-4).
    let max_abs: f64 = logits
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("max_abs="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no LOGITS line: {out}"));
    assert!(max_abs < 1e-4, "{case}: {logits}");
    last_line(out.as_bytes())
}

fn assert_exact(line: &str) {
    let v: Vec<&str> = line.split([' ', '=', '/']).collect();
    assert_eq!(v[0], "VALIDATE", "{line}");
    assert_eq!(v[2], v[3], "teacher forcing not exact: {line}");
    assert_eq!(v[5], v[6], "generation not exact: {line}");
    assert!(v[3].parse::<usize>().unwrap() > 0, "{line}");
}

#[test]
fn it_is_transformers_token_for_token_short_and_long() {
    for case in ["short", "long"] {
        assert_exact(&validate(case));
    }
}

/// `run` and `convert` on `bad` both exit 2 naming `named`, and convert writes nothing.
fn refused_by_run_and_convert(bad: &Path, tag: &str, named: &[&str]) {
    let o = colibri()
        .arg("run")
        .arg("--snap")
        .arg(bad)
        .args(["--max-tokens", "2", "--temp", "0", "hi"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    for n in named {
        assert!(stderr(&o).contains(n), "{n}: {}", stderr(&o));
    }
    let (e, to) = oracle::convert_refused(bad, tag);
    assert!(e.contains(named[0]), "{e}");
    assert!(
        !to.exists() || std::fs::read_dir(&to).unwrap().next().is_none(),
        "convert wrote something"
    );
}

#[test]
fn an_unknown_layer_type_is_refused_by_run_and_convert() {
    let bad = copy_with_config(&fixture(HF), "dsv4-bad-type", |v| {
        v["layer_types"][2] = "linear_attention".into();
    });
    refused_by_run_and_convert(
        &bad,
        "dsv4-bad-type-out",
        &[
            "\"layer_types\" = \"linear_attention\"",
            "\"heavily_compressed_attention\"",
        ],
    );
}

#[test]
fn groups_that_do_not_divide_the_heads_are_refused() {
    let bad = copy_with_config(&fixture(HF), "dsv4-bad-groups", |v| {
        v["o_groups"] = 3.into();
    });
    refused_by_run_and_convert(
        &bad,
        "dsv4-bad-groups-out",
        &["\"o_groups\" = 3", "must divide num_attention_heads (4)"],
    );
}

#[test]
fn a_compress_ratio_it_does_not_know_is_refused() {
    let bad = copy_with_config(&fixture(HF), "dsv4-bad-ratio", |v| {
        v.as_object_mut().unwrap().remove("layer_types");
        v["compress_ratios"] = serde_json::json!([0, 4, 8, 4]);
    });
    refused_by_run_and_convert(&bad, "dsv4-bad-ratio-out", &["\"compress_ratios\" = 8"]);
}

/// `info` on the fixture names the family and counts every tensor it holds (the hash
/// layers' token-id tables included).
#[test]
fn info_reads_the_fixture() {
    let o = colibri()
        .args(["info", "--json", "--snap"])
        .arg(fixture(HF))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["family"], "deepseek_v4", "{v}");
}

// ---- The engine's fronts on the fixture: run, serve (legacy and mux), api, score, bench,
// ---- convert, `.coli_kv` across a kill, batched sessions, prefix reuse.

const P1: &str = "<｜begin▁of▁sentence｜><｜User｜>Tell me about the sea.<｜Assistant｜></think>";
const MORE: &str = "<｜end▁of▁sentence｜><｜User｜>And the sky?<｜Assistant｜></think>";

fn args(snap: &Path) -> Vec<String> {
    [
        "--snap",
        snap.to_str().unwrap(),
        "--ctx",
        "128",
        "--temp",
        "0",
    ]
    .map(String::from)
    .to_vec()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// `colibri run --raw` answers what a fresh in-process greedy engine answers.
#[test]
fn run_answers_as_the_in_process_greedy_run() {
    let snap = fixture(HF);
    let got = oracle::run_greedy(&snap, &["--raw", P1]);
    assert_eq!(got, colibri_e2e::greedy_answer(&snap, P1, 6, false).1);
}

#[test]
fn v4_answers_as_the_in_process_greedy_run_in_both_protocols() {
    let snap = fixture(HF);
    let a = args(&snap);
    oracle::serves_greedy_in_both_protocols(&snap, &strs(&a), P1, "dsv4");
}

/// Two turns: killed after the first and resumed from `.coli_kv` plus its state snapshot
/// (the window's keys, the compressors' open windows and entries), the daemon answers the
/// second turn as one that never stopped; with the snapshot damaged it resumes nothing and
/// still answers the same (computed again).
#[test]
fn a_v4_conversation_resumes_after_a_kill_exactly() {
    let a = args(&fixture(HF));
    colibri_e2e::state::assert_resumes_after_a_kill(&strs(&a), P1, MORE, "dsv4");
}

/// A prompt that shares only part of the cached conversation (the state cannot be cut back
/// to it): the daemon computes it again and answers as a fresh run does; the first
/// conversation asked again answers as before.
#[test]
fn v4_prefix_reuse_is_exact() {
    let snap = fixture(HF);
    let a = args(&snap);
    let other = "<｜begin▁of▁sentence｜><｜User｜>Tell me about the sky.<｜Assistant｜></think>";
    colibri_e2e::state::assert_partial_prefix_is_recomputed(&snap, &strs(&a), P1, other, "dsv4");
}

/// Three sessions decoded in one batch (each layer's state advanced by its own rows) answer
/// as three single runs.
#[test]
fn v4_batched_sessions_answer_as_single_runs() {
    use colibri_e2e::mux::{data_of, submit_bytes, MuxDaemon};
    use colibri_e2e::{greedy_answer, temp_dir};
    let snap = fixture(HF);
    let mut a = args(&snap);
    a.extend(["--kv-slots", "3"].map(String::from));
    let (mut d, _) = MuxDaemon::start(&strs(&a), &temp_dir("dsv4-batch"));
    let prompts = [
        P1.to_string(),
        "<｜begin▁of▁sentence｜><｜User｜>Tell me about the sky.<｜Assistant｜></think>".into(),
        "<｜begin▁of▁sentence｜><｜User｜>Hello! How are you?<｜Assistant｜></think>".into(),
    ];
    let mut batch = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        batch.extend(submit_bytes(i as u64 + 1, i as u32, p, 8));
    }
    d.send(&batch);
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

#[test]
fn v4_scores_and_benches() {
    oracle::scores_and_benches(&fixture(HF));
}

/// The API: a streamed chat completion's pieces concatenate to the answer it gives
/// unstreamed, and it ends the same way.
#[test]
fn the_api_streams_the_answer_it_gives_whole() {
    use colibri_e2e::http::{chat_stream_content, ApiServer};
    let snap = fixture(HF);
    let s = ApiServer::start("api-dsv4", &["--snap", snap.to_str().unwrap()]);
    let req = |stream: bool| {
        serde_json::json!({"model": HF, "max_tokens": 8, "temperature": 0, "stream": stream,
            "messages": [{"role": "user", "content": "Tell me about the sea."}]})
    };
    let v = s.post("/v1/chat/completions", &req(false)).json();
    let whole = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(v["usage"]["completion_tokens"].as_u64() > Some(0), "{v}");
    let r = s.post("/v1/chat/completions", &req(true));
    assert_eq!(r.status, 200, "{}", r.text());
    let (text, finish) = chat_stream_content(&r);
    assert_eq!(text, whole, "{}", r.text());
    assert_eq!(finish, v["choices"][0]["finish_reason"].as_str().unwrap());
}

/// The f32 checkpoint converted (int4 and int8 experts with f32 dense; int4 experts with int8
/// dense: the attention's and compressors' projections and the shared expert quantized, the
/// router, hyper-connections and position biases kept f32) validates exactly as the same
/// formats quantized at load (the store reads the converted experts in place).
#[test]
fn converted_checkpoints_validate_as_quantized_at_load() {
    use colibri_e2e::{run_ok, temp_dir};
    let from = fixture(HF);
    for (experts, dense, io) in [("4", "16", "16"), ("8", "16", "16"), ("4", "8", "8")] {
        let out = temp_dir(&format!("dsv4-convert-{experts}-{dense}"));
        let to = out.join("c");
        let args = ["--expert-bits", experts, "--dense-bits", dense];
        let mut cmd = colibri();
        cmd.arg("convert")
            .arg("--from")
            .arg(&from)
            .arg("--to")
            .arg(&to)
            .args(args)
            .args(["--io-bits", io])
            .env_remove("COLI_CONVERT_STOP_AFTER")
            .env_remove("COLI_CONVERT_FREE_BYTES");
        run_ok(&mut cmd);
        let converted = oracle::validate(&to, HF, "long", &[]);
        let at_load = oracle::validate(&from, HF, "long", &args);
        assert_eq!(converted, at_load, "experts {experts} bits, dense {dense}");
        assert!(converted.contains("LOGITS"), "{converted}");
        let _ = std::fs::remove_dir_all(&out);
    }
}

/// The API renders a V4 conversation with DeepSeek's encoder: tools, an answer with two calls
/// and their results (out of call order) take the tokens of the encoder's own bytes
/// (tests/fixtures/dsv4-chat-cases.json, from `encoding_dsv4.py`) sent raw, and the same
/// greedy answer, in chat and thinking mode; a forced call comes back as a call, and renders
/// back with its result.
#[test]
fn the_api_renders_the_encoders_conversation_and_forced_calls() {
    use colibri_e2e::http::ApiServer;
    use serde_json::{json, Value};
    // The tools section alone is past the fixture's 128 positions: a copy that takes more
    // (both sides of each comparison run on it, so its rotary numbers need no reference).
    let snap = copy_with_config(&fixture(HF), "dsv4-api-tools-model", |v| {
        v["max_position_embeddings"] = json!(4096)
    });
    let s = ApiServer::start(
        "api-dsv4-tools",
        &["--snap", snap.to_str().unwrap(), "--ctx", "4096"],
    );
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/dsv4-chat-cases.json");
    let cases: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let content = |v: &Value| {
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let mut checked = 0;
    for case in cases.as_array().unwrap() {
        if case["name"] != "tool_round_trip" {
            continue;
        }
        let effort = if case["thinking"] == true {
            "high"
        } else {
            "none"
        };
        let req = json!({"model": HF, "max_tokens": 4, "temperature": 0,
            "messages": case["messages"], "tools": case["tools"], "reasoning_effort": effort});
        let v = s.post("/v1/chat/completions", &req).json();
        let raw = s
            .post(
                "/v1/completions",
                &json!({"model": HF, "max_tokens": 4, "temperature": 0,
                        "prompt": case["expected"]}),
            )
            .json();
        assert!(raw["usage"]["prompt_tokens"].as_u64() > Some(100), "{raw}");
        assert_eq!(
            raw["usage"]["prompt_tokens"], v["usage"]["prompt_tokens"],
            "{raw} {v}"
        );
        assert_eq!(
            raw["choices"][0]["text"].as_str().unwrap(),
            content(&v),
            "{raw} {v}"
        );
        checked += 1;
    }
    assert_eq!(checked, 2);
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object",
                       "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]}},
                       "required": ["city"]}}}]);
    // An enum keeps a random model's forced call short.
    let req = json!({"model": HF, "max_tokens": 60, "temperature": 0, "tools": tools,
        "tool_choice": "required",
        "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    let v = s.post("/v1/chat/completions", &req).json();
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    let call = &v["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather", "{v}");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(
        ["Paris", "Rome", "Oslo"].contains(&args["city"].as_str().unwrap()),
        "{args}"
    );
    let back = json!({"model": HF, "max_tokens": 4, "temperature": 0, "tools": tools,
        "messages": [{"role": "user", "content": "Weather in Paris?"},
                     {"role": "assistant", "content": null, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]});
    let r = s.post("/v1/chat/completions", &back);
    assert_eq!(r.status, 200, "{}", r.text());
}
