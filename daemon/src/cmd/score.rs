//! `colibri score`: the log-likelihood of a text under the model (upstream's SCORE mode,
//! llama.cpp's `perplexity`): mean negative log-likelihood per token, perplexity, and bits per
//! byte, over windows of `--ctx` tokens that advance by `--stride`.
//!
//! The text is tokenized as it is (no chat template, no special tokens). Each token is scored
//! once, by the first window that contains it after the part already scored, so with a stride
//! below the context every token after the first window sees at least `ctx - stride` tokens
//! of context (the strided evaluation of transformers' perplexity guide). A window's first
//! token is never scored (nothing precedes it inside the window), so the very first token of
//! the text never is, and with `--stride` equal to `--ctx` neither is the first of each window.
//!
//! Each window is a fresh teacher-forced forward, as `validate` drives the model: its unscored
//! head runs without logits, then the scored tail returns the logits of every position, so the
//! memory held for logits is `stride x vocab`, not `ctx x vocab`.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use crate::cli::ScoreArgs;
use crate::engine::{Engine, StartOptions};
use crate::error::EngineError;

/// Running totals of a scoring pass.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Totals {
    /// Tokens scored.
    pub tokens: usize,
    /// Sum of their negative log-likelihoods, in nats.
    pub nll_sum: f64,
    /// UTF-8 bytes those tokens stand for.
    pub bytes: usize,
}

impl Totals {
    pub fn mean_nll(&self) -> f64 {
        self.nll_sum / self.tokens.max(1) as f64
    }

    pub fn perplexity(&self) -> f64 {
        self.mean_nll().exp()
    }

    pub fn bits_per_byte(&self) -> f64 {
        self.nll_sum / std::f64::consts::LN_2 / self.bytes.max(1) as f64
    }
}

/// One forward window: tokens `begin..end` of the text run, targets `first..end` are scored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub begin: usize,
    pub first: usize,
    pub end: usize,
}

/// The windows that score a text of `n` tokens with context `ctx` and stride `stride`
/// (`1 <= stride <= ctx`, `ctx >= 2`): every target in `1..n` at most once, in order.
pub fn windows(n: usize, ctx: usize, stride: usize) -> Vec<Window> {
    let mut out = Vec::new();
    let (mut begin, mut scored_to) = (0usize, 1usize);
    while scored_to < n {
        let end = (begin + ctx).min(n);
        let first = scored_to.max(begin + 1);
        if first < end {
            out.push(Window { begin, first, end });
        }
        scored_to = end;
        begin += stride;
    }
    out
}

/// Negative log-likelihood of `target` under one row of logits, in nats (log-sum-exp in f64).
pub fn token_nll(row: &[f32], target: u32) -> f64 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
    max + sum.ln() - row[target as usize] as f64
}

/// Scores `ids` on a loaded engine, calling `progress` after every window.
pub fn score(
    engine: &Engine,
    ids: &[u32],
    ctx: usize,
    stride: usize,
    mut progress: impl FnMut(usize, usize, &Totals),
) -> Result<Totals, EngineError> {
    let vocab = engine.vocab_size();
    let plan = windows(ids.len(), ctx, stride);
    let mut totals = Totals::default();
    let mut logits = Vec::new();
    for (i, w) in plan.iter().enumerate() {
        // Row j of the tail's logits predicts token first + j.
        let head = &ids[w.begin..w.first - 1];
        engine.teacher_forced(head, &ids[w.first - 1..w.end - 1], &mut logits)?;
        for (row, &target) in logits.chunks_exact(vocab).zip(&ids[w.first..w.end]) {
            totals.nll_sum += token_nll(row, target);
            totals.tokens += 1;
            totals.bytes += engine.token_bytes(target).len();
        }
        progress(i + 1, plan.len(), &totals);
    }
    Ok(totals)
}

fn read_text(path: &Path) -> Result<String, EngineError> {
    let raw = std::fs::read(path)
        .map_err(|e| EngineError::io(format!("reading {}", path.display()), e))?;
    String::from_utf8(raw).map_err(|e| {
        EngineError::Usage(format!(
            "--text {}: not UTF-8 (first bad byte at offset {})",
            path.display(),
            e.utf8_error().valid_up_to()
        ))
    })
}

