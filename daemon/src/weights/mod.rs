//! Safetensors shards: discovery along a search path, header validation, memory maps, and
//! positional reads.
//!
//! [`ShardSet::open`] validates every header up front (see `safetensors.rs`), so the rest of
//! the engine can take a [`TensorInfo`] at its word: its bytes lie inside its file and belong
//! to no other tensor. Dense weights are read through the memory map: converted from it
//! ([`ShardSet::read_f32`]), or, stored as computed, used in place ([`ShardSet::in_place`]);
//! the expert store streams with `pread` ([`ShardSet::read_at`]), which turns a file
//! truncated under us into an error rather than a SIGBUS.

pub mod checksums;
mod dsv4_published;
pub mod fp8;
pub mod fused_experts;
mod in_place;
mod in_place_huge;
mod mmap;
pub mod names;
mod owned;
mod safetensors;
pub mod sigbus;

/// Parses a safetensors file's header from the file's bytes (`bytes.len()` its size) and
/// returns how many tensors it names: the checks `ShardSet::open` makes, for tools and the
/// fuzz tests.
pub fn check_safetensors_header(bytes: &[u8], path: &Path) -> Result<usize, WeightsError> {
    safetensors::parse_header(bytes, path).map(|t| t.len())
}
pub mod writer;

use std::collections::BTreeMap;
use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};

pub use in_place::{Warm, IN_PLACE_ALIGN};
pub use in_place_huge::HugeInPlace;
use mmap::ShardMap;

/// Element type of a stored tensor. Other safetensors dtypes are refused at open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32,
    BF16,
    F16,
    I8,
    U8,
    /// FP8 e4m3 (`float8_e4m3fn`), scaled per 128x128 block by `<name>_scale_inv` (see `fp8.rs`).
    F8E4M3,
    /// A bare power-of-two exponent byte (`float8_e8m0fnu`, `2^(b - 127)`, 255 NaN): the scales
    /// DeepSeek-V4 publishes beside its FP8 matrices and its FP4 experts (`dsv4_published.rs`).
    F8E8M0,
    /// 64-bit integers: DeepSeek-V4's token-to-expert tables (`mlp.gate.tid2eid`), read as
    /// numbers (expert ids, exact in f32).
    I64,
    /// 32-bit integers: the same tables as a GGUF holds them (llama.cpp's `ffn_gate_tid2eid`).
    I32,
    /// A GGUF tensor's ggml blocks (`gguf::types`): computed as stored where the type is one
    /// of `quant::ggml`'s, else dequantized to f32 at load.
    Ggml(crate::gguf::GgmlType),
}

