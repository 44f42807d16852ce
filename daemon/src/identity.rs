//! What made a saved conversation: the model's identity (family, tensor index, a fingerprint
//! of every weight byte) and the compute formats it ran in. `.coli_kv` records it in its
//! header and `.coli_usage` the weights' part, so state is never resumed under other weights
//! or other formats (CONTRACT.md §4).
//!
//! The content fingerprint hashes every shard whole (xxh3-64): the only check that changes
//! when any weight changes. That costs one read of the model, so each shard's hash is cached
//! in the state folder (`.coli_fingerprint`) under its path, size, mtime and inode, and only a
//! shard whose metadata moved is hashed again.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::{json, Value};
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use crate::weights::ShardSet;

/// The fingerprint cache's name in the state folder.
pub const CACHE_FILE: &str = ".coli_fingerprint";

/// The four parts a saved conversation is bound to, each an xxh3-64.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ModelIdentity {
    /// The architecture (`model_type`).
    pub family: u64,
    /// Every tensor's name, dtype and shape.
    pub index: u64,
    /// Every byte of every shard.
    pub content: u64,
    /// The compute formats (expert and dense bits, activations).
    pub formats: u64,
}

impl ModelIdentity {
    /// The identity of the model in `shards`, of architecture `family`, run in `formats` (a
    /// description whose text changes whenever the numbers computed would). Shard hashes
    /// come from `cache_dir`'s cache when their metadata still matches, and are written back.
    pub fn compute(
        family: &str,
        shards: &ShardSet,
        formats: &str,
        cache_dir: Option<&Path>,
    ) -> std::io::Result<ModelIdentity> {
        Ok(ModelIdentity {
            family: xxh3_64(family.as_bytes()),
            index: index_hash(shards),
            content: content_fingerprint(shards, cache_dir)?,
            formats: xxh3_64(formats.as_bytes()),
        })
    }

    /// The 32 bytes `.coli_kv` stores (little-endian, in field order).
    pub fn to_bytes(self) -> [u8; 32] {
        let mut b = [0u8; 32];
        for (i, v) in [self.family, self.index, self.content, self.formats]
            .iter()
            .enumerate()
        {
            b[8 * i..8 * i + 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    pub fn from_bytes(b: &[u8; 32]) -> ModelIdentity {
        let at = |i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes"));
        ModelIdentity {
            family: at(0),
            index: at(1),
            content: at(2),
            formats: at(3),
        }
    }

    /// Why `saved` is not this identity, in the words stderr uses (`None`: the same).
    pub fn mismatch(&self, saved: &ModelIdentity) -> Option<&'static str> {
        if self.family != saved.family {
            Some("saved by another model family")
        } else if self.index != saved.index {
            Some("saved by another model (its tensors differ)")
        } else if self.content != saved.content {
            Some("saved under other weights (the weights' fingerprint differs)")
        } else if self.formats != saved.formats {
            Some("saved with other compute formats (--expert-bits, --dense-bits or activations)")
        } else {
            None
        }
    }
}

/// Every tensor's name, dtype and shape, in name order.
fn index_hash(shards: &ShardSet) -> u64 {
    let mut h = Xxh3::new();
    for name in shards.names() {
        let Some(t) = shards.get(name) else { continue };
        h.update(name.as_bytes());
        h.update(&[0]);
        h.update(t.dtype.safetensors_name().as_bytes());
        h.update(&[0]);
        h.update(&(t.shape.len() as u64).to_le_bytes());
        for &d in &t.shape {
            h.update(&(d as u64).to_le_bytes());
        }
    }
    h.digest()
}

/// A shard as the cache knows it: the hash holds while the metadata does.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ShardStamp {
    size: u64,
    mtime_ns: i128,
    ino: u64,
    dev: u64,
}

impl ShardStamp {
    fn of(path: &Path) -> std::io::Result<ShardStamp> {
        let m = std::fs::metadata(path)?;
        Ok(ShardStamp {
            size: m.len(),
            mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
            ino: m.ino(),
            dev: m.dev(),
        })
    }
}

/// The hash of every shard's bytes, combined in shard-name order (the order the set opened
/// them); the per-shard hashes are cached in `cache_dir`.
fn content_fingerprint(shards: &ShardSet, cache_dir: Option<&Path>) -> std::io::Result<u64> {
    let cache_path = cache_dir.map(|d| d.join(CACHE_FILE));
    let mut cache = cache_path.as_deref().map(read_cache).unwrap_or_default();
    let paths: Vec<PathBuf> = (0..shards.num_files())
        .map(|i| {
            let p = shards.file_path(i);
            p.canonicalize().unwrap_or_else(|_| p.to_path_buf())
        })
        .collect();
    let mut stamps = Vec::with_capacity(paths.len());
    let mut todo = Vec::new();
    for (i, p) in paths.iter().enumerate() {
        let stamp = ShardStamp::of(p)?;
        let key = p.to_string_lossy().into_owned();
        if cache.get(&key).is_none_or(|(s, _)| *s != stamp) {
            todo.push(i);
        }
        stamps.push(stamp);
    }
    if !todo.is_empty() {
        let total: u64 = todo.iter().map(|&i| stamps[i].size).sum();
        let t0 = Instant::now();
        let mut progress = Progress::new(total);
        for &i in &todo {
            let hash = hash_file(&paths[i], &mut progress)?;
            // The file must not have moved while it was read, or the hash names neither state.
            let after = ShardStamp::of(&paths[i])?;
            if after != stamps[i] {
                return Err(std::io::Error::other(format!(
                    "{} changed while its fingerprint was taken",
                    paths[i].display()
                )));
            }
            cache.insert(
                paths[i].to_string_lossy().into_owned(),
                (stamps[i].clone(), hash),
            );
        }
        let secs = t0.elapsed().as_secs_f64();
        crate::elog!(
            "[KV] weights fingerprinted: {} of {} shards, {:.2} GB in {secs:.1}s (cached in {})",
            todo.len(),
            paths.len(),
            total as f64 / 1e9,
            cache_path
                .as_deref()
                .map_or("nowhere: no state folder".into(), |p| p
                    .display()
                    .to_string()),
        );
        if let Some(p) = &cache_path {
            // Only this model's shards are kept: a cache never grows past one model.
            let keep: BTreeMap<String, (ShardStamp, u64)> = paths
                .iter()
                .filter_map(|p| {
                    let k = p.to_string_lossy().into_owned();
                    cache.get(&k).map(|v| (k, v.clone()))
                })
                .collect();
            if let Err(e) = write_cache(p, &keep) {
                crate::elog!(
                    "[KV] cannot cache the weights' fingerprint in {}: {e}",
                    p.display()
                );
            }
        }
    }
    let mut h = Xxh3::new();
    for p in &paths {
        let (_, hash) = cache[&p.to_string_lossy().into_owned()];
        h.update(&hash.to_le_bytes());
    }
    Ok(h.digest())
}

/// Stderr progress for a long fingerprint: a line every 10% once it has run two seconds.
struct Progress {
    total: u64,
    done: u64,
    next_tenth: u64,
    t0: Instant,
}

impl Progress {
    fn new(total: u64) -> Progress {
        Progress {
            total,
            done: 0,
            next_tenth: 1,
            t0: Instant::now(),
        }
    }

