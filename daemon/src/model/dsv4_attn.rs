//! DeepSeek-V4's attention (transformers' `DeepseekV4Attention`): one shared key=value head
//! over the last `sliding_window` positions, and on the compressed layers the entries the
//! compressor (`dsv4_compress.rs`) has closed so far (every one on an HCA layer; the indexer's
//! top-k on a CSA layer). Queries and keys rotate their last `rope_dim` values (interleaved
//! pairs); the output's rotated part turns back by the query's position, so each value counts
//! by its distance. A learned sink per head joins the softmax.
//!
//! Every weight product is a [`Linear`] in `--dense-bits` (or as converted), run over all the
//! batch's rows at once, as the other families' projections: the query, key, compressor and
//! indexer projections first, then each sequence's rows in order through the state (the
//! window, the compressors closing their windows, the indexer's choice, the attention core),
//! then the grouped low-rank output. The working memory is [`Dsv4Scratch`], kept with the
//! model's, so a decode step does not allocate once it has grown.
//!
//! The state kept per sequence ([`LayerState`]) is what transformers' `DeepseekV4HCACache` /
//! `DeepseekV4CSACache` hold: the window's keys, and per compressor the tokens of the window
//! not yet closed, the previous window's first series (CSA's overlap) and the entries emitted.

use std::collections::VecDeque;

use super::batch::{SeqStep, Span};
use super::dsv4_compress::Compressor;
pub(crate) use super::dsv4_compress::Series;
use super::dsv4_hc::{unweighted_rms, HcScratch};
use super::dsv4_trail::LayerTrail;
use super::kv::{Dsv4Kv, LayerKv};
use super::linear::{load_linear, ActMode, Linear};
use super::ops::{axpy, dot};
use super::rope::Rope;
use super::scratch::grow;
use crate::config::{Dsv4Attn, Dsv4Config};
use crate::error::EngineError;
use crate::quant::{QFormat, QMatrix};
use crate::weights::ShardSet;

/// `x * rsqrt(mean(x^2) + eps) * w`, in place.
pub(crate) fn rms(x: &mut [f32], w: &[f32], eps: f32) {
    unweighted_rms(x, eps);
    x.iter_mut().zip(w).for_each(|(v, g)| *v *= g);
}

/// Rotates the last `rope.dim()` values of each `width`-wide head of `x` by `pos`; `conj`
/// turns them the other way (the output's `-sin`). `cs` is scratch for the angles.
pub(crate) fn rotate_tail(
    rope: &Rope,
    x: &mut [f32],
    width: usize,
    pos: usize,
    conj: bool,
    cs: &mut Vec<f32>,
) {
    let r = rope.dim();
    cs.clear();
    rope.cos_sin(pos, cs);
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

/// `v` able to hold `n` values without reallocating.
fn reserve_to<T>(v: &mut Vec<T>, n: usize) {
    if v.capacity() < n {
        v.reserve_exact(n - v.len());
    }
}

/// One layer's attention state in one sequence.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct LayerState {
    /// The keys (= values) of the last `sliding_window` positions.
    pub window: VecDeque<Vec<f32>>,
    pub compressor: Series,
    pub indexer: Series,
}

/// The V4 layers' working memory (one set, reused by every layer): the hyper-connections',
/// each row's mixes, and the attention's per-row projections and per-query buffers.
#[derive(Default)]
pub(crate) struct Dsv4Scratch {
    pub hc: HcScratch,
    /// Each row's hyper-connection mix (`HyperConnection::mix_len` values a row).
    pub mixes: Vec<f32>,
    /// The rows' token ids (the hash layers route by them).
    pub tokens: Vec<u32>,
    pub attn: AttnBufs,
}

