//! App-state tests driven by recorded protocol and telemetry byte streams.

mod common;

use coli::app::{Action, Focus, Pending, Phase, Role};
use coli::event::ExitInfo;
use common::*;
use crossterm::event::{KeyCode, KeyModifiers};

#[test]
fn ready_then_startup_stat_and_tiers_make_it_idle() {
    let mut h = Harness::new(80, 24);
    assert_eq!(h.app.phase, Phase::Loading);
    h.tel("STATE loading");
    h.tel("PROGRESS load 3 12");
    assert_eq!(h.app.dash.progress.as_ref().map(|p| p.done), Some(3));
    h.stdout(b"\x01\x01READY\x01\x01\nSTAT 0 0.00 0.0 1.25\nTIERS 2 64 190 0.10 0.40\n");
    assert_eq!(h.app.phase, Phase::Idle);
    assert_eq!(h.app.figures.rss_gb, 1.25);
    assert!(h.app.dash.progress.is_none());
    let t = h.app.dash.tiers.as_ref().expect("TIERS");
    assert_eq!(
        (t.vram_experts, t.ram_experts, t.disk_experts),
        (2, 64, 190)
    );
    assert!(h.app.turns.is_empty());
    assert!(h.take_actions().is_empty());
}

/// READY and the start-up STAT are two writes on the daemon's side (upstream's and ours) and
/// two events on the client's, so a line typed as soon as READY makes the client idle can go
/// out before the start-up STAT is read. That STAT is READY's, not the turn's: the turn ends
/// with its own END and STAT.
#[test]
fn a_prompt_sent_before_the_startup_stat_arrives_keeps_the_answers_figures() {
    let mut h = Harness::new(100, 30);
    h.stdout(b"\x01\x01READY\x01\x01\n");
    assert_eq!(h.app.phase, Phase::Idle);
    let sent = h.send("hello world");
    assert_eq!(sent, vec![Action::SendRequest("hello world\n".into())]);
    assert_eq!(h.app.pending, Some(Pending::Chat));
    // The start-up STAT and TIERS, already on their way when the line was sent.
    h.stdout(b"STAT 0 0.00 0.0 0.25\nTIERS 2 6 56 0.01 0.03\n");
    assert_eq!(
        h.app.pending,
        Some(Pending::Chat),
        "the start-up STAT ended the turn"
    );
    assert_eq!(h.app.phase, Phase::Prefill);
    assert!(h.app.turns[1].streaming);
    assert_eq!(h.app.turns[1].footer, None);
    assert_eq!(h.app.figures.rss_gb, 0.25);
    h.tick(3);
    h.stdout(b"you said: ");
    assert_eq!(h.app.phase, Phase::Generating);
    h.stdout(&turn_bytes(b"hello world ", "STAT 4 5.00 80.0 0.25 2 0"));
    assert_eq!(h.app.phase, Phase::Idle);
    assert_eq!(h.app.pending, None);
    assert_eq!(h.app.turns.len(), 2);
    let t = &h.app.turns[1];
    assert_eq!(t.bytes, b"you said: hello world ");
    assert!(!t.streaming);
    let footer = t.footer.as_deref().expect("footer");
    assert!(footer.starts_with("└─ 4 tok · 5.00 tok/s"), "{footer}");
    assert_eq!(h.app.figures.tokens, 4);
    assert_eq!(h.app.figures.prompt_tokens, Some(2));
    let screen = h.screen_text(100, 30);
    assert!(screen.contains("└─ 4 tok"), "{screen}");
    assert!(!screen.contains("└─ 0 tok"), "{screen}");
    assert!(screen.contains("prompt 2 · tok 4"), "{screen}");
}

