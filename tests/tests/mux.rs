//! The multiplexed protocol end to end (`colibri serve --mux`, and upstream's `SERVE=1
//! SERVE_BATCH=1` launch): byte transcripts of every frame and every ERROR code, each bad
//! frame followed by a good request; sessions submitted together answering exactly as each
//! alone; STOP and CANCEL mid-generation; a long prefill interleaved with another stream;
//! kill -9 with sessions active and the resume.

use std::path::PathBuf;

use colibri::engine::Engine;
use colibri::model::LoadOptions;
use colibri_e2e::mux::{data_of, error_of, submit_bytes, MuxDaemon};
use colibri_e2e::{colibri, fixture, greedy_answer, temp_dir};
use protocol::mux::{ErrorCode, MuxReply};
use protocol::Telemetry;

const MODEL: &str = "tiny-dense-shared";

fn snap() -> PathBuf {
    fixture(MODEL)
}

fn start(tag: &str, extra: &[&str]) -> (MuxDaemon, Vec<MuxReply>, PathBuf) {
    let state = temp_dir(tag);
    let snap = snap();
    let mut args = vec!["--snap", snap.to_str().unwrap(), "--kv-slots", "4"];
    args.extend_from_slice(extra);
    let (d, startup) = MuxDaemon::start(&args, &state);
    (d, startup, state)
}

/// What a fresh greedy engine answers to `prompt` (raw) with mux's stop set.
fn expected(prompt: &str, max_new: usize) -> (Vec<u32>, Vec<u8>) {
    greedy_answer(&snap(), prompt, max_new, true)
}

fn prompt_tokens(prompt: &str) -> usize {
    let engine = Engine::open(vec![snap()], LoadOptions::default()).unwrap();
    engine.tokenizer().encode(prompt).unwrap().len()
}

fn chat(text: &str) -> String {
    format!("[gMASK]<sop><|user|>{text}<|assistant|><think></think>")
}

