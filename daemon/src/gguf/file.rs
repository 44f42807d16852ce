//! One GGUF file (v2/v3, little-endian), memory-mapped and validated before any weight is
//! handed out.
//!
//! Layout: `GGUF` magic, u32 version, u64 tensor count, u64 key/value count, the key/values,
//! the tensor infos (name, dims in ggml order (ne[0] is the row length), type id, offset
//! relative to the data section), padding to `general.alignment` (default 32), then the data.
//! Every count read from the header is bounded by the bytes left in the file before anything
//! is allocated for it, so a hostile header cannot make the reader allocate more than the
//! file's own size.

#![deny(clippy::undocumented_unsafe_blocks)]

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::meta::{parse_kvs, Cursor, GgufValue};
use super::types::GgmlType;
use super::GgufError;

/// The alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's `GGML_MAX_DIMS`: no tensor has more dimensions.
const MAX_DIMS: u32 = 4;

/// One tensor's entry in the table: where its bytes are and how to read them.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions in ggml order: `ne[0]` is the row length (the fastest-moving index).
    pub ne: Vec<u64>,
    pub ty: GgmlType,
    /// Absolute byte offset of the first byte in its file.
    pub offset: u64,
    /// Bytes the tensor occupies: whole blocks of `ty` for every row.
    pub n_bytes: u64,
    /// Which part of a split set holds it (0 for a single file).
    pub part: usize,
}

impl TensorInfo {
    /// Number of elements.
    pub fn n_elems(&self) -> u64 {
        self.ne.iter().product()
    }

    /// Bytes of one row (`ne[0]` elements).
    pub fn row_bytes(&self) -> u64 {
        // Validated at open: ne[0] is a whole number of blocks and the product fits.
        self.ne[0] / self.ty.block_elems() as u64 * self.ty.block_bytes() as u64
    }

    /// The absolute byte range of this tensor in its file.
    pub fn range(&self) -> Range<u64> {
        self.offset..self.offset + self.n_bytes
    }
}

/// A read-only map of a GGUF file, registered with the SIGBUS guard for its lifetime.
#[derive(Debug)]
struct GgufMap {
    map: Mmap,
    sigbus_slot: Option<usize>,
}

impl Drop for GgufMap {
    fn drop(&mut self) {
        if let Some(i) = self.sigbus_slot {
            crate::weights::sigbus::unregister(i);
        }
    }
}

/// One parsed, validated GGUF file.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    map: GgufMap,
    pub version: u32,
    /// The key/values in file order.
    pub metadata: Vec<(String, GgufValue)>,
    meta_index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_start: u64,
}

impl GgufFile {
    /// Maps and validates `path`; `part` is its index in a split set (0 otherwise).
    pub fn open(path: &Path, part: usize) -> Result<GgufFile, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len < 24 {
            return Err(GgufError::Truncated {
                path: path.to_path_buf(),
                what: "the header (24 bytes: magic, version, counts)".into(),
            });
        }
        // SAFETY: a `Mmap` hands out `&[u8]` over the file's pages, which Rust assumes never
        // change while borrowed. Invariant: nobody modifies or truncates the GGUF file while
        // colibri has it mapped. Who guarantees it: the user (model files are not edited while
        // the engine runs); we open it read-only and never write through the map. Worst case
        // if violated: changed bytes under a live slice (wrong numbers), or, for a truncation,
        // SIGBUS on a page past the new end, which `weights::sigbus` (registered below) turns
        // into a zero page and an error naming the file, as for safetensors shards.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let sigbus_slot = crate::weights::sigbus::register(map.as_ptr() as usize, map.len(), path);
        let map = GgufMap { map, sigbus_slot };
        let parsed = parse(&map.map, path, part)?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            map,
            version: parsed.version,
            meta_index: parsed
                .metadata
                .iter()
                .enumerate()
                .map(|(i, (k, _))| (k.clone(), i))
                .collect(),
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            alignment: parsed.alignment,
            data_start: parsed.data_start,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The value of metadata key `key`.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// The whole file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map.map
    }

    /// The bytes of `t`, a tensor of this file (its range was checked at open).
    pub fn tensor_bytes(&self, t: &TensorInfo) -> &[u8] {
        &self.map.map[t.offset as usize..(t.offset + t.n_bytes) as usize]
    }
}

/// What `parse` finds in a file's bytes.
pub(super) struct Parsed {
    pub version: u32,
    pub metadata: Vec<(String, GgufValue)>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    pub data_start: u64,
}

