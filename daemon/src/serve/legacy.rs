//! Upstream's single-conversation line protocol (CONTRACT.md §3): one request at a time,
//! decoded with `protocol`, turned into tokens for a session, run to its end on the engine,
//! answered with the streamed text, END and STAT.

use std::io::{Read, Write};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use protocol::{
    check_slot, decode_request, decode_request_eof, DecodeError, EngineState, KvSave, Live,
    Progress, ProgressPhase, Reply, Request, Stat, Telemetry,
};

use super::discard::Discard;
use super::signal;
use crate::cli::ServeArgs;
use crate::engine::answer::{keep_sent, AnswerStream};
use crate::engine::report::{self, Baseline};
use crate::engine::{
    AdmitRequest, Engine, Event, Finish, PromptInput, Refusal, TurnSpec, PREFILL_CHUNK,
};
use crate::error::EngineError;
use crate::sampling::{Rng, Sampler};
use crate::telemetry::{rss_gb, TelemetryOut};
use crate::tokenizer::ChatText;

/// How the last turn was asked, for `\x02MORE`.
#[derive(Clone, Copy)]
struct LastTurn {
    slot: usize,
    temperature: f32,
    top_p: f32,
}

struct Legacy<W: Write> {
    engine: Engine,
    args: ServeArgs,
    out: W,
    telemetry: TelemetryOut,
    /// One stream of draws across turns, so a turn never replays the last one's.
    rng: Rng,
    last: Option<LastTurn>,
    /// Plain chat lines' temperature (`--temp`, COLI_TEMP, TEMP).
    temperature: f32,
    /// stdout went away: finish the turn and exit.
    closed: bool,
}

/// What a turn feeds: tokens to start it with, or a request the engine already admitted
/// (that many tokens to prefill).
enum Feed {
    Tokens(Vec<u32>),
    Admitted(usize),
}

/// What a turn feeds and how its END/STAT look.
struct TurnPlan {
    slot: usize,
    /// Tokens to feed after the slot's kept prefix.
    feed: Feed,
    max_new: usize,
    temperature: f32,
    top_p: f32,
    /// Plain-line chat and MORE put `\n` before END; PROMPT does not.
    newline_before_end: bool,
    /// 6-field STAT (chat, PROMPT) or 4-field (MORE).
    stat6: bool,
    prompt_tokens: usize,
}

pub fn serve(
    engine: Engine,
    args: ServeArgs,
    telemetry: TelemetryOut,
) -> Result<ExitCode, EngineError> {
    let rng = args
        .sampling
        .seed
        .map(Rng::new)
        .unwrap_or_else(Rng::from_entropy);
    let temperature = args.sampling.temperature()?;
    let mut server = Legacy {
        temperature,
        engine,
        args,
        out: std::io::stdout(),
        telemetry,
        rng,
        last: None,
        closed: false,
    };
    signal::install_sigterm();
    server.ready();
    server.serve_stdin()?;
    server.engine.save_all();
    if signal::terminated() {
        crate::elog!(
            "[serve] SIGTERM/SIGHUP: the turn in progress was finished and saved; exiting"
        );
    } else if server.closed {
        // Writes to a closed pipe fail with EPIPE (Rust ignores SIGPIPE): said, not silent.
        crate::elog!("[serve] stdout was closed (the client went away): the turn in progress was ended and saved; exiting");
    }
    Ok(ExitCode::SUCCESS)
}

impl<W: Write> Legacy<W> {
    fn send(&mut self, r: &Reply) {
        if r.write_to(&mut self.out)
            .and_then(|_| self.out.flush())
            .is_err()
        {
            self.closed = true;
        }
    }

    fn ready(&mut self) {
        self.send(&Reply::Ready);
        self.send(&Reply::Stat(Stat::zero(rss_gb())));
        let tiers = Telemetry::Tiers(report::tiers(&self.engine));
        self.send(&Reply::Telemetry(tiers.clone()));
        // The machine and the map from the start, on the fd only (stdout is upstream's), so
        // a dashboard has them before the first answer ends.
        self.telemetry
            .send(&Telemetry::HwInfo(crate::telemetry::hwinfo()));
        self.telemetry.send(&tiers);
        self.telemetry
            .send(&Telemetry::Emap(self.engine.tiers().emap()));
        self.telemetry.send(&Telemetry::State(EngineState::Idle));
    }