/// Little-endian f32 values (a shard's F32 tensor, a `.qs` scale array, a logits file).
pub fn f32_le(raw: &[u8]) -> Vec<f32> {
    raw.chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

impl Dtype {
    /// Little-endian elements of this dtype as f32 values; `None` for the integer dtypes,
    /// which are packed weights and need their scales, and for FP8, which needs its block
    /// scales ([`ShardSet::read_f32`] finds them).
    pub fn to_f32(self, raw: &[u8]) -> Option<Vec<f32>> {
        let mut out = vec![0.0; self.elems(raw.len())];
        self.to_f32_into(raw, &mut out).map(|()| out)
    }

    /// [`Dtype::to_f32`] into `out` (`raw.len() / size()` values), without allocating.
    pub fn to_f32_into(self, raw: &[u8], out: &mut [f32]) -> Option<()> {
        match self {
            Dtype::F32 => {
                for (o, b) in out.iter_mut().zip(raw.chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            Dtype::BF16 => {
                for (o, b) in out.iter_mut().zip(raw.chunks_exact(2)) {
                    *o = half::bf16::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
            Dtype::F16 => {
                for (o, b) in out.iter_mut().zip(raw.chunks_exact(2)) {
                    *o = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
            Dtype::I64 => {
                for (o, b) in out.iter_mut().zip(raw.chunks_exact(8)) {
                    let v = i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
                    *o = v as f32;
                }
            }
            Dtype::I32 => {
                for (o, b) in out.iter_mut().zip(raw.chunks_exact(4)) {
                    *o = i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32;
                }
            }
            Dtype::F8E8M0 => {
                for (o, &b) in out.iter_mut().zip(raw) {
                    *o = crate::quant::mxfp4::e8m0(b).unwrap_or(f32::NAN);
                }
            }
            Dtype::Ggml(t) => crate::gguf::dequantize_row(t, raw, out).ok()?,
            Dtype::I8 | Dtype::U8 | Dtype::F8E4M3 => return None,
        }
        Some(())
    }

    /// The values of little-endian elements `raw` that are not finite (NaN or infinite): how
    /// many, and the index of the first; `None` when every one is finite or the dtype holds no
    /// floats (packed blobs). Decided on the bits (an all-ones exponent; e4m3fn's only
    /// non-finite code is NaN, `S1111111`), so nothing is converted.
    pub fn non_finite(self, raw: &[u8]) -> Option<(usize, usize)> {
        // Counted first with a filter the compiler vectorizes (26 GB/s on f32, measured), the
        // first one looked for only when there is one: every expert load pays the count.
        fn find<const N: usize>(
            raw: &[u8],
            bad: impl Fn([u8; N]) -> bool,
        ) -> Option<(usize, usize)> {
            let elems = || {
                raw.chunks_exact(N)
                    .map(|b| <[u8; N]>::try_from(b).expect("chunks of N bytes"))
            };
            match elems().filter(|&b| bad(b)).count() {
                0 => None,
                n => elems().position(bad).map(|first| (n, first)),
            }
        }
        match self {
            Dtype::F32 => find(raw, |b: [u8; 4]| {
                u32::from_le_bytes(b) & 0x7F80_0000 == 0x7F80_0000
            }),
            Dtype::BF16 => find(raw, |b: [u8; 2]| u16::from_le_bytes(b) & 0x7F80 == 0x7F80),
            Dtype::F16 => find(raw, |b: [u8; 2]| u16::from_le_bytes(b) & 0x7C00 == 0x7C00),
            Dtype::F8E4M3 => find(raw, |b: [u8; 1]| b[0] & 0x7F == 0x7F),
            Dtype::F8E8M0 => find(raw, |b: [u8; 1]| b[0] == 0xFF),
            // The blocks' scales could be checked; their values are the dequantization's.
            Dtype::I8 | Dtype::U8 | Dtype::I64 | Dtype::I32 | Dtype::Ggml(_) => None,
        }
    }

    /// A pre-quantized container blob (U8/I8 data beside its `<name>.qs` scales).
    pub fn is_packed(self) -> bool {
        matches!(self, Dtype::I8 | Dtype::U8)
    }

    /// The name safetensors headers use.
    pub fn safetensors_name(self) -> &'static str {
        match self {
            Dtype::F32 => "F32",
            Dtype::BF16 => "BF16",
            Dtype::F16 => "F16",
            Dtype::I8 => "I8",
            Dtype::U8 => "U8",
            Dtype::F8E4M3 => "F8_E4M3",
            Dtype::F8E8M0 => "F8_E8M0",
            Dtype::I64 => "I64",
            Dtype::I32 => "I32",
            Dtype::Ggml(t) => t.name(),
        }
    }

    /// Bytes per element (a ggml block type: per block, see [`Dtype::bytes_of`]).
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::BF16 | Dtype::F16 => 2,
            Dtype::I8 | Dtype::U8 | Dtype::F8E4M3 | Dtype::F8E8M0 => 1,
            Dtype::I64 => 8,
            Dtype::I32 => 4,
            Dtype::Ggml(t) => t.block_bytes(),
        }
    }

    /// Bytes of `n` elements (`None`: not whole blocks of a ggml type).
    pub fn bytes_of(self, n: u64) -> Option<u64> {
        match self {
            Dtype::Ggml(t) => t.bytes_for(n),
            dt => Some(n * dt.size() as u64),
        }
    }

    /// Elements in `bytes` bytes (whole ones).
    pub fn elems(self, bytes: usize) -> usize {
        match self {
            Dtype::Ggml(t) => bytes / t.block_bytes() * t.block_elems(),
            dt => bytes / dt.size(),
        }
    }

    /// The dtype named `s` in a safetensors header, if supported.
    pub fn from_safetensors(s: &str) -> Option<Dtype> {
        Some(match s {
            "F32" => Dtype::F32,
            "BF16" => Dtype::BF16,
            "F16" => Dtype::F16,
            "I8" => Dtype::I8,
            "U8" => Dtype::U8,
            "F8_E4M3" => Dtype::F8E4M3,
            "F8_E8M0" => Dtype::F8E8M0,
            "I64" => Dtype::I64,
            "I32" => Dtype::I32,
            // A GGUF's blocks kept as stored by `colibri convert --from FILE.gguf`, under the
            // type names gguf-py prints (only the types colibri computes).
            other => crate::quant::ggml::COMPUTED
                .into_iter()
                .find(|t| t.name() == other)
                .map(Dtype::Ggml)?,
        })
    }
}

/// One tensor's bytes in its shard's map, held with the shard that owns the map (see
/// [`ShardSet::mapped_tensor`] and [`ShardSet::in_place`]).
#[derive(Debug)]
pub struct MappedTensor {
    shard: Arc<Shard>,
    /// The shard's index in its set.
    file: usize,
    start: usize,
    len: usize,
}

impl crate::quant::SharedBytes for MappedTensor {
    fn bytes(&self) -> &[u8] {
        // In range: checked against the file's size at open, and the map covers the file.
        &self.shard.map.bytes()[self.start..self.start + self.len]
    }
}

impl Drop for MappedTensor {
    fn drop(&mut self) {
        // Every page the tensor touches, boundary pages too: a neighbour still in use that
        // shares one faults it back in from the page cache on its next read (a minor fault),
        // where keeping them would leave a few pages of every expert ever loaded counted in
        // RSS. Best effort: a refusal only leaves the pages counted.
        let _ = self.shard.map.release_range(self.start, self.len);
    }
}

/// Where one tensor lives. `offset..offset + len` is inside file `file` and was checked
/// against the dtype and shape at open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Index of the shard file (see [`ShardSet::file_path`]).
    pub file: usize,
    /// Absolute byte offset in the file.
    pub offset: u64,
    pub len: u64,
}

/// Why shards could not be opened or a tensor not read. Variants name the file and tensor.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("{}: the file was cut short while the daemon had it mapped (SIGBUS at byte {offset}): the request in progress is lost and not saved; saved conversations are intact. Restore the file and restart", path.display())]
    CutShort { path: PathBuf, offset: u64 },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: bad safetensors header: {reason}", file.display())]
    Header { file: PathBuf, reason: String },
    #[error("{}: tensor \"{tensor}\": {reason}", file.display())]
    Tensor {
        file: PathBuf,
        tensor: String,
        reason: String,
    },
    #[error("{}: reading {len} bytes at offset {offset}: {source}", file.display())]
    Read {
        file: PathBuf,
        offset: u64,
        len: usize,
        source: std::io::Error,
    },
    #[error("tensor \"{name}\" is not in any shard")]
    Missing { name: String },
    #[error("tensor \"{name}\" has shape {found:?}, expected {expected:?}")]
    Shape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("tensor \"{name}\" has dtype {dtype:?}, which cannot be read as f32")]
    Dtype { name: String, dtype: Dtype },
    #[error("tensor \"{name}\" appears in both {} and {}", first.display(), second.display())]
    Duplicate {
        name: String,
        first: PathBuf,
        second: PathBuf,
    },
    #[error("FP8 tensor \"{name}\": {reason}")]
    Fp8 { name: String, reason: String },
    /// Tensors that do not fit together (DeepSeek-V4's published scales, `dsv4_published.rs`):
    /// the checkpoint is refused, as a config that cannot run is.
    #[error("{}: tensor \"{tensor}\": {reason}", file.display())]
    Refused {
        file: PathBuf,
        tensor: String,
        reason: String,
    },
    #[error("no *.safetensors files in {}", join_dirs(dirs))]
    NoShards { dirs: Vec<PathBuf> },
    #[error("{}: {reason}", file.display())]
    Checksums { file: PathBuf, reason: String },
    /// The tensors of a GGUF model (`--snap FILE.gguf`).
    #[error("{0}")]
    Gguf(Box<crate::gguf::GgufError>),
}

fn join_dirs(dirs: &[PathBuf]) -> String {
    if dirs.is_empty() {
        return "(no directories given)".into();
    }
    let parts: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    parts.join(":")
}

/// One open shard: the file (kept for `pread`) and its map.
#[derive(Debug)]
struct Shard {
    path: PathBuf,
    file: File,
    map: ShardMap,
    /// The end of the farthest tensor computed in place from this map (0: none): the file
    /// must stay at least this long (`in_place`).
    in_place_end: AtomicU64,
}

impl Shard {
    fn new(path: PathBuf, file: File, map: ShardMap) -> Shard {
        Shard {
            path,
            file,
            map,
            in_place_end: AtomicU64::new(0),
        }
    }
}

/// Every tensor of a model, found across the shards of a search path.
#[derive(Debug)]
pub struct ShardSet {
    /// Shared with the tensors read in place ([`MappedTensor`]), which keep their map alive.
    shards: Vec<Arc<Shard>>,
    tensors: BTreeMap<String, TensorInfo>,
    /// The tensors computed in place, for [`ShardSet::warm_in_place`].
    in_place: Mutex<Vec<in_place::Kept>>,
    /// Set by [`ShardSet::copy_dense`]: no tensor is handed out in place any more.
    copy_dense: AtomicBool,
}

impl ShardSet {
    /// `search_path`: directories in order; every `*.safetensors` file in each; when two
    /// directories hold a file with the same name, the first wins. A tensor name appearing in
    /// two different files is an error naming both files.
    ///
    /// gpt-oss's published fused MXFP4 experts are also listed as per-expert views over their
    /// bytes (`fused_experts`), which the expert store reads in place.
    pub fn open(search_path: &[PathBuf]) -> Result<ShardSet, WeightsError> {
        let mut set = ShardSet::open_stored(search_path)?;
        let names: Vec<&str> = set.names().collect();
        let views = fused_experts::views(|n| set.tensors.get(n), &names);
        for v in views {
            set.tensors.entry(v.name.clone()).or_insert(v);
        }
        Ok(set)
    }

    /// As [`ShardSet::open`], the tensors exactly as the files store them (no views): what
    /// `convert` reads.
    pub fn open_stored(search_path: &[PathBuf]) -> Result<ShardSet, WeightsError> {
        if let Some(gguf) = crate::gguf::snap::gguf_of(search_path) {
            return crate::gguf::snap::shard_set(gguf);
        }
        let mut seen_names = HashSet::new();
        let mut shards: Vec<Arc<Shard>> = Vec::new();
        let mut tensors: BTreeMap<String, TensorInfo> = BTreeMap::new();
        for dir in search_path {
            for path in shard_files(dir)? {
                let Some(file_name) = path.file_name().map(|n| n.to_os_string()) else {
                    continue;
                };
                if !seen_names.insert(file_name) {
                    continue; // an earlier directory already supplied this shard
                }
                let (shard, raw) = open_shard(path)?;
                let index = shards.len();
                for mut t in raw {
                    // Qwen3.5's vision-language checkpoints keep the language model under
                    // `model.language_model.` (transformers' qwen3_5_text prefix rule): it is
                    // read as the text model's `model.` (the vision tower and MTP tensors,
                    // `model.visual.*` and `mtp.*`, are left unread).
                    if let Some(rest) = t.name.strip_prefix("model.language_model.") {
                        t.name = format!("model.{rest}");
                    }
                    // Mixtral-layout expert names read as transformers names them (names.rs).
                    if let std::borrow::Cow::Owned(n) = names::canonical(&t.name) {
                        t.name = n;
                    }
                    if let Some(prev) = tensors.get(&t.name) {
                        return Err(WeightsError::Duplicate {
                            name: t.name,
                            first: shards[prev.file].path.clone(),
                            second: shard.path,
                        });
                    }
                    let info = TensorInfo {
                        name: t.name.clone(),
                        dtype: t.dtype,
                        shape: t.shape,
                        file: index,
                        offset: t.offset,
                        len: t.len,
                    };
                    tensors.insert(t.name, info);
                }
                shards.push(Arc::new(shard));
            }
        }
        if shards.is_empty() {
            return Err(WeightsError::NoShards {
                dirs: search_path.to_vec(),
            });
        }
        // DeepSeek-V4 as published: its names and its `.scale` companions (dsv4_published.rs).
        dsv4_published::adopt(&mut tensors, |f| shards[f].path.as_path())?;
        Ok(ShardSet {
            shards,
            tensors,
            in_place: Mutex::default(),
            copy_dense: AtomicBool::new(false),
        })
    }

    /// A set over `files` whose tensors were found by another index (a GGUF's, under the
    /// engine's names): each is checked to lie inside its file, as a safetensors header's are.
    pub fn from_tensors(
        files: &[PathBuf],
        tensors: Vec<TensorInfo>,
    ) -> Result<ShardSet, WeightsError> {
        let mut shards = Vec::with_capacity(files.len());
        for path in files {
            let io_err = |source| WeightsError::Io {
                path: path.clone(),
                source,
            };
            let file = File::open(path).map_err(io_err)?;
            let len = file.metadata().map_err(io_err)?.len();
            let map = ShardMap::map(&file, path, len)?;
            shards.push((Shard::new(path.clone(), file, map), len));
        }
        let mut by_name = BTreeMap::new();
        for t in tensors {
            let Some((shard, size)) = shards.get(t.file) else {
                return Err(WeightsError::Tensor {
                    file: PathBuf::from(format!("<file #{} of {}>", t.file, files.len())),
                    tensor: t.name,
                    reason: "in no file of the set".into(),
                });
            };
            let want = t.dtype.bytes_of(t.shape.iter().product::<usize>() as u64);
            let want = want.unwrap_or(u64::MAX);
            if t.offset.checked_add(t.len).is_none_or(|end| end > *size) || t.len != want {
                return Err(WeightsError::Tensor {
                    file: shard.path.clone(),
                    tensor: t.name,
                    reason: format!(
                        "bytes {}..+{} ({want} expected for {:?} {:?}) do not fit the file's {size}",
                        t.offset, t.len, t.dtype, t.shape
                    ),
                });
            }
            if let Some(prev) = by_name.insert(t.name.clone(), t) {
                return Err(WeightsError::Duplicate {
                    name: prev.name,
                    first: shard.path.clone(),
                    second: shard.path.clone(),
                });
            }
        }
        Ok(ShardSet {
            shards: shards.into_iter().map(|(s, _)| Arc::new(s)).collect(),
            tensors: by_name,
            in_place: Mutex::default(),
            copy_dense: AtomicBool::new(false),
        })
    }

    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(name)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// All tensor names, in sorted order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// Number of shard files opened.
    pub fn num_files(&self) -> usize {
        self.shards.len()
    }

    /// Path of shard `file`. Panics if `file >= num_files()`: indices come from a
    /// [`TensorInfo`] of this set, so a bad one is a bug.
    pub fn file_path(&self, file: usize) -> &Path {
        &self.shards[file].path
    }

    fn info(&self, name: &str) -> Result<&TensorInfo, WeightsError> {
        self.get(name).ok_or_else(|| WeightsError::Missing {
            name: name.to_string(),
        })
    }

    /// Whole tensor as f32 (F32, BF16, F16 converted, FP8 dequantized with its block scales);
    /// the shape must equal `shape` exactly.
    pub fn read_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, WeightsError> {
        let info = self.info(name)?;
        if info.shape != shape {
            return Err(WeightsError::Shape {
                name: name.to_string(),
                expected: shape.to_vec(),
                found: info.shape.clone(),
            });
        }
        let bytes = self.bytes(name)?;
        if info.dtype == Dtype::F8E4M3 {
            let scales = self.fp8_scales(name)?;
            let cols = info.shape.get(1).copied().unwrap_or(0);
            let mut out = vec![0.0; bytes.len()];
            fp8::dequant_rows(bytes, cols, 0, &scales, &mut out);
            self.release(name);
            return Ok(out);
        }
        let out = info
            .dtype
            .to_f32(bytes)
            .ok_or_else(|| WeightsError::Dtype {
                name: name.to_string(),
                dtype: info.dtype,
            })?;
        // Copied out: the map's pages would only count this tensor twice in RSS.
        self.release(name);
        Ok(out)
    }

    /// The `<name>_scale_inv` tensor of FP8 tensor `name`, checked from the headers alone
    /// (nothing is read): F32, BF16, F16 or F8_E8M0 (DeepSeek-V4's), shape
    /// `[ceil(rows/128), ceil(cols/128)]` of a 2-D tensor.
    pub fn fp8_scale_info(&self, name: &str) -> Result<&TensorInfo, WeightsError> {
        let info = self.info(name)?;
        let err = |reason: String| WeightsError::Fp8 {
            name: name.to_string(),
            reason,
        };
        let &[rows, cols] = info.shape.as_slice() else {
            return Err(err(format!(
                "shape {:?} is not 2-D; only matrices carry 128x128 block scales",
                info.shape
            )));
        };
        let scale_name = fp8_scale_name(name);
        let s = self.get(&scale_name).ok_or_else(|| {
            err(format!(
                "its block scales \"{scale_name}\" are missing (DeepSeek-V4's published \
                     files name them \"<name without .weight>.scale\")"
            ))
        })?;
        let want = fp8::scale_shape(rows, cols);
        if s.shape != want {
            return Err(err(format!(
                "\"{scale_name}\" has shape {:?}, expected {want:?} (one scale per 128x128 \
                 block of [{rows}, {cols}])",
                s.shape
            )));
        }
        if !matches!(
            s.dtype,
            Dtype::F32 | Dtype::BF16 | Dtype::F16 | Dtype::F8E8M0
        ) {
            return Err(err(format!(
                "\"{scale_name}\" has dtype {:?}; scales must be F32, BF16, F16 or F8_E8M0",
                s.dtype
            )));
        }
        Ok(s)
    }

    /// The block scales of FP8 tensor `name` as f32, through the memory map (the loader).
    pub fn fp8_scales(&self, name: &str) -> Result<Vec<f32>, WeightsError> {
        let s = self.fp8_scale_info(name)?;
        let raw = self.bytes(&s.name)?;
        Ok(s.dtype
            .to_f32(raw)
            .expect("fp8_scale_info admits float dtypes only"))
    }

    /// [`ShardSet::fp8_scales`] with a positional read instead of the map, so that a tool
    /// passing over a whole model (the converter) keeps no mapped pages resident.
    pub fn fp8_scales_pread(&self, name: &str) -> Result<Vec<f32>, WeightsError> {
        let s = self.fp8_scale_info(name)?;
        let mut raw = vec![0u8; s.len as usize];
        self.read_at(s.file, s.offset, &mut raw)?;
        Ok(s.dtype
            .to_f32(&raw)
            .expect("fp8_scale_info admits float dtypes only"))
    }

    /// Lets go of the map pages loading touched (see `ShardMap::release_pages`): what was
    /// copied or quantized out of them would count twice in RSS. The tensors read in place
    /// lose their pages too: [`ShardSet::warm_in_place`] maps them again, after this. Best
    /// effort: a refusal only leaves the pages counted.
    pub fn release_mapped_pages(&self) {
        for s in &self.shards {
            if let Err(e) = s.map.release_pages() {
                crate::elog!(
                    "[mem] releasing the pages of {} failed: {e}",
                    s.path.display()
                );
            }
        }
    }

    /// Lets go of the map pages of tensor `name` once it was copied out (best effort).
    pub fn release(&self, name: &str) {
        if let Some(info) = self.tensors.get(name) {
            let _ = self.shards[info.file]
                .map
                .release_range(info.offset as usize, info.len as usize);
        }
    }

    /// Tensor `name` as a handle into its shard's map that keeps the map alive: a matrix over
    /// it reads the page cache's pages with no copy of its own. The pages are faulted in now
    /// (`MADV_POPULATE_READ`, so the products do not take the faults, or the disk reads, one
    /// page at a time), and the handle's drop lets go of them again (RSS stops counting them;
    /// the page cache keeps them).
    pub fn mapped_tensor(&self, name: &str) -> Result<MappedTensor, WeightsError> {
        let t = self.unpopulated(name)?;
        if let Err(source) = t.shard.map.populate(t.start, t.len) {
            // An I/O error under the map (the disk failed): the products must not be left
            // to take it as SIGBUS.
            return Err(WeightsError::Read {
                file: t.shard.path.clone(),
                offset: t.start as u64,
                len: t.len,
                source,
            });
        }
        Ok(t)
    }

    /// Tensor `name` as a handle into its shard's map, no page touched yet.
    fn unpopulated(&self, name: &str) -> Result<MappedTensor, WeightsError> {
        let info = self.info(name)?;
        Ok(MappedTensor {
            shard: Arc::clone(&self.shards[info.file]),
            file: info.file,
            start: info.offset as usize,
            len: info.len as usize,
        })
    }

    /// Raw bytes of a tensor via the memory map of its shard.
    pub fn bytes(&self, name: &str) -> Result<&[u8], WeightsError> {
        let info = self.info(name)?;
        // offset + len <= file size was checked at open, and the map covers the whole file.
        let start = info.offset as usize;
        Ok(&self.shards[info.file].map.bytes()[start..start + info.len as usize])
    }

    /// Positional read (`pread`) of `buf.len()` bytes at `offset` of shard `file`: the seam
    /// for the expert store. A short read (file truncated after open) is an error.
    pub fn read_at(&self, file: usize, offset: u64, buf: &mut [u8]) -> Result<(), WeightsError> {
        let Some(shard) = self.shards.get(file) else {
            return Err(WeightsError::Read {
                file: PathBuf::from(format!("<shard #{file} of {}>", self.shards.len())),
                offset,
                len: buf.len(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "no such shard"),
            });
        };
        shard
            .file
            .read_exact_at(buf, offset)
            .map_err(|source| WeightsError::Read {
                file: shard.path.clone(),
                offset,
                len: buf.len(),
                source,
            })
    }
}

/// The name of FP8 tensor `name`'s block scales: `<name>_scale_inv`.
pub fn fp8_scale_name(name: &str) -> String {
    format!("{name}_scale_inv")
}

/// The `*.safetensors` files of `dir`, sorted by name.
fn shard_files(dir: &Path) -> Result<Vec<PathBuf>, WeightsError> {
    let io_err = |source| WeightsError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_err)? {
        let path = entry.map_err(io_err)?.path();
        if path.extension().is_none_or(|e| e != "safetensors") {
            continue;
        }
        // Follows symlinks (Hugging Face caches link shards into snapshots). A dangling link
        // is kept, so that opening it reports the missing blob instead of a missing tensor.
        if std::fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        files.push(path);
    }
    files.sort();
    Ok(files)
}

