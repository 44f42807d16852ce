//! Render tests on ratatui's `TestBackend`: what is on screen at 80x24 and 160x48, the
//! overlays, and resizing from tiny to huge.

mod common;

use coli::event::ExitInfo;
use common::*;
use crossterm::event::KeyCode;
use ratatui::style::Color;

/// A session after one full turn with every kind of telemetry.
fn scenario(w: u16, h: u16) -> Harness {
    let mut hs = Harness::ready(w, h);
    hs.stderr("[KV] context slots: 1 x 4096 tokens, projected pool 0.05 GB");
    hs.stderr("[PIN] pinned 64 experts (0.40 GB)");
    hs.tel("HWINFO 16 128.0 100.5 0 0.0 AMD EPYC 7B13|");
    hs.tel(&emap_line());
    hs.send("What is a colibri?");
    hs.tel("STATE prefill");
    hs.tel("PROGRESS prefill 20 20");
    hs.tel("STATE generating");
    hs.stdout(b"<think>small bird</think>A hummingbird: tiny, fast, and always hungry.");
    hs.tel("LIVE 10 11.00 85.0 1.30 0");
    hs.tel("HITS 4 16 ff00020000000000");
    hs.tick(12);
    hs.stdout(&turn_bytes(b"", "STAT 12 12.34 87.5 1.31 20 0"));
    hs.tel("REPIN 3 7 2 12 9 1.5");
    hs.tel("DISKCLASS cold 120 2400000000 3.000 2.000 0 warm 30 600000000 0.500 0.400 0");
    hs.tel("TIERS 2 64 190 0.10 0.40");
    hs.tel("STATE idle");
    hs
}

fn contains(screen: &str, needle: &str) {
    assert!(screen.contains(needle), "missing {needle:?} in\n{screen}");
}

#[test]
fn screen_80x24_golden() {
    let mut h = scenario(80, 24);
    let screen = h.screen(80, 24);
    let expected = [
        " conversation ──────────────────────────────────────────────────────────────────",
        "› What is a colibri?                                                            ",
        "                                                                                ",
        "<think>small bird</think>A hummingbird: tiny, fast, and always hungry.          ",
        "└─ 12 tok · 12.34 tok/s · hit 87.5% · RSS 1.31 GB · prompt 20 · 1s · end of text",
        "                                                                                ",
        "                                                                                ",
        "                                                                                ",
        "                                                                                ",
        "                                                                                ",
        "                                                                                ",
        "                                                                                ",
        "                                                                                ",
        "                                                                                ",
        "                                                                                ",
        "                                                                                ",
        "                                                                                ",
        "                                                                                ",
        "                                                                                ",
        "                                                                                ",
        "■VRAM 2 ■RAM 64 ■disk 190 │ hit ▇▇ │ tok/s ▇█ │ cold 2.4 GB warm 0.6 GB         ",
        " message · Enter send · Alt-Enter newline · ? help ─────────────────────────────",
        "                                                                                ",
        " ● idle  12.34 tok/s │ hit 87.5% │ RSS 1.31 GB │ prompt 20 · tok 12 │ slot 0    ",
    ];
    if screen != expected {
        panic!("80x24 screen:\n{}", screen.join("\n"));
    }
}

#[test]
fn screen_160x48_has_the_dashboard_beside_the_chat() {
    let mut h = scenario(160, 48);
    let screen = h.screen_text(160, 48);
    for needle in [
        "A hummingbird: tiny, fast, and always hungry.",
        "hit 87.5%",
        "RSS 1.31 GB",
        "prompt 20 · tok 12",
        "■ VRAM 2  ■ RAM 64  ■ disk 190",
        "VRAM 0.10 GB · RAM 0.40 GB · 256 experts",
        "experts: 4 MoE layers ↓ × 16 experts →",
        "re-pin swaps (1)",
        "L3   e7 (h2) → e12 (h9)  1.5 ms",
        "cold     120 ×   2.40 GB  1.20 GB/s",
        "warm      30 ×   0.60 GB  1.50 GB/s",
        "16 cores · RAM 128.0 GB (100.5 free) · AMD EPYC 7B13",
        "log (stderr)",
        "[PIN] pinned 64 experts (0.40 GB)",
    ] {
        contains(&screen, needle);
    }
    // Beside: the chat's first row and the dashboard's first row share a line.
    let lines = h.screen(160, 48);
    assert!(lines[0].starts_with(" conversation"), "{}", lines[0]);
    assert!(lines[0].contains("16 cores"), "{}", lines[0]);
}

#[test]
fn screen_100x40_has_the_dashboard_below_the_chat() {
    let mut h = scenario(100, 40);
    let lines = h.screen(100, 40);
    let tiers_row = lines
        .iter()
        .position(|l| l.contains("┌ tiers"))
        .expect("tiers");
    let convo_row = lines
        .iter()
        .position(|l| l.contains("A hummingbird"))
        .expect("answer");
    assert!(tiers_row > convo_row);
    contains(&lines.join("\n"), "re-pin swaps (1)");
}

