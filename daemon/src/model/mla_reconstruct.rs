//! The reconstruct path of MLA's attention core (see `mla.rs`): `kv_b_proj` turns every cached
//! latent into per-head keys and values, which each head's queries then attend over.
//!
//! Each head's task rebuilds its own keys and values (that head's rows of `kv_b_proj` over the
//! whole cache, from activations quantized once for all heads) into its own block, then
//! attends: the head's keys and values stay in L2 between the product and the scores, and
//! nothing of the size of the whole expansion is written, transposed and regrouped first.
//! Every output is the one the whole product computes (`PreparedRows::rows_by_output`), so
//! the bits are those of the whole-matrix path, which stays for a `kv_b_proj` that runs on
//! the device or has a bias.

use super::{
    for_each_head, head_block_len, AttnCtx, Mla, MlaDims, MlaKv, RowKeys, Selection, KEY_CHUNK,
};
use crate::model::linear::ActMode;
use crate::model::ops::{axpy_gather, axpy_gather4, dot_gather, softmax_rows};
use crate::model::scratch::grow;
use crate::quant::{dot_f32_cols, has_dot_f32_cols};

/// Query rows the reconstruct path takes through each chunk of keys together.
pub(super) const QUERY_TILE: usize = 16;

/// One head's keys and values as its attention core reads them.
struct HeadKv<'a> {
    /// Key `t` (`nope` floats) at `keys[t * kstride..]` (unused when scored by column).
    keys: &'a [f32],
    kstride: usize,
    /// Value `t` (`v` floats) at `values[t * vstride..]`.
    values: &'a [f32],
    vstride: usize,
    /// The keys by column, element `e` of key `t` at `cols[e * ld + t]` (when scored by
    /// column).
    cols: &'a [f32],
}

