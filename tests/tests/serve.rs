//! `colibri serve` end to end: byte-exact framing, bad headers, KV slots, prefix reuse and
//! crash-safe persistence, against the real binary on a tiny oracle model.

use std::path::{Path, PathBuf};

use colibri::engine::chat::ChatTemplate;
use colibri::engine::Engine;
use colibri::model::LoadOptions;
use colibri_e2e::{colibri, fixture, greedy_answer, temp_dir, Daemon};

const MODEL: &str = "tiny-dense-shared";

fn model_dir() -> PathBuf {
    fixture(MODEL)
}

fn start(state: &Path, extra: &[&str]) -> (Daemon, Vec<u8>) {
    Daemon::greedy(&model_dir(), state, &[&["--ngen", "24"], extra].concat())
}

/// What a fresh greedy engine answers to `prompt` (raw, no template): the ids and their bytes.
fn expected(prompt: &str, max_new: usize) -> (Vec<u32>, Vec<u8>) {
    greedy_answer(&model_dir(), prompt, max_new, false)
}

fn stat_fields(stat: &str) -> Vec<String> {
    assert!(
        stat.starts_with("STAT ") && stat.ends_with('\n'),
        "not a STAT line: {stat:?}"
    );
    stat.trim_end()
        .split(' ')
        .skip(1)
        .map(String::from)
        .collect()
}

fn assert_stat6(stat: &str) -> Vec<String> {
    let f = stat_fields(stat);
    assert_eq!(f.len(), 6, "{stat:?}");
    f[0].parse::<u32>().unwrap();
    assert_eq!(f[1].split('.').nth(1).map(str::len), Some(2), "{stat:?}");
    assert_eq!(f[2].split('.').nth(1).map(str::len), Some(1), "{stat:?}");
    assert_eq!(f[3].split('.').nth(1).map(str::len), Some(2), "{stat:?}");
    f[4].parse::<u32>().unwrap();
    assert!(f[5] == "0" || f[5] == "1", "{stat:?}");
    f
}

fn assert_zero_stat(stat: &str, six: bool) {
    let f = stat_fields(stat);
    assert_eq!(&f[..3], ["0", "0.00", "0.0"], "{stat:?}");
    if six {
        assert_eq!(f.len(), 6, "{stat:?}");
        assert_eq!(&f[4..], ["0", "0"], "{stat:?}");
    } else {
        assert_eq!(f.len(), 4, "{stat:?}");
    }
}

#[test]
fn startup_and_every_command_is_framed_byte_exactly() {
    let state = temp_dir("framing");
    let (mut d, startup) = start(&state, &[]);
    let text = String::from_utf8(startup).unwrap();
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    assert_eq!(lines[0], "\x01\x01READY\x01\x01\n");
    assert_zero_stat(lines[1], false);
    assert!(
        lines[2].starts_with("TIERS 0 0 24 0.00 0.00"),
        "{:?}",
        lines[2]
    );

    // A plain line: template applied, `\n` before END, 6-field STAT.
    d.send(b"Hello there\n");
    let (body, _, stat) = d.read_turn();
    assert_eq!(body.last(), Some(&b'\n'), "chat turns put \\n before END");
    let f = assert_stat6(&stat);
    let prompt = ChatTemplate::Glm.turn(None, "Hello there", true, false);
    let (ids, bytes) = expected(&prompt, 24);
    assert_eq!(
        &body[..body.len() - 1],
        &bytes[..],
        "streamed bytes != raw token bytes"
    );
    assert_eq!(f[0], ids.len().to_string());

    // PROMPT: exactly the raw bytes, no `\n` before END.
    let p = "[gMASK]<sop><|user|>What is two plus two?<|assistant|><think></think>";
    let (body, stat) = d.prompt(p, 8, None);
    let (ids, bytes) = expected(p, 8);
    assert_eq!(body, bytes);
    let f = assert_stat6(&stat);
    assert_eq!(f[0], ids.len().to_string());
    assert_eq!(
        f[5],
        if ids.len() == 8 { "1" } else { "0" },
        "length_limited flag"
    );

    // MORE: 4-field STAT, `\n` before END.
    d.send(b"\x02MORE\n");
    let (body, _, stat) = d.read_turn();
    assert_eq!(body.last(), Some(&b'\n'));
    assert_eq!(stat_fields(&stat).len(), 4, "{stat:?}");

    // RESET, an empty line and an unknown command: END + zero STAT.
    for req in [
        &b"\x02RESET\n"[..],
        b"\x02RESET 0\n",
        b"\n",
        b"\x02FROB 1 2\n",
    ] {
        d.send(req);
        let (body, _, stat) = d.read_turn();
        assert!(body.is_empty(), "{req:?} -> {body:?}");
        assert_zero_stat(&stat, false);
    }
    // MORE right after RESET has nothing to continue.
    d.send(b"\x02MORE\n");
    let (body, _, stat) = d.read_turn();
    assert!(body.is_empty());
    assert_zero_stat(&stat, false);
    assert!(d.finish().success());
}