#[test]
fn the_expert_map_is_coloured_by_tier_heat_and_pulse() {
    use coli::ui::cell_colour;
    // Tier hues at full heat, dimmer when cold, white when pulsing.
    assert_eq!(cell_colour(2, 63, 0.0), Color::Rgb(0x4e, 0xd6, 0xa5));
    assert_eq!(cell_colour(1, 24, 0.0), Color::Rgb(0x5a, 0x9b, 0xd8));
    assert_eq!(cell_colour(0, 0, 1.0), Color::Rgb(255, 255, 255));
    let Color::Rgb(r, _, _) = cell_colour(1, 0, 0.0) else {
        unreachable!()
    };
    assert!(r < 0x5a);

    let mut h = scenario(160, 48);
    h.tick(30); // pulses gone
    let mut t = ratatui::Terminal::new(ratatui::backend::TestBackend::new(160, 48)).unwrap();
    t.draw(|f| coli::ui::draw(f, &h.app)).unwrap();
    let buf = t.backend().buffer();
    let (x, y) = find(buf, "experts: 4 MoE layers");
    // First map cell (below the expert numbers, right of the layer numbers): row 0 expert 0
    // (VRAM, heat 0).
    let (x, y) = (x + 1, y + 2);
    assert_eq!(buf[(x - 2, y)].symbol(), "0", "the layer label");
    let cell = &buf[(x, y)];
    assert_eq!(cell.symbol(), "▀");
    assert_eq!(cell.fg, cell_colour(2, 0, 0.0));
    // A pulse turns it white for a moment.
    h.tel("HITS 4 16 0100000000000000");
    t.draw(|f| coli::ui::draw(f, &h.app)).unwrap();
    assert_eq!(t.backend().buffer()[(x, y)].fg, Color::Rgb(255, 255, 255));
}

fn find(buf: &ratatui::buffer::Buffer, needle: &str) -> (u16, u16) {
    for (y, line) in buffer_lines(buf).iter().enumerate() {
        if let Some(i) = line.find(needle) {
            let x = line[..i].chars().count();
            return (x as u16, y as u16);
        }
    }
    panic!("{needle} not on screen");
}

#[test]
fn help_overlay_at_80x24() {
    let mut h = scenario(80, 24);
    h.key(KeyCode::Char('?'));
    let screen = h.screen_text(80, 24);
    contains(&screen, "coli keys");
    contains(&screen, "Ctrl-C  stop the answer; again, or idle: quit");
    contains(&screen, ":slot N  talk on KV slot N");
    contains(&screen, "any key closes this help");
    h.key(KeyCode::Esc);
    assert!(!h.screen_text(80, 24).contains("coli keys"));
}

#[test]
fn loading_shows_progress() {
    let mut h = Harness::new(160, 48);
    h.tel("STATE loading");
    h.tel("PROGRESS load 30 120");
    let screen = h.screen_text(160, 48);
    contains(&screen, "waking colibri");
    contains(&screen, "load 30/120 (25%)");
    contains(&screen, "load 25%");
    let small = h.screen_text(80, 24);
    contains(&small, "load 25%");
}

#[test]
fn streaming_shows_the_answer_so_far_and_live_figures() {
    let mut h = Harness::ready(80, 24);
    h.send("count");
    let waiting = h.screen_text(80, 24);
    contains(&waiting, "thinking…");
    contains(&waiting, "prefill");
    h.stdout(b"one two three");
    h.tel("LIVE 3 4.50 66.7 1.28 0");
    let screen = h.screen_text(80, 24);
    contains(&screen, "one two three▌");
    contains(&screen, "generating");
    contains(&screen, "4.50 tok/s");
    contains(&screen, "hit 66.7%");
    contains(&screen, "tok 3");
}

#[test]
fn a_dead_daemon_shows_status_hint_and_last_stderr_lines() {
    let mut h = scenario(80, 24);
    h.stderr("[RAM] expert cache 6.0 GB");
    h.stderr("[prefill] 400/900");
    h.exit(ExitInfo::signal(9));
    let screen = h.screen_text(80, 24);
    contains(&screen, "colibri stopped");
    contains(&screen, "killed by SIGKILL");
    contains(&screen, "out-of-memory killer; lower --cache or --ram-gb");
    contains(&screen, "[prefill] 400/900");
    contains(&screen, "r restart");
    contains(&screen, "stopped");
    let big = h.screen_text(160, 48);
    contains(&big, "killed by SIGKILL");
}

#[test]
fn wide_and_narrow_text_wraps_and_scrolls_without_panicking() {
    let mut h = Harness::ready(80, 24);
    h.send("wrap");
    let long = "日本語のテキスト🙂 ".repeat(60);
    h.stdout(long.as_bytes());
    h.stdout(&turn_bytes(b"\n\tend\x1b[2J", "STAT 3 1.00 50.0 1.30 2 0"));
    let screen = h.screen_text(80, 24);
    contains(&screen, "日本語");
    contains(&screen, "␛[2J");
    assert!(!screen.contains('\x1b'));
}

