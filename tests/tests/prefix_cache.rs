//! The prefix cache (`--prefix-cache-gb`) end to end over `colibri api`: a long system prompt
//! two conversations shared is kept under the state folder, a later conversation (and the
//! first after a kill -9 and restart) adopts it from there and answers exactly as a full
//! prefill does; a damaged entry is rebuilt with one log line; another client never adopts
//! it; the size bound evicts the least recently used; 0 turns it off. On the demo model
//! (MLA with the indexer), tiny-qwen3-moe (grouped-query attention) and tiny-deepseek-v3 (MLA).

use std::path::{Path, PathBuf};

use colibri_e2e::http::ApiServer;
use colibri_e2e::{fixture, temp_dir};
use serde_json::{json, Value};

/// A system prompt and tool list of a few hundred tokens.
fn system_prompt(flavour: &str) -> String {
    let mut s = format!("You are {flavour}, a careful assistant. Answer briefly. Tools:\n");
    for i in 0..24 {
        s.push_str(&format!(
            "- tool_{i}: looks up record {i} in the {flavour} archive and returns its fields.\n"
        ));
    }
    s
}

fn convo(system: &str, user: &str, who: Option<&str>) -> Value {
    let mut v = json!({"messages": [{"role": "system", "content": system},
                                    {"role": "user", "content": user}],
                       "max_tokens": 12, "temperature": 0});
    if let Some(u) = who {
        v["user"] = json!(u);
    }
    v
}

struct Answer {
    text: String,
    prompt: u64,
    cached: u64,
}

