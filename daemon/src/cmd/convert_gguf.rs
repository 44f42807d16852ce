//! `colibri convert --from FILE.gguf --to DIR`: a GGUF model (one file, or the first part of a
//! split set) rewritten as our streaming container, every tensor kept in its own type.
//!
//! Nothing is requantized: the quantized matrices (experts and dense alike) keep their ggml
//! blocks, written under their GGUF type name as a safetensors dtype (`Q4_0`, `Q8_0`, ...,
//! which `weights::Dtype::from_safetensors` reads back as `Dtype::Ggml`); F32, F16 and BF16
//! tensors stay what they are. The loader then does with the folder exactly what it does with
//! the GGUF (experts computed as stored, quantized dense matrices dequantized at load), so the
//! two give the same tokens. What changes is the layout: GGUF stacks each projection of all of
//! a layer's experts in one tensor, so an expert is three reads far apart; here an expert's
//! gate, up and down are adjacent in one shard, one read, as `colibri convert` lays them out.
//!
//! Beside the shards: `config.json` (the metadata as the Hugging Face keys the model loader
//! reads, `config::config_json`), `tokenizer.json` (the vocabulary, `tokenizer::tokenizer_json`),
//! `chat_template.jinja` (`tokenizer.chat_template`) with the texts of the bos and eos tokens in
//! `tokenizer_config.json`, the index, the per-tensor checksums `colibri verify` checks, and
//! the record `.colibri-convert.json` (a rerun with the same source keeps the shards whose size
//! and hash still match and rewrites the rest).
//!
//! Everything that can be refused is refused before the output folder is touched: an
//! architecture colibri does not run, a tensor type or name it does not read, a split set with
//! a part missing (all by `GgufModel::open`, `config`, `names`), a tokenizer or template `run`
//! would refuse, a folder holding something else, a disk too small.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use serde_json::{json, Value};

use crate::cli::ConvertArgs;
use crate::convert::manifest::{hash_shard, write_atomic, Done, Hasher, Manifest};
use crate::convert::plan::{expert_of, layer_of};
use crate::error::EngineError;
use crate::gguf::{config, names, tokenizer, GgufModel};
use crate::weights::checksums::{Checksums, Hasher as TensorHasher};
use crate::weights::writer::{header_bytes, HeaderEntry};
use crate::weights::TensorInfo;

/// Version of this layout; part of the recorded parameters.
const LAYOUT_VERSION: u64 = 1;
const INDEX: &str = "model.safetensors.index.json";
const LOCK: &str = ".convert.lock";

/// One output file: its tensors in file order (each pointing into the GGUF), its header.
#[derive(Debug)]
pub struct Shard {
    pub name: String,
    pub tensors: Vec<TensorInfo>,
    pub header: Vec<u8>,
    pub bytes: u64,
}

impl Shard {
    /// `(name, bytes)` of every tensor in file order.
    fn entries(&self) -> Vec<(String, u64)> {
        self.tensors
            .iter()
            .map(|t| (t.name.clone(), t.len))
            .collect()
    }
}

/// File order: the embedding, then layer by layer (its other tensors by name, then its
/// experts in expert order, gate-up-down), then the rest by name: `colibri convert`'s order.
fn order_key(name: &str) -> (u8, usize, usize, u8, &str) {
    let top = match layer_of(name) {
        _ if name == "model.embed_tokens.weight" => 0,
        Some(_) => 1,
        None => 2,
    };
    let (e, rank) = expert_of(name).map_or((0, 0), |(e, r)| (e + 1, r));
    (top, layer_of(name).unwrap_or(0), e, rank, name)
}

