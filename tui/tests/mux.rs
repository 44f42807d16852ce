//! `coli --mux`: App-state tests driven by mux byte transcripts through `MuxReplyDecoder`,
//! and golden screens of the sessions panel.

mod common;

use coli::app::{Action, Phase, Role, Stage};
use coli::event::ExitInfo;
use common::*;
use crossterm::event::KeyCode;

/// The SUBMIT `coli` sends for a conversation payload (the default sampling options).
fn submit(id: u64, slot: u32, payload: &[u8]) -> Action {
    let mut v = format!("SUBMIT {id} {slot} {} 4096 0.7 0.9\n", payload.len()).into_bytes();
    v.extend_from_slice(payload);
    v.push(b'\n');
    Action::SendRequest(v)
}

fn data(id: u64, text: &[u8]) -> Vec<u8> {
    let mut v = format!("DATA {id} {}\n", text.len()).into_bytes();
    v.extend_from_slice(text);
    v.push(b'\n');
    v
}

fn answer(h: &Harness, i: usize) -> (String, bool, Option<String>) {
    let t = &h.app.turns[i];
    assert_eq!(t.role, Role::Assistant);
    (
        String::from_utf8_lossy(&t.bytes).into_owned(),
        t.streaming,
        t.footer.clone(),
    )
}

#[test]
fn a_turn_is_a_templated_submit_and_the_next_resends_the_conversation() {
    let mut h = Harness::ready_mux(80, 24);
    assert_eq!(h.app.phase, Phase::Idle);
    assert_eq!(h.app.figures.rss_gb, 1.25);
    assert!(h.app.dash.hwinfo.is_some() && h.app.dash.emap.is_some());
    let sent = h.send("What is a colibri?");
    let first = b"[gMASK]<sop><|user|>What is a colibri?<|assistant|><think></think>";
    assert_eq!(sent, vec![submit(1, 0, first)]);
    assert_eq!(h.app.phase, Phase::Prefill);
    assert_eq!(h.app.mux.inflight[&1].stage, Stage::Queued);
    assert!(h.screen_text(80, 24).contains("waiting for colibri…"));
    h.mux_stdout(b"ACCEPT 1 17\n");
    assert_eq!(
        h.app.mux.inflight[&1].stage,
        Stage::Prefill { prompt_tokens: 17 }
    );
    assert!(h.screen_text(80, 24).contains("prefill 17 tokens"));
    h.tick(4);
    h.mux_stdout(&data(1, b"A hum"));
    assert_eq!(h.app.phase, Phase::Generating);
    h.mux_stdout(&data(1, b"mingbird."));
    h.tick(6);
    h.mux_stdout(b"TIERS 0 66 190 0.00 0.41\nPROF 1.000 17 2 0.1 0.1 0.1 0.1 0.1 3\n");
    h.mux_stdout(b"DONE 1 STAT 2 2.00 75.0 1.30 17 0\n");
    assert_eq!(h.app.phase, Phase::Idle);
    assert!(h.app.mux.inflight.is_empty());
    let (text, streaming, footer) = answer(&h, 1);
    assert_eq!(text, "A hummingbird.");
    assert!(!streaming);
    assert_eq!(
        footer.as_deref(),
        Some("└─ 2 tok · 2.00 tok/s · hit 75.0% · RSS 1.30 GB · prompt 17 · 1s · end of text")
    );
    assert_eq!(h.app.figures.tokens, 2);
    assert_eq!(h.app.figures.prompt_tokens, Some(17));
    assert_eq!(h.app.dash.tiers.as_ref().map(|t| t.ram_experts), Some(66));
    // The second turn carries the whole conversation, answer included, and a new id.
    let sent = h.send("And its size?");
    let mut second = first.to_vec();
    second.extend_from_slice(b"A hummingbird.<|user|>And its size?<|assistant|><think></think>");
    assert_eq!(sent, vec![submit(2, 0, &second)]);
    // Enter on a busy slot waits.
    assert!(h.send("again").is_empty());
    assert_eq!(h.app.input.text(), "again");
    assert!(h.app.flash.as_ref().unwrap().0.contains("slot 0 is busy"));
}

