//! GGUF metadata: the typed key/values of the header, and the bounds-checked little-endian
//! cursor the whole header is read with.

use std::path::Path;

use super::GgufError;

/// One metadata value, as typed in the file.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    U64(u64),
    I64(i64),
    F64(f64),
    /// An array: its element type id and the values (all of that type).
    Array(u32, Vec<GgufValue>),
}

impl GgufValue {
    /// The GGUF value type id (`GGUFValueType`).
    pub fn type_id(&self) -> u32 {
        match self {
            GgufValue::U8(_) => 0,
            GgufValue::I8(_) => 1,
            GgufValue::U16(_) => 2,
            GgufValue::I16(_) => 3,
            GgufValue::U32(_) => 4,
            GgufValue::I32(_) => 5,
            GgufValue::F32(_) => 6,
            GgufValue::Bool(_) => 7,
            GgufValue::String(_) => 8,
            GgufValue::Array(..) => 9,
            GgufValue::U64(_) => 10,
            GgufValue::I64(_) => 11,
            GgufValue::F64(_) => 12,
        }
    }

    /// The value as an unsigned integer, for any integer type holding a non-negative value.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v as u64),
            GgufValue::U16(v) => Some(v as u64),
            GgufValue::U32(v) => Some(v as u64),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }
}

/// Nesting depth at which an array of arrays is refused (llama.cpp writes none nested).
const MAX_ARRAY_DEPTH: u32 = 4;

/// A little-endian reader over a file's bytes whose every read is bounds-checked and names
/// what it was reading when it ran out.
pub(super) struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    pub(super) fn new(b: &'a [u8], path: &'a Path) -> Cursor<'a> {
        Cursor { b, pos: 0, path }
    }

    pub(super) fn pos(&self) -> usize {
        self.pos
    }

    fn truncated(&self, what: &str) -> GgufError {
        GgufError::Truncated {
            path: self.path.to_path_buf(),
            what: what.to_string(),
        }
    }

    pub(super) fn bytes(&mut self, n: usize, what: &str) -> Result<&'a [u8], GgufError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| self.truncated(what))?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let s = self.bytes(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub(super) fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(super) fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Refuses `count` items of at least `min_size` bytes each when the rest of the file
    /// cannot hold them: the bound that keeps a hostile count from driving an allocation.
    pub(super) fn check_count(
        &self,
        count: u64,
        min_size: u64,
        what: &str,
    ) -> Result<(), GgufError> {
        let left = (self.b.len() - self.pos) as u64;
        if count.checked_mul(min_size).is_none_or(|need| need > left) {
            return Err(GgufError::AbsurdCount {
                path: self.path.to_path_buf(),
                what: what.to_string(),
                count,
                bytes_left: left,
            });
        }
        Ok(())
    }

    /// A GGUF string: u64 byte length, then UTF-8 bytes.
    pub(super) fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        self.check_count(len, 1, what)?;
        let s = self.bytes(len as usize, what)?;
        String::from_utf8(s.to_vec()).map_err(|_| GgufError::Utf8 {
            path: self.path.to_path_buf(),
            what: what.to_string(),
        })
    }

    fn value(&mut self, ty: u32, key: &str, depth: u32) -> Result<GgufValue, GgufError> {
        Ok(match ty {
            0 => GgufValue::U8(self.array::<1>(key)?[0]),
            1 => GgufValue::I8(self.array::<1>(key)?[0] as i8),
            2 => GgufValue::U16(u16::from_le_bytes(self.array(key)?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array(key)?)),
            4 => GgufValue::U32(self.u32(key)?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array(key)?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array(key)?)),
            7 => match self.array::<1>(key)?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return Err(self.bad_value(key, format!("a bool byte of {b}"))),
            },
            8 => GgufValue::String(self.string(key)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.bad_value(key, "arrays nested too deep".into()));
                }
                let elem = self.u32(key)?;
                let count = self.u64(key)?;
                let min = min_size(elem).ok_or_else(|| {
                    self.bad_value(key, format!("an array of unknown value type {elem}"))
                })?;
                self.check_count(count, min, key)?;
                let mut v = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    v.push(self.value(elem, key, depth + 1)?);
                }
                GgufValue::Array(elem, v)
            }
            10 => GgufValue::U64(self.u64(key)?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array(key)?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array(key)?)),
            t => return Err(self.bad_value(key, format!("unknown value type {t}"))),
        })
    }

    fn bad_value(&self, key: &str, reason: String) -> GgufError {
        GgufError::Metadata {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            reason,
        }
    }
}

/// The fewest bytes one value of type `ty` takes in the file (`None`: unknown type).
fn min_size(ty: u32) -> Option<u64> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 => 8,
        9 => 12,
        10..=12 => 8,
        _ => return None,
    })
}

/// Reads `n_kv` key/values; duplicate keys are refused by name.
pub(super) fn parse_kvs(c: &mut Cursor, n_kv: u64) -> Result<Vec<(String, GgufValue)>, GgufError> {
    // A key/value takes at least 8 (key length) + 4 (type) + 1 bytes.
    c.check_count(n_kv, 13, "metadata key/values")?;
    let mut kvs: Vec<(String, GgufValue)> = Vec::with_capacity(n_kv as usize);
    let mut seen = std::collections::HashSet::with_capacity(n_kv as usize);
    for i in 0..n_kv {
        let key = c.string(&format!("the key of metadata entry #{i}"))?;
        let ty = c.u32(&key)?;
        let v = c.value(ty, &key, 0)?;
        if !seen.insert(key.clone()) {
            return Err(c.bad_value(&key, "the key appears twice".into()));
        }
        kvs.push((key, v));
    }
    Ok(kvs)
}
