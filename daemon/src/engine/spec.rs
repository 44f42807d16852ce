//! Speculative decoding inside the batched step.
//!
//! A decoding session with drafts feeds `[next, d1 .. dk]` as k + 1 rows of the same batched
//! forward as everyone else (`Logits::All`); row i's logits decide the token after row i's
//! token, so the drafts are checked in order and the first one the target does not take ends
//! the run: its replacement is emitted and the rows after it are cut from the KV and indexer
//! caches (`KvCache::truncate`). Every row of a forward is computed as if alone in its
//! sequence (causal attention, row-independent products), so what stays in the cache is the
//! bits a forward without the rejected drafts would have written.
//!
//! Lossless: a draft is a single proposed token (a point mass q = δ(d)), so Leviathan et al. /
//! Chen et al.'s rule reduces to: accept d with probability p(d) under the target's sampling
//! distribution (temperature, nucleus); else draw from p with d removed, renormalised. The
//! output token is then distributed exactly as p. Greedy is the case p = δ(argmax): accept iff
//! d is the argmax, else emit the argmax, so greedy output is identical drafts on or off.
//!
//! Draft sources ([`DraftSource`]): the model's MTP head chained up to `--draft` tokens, and
//! n-gram prompt lookup over the session's history. A third source (grammar-forced spans)
//! is drafted for constrained sessions only, checked under the grammar's mask (`spec_plan`).
//!
//! When to draft (`plan`): each session tracks acceptance per source (an exponential average).
//! The draft length k maximises the expected tokens per unit of cost, `(1 - a^(k+1)) / (1 - a)`
//! over `1 + k c`, with c the measured cost of one draft relative to a plain decode step: one
//! extra verify position (timed on the step's own forwards, so a disk-bound model whose extra
//! positions read more experts gets shorter drafts), plus for the MTP head the time of the head
//! itself per draft. The choice is made before the head runs, so drafts that would not pay
//! cost nothing. A source whose best k gains nothing is turned off with a stderr line and
//! retried with one draft after `RETRY_STEPS` steps, twice as long after each failed retry (up
//! to `RETRY_MAX`). The MTP head, once off, also stops being fed until a conversation starts
//! from an empty cache after its pause (`SessionSpec::mtp_off`).

use std::time::Instant;

use super::grammar_turn::Pick;
use super::session::{Finish, Turn};
use super::step::Event;
use super::{Engine, StepReport};
use crate::model::KvCache;

mod mtp;
mod plan;

/// Where a drafted token came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraftSource {
    Mtp,
    NGram,
}

impl DraftSource {
    pub const ALL: [DraftSource; 2] = [DraftSource::Mtp, DraftSource::NGram];