    /// Reads requests until EOF (or stdout closes).
    fn serve_stdin(&mut self) -> Result<(), EngineError> {
        let mut stdin = std::io::stdin().lock();
        let mut buf: Vec<u8> = Vec::new();
        let mut chunk = vec![0u8; 64 * 1024];
        let mut eof = false;
        let mut discard = Discard::default();
        while !self.closed && !signal::terminated() {
            let decoded = if !discard.apply(&mut buf) {
                Err(DecodeError::Incomplete)
            } else if eof {
                decode_request_eof(&buf)
            } else {
                decode_request(&buf)
            };
            match decoded {
                Ok((req, used)) => {
                    // A count over 16 MiB consumes nothing beyond the header here
                    // (CONTRACT §3), unlike mux, whose oversized bodies are discarded.
                    buf.drain(..used);
                    self.handle(req)?;
                }
                Err(DecodeError::Incomplete) if !eof => {
                    if !signal::wait_readable() {
                        break;
                    }
                    let n = loop {
                        match stdin.read(&mut chunk) {
                            Ok(n) => break n,
                            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                            Err(e) => return Err(EngineError::io("reading stdin", e)),
                        }
                    };
                    if n == 0 {
                        eof = true;
                    } else {
                        buf.extend_from_slice(&chunk[..n]);
                    }
                }
                Err(DecodeError::Incomplete) => break, // EOF with nothing complete left
                Err(e) => {
                    // Dropped through its newline so the next request is read in sync.
                    crate::elog!("[API] refused: {e}; dropping it through its \\n");
                    self.zero_reply(false);
                    discard = Discard::line();
                }
            }
        }
        Ok(())
    }

    fn zero_reply(&mut self, six: bool) {
        self.send(&Reply::End {
            leading_newline: false,
        });
        let rss = rss_gb();
        self.send(&Reply::Stat(if six {
            Stat::zero6(rss)
        } else {
            Stat::zero(rss)
        }));
    }

    fn handle(&mut self, req: Request) -> Result<(), EngineError> {
        signal::clear();
        match req {
            Request::Chat(line) => self.chat(&line),
            Request::Prompt(p) => {
                let slot = p.slot();
                if let Err(reason) = check_slot(slot, self.args.kv_slots) {
                    crate::elog!("[API] rejected PROMPT: {reason}");
                    self.zero_reply(true);
                    return Ok(());
                }
                let text = String::from_utf8_lossy(&p.payload).into_owned();
                self.prompt(
                    slot as usize,
                    &text,
                    p.max_tokens as usize,
                    p.temperature as f32,
                    p.top_p as f32,
                )
            }
            Request::More => self.more(),
            Request::Reset { slot } => {
                let s = slot.unwrap_or(0);
                match check_slot(s, self.args.kv_slots) {
                    Ok(()) => self.reset(s as usize),
                    Err(reason) => crate::elog!("[API] rejected RESET: {reason}"),
                }
                self.zero_reply(false);
                Ok(())
            }
            Request::Rejected(r) => {
                crate::elog!(
                    "[API] rejected {}: {}",
                    String::from_utf8_lossy(&r.line),
                    r.reason
                );
                self.zero_reply(true);
                Ok(())
            }
            Request::Unknown(name) => {
                crate::elog!("[API] unknown command \\x02{name}");
                self.zero_reply(false);
                Ok(())
            }
        }
    }

    fn reset(&mut self, slot: usize) {
        self.engine.reset(slot);
        if self.last.is_some_and(|l| l.slot == slot) {
            self.last = None;
        }
    }

    /// Whether a text of `len` bytes must be refused before encoding it (the engine's rule,
    /// [`Engine::check_encodable`]); says why on stderr.
    fn too_long_to_encode(&self, len: usize, room: usize) -> bool {
        match self.engine.check_encodable(len, room) {
            Ok(()) => false,
            Err(r) => {
                self.refused(&r);
                true
            }
        }
    }

    /// A refused request's reason on stderr, in this protocol's words.
    fn refused(&self, r: &Refusal) {
        let ctx = self.args.ctx;
        match r {
            Refusal::TooManyBytes {
                bytes,
                at_least,
                max_prompt_tokens,
            } => crate::elog!(
                "[API] refused: the prompt is {bytes} bytes, so at least {at_least} tokens, the context holds {max_prompt_tokens} (--ctx {ctx}); not tokenized, nothing was truncated"
            ),
            Refusal::EmptyPrompt => {
                crate::elog!("[API] refused: the prompt is empty after tokenization")
            }
            Refusal::ContextExceeded {
                tokens,
                max_prompt_tokens,
            } => crate::elog!(
                "[API] refused: the prompt is {tokens} tokens, the context holds {max_prompt_tokens} (--ctx {ctx}); nothing was truncated"
            ),
            Refusal::EncodeBudget(why) | Refusal::Tokenizer(why) | Refusal::Engine(why) => {
                crate::elog!("[API] refused: {why}")
            }
            Refusal::NoSuchSlot { .. } | Refusal::SlotBusy { .. } | Refusal::NoFreeSlot => {
                crate::elog!("[API] refused: {r:?}")
            }
        }
    }