/// Only the line right after READY is READY's STAT: a daemon that skips it does not lose
/// its first turn's STAT to it.
#[test]
fn a_stat_that_does_not_follow_ready_belongs_to_the_turn() {
    let mut h = Harness::new(80, 24);
    h.stdout(b"\x01\x01READY\x01\x01\nTIERS 2 6 56 0.01 0.03\n");
    assert_eq!(h.app.phase, Phase::Idle);
    h.send("hi");
    h.stdout(&turn_bytes(b"hello", "STAT 1 5.00 80.0 0.25 2 0"));
    assert_eq!(h.app.phase, Phase::Idle);
    assert_eq!(h.app.pending, None);
    let footer = h.app.turns[1].footer.as_deref().expect("footer");
    assert!(footer.starts_with("└─ 1 tok"), "{footer}");
}

#[test]
fn a_streamed_turn_grows_the_conversation_and_ends_with_its_figures() {
    let mut h = Harness::ready(80, 24);
    let sent = h.send("hello\u{e9}");
    assert_eq!(sent, vec![Action::SendRequest("hello\u{e9}\n".into())]);
    assert_eq!(h.app.phase, Phase::Prefill);
    assert_eq!(h.app.pending, Some(Pending::Chat));
    assert_eq!(h.app.turns[0].role, Role::User);
    h.tick(5);
    h.stdout(b"Hel");
    assert_eq!(h.app.phase, Phase::Generating);
    h.stdout(b"lo, wor");
    h.tel("LIVE 3 6.00 50.0 1.30 0");
    assert_eq!(h.app.figures.tokens, 3);
    h.stdout(b"ld!\n\x01\x01EN");
    // The `\n` and the partial sentinel are held back by the decoder.
    assert_eq!(h.app.turns[1].bytes, b"Hello, world!");
    assert!(h.app.turns[1].streaming);
    h.tick(10);
    h.stdout(b"D\x01\x01\nSTAT 4 2.50 75.0 1.31 9 0\n");
    let t = &h.app.turns[1];
    assert_eq!(t.bytes, b"Hello, world!");
    assert!(!t.streaming);
    let footer = t.footer.as_deref().expect("footer");
    assert!(footer.contains("4 tok"), "{footer}");
    assert!(footer.contains("2.50 tok/s"), "{footer}");
    assert!(footer.contains("hit 75.0%"), "{footer}");
    assert!(footer.contains("prompt 9"), "{footer}");
    assert!(footer.contains("· 2s"), "{footer}");
    assert_eq!(h.app.phase, Phase::Idle);
    assert_eq!(h.app.figures.prompt_tokens, Some(9));
    assert_eq!(h.app.figures.hit_pct, 75.0);
    assert_eq!(h.app.pending, None);
    // One sample from LIVE, one from the turn's STAT.
    assert_eq!(h.app.dash.hit_hist.len(), 2);
}

/// Cache-aware routing's STAT suffix (upstream's `swap_pct=...`): the footer and the status
/// figures say the turn's routing, hence its output, was approximate; an exact turn clears it.
#[test]
fn a_stat_with_the_cache_route_suffix_shows_the_swap_share() {
    let mut h = Harness::ready(80, 24);
    h.send("hello");
    h.stdout(&turn_bytes(
        b"hi",
        "STAT 2 5.00 80.0 0.25 3 0 swap_pct=25.0 route_swaps=3 route_slots=12 route_agree=75.0 route_kl=0.1234",
    ));
    let footer = h.app.turns[1].footer.as_deref().expect("footer");
    assert!(footer.contains("· swap 25%"), "{footer}");
    assert_eq!(h.app.figures.swap_pct, Some(25.0));
    h.send("again");
    h.stdout(&turn_bytes(b"ok", "STAT 1 5.00 80.0 0.25 3 0"));
    assert_eq!(h.app.figures.swap_pct, None);
    let footer = h.app.turns[3].footer.as_deref().expect("footer");
    assert!(!footer.contains("swap"), "{footer}");
}

