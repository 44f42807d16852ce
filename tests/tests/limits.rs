//! Resource limits end to end: a payload, grammar or line at the protocol's byte limits and
//! one byte over, 512 mux sessions, a context filled to its maximum. Each is either served
//! or refused up front with the figures, the stream stays in sync, and the daemon's peak RSS
//! (VmHWM, printed for the record) stays inside the `--ram-gb` budget it was started with.

use std::path::PathBuf;

use colibri::engine::Engine;
use colibri::model::LoadOptions;
use colibri_e2e::mux::{data_of, error_of, submit_bytes, MuxDaemon};
use colibri_e2e::{colibri, fixture, temp_dir, Daemon};
use protocol::mux::{ErrorCode, MuxReply, MAX_GRAMMAR_BYTES, MAX_SUBMIT_BYTES};
use protocol::MAX_LINE_BYTES;

const MODEL: &str = "tiny-dense-shared";
/// The budget every daemon here runs under; its peak RSS must stay below it.
const RAM_GB: &str = "6";

fn snap() -> PathBuf {
    fixture(MODEL)
}

/// Peak resident set of a live process, in bytes (`VmHWM` of /proc/<pid>/status).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/<pid>/status");
    kb * 1024
}

/// Prints the case's peak RSS and checks it against the budget.
fn record_peak(case: &str, pid: u32) {
    let peak = peak_rss(pid);
    println!("[limits] {case}: peak RSS {:.1} MB", peak as f64 / 1e6);
    let budget: f64 = RAM_GB.parse().unwrap();
    assert!(
        (peak as f64) < budget * 1e9,
        "{case}: peak RSS {peak} bytes is over the --ram-gb {RAM_GB} budget"
    );
}

fn mux(tag: &str, extra: &[&str]) -> MuxDaemon {
    let state = temp_dir(tag);
    let snap = snap();
    let mut args = vec!["--snap", snap.to_str().unwrap(), "--ram-gb", RAM_GB];
    args.extend_from_slice(extra);
    MuxDaemon::start(&args, &state).0
}

/// `SUBMIT` whose payload is ASCII token ids (`ids=1`), so a prompt has an exact length.
fn submit_ids(id: u64, slot: u32, ids: &[u32], max_tokens: u32) -> Vec<u8> {
    let payload = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ");
    let mut b = format!(
        "SUBMIT {id} {slot} {} {max_tokens} 0 1 0 ids=1\n",
        payload.len()
    )
    .into_bytes();
    b.extend_from_slice(payload.as_bytes());
    b.push(b'\n');
    b
}

fn ids(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 20 + i % 300).collect()
}

/// A good request after the limit cases: it is answered, so the stream is in sync.
fn assert_in_sync(d: &mut MuxDaemon, id: u64) {
    d.submit(id, 0, "Hello there", 3);
    let r = d.until_end_of(id);
    assert!(
        matches!(r.first(), Some(MuxReply::Accept { id: i, .. }) if *i == id),
        "the request after the limit cases is answered: {r:?}"
    );
    assert!(matches!(r.last(), Some(MuxReply::Done { id: i, .. }) if *i == id));
}

fn tokenizer() -> colibri::tokenizer::Tokenizer {
    Engine::open(vec![snap()], LoadOptions::default())
        .unwrap()
        .into_tokenizer()
}

#[test]
fn the_length_bound_never_exceeds_the_real_token_count() {
    let t = tokenizer();
    let texts: [&[u8]; 4] = [
        &text_of(1 << 20),
        &[b'a'; 100_000],
        b"[gMASK]<sop><|user|>hi<|assistant|>",
        "\u{1F600} \u{4E2D}\u{6587} 1234567890 \t\n  spaces".as_bytes(),
    ];
    for text in texts {
        let s = std::str::from_utf8(text).unwrap();
        let bound = t
            .min_tokens(text.len())
            .expect("the fixture's tokenizer is byte-level");
        let real = t.encode(s).unwrap().len();
        assert!(
            bound <= real,
            "{bound} > {real} for {:?}",
            &s[..s.len().min(40)]
        );
    }
}

/// Text of exactly `n` bytes with ordinary words in it.
fn text_of(n: usize) -> Vec<u8> {
    let unit = b"The quick brown fox jumps over the lazy dog. ";
    unit.iter().copied().cycle().take(n).collect()
}

