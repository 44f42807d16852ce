//! `colibri api` against hostile and unlucky JSON schemas (issue 45, items 2 and 4), end to
//! end over raw HTTP:
//! - a schema of 100k keys, near the 4 MiB body limit, took minutes to compile on the async
//!   threads (its duplicate-key check was quadratic) and froze `/health` for every client;
//!   now `/health` answers at once while such schemas compile beside a 1 MB one that works;
//! - a schema past `--max-schema-bytes` is refused with a 413 naming the limit and the flag;
//! - a forced tool call with integer and number parameters always comes back as a call
//!   whose arguments a strict parser reads (no `2102E+406`, no integer past 2^53) with the
//!   keys in the schema's order (they came back sorted), on the demo model and on a second
//!   family's fixture (Qwen3).

use std::time::{Duration, Instant};

use colibri_e2e::fixture;
use colibri_e2e::http::{ApiServer, HttpResponse};
use serde_json::{json, Value};

/// A response_format request whose schema is an object of `n` optional integer members
/// named `{tag}key{i}`: about 30 bytes a member (the tag keeps schemas distinct, so none is
/// served from the cache of compiled schemas).
fn wide_schema_request(tag: &str, n: usize) -> Vec<u8> {
    let props: Vec<String> = (0..n)
        .map(|i| format!(r#""{tag}key{i}":{{"type":"integer"}}"#))
        .collect();
    let schema = format!(
        r#"{{"type":"object","properties":{{{}}}}}"#,
        props.join(",")
    );
    format!(
        r#"{{"max_tokens":4,"temperature":0,"messages":[{{"role":"user","content":"x"}}],
            "response_format":{{"type":"json_schema","json_schema":{{"name":"x","schema":{schema}}}}}}}"#
    )
    .into_bytes()
}

fn post_raw(s: &ApiServer, path: &str, body: &[u8]) -> HttpResponse {
    s.request("POST", path, &[("Content-Type", "application/json")], body)
}

#[test]
fn health_answers_while_big_schemas_compile() {
    // Schemas up to the body limit are let through, to be compiled (or refused by the
    // compiler's symbol bound) off the async threads.
    let s = ApiServer::start("attack-schema", &["--max-schema-bytes", "4194304"]);
    // One that compiles (30k members, 0.9 MB) and two of 130k members (3.8 MB, under the
    // body limit): before, each of these took a runtime thread for a minute.
    let works = wide_schema_request("a", 30_000);
    let huge = [
        wide_schema_request("b", 130_000),
        wide_schema_request("c", 130_000),
    ];
    assert!(huge.iter().all(|b| b.len() < 4 << 20 && b.len() > 3 << 20));
    let health = std::thread::scope(|scope| {
        let big = [
            scope.spawn(|| post_raw(&s, "/v1/chat/completions", &works)),
            scope.spawn(|| post_raw(&s, "/v1/chat/completions", &huge[0])),
            scope.spawn(|| post_raw(&s, "/v1/chat/completions", &huge[1])),
        ];
        // Probe /health on its own connections until every big request has its answer.
        let mut probes = Vec::new();
        while big.iter().any(|h| !h.is_finished()) {
            let t0 = Instant::now();
            let r = s.get("/health");
            probes.push(t0.elapsed());
            assert_eq!(r.status, 200, "{}", r.text());
            std::thread::sleep(Duration::from_millis(20));
        }
        let [a, b, c] = big.map(|h| h.join().expect("the request thread"));
        assert_eq!(a.status, 200, "{}", a.text());
        for r in [b, c] {
            // Past the compiler's bound of symbols: refused (a 400, as every schema the
            // grammar cannot take), with why.
            assert_eq!(r.status, 400, "{}", r.text());
            assert!(r.text().contains("smaller grammar"), "{}", r.text());
        }
        probes
    });
    let worst = health.iter().max().copied().unwrap_or_default();
    assert!(
        worst < Duration::from_secs(2),
        "/health took {worst:?} while schemas compiled ({} probes)",
        health.len()
    );
    assert!(health.len() >= 2, "the big requests ended before a probe");
}

#[test]
fn a_schema_past_the_limit_is_refused_naming_it() {
    let s = ApiServer::start("attack-limit", &["--max-schema-bytes", "4096"]);
    let schema = |n: usize| {
        let props: Vec<String> = (0..n)
            .map(|i| format!(r#""p{i}":{{"type":"integer"}}"#))
            .collect();
        serde_json::from_str::<Value>(&format!(
            r#"{{"type":"object","properties":{{{}}}}}"#,
            props.join(",")
        ))
        .unwrap()
    };
    let (small, big) = (schema(10), schema(300));
    assert!(big.to_string().len() > 4096);
    let chat = |schema: &Value| {
        json!({"max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": "x"}],
               "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
    };
    let r = s.post("/v1/chat/completions", &chat(&small));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = s.post("/v1/chat/completions", &chat(&big));
    assert_eq!(r.status, 413, "{}", r.text());
    let e = r.json();
    let msg = e["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("4096") && msg.contains("--max-schema-bytes"),
        "{e}"
    );
    assert_eq!(e["error"]["param"], "response_format", "{e}");
    // A forced call's schema is its tools' schemas together.
    let tools = json!([{"type": "function", "function": {"name": "f", "parameters": big}}]);
    let r = s.post(
        "/v1/chat/completions",
        &json!({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
                "tools": tools, "tool_choice": "required"}),
    );
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "tools");
    // Anthropic's shape says the same.
    let r = s.post(
        "/v1/messages",
        &json!({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
                "tools": [{"name": "f", "input_schema": big}], "tool_choice": {"type": "any"}}),
    );
    assert_eq!(r.status, 413, "{}", r.text());
    let e = r.json();
    assert_eq!(e["type"], "error", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("--max-schema-bytes")),
        "{e}"
    );
}

