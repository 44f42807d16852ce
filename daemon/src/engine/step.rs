//! The step: one batched forward over every active session, then sampling, then the expert
//! store's housekeeping (live re-pin, the RSS guard).
//!
//! A decoding session brings one row (the token it sampled last); a prefilling session brings
//! its next chunk of prompt tokens. Chunks are cut from each session's own prompt, never
//! resized to fit a batch, and a prompt's bits do not depend on the chunk either
//! (`daemon/tests/prefill_chunk.rs`), so a session's bits do not depend on what else ran beside
//! it, though the chunk does (below). MLA's `AttnPath::Auto`, whose two paths round
//! differently, picks its path per 256 rows of a chunk, each block as a chunk of its own would
//! (`model::mla::split_rows`), so chunks of any multiple of 256 (all the engine cuts but a
//! prompt's last) give the same bits.
//!
//! While any session decodes, one prefill chunk of at most `PREFILL_CHUNK` tokens joins a step
//! (round robin over the sessions waiting), so a long prompt never freezes the streams already
//! running; with no one decoding, every waiting prompt's next chunk runs in the same forward,
//! each of the engine's prefill chunk (longer where the experts stream from disk, so that a
//! prompt reads them fewer times: `experts/chunk.rs`).

use protocol::Repin;

use super::grammar_turn::Pick;
use super::session::{Finish, Phase, Session, TurnOutcome};
use super::Engine;
use crate::error::EngineError;
use crate::model::{Logits, SeqStep};

/// Prompt tokens per prefill forward of one session while another decodes, and while no one
/// does unless the experts stream from disk (`experts/chunk.rs`). Bounds the batch working set
/// (activations, per-expert products, the k/v reconstruction) whatever the prompt length, and
/// gives progress ticks.
pub const PREFILL_CHUNK: usize = crate::experts::chunk::DECODE_CHUNK;

/// What happened to one session in a step, in order.
#[derive(Clone, Debug)]
pub enum Event {
    /// `done` of `total` prompt tokens are in the cache.
    Prefill {
        slot: usize,
        done: usize,
        total: usize,
    },
    /// A sampled (non-stop) token.
    Token { slot: usize, id: u32 },
    /// The logprobs of the token whose `Token` event follows, for a request that asked for
    /// them ([`crate::sampling::Sampler::logprobs`]).
    Logprob {
        slot: usize,
        lp: crate::sampling::TokenLogprob,
    },
    /// The request ended.
    Done { slot: usize, outcome: TurnOutcome },
}

/// What one step did: the protocol layer turns it into frames.
#[derive(Debug, Default)]
pub struct StepReport {
    pub events: Vec<Event>,
    /// Sequences and rows of the forward (0 when nothing was active).
    pub sequences: usize,
    pub rows: usize,
    /// Live re-pin swaps made at the safe point after the forward.
    pub swaps: Vec<Repin>,
}

impl StepReport {
    pub fn clear(&mut self) {
        self.events.clear();
        self.swaps.clear();
        self.sequences = 0;
        self.rows = 0;
    }
}

/// What one session feeds in a step: its cache, and the tokens of its role.
fn seq_of(s: &mut Session, role: Role) -> SeqStep<'_> {
    let Session {
        kv,
        turn: Some(t),
        spec,
        ..
    } = s
    else {
        unreachable!("planned sessions have a turn")
    };
    let (tokens, logits) = match role {
        // The pending token and this step's drafts (see `spec`); a recurrent state keeps
        // its state after each row, for the cut of the rejected ones (`kv_snap.rs`).
        Role::Decode if spec.feed.len() > 1 => {
            kv.arm_trail(spec.feed.len());
            (&spec.feed[..], Logits::All)
        }
        Role::Decode => (
            std::slice::from_ref(t.next.as_ref().expect("decoding turns have a token")),
            Logits::Last,
        ),
        Role::Prefill { to } => {
            // A recurrent state is kept near the prompt's end: a regeneration, or the next
            // prompt of the conversation, starts from it (`kv_snap.rs`). Asked at every
            // chunk, as the kept position may fall in any.
            kv.mark_prompt_end(kv.len() + (t.feed.len() - t.fed));
            (
                &t.feed[t.fed..to],
                if to == t.feed.len() {
                    Logits::Last
                } else {
                    Logits::None
                },
            )
        }
    };
    SeqStep { kv, tokens, logits }
}

