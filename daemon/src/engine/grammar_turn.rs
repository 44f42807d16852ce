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

/// Samples refused for overrunning the budget before the shortest completion is forced.
const BUDGET_RESAMPLES: usize = 8;

pub(crate) struct GrammarTurn {
    state: GrammarState,
    trie: Arc<TokenTrie>,
    allowed: Vec<bool>,
    masked: Vec<f32>,
    pub masks: usize,
    pub mask_s: f64,
    /// Tokens forced to close the answer within its budget.
    pub budget_forced: usize,
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
            budget_forced: 0,
        }
    }

    /// The matcher (for a draft source: [`GrammarState::forced_bytes`]).
    pub fn state_mut(&mut self) -> &mut GrammarState {
        &mut self.state
    }

    /// Samples `logits` with every token the grammar forbids at -inf; `left`: the tokens the
    /// budget still allows, this one included.
    pub fn pick(
        &mut self,
        logits: &[f32],
        sampler: &mut Sampler,
        stops: &[u32],
        use_stops: bool,
        left: usize,
    ) -> Pick {
        self.pick_checking(logits, sampler, stops, use_stops, None, left)
            .0
    }

    /// The tokens of the shortest completion from here (each the longest vocabulary token
    /// its rest begins with); `None` when the vocabulary cannot spell it.
    fn completion_tokens(&mut self, state_after: Option<&[u8]>) -> Option<Vec<u32>> {
        let bytes = match state_after {
            None => self.state.shortest_completion(),
            Some(b) => self.state.shortest_completion_after(b)?,
        };
        let mut rest = &bytes[..];
        let mut out = Vec::new();
        while !rest.is_empty() {
            let (id, len) = self.trie.longest_prefix(rest)?;
            out.push(id);
            rest = &rest[len..];
        }
        Some(out)
    }

    /// Whether the answer can still be closed within `left` tokens after `tok`: cheap when
    /// the completion's bytes fit (a token is at least a byte), exact (its tokens) near
    /// the edge.
    fn fits_after(&mut self, tok: u32, left: usize) -> bool {
        let bytes = self.trie.token_bytes(tok).to_vec();
        match self.state.completion_len_after(&bytes) {
            None => true, // a stop token: the answer ends here
            Some(n) if n < left => true,
            Some(_) => self
                .completion_tokens(Some(&bytes))
                .is_some_and(|t| t.len() < left),
        }
    }

    /// As `pick`, checking a drafted token against the masked distribution (lossless, see
    /// [`Sampler::verify`]): (what the row gives, whether it was the draft).
    ///
    /// The budget: an answer must end as a whole sentence within `left` tokens. When the
    /// shortest completion takes all of them, it is forced; otherwise a token after which
    /// the completion would no longer fit is masked out and the row sampled again (after
    /// a few such, the completion is forced).
    pub fn pick_checking(
        &mut self,
        logits: &[f32],
        sampler: &mut Sampler,
        stops: &[u32],
        use_stops: bool,
        draft: Option<u32>,
        left: usize,
    ) -> (Pick, bool) {
        if self.state.complete() {
            return (Pick::Complete, false);
        }
        let t0 = Instant::now();
        let need = self.state.completion_len();
        let forced = if need > 0 && need >= left {
            self.completion_tokens(None).filter(|t| t.len() >= left)
        } else {
            None
        };
        if let Some(t) = forced.and_then(|t| t.first().copied()) {
            self.mask_s += t0.elapsed().as_secs_f64();
            self.budget_forced += 1;
            return (Pick::Token(t), draft == Some(t));
        }
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
        let (mut tok, mut took) = match draft {
            None => (sampler.sample(&self.masked), false),
            Some(d) => sampler.verify(&self.masked, d),
        };
        // Only near the budget's edge can a token leave too little room to close.
        if need + FORCED_SPAN_BYTES >= left {
            let mut tries = 0;
            while !self.fits_after(tok, left) {
                tries += 1;
                self.masked[tok as usize] = f32::NEG_INFINITY;
                n -= 1;
                if tries > BUDGET_RESAMPLES || n == 0 {
                    if let Some(t) = self
                        .completion_tokens(None)
                        .and_then(|t| t.first().copied())
                    {
                        self.budget_forced += 1;
                        return (Pick::Token(t), draft == Some(t));
                    }
                    break;
                }
                tok = sampler.sample(&self.masked);
                took = false;
            }
        }
        (Pick::Token(tok), took)
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
