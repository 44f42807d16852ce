//! DeepSeek-V4's attention (transformers' `DeepseekV4Attention` and its compressors), one
//! token at a time: one shared key=value head over the last `sliding_window` positions, and
//! on the compressed layers the entries the compressor has closed so far (every one on an HCA
//! layer; the indexer's top-k on a CSA layer). Queries and keys rotate their last `rope_dim`
//! values (interleaved pairs); the output's rotated part turns back by the query's position,
//! so each value counts by its distance. A learned sink per head joins the softmax.
//!
//! The compressor state kept per sequence ([`LayerState`]) is what transformers'
//! `DeepseekV4HCACache` / `DeepseekV4CSACache` hold: the tokens of the window not yet closed,
//! the previous window's first series (CSA's overlap) and the entries emitted.

use std::collections::VecDeque;

use super::dsv4_hc::{unweighted_rms, Mat};
use super::dsv4_trail::{LayerTrail, SeriesTrail, Shape};
use super::kv::Dsv4Kv;
use super::rope::Rope;
use crate::config::{Dsv4Attn, Dsv4Config};
use crate::error::EngineError;
use crate::quant::QFormat;
use crate::weights::ShardSet;

/// `x * rsqrt(mean(x^2) + eps) * w`, in place.
pub(crate) fn rms(x: &mut [f32], w: &[f32], eps: f32) {
    unweighted_rms(x, eps);
    x.iter_mut().zip(w).for_each(|(v, g)| *v *= g);
}

/// Rotates the last `rope.dim()` values of each `width`-wide head of `x` by `pos`; `conj`
/// turns them the other way (the output's `-sin`).
fn rotate_tail(rope: &Rope, x: &mut [f32], width: usize, pos: usize, conj: bool) {
    let r = rope.dim();
    let mut cs = Vec::with_capacity(r);
    rope.cos_sin(pos, &mut cs);
    for head in x.chunks_exact_mut(width) {
        let tail = &mut head[width - r..];
        for (pair, t) in tail.chunks_exact_mut(2).zip(cs.chunks_exact(2)) {
            let (cos, sin) = (t[0], if conj { -t[1] } else { t[1] });
            let (x0, x1) = (pair[0], pair[1]);
            pair[0] = x0 * cos - x1 * sin;
            pair[1] = x1 * cos + x0 * sin;
        }
    }
}

/// One compressor: `kv_proj` and `gate_proj` of `series * dim` (CSA's two overlapping
/// series, HCA's one), the per-slot `position_bias`, `kv_norm`.
struct Compressor {
    rate: usize,
    dim: usize,
    overlap: bool,
    kv: Mat,
    gate: Mat,
    bias: Vec<f32>,
    norm: Vec<f32>,
}

impl Compressor {
    fn load(
        s: &ShardSet,
        p: &str,
        rate: usize,
        dim: usize,
        overlap: bool,
        h: usize,
        fmt: QFormat,
    ) -> Result<Self, EngineError> {
        let w = if overlap { 2 * dim } else { dim };
        Ok(Compressor {
            rate,
            dim,
            overlap,
            kv: Mat::read_as(s, &format!("{p}.wkv.weight"), w, h, fmt)?,
            gate: Mat::read_as(s, &format!("{p}.wgate.weight"), w, h, fmt)?,
            bias: s.read_f32(&format!("{p}.ape"), &[rate, w])?,
            norm: s.read_f32(&format!("{p}.norm.weight"), &[dim])?,
        })
    }

    /// (f32 values held, multiply-accumulates per token): its two projections, the
    /// position biases and the norm.
    fn counts(&self) -> (u64, u64) {
        let m = self.kv.macs() + self.gate.macs();
        (m + (self.bias.len() + self.norm.len()) as u64, m)
    }

    /// What its verify trail needs to know of it (`dsv4_trail.rs`).
    fn shape(&self) -> Shape {
        (self.kv.rows, self.rate, self.dim, self.overlap)
    }