#[test]
fn resizing_never_breaks_it() {
    let mut states = vec![scenario(80, 24), Harness::new(80, 24)];
    let mut dead = scenario(80, 24);
    dead.exit(ExitInfo::code(1));
    states.push(dead);
    let mut help = scenario(80, 24);
    help.key(KeyCode::Char('?'));
    states.push(help);
    let mut log = scenario(80, 24);
    log.key(KeyCode::Tab);
    log.key(KeyCode::Tab);
    for i in 0..50 {
        log.stderr(&format!("[prefill] {i}"));
    }
    log.key(KeyCode::PageUp);
    states.push(log);
    let mut multiline = scenario(80, 24);
    for i in 0..12 {
        multiline.type_str(&format!("line {i} {}", "x".repeat(i * 13)));
        multiline.ctrl('j');
    }
    states.push(multiline);
    let sizes: Vec<(u16, u16)> = (1..=30)
        .map(|i| (i * 10, i * 10 / 3))
        .chain([
            (1, 1),
            (20, 5),
            (80, 24),
            (119, 35),
            (120, 36),
            (160, 48),
            (300, 100),
            (2, 200),
            (300, 2),
        ])
        .collect();
    for h in &mut states {
        for &(w, ht) in &sizes {
            let screen = h.screen(w, ht);
            assert_eq!(screen.len(), usize::from(ht));
            h.key(KeyCode::PageUp);
            h.key(KeyCode::PageDown);
        }
    }
}

/// `cargo test -p coli --test render -- --ignored --nocapture capture` prints the screens
/// shown in tui/README.md.
#[test]
#[ignore]
fn capture() {
    for (w, h) in [(80, 24), (160, 48)] {
        let mut hs = scenario(w, h);
        println!("{w}x{h}:");
        for l in hs.screen(w, h) {
            println!("{}", l.trim_end());
        }
    }
}

#[test]
fn rates_panel_shows_tokens_per_forward_and_acceptance_per_source() {
    let mut h = scenario(160, 48);
    contains(&h.screen_text(160, 48), "drafts: no SPEC figures yet");
    // While a turn streams, LIVE's tokens/forward; at its end, SPEC's figures.
    h.tel("LIVE 12 10.00 90.0 1.30 0 1.75");
    contains(&h.screen_text(160, 48), "1.75 tok/fwd");
    h.tel("SPEC 0 256 136 1.88 2 1.60 117 mtp 9 5 55.6 ngram 178 115 64.6 grammar 0 0 0.0");
    let screen = h.screen_text(160, 48);
    contains(
        &screen,
        "1.88 tok/fwd · draft 1.6/2 · mtp 56% · ngram 65% · grammar —",
    );
    // The one-line summary of a small screen carries tokens/forward too.
    contains(&h.screen_text(80, 24), "1.88 tok/fwd");
    // Drafting off says so rather than showing empty acceptance.
    h.tel("SPEC 0 10 10 1.00 0 0.00 0 mtp 0 0 0.0 ngram 0 0 0.0 grammar 0 0 0.0");
    contains(&h.screen_text(160, 48), "1.00 tok/fwd · drafts off");
}

#[test]
fn the_disk_panel_shows_each_drive_of_a_mirrored_model() {
    let mut h = scenario(160, 48);
    // The first line with drives: cumulative rate over each drive's busy seconds.
    h.tel(
        "DISKCLASS cold 120 2400000000 3.000 2.000 0 warm 30 600000000 0.500 0.400 0 \
         drives 2 900 1800000000 2.000 1.000 0 100 200000000 0.400 0.400 3",
    );
    let screen = h.screen_text(160, 48);
    contains(&screen, "disk     900 ×   1.80 GB  1.80 GB/s busy   1s");
    contains(
        &screen,
        "mir1     100 ×   0.20 GB  0.50 GB/s busy   0s 3 failed",
    );
    // One second later: the rate and busy share over that second.
    h.tick(10);
    h.tel(
        "DISKCLASS cold 150 3400000000 4.000 2.500 0 warm 40 1000000000 0.800 0.600 0 \
         drives 2 950 3300000000 3.000 1.500 0 150 700000000 0.700 0.650 3",
    );
    let screen = h.screen_text(160, 48);
    contains(&screen, "disk     950 ×   3.30 GB  1.50 GB/s busy  50%");
    contains(
        &screen,
        "mir1     150 ×   0.70 GB  0.50 GB/s busy  25% 3 failed",
    );
    // A daemon without the tail: no drive rows, as before.
    h.tel("DISKCLASS cold 150 3400000000 4.000 2.500 0 warm 40 1000000000 0.800 0.600 0");
    let screen = h.screen_text(160, 48);
    assert!(!screen.contains("mir1"), "{screen}");
}
