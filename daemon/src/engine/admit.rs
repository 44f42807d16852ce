//! Admission: whether a request may start on a session, decided once for every front (legacy
//! `\x02PROMPT`, mux SUBMIT, HTTP). The size checks before tokenizing, the tokenizing, the
//! context check, prefix reuse and the start of the request live here; a refusal is a typed
//! value that each front maps to its own bytes (END + zero STAT, `ERROR <id> <CODE>`, an HTTP
//! status with a JSON body), so a rule changes in one place.

use std::sync::Arc;

use super::prefix::Adopted;
use super::session::TurnSpec;
use super::tenant::Tenant;
use super::Engine;
use crate::grammar::Grammar;
use crate::sampling::{logprob_of, Sampler, TokenLogprob};
use crate::tokenizer::ChatText;

/// What a request's prompt is.
pub enum PromptInput {
    /// Text to tokenize (invalid UTF-8 is read lossily, as upstream reads it).
    Text(Vec<u8>),
    /// Token ids already checked against the vocabulary (mux `ids=1`).
    Ids(Vec<u32>),
    /// A chat template's output: special tokens only where the template wrote them, the
    /// ones message content spelled read as text
    /// ([`crate::tokenizer::Tokenizer::encode_chat`]).
    Chat(ChatText),
}

/// A request as a front hands it to [`Engine::admit`].
pub struct AdmitRequest {
    /// The slot to run on; `None`: an idle one the engine picks after tokenizing (the one
    /// sharing the longest prefix with the prompt, else an empty one).
    pub slot: Option<usize>,
    pub prompt: PromptInput,
    /// The most prompt tokens this front accepts (its context rule: legacy takes up to
    /// CTX - 2, mux fewer than CTX - 2).
    pub max_prompt_tokens: usize,
    /// The answer budget (the client's limit, already capped by the front's `--ngen`); it is
    /// clamped to the slot's room here.
    pub max_tokens: usize,
    pub sampler: Sampler,
    pub grammar: Option<Arc<Grammar>>,
    /// Adopt a longer shared prefix from another slot of the same tenant (`--kv-share`).
    pub share: bool,
    /// Whose request this is: its prompt is only ever compared with this tenant's histories.
    pub tenant: Tenant,
    /// Read the prompt out: each of its tokens' logprob under the positions before it, with
    /// this many alternatives (completions' `echo`, mux `logprobs=k`). `None`: not read out.
    pub echo: Option<usize>,
}

/// A request that started on its slot.
#[derive(Clone, Debug)]
pub struct Admitted {
    pub slot: usize,
    pub prompt_tokens: usize,
    /// Prompt tokens reused from the cache (the slot's own history or adopted rows).
    pub cached: usize,
    pub adopted: Option<Adopted>,
    /// The budget after the clamp to the slot's room.
    pub max_new: usize,
    /// The prompt's read-out when the request asked for it (one entry per prompt token).
    pub echo: Vec<PromptToken>,
}

/// A prompt token as the read-out reports it: its id, and its logprob under the positions
/// before it (`None` for the first, which nothing predicts).
#[derive(Clone, Debug, PartialEq)]
pub struct PromptToken {
    pub id: u32,
    pub lp: Option<TokenLogprob>,
}

/// Why a request was not started. Each variant carries the figures a front's message needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The slot does not exist.
    NoSuchSlot { slot: usize, slots: usize },
    /// The slot serves another request.
    SlotBusy { slot: usize },
    /// No slot is idle (the engine was to pick one).
    NoFreeSlot,
    /// The prompt's length in bytes alone proves it has more tokens than allowed: not
    /// tokenized (a huge prompt costs no tokenizer time or memory).
    TooManyBytes {
        bytes: usize,
        at_least: usize,
        max_prompt_tokens: usize,
    },
    /// Tokenizing it would not fit the RAM budget (the figures in words).
    EncodeBudget(String),
    /// The tokenizer failed.
    Tokenizer(String),
    /// Nothing left after tokenizing.
    EmptyPrompt,
    /// More tokens than the front accepts; nothing was truncated.
    ContextExceeded {
        tokens: usize,
        max_prompt_tokens: usize,
    },
    /// The engine could not start it (a bug guard: the checks above make it unreachable).
    Engine(String),
}

/// Positions per forward of a prompt read-out ([`Engine::read_out`]).
pub const READ_OUT_BLOCK: usize = 64;

impl Engine {
    /// Whether a text of `len` bytes must be refused before it is tokenized: sure to have
    /// more than `max_tokens` tokens, or too big to tokenize inside the RAM budget.
    pub fn check_encodable(&self, len: usize, max_tokens: usize) -> Result<(), Refusal> {
        if let Some(at_least) = self.tokenizer.min_tokens(len) {
            if at_least > max_tokens {
                return Err(Refusal::TooManyBytes {
                    bytes: len,
                    at_least,
                    max_prompt_tokens: max_tokens,
                });
            }
        }
        self.encode_fits(len)
            .map_err(|e| Refusal::EncodeBudget(e.to_string()))
    }