    pub fn name(self) -> &'static str {
        match self {
            DraftSource::Mtp => "mtp",
            DraftSource::NGram => "ngram",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// One step in this many decodes without drafts, to keep the plain step's cost measured.
pub const CALIBRATE_EVERY: u64 = 32;
/// Steps a source stays off after it was found a loss (doubled after each failed retry, up to
/// `RETRY_MAX`).
pub const RETRY_STEPS: u64 = 64;
pub const RETRY_MAX: u64 = 1024;
/// Drafts a source has verified since it was (re)turned on before it may be judged a loss:
/// one slow step on a shared machine is not evidence.
pub const MIN_EVIDENCE: u64 = 8;
/// Weight of the newest observation in the acceptance and cost averages.
const EMA: f64 = 0.1;
/// Longest history suffix the n-gram lookup matches, and the shortest.
const NGRAM_MAX: usize = 4;
const NGRAM_MIN: usize = 2;

/// One source's record in one session.
#[derive(Clone, Debug)]
pub struct SourceStats {
    pub proposed: u64,
    pub accepted: u64,
    /// Exponential average of the per-draft acceptance.
    pub rate: f64,
    /// Step count before which the source stays off (0: on).
    pub off_until: u64,
    /// Times it was found a loss and turned off, and times it was tried again.
    pub switched_off: u64,
    pub retries: u64,
    /// Drafts verified since it was last turned on.
    pub since_on: u64,
    /// Steps it stays off the next time it is found a loss.
    pub backoff: u64,
}

impl Default for SourceStats {
    fn default() -> Self {
        SourceStats {
            proposed: 0,
            accepted: 0,
            // Optimistic start, so a fresh source gets drafted and measured.
            rate: 0.5,
            off_until: 0,
            switched_off: 0,
            retries: 0,
            since_on: 0,
            backoff: RETRY_STEPS,
        }
    }
}

/// A session's speculation state: the MTP head's cache and the hidden states it has not
/// consumed yet, this step's drafts, the per-source record.
#[derive(Default)]
pub struct SessionSpec {
    /// The MTP head's own KV: position t from h[t] and token t + 1, for every t whose next
    /// token is in the main cache.
    pub mtp_kv: Option<KvCache>,
    /// The main model's last hidden state at positions `mtp_kv.len()..sync`, `(rows, hidden)`.
    hidden: Vec<f32>,
    /// The main cache length this state mirrors.
    sync: usize,
    /// The main cache changed under it (adopted prefix, resumed file): no MTP drafts until
    /// the cache restarts from empty.
    broken: bool,
    /// What the session feeds at its next decode step: the pending token, then the drafts.
    pub(crate) feed: Vec<u32>,
    pub(crate) source: Option<DraftSource>,
    /// The MTP head's chained drafts for the next step, and the n-gram lookup's proposal.
    mtp_drafts: Vec<u32>,
    ngram: Vec<u32>,
    pub stats: [SourceStats; 2],
    steps: u64,
    /// What this session's forwards sampled and verified, over its life (a request's share is
    /// the difference between two readings).
    pub counts: SpecCounts,
}

/// A session's speculation counters, for the per-request `SPEC` and `LIVE` telemetry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecCounts {
    /// Tokens sampled, and the forwards that sampled them.
    pub tokens: u64,
    pub forwards: u64,
    /// Forwards that carried at least one draft.
    pub drafting_forwards: u64,
    /// Drafts proposed and accepted per [`DraftSource`].
    pub proposed: [u64; 2],
    pub accepted: [u64; 2],
    /// Grammar-forced drafts proposed and accepted.
    pub forced_proposed: u64,
    pub forced_accepted: u64,
}

impl SpecCounts {
    /// What happened after `before` (an earlier reading of the same session; saturating, so
    /// a session that was replaced in between reads as having done nothing rather than wrap).
    pub fn since(&self, before: &SpecCounts) -> SpecCounts {
        let sub = |a: [u64; 2], b: [u64; 2]| [a[0].saturating_sub(b[0]), a[1].saturating_sub(b[1])];
        SpecCounts {
            tokens: self.tokens.saturating_sub(before.tokens),
            forwards: self.forwards.saturating_sub(before.forwards),
            drafting_forwards: self
                .drafting_forwards
                .saturating_sub(before.drafting_forwards),
            proposed: sub(self.proposed, before.proposed),
            accepted: sub(self.accepted, before.accepted),
            forced_proposed: self.forced_proposed.saturating_sub(before.forced_proposed),
            forced_accepted: self.forced_accepted.saturating_sub(before.forced_accepted),
        }
    }
}

impl SessionSpec {
    fn mtp_live(&self) -> bool {
        self.mtp_kv.is_some() && !self.broken
    }

    /// Follows what happened to the main cache between steps (a new turn cut it back, a
    /// reset emptied it, a prefix was adopted).
    fn sync_to(&mut self, kv: &KvCache, hidden: usize) {
        let Some(mtp) = &mut self.mtp_kv else { return };
        let n = kv.len();
        if n == 0 {
            mtp.clear();
            self.hidden.clear();
            // A head switched off stays unfed through a conversation that starts during its
            // pause (see `mtp_off`).
            self.broken = self.stats[DraftSource::Mtp.index()].off_until > self.steps;
        } else if n < self.sync {
            if n > mtp.len() {
                self.hidden.truncate((n - mtp.len()) * hidden);
            } else {
                self.broken = true;
            }
        } else if n > self.sync {
            self.broken = true;
        }
        self.sync = n;
        if self.broken {
            mtp.clear();
            self.hidden.clear();
        }
    }

    /// The MTP head was found a loss: it stops being fed for the rest of the conversation (its
    /// cache and the hidden rows it has not seen are dropped, the main forward stops handing
    /// them over). Keeping it in step would cost one head position per token, and a retry
    /// after a pause would first have to catch up on every position of the pause, which on a
    /// small model costs more than drafting can win back. It is retried, after its pause, in a
    /// conversation that starts from an empty cache.
    fn mtp_off(&mut self) {
        if let Some(mtp) = &mut self.mtp_kv {
            mtp.clear();
        }
        self.hidden.clear();
        self.broken = true;
    }

