//! `App`: everything on screen, and the transitions that change it.
//!
//! Every input (a key, a reply from the daemon's stdout, a telemetry line, a stderr line, a
//! tick, the daemon's exit) goes through one method that mutates the state and returns the
//! [`Action`]s for the I/O side to perform. Nothing here does I/O or reads a clock: ticks
//! carry their `Instant`, so tests drive time exactly.
//!
//! The plain types live in `state` (the dashboard's beside what feeds it, in `telemetry`);
//! the transitions are split by where their input comes from: `keys` (the keyboard and
//! pastes), `requests` (what a submitted line sends), `replies` (the daemon's stdout),
//! `telemetry` (the dashboard's feed), `lifecycle` (stderr, ticks, the daemon's exit and
//! restarts) and `mux` (turns, replies and Ctrl-C when the daemon speaks the multiplexed
//! protocol).

mod attach;
mod keys;
mod lifecycle;
mod mux;
mod replies;
mod requests;
mod state;
mod telemetry;

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use crate::event::{Event, ExitInfo};
use crate::input::{History, Input};

pub use attach::ChatRequest;
pub use lifecycle::{sanitize, LOG_LEN};
pub use mux::{InFlight, MuxState, Stage};
pub use state::{Config, DaemonInfo, Figures, Focus, Pending, Phase, Role, StopReason, Turn};
pub use telemetry::{Dashboard, DiskRates, DriveRate, HISTORY_LEN, PULSE_DECAY, REPIN_LEN};

/// What the I/O side must do after a transition.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Write these bytes to the daemon's stdin.
    SendRequest(Vec<u8>),
    /// Attached (`--attach`): send this chat turn to the server; its answer comes back as
    /// text, END and STAT replies.
    Chat(ChatRequest),
    /// Send SIGINT to the daemon (stop the current answer).
    Interrupt,
    /// Leave: close the daemon's stdin, wait briefly, kill it, restore the terminal.
    Quit,
    /// Start a new daemon (after the previous one died).
    Restart,
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
    /// Templated conversation per slot > 0 (what the next `\x02PROMPT` extends); in mux mode
    /// per slot, 0 included (what the next SUBMIT carries).
    pub slot_prompts: HashMap<u32, Vec<u8>>,
    /// The request awaiting END + STAT (legacy protocol).
    pub pending: Option<Pending>,
    /// The requests in flight (mux mode).
    pub mux: MuxState,
    /// END seen for `pending`, STAT not yet.
    ended: bool,
    /// READY was the last reply: a STAT now is the start-up one, not a turn's.
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
    /// What the daemon said about itself on stderr (slots, context, model).
    pub daemon: DaemonInfo,
    /// Some daemon of this session reached READY (else its failure is coli's exit status).
    pub ever_ready: bool,
    /// The last legacy turn's text on a slot > 0, so that a conversation refused for filling
    /// the context can start over with it.
    retry_text: Option<String>,
    /// Attached: the first turn of the conversation sent with each request (`:reset` moves
    /// it past the turns so far).
    attach_from: usize,
}

/// The status-bar message while a Ctrl-C'd answer finishes; cleared when it has.
pub(crate) const STOPPING: &str = "stopping the answer; Ctrl-C again quits";

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
            mux: MuxState::default(),
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
            daemon: DaemonInfo::default(),
            ever_ready: false,
            retry_text: None,
            attach_from: 0,
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
            Event::Mux(reply) => self.on_mux_reply(reply),
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

    fn flash(&mut self, msg: &str) {
        self.flash = Some((msg.to_string(), self.ticks + 40));
    }

    /// Drops the "stopping the answer" flash once nothing is being stopped any more.
    fn clear_stopping_flash(&mut self) {
        let stopping = self.interrupted || self.mux.inflight.values().any(|r| r.stopping);
        if !stopping && self.flash.as_ref().is_some_and(|(m, _)| m == STOPPING) {
            self.flash = None;
        }
    }

    /// The exit status `coli` should end with: 1 when its daemon never reached READY and is
    /// not running (it could not start, or died while loading), else 0.
    pub fn exit_status(&self) -> u8 {
        if !self.ever_ready && self.phase == Phase::Dead {
            1
        } else {
            0
        }
    }

    /// A slot the daemon does not have, said at once: `Some(message)` when `slot` is out of
    /// range of the `--kv-slots` the daemon reported.
    pub(super) fn missing_slot(&self, slot: u32) -> Option<String> {
        let n = self.daemon.kv_slots?;
        (slot >= n).then(|| {
            format!(
                "slot {slot} does not exist: this daemon has {n} slot{} (0..={}); start coli with -- --kv-slots {}",
                if n == 1 { "" } else { "s" },
                n.saturating_sub(1),
                slot + 1
            )
        })
    }

    fn notice(&mut self, msg: impl Into<String>) {
        self.turns
            .push(Turn::new(Role::Notice, msg.into().into_bytes(), self.slot));
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
