//! Upstream's multiplexed protocol (`run_serve_mux`, reference/upstream-behaviour.md §1.2):
//! SUBMIT / STOP / CANCEL in, ACCEPT / DATA / DONE / ERROR out, every active request advanced
//! by one batched engine step per loop.
//!
//! Stdin is read on its own thread into a channel, so the loop polls it between steps (STOP
//! and CANCEL act within one step, a SUBMIT joins the next one) and blocks on it only when no
//! request is active. Frames are the protocol crate's; this file only maps them onto engine
//! calls and the engine's step reports back onto frames.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use protocol::mux::{
    decode_mux_request, decode_mux_request_eof, ErrorCode, LogprobTail, MuxRejected, MuxReply,
    MuxRequest, Submit,
};
use protocol::{
    DecodeError, EngineState, GrammarEnd, KvSave, Live, SessionInfo, SessionState, Stat, Telemetry,
};

use super::discard::Discard;
use super::signal;
use crate::cli::ServeArgs;
use crate::engine::answer::{keep_sent, AnswerStream};
use crate::engine::report::{self, Baseline};
use crate::engine::{
    AdmitRequest, Engine, Event, Finish, Phase, PromptInput, Refusal, StepReport, TurnOutcome,
};
use crate::error::EngineError;
use crate::experts::ExpertCounters;
use crate::grammar::Grammar;
use crate::sampling::{Rng, Sampler};
use crate::telemetry::{rss_gb, TelemetryOut};

/// What the stdin thread sends.
enum Input {
    Bytes(Vec<u8>),
    Eof,
}

/// A request in flight.
struct Request {
    slot: usize,
    prompt_tokens: usize,
    /// The answer budget: the client's max_tokens clamped to the slot's room (upstream's
    /// only clamp); reaching it is what DONE reports as length-limited.
    max_tokens: usize,
    emitted: usize,
    /// The answer's bytes on their way to DATA frames (`--stop`, the UTF-8 hold).
    answer: AnswerStream,
    /// Where the answer starts in the slot's conversation: the prompt's length.
    answer_start: usize,
    /// The request carried a grammar: a GRAMMAR line says, before DONE, whether its output
    /// is a whole sentence of it.
    constrained: bool,
    /// Counters when the first token came (upstream's window starts after the prefill), and
    /// when the request was accepted (for PROF).
    decode_base: Option<(Instant, ExpertCounters)>,
    accepted: Baseline,
    accepted_at: Instant,
    /// `logprobs=k`: every token goes out as its own DATA frame with this logprobs tail.
    logprobs: bool,
    /// The tail of the token whose `Token` event comes next.
    pending_tail: Option<LogprobTail>,
}

/// A token's logprobs as the wire's tail.
fn tail_of(lp: &crate::sampling::TokenLogprob) -> LogprobTail {
    LogprobTail {
        logprob: lp.logprob,
        top: lp.top.clone(),
    }
}

struct Mux<W: Write> {
    engine: Engine,
    args: ServeArgs,
    out: W,
    telemetry: TelemetryOut,
    rng: Rng,
    /// Requests in flight by id, and the id each slot serves.
    requests: HashMap<u64, Request>,
    by_slot: Vec<Option<u64>>,
    /// Tokens the last finished request of each slot generated: SESSIONS reports it for
    /// idle slots (the request itself is gone by then).
    last_generated: Vec<u64>,
    closed: bool,
    last_live: Instant,
    state: EngineState,
}

pub fn serve(
    engine: Engine,
    args: ServeArgs,
    telemetry: TelemetryOut,
) -> Result<ExitCode, EngineError> {
    signal::install_sigterm();
    let mut engine = engine;
    // Upstream keeps only <|endoftext|> as a stop in mux mode (the gateway owns tool-call
    // stops: an `<|observation|>` must reach it); COLI_SERVE_ALL_STOPS=1 re-arms all.
    if !std::env::var("COLI_SERVE_ALL_STOPS").is_ok_and(|v| v == "1") {
        engine.stop_on_end_of_text_only();
    }
    let rng = args
        .sampling
        .seed
        .map(Rng::new)
        .unwrap_or_else(Rng::from_entropy);
    let slots = engine.sessions().len();
    let mut mux = Mux {
        engine,
        args,
        out: std::io::stdout(),
        telemetry,
        rng,
        requests: HashMap::new(),
        by_slot: vec![None; slots],
        last_generated: vec![0; slots],
        closed: false,
        last_live: Instant::now(),
        state: EngineState::Idle,
    };
    mux.ready();
    let input = spawn_stdin_reader();
    mux.serve(&input)?;
    mux.engine.save_all();
    Ok(ExitCode::SUCCESS)
}