#[test]
fn every_bad_header_is_answered_and_the_stream_stays_in_sync() {
    let state = temp_dir("bad");
    let (mut d, _) = start(&state, &["--kv-slots", "2"]);
    let good = "[gMASK]<sop><|user|>Hi<|assistant|><think></think>";
    let (_, want) = expected(good, 6);
    let payload = "\x02MORE\n"; // a payload that looks like a command must be consumed, not run
    let n = payload.len();
    let bad: Vec<String> = vec![
        format!("\x02PROMPT {n} 5 0.5\n{payload}\n"), // 3 fields
        format!("\x02PROMPT 99999999999 5 0.5 0.9\n"), // bytes > 16 MiB (nothing consumed)
        format!("\x02PROMPT {n} 0 0.5 0.9\n{payload}\n"), // max_tokens < 1
        format!("\x02PROMPT {n} 5 -0.1 0.9\n{payload}\n"), // temperature < 0
        format!("\x02PROMPT {n} 5 2.5 0.9\n{payload}\n"), // temperature > 2
        format!("\x02PROMPT {n} 5 nan 0.9\n{payload}\n"), // temperature not finite
        format!("\x02PROMPT {n} 5 0.5 0\n{payload}\n"), // top_p = 0
        format!("\x02PROMPT {n} 5 0.5 1.5\n{payload}\n"), // top_p > 1
        format!("\x02PROMPT {n} 5 0.5 0.9 2\n{payload}\n"), // slot >= --kv-slots
        format!("\x02PROMPT {n} 5 0.5 0.9 -1\n{payload}\n"), // negative slot
        "\x02PROMPT 3 5 0.5 0.9\na\0b\n".to_string(), // NUL in the payload
    ];
    for req in &bad {
        d.send(req.as_bytes());
        let (body, _, stat) = d.read_turn();
        assert!(body.is_empty(), "{req:?}");
        assert_zero_stat(&stat, true);
        let (body, stat) = d.prompt(good, 6, None);
        assert_eq!(body, want, "out of sync after {req:?}");
        assert_stat6(&stat);
    }
    assert!(d.finish().success());
}

#[test]
fn two_slots_never_see_each_other() {
    let state = temp_dir("slots");
    let a = "[gMASK]<sop><|user|>Tell me about the sea.<|assistant|><think></think>";
    let b = "[gMASK]<sop><|user|>How many legs does a spider have?<|assistant|><think></think>";
    let (mut d, _) = start(&state, &["--kv-slots", "2"]);
    let (ans_a, _) = d.prompt(a, 12, Some(1));
    let (ans_b, _) = d.prompt(b, 12, Some(0));
    // Slot 1 continues its own conversation; slot 0's turn must not have touched it.
    let a2 = format!(
        "{a}{}<|user|>And the sky?<|assistant|><think></think>",
        String::from_utf8_lossy(&ans_a)
    );
    let (ans_a2, _) = d.prompt(&a2, 12, Some(1));
    assert!(d.finish().success());
    assert_eq!(ans_a, expected(a, 12).1);
    assert_eq!(ans_b, expected(b, 12).1);
    assert_eq!(ans_a2, expected(&a2, 12).1);
    assert!(state.join(".coli_kv").exists() && state.join(".coli_kv.1").exists());
}

fn prefix_line(stderr: &str) -> Vec<(usize, usize, usize)> {
    // [API] KV slot s prefix p/n token, prefill k
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("[API] KV slot "))
        .map(|l| {
            let nums: Vec<usize> = l
                .split(|c: char| !c.is_ascii_digit())
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().unwrap())
                .collect();
            (nums[1], nums[2], nums[3])
        })
        .collect()
}

