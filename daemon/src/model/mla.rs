//! Multi-head latent attention (reference §3) with the compressed KV cache, in two paths that
//! compute the same thing:
//!
//! * **reconstruct**: `kv_b_proj` turns every cached latent into per-head `[k_nope | v]`, as
//!   transformers does; cheapest for long batches (prefill).
//! * **absorbed**: `kv_b_proj` is folded into the query (`q_lat = W_k^T q_nope`) and the output
//!   (`o = W_v (sum_t p_t c_t)`), so a decode step never expands the cache.

use super::batch::{SeqStep, Span};
use super::dsa_indexer::{Indexer, Selection};
use super::kv::LayerKv;
use super::linear::{ActMode, Linear};
use super::ops::{axpy, axpy_gather, dot, dot_gather, rms_norm_rows, softmax};
use super::rope::Rope;
use super::scratch::{grow, zeroed, AttnScratch, IndexScratch};
use rayon::prelude::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnPath {
    /// Absorbed when the batch is small against the context, reconstruct otherwise.
    Auto,
    Reconstruct,
    Absorbed,
}

#[derive(Clone, Copy, Debug)]
pub struct MlaDims {
    pub heads: usize,
    pub nope: usize,
    pub rope: usize,
    pub v: usize,
    pub kv_lora: usize,
}

pub struct Mla {
    pub q_a: Linear,
    pub q_a_norm: Vec<f32>,
    pub q_b: Linear,
    pub kv_a: Linear,
    pub kv_a_norm: Vec<f32>,
    pub kv_b: Linear,
    pub o: Linear,
    pub indexer: Option<Indexer>,
}

/// Eps of q_a_layernorm and kv_a_layernorm: hard-coded 1e-6 in transformers, not rms_norm_eps.
const LORA_NORM_EPS: f32 = 1e-6;

pub struct AttnCtx<'a> {
    pub dims: MlaDims,
    pub rope: &'a Rope,
    pub index_topk: usize,
    pub path: AttnPath,
    pub act: ActMode,
}

impl Mla {
    /// Attention for the rows of `a` (the input_layernorm output) of every sequence of a
    /// batch: sequence `i` owns rows `spans[i]` at positions `spans[i].pos0..` and attends over
    /// its own cache, `seqs[i].kv.layers[layer]`, to which its keys are appended. o_proj's
    /// output goes to `out` (`(rows, hidden)`). The projections run once over all rows (each
    /// weight read once per step, whatever the number of sequences); the attention core runs
    /// per sequence. `sels[i]` carries sequence `i`'s DSA selection from layer to layer: a
    /// full layer replaces it, a shared layer reads it.
    ///
    /// Every row's result is bit-identical to a forward of its sequence alone: the products
    /// are row-independent and the core sees exactly that sequence's rows.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &self,
        cx: &AttnCtx,
        layer: usize,
        a: &[f32],
        spans: &[Span],
        seqs: &mut [SeqStep<'_>],
        sels: &mut [Selection],
        sc: &mut AttnScratch,
        ix: &mut IndexScratch,
        out: &mut [f32],
    ) {
        let d = cx.dims;
        let qk = d.nope + d.rope;
        let rows: usize = spans.iter().map(|s| s.n).sum();
        let hidden = a.len() / rows.max(1);
        let AttnScratch {
            q_resid,
            q,
            ckv,
            by_head,
            heads_out,
            heads,
        } = sc;
        // q_resid = q_a_layernorm(q_a_proj(a)); q = q_b_proj(q_resid).view(H, nope + rope)
        let q_resid = grow(q_resid, rows * self.q_a.out_dim());
        self.q_a.forward(a, rows, q_resid, cx.act);
        rms_norm_rows(q_resid, &self.q_a_norm, LORA_NORM_EPS);
        let q = grow(q, rows * d.heads * qk);
        self.q_b.forward(q_resid, rows, q, cx.act);
        for span in spans {
            let q = &mut q[span.start * d.heads * qk..][..span.n * d.heads * qk];
            for (s, row) in q.chunks_exact_mut(d.heads * qk).enumerate() {
                for head in row.chunks_exact_mut(qk) {
                    cx.rope.rotate(&mut head[d.nope..], span.pos0 + s);
                }
            }
        }
        // ckv = kv_a_proj_with_mqa(a) = [c (kv_lora) | k_rope (rope)]
        let ckv = grow(ckv, rows * (d.kv_lora + d.rope));
        self.kv_a.forward(a, rows, ckv, cx.act);
        if let Some(indexer) = &self.indexer {
            indexer.project(cx.rope, a, q_resid, spans, ix);
        }
        let heads_out = grow(heads_out, rows * d.heads * d.v);
        for ((span, seq), sel) in spans.iter().zip(seqs.iter_mut()).zip(sels.iter_mut()) {
            let (n, pos0) = (span.n, span.pos0);
            let kv = &mut seq.kv.layers[layer];
            // Appended to the cache first, then normalised / rotated in place there.
            let ckv = &ckv[span.start * (d.kv_lora + d.rope)..][..n * (d.kv_lora + d.rope)];
            for (s, row) in ckv.chunks_exact(d.kv_lora + d.rope).enumerate() {
                let at = kv.latent.len();
                kv.latent.extend_from_slice(&row[..d.kv_lora]);
                rms_norm_rows(&mut kv.latent[at..], &self.kv_a_norm, LORA_NORM_EPS);
                let at = kv.rope.len();
                kv.rope.extend_from_slice(&row[d.kv_lora..]);
                cx.rope.rotate(&mut kv.rope[at..], pos0 + s);
            }
            if let Some(indexer) = &self.indexer {
                indexer.select(span, &mut kv.index, cx.index_topk, ix, sel);
            }
            debug_assert_eq!(
                sel.len(),
                n,
                "shared DSA layer without a full layer before it"
            );
            let q = &q[span.start * d.heads * qk..][..n * d.heads * qk];
            let rows_out = &mut heads_out[span.start * d.heads * d.v..][..n * d.heads * d.v];
            let core = CoreScratch {
                by_head: &mut *by_head,
                heads: &mut *heads,
            };
            self.attend(cx, q, n, pos0, kv, sel, core, rows_out);
        }
        self.o
            .forward(heads_out, rows, &mut out[..rows * hidden], cx.act);
    }