    fn encode(&self, chat: &ChatText) -> Result<Vec<u32>, EngineError> {
        Ok(self.engine.tokenizer().encode_chat(chat)?)
    }

    /// A plain line: one user turn of slot 0's conversation, in the model's chat template.
    fn chat(&mut self, line: &[u8]) -> Result<(), EngineError> {
        if line.is_empty() {
            self.zero_reply(false);
            return Ok(());
        }
        let text = String::from_utf8_lossy(line);
        let ngen = self.args.ngen as usize;
        let ctx = self.args.ctx as usize;
        // The turn as the conversation's first and as a later one, rendered up front (the
        // model's chat template, or the line as it is with --chat-template 0). A template that
        // fails to render ends the turn as a refused request does, saying why.
        let render = |first: bool| -> Result<ChatText, EngineError> {
            if self.args.chat_template {
                self.engine.chat_turn(
                    self.args.sampling.system.as_deref(),
                    &text,
                    first,
                    self.args.think,
                )
            } else {
                // No template: the line is the prompt, its special tokens included.
                Ok(ChatText::template(text.to_string()))
            }
        };
        let (as_first, as_later) = match (render(true), render(false)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => {
                crate::elog!("[API] refused: {e}");
                self.send(&Reply::End {
                    leading_newline: true,
                });
                self.send(&Reply::Stat(Stat::zero6(rss_gb())));
                return Ok(());
            }
        };
        if self.too_long_to_encode(as_first.text.len(), ctx.saturating_sub(8)) {
            self.send(&Reply::End {
                leading_newline: true,
            });
            self.send(&Reply::Stat(Stat::zero6(rss_gb())));
            return Ok(());
        }
        let s = self.engine.session(0);
        let held = s.held();
        let mut feed: Vec<u32> = s.pending.into_iter().collect();
        let turn = if s.held() == 0 { &as_first } else { &as_later };
        feed.extend(self.encode(turn)?);
        if held + feed.len() + ngen + 8 >= ctx {
            let fresh = self.encode(&as_first)?;
            if fresh.len() + 8 >= ctx {
                crate::elog!(
                    "[API] refused: the message is {} tokens, the context holds {} (--ctx {ctx})",
                    fresh.len(),
                    ctx.saturating_sub(8)
                );
                self.send(&Reply::End {
                    leading_newline: true,
                });
                self.send(&Reply::Stat(Stat::zero6(rss_gb())));
                return Ok(());
            }
            crate::elog!(
                "[KV] the conversation ({held} tokens) would overflow the context of {ctx}: starting a new one with this turn"
            );
            self.reset(0);
            feed = fresh;
        }
        let prompt_tokens = feed.len();
        let max_new = ngen.min(self.engine.room_left(0) - feed.len() - 1);
        let (temperature, top_p) = (self.temperature, self.args.sampling.top_p);
        self.turn(TurnPlan {
            slot: 0,
            feed: Feed::Tokens(feed),
            max_new,
            temperature,
            top_p,
            newline_before_end: true,
            stat6: true,
            prompt_tokens,
        })
    }

    /// `\x02PROMPT`: the prompt as given, reusing the slot's longest common token prefix (or a
    /// longer one another slot holds); admitted by the engine.
    fn prompt(
        &mut self,
        slot: usize,
        text: &str,
        max_tokens: usize,
        temperature: f32,
        top_p: f32,
    ) -> Result<(), EngineError> {
        let sampler = Sampler::new(temperature, top_p, self.rng.clone())
            .with_params(self.args.sampling.params());
        let admitted = self.engine.admit(AdmitRequest {
            slot: Some(slot),
            prompt: PromptInput::Text(text.as_bytes().to_vec()),
            max_prompt_tokens: (self.args.ctx as usize).saturating_sub(2),
            max_tokens: max_tokens.min(self.args.ngen as usize),
            sampler,
            grammar: None,
            share: self.args.kv_share,
            tenant: crate::engine::Tenant::LOCAL,
            echo: None,
        });
        let a = match admitted {
            Ok(a) => a,
            Err(r) => {
                self.refused(&r);
                self.zero_reply(true);
                return Ok(());
            }
        };
        self.turn(TurnPlan {
            slot,
            feed: Feed::Admitted(a.prompt_tokens - a.cached),
            max_new: a.max_new,
            temperature,
            top_p,
            newline_before_end: false,
            stat6: true,
            prompt_tokens: a.prompt_tokens,
        })
    }