#[test]
fn prefix_reuse_prefills_only_the_tail() {
    let state = temp_dir("prefix");
    let p1 = "[gMASK]<sop><|user|>What is the capital of France?<|assistant|><think></think>";
    let p2 = format!("{p1}Paris.<|user|>And of Italy?<|assistant|><think></think>");
    let (mut d, _) = start(&state, &[]);
    d.prompt(p1, 6, None);
    let (ans, _) = d.prompt(&p2, 10, None);
    let (again, _) = d.prompt(&p2, 10, None);
    let err = d.stderr();
    assert!(d.finish().success());
    let lines = prefix_line(&err);
    let engine = Engine::open(vec![model_dir()], LoadOptions::default()).unwrap();
    let n1 = engine.tokenizer().encode(p1).unwrap().len();
    let n2 = engine.tokenizer().encode(&p2).unwrap().len();
    assert_eq!(lines[0], (0, n1, n1));
    let (p, n, k) = lines[1];
    assert_eq!(n, n2);
    assert!(
        p >= n1,
        "the first prompt's tokens must be reused: {lines:?}"
    );
    assert_eq!(p + k, n);
    // The same prompt again: everything cached, the last token re-run for its logits.
    assert_eq!(lines[2], (n2 - 1, n2, 1));
    let want = expected(&p2, 10).1;
    assert_eq!(ans, want);
    assert_eq!(again, want);
}

#[test]
fn kill_after_a_turn_then_resume_without_prefill() {
    let state = temp_dir("kill-after");
    let p1 = "[gMASK]<sop><|user|>Write a short poem about the sea.<|assistant|><think></think>";
    let (mut d, _) = start(&state, &[]);
    let (ans1, _) = d.prompt(p1, 10, None);
    d.kill9();
    let p2 = format!(
        "{p1}{}<|user|>Another one.<|assistant|><think></think>",
        String::from_utf8_lossy(&ans1)
    );
    let (mut d, _) = start(&state, &[]);
    let err = d.stderr();
    assert!(err.contains("resumed conversation from disk"), "{err}");
    let (ans2, _) = d.prompt(&p2, 10, None);
    let err = d.stderr();
    assert!(d.finish().success());
    let (p, _, _) = prefix_line(&err)[0];
    assert!(p > 0, "nothing reused after resume: {err}");
    assert_eq!(
        ans2,
        expected(&p2, 10).1,
        "a resumed daemon must answer as a fresh one"
    );
}

#[test]
fn kill_in_the_middle_of_a_generation_then_resume() {
    let state = temp_dir("kill-mid");
    let p1 = "[gMASK]<sop><|user|>Hello! How are you today?<|assistant|><think></think>";
    let snap = model_dir();
    let (mut d, _) = Daemon::start(
        &[
            "--snap",
            snap.to_str().unwrap(),
            "--ngen",
            "4000",
            "--ctx",
            "4096",
            "--temp",
            "0",
        ],
        &state,
    );
    d.prompt(p1, 6, None);
    // A long generation, killed while tokens are streaming.
    let long = "[gMASK]<sop><|user|>Count to a thousand.<|assistant|><think></think>";
    let req = format!("\x02PROMPT {} 4000 0 1\n{long}\n", long.len());
    d.send(req.as_bytes());
    let _ = d.read_line_partial();
    d.kill9();
    let (mut d, _) = start(&state, &[]);
    let err = d.stderr();
    assert!(err.contains("resumed conversation from disk"), "{err}");
    let (ans, _) = d.prompt(p1, 10, None);
    assert!(d.finish().success());
    assert_eq!(ans, expected(p1, 10).1);
}

