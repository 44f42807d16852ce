//! Multi-head latent attention (reference §3) with the compressed KV cache, in two paths that
//! compute the same thing:
//!
//! * **reconstruct**: `kv_b_proj` turns every cached latent into per-head `[k_nope | v]`, as
//!   transformers does; cheapest for long batches (prefill).
//! * **absorbed**: `kv_b_proj` is folded into the query (`q_lat = W_k^T q_nope`) and the output
//!   (`o = W_v (sum_t p_t c_t)`), so a decode step never expands the cache.

use super::dsa_indexer::{Indexer, Selection};
use super::kv::LayerKv;
use super::linear::{ActMode, Linear};
use super::ops::{axpy, dot, rms_norm_rows, softmax};
use super::rope::Rope;
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
    /// Attention for `n` new rows of `a` (the input_layernorm output) at positions
    /// `pos0..pos0+n`, appending their keys to `kv`. `sel` carries the DSA selection from
    /// layer to layer: a full layer replaces it, a shared layer reads it.
    pub fn forward(
        &self,
        cx: &AttnCtx,
        a: &[f32],
        n: usize,
        pos0: usize,
        kv: &mut LayerKv,
        sel: &mut Selection,
    ) -> Vec<f32> {
        let d = cx.dims;
        let qk = d.nope + d.rope;
        // q_resid = q_a_layernorm(q_a_proj(a)); q = q_b_proj(q_resid).view(H, nope + rope)
        let mut q_resid = self.q_a.apply(a, n, cx.act);
        rms_norm_rows(&mut q_resid, &self.q_a_norm, LORA_NORM_EPS);
        let mut q = self.q_b.apply(&q_resid, n, cx.act);
        for (s, row) in q.chunks_exact_mut(d.heads * qk).enumerate() {
            for head in row.chunks_exact_mut(qk) {
                cx.rope.rotate(&mut head[d.nope..], pos0 + s);
            }
        }
        // ckv = kv_a_proj_with_mqa(a) = [c (kv_lora) | k_rope (rope)]
        let ckv = self.kv_a.apply(a, n, cx.act);
        // Appended to the cache first, then normalised / rotated in place there.
        for (s, row) in ckv.chunks_exact(d.kv_lora + d.rope).enumerate() {
            let at = kv.latent.len();
            kv.latent.extend_from_slice(&row[..d.kv_lora]);
            rms_norm_rows(&mut kv.latent[at..], &self.kv_a_norm, LORA_NORM_EPS);
            let at = kv.rope.len();
            kv.rope.extend_from_slice(&row[d.kv_lora..]);
            cx.rope.rotate(&mut kv.rope[at..], pos0 + s);
        }
        if let Some(ix) = &self.indexer {
            *sel = ix.select(
                cx.rope,
                a,
                &q_resid,
                n,
                pos0,
                &mut kv.index,
                cx.index_topk,
                cx.act,
            );
        }
        debug_assert_eq!(
            sel.rows.len(),
            n,
            "shared DSA layer without a full layer before it"
        );

        let total = kv.latent.len() / d.kv_lora;
        let nv = d.nope + d.v;
        let absorbed = match cx.path {
            AttnPath::Absorbed => true,
            AttnPath::Reconstruct => false,
            AttnPath::Auto => n * (total + nv) < total * nv,
        };
        let heads_out = if absorbed {
            self.attend_absorbed(cx, &q, n, pos0, kv, sel)
        } else {
            self.attend_reconstructed(cx, &q, n, pos0, kv, sel)
        };
        self.o.apply(&heads_out, n, cx.act)
    }

    /// The keys query row `s` attends to: the DSA selection, or every visible position.
    fn keys_of(sel: &Selection, s: usize, visible: usize) -> KeyIter<'_> {
        match sel.rows.get(s).and_then(|r| r.as_deref()) {
            Some(list) => KeyIter::List(list.iter()),
            None => KeyIter::Range(0..visible),
        }
    }

    fn scaling(d: MlaDims) -> f32 {
        ((d.nope + d.rope) as f32).powf(-0.5)
    }

    fn attend_reconstructed(
        &self,
        cx: &AttnCtx,
        q: &[f32],
        n: usize,
        pos0: usize,
        kv: &LayerKv,
        sel: &Selection,
    ) -> Vec<f32> {
        let d = cx.dims;
        let (qk, nv) = (d.nope + d.rope, d.nope + d.v);
        let total = kv.latent.len() / d.kv_lora;
        // kv = kv_b_proj(c).view(H, nope + v) for every cached position: (total, H, nope + v)
        let full = self.kv_b.apply(&kv.latent, total, cx.act);
        let scale = Self::scaling(d);
        // Heads are independent: one task per head, each writing its own (n, v) block.
        let mut by_head = vec![0.0f32; d.heads * n * d.v];
        let work = n * total * d.heads * (d.nope + d.v);
        for_each_head(&mut by_head, n * d.v, work, |h, out| {
            let mut keys = Vec::new();
            let mut probs = Vec::new();
            for (s, oh) in out.chunks_exact_mut(d.v).enumerate() {
                keys.clear();
                keys.extend(Self::keys_of(sel, s, pos0 + s + 1));
                let qh = &q[(s * d.heads + h) * qk..][..qk];
                attend_row(
                    &keys,
                    &mut probs,
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
        Self::heads_to_rows(&by_head, n, d.heads, d.v)
    }

    fn attend_absorbed(
        &self,
        cx: &AttnCtx,
        q: &[f32],
        n: usize,
        pos0: usize,
        kv: &LayerKv,
        sel: &Selection,
    ) -> Vec<f32> {
        let d = cx.dims;
        let (qk, nv, l) = (d.nope + d.rope, d.nope + d.v, d.kv_lora);
        let w = &self.kv_b.w;
        let scale = Self::scaling(d);
        let mut by_head = vec![0.0f32; d.heads * n * d.v];
        let total = kv.latent.len() / l;
        let work = n * d.heads * (total + nv) * l;
        for_each_head(&mut by_head, n * d.v, work, |h, out| {
            let mut row = vec![0.0f32; l];
            // q_lat[s] = sum_i q_nope[s,h,i] * W_kb[h*(nope+v) + i, :]   (each row read once)
            let mut q_lat = vec![0.0f32; n * l];
            for i in 0..d.nope {
                w.dequant_row(h * nv + i, &mut row);
                for (s, ql) in q_lat.chunks_exact_mut(l).enumerate() {
                    axpy(ql, q[(s * d.heads + h) * qk + i], &row);
                }
            }
            // ctx_lat[s] = sum_t softmax_t(q_lat.c_t + q_rope.k_rope_t) c_t
            let mut ctx_lat = vec![0.0f32; n * l];
            let mut keys = Vec::new();
            let mut probs = Vec::new();
            for s in 0..n {
                keys.clear();
                keys.extend(Self::keys_of(sel, s, pos0 + s + 1));
                let ql = &q_lat[s * l..][..l];
                let qr = &q[(s * d.heads + h) * qk + d.nope..][..d.rope];
                attend_row(
                    &keys,
                    &mut probs,
                    |t| {
                        (dot(ql, &kv.latent[t * l..][..l])
                            + dot(qr, &kv.rope[t * d.rope..][..d.rope]))
                            * scale
                    },
                    |t| &kv.latent[t * l..][..l],
                    &mut ctx_lat[s * l..][..l],
                );
            }
            // o[s,j] = W_kb[h*(nope+v) + nope + j, :] . ctx_lat[s]
            for j in 0..d.v {
                w.dequant_row(h * nv + d.nope + j, &mut row);
                for s in 0..n {
                    out[s * d.v + j] = dot(&row, &ctx_lat[s * l..][..l]);
                }
            }
        });
        Self::heads_to_rows(&by_head, n, d.heads, d.v)
    }

    /// (heads, n, v) -> (n, heads * v), the layout o_proj reads.
    fn heads_to_rows(by_head: &[f32], n: usize, heads: usize, v: usize) -> Vec<f32> {
        let mut out = vec![0.0f32; n * heads * v];
        for h in 0..heads {
            for s in 0..n {
                out[(s * heads + h) * v..][..v].copy_from_slice(&by_head[(h * n + s) * v..][..v]);
            }
        }
        out
    }
}

/// One query row of one head: softmax over the `score`s of `keys`, then
/// `out += p_t * value(t)` in key order (the same operations in both attention paths).
fn attend_row<'a>(
    keys: &[usize],
    probs: &mut Vec<f32>,
    score: impl Fn(usize) -> f32,
    value: impl Fn(usize) -> &'a [f32],
    out: &mut [f32],
) {
    probs.clear();
    probs.extend(keys.iter().map(|&t| score(t)));
    softmax(probs);
    for (&t, &p) in keys.iter().zip(probs.iter()) {
        axpy(out, p, value(t));
    }
}

/// Runs `f(head, block)` over the per-head blocks of `buf`, on the worker threads when the
/// work (multiply-adds) is big enough to pay for waking them.
fn for_each_head(
    buf: &mut [f32],
    block: usize,
    work: usize,
    f: impl Fn(usize, &mut [f32]) + Sync + Send,
) {
    const PARALLEL_WORK: usize = 1 << 18;
    if work >= PARALLEL_WORK {
        buf.par_chunks_mut(block)
            .enumerate()
            .for_each(|(h, b)| f(h, b));
    } else {
        buf.chunks_mut(block).enumerate().for_each(|(h, b)| f(h, b));
    }
}

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
}
