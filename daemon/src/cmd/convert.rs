//! `colibri convert --from HF_DIR --to OUT`: a Hugging Face checkpoint (F32, BF16, or FP8
//! e4m3 with 128x128 block scales) to upstream's streaming container.
//!
//! The order of work is what makes it safe to start and to stop: plan everything first (the
//! `[PLAN]` line: what, how many bytes, the free disk needed against what is there), refuse
//! before writing anything when the output folder holds another conversion or a checkpoint of
//! its own, or when the disk cannot hold the rest; then write shard by shard, each to
//! `<name>.partial`, synced, renamed into place and only then recorded. A kill or a full disk
//! loses at most the shard in progress; the same command again verifies the recorded shards
//! (size and hash, and that the source files they read still have the content they were made
//! from) and redoes the rest. Output bytes depend only on the source and the parameters, so a
//! resumed conversion equals an uninterrupted one. Last come the per-tensor checksums,
//! `colibri-checksums.json` (see `weights/checksums.rs`), which `colibri verify` and
//! `--verify-reads` check.
//!
//! Test aids (environment): `COLI_CONVERT_FREE_BYTES` replaces the free-space figure of the
//! output's file system; `COLI_CONVERT_STOP_AFTER=N` exits (status 75) after N pieces are
//! written, as a kill part way would.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::{json, Value};

use crate::cli::ConvertArgs;
use crate::convert::manifest::{hash_shard, write_atomic, Done, Manifest};
use crate::convert::plan::{self, Formats, Group, Plan};
use crate::convert::progress::Progress;
use crate::convert::shard::{self, StopHook};
use crate::convert::source::{self, SourceId};
use crate::error::EngineError;
use crate::quant::QFormat;
use crate::weights::checksums::{self, Checksums};
use crate::weights::ShardSet;

/// Files copied next to the shards as they are: the config, the generation config, and every
/// file a tokenizer or chat template may live in (transformers now writes the template to
/// `chat_template.jinja`; Kimi ships `tiktoken.model` and its `tokenization_kimi.py`).
const META_NAMES: [&str; 7] = [
    "config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
];
const META_PREFIXES: [&str; 3] = ["tokenizer", "tokenization_", "chat_template"];
const META_SUFFIXES: [&str; 2] = [".tiktoken", "tiktoken.model"];
const INDEX: &str = "model.safetensors.index.json";
const LOCK: &str = ".convert.lock";
/// Version of the container layout this converter writes; part of the recorded parameters.
const LAYOUT_VERSION: u64 = 1;

fn gb(b: u64) -> f64 {
    b as f64 / 1e9
}

fn formats(a: &ConvertArgs) -> Result<Formats, EngineError> {
    let fmt = |bits: u32, flag: &str| {
        QFormat::from_bits(bits, a.group_size)
            .map_err(|e| EngineError::Usage(format!("{flag} {bits}: {e}")))
    };
    if a.io_bits != 8 && a.io_bits != 16 {
        return Err(EngineError::Usage(format!(
            "--io-bits {}: the embedding and lm_head keep 8 (int8 per row) or 16 (f32) bits; \
             below 8 the logits lose their order",
            a.io_bits
        )));
    }
    if a.expert_bits == 16 {
        return Err(EngineError::Usage(
            "--expert-bits 16: routed experts are streamed quantized; allowed: 8, 4, 3, 2".into(),
        ));
    }
    Ok(Formats {
        expert: fmt(a.expert_bits, "--expert-bits")?,
        dense: fmt(a.dense_bits, "--dense-bits")?,
        io: fmt(a.io_bits, "--io-bits")?,
        mtp: fmt(a.mtp_bits, "--mtp-bits")?,
    })
}

/// `num_hidden_layers` of the source's config.json: layers from there on are the MTP head.
fn n_layers(from: &Path) -> Result<usize, EngineError> {
    let path = from.join("config.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| EngineError::io(format!("reading {}", path.display()), e))?;
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| EngineError::Usage(format!("{}: not valid JSON: {e}", path.display())))?;
    v.get("num_hidden_layers")
        .and_then(Value::as_u64)
        .map(|n| n as usize)
        .ok_or_else(|| {
            EngineError::Usage(format!(
                "{}: no integer \"num_hidden_layers\"",
                path.display()
            ))
        })
}