#[test]
fn the_conversation_does_not_depend_on_how_stdout_is_chunked() {
    let turn = turn_bytes(
        b"line one\nline \x01two\xe2\x82",
        "STAT 5 1.00 50.0 1.30 7 1",
    );
    let mut whole = Harness::ready(80, 24);
    let mut bytewise = Harness::ready(80, 24);
    whole.send("q");
    bytewise.send("q");
    whole.stdout(&turn);
    for b in &turn {
        bytewise.stdout(std::slice::from_ref(b));
    }
    assert_eq!(whole.app.turns, bytewise.app.turns);
    assert_eq!(whole.app.turns[1].bytes, b"line one\nline \x01two\xe2\x82");
    assert!(whole.app.turns[1]
        .footer
        .as_deref()
        .unwrap()
        .contains("token limit; :more continues"));
}

#[test]
fn invalid_utf8_shows_replacement_characters_but_a_split_character_waits() {
    let mut h = Harness::ready(80, 24);
    h.send("x");
    h.stdout(b"caf\xc3");
    // Streaming: the half of `é` is not shown as garbage yet.
    assert_eq!(coli::ui::display_text(&h.app.turns[1].bytes, true), "caf");
    h.stdout(b"\xa9 \xff!");
    assert_eq!(
        coli::ui::display_text(&h.app.turns[1].bytes, true),
        "café \u{fffd}!"
    );
    h.stdout(b"\xe2\x82");
    assert_eq!(
        coli::ui::display_text(&h.app.turns[1].bytes, true),
        "café \u{fffd}!"
    );
    h.stdout(&turn_bytes(b"", "STAT 3 1.00 50.0 1.30 2 0"));
    assert_eq!(
        coli::ui::display_text(&h.app.turns[1].bytes, false),
        "café \u{fffd}!\u{fffd}"
    );
}

#[test]
fn think_blocks_are_split_out() {
    use coli::ui::think_runs;
    assert_eq!(
        think_runs("<think>hmm</think>Answer"),
        vec![(true, "<think>hmm</think>"), (false, "Answer")]
    );
    assert_eq!(
        think_runs("pre<think>still going"),
        vec![(false, "pre"), (true, "<think>still going")]
    );
    // THINK=1: the prompt ended with <think>, the answer starts inside the block.
    assert_eq!(
        think_runs("reasoning</think>done"),
        vec![(true, "reasoning</think>"), (false, "done")]
    );
    assert_eq!(think_runs("plain"), vec![(false, "plain")]);
}

#[test]
fn emap_and_hits_colour_cells_and_pulses_fade_with_ticks() {
    let mut h = Harness::ready(80, 24);
    h.tel(&emap_line());
    let e = h.app.dash.emap.as_ref().expect("EMAP");
    assert_eq!((e.rows, e.cols), (4, 16));
    assert_eq!(e.tier(0, 0), Some(2));
    assert_eq!(e.tier(0, 5), Some(1));
    assert_eq!(e.tier(3, 15), Some(0));
    assert_eq!(e.heat(3, 1), Some(19));
    assert!(h.app.dash.pulse.iter().all(|&p| p == 0.0));
    // Bits 0..8 and 17: row 0 experts 0..8, row 1 expert 1.
    h.tel("HITS 4 16 ff00020000000000");
    let pulse = &h.app.dash.pulse;
    assert!(pulse[..8].iter().all(|&p| p == 1.0));
    assert_eq!(pulse[8], 0.0);
    assert_eq!(pulse[17], 1.0);
    h.tick(1);
    let p1 = h.app.dash.pulse[0];
    assert!(p1 < 1.0 && p1 > 0.5, "{p1}");
    h.tick(20);
    assert!(h.app.dash.pulse.iter().all(|&p| p == 0.0));
    // HITS of another shape is ignored.
    h.tel("HITS 1 8 ff");
    assert!(h.app.dash.pulse.iter().all(|&p| p == 0.0));
}

#[test]
fn repin_lines_fill_the_swap_list_newest_last() {
    let mut h = Harness::ready(80, 24);
    for i in 0..40 {
        h.tel(&format!("REPIN {i} 7 2 12 9 1.5"));
    }
    assert_eq!(h.app.dash.repin_total, 40);
    assert_eq!(h.app.dash.repins.len(), coli::app::REPIN_LEN);
    assert_eq!(h.app.dash.repins.back().map(|r| r.layer), Some(39));
    assert_eq!(h.app.dash.repins.front().map(|r| r.layer), Some(8));
}