fn ask(s: &ApiServer, body: &Value) -> Answer {
    let r = s.post("/v1/chat/completions", body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    Answer {
        text: v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_else(|| panic!("no content in {v}"))
            .to_string(),
        prompt: v["usage"]["prompt_tokens"].as_u64().unwrap(),
        cached: v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
    }
}

fn count(log: &str, what: &str) -> usize {
    log.lines().filter(|l| l.contains(what)).count()
}

/// Waits until stderr has `n` lines with `what` (they may trail the response), then checks
/// there are exactly `n`.
fn seen(s: &ApiServer, what: &str, n: usize) {
    s.wait_for(what, |s| count(&s.stderr(), what) >= n);
    assert_eq!(count(&s.stderr(), what), n, "{}", s.stderr());
}

fn entries(state: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(state.join("prefix"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

fn with_snap<'a>(snap: &'a Option<String>, args: &[&'a str]) -> Vec<&'a str> {
    let mut v = args.to_vec();
    if let Some(s) = snap {
        v.extend(["--snap", s.as_str()]);
    }
    v
}

/// Answers by full prefill: no prefix cache, no sharing between slots, each conversation on
/// an empty slot.
fn reference(snap: &Option<String>, bodies: &[&Value]) -> Vec<String> {
    let args = with_snap(
        snap,
        &[
            "--prefix-cache-gb",
            "0",
            "--kv-share",
            "0",
            "--kv-save",
            "0",
            "--kv-slots",
            "8",
        ],
    );
    let s = ApiServer::start("prefix-ref", &args);
    bodies.iter().map(|b| ask(&s, b).text).collect()
}

const CACHE: [&str; 6] = [
    "--kv-save",
    "0",
    "--kv-slots",
    "4",
    "--prefix-cache-min-tokens",
    "64",
];

/// Two conversations share the system prompt: the second writes it as an entry; after a
/// kill -9 a new conversation adopts it from disk and answers as a full prefill does.
fn survives_a_restart(snap: Option<String>, tag: &str) -> (PathBuf, Vec<String>) {
    let sys = system_prompt("Ada");
    let a = convo(&sys, "What is record 3?", None);
    let b = convo(&sys, "Which tool reads record 7?", None);
    let c = convo(&sys, "Name two tools.", None);
    let want = reference(&snap, &[&a, &b, &c]);
    let state = temp_dir(tag);
    let args = with_snap(&snap, &CACHE);
    let s = ApiServer::start_in(&state, &args);
    let ra = ask(&s, &a);
    assert_eq!(ra.text, want[0]);
    assert_eq!(ra.cached, 0);
    let rb = ask(&s, &b);
    assert_eq!(
        rb.text, want[1],
        "the second conversation answers as a prefill"
    );
    assert!(
        rb.cached >= 64 && rb.cached < rb.prompt,
        "the shared system prompt is reused: {} of {}",
        rb.cached,
        rb.prompt
    );
    seen(&s, "prefix cache: wrote", 1);
    assert_eq!(entries(&state).len(), 1, "{:?}", entries(&state));
    drop(s); // SIGKILL
    let s = ApiServer::start_in(&state, &args);
    let rc = ask(&s, &c);
    assert_eq!(
        rc.text, want[2],
        "the adopting conversation answers as a prefill"
    );
    seen(&s, "prefix cache: adopted", 1);
    let log = s.stderr();
    // Its cached tokens are the entry's: the system prompt's (the part the first two shared).
    assert!(
        rc.cached >= 64 && rc.cached < rc.prompt,
        "{} of {}",
        rc.cached,
        rc.prompt
    );
    assert_eq!(count(&log, "prefix cache: wrote"), 0, "{log}");
    (state, want)
}

#[test]
fn demo_prefix_survives_a_restart_is_rebuilt_when_damaged_and_stays_with_its_tenant() {
    let (state, _) = survives_a_restart(None, "prefix-demo");
    let sys = system_prompt("Ada");
    let d = convo(&sys, "Is tool_5 read-only?", None);
    let mallory = convo(&sys, "Is tool_5 read-only?", Some("mallory"));
    let want = reference(&None, &[&d, &mallory]);
    assert_eq!(want[0], want[1], "the answer does not depend on the user");

    // A byte flipped inside a record: one line, a full prefill, the right answer, and the
    // entry written anew from that prefill.
    let entry = entries(&state).pop().expect("an entry");
    let mut bytes = std::fs::read(&entry).unwrap();
    // The last value of the last record (its checksum is the 4 bytes after it).
    let at = bytes.len() - 5;
    bytes[at] ^= 0x40;
    std::fs::write(&entry, &bytes).unwrap();
    let s = ApiServer::start_in(&state, &CACHE);
    let r = ask(&s, &d);
    assert_eq!(r.text, want[0]);
    assert_eq!(r.cached, 0, "nothing adopted from a damaged entry");
    seen(&s, "prefix cache: entry", 1);
    seen(&s, "is damaged", 1);
    seen(&s, "prefix cache: wrote", 1);
    let rebuilt = entries(&state);
    assert_eq!(rebuilt.len(), 1, "{rebuilt:?}");
    assert_ne!(std::fs::read(&rebuilt[0]).unwrap(), bytes, "rewritten");

    // Another client (its own `user`) adopts nothing, neither from disk nor from a slot.
    let m = ask(&s, &mallory);
    assert_eq!(m.text, want[1]);
    assert_eq!(m.cached, 0, "another tenant's prefix is never reused");
    assert_eq!(count(&s.stderr(), "prefix cache: adopted"), 0);
    drop(s);
    let s = ApiServer::start_in(&state, &CACHE);
    let m = ask(&s, &mallory);
    assert_eq!(m.cached, 0, "nor after a restart");
    assert_eq!(count(&s.stderr(), "prefix cache: adopted"), 0);
    // The owner still does.
    assert!(ask(&s, &d).cached >= 64);
    seen(&s, "prefix cache: adopted", 1);
}

#[test]
fn demo_size_bound_evicts_the_least_recently_used_and_zero_is_off() {
    // One entry's size first.
    let state = temp_dir("prefix-bound");
    let s = ApiServer::start_in(&state, &CACHE);
    let one = system_prompt("Bea");
    ask(&s, &convo(&one, "Hello", None));
    ask(&s, &convo(&one, "Goodbye", None));
    drop(s);
    let first = entries(&state);
    assert_eq!(first.len(), 1);
    let size = std::fs::metadata(&first[0]).unwrap().len();
    // Room for one entry and a half: a second evicts the first.
    let gb = format!("{}", size as f64 * 1.5 / 1e9);
    let mut args = CACHE.to_vec();
    args.extend(["--prefix-cache-gb", gb.as_str()]);
    let s = ApiServer::start_in(&state, &args);
    let two = system_prompt("Cleo");
    ask(&s, &convo(&two, "Hello", None));
    ask(&s, &convo(&two, "Goodbye", None));
    seen(&s, "prefix cache: evicted", 1);
    let left = entries(&state);
    assert_eq!(left.len(), 1, "{left:?}");
    assert_ne!(left, first, "the older entry went");
    drop(s);

    // --prefix-cache-gb 0: nothing written or adopted, slots still share in memory.
    let state = temp_dir("prefix-off");
    let mut args = CACHE.to_vec();
    args.extend(["--prefix-cache-gb", "0"]);
    let s = ApiServer::start_in(&state, &args);
    ask(&s, &convo(&one, "Hello", None));
    assert!(ask(&s, &convo(&one, "Goodbye", None)).cached >= 64);
    assert_eq!(count(&s.stderr(), "prefix cache"), 0, "{}", s.stderr());
    drop(s);
    assert!(entries(&state).is_empty());
    let s = ApiServer::start_in(&state, &args);
    assert_eq!(ask(&s, &convo(&one, "Thanks", None)).cached, 0);
}

#[test]
fn qwen3_moe_gqa_prefix_survives_a_restart() {
    let snap = fixture("tiny-qwen3-moe").to_string_lossy().into_owned();
    survives_a_restart(Some(snap), "prefix-qwen");
}

#[test]
fn deepseek_v3_mla_prefix_survives_a_restart() {
    let snap = fixture("tiny-deepseek-v3").to_string_lossy().into_owned();
    survives_a_restart(Some(snap), "prefix-dsv3");
}
