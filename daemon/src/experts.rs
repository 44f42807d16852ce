//! The routed-expert store: where the MoE layers get an expert's gate/up/down weights.
//!
//! Experts are never loaded at start. The first time the router picks one, its three matrices
//! are read with positional reads from the shard that holds them (one read when they are
//! adjacent in the file) and kept. Later issues put the per-layer LRU, the pinned hot store
//! and the disk telemetry behind this same `get`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::EngineError;
use crate::quant::{QFormat, QMatrix};
use crate::weights::{Dtype, ShardSet, TensorInfo};

pub struct Expert {
    pub gate: QMatrix,
    pub up: QMatrix,
    pub down: QMatrix,
}

impl Expert {
    pub fn resident_bytes(&self) -> usize {
        self.gate.resident_bytes() + self.up.resident_bytes() + self.down.resident_bytes()
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct ExpertCounters {
    pub hits: u64,
    pub misses: u64,
    pub bytes_read: u64,
}

pub struct ExpertStore {
    shards: Arc<ShardSet>,
    fmt: QFormat,
    fake_quant: bool,
    hidden: usize,
    inter: usize,
    n_experts: usize,
    /// Indexed by layer; `None` for dense layers.
    slots: Vec<Option<Vec<Mutex<Option<Arc<Expert>>>>>>,
    hits: AtomicU64,
    misses: AtomicU64,
    bytes_read: AtomicU64,
}

impl ExpertStore {
    pub fn new(
        shards: Arc<ShardSet>,
        sparse_layers: &[bool],
        n_experts: usize,
        hidden: usize,
        inter: usize,
        fmt: QFormat,
        fake_quant: bool,
    ) -> Result<ExpertStore, EngineError> {
        let slots = sparse_layers
            .iter()
            .map(|&sparse| sparse.then(|| (0..n_experts).map(|_| Mutex::new(None)).collect()))
            .collect();
        let store = ExpertStore {
            shards,
            fmt,
            fake_quant,
            hidden,
            inter,
            n_experts,
            slots,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
        };
        // Every expert tensor must exist with the right shape before the first token, so a
        // missing or mis-shaped expert is a load error, not a failure in the middle of a turn.
        for (layer, s) in store.slots.iter().enumerate() {
            if s.is_some() {
                for e in 0..n_experts {
                    for (proj, rows, cols) in store.projections() {
                        store.check_tensor(&Self::name(layer, e, proj), rows, cols)?;
                    }
                }
            }
        }
        Ok(store)
    }

    fn projections(&self) -> [(&'static str, usize, usize); 3] {
        [
            ("gate_proj", self.inter, self.hidden),
            ("up_proj", self.inter, self.hidden),
            ("down_proj", self.hidden, self.inter),
        ]
    }

    pub fn name(layer: usize, e: usize, proj: &str) -> String {
        format!("model.layers.{layer}.mlp.experts.{e}.{proj}.weight")
    }

    fn check_tensor(&self, name: &str, rows: usize, cols: usize) -> Result<(), EngineError> {
        let info = self.shards.get(name).ok_or_else(|| {
            EngineError::from(crate::weights::WeightsError::Missing {
                name: name.to_string(),
            })
        })?;
        match info.dtype {
            Dtype::U8 | Dtype::I8 => {
                if !self.shards.contains(&format!("{name}.qs")) {
                    return Err(EngineError::Load(format!(
                        "tensor {name} is packed but {name}.qs is missing"
                    )));
                }
            }
            _ => {
                if info.shape != [rows, cols] {
                    return Err(EngineError::Load(format!(
                        "tensor {name} has shape {:?}, expected [{rows}, {cols}]",
                        info.shape
                    )));
                }
            }
        }
        Ok(())
    }

    pub fn n_experts(&self) -> usize {
        self.n_experts
    }

    pub fn counters(&self) -> ExpertCounters {
        ExpertCounters {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
        }
    }

    /// Experts resident in RAM and their bytes.
    pub fn resident(&self) -> (usize, usize) {
        let mut n = 0;
        let mut bytes = 0;
        for layer in self.slots.iter().flatten() {
            for slot in layer {
                if let Some(x) = slot.lock().as_ref() {
                    n += 1;
                    bytes += x.resident_bytes();
                }
            }
        }
        (n, bytes)
    }

    /// The weights of expert `e` of `layer`, reading them from disk on first use.
    pub fn get(&self, layer: usize, e: usize) -> Result<Arc<Expert>, EngineError> {
        let slot = self
            .slots
            .get(layer)
            .and_then(|s| s.as_ref())
            .and_then(|s| s.get(e))
            .ok_or_else(|| EngineError::Load(format!("no routed expert {e} in layer {layer}")))?;
        let mut guard = slot.lock();
        if let Some(x) = guard.as_ref() {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(x.clone());
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let expert = Arc::new(self.load(layer, e)?);
        *guard = Some(expert.clone());
        Ok(expert)
    }

    fn load(&self, layer: usize, e: usize) -> Result<Expert, EngineError> {
        let [g, u, d] = self.projections();
        Ok(Expert {
            gate: self.load_matrix(&Self::name(layer, e, g.0), g.1, g.2)?,
            up: self.load_matrix(&Self::name(layer, e, u.0), u.1, u.2)?,
            down: self.load_matrix(&Self::name(layer, e, d.0), d.1, d.2)?,
        })
    }

    fn read(&self, info: &TensorInfo) -> Result<Vec<u8>, EngineError> {
        let mut buf = vec![0u8; info.len as usize];
        self.shards.read_at(info.file, info.offset, &mut buf)?;
        self.bytes_read.fetch_add(info.len, Ordering::Relaxed);
        Ok(buf)
    }

    fn load_matrix(&self, name: &str, rows: usize, cols: usize) -> Result<QMatrix, EngineError> {
        let missing = |n: &str| {
            EngineError::from(crate::weights::WeightsError::Missing {
                name: n.to_string(),
            })
        };
        let info = self.shards.get(name).ok_or_else(|| missing(name))?;
        let raw = self.read(info)?;
        let w = match info.dtype {
            Dtype::U8 | Dtype::I8 => {
                let qs_name = format!("{name}.qs");
                let qs = self.shards.get(&qs_name).ok_or_else(|| missing(&qs_name))?;
                let scales = bytes_to_f32(Dtype::F32, &self.read(qs)?);
                return QMatrix::from_packed(rows, cols, raw, scales)
                    .map_err(|err| EngineError::Load(format!("tensor {name}: {err}")));
            }
            dt => bytes_to_f32(dt, &raw),
        };
        Ok(match (self.fmt, self.fake_quant) {
            (QFormat::F32, _) => QMatrix::from_f32(w, rows, cols),
            (fmt, false) => QMatrix::quantize(&w, rows, cols, fmt),
            (fmt, true) => QMatrix::from_f32(
                QMatrix::quantize(&w, rows, cols, fmt).dequantize(),
                rows,
                cols,
            ),
        })
    }
}

/// Little-endian F32/BF16/F16 bytes to f32 values (other dtypes are handled by the caller).
pub fn bytes_to_f32(dtype: Dtype, raw: &[u8]) -> Vec<f32> {
    match dtype {
        Dtype::F32 => raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::BF16 => raw
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::F16 => raw
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::I8 | Dtype::U8 => raw.iter().map(|&b| b as f32).collect(),
    }
}