/// Reads stdin on a thread of its own, chunk by chunk, until EOF or an error (which ends the
/// input like EOF, with a message).
fn spawn_stdin_reader() -> Receiver<Input> {
    let (tx, rx) = crossbeam_channel::unbounded();
    std::thread::Builder::new()
        .name("stdin".into())
        .spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let mut chunk = vec![0u8; 64 * 1024];
            loop {
                match stdin.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => {
                        if tx.send(Input::Bytes(chunk[..n].to_vec())).is_err() {
                            return;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        crate::elog!("[serve] reading stdin failed: {e}; taking it as EOF");
                        break;
                    }
                }
            }
            let _ = tx.send(Input::Eof);
        })
        .expect("spawning the stdin reader thread");
    rx
}

impl<W: Write> Mux<W> {
    fn send(&mut self, r: &MuxReply) {
        let mut bytes = Vec::new();
        r.encode(&mut bytes);
        if self
            .out
            .write_all(&bytes)
            .and_then(|_| self.out.flush())
            .is_err()
        {
            self.closed = true;
        }
    }

    fn error(&mut self, id: u64, code: ErrorCode) {
        self.send(&MuxReply::Error { id, code });
    }

    /// A telemetry line on stdout (upstream's per-request block) and on the telemetry fd.
    fn both(&mut self, t: Telemetry) {
        self.telemetry.send(&t);
        self.send(&MuxReply::Telemetry(t));
    }

    fn ready(&mut self) {
        self.send(&MuxReply::Ready);
        self.send(&MuxReply::Stat(Stat::zero(rss_gb())));
        self.both(Telemetry::HwInfo(crate::telemetry::hwinfo()));
        self.both(Telemetry::Tiers(report::tiers(&self.engine)));
        self.both(Telemetry::Emap(self.engine.tiers().emap()));
        self.telemetry.send(&Telemetry::State(EngineState::Idle));
    }

    /// The loop: take what stdin has, act on it, step, until EOF with nothing in flight.
    fn serve(&mut self, input: &Receiver<Input>) -> Result<(), EngineError> {
        let mut buf: Vec<u8> = Vec::new();
        let mut eof = false;
        let mut report = StepReport::default();
        let mut discard = Discard::default();
        while !self.closed {
            // 1. Input: everything there now; wait for it (briefly, to poll the signals) only
            //    when nothing is active.
            let mut next = if self.engine.any_active() || eof {
                input.try_recv().ok()
            } else {
                match input.recv_timeout(Duration::from_millis(100)) {
                    Ok(i) => Some(i),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => Some(Input::Eof),
                }
            };
            while let Some(i) = next {
                match i {
                    Input::Bytes(b) => buf.extend_from_slice(&b),
                    Input::Eof => eof = true,
                }
                next = input.try_recv().ok();
            }
            // 2. Requests: every complete frame in the buffer.
            loop {
                if !discard.apply(&mut buf) {
                    break;
                }
                let decoded = if eof {
                    decode_mux_request_eof(&buf)
                } else {
                    decode_mux_request(&buf)
                };
                match decoded {
                    Ok((req, used)) => {
                        buf.drain(..used);
                        if let MuxRequest::Rejected(r) = &req {
                            let unread = r.unread_body();
                            if unread > 0 {
                                crate::elog!("[API] discarding the {unread} bytes it announced");
                                discard = Discard::body(unread);
                            }
                        }
                        self.handle(req);
                    }
                    Err(DecodeError::Incomplete) => {
                        if eof && !buf.is_empty() {
                            crate::elog!(
                                "[API] {} bytes of an incomplete frame at EOF: dropped",
                                buf.len()
                            );
                            buf.clear();
                        }
                        break;
                    }
                    Err(e) => {
                        // Dropped through its newline so the next frame is read in sync.
                        crate::elog!("[API] rejected: {e}; dropping it through its \\n");
                        self.error(0, ErrorCode::BadRequest);
                        discard = Discard::line();
                    }
                }
            }
            // 3. Signals: SIGINT finishes every active request now (DONE); SIGTERM too, then
            //    the daemon exits.
            let term = signal::TERMINATED.load(Ordering::Relaxed);
            if signal::INTERRUPTED.swap(false, Ordering::Relaxed) || term {
                let active: Vec<usize> = (0..self.by_slot.len())
                    .filter(|&s| self.by_slot[s].is_some())
                    .collect();
                for slot in active {
                    if let Some(outcome) = self.engine.stop(slot, false) {
                        self.finished(slot, outcome);
                    }
                }
                if term {
                    crate::elog!("[serve] SIGTERM: requests finished, saving and exiting");
                    break;
                }
            }
            // 4. One step over every active request.
            if self.engine.any_active() {
                self.set_state();
                self.engine.step(&mut report)?;
                self.deliver(&report);
                self.live();
            } else {
                self.set_state();
                if eof {
                    break;
                }
            }
        }
        Ok(())
    }

