//! `colibri api` end to end over raw HTTP: chat in the family's template, streaming equal to
//! the whole answer, stop strings, usage with cached prompt tokens, forced tool calls whose
//! arguments parse and match their schema, JSON-schema output that validates, cancellation by
//! disconnect, 8 concurrent streams each equal to its answer alone, every error status, and
//! the same on a second family's fixture (Qwen3, ChatML). The official SDKs drive it too
//! (`sdk_clients`, when a Python with `openai` and `anthropic` is there).

use std::io::Read;

use colibri_e2e::http::{chat_stream_content, ApiServer};
use colibri_e2e::{colibri, fixture, root};
use serde_json::{json, Value};

const GLM_TURN: &str = "[gMASK]<sop><|user|>In the beginning<|assistant|><think></think>";

fn chat(text: &str, max_tokens: u32) -> Value {
    json!({"model": "colibri-demo", "messages": [{"role": "user", "content": text}],
           "max_tokens": max_tokens, "temperature": 0})
}

fn content(r: &Value) -> String {
    r.pointer("/choices/0/message/content")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no content in {r}"))
        .to_string()
}

#[test]
fn chat_is_the_templated_prompt_with_usage_and_models() {
    let s = ApiServer::start("api-chat", &[]);
    let models = s.get("/v1/models").json();
    assert_eq!(models["data"][0]["id"], "colibri-demo", "{models}");
    assert_eq!(s.get("/health").status, 200);
    let r = s.post("/v1/chat/completions", &chat("In the beginning", 16));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 16);
    // The chat is the family's template around the message: the same answer as the raw
    // completion of the templated text.
    let raw = s
        .post(
            "/v1/completions",
            &json!({"prompt": GLM_TURN, "max_tokens": 16, "temperature": 0}),
        )
        .json();
    assert_eq!(raw["choices"][0]["text"].as_str().unwrap(), content(&v));
    assert_eq!(raw["usage"]["prompt_tokens"], v["usage"]["prompt_tokens"]);
    // The second time the prompt is in a slot's cache: all but its last token reused.
    let prompt_tokens = raw["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(
        raw["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(),
        Some(prompt_tokens - 1),
        "{raw}"
    );
    // A conversation re-sent with a new turn prefills only its tail.
    let first = content(&v);
    let next = json!({"messages": [
        {"role": "user", "content": "In the beginning"},
        {"role": "assistant", "content": first},
        {"role": "user", "content": "And then?"}], "max_tokens": 4, "temperature": 0});
    let n = s.post("/v1/chat/completions", &next).json();
    let cached = n["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached >= prompt_tokens, "{n}");
}

#[test]
fn streaming_equals_the_whole_answer_and_stop_strings_cut_it() {
    let s = ApiServer::start("api-stream", &[]);
    let whole = s
        .post("/v1/chat/completions", &chat("And God said", 24))
        .json();
    let text = content(&whole);
    let mut req = chat("And God said", 24);
    req["stream"] = json!(true);
    req["stream_options"] = json!({"include_usage": true});
    let r = s.post("/v1/chat/completions", &req);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let data = r.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let (streamed, finish) = chat_stream_content(&r);
    assert_eq!(streamed, text);
    assert_eq!(finish, "length");
    let usage: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 24, "{usage}");
    // A stop string from the middle of the answer: the text before it, finish "stop".
    let chars: Vec<char> = text.chars().collect();
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 3].iter().collect();
    let before = &text[..text.find(&stop).unwrap()];
    let mut req = chat("And God said", 24);
    req["stop"] = json!([stop]);
    let cut = s.post("/v1/chat/completions", &req).json();
    assert_eq!(content(&cut), before);
    assert_eq!(cut["choices"][0]["finish_reason"], "stop");
    // Anthropic: the same answer, streamed as its events, and its stop_sequence.
    let m = json!({"model": "colibri-demo", "max_tokens": 24, "temperature": 0,
                   "messages": [{"role": "user", "content": "And God said"}]});
    let a = s.post("/v1/messages", &m).json();
    assert_eq!(a["content"][0]["text"].as_str(), Some(text.as_str()), "{a}");
    assert_eq!(a["stop_reason"], "max_tokens");
    let mut ms = m.clone();
    ms["stream"] = json!(true);
    let ev = s.post("/v1/messages", &ms).text();
    let kinds: Vec<&str> = ev
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(kinds.first(), Some(&"message_start"));
    assert_eq!(kinds[1], "content_block_start");
    assert_eq!(
        &kinds[kinds.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    let streamed: String = ev
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v.pointer("/delta/text")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .collect();
    assert_eq!(streamed, text);
    let mut mstop = m.clone();
    // A stop string that never comes beside the one that does: the response names the latter.
    mstop["stop_sequences"] = json!(["never in this answer", stop]);
    let a = s.post("/v1/messages", &mstop).json();
    assert_eq!(a["content"][0]["text"].as_str(), Some(before));
    assert_eq!(a["stop_reason"], "stop_sequence");
    assert_eq!(a["stop_sequence"].as_str(), Some(stop.as_str()), "{a}");
    mstop["stream"] = json!(true);
    let ev = s.post("/v1/messages", &mstop).text();
    let delta = ev
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|v| v["type"] == "message_delta")
        .unwrap_or_else(|| panic!("no message_delta in {ev}"));
    assert_eq!(delta["delta"]["stop_reason"], "stop_sequence", "{delta}");
    assert_eq!(
        delta["delta"]["stop_sequence"].as_str(),
        Some(stop.as_str()),
        "{delta}"
    );
}

