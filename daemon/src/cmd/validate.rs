//! `colibri validate`: the oracle check of CONTRACT.md §5.
//!
//! (a) one teacher-forced forward over `full_ids`, argmax at every position against `tf_pred`;
//! (b) greedy generation from `prompt_ids` with the KV cache, step by step, no stop tokens,
//! against the rest of `full_ids`. When the reference carries the oracle's logits
//! (`logits_file`), their distance to ours is printed too.

use std::path::Path;
use std::process::ExitCode;

use serde_json::Value;

use crate::cli::ValidateArgs;
use crate::engine::{Engine, Event, Finish, StartOptions, TurnSpec};
use crate::error::EngineError;
use crate::model::ops::argmax;
use crate::sampling::Sampler;

pub struct Reference {
    pub prompt_ids: Vec<u32>,
    pub full_ids: Vec<u32>,
    pub tf_pred: Option<Vec<u32>>,
    /// Oracle logits over full_ids, (len(full_ids), vocab), when the reference names a file.
    pub logits: Option<Vec<f32>>,
}

fn ids(obj: &Value, key: &str, path: &Path) -> Result<Option<Vec<u32>>, EngineError> {
    let Some(v) = obj.get(key) else {
        return Ok(None);
    };
    let arr = v.as_array().ok_or_else(|| {
        EngineError::Usage(format!("{}: \"{key}\" is not an array", path.display()))
    })?;
    arr.iter()
        .map(|x| {
            x.as_u64()
                .filter(|&n| n <= u32::MAX as u64)
                .map(|n| n as u32)
                .ok_or_else(|| {
                    EngineError::Usage(format!(
                        "{}: \"{key}\" holds {x}, not a token id",
                        path.display()
                    ))
                })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

impl Reference {
    pub fn load(path: &Path, case: Option<&str>) -> Result<Reference, EngineError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| EngineError::io(format!("reading {}", path.display()), e))?;
        let root: Value = serde_json::from_str(&text)
            .map_err(|e| EngineError::Usage(format!("{}: not valid JSON: {e}", path.display())))?;
        let obj = match case {
            Some(k) => root.get(k).ok_or_else(|| {
                let keys: Vec<&str> = root
                    .as_object()
                    .map(|o| o.keys().map(|s| s.as_str()).collect())
                    .unwrap_or_default();
                EngineError::Usage(format!(
                    "{}: no case {k:?} (cases: {})",
                    path.display(),
                    keys.join(", ")
                ))
            })?,
            None => &root,
        };
        // A file of cases has no arrays at its top level: say which --case to pick.
        let cases: Vec<&str> = match (case, obj.as_object()) {
            (None, Some(o)) => o
                .iter()
                .filter(|(_, v)| v.get("prompt_ids").is_some())
                .map(|(k, _)| k.as_str())
                .collect(),
            _ => Vec::new(),
        };
        let need = |key: &str| -> Result<Vec<u32>, EngineError> {
            ids(obj, key, path)?.ok_or_else(|| {
                let hint = if cases.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; the file holds cases: pick one with --case ({})",
                        cases.join(", ")
                    )
                };
                EngineError::Usage(format!("--ref {}: missing \"{key}\"{hint}", path.display()))
            })
        };
        let prompt_ids = need("prompt_ids")?;
        let full_ids = need("full_ids")?;
        if prompt_ids.is_empty()
            || full_ids.len() < prompt_ids.len()
            || full_ids[..prompt_ids.len()] != prompt_ids[..]
        {
            return Err(EngineError::Usage(format!(
                "{}: full_ids must start with the (non-empty) prompt_ids",
                path.display()
            )));
        }
        let tf_pred = ids(obj, "tf_pred", path)?;
        if let Some(tf) = &tf_pred {
            if tf.len() != full_ids.len() {
                return Err(EngineError::Usage(format!(
                    "{}: tf_pred has {} entries, full_ids {}",
                    path.display(),
                    tf.len(),
                    full_ids.len()
                )));
            }
        }
        let logits = match obj.get("logits_file").and_then(|v| v.as_str()) {
            Some(f) => {
                let p = path.parent().unwrap_or(Path::new(".")).join(f);
                let raw = std::fs::read(&p)
                    .map_err(|e| EngineError::io(format!("reading {}", p.display()), e))?;
                Some(crate::weights::f32_le(&raw))
            }
            None => None,
        };
        Ok(Reference {
            prompt_ids,
            full_ids,
            tf_pred,
            logits,
        })
    }
}

/// Distance of our logits to the oracle's: max |d|, RMS of d, and RMS of d relative to the
/// spread (standard deviation) of the oracle logits.
#[derive(Clone, Copy, Debug)]
pub struct LogitError {
    pub max_abs: f64,
    pub rms: f64,
    pub rel_rms: f64,
}

pub fn logit_error(ours: &[f32], oracle: &[f32]) -> LogitError {
    let n = ours.len().min(oracle.len()).max(1) as f64;
    let mut max_abs = 0.0f64;
    let mut sq = 0.0f64;
    for (a, b) in ours.iter().zip(oracle) {
        let d = (*a as f64 - *b as f64).abs();
        max_abs = max_abs.max(d);
        sq += d * d;
    }
    let mean = oracle.iter().map(|v| *v as f64).sum::<f64>() / n;
    let var = oracle
        .iter()
        .map(|v| (*v as f64 - mean).powi(2))
        .sum::<f64>()
        / n;
    let rms = (sq / n).sqrt();
    LogitError {
        max_abs,
        rms,
        rel_rms: rms / var.sqrt().max(1e-30),
    }
}

