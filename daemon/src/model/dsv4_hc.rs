//! DeepSeek-V4's manifold-constrained hyper-connections (transformers'
//! `DeepseekV4HyperConnection`, `DeepseekV4HyperHead`): the residual is `hc_mult` streams of
//! `hidden` values; before each block a small projection of all of them gives the weights
//! that fold them into the block's input (`pre`), spread the block's output back (`post`) and
//! mix the streams among themselves (`comb`, Sinkhorn-normalised towards doubly stochastic).

use crate::error::EngineError;
use crate::weights::ShardSet;

/// `x * rsqrt(mean(x^2) + eps)`, in place (transformers' `DeepseekV4UnweightedRMSNorm`).
pub(crate) fn unweighted_rms(x: &mut [f32], eps: f32) {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let r = 1.0 / (ms + eps).sqrt();
    x.iter_mut().for_each(|v| *v *= r);
}

/// The first of `names` the checkpoint holds (the first, for the error, when none).
pub(crate) fn pick(s: &ShardSet, names: &[String]) -> String {
    names
        .iter()
        .find(|n| s.contains(n))
        .unwrap_or(&names[0])
        .clone()
}

/// Layer `l`'s prefix: `model.layers.{l}` as transformers saves it, `layers.{l}` as the
/// published checkpoints have it (the tensor names under it are the same: the reference's).
pub(crate) fn layer_prefix(s: &ShardSet, l: usize) -> String {
    pick(
        s,
        &[format!("model.layers.{l}"), format!("layers.{l}")]
            .map(|p| format!("{p}.attn_norm.weight")),
    )
    .trim_end_matches(".attn_norm.weight")
    .to_string()
}

/// A row-major `[rows, cols]` f32 matrix.
pub(crate) struct Mat {
    pub rows: usize,
    pub cols: usize,
    pub w: Vec<f32>,
}

