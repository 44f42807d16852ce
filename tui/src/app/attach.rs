//! `coli --attach URL`: the chat on a running `colibri api`. The server is stateless, so the
//! conversation lives here: each turn sends every user and assistant turn since the last
//! `:reset` as a [`ChatRequest`] (the server's prefix reuse keeps that fast). The answer comes
//! back as the legacy protocol's text, END and STAT (the I/O side translates the HTTP stream),
//! so the turn machinery is the same as a local daemon's.

use super::requests::Command;
use super::{Action, App, Pending, Role};

/// One chat turn for `POST /v1/chat/completions`.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatRequest {
    /// `(role, content)`, oldest first: `user` and `assistant`.
    pub messages: Vec<(&'static str, String)>,
    pub max_tokens: u32,
    pub temperature: f64,
    pub top_p: f64,
}

/// What `:slot` and `:more` say when attached.
pub(crate) const NO_SLOTS: &str =
    ":slot does not apply when attached: the server gives each request a session of its own";
pub(crate) const NO_MORE: &str =
    ":more does not apply when attached: ask the model to continue in a message";

impl App {
    /// Whether this client is attached to a `colibri api` (no daemon of its own).
    pub fn attached(&self) -> bool {
        self.config.attach.is_some()
    }

    /// Enter when attached: a command, or a chat turn.
    pub(super) fn submit_attached(&mut self, text: String) -> Vec<Action> {
        if let Some(cmd) = Command::parse(text.trim()) {
            self.history.push(&text);
            self.input.take();
            return self.run_attached_command(cmd);
        }
        if !self.ready_for_request() {
            return Vec::new();
        }
        let (_, slot) = self.take_user_turn(&text);
        self.pending = Some(Pending::Chat);
        let request = self.chat_request();
        self.start_answer(slot);
        vec![Action::Chat(request)]
    }

    /// The conversation since the last `:reset`, with the sampling values of `:set`. An
    /// answer that was refused (no text) is left out, so the history alternates as a chat
    /// template expects.
    pub fn chat_request(&self) -> ChatRequest {
        let messages = self.turns[self.attach_from.min(self.turns.len())..]
            .iter()
            .filter(|t| !t.streaming)
            .filter_map(|t| match t.role {
                Role::User => Some(("user", String::from_utf8_lossy(&t.bytes).into_owned())),
                Role::Assistant if !t.bytes.is_empty() => {
                    Some(("assistant", String::from_utf8_lossy(&t.bytes).into_owned()))
                }
                _ => None,
            })
            .collect();
        ChatRequest {
            messages,
            max_tokens: self.config.max_tokens.max(1),
            temperature: self.config.temperature,
            top_p: self.config.top_p,
        }
    }

    fn run_attached_command(&mut self, cmd: Command) -> Vec<Action> {
        match cmd {
            Command::Slot(_) => {
                self.flash(NO_SLOTS);
                Vec::new()
            }
            Command::More => {
                self.flash(NO_MORE);
                Vec::new()
            }
            Command::Reset => {
                if self.phase.busy() {
                    self.flash("busy: reset after this answer");
                    return Vec::new();
                }
                self.attach_from = self.turns.len();
                self.notice(
                    "conversation reset: the next message starts a new one (the server keeps none; coli sends the history with each turn)",
                );
                Vec::new()
            }
            // temp, top_p and max are the request's own fields: they apply as they do locally.
            cmd => self.run_command(cmd),
        }
    }
}
