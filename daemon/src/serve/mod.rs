//! `colibri serve`: upstream's single-conversation line protocol on stdin/stdout, with
//! `--kv-slots` conversations that persist to disk (CONTRACT.md §3-4).
//!
//! One request at a time: decode it (`protocol`), turn it into tokens for a slot, reuse the
//! slot's cached prefix, generate into a `StreamSink` that writes stdout, close the turn with
//! END + STAT, and append the new positions to the slot's `.coli_kv`.

mod signal;
mod sink;
mod state;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use protocol::{
    check_slot, decode_request, decode_request_eof, DecodeError, EngineState, Progress,
    ProgressPhase, Reply, Request, Stat, Telemetry, Tiers,
};

use crate::cli::ServeArgs;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::experts::{usage_path, TierStart};
use crate::generate::{generate, GenStats};
use crate::kv_file::{KvFile, KvShape};
use crate::model::profile::Stage;
use crate::model::KvCache;
use crate::sampling::{Rng, Sampler};
use crate::telemetry::{rss_gb, TelemetryOut};

pub use sink::incomplete_utf8_tail;

/// One conversation: its cache (whose `tokens` are the fed history), the token sampled last
/// and not fed yet (a turn cut by the token limit), and its file.
struct Slot {
    kv: KvCache,
    pending: Option<u32>,
    file: Option<KvFile>,
}

/// How the last turn was asked, for `\x02MORE`.
#[derive(Clone, Copy)]
struct LastTurn {
    slot: usize,
    temperature: f32,
    top_p: f32,
}

struct Server<W: Write> {
    engine: Engine,
    args: ServeArgs,
    slots: Vec<Slot>,
    out: W,
    telemetry: TelemetryOut,
    rng: Rng,
    last: Option<LastTurn>,
    /// stdout went away: finish the turn and exit.
    closed: bool,
}

/// What a turn streams and how its END/STAT look.
struct TurnSpec {
    slot: usize,
    /// Tokens to feed after the slot's kept prefix.
    feed: Vec<u32>,
    max_new: usize,
    temperature: f32,
    top_p: f32,
    /// Plain-line chat and MORE put `\n` before END; PROMPT does not.
    newline_before_end: bool,
    /// 6-field STAT (chat, PROMPT) or 4-field (MORE).
    stat6: bool,
    prompt_tokens: usize,
}

pub fn run(args: ServeArgs) -> Result<ExitCode, EngineError> {
    args.model.init_threads();
    signal::install();
    let mut telemetry = match args.telemetry_fd {
        Some(fd) => TelemetryOut::from_fd(fd).map_err(EngineError::Usage)?,
        None => TelemetryOut::default(),
    };
    telemetry.send(&Telemetry::State(EngineState::Loading));
    let dirs = args.model.dirs()?;
    let engine = Engine::open(dirs, args.model.load_options()?)?;
    let model = &engine.model;
    let state_dir = state::resolve(&engine.dirs[0], args.state_dir.as_deref())?;
    let shape = KvShape::of(&model.new_cache(), model.cfg.vocab_size);
    eprintln!(
        "[KV] context slots: {} x {} tokens, {:.1} kB per token, projected pool {:.2} GB",
        args.kv_slots,
        args.ctx,
        model.new_cache().bytes_per_position() as f64 / 1e3,
        (args.kv_slots as usize * args.ctx as usize * model.new_cache().bytes_per_position())
            as f64
            / 1e9
    );
    {
        // Usage history, pinned experts (PROGRESS pin lines) and the RAM clamp of the LRU.
        let mut progress = |done, total| {
            telemetry.send(&Telemetry::Progress(Progress {
                phase: ProgressPhase::Pin,
                done,
                total,
            }))
        };
        let mut start = TierStart::for_model(
            model,
            args.kv_slots as usize,
            args.ctx as usize,
            Some(usage_path(&state_dir)),
        );
        start.progress = Some(&mut progress);
        model.experts.start(start)?;
    }
    let mut slots = Vec::new();
    for i in 0..args.kv_slots as usize {
        let mut kv = model.new_cache();
        let file = if args.kv_save {
            let path = state_dir.join(state::kv_file_name(i));
            match KvFile::open(&path, shape) {
                Ok(mut f) => {
                    let t0 = Instant::now();
                    match f.load(&mut kv, args.ctx as usize) {
                        Ok(0) => {}
                        Ok(n) => eprintln!(
                            "[KV] slot {i}: resumed conversation from disk: {n} tokens in {:.3}s (no re-prefill)",
                            t0.elapsed().as_secs_f64()
                        ),
                        Err(e) => eprintln!("[KV] slot {i}: ignoring saved conversation: {e}; starting over"),
                    }
                    Some(f)
                }
                Err(e) => {
                    eprintln!(
                        "[KV] slot {i}: cannot open {} ({e}): this slot is not saved",
                        path.display()
                    );
                    None
                }
            }
        } else {
            None
        };
        slots.push(Slot {
            kv,
            pending: None,
            file,
        });
    }
    let rng = args
        .sampling
        .seed
        .map(Rng::new)
        .unwrap_or_else(Rng::from_entropy);
    let mut server = Server {
        engine,
        args,
        slots,
        out: std::io::stdout(),
        telemetry,
        rng,
        last: None,
        closed: false,
    };
    server.ready()?;
    server.serve_stdin()?;
    server.shutdown();
    Ok(ExitCode::SUCCESS)
}

