//! `App`: everything on screen, and the transitions that change it.
//!
//! Every input (a key, a reply from the daemon's stdout, a telemetry line, a stderr line, a
//! tick, the daemon's exit) goes through one method that mutates the state and returns the
//! [`Action`]s for the I/O side to perform. Nothing here does I/O or reads a clock: ticks
//! carry their `Instant`, so tests drive time exactly.
//!
//! Chat turns: slot 0 (the default) uses plain lines, so the daemon applies the GLM template
//! and keeps (and saves) the conversation itself, as upstream's `coli chat` does. After
//! `:slot N` with N > 0 the turns are `\x02PROMPT` requests carrying the whole conversation of
//! that slot, templated here (`[gMASK]<sop>` once, then `<|user|>{text}<|assistant|>
//! <think></think>{answer}` per turn); the daemon reuses the common prefix with the slot's
//! KV, so only the new turn is prefilled. Multi-line messages keep their newlines there;
//! on slot 0 newlines become spaces (the protocol's plain line).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use protocol::{
    DiskClass, Emap, EngineState, Hits, HwInfo, Live, Prof, Progress, Prompt, Repin, Reply,
    Request, Stat, Telemetry, Tiers,
};
use ratatui::layout::Rect;

use crate::event::{Event, ExitInfo};
use crate::input::{History, Input};

/// What the I/O side must do after a transition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Write these bytes to the daemon's stdin.
    SendRequest(Vec<u8>),
    /// Send SIGINT to the daemon (stop the current answer).
    Interrupt,
    /// Leave: close the daemon's stdin, wait briefly, kill it, restore the terminal.
    Quit,
    /// Start a new daemon (after the previous one died).
    Restart,
}

/// What the daemon is doing, as far as the client knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Started, READY not seen yet.
    Loading,
    /// Waiting for the user.
    Idle,
    /// A request was sent; no answer text yet.
    Prefill,
    /// Answer text is streaming.
    Generating,
    /// The daemon exited (see [`App::exit`]).
    Dead,
}

impl Phase {
    /// The word on the status bar.
    pub fn label(self) -> &'static str {
        match self {
            Phase::Loading => "loading",
            Phase::Idle => "idle",
            Phase::Prefill => "prefill",
            Phase::Generating => "generating",
            Phase::Dead => "stopped",
        }
    }

    /// Whether a turn is in progress.
    pub fn busy(self) -> bool {
        matches!(self, Phase::Prefill | Phase::Generating)
    }
}

/// Which pane takes the navigation keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Focus {
    /// The input box (typing).
    Input,
    /// The conversation (scrolling).
    Conversation,
    /// The stderr log (scrolling).
    Log,
}

impl Focus {
    fn next(self) -> Focus {
        match self {
            Focus::Input => Focus::Conversation,
            Focus::Conversation => Focus::Log,
            Focus::Log => Focus::Input,
        }
    }

    fn prev(self) -> Focus {
        match self {
            Focus::Input => Focus::Log,
            Focus::Conversation => Focus::Input,
            Focus::Log => Focus::Conversation,
        }
    }
}

/// Who wrote a turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The user's message.
    User,
    /// The model's answer (raw bytes as streamed).
    Assistant,
    /// A message from `coli` itself.
    Notice,
}

/// One entry of the conversation.
#[derive(Clone, Debug, PartialEq)]
pub struct Turn {
    /// Who wrote it.
    pub role: Role,
    /// The text: raw bytes for answers (possibly invalid UTF-8), UTF-8 otherwise.
    pub bytes: Vec<u8>,
    /// The KV slot of the turn.
    pub slot: u32,
    /// Still streaming.
    pub streaming: bool,
    /// The line under a finished answer (tokens, tok/s, hit %, ...).
    pub footer: Option<String>,
}

impl Turn {
    fn new(role: Role, bytes: Vec<u8>, slot: u32) -> Turn {
        Turn {
            role,
            bytes,
            slot,
            streaming: false,
            footer: None,
        }
    }
}

