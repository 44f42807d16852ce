//! A GGUF model: one file, or every part of a split set (`NAME-00001-of-0000N.gguf`, as
//! llama.cpp's `gguf-split` writes them), with one tensor index over all parts, the
//! metadata checked against the tensor shapes, and the per-expert byte ranges of stacked
//! expert tensors that the streaming tiers read.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use super::dequant::dequantize_row;
use super::file::{GgufFile, TensorInfo};
use super::meta::GgufValue;
use super::GgufError;

const SPLIT_COUNT: &str = "split.count";
const SPLIT_NO: &str = "split.no";
const SPLIT_TENSORS: &str = "split.tensors.count";

/// Every part of a GGUF model, validated together.
#[derive(Debug)]
pub struct GgufModel {
    pub parts: Vec<GgufFile>,
    /// Tensor name to (part, index in that part's table).
    index: HashMap<String, (usize, usize)>,
}

impl GgufModel {
    /// Opens `path` and, when its `split.count` says it is the first of several parts, every
    /// other part next to it. A missing part, a part out of place or a tensor in two parts is
    /// refused by name before any weight is read.
    pub fn open(path: &Path) -> Result<GgufModel, GgufError> {
        let first = GgufFile::open(path, 0)?;
        let count = split_key(&first, SPLIT_COUNT)?.unwrap_or(1);
        let mut parts = vec![first];
        if count > 1 {
            let no = split_key(&parts[0], SPLIT_NO)?.unwrap_or(0);
            if no != 0 {
                return Err(GgufError::Split {
                    path: path.to_path_buf(),
                    reason: format!("{SPLIT_NO} = {no}: open the first part (-00001-of-…)"),
                });
            }
            let prefix = split_prefix(path, count).ok_or_else(|| GgufError::Split {
                path: path.to_path_buf(),
                reason: format!(
                    "{SPLIT_COUNT} = {count} but the name does not end in -00001-of-{count:05}.gguf"
                ),
            })?;
            for i in 1..count {
                let p = PathBuf::from(format!("{prefix}-{:05}-of-{count:05}.gguf", i + 1));
                if !p.exists() {
                    return Err(GgufError::MissingPart {
                        path: p,
                        part: i + 1,
                        count,
                    });
                }
                let f = GgufFile::open(&p, i as usize)?;
                let (no, c) = (split_key(&f, SPLIT_NO)?, split_key(&f, SPLIT_COUNT)?);
                if no != Some(i) || c != Some(count) {
                    return Err(GgufError::Split {
                        path: p,
                        reason: format!(
                            "expected {SPLIT_NO} = {i} and {SPLIT_COUNT} = {count}, found {no:?} and {c:?}"
                        ),
                    });
                }
                parts.push(f);
            }
        }
        let mut index = HashMap::new();
        for (pi, part) in parts.iter().enumerate() {
            for (ti, t) in part.tensors.iter().enumerate() {
                if let Some((other, _)) = index.insert(t.name.clone(), (pi, ti)) {
                    return Err(GgufError::Tensor {
                        path: part.path().to_path_buf(),
                        tensor: t.name.clone(),
                        reason: format!("also in part {}", other + 1),
                    });
                }
            }
        }
        if count > 1 {
            if let Some(total) = split_key(&parts[0], SPLIT_TENSORS)? {
                if total != index.len() as u64 {
                    return Err(GgufError::Metadata {
                        path: path.to_path_buf(),
                        key: SPLIT_TENSORS.into(),
                        reason: format!("says {total} tensors; the parts hold {}", index.len()),
                    });
                }
            }
        }
        let model = GgufModel { parts, index };
        model.check_shapes()?;
        Ok(model)
    }

