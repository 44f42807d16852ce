//! `colibri run`: one completion for scripts and pipes. The answer's raw bytes go to stdout
//! exactly as `serve` streams them; one summary line goes to stderr (`-v`: the profile too).
//!
//! Exit codes: 0 done, 1 runtime failure, 2 usage or configuration (a prompt that does not fit
//! `--ctx` is refused before anything is computed), 3 an answer constrained by `--grammar` or
//! `--json-schema` that ended before its sentence was complete (a pipe into `jq` would fail).

use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cli::{option_name, RunArgs};
use crate::engine::{Engine, Event, Finish, TurnSpec, PREFILL_CHUNK};
use crate::error::EngineError;
use crate::grammar::Grammar;
use crate::sampling::{Rng, Sampler, StopStrings};

/// The exit code of an answer cut short under a grammar or JSON schema.
pub const EXIT_INCOMPLETE: u8 = 3;

/// How often plain `[prefill]` lines are written when stderr is not a terminal.
const PREFILL_LINE_EVERY: Duration = Duration::from_secs(2);

pub fn run(args: RunArgs) -> Result<ExitCode, EngineError> {
    let text = prompt_text(&args)?;
    // A bad grammar or state folder is refused before the model loads.
    let grammar = load_grammar(&args)?;
    if let Some(dir) = &args.state_dir {
        if dir.exists() && !dir.is_dir() {
            return Err(EngineError::Usage(format!(
                "{} {}: not a directory (a file of that name is in the way)",
                option_name("--state-dir", "COLI_STATE_DIR"),
                dir.display()
            )));
        }
    }
    let dirs = args.model.dirs()?;
    let state_dir = crate::engine::state::resolve(&dirs[0], args.state_dir.as_deref())?;
    // `run` saves only the usage history; beside a daemon on the same folder it writes nothing.
    let state_lock = crate::engine::state::lock_state(&state_dir, false)?;
    let mut load = args.model.load_options()?;
    if state_lock.is_none() {
        load.tiers.usage_save = false;
    }
    let facts = crate::engine::facts::ModelFacts::gather(&dirs, &load, Some(&state_dir))?;
    crate::elog!("{}", facts.stderr_line());
    let mut engine = Engine::open(dirs, load)?;
    // The family's chat template, known once the model is.
    // `--raw`: the client owns every byte, special tokens included; a chat turn's text and
    // system prompt are content, whose special tokens are read as text.
    let ids = if args.raw {
        engine.tokenizer().encode(&text)?
    } else {
        let turn = engine.chat_turn(
            args.sampling.system.as_deref(),
            text.trim_end_matches('\n'),
            true,
            args.think,
        )?;
        engine.tokenizer().encode_chat(&turn)?
    };
    if ids.is_empty() {
        return Err(EngineError::Usage("the prompt is empty".into()));
    }
    let max_new = args.max_tokens as usize;
    let prompt_tokens = ids.len();
    let need = check_context(&args, engine.max_positions(), prompt_tokens)?;
    // The tiers start once the prompt is tokenized, so the RAM clamp counts its real context.
    engine.start_sessions(1, need + 1, Some(&state_dir), false, None)?;
    let rng = args
        .sampling
        .seed
        .map(Rng::new)
        .unwrap_or_else(Rng::from_entropy);
    let sampler = Sampler::new(args.sampling.temperature()?, args.sampling.top_p, rng)
        .with_params(args.sampling.params());
    let constrained = grammar.is_some();
    let mut spec = TurnSpec::new(ids, max_new, sampler);
    if let Some(g) = grammar {
        spec = spec.with_grammar(g);
    }
    engine.begin(0, spec)?;
    let snap0 = engine.tiers().snapshot();
    let spec0 = engine.spec().figures();
    let out = std::io::stdout();
    let mut write_err = None;
    let mut stops = StopStrings::new(&args.sampling.stop);
    let mut progress = PrefillProgress::new(prompt_tokens);
    let emit = |bytes: &[u8], write_err: &mut Option<EngineError>| -> bool {
        if bytes.is_empty() {
            return true;
        }
        let mut lock = out.lock();
        match lock.write_all(bytes).and_then(|_| lock.flush()) {
            Ok(()) => true,
            // A closed pipe ends the generation quietly (`colibri run | head -c 10`).
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => false,
            Err(e) => {
                *write_err = Some(EngineError::io("writing to stdout", e));
                false
            }
        }
    };
    // Each token's bytes to stdout as it comes (held back only while they may begin a stop
    // string).
    let stats = engine.finish_turn(0, |engine, e, _| match *e {
        Event::Prefill { done, total, .. } => {
            progress.update(done, total);
            true
        }
        Event::Token { id, .. } => {
            progress.finish();
            let ready = stops.push(engine.tokenizer().token_bytes(id));
            emit(&ready, &mut write_err) && !stops.hit()
        }
        _ => true,
    })?;
    progress.finish();
    if !stops.hit() {
        let rest = stops.flush();
        emit(&rest, &mut write_err);
    }
    if let Some(e) = write_err {
        return Err(e);
    }
    if let Finish::Failed(why) = &stats.finish {
        return Err(EngineError::Load(why.clone()));
    }
    let experts = &engine.tiers();
    let d = experts.snapshot().since(&snap0);
    let (hit_pct, pin_pct, lru_pct) = d.hit_pcts();
    engine.save_usage();
    if out.is_terminal() {
        // Only for a person at a terminal: a pipe gets exactly the answer's bytes.
        let _ = out.lock().write_all(b"\n");
    }
    let spec = engine.spec().figures().since(&spec0);
    let why = if stops.hit() {
        " | stopped at --stop"
    } else if stats.length_limited() {
        if stats.completion_tokens < max_new {
            " | stopped at --ctx"
        } else {
            " | stopped at --max-tokens"
        }
    } else {
        ""
    };
    crate::elog!(
        "[run] {} prompt + {} completion tokens | prefill {:.2}s ({:.1} tok/s) | decode {:.2} tok/s | expert hit {:.1}% (pin {:.1}% + lru {:.1}%) | load {:.2}s{}{}",
        prompt_tokens,
        stats.completion_tokens,
        stats.prefill_s,
        prompt_tokens as f64 / stats.prefill_s.max(1e-9),
        stats.decode_tok_s(),
        hit_pct,
        pin_pct,
        lru_pct,
        engine.load_s(),
        if engine.spec().max_draft > 0 {
            format!(" | {:.2} tokens/forward", spec.tokens_per_forward())
        } else {
            String::new()
        },
        why
    );
    if stats.grammar_masks > 0 {
        crate::elog!(
            "[grammar] {} masks, {:.1} us per token ({:.3}s in all) | forced-span drafts {} accepted {}{}",
            stats.grammar_masks,
            stats.grammar_mask_s * 1e6 / stats.grammar_masks as f64,
            stats.grammar_mask_s,
            engine.spec().forced_proposed,
            engine.spec().forced_accepted,
            if stats.finish == Finish::Grammar {
                " | sentence complete"
            } else {
                ""
            }
        );
    }
    if args.verbose {
        crate::elog!(
            "[run] {:.2} tokens/forward | draft {} | acceptance {} | cost of a verify position {:.2}, of an MTP draft {:.2} (x a decode row)",
            spec.tokens_per_forward(),
            engine.spec().max_draft,
            spec.acceptance_line(),
            engine.spec().extra_cost(),
            engine.spec().mtp_cost()
        );
        for line in experts.report_lines(
            &d,
            prompt_tokens + stats.completion_tokens,
            stats.prefill_s + stats.decode_s,
        ) {
            crate::elog!("{line}");
        }
    }
    if constrained && (stops.hit() || !stats.grammar_accepting) {
        let what = if args.json_schema.is_some() {
            "--json-schema"
        } else {
            "--grammar"
        };
        let cause = match why {
            "" => "the answer ended",
            w => w.trim_start_matches(" | "),
        };
        crate::elog!(
            "[run] incomplete: {cause} before the {what} sentence was complete; the output does not match it (exit {EXIT_INCOMPLETE})"
        );
        return Ok(ExitCode::from(EXIT_INCOMPLETE));
    }
    Ok(ExitCode::SUCCESS)
}