    /// Record of a verify: `accepted` of `proposed` drafts of `source` were taken.
    fn record(&mut self, source: DraftSource, proposed: usize, accepted: usize) {
        let s = &mut self.stats[source.index()];
        s.proposed += proposed as u64;
        s.accepted += accepted as u64;
        s.since_on += proposed as u64;
        // A draft after a rejection was never judged: the rate is over judged drafts.
        let judged = (accepted + 1).min(proposed);
        s.rate = (1.0 - EMA).powi(judged as i32) * s.rate
            + (1.0 - (1.0 - EMA).powi(judged as i32)) * (accepted as f64 / judged as f64);
        if accepted > 0 {
            s.backoff = RETRY_STEPS;
        }
    }
}

/// The engine's speculation settings and figures.
pub struct SpecEngine {
    /// `--draft N`: most drafted tokens per step (0: off).
    pub max_draft: usize,
    /// Choose the draft length from acceptance and cost, switching losing sources off (the
    /// default); `false` always drafts `max_draft` from the first source with a proposal
    /// (tests of the verify itself).
    pub adaptive: bool,
    /// Which sources may draft, by [`DraftSource`] order (both by default).
    pub enabled: [bool; 2],
    /// Seconds of a decode forward per session row without drafts, and per extra verify row
    /// (medians of the latest samples: a step that lost its core to another process on a
    /// shared machine does not move them).
    base_s: Window,
    extra_s: Window,
    /// Seconds of the MTP head per draft it makes.
    mtp_s: Window,
    /// Steps planned with drafting on; every `CALIBRATE_EVERY`-th runs without drafts so
    /// the plain decode row stays measured.
    planned: u64,
    /// Steady-state MTP runs seen; the first is not timed (it reads the head's experts).
    mtp_s_samples: u64,
    /// Tokens sampled and forwards that sampled them, per session (tokens/forward).
    pub tokens: u64,
    pub forwards: u64,
    /// Proposed and accepted drafts per source over all sessions.
    pub proposed: [u64; 2],
    pub accepted: [u64; 2],
    /// Drafts of grammar-forced spans proposed and accepted (constrained sessions).
    pub forced_proposed: u64,
    pub forced_accepted: u64,
    /// The forced-span drafts of the session being planned, and its history (n-gram lookup).
    forced: Vec<u32>,
    history: Vec<u32>,
    /// The last forward's hidden rows (when some session feeds the MTP head).
    pub(crate) hidden: Vec<f32>,
    mtp_logits: Vec<f32>,
    mtp_hidden: Vec<f32>,
}

impl SpecEngine {
    pub fn new(max_draft: usize) -> SpecEngine {
        SpecEngine {
            max_draft,
            adaptive: true,
            enabled: [true; 2],
            base_s: Window::default(),
            extra_s: Window::default(),
            mtp_s: Window::default(),
            planned: 0,
            mtp_s_samples: 0,
            tokens: 0,
            forwards: 0,
            proposed: [0; 2],
            accepted: [0; 2],
            forced_proposed: 0,
            forced_accepted: 0,
            forced: Vec::new(),
            history: Vec::new(),
            hidden: Vec::new(),
            mtp_logits: Vec::new(),
            mtp_hidden: Vec::new(),
        }
    }

    pub fn tokens_per_forward(&self) -> f64 {
        self.figures().tokens_per_forward()
    }

    /// Acceptance of `source` in percent over every session (None before any draft).
    pub fn acceptance_pct(&self, source: DraftSource) -> Option<f64> {
        self.figures().acceptance_pct(source)
    }

    pub fn acceptance_line(&self) -> String {
        self.figures().acceptance_line()
    }

    /// The counters so far, to subtract a later reading from.
    pub fn figures(&self) -> SpecFigures {
        SpecFigures {
            tokens: self.tokens,
            forwards: self.forwards,
            proposed: self.proposed,
            accepted: self.accepted,
        }
    }

    /// Cost of one extra verify position relative to a plain decode row (0.25 until measured).
    pub fn extra_cost(&self) -> f64 {
        match (self.base_s.median(), self.extra_s.median()) {
            (Some(b), Some(e)) if b > 0.0 => (e / b).clamp(0.01, 4.0),
            _ => 0.25,
        }
    }

    /// Cost of drafting one token with the MTP head relative to a plain decode row (0.1 until
    /// measured).
    pub fn mtp_cost(&self) -> f64 {
        match (self.base_s.median(), self.mtp_s.median()) {
            (Some(b), Some(m)) if b > 0.0 => (m / b).clamp(0.0, 4.0),
            _ => 0.1,
        }
    }