/// The request whose END + STAT we are waiting for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pending {
    /// A plain chat line (slot 0).
    Chat,
    /// A `\x02PROMPT` turn on this slot.
    Prompt {
        /// The slot.
        slot: u32,
    },
    /// `\x02MORE`.
    More {
        /// The slot of the answer being continued.
        slot: u32,
    },
    /// `\x02RESET`.
    Reset {
        /// The slot.
        slot: u32,
    },
}

/// The figures on the status bar.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Figures {
    /// Completion tokens of the current or last turn.
    pub tokens: u32,
    /// Tokens per second.
    pub tok_per_s: f64,
    /// Expert hit rate, percent.
    pub hit_pct: f64,
    /// Resident set, GB.
    pub rss_gb: f64,
    /// Prompt tokens of the last turn (6-field STAT).
    pub prompt_tokens: Option<u32>,
}

/// Rates derived from two successive DISKCLASS lines.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DiskRates {
    /// Fraction of the interval the cold class had a load in flight (0..=1).
    pub cold_busy: f64,
    /// Same for the warm class.
    pub warm_busy: f64,
}

/// Everything the dashboard shows.
#[derive(Clone, Debug, Default)]
pub struct Dashboard {
    /// Machine description.
    pub hwinfo: Option<HwInfo>,
    /// Expert counts per tier.
    pub tiers: Option<Tiers>,
    /// The expert map.
    pub emap: Option<Emap>,
    /// Per expert cell (same indexing as `emap.cells`): pulse intensity 0..=1 from HITS,
    /// fading with ticks.
    pub pulse: Vec<f32>,
    /// Hit-rate samples, percent (LIVE lines and turn ends).
    pub hit_hist: VecDeque<f64>,
    /// Tokens-per-second samples.
    pub tps_hist: VecDeque<f64>,
    /// Cumulative DISK-CLASS figures.
    pub disk: Option<DiskClass>,
    /// Busy fractions over the last DISKCLASS interval.
    pub disk_rates: Option<DiskRates>,
    disk_prev: Option<(Instant, DiskClass)>,
    /// Recent live re-pin swaps, newest last.
    pub repins: VecDeque<Repin>,
    /// Re-pin swaps seen in all.
    pub repin_total: u64,
    /// Load / pin / prefill progress, cleared when the phase moves on.
    pub progress: Option<Progress>,
    /// The last PROF line.
    pub prof: Option<Prof>,
}

/// Samples kept for the sparklines.
pub const HISTORY_LEN: usize = 240;
/// Re-pin swaps kept.
pub const REPIN_LEN: usize = 32;
/// Stderr lines kept.
pub const LOG_LEN: usize = 2000;
/// A HITS pulse keeps this fraction of its intensity per tick (100 ms): gone in ~1.5 s.
pub const PULSE_DECAY: f32 = 0.7;

/// Options fixed at start-up.
#[derive(Clone, Debug)]
pub struct Config {
    /// `max_tokens` of `\x02PROMPT` turns (the daemon clamps it to its NGEN).
    pub max_tokens: u32,
    /// Temperature of `\x02PROMPT` turns.
    pub temperature: f64,
    /// Nucleus of `\x02PROMPT` turns.
    pub top_p: f64,
    /// How the daemon was started, for the title line.
    pub daemon_desc: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_tokens: 4096,
            temperature: 0.7,
            top_p: 0.9,
            daemon_desc: "colibri serve".into(),
        }
    }
}