impl<W: Write> Server<W> {
    fn send(&mut self, r: &Reply) {
        if r.write_to(&mut self.out)
            .and_then(|_| self.out.flush())
            .is_err()
        {
            self.closed = true;
        }
    }

    fn tiers(&self) -> Tiers {
        let model = &self.engine.model;
        let total = (model.cfg.n_sparse_layers() * model.cfg.n_routed_experts) as u32;
        let (resident, bytes) = model.experts.resident();
        Tiers {
            vram_experts: 0,
            ram_experts: resident as u32,
            disk_experts: total.saturating_sub(resident as u32),
            vram_gb: 0.0,
            ram_gb: bytes as f64 / 1e9,
        }
    }

    fn ready(&mut self) -> Result<(), EngineError> {
        self.send(&Reply::Ready);
        self.send(&Reply::Stat(Stat::zero(rss_gb())));
        let tiers = Telemetry::Tiers(self.tiers());
        self.send(&Reply::Telemetry(tiers.clone()));
        self.telemetry.send(&tiers);
        self.telemetry.send(&Telemetry::State(EngineState::Idle));
        Ok(())
    }

    /// Reads requests until EOF (or stdout closes).
    fn serve_stdin(&mut self) -> Result<(), EngineError> {
        let mut stdin = std::io::stdin().lock();
        let mut buf: Vec<u8> = Vec::new();
        let mut chunk = vec![0u8; 64 * 1024];
        let mut eof = false;
        while !self.closed {
            let decoded = if eof {
                decode_request_eof(&buf)
            } else {
                decode_request(&buf)
            };
            match decoded {
                Ok((req, used)) => {
                    buf.drain(..used);
                    self.handle(req)?;
                }
                Err(DecodeError::Incomplete) if !eof => {
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
                    eprintln!("[serve] {e}: closing the session");
                    break;
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
                    eprintln!("[API] rejected PROMPT: {reason}");
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
                    Err(reason) => eprintln!("[API] rejected RESET: {reason}"),
                }
                self.zero_reply(false);
                Ok(())
            }
            Request::Rejected(r) => {
                eprintln!(
                    "[API] rejected {}: {}",
                    String::from_utf8_lossy(&r.line),
                    r.reason
                );
                self.zero_reply(true);
                Ok(())
            }
            Request::Unknown(name) => {
                eprintln!("[API] unknown command \\x02{name}");
                self.zero_reply(false);
                Ok(())
            }
        }
    }

    fn reset(&mut self, slot: usize) {
        let s = &mut self.slots[slot];
        s.kv.clear();
        s.pending = None;
        if let Some(f) = &mut s.file {
            if let Err(e) = f.clear() {
                eprintln!(
                    "[KV] slot {slot}: clearing {} failed: {e}",
                    f.path().display()
                );
            }
        }
        if self.last.is_some_and(|l| l.slot == slot) {
            self.last = None;
        }
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        Ok(self.engine.tokenizer.encode(text)?)
    }

