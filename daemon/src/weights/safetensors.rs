//! Parsing and validating one safetensors header.
//!
//! Layout: 8 bytes little-endian `n`, then `n` bytes of a JSON object mapping tensor names to
//! `{"dtype", "shape", "data_offsets": [begin, end]}` (offsets relative to the data section
//! that starts at `8 + n`), plus an optional `"__metadata__"` object. Nothing here trusts the
//! file: every count is bounded before it sizes an allocation and every error names the file
//! and, where there is one, the tensor.

use std::fmt;
use std::path::Path;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::Value;

use super::{Dtype, WeightsError};

/// Largest header accepted (the reference implementation's own limit).
pub(crate) const MAX_HEADER_BYTES: u64 = 100_000_000;
/// Most dimensions a tensor may have.
const MAX_RANK: usize = 8;
/// Largest single dimension (2^48): far beyond any real tensor, small enough to keep sums sane.
const MAX_DIM: u64 = 1 << 48;

/// One tensor entry as found in a header, offsets made absolute.
#[derive(Debug)]
pub(crate) struct RawTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Absolute byte offset of the first byte in the file.
    pub offset: u64,
    pub len: u64,
}

/// Parses the header at the start of `bytes` (the whole file, `bytes.len()` its size).
pub(crate) fn parse_header(bytes: &[u8], path: &Path) -> Result<Vec<RawTensor>, WeightsError> {
    let header_err = |reason: String| WeightsError::Header {
        file: path.to_path_buf(),
        reason,
    };
    let file_len = bytes.len() as u64;
    let Some(len_bytes) = bytes.get(..8) else {
        return Err(header_err(format!(
            "the file is {file_len} bytes, shorter than the 8-byte header length"
        )));
    };
    let mut le = [0u8; 8];
    le.copy_from_slice(len_bytes);
    let header_len = u64::from_le_bytes(le);
    if header_len > MAX_HEADER_BYTES {
        return Err(header_err(format!(
            "header length {header_len} exceeds the {MAX_HEADER_BYTES}-byte limit"
        )));
    }
    if header_len > file_len - 8 {
        return Err(header_err(format!(
            "header length {header_len} runs past the end of the {file_len}-byte file"
        )));
    }
    let data_start = 8 + header_len;
    let data_len = file_len - data_start;
    // Both bounds were checked against the slice length just above.
    let header = &bytes[8..data_start as usize];

    let entries = {
        let mut de = serde_json::Deserializer::from_slice(header);
        let entries = Entries::deserialize(&mut de)
            .map_err(|e| header_err(format!("header is not a JSON object: {e}")))?;
        de.end()
            .map_err(|e| header_err(format!("header has trailing bytes: {e}")))?;
        entries.0
    };

    let mut tensors = Vec::with_capacity(entries.len());
    let mut seen = std::collections::HashSet::with_capacity(entries.len());
    for (name, entry) in entries {
        if !seen.insert(name.clone()) {
            return Err(tensor_err(path, &name, "listed twice in the header".into()));
        }
        if name == "__metadata__" {
            if !entry.is_object() {
                return Err(header_err("\"__metadata__\" is not an object".into()));
            }
            continue;
        }
        tensors.push(parse_entry(path, name, &entry, data_start, data_len)?);
    }

    // No two tensors may share bytes: sorted by start, each must begin at or after the
    // previous one's end. Empty tensors own no bytes.
    let mut order: Vec<&RawTensor> = tensors.iter().filter(|t| t.len > 0).collect();
    order.sort_by_key(|t| t.offset);
    for pair in order.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.offset < a.offset + a.len {
            return Err(tensor_err(
                path,
                &b.name,
                format!(
                    "bytes {}..{} overlap tensor \"{}\" at {}..{}",
                    b.offset,
                    b.offset + b.len,
                    a.name,
                    a.offset,
                    a.offset + a.len
                ),
            ));
        }
    }
    Ok(tensors)
}