/// The whole client state.
#[derive(Debug)]
pub struct App {
    /// Start-up options.
    pub config: Config,
    /// What the daemon is doing.
    pub phase: Phase,
    /// The conversation.
    pub turns: Vec<Turn>,
    /// The input box.
    pub input: Input,
    /// Sent messages.
    pub history: History,
    /// Which pane has the navigation keys.
    pub focus: Focus,
    /// Conversation lines scrolled up from the bottom (0 = follow the end).
    pub conv_scroll: usize,
    /// Log lines scrolled up from the bottom.
    pub log_scroll: usize,
    /// F2.
    pub show_dashboard: bool,
    /// `?`.
    pub show_help: bool,
    /// Status-bar figures.
    pub figures: Figures,
    /// The KV slot new turns go to.
    pub slot: u32,
    /// Templated conversation per slot > 0 (what the next `\x02PROMPT` extends).
    pub slot_prompts: HashMap<u32, Vec<u8>>,
    /// The request awaiting END + STAT.
    pub pending: Option<Pending>,
    /// END seen for `pending`, STAT not yet.
    ended: bool,
    /// READY seen; the start-up STAT has not arrived yet.
    awaiting_startup_stat: bool,
    /// Ctrl-C was pressed during the current turn (SIGINT sent).
    pub interrupted: bool,
    /// The dashboard data.
    pub dash: Dashboard,
    /// Stderr lines.
    pub log: VecDeque<String>,
    /// How the daemon ended, while `phase == Dead`.
    pub exit: Option<ExitInfo>,
    /// Why the daemon could not be started.
    pub spawn_error: Option<String>,
    /// A one-line message on the status bar, with the tick it expires at.
    pub flash: Option<(String, u64)>,
    /// Ticks seen (spinners, expiry).
    pub ticks: u64,
    /// The time of the last tick.
    pub now: Option<Instant>,
    turn_started: Option<Instant>,
    /// Terminal size (columns, rows).
    pub size: (u16, u16),
    /// How many daemons were started (1 + restarts).
    pub starts: u32,
}

impl App {
    /// A fresh client whose daemon is loading.
    pub fn new(config: Config, size: (u16, u16)) -> App {
        App {
            config,
            phase: Phase::Loading,
            turns: Vec::new(),
            input: Input::default(),
            history: History::default(),
            focus: Focus::Input,
            conv_scroll: 0,
            log_scroll: 0,
            show_dashboard: true,
            show_help: false,
            figures: Figures::default(),
            slot: 0,
            slot_prompts: HashMap::new(),
            pending: None,
            ended: false,
            awaiting_startup_stat: false,
            interrupted: false,
            dash: Dashboard::default(),
            log: VecDeque::new(),
            exit: None,
            spawn_error: None,
            flash: None,
            ticks: 0,
            now: None,
            turn_started: None,
            size,
            starts: 1,
        }
    }

    /// Routes one event to its transition.
    pub fn update(&mut self, event: Event) -> Vec<Action> {
        match event {
            Event::Key(key) => self.on_key(key),
            Event::Paste(text) => {
                self.on_paste(&text);
                Vec::new()
            }
            Event::Resize(w, h) => {
                self.size = (w, h);
                Vec::new()
            }
            Event::Reply(reply) => self.on_reply(reply),
            Event::Telemetry(t) => {
                self.on_telemetry(t);
                Vec::new()
            }
            Event::Stderr(line) => {
                self.on_stderr_line(&line);
                Vec::new()
            }
            Event::Tick(now) => {
                self.on_tick(now);
                Vec::new()
            }
            Event::DaemonExited(info) => {
                self.on_daemon_exit(info);
                Vec::new()
            }
            Event::SpawnFailed(msg) => {
                self.on_spawn_failed(msg);
                Vec::new()
            }
        }
    }

    // ----- keys ---------------------------------------------------------------------------