    /// A plain line: one user turn of slot 0's conversation, in the GLM chat template.
    fn chat(&mut self, line: &[u8]) -> Result<(), EngineError> {
        if line.is_empty() {
            self.zero_reply(false);
            return Ok(());
        }
        let text = String::from_utf8_lossy(line);
        let ngen = self.args.ngen as usize;
        let ctx = self.args.ctx as usize;
        let templated = |first: bool| {
            if self.args.chat_template {
                Engine::chat_prompt(&text, first, self.args.think)
            } else {
                text.to_string()
            }
        };
        let slot = &self.slots[0];
        let mut feed: Vec<u32> = slot.pending.into_iter().collect();
        feed.extend(self.encode(&templated(slot.kv.is_empty()))?);
        if slot.kv.len() + feed.len() + ngen + 8 >= ctx {
            let fresh = self.encode(&templated(true))?;
            if fresh.len() + 8 >= ctx {
                eprintln!(
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
            eprintln!(
                "[KV] the conversation ({} tokens) would overflow the context of {ctx}: starting a new one with this turn",
                slot.kv.len()
            );
            self.reset(0);
            feed = fresh;
        }
        let prompt_tokens = feed.len();
        let max_new = ngen.min(ctx - self.slots[0].kv.len() - feed.len() - 1);
        let (temperature, top_p) = (self.args.sampling.temperature, self.args.sampling.top_p);
        self.turn(TurnSpec {
            slot: 0,
            feed,
            max_new,
            temperature,
            top_p,
            newline_before_end: true,
            stat6: true,
            prompt_tokens,
        })
    }

    /// `\x02PROMPT`: the prompt as given, reusing the slot's longest common token prefix.
    fn prompt(
        &mut self,
        slot: usize,
        text: &str,
        max_tokens: usize,
        temperature: f32,
        top_p: f32,
    ) -> Result<(), EngineError> {
        let ids = self.encode(text)?;
        let ctx = self.args.ctx as usize;
        if ids.is_empty() {
            eprintln!("[API] refused: the prompt is empty after tokenization");
            self.zero_reply(true);
            return Ok(());
        }
        if ids.len() + 2 > ctx {
            eprintln!(
                "[API] refused: the prompt is {} tokens, the context holds {} (--ctx {ctx}); nothing was truncated",
                ids.len(),
                ctx - 2
            );
            self.zero_reply(true);
            return Ok(());
        }
        let s = &mut self.slots[slot];
        s.pending = None;
        let common =
            s.kv.tokens
                .iter()
                .zip(&ids)
                .take_while(|(a, b)| a == b)
                .count();
        // The whole prompt cached: re-run its last token to get logits again.
        let keep = if common == ids.len() {
            common - 1
        } else {
            common
        };
        eprintln!(
            "[API] KV slot {slot} prefix {keep}/{} token, prefill {}",
            ids.len(),
            ids.len() - keep
        );
        s.kv.truncate(keep);
        if let Some(f) = &mut s.file {
            if let Err(e) = f.truncate(keep) {
                eprintln!(
                    "[KV] slot {slot}: truncating {} failed: {e}",
                    f.path().display()
                );
            }
        }
        let max_new = max_tokens
            .min(self.args.ngen as usize)
            .min(ctx - ids.len() - 1);
        self.turn(TurnSpec {
            slot,
            feed: ids[keep..].to_vec(),
            max_new,
            temperature,
            top_p,
            newline_before_end: false,
            stat6: true,
            prompt_tokens: ids.len(),
        })
    }

    /// `\x02MORE`: continue the last answer by up to NGEN tokens.
    fn more(&mut self) -> Result<(), EngineError> {
        let Some(last) = self.last else {
            self.zero_reply(false);
            return Ok(());
        };
        let ctx = self.args.ctx as usize;
        let s = &mut self.slots[last.slot];
        let feed = match s.pending.take() {
            Some(t) => vec![t],
            None => match s.kv.tokens.last().copied() {
                // The answer ended on a stop token: re-run the last fed token for its logits.
                Some(t) => {
                    let n = s.kv.len() - 1;
                    s.kv.truncate(n);
                    vec![t]
                }
                None => {
                    self.zero_reply(false);
                    return Ok(());
                }
            },
        };
        let room = ctx.saturating_sub(s.kv.len() + feed.len() + 1);
        if room == 0 {
            eprintln!("[API] MORE: the context of {ctx} is full; send \\x02RESET or a new prompt");
            self.zero_reply(false);
            return Ok(());
        }
        let max_new = (self.args.ngen as usize).min(room);
        self.turn(TurnSpec {
            slot: last.slot,
            feed,
            max_new,
            temperature: last.temperature,
            top_p: last.top_p,
            newline_before_end: true,
            stat6: false,
            prompt_tokens: 0,
        })
    }

    fn turn(&mut self, spec: TurnSpec) -> Result<(), EngineError> {
        let Server {
            engine,
            slots,
            out,
            telemetry,
            rng,
            ..
        } = self;
        let slot = &mut slots[spec.slot];
        let model = &engine.model;
        telemetry.send(&Telemetry::State(EngineState::Prefill));
        telemetry.send(&Telemetry::Progress(Progress {
            phase: ProgressPhase::Prefill,
            done: 0,
            total: spec.feed.len() as u64,
        }));
        let mut sampler = Sampler::new(spec.temperature, spec.top_p, rng.clone());
        let before = model.experts.counters();
        let snap0 = model.experts.snapshot();
        let stages0 = model.profile.snapshot();
        let mut sink =
            sink::StreamSink::new(out, &engine.tokenizer, model, telemetry, spec.slot as u32);
        let t0 = Instant::now();
        let result = generate(
            model,
            &mut slot.kv,
            &spec.feed,
            spec.max_new,
            &engine.stops,
            &mut sampler,
            &mut sink,
        );
        sink.finish();
        let broken = sink.broken;
        let emitted = std::mem::take(&mut sink.tokens);
        drop(sink);
        // Advance the shared RNG so the next turn does not replay this one's draws.
        *rng = sampler.rng.clone();
        let stats = match result {
            Ok(s) => s,
            Err(e) => {
                // The cache rolled back to its last consistent state; the turn ends cleanly.
                eprintln!("[serve] turn failed: {e}");
                GenStats {
                    prompt_tokens: spec.prompt_tokens,
                    ..Default::default()
                }
            }
        };
        // The last emitted token was not fed back: it opens the next turn or MORE.
        slot.pending = stats.unfed;
        let after = model.experts.counters();
        let wall = t0.elapsed().as_secs_f64();
        let stat = Stat {
            completion_tokens: emitted.len() as u32,
            tok_per_s: crate::telemetry::per_second(emitted.len() as f64, wall),
            hit_pct: after.hit_pct_since(&before),
            rss_gb: rss_gb(),
            prompt: spec
                .stat6
                .then_some((spec.prompt_tokens as u32, stats.length_limited)),
        };
        self.closed |= broken;
        // Saved before END/STAT go out: once a client has the STAT, the turn is durable.
        self.save_slot(spec.slot);
        self.send(&Reply::End {
            leading_newline: spec.newline_before_end,
        });
        self.send(&Reply::Stat(stat));
        self.last = Some(LastTurn {
            slot: spec.slot,
            temperature: spec.temperature,
            top_p: spec.top_p,
        });
        // Turn end: .coli_usage saved, then the tier telemetry. The sink already ran a safe
        // point (re-pin, RSS guard) after every token, so no tokens are counted again here.
        let experts = &self.engine.model.experts;
        let end = experts.turn_end(0);
        let mut prof = experts.snapshot().since(&snap0).prof(
            wall,
            spec.prompt_tokens as u32,
            emitted.len() as u32,
        );
        let stages = self.engine.model.profile.snapshot();
        prof.attention_s = stages.get(Stage::Attention) - stages0.get(Stage::Attention);
        prof.lm_head_s = stages.get(Stage::LmHead) - stages0.get(Stage::LmHead);
        let mut lines = vec![
            Telemetry::Tiers(self.tiers()),
            Telemetry::Emap(experts.emap()),
            Telemetry::Hits(experts.take_hits()),
            Telemetry::Prof(prof),
            Telemetry::DiskClass(experts.disk_class()),
        ];
        lines.extend(end.swaps.into_iter().map(Telemetry::Repin));
        for t in &lines {
            self.telemetry.send(t);
        }
        self.telemetry.send(&Telemetry::State(EngineState::Idle));
        Ok(())
    }

    fn save_slot(&mut self, slot: usize) {
        let s = &mut self.slots[slot];
        if let Some(f) = &mut s.file {
            if let Err(e) = f.save(&s.kv) {
                eprintln!(
                    "[KV] slot {slot}: saving to {} failed: {e}",
                    f.path().display()
                );
            }
        }
    }

    fn shutdown(&mut self) {
        for i in 0..self.slots.len() {
            self.save_slot(i);
        }
        self.engine.model.experts.save_usage();
    }
}

/// Where the model's state files go (for tests and tools).
pub fn state_dir_for(
    model_dir: &std::path::Path,
    explicit: Option<&std::path::Path>,
) -> Result<PathBuf, EngineError> {
    state::resolve(model_dir, explicit)
}