/// What is recorded and compared: the source's files and every choice that changes a byte.
fn params(a: &ConvertArgs, f: &Formats, src: &ShardSet) -> Value {
    let files: Vec<Value> = (0..src.num_files())
        .map(|i| {
            let p = src.file_path(i);
            json!({
                "name": p.file_name().map(|n| n.to_string_lossy().into_owned()),
                "bytes": std::fs::metadata(p).map(|m| m.len()).unwrap_or(0),
            })
        })
        .collect();
    json!({
        "layout": LAYOUT_VERSION,
        "source_files": files,
        "experts": f.expert.name(),
        "dense": f.dense.name(),
        "io": f.io.name(),
        "mtp": f.mtp.name(),
        "group_size": a.group_size,
        "shard_size": a.shard_size,
    })
}

/// Free bytes on the file system that will hold `dir` (its nearest existing ancestor).
pub(crate) fn free_bytes(dir: &Path) -> Result<u64, EngineError> {
    if let Ok(v) = std::env::var("COLI_CONVERT_FREE_BYTES") {
        return v.parse().map_err(|_| {
            EngineError::Usage(format!("COLI_CONVERT_FREE_BYTES={v:?} is not a byte count"))
        });
    }
    let mut at = dir.to_path_buf();
    while !at.exists() {
        if !at.pop() {
            at = PathBuf::from(".");
            break;
        }
    }
    if at.as_os_str().is_empty() {
        at = PathBuf::from(".");
    }
    let st = nix::sys::statvfs::statvfs(&at)
        .map_err(|e| EngineError::io(format!("statvfs {}", at.display()), e.into()))?;
    Ok(st.blocks_available() as u64 * st.fragment_size() as u64)
}

/// Refuses an output folder that holds something other than this conversion.
pub(crate) fn check_out_dir(out: &Path, params: &Value) -> Result<Option<Manifest>, EngineError> {
    if !out.exists() {
        return Ok(None);
    }
    if !out.is_dir() {
        return Err(EngineError::Usage(format!(
            "--to {}: exists and is not a directory",
            out.display()
        )));
    }
    match Manifest::load(out)? {
        Some(m) if m.params != *params => Err(EngineError::Usage(format!(
            "--to {}: holds a conversion with other parameters\n  recorded: {}\n  this run: {}\n\
             refusing to mix two conversions in one folder; use another --to, or empty this one",
            out.display(),
            m.params,
            params
        ))),
        Some(m) => Ok(Some(m)),
        None => {
            let foreign = std::fs::read_dir(out)
                .map_err(|e| EngineError::io(format!("listing {}", out.display()), e))?
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .find(|n| n.ends_with(".safetensors") || n == "config.json");
            match foreign {
                Some(n) => Err(EngineError::Usage(format!(
                    "--to {}: already holds a checkpoint ({n}) that colibri convert did not \
                     write; refusing to write into it",
                    out.display()
                ))),
                None => Ok(None),
            }
        }
    }
}

/// Per planned shard: its tensors' checksums when the shard is kept, `None` to (re)write it.
type Kept = Vec<Option<Vec<(String, u64)>>>;

/// The recorded shards whose file still has the recorded size and hash and whose sources
/// are what they were made from (`inputs`).
fn verified(out: &Path, plan: &Plan, inputs: &[u64], m: &Manifest) -> Result<Kept, EngineError> {
    plan.shards
        .iter()
        .zip(inputs)
        .map(|(s, &want)| {
            let Some(rec) = m
                .shards
                .get(&s.name)
                .filter(|r| r.bytes == s.bytes && r.inputs == Some(want))
            else {
                return Ok(None);
            };
            let found = hash_shard(&out.join(&s.name), s.header.len() as u64, &s.entries())?;
            Ok(found
                .filter(|f| f.bytes == rec.bytes && f.hash == rec.hash)
                .map(|f| f.tensors))
        })
        .collect()
}

