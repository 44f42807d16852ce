//! The first minutes with `coli` (issue 36): why each answer stopped, one behaviour when the
//! context fills (legacy and mux), a resumed conversation shown, `:slot` refused at once,
//! `:set`, the status bar after a stopped answer, the log pane (Home, wrapping), the 80-column
//! summary, the model in the header, the map's labels, and the exit status. Every test drives
//! an `App` with recorded bytes and renders it on ratatui's `TestBackend`.

mod common;

use coli::app::{Action, Phase};
use coli::event::ExitInfo;
use common::*;
use crossterm::event::KeyCode;
use protocol::mux::{MuxRequest, Submit};
use protocol::{Prompt, Request};

fn contains(screen: &str, needle: &str) {
    assert!(screen.contains(needle), "missing {needle:?} in\n{screen}");
}

/// The screen's words with wrapping undone (each row trimmed, runs of spaces as one), for
/// messages that wrap.
fn words(screen: &str) -> String {
    screen.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn says(screen: &str, message: &str) {
    assert!(
        words(screen).contains(message),
        "missing {message:?} in\n{screen}"
    );
}

fn lacks(screen: &str, needle: &str) {
    assert!(
        !screen.contains(needle),
        "unexpected {needle:?} in\n{screen}"
    );
}

/// A legacy client past start-up that knows the daemon's slots and context.
fn ready_with_kv(slots: u32, ctx: u32) -> Harness {
    let mut h = Harness::ready(100, 30);
    h.stderr(&format!(
        "[KV] context slots: {slots} x {ctx} tokens, 5.3 kB per token, projected pool 0.02 GB"
    ));
    h
}

fn submit_of(a: &Action) -> Submit {
    match a {
        Action::SendRequest(b) => match protocol::mux::decode_mux_request(b) {
            Ok((MuxRequest::Submit(s), _)) => s,
            other => panic!("not a SUBMIT: {other:?}"),
        },
        other => panic!("not a request: {other:?}"),
    }
}

#[test]
fn each_footer_says_why_the_answer_stopped() {
    let mut h = ready_with_kv(2, 64);
    // End of text: not length-limited.
    h.send("one");
    h.stdout(&turn_bytes(b"Amen.", "STAT 2 9.00 50.0 0.10 7 0"));
    // The token limit.
    h.send("two");
    h.stdout(&turn_bytes(b"And it came", "STAT 3 9.00 50.0 0.10 7 1"));
    // Stopped by the user.
    h.send("three");
    h.ctrl('c');
    h.stdout(&turn_bytes(b"And", "STAT 1 9.00 50.0 0.10 7 0"));
    // A PROMPT turn (slot 1) whose conversation reached the context: 40 + 23 + 1 = 64.
    h.send(":slot 1");
    h.send("four");
    h.stdout(b"x\x01\x01END\x01\x01\nSTAT 23 9.00 50.0 0.10 40 1\n");
    let s = h.screen_text(100, 30);
    contains(
        &s,
        "└─ 2 tok · 9.00 tok/s · hit 50.0% · RSS 0.10 GB · prompt 7 · 0s · end of text",
    );
    contains(&s, "prompt 7 · 0s · token limit; :more continues");
    contains(&s, "prompt 7 · 0s · stopped by you; :more continues");
    contains(&s, "prompt 40 · 0s · context full; :reset starts over");
}

#[test]
fn mux_footers_say_why_too() {
    let mut h = Harness::ready_mux(100, 30);
    h.stderr("[KV] context slots: 1 x 64 tokens, 5.3 kB per token, projected pool 0.02 GB");
    h.send("hello");
    h.mux_stdout(b"ACCEPT 1 9\nDATA 1 3\nabc\nDONE 1 STAT 5 9.00 50.0 0.10 9 1\n");
    h.send("again");
    h.mux_stdout(b"ACCEPT 2 20\nDATA 2 1\nz\nDONE 2 STAT 43 9.00 50.0 0.10 20 0\n");
    let s = h.screen_text(100, 30);
    contains(&s, "prompt 9 · 0s · token limit; :more continues");
    contains(&s, "prompt 20 · 0s · context full; :reset starts over");
}

/// Mux: a conversation refused for filling the context starts over with the message, as the
/// legacy protocol's plain lines do, and the chat says so; a message alone too long says how.
#[test]
fn mux_context_full_starts_over_with_the_message() {
    let mut h = Harness::ready_mux(100, 30);
    h.stderr("[KV] context slots: 1 x 4096 tokens, 5.3 kB per token, projected pool 0.02 GB");
    h.send("first");
    h.mux_stdout(b"ACCEPT 1 9\nDATA 1 2\nok\nDONE 1 STAT 1 9.00 50.0 0.10 9 0\n");
    h.take_actions();
    h.send("second");
    let first = submit_of(&h.take_actions()[0]);
    assert!(first
        .payload
        .starts_with(b"[gMASK]<sop><|user|>first<|assistant|>"));
    h.mux_stdout(b"ERROR 2 CONTEXT_EXCEEDED 4100 4094\n");
    let again = h.take_actions();
    assert_eq!(again.len(), 1, "{again:?}");
    let s2 = submit_of(&again[0]);
    assert_eq!(s2.id, 3);
    assert_eq!(
        s2.payload,
        b"[gMASK]<sop><|user|>second<|assistant|><think></think>".to_vec()
    );
    h.mux_stdout(b"ACCEPT 3 12\nDATA 3 3\nnew\nDONE 3 STAT 1 9.00 50.0 0.10 12 0\n");
    let s = h.screen_text(100, 30);
    contains(
        &s,
        "• the conversation on slot 0 filled the context (4096 tokens): it starts over",
    );
    contains(&s, "[0] new");
    lacks(&s, "CONTEXT_EXCEEDED");
    // One message alone too long: said, with the way out.
    h.send(":reset");
    h.send("huge");
    h.mux_stdout(b"ERROR 4 CONTEXT_EXCEEDED 5000 4094\n");
    let s = h.screen_text(100, 30);
    contains(
        &s,
        "this message is 5000 tokens, the context holds 4094: shorten it, or start",
    );
}

/// Legacy: the daemon starts slot 0's conversation over (its stderr says so) and the chat
/// shows it before the answer; a slot > 0 PROMPT refused for the context is sent again alone.
#[test]
fn legacy_context_full_is_shown_and_slots_start_over_too() {
    let mut h = ready_with_kv(2, 4096);
    h.send("hello");
    h.stderr("[KV] the conversation (4000 tokens) would overflow the context of 4096: starting a new one with this turn");
    h.stdout(&turn_bytes(b"Amen.", "STAT 2 9.00 50.0 0.10 7 0"));
    let s = h.screen_text(100, 30);
    let notice = s
        .find("• the conversation on slot 0 filled the context (4096 tokens): it starts over")
        .unwrap_or_else(|| panic!("{s}"));
    assert!(notice < s.find("Amen.").unwrap(), "{s}");
    // Slot 1: the second turn is refused for the context; coli resends it alone.
    h.send(":slot 1");
    h.send("a");
    h.stdout(b"b\x01\x01END\x01\x01\nSTAT 1 9.00 50.0 0.10 9 0\n");
    h.take_actions();
    h.send("c");
    h.stderr("[API] refused: the prompt is 5000 tokens, the context holds 4094 (--ctx 4096); nothing was truncated");
    h.stdout(b"\x01\x01END\x01\x01\nSTAT 0 0.00 0.0 0.10 0 0\n");
    let acts = h.take_actions();
    let resent = acts
        .iter()
        .filter_map(|a| match a {
            Action::SendRequest(b) => Some(b.clone()),
            _ => None,
        })
        .next_back()
        .unwrap();
    let want = Request::Prompt(Prompt {
        max_tokens: 4096,
        temperature: 0.7,
        top_p: 0.9,
        slot: Some(1),
        payload: b"[gMASK]<sop><|user|>c<|assistant|><think></think>".to_vec(),
    })
    .to_bytes()
    .unwrap();
    assert_eq!(resent, want);
    assert_eq!(h.app.phase, Phase::Prefill);
}

#[test]
fn a_resumed_conversation_is_shown_with_its_size_and_how_to_forget_it() {
    let mut h = Harness::new(100, 30);
    h.stderr("[KV] slot 0: resumed conversation from disk: 1678 tokens in 0.004s (no re-prefill)");
    h.stdout(b"\x01\x01READY\x01\x01\nSTAT 0 0.00 0.0 1.25\n");
    let s = h.screen_text(100, 30);
    says(&s, "• resumed the saved conversation of slot 0 from disk: 1678 tokens; your messages continue it (:reset forgets it)");
    // Mux mode resends the whole conversation: nothing continues a saved one, nothing said.
    let mut m = Harness::new_mux(100, 30);
    m.stderr("[KV] slot 0: resumed conversation from disk: 1678 tokens in 0.004s (no re-prefill)");
    lacks(&m.screen_text(100, 30), "resumed the saved");
}

#[test]
fn a_slot_the_daemon_lacks_is_refused_at_once() {
    for mux in [false, true] {
        let mut h = if mux {
            Harness::ready_mux(120, 30)
        } else {
            Harness::ready(120, 30)
        };
        h.stderr("[KV] context slots: 1 x 4096 tokens, 5.3 kB per token, projected pool 0.02 GB");
        h.send(":slot 2");
        assert_eq!(h.app.slot, 0, "mux {mux}");
        says(
            &h.screen_text(100, 30),
            "• slot 2 does not exist: this daemon has 1 slot (0..=0); start coli with -- --kv-slots 3",
        );
        h.stderr("[KV] context slots: 4 x 4096 tokens, 5.3 kB per token, projected pool 0.02 GB");
        h.send(":slot 3");
        assert_eq!(h.app.slot, 3);
    }
}

#[test]
fn set_changes_what_the_next_request_carries() {
    let mut h = Harness::ready_mux(100, 30);
    h.send(":set temp 0.3");
    h.send(":set top_p 0.5");
    h.send(":set max 256");
    h.take_actions();
    h.send("hi");
    let s = submit_of(&h.take_actions()[0]);
    assert_eq!((s.temperature, s.top_p, s.max_tokens), (0.3, 0.5, 256));
    h.send(":set temp 7");
    h.send(":set");
    let screen = h.screen_text(100, 30);
    contains(&screen, "• temperature 0.3 from the next turn");
    contains(&screen, "• :set temp must be in 0..=2, got 7");
    contains(
        &screen,
        "• temp 0.3 · top_p 0.5 · max 256 (:set temp T | top_p P | max N)",
    );
    // Legacy slot 0 sends plain lines: the note says where the value applies.
    let mut l = Harness::ready(100, 30);
    l.send(":set max 64");
    says(&l.screen_text(100, 30), "• answers of at most 64 tokens from the next turn (and the daemon's --ngen); slot 0's plain chat lines use the daemon's --temp, --top-p and --ngen: it applies on :slot N > 0, or with coli --mux");
    // And `?` lists them.
    let mut k = Harness::ready(80, 24);
    k.key(KeyCode::Char('?'));
    let help = k.screen_text(80, 24);
    contains(&help, ":set temp T  temperature 0..=2 of the next turns");
    contains(&help, ":set top_p P  nucleus (0, 1] of the next turns");
    contains(
        &help,
        ":set max N  answer budget (--ngen caps it unless --mux)",
    );
}

#[test]
fn the_stopping_message_goes_when_the_answer_has_ended() {
    let mut h = Harness::ready(160, 30);
    h.send("go");
    h.ctrl('c');
    contains(
        &h.screen_text(160, 30),
        "stopping the answer; Ctrl-C again quits",
    );
    h.stdout(&turn_bytes(b"And", "STAT 1 9.00 50.0 0.10 7 0"));
    lacks(&h.screen_text(160, 30), "stopping the answer");
    let mut m = Harness::ready_mux(160, 30);
    m.send("go");
    m.ctrl('c');
    contains(
        &m.screen_text(160, 30),
        "stopping the answer; Ctrl-C again quits",
    );
    m.mux_stdout(b"ACCEPT 1 9\nDONE 1 STAT 0 0.00 0.0 0.10 9 0\n");
    lacks(&m.screen_text(160, 30), "stopping the answer");
}

#[test]
fn home_in_the_log_stops_at_its_top_and_long_lines_wrap() {
    let mut h = Harness::ready(80, 40);
    for i in 0..30 {
        h.stderr(&format!("[fake] line {i}"));
    }
    let long = format!("[KV] {}the end", "abcd ".repeat(20));
    h.stderr(&long);
    h.key(KeyCode::Tab);
    h.key(KeyCode::Tab); // focus: the log
    h.key(KeyCode::Home);
    let s = h.screen(80, 40);
    // The log pane is the lower half; its first row after Home is the first line.
    let title = s
        .iter()
        .position(|l| l.starts_with(" log (stderr)"))
        .unwrap();
    assert_eq!(s[title + 1].trim_end(), "[fake] line 0", "{}", s.join("\n"));
    // Home again: nothing moves past the top.
    let scroll = h.app.log_scroll;
    h.key(KeyCode::Home);
    h.key(KeyCode::Up);
    assert_eq!(h.app.log_scroll, scroll);
    // End: the long line wraps onto a second row instead of being cut.
    h.key(KeyCode::End);
    let s = h.screen(80, 40);
    let at = s
        .iter()
        .position(|l| l.starts_with("[KV] abcd"))
        .unwrap_or_else(|| panic!("{}", s.join("\n")));
    assert_eq!(
        s[at].trim_end(),
        format!("[KV] {}", "abcd ".repeat(15).trim_end())
    );
    assert_eq!(s[at + 1].trim_end(), "abcd abcd abcd abcd abcd the end");
}

#[test]
fn the_summary_line_fits_80_columns() {
    let mut h = Harness::ready_mux(80, 24);
    h.tel("SESSIONS 3 0 decode 5 100 4 1 prefill 6 50 0 2 idle 0 10 3");
    h.tel("DISKCLASS cold 120 2400000000 3.000 2.000 0 warm 30 600000000 0.500 0.400 0");
    h.tel("REPIN 3 7 2 12 9 1.5");
    h.tel("TIERS 2 64 190 0.10 0.40");
    h.tel("LIVE 10 11.00 85.0 1.30 0");
    let s = h.screen(80, 24);
    let line = s.iter().find(|l| l.starts_with("sessions")).unwrap();
    // Whole segments only: what does not fit is left out, never cut mid-word.
    assert_eq!(
        line.trim_end(),
        "sessions decode 1 prefill 1 idle 1 │ ■VRAM 2 ■RAM 64 ■disk 190 │ hit ▇ │ tok/s █"
    );
}

#[test]
fn the_header_names_the_model_when_the_daemon_does() {
    let mut h = Harness::ready(100, 30);
    lacks(&h.screen_text(100, 30), "glm_moe_dsa");
    h.stderr("[MODEL] demo · glm_moe_dsa · 20 MB · 4 layers, 16 experts/layer · ctx 4096");
    let s = h.screen(100, 30);
    assert_eq!(
        s[0],
        format!(
            " conversation {} demo · glm_moe_dsa · 20 MB · 4 layers, 16 experts/layer · ctx 4096 ",
            "─".repeat(18)
        )
    );
    // Too long for the row: cut with an ellipsis, the title kept.
    let s = h.screen(60, 30);
    assert_eq!(
        s[0],
        " conversation ──── demo · glm_moe_dsa · 20 MB · 4 layers, … "
    );
}

#[test]
fn the_expert_map_has_layer_and_expert_labels() {
    let mut h = Harness::ready(160, 48);
    h.tel(&emap_line());
    let s = h.screen(160, 48);
    let top = s
        .iter()
        .position(|l| l.contains("experts: 4 MoE layers ↓ × 16 experts →"))
        .unwrap_or_else(|| panic!("{}", s.join("\n")));
    let col = s[top].find("┌").unwrap();
    let inner = |row: usize| -> String { s[row][col..].chars().skip(1).take(50).collect() };
    // Expert numbers (3 columns each), layer numbers on their rows (two rows each).
    assert_eq!(
        inner(top + 1),
        "  0  1  2  3  4  5  6  7  8  9  10 11 12 13 14 15 "
    );
    assert!(inner(top + 2).starts_with("0 ▀▀▀"), "{}", s.join("\n"));
    assert!(inner(top + 4).starts_with("1 ▀▀▀"), "{}", s.join("\n"));
    assert!(inner(top + 3).starts_with("  ▀▀▀"), "{}", s.join("\n"));
}

#[test]
fn the_exit_status_says_whether_the_daemon_ever_started() {
    // Could not start at all.
    let mut h = Harness::new(80, 24);
    h.event(coli::event::Event::SpawnFailed(
        "No such file or directory (os error 2)".into(),
    ));
    assert_eq!(h.app.exit_status(), 1);
    // Died while loading.
    let mut h = Harness::new(80, 24);
    h.exit(ExitInfo::code(2));
    assert_eq!(h.app.exit_status(), 1);
    // Quit while loading: not a failure.
    assert_eq!(Harness::new(80, 24).app.exit_status(), 0);
    // Died after READY: it did start.
    let mut h = Harness::ready(80, 24);
    h.exit(ExitInfo::signal(9));
    assert_eq!(h.app.exit_status(), 0);
}

#[test]
fn the_status_bar_fits_80_columns_while_generating() {
    let mut h = ready_with_kv(1, 4096);
    h.send("first");
    h.stdout(&turn_bytes(b"Amen.", "STAT 2 9.00 50.0 0.10 9 0"));
    h.send("go");
    h.stdout(b"And");
    h.tel("LIVE 142 547.32 36.5 0.04 0");
    h.stdout(&[]);
    let s = h.screen(80, 24);
    assert_eq!(
        s[23].trim_end(),
        format!(
            " {} generating  547.32 tok/s│hit 36.5%│RSS 0.04 GB│prompt 9 · tok 142│slot 0",
            s[23].chars().nth(1).unwrap()
        )
    );
}