    fn set_state(&mut self) {
        let phases = self.engine.sessions().iter().map(|s| s.phase());
        let mut state = EngineState::Idle;
        for p in phases {
            match p {
                Phase::Decode => {
                    state = EngineState::Generating;
                    break;
                }
                Phase::Prefill => state = EngineState::Prefill,
                Phase::Idle => {}
            }
        }
        if state != self.state {
            self.state = state;
            self.telemetry.send(&Telemetry::State(state));
        }
    }

    /// LIVE lines (one per decoding request) at most every 250 ms.
    fn live(&mut self) {
        if !self.telemetry.enabled() || self.last_live.elapsed() < Duration::from_millis(250) {
            return;
        }
        self.last_live = Instant::now();
        let now = self.engine.tiers().counters();
        let mut lines = Vec::new();
        for r in self.requests.values() {
            if let Some((t, c)) = &r.decode_base {
                lines.push(Live {
                    tokens: r.emitted as u32,
                    tok_per_s: crate::telemetry::per_second(
                        r.emitted as f64,
                        t.elapsed().as_secs_f64(),
                    ),
                    hit_pct: now.hit_pct_since(c),
                    rss_gb: rss_gb(),
                    slot: r.slot as u32,
                    tokens_per_forward: Some(
                        report::spec_since(&self.engine, &r.accepted).tokens_per_forward(),
                    ),
                });
            }
        }
        for l in lines {
            self.telemetry.send(&Telemetry::Live(l));
        }
        // The tiers and the map as they are now, so a dashboard moves during an answer and
        // not only at its end (the fd only: stdout keeps upstream's per-request block).
        self.telemetry
            .send(&Telemetry::Tiers(report::tiers(&self.engine)));
        self.telemetry
            .send(&Telemetry::Emap(self.engine.tiers().emap()));
        self.emit_sessions();
    }

    fn handle(&mut self, req: MuxRequest) {
        match req {
            MuxRequest::Submit(s) => self.submit(s),
            MuxRequest::Stop { id } | MuxRequest::Cancel { id }
                if !self.requests.contains_key(&id) =>
            {
                self.error(id, ErrorCode::NotFound)
            }
            MuxRequest::Stop { id } => {
                let slot = self.requests[&id].slot;
                if let Some(outcome) = self.engine.stop(slot, false) {
                    self.finished(slot, outcome);
                }
            }
            MuxRequest::Cancel { id } => {
                let slot = self.requests[&id].slot;
                if let Some(outcome) = self.engine.stop(slot, true) {
                    self.finished(slot, outcome);
                }
            }
            MuxRequest::Rejected(r) => self.rejected(&r),
        }
    }

    fn rejected(&mut self, r: &MuxRejected) {
        crate::elog!(
            "[API] rejected {}: {}",
            String::from_utf8_lossy(&r.line),
            r.reason
        );
        self.error(r.id, r.code);
    }

