//! What a submitted line sends: a chat turn or a `:command`, encoded as a [`Request`].
//!
//! Chat turns: slot 0 (the default) uses plain lines, so the daemon applies the GLM template
//! and keeps (and saves) the conversation itself, as upstream's `coli chat` does. After
//! `:slot N` with N > 0 the turns are `\x02PROMPT` requests carrying the whole conversation of
//! that slot, templated here (`[gMASK]<sop>` once, then `<|user|>{text}<|assistant|>
//! <think></think>{answer}` per turn); the daemon reuses the common prefix with the slot's
//! KV, so only the new turn is prefilled. Multi-line messages keep their newlines there;
//! on slot 0 newlines become spaces (the protocol's plain line). Mux mode sends SUBMIT frames
//! instead, for every slot (`mux.rs`).

use protocol::{Prompt, Request};

use super::{Action, App, Pending, Phase, Role, Turn};

impl App {
    /// Enter in the input box: a command or a chat turn.
    pub(super) fn submit(&mut self) -> Vec<Action> {
        let text = self.input.text().to_string();
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Vec::new();
        }
        if self.attached() {
            return self.submit_attached(text);
        }
        if let Some(cmd) = Command::parse(trimmed) {
            self.history.push(&text);
            self.input.take();
            return if self.config.mux {
                self.run_mux_command(cmd)
            } else {
                self.run_command(cmd)
            };
        }
        if self.config.mux {
            return self.submit_mux(text);
        }
        if !self.ready_for_request() {
            return Vec::new();
        }
        let (text, slot) = self.take_user_turn(&text);
        let request = if slot == 0 {
            self.pending = Some(Pending::Chat);
            Request::chat_from_text(&text)
        } else {
            self.retry_text = Some(text.clone());
            self.pending = Some(Pending::Prompt { slot });
            self.template_turn(slot, &text);
            self.prompt_request(slot)
        };
        self.start_answer(slot);
        self.send(request)
    }

    /// The `\x02PROMPT` carrying `slot`'s whole conversation.
    fn prompt_request(&self, slot: u32) -> Request {
        Request::Prompt(Prompt {
            max_tokens: self.config.max_tokens.max(1),
            temperature: self.config.temperature,
            top_p: self.config.top_p,
            slot: Some(slot),
            payload: self.slot_prompts.get(&slot).cloned().unwrap_or_default(),
        })
    }

    /// Sends `text` again as the first turn of a fresh conversation on `slot` (legacy
    /// protocol, slot > 0: the old one filled the context).
    pub(super) fn resend_prompt(&mut self, slot: u32, text: &str) -> Vec<Action> {
        self.slot_prompts.remove(&slot);
        self.template_turn(slot, text);
        self.pending = Some(Pending::Prompt { slot });
        let request = self.prompt_request(slot);
        self.start_answer(slot);
        self.send(request)
    }

    /// Takes the input line as the user's turn on the current slot (history, input box,
    /// scroll, the conversation): the text without its trailing newline, and the slot.
    pub(super) fn take_user_turn(&mut self, text: &str) -> (String, u32) {
        self.history.push(text);
        self.input.take();
        self.conv_scroll = 0;
        let text = text.trim_end_matches('\n').to_string();
        let slot = self.slot;
        self.turns
            .push(Turn::new(Role::User, text.clone().into_bytes(), slot));
        (text, slot)
    }

    /// Appends one user turn in the GLM chat template to `slot`'s conversation text (the
    /// first one opens with `[gMASK]<sop>`); the conversation's length before it.
    pub(super) fn template_turn(&mut self, slot: u32, text: &str) -> usize {
        let convo = self.slot_prompts.entry(slot).or_default();
        let before = convo.len();
        if convo.is_empty() {
            convo.extend_from_slice(b"[gMASK]<sop>");
        }
        convo.extend_from_slice(b"<|user|>");
        // The protocol refuses NUL bytes in a payload.
        convo.extend(text.bytes().filter(|&b| b != 0));
        convo.extend_from_slice(b"<|assistant|><think></think>");
        before
    }

    pub(super) fn ready_for_request(&mut self) -> bool {
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

    pub(super) fn start_answer(&mut self, slot: u32) {
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

    pub(super) fn run_command(&mut self, cmd: Command) -> Vec<Action> {
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
                if let Some(msg) = self.missing_slot(n) {
                    self.notice(msg);
                    return Vec::new();
                }
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
            Command::Set(what) => {
                self.set_option(what);
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

    /// `:set KEY VALUE`: a per-request value of the protocol (PROMPT and SUBMIT carry
    /// max_tokens, temperature and top_p), from the next turn on.
    fn set_option(&mut self, what: SetCommand) {
        let changes = matches!(
            what,
            SetCommand::Temp(_) | SetCommand::TopP(_) | SetCommand::Max(_)
        );
        let c = &mut self.config;
        let msg = match what {
            SetCommand::Show => format!(
                "temp {} · top_p {} · max {} (:set temp T | top_p P | max N)",
                c.temperature, c.top_p, c.max_tokens
            ),
            SetCommand::Bad(why) => why,
            SetCommand::Temp(t) => {
                c.temperature = t;
                format!("temperature {t} from the next turn")
            }
            SetCommand::TopP(p) => {
                c.top_p = p;
                format!("top_p {p} from the next turn")
            }
            SetCommand::Max(n) => {
                c.max_tokens = n;
                // The legacy protocol caps a turn at the daemon's --ngen; the mux clamps a
                // SUBMIT's max_tokens only to the context room, as upstream's does.
                let cap = if self.config.mux || self.attached() {
                    "within the context room"
                } else {
                    "and the daemon's --ngen"
                };
                format!("answers of at most {n} tokens from the next turn ({cap})")
            }
        };
        // Slot 0's plain chat lines carry no sampling fields: say where the value applies.
        let note = if changes && !self.config.mux && !self.attached() && self.slot == 0 {
            "; slot 0's plain chat lines use the daemon's --temp, --top-p and --ngen: it applies on :slot N > 0, or with coli --mux"
        } else {
            ""
        };
        self.notice(format!("{msg}{note}"));
    }
}

/// What `:set` was asked.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum SetCommand {
    Show,
    Temp(f64),
    TopP(f64),
    Max(u32),
    /// The message saying what is wrong.
    Bad(String),
}

impl SetCommand {
    fn parse<'a>(mut words: impl Iterator<Item = &'a str>) -> SetCommand {
        let (Some(key), value) = (words.next(), words.next()) else {
            return SetCommand::Show;
        };
        let Some(value) = value else {
            return SetCommand::Bad(format!(":set {key} needs a value (:set temp 0.3)"));
        };
        match key {
            "temp" | "temperature" => match value.parse::<f64>() {
                Ok(t) if (0.0..=2.0).contains(&t) => SetCommand::Temp(t),
                _ => SetCommand::Bad(format!(":set temp must be in 0..=2, got {value}")),
            },
            "top_p" | "top-p" | "nucleus" => match value.parse::<f64>() {
                Ok(p) if p > 0.0 && p <= 1.0 => SetCommand::TopP(p),
                _ => SetCommand::Bad(format!(
                    ":set top_p must be above 0 and at most 1, got {value}"
                )),
            },
            "max" | "max_tokens" | "max-tokens" => match value.parse::<u32>() {
                Ok(n) if (1..=i32::MAX as u32).contains(&n) => SetCommand::Max(n),
                _ => SetCommand::Bad(format!(":set max must be in 1..=2147483647, got {value}")),
            },
            other => SetCommand::Bad(format!(
                ":set {other}: unknown; :set temp T, :set top_p P or :set max N"
            )),
        }
    }
}

/// A `:command` typed in the input box.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Command {
    Quit,
    Reset,
    More,
    Slot(Option<u32>),
    Set(SetCommand),
    Help,
    Unknown(String),
}

impl Command {
    /// `None`: not a command, send it as text (`:)` is a message).
    pub(super) fn parse(text: &str) -> Option<Command> {
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
            "set" => Command::Set(SetCommand::parse(words)),
            "help" | "h" => Command::Help,
            other => Command::Unknown(other.to_string()),
        })
    }
}