    /// A key press.
    pub fn on_key(&mut self, key: KeyEvent) -> Vec<Action> {
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        let alt = key.modifiers.contains(KeyModifiers::ALT);
        let shift = key.modifiers.contains(KeyModifiers::SHIFT);

        if ctrl && matches!(key.code, KeyCode::Char('c')) {
            return self.on_ctrl_c();
        }
        if self.show_help {
            // Any key closes the help.
            self.show_help = false;
            return Vec::new();
        }
        if self.phase == Phase::Dead && self.input.is_empty() {
            match key.code {
                KeyCode::Char('r') if !ctrl && !alt => return vec![Action::Restart],
                KeyCode::Char('q') if !ctrl && !alt => return vec![Action::Quit],
                _ => {}
            }
        }
        match key.code {
            KeyCode::Tab => {
                self.focus = self.focus.next();
                return Vec::new();
            }
            KeyCode::BackTab => {
                self.focus = self.focus.prev();
                return Vec::new();
            }
            KeyCode::F(1) => {
                self.show_help = true;
                return Vec::new();
            }
            KeyCode::F(2) => {
                self.show_dashboard = !self.show_dashboard;
                return Vec::new();
            }
            KeyCode::PageUp => {
                self.scroll_up(self.page());
                return Vec::new();
            }
            KeyCode::PageDown => {
                self.scroll_down(self.page());
                return Vec::new();
            }
            KeyCode::Esc => {
                self.focus = Focus::Input;
                return Vec::new();
            }
            KeyCode::Char('d') if ctrl && self.input.is_empty() => return vec![Action::Quit],
            _ => {}
        }
        match self.focus {
            Focus::Input => self.on_input_key(key, ctrl, alt, shift),
            Focus::Conversation | Focus::Log => {
                match key.code {
                    KeyCode::Up | KeyCode::Char('k') => self.scroll_up(1),
                    KeyCode::Down | KeyCode::Char('j') => self.scroll_down(1),
                    KeyCode::Home | KeyCode::Char('g') => self.scroll_up(usize::MAX / 2),
                    KeyCode::End | KeyCode::Char('G') => self.scroll_down(usize::MAX / 2),
                    KeyCode::Char(_) if !ctrl && !alt => {
                        // Typing goes to the input box.
                        self.focus = Focus::Input;
                        return self.on_input_key(key, ctrl, alt, shift);
                    }
                    KeyCode::Enter => self.focus = Focus::Input,
                    _ => {}
                }
                Vec::new()
            }
        }
    }

    fn on_ctrl_c(&mut self) -> Vec<Action> {
        if self.phase.busy() && !self.interrupted {
            self.interrupted = true;
            self.flash("stopping the answer; Ctrl-C again quits");
            vec![Action::Interrupt]
        } else {
            vec![Action::Quit]
        }
    }

    fn on_input_key(&mut self, key: KeyEvent, ctrl: bool, alt: bool, shift: bool) -> Vec<Action> {
        match key.code {
            KeyCode::Enter if alt || shift => self.input.insert_char('\n'),
            KeyCode::Char('j') if ctrl => self.input.insert_char('\n'),
            KeyCode::Enter => return self.submit(),
            KeyCode::Char('?') if self.input.is_empty() && !ctrl && !alt => {
                self.show_help = true;
            }
            KeyCode::Char('u') if ctrl => self.input.kill_to_line_start(),
            KeyCode::Char('w') if ctrl => self.input.kill_word(),
            KeyCode::Char('a') if ctrl => self.input.home(),
            KeyCode::Char('e') if ctrl => self.input.end(),
            KeyCode::Char(c) if !ctrl => self.input.insert_char(c),
            KeyCode::Backspace => self.input.backspace(),
            KeyCode::Delete => self.input.delete(),
            KeyCode::Left => self.input.left(),
            KeyCode::Right => self.input.right(),
            KeyCode::Home => self.input.home(),
            KeyCode::End => self.input.end(),
            KeyCode::Up => self.history_older(),
            KeyCode::Down => self.history_newer(),
            _ => {}
        }
        Vec::new()
    }

    /// Up: to the line above in the input, or (on its first line) the older history entry.
    fn history_older(&mut self) {
        if self.input.up() {
            return;
        }
        let current = self.input.text().to_string();
        if let Some(prev) = self.history.prev(&current) {
            let prev = prev.to_string();
            self.input.set(&prev);
        }
    }

    /// Down: to the line below, or (on the last line) the newer history entry.
    fn history_newer(&mut self) {
        if self.input.down() {
            return;
        }
        if let Some(next) = self.history.newer() {
            let next = next.to_string();
            self.input.set(&next);
        }
    }

    /// A bracketed paste: goes into the input box as typed, newlines included.
    pub fn on_paste(&mut self, text: &str) {
        self.focus = Focus::Input;
        self.input.insert_str(text);
    }