impl Mla {
    /// `by_head` (zeroed, `(heads, n, v)`) gets each head's output. `heads` and `rebuild` are
    /// the per-head blocks: the softmax probabilities alone (`heads`, kept between calls) when
    /// the keys and values are rebuilt for all heads at once, or the probabilities and that
    /// head's keys and values (`rebuild`, which scales with the context: the model empties it
    /// after each forward) when each head rebuilds its own (`per_head`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attend_reconstructed(
        &self,
        cx: &AttnCtx,
        q: &[f32],
        n: usize,
        pos0: usize,
        kv: &MlaKv,
        sel: &Selection,
        by_head: &mut [f32],
        (heads, rebuild): (&mut Vec<f32>, &mut Vec<f32>),
        per_head: bool,
    ) {
        let d = cx.dims;
        let nv = d.nope + d.v;
        let total = kv.latent.len() / d.kv_lora;
        // The most keys any row attends to: the length of its softmax.
        let max_keys = (0..n)
            .map(|s| sel.row(s).map_or(pos0 + s + 1, |r| r.len()))
            .max()
            .unwrap_or(0);
        let tile = n.min(QUERY_TILE);
        let probs_len = head_block_len(0, tile, tile * max_keys);
        // Short heads (under 64 wide, where the horizontal sum is most of a key's cost) whose
        // rows all attend to every visible key (no DSA selection) are scored by column where
        // the kernels can: keys `(H, nope, ld)`, the shared rope keys `(rope, ld)`, sixteen
        // keys a vector, no horizontal sums, the same bits (see `dot_f32_cols`). GLM-5's
        // 192 + 64 ran 1.25x slower that way, a chunk's columns more lines than L1 holds.
        // `ld` is a whole number of cache lines plus one: `total` is often a multiple of
        // 1 KiB, which put every element of a key in the same few L1 sets.
        let by_column =
            has_dot_f32_cols() && d.nope.max(d.rope) < 64 && (0..n).all(|s| sel.row(s).is_none());
        let ld = total.next_multiple_of(16) + 16;
        let rope_t = if by_column {
            let mut rope_t = vec![0.0; d.rope * ld];
            columns_into(&kv.rope, total, d.rope, ld, &mut rope_t);
            rope_t
        } else {
            Vec::new()
        };
        let core = |h: usize, out: &mut [f32], probs: &mut [f32], kvh: HeadKv| {
            Self::head_core(d, q, pos0, kv, sel, (h, out, probs), kvh, (&rope_t, ld));
        };
        // Heads are independent: one task per head, each writing its own (n, v) block.
        let work = n * total * d.heads * (d.nope + d.v);
        if per_head {
            let int8 = cx.act == ActMode::Int8;
            // The product's `(nv, total)` output, then the keys and values as the core reads
            // them: by column and by row (values only), or both by row. About twice the whole
            // expansion in all (the RAM clamp's "k/v rebuild buffer" counts it once), where the
            // whole product took about three and a half at once: its output, its row-major
            // scratch (kept per thread), the copy regrouped by head and the keys by column.
            let (cols_len, rows_len) = if by_column {
                (d.nope * ld, d.v * total)
            } else {
                (0, nv * total)
            };
            let block = probs_len + nv * total + cols_len + rows_len;
            let scratch = grow(rebuild, d.heads * block);
            let work = work + d.heads * total * nv * d.kv_lora;
            self.kv_b.w.with_prepared(&kv.latent, total, int8, |prep| {
                for_each_head(by_head, n * d.v, scratch, block, work, n, |h, out, hs| {
                    let (probs, hs) = hs.split_at_mut(probs_len);
                    let (raw, hs) = hs.split_at_mut(nv * total);
                    let (cols, rows) = hs.split_at_mut(cols_len);
                    prep.rows_by_output(h * nv, raw);
                    let kvh = if by_column {
                        for (e, col) in cols.chunks_exact_mut(ld).enumerate() {
                            col[..total].copy_from_slice(&raw[e * total..][..total]);
                        }
                        let values = &mut *rows;
                        transpose(&raw[d.nope * total..], total, values);
                        HeadKv {
                            keys: &[],
                            kstride: 0,
                            values,
                            vstride: d.v,
                            cols,
                        }
                    } else {
                        transpose(raw, total, rows);
                        HeadKv {
                            keys: rows,
                            kstride: nv,
                            values: &rows[d.nope..],
                            vstride: nv,
                            cols: &[],
                        }
                    };
                    core(h, out, probs, kvh);
                });
            });
            return;
        }
        // kv = kv_b_proj(c).view(H, nope + v) for every cached position: (total, H, nope + v).
        // Allocated per call on purpose (see `scratch`): it scales with the context.
        let full = self.kv_b.apply(&kv.latent, total, cx.act);
        // Regrouped head by head, (H, total, nope + v): a head's keys are then one contiguous
        // run its queries stream through L2, not rows `H * (nope + v)` floats apart (4 KiB at
        // 16 heads of 64, so every row fell in the same few cache sets and came from L3).
        let full = by_head_rows(&full, total, d.heads, nv);
        let kt = if by_column {
            let mut kt = vec![0.0; d.heads * d.nope * ld];
            for (h, kt_h) in kt.chunks_exact_mut(d.nope * ld).enumerate() {
                columns_into(&full[h * total * nv..], total, nv, ld, kt_h);
            }
            kt
        } else {
            Vec::new()
        };
        let scratch = grow(heads, d.heads * probs_len);
        for_each_head(
            by_head,
            n * d.v,
            scratch,
            probs_len,
            work,
            n,
            |h, out, probs| {
                let kh = &full[h * total * nv..];
                let kvh = HeadKv {
                    keys: kh,
                    kstride: nv,
                    values: &kh[d.nope..],
                    vstride: nv,
                    cols: kt.get(h * d.nope * ld..).unwrap_or(&[]),
                };
                core(h, out, probs, kvh);
            },
        );
    }

    /// Head `h`'s output `out` (`(n, v)`) over its keys and values `kvh`, with the rope keys
    /// `rope_t` by column (`ld` apart) when `kvh` has its keys by column; `probs` holds a tile
    /// of rows' probabilities.
    #[allow(clippy::too_many_arguments)]
    fn head_core(
        d: MlaDims,
        q: &[f32],
        pos0: usize,
        kv: &MlaKv,
        sel: &Selection,
        (h, out, probs): (usize, &mut [f32], &mut [f32]),
        kvh: HeadKv,
        (rope_t, ld): (&[f32], usize),
    ) {
        let qk = d.nope + d.rope;
        let scale = Self::scaling(d);
        let by_column = !kvh.cols.is_empty();
        let mut idx = [0usize; KEY_CHUNK];
        let mut rope_scores = [0f32; KEY_CHUNK];
        // A tile of query rows meets each chunk of keys in turn, so the chunk's keys (and then
        // its values) are read from L2 by every row of the tile instead of from L3 once per row
        // (a GLM-5 head's keys and values at 1k positions are 1.8 MB). Each row still makes the
        // same calls on the same chunks in the same order, only interleaved with the other
        // rows', so the same bits.
        for (t, out_t) in out.chunks_mut(QUERY_TILE * d.v).enumerate() {
            let s0 = t * QUERY_TILE;
            let rows = out_t.len() / d.v;
            // (A short last tile repeats its last row in the unused entries.)
            let keys: [RowKeys; QUERY_TILE] = core::array::from_fn(|i| {
                let s = s0 + i.min(rows - 1);
                RowKeys::of(sel, s, pos0 + s + 1)
            });
            let keys = &keys[..rows];
            let most = keys.iter().map(RowKeys::len).max().unwrap_or(0);
            let (probs, _) = probs.split_at_mut(rows * most);
            // Scores: `(dot(q_nope, k_t) + dot(q_rope, r_t)) * scale` for each key.
            for sub in (0..most).step_by(KEY_CHUNK) {
                for (i, rk) in keys.iter().enumerate() {
                    let m = KEY_CHUNK.min(rk.len().saturating_sub(sub));
                    if m == 0 {
                        continue;
                    }
                    let s = s0 + i;
                    let qh = &q[(s * d.heads + h) * qk..][..qk];
                    let dst = &mut probs[i * most + sub..][..m];
                    let rope_dst = &mut rope_scores[..m];
                    if by_column {
                        let kt_h = &kvh.cols[..d.nope * ld];
                        dot_f32_cols(&qh[..d.nope], &kt_h[sub..], ld, dst);
                        dot_f32_cols(&qh[d.nope..], &rope_t[sub..], ld, rope_dst);
                    } else {
                        let ks = rk.chunk(sub, m, &mut idx);
                        dot_gather(&qh[..d.nope], kvh.keys, kvh.kstride, ks, dst);
                        dot_gather(&qh[d.nope..], &kv.rope, d.rope, ks, rope_dst);
                    }
                    for (p, r) in dst.iter_mut().zip(&rope_scores) {
                        *p = (*p + r) * scale;
                    }
                }
            }
            let lens: [usize; QUERY_TILE] = core::array::from_fn(|i| keys[i.min(rows - 1)].len());
            softmax_rows(probs, most, &lens[..rows]);
            // `out += p_t * value(t)` in key order for each row, the accumulator held in
            // registers across a chunk; four rows over the same keys in one pass where they
            // share them (each value row loaded once for the four, four independent chains of
            // multiply-adds), each row's keys still in order, so the same bits.
            let probs = &*probs;
            for sub in (0..most).step_by(KEY_CHUNK) {
                let m = |i: usize| KEY_CHUNK.min(keys[i].len().saturating_sub(sub));
                let mut outs = out_t.chunks_exact_mut(d.v);
                let mut i = 0;
                while i < rows {
                    let all = |i: usize| matches!(keys[i], RowKeys::All(_));
                    if i + 4 <= rows && (i..i + 4).all(all) {
                        // Their keys are `sub..` up to each row's length: the four together
                        // as far as the shortest goes, then each row's own rest.
                        let common = (i..i + 4).map(m).min().unwrap_or(0);
                        let four: [&mut [f32]; 4] =
                            core::array::from_fn(|_| outs.next().expect("four rows"));
                        let p = |j: usize, from: usize, to: usize| {
                            &probs[(i + j) * most + sub + from..][..to - from]
                        };
                        let ks = keys[i].chunk(sub, common, &mut idx);
                        let coefs = core::array::from_fn(|j| p(j, 0, common));
                        let [a, b, c, e] = four;
                        axpy_gather4(
                            [&mut *a, &mut *b, &mut *c, &mut *e],
                            coefs,
                            kvh.values,
                            kvh.vstride,
                            ks,
                        );
                        for (j, oh) in [a, b, c, e].into_iter().enumerate() {
                            let mj = m(i + j);
                            if mj > common {
                                let ks = keys[i + j].chunk(sub + common, mj - common, &mut idx);
                                axpy_gather(oh, p(j, common, mj), kvh.values, kvh.vstride, ks);
                            }
                        }
                        i += 4;
                        continue;
                    }
                    let oh = outs.next().expect("a row");
                    let mi = m(i);
                    if mi > 0 {
                        let ks = keys[i].chunk(sub, mi, &mut idx);
                        let p = &probs[i * most + sub..][..mi];
                        axpy_gather(oh, p, kvh.values, kvh.vstride, ks);
                    }
                    i += 1;
                }
            }
        }
    }
}