    /// Feeds one token's input `a`; when it closes a window, appends the window's entry.
    /// `log` (a verify step) keeps the row fed.
    fn feed(
        &self,
        st: &mut Series,
        a: &[f32],
        rope: &Rope,
        eps: f32,
        log: Option<&mut SeriesTrail>,
    ) {
        let w = self.kv.rows;
        let kv = self.kv.apply(a);
        let mut gate = self.gate.apply(a);
        let slot = st.buf_kv.len() / w;
        gate.iter_mut()
            .zip(&self.bias[slot * w..(slot + 1) * w])
            .for_each(|(g, b)| *g += b);
        if let Some(log) = log {
            log.log(&kv, &gate);
        }
        st.buf_kv.extend_from_slice(&kv);
        st.buf_gate.extend_from_slice(&gate);
        if st.buf_kv.len() < self.rate * w {
            return;
        }
        let d = self.dim;
        // Per value: the slots of the window (CSA: the previous window's first series, then
        // this window's second), softmaxed over the slots by their gates.
        let mut slots: Vec<(&[f32], &[f32])> = Vec::with_capacity(2 * self.rate);
        if self.overlap {
            if let Some((pk, pg)) = &st.prior {
                for i in 0..self.rate {
                    slots.push((&pk[i * d..(i + 1) * d], &pg[i * d..(i + 1) * d]));
                }
            }
        }
        let off = if self.overlap { d } else { 0 };
        for i in 0..self.rate {
            slots.push((
                &st.buf_kv[i * w + off..i * w + off + d],
                &st.buf_gate[i * w + off..i * w + off + d],
            ));
        }
        let mut entry = vec![0.0f32; d];
        for (j, e) in entry.iter_mut().enumerate() {
            let max = slots
                .iter()
                .map(|(_, g)| g[j])
                .fold(f32::NEG_INFINITY, f32::max);
            let sum: f32 = slots.iter().map(|(_, g)| (g[j] - max).exp()).sum();
            *e = slots
                .iter()
                .map(|(k, g)| k[j] * ((g[j] - max).exp() / sum))
                .sum();
        }
        rms(&mut entry, &self.norm, eps);
        rotate_tail(rope, &mut entry, d, st.entries.len() * self.rate, false);
        st.entries.push(entry);
        if self.overlap {
            let first = |buf: &[f32]| -> Vec<f32> {
                (0..self.rate)
                    .flat_map(|i| buf[i * w..i * w + d].to_vec())
                    .collect()
            };
            st.prior = Some((first(&st.buf_kv), first(&st.buf_gate)));
        }
        st.buf_kv.clear();
        st.buf_gate.clear();
    }
}

/// One compressor's state in one sequence.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Series {
    /// The inputs of the window not yet closed: per token its kv and biased gate rows.
    pub buf_kv: Vec<f32>,
    pub buf_gate: Vec<f32>,
    /// CSA: the last closed window's first series (kv, biased gate), `rate * dim` each.
    pub prior: Option<(Vec<f32>, Vec<f32>)>,
    /// The entries emitted so far, rotated to their window's first position.
    pub entries: Vec<Vec<f32>>,
}

/// One layer's attention state in one sequence.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct LayerState {
    /// The keys (= values) of the last `sliding_window` positions.
    pub window: VecDeque<Vec<f32>>,
    pub compressor: Series,
    pub indexer: Series,
}

/// The lightning indexer of a CSA layer.
struct Indexer {
    comp: Compressor,
    heads: usize,
    dim: usize,
    topk: usize,
    q_b: Mat,
    weights: Mat,
}

pub(crate) struct Attention {
    kind: Dsv4Attn,
    heads: usize,
    head_dim: usize,
    groups: usize,
    window: usize,
    eps: f32,
    q_a: Mat,
    q_a_norm: Vec<f32>,
    q_b: Mat,
    kv: Mat,
    kv_norm: Vec<f32>,
    o_a: Mat,
    o_b: Mat,
    sinks: Vec<f32>,
    compressor: Option<Compressor>,
    indexer: Option<Indexer>,
}

