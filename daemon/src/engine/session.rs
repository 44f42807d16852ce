//! One conversation the engine holds: its KV cache (whose `tokens` are the fed history), the
//! token sampled last and not fed yet, its saved file, and the request it is serving, if any.

use std::sync::Arc;
use std::time::Instant;

use super::grammar_turn::GrammarTurn;
use super::tenant::Tenant;
use crate::grammar::Grammar;

use crate::kv_file::KvFile;
use crate::model::KvCache;
use crate::sampling::{Rng, Sampler};

/// What a caller asks of a session: feed these tokens after what it holds, then sample up to
/// `max_new` tokens.
pub struct TurnSpec {
    /// Fed after the session's cache (its kept prefix). At least one token.
    pub feed: Vec<u32>,
    pub max_new: usize,
    pub sampler: Sampler,
    /// End at the model's stop tokens (`false` for oracle checks, which run to `max_new`).
    pub use_stops: bool,
    /// Replay: the tokens to emit, in order, instead of sampling (`bench` replays a
    /// reference's ids through the real step). Past its end, sampling resumes.
    pub forced: Vec<u32>,
    /// Constrains the output to this grammar (`run --grammar`, a SUBMIT's gbytes).
    pub grammar: Option<Arc<Grammar>>,
}

impl TurnSpec {
    /// A request sampled with `sampler`, ending at the model's stop tokens.
    pub fn new(feed: Vec<u32>, max_new: usize, sampler: Sampler) -> TurnSpec {
        TurnSpec {
            feed,
            max_new,
            sampler,
            use_stops: true,
            forced: Vec::new(),
            grammar: None,
        }
    }

    /// The same request, its output constrained to `grammar`.
    pub fn with_grammar(self, grammar: Arc<Grammar>) -> TurnSpec {
        TurnSpec {
            grammar: Some(grammar),
            ..self
        }
    }

    /// The same request, emitting `forced` instead of sampling (a replay).
    pub fn with_forced(self, forced: Vec<u32>) -> TurnSpec {
        TurnSpec { forced, ..self }
    }
}

/// Where a session's request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// No request.
    Idle,
    /// Its prompt is being fed, a chunk per step.
    Prefill,
    /// Sampling a token per step.
    Decode,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Prefill => "prefill",
            Phase::Decode => "decode",
        }
    }
}

/// Why a request ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finish {
    /// The model sampled a stop token (not emitted, not fed).
    StopToken,
    /// `max_new` tokens were emitted.
    Length,
    /// The caller stopped it (STOP, SIGINT, a closed pipe).
    Stopped,
    /// The caller cancelled it (CANCEL): ends like `Stopped`, reported differently.
    Cancelled,
    /// The grammar's sentence is complete and allows nothing after it (the last token is
    /// emitted and, like at `Length`, pending).
    Grammar,
    /// A forward failed (an expert read, a bad token): the session's cache is back where it
    /// was before the request.
    Failed(String),
}

/// A finished request, as the protocol layer reports it.
#[derive(Clone, Debug)]
pub struct TurnOutcome {
    pub finish: Finish,
    /// Tokens fed for the prompt (the tail after the reused prefix).
    pub fed_tokens: usize,
    pub completion_tokens: usize,
    /// Seconds from `begin` to the first sampled token, and from there to the end.
    pub prefill_s: f64,
    pub decode_s: f64,
    /// The sampler's generator after the request, so a caller that shares one stream of
    /// draws across requests (legacy serve) continues it.
    pub rng: Rng,
    /// Grammar-constrained requests: token masks computed and the seconds they took.
    pub grammar_masks: usize,
    pub grammar_mask_s: f64,
    /// Whether the output is a whole sentence of the request's grammar (true without one):
    /// false when the token limit or a stop cut a constrained answer short.
    pub grammar_accepting: bool,
}

impl TurnOutcome {
    pub fn length_limited(&self) -> bool {
        self.finish == Finish::Length
    }

    /// Completion tokens over the whole request, prefill included (legacy STAT tok/s).
    pub fn turn_tok_s(&self) -> f64 {
        crate::telemetry::per_second(
            self.completion_tokens as f64,
            self.prefill_s + self.decode_s,
        )
    }

    /// Decode speed: tokens after the first over the time after it.
    pub fn decode_tok_s(&self) -> f64 {
        crate::telemetry::per_second(
            self.completion_tokens.saturating_sub(1) as f64,
            self.decode_s,
        )
    }
}