/// Cuts `tensors` (the GGUF's, under the engine's names) into shards of at most `shard_size`
/// bytes of data (a tensor larger than that alone), an expert's three projections never
/// split between two shards.
pub fn plan(mut tensors: Vec<TensorInfo>, shard_size: u64) -> Result<Vec<Shard>, EngineError> {
    tensors.sort_by(|a, b| order_key(&a.name).cmp(&order_key(&b.name)));
    let unit_of = |t: &TensorInfo| expert_of(&t.name).map(|(e, _)| (layer_of(&t.name), e));
    let mut groups: Vec<Vec<TensorInfo>> = Vec::new();
    let (mut cur, mut cur_bytes) = (Vec::<TensorInfo>::new(), 0u64);
    let mut i = 0;
    while i < tensors.len() {
        let unit = unit_of(&tensors[i]);
        let mut j = i + 1;
        while j < tensors.len() && unit.is_some() && unit_of(&tensors[j]) == unit {
            j += 1;
        }
        let bytes: u64 = tensors[i..j].iter().map(|t| t.len).sum();
        if !cur.is_empty() && cur_bytes + bytes > shard_size {
            groups.push(std::mem::take(&mut cur));
            cur_bytes = 0;
        }
        cur.extend(tensors[i..j].iter().cloned());
        cur_bytes += bytes;
        i = j;
    }
    if !cur.is_empty() {
        groups.push(cur);
    }
    groups
        .into_iter()
        .enumerate()
        .map(|(n, tensors)| {
            let entries: Vec<HeaderEntry> = tensors
                .iter()
                .map(|t| HeaderEntry {
                    name: &t.name,
                    dtype: t.dtype,
                    shape: &t.shape,
                    len: t.len,
                })
                .collect();
            let header = header_bytes(&entries)
                .map_err(|e| EngineError::io("building a safetensors header", e))?;
            let data: u64 = tensors.iter().map(|t| t.len).sum();
            Ok(Shard {
                name: format!("out-{n:05}.safetensors"),
                bytes: header.len() as u64 + data,
                header,
                tensors,
            })
        })
        .collect()
}

/// The files written beside the shards, as (name, bytes), from the GGUF's metadata.
fn meta_files(m: &GgufModel, from: &Path) -> Result<Vec<(String, Vec<u8>)>, EngineError> {
    let pretty = |v: &Value| serde_json::to_string_pretty(v).expect("JSON serializes") + "\n";
    let mut out = vec![
        ("config.json".to_string(), pretty(&config::config_json(m)?)),
        (
            "tokenizer.json".to_string(),
            tokenizer::tokenizer_json(m)?.to_string(),
        ),
    ];
    let f = crate::gguf::snap::files(from)?;
    let (bos, eos) = match &f.template {
        Some((source, bos, eos)) => {
            out.push(("chat_template.jinja".to_string(), source.clone()));
            (bos.clone(), eos.clone())
        }
        None => (String::new(), String::new()),
    };
    out.push((
        "tokenizer_config.json".to_string(),
        pretty(&json!({"bos_token": bos, "eos_token": eos})),
    ));
    Ok(out.into_iter().map(|(n, s)| (n, s.into_bytes())).collect())
}

/// What is recorded and compared on a rerun: the source's files and the shard size.
fn params(m: &GgufModel, shard_size: u64) -> Value {
    let files: Vec<Value> = m
        .parts
        .iter()
        .map(|p| {
            json!({
                "name": p.path().file_name().map(|n| n.to_string_lossy().into_owned()),
                "bytes": p.bytes().len(),
            })
        })
        .collect();
    json!({
        "layout": LAYOUT_VERSION,
        "from": "gguf",
        "source_files": files,
        "shard_size": shard_size,
    })
}