#[test]
fn mux_payload_at_the_limit_is_answered_and_one_byte_over_is_refused_in_sync() {
    let mut d = mux("lim-payload", &["--kv-slots", "2", "--ctx", "64"]);
    let n = MAX_SUBMIT_BYTES as usize;
    // At the limit: refused for the context with the figures, from its length alone (a
    // byte-level tokenizer covers at most its longest token's bytes per token).
    let mut wire = format!("SUBMIT 1 0 {n} 4 0 1\n").into_bytes();
    wire.extend_from_slice(&text_of(n));
    wire.push(b'\n');
    d.send(&wire);
    let r = d.until_end_of(1);
    match error_of(&r, 1) {
        Some(ErrorCode::ContextExceeded { tokens, limit }) => {
            assert_eq!(limit, 62, "CTX 64 - 2");
            // Refused from its length alone: the fewest tokens 16 MiB can be.
            assert_eq!(Some(tokens as usize), tokenizer().min_tokens(n));
            assert!(tokens > limit);
        }
        other => panic!("wanted CONTEXT_EXCEEDED, got {other:?} in {r:?}"),
    }
    // One byte over: refused with id 0 (the header broke a rule), its body discarded.
    let mut wire = format!("SUBMIT 2 0 {} 4 0 1\n", n + 1).into_bytes();
    wire.extend_from_slice(&text_of(n + 1));
    wire.push(b'\n');
    d.send(&wire);
    let r = d.until_end_of(0);
    assert_eq!(error_of(&r, 0), Some(ErrorCode::BadRequest));
    assert_in_sync(&mut d, 3);
    assert!(
        d.stderr()
            .contains("SUBMIT bytes must be an integer in 0..=16777216"),
        "{}",
        d.stderr()
    );
    record_peak("mux payload 16 MiB and 16 MiB + 1", d.child.id());
    assert!(d.finish().0.success());
}

/// A GBNF grammar of exactly `n` bytes: one alternative per word, padded with a comment.
fn grammar_of(n: usize) -> Vec<u8> {
    let mut g = b"root ::= \"Hello\"".to_vec();
    let mut i = 0;
    while g.len() + 40 < n {
        g.extend_from_slice(format!(" | \"w{i}\"").as_bytes());
        i += 1;
    }
    g.extend_from_slice(b"\n#");
    g.resize(n, b'x');
    g
}

#[test]
fn mux_grammar_at_the_limit_is_compiled_or_refused_and_one_byte_over_is_refused_in_sync() {
    let mut d = mux("lim-grammar", &["--kv-slots", "2", "--ctx", "64"]);
    let g = MAX_GRAMMAR_BYTES as usize;
    let prompt = b"Say hello";
    let mut wire = format!("SUBMIT 1 0 {} 3 0 1 {g}\n", prompt.len()).into_bytes();
    wire.extend_from_slice(prompt);
    wire.extend_from_slice(&grammar_of(g));
    wire.push(b'\n');
    d.send(&wire);
    let r = d.until_end_of(1);
    match error_of(&r, 1) {
        // Refused: stderr names the request and why.
        Some(ErrorCode::BadRequest) => {
            assert!(
                d.stderr().contains("[API] rejected SUBMIT 1: "),
                "{}",
                d.stderr()
            )
        }
        None => {
            // Served: every answer is a word of the grammar (or a prefix of one, when cut).
            let text = String::from_utf8(data_of(&r, 1)).unwrap();
            assert!(
                text.is_empty() || "Hello".starts_with(&text) || text.starts_with('w'),
                "{text:?}"
            );
        }
        Some(other) => panic!("{other:?} in {r:?}"),
    }
    // One byte over: refused, its body discarded.
    let mut wire = format!("SUBMIT 2 0 {} 3 0 1 {}\n", prompt.len(), g + 1).into_bytes();
    wire.extend_from_slice(prompt);
    wire.extend_from_slice(&grammar_of(g + 1));
    wire.push(b'\n');
    d.send(&wire);
    let r = d.until_end_of(0);
    assert_eq!(error_of(&r, 0), Some(ErrorCode::BadRequest));
    assert!(d
        .stderr()
        .contains("SUBMIT gbytes must be an integer in 0..=1048576"));
    assert_in_sync(&mut d, 3);
    record_peak("mux grammar 1 MiB and 1 MiB + 1", d.child.id());
    assert!(d.finish().0.success());
}

