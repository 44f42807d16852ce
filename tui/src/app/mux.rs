//! Mux mode (`coli --mux`, the daemon started as `colibri serve --mux`): several slots'
//! turns in flight at once.
//!
//! The server owns the chat template in this protocol, so `coli` keeps each slot's whole
//! conversation text (`[gMASK]<sop>` once, then `<|user|>{text}<|assistant|><think></think>`
//! and the streamed answer per turn) and sends it as a SUBMIT with the next id; the daemon's
//! prefix reuse makes resending it cheap. Each SUBMIT gets exactly one of ACCEPT or an early
//! ERROR, then DATA frames into its answer turn, then DONE (the footer) or ERROR (shown on
//! the turn). Ctrl-C sends `STOP <id>`. The phase on the status bar is derived from the
//! requests in flight: generating while any streams, prefill while any waits, idle else.

use std::collections::BTreeMap;
use std::time::Instant;

use protocol::mux::{ErrorCode, MuxReply, MuxRequest, Submit, MAX_SUBMIT_BYTES};
use protocol::Stat;

use super::replies::{context_restart_notice, turn_footer};
use super::requests::Command;
use super::telemetry::push_sample;
use super::{Action, App, Phase, Role, StopReason, Turn};

/// Where a request in flight is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Sent; neither ACCEPT nor ERROR yet.
    Queued,
    /// ACCEPTed: prefilling a prompt of this many tokens.
    Prefill {
        /// The prompt's tokens, from ACCEPT.
        prompt_tokens: u64,
    },
    /// DATA is arriving.
    Decode,
}

/// One SUBMIT awaiting its DONE or ERROR.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InFlight {
    /// Its KV slot.
    pub slot: u32,
    /// Index of its answer in [`App::turns`] (turns are only ever appended).
    pub turn: usize,
    /// Where it is.
    pub stage: Stage,
    /// `STOP <id>` was sent.
    pub stopping: bool,
    /// The slot's conversation length before this request added to it: an early ERROR
    /// (the turn never ran) rolls the conversation back to it.
    convo_len: usize,
    /// The user's message of this turn (`None` for `:more`): a conversation that no longer
    /// fits the context starts over with it.
    text: Option<String>,
    started: Option<Instant>,
}

/// The requests in flight and the next id to use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MuxState {
    /// The id of the next SUBMIT (ids start at 1 and only grow, across restarts too).
    pub next_id: u64,
    /// In flight, by id (so by age: ids grow).
    pub inflight: BTreeMap<u64, InFlight>,
}

impl Default for MuxState {
    fn default() -> Self {
        MuxState {
            next_id: 1,
            inflight: BTreeMap::new(),
        }
    }
}

impl MuxState {
    /// The request in flight on `slot`, if any.
    pub fn on_slot(&self, slot: u32) -> Option<u64> {
        self.inflight
            .iter()
            .find(|(_, r)| r.slot == slot)
            .map(|(&id, _)| id)
    }
}

/// A SUBMIT's `slot` field is a C `int`.
const MAX_SLOT: u32 = i32::MAX as u32;

impl App {
    /// Enter with a chat line, in mux mode.
    pub(super) fn submit_mux(&mut self, text: String) -> Vec<Action> {
        if !self.mux_slot_free() {
            return Vec::new();
        }
        let (text, slot) = self.take_user_turn(&text);
        let before = self.template_turn(slot, &text);
        self.mux_send(slot, before, None, Some(text))
    }