/// The attention's buffers, `(rows, width)` each unless said otherwise.
#[derive(Default)]
pub(crate) struct AttnBufs {
    /// The query's low-rank latent, normalised.
    qr: Vec<f32>,
    q: Vec<f32>,
    kv: Vec<f32>,
    /// The compressor's kv and gate rows, and the indexer compressor's.
    ckv: Vec<f32>,
    cgate: Vec<f32>,
    ikv: Vec<f32>,
    igate: Vec<f32>,
    /// The indexer's queries and head weights.
    iq: Vec<f32>,
    iw: Vec<f32>,
    /// The heads' outputs, what the grouped output reads.
    heads_out: Vec<f32>,
    /// One output group's inputs and outputs, and all groups' outputs.
    grp_in: Vec<f32>,
    grp_out: Vec<f32>,
    mid: Vec<f32>,
    /// One query's: the rotation's angles, logits, entries seen and indexer scores.
    cs: Vec<f32>,
    logits: Vec<f32>,
    picked: Vec<usize>,
    scores: Vec<f32>,
}

/// The lightning indexer of a CSA layer.
struct Indexer {
    comp: Compressor,
    heads: usize,
    dim: usize,
    topk: usize,
    q_b: Linear,
    /// Small (`heads x hidden`): f32, as the other families' indexers keep it.
    weights: Linear,
}

pub(crate) struct Attention {
    kind: Dsv4Attn,
    heads: usize,
    head_dim: usize,
    window: usize,
    eps: f32,
    q_a: Linear,
    q_a_norm: Vec<f32>,
    q_b: Linear,
    kv: Linear,
    kv_norm: Vec<f32>,
    /// The grouped low-rank output: one block of `wo_a`'s rows per group of heads.
    o_a: Vec<Linear>,
    o_b: Linear,
    sinks: Vec<f32>,
    compressor: Option<Compressor>,
    indexer: Option<Indexer>,
}

