//! `colibri run`: one completion for scripts and pipes. The answer's raw bytes go to stdout
//! exactly as `serve` streams them; the figures go to stderr.

use std::io::{Read, Write};
use std::process::ExitCode;

use crate::cli::RunArgs;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::experts::{usage_path, ExpertStore, TierStart};
use crate::generate::{generate, TokenSink};
use crate::sampling::{Rng, Sampler};
use crate::tokenizer::Tokenizer;

/// Writes each token's bytes to stdout as it comes. A closed pipe ends the generation quietly
/// (`colibri run | head -c 10` is polite).
struct StdoutSink<'a> {
    tokenizer: &'a Tokenizer,
    out: std::io::Stdout,
    /// Between two decode steps is a safe point for live re-pin and the RSS guard.
    experts: &'a ExpertStore,
}

impl TokenSink for StdoutSink<'_> {
    fn token(&mut self, id: u32) -> Result<bool, EngineError> {
        let mut lock = self.out.lock();
        match lock
            .write_all(self.tokenizer.token_bytes(id))
            .and_then(|_| lock.flush())
        {
            Ok(()) => {
                self.experts.safe_point(1);
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
            Err(e) => Err(EngineError::io("writing to stdout", e)),
        }
    }
}

pub fn run(args: RunArgs) -> Result<ExitCode, EngineError> {
    args.model.init_threads();
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
    let engine = Engine::open(args.model.dirs()?, args.model.load_options()?)?;
    let experts = &engine.model.experts;
    let state_dir = crate::serve::state_dir_for(&engine.dirs[0], args.state_dir.as_deref())?;
    let prompt = if args.raw {
        text
    } else {
        Engine::chat_prompt(text.trim_end_matches('\n'), true, args.think)
    };
    let ids = engine.tokenizer.encode(&prompt)?;
    if ids.is_empty() {
        return Err(EngineError::Usage("the prompt is empty".into()));
    }
    experts.start(TierStart::for_model(
        &engine.model,
        1,
        ids.len() + args.max_tokens as usize + 1,
        Some(usage_path(&state_dir)),
    ))?;
    let rng = args
        .sampling
        .seed
        .map(Rng::new)
        .unwrap_or_else(Rng::from_entropy);
    let mut sampler = Sampler::new(args.sampling.temperature, args.sampling.top_p, rng);
    let mut kv = engine.model.new_cache();
    let mut sink = StdoutSink {
        tokenizer: &engine.tokenizer,
        out: std::io::stdout(),
        experts,
    };
    let snap0 = experts.snapshot();
    let stats = generate(
        &engine.model,
        &mut kv,
        &ids,
        args.max_tokens as usize,
        &engine.stops,
        &mut sampler,
        &mut sink,
    )?;
    let d = experts.snapshot().since(&snap0);
    let (hit_pct, pin_pct, lru_pct) = d.hit_pcts();
    experts.save_usage();
    if std::io::IsTerminal::is_terminal(&sink.out) {
        // Only for a person at a terminal: a pipe gets exactly the answer's bytes.
        let _ = sink.out.lock().write_all(b"\n");
    }
    eprintln!(
        "[run] {} prompt + {} completion tokens | prefill {:.2}s ({:.1} tok/s) | decode {:.2} tok/s | expert hit {:.1}% (pin {:.1}% + lru {:.1}%) | load {:.2}s{}",
        stats.prompt_tokens,
        stats.completion_tokens,
        stats.prefill_s,
        stats.prompt_tokens as f64 / stats.prefill_s.max(1e-9),
        stats.decode_tok_s(),
        hit_pct,
        pin_pct,
        lru_pct,
        engine.load_s,
        if stats.length_limited { " | stopped at --max-tokens" } else { "" }
    );
    for line in experts.report_lines(
        &d,
        stats.prompt_tokens + stats.completion_tokens,
        stats.prefill_s + stats.decode_s,
    ) {
        eprintln!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}
