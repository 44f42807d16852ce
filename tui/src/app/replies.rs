//! The daemon's stdout: READY, answer text, END and STAT, which close a turn and write its
//! footer. Telemetry that arrives on stdout goes on to [`App::on_telemetry`].

use std::time::Duration;

use protocol::{Reply, Stat};

use super::telemetry::push_sample;
use super::{Action, App, Figures, Pending, Phase, Role, StopReason, Turn};

impl App {
    /// One reply decoded from the daemon's stdout.
    pub fn on_reply(&mut self, reply: Reply) -> Vec<Action> {
        // The start-up STAT is the line right after READY (CONTRACT §3, upstream's
        // `run_serve`): once anything else came, a STAT is a turn's.
        if !matches!(reply, Reply::Ready | Reply::Stat(_)) {
            self.awaiting_startup_stat = false;
        }
        match reply {
            Reply::Ready => {
                self.ever_ready = true;
                self.phase = Phase::Idle;
                self.awaiting_startup_stat = true;
                self.pending = None;
                self.dash.progress = None;
            }
            Reply::Text(bytes) => self.on_text(&bytes),
            Reply::End { leading_newline } => {
                // A PROMPT turn's END has no `\n` of its own: one seen there was the text's.
                if leading_newline && matches!(self.pending, Some(Pending::Prompt { .. })) {
                    self.on_text(b"\n");
                }
                self.ended = true;
            }
            Reply::Stat(stat) => return self.on_stat(stat),
            Reply::Telemetry(t) => self.on_telemetry(t),
        }
        Vec::new()
    }

    fn on_text(&mut self, bytes: &[u8]) {
        if self.phase == Phase::Prefill {
            self.phase = Phase::Generating;
            self.dash.progress = None;
        }
        let slot = self.slot;
        match self.turns.last_mut() {
            Some(t) if t.role == Role::Assistant && t.streaming => t.bytes.extend_from_slice(bytes),
            _ => {
                // Text nobody asked for (a daemon that talks out of turn): show it anyway.
                let mut t = Turn::new(Role::Assistant, bytes.to_vec(), slot);
                t.streaming = true;
                self.turns.push(t);
            }
        }
        if let Some(Pending::Prompt { slot } | Pending::More { slot }) = self.pending {
            if slot != 0 {
                if let Some(convo) = self.slot_prompts.get_mut(&slot) {
                    convo.extend(bytes.iter().filter(|&&b| b != 0));
                }
            }
        }
    }