#[test]
fn two_slots_stream_at_once_each_into_its_own_turn() {
    let mut h = Harness::ready_mux(80, 24);
    h.send("first");
    h.mux_stdout(b"ACCEPT 1 5\n");
    h.mux_stdout(&data(1, b"one"));
    // Another slot while slot 0 streams.
    assert!(h.send(":slot 2").is_empty());
    assert_eq!(h.app.slot, 2);
    let sent = h.send("second");
    assert_eq!(
        sent,
        vec![submit(
            2,
            2,
            b"[gMASK]<sop><|user|>second<|assistant|><think></think>"
        )]
    );
    h.mux_stdout(b"ACCEPT 2 4\n");
    h.mux_stdout(&[data(2, b"deux"), data(1, b" two"), data(2, b" trois")].concat());
    assert_eq!(h.app.phase, Phase::Generating);
    // Turns: user 0, answer 0, notice (:slot), user 2, answer 2.
    assert_eq!(answer(&h, 1).0, "one two");
    assert_eq!(answer(&h, 4).0, "deux trois");
    h.mux_stdout(b"DONE 2 STAT 2 4.00 50.0 1.30 4 1\n");
    let (_, streaming, footer) = answer(&h, 4);
    assert!(!streaming);
    let footer = footer.unwrap();
    assert!(footer.ends_with("token limit; :more continues"), "{footer}");
    // The status bar follows the current slot (2), not slot 0 still streaming.
    assert_eq!(h.app.figures.tokens, 2);
    assert_eq!(h.app.phase, Phase::Generating);
    assert!(answer(&h, 1).1);
    h.mux_stdout(b"DONE 1 STAT 2 1.00 50.0 1.30 5 0\n");
    assert_eq!(h.app.figures.tokens, 2);
    assert_eq!(h.app.figures.tok_per_s, 4.0);
    assert_eq!(h.app.phase, Phase::Idle);
    // Each slot keeps its own conversation.
    assert_eq!(
        h.app.slot_prompts[&0],
        b"[gMASK]<sop><|user|>first<|assistant|><think></think>one two"
    );
    assert_eq!(
        h.app.slot_prompts[&2],
        b"[gMASK]<sop><|user|>second<|assistant|><think></think>deux trois"
    );
    let screen = h.screen_text(80, 24);
    assert!(screen.contains("› [0] first"), "{screen}");
    assert!(screen.contains("[2] deux trois"), "{screen}");
}

#[test]
fn ctrl_c_stops_this_slot_then_the_others_then_quits() {
    let mut h = Harness::ready_mux(80, 24);
    h.send("a");
    h.send(":slot 1");
    h.send("b");
    h.mux_stdout(&[data(1, b"x"), data(2, b"y")].concat());
    h.take_actions();
    h.ctrl('c');
    assert_eq!(
        h.take_actions(),
        vec![Action::SendRequest(b"STOP 2\n".to_vec())]
    );
    h.ctrl('c');
    assert_eq!(
        h.take_actions(),
        vec![Action::SendRequest(b"STOP 1\n".to_vec())]
    );
    h.mux_stdout(b"DONE 2 STAT 1 1.00 0.0 1.30 3 0\n");
    let footer = answer(&h, 4).2.unwrap();
    assert!(
        footer.ends_with("stopped by you; :more continues"),
        "{footer}"
    );
    // A STOP that crossed its request's DONE: NOT_FOUND is nothing to show.
    let turns = h.app.turns.len();
    h.mux_stdout(b"ERROR 2 NOT_FOUND\n");
    assert_eq!(h.app.turns.len(), turns);
    // Everything in flight is already stopping: the next Ctrl-C quits.
    h.ctrl('c');
    assert_eq!(h.take_actions(), vec![Action::Quit]);
}

#[test]
fn errors_end_the_turn_on_screen_and_an_early_one_rolls_the_conversation_back() {
    let mut h = Harness::ready_mux(100, 30);
    h.send("hello");
    h.mux_stdout(b"ERROR 1 CONTEXT_EXCEEDED 5000 4094\n");
    let (_, streaming, footer) = answer(&h, 1);
    assert!(!streaming);
    assert_eq!(
        footer.as_deref(),
        Some(
            "└─ error CONTEXT_EXCEEDED: this message is 5000 tokens, the context holds 4094: \
             shorten it, or start coli with -- --ctx N"
        )
    );
    assert_eq!(h.app.phase, Phase::Idle);
    // The refused turn is not part of the conversation any more.
    assert_eq!(h.app.slot_prompts[&0], b"");
    let sent = h.send("hi");
    assert_eq!(
        sent,
        vec![submit(
            2,
            0,
            b"[gMASK]<sop><|user|>hi<|assistant|><think></think>"
        )]
    );
    // ERROR 0 (a header the daemon could not read) belongs to the oldest SUBMIT not yet
    // accepted: here the one on slot 7.
    h.mux_stdout(b"ACCEPT 2 3\n");
    h.send(":slot 7");
    h.send("seven");
    h.mux_stdout(b"ERROR 0 BAD_REQUEST\n");
    let footer = h.app.turns.last().unwrap().footer.clone().unwrap();
    assert_eq!(
        footer,
        "└─ error BAD_REQUEST: the daemon refused it (is --kv-slots > 7?)"
    );
    assert!(h.app.mux.inflight.contains_key(&2));
    assert_eq!(h.app.slot_prompts[&7], b"");
    // CANCELLED after text: the text stays, and so does the conversation.
    h.mux_stdout(&data(2, b"par"));
    h.mux_stdout(b"ERROR 2 CANCELLED\n");
    let (text, streaming, footer) = answer(&h, 3);
    assert_eq!(
        (text.as_str(), streaming, footer.as_deref()),
        ("par", false, Some("└─ cancelled"))
    );
    assert!(h.app.slot_prompts[&0].ends_with(b"<think></think>par"));
    // An error for nothing in flight is shown as a notice.
    h.mux_stdout(b"ERROR 99 SLOT_BUSY\n");
    let last = h.app.turns.last().unwrap();
    assert_eq!(
        (last.role, last.bytes.as_slice()),
        (Role::Notice, &b"colibri: ERROR 99 SLOT_BUSY"[..])
    );
    let screen = h.screen_text(100, 30);
    assert!(screen.contains("└─ cancelled"), "{screen}");
    assert!(screen.contains("error BAD_REQUEST"), "{screen}");
}