/// `m`'s rows cut into `parts` matrices of consecutive rows, each in `m`'s format (the
/// packed formats keep each row's bytes and scales together, so the cut moves no value).
fn split_rows(m: QMatrix, parts: usize, name: &str) -> Result<Vec<QMatrix>, EngineError> {
    let (fmt, rows, cols) = (m.format(), m.rows(), m.cols());
    let per = rows / parts.max(1);
    let (data, scales) = m.into_parts();
    let (rb, sr) = (data.len() / rows.max(1), scales.len() / rows.max(1));
    (0..parts)
        .map(|g| {
            let (r0, r1) = (g * per, (g + 1) * per);
            QMatrix::from_parts(
                fmt,
                per,
                cols,
                data[r0 * rb..r1 * rb].to_vec(),
                scales[r0 * sr..r1 * sr].to_vec(),
            )
            .map_err(|e| EngineError::Load(format!("tensor {name}: group {g}: {e}")))
        })
        .collect()
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
                    q_b: load_linear(s, &format!("{ip}.wq_b"), ih * id, ql, fmt, false)?,
                    weights: load_linear(
                        s,
                        &format!("{ip}.weights_proj"),
                        ih,
                        hidden,
                        QFormat::F32,
                        false,
                    )?,
                })
            }
            _ => None,
        };
        let g = d.o_groups;
        let o_a_name = format!("{p}.wo_a.weight");
        let o_a = super::linear::load_matrix(s, &o_a_name, g * d.o_lora_rank, heads * hd / g, fmt)?;
        Ok(Attention {
            kind,
            heads,
            head_dim: hd,
            window: d.sliding_window,
            eps,
            q_a: load_linear(s, &format!("{p}.wq_a"), ql, hidden, fmt, false)?,
            q_a_norm: s.read_f32(&format!("{p}.q_norm.weight"), &[ql])?,
            q_b: load_linear(s, &format!("{p}.wq_b"), heads * hd, ql, fmt, false)?,
            kv: load_linear(s, &format!("{p}.wkv"), hd, hidden, fmt, false)?,
            kv_norm: s.read_f32(&format!("{p}.norm.weight"), &[hd])?,
            o_a: (split_rows(o_a, g, &o_a_name)?.into_iter())
                .map(|w| Linear::new(w, None))
                .collect(),
            o_b: load_linear(
                s,
                &format!("{p}.wo_b"),
                hidden,
                g * d.o_lora_rank,
                fmt,
                false,
            )?,
            sinks: s.read_f32(&format!("{p}.attn_sink"), &[heads])?,
            compressor,
            indexer,
        })
    }

    /// Every weight product: the query, key and grouped output projections, the compressors'
    /// and the indexer's (counted with every family's `Linear`s).
    pub(crate) fn linears(&self) -> Vec<&Linear> {
        let mut all = vec![&self.q_a, &self.q_b, &self.kv, &self.o_b];
        all.extend(&self.o_a);
        if let Some(c) = &self.compressor {
            all.extend(c.linears());
        }
        if let Some(ix) = &self.indexer {
            all.extend(ix.comp.linears());
            all.extend([&ix.q_b, &ix.weights]);
        }
        all
    }

    /// The format its projections compute in: the output projection's (`--dense-bits`, or
    /// as converted).
    pub(crate) fn out_format(&self) -> QFormat {
        self.o_b.w.format()
    }

    /// The f32 values it holds besides its [`Attention::linears`]: the norms, sinks and the
    /// compressors' position biases and norms.
    pub(crate) fn values(&self) -> u64 {
        let mut values = (self.q_a_norm.len() + self.kv_norm.len() + self.sinks.len()) as u64;
        if let Some(c) = &self.compressor {
            values += c.values();
        }
        if let Some(ix) = &self.indexer {
            values += ix.comp.values();
        }
        values
    }

    /// A verify step starts at `kv`: `trail` keeps what cutting its rejected rows needs.
    pub(crate) fn begin_trail(&self, trail: &mut LayerTrail, kv: &Dsv4Kv) {
        let compressor = self.compressor.as_ref().map(Compressor::shape);
        let indexer = self.indexer.as_ref().map(|ix| ix.comp.shape());
        trail.begin(kv, self.window, compressor, indexer);
    }

    /// Room in `st` for `positions` positions (the compressed entries), so decode steps up to
    /// there do not allocate.
    fn reserve(&self, st: &mut LayerState, positions: usize) {
        if let Some(c) = &self.compressor {
            c.reserve(&mut st.compressor, positions);
        }
        if let Some(ix) = &self.indexer {
            ix.comp.reserve(&mut st.indexer, positions);
        }
        st.window
            .reserve((self.window + 1).saturating_sub(st.window.len()));
    }

    /// The attention of the batch's rows `a` (`(rows, hidden)`, the normalised block inputs;
    /// `spans` says whose they are) into `out` (`(rows, hidden)`), each sequence's layer
    /// `kv_layer` state moved past its rows, in order. `main` rotates the sliding layers,
    /// `compress` the compressed ones, their compressors and the indexer. A verify step
    /// (drafts) logs what cutting its rejected rows needs.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &self,
        a: &[f32],
        seqs: &mut [SeqStep<'_>],
        spans: &[Span],
        kv_layer: usize,
        (main, compress): (&Rope, &Rope),
        act: ActMode,
        sc: &mut AttnBufs,
        out: &mut [f32],
    ) -> Result<(), EngineError> {
        let rope = if self.kind == Dsv4Attn::Sliding {
            main
        } else {
            compress
        };
        let n: usize = spans.iter().map(|s| s.n).sum();
        let (hd, eps) = (self.head_dim, self.eps);
        let (ql, qw) = (self.q_a.out_dim(), self.heads * hd);
        let AttnBufs {
            qr,
            q,
            kv,
            ckv,
            cgate,
            ikv,
            igate,
            iq,
            iw,
            heads_out,
            grp_in,
            grp_out,
            mid,
            cs,
            logits,
            picked,
            scores,
        } = sc;
        // The rows' projections, each one product over all of them.
        let qr = grow(qr, n * ql);
        let kv = grow(kv, n * hd);
        Linear::forward_pair(&self.q_a, &self.kv, a, n, qr, kv, act);
        qr.chunks_exact_mut(ql)
            .for_each(|r| rms(r, &self.q_a_norm, eps));
        kv.chunks_exact_mut(hd)
            .for_each(|r| rms(r, &self.kv_norm, eps));
        let q = grow(q, n * qw);
        let cw = self.compressor.as_ref().map_or(0, Compressor::width);
        let (ckv, cgate) = (grow(ckv, n * cw), grow(cgate, n * cw));
        if let Some(c) = &self.compressor {
            c.project(a, n, act, ckv, cgate);
        }
        let (iw_, ih, id) = match &self.indexer {
            Some(ix) => (ix.comp.width(), ix.heads, ix.dim),
            None => (0, 0, 0),
        };
        let (ikv, igate) = (grow(ikv, n * iw_), grow(igate, n * iw_));
        let (iq, iw) = (grow(iq, n * ih * id), grow(iw, n * ih));
        match &self.indexer {
            Some(ix) => {
                // The main and the indexer's queries read the same latent: one product.
                Linear::forward_pair(&self.q_b, &ix.q_b, qr, n, q, iq, act);
                ix.comp.project(a, n, act, ikv, igate);
                ix.weights.forward(a, n, iw, act);
                let f = (ih as f32).powf(-0.5);
                iw.iter_mut().for_each(|v| *v *= f);
            }
            None => self.q_b.forward(qr, n, q, act),
        }
        q.chunks_exact_mut(hd).for_each(|h| unweighted_rms(h, eps));
        // Each sequence's rows in order through its state.
        let heads_out = grow(heads_out, n * qw);
        for (seq, span) in seqs.iter_mut().zip(spans) {
            let cache = &mut *seq.kv;
            // The cache's room for positions (`Model::reserve`) is the compressors' too.
            let room = cache.tokens.capacity();
            let LayerKv::Dsv4(st) = &mut cache.layers[kv_layer] else {
                return Err(EngineError::Load(format!(
                    "layer {kv_layer}: a DeepSeek-V4 layer over another family's cache"
                )));
            };
            let mut trail = cache.snaps.dsv4_trail(kv_layer, span.n);
            if let Some(t) = trail.as_deref_mut() {
                self.begin_trail(t, st);
            }
            let room = room.max(st.pos + span.n);
            self.reserve(&mut st.state, room);
            // The per-query buffers grow with the entries closed: room for all of them.
            let most = [
                self.compressor.as_ref(),
                self.indexer.as_ref().map(|ix| &ix.comp),
            ]
            .into_iter()
            .flatten()
            .map(|c| c.most(room))
            .max()
            .unwrap_or(0);
            reserve_to(picked, most);
            reserve_to(scores, most);
            reserve_to(logits, self.window + most);
            for i in 0..span.n {
                let (r, pos) = (span.start + i, span.pos0 + i);
                if st.pos != pos {
                    return Err(EngineError::Load(format!(
                        "layer {kv_layer}: its state is at position {} but the row is at {pos}",
                        st.pos
                    )));
                }
                let state = &mut st.state;
                let qrow = &mut q[r * qw..(r + 1) * qw];
                rotate_tail(rope, qrow, hd, pos, false, cs);
                let key = &mut kv[r * hd..(r + 1) * hd];
                rotate_tail(rope, key, hd, pos, false, cs);
                // The window's oldest key's buffer takes the new one, when nothing keeps it.
                let reuse = trail.is_none() && state.window.len() >= self.window;
                let held = match reuse.then(|| state.window.pop_front()).flatten() {
                    Some(mut v) => {
                        v.clear();
                        v.extend_from_slice(key);
                        v
                    }
                    None => key.to_vec(),
                };
                state.window.push_back(held);
                while state.window.len() > self.window {
                    let gone = state.window.pop_front();
                    if let (Some(t), Some(k)) = (trail.as_deref_mut(), gone) {
                        t.popped.push(k);
                    }
                }
                // The compressed entries this query sees.
                picked.clear();
                if let Some(c) = &self.compressor {
                    let (clog, ilog) = match trail.as_deref_mut() {
                        Some(t) => (Some(&mut t.compressor), Some(&mut t.indexer)),
                        None => (None, None),
                    };
                    let crow = r * cw..(r + 1) * cw;
                    let comp = &mut state.compressor;
                    c.feed(
                        comp,
                        &ckv[crow.clone()],
                        &cgate[crow],
                        compress,
                        eps,
                        clog,
                        cs,
                    );
                    match &self.indexer {
                        None => picked.extend(0..state.compressor.len()),
                        Some(ix) => {
                            let irow = r * iw_..(r + 1) * iw_;
                            ix.comp.feed(
                                &mut state.indexer,
                                &ikv[irow.clone()],
                                &igate[irow],
                                compress,
                                eps,
                                ilog,
                                cs,
                            );
                            let iq = &mut iq[r * ih * id..(r + 1) * ih * id];
                            let w = &iw[r * ih..(r + 1) * ih];
                            ix.select(
                                iq,
                                w,
                                pos,
                                &state.indexer,
                                compress,
                                (&mut *cs, &mut *scores),
                                picked,
                            );
                        }
                    }
                }
                let o = &mut heads_out[r * qw..(r + 1) * qw];
                self.core(&q[r * qw..(r + 1) * qw], state, picked, logits, o);
                rotate_tail(rope, o, hd, pos, true, cs);
                st.pos += 1;
            }
        }
        // The grouped low-rank output: each group of heads through its own block of wo_a.
        let groups = self.o_a.len();
        let per_in = qw / groups;
        let per_out = self.o_a[0].out_dim();
        let mid = grow(mid, n * groups * per_out);
        let (gi, go) = (grow(grp_in, n * per_in), grow(grp_out, n * per_out));
        for (g, o_a) in self.o_a.iter().enumerate() {
            for (dst, row) in gi.chunks_exact_mut(per_in).zip(heads_out.chunks_exact(qw)) {
                dst.copy_from_slice(&row[g * per_in..(g + 1) * per_in]);
            }
            o_a.forward(gi, n, go, act);
            for (src, row) in go
                .chunks_exact(per_out)
                .zip(mid.chunks_exact_mut(groups * per_out))
            {
                row[g * per_out..(g + 1) * per_out].copy_from_slice(src);
            }
        }
        self.o_b.forward(mid, n, out, act);
        Ok(())
    }

    /// One query's heads `q` (rotated) over the window's keys and the `picked` entries into
    /// `out` (not yet turned back).
    fn core(
        &self,
        q: &[f32],
        st: &LayerState,
        picked: &[usize],
        logits: &mut Vec<f32>,
        out: &mut [f32],
    ) {
        let hd = self.head_dim;
        let keys = || {
            (st.window.iter().map(Vec::as_slice))
                .chain(picked.iter().map(|&i| st.compressor.entry(i)))
        };
        let scale = 1.0 / (hd as f32).sqrt();
        let logits = grow(logits, st.window.len() + picked.len());
        out.fill(0.0);
        for h in 0..self.heads {
            let qh = &q[h * hd..(h + 1) * hd];
            for (lg, k) in logits.iter_mut().zip(keys()) {
                *lg = dot(qh, k) * scale;
            }
            let sink = self.sinks[h];
            let max = logits.iter().copied().fold(sink, f32::max);
            let denom: f32 =
                logits.iter().map(|v| (v - max).exp()).sum::<f32>() + (sink - max).exp();
            let oh = &mut out[h * hd..(h + 1) * hd];
            for (lg, k) in logits.iter().zip(keys()) {
                axpy(oh, (lg - max).exp() / denom, k);
            }
        }
    }
}

