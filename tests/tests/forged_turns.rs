//! Forged turns (issue 45, item 7): special tokens written inside a message's content
//! (`<|user|>`, `<|assistant|>`, `<|im_end|>`, `<|endoftext|>`) are text, through every chat
//! front: `colibri api` (OpenAI and Anthropic chat), `colibri run` and `serve` chat lines. The
//! prompt is token for token what transformers gives with `split_special_tokens` for the
//! content (tests/fixtures/forged_turns.json, from scripts/forged_turns_ref.py), and the answer
//! is the model's answer to those ids. Raw prompts (`/v1/completions`, `run --raw`,
//! `\x02PROMPT`) still read special tokens as control tokens: the client owns those bytes.

use std::path::{Path, PathBuf};

use colibri_e2e::http::ApiServer;
use colibri_e2e::{colibri, fixture, root, run_ok, temp_dir, Daemon};
use serde_json::{json, Value};

/// One conversation of the reference file: its messages, the rendering, the ids with content
/// as text (`ids`) and the ids the rendering gives read whole (`forged`, the old behaviour).
struct Reference {
    messages: Value,
    rendered: String,
    ids: Vec<u32>,
    forged: Vec<u32>,
}

fn reference(name: &str) -> Reference {
    let text = std::fs::read_to_string(fixture("forged_turns.json")).unwrap();
    let all: Value = serde_json::from_str(&text).unwrap();
    let c = all["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no case {name}"));
    let ids = |k: &str| serde_json::from_value(c[k].clone()).unwrap();
    Reference {
        messages: c["messages"].clone(),
        rendered: c["rendered"].as_str().unwrap().to_string(),
        ids: ids("ids"),
        forged: ids("forged"),
    }
}

/// The model in the binary (`colibri` with no `--snap`): the same files.
fn demo_dir() -> PathBuf {
    root().join("daemon").join("demo")
}

/// What a fresh greedy engine on `snap` answers to the prompt `ids`, in process.
fn greedy(snap: &Path, ids: &[u32], max_new: usize) -> Vec<u8> {
    colibri_e2e::greedy_answer_ids(snap, ids, max_new).1
}

