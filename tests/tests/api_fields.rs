//! `colibri api` takes what real clients send: `max_tokens` clamped only to the context room
//! (not `--ngen`), the model's own context by default, any model name (the response names
//! the real one; `--strict-model-name` restores the 404, in api.rs), `--model-alias`, the
//! sampling fields each with its effect (seed, top_k, min_p, the penalties), `n` choices,
//! logprobs equal to the log-softmax of the reference logits, and unknown fields ignored and
//! logged; `n` and `top_logprobs` past their limits are a 400 naming the field.

use colibri::engine::Engine;
use colibri::model::LoadOptions;
use colibri_e2e::http::ApiServer;
use colibri_e2e::{fixture, root, temp_dir};
use serde_json::{json, Value};

fn demo_dir() -> std::path::PathBuf {
    root().join("daemon").join("demo")
}

fn completion(prompt: &str, max_tokens: u32, extra: Value) -> Value {
    let mut r = json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0});
    for (k, v) in extra.as_object().unwrap() {
        r[k] = v.clone();
    }
    r
}

fn text(r: &Value) -> String {
    r.pointer("/choices/0/text")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no text in {r}"))
        .to_string()
}

fn ok(s: &ApiServer, path: &str, body: &Value) -> Value {
    let r = s.post(path, body);
    assert_eq!(r.status, 200, "{body}: {}", r.text());
    r.json()
}

#[test]
fn no_hidden_caps_any_model_name_aliases_and_unknown_fields() {
    let s = ApiServer::start(
        "api-fields-names",
        &[
            "--ngen",
            "8",
            // A small context, so an answer without max_tokens runs to its room quickly.
            "--ctx",
            "160",
            "--model-alias",
            "gpt-4o-mini",
            "--model-alias",
            "local",
        ],
    );
    let ids: Vec<Value> = s.get("/v1/models").json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].clone())
        .collect();
    assert_eq!(
        ids,
        [json!("colibri-demo"), json!("gpt-4o-mini"), json!("local")]
    );
    assert_eq!(s.get("/v1/models/local").json()["id"], "local");
    // What tools pointed at a local base URL send: served, the response names the real model,
    // and max_tokens 40 is not cut to --ngen 8.
    let chat = json!({"model": "gpt-4o", "max_tokens": 40, "temperature": 0,
                      "messages": [{"role": "user", "content": "In the beginning"}]});
    let v = ok(&s, "/v1/chat/completions", &chat);
    assert_eq!(v["model"], "colibri-demo");
    let n = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(n > 8, "--ngen 8 capped the answer: {v}");
    let m = json!({"model": "claude-sonnet-4-5", "max_tokens": 40, "temperature": 0,
                   "messages": [{"role": "user", "content": "In the beginning"}]});
    let a = ok(&s, "/v1/messages", &m);
    assert_eq!(a["model"], "colibri-demo");
    assert_eq!(a["usage"]["output_tokens"].as_u64(), Some(n), "{a}");
    // Without max_tokens the answer runs to the room (or the end), not to --ngen.
    let mut open = chat.clone();
    open.as_object_mut().unwrap().remove("max_tokens");
    let v = ok(&s, "/v1/chat/completions", &open);
    let (prompt, answer) = (
        v["usage"]["prompt_tokens"].as_u64().unwrap(),
        v["usage"]["completion_tokens"].as_u64().unwrap(),
    );
    assert!(answer > 40, "{v}");
    if v["choices"][0]["finish_reason"] == "length" {
        assert_eq!(
            prompt + answer,
            160 - 1,
            "the room is the context less one: {v}"
        );
    }
    // Fields of other servers and newer versions: ignored, and named in the log.
    let mut extra = chat.clone();
    extra["max_tokens"] = json!(4);
    for (k, v) in [
        ("frobnicate", json!(1)),
        ("logit_bias", json!({})),
        ("parallel_tool_calls", json!(false)),
        ("user", json!("u")),
        ("metadata", json!({"a": "b"})),
        (
            "stream_options",
            json!({"include_usage": true, "future": 1}),
        ),
        ("reasoning_effort", json!("low")),
        ("top_k", json!(40)),
    ] {
        extra[k] = v;
    }
    ok(&s, "/v1/chat/completions", &extra);
    s.wait_for("the ignored fields' log line", |s| {
        s.stderr()
            .contains(r#"ignored unknown fields ["frobnicate", "logit_bias"]"#)
    });
    let mut thinking = m.clone();
    thinking["max_tokens"] = json!(4);
    thinking["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
    thinking["top_k"] = json!(5);
    thinking["tool_choice"] = json!({"type": "auto"});
    thinking["stop_sequences"] = json!(["never"]);
    ok(&s, "/v1/messages", &thinking);
    // reasoning_effort and thinking turn the template's thinking switch: GLM's turn opens
    // `<think>` instead of writing an empty `<think></think>`, one token fewer.
    // Counted by the server's own metric, the same for both APIs whatever their usage shape.
    let prompt_tokens = |path: &str, body: &Value| -> u64 {
        let before = s.metric("prompt_tokens_total");
        ok(&s, path, body);
        (s.metric("prompt_tokens_total") - before) as u64
    };
    let mut effort = chat.clone();
    effort["max_tokens"] = json!(1);
    effort["reasoning_effort"] = json!("none");
    let off = prompt_tokens("/v1/chat/completions", &effort);
    effort["reasoning_effort"] = json!("high");
    assert_eq!(prompt_tokens("/v1/chat/completions", &effort), off - 1);
    thinking["max_tokens"] = json!(1);
    let on = prompt_tokens("/v1/messages", &thinking);
    thinking["thinking"] = json!({"type": "disabled"});
    assert_eq!(prompt_tokens("/v1/messages", &thinking), on + 1);
    // A wrong type is still refused; limits are a 400 naming the field.
    let mut bad = chat.clone();
    bad["top_k"] = json!("many");
    assert_eq!(s.post("/v1/chat/completions", &bad).status, 422);
    for (path, field, value) in [
        ("/v1/chat/completions", "n", json!(9)),
        ("/v1/chat/completions", "top_logprobs", json!(21)),
        ("/v1/completions", "logprobs", json!(6)),
        ("/v1/completions", "n", json!(0)),
    ] {
        let mut body = if path == "/v1/completions" {
            completion("In", 2, json!({}))
        } else {
            chat.clone()
        };
        body[field] = value;
        if field == "top_logprobs" {
            body["logprobs"] = json!(true);
        }
        let r = s.post(path, &body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], field, "{}", r.text());
    }
}

