//! Test harness: drives an `App` with recorded byte streams, keys and ticks (time is
//! injected: every tick advances a fake clock by 100 ms), and renders it on a `TestBackend`.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use coli::app::{Action, App, Config};
use coli::event::{Event, ExitInfo};
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use protocol::{parse_telemetry_line, MuxReplyDecoder, ReplyDecoder};
use ratatui::backend::TestBackend;
use ratatui::Terminal;

pub struct Harness {
    pub app: App,
    dec: ReplyDecoder,
    mux_dec: MuxReplyDecoder,
    pub t0: Instant,
    pub clock: Duration,
    pub actions: Vec<Action>,
}

impl Harness {
    pub fn new(w: u16, h: u16) -> Harness {
        Harness::with_config(
            w,
            h,
            Config {
                daemon_desc: "colibri serve --telemetry-fd 3".into(),
                ..Config::default()
            },
        )
    }

    /// A client in mux mode (`coli --mux`), before READY.
    pub fn new_mux(w: u16, h: u16) -> Harness {
        Harness::with_config(
            w,
            h,
            Config {
                daemon_desc: "colibri serve --mux --telemetry-fd 3".into(),
                mux: true,
                ..Config::default()
            },
        )
    }

    /// A mux client past start-up: READY, the start-up STAT, HWINFO, TIERS, EMAP.
    pub fn ready_mux(w: u16, h: u16) -> Harness {
        let mut hs = Harness::new_mux(w, h);
        hs.mux_stdout(b"\x01\x01READY\x01\x01\nSTAT 0 0.00 0.0 1.25\n");
        hs.mux_stdout(b"HWINFO 16 128.0 100.5 0 0.0 AMD EPYC 7B13|\nTIERS 0 64 192 0.00 0.40\n");
        hs.mux_stdout(format!("{}\n", emap_line()).as_bytes());
        hs
    }

    fn with_config(w: u16, h: u16, config: Config) -> Harness {
        let mut h = Harness {
            app: App::new(config, (w, h)),
            dec: ReplyDecoder::new(),
            mux_dec: MuxReplyDecoder::new(),
            t0: Instant::now(),
            clock: Duration::ZERO,
            actions: Vec::new(),
        };
        h.tick(1);
        h
    }

    /// A harness past start-up: READY, the start-up STAT and TIERS.
    pub fn ready(w: u16, h: u16) -> Harness {
        let mut hs = Harness::new(w, h);
        hs.stdout(b"\x01\x01READY\x01\x01\nSTAT 0 0.00 0.0 1.25\nTIERS 0 64 192 0.00 0.40\n");
        hs
    }

    pub fn event(&mut self, ev: Event) {
        let a = self.app.update(ev);
        self.actions.extend(a);
    }

    /// Bytes of the daemon's stdout, decoded as `io.rs` does.
    pub fn stdout(&mut self, bytes: &[u8]) {
        let mut replies = Vec::new();
        self.dec.decode_chunk(bytes, &mut replies);
        for r in replies {
            self.event(Event::Reply(r));
        }
    }

    /// Bytes of the daemon's stdout in mux mode, decoded as `io.rs` does.
    pub fn mux_stdout(&mut self, bytes: &[u8]) {
        let mut replies = Vec::new();
        self.mux_dec.decode_chunk(bytes, &mut replies);
        for r in replies {
            self.event(Event::Mux(r));
        }
    }

    /// One telemetry line (from the telemetry fd).
    pub fn tel(&mut self, line: &str) {
        let t = parse_telemetry_line(line.as_bytes())
            .unwrap_or_else(|| panic!("bad telemetry line in the test: {line}"));
        self.event(Event::Telemetry(t));
    }

    pub fn stderr(&mut self, line: &str) {
        self.event(Event::Stderr(line.to_string()));
    }

    pub fn tick(&mut self, n: u32) {
        for _ in 0..n {
            self.clock += Duration::from_millis(100);
            let now = self.t0 + self.clock;
            self.event(Event::Tick(now));
        }
    }

    pub fn key(&mut self, code: KeyCode) {
        self.key_mod(code, KeyModifiers::NONE);
    }

    pub fn key_mod(&mut self, code: KeyCode, m: KeyModifiers) {
        self.event(Event::Key(KeyEvent::new(code, m)));
    }

    pub fn ctrl(&mut self, c: char) {
        self.key_mod(KeyCode::Char(c), KeyModifiers::CONTROL);
    }

    pub fn type_str(&mut self, s: &str) {
        for c in s.chars() {
            self.key(KeyCode::Char(c));
        }
    }

    /// Types `s` and presses Enter; returns the actions that produced.
    pub fn send(&mut self, s: &str) -> Vec<Action> {
        self.type_str(s);
        let before = self.actions.len();
        self.key(KeyCode::Enter);
        self.actions[before..].to_vec()
    }

    pub fn exit(&mut self, info: ExitInfo) {
        self.event(Event::DaemonExited(info));
    }

    pub fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    /// The screen at `w` x `h`, one string per row.
    pub fn screen(&mut self, w: u16, h: u16) -> Vec<String> {
        self.event(Event::Resize(w, h));
        let mut t = Terminal::new(TestBackend::new(w, h)).expect("test backend");
        t.draw(|f| coli::ui::draw(f, &self.app)).expect("draw");
        buffer_lines(t.backend().buffer())
    }

    pub fn screen_text(&mut self, w: u16, h: u16) -> String {
        self.screen(w, h).join("\n")
    }
}

pub fn buffer_lines(buf: &ratatui::buffer::Buffer) -> Vec<String> {
    let area = buf.area;
    (0..area.height)
        .map(|y| {
            let mut s = String::new();
            let mut skip = 0;
            for x in 0..area.width {
                // A wide character covers the next cell(s) too.
                if skip > 0 {
                    skip -= 1;
                    continue;
                }
                let sym = buf[(x, y)].symbol();
                skip = ratatui::text::Line::from(sym).width().saturating_sub(1);
                s.push_str(sym);
            }
            s
        })
        .collect()
}

/// A small EMAP: 4 rows x 16 experts, tiers by column, heat by row.
pub fn emap_line() -> String {
    let mut hex = String::new();
    for r in 0..4u8 {
        for e in 0..16u8 {
            let tier = if e < 2 {
                2
            } else if e < 8 {
                1
            } else {
                0
            };
            let heat = r * 6 + e % 4;
            hex.push_str(&format!("{:02x}", (tier << 6) | heat));
        }
    }
    format!("EMAP 4 16 {hex}")
}

/// A conversation turn as the daemon writes it to stdout.
pub fn turn_bytes(text: &[u8], stat: &str) -> Vec<u8> {
    let mut v = text.to_vec();
    v.extend_from_slice(b"\n\x01\x01END\x01\x01\n");
    v.extend_from_slice(stat.as_bytes());
    v.push(b'\n');
    v
}
