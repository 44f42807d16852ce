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
        let mut header = serde_json::Map::new();
        let mut offset = 0usize;
        for (name, dtype, shape, bytes) in &self.tensors {
            header.insert(
                name.clone(),
                serde_json::json!({
                    "dtype": dtype.safetensors_name(),
                    "shape": shape,
                    "data_offsets": [offset, offset + bytes.len()],
                }),
            );
            offset += bytes.len();
        }
        let mut text = serde_json::to_string(&serde_json::Value::Object(header))?.into_bytes();
        while text.len() % 8 != 0 {
            text.push(b' ');
        }
        let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
        f.write_all(&(text.len() as u64).to_le_bytes())?;
        f.write_all(&text)?;
        for (_, _, _, bytes) in &self.tensors {
            f.write_all(bytes)?;
        }
        f.flush()
    }
}
