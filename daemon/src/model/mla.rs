//! Multi-head latent attention (reference §3) with the compressed KV cache, in two paths that
//! compute the same thing:
//!
//! * **reconstruct**: `kv_b_proj` turns every cached latent into per-head `[k_nope | v]`, as
//!   transformers does; cheapest for long batches (prefill).
//! * **absorbed**: `kv_b_proj` is folded into the query (`q_lat = W_k^T q_nope`) and the output
//!   (`o = W_v (sum_t p_t c_t)`), so a decode step never expands the cache.

use super::batch::{SeqStep, Span};
use super::dsa_indexer::{Indexer, Selection};
use super::kv::{LayerKv, MlaKv};
use super::linear::{ActMode, Linear};
use super::ops::{axpy_gather, axpy_gather4, dot_gather, dot_gather4, softmax};
use super::placement::Placement;
use super::rope::{Rope, Rotation};
use super::scratch::{grow, zeroed, AttnScratch, IndexScratch};
use crate::gpu::{AttnGpu, GpuError, KvMirror, MlaShape};
use crate::quant::{par_chunk_pairs, par_chunks_mut, PreparedRows};

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
    /// Multiplies the softmax scale: YaRN's `mscale(factor, mscale_all_dim)^2` (DeepSeek-V3),
    /// 1 otherwise.
    pub softmax_factor: f32,
    /// The rotary pairs `(x[2i], x[2i+1])` (`rope_interleave`, every published checkpoint),
    /// else `(x[i], x[i + rope/2])` (transformers' `rope_interleave: false`).
    pub interleave: bool,
}

impl MlaDims {
    /// Rotates one head's rotary part by `at` in the layout the config names.
    fn rotate(&self, at: &Rotation, x: &mut [f32]) {
        if self.interleave {
            at.interleaved(x);
        } else {
            at.half(x);
        }
    }

    /// Rotates the rotary part of every head of one query row (`(heads, nope + rope)`).
    fn rotate_heads(&self, at: &Rotation, row: &mut [f32]) {
        for head in row.chunks_exact_mut(self.nope + self.rope) {
            self.rotate(at, &mut head[self.nope..]);
        }
    }
}

/// How the query heads come from the attention input.
pub enum QProj {
    /// `q_b_proj(q_a_layernorm(q_a_proj(x)))` (GLM-5, DeepSeek-V3/V3.2): the low-rank
    /// residual `q_a_layernorm(q_a_proj(x))` also feeds the DSA indexer.
    LowRank {
        a: Linear,
        norm: Vec<f32>,
        b: Linear,
    },
    /// `q_proj(x)`: `q_lora_rank: null` (DeepSeek-V2-Lite, Moonlight), as transformers'
    /// DeepseekV3Attention does when the rank is None. Never with an indexer: it has no
    /// low-rank residual to read.
    Full(Linear),
}

impl QProj {
    /// The projections, for walks over every matrix.
    pub fn linears_mut(&mut self) -> Vec<&mut Linear> {
        match self {
            QProj::LowRank { a, b, .. } => vec![a, b],
            QProj::Full(q) => vec![q],
        }
    }

    pub fn linears(&self) -> Vec<&Linear> {
        match self {
            QProj::LowRank { a, b, .. } => vec![a, b],
            QProj::Full(q) => vec![q],
        }
    }
}