fn chat(s: &ApiServer, messages: &Value, max_tokens: u32) -> Value {
    let r = s.post(
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": max_tokens, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn content(v: &Value) -> &str {
    v.pointer("/choices/0/message/content")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no content in {v}"))
}

fn prompt_tokens(v: &Value) -> usize {
    v["usage"]["prompt_tokens"].as_u64().unwrap() as usize
}

/// The raw completion of `rendered`: its special tokens are control tokens.
fn raw_prompt_tokens(s: &ApiServer, rendered: &str) -> usize {
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": rendered, "max_tokens": 1, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    prompt_tokens(&r.json())
}

#[test]
fn api_chat_content_cannot_end_its_turn() {
    let s = ApiServer::start("forged-api", &[]);
    for name in [
        "glm_user_forges_an_answer",
        "glm_content_is_one_special",
        "glm_tool_result",
    ] {
        let r = reference(name);
        let v = chat(&s, &r.messages, 8);
        // The prompt is transformers' ids for the content as text, and the answer is the
        // model's answer to exactly those ids.
        assert_eq!(prompt_tokens(&v), r.ids.len(), "{name}: {v}");
        assert_eq!(
            content(&v),
            String::from_utf8_lossy(&greedy(&demo_dir(), &r.ids, 8)),
            "{name}"
        );
        // The same text as a raw completion reads the content's tokens as turns.
        assert_eq!(raw_prompt_tokens(&s, &r.rendered), r.forged.len(), "{name}");
        assert_ne!(r.ids.len(), r.forged.len());
    }
    // Anthropic's messages take the same path.
    let r = reference("glm_user_forges_an_answer");
    let m = s.post(
        "/v1/messages",
        &json!({"model": "colibri-demo", "max_tokens": 4, "temperature": 0,
                "messages": r.messages}),
    );
    assert_eq!(m.status, 200, "{}", m.text());
    // Anthropic's input_tokens leave out the prompt tokens read from the cache.
    let u = &m.json()["usage"];
    assert_eq!(
        u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap(),
        r.ids.len() as u64,
        "{u}"
    );
    // A conversation with content specials still reuses its cache: the second request,
    // the first's history and a new turn, prefills only its tail.
    let first = chat(&s, &r.messages, 6);
    let mut messages = r.messages.as_array().unwrap().clone();
    messages.push(json!({"role": "assistant", "content": content(&first)}));
    messages.push(json!({"role": "user", "content": "And <|user|> then?"}));
    let next = chat(&s, &Value::Array(messages), 4);
    let cached = next["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap() as usize;
    assert!(cached >= r.ids.len(), "{next}");
}

#[test]
fn api_chatml_content_cannot_end_its_turn() {
    let snap = fixture("tiny-qwen3-moe");
    for (think, names) in [
        (
            false,
            &["chatml_user_forges_an_answer", "chatml_one_line"][..],
        ),
        (true, &["chatml_every_role", "chatml_tool_result"][..]),
    ] {
        let mut args = vec!["--snap", snap.to_str().unwrap()];
        if think {
            args.push("--think");
        }
        let s = ApiServer::start("forged-api-qwen", &args);
        for name in names {
            let r = reference(name);
            let v = chat(&s, &r.messages, 8);
            assert_eq!(prompt_tokens(&v), r.ids.len(), "{name}: {v}");
            // The API's text is the answer's bytes read lossily (this model's answers are
            // not all UTF-8).
            assert_eq!(
                content(&v),
                String::from_utf8_lossy(&greedy(&snap, &r.ids, 8)),
                "{name}"
            );
            assert_eq!(raw_prompt_tokens(&s, &r.rendered), r.forged.len(), "{name}");
        }
    }
}

/// `[run] N prompt + ...`: N.
fn run_prompt_tokens(stderr: &str) -> usize {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("[run] ") && l.contains(" prompt + "))
        .unwrap_or_else(|| panic!("no summary in {stderr}"));
    line["[run] ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn run_reads_a_prompts_special_tokens_as_text_unless_raw() {
    let home = temp_dir("forged-run");
    let r = reference("glm_user_forges_an_answer");
    let text = r.messages[0]["content"].as_str().unwrap();
    let run = |args: &[&str]| {
        let out = run_ok(
            colibri()
                .env("XDG_CACHE_HOME", &home)
                .args(["run", "--temp", "0", "--max-tokens", "8"])
                .args(args),
        );
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.stdout, run_prompt_tokens(&err))
    };
    let (answer, n) = run(&["--prompt", text]);
    assert_eq!(n, r.ids.len());
    assert_eq!(answer, greedy(&demo_dir(), &r.ids, 8));
    // --raw: the bytes are the client's, special tokens included.
    let (raw, n) = run(&["--raw", "--prompt", &r.rendered]);
    assert_eq!(n, r.forged.len());
    assert_eq!(raw, greedy(&demo_dir(), &r.forged, 8));
}

/// A STAT line's prompt tokens (the fifth of six fields).
fn stat_prompt_tokens(stat: &str) -> usize {
    let f: Vec<&str> = stat.trim_end().split(' ').collect();
    assert_eq!(f.len(), 7, "{stat:?}");
    f[5].parse().unwrap()
}

#[test]
fn serve_chat_lines_read_special_tokens_as_text_raw_prompts_as_control() {
    let snap = fixture("tiny-qwen3-moe");
    let state = temp_dir("forged-serve");
    let (mut d, _) = Daemon::start(
        &[
            "--snap",
            snap.to_str().unwrap(),
            "--ctx",
            "512",
            "--ngen",
            "8",
            "--temp",
            "0",
            "--kv-save",
            "0",
        ],
        &state,
    );
    let r = reference("chatml_one_line");
    let line = r.messages[0]["content"].as_str().unwrap();
    d.send(format!("{line}\n").as_bytes());
    let (answer, _, stat) = d.read_turn();
    assert_eq!(stat_prompt_tokens(&stat), r.ids.len(), "{stat}");
    // A chat turn's answer ends with the newline before END.
    let mut expected = greedy(&snap, &r.ids, 8);
    expected.push(b'\n');
    assert_eq!(answer, expected);
    // The same rendering as a raw prompt: the client's control tokens.
    d.send(b"\x02RESET\n");
    d.read_turn();
    let (raw, stat) = d.prompt(&r.rendered, 8, None);
    assert_eq!(stat_prompt_tokens(&stat), r.forged.len(), "{stat}");
    assert_eq!(raw, greedy(&snap, &r.forged, 8));
    assert!(d.finish().success());
}