#[test]
fn diskclass_keeps_figures_and_busy_fractions_over_injected_time() {
    let mut h = Harness::ready(80, 24);
    h.tel("DISKCLASS cold 100 2000000000 2.000 1.000 0 warm 10 100000000 0.100 0.100 0");
    assert!(h.app.dash.disk_rates.is_none());
    h.tick(20); // 2 s
    h.tel("DISKCLASS cold 150 3000000000 3.000 2.000 0 warm 20 200000000 0.200 0.300 0");
    let d = h.app.dash.disk.as_ref().expect("DISKCLASS");
    assert_eq!(d.cold.count, 150);
    let r = h.app.dash.disk_rates.expect("rates");
    assert!((r.cold_busy - 0.5).abs() < 1e-9, "{r:?}");
    assert!((r.warm_busy - 0.1).abs() < 1e-9, "{r:?}");
}

#[test]
fn live_lines_and_state_lines_drive_the_status() {
    let mut h = Harness::ready(80, 24);
    h.send("go");
    h.tel("STATE prefill");
    h.tel("PROGRESS prefill 10 40");
    assert_eq!(h.app.phase, Phase::Prefill);
    assert_eq!(h.app.dash.progress.as_ref().map(|p| p.total), Some(40));
    h.tel("STATE generating");
    assert_eq!(h.app.phase, Phase::Generating);
    assert!(h.app.dash.progress.is_none());
    for i in 1..=5 {
        h.tel(&format!("LIVE {i} {}.00 80.0 1.40 0", i * 2));
    }
    assert_eq!(h.app.figures.tok_per_s, 10.0);
    assert_eq!(h.app.dash.tps_hist.len(), 5);
    // STATE idle may overtake the END/STAT on stdout: the turn is still pending.
    h.tel("STATE idle");
    assert_eq!(h.app.phase, Phase::Generating);
    h.stdout(&turn_bytes(b"ok", "STAT 5 10.00 80.0 1.40 3 0"));
    assert_eq!(h.app.phase, Phase::Idle);
}

#[test]
fn ctrl_c_interrupts_a_turn_then_quits() {
    let mut h = Harness::ready(80, 24);
    h.ctrl('c');
    assert_eq!(h.take_actions(), vec![Action::Quit], "idle: quit");

    let mut h = Harness::ready(80, 24);
    h.send("long story");
    h.take_actions();
    h.stdout(b"Once upon");
    h.ctrl('c');
    assert_eq!(h.take_actions(), vec![Action::Interrupt]);
    // The daemon stops through the normal END/STAT path.
    h.stdout(&turn_bytes(b" a time", "STAT 3 1.00 50.0 1.30 4 0"));
    assert_eq!(h.app.phase, Phase::Idle);
    assert!(h.app.turns[1]
        .footer
        .as_deref()
        .unwrap()
        .contains("stopped by you; :more continues"));
    h.send("again");
    h.take_actions();
    h.ctrl('c');
    h.ctrl('c');
    assert_eq!(h.take_actions(), vec![Action::Interrupt, Action::Quit]);
}