pub struct Mla {
    pub q: QProj,
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
    /// Where the norms and the attention cores run (`model::placement`).
    pub place: &'a Placement,
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
            tile,
            stripes,
            rebuild,
            dsv4: _,
        } = sc;
        // q_resid = q_a_layernorm(q_a_proj(a)); q = q_b_proj(q_resid).view(H, nope + rope)
        // (or q = q_proj(a) without a low rank); ckv = kv_a_proj_with_mqa(a) =
        // [c (kv_lora) | k_rope (rope)], in the same product as the first query projection.
        let ckv = grow(ckv, rows * (d.kv_lora + d.rope));
        let q = grow(q, rows * d.heads * qk);
        // A decode step's query heads wait for the core (`Mla::attend`), which projects each
        // head inside its head-by-head task when it takes that path: one fork and join fewer.
        // Only on the CPU, and without a bias (the row products leave it out).
        let defer_q_b = rows == 1
            && !cx.place.attention_placed()
            && matches!(&self.q, QProj::LowRank { b, .. } if !b.slot.placed() && b.bias.is_none());
        let q_resid: &[f32] = match &self.q {
            QProj::LowRank {
                a: q_a,
                norm,
                b: q_b,
            } => {
                let q_resid = grow(q_resid, rows * q_a.out_dim());
                Linear::forward_pair(q_a, &self.kv_a, a, rows, q_resid, ckv, cx.act);
                cx.place.norm_rows(q_resid, norm, LORA_NORM_EPS);
                if !defer_q_b {
                    q_b.forward(q_resid, rows, q, cx.act);
                }
                q_resid
            }
            QProj::Full(q_proj) => {
                Linear::forward_pair(q_proj, &self.kv_a, a, rows, q, ckv, cx.act);
                &[]
            }
        };
        for span in spans.iter().filter(|_| !defer_q_b) {
            let q = &mut q[span.start * d.heads * qk..][..span.n * d.heads * qk];
            for (s, row) in q.chunks_exact_mut(d.heads * qk).enumerate() {
                d.rotate_heads(&cx.rope.at(span.pos0 + s), row);
            }
        }
        let deferred = match &self.q {
            QProj::LowRank { b, .. } if defer_q_b => Some(DeferredQ { q_b: b, q_resid }),
            _ => None,
        };
        if let Some(indexer) = &self.indexer {
            // The index queries and head weights only serve rows with more visible keys than
            // `index_topk` (the others attend to every key): a prefill inside the first
            // `index_topk` positions never reads them on the CPU. The device's selection
            // takes them for every row.
            let queries =
                cx.place.attention_on() || spans.iter().any(|s| s.pos0 + s.n > cx.index_topk);
            indexer.project(cx.rope, a, q_resid, spans, queries, ix);
        }
        let heads_out = grow(heads_out, rows * d.heads * d.v);
        for ((span, seq), sel) in spans.iter().zip(seqs.iter_mut()).zip(sels.iter_mut()) {
            let (n, pos0) = (span.n, span.pos0);
            let super::kv::KvCache {
                layers,
                device: mirror,
                ..
            } = &mut *seq.kv;
            let LayerKv::Mla(kv) = &mut layers[layer] else {
                // The cache was made from this model's config (`KvCache::new`).
                unreachable!("an MLA layer's cache holds grouped-query keys");
            };
            // Appended to the cache first, then normalised / rotated in place there (the
            // norm is per row: all of the span's rows at once give the same bits).
            let ckv = &ckv[span.start * (d.kv_lora + d.rope)..][..n * (d.kv_lora + d.rope)];
            let latent0 = kv.latent.len();
            for (s, row) in ckv.chunks_exact(d.kv_lora + d.rope).enumerate() {
                kv.latent.extend_from_slice(&row[..d.kv_lora]);
                let at = kv.rope.len();
                kv.rope.extend_from_slice(&row[d.kv_lora..]);
                d.rotate(&cx.rope.at(pos0 + s), &mut kv.rope[at..]);
            }
            let latent = &mut kv.latent[latent0..];
            cx.place.norm_rows(latent, &self.kv_a_norm, LORA_NORM_EPS);
            if let Some(indexer) = &self.indexer {
                indexer.push_keys(span, &mut kv.index, ix);
            }
            let q = &mut q[span.start * d.heads * qk..][..n * d.heads * qk];
            let rows_out = &mut heads_out[span.start * d.heads * d.v..][..n * d.heads * d.v];
            let placed = (cx.place)
                .attention(|g| self.attend_gpu(g, cx, layer, span, &*q, kv, mirror, sel, ix));
            if let Some(out) = placed {
                rows_out.copy_from_slice(&out);
                continue;
            }
            // Not placed, or the device failed: the CPU cache holds every row.
            if let Some(indexer) = &self.indexer {
                indexer.select_rows(span, &kv.index, cx.index_topk, ix, sel);
            }
            // A model without any indexer (DeepSeek-V3) leaves the selection empty: every row
            // attends to every key.
            debug_assert!(
                sel.len() == n || sel.is_empty(),
                "shared DSA layer without a full layer before it"
            );
            // Rows `..split` take the reconstruct path, the rest the absorbed one (`split_rows`).
            let split = split_rows(cx.path, n, pos0, d.nope + d.v);
            for (r0, r1, absorbed) in [(0, split, false), (split, n, true)] {
                if r0 == r1 {
                    continue;
                }
                let core = CoreScratch {
                    by_head: &mut *by_head,
                    heads: &mut *heads,
                    tile: &mut *tile,
                    stripes: &mut *stripes,
                    rebuild: &mut *rebuild,
                };
                sel.start_at(r0);
                let q = &mut q[r0 * d.heads * qk..r1 * d.heads * qk];
                let out = &mut rows_out[r0 * d.heads * d.v..r1 * d.heads * d.v];
                let rows = (r1 - r0, pos0 + r0, absorbed);
                self.attend(cx, (q, deferred), rows, kv, sel, core, out);
            }
            sel.start_at(0);
        }
        self.o
            .forward(heads_out, rows, &mut out[..rows * hidden], cx.act);
    }

    /// [`Mla::attend`] (and the DSA selection, on full-indexer layers) on the GPU, over the
    /// device mirror of the sequence's cache: the heads' outputs, `(n, heads * v)`.
    #[allow(clippy::too_many_arguments)]
    fn attend_gpu(
        &self,
        g: &AttnGpu,
        cx: &AttnCtx,
        layer: usize,
        span: &Span,
        q: &[f32],
        kv: &MlaKv,
        mirror: &mut KvMirror,
        sel: &mut Selection,
        ix: &IndexScratch,
    ) -> Result<Vec<f32>, GpuError> {
        let d = cx.dims;
        // kv_b_proj's rows in device memory, uploaded the first time attention runs there.
        let kv_b = g.f32_rows(&self.kv_b.slot, &self.kv_b.w)?;
        let parts = [&kv.latent[..], &kv.rope[..], &kv.index[..]];
        let [latent, rope, index] = mirror.sync(g.kernels(), layer, parts)?;
        if let Some(indexer) = &self.indexer {
            indexer.select_gpu(g, span, index, cx.index_topk, ix, sel)?;
        }
        let shape = MlaShape {
            heads: d.heads,
            nope: d.nope,
            rope: d.rope,
            v: d.v,
            kv_lora: d.kv_lora,
            scale: Self::scaling(d),
        };
        let sel = &*sel;
        let keys = |s: usize| sel.row(s);
        g.mla_core(shape, kv_b, q, span.n, span.pos0, latent, rope, keys)
    }

    /// The attention core of one sequence's `n` query rows `q` at `pos0` (rope applied) over
    /// its cache `kv` (this batch's keys already appended, perhaps past these rows': a chunk's
    /// later rows), on the absorbed path or the reconstruct one, into `heads_out`
    /// (`(n, heads * v)`). With
    /// `deferred` (one row), `q` is not projected yet: the head-by-head core projects each
    /// head in its task, any other path projects them all here first.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        cx: &AttnCtx,
        (q, deferred): (&mut [f32], Option<DeferredQ>),
        (n, pos0, absorbed): (usize, usize, bool),
        kv: &MlaKv,
        sel: &Selection,
        core: CoreScratch<'_>,
        heads_out: &mut [f32],
    ) {
        let d = cx.dims;
        let total = kv.latent.len() / d.kv_lora;
        let nv = d.nope + d.v;
        // The most keys any row attends to: the length of its softmax.
        let max_keys = (0..n)
            .map(|s| sel.row(s).map_or(pos0 + s + 1, |r| r.len()))
            .max()
            .unwrap_or(0);
        let l = d.kv_lora;
        let head_outer =
            absorbed && n == 1 && d.nope + d.rope <= l && max_keys * l <= HEAD_OUTER_MAX_LATENT;
        if let Some(dq) = deferred.filter(|_| !head_outer) {
            dq.project(cx, pos0, q);
        }
        let q = &*q;
        let par = n * d.heads * (total + nv) * l >= PARALLEL_WORK;
        let by_head = zeroed(core.by_head, d.heads * n * d.v);
        if absorbed {
            let block = head_block_len(l, n, max_keys);
            let heads = grow(core.heads, d.heads * block);
            if head_outer {
                let work = if par { PARALLEL_WORK } else { 0 };
                let q = deferred.map_or(QHeads::Rotated(q), QHeads::Deferred);
                self.absorbed_by_head(cx, q, kv, (sel, pos0), by_head, heads, block, work);
            } else {
                let bufs = (core.tile, core.stripes);
                self.absorbed_by_key(cx, q, n, pos0, kv, sel, by_head, heads, block, bufs);
            }
        } else {
            // Each head rebuilds its own keys and values, unless kv_b_proj runs whole (on the
            // device) or adds a bias (which the row products leave out): then all at once, by
            // the whole product.
            let per_head = self.kv_b.by_row_blocks();
            let bufs = (core.heads, core.rebuild);
            self.attend_reconstructed(cx, q, n, pos0, kv, sel, by_head, bufs, per_head);
        }
        Self::heads_to_rows(by_head, n, d.heads, d.v, heads_out);
    }

    /// The softmax scale of a score: 1 / sqrt(qk head dim), times YaRN's factor (exactly
    /// 1 without YaRN, so the product leaves the bits as they were).
    fn scaling(d: MlaDims) -> f32 {
        ((d.nope + d.rope) as f32).powf(-0.5) * d.softmax_factor
    }

    /// As `attend_reconstructed`, with `kv_b_proj` folded into the query and the output, the
    /// keys as the outer loop (a decode step over a short selection goes head by head:
    /// [`Mla::absorbed_by_head`]).
    ///
    /// Every head reads the same latent rows, so a task scores a chunk of keys for all heads,
    /// and a task sums a stripe of latent columns for all heads, each latent row read once per
    /// step while it is in cache, instead of once per head (at GLM-5's 64 heads and 2048
    /// selected keys that is 4 MB a layer, not 256 MB). Each score and each sum takes the same
    /// operations in the same key order as a head-by-head loop.
    #[allow(clippy::too_many_arguments)]
    fn absorbed_by_key(
        &self,
        cx: &AttnCtx,
        q: &[f32],
        n: usize,
        pos0: usize,
        kv: &MlaKv,
        sel: &Selection,
        by_head: &mut [f32],
        scratch: &mut [f32],
        block: usize,
        (tile, stripes): (&mut Vec<f32>, &mut Vec<f32>),
    ) {
        let d = cx.dims;
        let (qk, nv, l, heads) = (d.nope + d.rope, d.nope + d.v, d.kv_lora, d.heads);
        let w = &self.kv_b.w;
        let scale = Self::scaling(d);
        let total = kv.latent.len() / l;
        let par = n * heads * (total + nv) * l >= PARALLEL_WORK;
        // q_lat[s] = sum_i q_nope[s,h,i] * W_kb[h*(nope+v) + i, :], in each head's block.
        chunks_maybe_par(scratch, block, par, n, |h, hs| {
            let q_lat = &mut hs[..n * l];
            q_lat.fill(0.0);
            for (s, ql) in q_lat.chunks_exact_mut(l).enumerate() {
                w.axpy_rows(h * nv, &q[(s * heads + h) * qk..][..d.nope], ql);
            }
        });
        for s in 0..n {
            let keys = RowKeys::of(sel, s, pos0 + s + 1);
            let nk = keys.len();
            // Scores q_lat.c_t + q_rope.k_rope_t of all heads, a chunk of keys per task, into
            // `tile` laid out (chunk, head, key in chunk).
            let tile = grow(tile, heads * nk);
            let blocks = &*scratch;
            chunks_maybe_par(tile, heads * KEYS_PER_TASK, par, n, |c, out| {
                let m = out.len() / heads;
                let mut idx = [0usize; KEY_CHUNK];
                let mut rope = [[0f32; KEY_CHUNK]; 4];
                let ql = |h: usize| &blocks[h * block + s * l..][..l];
                let qr = |h: usize| &q[(s * heads + h) * qk + d.nope..][..d.rope];
                for sub in (0..m).step_by(KEY_CHUNK) {
                    let mm = KEY_CHUNK.min(m - sub);
                    let ks = keys.chunk(c * KEYS_PER_TASK + sub, mm, &mut idx);
                    // Four heads a pass over the chunk's rows (the same bits as one each).
                    let mut h = 0;
                    while h + 4 <= heads {
                        let [r0, r1, r2, r3] = &mut rope;
                        let rs = [&mut r0[..mm], &mut r1[..mm], &mut r2[..mm], &mut r3[..mm]];
                        dot_gather4(
                            [qr(h), qr(h + 1), qr(h + 2), qr(h + 3)],
                            &kv.rope,
                            d.rope,
                            ks,
                            rs,
                        );
                        let (d0, rest) = out[h * m..(h + 4) * m].split_at_mut(m);
                        let (d1, rest) = rest.split_at_mut(m);
                        let (d2, d3) = rest.split_at_mut(m);
                        let dst = [d0, d1, d2, d3].map(|dh| &mut dh[sub..sub + mm]);
                        let [o0, o1, o2, o3] = dst;
                        let qs = [ql(h), ql(h + 1), ql(h + 2), ql(h + 3)];
                        dot_gather4(
                            qs,
                            &kv.latent,
                            l,
                            ks,
                            [&mut *o0, &mut *o1, &mut *o2, &mut *o3],
                        );
                        for (dh, r) in [o0, o1, o2, o3].into_iter().zip(&rope) {
                            for (p, r) in dh.iter_mut().zip(r) {
                                *p = (*p + r) * scale;
                            }
                        }
                        h += 4;
                    }
                    for h in h..heads {
                        let dst = &mut out[h * m + sub..][..mm];
                        dot_gather(ql(h), &kv.latent, l, ks, dst);
                        dot_gather(qr(h), &kv.rope, d.rope, ks, &mut rope[0][..mm]);
                        for (p, r) in dst.iter_mut().zip(&rope[0]) {
                            *p = (*p + r) * scale;
                        }
                    }
                }
            });
            // Each head's scores into its block, then its softmax: on the workers only when
            // the softmaxes are long enough to pay for the fork and join.
            let tile = &*tile;
            let par_softmax = par && heads * nk >= PARALLEL_SOFTMAX;
            chunks_maybe_par(scratch, block, par_softmax, n, |h, hs| {
                let probs = &mut hs[2 * n * l..][..nk];
                for (c, chunk) in probs.chunks_mut(KEYS_PER_TASK).enumerate() {
                    let m = chunk.len();
                    chunk.copy_from_slice(&tile[c * heads * KEYS_PER_TASK + h * m..][..m]);
                }
                softmax(probs);
            });
            // ctx_lat[s] = sum_t p_t c_t of all heads, a stripe of latent columns per task,
            // into `stripes` laid out (stripe, head, column in stripe).
            let stripes = zeroed(stripes, heads * l);
            let blocks = &*scratch;
            chunks_maybe_par(stripes, heads * STRIPE, par, n, |j, out| {
                let (j0, wj) = (j * STRIPE, out.len() / heads);
                let mut idx = [0usize; KEY_CHUNK];
                for sub in (0..nk).step_by(KEY_CHUNK) {
                    let mm = KEY_CHUNK.min(nk - sub);
                    let ks = keys.chunk(sub, mm, &mut idx);
                    let probs = |h: usize| &blocks[h * block + 2 * n * l + sub..][..mm];
                    // Four heads a pass over the chunk's rows (the same bits as one each).
                    let mut fours = out[..heads * wj].chunks_exact_mut(4 * wj);
                    for (g, four) in (&mut fours).enumerate() {
                        let (a, rest) = four.split_at_mut(wj);
                        let (b, rest) = rest.split_at_mut(wj);
                        let (c, e) = rest.split_at_mut(wj);
                        let h = 4 * g;
                        let coefs = [probs(h), probs(h + 1), probs(h + 2), probs(h + 3)];
                        axpy_gather4([a, b, c, e], coefs, &kv.latent[j0..], l, ks);
                    }
                    let done = heads / 4 * 4;
                    for (i, acc) in fours.into_remainder().chunks_exact_mut(wj).enumerate() {
                        axpy_gather(acc, probs(done + i), &kv.latent[j0..], l, ks);
                    }
                }
            });
            // Each head's ctx_lat[s] out of the stripes; the last row's is taken by the
            // output's tasks below, one fork and join fewer (a decode step's only row).
            if s + 1 < n {
                let stripes = &*stripes;
                chunks_maybe_par(scratch, block, par, n, |h, hs| {
                    let ctx = &mut hs[n * l + s * l..][..l];
                    Self::stripes_to_head(stripes, heads, h, ctx);
                });
            }
        }
        // o[s,j] = W_kb[h*(nope+v) + nope + j, :] . ctx_lat[s], with the matmul kernels
        // on that head's rows.
        let int8 = cx.act == ActMode::Int8;
        let work = if par { PARALLEL_WORK } else { 0 };
        let last = &stripes[..heads * l];
        for_each_head(by_head, n * d.v, scratch, block, work, n, |h, out, hs| {
            let ctx_lat = &mut hs[n * l..][..n * l];
            Self::stripes_to_head(last, heads, h, &mut ctx_lat[(n - 1) * l..]);
            w.matmul_rows(h * nv + d.nope, d.v, ctx_lat, n, out, int8);
        });
    }

    /// [`Mla::absorbed_by_key`] of one query row (a decode step) head by head: each task takes
    /// one head from its query (projected here too, when deferred) through its scores,
    /// softmax and latent sum to its output, so the core is one fork and join, not four (five
    /// with `q_b_proj`'s). Each head reads every selected latent row, which the key-outer
    /// tiles avoid; up to `HEAD_OUTER_MAX_LATENT` floats they stay in the core's cache between
    /// heads. Each value takes the same kernels on the same keys in the same order as the
    /// key-outer path (the four-head gathers give one head's bits; a latent sum is per column
    /// whatever the stripe; a row product gives each output the whole product's bits): the
    /// same bits.
    #[allow(clippy::too_many_arguments)]
    fn absorbed_by_head(
        &self,
        cx: &AttnCtx,
        q: QHeads,
        kv: &MlaKv,
        (sel, pos0): (&Selection, usize),
        by_head: &mut [f32],
        scratch: &mut [f32],
        block: usize,
        work: usize,
    ) {
        let d = cx.dims;
        let (qk, nv, l) = (d.nope + d.rope, d.nope + d.v, d.kv_lora);
        let w = &self.kv_b.w;
        let scale = Self::scaling(d);
        let int8 = cx.act == ActMode::Int8;
        let keys = RowKeys::of(sel, 0, pos0 + 1);
        let nk = keys.len();
        let at = cx.rope.at(pos0);
        let mut core = |prepared: Option<&PreparedRows>| {
            for_each_head(by_head, d.v, scratch, block, work, 1, |h, out, hs| {
                // The block's layout as `head_block_len` gives it for one row: q_lat,
                // ctx_lat, then the probabilities. The head's query waits in ctx_lat's place
                // until the softmax (`attend` takes this path only when it fits there).
                let (q_lat, rest) = hs.split_at_mut(l);
                let (ctx, rest) = rest.split_at_mut(l);
                let probs = &mut rest[..nk];
                let qh = &mut ctx[..qk];
                match (q, prepared) {
                    (QHeads::Deferred(_), Some(p)) => {
                        p.rows_by_output(h * qk, qh);
                        d.rotate(&at, &mut qh[d.nope..]);
                    }
                    (QHeads::Rotated(q), _) => qh.copy_from_slice(&q[h * qk..][..qk]),
                    (QHeads::Deferred(_), None) => unreachable!("deferred heads are prepared"),
                }
                let (q_nope, q_rope) = (&qh[..d.nope], &qh[d.nope..]);
                q_lat.fill(0.0);
                w.axpy_rows(h * nv, q_nope, q_lat);
                let mut idx = [0usize; KEY_CHUNK];
                let mut rope = [0f32; KEY_CHUNK];
                for sub in (0..nk).step_by(KEY_CHUNK) {
                    let mm = KEY_CHUNK.min(nk - sub);
                    let ks = keys.chunk(sub, mm, &mut idx);
                    let dst = &mut probs[sub..sub + mm];
                    dot_gather(q_lat, &kv.latent, l, ks, dst);
                    dot_gather(q_rope, &kv.rope, d.rope, ks, &mut rope[..mm]);
                    for (p, r) in dst.iter_mut().zip(&rope) {
                        *p = (*p + r) * scale;
                    }
                }
                softmax(probs);
                ctx.fill(0.0);
                for sub in (0..nk).step_by(KEY_CHUNK) {
                    let mm = KEY_CHUNK.min(nk - sub);
                    let ks = keys.chunk(sub, mm, &mut idx);
                    axpy_gather(ctx, &probs[sub..sub + mm], &kv.latent, l, ks);
                }
                w.matmul_rows(h * nv + d.nope, d.v, ctx, 1, out, int8);
            });
        };
        match q {
            // The row quantised once (as `q_b.forward` would), each head's rows on its task.
            QHeads::Deferred(dq) => dq
                .q_b
                .w
                .with_prepared(dq.q_resid, 1, int8, |p| core(Some(p))),
            QHeads::Rotated(_) => core(None),
        }
    }

    /// Head `h`'s latent sum (`ctx` of kv_lora floats) out of `stripes`, laid out (stripe,
    /// head, column in stripe) by the absorbed path's summing tasks.
    fn stripes_to_head(stripes: &[f32], heads: usize, h: usize, ctx: &mut [f32]) {
        for (j, part) in ctx.chunks_mut(STRIPE).enumerate() {
            let wj = part.len();
            part.copy_from_slice(&stripes[j * heads * STRIPE + h * wj..][..wj]);
        }
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

/// Rows of a chunk that `AttnPath::Auto` judges together: what a prefill chunk is while a
/// session decodes (`engine::PREFILL_CHUNK`).
const AUTO_BLOCK: usize = crate::experts::chunk::DECODE_CHUNK;

/// How many of a sequence's `n` rows at `pos0` take the reconstruct path; the rest take the
/// absorbed one. `nv` is a head's nope + v width.
///
/// `Auto` weighs the work of both: rebuilding each key's k and v costs `total * nv` a head
/// (`total` keys once the rows are appended), absorbing costs `n * (total + nv)`, so few rows
/// over a long context go absorbed. The two paths round differently, and a prompt's chunks
/// are as long as the engine likes (`experts/chunk.rs`: up to 2048 rows alone, 256 beside a
/// decoding session), so the choice is made for each block of [`AUTO_BLOCK`] rows as if it
/// were a chunk of its own: a chunk of any multiple of that length gives the bits of 256-row
/// chunks. The cost only falls as a block's context grows and as its rows shrink (only the
/// last block is short), so the blocks that go absorbed are the last ones.
pub(super) fn split_rows(path: AttnPath, n: usize, pos0: usize, nv: usize) -> usize {
    match path {
        AttnPath::Absorbed => 0,
        AttnPath::Reconstruct => n,
        AttnPath::Auto => (0..n)
            .step_by(AUTO_BLOCK)
            .find(|&b| {
                let rows = AUTO_BLOCK.min(n - b);
                let total = pos0 + b + rows;
                rows * (total + nv) < total * nv
            })
            .unwrap_or(n),
    }
}

/// A decode step's `q_b_proj` and its input row (q_a_layernorm's output), for a core that
/// projects the query heads itself (`Mla::forward`).
#[derive(Clone, Copy)]
struct DeferredQ<'a> {
    q_b: &'a Linear,
    q_resid: &'a [f32],
}

