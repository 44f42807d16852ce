//! A minimal safetensors writer: for pre-quantized containers written by tools and tests.
//! Tensors are laid out in the order they are added, so a caller that adds an expert's
//! gate, up and down one after the other gets them adjacent in the file (one read each).

use std::io::Write;
use std::path::Path;

use super::{Dtype, IN_PLACE_ALIGN};

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

    /// Writes the file (header padded with spaces so the data starts on a 64-byte boundary).
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
/// the JSON header, padded with spaces (as the format allows) so that the data section starts
/// on a [`IN_PLACE_ALIGN`] boundary: a tensor whose offset in the data section is a multiple
/// of 64 (every one behind tensors of whole 64-byte sizes, most of a model) can then be
/// computed where the file's map holds it. The JSON keys are sorted (serde_json's map), so
/// the same entries always give the same bytes.
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
    while (8 + text.len()) % IN_PLACE_ALIGN as usize != 0 {
        text.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + text.len());
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(&text);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_starts_on_a_64_byte_boundary_whatever_the_names() {
        let shape = [3usize, 5];
        for n in 0..70 {
            // Names of every length move the JSON's end through all residues mod 64.
            let name = "t".repeat(n + 1);
            let entries = [HeaderEntry {
                name: &name,
                dtype: Dtype::F32,
                shape: &shape,
                len: 60,
            }];
            let h = header_bytes(&entries).unwrap();
            assert_eq!(h.len() % 64, 0, "{n}");
            let text_len = u64::from_le_bytes(h[..8].try_into().unwrap()) as usize;
            assert_eq!(8 + text_len, h.len());
            // Padding is spaces after the JSON, which still parses as the same header.
            let text = std::str::from_utf8(&h[8..]).unwrap();
            let v: serde_json::Value = serde_json::from_str(text).unwrap();
            assert_eq!(v[&name]["data_offsets"], serde_json::json!([0, 60]));
        }
    }

    #[test]
    fn a_written_file_reads_back_with_its_first_tensor_aligned() {
        let dir = std::env::temp_dir().join(format!("colibri-writer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.safetensors");
        let mut w = SafetensorsWriter::new();
        w.add_f32("a.weight", &[2, 32], &[0.5; 64]);
        w.add_f32("b.bias", &[3], &[1.0, 2.0, 3.0]);
        w.write(&path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let tensors = crate::weights::safetensors::parse_header(&bytes, &path).unwrap();
        let a = tensors.iter().find(|t| t.name == "a.weight").unwrap();
        assert_eq!(a.offset % IN_PLACE_ALIGN, 0);
        assert_eq!(bytes.len() as u64, a.offset + 256 + 12);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