#[test]
fn mux_line_over_the_limit_is_refused_and_the_next_frame_is_read() {
    let mut d = mux("lim-line", &["--kv-slots", "1", "--ctx", "64"]);
    let mut wire = vec![b'S'; MAX_LINE_BYTES + 1];
    wire.push(b'\n');
    d.send(&wire);
    let r = d.until_end_of(0);
    assert_eq!(error_of(&r, 0), Some(ErrorCode::BadRequest));
    assert_in_sync(&mut d, 1);
    record_peak("mux line 16 MiB + 1", d.child.id());
    assert!(d.finish().0.success());
}

fn legacy(tag: &str) -> Daemon {
    let state = temp_dir(tag);
    let snap = snap();
    let args = [
        "--snap",
        snap.to_str().unwrap(),
        "--ctx",
        "64",
        "--ngen",
        "4",
        "--temp",
        "0",
        "--ram-gb",
        RAM_GB,
    ];
    Daemon::start(&args, &state).0
}

/// STAT fields after the word STAT.
fn stat_fields(stat: &str) -> Vec<String> {
    let mut w = stat.split_whitespace();
    assert_eq!(w.next(), Some("STAT"), "{stat:?}");
    w.map(str::to_string).collect()
}

#[test]
fn legacy_line_and_prompt_at_the_limit_are_answered_and_over_it_refused_in_sync() {
    let mut d = legacy("lim-legacy");
    // A chat line of exactly the longest the decoder waits for: tokenized, then refused
    // for the context (END + zero STAT), stderr giving the figures.
    let mut line = text_of(MAX_LINE_BYTES);
    line.push(b'\n');
    d.send(&line);
    let (_, _, stat) = d.read_turn();
    assert_eq!(stat_fields(&stat)[0], "0", "{stat:?}");
    // The figures are those of the templated turn.
    let templated = MAX_LINE_BYTES + "[gMASK]<sop><|user|><|assistant|><think></think>".len();
    let at_least = tokenizer().min_tokens(templated).unwrap();
    assert!(
        d.stderr().contains(&format!(
            "[API] refused: the prompt is {templated} bytes, so at least {at_least} tokens, the context holds 56 (--ctx 64); not tokenized"
        )),
        "{}",
        d.stderr()
    );
    // One byte longer: refused without buffering it, END + zero STAT.
    let mut line = text_of(MAX_LINE_BYTES + 1);
    line.push(b'\n');
    d.send(&line);
    let (text, _, stat) = d.read_turn();
    assert!(text.is_empty());
    assert_eq!(
        stat_fields(&stat),
        ["0", "0.00", "0.0", &stat_fields(&stat)[3]]
    );
    assert!(d
        .stderr()
        .contains("request line longer than 16777216 bytes"));
    // A PROMPT announcing one byte over 16 MiB: refused; nothing beyond the header is
    // consumed (CONTRACT §3), so the client sends no payload.
    let n = MAX_LINE_BYTES + 1;
    d.send(format!("\x02PROMPT {n} 4 0 1\n").as_bytes());
    let (text, _, stat) = d.read_turn();
    assert!(text.is_empty());
    let f = stat_fields(&stat);
    assert_eq!((f[0].as_str(), f.len()), ("0", 6), "{stat:?}");
    assert!(d
        .stderr()
        .contains("PROMPT byte count is not an integer in 0..=16777216"));
    // In sync: a good prompt is answered.
    let (_, stat) = d.prompt("Hello there", 3, None);
    let f = stat_fields(&stat);
    assert_ne!(
        f[4], "0",
        "the prompt after the limit cases is answered: {stat:?}"
    );
    record_peak(
        "legacy line 16 MiB, 16 MiB + 1, PROMPT 16 MiB + 1",
        d.child.id(),
    );
    assert!(d.finish().success());
}

#[test]
fn five_hundred_twelve_mux_sessions_start_and_serve_slot_511() {
    let mut d = mux("lim-512", &["--kv-slots", "512", "--ctx", "64"]);
    d.send(&submit_bytes(9, 511, "Hello from the last slot", 4));
    let r = d.until_end_of(9);
    assert!(
        matches!(r.first(), Some(MuxReply::Accept { id: 9, .. })),
        "{r:?}"
    );
    assert!(
        matches!(r.last(), Some(MuxReply::Done { id: 9, .. })),
        "{r:?}"
    );
    // One past the last slot is refused.
    d.send(&submit_bytes(10, 512, "Hello", 4));
    assert_eq!(
        error_of(&d.until_end_of(10), 10),
        Some(ErrorCode::BadRequest)
    );
    record_peak("mux 512 sessions, ctx 64", d.child.id());
    assert!(d.finish().0.success());
}