/// The prompt: the positional argument, `--prompt`, or all of stdin (with a hint when stdin
/// is a terminal, where a bare `colibri run` would otherwise wait without a word).
fn prompt_text(args: &RunArgs) -> Result<String, EngineError> {
    if let Some(p) = args.positional.as_ref().or(args.prompt.as_ref()) {
        return Ok(p.clone());
    }
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        crate::elog!("[run] reading the prompt from the terminal: type it, then Ctrl-D (or: colibri run \"your question\")");
    }
    let mut s = String::new();
    stdin
        .lock()
        .read_to_string(&mut s)
        .map_err(|e| EngineError::io("reading the prompt from stdin", e))?;
    Ok(s)
}

/// The positions the request needs (prompt plus `--max-tokens`), refused with the sizes when
/// they exceed `--ctx` or `--ctx` exceeds the model's positions.
fn check_context(
    args: &RunArgs,
    model_max: usize,
    prompt_tokens: usize,
) -> Result<usize, EngineError> {
    let ctx_name = option_name("--ctx", "CTX");
    let ctx = match args.ctx {
        Some(c) if c as usize > model_max => {
            return Err(EngineError::Usage(format!(
                "{ctx_name} {c} is more than the model's {model_max} positions (max_position_embeddings); the allowed range is 16..={model_max}"
            )))
        }
        Some(c) => c as usize,
        None => model_max,
    };
    let max_new = args.max_tokens as usize;
    let need = prompt_tokens + max_new;
    if need > ctx {
        let room = ctx.saturating_sub(prompt_tokens);
        let advice = if prompt_tokens >= ctx {
            "shorten the prompt".to_string()
        } else if ctx < model_max {
            format!("lower --max-tokens to {room}, raise {ctx_name} (up to {model_max}) or shorten the prompt")
        } else {
            format!("lower --max-tokens to {room} or shorten the prompt")
        };
        return Err(EngineError::Usage(format!(
            "the prompt is {prompt_tokens} tokens and --max-tokens is {max_new}: {need} positions do not fit {ctx_name} {ctx} (the model's maximum: {model_max}); nothing was computed; {advice}"
        )));
    }
    Ok(need)
}