    /// SUBMIT: the daemon's checks in upstream's order, then ACCEPT and the engine request.
    fn submit(&mut self, s: Submit) {
        let id = s.id;
        let kv_slots = self.by_slot.len();
        let slot = s.slot as usize;
        if slot >= kv_slots {
            crate::elog!(
                "[API] rejected SUBMIT {id}: slot {slot} must be in 0..={} (KV_SLOTS {kv_slots})",
                kv_slots - 1
            );
            return self.error(id, ErrorCode::BadRequest);
        }
        if self.by_slot[slot].is_some() {
            crate::elog!(
                "[API] rejected SUBMIT {id}: slot {slot} is busy with request {}",
                self.by_slot[slot].unwrap_or(0)
            );
            return self.error(id, ErrorCode::SlotBusy);
        }
        if self.requests.contains_key(&id) {
            crate::elog!("[API] rejected SUBMIT {id}: that id is already in flight");
            return self.error(id, ErrorCode::DuplicateId);
        }
        // Compiled before tokenizing, as upstream checks its grammar before ACCEPT.
        let grammar = match s.grammar.as_deref().map(Grammar::from_request) {
            None => None,
            Some(Ok(g)) => Some(Arc::new(g)),
            Some(Err(e)) => {
                crate::elog!("[API] rejected SUBMIT {id}: {e}");
                return self.error(id, ErrorCode::BadRequest);
            }
        };
        // `logprobs=k` (k > 0): the prompt read out in ECHO frames, each token's DATA with
        // its tail; `logprobs=0` is the channel off, as upstream.
        let logprobs = s.logprobs.filter(|&k| k > 0).map(|k| k as usize);
        let prompt = if s.ids {
            match parse_ids(&s.payload, self.engine.vocab_size()) {
                Ok(v) => PromptInput::Ids(v),
                Err(why) => {
                    crate::elog!("[API] rejected SUBMIT {id}: ids=1 payload {why}");
                    return self.error(id, ErrorCode::BadRequest);
                }
            }
        } else {
            PromptInput::Text(s.payload)
        };
        // The client's budget, clamped only to the slot's room (by `admit`), as upstream's
        // mux does: `--ngen` is the legacy protocol's per-turn budget, and a gateway asking
        // for 1000 tokens must not silently get 256.
        let max_tokens = s.max_tokens as usize;
        // Each request draws from its own generator, seeded from the daemon's one stream (a
        // refused request gives its draw back, so it changes no later request's seed).
        let stream = self.rng.clone();
        let rng = Rng::new(self.rng.next_u64());
        let sampler = Sampler::new(s.temperature as f32, s.top_p as f32, rng)
            .with_params(self.args.sampling.params())
            .with_logprobs(logprobs);
        let constrained = grammar.is_some();
        let admitted = self.engine.admit(AdmitRequest {
            slot: Some(slot),
            prompt,
            // A request holds fewer than CTX - 2 tokens (upstream's rule).
            max_prompt_tokens: self.engine.ctx().saturating_sub(3),
            max_tokens,
            sampler,
            grammar,
            share: self.args.kv_share,
            tenant: crate::engine::Tenant::LOCAL,
            echo: logprobs,
        });
        let admitted = match admitted {
            Ok(a) => a,
            Err(r) => {
                self.rng = stream;
                return self.refused(id, r);
            }
        };
        self.send(&MuxReply::Accept {
            id,
            prompt_tokens: admitted.prompt_tokens as u64,
        });
        for (pos, t) in admitted.echo.iter().enumerate() {
            let bytes = self.engine.token_bytes(t.id).to_vec();
            self.send(&MuxReply::Echo {
                id,
                pos: pos as u64,
                bytes,
                tail: t.lp.as_ref().map_or_else(LogprobTail::unpredicted, tail_of),
            });
        }
        let prompt_tokens = admitted.prompt_tokens;
        self.by_slot[slot] = Some(id);
        self.requests.insert(
            id,
            Request {
                slot,
                prompt_tokens,
                max_tokens: admitted.max_new,
                emitted: 0,
                answer: AnswerStream::new(&self.args.sampling.stop),
                answer_start: prompt_tokens,
                constrained,
                decode_base: None,
                accepted: Baseline::now(&self.engine, slot),
                accepted_at: Instant::now(),
                logprobs: logprobs.is_some(),
                pending_tail: None,
            },
        );
        self.emit_sessions();
    }

    /// A refusal of the engine's admission as this protocol's ERROR frame, with the reason
    /// on stderr in its words.
    fn refused(&mut self, id: u64, r: Refusal) {
        let ctx = self.engine.ctx();
        // Upstream words the limit as "fewer than CTX - 2".
        let limit = ctx.saturating_sub(2);
        let code = match r {
            Refusal::TooManyBytes {
                bytes, at_least, ..
            } => {
                crate::elog!(
                    "[API] rejected SUBMIT {id}: the prompt is {bytes} bytes, so at least {at_least} tokens, a request holds fewer than {limit} (CTX {ctx} - 2); not tokenized, nothing was truncated, raise --ctx"
                );
                ErrorCode::ContextExceeded {
                    tokens: at_least as u64,
                    limit: limit as u64,
                }
            }
            Refusal::ContextExceeded { tokens, .. } => {
                crate::elog!(
                    "[API] rejected SUBMIT {id}: the prompt is {tokens} tokens, a request holds fewer than {limit} (CTX {ctx} - 2); nothing was truncated, raise --ctx"
                );
                ErrorCode::ContextExceeded {
                    tokens: tokens as u64,
                    limit: limit as u64,
                }
            }
            Refusal::EmptyPrompt => {
                crate::elog!("[API] rejected SUBMIT {id}: the prompt is empty after tokenization");
                ErrorCode::EmptyPrompt
            }
            Refusal::SlotBusy { .. } | Refusal::NoFreeSlot => ErrorCode::SlotBusy,
            Refusal::EncodeBudget(why) | Refusal::Tokenizer(why) | Refusal::Engine(why) => {
                crate::elog!("[API] rejected SUBMIT {id}: {why}");
                ErrorCode::BadRequest
            }
            Refusal::NoSuchSlot { slot, slots } => {
                crate::elog!("[API] rejected SUBMIT {id}: slot {slot} is not in 0..{slots}");
                ErrorCode::BadRequest
            }
        };
        self.error(id, code)
    }