fn open_shard(path: PathBuf) -> Result<(Shard, Vec<safetensors::RawTensor>), WeightsError> {
    let io_err = |source| WeightsError::Io {
        path: path.clone(),
        source,
    };
    let file = File::open(&path).map_err(io_err)?;
    let len = file.metadata().map_err(io_err)?.len();
    if len < 8 {
        return Err(WeightsError::Header {
            file: path,
            reason: format!("the file is {len} bytes, shorter than the 8-byte header length"),
        });
    }
    let map = ShardMap::map(&file, &path, len)?;
    let raw = safetensors::parse_header(map.bytes(), &path)?;
    Ok((Shard::new(path, file, map), raw))
}

#[cfg(test)]
mod tests {
    use super::Dtype;

    #[test]
    fn non_finite_values_are_found_on_their_bits() {
        let f32s: Vec<u8> = [1.0f32, f32::NAN, -2.5, f32::INFINITY, f32::MAX]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(Dtype::F32.non_finite(&f32s), Some((2, 1)));
        assert_eq!(Dtype::F32.non_finite(&f32s[8..12]), None);
        let bf: Vec<u8> = [1.0f32, -0.0, f32::NEG_INFINITY]
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect();
        assert_eq!(Dtype::BF16.non_finite(&bf), Some((1, 2)));
        let f16: Vec<u8> = [half::f16::NAN, half::f16::MAX]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(Dtype::F16.non_finite(&f16), Some((1, 0)));
        // e4m3fn: 0x7E is 448, its largest finite value; 0x7F and 0xFF are NaN.
        assert_eq!(
            Dtype::F8E4M3.non_finite(&[0x7E, 0xFE, 0x00, 0xFF, 0x7F]),
            Some((2, 3))
        );
        assert_eq!(Dtype::U8.non_finite(&[0xFF; 8]), None);
    }
}