#[test]
fn default_ctx_is_the_models_own_and_takes_a_long_prompt() {
    // The demo model with a context of 16384 positions (its weights do not care).
    let dir = temp_dir("api-fields-ctx-model");
    for f in ["tokenizer.json", "model.safetensors"] {
        std::fs::copy(demo_dir().join(f), dir.join(f)).unwrap();
    }
    let mut cfg: Value =
        serde_json::from_slice(&std::fs::read(demo_dir().join("config.json")).unwrap()).unwrap();
    cfg["max_position_embeddings"] = json!(16384);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let s = ApiServer::start(
        "api-fields-ctx",
        &["--snap", dir.to_str().unwrap(), "--kv-slots", "1"],
    );
    s.wait_for("the ready line", |s| {
        s.stderr().contains("[api] ready: 1 sessions, ctx 16384")
    });
    let log = s.stderr();
    assert!(
        log.contains("[KV] ctx 16384 (model max 16384"),
        "the start line says the context and why:\n{log}"
    );
    // About 5.6k tokens: past the old fixed 4096.
    let prompt = "In the beginning God created the heaven and the earth. ".repeat(515);
    let v = ok(&s, "/v1/completions", &completion(&prompt, 2, json!({})));
    let n = v["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(n > 5600, "{n} prompt tokens");
}

#[test]
fn sampling_fields_have_their_effect() {
    let s = ApiServer::start("api-fields-sampling", &[]);
    let p = "And God said";
    let sampled = |extra: Value| text(&ok(&s, "/v1/completions", &completion(p, 24, extra)));
    let greedy = sampled(json!({}));
    // Seeded sampling is reproducible, and another seed gives another answer.
    let seeded = sampled(json!({"temperature": 1.0, "seed": 7}));
    assert_eq!(seeded, sampled(json!({"temperature": 1.0, "seed": 7})));
    let others: Vec<String> = (8..11)
        .map(|seed| sampled(json!({"temperature": 1.0, "seed": seed})))
        .collect();
    assert!(others.iter().any(|o| *o != seeded), "{seeded:?} {others:?}");
    // top_k 1 and min_p 1 keep only the most likely token: greedy at any temperature.
    assert_eq!(
        sampled(json!({"temperature": 1.5, "top_k": 1, "seed": 3})),
        greedy
    );
    assert_eq!(
        sampled(json!({"temperature": 1.5, "min_p": 1.0, "seed": 3})),
        greedy
    );
    // The penalties change a repetitive greedy answer, and the frequency penalty makes it
    // repeat its most repeated token less.
    let tokens = |extra: Value| -> Vec<String> {
        let mut body = completion(p, 40, extra);
        body["logprobs"] = json!(0);
        ok(&s, "/v1/completions", &body)["choices"][0]["logprobs"]["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap().to_string())
            .collect()
    };
    let most = |toks: &[String]| {
        toks.iter()
            .map(|t| toks.iter().filter(|u| *u == t).count())
            .max()
            .unwrap_or(0)
    };
    let plain = tokens(json!({}));
    let freq = tokens(json!({"frequency_penalty": 2.0}));
    assert_ne!(plain, freq);
    assert!(most(&freq) < most(&plain), "{plain:?}\n{freq:?}");
    assert_ne!(plain, tokens(json!({"presence_penalty": 2.0})));
    assert_ne!(plain, tokens(json!({"repetition_penalty": 3.0})));
    // n choices, each its own sampling seeded seed + i: choice i is the answer of seed + i.
    let body = completion(p, 12, json!({"temperature": 1.0, "seed": 5, "n": 3}));
    let v = ok(&s, "/v1/completions", &body);
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        let alone = completion(p, 12, json!({"temperature": 1.0, "seed": 5 + i}));
        assert_eq!(c["text"], json!(text(&ok(&s, "/v1/completions", &alone))));
    }
    let chat = json!({"messages": [{"role": "user", "content": p}], "max_tokens": 6,
                      "temperature": 1.0, "n": 3});
    let v = ok(&s, "/v1/chat/completions", &chat);
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3, "{v}");
    let mut tokens = 0;
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert!(c["message"]["content"].is_string(), "{c}");
        tokens += if c["finish_reason"] == "length" { 6 } else { 0 };
    }
    // Usage counts the prompt once and every choice's tokens.
    let used = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(used >= tokens && used <= 18, "{v}");
    // Streamed, each choice's deltas carry its index; they spell the choices of the same
    // seeds answered whole, and one usage and one [DONE] close the stream.
    let mut seeded = chat.clone();
    seeded["seed"] = json!(11);
    let whole = ok(&s, "/v1/chat/completions", &seeded);
    seeded["stream"] = json!(true);
    seeded["stream_options"] = json!({"include_usage": true});
    let data = s.post("/v1/chat/completions", &seeded).sse_data();
    assert_eq!(data.iter().filter(|d| *d == "[DONE]").count(), 1);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data
        .iter()
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    let usage = chunks.last().unwrap();
    for k in ["prompt_tokens", "completion_tokens"] {
        assert_eq!(usage["usage"][k], whole["usage"][k], "{usage}");
    }
    for i in 0..3 {
        let mut text = String::new();
        let mut finish = None;
        for c in &chunks {
            for ch in c["choices"].as_array().unwrap() {
                if ch["index"] == i {
                    text += ch["delta"]["content"].as_str().unwrap_or("");
                    if !ch["finish_reason"].is_null() {
                        finish = Some(ch["finish_reason"].clone());
                    }
                }
            }
        }
        let c = &whole["choices"][i];
        assert_eq!(
            text,
            c["message"]["content"].as_str().unwrap(),
            "choice {i}"
        );
        assert_eq!(finish.as_ref(), Some(&c["finish_reason"]), "choice {i}");
    }
}