pub struct Outcome {
    pub tf_matched: usize,
    pub tf_total: usize,
    pub gen_matched: usize,
    pub gen_total: usize,
    pub tf_logits: Vec<f32>,
    pub generated: Vec<u32>,
    /// The DSA indexer's top-k cuts in the teacher-forced forward.
    pub tf_cuts: crate::model::IndexCuts,
}

/// Runs both checks of a reference on a loaded engine.
pub fn check(engine: &mut Engine, r: &Reference) -> Result<Outcome, EngineError> {
    let mut tf_logits = Vec::new();
    engine.take_index_cuts();
    engine.teacher_forced(&[], &r.full_ids, &mut tf_logits)?;
    let tf_cuts = engine.take_index_cuts();
    let vocab = engine.vocab_size();
    let preds: Vec<u32> = tf_logits
        .chunks_exact(vocab)
        .map(|row| argmax(row) as u32)
        .collect();
    let (tf_matched, tf_total) = match &r.tf_pred {
        Some(tf) => (
            preds.iter().zip(tf).filter(|(a, b)| a == b).count(),
            tf.len(),
        ),
        // Without tf_pred, teacher forcing checks the continuation positions against full_ids.
        None => {
            let p = r.prompt_ids.len();
            let want = &r.full_ids[p..];
            let got = &preds[p - 1..r.full_ids.len() - 1];
            (
                want.iter().zip(got).filter(|(a, b)| a == b).count(),
                want.len(),
            )
        }
    };
    let n_new = r.full_ids.len() - r.prompt_ids.len();
    let mut generated = Vec::new();
    if n_new > 0 {
        // Greedy, no stop tokens, through the engine's step like every other caller, on a
        // fresh conversation.
        engine.reset(0);
        engine.begin(
            0,
            TurnSpec {
                use_stops: false,
                ..TurnSpec::new(r.prompt_ids.clone(), n_new, Sampler::greedy())
            },
        )?;
        let outcome = engine.finish_turn(0, |_, e, _| {
            if let Event::Token { id, .. } = e {
                generated.push(*id);
            }
            true
        })?;
        if let Finish::Failed(why) = outcome.finish {
            return Err(EngineError::Load(why));
        }
    }
    let want = &r.full_ids[r.prompt_ids.len()..];
    let gen_matched = want.iter().zip(&generated).filter(|(a, b)| a == b).count();
    Ok(Outcome {
        tf_matched,
        tf_total,
        gen_matched,
        gen_total: n_new,
        tf_logits,
        generated,
        tf_cuts,
    })
}

pub fn run(args: ValidateArgs) -> Result<ExitCode, EngineError> {
    let opts = args.reference.load_options(&args.model)?;
    let reference = Reference::load(&args.reference.reference, args.reference.case.as_deref())?;
    // Pins (--pin FILE) and the RAM clamp; no usage history is read or written.
    let mut engine = Engine::start(StartOptions {
        dirs: args.model.dirs()?,
        load: opts,
        sessions: 1,
        ctx: reference.full_ids.len() + 1,
        state_dir: None,
        kv_save: false,
        progress: None,
    })?;
    let o = check(&mut engine, &reference)?;
    let (experts, dense) = engine.format_names();
    crate::elog!(
        "[validate] {} positions ({} prompt + {} generated), index_topk {}, experts {experts} / dense {dense}",
        reference.full_ids.len(),
        reference.prompt_ids.len(),
        o.gen_total,
        engine.index_topk(),
    );
    if let Some(oracle) = &reference.logits {
        if oracle.len() == o.tf_logits.len() {
            let e = logit_error(&o.tf_logits, oracle);
            println!(
                "LOGITS max_abs={:.3e} rms={:.3e} rel_rms={:.3e}",
                e.max_abs, e.rms, e.rel_rms
            );
        } else {
            crate::elog!(
                "[validate] logits file has {} values, expected {}: not compared",
                oracle.len(),
                o.tf_logits.len()
            );
        }
    }
    if o.gen_matched < o.gen_total {
        crate::elog!("[validate] generated {:?}", o.generated);
    }
    if o.tf_cuts.rows > 0 {
        // A row whose top-k cut falls inside a tie of index scores keeps the earliest keys
        // here, while the reference's torch.topk keeps an unspecified subset: a mismatch
        // after such rows may be the tie, not a bug (a reference made with the same rule
        // must still match exactly).
        println!(
            "INDEXER sparse_rows={} boundary_ties={} tie_rule=earliest",
            o.tf_cuts.rows, o.tf_cuts.ties
        );
    }
    println!(
        "VALIDATE tf={}/{} gen={}/{}",
        o.tf_matched, o.tf_total, o.gen_matched, o.gen_total
    );
    Ok(
        if o.tf_matched == o.tf_total && o.gen_matched == o.gen_total {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        },
    )
}
