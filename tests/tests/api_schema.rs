//! JSON Schema coverage and answers that always parse, through `colibri api` and
//! `colibri run` on the demo model: Pydantic-style schemas (nested models through `$defs` /
//! `$ref`, `Optional` as `anyOf` with null, bounds, patterns, enums) in forced tool calls and
//! `response_format`; a budget too small for the model's own answer still closes it (the demo
//! model never closes a string by itself), `finish_reason` staying `length`; strict mode
//! refuses what the grammar cannot enforce, naming keyword and path. Every answer is checked
//! by serde_json and a hand-written check of its schema, never by the engine's matcher.

use colibri_e2e::http::ApiServer;
use colibri_e2e::{colibri, run_ok, temp_dir};
use serde_json::{json, Value};

/// What Pydantic v2 writes for `Person(name: constr(max_length=20), age: conint(ge=1, le=150),
/// color: Color = "red", home: Optional[Address] = None)`.
const PERSON: &str = r##"{"$defs":{"Color":{"enum":["red","green"],"title":"Color","type":"string"},
 "Address":{"properties":{"street":{"title":"Street","type":"string","maxLength":8},
  "zip":{"pattern":"^[0-9]{5}$","title":"Zip","type":"string"}},"required":["street","zip"],
  "title":"Address","type":"object","additionalProperties":false}},
 "properties":{"name":{"title":"Name","type":"string","maxLength":20},
  "age":{"minimum":1,"maximum":150,"title":"Age","type":"integer"},
  "color":{"$ref":"#/$defs/Color","default":"red"},
  "home":{"anyOf":[{"$ref":"#/$defs/Address"},{"type":"null"}],"default":null}},
 "required":["name","age"],"title":"Person","type":"object","additionalProperties":false}"##;

/// PERSON's constraints, checked by hand.
fn check_person(v: &Value) {
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"));
    for k in o.keys() {
        assert!(
            ["name", "age", "color", "home"].contains(&k.as_str()),
            "{v}"
        );
    }
    assert!(
        o["name"].as_str().is_some_and(|s| s.chars().count() <= 20),
        "{v}"
    );
    assert!(
        o["age"].as_i64().is_some_and(|a| (1..=150).contains(&a)),
        "{v}"
    );
    if let Some(c) = o.get("color") {
        assert!(["red", "green"].contains(&c.as_str().unwrap_or("")), "{v}");
    }
    match o.get("home") {
        None | Some(Value::Null) => {}
        Some(h) => {
            assert!(
                h["street"].as_str().is_some_and(|s| s.chars().count() <= 8),
                "{v}"
            );
            let zip = h["zip"].as_str().unwrap_or("");
            assert!(
                zip.len() == 5 && zip.bytes().all(|b| b.is_ascii_digit()),
                "{v}"
            );
            assert_eq!(h.as_object().unwrap().len(), 2, "{v}");
        }
    }
}

/// Strings without a bound: the demo model keeps writing them until the budget ends.
const NOTE: &str = r#"{"type":"object","properties":{"note":{"type":"string"},"n":{"type":"integer"},
 "list":{"type":"array","items":{"type":"string"}}},"required":["note","n","list"],"additionalProperties":false}"#;

fn check_note(v: &Value) {
    assert!(v["note"].is_string(), "{v}");
    assert!(v["n"].is_i64(), "{v}");
    assert!(
        v["list"]
            .as_array()
            .is_some_and(|l| l.iter().all(Value::is_string)),
        "{v}"
    );
    assert_eq!(v.as_object().unwrap().len(), 3, "{v}");
}

fn tool(name: &str, schema: &str) -> Value {
    json!({"type": "function", "function": {"name": name, "parameters":
        serde_json::from_str::<Value>(schema).unwrap()}})
}

fn call_args(v: &Value) -> Value {
    let call = &v["choices"][0]["message"]["tool_calls"][0];
    serde_json::from_str(
        call["function"]["arguments"]
            .as_str()
            .unwrap_or_else(|| panic!("no call: {v}")),
    )
    .unwrap_or_else(|e| panic!("arguments do not parse ({e}): {v}"))
}