impl DeferredQ<'_> {
    /// The query heads of the row at `pos0`, as `Mla::forward` projects and rotates them.
    fn project(&self, cx: &AttnCtx, pos0: usize, q: &mut [f32]) {
        self.q_b.forward(self.q_resid, 1, q, cx.act);
        cx.dims.rotate_heads(&cx.rope.at(pos0), q);
    }
}

/// Where the head-by-head core takes each head's query from.
#[derive(Clone, Copy)]
enum QHeads<'a> {
    /// Projected and rotated: `(heads, nope + rope)`.
    Rotated(&'a [f32]),
    /// Projected and rotated by each head's task.
    Deferred(DeferredQ<'a>),
}

/// The per-call buffers of one sequence's attention core.
struct CoreScratch<'a> {
    by_head: &'a mut Vec<f32>,
    heads: &'a mut Vec<f32>,
    tile: &'a mut Vec<f32>,
    stripes: &'a mut Vec<f32>,
    rebuild: &'a mut Vec<f32>,
}

/// Keys the absorbed path scores per task (a multiple of `KEY_CHUNK`, so each task's gathers
/// cut the keys where a head-by-head loop would).
const KEYS_PER_TASK: usize = 4 * KEY_CHUNK;

/// Selected latent floats (keys x kv_lora) up to which a decode step's absorbed core runs
/// head by head (`Mla::absorbed_by_head`): 256 KB, which stays in a core's L2 while every
/// head of the task's share reads it.
const HEAD_OUTER_MAX_LATENT: usize = 1 << 16;