    /// The attention core of one sequence's `n` query rows `q` (rope applied) over its cache
    /// `kv` (this batch's keys already appended), into `heads_out` (`(n, heads * v)`).
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        cx: &AttnCtx,
        q: &[f32],
        n: usize,
        pos0: usize,
        kv: &LayerKv,
        sel: &Selection,
        core: CoreScratch<'_>,
        heads_out: &mut [f32],
    ) {
        let d = cx.dims;
        let total = kv.latent.len() / d.kv_lora;
        let nv = d.nope + d.v;
        let absorbed = match cx.path {
            AttnPath::Absorbed => true,
            AttnPath::Reconstruct => false,
            AttnPath::Auto => n * (total + nv) < total * nv,
        };
        // The most keys any row attends to: the length of its softmax.
        let max_keys = (0..n)
            .map(|s| sel.row(s).map_or(pos0 + s + 1, |r| r.len()))
            .max()
            .unwrap_or(0);
        let by_head = zeroed(core.by_head, d.heads * n * d.v);
        if absorbed {
            let block = head_block_len(d.kv_lora, n, max_keys);
            let heads = grow(core.heads, d.heads * block);
            self.attend_absorbed(cx, q, n, pos0, kv, sel, by_head, heads, block);
        } else {
            let block = head_block_len(0, n, max_keys);
            let heads = grow(core.heads, d.heads * block);
            self.attend_reconstructed(cx, q, n, pos0, kv, sel, by_head, heads, block);
        }
        Self::heads_to_rows(by_head, n, d.heads, d.v, heads_out);
    }

    /// The keys query row `s` attends to: the DSA selection, or every visible position.
    fn keys_of(sel: &Selection, s: usize, visible: usize) -> KeyIter<'_> {
        match sel.row(s) {
            Some(list) => KeyIter::List(list.iter()),
            None => KeyIter::Range(0..visible),
        }
    }

    fn scaling(d: MlaDims) -> f32 {
        ((d.nope + d.rope) as f32).powf(-0.5)
    }

    /// `by_head` (zeroed, `(heads, n, v)`) gets each head's output; `scratch` holds one block
    /// of `block` floats per head.
    #[allow(clippy::too_many_arguments)]
    fn attend_reconstructed(
        &self,
        cx: &AttnCtx,
        q: &[f32],
        n: usize,
        pos0: usize,
        kv: &LayerKv,
        sel: &Selection,
        by_head: &mut [f32],
        scratch: &mut [f32],
        block: usize,
    ) {
        let d = cx.dims;
        let (qk, nv) = (d.nope + d.rope, d.nope + d.v);
        let total = kv.latent.len() / d.kv_lora;
        // kv = kv_b_proj(c).view(H, nope + v) for every cached position: (total, H, nope + v).
        // Allocated per call on purpose (see `scratch`): it scales with the context.
        let full = self.kv_b.apply(&kv.latent, total, cx.act);
        let scale = Self::scaling(d);
        // Heads are independent: one task per head, each writing its own (n, v) block.
        let work = n * total * d.heads * (d.nope + d.v);
        for_each_head(by_head, n * d.v, scratch, block, work, |h, out, probs| {
            for (s, oh) in out.chunks_exact_mut(d.v).enumerate() {
                let qh = &q[(s * d.heads + h) * qk..][..qk];
                attend_row(
                    Self::keys_of(sel, s, pos0 + s + 1),
                    probs,
                    |t| {
                        let kt = &full[(t * d.heads + h) * nv..][..d.nope];
                        let kr = &kv.rope[t * d.rope..][..d.rope];
                        (dot(&qh[..d.nope], kt) + dot(&qh[d.nope..], kr)) * scale
                    },
                    |t| &full[(t * d.heads + h) * nv + d.nope..][..d.v],
                    oh,
                );
            }
        });
    }

    /// As `attend_reconstructed`, with `kv_b_proj` folded into the query and the output.
    #[allow(clippy::too_many_arguments)]
    fn attend_absorbed(
        &self,
        cx: &AttnCtx,
        q: &[f32],
        n: usize,
        pos0: usize,
        kv: &LayerKv,
        sel: &Selection,
        by_head: &mut [f32],
        scratch: &mut [f32],
        block: usize,
    ) {
        let d = cx.dims;
        let (qk, nv, l) = (d.nope + d.rope, d.nope + d.v, d.kv_lora);
        let w = &self.kv_b.w;
        let scale = Self::scaling(d);
        let total = kv.latent.len() / l;
        let work = n * d.heads * (total + nv) * l;
        for_each_head(by_head, n * d.v, scratch, block, work, |h, out, hs| {
            let (q_lat, rest) = hs.split_at_mut(n * l);
            let (ctx_lat, probs) = rest.split_at_mut(n * l);
            // q_lat[s] = sum_i q_nope[s,h,i] * W_kb[h*(nope+v) + i, :]
            q_lat.fill(0.0);
            for (s, ql) in q_lat.chunks_exact_mut(l).enumerate() {
                w.axpy_rows(h * nv, &q[(s * d.heads + h) * qk..][..d.nope], ql);
            }
            // ctx_lat[s] = sum_t softmax_t(q_lat.c_t + q_rope.k_rope_t) c_t, the same
            // operations as `attend_row`, through kernels that take a chunk of keys per call:
            // each query load serves four keys, and the sum stays in registers across keys.
            ctx_lat.fill(0.0);
            let mut idx = [0usize; KEY_CHUNK];
            let mut rope_scores = [0f32; KEY_CHUNK];
            for s in 0..n {
                let ql = &q_lat[s * l..][..l];
                let qr = &q[(s * d.heads + h) * qk + d.nope..][..d.rope];
                let keys = Self::keys_of(sel, s, pos0 + s + 1);
                let nk = keys.len();
                let mut it = keys.clone();
                let mut i0 = 0;
                while i0 < nk {
                    let m = next_keys(&mut it, &mut idx);
                    let (ks, chunk) = (&idx[..m], &mut probs[i0..i0 + m]);
                    dot_gather(ql, &kv.latent, l, ks, chunk);
                    dot_gather(qr, &kv.rope, d.rope, ks, &mut rope_scores[..m]);
                    for (p, r) in chunk.iter_mut().zip(&rope_scores) {
                        *p = (*p + r) * scale;
                    }
                    i0 += m;
                }
                softmax(&mut probs[..nk]);
                let out = &mut ctx_lat[s * l..][..l];
                let mut it = keys;
                let mut i0 = 0;
                while i0 < nk {
                    let m = next_keys(&mut it, &mut idx);
                    axpy_gather(out, &probs[i0..i0 + m], &kv.latent, l, &idx[..m]);
                    i0 += m;
                }
            }
            // o[s,j] = W_kb[h*(nope+v) + nope + j, :] . ctx_lat[s], with the matmul kernels
            // on that head's rows.
            let int8 = cx.act == ActMode::Int8;
            w.matmul_rows(h * nv + d.nope, d.v, &ctx_lat[..n * l], n, out, int8);
        });
    }

    /// (heads, n, v) -> (n, heads * v), the layout o_proj reads.
    fn heads_to_rows(by_head: &[f32], n: usize, heads: usize, v: usize, out: &mut [f32]) {
        for h in 0..heads {
            for s in 0..n {
                out[(s * heads + h) * v..][..v].copy_from_slice(&by_head[(h * n + s) * v..][..v]);
            }
        }
    }
}

