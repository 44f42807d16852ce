//! The plain data of the client: what the daemon is doing, the conversation's turns, the
//! figures, the start-up options. Transitions live with their inputs, not here.

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
    /// The daemon exited (see [`App::exit`](super::App::exit)).
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
    pub(super) fn next(self) -> Focus {
        match self {
            Focus::Input => Focus::Conversation,
            Focus::Conversation => Focus::Log,
            Focus::Log => Focus::Input,
        }
    }

    pub(super) fn prev(self) -> Focus {
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
    /// Mux mode: the id of the SUBMIT this answer streams from.
    pub request: Option<u64>,
}

impl Turn {
    pub(super) fn new(role: Role, bytes: Vec<u8>, slot: u32) -> Turn {
        Turn {
            role,
            bytes,
            slot,
            streaming: false,
            footer: None,
            request: None,
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
    /// Cache-aware routing's swapped share of the last turn (STAT's `swap_pct=` suffix):
    /// the outputs came from approximate routing. `None`: exact routing.
    pub swap_pct: Option<f64>,
}

/// Why an answer ended, as its footer says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The model wrote a stop token.
    EndOfText,
    /// The answer budget (`--ngen` / `:set max`) was reached.
    TokenLimit,
    /// The conversation reached the context length (`--ctx`).
    ContextFull,
    /// Ctrl-C.
    Stopped,
}

impl StopReason {
    /// From a finished turn's figures: Ctrl-C first, then a conversation that reached the
    /// context (`prompt + completion` tokens fill `ctx` but the last position), then the
    /// daemon's length-limited flag.
    pub fn of(
        interrupted: bool,
        limited: bool,
        prompt_tokens: Option<u32>,
        completion: u32,
        ctx: Option<u32>,
    ) -> StopReason {
        let full = match (prompt_tokens, ctx) {
            (Some(p), Some(c)) => u64::from(p) + u64::from(completion) + 1 >= u64::from(c),
            _ => false,
        };
        if interrupted {
            StopReason::Stopped
        } else if full {
            StopReason::ContextFull
        } else if limited {
            StopReason::TokenLimit
        } else {
            StopReason::EndOfText
        }
    }

    /// The footer's last words.
    pub fn label(self) -> &'static str {
        match self {
            StopReason::EndOfText => "end of text",
            StopReason::TokenLimit => "token limit; :more continues",
            StopReason::ContextFull => "context full; :reset starts over",
            StopReason::Stopped => "stopped by you; :more continues",
        }
    }
}

/// What the daemon told about itself on stderr: its slots and context (`[KV] context slots:
/// N x C tokens ...`) and its model (`[MODEL] ...`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DaemonInfo {
    /// `--kv-slots`.
    pub kv_slots: Option<u32>,
    /// `--ctx`, tokens per slot.
    pub ctx: Option<u32>,
    /// The text after `[MODEL] `, for the header.
    pub model: Option<String>,
}

/// Options fixed at start-up. `max_tokens`, `temperature` and `top_p` apply to every turn
/// in mux mode, to slot > 0 turns in legacy mode.
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
    /// The daemon speaks the multiplexed protocol (`colibri serve --mux`): `coli` templates
    /// every slot's conversation itself and sends SUBMIT frames.
    pub mux: bool,
    /// `--attach URL`: no daemon of its own; chat and dashboard come from a running
    /// `colibri api` at this URL.
    pub attach: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_tokens: 4096,
            temperature: 0.7,
            top_p: 0.9,
            daemon_desc: "colibri serve".into(),
            mux: false,
            attach: None,
        }
    }
}