    /// The frames of one step.
    fn deliver(&mut self, report: &StepReport) {
        for swap in &report.swaps {
            self.telemetry.send(&Telemetry::Repin(swap.clone()));
        }
        for event in &report.events {
            match event {
                Event::Prefill { slot, done, total } => {
                    if *total > crate::engine::PREFILL_CHUNK {
                        crate::elog!("[prefill] slot {slot}: {done}/{total} tokens");
                    }
                }
                Event::Token { slot, id } => {
                    let Some(rid) = self.by_slot[*slot] else {
                        continue;
                    };
                    let bytes = self.engine.token_bytes(*id).to_vec();
                    let counters = self.engine.tiers().counters();
                    let r = self.requests.get_mut(&rid).expect("slot's request");
                    if r.answer.stopped() {
                        // A drafted token after the stop string, in the step that completed
                        // it (the request ends at this step's Done): not part of the answer.
                        continue;
                    }
                    r.emitted += 1;
                    r.decode_base.get_or_insert((Instant::now(), counters));
                    let ready = r.answer.push(&bytes);
                    let (first, stopped) = (r.emitted == 1, r.answer.stopped());
                    let tail = r.pending_tail.take().filter(|_| r.logprobs);
                    if first {
                        self.emit_sessions();
                    }
                    // With logprobs, one frame per token (its bytes may be held back yet),
                    // as upstream writes them; without, a frame only when bytes are ready.
                    if let Some(tail) = tail {
                        self.send(&MuxReply::DataLogprobs {
                            id: rid,
                            bytes: ready,
                            tail,
                        });
                    } else if !ready.is_empty() {
                        self.send(&MuxReply::Data {
                            id: rid,
                            bytes: ready,
                        });
                    }
                    // A stop string ends the request now, through DONE as STOP would. When
                    // this step already ended it (its Done event follows), that event does.
                    if stopped {
                        if let Some(outcome) = self.engine.stop(*slot, false) {
                            self.finished(*slot, outcome);
                        }
                    }
                }
                Event::Done { slot, outcome } => self.finished(*slot, outcome.clone()),
                Event::Logprob { slot, lp } => {
                    let req = self.by_slot[*slot].and_then(|rid| self.requests.get_mut(&rid));
                    if let Some(r) = req {
                        r.pending_tail = Some(tail_of(lp));
                    }
                }
            }
        }
    }