    fn page(&self) -> usize {
        let l = crate::ui::layout(Rect::new(0, 0, self.size.0, self.size.1), self);
        let h = match self.focus {
            Focus::Log => l.log.map_or(1, |r| r.height),
            _ => crate::ui::conversation_inner(l.conversation).height,
        };
        usize::from(h.saturating_sub(2)).max(1)
    }

    fn scroll_up(&mut self, n: usize) {
        if self.focus == Focus::Log {
            let max = self.log.len();
            self.log_scroll = self.log_scroll.saturating_add(n).min(max);
        } else {
            let l = crate::ui::layout(Rect::new(0, 0, self.size.0, self.size.1), self);
            let inner = crate::ui::conversation_inner(l.conversation);
            let total = crate::ui::conversation_line_count(self, inner.width);
            let max = total.saturating_sub(usize::from(inner.height));
            self.conv_scroll = self.conv_scroll.saturating_add(n).min(max);
        }
    }

    fn scroll_down(&mut self, n: usize) {
        if self.focus == Focus::Log {
            self.log_scroll = self.log_scroll.saturating_sub(n);
        } else {
            self.conv_scroll = self.conv_scroll.saturating_sub(n);
        }
    }

    fn flash(&mut self, msg: &str) {
        self.flash = Some((msg.to_string(), self.ticks + 40));
    }

    fn notice(&mut self, msg: impl Into<String>) {
        self.turns
            .push(Turn::new(Role::Notice, msg.into().into_bytes(), self.slot));
    }