/// Says which source files changed since the record (same names and sizes: the parameters
/// matched) and how many recorded shards predate source identities.
fn report_changes(m: &Manifest, ids: &[SourceId]) {
    let changed: Vec<&str> = ids
        .iter()
        .filter(|id| {
            m.sources
                .iter()
                .find(|r| r.name == id.name)
                .is_some_and(|r| r != *id)
        })
        .map(|id| id.name.as_str())
        .collect();
    if !changed.is_empty() {
        crate::elog!(
            "[RESUME] source content changed since the record (same sizes): {}; the output \
             shards made from them are rewritten",
            changed.join(", ")
        );
    }
    let old = m.shards.values().filter(|d| d.inputs.is_none()).count();
    if old > 0 {
        crate::elog!(
            "[RESUME] {old} recorded shard(s) were written by an older colibri convert that did \
             not identify its sources: rewritten"
        );
    }
}

fn plan_line(a: &ConvertArgs, f: &Formats, plan: &Plan, to_write: u64, done: usize, free: u64) {
    crate::elog!(
        "[PLAN] {} -> {} | experts {}, dense {}, embed/lm_head {}, MTP {} | {} tensors in {} \
         shards ({} out-, {} out-mtp-, {} out-idx-), {:.3} GB from {:.3} GB | {} shard(s) done, \
         {:.3} GB to write, {:.3} GB free",
        a.from.display(),
        a.to.display(),
        f.expert,
        f.dense,
        f.io,
        f.mtp,
        plan.n_tensors(),
        plan.shards.len(),
        plan.count(Group::Main),
        plan.count(Group::Mtp),
        plan.count(Group::Indexer),
        gb(plan.out_bytes()),
        gb(plan.source_bytes),
        done,
        gb(to_write),
        gb(free)
    );
}

fn refuse_if_full(need: u64, free: u64, out: &Path) -> Result<(), EngineError> {
    if need > free {
        return Err(EngineError::Usage(format!(
            "--to {}: the conversion needs {:.3} GB more but the disk has {:.3} GB free; \
             nothing was written (free space, or choose another --to)",
            out.display(),
            gb(need),
            gb(free)
        )));
    }
    Ok(())
}

/// The names of the source's files that [`META_NAMES`], [`META_PREFIXES`] and
/// [`META_SUFFIXES`] select, sorted.
fn meta_files(from: &Path) -> Result<Vec<String>, EngineError> {
    let mut names: Vec<String> = std::fs::read_dir(from)
        .map_err(|e| EngineError::io(format!("listing {}", from.display()), e))?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            META_NAMES.contains(&n.as_str())
                || META_PREFIXES.iter().any(|p| n.starts_with(p))
                || META_SUFFIXES.iter().any(|s| n.ends_with(s))
        })
        .collect();
    names.sort();
    Ok(names)
}

fn meta_bytes(from: &Path, names: &[String]) -> u64 {
    names
        .iter()
        .filter_map(|m| std::fs::metadata(from.join(m)).ok())
        .map(|m| m.len())
        .sum()
}

/// The checks `run` makes on a model folder (family and config, tokenizer.json against the
/// vocabulary, the chat template), made on the source before anything is written: what `run`
/// would refuse after the conversion is refused before it, with the same reason.
fn check_source(from: &Path) -> Result<(), EngineError> {
    crate::engine::ModelFiles::check(&[from.to_path_buf()])
        .map(|_| ())
        .map_err(|e| {
            EngineError::Usage(format!(
                "--from {}: {e}\n  run and serve would refuse the converted folder; nothing was \
                 converted",
                from.display()
            ))
        })
}

