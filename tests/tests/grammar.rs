//! Grammar-constrained output end to end: `run --grammar` / `--json-schema` on the bundled
//! demo model and a tiny fixture, and SUBMIT with `gbytes` in mux mode. Every output is
//! checked by an independent parser (serde_json, or the pattern written out by hand), never
//! by the engine's own matcher.

use std::path::{Path, PathBuf};

use colibri_e2e::mux::MuxDaemon;
use colibri_e2e::{colibri, fixture, run_ok, temp_dir};
use protocol::mux::{ErrorCode, MuxReply};

/// Every field bounded, so the sentence always completes well within the token limit.
const SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 10},
    "greek": {"enum": ["αβγ", "δέλτα"]},
    "count": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
    "ok": {"type": "boolean"}
  },
  "required": ["name", "greek", "count", "ok"]
}"#;

/// `«` then 1 to 8 Greek small letters then `»`: multi-byte characters only.
const GREEK: &str = "root ::= \"«\" [α-ω]{1,8} \"»\"\n";

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// Checks an output against SCHEMA with serde_json.
fn check_schema_output(out: &[u8]) {
    let text = std::str::from_utf8(out).unwrap_or_else(|e| panic!("not UTF-8 ({e}): {out:?}"));
    let v: serde_json::Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {text}"));
    assert!(
        o["name"].as_str().is_some_and(|s| s.chars().count() <= 10),
        "{text}"
    );
    assert!(
        ["αβγ", "δέλτα"].contains(&o["greek"].as_str().unwrap()),
        "{text}"
    );
    assert!(o["count"].is_i64() || o["count"].is_u64(), "{text}");
    assert!(o["ok"].is_boolean(), "{text}");
    if let Some(t) = o.get("tags") {
        let t = t.as_array().unwrap();
        assert!(
            t.len() <= 3 && t.iter().all(|x| x.as_str().is_some()),
            "{text}"
        );
    }
    for k in o.keys() {
        assert!(
            ["name", "greek", "count", "tags", "ok"].contains(&k.as_str()),
            "{text}"
        );
    }
}

fn check_greek(out: &[u8]) {
    let text = std::str::from_utf8(out).unwrap_or_else(|e| panic!("not UTF-8 ({e}): {out:?}"));
    let inner = text
        .strip_prefix('«')
        .and_then(|t| t.strip_suffix('»'))
        .unwrap_or_else(|| panic!("not «...»: {text}"));
    let n = inner.chars().count();
    assert!((1..=8).contains(&n), "{text}");
    assert!(inner.chars().all(|c| ('α'..='ω').contains(&c)), "{text}");
}

fn demo_run(home: &Path, extra: &[&str]) -> std::process::Output {
    run_ok(
        colibri()
            .env("XDG_CACHE_HOME", home)
            .args(["run", "--prompt", "Answer:"])
            .args(extra),
    )
}

#[test]
fn json_schema_output_parses_on_the_demo_model() {
    let dir = temp_dir("gram-demo");
    let schema = write(&dir, "schema.json", SCHEMA);
    let schema = schema.to_str().unwrap();
    for (temp, seed) in [("0", "1"), ("1.0", "1"), ("1.0", "2"), ("1.5", "3")] {
        let out = demo_run(
            &dir,
            &[
                "--json-schema",
                schema,
                "--max-tokens",
                "400",
                "--temp",
                temp,
                "--seed",
                seed,
            ],
        );
        check_schema_output(&out.stdout);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("sentence complete"), "{err}");
    }
}

#[test]
fn gbnf_output_matches_on_the_demo_model_and_a_tiny_fixture() {
    let dir = temp_dir("gram-gbnf");
    let g = write(&dir, "greek.gbnf", GREEK);
    for seed in ["1", "2", "3"] {
        let out = demo_run(
            &dir,
            &[
                "--grammar",
                g.to_str().unwrap(),
                "--max-tokens",
                "64",
                "--temp",
                "1",
                "--seed",
                seed,
            ],
        );
        check_greek(&out.stdout);
    }
    let out = run_ok(
        colibri()
            .args([
                "run",
                "--raw",
                "--prompt",
                "[gMASK]<sop><|user|>Hi<|assistant|>",
            ])
            .args([
                "--temp",
                "0.9",
                "--seed",
                "5",
                "--max-tokens",
                "64",
                "--grammar",
            ])
            .arg(&g)
            .arg("--snap")
            .arg(fixture("tiny-dense-shared"))
            .arg("--state-dir")
            .arg(&dir),
    );
    check_greek(&out.stdout);
}