/// `(w, n)` as `(n, w)`: `out[t * w + e] = raw[e * n + t]`, sixteen columns of `raw` at a
/// time, so the rows being written stay in L1.
fn transpose(raw: &[f32], n: usize, out: &mut [f32]) {
    let w = out.len() / n;
    for t0 in (0..n).step_by(16) {
        let block = &mut out[t0 * w..n.min(t0 + 16) * w];
        for (e, row) in raw[..w * n].chunks_exact(n).enumerate() {
            for (dt, &v) in row[t0..n.min(t0 + 16)].iter().enumerate() {
                block[dt * w + e] = v;
            }
        }
    }
}

/// The first `out.len() / ld` elements of each of `n` rows `stride` apart, by column:
/// element `e` of row `t` to `out[e * ld + t]` (`ld >= n`; the padding is left as it is).
/// Sixteen rows at a time, so the rows being read stay in L1.
fn columns_into(rows: &[f32], n: usize, stride: usize, ld: usize, out: &mut [f32]) {
    for t0 in (0..n).step_by(16) {
        let block = &rows[t0 * stride..];
        for (e, col) in out.chunks_exact_mut(ld).enumerate() {
            for (dt, o) in col[t0..n.min(t0 + 16)].iter_mut().enumerate() {
                *o = block[dt * stride + e];
            }
        }
    }
}