fn done_stat(replies: &[MuxReply], id: u64) -> protocol::Stat {
    replies
        .iter()
        .find_map(|r| match r {
            MuxReply::Done { id: i, stat } if *i == id => Some(stat.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no DONE {id} in {replies:?}"))
}

#[test]
fn startup_and_one_request_byte_for_byte() {
    let (mut d, startup, _) = start("one", &[]);
    assert_eq!(startup[0], MuxReply::Ready);
    assert!(
        matches!(&startup[1], MuxReply::Stat(s) if s.completion_tokens == 0 && s.prompt.is_none())
    );
    assert!(matches!(
        startup[2],
        MuxReply::Telemetry(Telemetry::HwInfo(_))
    ));
    assert!(matches!(
        startup[3],
        MuxReply::Telemetry(Telemetry::Tiers(_))
    ));
    assert!(matches!(
        startup[4],
        MuxReply::Telemetry(Telemetry::Emap(_))
    ));
    // The exact startup bytes: READY, then a 4-field zero STAT.
    assert!(
        d.raw
            .starts_with(b"\x01\x01READY\x01\x01\nSTAT 0 0.00 0.0 "),
        "{:?}",
        String::from_utf8_lossy(&d.raw)
    );
    let p = chat("Tell me about birds.");
    let n = prompt_tokens(&p);
    let start_at = d.raw.len();
    d.submit(7, 0, &p, 12);
    let replies = d.until_end_of(7);
    assert_eq!(
        replies[0],
        MuxReply::Accept {
            id: 7,
            prompt_tokens: n as u64
        }
    );
    let (ids, want) = expected(&p, 12);
    assert_eq!(
        data_of(&replies, 7),
        want,
        "the streamed text is the greedy answer"
    );
    let stat = done_stat(&replies, 7);
    assert_eq!(stat.completion_tokens as usize, ids.len());
    assert_eq!(stat.prompt, Some((n as u32, ids.len() == 12)));
    // The telemetry block before DONE, in upstream's order.
    let kinds: Vec<&str> = replies
        .iter()
        .filter_map(|r| match r {
            MuxReply::Telemetry(t) => t.kind(),
            _ => None,
        })
        .collect();
    assert_eq!(kinds, ["HWINFO", "TIERS", "EMAP", "HITS", "PROF"]);
    assert!(matches!(replies.last(), Some(MuxReply::Done { id: 7, .. })));
    // Byte for byte: ACCEPT, the DATA frames, the DONE line's shape.
    let tail = &d.raw[start_at..];
    let text = String::from_utf8_lossy(tail);
    assert!(
        text.starts_with(&format!("ACCEPT 7 {n}\nDATA 7 ")),
        "{text}"
    );
    let done = text
        .lines()
        .rev()
        .find(|l| l.starts_with("DONE 7 "))
        .unwrap();
    let f: Vec<&str> = done.split(' ').collect();
    assert_eq!(f.len(), 9, "{done}");
    assert_eq!(f[2], "STAT");
    assert_eq!(f[3], ids.len().to_string());
    assert!(
        f[4].split_once('.').is_some_and(|(_, d)| d.len() == 2),
        "{done}"
    );
    assert!(
        f[5].split_once('.').is_some_and(|(_, d)| d.len() == 1),
        "{done}"
    );
    assert!(
        f[6].split_once('.').is_some_and(|(_, d)| d.len() == 2),
        "{done}"
    );
    assert_eq!(f[7], n.to_string());
    let mut data = Vec::new();
    // Every DATA frame is `DATA 7 <len>\n<len bytes>\n`.
    let mut rest = tail;
    while let Some(at) = find(rest, b"DATA 7 ") {
        let line_end = at + find(&rest[at..], b"\n").unwrap();
        let len: usize = std::str::from_utf8(&rest[at + 7..line_end])
            .unwrap()
            .parse()
            .unwrap();
        data.extend_from_slice(&rest[line_end + 1..line_end + 1 + len]);
        assert_eq!(rest[line_end + 1 + len], b'\n');
        rest = &rest[line_end + 2 + len..];
    }
    assert_eq!(data, want);
    let (status, _) = d.finish();
    assert!(status.success());
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[test]
fn every_error_code_and_the_stream_stays_in_sync() {
    let (mut d, _, _) = start("errors", &["--ctx", "64"]);
    let good = chat("Hi");
    let want = expected(&good, 3).1;
    let mut next_id = 100;
    let mut good_request = |d: &mut MuxDaemon| {
        next_id += 1;
        d.submit(next_id, 0, &good, 3);
        let r = d.until_end_of(next_id);
        assert_eq!(data_of(&r, next_id), want, "a good request after a bad one");
        assert!(matches!(r.last(), Some(MuxReply::Done { .. })), "{r:?}");
    };
    let expect_error = |d: &mut MuxDaemon, bytes: &[u8], id: u64, code: ErrorCode| {
        let at = d.raw.len();
        d.send(bytes);
        let r = d.next();
        assert_eq!(
            r,
            MuxReply::Error { id, code },
            "after sending {:?}",
            String::from_utf8_lossy(bytes)
        );
        let line = format!("ERROR {id} {code}\n");
        assert_eq!(&d.raw[at..at + line.len()], line.as_bytes());
    };
    // Header that does not parse (max_tokens 0), its payload consumed.
    expect_error(
        &mut d,
        b"SUBMIT 1 0 5 0 0 1\nhello\n",
        0,
        ErrorCode::BadRequest,
    );
    good_request(&mut d);
    // Garbage and an unknown command word.
    expect_error(&mut d, b"HELLO there\n", 0, ErrorCode::BadRequest);
    expect_error(
        &mut d,
        b"SUBMIT x 0 2 3 0 1\nhi\n",
        0,
        ErrorCode::BadRequest,
    );
    good_request(&mut d);
    // Temperature and top_p out of range.
    expect_error(
        &mut d,
        b"SUBMIT 2 0 2 3 2.5 1\nhi\n",
        0,
        ErrorCode::BadRequest,
    );
    expect_error(
        &mut d,
        b"SUBMIT 2 0 2 3 0 0\nhi\n",
        0,
        ErrorCode::BadRequest,
    );
    good_request(&mut d);
    // The byte after the payload is not a newline: BAD_FRAME; the stray byte starts the next
    // line ("X\n" is then an unknown command).
    expect_error(&mut d, b"SUBMIT 3 0 2 3 0 1\nhiX\n", 3, ErrorCode::BadFrame);
    assert_eq!(
        d.next(),
        MuxReply::Error {
            id: 0,
            code: ErrorCode::BadRequest
        }
    );
    good_request(&mut d);
    // Slot out of range (KV_SLOTS 4), and NUL in the payload.
    expect_error(
        &mut d,
        &submit_bytes(4, 4, "hi", 3),
        4,
        ErrorCode::BadRequest,
    );
    expect_error(
        &mut d,
        b"SUBMIT 5 0 3 3 0 1\nh\0i\n",
        5,
        ErrorCode::BadRequest,
    );
    good_request(&mut d);
    // A grammar (gbytes > 0) is refused until grammars exist; the grammar bytes consumed.
    expect_error(
        &mut d,
        b"SUBMIT 6 0 2 3 0 1 4\nhiroot\n",
        6,
        ErrorCode::BadRequest,
    );
    good_request(&mut d);
    // Empty after tokenization; too long for the context (CTX 64: limit 62).
    expect_error(&mut d, b"SUBMIT 8 0 0 3 0 1\n\n", 8, ErrorCode::EmptyPrompt);
    let long = "word ".repeat(80);
    let n = prompt_tokens(&long) as u64;
    expect_error(
        &mut d,
        &submit_bytes(9, 0, &long, 3),
        9,
        ErrorCode::ContextExceeded {
            tokens: n,
            limit: 62,
        },
    );
    good_request(&mut d);
    // STOP / CANCEL of an unknown id, and with a bad id.
    expect_error(&mut d, b"STOP 999\n", 999, ErrorCode::NotFound);
    expect_error(&mut d, b"CANCEL 998\n", 998, ErrorCode::NotFound);
    expect_error(&mut d, b"STOP abc\n", 0, ErrorCode::BadRequest);
    good_request(&mut d);
    // SLOT_BUSY and DUPLICATE_ID against a request in flight, then CANCEL it.
    let busy = chat("Count slowly to one hundred");
    let mut b = submit_bytes(10, 1, &busy, 40);
    b.extend(submit_bytes(11, 1, "hi", 3));
    b.extend(submit_bytes(10, 2, "hi", 3));
    b.extend(b"CANCEL 10\n");
    d.send(&b);
    let mut r = Vec::new();
    while !r.contains(&MuxReply::Error {
        id: 10,
        code: ErrorCode::Cancelled,
    }) {
        r.push(d.next());
    }
    assert_eq!(error_of(&r, 11), Some(ErrorCode::SlotBusy), "{r:?}");
    assert!(
        r.contains(&MuxReply::Error {
            id: 10,
            code: ErrorCode::Cancelled
        }),
        "{r:?}"
    );
    assert!(
        !r.iter().any(|x| matches!(x, MuxReply::Done { id: 10, .. })),
        "no DONE after CANCEL"
    );
    let dup = r
        .iter()
        .filter(|x| {
            matches!(
                x,
                MuxReply::Error {
                    id: 10,
                    code: ErrorCode::DuplicateId
                }
            )
        })
        .count();
    assert_eq!(dup, 1, "{r:?}");
    good_request(&mut d);
    let err = d.stderr();
    assert!(err.contains("[API] rejected SUBMIT 6: grammar"), "{err}");
    assert!(
        err.contains("CONTEXT_EXCEEDED") || err.contains("nothing was truncated"),
        "{err}"
    );
    let (status, _) = d.finish();
    assert!(status.success());
}

#[test]
fn four_sessions_together_answer_as_each_alone() {
    let (mut d, _, _) = start("four", &[]);
    let prompts: Vec<String> = [
        "The sea",
        "Birds fly",
        "Numbers: one",
        "Why is the sky blue?",
    ]
    .iter()
    .map(|t| chat(t))
    .collect();
    let mut batch = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        batch.extend(submit_bytes(i as u64 + 1, i as u32, p, 24));
    }
    d.send(&batch);
    let mut replies = Vec::new();
    let mut done = 0;
    while done < 4 {
        let r = d.next();
        if matches!(r, MuxReply::Done { .. } | MuxReply::Error { .. }) {
            done += 1;
        }
        replies.push(r);
    }
    for (i, p) in prompts.iter().enumerate() {
        let id = i as u64 + 1;
        let (ids, want) = expected(p, 24);
        assert_eq!(
            data_of(&replies, id),
            want,
            "session {i} in the batch vs alone"
        );
        assert_eq!(
            done_stat(&replies, id).completion_tokens as usize,
            ids.len()
        );
    }
    // The streams really interleaved: DATA of different ids alternate.
    let order: Vec<u64> = replies
        .iter()
        .filter_map(|r| match r {
            MuxReply::Data { id, .. } => Some(*id),
            _ => None,
        })
        .collect();
    let switches = order.windows(2).filter(|w| w[0] != w[1]).count();
    assert!(
        switches >= 8,
        "the sessions did not step together: {order:?}"
    );
    assert!(d.finish().0.success());
}

#[test]
fn stop_and_cancel_end_one_request_while_the_others_go_on() {
    let (mut d, _, _) = start("stop", &["--ngen", "4000"]);
    let a = chat("Tell a long story");
    let b = chat("Tell another long story");
    let c = chat("And a third");
    let (_, want_b) = expected(&b, 60);
    let mut batch = submit_bytes(1, 0, &a, 3000);
    batch.extend(submit_bytes(2, 1, &b, 60));
    batch.extend(submit_bytes(3, 2, &c, 3000));
    d.send(&batch);
    // Once A and C stream, stop A and cancel C.
    let mut replies = Vec::new();
    let (mut seen_a, mut seen_c) = (false, false);
    while !(seen_a && seen_c) {
        let r = d.next();
        seen_a |= matches!(r, MuxReply::Data { id: 1, .. });
        seen_c |= matches!(r, MuxReply::Data { id: 3, .. });
        replies.push(r);
    }
    d.send(b"STOP 1\nCANCEL 3\n");
    let mut ended = 0;
    while ended < 3 {
        let r = d.next();
        if matches!(r, MuxReply::Done { .. } | MuxReply::Error { .. }) {
            ended += 1;
        }
        replies.push(r);
    }
    let stat_a = done_stat(&replies, 1);
    assert!(
        stat_a.completion_tokens < 3000,
        "STOP ended A early: {stat_a:?}"
    );
    assert_eq!(stat_a.prompt.map(|p| p.1), Some(false));
    assert_eq!(error_of(&replies, 3), Some(ErrorCode::Cancelled));
    // B ran to its end, unchanged by the others stopping.
    assert_eq!(data_of(&replies, 2), want_b);
    // A's DATA count equals its DONE count: nothing streamed after the STOP was acted on.
    let a_tokens = replies
        .iter()
        .filter(|r| matches!(r, MuxReply::Data { id: 1, .. }))
        .count();
    assert!(a_tokens as u32 <= stat_a.completion_tokens);
    assert!(d.finish().0.success());
}

#[test]
fn a_long_prompt_does_not_stall_another_stream() {
    let (mut d, _, _) = start("interleave", &["--ngen", "4000", "--ctx", "4096"]);
    let a = chat("Keep talking");
    d.submit(1, 0, &a, 2000);
    // A streams first.
    loop {
        if matches!(d.next(), MuxReply::Data { id: 1, .. }) {
            break;
        }
    }
    // B: a prompt of several prefill chunks.
    let long = chat(&"the quick brown fox jumps over the lazy dog ".repeat(60));
    let n = prompt_tokens(&long);
    assert!(n > 3 * colibri::engine::PREFILL_CHUNK, "{n} tokens");
    d.submit(2, 1, &long, 4);
    let mut a_during = 0;
    let mut accepted = false;
    loop {
        match d.next() {
            MuxReply::Accept { id: 2, .. } => accepted = true,
            MuxReply::Data { id: 1, .. } if accepted => a_during += 1,
            MuxReply::Data { id: 2, .. } => break,
            MuxReply::Done { id: 1, .. } => panic!("A ended before B's prefill did"),
            _ => {}
        }
    }
    // One prefill chunk joins each step while A decodes, so A gets a token per chunk of B's
    // prefill. (A DATA frame per token, except where the random model's bytes end inside a
    // UTF-8 sequence: those are held for the next frame, hence the margin.)
    let chunks = n.div_ceil(colibri::engine::PREFILL_CHUNK);
    assert!(
        a_during >= chunks / 2,
        "A got {a_during} DATA frames during B's {chunks}-chunk prefill"
    );
    d.send(b"STOP 1\n");
    d.until_end_of(2);
    let (status, _) = d.finish();
    assert!(status.success());
}

#[test]
fn kill9_with_four_sessions_active_then_every_session_resumes() {
    let state = temp_dir("mux-kill");
    let snap = snap();
    let args = [
        "--snap",
        snap.to_str().unwrap(),
        "--kv-slots",
        "4",
        "--ngen",
        "4000",
    ];
    let first: Vec<String> = (0..4)
        .map(|i| chat(&format!("Conversation number {i}")))
        .collect();
    let (mut d, _) = MuxDaemon::start(&args, &state);
    // Round 1 completes (and is saved).
    let mut answers = Vec::new();
    for (i, p) in first.iter().enumerate() {
        d.submit(i as u64 + 1, i as u32, p, 8);
        let r = d.until_end_of(i as u64 + 1);
        answers.push(data_of(&r, i as u64 + 1));
    }
    // Round 2: four long generations, killed while they stream.
    let second: Vec<String> = first
        .iter()
        .zip(&answers)
        // (A random model's answer may hold a NUL byte, which no payload may carry.)
        .map(|(p, a)| {
            format!(
                "{p}{}<|user|>Go on, at length.<|assistant|><think></think>",
                String::from_utf8_lossy(a).replace('\0', "")
            )
        })
        .collect();
    let mut batch = Vec::new();
    for (i, p) in second.iter().enumerate() {
        batch.extend(submit_bytes(10 + i as u64, i as u32, p, 3000));
    }
    d.send(&batch);
    let mut streaming = [false; 4];
    while !streaming.iter().all(|s| *s) {
        if let MuxReply::Data { id, .. } = d.next() {
            streaming[(id - 10) as usize] = true;
        }
    }
    d.kill9();
    // Restart: every slot resumes its saved conversation without a prefill, and answers the
    // next turn exactly as a fresh daemon does.
    let (mut d, _) = MuxDaemon::start(&args, &state);
    let err = d.stderr();
    for i in 0..4 {
        assert!(
            err.contains(&format!("[KV] slot {i}: resumed conversation from disk")),
            "{err}"
        );
    }
    for (i, p) in second.iter().enumerate() {
        let id = 20 + i as u64;
        d.submit(id, i as u32, p, 8);
        let r = d.until_end_of(id);
        assert_eq!(
            data_of(&r, id),
            expected(p, 8).1,
            "slot {i} after the resume"
        );
    }
    let err = d.stderr();
    for i in 0..4 {
        let line = err
            .lines()
            .rfind(|l| l.starts_with(&format!("[API] KV slot {i} prefix ")))
            .unwrap_or_else(|| panic!("no prefix line for slot {i}: {err}"));
        let kept: usize = line
            .split(' ')
            .nth(5)
            .and_then(|f| f.split('/').next())
            .and_then(|k| k.parse().ok())
            .unwrap();
        assert!(kept > 0, "slot {i} reused nothing after the resume: {line}");
    }
    assert!(d.finish().0.success());
}

#[test]
fn a_shared_prefix_is_adopted_from_another_session() {
    let (mut d, _, _) = start("share", &[]);
    let system = "You are a careful assistant. ".repeat(12);
    let p1 =
        format!("[gMASK]<sop><|system|>{system}<|user|>First question<|assistant|><think></think>");
    let p2 = format!(
        "[gMASK]<sop><|system|>{system}<|user|>Second question<|assistant|><think></think>"
    );
    d.submit(1, 0, &p1, 4);
    d.until_end_of(1);
    d.submit(2, 1, &p2, 6);
    let r = d.until_end_of(2);
    assert_eq!(
        data_of(&r, 2),
        expected(&p2, 6).1,
        "adopted rows answer as a fresh prefill"
    );
    let err = d.stderr();
    assert!(
        err.contains("[API] KV cross-slot adopt: slot 1 took rows [0,"),
        "{err}"
    );
    assert!(d.finish().0.success());
}

#[test]
fn upstream_style_launch_selects_mux_and_never_falls_back() {
    let state = temp_dir("upstream-mux");
    let snap = snap();
    let mut cmd = colibri();
    cmd.args(["0", "16"])
        .env("SERVE", "1")
        .env("SERVE_BATCH", "1")
        .env("SNAP", &snap)
        .env("KV_SLOTS", "2");
    let (mut d, startup) = MuxDaemon::start_with(&mut cmd, &state);
    assert_eq!(startup[0], MuxReply::Ready);
    assert!(matches!(
        startup[2],
        MuxReply::Telemetry(Telemetry::HwInfo(_))
    ));
    let p = chat("Hi");
    d.submit(1, 1, &p, 3);
    let r = d.until_end_of(1);
    assert_eq!(data_of(&r, 1), expected(&p, 3).1);
    assert!(d.finish().0.success());
    // A SERVE_BATCH that is not a boolean is refused, never taken as legacy.
    let out = colibri()
        .args(["0", "16"])
        .env("SERVE", "1")
        .env("SERVE_BATCH", "maybe")
        .env("SNAP", &snap)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn sigint_finishes_every_active_request_through_done() {
    let (mut d, _, _) = start("sigint", &["--ngen", "4000"]);
    let mut batch = submit_bytes(1, 0, &chat("Talk"), 3000);
    batch.extend(submit_bytes(2, 1, &chat("Talk more"), 3000));
    d.send(&batch);
    let mut seen = [false; 2];
    while !(seen[0] && seen[1]) {
        if let MuxReply::Data { id, .. } = d.next() {
            seen[(id - 1) as usize] = true;
        }
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let mut replies = Vec::new();
    while !(replies
        .iter()
        .any(|r| matches!(r, MuxReply::Done { id: 1, .. }))
        && replies
            .iter()
            .any(|r| matches!(r, MuxReply::Done { id: 2, .. })))
    {
        replies.push(d.next());
    }
    // The daemon is still serving.
    let p = chat("Hi");
    d.submit(3, 0, &p, 3);
    let r = d.until_end_of(3);
    assert!(matches!(r.last(), Some(MuxReply::Done { id: 3, .. })));
    assert!(d.finish().0.success());
}

#[test]
fn a_kv_pool_that_cannot_fit_is_refused_with_the_figures() {
    let state = temp_dir("mux-pool");
    let out = colibri()
        .args([
            "serve",
            "--mux",
            "--kv-slots",
            "512",
            "--ctx",
            "1048576",
            "--snap",
        ])
        .arg(snap())
        .arg("--state-dir")
        .arg(&state)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("KV pool") && err.contains("GB") && err.contains("--kv-slots"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "nothing before READY, and no READY");
}

/// A SUBMIT's max_tokens is clamped only to the slot's room, as upstream's mux does:
/// `--ngen 5` (the legacy protocol's budget) does not cut a request asking for 40 to 5, and
/// one asking for 1000 under `--ctx 96` gets the greedy answer up to the room, reported
/// length-limited. The SESSIONS line after DONE reports the tokens for the idle slot.
#[test]
fn mux_max_tokens_is_clamped_only_to_the_room() {
    let state = temp_dir("mux-ngen");
    let tel = state.join("telemetry.log");
    let snap = snap();
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg("exec \"$0\" serve --mux --kv-slots 2 --ngen 5 --ctx 96 --snap \"$1\" --telemetry-fd 3 3>\"$2\"")
        .arg(colibri_e2e::bin("colibri"))
        .arg(&snap)
        .arg(&tel)
        .env_remove("NGEN");
    let (mut d, _) = MuxDaemon::start_with(&mut cmd, &state);
    let p = chat("Tell me about birds and the sea and the sky.");
    let (ids, want) = expected(&p, 40);
    assert!(
        ids.len() > 5,
        "the fixture's greedy answer stops at {}",
        ids.len()
    );
    d.submit(3, 0, &p, 40);
    let replies = d.until_end_of(3);
    assert_eq!(data_of(&replies, 3), want);
    let stat = done_stat(&replies, 3);
    assert_eq!(stat.completion_tokens as usize, ids.len());
    assert_eq!(
        stat.prompt,
        Some((prompt_tokens(&p) as u32, ids.len() == 40))
    );
    // Room: the context less the prompt and the sampled-not-fed last token.
    let room = 96 - prompt_tokens(&p) - 1;
    let (ids, want) = expected(&p, room);
    d.submit(4, 1, &p, 1000);
    let replies = d.until_end_of(4);
    assert_eq!(data_of(&replies, 4), want);
    let stat = done_stat(&replies, 4);
    assert_eq!(stat.completion_tokens as usize, ids.len());
    assert_eq!(
        stat.prompt,
        Some((prompt_tokens(&p) as u32, ids.len() == room)),
        "length-limited exactly when the room ran out"
    );
    d.submit(5, 0, &p, 5);
    let replies = d.until_end_of(5);
    assert_eq!(done_stat(&replies, 5).completion_tokens, 5);
    let (status, _) = d.finish();
    assert!(status.success());
    let text = String::from_utf8(std::fs::read(&tel).unwrap()).unwrap();
    let last_sessions = text
        .lines()
        .rev()
        .find(|l| l.starts_with("SESSIONS "))
        .unwrap();
    let ctx = prompt_tokens(&p) + 5;
    // `SESSIONS 2 <slot> idle <id 0> <ctx> <generated> ...`, slot 0's last request (of 5)
    // first;
    // the KV holds the prompt and the answer but its last token (sampled, not yet fed).
    assert!(
        last_sessions.starts_with(&format!("SESSIONS 2 0 idle 0 {} 5 1 idle 0 ", ctx - 1)),
        "{last_sessions}\n{text}"
    );
}

/// `logprobs=k` (upstream's extension): the prompt read out in ECHO frames, each prompt
/// token's logprob under the positions before it as the engine's own teacher-forced logits
/// give it (position 0 `nan 0`), then one DATA frame per answer token with its tail, the
/// greedy token its own top; `max_tokens` 0 with logprobs reads the prompt out and ends.
#[test]
fn logprobs_read_the_prompt_out_and_tail_every_token() {
    let (mut d, _, _) = start("logprobs", &[]);
    let p = chat("Name three rivers.");
    let engine = Engine::open(vec![snap()], LoadOptions::default()).unwrap();
    let ids = engine.tokenizer().encode(&p).unwrap();
    let mut logits = Vec::new();
    engine.teacher_forced(&[], &ids, &mut logits).unwrap();
    let vocab = engine.vocab_size();
    let log_softmax = |row: &[f32], id: u32| -> f64 {
        let max = row.iter().copied().fold(f32::MIN, f32::max) as f64;
        let lse = max
            + row
                .iter()
                .map(|&v| (v as f64 - max).exp())
                .sum::<f64>()
                .ln();
        row[id as usize] as f64 - lse
    };
    let header = format!("SUBMIT 5 0 {} 8 0 1 0 logprobs=3\n", p.len());
    let mut frame = header.into_bytes();
    frame.extend_from_slice(p.as_bytes());
    frame.push(b'\n');
    d.send(&frame);
    let replies = d.until_end_of(5);
    let echoes: Vec<_> = replies
        .iter()
        .filter_map(|r| match r {
            MuxReply::Echo {
                id: 5,
                pos,
                bytes,
                tail,
            } => Some((*pos, bytes.clone(), tail.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(echoes.len(), ids.len());
    let mut spelled = Vec::new();
    for (i, (pos, bytes, tail)) in echoes.iter().enumerate() {
        assert_eq!(*pos as usize, i);
        assert_eq!(bytes.as_slice(), engine.tokenizer().token_bytes(ids[i]));
        spelled.extend_from_slice(bytes);
        if i == 0 {
            assert!(tail.logprob.is_nan() && tail.top.is_empty(), "{tail:?}");
            continue;
        }
        let row = &logits[(i - 1) * vocab..i * vocab];
        let want = log_softmax(row, ids[i]);
        assert!(
            (tail.logprob as f64 - want).abs() < 1e-4,
            "pos {i}: {tail:?} vs {want}"
        );
        assert_eq!(tail.top.len(), 3);
        assert!(tail.top.windows(2).all(|w| w[0].1 >= w[1].1), "{tail:?}");
    }
    assert_eq!(spelled, p.as_bytes());
    // One DATA frame per token, greedy's token its own top, spelling the greedy answer; bytes
    // still held at the end (a cut UTF-8 sequence) come in one last DATA without a tail.
    let (answer, want) = expected(&p, 8);
    let frames: Vec<&MuxReply> = replies
        .iter()
        .filter(|r| {
            matches!(
                r,
                MuxReply::Data { id: 5, .. } | MuxReply::DataLogprobs { id: 5, .. }
            )
        })
        .collect();
    let plain = frames
        .iter()
        .position(|r| matches!(r, MuxReply::Data { .. }));
    assert!(
        plain.is_none_or(|at| at == frames.len() - 1),
        "a DATA frame without its tail before the end: {frames:?}"
    );
    let tails: Vec<_> = frames
        .iter()
        .filter_map(|r| match r {
            MuxReply::DataLogprobs { tail, .. } => Some(tail.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(tails.len(), answer.len());
    for (t, &id) in tails.iter().zip(&answer) {
        assert_eq!(t.top[0].0, id, "{t:?}");
        assert_eq!(t.logprob, t.top[0].1);
    }
    assert_eq!(data_of(&replies, 5), want);
    // max_tokens 0: the read-out alone, then DONE with nothing generated.
    let header = format!("SUBMIT 6 1 {} 0 0 1 0 logprobs=2\n", p.len());
    let mut frame = header.into_bytes();
    frame.extend_from_slice(p.as_bytes());
    frame.push(b'\n');
    d.send(&frame);
    let replies = d.until_end_of(6);
    let n_echo = replies
        .iter()
        .filter(|r| matches!(r, MuxReply::Echo { id: 6, .. }))
        .count();
    assert_eq!(n_echo, ids.len());
    assert_eq!(done_stat(&replies, 6).completion_tokens, 0);
    assert!(data_of(&replies, 6).is_empty());
    let (status, _) = d.finish();
    assert!(status.success());
}