/// How a participant of the step feeds.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Role {
    Decode,
    /// Prompt tokens `from..to` of the turn's feed.
    Prefill {
        to: usize,
    },
}

impl Engine {
    /// Advances every active session by one forward (see the module doc). Events go to
    /// `report` (cleared first). A failed forward ends the requests of that step with
    /// [`Finish::Failed`], their caches restored; it is not an error of the engine.
    pub fn step(&mut self, report: &mut StepReport) -> Result<(), EngineError> {
        report.clear();
        let mut plan = std::mem::take(&mut self.plan);
        self.plan_step(&mut plan);
        // A chunk longer than the decode chunk takes its rows' working set from the expert
        // cache while it runs (`experts/chunk.rs`); after the last one the cache gets it back
        // and the forward's buffers shrink to a decode step's.
        let long = plan.iter().any(|&(slot, role)| match role {
            Role::Prefill { to } => self.sessions[slot]
                .turn
                .as_ref()
                .is_some_and(|t| to - t.fed > PREFILL_CHUNK),
            Role::Decode => false,
        });
        if self.model.experts.long_chunk(long) && !long {
            self.model.shed_batch_rows();
        }
        if plan.is_empty() {
            self.plan = plan;
            return Ok(());
        }
        report.sequences = plan.len();
        for &(slot, _) in &plan {
            self.spec_sync(slot);
        }
        let want_hidden = self.spec_wants_hidden(&plan);
        let mut hidden = std::mem::take(&mut self.spec.hidden);
        hidden.clear();
        let t0 = std::time::Instant::now();
        let model = &self.model;
        let mut forward = |seqs: &mut [SeqStep], logits: &mut Vec<f32>| {
            if want_hidden {
                model.forward_batch_hidden(seqs, logits, &mut hidden)
            } else {
                model.forward_batch(seqs, logits)
            }
        };
        let result = if let [(slot, role)] = plan[..] {
            // One session (every single-conversation caller): no batch to gather, and the
            // decode step stays allocation-free.
            let mut one = [seq_of(&mut self.sessions[slot], role)];
            report.rows = one[0].tokens.len();
            forward(&mut one, &mut self.logits)
        } else {
            let mut seqs: Vec<SeqStep> = Vec::with_capacity(plan.len());
            let mut roles = plan.iter().peekable();
            for (slot, s) in self.sessions.iter_mut().enumerate() {
                match roles.peek() {
                    Some(&&(want, role)) if want == slot => {
                        roles.next();
                        seqs.push(seq_of(s, role));
                    }
                    Some(_) => {}
                    None => break,
                }
            }
            report.rows = seqs.iter().map(|s| s.tokens.len()).sum();
            forward(&mut seqs, &mut self.logits)
        };
        self.spec.hidden = hidden;
        // A shard cut short under the map: this forward read zeros, so nothing of it may be
        // kept or saved. Fatal, naming the file (`weights::sigbus`).
        if let Some(f) = crate::weights::sigbus::take_fault() {
            self.plan = plan;
            return Err(crate::weights::WeightsError::CutShort {
                path: f.path,
                offset: f.offset,
            }
            .into());
        }
        if plan.iter().all(|(_, r)| matches!(r, Role::Decode)) {
            let extra = report.rows - plan.len();
            self.spec
                .observe_forward(t0.elapsed().as_secs_f64(), report.rows, extra);
        }
        if let Err(e) = result {
            crate::elog!("[step] forward failed: {e}");
            if plan.len() == 1 {
                self.fail(plan[0].0, &e.to_string(), report);
                self.plan = plan;
                return Ok(());
            }
            self.retry_alone(&mut plan, report);
        }
        let vocab = self.model.cfg.vocab_size;
        let mut row = 0;
        let mut batch_row = 0;
        let mut emitted = 0;
        for &(slot, role) in &plan {
            if let Role::Decode = role {
                let fed = self.sessions[slot].spec.feed.len().max(1);
                let (rows, n, kept) = self.spec_decode(slot, row, report);
                self.spec_keep_hidden(slot, batch_row, kept);
                row += rows;
                batch_row += fed;
                emitted += n;
                continue;
            }
            let s = &mut self.sessions[slot];
            let t = s.turn.as_mut().expect("planned sessions have a turn");
            let Role::Prefill { to } = role else {
                unreachable!("decode handled above")
            };
            let chunk = to - t.fed;
            t.fed = to;
            report.events.push(Event::Prefill {
                slot,
                done: to,
                total: t.feed.len(),
            });
            self.spec_keep_hidden(slot, batch_row, chunk);
            batch_row += chunk;
            let s = &mut self.sessions[slot];
            let t = s.turn.as_mut().expect("planned sessions have a turn");
            if to != t.feed.len() {
                continue;
            }
            let logits = &self.logits[row * vocab..(row + 1) * vocab];
            row += 1;
            if t.emitted >= t.max_new {
                // Nothing to sample (a prompt-only request): it ends once fed.
                self.end_in_step(slot, Finish::Length, report);
                continue;
            }
            let tok = match (t.forced.get(t.emitted), t.grammar.as_mut()) {
                (Some(&tok), _) => tok,
                (None, None) => t.sampler.sample(logits),
                (None, Some(g)) => match g.pick(
                    logits,
                    &mut t.sampler,
                    &self.stops,
                    t.use_stops,
                    t.max_new - t.emitted,
                ) {
                    Pick::Token(tok) => tok,
                    Pick::Complete => {
                        self.end_in_step(slot, Finish::Grammar, report);
                        continue;
                    }
                    Pick::DeadEnd => {
                        self.fail(
                            slot,
                            "grammar: no token of the vocabulary continues the output",
                            report,
                        );
                        continue;
                    }
                },
            };
            self.spec.tokens += 1;
            self.spec.forwards += 1;
            s.spec.counts.tokens += 1;
            s.spec.counts.forwards += 1;
            if t.use_stops && self.stops.contains(&tok) {
                self.end_in_step(slot, Finish::StopToken, report);
                continue;
            }
            t.emitted += 1;
            emitted += 1;
            t.first_token.get_or_insert_with(std::time::Instant::now);
            if let Some(top) = t.sampler.logprobs {
                let lp = crate::sampling::logprob_of(logits, tok, top);
                report.events.push(Event::Logprob { slot, lp });
            }
            report.events.push(Event::Token { slot, id: tok });
            t.next = Some(tok);
            let grammar_done = t.grammar.as_mut().is_some_and(|g| {
                g.accept(self.tokenizer.token_bytes(tok));
                g.complete()
            });
            if t.emitted == t.max_new {
                self.end_in_step(slot, Finish::Length, report);
            } else if grammar_done {
                self.end_in_step(slot, Finish::Grammar, report);
            }
        }
        self.spec_plan(&plan);
        self.plan = plan;
        // Between two steps nothing borrows a layer's experts: the safe point for re-pin and
        // the RSS guard, whoever the caller is.
        let safe = self.model.experts.safe_point(emitted);
        report.swaps = safe.swaps;
        Ok(())
    }