    /// Sends the slot's conversation as a SUBMIT into a new answer turn, or into
    /// `continue_turn` (`:more`).
    fn mux_send(
        &mut self,
        slot: u32,
        before: usize,
        continue_turn: Option<usize>,
        text: Option<String>,
    ) -> Vec<Action> {
        let payload = self.slot_prompts.get(&slot).cloned().unwrap_or_default();
        if payload.len() as u64 > MAX_SUBMIT_BYTES {
            if let Some(convo) = self.slot_prompts.get_mut(&slot) {
                convo.truncate(before);
            }
            self.notice(format!(
                "the conversation on slot {slot} is over {} MiB, more than a SUBMIT carries: \
                 :reset it",
                MAX_SUBMIT_BYTES >> 20
            ));
            return Vec::new();
        }
        let id = self.mux.next_id;
        self.mux.next_id += 1;
        let turn = match continue_turn {
            Some(i) => {
                let t = &mut self.turns[i];
                t.streaming = true;
                t.footer = None;
                t.request = Some(id);
                i
            }
            None => {
                let mut t = Turn::new(Role::Assistant, Vec::new(), slot);
                t.streaming = true;
                t.request = Some(id);
                self.turns.push(t);
                self.turns.len() - 1
            }
        };
        self.mux.inflight.insert(
            id,
            InFlight {
                slot,
                turn,
                stage: Stage::Queued,
                stopping: false,
                convo_len: before,
                text,
                started: self.now,
            },
        );
        if slot == self.slot {
            self.figures.tokens = 0;
        }
        self.mux_phase();
        let submit = Submit {
            id,
            slot,
            max_tokens: self.config.max_tokens.clamp(1, i32::MAX as u32),
            temperature: self.config.temperature,
            top_p: self.config.top_p,
            payload,
            grammar: None,
            logprobs: None,
            ids: false,
        };
        vec![Action::SendRequest(MuxRequest::Submit(submit).to_bytes())]
    }

    /// Whether a turn may go to the current slot now (else says why on the status bar).
    fn mux_slot_free(&mut self) -> bool {
        match self.phase {
            Phase::Loading => {
                self.flash("the model is still loading");
                false
            }
            Phase::Dead => {
                self.flash("colibri is not running: press r (with an empty input) to restart");
                false
            }
            _ if self.mux.on_slot(self.slot).is_some() => {
                let msg = format!(
                    "slot {} is busy: wait, Ctrl-C to stop it, or :slot N for another",
                    self.slot
                );
                self.flash(&msg);
                false
            }
            _ => true,
        }
    }

    /// `:slot`, `:reset` and `:more` in mux mode (the others are the same in both modes).
    pub(super) fn run_mux_command(&mut self, cmd: Command) -> Vec<Action> {
        match cmd {
            Command::Slot(Some(n)) if n > MAX_SLOT => {
                self.flash(&format!("slots go up to {MAX_SLOT}"));
                Vec::new()
            }
            Command::Slot(Some(n)) if self.missing_slot(n).is_some() => {
                let msg = self.missing_slot(n).unwrap_or_default();
                self.notice(msg);
                Vec::new()
            }
            Command::Slot(Some(n)) => {
                // Other slots keep streaming: that is what mux mode is for.
                self.slot = n;
                self.notice(format!(
                    "slot {n}: coli keeps this slot's conversation and resends it each turn \
                     (the daemon needs --kv-slots > {n})"
                ));
                Vec::new()
            }
            Command::Reset => {
                if !self.mux_slot_free() {
                    return Vec::new();
                }
                let slot = self.slot;
                self.slot_prompts.remove(&slot);
                self.notice(format!("conversation on slot {slot} reset"));
                Vec::new()
            }
            Command::More => {
                if !self.mux_slot_free() {
                    return Vec::new();
                }
                let slot = self.slot;
                if self.slot_prompts.get(&slot).is_none_or(Vec::is_empty) {
                    self.flash(&format!("nothing to continue on slot {slot}"));
                    return Vec::new();
                }
                // Continue the last answer in place when it is the last turn.
                let continue_turn = match self.turns.last() {
                    Some(t) if t.role == Role::Assistant && t.slot == slot => {
                        Some(self.turns.len() - 1)
                    }
                    _ => None,
                };
                self.conv_scroll = 0;
                let before = self.slot_prompts.get(&slot).map_or(0, Vec::len);
                self.mux_send(slot, before, continue_turn, None)
            }
            other => self.run_command(other),
        }
    }

    /// Ctrl-C in mux mode: STOP the current slot's request, or (none there) every request;
    /// quit when nothing is left to stop.
    pub(super) fn mux_ctrl_c(&mut self) -> Vec<Action> {
        let slot = self.slot;
        let live = |r: &InFlight| !r.stopping;
        let mut targets: Vec<u64> = self
            .mux
            .inflight
            .iter()
            .filter(|(_, r)| live(r) && r.slot == slot)
            .map(|(&id, _)| id)
            .collect();
        if targets.is_empty() {
            targets = self
                .mux
                .inflight
                .iter()
                .filter(|(_, r)| live(r))
                .map(|(&id, _)| id)
                .collect();
        }
        if targets.is_empty() {
            return vec![Action::Quit];
        }
        let mut actions = Vec::new();
        for id in targets {
            if let Some(r) = self.mux.inflight.get_mut(&id) {
                r.stopping = true;
            }
            actions.push(Action::SendRequest(MuxRequest::Stop { id }.to_bytes()));
        }
        self.flash(super::STOPPING);
        actions
    }