/// Latent columns the absorbed path sums per task.
const STRIPE: usize = 64;

/// Multiply-adds below which the attention core stays on the calling thread.
const PARALLEL_WORK: usize = 1 << 18;

/// Scores (heads x keys) below which the absorbed path's softmaxes stay on the calling
/// thread, in a step whose products go parallel: a few thousand exponentials take less than
/// waking the workers and joining them.
const PARALLEL_SOFTMAX: usize = 1 << 14;

/// `f(i, chunk)` over `buf`'s chunks of `chunk` elements, on the worker threads when `par`
/// (the pool of products at `positions` query rows).
fn chunks_maybe_par(
    buf: &mut [f32],
    chunk: usize,
    par: bool,
    positions: usize,
    f: impl Fn(usize, &mut [f32]) + Sync + Send,
) {
    if par {
        par_chunks_mut(buf, chunk, positions, f);
    } else {
        buf.chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c));
    }
}

/// The keys one query row attends to, indexable by position in its softmax.
#[derive(Clone, Copy)]
enum RowKeys<'a> {
    /// The DSA selection (ascending).
    List(&'a [usize]),
    /// Every visible position `0..n`.
    All(usize),
}

impl<'a> RowKeys<'a> {
    fn of(sel: &'a Selection, s: usize, visible: usize) -> RowKeys<'a> {
        match sel.row(s) {
            Some(list) => RowKeys::List(list),
            None => RowKeys::All(visible),
        }
    }

    fn len(&self) -> usize {
        match self {
            RowKeys::List(l) => l.len(),
            RowKeys::All(n) => *n,
        }
    }

    /// Keys `i0..i0 + m` (`m <= KEY_CHUNK`), borrowed from the list or written to `idx`.
    fn chunk<'b>(&self, i0: usize, m: usize, idx: &'b mut [usize; KEY_CHUNK]) -> &'b [usize]
    where
        'a: 'b,
    {
        match *self {
            RowKeys::List(l) => &l[i0..i0 + m],
            RowKeys::All(_) => {
                for (k, slot) in idx[..m].iter_mut().enumerate() {
                    *slot = i0 + k;
                }
                &idx[..m]
            }
        }
    }
}