#[test]
fn a_bad_grammar_is_refused_with_its_position() {
    let dir = temp_dir("gram-bad");
    let g = write(&dir, "bad.gbnf", "root ::= item+\nitem ::= \"a\" | [b-\n");
    let out = colibri()
        .env("XDG_CACHE_HOME", &dir)
        .args(["run", "--prompt", "x", "--grammar"])
        .arg(&g)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.gbnf") && err.contains("line 2, column 16"),
        "{err}"
    );
    assert!(out.stdout.is_empty());

    let s = write(
        &dir,
        "bad.json",
        // A look-behind: no pattern the grammar can bound.
        "{\"type\": \"object\",\n \"properties\": {\"a\": {\"pattern\": \"(?<=a)x\"}}}",
    );
    let out = colibri()
        .env("XDG_CACHE_HOME", &dir)
        .args(["run", "--prompt", "x", "--json-schema"])
        .arg(&s)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("$.properties.a.pattern"), "{err}");
}

/// `SUBMIT <id> 0 <bytes> <max> <temp> 1 <gbytes>\n<prompt><grammar>\n`.
fn submit_with_grammar(id: u64, prompt: &str, max: u32, temp: &str, grammar: &str) -> Vec<u8> {
    let mut b = format!(
        "SUBMIT {id} 0 {} {max} {temp} 1 {}\n",
        prompt.len(),
        grammar.len()
    )
    .into_bytes();
    b.extend_from_slice(prompt.as_bytes());
    b.extend_from_slice(grammar.as_bytes());
    b.push(b'\n');
    b
}

fn data(replies: &[MuxReply], id: u64) -> Vec<u8> {
    colibri_e2e::mux::data_of(replies, id)
}

fn done(replies: &[MuxReply], id: u64) -> bool {
    replies
        .iter()
        .any(|r| matches!(r, MuxReply::Done { id: i, .. } if *i == id))
}

#[test]
fn mux_submit_with_gbytes_constrains_each_request() {
    let state = temp_dir("gram-mux");
    let snap = fixture("tiny-dense-shared");
    let (mut d, _) = MuxDaemon::start(
        &["--snap", snap.to_str().unwrap(), "--kv-slots", "2"],
        &state,
    );
    let prompt = "[gMASK]<sop><|user|>Hi<|assistant|>";
    d.send(&submit_with_grammar(1, prompt, 400, "0", SCHEMA));
    let r = d.until_end_of(1);
    assert!(done(&r, 1), "{r:?}");
    check_schema_output(&data(&r, 1));

    d.send(&submit_with_grammar(2, prompt, 400, "1.2", SCHEMA));
    let r = d.until_end_of(2);
    check_schema_output(&data(&r, 2));

    d.send(&submit_with_grammar(3, prompt, 64, "1", GREEK));
    let r = d.until_end_of(3);
    check_greek(&data(&r, 3));

    // A bad grammar: ERROR before ACCEPT, the position on stderr, and the stream goes on.
    d.send(&submit_with_grammar(
        4,
        prompt,
        8,
        "0",
        "root ::= \"a\" (\"b\"\n",
    ));
    let r = d.until_end_of(4);
    assert!(
        r.iter().any(|x| matches!(
            x,
            MuxReply::Error {
                id: 4,
                code: ErrorCode::BadRequest
            }
        )),
        "{r:?}"
    );
    assert!(
        !r.iter()
            .any(|x| matches!(x, MuxReply::Accept { id: 4, .. })),
        "{r:?}"
    );
    let err = d.stderr();
    assert!(
        err.contains("SUBMIT 4")
            && err.contains("line 2, column 1")
            && err.contains("opened at line 1, column 14"),
        "{err}"
    );

    // Unconstrained afterwards: the grammar belonged to its request only.
    d.submit(5, 0, prompt, 4);
    let r = d.until_end_of(5);
    assert!(done(&r, 5), "{r:?}");
    d.kill9();
}