    /// `\x02MORE`: continue the last answer by up to NGEN tokens.
    fn more(&mut self) -> Result<(), EngineError> {
        let Some(last) = self.last else {
            self.zero_reply(false);
            return Ok(());
        };
        let ctx = self.args.ctx as usize;
        let s = self.engine.session(last.slot);
        let feed = match s.pending {
            Some(t) => vec![t],
            None => match s.history().last().copied() {
                // The answer ended on a stop token: re-run the last fed token for its logits.
                Some(t) => {
                    let history = s.history().to_vec();
                    self.engine.truncate(last.slot, history.len() - 1);
                    // A cache with a recurrent state goes back to its latest saved state
                    // at or before the cut (or to empty), and the rest of the history is
                    // fed again (ending with `t`).
                    let kept = self.engine.session(last.slot).held();
                    debug_assert_eq!(history.last(), Some(&t));
                    history[kept..].to_vec()
                }
                None => {
                    self.zero_reply(false);
                    return Ok(());
                }
            },
        };
        let room = self
            .engine
            .room_left(last.slot)
            .saturating_sub(feed.len() + 1);
        if room == 0 {
            crate::elog!(
                "[API] MORE: the context of {ctx} is full; send \\x02RESET or a new prompt"
            );
            self.zero_reply(false);
            return Ok(());
        }
        let max_new = (self.args.ngen as usize).min(room);
        self.turn(TurnPlan {
            slot: last.slot,
            feed: Feed::Tokens(feed),
            max_new,
            temperature: last.temperature,
            top_p: last.top_p,
            newline_before_end: true,
            stat6: false,
            prompt_tokens: 0,
        })
    }