/// Parameters in an order that is not alphabetical, integers and numbers among them.
const PAY: &str = r#"{"type":"object","properties":{
    "zeta":{"type":"integer"},"count":{"type":"integer"},"amount":{"type":"number"},
    "big":{"type":"number"},"label":{"type":"string","maxLength":8},
    "ratio":{"anyOf":[{"type":"number"},{"type":"null"}]}},
    "required":["zeta","count","amount","big","label","ratio"]}"#;
const ORDER: [&str; 6] = ["zeta", "count", "amount", "big", "label", "ratio"];

/// Forced calls sampled at temperature 1 under many seeds: every one a call whose
/// arguments parse strictly, with integers within 2^53 and the keys in schema order.
fn forced_numbers(s: &ApiServer, model: &str, seeds: u64) {
    // The schema goes as its text: a `Value` here would send its keys sorted.
    let tools = json!([{"type": "function", "function": {"name": "pay",
        "description": "Pay an amount", "parameters": "PAY"}}]);
    for seed in 0..seeds {
        let choice = if seed % 2 == 0 {
            json!("required")
        } else {
            json!({"type": "function", "function": {"name": "pay"}})
        };
        let req = json!({"model": model, "max_tokens": 400, "temperature": 1.0, "seed": seed,
            "tools": tools, "tool_choice": choice,
            "messages": [{"role": "user", "content": "Pay a large amount, in scientific notation"}]});
        let body = req.to_string().replace(r#""PAY""#, PAY);
        let v = post_raw(s, "/v1/chat/completions", body.as_bytes()).json();
        let msg = &v["choices"][0]["message"];
        assert_eq!(
            v["choices"][0]["finish_reason"], "tool_calls",
            "{model} seed {seed}: {v}"
        );
        assert!(msg["content"].is_null(), "{model} seed {seed}: {v}");
        let call = &msg["tool_calls"][0]["function"];
        assert_eq!(call["name"], "pay");
        let text = call["arguments"].as_str().expect("arguments are text");
        let args: Value = serde_json::from_str(text)
            .unwrap_or_else(|e| panic!("{model} seed {seed}: {text}: {e}"));
        for k in ["zeta", "count"] {
            let n = args[k]
                .as_i64()
                .unwrap_or_else(|| panic!("{model} seed {seed}: {k} in {text}"));
            assert!(n.unsigned_abs() < 1 << 53, "{model} seed {seed}: {text}");
        }
        for k in ["amount", "big"] {
            assert!(
                args[k].as_f64().is_some_and(f64::is_finite),
                "{model} seed {seed}: {text}"
            );
        }
        // The order written, which is the schema's: each key after the one before.
        let at: Vec<usize> = ORDER
            .iter()
            .map(|k| {
                text.find(&format!("\"{k}\":"))
                    .unwrap_or_else(|| panic!("{model} seed {seed}: no {k} in {text}"))
            })
            .collect();
        assert!(
            at.windows(2).all(|w| w[0] < w[1]),
            "{model} seed {seed}: keys out of the schema's order: {text}"
        );
    }
    // Anthropic's `tool_use.input` is an object: its keys come in the schema's order too.
    for i in 0..4 {
        let req = json!({"model": model, "max_tokens": 400, "temperature": 1.0,
            "tools": [{"name": "pay", "description": "Pay an amount", "input_schema": "PAY"}],
            "tool_choice": {"type": "any"},
            "messages": [{"role": "user", "content": "Pay a large amount"}]});
        let body = req.to_string().replace(r#""PAY""#, PAY);
        let r = post_raw(s, "/v1/messages", body.as_bytes());
        assert_eq!(r.status, 200, "{}", r.text());
        let text = r.text();
        let input = text
            .find("\"input\":")
            .map(|at| &text[at..])
            .unwrap_or_else(|| panic!("{model} #{i}: no input in {text}"));
        let at: Vec<usize> = ORDER
            .iter()
            .map(|k| {
                input
                    .find(&format!("\"{k}\":"))
                    .unwrap_or_else(|| panic!("{model} #{i}: no {k} in {input}"))
            })
            .collect();
        assert!(
            at.windows(2).all(|w| w[0] < w[1]),
            "{model} #{i}: tool_use.input out of the schema's order: {input}"
        );
    }
}

#[test]
fn forced_calls_with_numbers_are_calls_in_schema_order() {
    let s = ApiServer::start("attack-numbers", &[]);
    forced_numbers(&s, "colibri-demo", 24);
}

#[test]
fn forced_calls_with_numbers_are_calls_in_schema_order_on_qwen3() {
    let snap = fixture("tiny-qwen3-moe");
    let s = ApiServer::start("attack-numbers-qwen", &["--snap", snap.to_str().unwrap()]);
    forced_numbers(&s, "tiny-qwen3-moe", 30);
}
