//! The engine thread: owns the [`Engine`], takes admitted-to-be requests from a bounded
//! channel (the queue), and advances every active one in one batched step per loop, as the
//! mux loop does. Each request's text goes back on its own channel; a channel whose receiver
//! is gone (the client disconnected) stops its request between two steps and frees the slot.
//!
//! The channel is the queue: the loop takes a request from it only when a slot is free, so
//! the HTTP side's `try_send` failing with `Full` is the 429.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, TryRecvError};
use tokio::sync::mpsc::UnboundedSender;

use super::metrics::Metrics;
use super::telemetry::{Hub, Tap};
use crate::engine::answer::{keep_sent, AnswerStream};
use crate::engine::conversation::Conversation;
use crate::engine::{
    AdmitRequest, Engine, Event, Finish, PromptInput, Refusal, StepReport, Tenant, TurnOutcome,
};
use crate::grammar::Grammar;
use crate::sampling::{Rng, Sampler, SamplingParams};

/// What a request's prompt is before the engine renders it.
pub enum JobPrompt {
    /// `/v1/completions`: the text as given.
    Text(String),
    /// A chat: rendered with the model's template.
    Chat(Conversation),
    /// Only counted (`/v1/messages/count_tokens`): rendered and tokenized as `Chat` would be,
    /// the count sent back as `Started` and nothing run. It waits in the queue as any job
    /// does (the tokenizer is the engine thread's, which takes jobs while a session is free)
    /// but occupies no session.
    Count(Conversation),
}

/// One request for the engine thread.
pub struct Job {
    pub prompt: JobPrompt,
    pub max_tokens: usize,
    pub temperature: f32,
    pub top_p: f32,
    pub params: SamplingParams,
    /// Report each token's logprob with this many alternatives (`None`: no logprobs).
    pub logprobs: Option<usize>,
    /// Read the prompt out as well ([`Out::Echo`]), with `logprobs` alternatives.
    pub echo: bool,
    /// The template's thinking switch; `None`: the server's `--think`.
    pub think: Option<bool>,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub grammar: Option<Arc<Grammar>>,
    /// Whose request it is (its API key and `user`): prefix reuse stays within it.
    pub tenant: Tenant,
    pub out: UnboundedSender<Out>,
    /// Arrival (time to first token counts from here) and the deadline of the whole request.
    pub arrived: Instant,
    pub deadline: Instant,
}

/// What a request's channel carries, in order: `Started` or `Refused`, then `Text`s, then
/// `Done`.
#[derive(Debug)]
pub enum Out {
    Started {
        prompt_tokens: usize,
        cached: usize,
    },
    Refused(Refusal),
    /// The template could not render the conversation.
    BadPrompt(String),
    /// The request's time ran out while it waited for a free session.
    Expired,
    Text(String),
    /// The logprobs of the token whose text comes next (requests that asked for them).
    Logprob(TokenLp),
    /// The prompt's tokens and their logprobs, right after `Started` (requests that asked
    /// for the read-out); the first token's `logprob` is NaN: nothing predicts it.
    Echo(Vec<TokenLp>),
    Done(Summary),
}

/// A token's logprob and its most likely alternatives, as token bytes.
#[derive(Clone, Debug)]
pub struct TokenLp {
    pub bytes: Vec<u8>,
    pub logprob: f32,
    pub top: Vec<(Vec<u8>, f32)>,
}