    /// Folds one decode forward's time into the cost model: `rows` session rows, `extra` of
    /// them drafts, no prefill rows.
    pub(crate) fn observe_forward(&mut self, secs: f64, rows: usize, extra: usize) {
        let plain = (rows - extra).max(1) as f64;
        if extra == 0 {
            self.base_s.push(secs / plain);
        } else if let Some(base) = self.base_s.median() {
            self.extra_s
                .push(((secs - base * plain) / extra as f64).max(0.0));
        }
    }
}

/// The latest `WINDOW` samples of a time, for their median.
#[derive(Clone, Copy, Debug, Default)]
struct Window {
    samples: [f64; WINDOW],
    len: usize,
    next: usize,
}

const WINDOW: usize = 15;

impl Window {
    fn push(&mut self, v: f64) {
        self.samples[self.next] = v;
        self.next = (self.next + 1) % WINDOW;
        self.len = (self.len + 1).min(WINDOW);
    }

    fn median(&self) -> Option<f64> {
        if self.len == 0 {
            return None;
        }
        let mut v = self.samples;
        let v = &mut v[..self.len];
        v.sort_unstable_by(f64::total_cmp);
        Some(v[self.len / 2])
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Tokens per forward and acceptance per source, over a stretch of steps.
#[derive(Clone, Copy, Debug, Default)]
pub struct SpecFigures {
    pub tokens: u64,
    pub forwards: u64,
    pub proposed: [u64; 2],
    pub accepted: [u64; 2],
}

impl SpecFigures {
    /// What happened after `before`.
    pub fn since(&self, before: &SpecFigures) -> SpecFigures {
        let sub = |a: [u64; 2], b: [u64; 2]| [a[0] - b[0], a[1] - b[1]];
        SpecFigures {
            tokens: self.tokens - before.tokens,
            forwards: self.forwards - before.forwards,
            proposed: sub(self.proposed, before.proposed),
            accepted: sub(self.accepted, before.accepted),
        }
    }

    /// The sum of two stretches.
    pub fn plus(&self, other: &SpecFigures) -> SpecFigures {
        let add = |a: [u64; 2], b: [u64; 2]| [a[0] + b[0], a[1] + b[1]];
        SpecFigures {
            tokens: self.tokens + other.tokens,
            forwards: self.forwards + other.forwards,
            proposed: add(self.proposed, other.proposed),
            accepted: add(self.accepted, other.accepted),
        }
    }

    /// Tokens sampled per forward that sampled them, per session (1 without drafts).
    pub fn tokens_per_forward(&self) -> f64 {
        if self.forwards == 0 {
            0.0
        } else {
            self.tokens as f64 / self.forwards as f64
        }
    }

    pub fn acceptance_pct(&self, source: DraftSource) -> Option<f64> {
        let i = source.index();
        (self.proposed[i] > 0).then(|| 100.0 * self.accepted[i] as f64 / self.proposed[i] as f64)
    }

    /// `mtp=<a>% (<accepted>/<proposed>) ngram=...` for the sources that drafted, or `none`.
    pub fn acceptance_line(&self) -> String {
        let parts: Vec<String> = DraftSource::ALL
            .iter()
            .filter_map(|&s| {
                self.acceptance_pct(s).map(|p| {
                    format!(
                        "{}={p:.1}% ({}/{})",
                        s.name(),
                        self.accepted[s.index()],
                        self.proposed[s.index()]
                    )
                })
            })
            .collect();
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(" ")
        }
    }
}

/// Expected gain (tokens per unit of cost) drafting must promise over plain decoding before
/// it is done: near break-even, the noise of the measured costs decides, and a wrong "yes"
/// costs time where a wrong "no" costs only a little gain.
pub const MIN_GAIN: f64 = 0.05;

/// The acceptance at which one draft of cost `c` starts to pay (by [`MIN_GAIN`]).
pub fn break_even(c: f64) -> f64 {
    (1.0 + MIN_GAIN) * (1.0 + c) - 1.0
}

/// The draft length that maximises expected tokens per cost for acceptance `a` and extra
/// position cost `c`, up to `max`; 0 when no length beats plain decoding by [`MIN_GAIN`].
pub fn best_draft_len(a: f64, c: f64, max: usize) -> usize {
    let mut best = (1.0 + MIN_GAIN, 0);
    for k in 1..=max {
        let expected = (0..=k).map(|i| a.powi(i as i32)).sum::<f64>();
        let gain = expected / (1.0 + c * k as f64);
        if gain > best.0 + 1e-9 {
            best = (gain, k);
        }
    }
    best.1
}

/// Prompt lookup: the tokens that followed the latest earlier occurrence of the history's
/// longest suffix (NGRAM_MAX down to NGRAM_MIN tokens), at most `max`.
pub fn ngram_draft(history: &[u32], max: usize, out: &mut Vec<u32>) {
    out.clear();
    let len = history.len();
    for n in (NGRAM_MIN..=NGRAM_MAX).rev() {
        if len <= n {
            continue;
        }
        let suffix = &history[len - n..];
        // Latest earlier start whose n tokens equal the suffix and that has a continuation.
        if let Some(start) = (0..len - n).rev().find(|&i| &history[i..i + n] == suffix) {
            let from = start + n;
            out.extend_from_slice(&history[from..(from + max).min(len)]);
            if !out.is_empty() {
                return;
            }
        }
    }
}

impl Engine {
    /// Called before a step's forward for each planned session.
    pub(super) fn spec_sync(&mut self, slot: usize) {
        let h = self.model.cfg.hidden_size;
        let s = &mut self.sessions[slot];
        if s.spec.mtp_kv.is_none() && self.spec.max_draft > 0 {
            if let Some(m) = &self.model.mtp {
                s.spec.mtp_kv = Some(m.new_cache(&self.model.cfg));
                s.spec.sync = 0;
                s.spec.broken = !s.kv.is_empty();
            }
        }
        s.spec.sync_to(&s.kv, h);
    }