/// The per-call buffers of one sequence's attention core.
struct CoreScratch<'a> {
    by_head: &'a mut Vec<f32>,
    heads: &'a mut Vec<f32>,
}

/// Keys a gathered score or sum takes per call (their indices wait on the stack).
const KEY_CHUNK: usize = 64;

/// The next up to `KEY_CHUNK` keys of `it` into `idx`; how many.
fn next_keys(it: &mut KeyIter, idx: &mut [usize; KEY_CHUNK]) -> usize {
    let mut m = 0;
    for (slot, t) in idx.iter_mut().zip(it) {
        *slot = t;
        m += 1;
    }
    m
}

/// Floats of one head's scratch block: the absorbed path's q_lat and ctx_lat (`latent` =
/// kv_lora; 0 for the reconstruct path, which needs neither), then the softmax probabilities
/// of up to `keys` keys. Never 0, so every head gets a block.
pub(crate) fn head_block_len(latent: usize, n: usize, keys: usize) -> usize {
    (2 * n * latent + keys).max(1)
}

/// One query row of one head: softmax over the `score`s of `keys` (written to the front of
/// `probs`), then `out += p_t * value(t)` in key order (the same operations in both attention
/// paths).
fn attend_row<'a>(
    keys: KeyIter<'_>,
    probs: &mut [f32],
    score: impl Fn(usize) -> f32,
    value: impl Fn(usize) -> &'a [f32],
    out: &mut [f32],
) {
    let probs = &mut probs[..keys.len()];
    for (p, t) in probs.iter_mut().zip(keys.clone()) {
        *p = score(t);
    }
    softmax(probs);
    for (t, &p) in keys.zip(probs.iter()) {
        axpy(out, p, value(t));
    }
}