pub fn run(a: ConvertArgs) -> Result<ExitCode, EngineError> {
    // A GGUF keeps each tensor's type: the bit flags do not apply (convert_gguf.rs).
    if crate::gguf::snap::is_gguf(&a.from) {
        return super::convert_gguf::run(&a);
    }
    let f = formats(&a)?;
    if !a.from.is_dir() {
        return Err(EngineError::Usage(format!(
            "--from {}: not a directory",
            a.from.display()
        )));
    }
    check_source(&a.from)?;
    let layers = n_layers(&a.from)?;
    let src = ShardSet::open_stored(std::slice::from_ref(&a.from))?;
    // gpt-oss: sinks of the wrong shape, which loading refuses, are refused before converting.
    if let Ok(cfg) = crate::config::ModelConfig::load(&a.from) {
        if cfg.oss.is_some() {
            crate::model::gpt_oss::check_sinks(&src, &cfg)?;
        }
    }
    let plan = plan::plan(&src, layers, &f, a.shard_size)?;
    let params = params(&a, &f, &src);
    let prior = check_out_dir(&a.to, &params)?;

    // The [PLAN] line counts recorded shards of the right size as done; hashes come next.
    let recorded = |s: &plan::Shard| {
        prior
            .as_ref()
            .and_then(|m| m.shards.get(&s.name))
            .is_some_and(|r| r.bytes == s.bytes)
    };
    let meta = meta_files(&a.from)?;
    let extra = meta_bytes(&a.from, &meta) + 1_000_000; // metadata, index and record
    let to_write: u64 = plan
        .shards
        .iter()
        .filter(|s| !recorded(s))
        .map(|s| s.bytes)
        .sum();
    let free = free_bytes(&a.to)?;
    let n_recorded = plan.shards.iter().filter(|s| recorded(s)).count();
    plan_line(&a, &f, &plan, to_write, n_recorded, free);
    if plan.count(Group::Mtp) > 0 && matches!(f.mtp, QFormat::I4Row | QFormat::I2Row) {
        // Upstream's issue #8: eh_proj's two column halves differ 20-30x in scale, so one
        // scale per row rounds the whole embedding half to zero and drafts never land.
        crate::elog!(
            "[PLAN] warning: --mtp-bits {} with one scale per row zeroes eh_proj's embedding half \
             (MTP acceptance ~0%); the default --mtp-bits 8, or --group-size 64, avoids it",
            f.mtp.bits()
        );
    }
    refuse_if_full(to_write + extra, free, &a.to)?;

    let ids = source::identify(&src)?;
    let inputs: Vec<u64> = plan
        .shards
        .iter()
        .map(|s| source::inputs(s, &src, &ids))
        .collect();
    let mut kept: Kept = vec![None; plan.shards.len()];
    if let Some(m) = &prior {
        report_changes(m, &ids);
        kept = verified(&a.to, &plan, &inputs, m)?;
        let good = kept.iter().filter(|v| v.is_some()).count();
        crate::elog!(
            "[RESUME] {} of {} recorded shard(s) verified (size and hash), {} to (re)write",
            good,
            m.shards.len(),
            plan.shards.len() - good
        );
        let need: u64 = plan
            .shards
            .iter()
            .zip(&kept)
            .filter(|(_, v)| v.is_none())
            .map(|(s, _)| s.bytes)
            .sum();
        refuse_if_full(need + extra, free, &a.to)?;
    }

    // From here on the output folder is written.
    std::fs::create_dir_all(&a.to)
        .map_err(|e| EngineError::io(format!("creating {}", a.to.display()), e))?;
    let lock_path = a.to.join(LOCK);
    let lock = File::create(&lock_path)
        .map_err(|e| EngineError::io(format!("creating {}", lock_path.display()), e))?;
    if lock.try_lock().is_err() {
        return Err(EngineError::Usage(format!(
            "--to {}: another colibri convert is writing into it",
            a.to.display()
        )));
    }
    // Another converter may have finished shards between our look and the lock.
    let now = Manifest::load(&a.to)?.map(|m| m.shards);
    if now != prior.as_ref().map(|m| m.shards.clone()) {
        return Err(EngineError::Usage(format!(
            "--to {}: its record changed while this conversion started; run it again",
            a.to.display()
        )));
    }
    let mut record = prior.unwrap_or_else(|| Manifest::new(params.clone()));
    record.complete = false;
    record.sources = ids;
    record.shards.retain(|name, _| {
        plan.shards
            .iter()
            .zip(&kept)
            .any(|(s, k)| k.is_some() && s.name == *name)
    });
    record.save(&a.to)?;
    let sums_path = drop_checksums(&a.to)?;

    let todo: Vec<usize> = (0..plan.shards.len())
        .filter(|&i| kept[i].is_none())
        .collect();
    let todo_source: u64 = todo
        .iter()
        .flat_map(|&i| &plan.shards[i].tensors)
        .map(|t| t.source.len)
        .sum();
    let progress = Progress::new(todo_source);
    let stop = StopHook::from_env();
    for &i in &todo {
        let s = &plan.shards[i];
        let final_path = a.to.join(&s.name);
        let partial = a.to.join(format!("{}.partial", s.name));
        let _ = std::fs::remove_file(&final_path);
        let found = shard::write(&src, s, &partial, shard::CHUNK_ELEMS, &progress, &stop)?;
        std::fs::rename(&partial, &final_path)
            .map_err(|e| EngineError::io(format!("renaming {}", partial.display()), e))?;
        record.shards.insert(
            s.name.clone(),
            Done {
                bytes: found.bytes,
                hash: found.hash,
                inputs: Some(inputs[i]),
            },
        );
        kept[i] = Some(found.tensors);
        record.save(&a.to)?;
        progress.shard_done(&s.name, i, plan.shards.len());
    }
    progress.finish();

    let mut sums = Checksums::default();
    for (s, tensors) in plan.shards.iter().zip(kept) {
        for (name, h) in tensors.unwrap_or_default() {
            sums.insert(name, s.name.clone(), h);
        }
    }
    finish_folder(&a, &plan, &meta)?;
    write_atomic(&sums_path, sums.to_json().as_bytes())?;
    record.complete = true;
    record.save(&a.to)?;
    let (read, written, secs) = progress.totals();
    crate::elog!(
        "[DONE] {}: {} shard(s) written ({} kept), {:.3} GB from {:.3} GB in {:.1} s \
         ({:.1} MB/s read, {:.1} MB/s written)",
        a.to.display(),
        todo.len(),
        plan.shards.len() - todo.len(),
        gb(written),
        gb(read),
        secs,
        read as f64 / 1e6 / secs.max(1e-9),
        written as f64 / 1e6 / secs.max(1e-9)
    );
    drop(lock);
    Ok(ExitCode::SUCCESS)
}

