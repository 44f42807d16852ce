//! A constrained request's grammar inside the step: the token mask applied to the logits
//! before sampling, and the matcher advanced by each emitted token's bytes.

use std::sync::Arc;
use std::time::Instant;

use crate::grammar::{Grammar, GrammarState, TokenTrie};
use crate::sampling::Sampler;
use crate::tokenizer::Tokenizer;

/// What the grammar lets the step do with a row of logits.
pub(crate) enum Pick {
    /// Sampled among the allowed tokens (a stop token only when the sentence is complete).
    Token(u32),
    /// The sentence is complete and nothing may follow: end the request.
    Complete,
    /// No token of the vocabulary continues the sentence (a vocabulary without the bytes
    /// the grammar needs).
    DeadEnd,
}

/// The longest forced span looked at for drafts (a JSON key with its quotes and colon fits).
const FORCED_SPAN_BYTES: usize = 64;

pub(crate) struct GrammarTurn {
    state: GrammarState,
    trie: Arc<TokenTrie>,
    allowed: Vec<bool>,
    masked: Vec<f32>,
    pub masks: usize,
    pub mask_s: f64,
}

/// The vocabulary trie a mask walks: every token by its bytes, special tokens left out
/// (control tokens are never grammar text; stop tokens are added when the sentence is
/// complete).
pub(crate) fn vocab_trie(tok: &Tokenizer) -> TokenTrie {
    let n = tok.vocab_size();
    TokenTrie::new(
        n,
        (0..n as u32)
            .filter(|&id| !tok.is_special(id))
            .map(|id| (id, tok.token_bytes(id))),
    )
}

impl GrammarTurn {
    pub fn new(grammar: Arc<Grammar>, trie: Arc<TokenTrie>) -> GrammarTurn {
        GrammarTurn {
            state: GrammarState::new(grammar),
            allowed: vec![false; trie.vocab()],
            trie,
            masked: Vec::new(),
            masks: 0,
            mask_s: 0.0,
        }
    }

    /// The matcher (for a draft source: [`GrammarState::forced_bytes`]).
    pub fn state_mut(&mut self) -> &mut GrammarState {
        &mut self.state
    }

    /// Samples `logits` with every token the grammar forbids at -inf.
    pub fn pick(
        &mut self,
        logits: &[f32],
        sampler: &mut Sampler,
        stops: &[u32],
        use_stops: bool,
    ) -> Pick {
        self.pick_checking(logits, sampler, stops, use_stops, None)
            .0
    }

    /// As `pick`, checking a drafted token against the masked distribution (lossless, see
    /// [`Sampler::verify`]): (what the row gives, whether it was the draft).
    pub fn pick_checking(
        &mut self,
        logits: &[f32],
        sampler: &mut Sampler,
        stops: &[u32],
        use_stops: bool,
        draft: Option<u32>,
    ) -> (Pick, bool) {
        if self.state.complete() {
            return (Pick::Complete, false);
        }
        let t0 = Instant::now();
        let mut n = self.state.fill_mask(&self.trie, &mut self.allowed);
        if use_stops && self.state.accepting() {
            for &s in stops {
                if let Some(a) = self.allowed.get_mut(s as usize) {
                    n += usize::from(!*a);
                    *a = true;
                }
            }
        }
        self.masked.clear();
        self.masked.extend(logits.iter().enumerate().map(|(i, &l)| {
            if self.allowed.get(i).copied().unwrap_or(false) {
                l
            } else {
                f32::NEG_INFINITY
            }
        }));
        self.masks += 1;
        self.mask_s += t0.elapsed().as_secs_f64();
        if n == 0 {
            let end = if self.state.accepting() {
                Pick::Complete
            } else {
                Pick::DeadEnd
            };
            return (end, false);
        }
        match draft {
            None => (Pick::Token(sampler.sample(&self.masked)), false),
            Some(d) => {
                let (tok, took) = sampler.verify(&self.masked, d);
                (Pick::Token(tok), took)
            }
        }
    }

    /// Drafts from the span the grammar forces next (the only continuation it allows): up to
    /// `max` tokens, each the longest vocabulary token the span begins with, into `out`.
    pub fn forced_tokens(&mut self, max: usize, out: &mut Vec<u32>) {
        out.clear();
        if max == 0 {
            return;
        }
        let span = self.state.forced_bytes(FORCED_SPAN_BYTES);
        let mut rest = &span[..];
        while out.len() < max {
            let Some((id, len)) = self.trie.longest_prefix(rest) else {
                break;
            };
            out.push(id);
            rest = &rest[len..];
        }
    }

    /// Feeds an emitted token's bytes. `false` only for a token the mask did not allow (a
    /// replayed or drafted one).
    pub fn accept(&mut self, bytes: &[u8]) -> bool {
        self.state.advance_bytes(bytes)
    }

    /// Complete with nothing allowed after.
    pub fn complete(&self) -> bool {
        self.state.complete()
    }

    /// Whether the output so far is a whole sentence of the grammar (it may go on).
    pub fn accepting(&self) -> bool {
        self.state.accepting()
    }
}

impl super::Engine {
    /// The bytes `slot`'s grammar forces next (at most `max`): the only continuation the
    /// grammar allows, whatever the model says, so a draft that costs no forward to propose.
    /// `None` when the session has no constrained request.
    pub fn grammar_forced_bytes(&mut self, slot: usize, max: usize) -> Option<Vec<u8>> {
        let t = self.sessions.get_mut(slot)?.turn.as_mut()?;
        Some(t.grammar.as_mut()?.state_mut().forced_bytes(max))
    }
}