#[test]
fn commands_reset_more_quit_and_unknown() {
    let mut h = Harness::ready(80, 24);
    assert_eq!(
        h.send(":reset"),
        vec![Action::SendRequest(b"\x02RESET\n".to_vec())]
    );
    assert_eq!(h.app.pending, Some(Pending::Reset { slot: 0 }));
    h.stdout(b"\x01\x01END\x01\x01\nSTAT 0 0.00 0.0 1.25\n");
    assert_eq!(h.app.phase, Phase::Idle);
    h.send("hi");
    h.stdout(&turn_bytes(b"Hi", "STAT 1 1.00 0.0 1.25 3 1"));
    assert_eq!(
        h.send(":more"),
        vec![Action::SendRequest(b"\x02MORE\n".to_vec())]
    );
    h.stdout(&turn_bytes(b" there", "STAT 1 1.00 0.0 1.25"));
    // MORE continues the same answer.
    assert_eq!(h.app.turns.last().unwrap().bytes, b"Hi there");
    assert!(h.send(":frobnicate").is_empty());
    assert!(h.app.flash.as_ref().unwrap().0.contains("unknown command"));
    // Not a command: a message that starts with a colon.
    assert_eq!(h.send(":)"), vec![Action::SendRequest(b":)\n".to_vec())]);
    h.stdout(&turn_bytes(b"ok", "STAT 1 1.00 0.0 1.25 3 0"));
    assert_eq!(h.send(":q"), vec![Action::Quit]);
}

#[test]
fn slots_other_than_zero_use_prompt_requests_with_the_template() {
    let mut h = Harness::ready(80, 24);
    assert!(h.send(":slot 2").is_empty());
    assert_eq!(h.app.slot, 2);
    let sent = h.send("one\u{e9}");
    let expected_payload = "[gMASK]<sop><|user|>one\u{e9}<|assistant|><think></think>";
    let header = format!("\x02PROMPT {} 4096 0.7 0.9 2\n", expected_payload.len());
    assert_eq!(
        sent,
        vec![Action::SendRequest(
            format!("{header}{expected_payload}\n").into_bytes()
        )]
    );
    // A PROMPT turn's END has no `\n` of its own: the decoder's leading newline is text.
    h.stdout(b"First\n\x01\x01END\x01\x01\nSTAT 1 1.00 0.0 1.25 12 0\n");
    assert_eq!(h.app.turns.last().unwrap().bytes, b"First\n");
    // The next turn carries the whole conversation of the slot.
    h.type_str("two");
    h.key_mod(KeyCode::Enter, KeyModifiers::ALT);
    h.type_str("lines");
    let sent = h.send("");
    let payload =
        format!("{expected_payload}First\n<|user|>two\nlines<|assistant|><think></think>");
    let header = format!("\x02PROMPT {} 4096 0.7 0.9 2\n", payload.len());
    assert_eq!(
        sent,
        vec![Action::SendRequest(
            format!("{header}{payload}\n").into_bytes()
        )]
    );
    h.stdout(b"ok\x01\x01END\x01\x01\nSTAT 1 1.00 0.0 1.25 30 0\n");
    assert_eq!(
        h.send(":reset"),
        vec![Action::SendRequest(b"\x02RESET 2\n".to_vec())]
    );
    assert!(!h.app.slot_prompts.contains_key(&2));
}

#[test]
fn a_rejected_slot_says_why() {
    let mut h = Harness::ready(80, 24);
    h.send(":slot 9");
    h.send("hi");
    h.stdout(b"\x01\x01END\x01\x01\nSTAT 0 0.00 0.0 1.25 0 0\n");
    let last = h.app.turns.last().unwrap();
    assert_eq!(last.role, Role::Notice);
    assert!(String::from_utf8_lossy(&last.bytes).contains("--kv-slots"));
    assert_eq!(h.app.phase, Phase::Idle);
}

#[test]
fn newlines_become_spaces_on_slot_zero_and_enter_while_busy_waits() {
    let mut h = Harness::ready(80, 24);
    h.type_str("a");
    h.key_mod(KeyCode::Enter, KeyModifiers::SHIFT);
    h.type_str("b");
    h.ctrl('j');
    h.type_str("c");
    assert_eq!(h.app.input.text(), "a\nb\nc");
    assert_eq!(h.send(""), vec![Action::SendRequest(b"a b c\n".to_vec())]);
    assert!(h.send("too soon").is_empty());
    assert_eq!(h.app.input.text(), "too soon", "kept for later");
    assert!(h.app.flash.is_some());
}