    /// One frame decoded from the daemon's stdout in mux mode.
    pub fn on_mux_reply(&mut self, reply: MuxReply) -> Vec<Action> {
        if !matches!(reply, MuxReply::Ready | MuxReply::Stat(_)) {
            self.awaiting_startup_stat = false;
        }
        match reply {
            MuxReply::Ready => {
                self.ever_ready = true;
                // A second READY: the daemon restarted under us; what was in flight is gone.
                self.mux_cut_short("└─ cut short: colibri restarted");
                self.phase = Phase::Idle;
                self.awaiting_startup_stat = true;
                self.dash.progress = None;
            }
            MuxReply::Stat(stat) => {
                if std::mem::take(&mut self.awaiting_startup_stat) {
                    self.figures.rss_gb = stat.rss_gb;
                }
            }
            MuxReply::Accept { id, prompt_tokens } => {
                if let Some(r) = self.mux.inflight.get_mut(&id) {
                    r.stage = Stage::Prefill { prompt_tokens };
                    if r.slot == self.slot {
                        self.figures.prompt_tokens = u32::try_from(prompt_tokens).ok();
                    }
                }
            }
            // coli asks for no logprobs; a frame that carries them is still the token's text.
            MuxReply::Data { id, bytes } | MuxReply::DataLogprobs { id, bytes, .. } => {
                self.on_mux_data(id, &bytes)
            }
            // A prompt read-out (`logprobs=k`): nothing to show.
            MuxReply::Echo { .. } => {}
            MuxReply::Done { id, stat } => self.on_mux_done(id, stat),
            MuxReply::Error { id, code } => {
                let actions = self.on_mux_error(id, code);
                self.mux_phase();
                self.clear_stopping_flash();
                return actions;
            }
            MuxReply::Telemetry(t) => self.on_telemetry(t),
            // Unknown line kinds: ignored, as upstream's forward-compatibility rule says.
            MuxReply::Other(_) => {}
        }
        self.mux_phase();
        self.clear_stopping_flash();
        Vec::new()
    }

    fn on_mux_data(&mut self, id: u64, bytes: &[u8]) {
        let Some(r) = self.mux.inflight.get_mut(&id) else {
            return; // a request already ended (or from before a restart)
        };
        r.stage = Stage::Decode;
        let (slot, turn) = (r.slot, r.turn);
        if let Some(t) = self.turns.get_mut(turn) {
            t.bytes.extend_from_slice(bytes);
        }
        if let Some(convo) = self.slot_prompts.get_mut(&slot) {
            convo.extend(bytes.iter().filter(|&&b| b != 0));
        }
        if slot == self.slot {
            self.dash.progress = None;
        }
    }

    fn on_mux_done(&mut self, id: u64, stat: Stat) {
        let Some(r) = self.mux.inflight.remove(&id) else {
            return;
        };
        let elapsed = match (r.started, self.now) {
            (Some(a), Some(b)) => Some(b.saturating_duration_since(a)),
            _ => None,
        };
        let limited = stat.prompt.is_some_and(|(_, l)| l);
        // A SUBMIT carries the whole conversation: prompt + answer is the slot's context.
        let reason = StopReason::of(
            r.stopping,
            limited,
            stat.prompt.map(|(p, _)| p),
            stat.completion_tokens,
            self.daemon.ctx,
        );
        if let Some(t) = self.turns.get_mut(r.turn) {
            t.streaming = false;
            t.footer = Some(turn_footer(&stat, elapsed, reason));
        }
        if r.slot == self.slot {
            self.figures.tokens = stat.completion_tokens;
            self.figures.tok_per_s = stat.tok_per_s;
            self.figures.hit_pct = stat.hit_pct;
            self.figures.rss_gb = stat.rss_gb;
            self.figures.swap_pct = stat.route.map(|r| r.swap_pct);
            if let Some((p, _)) = stat.prompt {
                self.figures.prompt_tokens = Some(p);
            }
        }
        if stat.completion_tokens > 0 {
            push_sample(&mut self.dash.hit_hist, stat.hit_pct);
            push_sample(&mut self.dash.tps_hist, stat.tok_per_s);
        }
    }