    fn add(&mut self, n: u64) {
        self.done += n;
        if self.total == 0 || self.done * 10 < self.next_tenth * self.total {
            return;
        }
        self.next_tenth = self.done * 10 / self.total + 1;
        if self.t0.elapsed().as_secs_f64() >= 2.0 {
            crate::elog!(
                "[KV] fingerprinting the weights (once per model): {:.2}/{:.2} GB",
                self.done as f64 / 1e9,
                self.total as f64 / 1e9
            );
        }
    }
}

fn hash_file(path: &Path, progress: &mut Progress) -> std::io::Result<u64> {
    let mut f = File::open(path)?;
    let mut h = Xxh3::new();
    let mut buf = vec![0u8; 8 << 20];
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        h.update(&buf[..n]);
        progress.add(n as u64);
    }
    Ok(h.digest())
}

/// The cache as written: `{"version": 1, "shards": {path: {size, mtime_ns, ino, dev, xxh3}}}`.
/// Anything unreadable is an empty cache (it only costs a re-hash).
fn read_cache(path: &Path) -> BTreeMap<String, (ShardStamp, u64)> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return BTreeMap::new();
    };
    let Ok(v) = serde_json::from_str::<Value>(&text) else {
        return BTreeMap::new();
    };
    if v["version"] != 1 {
        return BTreeMap::new();
    }
    let mut out = BTreeMap::new();
    if let Some(shards) = v["shards"].as_object() {
        for (k, s) in shards {
            let stamp = (|| {
                Some(ShardStamp {
                    size: s["size"].as_u64()?,
                    mtime_ns: s["mtime_ns"].as_str()?.parse().ok()?,
                    ino: s["ino"].as_u64()?,
                    dev: s["dev"].as_u64()?,
                })
            })();
            let hash = s["xxh3"]
                .as_str()
                .and_then(|h| u64::from_str_radix(h, 16).ok());
            if let (Some(stamp), Some(hash)) = (stamp, hash) {
                out.insert(k.clone(), (stamp, hash));
            }
        }
    }
    out
}

fn write_cache(path: &Path, cache: &BTreeMap<String, (ShardStamp, u64)>) -> std::io::Result<()> {
    let shards: serde_json::Map<String, Value> = cache
        .iter()
        .map(|(k, (s, h))| {
            (
                k.clone(),
                json!({
                    "size": s.size,
                    "mtime_ns": s.mtime_ns.to_string(),
                    "ino": s.ino,
                    "dev": s.dev,
                    "xxh3": format!("{h:016x}"),
                }),
            )
        })
        .collect();
    let text = serde_json::to_string_pretty(&json!({"version": 1, "shards": shards}))?;
    crate::durable::replace_file(path, text.as_bytes())
}