/// Parses and validates a whole GGUF file held in `b`.
pub(super) fn parse(b: &[u8], path: &Path, part: usize) -> Result<Parsed, GgufError> {
    let mut c = Cursor::new(b, path);
    let magic = c.bytes(4, "the magic")?;
    if magic != b"GGUF" {
        return Err(GgufError::BadMagic {
            path: path.to_path_buf(),
            found: magic.to_vec(),
        });
    }
    let version = c.u32("the version")?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::Version {
            path: path.to_path_buf(),
            version,
        });
    }
    let n_tensors = c.u64("the tensor count")?;
    let n_kv = c.u64("the key/value count")?;
    let metadata = parse_kvs(&mut c, n_kv)?;
    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, GgufValue::U32(a))) if a.is_power_of_two() => *a as u64,
        Some((_, v)) => {
            return Err(GgufError::Metadata {
                path: path.to_path_buf(),
                key: "general.alignment".into(),
                reason: format!("expected a u32 power of two, found {v:?}"),
            })
        }
    };

    // A tensor info takes at least 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset) bytes.
    c.check_count(n_tensors, 24, "tensor infos")?;
    let mut raw = Vec::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        let name = c.string(&format!("the name of tensor #{i}"))?;
        let n_dims = c.u32(&format!("tensor {name:?}'s dimension count"))?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(GgufError::Tensor {
                path: path.to_path_buf(),
                tensor: name,
                reason: format!("{n_dims} dimensions; expected 1 to {MAX_DIMS}"),
            });
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            ne.push(c.u64(&format!("tensor {name:?}'s dimension {d}"))?);
        }
        let id = c.u32(&format!("tensor {name:?}'s type"))?;
        let offset = c.u64(&format!("tensor {name:?}'s offset"))?;
        raw.push((name, ne, id, offset));
    }
    // Past the end only matters if a tensor lies there: each range is checked below.
    let data_start = align_up(c.pos() as u64, alignment);
    let file_len = b.len() as u64;

    let mut tensors = Vec::with_capacity(raw.len());
    let mut seen: HashMap<&str, ()> = HashMap::with_capacity(raw.len());
    for (name, ne, id, rel) in &raw {
        let bad = |reason: String| GgufError::Tensor {
            path: path.to_path_buf(),
            tensor: name.clone(),
            reason,
        };
        if seen.insert(name.as_str(), ()).is_some() {
            return Err(bad("the name appears twice in the tensor table".into()));
        }
        let ty = GgmlType::from_id(*id).ok_or_else(|| GgufError::UnknownType {
            path: path.to_path_buf(),
            tensor: name.clone(),
            id: *id,
        })?;
        let be = ty.block_elems() as u64;
        if ne[0] % be != 0 {
            return Err(bad(format!(
                "row length ne[0] = {} is not a multiple of {ty}'s block of {be}",
                ne[0]
            )));
        }
        let n_elems = ne
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| bad(format!("dimensions {ne:?} overflow")))?;
        let n_bytes = ty
            .bytes_for(n_elems)
            .ok_or_else(|| bad(format!("dimensions {ne:?} overflow as {ty}")))?;
        if rel % alignment != 0 {
            return Err(bad(format!(
                "offset {rel} is not a multiple of the alignment {alignment}"
            )));
        }
        let offset = data_start
            .checked_add(*rel)
            .filter(|o| o.checked_add(n_bytes).is_some_and(|end| end <= file_len))
            .ok_or_else(|| {
                bad(format!(
                    "bytes {rel}..+{n_bytes} of the data section (from {data_start}) run past \
                     the end of the {file_len}-byte file"
                ))
            })?;
        tensors.push(TensorInfo {
            name: name.clone(),
            ne: ne.clone(),
            ty,
            offset,
            n_bytes,
            part,
        });
    }
    check_overlaps(&tensors, path)?;
    Ok(Parsed {
        version,
        metadata,
        tensors,
        alignment,
        data_start,
    })
}

/// Refuses two tensors whose byte ranges share a byte.
fn check_overlaps(tensors: &[TensorInfo], path: &Path) -> Result<(), GgufError> {
    let mut order: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    order.sort_by_key(|t| t.offset);
    for w in order.windows(2) {
        if w[1].offset < w[0].offset + w[0].n_bytes {
            return Err(GgufError::Tensor {
                path: path.to_path_buf(),
                tensor: w[1].name.clone(),
                reason: format!(
                    "its bytes {:?} overlap tensor {:?}'s {:?}",
                    w[1].range(),
                    w[0].name,
                    w[0].range()
                ),
            });
        }
    }
    Ok(())
}

fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}