    /// Admits `req`: checks its size, tokenizes it, checks it against the context, readies
    /// the slot's cache (the longest common prefix, or a longer one adopted from another
    /// slot) and starts the request. Nothing about the slot changes on a refusal before the
    /// prefix step.
    pub fn admit(&mut self, req: AdmitRequest) -> Result<Admitted, Refusal> {
        let slots = self.sessions.len();
        if let Some(slot) = req.slot {
            if slot >= slots {
                return Err(Refusal::NoSuchSlot { slot, slots });
            }
            if self.sessions[slot].is_active() {
                return Err(Refusal::SlotBusy { slot });
            }
        } else if !self.sessions.iter().any(|s| !s.is_active()) {
            return Err(Refusal::NoFreeSlot);
        }
        let max_prompt = req.max_prompt_tokens;
        let ids = match req.prompt {
            PromptInput::Ids(ids) => ids,
            PromptInput::Text(bytes) => {
                self.check_encodable(bytes.len(), max_prompt)?;
                self.tokenizer
                    .encode(&String::from_utf8_lossy(&bytes))
                    .map_err(|e| Refusal::Tokenizer(e.to_string()))?
            }
            PromptInput::Chat(chat) => {
                self.check_encodable(chat.text.len(), max_prompt)?;
                self.tokenizer
                    .encode_chat(&chat)
                    .map_err(|e| Refusal::Tokenizer(e.to_string()))?
            }
        };
        if ids.is_empty() {
            return Err(Refusal::EmptyPrompt);
        }
        if ids.len() > max_prompt {
            return Err(Refusal::ContextExceeded {
                tokens: ids.len(),
                max_prompt_tokens: max_prompt,
            });
        }
        // Read out before the slot is touched: a failed forward refuses the request whole.
        let echo = match req.echo {
            Some(top) => self
                .read_out(&ids, top)
                .map_err(|e| Refusal::Engine(e.to_string()))?,
            None => Vec::new(),
        };
        let slot = match req.slot {
            Some(slot) => slot,
            None => self
                .pick_slot(&ids, req.tenant)
                .ok_or(Refusal::NoFreeSlot)?,
        };
        let plan = self.prepare_prompt(slot, &ids, req.share, req.tenant);
        if let Some(a) = &plan.adopted {
            crate::elog!(
                "[API] KV cross-slot adopt: slot {slot} took rows [{},{}) from slot {}",
                a.from_row,
                a.to_row,
                a.from
            );
        }
        crate::elog!(
            "[API] KV slot {slot} prefix {}/{} token, prefill {}",
            plan.keep,
            ids.len(),
            ids.len() - plan.keep
        );
        // Clamped to the slot's room silently (upstream).
        let max_new = req.max_tokens.min(self.ctx.saturating_sub(ids.len() + 1));
        let mut spec = TurnSpec::new(ids[plan.keep..].to_vec(), max_new, req.sampler);
        if let Some(g) = req.grammar {
            spec = spec.with_grammar(g);
        }
        if let Err(e) = self.begin(slot, spec) {
            self.forget_shared(slot);
            return Err(Refusal::Engine(e.to_string()));
        }
        Ok(Admitted {
            slot,
            prompt_tokens: ids.len(),
            cached: plan.keep,
            adopted: plan.adopted,
            max_new,
            echo,
        })
    }

    /// Each prompt token's logprob under the positions before it, `top` alternatives each.
    /// A teacher-forced forward on a fresh cache, outside the sessions, in blocks of
    /// [`READ_OUT_BLOCK`] positions so that only one block of logits is ever held (a long
    /// prompt on a 150k vocabulary would otherwise hold gigabytes). It costs a second prefill
    /// of the prompt, paid only by requests that ask for the read-out, and it leaves the
    /// slot's cache and prefix reuse exactly as without it.
    pub fn read_out(
        &self,
        ids: &[u32],
        top: usize,
    ) -> Result<Vec<PromptToken>, super::EngineError> {
        let mut out = Vec::with_capacity(ids.len());
        if let Some(&first) = ids.first() {
            out.push(PromptToken {
                id: first,
                lp: None,
            });
        }
        let vocab = self.vocab_size();
        let mut kv = self.model.new_cache();
        let mut logits = Vec::new();
        // Block b's logits predict the tokens one past its positions.
        for (b, block) in ids[..ids.len().saturating_sub(1)]
            .chunks(READ_OUT_BLOCK)
            .enumerate()
        {
            self.model
                .forward_into(&mut kv, block, crate::model::Logits::All, &mut logits)?;
            for (i, row) in logits.chunks_exact(vocab).take(block.len()).enumerate() {
                let id = ids[b * READ_OUT_BLOCK + i + 1];
                out.push(PromptToken {
                    id,
                    lp: Some(logprob_of(row, id, top)),
                });
            }
        }
        Ok(out)
    }

    /// The idle slot a prompt of `tenant` should run on: one of its own whose whole
    /// conversation the prompt continues (an agent re-sending its history lands where its KV
    /// is; the longest such), else an empty one (a new conversation evicts none while slots
    /// are free; with `--kv-share` it still adopts a shared prefix from another slot of its
    /// own), else the one of its own sharing the longest prefix with it, else the lowest
    /// idle slot. Other tenants' histories count as sharing nothing, so where a prompt lands
    /// (and what it evicts) says nothing about them.
    pub fn pick_slot(&self, ids: &[u32], tenant: Tenant) -> Option<usize> {
        let shared = |s: &super::Session| {
            if s.tenant != tenant {
                return 0;
            }
            s.kv.tokens
                .iter()
                .zip(ids)
                .take_while(|(a, b)| a == b)
                .count()
        };
        let idle = || {
            self.sessions
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.is_active())
        };
        let continued = idle()
            .filter(|(_, s)| s.tenant == tenant && !s.kv.is_empty() && shared(s) == s.kv.len())
            .max_by_key(|(i, s)| (s.kv.len(), std::cmp::Reverse(*i)));
        if let Some((i, _)) = continued {
            return Some(i);
        }
        if let Some((i, _)) = idle().find(|(_, s)| s.kv.is_empty()) {
            return Some(i);
        }
        idle()
            .max_by_key(|(i, s)| (shared(s), std::cmp::Reverse(*i)))
            .map(|(i, _)| i)
    }
}