impl Mat {
    pub(crate) fn read(
        s: &ShardSet,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Mat, EngineError> {
        Ok(Mat {
            rows,
            cols,
            w: s.read_f32(name, &[rows, cols])?,
        })
    }

    /// `name` in `fmt` (`--dense-bits`), or as stored when the checkpoint is pre-quantized
    /// (`colibri convert`), kept as its f32 values: the same numbers either way.
    pub(crate) fn read_as(
        s: &ShardSet,
        name: &str,
        rows: usize,
        cols: usize,
        fmt: crate::quant::QFormat,
    ) -> Result<Mat, EngineError> {
        let q = super::linear::load_matrix(s, name, rows, cols, fmt)?;
        Ok(Mat {
            rows,
            cols,
            w: q.dequantize(),
        })
    }

    /// `out = W x`.
    pub(crate) fn matvec(&self, x: &[f32], out: &mut [f32]) {
        debug_assert_eq!(x.len(), self.cols);
        for (o, row) in out.iter_mut().zip(self.w.chunks_exact(self.cols)) {
            *o = row.iter().zip(x).map(|(a, b)| a * b).sum();
        }
    }

    /// Its multiply-accumulates per input (also its values).
    pub(crate) fn macs(&self) -> u64 {
        (self.rows * self.cols) as u64
    }

    pub(crate) fn apply(&self, x: &[f32]) -> Vec<f32> {
        let mut out = vec![0.0; self.rows];
        self.matvec(x, &mut out);
        out
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// One hyper-connection (`attn_hc` or `ffn_hc` of a layer).
pub(crate) struct HyperConnection {
    hc: usize,
    iters: usize,
    hc_eps: f32,
    norm_eps: f32,
    /// `[(2 + hc) * hc, hc * hidden]`.
    fn_: Mat,
    base: Vec<f32>,
    scale: Vec<f32>,
}

/// What a hyper-connection gives a block: its input, and how to put its output back.
pub(crate) struct Mix {
    pub collapsed: Vec<f32>,
    pub post: Vec<f32>,
    /// `comb[j * hc + k]`: how much of input stream `j` goes to output stream `k`.
    pub comb: Vec<f32>,
}

impl HyperConnection {
    /// (f32 values held, multiply-accumulates per token).
    pub(crate) fn counts(&self) -> (u64, u64) {
        let m = self.fn_.macs();
        (m + (self.base.len() + self.scale.len()) as u64, m)
    }

    /// `p`: the layer's tensors' prefix and `which` `attn` or `ffn` (`{p}.hc_{which}_fn`,
    /// `_base`, `_scale`, as the published checkpoints name them).
    pub(crate) fn load(
        s: &ShardSet,
        p: &str,
        which: &str,
        hc: usize,
        hidden: usize,
        iters: usize,
        hc_eps: f32,
        norm_eps: f32,
    ) -> Result<Self, EngineError> {
        let n = (2 + hc) * hc;
        Ok(HyperConnection {
            hc,
            iters,
            hc_eps,
            norm_eps,
            fn_: Mat::read(s, &format!("{p}.hc_{which}_fn"), n, hc * hidden)?,
            base: s.read_f32(&format!("{p}.hc_{which}_base"), &[n])?,
            scale: s.read_f32(&format!("{p}.hc_{which}_scale"), &[3])?,
        })
    }

    /// The weights for `streams` (`hc * hidden`, stream-major) and the block input they fold.
    pub(crate) fn mix(&self, streams: &[f32]) -> Mix {
        let hc = self.hc;
        let mut flat = streams.to_vec();
        unweighted_rms(&mut flat, self.norm_eps);
        let w = self.fn_.apply(&flat);
        let pre: Vec<f32> = (0..hc)
            .map(|i| sigmoid(w[i] * self.scale[0] + self.base[i]) + self.hc_eps)
            .collect();
        let post: Vec<f32> = (0..hc)
            .map(|i| 2.0 * sigmoid(w[hc + i] * self.scale[1] + self.base[hc + i]))
            .collect();
        let mut comb: Vec<f32> = (0..hc * hc)
            .map(|i| w[2 * hc + i] * self.scale[2] + self.base[2 * hc + i])
            .collect();
        // Softmax over each row, then the floor.
        for row in comb.chunks_exact_mut(hc) {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            row.iter_mut().for_each(|v| *v = (*v - max).exp());
            let sum: f32 = row.iter().sum();
            row.iter_mut().for_each(|v| *v = *v / sum + self.hc_eps);
        }
        // Sinkhorn-Knopp: columns, then (rows, columns) `iters - 1` more times.
        let cols = |comb: &mut [f32]| {
            for k in 0..hc {
                let sum: f32 = (0..hc).map(|j| comb[j * hc + k]).sum::<f32>() + self.hc_eps;
                (0..hc).for_each(|j| comb[j * hc + k] /= sum);
            }
        };
        cols(&mut comb);
        for _ in 1..self.iters {
            for row in comb.chunks_exact_mut(hc) {
                let sum: f32 = row.iter().sum::<f32>() + self.hc_eps;
                row.iter_mut().for_each(|v| *v /= sum);
            }
            cols(&mut comb);
        }
        Mix {
            collapsed: fold(streams, &pre),
            post,
            comb,
        }
    }
}

/// `sum_k pre[k] * stream_k`.
fn fold(streams: &[f32], pre: &[f32]) -> Vec<f32> {
    let hidden = streams.len() / pre.len();
    let mut out = vec![0.0; hidden];
    for (k, &p) in pre.iter().enumerate() {
        for (o, v) in out.iter_mut().zip(&streams[k * hidden..(k + 1) * hidden]) {
            *o += p * v;
        }
    }
    out
}

impl Mix {
    /// The streams after the block: `post[k] * out + sum_j comb[j][k] * stream_j`.
    pub(crate) fn put_back(&self, streams: &[f32], out: &[f32]) -> Vec<f32> {
        let hc = self.post.len();
        let hidden = out.len();
        let mut next = vec![0.0; hc * hidden];
        for k in 0..hc {
            let dst = &mut next[k * hidden..(k + 1) * hidden];
            for (d, o) in dst.iter_mut().zip(out) {
                *d = self.post[k] * o;
            }
            for j in 0..hc {
                let c = self.comb[j * hc + k];
                for (d, v) in dst.iter_mut().zip(&streams[j * hidden..(j + 1) * hidden]) {
                    *d += c * v;
                }
            }
        }
        next
    }
}

/// The final fold of the streams into one (`model.hc_head`).
pub(crate) struct HyperHead {
    hc_eps: f32,
    norm_eps: f32,
    fn_: Mat,
    base: Vec<f32>,
    scale: f32,
}

impl HyperHead {
    /// The f32 values it holds.
    pub(crate) fn values(&self) -> u64 {
        self.fn_.macs() + self.base.len() as u64 + 1
    }

    pub(crate) fn load(
        s: &ShardSet,
        hc: usize,
        hidden: usize,
        hc_eps: f32,
        norm_eps: f32,
    ) -> Result<Self, EngineError> {
        // transformers saves `model.hc_head.hc_fn`; the published checkpoints `hc_head_fn`.
        let name = |part: &str| {
            pick(
                s,
                &[
                    format!("model.hc_head.hc_{part}"),
                    format!("hc_head_{part}"),
                ],
            )
        };
        Ok(HyperHead {
            hc_eps,
            norm_eps,
            fn_: Mat::read(s, &name("fn"), hc, hc * hidden)?,
            base: s.read_f32(&name("base"), &[hc])?,
            scale: s.read_f32(&name("scale"), &[1])?[0],
        })
    }

    pub(crate) fn fold(&self, streams: &[f32]) -> Vec<f32> {
        let mut flat = streams.to_vec();
        unweighted_rms(&mut flat, self.norm_eps);
        let pre: Vec<f32> = self
            .fn_
            .apply(&flat)
            .iter()
            .zip(&self.base)
            .map(|(m, b)| sigmoid(m * self.scale + b) + self.hc_eps)
            .collect();
        fold(streams, &pre)
    }
}