    /// The model's metadata (the first part's: later parts only repeat the split keys).
    pub fn metadata(&self) -> &[(String, GgufValue)] {
        &self.parts[0].metadata
    }

    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.parts[0].get(key)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index
            .get(name)
            .map(|&(p, t)| &self.parts[p].tensors[t])
    }

    /// Every tensor, part by part in file order.
    pub fn tensors(&self) -> impl Iterator<Item = &TensorInfo> {
        self.parts.iter().flat_map(|p| p.tensors.iter())
    }

    /// The mapped bytes of `t` (from this model).
    pub fn tensor_bytes(&self, t: &TensorInfo) -> &[u8] {
        self.parts[t.part].tensor_bytes(t)
    }

    /// The path of the file holding `t`.
    pub fn tensor_path(&self, t: &TensorInfo) -> &Path {
        self.parts[t.part].path()
    }

    /// `t` dequantized whole into `out` (`t.n_elems()` values).
    pub fn dequantize(&self, t: &TensorInfo, out: &mut [f32]) -> Result<(), GgufError> {
        dequantize_row(t.ty, self.tensor_bytes(t), out).map_err(|source| GgufError::Dequant {
            tensor: t.name.clone(),
            source,
        })
    }

    /// Refuses metadata that contradicts the tensor shapes: `{arch}.expert_count` against
    /// every stacked experts tensor's last dimension, `{arch}.embedding_length` against
    /// `token_embd.weight`'s row length.
    fn check_shapes(&self) -> Result<(), GgufError> {
        let Some(arch) = self.get("general.architecture").and_then(|v| v.as_str()) else {
            return Ok(());
        };
        let path = self.parts[0].path();
        let contradiction =
            |key: String, t: &TensorInfo, want: u64, dim: usize| GgufError::Contradiction {
                path: path.to_path_buf(),
                key,
                tensor: t.name.clone(),
                reason: format!(
                    "the key says {want}, the tensor's ne[{dim}] is {}",
                    t.ne[dim]
                ),
            };
        let key = format!("{arch}.expert_count");
        if let Some(n) = self.get(&key).and_then(GgufValue::as_u64) {
            for t in self.tensors().filter(|t| t.name.contains("_exps")) {
                if t.ne.len() >= 2 && t.ne[t.ne.len() - 1] != n {
                    return Err(contradiction(key, t, n, t.ne.len() - 1));
                }
            }
        }
        let key = format!("{arch}.embedding_length");
        if let (Some(n), Some(t)) = (
            self.get(&key).and_then(GgufValue::as_u64),
            self.tensor("token_embd.weight"),
        ) {
            if t.ne[0] != n {
                return Err(contradiction(key, t, n, 0));
            }
        }
        Ok(())
    }
}

/// A split key's value as an integer, refusing one of a non-integer type by name.
fn split_key(f: &GgufFile, key: &str) -> Result<Option<u64>, GgufError> {
    match f.get(key) {
        None => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| GgufError::Metadata {
            path: f.path().to_path_buf(),
            key: key.into(),
            reason: format!("expected a non-negative integer, found {v:?}"),
        }),
    }
}

/// `dir/NAME` from `dir/NAME-00001-of-0000N.gguf`.
fn split_prefix(path: &Path, count: u64) -> Option<String> {
    let s = path.to_str()?;
    s.strip_suffix(&format!("-00001-of-{count:05}.gguf"))
        .map(str::to_string)
}

/// The absolute byte range, in its file, of expert `e` of a stacked experts tensor
/// (`ffn_{gate,up,down}_exps`, ne = [cols, rows, n_expert]): expert `e`'s rows are
/// contiguous, `rows * row_bytes` long.
pub fn expert_range(t: &TensorInfo, e: u64) -> Result<Range<u64>, GgufError> {
    if t.ne.len() != 3 {
        return Err(GgufError::NotExperts {
            tensor: t.name.clone(),
            reason: format!(
                "{} dimensions; expected 3 (cols, rows, experts)",
                t.ne.len()
            ),
        });
    }
    if e >= t.ne[2] {
        return Err(GgufError::NotExperts {
            tensor: t.name.clone(),
            reason: format!("expert {e} asked for; it holds {}", t.ne[2]),
        });
    }
    let per = t.row_bytes() * t.ne[1];
    let start = t.offset + e * per;
    Ok(start..start + per)
}