fn parse_entry(
    path: &Path,
    name: String,
    entry: &Value,
    data_start: u64,
    data_len: u64,
) -> Result<RawTensor, WeightsError> {
    let err = |reason: String| tensor_err(path, &name, reason);
    let Value::Object(fields) = entry else {
        return Err(err("entry is not an object".into()));
    };

    let dtype = match fields.get("dtype") {
        Some(Value::String(s)) => Dtype::from_safetensors(s).ok_or_else(|| {
            err(format!(
                "dtype \"{}\" is not supported (supported: F32, BF16, F16, F8_E4M3, F8_E8M0, I8, U8, \
                 I64, and the GGUF block types {})",
                truncate(s),
                crate::quant::ggml::COMPUTED.map(|t| t.name()).join(", ")
            ))
        })?,
        _ => return Err(err("\"dtype\" is missing or not a string".into())),
    };

    let Some(Value::Array(dims)) = fields.get("shape") else {
        return Err(err("\"shape\" is missing or not a list".into()));
    };
    if dims.len() > MAX_RANK {
        return Err(err(format!(
            "shape has {} dimensions (at most {MAX_RANK} allowed)",
            dims.len()
        )));
    }
    let mut shape = Vec::with_capacity(dims.len());
    let mut elems: u64 = 1;
    for d in dims {
        let n = d.as_u64().filter(|n| *n <= MAX_DIM).ok_or_else(|| {
            err(format!(
                "shape dimension {d} is not an integer in 0..={MAX_DIM}"
            ))
        })?;
        elems = elems
            .checked_mul(n)
            .ok_or_else(|| err(format!("shape {dims:?} has too many elements (overflow)")))?;
        // n <= 2^48 fits usize on the 64-bit targets this engine supports.
        shape.push(usize::try_from(n).map_err(|_| err(format!("dimension {n} too large")))?);
    }
    let expected_bytes = match dtype {
        // Blocks run along a row: each row must be whole blocks.
        Dtype::Ggml(t) => shape
            .last()
            .filter(|&&cols| cols % t.block_elems() == 0)
            .and_then(|_| t.bytes_for(elems))
            .ok_or_else(|| {
                err(format!(
                    "shape {shape:?} is not rows of whole {} blocks of {} elements",
                    t.name(),
                    t.block_elems()
                ))
            })?,
        _ => elems
            .checked_mul(dtype.size() as u64)
            .ok_or_else(|| err(format!("shape {shape:?} has too many bytes (overflow)")))?,
    };

    let offsets = match fields.get("data_offsets") {
        Some(Value::Array(v)) if v.len() == 2 => (v[0].as_u64(), v[1].as_u64()),
        _ => return Err(err("\"data_offsets\" is missing or not [begin, end]".into())),
    };
    let (Some(begin), Some(end)) = offsets else {
        return Err(err("\"data_offsets\" are not non-negative integers".into()));
    };
    if begin > end {
        return Err(err(format!(
            "data_offsets [{begin}, {end}] has begin > end"
        )));
    }
    if end > data_len {
        return Err(err(format!(
            "data_offsets [{begin}, {end}] run past the end of the {data_len}-byte data \
             section (file truncated?)"
        )));
    }
    let len = end - begin;
    if len != expected_bytes {
        return Err(err(format!(
            "{dtype:?} x shape {shape:?} is {expected_bytes} bytes but data_offsets \
             [{begin}, {end}] hold {len}"
        )));
    }
    Ok(RawTensor {
        name,
        dtype,
        shape,
        offset: data_start + begin,
        len,
    })
}

fn tensor_err(path: &Path, tensor: &str, reason: String) -> WeightsError {
    WeightsError::Tensor {
        file: path.to_path_buf(),
        tensor: truncate(tensor),
        reason,
    }
}

/// Names from a hostile header can be megabytes long; keep messages readable.
fn truncate(s: &str) -> String {
    if s.chars().count() > 200 {
        let head: String = s.chars().take(197).collect();
        format!("{head}...")
    } else {
        s.to_string()
    }
}

/// The header's top-level entries in file order, keeping duplicate keys (which a
/// `serde_json::Map` would silently merge) so they can be refused.
struct Entries(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entries;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object of tensor entries")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Value>()? {
                    out.push((k, v));
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(V)
    }
}