pub fn run(args: ScoreArgs) -> Result<ExitCode, EngineError> {
    let ctx = args.ctx as usize;
    let stride = args.stride.map(|s| s as usize).unwrap_or((ctx / 2).max(1));
    if stride > ctx {
        return Err(EngineError::Usage(format!(
            "--stride {stride} is larger than --ctx {ctx}: allowed 1..={ctx}"
        )));
    }
    let text = read_text(&args.text)?;
    // Pins and the RAM clamp, as validate; no usage history is read or written.
    let engine = Engine::start(StartOptions {
        dirs: args.model.dirs()?,
        load: args.model.load_options()?,
        sessions: 1,
        ctx: ctx + 1,
        state_dir: None,
        kv_save: false,
        progress: None,
    })?;
    let ids = engine.tokenizer().encode(&text)?;
    if ids.len() < 2 {
        return Err(EngineError::Usage(format!(
            "--text {}: {} token(s); scoring needs at least 2",
            args.text.display(),
            ids.len()
        )));
    }
    let (experts, dense) = engine.format_names();
    crate::elog!(
        "[score] {}: {} bytes, {} tokens | ctx {ctx} stride {stride} | experts {experts} / dense {dense}",
        args.text.display(),
        text.len(),
        ids.len(),
    );
    let t0 = Instant::now();
    let totals = score(&engine, &ids, ctx, stride, |done, all, t| {
        crate::elog!(
            "[score] window {done}/{all} | {} tokens | nll {:.4} | ppl {:.3} | {:.1} tok/s",
            t.tokens,
            t.mean_nll(),
            t.perplexity(),
            t.tokens as f64 / t0.elapsed().as_secs_f64().max(1e-9)
        );
    })?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "SCORE tokens={} nll={:.6} ppl={:.6} bpb={:.6}",
        totals.tokens,
        totals.mean_nll(),
        totals.perplexity(),
        totals.bits_per_byte()
    )
    .map_err(|e| EngineError::io("writing to stdout", e))?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets(plan: &[Window]) -> Vec<usize> {
        plan.iter().flat_map(|w| w.first..w.end).collect()
    }

    #[test]
    fn windows_score_every_target_once_with_overlap() {
        let plan = windows(10, 4, 2);
        assert_eq!(
            plan,
            vec![
                Window {
                    begin: 0,
                    first: 1,
                    end: 4
                },
                Window {
                    begin: 2,
                    first: 4,
                    end: 6
                },
                Window {
                    begin: 4,
                    first: 6,
                    end: 8
                },
                Window {
                    begin: 6,
                    first: 8,
                    end: 10
                },
            ]
        );
        assert_eq!(targets(&plan), (1..10).collect::<Vec<_>>());
    }

    #[test]
    fn windows_without_overlap_skip_each_windows_first_token() {
        let plan = windows(9, 4, 4);
        assert_eq!(
            plan,
            vec![
                Window {
                    begin: 0,
                    first: 1,
                    end: 4
                },
                Window {
                    begin: 4,
                    first: 5,
                    end: 8
                },
            ]
        );
        assert_eq!(targets(&plan), vec![1, 2, 3, 5, 6, 7]);
    }

    #[test]
    fn a_text_shorter_than_the_context_is_one_window() {
        assert_eq!(
            windows(3, 512, 256),
            vec![Window {
                begin: 0,
                first: 1,
                end: 3
            }]
        );
        assert!(windows(1, 512, 256).is_empty());
    }

    #[test]
    fn token_nll_is_the_log_softmax() {
        let row = [1.0f32, 2.0, 3.0];
        let z: f64 = [1.0f64, 2.0, 3.0].iter().map(|v| v.exp()).sum();
        for t in 0..3 {
            let want = z.ln() - (t as f64 + 1.0);
            assert!((token_nll(&row, t) - want).abs() < 1e-12);
        }
        // Large logits do not overflow.
        assert!((token_nll(&[1000.0, 1000.0], 0) - std::f64::consts::LN_2).abs() < 1e-12);
    }

    #[test]
    fn totals_give_perplexity_and_bits_per_byte() {
        let t = Totals {
            tokens: 4,
            nll_sum: 4.0 * 2.0f64.ln(),
            bytes: 8,
        };
        assert!((t.perplexity() - 2.0).abs() < 1e-12);
        // 4 tokens of 1 bit each over 8 bytes.
        assert!((t.bits_per_byte() - 0.5).abs() < 1e-12);
    }
}
