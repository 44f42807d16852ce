//! The `minimax_m2` family (MiniMax-M2 / M2.1 / M2.5 / M2.7) end to end, on the fixtures of
//! scripts/make_fixture_minimax.py: token-exact against transformers in f32 (short and long
//! cases, teacher-forced and greedy), its FP8 checkpoint as MiniMax ships it (Mixtral-layout
//! expert names, 128x128 block scales) loaded and converted, every other engine path
//! (daemon in both protocols, `.coli_kv` resumed after a kill, batched equal to single, the
//! tiers, pins, pilot and drafts, score, bench, the API with its chat template and forced
//! tool calls), and a config the family cannot run refused by name before any weight is read.

use std::path::Path;
use std::process::Command;

use colibri_e2e::http::ApiServer;
use colibri_e2e::mux::{data_of, submit_bytes, MuxDaemon};
use colibri_e2e::oracle::validate;
use colibri_e2e::{
    colibri, fixture, greedy_answer, oracle, stderr, temp_dir, validate_refused, Daemon,
};
use protocol::mux::MuxReply;
use serde_json::{json, Value};

const MM: &str = "tiny-minimax-m2";
const GQA: &str = "tiny-minimax-m2-gqa";
const FP8: &str = "hf-fp8-minimax-m2";
/// The family's template around "Tell me about the sea." (`engine/chat_minimax.rs`).
const P1: &str = "]~!b[]~b]system\nYou are a helpful assistant.[e~[\n]~b]user\nTell me about the sea.[e~[\n]~b]ai\n<think>\n";

fn expect_exact(model: &str, case: &str) {
    oracle::expect_exact(&fixture(model), model, case, &[]);
}

#[test]
fn minimax_m2_short() {
    expect_exact(MM, "short");
}

#[test]
fn minimax_m2_long() {
    expect_exact(MM, "long");
}

#[test]
fn minimax_m2_gqa_quarter_rotary_tied_short() {
    expect_exact(GQA, "short");
}

#[test]
fn minimax_m2_gqa_quarter_rotary_tied_long() {
    expect_exact(GQA, "long");
}

fn convert(from: &Path, to: &Path, extra: &[&str]) -> Command {
    let mut c = colibri();
    c.arg("convert")
        .arg("--from")
        .arg(from)
        .arg("--to")
        .arg(to)
        .args(extra);
    for v in ["COLI_CONVERT_STOP_AFTER", "COLI_CONVERT_FREE_BYTES"] {
        c.env_remove(v);
    }
    c
}

/// Converting `hf` and validating the output gives the LOGITS and VALIDATE lines of
/// validating `hf` quantized at load with the same formats.
fn same_as_at_load(hf: &str, reference: &str, expert: &str, dense: &str) {
    let to = temp_dir("minimax-convert").join("c");
    let args = ["--expert-bits", expert, "--dense-bits", dense];
    let o = convert(&fixture(hf), &to, &args).output().unwrap();
    assert!(o.status.success(), "convert: {}", stderr(&o));
    let converted = validate(&to, reference, "long", &[]);
    let at_load = validate(&fixture(hf), reference, "long", &args);
    assert_eq!(converted, at_load, "{hf} at {expert}/{dense}");
    // The converted folder holds the engine's names, not the checkpoint's Mixtral layout.
    let index = std::fs::read_to_string(to.join("model.safetensors.index.json")).unwrap();
    assert!(index.contains("mlp.experts.1.gate_proj.weight"), "{index}");
    assert!(!index.contains("block_sparse_moe"), "{index}");
}

#[test]
fn converted_validates_as_quantized_at_load() {
    same_as_at_load(MM, MM, "4", "8");
    same_as_at_load(GQA, GQA, "8", "8");
}