#[test]
fn up_and_down_browse_the_history() {
    let mut h = Harness::ready(80, 24);
    h.send("first");
    h.stdout(&turn_bytes(b"1", "STAT 1 1.00 0.0 1.25 3 0"));
    h.send("second");
    h.stdout(&turn_bytes(b"2", "STAT 1 1.00 0.0 1.25 3 0"));
    h.type_str("draft");
    h.key(KeyCode::Up);
    assert_eq!(h.app.input.text(), "second");
    h.key(KeyCode::Up);
    assert_eq!(h.app.input.text(), "first");
    h.key(KeyCode::Down);
    h.key(KeyCode::Down);
    assert_eq!(h.app.input.text(), "draft");
}

#[test]
fn focus_cycles_and_typing_returns_to_the_input() {
    let mut h = Harness::ready(80, 24);
    assert_eq!(h.app.focus, Focus::Input);
    h.key(KeyCode::Tab);
    assert_eq!(h.app.focus, Focus::Conversation);
    h.key(KeyCode::Tab);
    assert_eq!(h.app.focus, Focus::Log);
    h.key(KeyCode::BackTab);
    assert_eq!(h.app.focus, Focus::Conversation);
    h.key(KeyCode::Char('x'));
    assert_eq!(h.app.focus, Focus::Input);
    assert_eq!(h.app.input.text(), "x");
    h.key(KeyCode::F(2));
    assert!(!h.app.show_dashboard);
    h.key(KeyCode::Backspace);
    h.key(KeyCode::Char('?'));
    assert!(h.app.show_help);
    h.key(KeyCode::Char('a'));
    assert!(!h.app.show_help, "any key closes the help");
    assert_eq!(h.app.input.text(), "", "and is not typed");
}

#[test]
fn page_up_scrolls_back_within_the_conversation() {
    let mut h = Harness::ready(80, 24);
    h.send("tell me a lot");
    let long: Vec<u8> = (0..100)
        .flat_map(|i| format!("line {i}\n").into_bytes())
        .collect();
    h.stdout(&turn_bytes(&long, "STAT 100 5.00 90.0 1.30 5 0"));
    h.key(KeyCode::PageUp);
    let one_page = h.app.conv_scroll;
    assert!(one_page > 5, "{one_page}");
    for _ in 0..100 {
        h.key(KeyCode::PageUp);
    }
    let max = h.app.conv_scroll;
    // Clamped to the top of the conversation.
    assert!(max < 110, "{max}");
    let screen = h.screen_text(80, 24);
    assert!(screen.contains("› tell me a lot"), "{screen}");
    h.key(KeyCode::PageDown);
    assert_eq!(h.app.conv_scroll, max - one_page);
}

#[test]
fn paste_goes_into_the_input_with_its_newlines() {
    let mut h = Harness::ready(80, 24);
    h.event(coli::event::Event::Paste("one\r\ntwo".into()));
    assert_eq!(h.app.input.text(), "one\ntwo");
}

#[test]
fn a_daemon_killed_by_sigkill_gets_the_oom_hint_and_a_restart() {
    let mut h = Harness::ready(80, 24);
    h.send("big question");
    h.take_actions();
    h.stdout(b"Part");
    h.stderr("[RAM] budget 3.2 GB");
    h.stderr("[prefill] 12/40");
    h.exit(ExitInfo::signal(9));
    assert_eq!(h.app.phase, Phase::Dead);
    let notice = String::from_utf8_lossy(&h.app.turns.last().unwrap().bytes).into_owned();
    assert!(notice.contains("killed by SIGKILL"), "{notice}");
    assert!(
        notice.contains("most likely the kernel's out-of-memory killer; lower --cache or --ram-gb"),
        "{notice}"
    );
    assert!(h.app.turns[1]
        .footer
        .as_deref()
        .unwrap()
        .contains("cut short"));
    assert!(h.send("more?").is_empty(), "nothing to send to");
    h.app.input.take();
    h.key(KeyCode::Char('r'));
    assert_eq!(h.take_actions(), vec![Action::Restart]);
    h.app.on_restarted();
    assert_eq!(h.app.phase, Phase::Loading);
    h.stdout(b"\x01\x01READY\x01\x01\nSTAT 0 0.00 0.0 1.25\n");
    assert_eq!(h.app.phase, Phase::Idle);
}