    fn on_stat(&mut self, stat: Stat) -> Vec<Action> {
        // READY's own STAT, whether or not a request is pending: READY and this STAT are two
        // writes (two events here), and a line typed as soon as READY made us idle may have
        // gone out before it was read. That request's answer ends with its own END + STAT.
        if std::mem::take(&mut self.awaiting_startup_stat) {
            self.figures.rss_gb = stat.rss_gb;
            return Vec::new();
        }
        let pending = self.pending.take();
        self.ended = false;
        self.figures = Figures {
            tokens: stat.completion_tokens,
            tok_per_s: stat.tok_per_s,
            hit_pct: stat.hit_pct,
            rss_gb: stat.rss_gb,
            prompt_tokens: stat.prompt.map(|(p, _)| p).or(self.figures.prompt_tokens),
            swap_pct: stat.route.map(|r| r.swap_pct),
        };
        let elapsed = match (self.turn_started.take(), self.now) {
            (Some(a), Some(b)) => Some(b.saturating_duration_since(a)),
            _ => None,
        };
        if matches!(pending, Some(Pending::Reset { .. }) | None) {
            self.phase = Phase::Idle;
            return Vec::new();
        }
        if stat.completion_tokens > 0 {
            push_sample(&mut self.dash.hit_hist, stat.hit_pct);
            push_sample(&mut self.dash.tps_hist, stat.tok_per_s);
        }
        let limited = stat.prompt.is_some_and(|(_, l)| l);
        let rejected = stat == Stat::zero6(stat.rss_gb);
        // A PROMPT carries the whole conversation, so its prompt tokens plus the answer are
        // the slot's context; a plain chat line's count only the new turn (the daemon starts
        // the conversation over before it could fill: see `on_stderr_line`).
        let convo_tokens = match pending {
            Some(Pending::Prompt { .. }) => stat.prompt.map(|(p, _)| p),
            _ => None,
        };
        let reason = StopReason::of(
            self.interrupted,
            limited,
            convo_tokens,
            stat.completion_tokens,
            self.daemon.ctx,
        );
        let mut footer = turn_footer(&stat, elapsed, reason);
        if self.attached() {
            // `:more` does not apply when attached (see `attach.rs`).
            footer = footer.replace("; :more continues", "");
        }
        if let Some(t) = self.turns.last_mut() {
            if t.role == Role::Assistant && t.streaming {
                t.streaming = false;
                t.footer = Some(if rejected {
                    "└─ refused by colibri".to_string()
                } else {
                    footer
                });
            }
        }
        self.interrupted = false;
        self.phase = Phase::Idle;
        self.clear_stopping_flash();
        let retry = self.retry_text.take();
        if let (true, Some(Pending::Prompt { slot })) = (rejected, pending) {
            let context = self
                .log
                .back()
                .is_some_and(|l| l.contains("[API] refused") && l.contains("the context holds"));
            let had_turns = self
                .slot_prompts
                .get(&slot)
                .is_some_and(|c| c.windows(8).filter(|w| w == b"<|user|>").count() > 1);
            self.slot_prompts.remove(&slot);
            match retry {
                // The same behaviour as slot 0's plain lines and mux mode: the conversation
                // starts over with this message.
                Some(text) if context && had_turns => {
                    self.notice(context_restart_notice(slot, self.daemon.ctx));
                    return self.resend_prompt(slot, &text);
                }
                _ if context => self.notice(format!(
                    "this message alone does not fit the context of slot {slot}{}: shorten it, or start coli with -- --ctx N",
                    self.daemon.ctx.map(|c| format!(" ({c} tokens)")).unwrap_or_default()
                )),
                _ => self.notice(match self.missing_slot(slot) {
                    Some(msg) => msg,
                    None => format!(
                        "the daemon refused the request on slot {slot}: its reason is in the log (Tab); a slot N > 0 needs coli -- --kv-slots N+1"
                    ),
                }),
            }
        }
        Vec::new()
    }
}

/// What the conversation says when a conversation filled the context and starts over with
/// the message just sent: the same words in both protocols and on every slot.
pub(super) fn context_restart_notice(slot: u32, ctx: Option<u32>) -> String {
    format!(
        "the conversation on slot {slot} filled the context{}: it starts over with this message (the earlier turns are forgotten; start coli with -- --ctx N for more room)",
        ctx.map(|c| format!(" ({c} tokens)")).unwrap_or_default()
    )
}

/// `└─ 45 tok · 12.34 tok/s · hit 87.5% · RSS 3.2 GB · 4s · end of text` (why it stopped).
pub(super) fn turn_footer(stat: &Stat, elapsed: Option<Duration>, reason: StopReason) -> String {
    let mut s = format!(
        "└─ {} tok · {:.2} tok/s · hit {:.1}% · RSS {:.2} GB",
        stat.completion_tokens, stat.tok_per_s, stat.hit_pct, stat.rss_gb
    );
    if let Some((p, _)) = stat.prompt {
        s.push_str(&format!(" · prompt {p}"));
    }
    if let Some(r) = &stat.route {
        s.push_str(&format!(" · swap {:.0}%", r.swap_pct));
    }
    if let Some(d) = elapsed {
        s.push_str(&format!(" · {:.0}s", d.as_secs_f64()));
    }
    s.push_str(" · ");
    s.push_str(reason.label());
    s
}