#[test]
fn reset_is_local_and_more_resends_the_conversation_into_the_same_answer() {
    let mut h = Harness::ready_mux(80, 24);
    h.send("go");
    h.mux_stdout(&data(1, b"part one"));
    h.mux_stdout(b"DONE 1 STAT 2 1.00 0.0 1.30 3 1\n");
    let convo = h.app.slot_prompts[&0].clone();
    let sent = h.send(":more");
    assert_eq!(sent, vec![submit(2, 0, &convo)]);
    assert!(answer(&h, 1).1, "the answer streams again in place");
    h.mux_stdout(&data(2, b", part two"));
    h.mux_stdout(b"DONE 2 STAT 3 1.00 0.0 1.30 5 0\n");
    assert_eq!(answer(&h, 1).0, "part one, part two");
    assert_eq!(h.app.turns.len(), 2);
    // :reset sends nothing: the next SUBMIT starts the conversation afresh.
    assert!(h.send(":reset").is_empty());
    assert!(!h.app.slot_prompts.contains_key(&0));
    let sent = h.send("new");
    assert_eq!(
        sent,
        vec![submit(
            3,
            0,
            b"[gMASK]<sop><|user|>new<|assistant|><think></think>"
        )]
    );
    assert!(h.send(":reset").is_empty());
    assert!(h.app.flash.as_ref().unwrap().0.contains("busy"));
    assert!(h.app.slot_prompts.contains_key(&0));
}

#[test]
fn a_daemon_that_exits_cuts_every_stream_short() {
    let mut h = Harness::ready_mux(80, 24);
    h.send("a");
    h.send(":slot 1");
    h.send("b");
    h.mux_stdout(&data(1, b"x"));
    h.exit(ExitInfo::signal(9));
    assert_eq!(h.app.phase, Phase::Dead);
    assert!(h.app.mux.inflight.is_empty());
    for i in [1, 4] {
        let (_, streaming, footer) = answer(&h, i);
        assert!(!streaming);
        assert_eq!(footer.as_deref(), Some("└─ cut short: colibri exited"));
    }
    // A restarted daemon: new ids go on from the last one.
    h.key(KeyCode::Char('r'));
    assert_eq!(h.take_actions().last(), Some(&Action::Restart));
    h.app.on_restarted();
    h.mux_stdout(b"\x01\x01READY\x01\x01\nSTAT 0 0.00 0.0 1.00\n");
    assert_eq!(h.app.phase, Phase::Idle);
    assert_eq!(h.app.mux.next_id, 3);
}

#[test]
fn the_telemetry_phase_lines_do_not_override_the_requests() {
    let mut h = Harness::ready_mux(80, 24);
    h.send("a");
    h.mux_stdout(&data(1, b"x"));
    h.tel("STATE idle");
    h.tel("PROGRESS prefill 0 40");
    assert_eq!(h.app.phase, Phase::Generating);
    // LIVE lines of another slot leave the status bar alone.
    h.tel("LIVE 9 9.00 90.0 1.40 3");
    assert_eq!(h.app.figures.tokens, 0);
    h.tel("LIVE 4 2.00 60.0 1.40 0");
    assert_eq!((h.app.figures.tokens, h.app.figures.tok_per_s), (4, 2.0));
}

const SESSIONS: &str =
    "SESSIONS 4 0 decode 7 1234 56 1 idle 0 300 12 2 prefill 8 2048 0 3 idle 0 0 0";

