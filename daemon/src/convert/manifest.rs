//! The record a conversion keeps in its output folder, `.colibri-convert.json`: the
//! parameters it was started with, the identity of every source file (`source.rs`) and every
//! shard finished so far (size, content hash, and what it was made from).
//!
//! It makes a conversion resumable and refuses a different one into the same folder: a rerun
//! with the same parameters keeps the shards whose size and hash still match and redoes the
//! rest (and the shards whose sources changed since: `inputs`); a rerun with other
//! parameters is refused before anything is touched. The file is
//! replaced atomically (write a temporary, fsync, rename), so a kill leaves the old record or
//! the new one, never half of one.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::source::SourceId;
use crate::error::EngineError;
use crate::weights::checksums::Hasher as TensorHasher;

pub const FILE: &str = ".colibri-convert.json";

/// A finished shard as recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Done {
    pub bytes: u64,
    pub hash: u64,
    /// What it was made from ([`super::source::inputs`]); `None` in a record written by a
    /// colibri that did not identify its sources, whose shards are therefore redone.
    pub inputs: Option<u64>,
}

#[derive(Clone, Debug)]
pub struct Manifest {
    pub params: Value,
    /// The source files as identified when the record was last written.
    pub sources: Vec<SourceId>,
    pub shards: BTreeMap<String, Done>,
    pub complete: bool,
}

impl Manifest {
    pub fn new(params: Value) -> Manifest {
        Manifest {
            params,
            sources: Vec::new(),
            shards: BTreeMap::new(),
            complete: false,
        }
    }

    /// The record in `dir`, if there is one.
    pub fn load(dir: &Path) -> Result<Option<Manifest>, EngineError> {
        let path = dir.join(FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(EngineError::io(format!("reading {}", path.display()), e)),
        };
        let bad = |why: &str| {
            EngineError::Usage(format!(
                "{}: {why}; it is not a record this version of colibri convert wrote \
                 (remove the folder's contents to start over)",
                path.display()
            ))
        };
        let v: Value = serde_json::from_str(&text).map_err(|_| bad("not valid JSON"))?;
        let params = v
            .get("params")
            .cloned()
            .ok_or_else(|| bad("no \"params\""))?;
        let mut shards = BTreeMap::new();
        if let Some(obj) = v.get("shards").and_then(Value::as_object) {
            for (name, d) in obj {
                let bytes = d.get("bytes").and_then(Value::as_u64);
                let hash = d
                    .get("hash")
                    .and_then(Value::as_str)
                    .and_then(|h| u64::from_str_radix(h, 16).ok());
                let inputs = match d.get("inputs") {
                    None => Some(None),
                    Some(i) => i
                        .as_str()
                        .and_then(|h| u64::from_str_radix(h, 16).ok())
                        .map(Some),
                };
                match (bytes, hash, inputs) {
                    (Some(bytes), Some(hash), Some(inputs)) => {
                        shards.insert(
                            name.clone(),
                            Done {
                                bytes,
                                hash,
                                inputs,
                            },
                        );
                    }
                    _ => return Err(bad(&format!("shard entry {name:?} is malformed"))),
                }
            }
        }
        let mut sources = Vec::new();
        if let Some(obj) = v.get("sources").and_then(Value::as_object) {
            for (name, s) in obj {
                sources.push(
                    SourceId::from_json(name, s)
                        .ok_or_else(|| bad(&format!("source entry {name:?} is malformed")))?,
                );
            }
        }
        let complete = v.get("complete").and_then(Value::as_bool).unwrap_or(false);
        Ok(Some(Manifest {
            params,
            sources,
            shards,
            complete,
        }))
    }

    /// Writes the record into `dir`, atomically.
    pub fn save(&self, dir: &Path) -> Result<(), EngineError> {
        let shards: serde_json::Map<String, Value> = self
            .shards
            .iter()
            .map(|(n, d)| {
                let mut e = json!({"bytes": d.bytes, "hash": format!("{:016x}", d.hash)});
                if let Some(i) = d.inputs {
                    e["inputs"] = Value::String(format!("{i:016x}"));
                }
                (n.clone(), e)
            })
            .collect();
        let sources: serde_json::Map<String, Value> = self
            .sources
            .iter()
            .map(|s| (s.name.clone(), s.to_json()))
            .collect();
        let v = json!({
            "params": self.params,
            "sources": sources,
            "shards": shards,
            "complete": self.complete,
        });
        let text = serde_json::to_string_pretty(&v).expect("a JSON value serializes") + "\n";
        write_atomic(&dir.join(FILE), text.as_bytes())
    }
}

/// Replaces `path` with `bytes`: a temporary beside it, fsynced, then renamed over it.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), EngineError> {
    let tmp = tmp_path(path);
    let ctx = |what: &str| format!("{what} {}", tmp.display());
    let mut f = std::fs::File::create(&tmp).map_err(|e| EngineError::io(ctx("creating"), e))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| EngineError::io(ctx("writing"), e))?;
    std::fs::rename(&tmp, path)
        .map_err(|e| EngineError::io(format!("renaming {} into place", tmp.display()), e))
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