    fn turn(&mut self, plan: TurnPlan) -> Result<(), EngineError> {
        let slot = plan.slot;
        let feed_len = match &plan.feed {
            Feed::Tokens(t) => t.len(),
            Feed::Admitted(n) => *n,
        };
        self.telemetry.send(&Telemetry::State(EngineState::Prefill));
        self.telemetry.send(&Telemetry::Progress(Progress {
            phase: ProgressPhase::Prefill,
            done: 0,
            total: feed_len as u64,
        }));
        let sampler = Sampler::new(plan.temperature, plan.top_p, self.rng.clone())
            .with_params(self.args.sampling.params());
        let before = self.engine.tiers().counters();
        let base = Baseline::now(&self.engine, slot);
        let t0 = Instant::now();
        // Where the answer's tokens start in the slot's conversation (a stop string cuts it
        // back to here plus the tokens sent).
        let answer_start = self.engine.session(slot).held() + feed_len;
        let mut answer = AnswerStream::new(&self.args.sampling.stop);
        if let Feed::Tokens(feed) = plan.feed {
            self.engine
                .begin(slot, TurnSpec::new(feed, plan.max_new, sampler))?;
        }
        let Legacy {
            engine,
            out,
            telemetry,
            closed,
            ..
        } = self;
        let mut emitted = 0u32;
        // The first token sends a LIVE line at once; then one every 250 ms.
        let mut last_live: Option<Instant> = None;
        let write = |out: &mut W, bytes: &[u8], closed: &mut bool| {
            if !bytes.is_empty() && out.write_all(bytes).and_then(|_| out.flush()).is_err() {
                *closed = true;
            }
        };
        let outcome = engine.finish_turn(slot, |engine, event, step| {
            match *event {
                Event::Prefill { done, total, .. } => {
                    if total > PREFILL_CHUNK {
                        crate::elog!("[prefill] {done}/{total} tokens");
                    }
                    telemetry.send(&Telemetry::Progress(Progress {
                        phase: ProgressPhase::Prefill,
                        done: done as u64,
                        total: total as u64,
                    }));
                }
                Event::Token { id, .. } => {
                    if answer.stopped() {
                        // Drafted tokens of the step that completed a stop string: not part
                        // of the answer.
                        return false;
                    }
                    emitted += 1;
                    if emitted == 1 {
                        telemetry.send(&Telemetry::State(EngineState::Generating));
                    }
                    let ready = answer.push(engine.token_bytes(id));
                    write(out, &ready, closed);
                    for swap in &step.swaps {
                        telemetry.send(&Telemetry::Repin(swap.clone()));
                    }
                    if telemetry.enabled()
                        && last_live.is_none_or(|t| t.elapsed() >= Duration::from_millis(250))
                    {
                        last_live = Some(Instant::now());
                        let c = engine.tiers().counters();
                        telemetry.send(&Telemetry::Live(Live {
                            tokens: emitted,
                            tok_per_s: crate::telemetry::per_second(
                                emitted as f64,
                                t0.elapsed().as_secs_f64(),
                            ),
                            hit_pct: c.hit_pct_since(&before),
                            rss_gb: rss_gb(),
                            slot: slot as u32,
                            tokens_per_forward: Some(
                                report::spec_since(engine, &base).tokens_per_forward(),
                            ),
                        }));
                        // The tiers and the map at the same cadence, so the dashboard
                        // moves while the answer streams (the fd only; stdout unchanged).
                        telemetry.send(&Telemetry::Tiers(report::tiers(engine)));
                        telemetry.send(&Telemetry::Emap(engine.tiers().emap()));
                    }
                }
                Event::Done { .. } | Event::Logprob { .. } => {}
            }
            !*closed
                && !answer.stopped()
                && !signal::INTERRUPTED.load(Ordering::Relaxed)
                && !signal::terminated()
        })?;
        write(out, &answer.finish(), closed);
        // Tokens of the answer: after a stop string, up to the one that completed it (a
        // draft accepted past it in the same step is not part of the answer).
        let completion_tokens = if answer.stopped() {
            emitted as usize
        } else {
            outcome.completion_tokens
        };
        if let Finish::Failed(why) = &outcome.finish {
            // The session's cache is back where it was; the turn ends cleanly.
            crate::elog!("[serve] turn failed: {why}");
        } else if let Some(sent) = answer.tokens_sent() {
            keep_sent(&mut self.engine, slot, answer_start, sent);
        }
        // Continue the one stream of draws, so the next turn does not replay this one's.
        self.rng = outcome.rng.clone();
        let wall = t0.elapsed().as_secs_f64();
        let after = self.engine.tiers().counters();
        let failed = matches!(outcome.finish, Finish::Failed(_));
        let stat = if failed {
            // A failed turn reports as a refused request does: the zero STAT.
            Stat {
                completion_tokens: 0,
                tok_per_s: 0.0,
                hit_pct: 0.0,
                rss_gb: rss_gb(),
                prompt: plan.stat6.then_some((0, false)),
                route: None,
                prefetch: None,
            }
        } else {
            Stat {
                completion_tokens: completion_tokens as u32,
                tok_per_s: crate::telemetry::per_second(completion_tokens as f64, wall),
                hit_pct: after.hit_pct_since(&before),
                rss_gb: rss_gb(),
                // `--cache-route`: the turn's agreement with exact routing (upstream's suffix).
                route: after.route_since(&before),
                // `--pilot`: what its reads ahead became, bytes since the start (our suffix).
                prefetch: self.engine.tiers().prefetch_bytes(),
                // An answer a stop string ended is not length-limited, even when the string
                // completed on the last token the budget allowed.
                prompt: plan.stat6.then_some((
                    plan.prompt_tokens as u32,
                    outcome.length_limited() && !answer.stopped(),
                )),
            }
        };
        // Saved before END/STAT go out: once a client has the STAT, the turn is durable, or
        // a KVSAVE line on the telemetry channel has said it is not.
        if let Err(e) = self.engine.save(slot) {
            self.telemetry.send(&Telemetry::KvSave(KvSave {
                slot: slot as u32,
                reason: e.to_string(),
            }));
        }
        self.send(&Reply::End {
            leading_newline: plan.newline_before_end,
        });
        self.send(&Reply::Stat(stat));
        self.last = Some(LastTurn {
            slot,
            temperature: plan.temperature,
            top_p: plan.top_p,
        });
        // Turn end: .coli_usage saved, then the tier telemetry. The engine already ran a safe
        // point (re-pin, RSS guard) after every step, so no tokens are counted again here.
        let end = self.engine.turn_end(0);
        let mut lines = report::turn_block(
            &self.engine,
            &base,
            wall,
            plan.prompt_tokens as u32,
            outcome.completion_tokens as u32,
        );
        lines.extend(end.swaps.into_iter().map(Telemetry::Repin));
        for t in &lines {
            self.telemetry.send(t);
        }
        self.telemetry.send(&Telemetry::State(EngineState::Idle));
        Ok(())
    }
}