/// Keys a gathered score or sum takes per call (their indices wait on the stack).
const KEY_CHUNK: usize = 64;

/// Floats of one head's scratch block: the absorbed path's q_lat and ctx_lat (`latent` =
/// kv_lora; 0 for the reconstruct path, which needs neither), then the softmax probabilities
/// of up to `keys` keys. Never 0, so every head gets a block.
pub(crate) fn head_block_len(latent: usize, n: usize, keys: usize) -> usize {
    (2 * n * latent + keys).max(1)
}

/// Runs `f(head, block, scratch)` over the per-head blocks of `buf` (`block` floats each) and
/// of `scratch` (`sblock` floats each), on the worker threads when the work (multiply-adds) is
/// big enough to pay for waking them (the pool of products at `positions` query rows).
fn for_each_head(
    buf: &mut [f32],
    block: usize,
    scratch: &mut [f32],
    sblock: usize,
    work: usize,
    positions: usize,
    f: impl Fn(usize, &mut [f32], &mut [f32]) + Sync + Send,
) {
    if work >= PARALLEL_WORK {
        par_chunk_pairs(buf, block, scratch, sblock, positions, f);
    } else {
        buf.chunks_mut(block)
            .zip(scratch.chunks_mut(sblock))
            .enumerate()
            .for_each(|(h, (b, s))| f(h, b, s));
    }
}

#[cfg(test)]
#[path = "mla_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "mla_gpu_tests.rs"]
mod gpu_tests;

#[path = "mla_reconstruct.rs"]
mod reconstruct;

#[path = "mla_probe.rs"]
pub(crate) mod probe;