/// Writes `s` to `path`: its header then each tensor's bytes, read from the GGUF with
/// positional reads through one buffer (not its memory map, whose pages would count as this
/// process's memory for the whole model), synced; returns its size, hash and the checksum of
/// each tensor.
fn write_shard(
    m: &GgufModel,
    s: &Shard,
    path: &Path,
) -> Result<crate::convert::manifest::Found, EngineError> {
    use std::os::unix::fs::FileExt;
    let ctx = |what: &str| format!("{what} {}", path.display());
    let file = File::create(path).map_err(|e| EngineError::io(ctx("creating"), e))?;
    let mut w = std::io::BufWriter::with_capacity(8 << 20, file);
    let mut h = Hasher::default();
    h.update(&s.header);
    w.write_all(&s.header)
        .map_err(|e| EngineError::io(ctx("writing"), e))?;
    let mut sources: Vec<Option<File>> = (0..m.parts.len()).map(|_| None).collect();
    let mut buf = vec![0u8; 8 << 20];
    let mut sums = Vec::with_capacity(s.tensors.len());
    for t in &s.tensors {
        let src = m.parts[t.file].path();
        let read_err = |e| EngineError::io(format!("reading {}", src.display()), e);
        if sources[t.file].is_none() {
            sources[t.file] = Some(File::open(src).map_err(read_err)?);
        }
        let f = sources[t.file].as_ref().expect("opened just above");
        let mut th = TensorHasher::default();
        let mut done = 0u64;
        while done < t.len {
            let n = (t.len - done).min(buf.len() as u64) as usize;
            f.read_exact_at(&mut buf[..n], t.offset + done)
                .map_err(read_err)?;
            th.update(&buf[..n]);
            h.update(&buf[..n]);
            w.write_all(&buf[..n])
                .map_err(|e| EngineError::io(ctx("writing"), e))?;
            done += n as u64;
        }
        sums.push((t.name.clone(), th.finish()));
    }
    let file = w
        .into_inner()
        .map_err(|e| EngineError::io(ctx("writing"), e.into_error()))?;
    file.sync_all()
        .map_err(|e| EngineError::io(ctx("syncing"), e))?;
    Ok(crate::convert::manifest::Found {
        bytes: s.bytes,
        hash: h.finish(),
        tensors: sums,
    })
}

fn gb(b: u64) -> f64 {
    b as f64 / 1e9
}

