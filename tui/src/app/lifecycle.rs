//! Everything outside the request/reply exchange: the daemon's stderr, clock ticks, the
//! daemon's exit or failure to start, and restarts.

use std::time::Instant;

use super::{App, Dashboard, Figures, Phase, PULSE_DECAY};
use crate::event::ExitInfo;

/// Stderr lines kept.
pub const LOG_LEN: usize = 2000;

impl App {
    /// One line of the daemon's stderr.
    pub fn on_stderr_line(&mut self, line: &str) {
        if self.log.len() == LOG_LEN {
            self.log.pop_front();
        }
        let line = sanitize(line);
        // The daemon's fatal error (`colibri: ...`, printed once as it exits, e.g. a state
        // folder another daemon holds) belongs in the conversation, not only the hidden log.
        if line.starts_with("colibri: ") {
            self.notice(line.clone());
        }
        self.learn_from_stderr(&line);
        self.log.push_back(line);
        if self.log_scroll > 0 {
            self.log_scroll = (self.log_scroll + 1).min(self.log.len());
        }
    }

    /// What some stderr lines tell the client: the daemon's slots and context, its model,
    /// a conversation resumed from disk, a conversation that starts over.
    fn learn_from_stderr(&mut self, line: &str) {
        if let Some(model) = line.strip_prefix("[MODEL] ") {
            self.daemon.model = Some(model.trim().to_string());
        } else if let Some(rest) = line.strip_prefix("[KV] context slots: ") {
            // `1 x 4096 tokens, ...`
            let mut w = rest.split_whitespace();
            if let (Some(n), Some("x"), Some(c)) = (w.next(), w.next(), w.next()) {
                self.daemon.kv_slots = n.parse().ok();
                self.daemon.ctx = c.parse().ok();
            }
        } else if let Some((slot, tokens)) = resumed(line) {
            // In mux mode coli sends each slot's whole conversation, so a saved one is only
            // a cache of a prefix: nothing continues it. Slots > 0 likewise in legacy mode.
            if !self.config.mux && slot == 0 {
                self.notice(format!(
                    "resumed the saved conversation of slot 0 from disk: {tokens} tokens; your \
                     messages continue it (:reset forgets it)"
                ));
            }
        } else if line.starts_with("[KV] the conversation (")
            && line.contains("would overflow the context")
        {
            // Legacy slot 0: the daemon started a new conversation with the turn just sent.
            let msg = super::replies::context_restart_notice(0, self.daemon.ctx);
            self.notice_before_answer(msg);
        }
    }

    /// A notice placed before the answer streaming now (legacy mode: the answer is the last
    /// turn and keeps receiving text), else at the end.
    fn notice_before_answer(&mut self, msg: String) {
        let turn = super::Turn::new(super::Role::Notice, msg.into_bytes(), self.slot);
        match self.turns.last() {
            Some(t) if !self.config.mux && t.role == super::Role::Assistant && t.streaming => {
                let at = self.turns.len() - 1;
                self.turns.insert(at, turn);
            }
            _ => self.turns.push(turn),
        }
    }

    /// A clock tick (every 100 ms): pulses fade, flashes expire.
    pub fn on_tick(&mut self, now: Instant) {
        self.ticks += 1;
        self.now = Some(now);
        for p in &mut self.dash.pulse {
            *p = if *p > 0.05 { *p * PULSE_DECAY } else { 0.0 };
        }
        if self.flash.as_ref().is_some_and(|(_, t)| self.ticks >= *t) {
            self.flash = None;
        }
    }

    /// The daemon exited.
    pub fn on_daemon_exit(&mut self, info: ExitInfo) {
        self.mux_cut_short("└─ cut short: colibri exited");
        self.phase = Phase::Dead;
        self.pending = None;
        self.interrupted = false;
        self.clear_stopping_flash();
        self.dash.progress = None;
        if let Some(t) = self.turns.last_mut() {
            if t.streaming {
                t.streaming = false;
                t.footer = Some("└─ cut short: colibri exited".into());
            }
        }
        let mut msg = format!("colibri {}", info.describe());
        if let Some(hint) = info.oom_hint() {
            msg.push_str(" — ");
            msg.push_str(hint);
        }
        self.notice(msg);
        self.exit = Some(info);
    }

    /// The daemon could not be started at all.
    pub fn on_spawn_failed(&mut self, msg: String) {
        self.phase = Phase::Dead;
        self.pending = None;
        self.notice(format!("could not start colibri: {msg}"));
        self.spawn_error = Some(msg);
        self.exit = None;
    }

    /// The I/O side started a new daemon after [`Action::Restart`](super::Action::Restart).
    pub fn on_restarted(&mut self) {
        self.phase = Phase::Loading;
        self.exit = None;
        self.spawn_error = None;
        self.pending = None;
        self.ended = false;
        self.awaiting_startup_stat = false;
        self.starts += 1;
        self.daemon = Default::default();
        self.dash = Dashboard::default();
        self.figures = Figures::default();
        self.notice("restarting colibri");
    }
}

/// `[KV] slot <i>: resumed conversation from disk: <n> tokens ...` -> (i, n).
fn resumed(line: &str) -> Option<(u32, u64)> {
    let rest = line.strip_prefix("[KV] slot ")?;
    let (slot, rest) = rest.split_once(": resumed conversation from disk: ")?;
    let tokens = rest.split_whitespace().next()?;
    Some((slot.parse().ok()?, tokens.parse().ok()?))
}

/// Makes a line safe to put on the terminal: control characters become visible symbols
/// (U+2400 block), tabs become spaces, a trailing `\r` goes.
pub fn sanitize(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\t' => out.push_str("    "),
            '\r' => {}
            c if (c as u32) < 0x20 => out.push(char::from_u32(0x2400 + c as u32).unwrap_or('?')),
            '\u{7f}' => out.push('\u{2421}'),
            c if ('\u{80}'..='\u{9f}').contains(&c) => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}