#[test]
fn corrupted_truncated_and_foreign_kv_files_are_refused_cleanly() {
    let p = "[gMASK]<sop><|user|>Hi<|assistant|><think></think>";
    let want = expected(p, 6).1;
    // Garbage.
    let state = temp_dir("garbage");
    std::fs::write(
        state.join(".coli_kv"),
        b"this is not a kv file at all, not even close",
    )
    .unwrap();
    let (mut d, _) = start(&state, &[]);
    assert!(d.stderr().contains("not a .coli_kv file"), "{}", d.stderr());
    assert_eq!(d.prompt(p, 6, None).0, want);
    assert!(d.finish().success());
    // Foreign: a file saved by the other fixture model.
    let other = temp_dir("foreign-src");
    let snap = fixture("tiny-moe-bias");
    let (mut d, _) = Daemon::start(&["--snap", snap.to_str().unwrap(), "--temp", "0"], &other);
    d.prompt(p, 4, None);
    assert!(d.finish().success());
    let state = temp_dir("foreign");
    std::fs::copy(other.join(".coli_kv"), state.join(".coli_kv")).unwrap();
    let (mut d, _) = start(&state, &[]);
    let err = d.stderr();
    assert!(err.contains("saved by a model of another shape"), "{err}");
    assert!(err.contains("kept as "), "{err}");
    assert_eq!(d.prompt(p, 6, None).0, want);
    assert!(d.finish().success());
    // Set aside, not overwritten: the other model's conversation is still there, byte for byte.
    let aside: Vec<_> = std::fs::read_dir(&state)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains(".coli_kv.aside-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(
        std::fs::read(&aside[0]).unwrap(),
        std::fs::read(other.join(".coli_kv")).unwrap()
    );
    // Truncated mid-record: loads the complete records only.
    let state = temp_dir("truncated");
    let (mut d, _) = start(&state, &[]);
    d.prompt(p, 6, None);
    assert!(d.finish().success());
    let f = state.join(".coli_kv");
    let len = std::fs::metadata(&f).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(len - 7)
        .unwrap();
    let (mut d, _) = start(&state, &[]);
    let err = d.stderr();
    assert!(err.contains("resumed conversation from disk"), "{err}");
    assert_eq!(d.prompt(p, 6, None).0, want);
    assert!(d.finish().success());
}