impl Attention {
    /// Layer `lp`'s attention (`{lp}.attn.*`, the reference's names). Its projections and
    /// the compressors' are in `fmt` (`--dense-bits`, or as converted); the small tensors
    /// (norms, sinks, position biases, the indexer's head weights) stay f32.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn load(
        s: &ShardSet,
        lp: &str,
        l: usize,
        d: &Dsv4Config,
        hidden: usize,
        heads: usize,
        eps: f32,
        fmt: QFormat,
    ) -> Result<Self, EngineError> {
        let p = format!("{lp}.attn");
        let (hd, ql) = (d.head_dim, d.q_lora_rank);
        let kind = d.layer_types[l];
        let compressor = match kind {
            Dsv4Attn::Sliding => None,
            Dsv4Attn::Hca => Some(Compressor::load(
                s,
                &format!("{p}.compressor"),
                d.hca_rate,
                hd,
                false,
                hidden,
                fmt,
            )?),
            Dsv4Attn::Csa => Some(Compressor::load(
                s,
                &format!("{p}.compressor"),
                d.csa_rate,
                hd,
                true,
                hidden,
                fmt,
            )?),
        };
        let indexer = match kind {
            Dsv4Attn::Csa => {
                let ip = format!("{p}.indexer");
                let (ih, id) = (d.index_n_heads, d.index_head_dim);
                Some(Indexer {
                    comp: Compressor::load(
                        s,
                        &format!("{ip}.compressor"),
                        d.csa_rate,
                        id,
                        true,
                        hidden,
                        fmt,
                    )?,
                    heads: ih,
                    dim: id,
                    topk: d.index_topk,
                    q_b: Mat::read_as(s, &format!("{ip}.wq_b.weight"), ih * id, ql, fmt)?,
                    weights: Mat::read(s, &format!("{ip}.weights_proj.weight"), ih, hidden)?,
                })
            }
            _ => None,
        };
        let g = d.o_groups;
        Ok(Attention {
            kind,
            heads,
            head_dim: hd,
            groups: g,
            window: d.sliding_window,
            eps,
            q_a: Mat::read_as(s, &format!("{p}.wq_a.weight"), ql, hidden, fmt)?,
            q_a_norm: s.read_f32(&format!("{p}.q_norm.weight"), &[ql])?,
            q_b: Mat::read_as(s, &format!("{p}.wq_b.weight"), heads * hd, ql, fmt)?,
            kv: Mat::read_as(s, &format!("{p}.wkv.weight"), hd, hidden, fmt)?,
            kv_norm: s.read_f32(&format!("{p}.norm.weight"), &[hd])?,
            o_a: Mat::read_as(
                s,
                &format!("{p}.wo_a.weight"),
                g * d.o_lora_rank,
                heads * hd / g,
                fmt,
            )?,
            o_b: Mat::read_as(
                s,
                &format!("{p}.wo_b.weight"),
                hidden,
                g * d.o_lora_rank,
                fmt,
            )?,
            sinks: s.read_f32(&format!("{p}.attn_sink"), &[heads])?,
            compressor,
            indexer,
        })
    }

    /// (f32 values held, multiply-accumulates per token of its weight products): the query,
    /// key and grouped output projections, the compressors and the indexer, with their norms,
    /// sinks and position biases (the attention core over the keys is not a weight product).
    pub(crate) fn counts(&self) -> (u64, u64) {
        let mats = [&self.q_a, &self.q_b, &self.kv, &self.o_a, &self.o_b];
        let mut macs: u64 = mats.iter().map(|m| m.macs()).sum();
        let mut values =
            macs + (self.q_a_norm.len() + self.kv_norm.len() + self.sinks.len()) as u64;
        if let Some(c) = &self.compressor {
            let (v, m) = c.counts();
            (values, macs) = (values + v, macs + m);
        }
        if let Some(ix) = &self.indexer {
            let (v, m) = ix.comp.counts();
            let own = ix.q_b.macs() + ix.weights.macs();
            (values, macs) = (values + v + own, macs + m + own);
        }
        (values, macs)
    }

    /// A verify step starts at `kv`: `trail` keeps what cutting its rejected rows needs.
    pub(crate) fn begin_trail(&self, trail: &mut LayerTrail, kv: &Dsv4Kv) {
        let compressor = self.compressor.as_ref().map(Compressor::shape);
        let indexer = self.indexer.as_ref().map(|ix| ix.comp.shape());
        trail.begin(kv, self.window, compressor, indexer);
    }

    /// The attention output of input `a` (the normalised block input) at `pos`, `st` moved
    /// past it. `main` rotates the sliding layers, `compress` the compressed ones, their
    /// compressors and the indexer. `trail` (a verify step, begun) logs what the row changed.
    pub(crate) fn forward(
        &self,
        a: &[f32],
        pos: usize,
        st: &mut LayerState,
        main: &Rope,
        compress: &Rope,
        mut trail: Option<&mut LayerTrail>,
    ) -> Vec<f32> {
        let rope = if self.kind == Dsv4Attn::Sliding {
            main
        } else {
            compress
        };
        let hd = self.head_dim;
        let mut qr = self.q_a.apply(a);
        rms(&mut qr, &self.q_a_norm, self.eps);
        let mut q = self.q_b.apply(&qr);
        q.chunks_exact_mut(hd)
            .for_each(|h| unweighted_rms(h, self.eps));
        rotate_tail(rope, &mut q, hd, pos, false);
        let mut kv = self.kv.apply(a);
        rms(&mut kv, &self.kv_norm, self.eps);
        rotate_tail(rope, &mut kv, hd, pos, false);
        st.window.push_back(kv);
        while st.window.len() > self.window {
            let out = st.window.pop_front();
            if let (Some(t), Some(r)) = (trail.as_deref_mut(), out) {
                t.popped.push(r);
            }
        }
        // The compressed entries this query sees.
        let mut picked: Vec<usize> = Vec::new();
        if let Some(c) = &self.compressor {
            let (clog, ilog) = match trail {
                Some(t) => (Some(&mut t.compressor), Some(&mut t.indexer)),
                None => (None, None),
            };
            c.feed(&mut st.compressor, a, compress, self.eps, clog);
            let n = st.compressor.entries.len();
            picked = match &self.indexer {
                None => (0..n).collect(),
                Some(ix) => ix.select(a, &qr, pos, &mut st.indexer, compress, self.eps, ilog),
            };
        }
        let keys: Vec<&[f32]> = st
            .window
            .iter()
            .map(Vec::as_slice)
            .chain(picked.iter().map(|&i| st.compressor.entries[i].as_slice()))
            .collect();
        let scale = 1.0 / (hd as f32).sqrt();
        let mut out = vec![0.0f32; self.heads * hd];
        let mut logits = vec![0.0f32; keys.len()];
        for h in 0..self.heads {
            let qh = &q[h * hd..(h + 1) * hd];
            for (lg, k) in logits.iter_mut().zip(&keys) {
                *lg = qh.iter().zip(k.iter()).map(|(x, y)| x * y).sum::<f32>() * scale;
            }
            let sink = self.sinks[h];
            let max = logits.iter().copied().fold(sink, f32::max);
            let denom: f32 =
                logits.iter().map(|v| (v - max).exp()).sum::<f32>() + (sink - max).exp();
            let oh = &mut out[h * hd..(h + 1) * hd];
            for (lg, k) in logits.iter().zip(&keys) {
                let p = (lg - max).exp() / denom;
                oh.iter_mut().zip(k.iter()).for_each(|(o, v)| *o += p * v);
            }
        }
        rotate_tail(rope, &mut out, hd, pos, true);
        // The grouped low-rank output: each group of heads through its own block of o_a_proj.
        let per_in = self.heads * hd / self.groups;
        let per_out = self.o_a.rows / self.groups;
        let mut mid = vec![0.0f32; self.o_a.rows];
        for g in 0..self.groups {
            let x = &out[g * per_in..(g + 1) * per_in];
            let w = &self.o_a.w[g * per_out * per_in..(g + 1) * per_out * per_in];
            for (o, row) in mid[g * per_out..(g + 1) * per_out]
                .iter_mut()
                .zip(w.chunks_exact(per_in))
            {
                *o = row.iter().zip(x).map(|(a, b)| a * b).sum();
            }
        }
        self.o_b.apply(&mid)
    }
}