    /// A request ended: its last held bytes, its saved conversation, then DONE with the
    /// telemetry block (or ERROR for a cancelled or failed one).
    fn finished(&mut self, slot: usize, outcome: TurnOutcome) {
        let Some(id) = self.by_slot[slot].take() else {
            return;
        };
        let Some(mut r) = self.requests.remove(&id) else {
            return;
        };
        self.last_generated[slot] = r.emitted as u64;
        let rest = r.answer.finish();
        if !rest.is_empty() && !matches!(outcome.finish, Finish::Cancelled) {
            self.send(&MuxReply::Data { id, bytes: rest });
        }
        let failed = matches!(outcome.finish, Finish::Failed(_));
        if let (Some(sent), false) = (r.answer.tokens_sent(), failed) {
            keep_sent(&mut self.engine, slot, r.answer_start, sent);
        }
        // Saved before DONE goes out: once a client has it, the request is durable, or a
        // KVSAVE line on the telemetry channel has said it is not.
        if let Err(e) = self.engine.save(slot) {
            self.telemetry.send(&Telemetry::KvSave(KvSave {
                slot: slot as u32,
                reason: e.to_string(),
            }));
        }
        match &outcome.finish {
            Finish::Cancelled => {
                self.error(id, ErrorCode::Cancelled);
                self.emit_sessions();
                return;
            }
            Finish::Failed(why) => {
                crate::elog!("[API] request {id} (slot {slot}) failed: {why}; its conversation is as before it");
                self.error(id, ErrorCode::EngineError);
                self.emit_sessions();
                return;
            }
            _ => {}
        }
        // The telemetry block of mux_done: HWINFO, (usage saved), TIERS, EMAP, HITS, PROF.
        self.both(Telemetry::HwInfo(crate::telemetry::hwinfo()));
        let end = self.engine.turn_end(0);
        let wall = r.accepted_at.elapsed().as_secs_f64();
        for t in report::turn_block(
            &self.engine,
            &r.accepted,
            wall,
            r.prompt_tokens as u32,
            r.emitted as u32,
        ) {
            match t {
                // DISK-CLASS and SPEC are ours: the telemetry fd only.
                Telemetry::DiskClass(_) | Telemetry::Spec(_) => self.telemetry.send(&t),
                t => self.both(t),
            }
        }
        for swap in end.swaps {
            self.telemetry.send(&Telemetry::Repin(swap));
        }
        let now = self.engine.tiers().counters();
        // Cache-aware routing's suffix: the decode's agreement (none decoded: zero slots).
        let (decode_s, hit_pct, route) = match &r.decode_base {
            Some((t, c)) => (
                t.elapsed().as_secs_f64(),
                now.hit_pct_since(c),
                now.route_since(c),
            ),
            None => (0.0, 0.0, now.route_since(&now)),
        };
        let stopped = r.answer.stopped();
        let stat = Stat {
            route,
            prefetch: self.engine.tiers().prefetch_bytes(),
            completion_tokens: r.emitted as u32,
            tok_per_s: crate::telemetry::per_second(r.emitted as f64, decode_s),
            hit_pct,
            rss_gb: rss_gb(),
            // A stop string that completed on the budget's last token ended the answer, not
            // the budget.
            prompt: Some((
                r.prompt_tokens as u32,
                r.emitted >= r.max_tokens && !stopped,
            )),
        };
        if r.constrained {
            // An answer cut before its sentence was complete does not parse; DONE is
            // upstream's and cannot say so, this line does (as `run` exits 3).
            self.telemetry.send(&Telemetry::Grammar(GrammarEnd {
                id,
                complete: outcome.grammar_accepting && !stopped,
            }));
        }
        self.send(&MuxReply::Done { id, stat });
        self.emit_sessions();
    }

    /// SESSIONS telemetry: every slot with a request or a conversation (at most 64 lines'
    /// worth: the busy ones first).
    fn emit_sessions(&mut self) {
        if !self.telemetry.enabled() {
            return;
        }
        const MAX_LISTED: usize = 64;
        let mut list: Vec<SessionInfo> = self
            .engine
            .sessions()
            .iter()
            .enumerate()
            .filter_map(|(slot, s)| {
                let id = self.by_slot[slot].unwrap_or(0);
                if id == 0 && s.held() == 0 {
                    return None;
                }
                Some(SessionInfo {
                    slot: slot as u32,
                    state: match s.phase() {
                        Phase::Idle => SessionState::Idle,
                        Phase::Prefill => SessionState::Prefill,
                        Phase::Decode => SessionState::Decode,
                    },
                    id,
                    ctx_tokens: s.held() as u64,
                    generated: self
                        .requests
                        .get(&id)
                        .map_or(self.last_generated[slot], |r| r.emitted as u64),
                })
            })
            .collect();
        list.sort_by_key(|i| (i.id == 0, i.slot));
        list.truncate(MAX_LISTED);
        self.telemetry.send(&Telemetry::Sessions(list));
    }
}

/// An `ids=1` payload: ASCII decimal token ids separated by whitespace or commas.
fn parse_ids(payload: &[u8], vocab: usize) -> Result<Vec<u32>, String> {
    let text = std::str::from_utf8(payload).map_err(|_| "is not ASCII".to_string())?;
    text.split(|c: char| c.is_ascii_whitespace() || c == ',')
        .filter(|w| !w.is_empty())
        .map(|w| match w.parse::<u32>() {
            Ok(t) if (t as usize) < vocab => Ok(t),
            _ => Err(format!("has {w:?}, not a token id in 0..{vocab}")),
        })
        .collect()
}