    /// Enter in the input box: a command or a chat turn.
    fn submit(&mut self) -> Vec<Action> {
        let text = self.input.text().to_string();
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Vec::new();
        }
        if let Some(cmd) = Command::parse(trimmed) {
            self.history.push(&text);
            self.input.take();
            return self.run_command(cmd);
        }
        if !self.ready_for_request() {
            return Vec::new();
        }
        self.history.push(&text);
        self.input.take();
        self.conv_scroll = 0;
        let text = text.trim_end_matches('\n').to_string();
        let slot = self.slot;
        self.turns
            .push(Turn::new(Role::User, text.clone().into_bytes(), slot));
        let request = if slot == 0 {
            self.pending = Some(Pending::Chat);
            Request::chat_from_text(&text)
        } else {
            self.pending = Some(Pending::Prompt { slot });
            let convo = self.slot_prompts.entry(slot).or_default();
            if convo.is_empty() {
                convo.extend_from_slice(b"[gMASK]<sop>");
            }
            convo.extend_from_slice(b"<|user|>");
            // The protocol refuses NUL bytes in a payload.
            convo.extend(text.bytes().filter(|&b| b != 0));
            convo.extend_from_slice(b"<|assistant|><think></think>");
            Request::Prompt(Prompt {
                max_tokens: self.config.max_tokens.max(1),
                temperature: self.config.temperature,
                top_p: self.config.top_p,
                slot: Some(slot),
                payload: convo.clone(),
            })
        };
        self.start_answer(slot);
        self.send(request)
    }

    fn ready_for_request(&mut self) -> bool {
        match self.phase {
            Phase::Idle => true,
            Phase::Loading => {
                self.flash("the model is still loading");
                false
            }
            Phase::Prefill | Phase::Generating => {
                self.flash("busy: wait for the answer, or Ctrl-C to stop it");
                false
            }
            Phase::Dead => {
                self.flash("colibri is not running: press r (with an empty input) to restart");
                false
            }
        }
    }

    fn start_answer(&mut self, slot: u32) {
        let mut t = Turn::new(Role::Assistant, Vec::new(), slot);
        t.streaming = true;
        self.turns.push(t);
        self.phase = Phase::Prefill;
        self.ended = false;
        self.interrupted = false;
        self.turn_started = self.now;
        self.figures.tokens = 0;
        self.dash.progress = None;
    }

    fn send(&mut self, request: Request) -> Vec<Action> {
        match request.to_bytes() {
            Ok(bytes) => vec![Action::SendRequest(bytes)],
            Err(e) => {
                // Unreachable for requests built above; say so rather than panic.
                self.pending = None;
                self.phase = Phase::Idle;
                self.notice(format!("could not encode the request: {e:?}"));
                Vec::new()
            }
        }
    }

    fn run_command(&mut self, cmd: Command) -> Vec<Action> {
        match cmd {
            Command::Quit => vec![Action::Quit],
            Command::Help => {
                self.show_help = true;
                Vec::new()
            }
            Command::Unknown(name) => {
                self.flash(&format!("unknown command :{name} (? for help)"));
                Vec::new()
            }
            Command::Slot(None) => {
                self.flash("usage: :slot N (0 = the daemon's own conversation)");
                Vec::new()
            }
            Command::Slot(Some(n)) => {
                if self.phase.busy() {
                    self.flash("busy: change the slot after this answer");
                    return Vec::new();
                }
                self.slot = n;
                self.notice(if n == 0 {
                    "slot 0: plain chat lines, the daemon keeps the conversation".to_string()
                } else {
                    format!(
                        "slot {n}: coli sends the templated conversation as PROMPT turns \
                         (the daemon needs --kv-slots > {n})"
                    )
                });
                Vec::new()
            }
            Command::Reset => {
                if !self.ready_for_request() {
                    return Vec::new();
                }
                let slot = self.slot;
                self.slot_prompts.remove(&slot);
                self.pending = Some(Pending::Reset { slot });
                self.phase = Phase::Prefill;
                self.ended = false;
                self.notice(format!("conversation on slot {slot} reset"));
                self.send(Request::Reset {
                    slot: (slot != 0).then_some(slot),
                })
            }
            Command::More => {
                if !self.ready_for_request() {
                    return Vec::new();
                }
                let slot = self.slot;
                self.pending = Some(Pending::More { slot });
                // Continue the last answer in place when it is the last turn.
                match self.turns.last_mut() {
                    Some(t) if t.role == Role::Assistant => {
                        t.streaming = true;
                        t.footer = None;
                        self.phase = Phase::Prefill;
                        self.ended = false;
                        self.interrupted = false;
                        self.turn_started = self.now;
                        self.figures.tokens = 0;
                    }
                    _ => self.start_answer(slot),
                }
                self.conv_scroll = 0;
                self.send(Request::More)
            }
        }
    }

    // ----- daemon stdout ------------------------------------------------------------------

    /// One reply decoded from the daemon's stdout.
    pub fn on_reply(&mut self, reply: Reply) -> Vec<Action> {
        match reply {
            Reply::Ready => {
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
            Reply::Stat(stat) => self.on_stat(stat),
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

    fn on_stat(&mut self, stat: Stat) {
        if self.awaiting_startup_stat && self.pending.is_none() {
            self.awaiting_startup_stat = false;
            self.figures.rss_gb = stat.rss_gb;
            return;
        }
        self.awaiting_startup_stat = false;
        let pending = self.pending.take();
        self.ended = false;
        self.figures = Figures {
            tokens: stat.completion_tokens,
            tok_per_s: stat.tok_per_s,
            hit_pct: stat.hit_pct,
            rss_gb: stat.rss_gb,
            prompt_tokens: stat.prompt.map(|(p, _)| p).or(self.figures.prompt_tokens),
        };
        let elapsed = match (self.turn_started.take(), self.now) {
            (Some(a), Some(b)) => Some(b.saturating_duration_since(a)),
            _ => None,
        };
        if matches!(pending, Some(Pending::Reset { .. }) | None) {
            self.phase = Phase::Idle;
            return;
        }
        if stat.completion_tokens > 0 {
            push_sample(&mut self.dash.hit_hist, stat.hit_pct);
            push_sample(&mut self.dash.tps_hist, stat.tok_per_s);
        }
        let limited = stat.prompt.is_some_and(|(_, l)| l);
        let rejected = stat == Stat::zero6(stat.rss_gb);
        let interrupted = self.interrupted;
        let footer = turn_footer(&stat, elapsed, interrupted, limited);
        if let Some(t) = self.turns.last_mut() {
            if t.role == Role::Assistant && t.streaming {
                t.streaming = false;
                t.footer = Some(footer);
            }
        }
        if rejected && matches!(pending, Some(Pending::Prompt { .. })) {
            if let Some(Pending::Prompt { slot }) = pending {
                self.notice(format!(
                    "the daemon rejected the request on slot {slot} (is --kv-slots > {slot}?)"
                ));
                self.slot_prompts.remove(&slot);
            }
        }
        self.interrupted = false;
        self.phase = Phase::Idle;
    }

    // ----- telemetry ----------------------------------------------------------------------

    /// One telemetry line (from stdout between turns, or from the telemetry fd).
    pub fn on_telemetry(&mut self, t: Telemetry) {
        match t {
            Telemetry::HwInfo(h) => self.dash.hwinfo = Some(h),
            Telemetry::Tiers(t) => self.dash.tiers = Some(t),
            Telemetry::Emap(e) => {
                let n = e.cells.len();
                if self.dash.pulse.len() != n {
                    self.dash.pulse = vec![0.0; n];
                }
                self.dash.emap = Some(e);
            }
            Telemetry::Hits(h) => self.on_hits(&h),
            Telemetry::Prof(p) => self.dash.prof = Some(p),
            Telemetry::Progress(p) => {
                if p.phase == protocol::ProgressPhase::Prefill && self.phase == Phase::Idle {
                    self.phase = Phase::Prefill;
                }
                self.dash.progress = Some(p);
            }
            Telemetry::Live(l) => self.on_live(&l),
            Telemetry::Repin(r) => {
                self.dash.repin_total += 1;
                if self.dash.repins.len() == REPIN_LEN {
                    self.dash.repins.pop_front();
                }
                self.dash.repins.push_back(r);
            }
            Telemetry::DiskClass(d) => self.on_diskclass(d),
            Telemetry::State(s) => self.on_state(s),
            Telemetry::Unknown(_) => {}
        }
    }

    fn on_hits(&mut self, h: &Hits) {
        let Some(e) = &self.dash.emap else { return };
        if (h.rows, h.cols) != (e.rows, e.cols) {
            return;
        }
        if self.dash.pulse.len() != e.cells.len() {
            self.dash.pulse = vec![0.0; e.cells.len()];
        }
        for (i, p) in self.dash.pulse.iter_mut().enumerate() {
            if h.bits.get(i / 8).is_some_and(|b| b >> (i % 8) & 1 == 1) {
                *p = 1.0;
            }
        }
    }

    fn on_live(&mut self, l: &Live) {
        if self.phase == Phase::Prefill && l.tokens > 0 {
            self.phase = Phase::Generating;
            self.dash.progress = None;
        }
        self.figures.tokens = l.tokens;
        self.figures.tok_per_s = l.tok_per_s;
        self.figures.hit_pct = l.hit_pct;
        self.figures.rss_gb = l.rss_gb;
        push_sample(&mut self.dash.hit_hist, l.hit_pct);
        push_sample(&mut self.dash.tps_hist, l.tok_per_s);
    }

    fn on_diskclass(&mut self, d: DiskClass) {
        if let (Some(now), Some((then, prev))) = (self.now, &self.dash.disk_prev) {
            let dt = now.saturating_duration_since(*then).as_secs_f64();
            if dt > 0.0 {
                let frac = |a: f64, b: f64| ((a - b) / dt).clamp(0.0, 1.0);
                self.dash.disk_rates = Some(DiskRates {
                    cold_busy: frac(d.cold.busy_s, prev.cold.busy_s),
                    warm_busy: frac(d.warm.busy_s, prev.warm.busy_s),
                });
            }
        }
        if let Some(now) = self.now {
            self.dash.disk_prev = Some((now, d.clone()));
        }
        self.dash.disk = Some(d);
    }

    fn on_state(&mut self, s: EngineState) {
        if self.phase == Phase::Dead {
            return;
        }
        match s {
            EngineState::Loading => self.phase = Phase::Loading,
            // Idle comes from END + STAT on stdout, which may lag the telemetry fd.
            EngineState::Idle => {
                if self.pending.is_none() && self.phase != Phase::Loading {
                    self.phase = Phase::Idle;
                }
                self.dash.progress = None;
            }
            // The telemetry fd may also trail stdout the other way: a prefill or generating
            // line that arrives after the turn's STAT is stale, and only a request in
            // flight can be prefilling or generating.
            EngineState::Prefill if self.pending.is_some() => self.phase = Phase::Prefill,
            EngineState::Generating if self.pending.is_some() => {
                self.phase = Phase::Generating;
                self.dash.progress = None;
            }
            EngineState::Prefill | EngineState::Generating => {}
        }
    }

    // ----- stderr, ticks, exit ------------------------------------------------------------

    /// One line of the daemon's stderr.
    pub fn on_stderr_line(&mut self, line: &str) {
        if self.log.len() == LOG_LEN {
            self.log.pop_front();
        }
        self.log.push_back(sanitize(line));
        if self.log_scroll > 0 {
            self.log_scroll = (self.log_scroll + 1).min(self.log.len());
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
        self.phase = Phase::Dead;
        self.pending = None;
        self.interrupted = false;
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

    /// The I/O side started a new daemon after [`Action::Restart`].
    pub fn on_restarted(&mut self) {
        self.phase = Phase::Loading;
        self.exit = None;
        self.spawn_error = None;
        self.pending = None;
        self.ended = false;
        self.awaiting_startup_stat = false;
        self.starts += 1;
        self.dash = Dashboard::default();
        self.figures = Figures::default();
        self.notice("restarting colibri");
    }

    /// Whether END was seen and only the STAT is missing (for tests and the status bar).
    pub fn answer_ended(&self) -> bool {
        self.ended
    }

    /// The last `n` stderr lines.
    pub fn last_log_lines(&self, n: usize) -> impl Iterator<Item = &str> {
        self.log
            .iter()
            .skip(self.log.len().saturating_sub(n))
            .map(String::as_str)
    }
}

/// A `:command` typed in the input box.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Command {
    Quit,
    Reset,
    More,
    Slot(Option<u32>),
    Help,
    Unknown(String),
}

impl Command {
    /// `None`: not a command, send it as text (`:)` is a message).
    fn parse(text: &str) -> Option<Command> {
        if text == "exit" || text == "quit" {
            return Some(Command::Quit);
        }
        let rest = text.strip_prefix(':')?;
        let mut words = rest.split_whitespace();
        let name = words.next()?;
        if !name.chars().all(|c| c.is_alphabetic()) {
            return None;
        }
        Some(match name {
            "q" | "quit" | "exit" => Command::Quit,
            "reset" => Command::Reset,
            "more" | "piu" | "più" | "continua" => Command::More,
            "slot" => Command::Slot(words.next().and_then(|w| w.parse().ok())),
            "help" | "h" => Command::Help,
            other => Command::Unknown(other.to_string()),
        })
    }
}

fn push_sample(hist: &mut VecDeque<f64>, v: f64) {
    if hist.len() == HISTORY_LEN {
        hist.pop_front();
    }
    hist.push_back(if v.is_finite() { v.max(0.0) } else { 0.0 });
}

/// `└─ 45 tok · 12.34 tok/s · hit 87.5% · RSS 3.2 GB · 4s` (+ why it stopped).
fn turn_footer(stat: &Stat, elapsed: Option<Duration>, interrupted: bool, limited: bool) -> String {
    let mut s = format!(
        "└─ {} tok · {:.2} tok/s · hit {:.1}% · RSS {:.2} GB",
        stat.completion_tokens, stat.tok_per_s, stat.hit_pct, stat.rss_gb
    );
    if let Some((p, _)) = stat.prompt {
        s.push_str(&format!(" · prompt {p}"));
    }
    if let Some(d) = elapsed {
        s.push_str(&format!(" · {:.0}s", d.as_secs_f64()));
    }
    if interrupted {
        s.push_str(" · ⏹ interrupted; type :more");
    } else if limited {
        s.push_str(" · stopped at the token limit; type :more");
    }
    s
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
