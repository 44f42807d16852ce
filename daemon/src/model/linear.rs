//! A projection `y = W x (+ b)` over a quantized or f32 weight, loaded from a shard set.

use crate::error::EngineError;
use crate::gpu::DenseMatrix;
use crate::quant::{QFormat, QMatrix};
use crate::weights::ShardSet;

pub use crate::quant::ActMode;

pub struct Linear {
    /// The weights; kept on the CPU even when `dev` holds a device copy, so a failed device
    /// falls back to the CPU mid-turn with the same answer.
    pub w: QMatrix,
    pub bias: Option<Vec<f32>>,
    /// The device copy the products run on while the device works (`--vram-gb`).
    pub dev: Option<DenseMatrix>,
}

impl Linear {
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
        let on_device = (self.dev.as_ref())
            .is_some_and(|d| DenseMatrix::forward_all(&[d], x, n, &mut [&mut *y], act));
        if !on_device {
            match act {
                ActMode::Int8 => self.w.matmul_i8act(x, n, y),
                ActMode::F32 => self.w.matmul(x, n, y),
            }
        }
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

    /// `a` and `b` over the same rows `x` in one product: with int8 activations the rows are
    /// quantized once and both matrices split across the threads in one parallel region (one
    /// fork and join instead of two). Bit-identical to two [`Linear::forward`] calls.
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
        // Both on the device: one batch, one round trip.
        if let (Some(da), Some(db)) = (&a.dev, &b.dev) {
            if a.in_dim() == b.in_dim()
                && DenseMatrix::forward_all(&[da, db], x, n, &mut [&mut *ya, &mut *yb], act)
            {
                a.add_bias(ya);
                b.add_bias(yb);
                return;
            }
        }
        if act == ActMode::F32 || a.in_dim() != b.in_dim() || a.dev.is_some() || b.dev.is_some() {
            a.forward(x, n, ya, act);
            b.forward(x, n, yb, act);
            return;
        }
        QMatrix::matmul_pair_i8act(&a.w, &b.w, x, n, ya, yb);
        a.add_bias(ya);
        b.add_bias(yb);
    }

    /// Allocating convenience for the load path and tests.
    pub fn apply(&self, x: &[f32], n: usize, act: ActMode) -> Vec<f32> {
        let mut y = vec![0.0; n * self.out_dim()];
        self.forward(x, n, &mut y, act);
        y
    }
}

/// Loads `name` as an `[rows, cols]` matrix: a pre-quantized container tensor (U8/I8 blob plus
/// `<name>.qs` scales) keeps its stored format; f32/bf16/f16 and FP8 (block-dequantized) sources are quantized to `fmt`.
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
        let data = shards.bytes(name)?.to_vec();
        shards.release(name);
        return QMatrix::from_packed(rows, cols, data, scales)
            .map_err(|e| EngineError::Load(format!("tensor {name}: {e}")));
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
    Ok(Linear { w, bias, dev: None })
}