/// The FP8 checkpoint as MiniMax ships it loads as it is, close to the f32 oracle it was
/// made from (e4m3 keeps 3 mantissa bits; a misplaced block scale or a router read as FP8
/// gives ~1), and converts to what quantizing it at load gives.
#[test]
fn the_fp8_checkpoint_loads_and_converts() {
    // validate exits non-zero when the tokens differ from the oracle's: only rel_rms counts.
    let o = colibri()
        .arg("validate")
        .arg("--snap")
        .arg(fixture(FP8))
        .arg("--ref")
        .arg(fixture(MM).join("ref.json"))
        .args(["--case", "long"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let rel: f64 = out
        .split("rel_rms=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no rel_rms in {out}: {}", stderr(&o)));
    assert!(rel < 0.15, "FP8 logits too far from the f32 oracle: {out}");
    same_as_at_load(FP8, MM, "4", "8");
}

/// A config the family cannot run: `run` and `convert` exit 2 naming the key, the value and
/// what is allowed, before any weight is read (the shards here are empty files) and before
/// anything is written.
#[test]
fn a_config_it_cannot_run_is_refused_before_any_weight() {
    for (key, value, says) in [
        ("qk_norm_type", "\"per_head\"", "only \"per_layer\""),
        ("scoring_func", "\"softmax\"", "only \"sigmoid\""),
        ("shared_intermediate_size", "64", "no shared expert"),
        ("rotary_dim", "7", "even"),
    ] {
        let dir = temp_dir(&format!("minimax-bad-{key}"));
        let mut cfg: Value =
            serde_json::from_slice(&std::fs::read(fixture(MM).join("config.json")).unwrap())
                .unwrap();
        cfg[key] = serde_json::from_str(value).unwrap();
        std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
        std::fs::copy(
            fixture(MM).join("tokenizer.json"),
            dir.join("tokenizer.json"),
        )
        .unwrap();
        std::fs::write(dir.join("model.safetensors"), b"").unwrap();
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
            .arg(&dir)
            .output()
            .unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{key}: {err}");
        assert!(
            err.contains(&format!("\"{key}\" = {value}")) && err.contains(says),
            "{key}: {err}"
        );
        let to = dir.join("out");
        let o = convert(&dir, &to, &[]).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{key}: {}", stderr(&o));
        assert!(stderr(&o).contains(&format!("\"{key}\"")), "{}", stderr(&o));
        assert!(!to.exists(), "{key}: the refused conversion created {to:?}");
    }
}

fn daemon_args(snap: &Path) -> Vec<String> {
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

/// Both protocols answer as a fresh in-process greedy run; `colibri run` wraps a plain
/// message in the family's template.
#[test]
fn serves_in_both_protocols_and_run_wraps_its_template() {
    let snap = fixture(MM);
    let args = daemon_args(&snap);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (mut d, _) = Daemon::start(&args, &temp_dir("minimax-legacy"));
    let (text, stat) = d.prompt(P1, 8, None);
    assert!(stat.starts_with("STAT "), "{stat}");
    assert_eq!(text, greedy_answer(&snap, P1, 8, false).1);
    assert!(d.finish().success());
    let (mut d, _) = MuxDaemon::start(&args, &temp_dir("minimax-mux"));
    d.submit(1, 0, P1, 8);
    let r = d.until_end_of(1);
    assert_eq!(data_of(&r, 1), greedy_answer(&snap, P1, 8, true).1);
    d.kill9();
    let out = colibri()
        .arg("run")
        .arg("--snap")
        .arg(&snap)
        .args(["--max-tokens", "6", "--temp", "0", "Tell me about the sea."])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(out.stdout, greedy_answer(&snap, P1, 6, false).1);
}

/// Two turns: killed after the first and resumed from `.coli_kv`, the daemon answers the
/// second turn as one that never stopped (the grouped-query cache of this family).
#[test]
fn a_conversation_resumes_after_a_kill_exactly() {
    for model in [MM, GQA] {
        let snap = fixture(model);
        let args = daemon_args(&snap);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let more = "[e~[\n]~b]user\nAnd the sky?[e~[\n]~b]ai\n<think>\n";
        let (mut d, _) = Daemon::start(&args, &temp_dir(&format!("{model}-kv-ref")));
        let (a1, _) = d.prompt(P1, 6, None);
        let p2 = format!("{P1}{}{more}", String::from_utf8_lossy(&a1));
        let (want, _) = d.prompt(&p2, 6, None);
        assert!(d.finish().success());
        let state = temp_dir(&format!("{model}-kv"));
        let (mut d, _) = Daemon::start(&args, &state);
        let (b1, _) = d.prompt(P1, 6, None);
        assert_eq!(a1, b1, "{model}");
        d.kill9();
        let (mut d, _) = Daemon::start(&args, &state);
        let err = d.stderr();
        assert!(
            err.contains("resumed conversation from disk"),
            "{model}: {err}"
        );
        let (got, _) = d.prompt(&p2, 6, None);
        assert_eq!(got, want, "{model}");
        assert!(d.finish().success());
    }
}

/// Three sessions decoded together in one batch answer as each does alone.
#[test]
fn sessions_batched_together_answer_as_each_alone() {
    let snap = fixture(MM);
    let args = daemon_args(&snap);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut args = args.to_vec();
    args.extend_from_slice(&["--kv-slots", "4"]);
    let (mut d, _) = MuxDaemon::start(&args, &temp_dir("minimax-batch"));
    let prompts: Vec<String> = ["The sea", "Birds fly", "Why is the sky blue?"]
        .iter()
        .map(|t| P1.replace("Tell me about the sea.", t))
        .collect();
    let mut batch = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        batch.extend(submit_bytes(i as u64 + 1, i as u32, p, 16));
    }
    d.send(&batch);
    let mut replies = Vec::new();
    let mut done = 0;
    while done < prompts.len() {
        let r = d.next();
        if matches!(r, MuxReply::Done { .. } | MuxReply::Error { .. }) {
            done += 1;
        }
        replies.push(r);
    }
    for (i, p) in prompts.iter().enumerate() {
        assert_eq!(
            data_of(&replies, i as u64 + 1),
            greedy_answer(&snap, p, 16, true).1,
            "session {i} in the batch vs alone"
        );
    }
    d.kill9();
}

#[test]
fn scores_and_benches() {
    oracle::scores_and_benches(&fixture(MM));
}

/// Under every expert format, a one-expert LRU with pins filled and re-planned, the pilot
/// reading ahead and drafts on give the plain run's answer.
#[test]
fn tiers_pins_pilot_and_drafts_change_nothing() {
    let dir = temp_dir("minimax-tiers");
    let snap = fixture(MM);
    for (i, format) in [
        ["--expert-bits", "8"],
        ["--expert-bits", "4"],
        ["--expert-bits", "2"],
    ]
    .iter()
    .enumerate()
    {
        let answer = |tag: &str, extra: &[&str]| {
            let state = dir.join(format!("{i}-{tag}"));
            let out = colibri()
                .arg("run")
                .arg("--snap")
                .arg(&snap)
                .args(["--max-tokens", "24", "--temp", "0", "--dense-bits", "8"])
                .args(format)
                .args(extra)
                .arg("--state-dir")
                .arg(&state)
                .arg("Is the sea wide?")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{format:?} {extra:?}: {}",
                stderr(&out)
            );
            out.stdout
        };
        let plain = answer("plain", &[]);
        let tiers = [
            "--cache",
            "1",
            "--pin",
            "auto",
            "--pin-gb",
            "0.0005",
            "--pin-fill",
            "1",
            "--repin",
            "4",
            "--pilot",
            "--draft",
            "2",
        ];
        for run in 0..2 {
            assert_eq!(answer("tiered", &tiers), plain, "{format:?} run {run}");
        }
    }
}

