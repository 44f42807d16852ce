//! A minimal safetensors writer: for pre-quantized containers written by tools and tests.
//! Tensors are laid out in the order they are added, so a caller that adds an expert's
//! gate, up and down one after the other gets them adjacent in the file (one read each).

use std::io::Write;
use std::path::Path;

use super::Dtype;

#[derive(Default)]
pub struct SafetensorsWriter {
    tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)>,
}

impl SafetensorsWriter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&mut self, name: &str, dtype: Dtype, shape: &[usize], bytes: Vec<u8>) {
        debug_assert_eq!(
            shape.iter().product::<usize>() * dtype.size(),
            bytes.len(),
            "{name}"
        );
        self.tensors
            .push((name.to_string(), dtype, shape.to_vec(), bytes));
    }

    pub fn add_f32(&mut self, name: &str, shape: &[usize], values: &[f32]) {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add(name, Dtype::F32, shape, bytes);
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Writes the file (header padded with spaces to a multiple of 8 bytes).
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let entries: Vec<HeaderEntry> = self
            .tensors
            .iter()
            .map(|(name, dtype, shape, bytes)| HeaderEntry {
                name,
                dtype: *dtype,
                shape,
                len: bytes.len() as u64,
            })
            .collect();
        let header = header_bytes(&entries)?;
        let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
        f.write_all(&header)?;
        for (_, _, _, bytes) in &self.tensors {
            f.write_all(bytes)?;
        }
        f.flush()
    }
}

/// One tensor of a header: its bytes follow the previous entry's in the data section.
pub struct HeaderEntry<'a> {
    pub name: &'a str,
    pub dtype: Dtype,
    pub shape: &'a [usize],
    pub len: u64,
}

/// The start of a safetensors file holding `entries` in that order: the 8-byte length and
/// the JSON header, padded with spaces to a multiple of 8 bytes. Not to 64 on purpose: a dense
/// tensor on a 64-byte boundary is computed from the page cache in place, and at real sizes
/// with experts read through the page cache those pages were evicted and read again (the
/// header padded to 64 made DeepSeek-V3's 8-layer shapes decode warm at 2.23 against 3.02
/// tok/s owned; scripts/plan_measure.out.md, 2026-12-07). The JSON keys are sorted
/// (serde_json's map), so the same entries always give the same bytes.
pub fn header_bytes(entries: &[HeaderEntry]) -> std::io::Result<Vec<u8>> {
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for e in entries {
        header.insert(
            e.name.to_string(),
            serde_json::json!({
                "dtype": e.dtype.safetensors_name(),
                "shape": e.shape,
                "data_offsets": [offset, offset + e.len],
            }),
        );
        offset += e.len;
    }
    let mut text = serde_json::to_string(&serde_json::Value::Object(header))?.into_bytes();
    while text.len() % 8 != 0 {
        text.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + text.len());
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(&text);
    Ok(out)
}