/// The reference logits of the demo's `short` case (transformers, float32) at the last
/// prompt position, log-softmaxed: the first answer token's logprobs must be these.
#[test]
fn logprobs_are_the_log_softmax_of_the_models_logits() {
    let refs: Value =
        serde_json::from_slice(&std::fs::read(fixture("demo-trained").join("ref.json")).unwrap())
            .unwrap();
    let ids: Vec<u32> = refs["short"]["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let raw = std::fs::read(fixture("demo-trained").join("logits_short.f32")).unwrap();
    let vocab = 4096;
    // Row p: the log-softmax of position p's logits, which predict token p + 1.
    let log_softmax = |p: usize| -> Vec<f64> {
        let row: Vec<f64> = raw[p * vocab * 4..(p + 1) * vocab * 4]
            .chunks(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
            .collect();
        let max = row.iter().copied().fold(f64::MIN, f64::max);
        let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
        row.iter().map(|v| v - lse).collect()
    };
    let last = log_softmax(ids.len() - 1);
    let mut order: Vec<usize> = (0..vocab).collect();
    order.sort_by(|&a, &b| last[b].total_cmp(&last[a]));
    let engine = Engine::open(vec![demo_dir()], LoadOptions::default()).unwrap();
    let tok = engine.tokenizer();
    let prompt = String::from_utf8(tok.decode_bytes(&ids)).unwrap();
    assert_eq!(
        tok.encode(&prompt).unwrap(),
        ids,
        "the prompt text round-trips"
    );

    let s = ApiServer::start("api-fields-logprobs", &[]);
    let echo = completion(&prompt, 1, json!({"logprobs": 5, "echo": true}));
    let v = ok(&s, "/v1/completions", &echo);
    assert_eq!(v["usage"]["prompt_tokens"], ids.len());
    let c = &v["choices"][0];
    assert!(
        c["text"].as_str().unwrap().starts_with(&prompt),
        "echo: {c}"
    );
    // Echoed with logprobs, the prompt is read out first: every prompt token but the first
    // (which nothing predicts: null) has the reference's logprob under the positions before
    // it, and the answer's token follows.
    let lp = &c["logprobs"];
    assert_eq!(
        lp["tokens"].as_array().unwrap().len(),
        ids.len() + 1,
        "{lp}"
    );
    assert_eq!(lp["token_logprobs"][0], Value::Null, "{lp}");
    assert_eq!(lp["top_logprobs"][0], Value::Null, "{lp}");
    assert_eq!(lp["text_offset"][0], 0, "{lp}");
    for (p, &id) in ids.iter().enumerate().skip(1) {
        let want = log_softmax(p - 1)[id as usize];
        let got = lp["token_logprobs"][p].as_f64().unwrap();
        assert!(
            (got - want).abs() < 1e-3,
            "prompt token {p}: {got} vs {want}"
        );
        assert_eq!(lp["top_logprobs"][p].as_object().unwrap().len(), 5);
    }
    let top = lp["top_logprobs"][ids.len()].as_object().unwrap();
    assert_eq!(top.len(), 5);
    for &id in &order[..5] {
        let t = String::from_utf8_lossy(tok.token_bytes(id as u32)).into_owned();
        let got = top
            .get(&t)
            .and_then(Value::as_f64)
            .unwrap_or_else(|| panic!("{t:?} not among {top:?}"));
        assert!(
            (got - last[id]).abs() < 1e-3,
            "{t:?}: {got} vs {}",
            last[id]
        );
    }
    let first = lp["token_logprobs"][ids.len()].as_f64().unwrap();
    assert!(
        (first - last[order[0]]).abs() < 1e-3,
        "greedy takes the top: {lp}"
    );
    // Streamed, the read-out comes in the first chunk with the prompt's text, and the
    // chunks together carry what the whole answer does.
    let mut streamed = echo.clone();
    streamed["stream"] = json!(true);
    let chunks: Vec<Value> = s
        .post("/v1/completions", &streamed)
        .sse_data()
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["text"], prompt.as_str());
    let mut joined =
        json!({"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []});
    for c in &chunks {
        let l = &c["choices"][0]["logprobs"];
        if l.is_null() {
            continue;
        }
        for k in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
            let more = l[k].as_array().unwrap().clone();
            joined[k].as_array_mut().unwrap().extend(more);
        }
    }
    // The same tokens and offsets; the answer token's logprob within f32 noise (this request
    // reused the first one's cached prefix, so its last position was computed in another
    // batch shape).
    for k in ["tokens", "text_offset"] {
        assert_eq!(joined[k], lp[k], "{k}");
    }
    let close = |a: &Value, b: &Value| match (a.as_f64(), b.as_f64()) {
        (Some(a), Some(b)) => (a - b).abs() < 1e-5,
        _ => a == b,
    };
    for (a, b) in joined["token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .zip(lp["token_logprobs"].as_array().unwrap())
    {
        assert!(close(a, b), "{a} vs {b}");
    }

    // Chat: one entry per token, greedy's is its own top, and the tokens spell the content,
    // whole and streamed alike.
    let chat = json!({"messages": [{"role": "user", "content": "And God said"}],
                      "max_tokens": 10, "temperature": 0, "logprobs": true, "top_logprobs": 3});
    let v = ok(&s, "/v1/chat/completions", &chat);
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(
        content.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap()
    );
    let mut spelled = String::new();
    for e in &content {
        let tops = e["top_logprobs"].as_array().unwrap();
        assert_eq!(tops.len(), 3);
        assert_eq!(e["token"], tops[0]["token"]);
        assert_eq!(e["logprob"], tops[0]["logprob"]);
        assert!(tops
            .windows(2)
            .all(|w| w[0]["logprob"].as_f64() >= w[1]["logprob"].as_f64()));
        let bytes: Vec<u8> = e["bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap() as u8)
            .collect();
        spelled.push_str(&String::from_utf8_lossy(&bytes));
    }
    assert_eq!(
        spelled,
        v["choices"][0]["message"]["content"].as_str().unwrap()
    );
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    let r = s.post("/v1/chat/completions", &streamed);
    let entries: Vec<Value> = r
        .sse_data()
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|c| c.pointer("/choices/0/logprobs/content").cloned())
        .flat_map(|c| c.as_array().unwrap().clone())
        .collect();
    assert_eq!(entries, content);
}

/// Completions with `n` > 1 stream too: each choice's chunks carry its index, spell the
/// choice of the same seeds answered whole, and one [DONE] closes the stream.
#[test]
fn completions_stream_several_choices() {
    let s = ApiServer::start("api-fields-n-stream", &[]);
    let body = completion(
        "In the beginning",
        6,
        json!({"n": 3, "temperature": 1.0, "seed": 5}),
    );
    let whole = ok(&s, "/v1/completions", &body);
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let data = s.post("/v1/completions", &streamed).sse_data();
    assert_eq!(data.iter().filter(|d| *d == "[DONE]").count(), 1);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data
        .iter()
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    for i in 0..3 {
        let mut text = String::new();
        let mut finish = None;
        for c in &chunks {
            for ch in c["choices"].as_array().unwrap() {
                if ch["index"] == i {
                    text += ch["text"].as_str().unwrap_or("");
                    if !ch["finish_reason"].is_null() {
                        finish = Some(ch["finish_reason"].clone());
                    }
                }
            }
        }
        let c = &whole["choices"][i];
        assert_eq!(text, c["text"].as_str().unwrap(), "choice {i}");
        assert_eq!(finish.as_ref(), Some(&c["finish_reason"]), "choice {i}");
    }
}
