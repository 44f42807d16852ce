//! What identifies a source shard: xxh3-64 of its safetensors header (the 8-byte length and
//! the JSON) and of its data section, recorded in the conversion's manifest. Names and sizes
//! alone let a resumed conversion keep output made from bytes that have since changed (a
//! checkpoint re-downloaded in place, a fine-tune written over its base); the content hash
//! makes it rewrite exactly the output shards that read a changed file.
//!
//! Hashing every byte costs one extra pass over the source per run, at the rate the source
//! is read: xxh3 itself hashes 28-29 GB/s on one core of this project's 2-core machine (1 GiB
//! buffer), far above any disk. Measured on a 6.64 GB synthetic BF16 checkpoint: the pass ran
//! at 11.5 GB/s with the source in the page cache (0.6 s beside a 6.6 s conversion) and at
//! 2.4-3.5 GB/s with its pages dropped (2-3 s beside 8-10 s), where the conversion itself
//! reads at 0.7-1.0 GB/s.

use std::io::Read;
use std::time::Instant;

use serde_json::{json, Value};

use super::plan::{Encode, Shard};
use crate::error::EngineError;
use crate::weights::checksums::Hasher;
use crate::weights::{Dtype, ShardSet};

/// One source file's identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceId {
    pub name: String,
    pub bytes: u64,
    pub header: u64,
    pub data: u64,
}

impl SourceId {
    pub fn to_json(&self) -> Value {
        json!({
            "bytes": self.bytes,
            "header": format!("{:016x}", self.header),
            "data": format!("{:016x}", self.data),
        })
    }

    pub fn from_json(name: &str, v: &Value) -> Option<SourceId> {
        let h = |k: &str| {
            v.get(k)
                .and_then(Value::as_str)
                .and_then(|s| u64::from_str_radix(s, 16).ok())
        };
        Some(SourceId {
            name: name.to_string(),
            bytes: v.get("bytes").and_then(Value::as_u64)?,
            header: h("header")?,
            data: h("data")?,
        })
    }
}

/// Hashes every file of `src` (in the set's file order), with a `[SOURCE]` line giving the
/// rate.
pub fn identify(src: &ShardSet) -> Result<Vec<SourceId>, EngineError> {
    let t0 = Instant::now();
    let mut buf = vec![0u8; 8 << 20];
    let mut ids = Vec::with_capacity(src.num_files());
    let mut total = 0u64;
    for i in 0..src.num_files() {
        let path = src.file_path(i);
        let ctx = |what: &str| format!("{what} {}", path.display());
        let mut f = std::fs::File::open(path).map_err(|e| EngineError::io(ctx("opening"), e))?;
        let mut len = [0u8; 8];
        f.read_exact(&mut len)
            .map_err(|e| EngineError::io(ctx("reading the header of"), e))?;
        // Opening the set checked that the header length fits the file.
        let mut left = 8 + u64::from_le_bytes(len);
        let (mut head, mut data) = (Hasher::default(), Hasher::default());
        head.update(&len);
        left -= 8;
        let mut bytes = 8u64;
        loop {
            let n = f
                .read(&mut buf)
                .map_err(|e| EngineError::io(ctx("reading"), e))?;
            if n == 0 {
                break;
            }
            let chunk = &buf[..n];
            let h = (left.min(n as u64)) as usize;
            head.update(&chunk[..h]);
            data.update(&chunk[h..]);
            left -= h as u64;
            bytes += n as u64;
        }
        total += bytes;
        ids.push(SourceId {
            name: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            bytes,
            header: head.finish(),
            data: data.finish(),
        });
    }
    let secs = t0.elapsed().as_secs_f64();
    crate::elog!(
        "[SOURCE] {} file(s) identified by content (xxh3 of header and data): {:.3} GB in \
         {:.1} s ({:.0} MB/s)",
        ids.len(),
        total as f64 / 1e9,
        secs,
        total as f64 / 1e6 / secs.max(1e-9)
    );
    Ok(ids)
}

/// What an output shard is made from: its planned header (its tensors, formats and layout)
/// and the identity of every source file it reads, FP8 block scales included. Two runs
/// that give a shard the same value write it byte for byte the same.
pub fn inputs(shard: &Shard, src: &ShardSet, ids: &[SourceId]) -> u64 {
    let mut files: Vec<usize> = Vec::new();
    for t in &shard.tensors {
        files.push(t.source.file);
        if t.source.dtype == Dtype::F8E4M3 && t.encode != Encode::Copy {
            // The plan checked the scales exist; a missing one only leaves them out here.
            if let Ok(s) = src.fp8_scale_info(&t.source.name) {
                files.push(s.file);
            }
        }
    }
    files.sort_unstable();
    files.dedup();
    let mut h = Hasher::default();
    h.update(&shard.header);
    for f in files {
        if let Some(id) = ids.get(f) {
            h.update(id.name.as_bytes());
            h.update(&[0]);
            for v in [id.bytes, id.header, id.data] {
                h.update(&v.to_le_bytes());
            }
        }
    }
    h.finish()
}