const WEATHER: &str = r#"{"type":"object","properties":{"city":{"type":"string","maxLength":12},"unit":{"enum":["celsius","fahrenheit"]},"days":{"type":"integer"}},"required":["city","unit","days"]}"#;

/// The arguments match WEATHER: the three keys with their types.
fn check_weather(args: &Value) {
    assert!(
        args["city"]
            .as_str()
            .is_some_and(|c| c.chars().count() <= 12),
        "{args}"
    );
    assert!(
        ["celsius", "fahrenheit"].contains(&args["unit"].as_str().unwrap_or("")),
        "{args}"
    );
    assert!(args["days"].is_i64(), "{args}");
}

fn forced_calls(s: &ApiServer, model: &str) {
    let tools: Value = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Weather for a city", "parameters": serde_json::from_str::<Value>(WEATHER).unwrap()}},
        {"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}}]);
    for choice in [
        json!({"type": "function", "function": {"name": "get_weather"}}),
        json!("required"),
    ] {
        let req = json!({"model": model, "max_tokens": 200, "temperature": 0, "tools": tools,
            "tool_choice": choice, "messages": [{"role": "user", "content": "Weather in Paris?"}]});
        let v = s.post("/v1/chat/completions", &req).json();
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
        let call = &v["choices"][0]["message"]["tool_calls"][0];
        assert_eq!(call["type"], "function");
        let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap())
            .expect("arguments parse");
        match call["function"]["name"].as_str() {
            Some("get_weather") => check_weather(&args),
            Some("noop") => assert!(args.is_object()),
            other => panic!("{other:?}"),
        }
        // The call and its result go back into the template.
        let back = json!({"model": model, "max_tokens": 4, "temperature": 0, "tools": tools,
            "messages": [{"role": "user", "content": "Weather in Paris?"},
                         {"role": "assistant", "content": null, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]});
        assert_eq!(s.post("/v1/chat/completions", &back).status, 200);
    }
    // Anthropic: tool_choice any gives a tool_use block.
    let req = json!({"model": model, "max_tokens": 200, "temperature": 0,
        "tools": [{"name": "get_weather", "input_schema": serde_json::from_str::<Value>(WEATHER).unwrap()}],
        "tool_choice": {"type": "any"}, "messages": [{"role": "user", "content": "Weather?"}]});
    let a = s.post("/v1/messages", &req).json();
    assert_eq!(a["stop_reason"], "tool_use", "{a}");
    let block = a["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap();
    check_weather(&block["input"]);
    let back = json!({"model": model, "max_tokens": 4, "messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [block]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block["id"], "content": "sunny"}]}]});
    assert_eq!(s.post("/v1/messages", &back).status, 200);
}

fn json_outputs(s: &ApiServer, model: &str) {
    let schema = json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
        "required": ["name", "age", "tags"]});
    let req = json!({"model": model, "max_tokens": 300, "temperature": 0,
        "messages": [{"role": "user", "content": "A person as JSON"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}});
    let v = s.post("/v1/chat/completions", &req).json();
    let out: Value = serde_json::from_str(&content(&v)).expect("the output parses");
    assert!(
        out["name"]
            .as_str()
            .is_some_and(|n| n.chars().count() <= 16),
        "{out}"
    );
    assert!(out["age"].is_i64(), "{out}");
    assert!(
        out["tags"]
            .as_array()
            .is_some_and(|t| t.len() <= 3 && t.iter().all(Value::is_boolean)),
        "{out}"
    );
    let req = json!({"model": model, "max_tokens": 300, "temperature": 0,
        "messages": [{"role": "user", "content": "JSON please"}],
        "response_format": {"type": "json_object"}});
    let v = s.post("/v1/chat/completions", &req).json();
    if v["choices"][0]["finish_reason"] == "stop" {
        let out: Value = serde_json::from_str(&content(&v)).expect("the output parses");
        assert!(out.is_object());
    }
}

#[test]
fn forced_tool_calls_and_json_schemas_always_parse() {
    let s = ApiServer::start("api-tools", &[]);
    forced_calls(&s, "colibri-demo");
    json_outputs(&s, "colibri-demo");
}

#[test]
fn a_second_family_qwen3_speaks_chatml_with_tools_and_schemas() {
    let snap = fixture("tiny-qwen3-moe");
    let s = ApiServer::start("api-qwen", &["--snap", snap.to_str().unwrap()]);
    let model = "tiny-qwen3-moe";
    let req = json!({"model": model, "max_tokens": 8, "temperature": 0,
                     "messages": [{"role": "user", "content": "Hi"}]});
    let v = s.post("/v1/chat/completions", &req).json();
    let raw = s
        .post(
            "/v1/completions",
            &json!({"model": model, "max_tokens": 8, "temperature": 0,
            "prompt": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"}),
        )
        .json();
    assert_eq!(
        raw["usage"]["prompt_tokens"], v["usage"]["prompt_tokens"],
        "{raw} {v}"
    );
    assert_eq!(raw["choices"][0]["text"].as_str().unwrap(), content(&v));
    forced_calls(&s, model);
    json_outputs(&s, model);
}

#[test]
fn glm4_and_deepseek_fixtures_take_their_own_templates_and_forced_calls() {
    for (name, turn) in [
        (
            "tiny-glm4-moe",
            "[gMASK]<sop><|user|>\nHi<|assistant|>\n<think></think>",
        ),
        (
            "tiny-deepseek-v3",
            "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>",
        ),
        (
            "tiny-deepseek-v32",
            "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>",
        ),
    ] {
        let snap = fixture(name);
        let s = ApiServer::start("api-family", &["--snap", snap.to_str().unwrap()]);
        let req = json!({"model": name, "max_tokens": 6, "temperature": 0,
                         "messages": [{"role": "user", "content": "Hi"}]});
        let v = s.post("/v1/chat/completions", &req).json();
        let raw = s
            .post(
                "/v1/completions",
                &json!({"model": name, "max_tokens": 6, "temperature": 0, "prompt": turn}),
            )
            .json();
        assert_eq!(
            raw["usage"]["prompt_tokens"], v["usage"]["prompt_tokens"],
            "{name}: {raw} {v}"
        );
        assert_eq!(
            raw["choices"][0]["text"].as_str().unwrap(),
            content(&v),
            "{name}"
        );
        forced_calls(&s, name);
    }
}

#[test]
fn a_disconnected_stream_stops_and_frees_its_slot() {
    let s = ApiServer::start("api-cancel", &["--kv-slots", "1", "--ngen", "3000"]);
    let mut req = chat("In the beginning", 3000);
    req["stream"] = json!(true);
    let mut conn = s.send(
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json")],
        req.to_string().as_bytes(),
    );
    let mut first = [0u8; 512];
    let n = conn.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    s.wait_for("the request to decode", |s| {
        s.metric("active_sessions") == 1.0
    });
    drop(conn);
    s.wait_for("the request to stop", |s| {
        s.metric("active_sessions") == 0.0 && s.metric("requests_cancelled_total") == 1.0
    });
    assert!(s.metric("completion_tokens_total") < 3000.0);
    // A client waiting for a whole (non-streamed) answer that goes away stops it too.
    let conn = s.send(
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json")],
        chat("And God said", 3000).to_string().as_bytes(),
    );
    s.wait_for("the request to decode", |s| {
        s.metric("active_sessions") == 1.0
    });
    drop(conn);
    s.wait_for("the request to stop", |s| {
        s.metric("active_sessions") == 0.0 && s.metric("requests_cancelled_total") == 2.0
    });
    // The only slot answers the next request.
    let r = s.post("/v1/chat/completions", &chat("And", 4));
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn a_request_past_its_timeout_ends_length_limited() {
    let s = ApiServer::start("api-timeout", &["--request-timeout", "1", "--ngen", "3000"]);
    let t0 = std::time::Instant::now();
    let v = s
        .post("/v1/chat/completions", &chat("In the beginning", 3000))
        .json();
    assert!(t0.elapsed() >= std::time::Duration::from_secs(1));
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert!(
        v["usage"]["completion_tokens"].as_u64().unwrap() < 3000,
        "{v}"
    );
    assert_eq!(s.metric("active_sessions"), 0.0);
}

#[test]
fn eight_concurrent_streams_each_get_their_answer_alone() {
    // Without cross-slot adoption every prompt is prefilled whole on an empty slot in both
    // runs, so the only difference is the batch: what the test is about.
    let args = ["--kv-slots", "8", "--kv-share", "false"];
    let alone_server = ApiServer::start("api-alone", &args);
    let s = ApiServer::start("api-eight", &args);
    let prompts: Vec<String> = (0..8).map(|i| format!("And the {i} day")).collect();
    let stream = |s: &ApiServer, p: &str| {
        let mut req = chat(p, 24);
        req["stream"] = json!(true);
        let r = s.post("/v1/chat/completions", &req);
        assert_eq!(r.status, 200);
        chat_stream_content(&r)
    };
    let alone: Vec<(String, String)> = prompts.iter().map(|p| stream(&alone_server, p)).collect();
    let together: Vec<(String, String)> = std::thread::scope(|sc| {
        let hs: Vec<_> = prompts
            .iter()
            .map(|p| {
                let s = &s;
                sc.spawn(move || stream(s, p))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, alone);
    assert_eq!(s.metric("requests_total"), 8.0);
    assert_eq!(s.metric("active_sessions"), 0.0);
}

#[test]
fn every_error_has_its_status_and_shape() {
    let s = ApiServer::start(
        "api-errors",
        &[
            "--kv-slots",
            "1",
            "--queue",
            "1",
            "--max-body-bytes",
            "65536",
            "--ngen",
            "5000",
            "--strict-model-name",
        ],
    );
    let post = |path: &str, body: &[u8]| {
        s.request("POST", path, &[("Content-Type", "application/json")], body)
    };
    // 400: not JSON, in each API's shape.
    let r = post("/v1/chat/completions", b"{not json");
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    let r = post("/v1/messages", b"[1,2");
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["type"], "error");
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    // 404: unknown route, and unknown model under --strict-model-name.
    assert_eq!(s.get("/v2/nothing").status, 404);
    let mut bad_model = chat("Hi", 4);
    bad_model["model"] = json!("gpt-4");
    let r = s.post("/v1/chat/completions", &bad_model);
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    // 413: a body over --max-body-bytes.
    let big = chat(&"x".repeat(70000), 4).to_string();
    assert_eq!(post("/v1/chat/completions", big.as_bytes()).status, 413);
    // 422: wrong values (unknown fields are ignored: api_fields.rs).
    for body in [
        json!({"messages": [{"role": "user", "content": "Hi"}], "temperature": 7}),
        json!({"messages": "Hi"}),
        json!({"messages": [{"role": "user", "content": "Hi"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}),
    ] {
        let r = s.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 422, "{body}: {}", r.text());
        assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    }
    let r = s.post(
        "/v1/messages",
        &json!({"messages": [{"role": "user", "content": "Hi"}]}),
    );
    assert_eq!(r.status, 422, "max_tokens is required: {}", r.text());
    // A prompt longer than the context: 400 context_length_exceeded, nothing truncated.
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": "word ".repeat(6000), "max_tokens": 1}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
    // 429: one request decoding, one queued, the next refused.
    let mut long = chat("In the beginning", 5000);
    long["stream"] = json!(true);
    let mut busy = s.send(
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json")],
        long.to_string().as_bytes(),
    );
    let mut head = [0u8; 64];
    let _ = busy.read(&mut head).unwrap();
    let queued = s.send(
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json")],
        chat("And", 2).to_string().as_bytes(),
    );
    s.wait_for("a queued request", |s| s.metric("queue_depth") == 1.0);
    let r = s.post("/v1/chat/completions", &chat("And", 2));
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");
    assert!(r.header("retry-after").is_some());
    let r = s.post(
        "/v1/messages",
        &json!({"max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}),
    );
    assert_eq!(r.status, 429);
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");
    drop(busy);
    let mut rest = Vec::new();
    let mut queued = queued;
    queued.read_to_end(&mut rest).unwrap();
    assert!(String::from_utf8_lossy(&rest).starts_with("HTTP/1.1 200"));
}

#[test]
fn an_api_key_is_required_when_given_and_off_loopback() {
    let s = ApiServer::start("api-key", &["--api-key", "sekrit"]);
    let body = chat("Hi", 2).to_string();
    let ct = ("Content-Type", "application/json");
    let r = s.request("POST", "/v1/chat/completions", &[ct], body.as_bytes());
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["type"], "authentication_error");
    let r = s.request(
        "POST",
        "/v1/chat/completions",
        &[ct, ("Authorization", "Bearer nope")],
        body.as_bytes(),
    );
    assert_eq!(r.status, 401);
    let r = s.request("POST", "/v1/messages", &[ct, ("x-api-key", "nope")], b"{}");
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["type"], "authentication_error");
    assert_eq!(r.json()["type"], "error");
    let r = s.request(
        "POST",
        "/v1/chat/completions",
        &[ct, ("Authorization", "Bearer sekrit")],
        body.as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = s.request("GET", "/v1/models", &[("x-api-key", "sekrit")], b"");
    assert_eq!(r.status, 200);
    assert_eq!(s.get("/health").status, 200, "health needs no key");
    // No CORS headers unless asked.
    assert!(r.header("access-control-allow-origin").is_none());
    // Off loopback without a key: refused before anything loads.
    let out = colibri()
        .args(["api", "--listen", "0.0.0.0:0"])
        .env("XDG_CACHE_HOME", &s.state)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs --api-key"));
}

/// The official `openai` and `anthropic` Python SDKs as clients (tests/python/test_sdk.py),
/// when a Python with both is at hand: `COLI_SDK_PYTHON`, or `.venv-sdk/bin/python` at the
/// repository root (`.ci/run` creates it).
#[test]
fn sdk_clients() {
    let python = std::env::var_os("COLI_SDK_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root().join(".venv-sdk/bin/python"));
    if !python.exists() {
        eprintln!(
            "sdk_clients: no {} (COLI_SDK_PYTHON); skipped",
            python.display()
        );
        return;
    }
    // A venv whose pip install failed (no network) has neither SDK: say so instead of failing.
    let has_sdks = std::process::Command::new(&python)
        .args(["-c", "import openai, anthropic"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_sdks {
        eprintln!(
            "sdk_clients: {} cannot import openai and anthropic (pip install openai anthropic); skipped",
            python.display()
        );
        return;
    }
    let s = ApiServer::start("api-sdk", &["--api-key", "sdk-key"]);
    let out = std::process::Command::new(&python)
        .arg(root().join("tests/python/test_sdk.py"))
        .env("COLI_API_URL", format!("http://{}", s.addr))
        .env("COLI_API_KEY", "sdk-key")
        .env("COLI_MODEL", "colibri-demo")
        .output()
        .expect("running the SDK tests");
    assert!(
        out.status.success(),
        "SDK tests failed:\n{}\n{}\nserver:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        s.stderr()
    );
}