    /// After a failed batched forward: which participant brought the failing read is not
    /// knowable (the batch's rows share experts), so each runs once alone, in plan order. Those
    /// whose own forward fails end as failed; the others stay in `plan` with the logits of their
    /// own forward in `self.logits`, in plan order, bitwise what the batch would have given
    /// them (a session's bits do not depend on what ran beside it).
    fn retry_alone(&mut self, plan: &mut Vec<(usize, Role)>, report: &mut StepReport) {
        let vocab = self.model.cfg.vocab_size;
        let mut logits = Vec::with_capacity(plan.len() * vocab);
        let mut kept = Vec::with_capacity(plan.len());
        for &(slot, role) in plan.iter() {
            // A recurrent state the batch advanced went back to a saved state
            // (`KvCache::rollback`): the positions after it are fed again first, so that the
            // retry starts where the batch did.
            let lost = self.sessions[slot].kv.take_lost();
            if !lost.is_empty() {
                let mut again = [SeqStep {
                    kv: &mut self.sessions[slot].kv,
                    tokens: &lost,
                    logits: Logits::None,
                }];
                if let Err(e) = self.model.forward_batch(&mut again, &mut self.logits) {
                    crate::elog!("[step] slot {slot}: refeeding its state failed too: {e}");
                    self.fail(slot, &e.to_string(), report);
                    continue;
                }
            }
            let mut one = [seq_of(&mut self.sessions[slot], role)];
            let sampled = matches!(one[0].logits, Logits::Last);
            match self.model.forward_batch(&mut one, &mut self.logits) {
                Ok(()) => {
                    if sampled {
                        logits.extend_from_slice(&self.logits[..vocab]);
                    }
                    kept.push((slot, role));
                }
                Err(e) => {
                    crate::elog!("[step] slot {slot}: forward failed alone too: {e}");
                    self.fail(slot, &e.to_string(), report);
                }
            }
        }
        crate::elog!(
            "[step] failed batch of {} retried one by one: {} went on, {} failed",
            plan.len(),
            kept.len(),
            plan.len() - kept.len()
        );
        *plan = kept;
        self.logits = logits;
    }