/// `rows` (`(total, heads, width)`) as `(heads, total, width)`.
fn by_head_rows(rows: &[f32], total: usize, heads: usize, width: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows.len());
    for h in 0..heads {
        for t in 0..total {
            let at = (t * heads + h) * width;
            out.extend_from_slice(&rows[at..at + width]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::tests::values;
    use super::*;
    use crate::model::linear::Linear;
    use crate::model::rope::Rope;
    use crate::quant::{QFormat, QMatrix};

    /// The core as its definition reads, one row and one head at a time, one kernel call per
    /// key (`dot_f32_cols` and the gathered kernels promise those bits): `(n, heads, v)` as
    /// bits, laid out as `by_head`.
    fn reference(
        mla: &Mla,
        cx: &AttnCtx,
        q: &[f32],
        n: usize,
        pos0: usize,
        kv: &MlaKv,
        sel: &Selection,
    ) -> Vec<u32> {
        use crate::model::ops::{axpy, dot, softmax};
        let d = cx.dims;
        let (qk, nv) = (d.nope + d.rope, d.nope + d.v);
        let total = kv.latent.len() / d.kv_lora;
        let full = mla.kv_b.apply(&kv.latent, total, cx.act);
        let mut by_head = vec![0.0; d.heads * n * d.v];
        for h in 0..d.heads {
            for s in 0..n {
                let keys: Vec<usize> = match sel.row(s) {
                    Some(list) => list.to_vec(),
                    None => (0..pos0 + s + 1).collect(),
                };
                let qh = &q[(s * d.heads + h) * qk..][..qk];
                let mut p: Vec<f32> = keys
                    .iter()
                    .map(|&t| {
                        let k = &full[(t * d.heads + h) * nv..][..d.nope];
                        let r = &kv.rope[t * d.rope..][..d.rope];
                        (dot(&qh[..d.nope], k) + dot(&qh[d.nope..], r)) * Mla::scaling(d)
                    })
                    .collect();
                softmax(&mut p);
                let out = &mut by_head[(h * n + s) * d.v..][..d.v];
                for (&t, &pt) in keys.iter().zip(&p) {
                    axpy(out, pt, &full[(t * d.heads + h) * nv + d.nope..][..d.v]);
                }
            }
        }
        by_head.iter().map(|v| v.to_bits()).collect()
    }

    /// Each head rebuilding its own keys and values gives the bits of the whole product
    /// regrouped, and both the definition's bits: every weight format and both activation modes, spans of 1 to 40 rows over
    /// caches not a multiple of the tiles, dense rows (scored by column where the kernels
    /// can) and a DSA selection with gaps (scored by row), on the pool and on one thread.
    #[test]
    fn per_head_rebuild_equals_the_whole_product() {
        let d = MlaDims {
            heads: 5,
            nope: 24,
            rope: 8,
            v: 20,
            kv_lora: 72,
            softmax_factor: 1.0,
            interleave: true,
        };
        let (qk, nv, l) = (d.nope + d.rope, d.nope + d.v, d.kv_lora);
        let rope = Rope::new(d.rope, 10000.0);
        for fmt in QFormat::ALL {
            let w: Vec<f32> = values(d.heads * nv * l, 4)
                .iter()
                .map(|v| v * 0.2)
                .collect();
            let linear = |rows: usize, cols: usize| Linear {
                w: QMatrix::from_f32(vec![0.0; rows * cols], rows, cols),
                bias: None,
                slot: Default::default(),
            };
            let mla = Mla {
                q: super::super::QProj::Full(linear(d.heads * qk, 8)),
                kv_a: linear(l + d.rope, 8),
                kv_a_norm: vec![1.0; l],
                kv_b: Linear {
                    w: QMatrix::quantize(&w, d.heads * nv, l, fmt),
                    bias: None,
                    slot: Default::default(),
                },
                o: linear(8, d.heads * d.v),
                indexer: None,
            };
            for (n, total, gaps) in [
                (1, 19, false),
                (8, 40, false),
                (13, 77, true),
                (40, 83, false),
            ] {
                let pos0 = total - n;
                let kv = MlaKv {
                    latent: values(total * l, 6),
                    rope: values(total * d.rope, 7),
                    ..MlaKv::default()
                };
                let q = values(n * d.heads * qk, 8);
                let mut sel = Selection::with_capacity(n, total);
                if gaps {
                    sel.begin(n);
                    for s in (0..n).step_by(2) {
                        sel.keep(s, (0..pos0 + s + 1).filter(|t| t % 3 != 1));
                    }
                }
                for act in [ActMode::F32, ActMode::Int8] {
                    let cx = AttnCtx {
                        dims: d,
                        rope: &rope,
                        index_topk: total,
                        path: super::super::AttnPath::Reconstruct,
                        act,
                        place: &crate::model::placement::CPU,
                    };
                    let run = |per_head: bool| {
                        let mut by_head = vec![0.0; d.heads * n * d.v];
                        let (mut heads, mut rebuild) = (Vec::new(), Vec::new());
                        let bufs = (&mut heads, &mut rebuild);
                        mla.attend_reconstructed(
                            &cx,
                            &q,
                            n,
                            pos0,
                            &kv,
                            &sel,
                            &mut by_head,
                            bufs,
                            per_head,
                        );
                        by_head.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                    };
                    let whole = run(false);
                    assert_eq!(run(true), whole, "{fmt} {act:?} {n} rows of {total}");
                    let spec = reference(&mla, &cx, &q, n, pos0, &kv, &sel);
                    assert_eq!(whole, spec, "{fmt} {act:?} {n} rows of {total}: the spec");
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(1)
                        .build()
                        .unwrap();
                    assert_eq!(
                        pool.install(|| run(true)),
                        whole,
                        "{fmt} {act:?} one thread"
                    );
                }
            }
        }
    }
}