/// `serve --mux` with 512 slots of `ctx` tokens (and `extra`), which must refuse to start:
/// exit 2, nothing on stdout; returns its stderr.
fn refused_512_sessions(tag: &str, ctx: &str, extra: &[&str]) -> String {
    let state = temp_dir(tag);
    let out = colibri()
        .args(["serve", "--mux", "--kv-slots", "512", "--ctx", ctx])
        .args(extra)
        .arg("--snap")
        .arg(snap())
        .arg("--state-dir")
        .arg(&state)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "no READY");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn five_hundred_twelve_sessions_whose_kv_pool_cannot_fit_are_refused_at_start() {
    let err = refused_512_sessions("lim-512-pool", "65536", &["--ram-gb", RAM_GB]);
    assert!(
        err.contains(&format!("--ram-gb {RAM_GB}.00")) && err.contains("KV pool"),
        "the refusal gives the budget and the pool: {err}"
    );
}

#[test]
fn five_hundred_twelve_sessions_too_big_for_the_machine_are_refused_without_ram_gb() {
    // No --ram-gb: the budget comes from MemAvailable, and the refusal says so.
    let err = refused_512_sessions("lim-512-auto", "1048576", &[]);
    assert!(
        err.contains("KV pool")
            && err.contains("no --ram-gb was given")
            && err.contains("MemAvailable"),
        "the refusal gives the pool and where the budget came from: {err}"
    );
}

/// A context wide enough that a 4 MiB prompt is not refused from its length alone, under a
/// 1 GB budget (`COLI_RAM_OVERCOMMIT=1` lets a budget this small start): tokenizing 4 MiB
/// would take more than the budget leaves, so the prompt is refused before it is encoded.
const WIDE_CTX: &str = "400000";
const BIG_PROMPT: usize = 4 << 20;

#[test]
fn mux_prompt_too_big_to_tokenize_inside_the_budget_is_refused_with_the_figures() {
    let state = temp_dir("lim-encode-mux");
    let snap = snap();
    let mut cmd = colibri();
    cmd.env("COLI_RAM_OVERCOMMIT", "1")
        .args(["serve", "--mux", "--snap", snap.to_str().unwrap()])
        .args(["--ram-gb", "1", "--kv-slots", "1", "--ctx", WIDE_CTX]);
    let mut d = MuxDaemon::start_with(&mut cmd, &state).0;
    let mut wire = format!("SUBMIT 1 0 {BIG_PROMPT} 4 0 1\n").into_bytes();
    wire.extend_from_slice(&text_of(BIG_PROMPT));
    wire.push(b'\n');
    d.send(&wire);
    assert_eq!(error_of(&d.until_end_of(1), 1), Some(ErrorCode::BadRequest));
    let err = d.stderr();
    assert!(
        err.contains(&format!(
            "the prompt is {BIG_PROMPT} bytes: tokenizing it takes up to"
        )) && err.contains("1.00 GB RAM budget leaves"),
        "{err}"
    );
    assert_in_sync(&mut d, 2);
    let peak = peak_rss(d.child.id());
    println!(
        "[limits] mux 4 MiB prompt under 1 GB: peak RSS {:.1} MB",
        peak as f64 / 1e6
    );
    assert!(peak < 1_000_000_000, "not tokenized: peak {peak}");
    assert!(d.finish().0.success());
}

