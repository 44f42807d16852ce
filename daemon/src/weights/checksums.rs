//! Per-tensor checksums of a converted container: `colibri-checksums.json` beside the shards,
//! written by `colibri convert`, read by `colibri verify` and by `--verify-reads`.
//!
//! A sidecar rather than a field in each shard's header: upstream's reader (and any other
//! safetensors reader) only opens `*.safetensors` files, so it ignores the file entirely, and
//! a shard's bytes stay exactly what they were before checksums existed. The layout, one
//! tensor a line so a diff of two folders reads well:
//!
//! ```text
//! {"format": "colibri-checksums", "version": 1, "hash": "xxh3-64", "tensors": {
//!   "<tensor name>": {"shard": "out-00000.safetensors", "xxh3": "<16 hex digits>"},
//!   ...
//! }}
//! ```
//!
//! The hash is xxh3-64 (seed 0) of the tensor's data bytes as stored (its `data_offsets`
//! range), not of the header: a damaged header is refused when the shard is opened. Keys are
//! sorted, so the same container always gives the same file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use xxhash_rust::xxh3::Xxh3;

use super::WeightsError;

pub const FILE: &str = "colibri-checksums.json";
const FORMAT: &str = "colibri-checksums";
const VERSION: u64 = 1;
const HASH: &str = "xxh3-64";

/// A tensor's recorded checksum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// File name of the shard that holds the tensor.
    pub shard: String,
    pub xxh3: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Checksums {
    pub tensors: BTreeMap<String, Entry>,
    /// The files they were read from (empty for a set being built).
    pub files: Vec<PathBuf>,
}

/// xxh3-64 of `bytes`, the checksum's definition.
pub fn hash(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// The same hash over bytes that arrive in pieces.
#[derive(Clone, Default)]
pub struct Hasher(Xxh3);

impl Hasher {
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub fn finish(&self) -> u64 {
        self.0.digest()
    }
}

pub fn hex(h: u64) -> String {
    format!("{h:016x}")
}

impl Checksums {
    pub fn insert(&mut self, tensor: String, shard: String, xxh3: u64) {
        self.tensors.insert(tensor, Entry { shard, xxh3 });
    }

    pub fn get(&self, tensor: &str) -> Option<&Entry> {
        self.tensors.get(tensor)
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The file's bytes (see the module's layout).
    pub fn to_json(&self) -> String {
        let mut out = format!(
            "{{\"format\": \"{FORMAT}\", \"version\": {VERSION}, \"hash\": \"{HASH}\", \
             \"tensors\": {{\n"
        );
        let n = self.tensors.len();
        for (i, (name, e)) in self.tensors.iter().enumerate() {
            let q = |s: &str| Value::String(s.to_string()).to_string();
            out.push_str(&format!(
                "  {}: {{\"shard\": {}, \"xxh3\": \"{}\"}}{}\n",
                q(name),
                q(&e.shard),
                hex(e.xxh3),
                if i + 1 < n { "," } else { "" }
            ));
        }
        out.push_str("}}\n");
        out
    }

    /// Parses the file at `path` (its bytes `text`).
    pub fn parse(text: &[u8], path: &Path) -> Result<Checksums, WeightsError> {
        let bad = |reason: String| WeightsError::Checksums {
            file: path.to_path_buf(),
            reason,
        };
        let v: Value =
            serde_json::from_slice(text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        if v.get("format").and_then(Value::as_str) != Some(FORMAT) {
            return Err(bad(format!("no \"format\": \"{FORMAT}\"")));
        }
        match v.get("version").and_then(Value::as_u64) {
            Some(VERSION) => {}
            other => {
                return Err(bad(format!(
                    "version {other:?}: this colibri reads version {VERSION} (a newer colibri \
                     wrote it?)"
                )))
            }
        }
        if v.get("hash").and_then(Value::as_str) != Some(HASH) {
            return Err(bad(format!("\"hash\" is not \"{HASH}\"")));
        }
        let obj = v
            .get("tensors")
            .and_then(Value::as_object)
            .ok_or_else(|| bad("no \"tensors\" object".into()))?;
        let mut tensors = BTreeMap::new();
        for (name, e) in obj {
            let shard = e.get("shard").and_then(Value::as_str);
            let h = e
                .get("xxh3")
                .and_then(Value::as_str)
                .filter(|h| h.len() == 16)
                .and_then(|h| u64::from_str_radix(h, 16).ok());
            match (shard, h) {
                (Some(shard), Some(xxh3)) => {
                    tensors.insert(
                        name.clone(),
                        Entry {
                            shard: shard.to_string(),
                            xxh3,
                        },
                    );
                }
                _ => return Err(bad(format!("the entry of tensor {name:?} is malformed"))),
            }
        }
        Ok(Checksums {
            tensors,
            files: vec![path.to_path_buf()],
        })
    }

    /// The checksums of a model on the search path `dirs`: every directory's file, merged
    /// (a tensor named in two, the first directory's, as with the shards); `None` when no
    /// directory has one.
    pub fn load(dirs: &[PathBuf]) -> Result<Option<Checksums>, WeightsError> {
        let mut all: Option<Checksums> = None;
        for d in dirs {
            let path = d.join(FILE);
            let text = match std::fs::read(&path) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(source) => return Err(WeightsError::Io { path, source }),
            };
            let c = Checksums::parse(&text, &path)?;
            match &mut all {
                None => all = Some(c),
                Some(a) => {
                    for (k, v) in c.tensors {
                        a.tensors.entry(k).or_insert(v);
                    }
                    a.files.extend(c.files);
                }
            }
        }
        Ok(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let mut c = Checksums::default();
        c.insert("b.weight".into(), "out-00001.safetensors".into(), 7);
        c.insert("a \"q\"".into(), "out-00000.safetensors".into(), u64::MAX);
        let text = c.to_json();
        let p = Path::new("x/colibri-checksums.json");
        let back = Checksums::parse(text.as_bytes(), p).unwrap();
        assert_eq!(back.tensors, c.tensors);
        assert_eq!(back.to_json(), text);
        for bad in [
            "{}",
            "[1]",
            &text.replace("\"version\": 1", "\"version\": 2"),
            &text.replace("0000000000000007", "7"),
        ] {
            let e = Checksums::parse(bad.as_bytes(), p).unwrap_err().to_string();
            assert!(e.starts_with("x/colibri-checksums.json: "), "{e}");
        }
        let mut h = Hasher::default();
        h.update(b"hello ");
        h.update(b"world");
        assert_eq!(h.finish(), hash(b"hello world"));
        assert_ne!(hash(b"hello world"), hash(b"hello worle"));
    }
}
