//! A projection `y = W x (+ b)` over a quantized or f32 weight, loaded from a shard set.

use super::placement::{self, DeviceSlot};
use crate::error::EngineError;
use crate::quant::{QFormat, QMatrix};
use crate::weights::{Dtype, ShardSet};

pub use crate::quant::ActMode;

pub struct Linear {
    /// The weights; kept on the CPU even when `slot` holds a device copy, so a failed device
    /// falls back to the CPU mid-turn with the same answer.
    pub w: QMatrix,
    pub bias: Option<Vec<f32>>,
    /// The device copies of `w` (`--vram-gb`), which only the placement reads: where the
    /// product runs is its decision (`model::placement`).
    pub slot: DeviceSlot,
}

impl Linear {
    /// `w` (+ `bias`), placed nowhere yet.
    pub fn new(w: QMatrix, bias: Option<Vec<f32>>) -> Linear {
        Linear {
            w,
            bias,
            slot: DeviceSlot::default(),
        }
    }

    pub fn out_dim(&self) -> usize {
        self.w.rows()
    }

    pub fn in_dim(&self) -> usize {
        self.w.cols()
    }

    /// `y[s] = W x[s] + b` for each of the `n` rows of `x`.
    pub fn forward(&self, x: &[f32], n: usize, y: &mut [f32], act: ActMode) {
        debug_assert_eq!(x.len(), n * self.in_dim());
        debug_assert_eq!(y.len(), n * self.out_dim());
        placement::product(&self.slot, &self.w, x, n, y, act);
        self.add_bias(y);
    }

    fn add_bias(&self, y: &mut [f32]) {
        if let Some(b) = &self.bias {
            for row in y.chunks_exact_mut(b.len()) {
                for (v, bb) in row.iter_mut().zip(b) {
                    *v += bb;
                }
            }
        }
    }

    /// `a` and `b` over the same rows `x` in one product (see [`placement::product_pair`]):
    /// bit-identical to two [`Linear::forward`] calls.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_pair(
        a: &Linear,
        b: &Linear,
        x: &[f32],
        n: usize,
        ya: &mut [f32],
        yb: &mut [f32],
        act: ActMode,
    ) {
        placement::product_pair((&a.slot, &a.w), (&b.slot, &b.w), x, n, ya, yb, act);
        a.add_bias(ya);
        b.add_bias(yb);
    }

    /// Whether the CPU may take this product a block of output rows at a time from `w`: no
    /// bias (which the row products leave out) and not run whole by the placement.
    pub fn by_row_blocks(&self) -> bool {
        self.bias.is_none() && !placement::runs_whole(&self.slot)
    }

    /// Allocating convenience for the load path and tests.
    pub fn apply(&self, x: &[f32], n: usize, act: ActMode) -> Vec<f32> {
        let mut y = vec![0.0; n * self.out_dim()];
        self.forward(x, n, &mut y, act);
        y
    }
}

/// Loads `name` as an `[rows, cols]` matrix: a pre-quantized container tensor (U8/I8 blob plus
/// `<name>.qs` scales) and a GGUF tensor of a type computed as stored keep their stored format;
/// f32/bf16/f16, FP8 (block-dequantized) and other GGUF sources are quantized to `fmt`.
pub fn load_matrix(
    shards: &ShardSet,
    name: &str,
    rows: usize,
    cols: usize,
    fmt: QFormat,
) -> Result<QMatrix, EngineError> {
    let info = shards.get(name).ok_or_else(|| {
        EngineError::from(crate::weights::WeightsError::Missing {
            name: name.to_string(),
        })
    })?;
    if info.dtype.is_packed() {
        let scales_name = format!("{name}.qs");
        let scale_info = shards.get(&scales_name).ok_or_else(|| {
            EngineError::Load(format!(
                "tensor {name} is stored as {:?} but its scales {scales_name} are missing",
                info.dtype
            ))
        })?;
        let scales = shards.read_f32(&scales_name, &scale_info.shape.clone())?;
        let data = shards.read_owned(name)?;
        return QMatrix::from_packed(rows, cols, data, scales)
            .map_err(|e| EngineError::Load(format!("tensor {name}: {e}")));
    }
    // A GGUF tensor of a type the kernels compute as stored keeps its blocks, as a packed
    // container tensor keeps its format: llama.cpp computes it so, and turning it into `fmt`
    // would cost memory (f32: 4 bytes a weight, the default) or round it a second time.
    if let Dtype::Ggml(t) = info.dtype {
        if crate::quant::ggml::act_kind(t).is_some() {
            let data = shards.read_owned(name)?;
            return QMatrix::from_ggml(t, rows, cols, data)
                .map_err(|e| EngineError::Load(format!("tensor {name}: {e}")));
        }
    }
    let w = shards.read_f32(name, &[rows, cols])?;
    Ok(if fmt == QFormat::F32 {
        QMatrix::from_f32(w, rows, cols)
    } else {
        QMatrix::quantize(&w, rows, cols, fmt)
    })
}

pub fn load_linear(
    shards: &ShardSet,
    name: &str,
    rows: usize,
    cols: usize,
    fmt: QFormat,
    with_bias: bool,
) -> Result<Linear, EngineError> {
    let w = load_matrix(shards, &format!("{name}.weight"), rows, cols, fmt)?;
    let bias = if with_bias {
        Some(shards.read_f32(&format!("{name}.bias"), &[rows])?)
    } else {
        None
    };
    Ok(Linear::new(w, bias))
}