impl Indexer {
    /// The compressed entries of `st` (the indexer's own, just fed) that query `pos` attends
    /// to, into `picked`: the `topk` best by `sum_h w_h relu(q_h . k)`, best first (ties: the
    /// earlier entry). `q` is the query's indexer heads (rotated here), `w` its head weights.
    #[allow(clippy::too_many_arguments)]
    fn select(
        &self,
        q: &mut [f32],
        w: &[f32],
        pos: usize,
        st: &Series,
        rope: &Rope,
        (cs, scores): (&mut Vec<f32>, &mut Vec<f32>),
        picked: &mut Vec<usize>,
    ) {
        let n = st.len();
        if n == 0 {
            return;
        }
        rotate_tail(rope, q, self.dim, pos, false, cs);
        let scale = (self.dim as f32).powf(-0.5);
        scores.clear();
        scores.extend((0..n).map(|e| {
            let k = st.entry(e);
            (0..self.heads)
                .map(|h| dot(&q[h * self.dim..(h + 1) * self.dim], k).max(0.0) * scale * w[h])
                .sum::<f32>()
        }));
        picked.extend(0..n);
        // A total order (the entry breaks ties), so the unstable selection is the sort's.
        let order = |x: &usize, y: &usize| scores[*y].total_cmp(&scores[*x]).then(x.cmp(y));
        let k = self.topk.min(n);
        if k < n {
            picked.select_nth_unstable_by(k, order);
            picked.truncate(k);
        }
        picked.sort_unstable_by(order);
    }
}