fn content(v: &Value) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The API renders a conversation in the family's template (the same tokens as the raw
/// prompt), forced tool calls come back as calls, and a call with its result renders back.
#[test]
fn the_api_speaks_its_template_and_forced_calls() {
    let snap = fixture(MM);
    let s = ApiServer::start("api-minimax", &["--snap", snap.to_str().unwrap()]);
    let req = json!({"model": MM, "max_tokens": 6, "temperature": 0,
                     "messages": [{"role": "user", "content": "Hi"}]});
    let v = s.post("/v1/chat/completions", &req).json();
    let raw = s
        .post(
            "/v1/completions",
            &json!({"model": MM, "max_tokens": 6, "temperature": 0,
                    "prompt": P1.replace("Tell me about the sea.", "Hi")}),
        )
        .json();
    assert_eq!(
        raw["usage"]["prompt_tokens"], v["usage"]["prompt_tokens"],
        "{raw} {v}"
    );
    assert_eq!(raw["choices"][0]["text"].as_str().unwrap(), content(&v));
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object",
                       "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]}},
                       "required": ["city"]}}}]);
    // An enum keeps a random model's forced call short.
    let req = json!({"model": MM, "max_tokens": 60, "temperature": 0, "tools": tools,
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
    let back = json!({"model": MM, "max_tokens": 4, "temperature": 0, "tools": tools,
        "messages": [{"role": "user", "content": "Weather in Paris?"},
                     {"role": "assistant", "content": null, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]});
    let r = s.post("/v1/chat/completions", &back);
    assert_eq!(r.status, 200, "{}", r.text());
}

/// The template a MiniMax-M2 checkpoint ships (tests/fixtures/templates/, llama.cpp's copy)
/// beside the weights: `run` renders the message with it, to the bytes of the built-in one,
/// and the API renders a conversation with tools, a call and its result through it.
#[test]
fn the_checkpoints_own_template_gives_the_same_turn() {
    let snap = temp_dir("minimax-own-template").join("model");
    std::fs::create_dir_all(&snap).unwrap();
    for e in std::fs::read_dir(fixture(MM)).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, snap.join(p.file_name().unwrap())).unwrap();
    }
    std::fs::copy(
        colibri_e2e::root().join("tests/fixtures/templates/unsloth-MiniMax-M2.jinja"),
        snap.join("chat_template.jinja"),
    )
    .unwrap();
    let out = colibri()
        .arg("run")
        .arg("--snap")
        .arg(&snap)
        .args(["--max-tokens", "6", "--temp", "0", "Tell me about the sea."])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(out.stdout, greedy_answer(&snap, P1, 6, false).1);
    let s = ApiServer::start("api-minimax-own", &["--snap", snap.to_str().unwrap()]);
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let call = json!({"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\",\"days\":2}"}});
    let req = json!({"model": MM, "max_tokens": 4, "temperature": 0, "tools": tools,
        "messages": [{"role": "user", "content": "Weather in Paris?"},
                     {"role": "assistant", "content": "Let me look.", "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]});
    let v = s.post("/v1/chat/completions", &req).json();
    // What the template renders for it (transformers' bytes; engine/chat_minimax.rs's test),
    // sent raw: the same prompt.
    let rendered = concat!(
        "]~!b[]~b]system\nYou are a helpful assistant.\n\n# Tools\nYou may call one or more tools to assist with the user query.\n",
        "Here are the tools available in JSONSchema format:\n\n<tools>\n",
        "<tool>{\"name\": \"get_weather\", \"description\": \"Weather for a city\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}</tool>\n",
        "</tools>\n\nWhen making tool calls, use XML format to invoke tools and pass parameters:\n\n",
        "<minimax:tool_call>\n<invoke name=\"tool-name-1\">\n<parameter name=\"param-key-1\">param-value-1</parameter>\n",
        "<parameter name=\"param-key-2\">param-value-2</parameter>\n...\n</invoke>\n</minimax:tool_call>[e~[\n",
        "]~b]user\nWeather in Paris?[e~[\n",
        "]~b]ai\nLet me look.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n",
        "<parameter name=\"city\">Paris</parameter>\n<parameter name=\"days\">2</parameter>\n",
        "</invoke>\n</minimax:tool_call>\n[e~[\n",
        "]~b]tool\n<response>sunny</response>[e~[\n",
        "]~b]ai\n<think>\n"
    );
    let raw = s
        .post(
            "/v1/completions",
            &json!({"model": MM, "max_tokens": 4, "temperature": 0, "prompt": rendered}),
        )
        .json();
    assert_eq!(
        raw["usage"]["prompt_tokens"], v["usage"]["prompt_tokens"],
        "{raw} {v}"
    );
    assert_eq!(raw["choices"][0]["text"].as_str().unwrap(), content(&v));
}

/// llama.cpp's GGUF of fixture `model` (scripts/make_gguf_fixtures.sh: `minimax-m2`).
fn gguf(model: &str) -> std::path::PathBuf {
    fixture("gguf").join(format!("{model}-f32.gguf"))
}

/// `--snap FILE.gguf`: llama.cpp's converter's GGUF of each fixture (q/k norms over every
/// head, the sigmoid router and its selection bias, rotary on half and a quarter of a head,
/// the GQA one's lm_head tied) is transformers' token for token, with the safetensors
/// fixture's own figures; `run` answers as the fixture does and `info` names the family.
#[test]
fn its_gguf_is_transformers_token_for_token_as_the_fixture() {
    for model in [MM, GQA] {
        for case in ["short", "long"] {
            let line = oracle::expect_exact(&gguf(model), model, case, &[]);
            let want =
                colibri_e2e::last_line(validate(&fixture(model), model, case, &[]).as_bytes());
            assert_eq!(line, want, "{model} {case}");
        }
        let want = oracle::run_greedy(&fixture(model), &["Tell me about the sea."]);
        assert!(!want.is_empty());
        assert_eq!(
            oracle::run_greedy(&gguf(model), &["Tell me about the sea."]),
            want,
            "{model}"
        );
    }
    let o = colibri()
        .arg("info")
        .arg("--snap")
        .arg(gguf(MM))
        .arg("--state-dir")
        .arg(temp_dir("minimax-gguf-info"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && text.contains("minimax_m2"), "{text}");
}

/// A copy of `model`'s GGUF with the u32 value of metadata key `key` set to `v`.
fn gguf_with_u32(model: &str, key: &str, v: u32) -> std::path::PathBuf {
    let mut b = std::fs::read(gguf(model)).unwrap();
    // The key's value type (u32: 4), then the value.
    let ty = colibri_e2e::gguf_edit::after_name(&b, key);
    assert_eq!(b[ty..ty + 4], 4u32.to_le_bytes(), "{key} is not a u32");
    b[ty + 4..ty + 8].copy_from_slice(&v.to_le_bytes());
    let p = temp_dir("minimax-gguf-bad").join(format!("{model}.gguf"));
    std::fs::write(&p, b).unwrap();
    p
}

/// A MiniMax-M2 GGUF whose router is not a sigmoid (llama.cpp's `expert_gating_func` 1:
/// softmax), or whose expert count contradicts its tensors, is refused naming the key (exit
/// 2), before any weight is read.
#[test]
fn a_gguf_it_cannot_run_is_refused_naming_the_key() {
    for (key, v, says) in [
        ("minimax-m2.expert_gating_func", 1, "sigmoid"),
        ("minimax-m2.expert_count", 4, "contradicts"),
    ] {
        let err = validate_refused(&gguf_with_u32(MM, key, v), &fixture(MM).join("ref.json"));
        assert!(err.contains(key) && err.contains(says), "{key}: {err}");
    }
}