#[test]
fn an_exit_status_is_reported_without_the_oom_hint() {
    let mut h = Harness::new(80, 24);
    h.stderr("error: --snap /nope: no such directory");
    h.exit(ExitInfo::code(2));
    let notice = String::from_utf8_lossy(&h.app.turns.last().unwrap().bytes).into_owned();
    assert_eq!(notice, "colibri exited with status 2");
    h.key(KeyCode::Char('q'));
    assert_eq!(h.take_actions(), vec![Action::Quit]);
}

#[test]
fn control_characters_in_stderr_are_made_visible() {
    let mut h = Harness::new(80, 24);
    h.stderr("\x1b[31mred\x1b[0m\tx\r");
    assert_eq!(h.app.log.back().unwrap(), "\u{241b}[31mred\u{241b}[0m    x");
}

#[test]
fn telemetry_that_trails_the_turns_stat_does_not_reopen_it() {
    let mut h = Harness::ready(80, 24);
    h.send("hello");
    h.take_actions();
    h.stdout(b"hi\n\x01\x01END\x01\x01\nSTAT 1 5.00 50.0 0.10 3 0\n");
    assert_eq!(h.app.phase, Phase::Idle);
    // The telemetry fd's lines for that same turn arrive after its STAT.
    for line in [
        "STATE prefill",
        "STATE generating",
        "LIVE 1 5.00 50.0 0.10 0",
    ] {
        h.tel(line);
    }
    assert_eq!(
        h.app.phase,
        Phase::Idle,
        "a stale telemetry line reopened the turn"
    );
    // So Ctrl-C still quits.
    h.ctrl('c');
    assert_eq!(h.take_actions(), vec![Action::Quit]);
}

#[test]
fn the_daemons_fatal_error_and_a_failed_save_reach_the_conversation() {
    // A second daemon on a state folder in use: its one `colibri: ` line says why it exits 2.
    let mut h = Harness::new(80, 24);
    let refusal = "colibri: the state folder /m is in use by another colibri (pid 4242): two daemons on one folder would mix their conversations. Stop that one, give this one its own folder with --state-dir DIR, or run without saving state with --kv-save 0";
    h.stderr("[KV] an ordinary log line");
    h.stderr(refusal);
    h.exit(ExitInfo::code(2));
    let notices: Vec<String> = h
        .app
        .turns
        .iter()
        .filter(|t| t.role == Role::Notice)
        .map(|t| String::from_utf8_lossy(&t.bytes).into_owned())
        .collect();
    assert_eq!(
        notices,
        vec![refusal.to_string(), "colibri exited with status 2".into()]
    );

    // A save that failed: the answer stands, the warning says it will not survive a restart.
    let mut h = Harness::ready(80, 24);
    h.tel("KVSAVE 0 fail saving to /m/.coli_kv failed: No space left on device (os error 28)");
    let last = h.app.turns.last().unwrap();
    assert_eq!(last.role, Role::Notice);
    assert_eq!(
        String::from_utf8_lossy(&last.bytes),
        "warning: slot 0's conversation was not saved (saving to /m/.coli_kv failed: No space left on device (os error 28)): it will not survive a restart"
    );
}

#[test]
fn an_incomplete_grammar_answer_is_a_warning_and_a_complete_one_is_silent() {
    let mut h = Harness::ready(80, 24);
    let before = h.app.turns.len();
    h.tel("GRAMMAR 7 complete");
    assert_eq!(
        h.app.turns.len(),
        before,
        "a complete answer needs no notice"
    );
    h.tel("GRAMMAR 8 incomplete");
    let last = h.app.turns.last().unwrap();
    assert_eq!(last.role, Role::Notice);
    assert_eq!(
        String::from_utf8_lossy(&last.bytes),
        "warning: request 8's answer stopped before its grammar was complete: it does not match it"
    );
}