#[test]
fn kv_files_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let state = temp_dir("mode");
    let (mut d, _) = start(&state, &[]);
    d.prompt("[gMASK]<sop><|user|>Hi<|assistant|>", 3, None);
    assert!(d.finish().success());
    let mode = std::fs::metadata(state.join(".coli_kv"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
}

#[test]
fn kv_save_off_writes_nothing() {
    let state = temp_dir("nosave");
    let (mut d, _) = start(&state, &["--kv-save", "0"]);
    d.prompt("[gMASK]<sop><|user|>Hi<|assistant|>", 3, None);
    assert!(d.finish().success());
    assert!(!state.join(".coli_kv").exists());
}

#[test]
fn kv_slots_out_of_range_exits_2_naming_the_range() {
    let out = colibri()
        .args(["serve", "--kv-slots", "17"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("kv-slots") && err.contains("1..=16"), "{err}");
    assert!(err.contains("--mux"), "{err}");
    // The multiplexed protocol takes up to 512.
    let out = colibri()
        .args(["serve", "--mux", "--kv-slots", "513"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("kv-slots") && err.contains("1..=512"), "{err}");
}

#[test]
fn streamed_bytes_are_the_raw_token_bytes_even_when_not_utf8() {
    let state = temp_dir("bytes");
    let (mut d, _) = start(&state, &[]);
    let mut saw_invalid = false;
    for q in [
        "Ça va?",
        "你好",
        "Numbers: 3.14159",
        "def fib(n):",
        "smörgåsbord",
        "Hello!",
        "A spider",
    ] {
        let p = format!("[gMASK]<sop><|user|>{q}<|assistant|><think></think>");
        d.send(b"\x02RESET\n");
        d.read_turn();
        let (body, _) = d.prompt(&p, 24, None);
        let (_, want) = expected(&p, 24);
        assert_eq!(body, want, "prompt {q:?}");
        saw_invalid |= std::str::from_utf8(&body).is_err();
    }
    assert!(d.finish().success());
    assert!(
        saw_invalid,
        "no answer contained invalid UTF-8: the test lost its point"
    );
}

#[test]
fn sigint_stops_the_turn_through_end_and_stat() {
    let state = temp_dir("sigint");
    let snap = model_dir();
    // A raw prompt with no stop tokens armed would still stop on EOS; use a long budget and
    // interrupt as soon as the first byte arrives.
    let (mut d, _) = Daemon::start(
        &[
            "--snap",
            snap.to_str().unwrap(),
            "--ngen",
            "100000",
            "--ctx",
            "200000",
            "--temp",
            "1",
            "--seed",
            "3",
        ],
        &state,
    );
    let p = "The";
    d.send(format!("\x02PROMPT {} 100000 1 1\n{p}\n", p.len()).as_bytes());
    let first = d.read_line_partial();
    assert!(!first.is_empty());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let (_, _, stat) = d.read_turn();
    let f = stat_fields(&stat);
    assert_eq!(f.len(), 6, "{stat:?}");
    assert!(f[0].parse::<u32>().unwrap() < 100000);
    // Still alive and in sync.
    let (_, stat) = d.prompt("[gMASK]<sop><|user|>Hi<|assistant|>", 3, None);
    assert_stat6(&stat);
    assert!(d.finish().success());
}

#[test]
fn an_overflowing_chat_restarts_with_the_new_turn_and_says_so() {
    let state = temp_dir("overflow");
    let snap = model_dir();
    let (mut d, _) = Daemon::start(
        &[
            "--snap",
            snap.to_str().unwrap(),
            "--ctx",
            "80",
            "--ngen",
            "8",
            "--temp",
            "0",
        ],
        &state,
    );
    let mut restarted_at = None;
    for i in 0..12 {
        d.send(format!("Tell me about the sea, part {i}.\n").as_bytes());
        let (body, _, stat) = d.read_turn();
        assert_stat6(&stat);
        if d.stderr().contains("would overflow the context") {
            // The turn after the restart is a first turn again: [gMASK]<sop> and nothing else.
            let prompt = ChatTemplate::Glm.turn(
                None,
                &format!("Tell me about the sea, part {i}."),
                true,
                false,
            );
            assert_eq!(&body[..body.len() - 1], &expected(&prompt, 8).1[..]);
            restarted_at = Some(i);
            break;
        }
    }
    assert!(
        restarted_at.is_some(),
        "the conversation never overflowed a context of 80"
    );
    // A message that cannot fit even alone is refused, not truncated.
    let long = "word ".repeat(200);
    d.send(format!("{long}\n").as_bytes());
    let (body, _, stat) = d.read_turn();
    assert_eq!(body, b"\n");
    assert_zero_stat(&stat, true);
    assert!(d.stderr().contains("the context holds"), "{}", d.stderr());
    assert!(d.finish().success());
}

#[test]
fn random_bytes_on_stdin_never_crash_the_daemon() {
    use std::io::Write;
    // Seeded garbage with protocol-looking fragments mixed in; the daemon must answer what it
    // can, stay alive, and exit 0 at EOF.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let pieces: [&[u8]; 8] = [
        b"\x02PROMPT ",
        b"\x02MORE\n",
        b"\x02RESET 1\n",
        b"\n",
        b"\x02PROMPT 5 2 0 1\nhello\n",
        b"\x02PROMPT 3 2 9 1\nabc\n",
        b"\xff\xfe\x00",
        b" 12 ",
    ];
    let mut input = Vec::new();
    while input.len() < 4_000 {
        if next() % 3 == 0 {
            input.extend_from_slice(pieces[(next() % 8) as usize]);
        } else {
            input.push((next() % 256) as u8);
        }
    }
    let state_dir = temp_dir("fuzz");
    let mut child = colibri()
        .args([
            "serve",
            "--temp",
            "0",
            "--ngen",
            "2",
            "--kv-slots",
            "2",
            "--kv-save",
            "0",
            "--snap",
        ])
        .arg(model_dir())
        .arg("--state-dir")
        .arg(&state_dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    assert!(out.stdout.starts_with(b"\x01\x01READY\x01\x01\n"));
    // Every turn closed: as many STAT lines as END sentinels, plus the startup STAT.
    let ends = out
        .stdout
        .windows(7)
        .filter(|w| w == b"\x01\x01END\x01\x01")
        .count();
    let stats = out
        .stdout
        .split(|&b| b == b'\n')
        .filter(|l| l.starts_with(b"STAT "))
        .count();
    assert!(ends > 10, "only {ends} turns answered");
    assert_eq!(
        stats,
        ends + 1,
        "STAT lines vs END sentinels (+ the startup STAT)"
    );
}