/// Config, tokenizer, chat template and generation config files copied as they are, and the
/// index of tensors.
fn finish_folder(a: &ConvertArgs, plan: &Plan, meta: &[String]) -> Result<(), EngineError> {
    for m in meta {
        let from = a.from.join(m);
        let bytes = std::fs::read(&from)
            .map_err(|e| EngineError::io(format!("reading {}", from.display()), e))?;
        write_atomic(&a.to.join(m), &bytes)?;
    }
    crate::elog!(
        "[META] copied from {}: {}",
        a.from.display(),
        meta.join(", ")
    );
    let mut map = serde_json::Map::new();
    for s in &plan.shards {
        for n in s.entry_names() {
            map.insert(n, Value::String(s.name.clone()));
        }
    }
    let data: u64 = plan
        .shards
        .iter()
        .map(|s| s.bytes - s.header.len() as u64)
        .sum();
    let index = json!({"metadata": {"total_size": data}, "weight_map": map});
    let text = serde_json::to_string_pretty(&index).expect("a JSON value serializes") + "\n";
    write_atomic(&a.to.join(INDEX), text.as_bytes())?;
    Ok(())
}

/// Removes the output folder's checksums before a conversion writes into it (they describe a
/// finished conversion, and this one is not finished until the end); returns their path, for
/// the end.
pub(crate) fn drop_checksums(to: &Path) -> Result<PathBuf, EngineError> {
    let sums_path = to.join(checksums::FILE);
    match std::fs::remove_file(&sums_path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(EngineError::io(
            format!("removing {}", sums_path.display()),
            e,
        )),
        _ => Ok(sums_path),
    }
}