/// A 64-bit content hash for telling a finished shard from a torn or altered one (not a
/// cryptographic digest). Four independent lanes over 8-byte words keep it at memory speed;
/// the definition is fixed here, so a record stays valid across builds.
#[derive(Clone, Debug)]
pub struct Hasher {
    lanes: [u64; 4],
    tail: Vec<u8>,
    len: u64,
}

const K: [u64; 4] = [
    0x9E37_79B9_7F4A_7C15,
    0xC2B2_AE3D_27D4_EB4F,
    0x1656_67B1_9E37_79F9,
    0x85EB_CA77_C2B2_AE63,
];

impl Default for Hasher {
    fn default() -> Self {
        Hasher {
            lanes: K,
            tail: Vec::with_capacity(32),
            len: 0,
        }
    }
}

impl Hasher {
    pub fn update(&mut self, mut bytes: &[u8]) {
        self.len += bytes.len() as u64;
        if !self.tail.is_empty() {
            let take = (32 - self.tail.len()).min(bytes.len());
            self.tail.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.tail.len() == 32 {
                let block = std::mem::take(&mut self.tail);
                self.blocks(&block);
                self.tail = block;
                self.tail.clear();
            }
        }
        let whole = bytes.len() / 32 * 32;
        self.blocks(&bytes[..whole]);
        self.tail.extend_from_slice(&bytes[whole..]);
    }

    fn blocks(&mut self, bytes: &[u8]) {
        for block in bytes.chunks_exact(32) {
            for (lane, (w, k)) in self.lanes.iter_mut().zip(block.chunks_exact(8).zip(K)) {
                let w = u64::from_le_bytes(w.try_into().expect("8-byte chunk"));
                *lane = (*lane ^ w).wrapping_mul(k).rotate_left(29);
            }
        }
    }

    pub fn finish(&self) -> u64 {
        let mut h = self.len.wrapping_mul(K[0]);
        for (i, lane) in self.lanes.iter().enumerate() {
            h = (h ^ lane.wrapping_mul(K[i]))
                .rotate_left(31)
                .wrapping_mul(K[3 - i]);
        }
        for &b in &self.tail {
            h = (h ^ b as u64).wrapping_mul(K[1]);
        }
        h ^ (h >> 33)
    }
}

/// A shard file as found on disk: what its record is checked against, and the checksum of
/// each tensor (for `colibri-checksums.json`).
#[derive(Debug)]
pub struct Found {
    pub bytes: u64,
    pub hash: u64,
    /// `(name, xxh3)` of each entry of `entries`, in order.
    pub tensors: Vec<(String, u64)>,
}

/// Reads the file at `path` once: its size and hash, and the checksum of each tensor laid
/// out as `entries` (`(name, bytes)` in file order, the first at `data_start`); `None` when
/// the file does not exist. Entries past a short file's end get the hash of what is there,
/// which the size check then refuses anyway.
pub fn hash_shard(
    path: &Path,
    data_start: u64,
    entries: &[(String, u64)],
) -> Result<Option<Found>, EngineError> {
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(EngineError::io(format!("opening {}", path.display()), e)),
    };
    let mut h = Hasher::default();
    let mut buf = vec![0u8; 8 << 20];
    let mut tensors = Vec::with_capacity(entries.len());
    let mut next = entries.iter();
    let mut cur = next
        .next()
        .map(|(n, len)| (n, *len, TensorHasher::default()));
    let mut skip = data_start;
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| EngineError::io(format!("reading {}", path.display()), e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        let mut chunk = &buf[..n];
        let s = skip.min(chunk.len() as u64) as usize;
        chunk = &chunk[s..];
        skip -= s as u64;
        while let Some((name, left, th)) = cur.as_mut() {
            let take = (*left).min(chunk.len() as u64) as usize;
            th.update(&chunk[..take]);
            chunk = &chunk[take..];
            *left -= take as u64;
            if *left > 0 {
                break;
            }
            tensors.push((name.to_string(), th.finish()));
            cur = next
                .next()
                .map(|(n, len)| (n, *len, TensorHasher::default()));
        }
    }
    if let Some((name, _, th)) = cur {
        tensors.push((name.to_string(), th.finish()));
    }
    Ok(Some(Found {
        bytes: h.len,
        hash: h.finish(),
        tensors,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_does_not_depend_on_how_bytes_arrive() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + i / 3) as u8).collect();
        let mut one = Hasher::default();
        one.update(&data);
        for split in [1, 5, 31, 32, 33, 64, 999] {
            let mut two = Hasher::default();
            for c in data.chunks(split) {
                two.update(c);
            }
            assert_eq!(one.finish(), two.finish(), "split {split}");
        }
        let mut other = data.clone();
        other[500] ^= 1;
        let mut three = Hasher::default();
        three.update(&other);
        assert_ne!(one.finish(), three.finish());
        let mut short = Hasher::default();
        short.update(&data[..999]);
        assert_ne!(one.finish(), short.finish());
    }
}