    /// Which sessions feed what in the next step, in slot order, into `plan`.
    fn plan_step(&mut self, plan: &mut Vec<(usize, Role)>) {
        plan.clear();
        let n = self.sessions.len();
        let decoding = self.sessions.iter().any(|s| s.phase() == Phase::Decode);
        let chunk = if decoding {
            self.prefill_chunk.min(PREFILL_CHUNK)
        } else {
            self.prefill_chunk
        };
        // Round robin: the scan for prefill chunks starts after the session served last; while
        // someone decodes, one chunk joins the step.
        let mut chunks = 0;
        let mut last = None;
        for k in 0..n {
            let slot = (self.prefill_cursor + k) % n;
            if self.sessions[slot].phase() == Phase::Prefill && !(decoding && chunks == 1) {
                let t = self.sessions[slot]
                    .turn
                    .as_ref()
                    .expect("prefilling has a turn");
                plan.push((
                    slot,
                    Role::Prefill {
                        to: (t.fed + chunk).min(t.feed.len()),
                    },
                ));
                chunks += 1;
                last = Some(slot);
            }
        }
        if let Some(slot) = last {
            self.prefill_cursor = (slot + 1) % n;
        }
        for (slot, s) in self.sessions.iter().enumerate() {
            if s.phase() == Phase::Decode {
                plan.push((slot, Role::Decode));
            }
        }
        plan.sort_unstable_by_key(|&(slot, _)| slot);
    }

    /// Ends `slot`'s request: what was sampled last and not fed becomes the session's pending
    /// token (a stop token is dropped).
    pub(crate) fn end(&mut self, slot: usize, finish: Finish) -> Option<TurnOutcome> {
        let s = &mut self.sessions[slot];
        let t = s.turn.take()?;
        s.undo = None;
        s.pending = match finish {
            Finish::StopToken => None,
            _ => t.next,
        };
        Some(t.outcome(finish))
    }

    /// `end`, reported as the step's Done event.
    pub(super) fn end_in_step(&mut self, slot: usize, finish: Finish, report: &mut StepReport) {
        if let Some(outcome) = self.end(slot, finish) {
            report.events.push(Event::Done { slot, outcome });
        }
    }

    /// Ends `slot`'s request as failed, with its cache and pending token as before it.
    pub(super) fn fail(&mut self, slot: usize, why: &str, report: &mut StepReport) {
        let s = &mut self.sessions[slot];
        let Some(t) = s.turn.take() else { return };
        s.kv.truncate(t.kv_len0);
        s.pending = t.pending0;
        if let Some(undo) = s.undo.take() {
            // Rows adopted from another session for this prompt go too.
            match undo.cut {
                Some(kv) => s.kv = kv,
                None => s.kv.truncate(undo.own),
            }
            s.pending = undo.pending;
        }
        let outcome = t.outcome(Finish::Failed(why.to_string()));
        report.events.push(Event::Done { slot, outcome });
    }
}
