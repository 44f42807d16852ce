//! DeepSeek-V4's manifold-constrained hyper-connections (transformers'
//! `DeepseekV4HyperConnection`, `DeepseekV4HyperHead`): the residual is `hc_mult` streams of
//! `hidden` values; before each block a small projection of all of them gives the weights
//! that fold them into the block's input (`pre`), spread the block's output back (`post`) and
//! mix the streams among themselves (`comb`, Sinkhorn-normalised towards doubly stochastic).

use super::scratch::grow;
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

    /// `out = W x`, each row through the f32 dot kernel the dense products use.
    pub(crate) fn matvec(&self, x: &[f32], out: &mut [f32]) {
        debug_assert_eq!(x.len(), self.cols);
        for (o, row) in out.iter_mut().zip(self.w.chunks_exact(self.cols)) {
            *o = crate::quant::dot_f32(row, x);
        }
    }

    /// Its multiply-accumulates per input (also its values).
    pub(crate) fn macs(&self) -> u64 {
        (self.rows * self.cols) as u64
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

/// A row's hyper-connection working memory, reused from row to row and step to step (a
/// decode step does not allocate once it has grown).
#[derive(Default)]
pub(crate) struct HcScratch {
    /// The streams, normalised.
    flat: Vec<f32>,
    /// The mixer's output.
    w: Vec<f32>,
    /// The fold's weights.
    pre: Vec<f32>,
    /// The streams after a block, before they replace the old ones; a folded row.
    next: Vec<f32>,
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

    /// The values of one row's mix ([`HyperConnection::mix_into`]): `post` then `comb`.
    pub(crate) fn mix_len(&self) -> usize {
        self.hc + self.hc * self.hc
    }

    /// The weights for `streams` (`hc * hidden`, stream-major) into `mix` (`hc` post weights,
    /// then `comb[j * hc + k]`: how much of input stream `j` goes to output stream `k`) and the
    /// block input they fold into `collapsed`.
    pub(crate) fn mix_into(
        &self,
        streams: &[f32],
        sc: &mut HcScratch,
        collapsed: &mut [f32],
        mix: &mut [f32],
    ) {
        let hc = self.hc;
        let flat = grow(&mut sc.flat, streams.len());
        flat.copy_from_slice(streams);
        unweighted_rms(flat, self.norm_eps);
        let w = grow(&mut sc.w, self.fn_.rows);
        self.fn_.matvec(flat, w);
        let pre = grow(&mut sc.pre, hc);
        for (i, p) in pre.iter_mut().enumerate() {
            *p = sigmoid(w[i] * self.scale[0] + self.base[i]) + self.hc_eps;
        }
        let (post, comb) = mix.split_at_mut(hc);
        for (i, p) in post.iter_mut().enumerate() {
            *p = 2.0 * sigmoid(w[hc + i] * self.scale[1] + self.base[hc + i]);
        }
        for (i, c) in comb.iter_mut().enumerate() {
            *c = w[2 * hc + i] * self.scale[2] + self.base[2 * hc + i];
        }
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
        cols(&mut *comb);
        for _ in 1..self.iters {
            for row in comb.chunks_exact_mut(hc) {
                let sum: f32 = row.iter().sum::<f32>() + self.hc_eps;
                row.iter_mut().for_each(|v| *v /= sum);
            }
            cols(&mut *comb);
        }
        fold(streams, pre, collapsed);
    }
}

/// `out = sum_k pre[k] * stream_k`.
fn fold(streams: &[f32], pre: &[f32], out: &mut [f32]) {
    let hidden = out.len();
    out.fill(0.0);
    for (k, &p) in pre.iter().enumerate() {
        for (o, v) in out.iter_mut().zip(&streams[k * hidden..(k + 1) * hidden]) {
            *o += p * v;
        }
    }
}

/// `streams` after the block whose output is `out`, by a row's `mix` (as
/// [`HyperConnection::mix_into`] wrote it): `post[k] * out + sum_j comb[j][k] * stream_j`.
pub(crate) fn put_back(mix: &[f32], streams: &mut [f32], out: &[f32], sc: &mut HcScratch) {
    let hidden = out.len();
    let hc = streams.len() / hidden;
    let (post, comb) = mix.split_at(hc);
    let next = grow(&mut sc.next, hc * hidden);
    for k in 0..hc {
        let dst = &mut next[k * hidden..(k + 1) * hidden];
        for (d, o) in dst.iter_mut().zip(out) {
            *d = post[k] * o;
        }
        for j in 0..hc {
            let c = comb[j * hc + k];
            for (d, v) in dst.iter_mut().zip(&streams[j * hidden..(j + 1) * hidden]) {
                *d += c * v;
            }
        }
    }
    streams.copy_from_slice(next);
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

    /// The streams of one row (`hc * hidden`) folded into `out` (`hidden`).
    pub(crate) fn fold_into(&self, streams: &[f32], sc: &mut HcScratch, out: &mut [f32]) {
        let flat = grow(&mut sc.flat, streams.len());
        flat.copy_from_slice(streams);
        unweighted_rms(flat, self.norm_eps);
        let w = grow(&mut sc.w, self.fn_.rows);
        self.fn_.matvec(flat, w);
        let pre = grow(&mut sc.pre, w.len());
        for ((p, m), b) in pre.iter_mut().zip(&*w).zip(&self.base) {
            *p = sigmoid(m * self.scale + b) + self.hc_eps;
        }
        fold(streams, pre, out);
    }

    /// The first `n` rows of `x` (`hc * hidden` each) folded, row `r` into `x[r * hidden..]`:
    /// row `r`'s streams lie at or past row `r`'s folded place, so folding in row order
    /// overwrites only streams already read.
    pub(crate) fn fold_rows(&self, x: &mut [f32], n: usize, hidden: usize, sc: &mut HcScratch) {
        let width = self.fn_.cols;
        for r in 0..n {
            let mut out = std::mem::take(&mut sc.next);
            self.fold_into(&x[r * width..(r + 1) * width], sc, grow(&mut out, hidden));
            x[r * hidden..(r + 1) * hidden].copy_from_slice(&out[..hidden]);
            sc.next = out;
        }
    }
}