#[test]
fn pydantic_schemas_and_small_budgets_always_parse_and_validate() {
    let s = ApiServer::start("api-schema", &[]);
    let msgs = json!([{"role": "user", "content": "Who?"}]);
    // Pydantic models: a forced call and a response format, at a few temperatures.
    for (temp, seed) in [(0.0, 1), (1.0, 2), (1.5, 3)] {
        let req = json!({"model": "colibri-demo", "max_tokens": 200, "temperature": temp, "seed": seed,
            "tools": [tool("person", PERSON)], "tool_choice": "required", "messages": msgs});
        let v = s.post("/v1/chat/completions", &req).json();
        check_person(&call_args(&v));
        let req = json!({"model": "colibri-demo", "max_tokens": 200, "temperature": temp, "seed": seed,
            "messages": msgs, "response_format": {"type": "json_schema",
            "json_schema": {"name": "person", "schema": serde_json::from_str::<Value>(PERSON).unwrap()}}});
        let v = s.post("/v1/chat/completions", &req).json();
        let text = v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_else(|| panic!("{v}"));
        check_person(&serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}")));
    }
    // Budgets far below what the model would write: closed within them, `length` kept.
    // (The demo's 4k vocabulary spells the shortest call, wrapper included, in about 42
    // tokens: a budget below the shortest sentence cannot hold one.)
    for max in [64, 100, 160] {
        let req = json!({"model": "colibri-demo", "max_tokens": max, "temperature": 1.0, "seed": max,
            "tools": [tool("note", NOTE)], "tool_choice": {"type": "function", "function": {"name": "note"}},
            "messages": msgs});
        let v = s.post("/v1/chat/completions", &req).json();
        assert_eq!(v["choices"][0]["finish_reason"], "length", "{max}: {v}");
        assert!(
            v["usage"]["completion_tokens"]
                .as_u64()
                .is_some_and(|n| n <= max),
            "{v}"
        );
        check_note(&call_args(&v));
        for rf in [
            json!({"type": "json_schema", "json_schema": {"name": "n", "schema": serde_json::from_str::<Value>(NOTE).unwrap()}}),
            json!({"type": "json_object"}),
        ] {
            let req = json!({"model": "colibri-demo", "max_tokens": max, "temperature": 1.0, "seed": max,
                "messages": msgs, "response_format": rf});
            let v = s.post("/v1/chat/completions", &req).json();
            let text = v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_else(|| panic!("{v}"));
            let parsed: Value =
                serde_json::from_str(text).unwrap_or_else(|e| panic!("{max} {e}: {text}"));
            if rf["type"] == "json_schema" {
                check_note(&parsed);
            } else {
                assert!(parsed.is_object(), "{text}");
            }
            assert!(
                v["usage"]["completion_tokens"]
                    .as_u64()
                    .is_some_and(|n| n <= max),
                "{v}"
            );
        }
    }
}

#[test]
fn strict_mode_refuses_what_the_grammar_cannot_enforce() {
    let s = ApiServer::start("api-schema-strict", &[]);
    let schema = json!({"type": "object", "properties": {"foo": {"type": "integer", "multipleOf": 3}},
        "required": ["foo"], "additionalProperties": false});
    let msgs = json!([{"role": "user", "content": "Hi"}]);
    let req = |strict: bool| {
        json!({"model": "colibri-demo", "max_tokens": 40, "temperature": 0, "messages": msgs,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": strict, "schema": schema}}})
    };
    let r = s.post("/v1/chat/completions", &req(true));
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text().contains("$.properties.foo.multipleOf"),
        "{}",
        r.text()
    );
    // Not strict: relaxed (any integer) and answered.
    let r = s.post("/v1/chat/completions", &req(false));
    assert_eq!(r.status, 200, "{}", r.text());
    // A strict tool the same way, named by its keyword and path.
    let req = json!({"model": "colibri-demo", "max_tokens": 40, "messages": msgs, "tool_choice": "required",
        "tools": [{"type": "function", "function": {"name": "f", "strict": true, "parameters": schema}}]});
    let r = s.post("/v1/chat/completions", &req);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("multipleOf"), "{}", r.text());
    // Bad input: a `$ref` to nowhere, a pattern that cannot be bounded: 400s naming the field.
    for bad in [
        json!({"$ref": "#/$defs/missing"}),
        json!({"type": "string", "pattern": "(?<=a)b"}),
    ] {
        let req = json!({"model": "colibri-demo", "max_tokens": 8, "messages": msgs,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": bad}}});
        let r = s.post("/v1/chat/completions", &req);
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(
            r.json()["error"]["param"],
            "response_format",
            "{}",
            r.text()
        );
    }
}

#[test]
fn run_closes_a_gbnf_answer_within_a_small_budget() {
    let dir = temp_dir("schema-run-budget");
    let grammar = dir.join("g.gbnf");
    std::fs::write(
        &grammar,
        "root ::= \"[\" item (\",\" item)* \"]\"\nitem ::= \"\\\"\" [a-z ]* \"\\\"\"\n",
    )
    .unwrap();
    for max in ["8", "16", "30"] {
        let out = run_ok(
            colibri()
                .env("XDG_CACHE_HOME", &dir)
                .args(["run", "--prompt", "List:", "--temp", "1.0", "--seed", "5"])
                .args(["--max-tokens", max, "--grammar"])
                .arg(&grammar),
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{max}: {e}: {text}"));
        let items = v.as_array().unwrap_or_else(|| panic!("{text}"));
        assert!(!items.is_empty(), "{text}");
        for i in items {
            assert!(
                i.as_str()
                    .is_some_and(|s| s.chars().all(|c| c.is_ascii_lowercase() || c == ' ')),
                "{text}"
            );
        }
    }
}