    /// Whether any planned session needs the forward's hidden states.
    pub(super) fn spec_wants_hidden(&self, plan: &[(usize, super::step::Role)]) -> bool {
        self.spec.max_draft > 0
            && plan
                .iter()
                .any(|&(slot, _)| self.sessions[slot].spec.mtp_live())
    }

    /// After the forward: hidden rows `from..from + rows` of the batch now belong to
    /// `slot`'s cache positions.
    pub(super) fn spec_keep_hidden(&mut self, slot: usize, from: usize, rows: usize) {
        let h = self.model.cfg.hidden_size;
        let s = &mut self.sessions[slot];
        if s.spec.mtp_live() && !self.spec.hidden.is_empty() {
            s.spec
                .hidden
                .extend_from_slice(&self.spec.hidden[from * h..(from + rows) * h]);
        }
        s.spec.sync = s.kv.len();
    }

    /// The decode half of a step for `slot`: its `feed.len()` logit rows from `row` on check
    /// the drafts, emit what is accepted plus one token, and cut the rejected rows from the
    /// cache. Returns (rows used, tokens emitted, cache positions kept).
    pub(super) fn spec_decode(
        &mut self,
        slot: usize,
        row: usize,
        report: &mut StepReport,
    ) -> (usize, usize, usize) {
        let vocab = self.model.cfg.vocab_size;
        let s = &mut self.sessions[slot];
        let n_rows = s.spec.feed.len().max(1);
        let kv_end = s.kv.len();
        let kv_start = kv_end - n_rows;
        let t = s.turn.as_mut().expect("decoding sessions have a turn");
        t.next = None;
        let mut emitted = 0;
        let mut finish = None;
        let mut kept = n_rows;
        let mut accepted = 0;
        let mut dead_end = false;
        for i in 0..n_rows {
            let logits = &self.logits[(row + i) * vocab..(row + i + 1) * vocab];
            let draft = s.spec.feed.get(i + 1).copied();
            let (tok, took) = match choose(t, logits, draft, &self.stops) {
                Choice::Token(tok, took) => (tok, took),
                Choice::Complete => {
                    finish = Some(Finish::Grammar);
                    kept = i + 1;
                    break;
                }
                Choice::DeadEnd => {
                    dead_end = true;
                    kept = i + 1;
                    break;
                }
            };
            if took {
                accepted += 1;
            }
            if t.use_stops && self.stops.contains(&tok) {
                finish = Some(Finish::StopToken);
                kept = i + 1;
                break;
            }
            t.emitted += 1;
            emitted += 1;
            t.first_token.get_or_insert_with(Instant::now);
            if let Some(top) = t.sampler.logprobs {
                let lp = crate::sampling::logprob_of(logits, tok, top);
                report.events.push(Event::Logprob { slot, lp });
            }
            report.events.push(Event::Token { slot, id: tok });
            let grammar_done = t.grammar.as_mut().is_some_and(|g| {
                g.accept(self.tokenizer.token_bytes(tok));
                g.complete()
            });
            if t.emitted == t.max_new {
                t.next = Some(tok);
                finish = Some(Finish::Length);
                kept = i + 1;
                break;
            }
            if grammar_done {
                t.next = Some(tok);
                finish = Some(Finish::Grammar);
                kept = i + 1;
                break;
            }
            if !took {
                t.next = Some(tok);
                kept = i + 1;
                break;
            }
        }
        let counts = &mut s.spec.counts;
        counts.tokens += emitted as u64;
        counts.forwards += 1;
        if n_rows > 1 {
            counts.drafting_forwards += 1;
        }
        if let Some(src) = s.spec.source {
            let proposed = n_rows - 1;
            s.spec.counts.proposed[src.index()] += proposed as u64;
            s.spec.counts.accepted[src.index()] += accepted as u64;
            s.spec.record(src, proposed, accepted);
            self.spec.proposed[src.index()] += proposed as u64;
            self.spec.accepted[src.index()] += accepted as u64;
        } else if t.grammar.is_some() {
            s.spec.counts.forced_proposed += (n_rows - 1) as u64;
            s.spec.counts.forced_accepted += accepted as u64;
            self.spec.forced_proposed += (n_rows - 1) as u64;
            self.spec.forced_accepted += accepted as u64;
        }
        s.kv.truncate(kv_start + kept);
        self.spec.tokens += emitted as u64;
        self.spec.forwards += 1;
        if dead_end {
            self.fail(
                slot,
                "grammar: no token of the vocabulary continues the output",
                report,
            );
        } else if let Some(f) = finish {
            self.end_in_step(slot, f, report);
        }
        (n_rows, emitted, kept)
    }
}

/// What a logit row gives a decoding session.
enum Choice {
    /// The token, and whether it was the row's draft.
    Token(u32, bool),
    /// The grammar's output is complete and nothing may follow.
    Complete,
    /// The grammar allows no token of the vocabulary.
    DeadEnd,
}

/// The target's token after a row, checking `draft` against it; under a grammar, against the
/// grammar's masked distribution (its drafts are the spans it forces, `spec_plan`).
fn choose(t: &mut Turn, logits: &[f32], draft: Option<u32>, stops: &[u32]) -> Choice {
    if let Some(&f) = t.forced.get(t.emitted) {
        return Choice::Token(f, draft == Some(f));
    }
    if let Some(g) = t.grammar.as_mut() {
        let left = t.max_new - t.emitted;
        return match g.pick_checking(logits, &mut t.sampler, stops, t.use_stops, draft, left) {
            (Pick::Token(tok), took) => Choice::Token(tok, took),
            (Pick::Complete, _) => Choice::Complete,
            (Pick::DeadEnd, _) => Choice::DeadEnd,
        };
    }
    let (tok, took) = match draft {
        None => (t.sampler.sample(logits), false),
        Some(d) => t.sampler.verify(logits, d),
    };
    Choice::Token(tok, took)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ngram_takes_the_latest_longest_match() {
        let mut out = Vec::new();
        ngram_draft(&[1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3], 3, &mut out);
        assert_eq!(out, vec![7, 8, 1]);
        ngram_draft(&[5, 6, 7], 3, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn a_window_keeps_the_median_of_its_latest_samples() {
        let mut w = Window::default();
        assert_eq!(w.median(), None);
        w.push(3.0);
        w.push(100.0);
        w.push(1.0);
        assert_eq!(w.median(), Some(3.0));
        for _ in 0..WINDOW {
            w.push(2.0);
        }
        // The old samples are gone; an outlier among many does not move it.
        w.push(50.0);
        assert_eq!(w.median(), Some(2.0));
    }

    #[test]
    fn draft_length_follows_cost_and_acceptance() {
        assert_eq!(best_draft_len(0.0, 0.25, 4), 0);
        assert_eq!(best_draft_len(0.9, 0.01, 4), 4);
        // Costly positions shorten the draft.
        assert!(best_draft_len(0.6, 0.3, 8) < best_draft_len(0.6, 0.05, 8));
        // a = 0.2 at c = 0.25: 1.2 / 1.25 < 1, a loss.
        assert_eq!(best_draft_len(0.2, 0.25, 4), 0);
    }
}