#[test]
fn sessions_panel_beside_the_chat_golden() {
    let mut h = Harness::ready_mux(160, 48);
    h.tel(SESSIONS);
    let list = h.app.dash.sessions.as_ref().expect("SESSIONS");
    assert_eq!(list.len(), 4);
    let screen = h.screen(160, 48);
    // The dashboard column: machine line, then the sessions, busy first, the current slot
    // (0) marked.
    let col: Vec<String> = screen[..8]
        .iter()
        .map(|l| {
            l.chars()
                .skip(96)
                .collect::<String>()
                .trim_end()
                .to_string()
        })
        .collect();
    let expected = [
        " 16 cores · RAM 128.0 GB (100.5 free) · AMD EPYC 7B13",
        "┌ sessions (2 busy / 4) ───────────────────────────────────────┐",
        "│›slot 0   decoding   ctx   1,234  gen     56  #7              │",
        "│ slot 2   prefilling ctx   2,048  gen      0  #8              │",
        "│ slot 1   idle       ctx     300  gen     12                  │",
        "│ slot 3   idle       ctx       0  gen      0                  │",
        "└──────────────────────────────────────────────────────────────┘",
        "┌ tiers ───────────────────────────────────────────────────────┐",
    ];
    if col != expected {
        panic!("dashboard column:\n{}", col.join("\n"));
    }
    // Colours by state.
    let mut t = ratatui::Terminal::new(ratatui::backend::TestBackend::new(160, 48)).unwrap();
    t.draw(|f| coli::ui::draw(f, &h.app)).unwrap();
    let buf = t.backend().buffer();
    assert_eq!(
        buf[(96 + 11, 2)].fg,
        coli::ui::session_label(protocol::SessionState::Decode).1
    );
    assert_eq!(buf[(96 + 11, 3)].fg, ratatui::style::Color::Magenta);
}

#[test]
fn screen_80x24_mux_golden() {
    let mut h = Harness::ready_mux(80, 24);
    h.send("What is a colibri?");
    h.send(":slot 1");
    h.send("And a wren?");
    h.mux_stdout(b"ACCEPT 1 17\nACCEPT 2 12\n");
    h.mux_stdout(&[data(1, b"A hummingbird."), data(2, b"A small bird")].concat());
    h.mux_stdout(b"DONE 1 STAT 3 3.00 75.0 1.30 17 0\n");
    h.tel(SESSIONS);
    let screen = h.screen(80, 24);
    let expected = [
        " conversation ──────────────────────────────────────────────────────────────────",
        "› [0] What is a colibri?                                                        ",
        "                                                                                ",
        "[0] A hummingbird.                                                              ",
        "└─ 3 tok · 3.00 tok/s · hit 75.0% · RSS 1.30 GB · prompt 17 · 0s · end of text  ",
        "                                                                                ",
        "• slot 1: coli keeps this slot's conversation and resends it each turn (the     ",
        "daemon needs --kv-slots > 1)                                                    ",
        "                                                                                ",
        "› [1] And a wren?                                                               ",
        "                                                                                ",
        "[1] A small bird▌                                                               ",
        "                                                                                ",
        "                                                                                ",
        "                                                                                ",
        "                                                                                ",
        "                                                                                ",
        "                                                                                ",
        "                                                                                ",
        "                                                                                ",
        "sessions decode 1 prefill 1 idle 2 │ ■VRAM 0 ■RAM 64 ■disk 192 │ hit ▆ │ tok/s █",
        " message · Enter send · Alt-Enter newline · ? help · slot 1 ────────────────────",
        "                                                                                ",
        " ⣽ generating  0.00 tok/s │ hit 0.0% │ RSS 1.25 GB │ prompt 12 · tok 0 │ slot 1 ",
    ];
    if screen != expected {
        panic!("80x24 mux screen:\n{}", screen.join("\n"));
    }
}

#[test]
fn mux_screens_survive_every_size() {
    let mut h = Harness::ready_mux(80, 24);
    h.send("a");
    h.send(":slot 1");
    h.send("b");
    h.mux_stdout(&[b"ACCEPT 1 3\n".to_vec(), data(1, b"x\ny")].concat());
    // Many more sessions than any panel holds.
    let mut line = String::from("SESSIONS 300");
    for s in 0..300 {
        let state = ["idle", "decode", "prefill"][s % 3];
        line.push_str(&format!(" {s} {state} {s} {} {}", s * 1000, s * 7));
    }
    h.tel(&line);
    for (w, ht) in [
        (1, 1),
        (20, 5),
        (80, 24),
        (100, 40),
        (119, 35),
        (120, 36),
        (160, 48),
        (300, 100),
        (2, 200),
        (300, 2),
    ] {
        assert_eq!(h.screen(w, ht).len(), usize::from(ht));
    }
    // Beside the chat, the busy ones (slots 1, 2, 4, 5, ...) come first.
    let screen = h.screen_text(160, 48);
    assert!(screen.contains("sessions (200 busy / 300)"), "{screen}");
    assert!(screen.contains("›slot 1   decoding"), "{screen}");
    assert!(!screen.contains("slot 0   idle"), "{screen}");
}