/// A token's logprobs with token bytes for ids.
fn token_lp(tok: &crate::tokenizer::Tokenizer, lp: &crate::sampling::TokenLogprob) -> TokenLp {
    TokenLp {
        bytes: tok.token_bytes(lp.id).to_vec(),
        logprob: lp.logprob,
        top: lp
            .top
            .iter()
            .map(|&(id, l)| (tok.token_bytes(id).to_vec(), l))
            .collect(),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// A stop token, or a grammar's sentence complete.
    Stop,
    /// The token budget.
    Length,
    /// One of the request's stop strings (which is not part of the text).
    StopString,
    /// The request timeout.
    Timeout,
    /// A forward failed; the conversation is as before it.
    Failed,
}

#[derive(Clone, Debug)]
pub struct Summary {
    pub why: Why,
    pub prompt_tokens: usize,
    pub cached: usize,
    pub completion_tokens: usize,
    /// The stop string that ended the answer (`Why::StopString`).
    pub stop_sequence: Option<String>,
    /// Why the conversation could not be saved after the answer (a full disk), if it could
    /// not: the client is told, as the answer itself is whole.
    pub save_error: Option<String>,
    /// `--cache-route`: the usage's `colibri` field, saying the routing was approximate and how
    /// far it agreed with exact routing over the request (the steps it shared with other
    /// requests included). `None`: exact routing.
    pub colibri: Option<serde_json::Value>,
}

impl Summary {
    /// `usage` with the `colibri` field added when the routing was approximate.
    pub fn with_colibri(&self, mut usage: serde_json::Value) -> serde_json::Value {
        if let (Some(c), Some(u)) = (&self.colibri, usage.as_object_mut()) {
            u.insert("colibri".into(), c.clone());
        }
        usage
    }
}

/// Settings the loop applies to every request.
pub struct Settings {
    pub think: bool,
    pub share: bool,
    /// `--stop` strings, added to each request's own.
    pub stop: Vec<String>,
    pub seed: Option<u64>,
}

struct Active {
    /// The tiers' counters when the request was admitted (cache-aware routing's agreement).
    counters0: crate::experts::ExpertCounters,
    out: UnboundedSender<Out>,
    answer: AnswerStream,
    answer_start: usize,
    prompt_tokens: usize,
    cached: usize,
    max_tokens: usize,
    emitted: usize,
    arrived: Instant,
    deadline: Instant,
    first_token: Option<Instant>,
}

pub struct Worker {
    engine: Engine,
    settings: Settings,
    metrics: Arc<Metrics>,
    rng: Rng,
    by_slot: Vec<Option<Active>>,
    /// The telemetry stream's publisher (`GET /v1/colibri/telemetry`).
    tap: Tap,
}

impl Worker {
    pub fn new(
        engine: Engine,
        settings: Settings,
        metrics: Arc<Metrics>,
        telemetry: Arc<Hub>,
    ) -> Worker {
        let rng = settings
            .seed
            .map(Rng::new)
            .unwrap_or_else(Rng::from_entropy);
        let slots = engine.sessions().len();
        Worker {
            engine,
            settings,
            metrics,
            rng,
            by_slot: (0..slots).map(|_| None).collect(),
            tap: Tap::new(telemetry, slots),
        }
    }

    /// Runs until the channel closes (the server shut down) with nothing in flight, or the
    /// engine fails; saves every session on the way out.
    pub fn run(mut self, jobs: Receiver<Job>, failed: &AtomicBool) {
        let mut report = StepReport::default();
        let mut closed = false;
        self.tap.ready(&self.engine);
        loop {
            // 1. Take waiting requests while a slot is free; block briefly when idle.
            while !closed && self.by_slot.iter().any(Option::is_none) {
                let job = if self.engine.any_active() {
                    match jobs.try_recv() {
                        Ok(j) => Some(j),
                        Err(TryRecvError::Empty) => None,
                        Err(TryRecvError::Disconnected) => {
                            closed = true;
                            None
                        }
                    }
                } else {
                    match jobs.recv_timeout(Duration::from_millis(50)) {
                        Ok(j) => Some(j),
                        Err(RecvTimeoutError::Timeout) => None,
                        Err(RecvTimeoutError::Disconnected) => {
                            closed = true;
                            None
                        }
                    }
                };
                match job {
                    Some(j) => self.start(j),
                    None => break,
                }
            }
            // 2. Requests whose client went away or whose time is up end now.
            let now = Instant::now();
            for slot in 0..self.by_slot.len() {
                let Some(a) = &self.by_slot[slot] else {
                    continue;
                };
                let (gone, late) = (a.out.is_closed(), now >= a.deadline);
                if gone || late {
                    if let Some(outcome) = self.engine.stop(slot, gone) {
                        self.metrics.add(&self.metrics.cancelled, 1);
                        self.finished(slot, outcome, late);
                    }
                }
            }
            // 3. One step over every active request.
            if self.engine.any_active() {
                if let Err(e) = self.engine.step(&mut report) {
                    crate::elog!("[api] the engine failed: {e}; no more requests are served");
                    failed.store(true, Ordering::Relaxed);
                    break;
                }
                self.deliver(&report);
                self.tap.stepped(&self.engine);
            } else if closed {
                break;
            }
        }
        self.engine.save_all();
    }

    fn start(&mut self, job: Job) {
        if job.out.is_closed() {
            // Gave up while queued.
            self.metrics.add(&self.metrics.cancelled, 1);
            return;
        }
        if Instant::now() >= job.deadline {
            self.metrics.add(&self.metrics.cancelled, 1);
            let _ = job.out.send(Out::Expired);
            return;
        }
        let prompt = match job.prompt {
            JobPrompt::Count(conv) => {
                let think = job.think.unwrap_or(self.settings.think);
                return self.count(&conv, think, &job.out);
            }
            JobPrompt::Text(t) => PromptInput::Text(t.into_bytes()),
            JobPrompt::Chat(conv) => {
                let think = job.think.unwrap_or(self.settings.think);
                match self.engine.render_conversation(&conv, think) {
                    Ok(t) => PromptInput::Chat(t),
                    Err(e) => {
                        self.metrics.add(&self.metrics.refused, 1);
                        let _ = job.out.send(Out::BadPrompt(e.to_string()));
                        return;
                    }
                }
            }
        };
        let rng = match job.seed {
            Some(s) => Rng::new(s),
            None => Rng::new(self.rng.next_u64()),
        };
        let sampler = Sampler::new(job.temperature, job.top_p, rng)
            .with_params(job.params)
            .with_logprobs(job.logprobs);
        // Clamped to the room by `admit` and by nothing else (no `--ngen` here).
        let max_tokens = job.max_tokens;
        let admitted = self.engine.admit(AdmitRequest {
            slot: None,
            prompt,
            // The prompt, the answer's first token and one position of slack.
            max_prompt_tokens: self.engine.ctx().saturating_sub(2),
            max_tokens,
            sampler,
            grammar: job.grammar,
            share: self.settings.share,
            tenant: job.tenant,
            echo: job.logprobs.filter(|_| job.echo),
        });
        let a = match admitted {
            Ok(a) => a,
            Err(r) => {
                self.metrics.add(&self.metrics.refused, 1);
                let _ = job.out.send(Out::Refused(r));
                return;
            }
        };
        self.tap.started(&self.engine, a.slot, a.prompt_tokens);
        let m = &self.metrics;
        m.add(&m.requests, 1);
        m.add(&m.active, 1);
        m.add(&m.prompt_tokens, a.prompt_tokens as u64);
        m.add(&m.cached_tokens, a.cached as u64);
        let _ = job.out.send(Out::Started {
            prompt_tokens: a.prompt_tokens,
            cached: a.cached,
        });
        if !a.echo.is_empty() {
            let tok = self.engine.tokenizer();
            let read_out = a
                .echo
                .iter()
                .map(|t| match &t.lp {
                    Some(lp) => token_lp(tok, lp),
                    None => TokenLp {
                        bytes: tok.token_bytes(t.id).to_vec(),
                        logprob: f32::NAN,
                        top: Vec::new(),
                    },
                })
                .collect();
            let _ = job.out.send(Out::Echo(read_out));
        }
        let mut stop = job.stop;
        stop.extend(self.settings.stop.iter().cloned());
        self.by_slot[a.slot] = Some(Active {
            out: job.out,
            answer: AnswerStream::new(&stop),
            answer_start: a.prompt_tokens,
            prompt_tokens: a.prompt_tokens,
            cached: a.cached,
            max_tokens: a.max_new,
            emitted: 0,
            arrived: job.arrived,
            deadline: job.deadline,
            counters0: self.engine.tiers().counters(),
            first_token: None,
        });
    }

    /// A conversation's prompt tokens, counted as [`Engine::admit`] counts a `Chat` prompt.
    /// Refused only past the RAM budget for tokenizing, not past the context: a client asks
    /// in order to learn whether its history still fits.
    fn count(&mut self, conv: &Conversation, think: bool, out: &UnboundedSender<Out>) {
        let chat = match self.engine.render_conversation(conv, think) {
            Ok(t) => t,
            Err(e) => {
                let _ = out.send(Out::BadPrompt(e.to_string()));
                return;
            }
        };
        if let Err(r) = self.engine.check_encodable(chat.text.len(), usize::MAX) {
            let _ = out.send(Out::Refused(r));
            return;
        }
        let _ = match self.engine.tokenizer().encode_chat(&chat) {
            Ok(ids) => out.send(Out::Started {
                prompt_tokens: ids.len(),
                cached: 0,
            }),
            Err(e) => out.send(Out::Refused(Refusal::Tokenizer(e.to_string()))),
        };
    }

    fn deliver(&mut self, report: &StepReport) {
        for event in &report.events {
            match event {
                Event::Prefill { done, total, .. } => self.tap.prefill(*done, *total),
                Event::Logprob { slot, lp } => {
                    let Some(a) = self.by_slot[*slot].as_ref() else {
                        continue;
                    };
                    if a.answer.stopped() {
                        continue;
                    }
                    let _ = a
                        .out
                        .send(Out::Logprob(token_lp(self.engine.tokenizer(), lp)));
                }
                Event::Token { slot, id } => {
                    let bytes = self.engine.token_bytes(*id);
                    let Some(a) = self.by_slot[*slot].as_mut() else {
                        continue;
                    };
                    if a.answer.stopped() {
                        // Drafted past the stop string in the step that completed it.
                        continue;
                    }
                    a.emitted += 1;
                    self.tap.token(&self.engine, *slot);
                    if a.first_token.is_none() {
                        let now = Instant::now();
                        a.first_token = Some(now);
                        let us = (now - a.arrived).as_micros() as u64;
                        self.metrics.add(&self.metrics.ttft_us, us);
                        self.metrics.add(&self.metrics.ttft_n, 1);
                    }
                    let ready = a.answer.push(bytes);
                    if !ready.is_empty() {
                        let _ = a
                            .out
                            .send(Out::Text(String::from_utf8_lossy(&ready).into_owned()));
                    }
                    if a.answer.stopped() {
                        if let Some(outcome) = self.engine.stop(*slot, false) {
                            self.finished(*slot, outcome, false);
                        }
                    }
                }
                Event::Done { slot, outcome } => self.finished(*slot, outcome.clone(), false),
            }
        }
    }

    fn finished(&mut self, slot: usize, outcome: TurnOutcome, timed_out: bool) {
        let Some(mut a) = self.by_slot[slot].take() else {
            return;
        };
        let m = &self.metrics;
        m.active.fetch_sub(1, Ordering::Relaxed);
        m.add(&m.completion_tokens, a.emitted as u64);
        let rest = a.answer.finish();
        let cancelled = matches!(outcome.finish, Finish::Cancelled);
        if !rest.is_empty() && !cancelled {
            let _ = a
                .out
                .send(Out::Text(String::from_utf8_lossy(&rest).into_owned()));
        }
        let failed = matches!(outcome.finish, Finish::Failed(_));
        if let (Some(sent), false) = (a.answer.tokens_sent(), failed) {
            keep_sent(&mut self.engine, slot, a.answer_start, sent);
        }
        let save_error = self.engine.save(slot).err().map(|e| e.to_string());
        if save_error.is_some() {
            // Already on stderr with its reason; counted so a full disk shows in /metrics.
            m.add(&m.save_failed, 1);
        }
        if let Some(t) = a.first_token {
            let decode = t.elapsed();
            m.add(&m.decode_us, decode.as_micros() as u64);
            let mut g = m.gauges.lock();
            g.last_tok_per_s = crate::telemetry::per_second(
                a.emitted.saturating_sub(1) as f64,
                decode.as_secs_f64(),
            );
        }
        self.refresh_gauges();
        let why = if let Finish::Failed(e) = &outcome.finish {
            crate::elog!("[api] a request on slot {slot} failed: {e}");
            Why::Failed
        } else if a.answer.stopped() {
            Why::StopString
        } else if timed_out {
            Why::Timeout
        } else if a.emitted >= a.max_tokens || outcome.finish == Finish::Length {
            Why::Length
        } else {
            Why::Stop
        };
        self.tap.finished(&self.engine, slot, why == Why::Length);
        let now = self.engine.tiers().counters();
        let colibri = now.route_since(&a.counters0).map(|r| {
            serde_json::json!({"cache_route": crate::cache_route::RouteCounts::usage_json(
                &r, now.route.m, now.route.j)})
        });
        let _ = a.out.send(Out::Done(Summary {
            colibri,
            why,
            prompt_tokens: a.prompt_tokens,
            cached: a.cached,
            completion_tokens: a.emitted,
            stop_sequence: a.answer.stop_string(),
            save_error,
        }));
    }

    fn refresh_gauges(&self) {
        let x = self.engine.tiers();
        let c = x.counters();
        let (resident, bytes) = x.resident();
        let total = x.n_sparse() * x.n_experts();
        let mut g = self.metrics.gauges.lock();
        g.expert_hits = c.hits();
        g.expert_misses = c.store.misses;
        g.bytes_read = c.store.bytes_read;
        g.ram_experts = resident as u64;
        g.disk_experts = total.saturating_sub(resident) as u64;
        g.ram_tier_bytes = bytes as u64;
    }
}