/// Runs `f(head, block, scratch)` over the per-head blocks of `buf` (`block` floats each) and
/// of `scratch` (`sblock` floats each), on the worker threads when the work (multiply-adds) is
/// big enough to pay for waking them.
fn for_each_head(
    buf: &mut [f32],
    block: usize,
    scratch: &mut [f32],
    sblock: usize,
    work: usize,
    f: impl Fn(usize, &mut [f32], &mut [f32]) + Sync + Send,
) {
    const PARALLEL_WORK: usize = 1 << 18;
    if work >= PARALLEL_WORK {
        buf.par_chunks_mut(block)
            .zip(scratch.par_chunks_mut(sblock))
            .enumerate()
            .for_each(|(h, (b, s))| f(h, b, s));
    } else {
        buf.chunks_mut(block)
            .zip(scratch.chunks_mut(sblock))
            .enumerate()
            .for_each(|(h, (b, s))| f(h, b, s));
    }
}

#[derive(Clone)]
enum KeyIter<'a> {
    List(std::slice::Iter<'a, usize>),
    Range(std::ops::Range<usize>),
}

impl Iterator for KeyIter<'_> {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        match self {
            KeyIter::List(it) => it.next().copied(),
            KeyIter::Range(r) => r.next(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match self {
            KeyIter::List(it) => it.size_hint(),
            KeyIter::Range(r) => r.size_hint(),
        }
    }
}

impl ExactSizeIterator for KeyIter<'_> {}