    fn on_mux_error(&mut self, id: u64, code: ErrorCode) -> Vec<Action> {
        // Upstream answers a header it cannot parse with id 0; SUBMITs are answered in
        // order, so that is the oldest one still waiting for ACCEPT.
        let key = if id == 0 {
            self.mux
                .inflight
                .iter()
                .find(|(_, r)| r.stage == Stage::Queued)
                .map(|(&k, _)| k)
        } else {
            Some(id).filter(|k| self.mux.inflight.contains_key(k))
        };
        let Some(r) = key.and_then(|k| self.mux.inflight.remove(&k)) else {
            // NOT_FOUND answers a STOP that crossed the request's DONE: nothing to show.
            if code != ErrorCode::NotFound {
                self.notice(format!("colibri: ERROR {id} {code}"));
            }
            return Vec::new();
        };
        let early = r.stage == Stage::Queued;
        if early {
            // The turn never ran: the next one must not carry it.
            if let Some(convo) = self.slot_prompts.get_mut(&r.slot) {
                convo.truncate(r.convo_len);
            }
            // The conversation filled the context: it starts over with this message, as the
            // legacy protocol's plain lines do (one behaviour in both modes).
            if let (ErrorCode::ContextExceeded { .. }, Some(text), true) =
                (&code, &r.text, r.convo_len > 0)
            {
                let text = text.clone();
                if let Some(t) = self.turns.get_mut(r.turn) {
                    // The answer turn is reused by the new request; its slot tag stays.
                    t.bytes.clear();
                }
                self.slot_prompts.remove(&r.slot);
                let before = self.template_turn(r.slot, &text);
                self.notice(context_restart_notice(r.slot, self.daemon.ctx));
                return self.mux_send(r.slot, before, Some(r.turn), Some(text));
            }
        }
        let footer = match code {
            ErrorCode::Cancelled => "└─ cancelled".to_string(),
            other => format!("└─ error {}: {}", other.word(), explain(other, r.slot)),
        };
        if let Some(t) = self.turns.get_mut(r.turn) {
            t.streaming = false;
            t.footer = Some(footer);
        }
        Vec::new()
    }

    /// Ends every request in flight (the daemon exited or restarted).
    pub(super) fn mux_cut_short(&mut self, footer: &str) {
        for r in std::mem::take(&mut self.mux.inflight).into_values() {
            if let Some(t) = self.turns.get_mut(r.turn) {
                if t.streaming {
                    t.streaming = false;
                    t.footer = Some(footer.to_string());
                }
            }
        }
    }

    /// The phase from the requests in flight (loading and stopped are left as they are).
    pub(super) fn mux_phase(&mut self) {
        if matches!(self.phase, Phase::Loading | Phase::Dead) {
            return;
        }
        let stages = self.mux.inflight.values().map(|r| r.stage);
        self.phase = if stages.clone().any(|s| s == Stage::Decode) {
            Phase::Generating
        } else if stages.count() > 0 {
            Phase::Prefill
        } else {
            Phase::Idle
        };
    }
}

/// What an ERROR means for the user.
fn explain(code: ErrorCode, slot: u32) -> String {
    match code {
        ErrorCode::BadRequest => format!("the daemon refused it (is --kv-slots > {slot}?)"),
        ErrorCode::BadFrame => "the daemon could not frame the request".into(),
        ErrorCode::SlotBusy => format!("slot {slot} is busy with another client's request"),
        ErrorCode::DuplicateId => "another client uses the same request id".into(),
        ErrorCode::EmptyPrompt => "the prompt is empty once tokenized".into(),
        // A conversation with earlier turns starts over instead (`on_mux_error`): this is
        // one message too long on its own.
        ErrorCode::ContextExceeded { tokens, limit } => format!(
            "this message is {tokens} tokens, the context holds {limit}: shorten it, or start \
             coli with -- --ctx N"
        ),
        ErrorCode::NotFound => "the daemon does not know this request".into(),
        ErrorCode::Cancelled => "cancelled".into(),
        ErrorCode::EngineError => {
            "the engine failed (see the log); the conversation is as before it".into()
        }
    }
}