/// A request in flight.
pub(crate) struct Turn {
    pub feed: Vec<u32>,
    /// How many of `feed` are in the cache.
    pub fed: usize,
    /// The token sampled last, to be fed at the next step (decode phase).
    pub next: Option<u32>,
    pub sampler: Sampler,
    pub max_new: usize,
    pub use_stops: bool,
    pub forced: Vec<u32>,
    pub emitted: usize,
    /// The cache length and pending token before the request: restored when it fails.
    pub kv_len0: usize,
    pub pending0: Option<u32>,
    pub started: Instant,
    pub first_token: Option<Instant>,
    pub grammar: Option<GrammarTurn>,
}

impl Turn {
    pub fn new(spec: TurnSpec, kv_len0: usize, pending0: Option<u32>) -> Turn {
        Turn {
            feed: spec.feed,
            fed: 0,
            next: None,
            sampler: spec.sampler,
            max_new: spec.max_new,
            use_stops: spec.use_stops,
            forced: spec.forced,
            emitted: 0,
            kv_len0,
            pending0,
            started: Instant::now(),
            first_token: None,
            grammar: None,
        }
    }

    pub fn phase(&self) -> Phase {
        if self.fed < self.feed.len() {
            Phase::Prefill
        } else {
            Phase::Decode
        }
    }

    pub fn outcome(&self, finish: Finish) -> TurnOutcome {
        let end = Instant::now();
        let first = self.first_token.unwrap_or(end);
        TurnOutcome {
            finish,
            fed_tokens: self.feed.len(),
            completion_tokens: self.emitted,
            prefill_s: (first - self.started).as_secs_f64(),
            decode_s: (end - first).as_secs_f64(),
            rng: self.sampler.rng.clone(),
            grammar_masks: self.grammar.as_ref().map_or(0, |g| g.masks),
            grammar_mask_s: self.grammar.as_ref().map_or(0.0, |g| g.mask_s),
            grammar_accepting: self.grammar.as_ref().is_none_or(|g| g.accepting()),
        }
    }
}

/// A conversation slot.
pub struct Session {
    /// The engine's alone: a front reads its length ([`Session::held`]) and tokens
    /// ([`Session::history`]).
    pub(super) kv: KvCache,
    /// The last emitted token when it was not fed back (the request ended on the token limit
    /// or was stopped): a continuation must feed it first.
    pub pending: Option<u32>,
    pub(crate) file: Option<KvFile>,
    pub(crate) turn: Option<Turn>,
    /// Speculative decoding: the MTP head's cache, the next drafts, acceptance per source.
    pub spec: super::spec::SessionSpec,
    /// What a prompt replaced, kept until the request ends so a failed one leaves the
    /// conversation as it found it.
    pub(crate) undo: Option<Undo>,
    /// Whose conversation this is: prefix reuse never crosses tenants.
    pub(crate) tenant: Tenant,
}

/// A session's state before a prompt was prepared on it.
pub(crate) struct Undo {
    /// The cache, when the prompt cut it to the common prefix.
    pub cut: Option<KvCache>,
    /// Rows of its own the session kept, before any rows adopted from another session.
    pub own: usize,
    pub pending: Option<u32>,
}

impl Session {
    pub(crate) fn new(kv: KvCache, file: Option<KvFile>) -> Session {
        Session {
            kv,
            pending: None,
            file,
            turn: None,
            spec: Default::default(),
            undo: None,
            tenant: Tenant::LOCAL,
        }
    }

    pub(crate) fn owned_by(self, tenant: Tenant) -> Session {
        Session { tenant, ..self }
    }

    /// Whose conversation the session holds.
    pub fn tenant(&self) -> Tenant {
        self.tenant
    }

    pub fn phase(&self) -> Phase {
        self.turn.as_ref().map_or(Phase::Idle, Turn::phase)
    }

    pub fn is_active(&self) -> bool {
        self.turn.is_some()
    }

    /// Positions the session's cache holds (its conversation so far).
    pub fn held(&self) -> usize {
        self.kv.len()
    }

    /// The tokens of the conversation the cache holds.
    pub fn history(&self) -> &[u32] {
        &self.kv.tokens
    }

    /// The cache itself, for the engine's own integration tests (`daemon/tests`), which check
    /// its bytes against a reference. Fronts use [`Session::held`] and [`Session::history`].
    #[doc(hidden)]
    pub fn kv_for_tests(&self) -> &crate::model::KvCache {
        &self.kv
    }

    /// Tokens emitted so far by the request in flight (0 when idle).
    pub fn emitted(&self) -> usize {
        self.turn.as_ref().map_or(0, |t| t.emitted)
    }

    /// The saved file, if this session is saved.
    pub fn file(&self) -> Option<&KvFile> {
        self.file.as_ref()
    }
}