#[test]
fn legacy_prompt_too_big_to_tokenize_inside_the_budget_is_refused_with_the_figures() {
    let state = temp_dir("lim-encode-legacy");
    let snap = snap();
    let mut cmd = colibri();
    cmd.env("COLI_RAM_OVERCOMMIT", "1")
        .args(["serve", "--snap", snap.to_str().unwrap()])
        .args([
            "--ram-gb", "1", "--ctx", WIDE_CTX, "--ngen", "4", "--temp", "0",
        ])
        .env("COLI_STATE_DIR", &state);
    let mut d = Daemon::spawn(&mut cmd, state.join("stderr.log")).0;
    let text = String::from_utf8(text_of(BIG_PROMPT)).unwrap();
    let (body, stat) = d.prompt(&text, 4, None);
    assert!(body.is_empty(), "{body:?}");
    assert!(stat_fields(&stat).iter().all(|f| f.parse::<f64>().is_ok()));
    assert!(
        d.stderr()
            .contains("[API] refused: the prompt is 4194304 bytes: tokenizing it takes up to"),
        "{}",
        d.stderr()
    );
    let (body, _) = d.prompt("Hello there", 4, None);
    assert!(!body.is_empty(), "the next prompt is answered");
    let peak = peak_rss(d.child.id());
    assert!(peak < 1_000_000_000, "not tokenized: peak {peak}");
    assert!(d.finish().success());
}

#[test]
fn mux_context_filled_to_its_maximum_works_and_one_token_more_is_refused() {
    let mut d = mux("lim-ctx", &["--kv-slots", "1", "--ctx", "64"]);
    // CTX - 2 is the bound a prompt stays under (upstream's rule): 61 tokens fit and leave
    // room for 2 generated ones, which fills 63 of the 64 positions.
    d.send(&submit_ids(1, 0, &ids(61), 100));
    let r = d.until_end_of(1);
    assert_eq!(
        r[0],
        MuxReply::Accept {
            id: 1,
            prompt_tokens: 61
        }
    );
    let stat = r
        .iter()
        .find_map(|x| match x {
            MuxReply::Done { stat, .. } => Some(stat.clone()),
            _ => None,
        })
        .unwrap();
    assert!(stat.completion_tokens <= 2, "{stat:?}");
    d.send(&submit_ids(2, 0, &ids(62), 100));
    assert_eq!(
        error_of(&d.until_end_of(2), 2),
        Some(ErrorCode::ContextExceeded {
            tokens: 62,
            limit: 62
        })
    );
    record_peak("mux ctx 64 at its maximum", d.child.id());
    assert!(d.finish().0.success());
}

/// Text that the fixture's tokenizer encodes to exactly `n` tokens.
fn text_of_tokens(n: usize) -> String {
    let engine = Engine::open(vec![snap()], LoadOptions::default()).unwrap();
    let count = |s: &str| engine.tokenizer().encode(s).unwrap().len();
    for unit in [" a", " the", " x", "a ", "1 ", " Hello"] {
        for k in 1..=n {
            let s = unit.repeat(k);
            match count(&s).cmp(&n) {
                std::cmp::Ordering::Equal => return s,
                std::cmp::Ordering::Greater => break,
                std::cmp::Ordering::Less => {}
            }
        }
    }
    panic!("no text of {n} tokens found");
}

#[test]
fn legacy_context_filled_to_its_maximum_works_and_one_token_more_is_refused() {
    let mut d = legacy("lim-legacy-ctx");
    // --ctx 64 holds a prompt of 62 tokens (CTX - 2), leaving one to generate.
    let (_, stat) = d.prompt(&text_of_tokens(62), 10, None);
    let f = stat_fields(&stat);
    assert_eq!(f[4], "62", "{stat:?}");
    assert!(f[0] == "0" || f[0] == "1", "{stat:?}");
    let (text, stat) = d.prompt(&text_of_tokens(63), 10, None);
    assert!(text.is_empty());
    assert_eq!(stat_fields(&stat)[0], "0");
    assert!(
        d.stderr()
            .contains("[API] refused: the prompt is 63 tokens, the context holds 62 (--ctx 64)"),
        "{}",
        d.stderr()
    );
    record_peak("legacy ctx 64 at its maximum", d.child.id());
    assert!(d.finish().success());
}

#[test]
fn mux_impossible_byte_count_is_refused_at_once_and_the_next_line_is_answered() {
    let mut d = mux("lim-impossible", &["--kv-slots", "2", "--ctx", "64"]);
    // No body follows: the count is beyond anything the daemon would wait for or discard,
    // so the very next line must be read as a frame.
    d.send(b"SUBMIT 2 0 99999999999999 8 0 1\n");
    let r = d.until_end_of(0);
    assert_eq!(error_of(&r, 0), Some(ErrorCode::BadRequest));
    assert_in_sync(&mut d, 3);
    assert!(
        !d.stderr().contains("discarding the"),
        "nothing is discarded: {}",
        d.stderr()
    );
    assert!(d.finish().0.success());
}