/// The conversion of `a.from`, a `.gguf` file.
pub fn run(a: &ConvertArgs) -> Result<ExitCode, EngineError> {
    let m = GgufModel::open(&a.from)?;
    config::arch(&m)?;
    let tensors = names::tensors(&m)?;
    // What `run` checks on a model (config, tokenizer against the vocabulary, template),
    // checked on the GGUF itself: the folder it becomes says the same.
    crate::engine::ModelFiles::check(std::slice::from_ref(&a.from)).map_err(|e| {
        EngineError::Usage(format!(
            "--from {}: {e}\n  run and serve would refuse it; nothing was converted",
            a.from.display()
        ))
    })?;
    let meta = meta_files(&m, &a.from)?;
    let shards = plan(tensors, a.shard_size)?;
    let params = params(&m, a.shard_size);
    let prior = crate::cmd::convert::check_out_dir(&a.to, &params)?;
    let recorded = |s: &Shard| {
        prior
            .as_ref()
            .and_then(|r| r.shards.get(&s.name))
            .is_some_and(|d| d.bytes == s.bytes)
    };
    let total: u64 = shards.iter().map(|s| s.bytes).sum();
    let to_write: u64 = shards
        .iter()
        .filter(|s| !recorded(s))
        .map(|s| s.bytes)
        .sum();
    let extra = meta.iter().map(|(_, b)| b.len() as u64).sum::<u64>() + 1_000_000;
    let free = crate::cmd::convert::free_bytes(&a.to)?;
    crate::elog!(
        "[PLAN] {} -> {} | every tensor in its own type (GGUF blocks kept, experts one read \
         each) | {} tensors in {} shards, {:.3} GB | {} shard(s) done, {:.3} GB to write, \
         {:.3} GB free",
        a.from.display(),
        a.to.display(),
        shards.iter().map(|s| s.tensors.len()).sum::<usize>(),
        shards.len(),
        gb(total),
        shards.iter().filter(|s| recorded(s)).count(),
        gb(to_write),
        gb(free)
    );
    if to_write + extra > free {
        return Err(EngineError::Usage(format!(
            "--to {}: the conversion needs {:.3} GB more but the disk has {:.3} GB free; \
             nothing was written (free space, or choose another --to)",
            a.to.display(),
            gb(to_write + extra),
            gb(free)
        )));
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
    let mut record = prior.unwrap_or_else(|| Manifest::new(params.clone()));
    record.complete = false;
    record.save(&a.to)?;
    let sums_path = super::convert::drop_checksums(&a.to)?;
    let mut sums = Checksums::default();
    let (mut written, mut kept) = (0usize, 0usize);
    let started = std::time::Instant::now();
    for s in &shards {
        let path = a.to.join(&s.name);
        // A recorded shard whose file still hashes as recorded is kept.
        if let Some(rec) = record.shards.get(&s.name).filter(|d| d.bytes == s.bytes) {
            let found = hash_shard(&path, s.header.len() as u64, &s.entries())?;
            if let Some(f) = found.filter(|f| f.bytes == rec.bytes && f.hash == rec.hash) {
                for (name, h) in f.tensors {
                    sums.insert(name, s.name.clone(), h);
                }
                kept += 1;
                continue;
            }
        }
        record.shards.remove(&s.name);
        let partial = a.to.join(format!("{}.partial", s.name));
        let found = write_shard(&m, s, &partial)?;
        std::fs::rename(&partial, &path)
            .map_err(|e| EngineError::io(format!("renaming {}", partial.display()), e))?;
        record.shards.insert(
            s.name.clone(),
            Done {
                bytes: found.bytes,
                hash: found.hash,
                inputs: None,
            },
        );
        record.save(&a.to)?;
        for (name, h) in found.tensors {
            sums.insert(name, s.name.clone(), h);
        }
        written += 1;
    }
    for (name, bytes) in &meta {
        write_atomic(&a.to.join(name), bytes)?;
    }
    let mut map = serde_json::Map::new();
    for s in &shards {
        for t in &s.tensors {
            map.insert(t.name.clone(), Value::String(s.name.clone()));
        }
    }
    let data: u64 = shards.iter().map(|s| s.bytes - s.header.len() as u64).sum();
    let index = json!({"metadata": {"total_size": data}, "weight_map": map});
    let text = serde_json::to_string_pretty(&index).expect("JSON serializes") + "\n";
    write_atomic(&a.to.join(INDEX), text.as_bytes())?;
    write_atomic(&sums_path, sums.to_json().as_bytes())?;
    record.complete = true;
    record.save(&a.to)?;
    let secs = started.elapsed().as_secs_f64();
    crate::elog!(
        "[DONE] {}: {written} shard(s) written ({kept} kept), {:.3} GB in {secs:.1} s; {}",
        a.to.display(),
        gb(total),
        meta.iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    drop(lock);
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::Dtype;

    fn t(name: &str, len: u64) -> TensorInfo {
        TensorInfo {
            name: name.into(),
            dtype: Dtype::F32,
            shape: vec![len as usize / 4],
            file: 0,
            offset: 0,
            len,
        }
    }

    #[test]
    fn an_expert_is_one_run_and_never_split_between_shards() {
        let mut ts = vec![t("lm_head.weight", 64), t("model.embed_tokens.weight", 64)];
        for e in [1, 0] {
            for p in ["down_proj", "up_proj", "gate_proj"] {
                ts.push(t(&format!("model.layers.0.mlp.experts.{e}.{p}.weight"), 40));
            }
        }
        ts.push(t("model.layers.0.mlp.gate.weight", 8));
        // 100 bytes a shard: the embedding, the router and expert 0 (120 B) cannot share.
        let shards = plan(ts, 100).unwrap();
        let names: Vec<Vec<&str>> = shards
            .iter()
            .map(|s| s.tensors.iter().map(|t| t.name.as_str()).collect())
            .collect();
        assert_eq!(
            names,
            vec![
                vec![
                    "model.embed_tokens.weight",
                    "model.layers.0.mlp.gate.weight"
                ],
                vec![
                    "model.layers.0.mlp.experts.0.gate_proj.weight",
                    "model.layers.0.mlp.experts.0.up_proj.weight",
                    "model.layers.0.mlp.experts.0.down_proj.weight",
                ],
                vec![
                    "model.layers.0.mlp.experts.1.gate_proj.weight",
                    "model.layers.0.mlp.experts.1.up_proj.weight",
                    "model.layers.0.mlp.experts.1.down_proj.weight",
                ],
                vec!["lm_head.weight"],
            ]
        );
        assert_eq!(shards[1].name, "out-00001.safetensors");
        assert_eq!(shards[1].bytes, shards[1].header.len() as u64 + 120);
    }
}
