//! `colibri run`: one completion for scripts and pipes. The answer's raw bytes go to stdout
//! exactly as `serve` streams them; the figures go to stderr.

use std::io::{Read, Write};
use std::process::ExitCode;
use std::sync::Arc;

use crate::cli::RunArgs;
use crate::engine::{Engine, Event, Finish, TurnSpec};
use crate::error::EngineError;
use crate::grammar::Grammar;
use crate::sampling::{Rng, Sampler};

pub fn run(args: RunArgs) -> Result<ExitCode, EngineError> {
    let text = match &args.prompt {
        Some(p) => p.clone(),
        None => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .map_err(|e| EngineError::io("reading the prompt from stdin", e))?;
            s
        }
    };
    // A bad grammar is refused before the model loads.
    let grammar = load_grammar(&args)?;
    let dirs = args.model.dirs()?;
    let prompt = if args.raw {
        text
    } else {
        Engine::chat_prompt(text.trim_end_matches('\n'), true, args.think)
    };
    let state_dir = crate::engine::state::resolve(&dirs[0], args.state_dir.as_deref())?;
    // `run` saves only the usage history; beside a daemon on the same folder it writes nothing.
    let state_lock = crate::engine::state::lock_state(&state_dir, false)?;
    let mut load = args.model.load_options()?;
    if state_lock.is_none() {
        load.tiers.usage_save = false;
    }
    let mut engine = Engine::open(dirs, load)?;
    let ids = engine.tokenizer.encode(&prompt)?;
    if ids.is_empty() {
        return Err(EngineError::Usage("the prompt is empty".into()));
    }
    // The tiers start once the prompt is tokenized, so the RAM clamp counts its real context.
    let max_new = args.max_tokens as usize;
    let ctx = ids.len().saturating_add(max_new).saturating_add(1);
    engine.start_sessions(1, ctx, Some(&state_dir), false, None)?;
    let rng = args
        .sampling
        .seed
        .map(Rng::new)
        .unwrap_or_else(Rng::from_entropy);
    let sampler = Sampler::new(args.sampling.temperature()?, args.sampling.top_p, rng);
    let prompt_tokens = ids.len();
    let mut spec = TurnSpec::new(ids, max_new, sampler);
    if let Some(g) = grammar {
        spec = spec.with_grammar(g);
    }
    engine.begin(0, spec)?;
    let snap0 = engine.model.experts.snapshot();
    let spec0 = engine.spec.figures();
    let out = std::io::stdout();
    let mut write_err = None;
    // Each token's bytes to stdout as it comes. A closed pipe ends the generation quietly
    // (`colibri run | head -c 10` is polite).
    let stats = engine.finish_turn(0, |engine, e, _| {
        let Event::Token { id, .. } = e else {
            return true;
        };
        let mut lock = out.lock();
        match lock
            .write_all(engine.tokenizer.token_bytes(*id))
            .and_then(|_| lock.flush())
        {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => false,
            Err(e) => {
                write_err = Some(EngineError::io("writing to stdout", e));
                false
            }
        }
    })?;
    if let Some(e) = write_err {
        return Err(e);
    }
    if let Finish::Failed(why) = &stats.finish {
        return Err(EngineError::Load(why.clone()));
    }
    let experts = &engine.model.experts;
    let d = experts.snapshot().since(&snap0);
    let (hit_pct, pin_pct, lru_pct) = d.hit_pcts();
    experts.save_usage();
    if std::io::IsTerminal::is_terminal(&out) {
        // Only for a person at a terminal: a pipe gets exactly the answer's bytes.
        let _ = out.lock().write_all(b"\n");
    }
    eprintln!(
        "[run] {} prompt + {} completion tokens | prefill {:.2}s ({:.1} tok/s) | decode {:.2} tok/s | expert hit {:.1}% (pin {:.1}% + lru {:.1}%) | load {:.2}s{}",
        prompt_tokens,
        stats.completion_tokens,
        stats.prefill_s,
        prompt_tokens as f64 / stats.prefill_s.max(1e-9),
        stats.decode_tok_s(),
        hit_pct,
        pin_pct,
        lru_pct,
        engine.load_s,
        if stats.length_limited() { " | stopped at --max-tokens" } else { "" }
    );
    if stats.grammar_masks > 0 {
        eprintln!(
            "[grammar] {} masks, {:.1} us per token ({:.3}s in all) | forced-span drafts {} accepted {}{}",
            stats.grammar_masks,
            stats.grammar_mask_s * 1e6 / stats.grammar_masks as f64,
            stats.grammar_mask_s,
            engine.spec.forced_proposed,
            engine.spec.forced_accepted,
            if stats.finish == Finish::Grammar {
                " | sentence complete"
            } else {
                ""
            }
        );
    }
    let spec = engine.spec.figures().since(&spec0);
    eprintln!(
        "[run] {:.2} tokens/forward | draft {} | acceptance {} | cost of a verify position {:.2}, of an MTP draft {:.2} (x a decode row)",
        spec.tokens_per_forward(),
        engine.spec.max_draft,
        spec.acceptance_line(),
        engine.spec.extra_cost(),
        engine.spec.mtp_cost()
    );
    for line in experts.report_lines(
        &d,
        prompt_tokens + stats.completion_tokens,
        stats.prefill_s + stats.decode_s,
    ) {
        eprintln!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `--grammar` / `--json-schema`, compiled; an invalid one is a usage error naming the file
/// and the position.
fn load_grammar(args: &RunArgs) -> Result<Option<Arc<Grammar>>, EngineError> {
    let (path, json) = match (&args.grammar, &args.json_schema) {
        (Some(p), _) => (p, false),
        (None, Some(p)) => (p, true),
        (None, None) => return Ok(None),
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| EngineError::io(format!("reading {}", path.display()), e))?;
    let g = if json {
        Grammar::from_json_schema(&text)
    } else {
        Grammar::from_gbnf(&text)
    };
    g.map(|g| Some(Arc::new(g)))
        .map_err(|e| EngineError::Usage(format!("{}: {e}", path.display())))
}