impl Indexer {
    /// Feeds the indexer's compressor and returns the compressed entries query `pos` attends
    /// to: the `topk` best by `sum_h w_h relu(q_h . k)` among those closed, best first
    /// (ties: the earlier entry). `log` as [`Compressor::feed`] takes it.
    #[allow(clippy::too_many_arguments)]
    fn select(
        &self,
        a: &[f32],
        qr: &[f32],
        pos: usize,
        st: &mut Series,
        rope: &Rope,
        eps: f32,
        log: Option<&mut SeriesTrail>,
    ) -> Vec<usize> {
        self.comp.feed(st, a, rope, eps, log);
        let n = st.entries.len();
        if n == 0 {
            return Vec::new();
        }
        let mut q = self.q_b.apply(qr);
        rotate_tail(rope, &mut q, self.dim, pos, false);
        let w: Vec<f32> = self
            .weights
            .apply(a)
            .iter()
            .map(|v| v * (self.heads as f32).powf(-0.5))
            .collect();
        let scale = (self.dim as f32).powf(-0.5);
        let scores: Vec<f32> = st
            .entries
            .iter()
            .map(|k| {
                (0..self.heads)
                    .map(|h| {
                        let dot: f32 = q[h * self.dim..(h + 1) * self.dim]
                            .iter()
                            .zip(k)
                            .map(|(x, y)| x * y)
                            .sum();
                        dot.max(0.0) * scale * w[h]
                    })
                    .sum()
            })
            .collect();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&x, &y| scores[y].total_cmp(&scores[x]).then(x.cmp(&y)));
        order.truncate(self.topk.min(n));
        order
    }
}