/// Prefill progress on stderr: a bar on a terminal, throttled `[prefill] done/total` lines
/// otherwise; nothing for a prompt that fits one chunk.
struct PrefillProgress {
    bar: Option<ProgressBar>,
    plain: bool,
    last_line: Option<Instant>,
    done: bool,
}

impl PrefillProgress {
    fn new(total: usize) -> PrefillProgress {
        let shown = total > PREFILL_CHUNK;
        let bar = (shown && std::io::stderr().is_terminal()).then(|| {
            let bar =
                ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "[prefill] {bar:40} {pos}/{len} tokens {per_sec} ETA {eta}",
                )
                .expect("the template is valid"),
            );
            bar
        });
        PrefillProgress {
            plain: shown && bar.is_none(),
            bar,
            last_line: None,
            done: false,
        }
    }

    fn update(&mut self, done: usize, total: usize) {
        if let Some(bar) = &self.bar {
            bar.set_position(done as u64);
        } else if self.plain {
            let due = self
                .last_line
                .is_none_or(|t| t.elapsed() >= PREFILL_LINE_EVERY);
            if due || done == total {
                crate::elog!("[prefill] {done}/{total} tokens");
                self.last_line = Some(Instant::now());
            }
        }
    }

    fn finish(&mut self) {
        if !std::mem::replace(&mut self.done, true) {
            if let Some(bar) = &self.bar {
                bar.finish_and_clear();
            }
        }
    }
}

/// `--grammar` / `--json-schema`, compiled; an unreadable file or an invalid one is a usage
/// error naming the option, the file and the position.
fn load_grammar(args: &RunArgs) -> Result<Option<Arc<Grammar>>, EngineError> {
    let (path, json, opt) = match (&args.grammar, &args.json_schema) {
        (Some(p), _) => (p, false, "--grammar"),
        (None, Some(p)) => (p, true, "--json-schema"),
        (None, None) => return Ok(None),
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        EngineError::Usage(format!("{opt} {}: cannot read it: {e}", path.display()))
    })?;
    let g = if json {
        Grammar::from_json_schema(&text)
    } else {
        Grammar::from_gbnf(&text)
    };
    g.map(|g| Some(Arc::new(g))).map_err(|e| {
        let hint = if !json
            && (text.trim_start().starts_with('{') || path.extension().is_some_and(|x| x == "json"))
        {
            "; this looks like a JSON Schema: pass it with --json-schema"
        } else {
            ""
        };
        EngineError::Usage(format!("{opt} {}: {e}{hint}", path.display()))
    })
}