/// With speculative decoding on, a constrained session drafts the spans its grammar forces
/// (the JSON keys and punctuation) and checks each verify row under the grammar's mask: the
/// output parses and, greedy, is the same as with drafts off.
#[test]
fn json_schema_output_is_the_same_with_forced_span_drafts() {
    let dir = temp_dir("gram-draft");
    let schema = write(&dir, "schema.json", SCHEMA);
    let schema = schema.to_str().unwrap();
    let base = [
        "--json-schema",
        schema,
        "--max-tokens",
        "400",
        "--temp",
        "0",
    ];
    let off = demo_run(&dir, &base);
    let on = demo_run(&dir, &[&base[..], &["--draft", "3"]].concat());
    check_schema_output(&on.stdout);
    assert_eq!(
        String::from_utf8_lossy(&on.stdout),
        String::from_utf8_lossy(&off.stdout)
    );
    let err = String::from_utf8_lossy(&on.stderr);
    let line = err
        .lines()
        .find(|l| l.starts_with("[grammar]"))
        .unwrap_or_else(|| panic!("{err}"));
    let field = |key: &str| -> u64 {
        let at = line.find(key).unwrap_or_else(|| panic!("{line}")) + key.len();
        line[at..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let (proposed, accepted) = (field("forced-span drafts "), field(" accepted "));
    assert!(
        proposed > 0 && accepted > 0 && accepted <= proposed,
        "{line}"
    );
}

/// The GRAMMAR lines of a telemetry log, in order.
fn grammar_lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("GRAMMAR "))
        .map(String::from)
        .collect()
}

/// A constrained mux request that `max_tokens` cuts short gets `GRAMMAR <id> incomplete` on
/// the telemetry fd before its DONE (its output does not parse); one that finishes its
/// sentence gets `GRAMMAR <id> complete`; an unconstrained one gets no GRAMMAR line; stdout
/// never carries one.
#[test]
fn mux_reports_a_grammar_answer_cut_short_on_the_telemetry_fd() {
    let state = temp_dir("gram-mux-end");
    let tel = state.join("telemetry.log");
    let snap = fixture("tiny-dense-shared");
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg("exec \"$0\" serve --mux --snap \"$1\" --telemetry-fd 3 3>\"$2\"")
        .arg(colibri_e2e::bin("colibri"))
        .arg(&snap)
        .arg(&tel);
    let (mut d, _) = MuxDaemon::start_with(&mut cmd, &state);
    let prompt = "[gMASK]<sop><|user|>Hi<|assistant|>";

    // Three tokens cannot hold the schema's four required keys.
    d.send(&submit_with_grammar(1, prompt, 3, "0", SCHEMA));
    let r = d.until_end_of(1);
    assert!(done(&r, 1), "{r:?}");
    let cut = data(&r, 1);
    assert!(
        serde_json::from_slice::<serde_json::Value>(&cut).is_err(),
        "{}",
        String::from_utf8_lossy(&cut)
    );
    // Written before DONE: it is in the log once DONE has come.
    assert_eq!(grammar_lines(&tel), ["GRAMMAR 1 incomplete"]);

    d.send(&submit_with_grammar(2, prompt, 400, "0", SCHEMA));
    let r = d.until_end_of(2);
    check_schema_output(&data(&r, 2));
    assert_eq!(
        grammar_lines(&tel),
        ["GRAMMAR 1 incomplete", "GRAMMAR 2 complete"]
    );

    d.submit(3, 0, prompt, 4);
    let r = d.until_end_of(3);
    assert!(done(&r, 3), "{r:?}");
    assert!(
        !d.raw.windows(8).any(|w| w == b"GRAMMAR "),
        "GRAMMAR is ours: never on stdout"
    );
    let (status, _) = d.finish();
    assert!(status.success());
    assert_eq!(
        grammar_lines(&tel),
        ["GRAMMAR 1 incomplete", "GRAMMAR 2 complete"]
    );
}
