//! Grouped-query attention (Qwen3-MoE; GLM-4.5 and the Llama family share it): `heads` query
//! heads over `kv_heads` key-value heads, each key-value head serving `heads / kv_heads`
//! consecutive query heads, as transformers' `repeat_kv` lays them out.
//!
//! Per row: `q = q_proj(x)`, `k = k_proj(x)`, `v = v_proj(x)` split into heads; with
//! `qk_norm` each query and key head is RMSNorm'd over `head_dim` (`q_norm`, `k_norm`); the
//! first `rotary_dim` values of every query and key head are rotated (rotate-half); the keys
//! and values are appended to the cache; each query head attends causally over its key-value
//! head's keys with scale `head_dim^-1/2` and softmax in f32; `o_proj` of the concatenated
//! heads is the output.
//!
//! With `output_gate` (Qwen3.5-MoE's gated attention) q_proj yields, per head, the query and
//! then a gate of `head_dim` values, and each head's output is multiplied by
//! `sigmoid(gate)` before o_proj.

use super::attn_core::{Attend, AttnShape, Visible};
use super::batch::{SeqStep, Span};
use super::linear::{ActMode, Linear};
use super::ops::rms_norm_rows;
use super::rope::Rope;
use super::scratch::{grow, AttnScratch};
use crate::config::GqaConfig;
use crate::gpu::GqaShape;
use crate::quant::QMatrix;

/// Rows of a span from which its attention core runs across the threads.
const PAR_ROWS: usize = 8;

/// Rows of a batch from which its q and k norms and rotations run across the threads
/// ([`Gqa::norm_rotate_par`]), and the rows a task takes there.
const PAR_NORM_ROWS: usize = 64;
const NORM_TASK_ROWS: usize = 16;

/// Multiply-adds (scores and values) from which one decode row's core splits its key-value
/// heads across the threads: below it, waking them costs more than the split saves.
const ROW_PAR_WORK: usize = 1 << 16;

pub(crate) struct Gqa {
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    /// RMSNorm weights of queries and keys, when the family has them: `head_dim` each, one
    /// norm per head, or (`cfg.qk_norm_whole`, MiniMax-M2) one norm over each row's whole
    /// projection, a weight per value.
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub heads: usize,
    pub cfg: GqaConfig,
    pub eps: f32,
    /// gpt-oss: one learned logit per query head in each softmax's denominator (its
    /// probability is dropped, so a head may attend to less than everything).
    pub sinks: Option<Vec<f32>>,
    /// gpt-oss's sliding layers: a query sees its own position and the `window - 1` before it.
    pub window: Option<usize>,
    /// q_proj yields a sigmoid output gate beside each query head (Qwen3.5-MoE).
    pub output_gate: bool,
}

impl Gqa {
    /// Attention of layer `layer` over the batch's rows `a` (normalised hidden states) into
    /// `out` (`(rows, hidden)`); each sequence's new keys and values go to its cache. The
    /// working memory is MLA's scratch (`q`, `ckv` for keys then values, `heads_out`, `heads`
    /// for a tile's probabilities), so a decode step does not allocate once it has grown.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &self,
        cx: &super::mla::AttnCtx,
        layer: usize,
        a: &[f32],
        spans: &[Span],
        seqs: &mut [SeqStep<'_>],
        sc: &mut AttnScratch,
        out: &mut [f32],
    ) {
        let GqaConfig {
            kv_heads,
            head_dim: hd,
            ..
        } = self.cfg;
        let (rope, act, place) = (cx.rope, cx.act, cx.place);
        let heads = self.heads;
        let rows: usize = spans.iter().map(|s| s.n).sum();
        let hidden = a.len() / rows.max(1);
        let (qw, kw) = (heads * hd, kv_heads * hd);
        let q = grow(&mut sc.q, rows * qw);
        let kv = grow(&mut sc.ckv, 2 * rows * kw);
        let one_region = rows == 1
            && act == ActMode::Int8
            && !self.output_gate
            && [&self.q, &self.k, &self.v].iter().all(|l| l.on_cpu());
        if one_region {
            self.qkv_one_region(a, q, kv);
        }
        let (k, v) = kv.split_at_mut(rows * kw);
        // Per head with `output_gate`: hd query values, then hd gate values (transformers'
        // view(.., heads, 2 * head_dim) and chunk), split out of q_proj's output below.
        let mut both = if self.output_gate && !one_region {
            Some(grow(&mut sc.q_resid, rows * 2 * qw))
        } else {
            None
        };
        if !one_region {
            // q, k and v over the rows quantized once (they were twice: q, then k and v).
            let yq = match both {
                Some(ref mut both) => &mut both[..],
                None => &mut q[..],
            };
            let lin = [&self.q, &self.k, &self.v];
            Linear::forward_triple(lin, a, rows, [yq, &mut k[..], &mut v[..]], act);
        }
        let gate = both.map(|both| {
            let gate = grow(&mut sc.by_head, rows * qw);
            for ((pair, qh), gh) in both
                .chunks_exact(2 * hd)
                .zip(q.chunks_exact_mut(hd))
                .zip(gate.chunks_exact_mut(hd))
            {
                qh.copy_from_slice(&pair[..hd]);
                gh.copy_from_slice(&pair[hd..]);
            }
            &*gate
        });
        if rows >= PAR_NORM_ROWS && !place.attention_on() {
            self.norm_rotate_par(rope, spans, q, k);
        } else {
            self.norm_rotate(rope, spans, q, k, |x, w| place.norm_rows(x, w, self.eps));
        }
        let scale = (hd as f32).powf(-0.5);
        let heads_out = grow(&mut sc.heads_out, rows * qw);
        let scores = &mut sc.heads;
        for (span, seq) in spans.iter().zip(seqs.iter_mut()) {
            let super::kv::KvCache {
                layers,
                device: mirror,
                ..
            } = &mut *seq.kv;
            let super::kv::LayerKv::Gqa(cache) = &mut layers[layer] else {
                // The cache was made from this model's config (`KvCache::new`).
                unreachable!("a grouped-query layer's cache holds MLA keys");
            };
            cache
                .k
                .extend_from_slice(&k[span.start * kw..(span.start + span.n) * kw]);
            cache
                .v
                .extend_from_slice(&v[span.start * kw..(span.start + span.n) * kw]);
            // The device's core has neither sinks nor windows: gpt-oss attends on the CPU.
            let plain = self.sinks.is_none() && self.window.is_none();
            let shape = GqaShape {
                heads,
                kv_heads,
                head_dim: hd,
                scale,
            };
            let span_q = &q[span.start * qw..(span.start + span.n) * qw];
            let placed = plain
                .then(|| {
                    place.attention(|g| {
                        let [kc, vc] =
                            mirror.sync(g.kernels(), layer, [&cache.k[..], &cache.v[..]])?;
                        g.gqa_core(shape, span_q, span.n, span.pos0, (kc, vc))
                    })
                })
                .flatten();
            if let Some(o) = placed {
                heads_out[span.start * qw..(span.start + span.n) * qw].copy_from_slice(&o);
                continue;
            }
            // Not placed, or the device failed: the CPU cache holds every row.
            let core = Attend {
                shape: AttnShape {
                    heads,
                    kv_heads,
                    head_dim: hd,
                    scale,
                },
                q: span_q,
                k: &cache.k,
                v: &cache.v,
                visible: Visible {
                    pos0: span.pos0,
                    window: self.window,
                },
                sinks: self.sinks.as_deref(),
            };
            let out = &mut heads_out[span.start * qw..(span.start + span.n) * qw];
            let keys = core.visible.keys(0).len();
            if span.n >= PAR_ROWS {
                // A prefill's row tiles across the threads (its quadratic part: at 512
                // positions it was half the prefill on one thread).
                core.run_par(out);
            } else if span.n == 1 && kv_heads > 1 && 2 * qw * keys >= ROW_PAR_WORK {
                // A decode row: its key-value heads across the threads, instead of the other
                // threads waiting while this one attends.
                core.run_row_par(out, scores);
            } else {
                // Decode and short spans on this thread, in the scratch (no allocation a step).
                core.run(out, scores);
            }
        }
        if let Some(gate) = gate {
            for (o, g) in heads_out.iter_mut().zip(gate) {
                *o *= super::ops::sigmoid(*g);
            }
        }
        self.o
            .forward(heads_out, rows, &mut out[..rows * hidden], act);
    }

    /// A decode row's q (into `q`), k and v (into `kv`, k then v) in one parallel region, the
    /// row quantized once a weight layout, where [`Linear::forward_triple`] takes two (q, then
    /// k and v): one fork and join a layer fewer. The same products and the same bias adds as
    /// `forward_triple`, so the same bits; q's bias (GLM-4.5's `attention_bias`, which kept
    /// its layers off this path) is added by the thread that ends q's rows while the other
    /// threads go on with k and v. Only for a row whose three products run on the CPU.
    fn qkv_one_region(&self, a: &[f32], q: &mut [f32], kv: &mut [f32]) {
        let mats = [&self.q.w, &self.k.w, &self.v.w];
        let q_bias = |q: &mut [f32]| self.q.add_bias(q);
        QMatrix::matmul_batch_i8act_then(3, 1, |j| (mats[j], a), q, kv, q_bias);
        let (k, v) = kv.split_at_mut(self.k.out_dim());
        self.k.add_bias(k);
        self.v.add_bias(v);
    }

    /// The q and k norms (`norm`: the placement's, on the device while attention runs there)
    /// and rotations of the batch's rows, on this thread.
    fn norm_rotate(
        &self,
        rope: &Rope,
        spans: &[Span],
        q: &mut [f32],
        k: &mut [f32],
        norm: impl Fn(&mut [f32], &[f32]),
    ) {
        if let Some(w) = &self.q_norm {
            norm(q, w);
        }
        if let Some(w) = &self.k_norm {
            norm(k, w);
        }
        self.rotate_rows(rope, spans, 0, q, k);
    }

    /// Rotates the query and key heads of whole rows `q` and `k`, the first of them the
    /// batch's row `row0`, each at its sequence position.
    fn rotate_rows(&self, rope: &Rope, spans: &[Span], row0: usize, q: &mut [f32], k: &mut [f32]) {
        let GqaConfig {
            kv_heads,
            head_dim: hd,
            rotary_dim,
            ..
        } = self.cfg;
        let (qw, kw) = (self.heads * hd, kv_heads * hd);
        for (i, (qr, kr)) in q
            .chunks_exact_mut(qw)
            .zip(k.chunks_exact_mut(kw))
            .enumerate()
        {
            let row = row0 + i;
            let s = spans
                .iter()
                .find(|s| (s.start..s.start + s.n).contains(&row))
                .expect("the spans cover the batch's rows");
            let at = rope.at(s.pos0 + row - s.start);
            for head in qr.chunks_exact_mut(hd).chain(kr.chunks_exact_mut(hd)) {
                at.half(&mut head[..rotary_dim]);
            }
        }
    }

    /// The q and k norms and rotations of a prefill's rows on the CPU, a task of
    /// [`NORM_TASK_ROWS`] rows at a time across the threads: each row is normed and rotated
    /// by the same calls as on one thread (a row's sum of squares is its own chain), so the
    /// same bits. On the caller alone they were about a twentieth of the attention stage at
    /// 512 positions while the other threads waited.
    fn norm_rotate_par(&self, rope: &Rope, spans: &[Span], q: &mut [f32], k: &mut [f32]) {
        use rayon::prelude::*;
        let hd = self.cfg.head_dim;
        let (qw, kw) = (self.heads * hd, self.cfg.kv_heads * hd);
        q.par_chunks_mut(NORM_TASK_ROWS * qw)
            .zip(k.par_chunks_mut(NORM_TASK_ROWS * kw))
            .enumerate()
            .for_each(|(t, (q, k))| {
                if let Some(w) = &self.q_norm {
                    rms_norm_rows(q, w, self.eps);
                }
                if let Some(w) = &self.k_norm {
                    rms_norm_rows(k, w, self.eps);
                }
                self.rotate_rows(rope, spans, t * NORM_TASK_ROWS, q, k);
            });
    }
}

/// Softmax of `x` with one more logit, `sink`, in the denominator only (transformers'
/// GptOss eager attention: the sink is concatenated, the maximum taken over all, and its
/// probability dropped).
pub(crate) fn softmax_with_sink(x: &mut [f32], sink: f32) {
    let max = x.iter().copied().fold(sink, f32::max);
    crate::quant::expf::exp_shifted(x, max);
    let mut sum = 0.0;
    for v in x.iter() {
        sum += *v;
    }
    sum += (sink - max).exp();
    for v in x.iter_mut() {
        *v /= sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::QFormat;

    /// A Gqa of `heads` query heads over 2 key-value heads of 16 values (rotary on 12), with
    /// per-head or whole-row q and k norms; its projections are never used here.
    fn norm_only(heads: usize, whole: bool, rng: &mut crate::rng::Rng) -> Gqa {
        let cfg = GqaConfig {
            kv_heads: 2,
            head_dim: 16,
            rotary_dim: 12,
            qk_norm: true,
            qk_norm_whole: whole,
        };
        let lin = || Linear::new(QMatrix::from_f32(vec![0.0; 16], 1, 16), None);
        let mut w = |n: usize| Some((0..n).map(|_| rng.unit_f32() + 0.5).collect::<Vec<f32>>());
        let (qn, kn) = if whole {
            (heads * 16, 2 * 16)
        } else {
            (16, 16)
        };
        Gqa {
            q: lin(),
            k: lin(),
            v: lin(),
            o: lin(),
            q_norm: w(qn),
            k_norm: w(kn),
            heads,
            cfg,
            eps: 1e-6,
            sinks: None,
            window: None,
            output_gate: false,
        }
    }

    /// The norms and rotations across the threads are the one-thread pass's bits (which
    /// forward takes below 64 rows and on a device), for 1 to 512 rows in one span and in
    /// several at different positions, per-head and whole-row norms.
    #[test]
    fn norm_rotate_across_threads_equals_one_thread() {
        let mut rng = crate::rng::Rng::new(52);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let rope = Rope::new(12, 10000.0);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for whole in [false, true] {
            let g = norm_only(4, whole, &mut rng);
            let (qw, kw) = (4 * 16, 2 * 16);
            for rows in [1, 17, 64, 512] {
                let one = [Span {
                    start: 0,
                    n: rows,
                    pos0: 3,
                }];
                let a = rows / 3;
                let three = [
                    Span {
                        start: 0,
                        n: a,
                        pos0: 100,
                    },
                    Span {
                        start: a,
                        n: 1,
                        pos0: 0,
                    },
                    Span {
                        start: a + 1,
                        n: rows - a - 1,
                        pos0: 7,
                    },
                ];
                let many: &[Span] = if rows >= 3 { &three } else { &one };
                for spans in [&one[..], many] {
                    let q: Vec<f32> = (0..rows * qw).map(|_| rng.unit_f32() * 4.0 - 2.0).collect();
                    let k: Vec<f32> = (0..rows * kw).map(|_| rng.unit_f32() * 4.0 - 2.0).collect();
                    let (mut q1, mut k1) = (q.clone(), k.clone());
                    g.norm_rotate(&rope, spans, &mut q1, &mut k1, |x, w| {
                        rms_norm_rows(x, w, g.eps)
                    });
                    let (mut qp, mut kp) = (q.clone(), k.clone());
                    pool.install(|| g.norm_rotate_par(&rope, spans, &mut qp, &mut kp));
                    let tag = format!("whole {whole} rows {rows} spans {}", spans.len());
                    assert_eq!(bits(&qp), bits(&q1), "{tag}");
                    assert_eq!(bits(&kp), bits(&k1), "{tag}");
                    assert_ne!(bits(&q1), bits(&q), "{tag}: nothing was normed");
                }
            }
        }
    }

    /// A decode row's q, k and v in one region are the bits of three `Linear::forward` calls
    /// (what `forward_triple` gives a row), with and without biases, int8 per row and int4 in
    /// groups, at shapes from one small enough to run on the caller to GLM-4.5's 96 query and
    /// 8 key-value heads of 128 (split across the threads, q's bias added beside k and v).
    #[test]
    fn qkv_in_one_region_equals_three_products() {
        let mut rng = crate::rng::Rng::new(50);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        let shapes = [
            (64, 2, 2, 16),
            (256, 8, 2, 64),
            (512, 12, 4, 64),
            (4096, 96, 8, 128),
        ];
        let mut checked_bias = false;
        for (hidden, heads, kv_heads, hd) in shapes {
            for fmt in [QFormat::I8Row, QFormat::I4G64] {
                for bias in [true, false] {
                    let mut g = norm_only(heads, false, &mut rng);
                    let mut lin = |rows: usize| {
                        let w: Vec<f32> = (0..rows * hidden)
                            .map(|_| rng.unit_f32() * 2.0 - 1.0)
                            .collect();
                        let b = bias.then(|| (0..rows).map(|_| rng.unit_f32() - 0.5).collect());
                        Linear::new(QMatrix::quantize(&w, rows, hidden, fmt), b)
                    };
                    let (qw, kw) = (heads * hd, kv_heads * hd);
                    (g.q, g.k, g.v) = (lin(qw), lin(kw), lin(kw));
                    let a: Vec<f32> = (0..hidden).map(|_| rng.unit_f32() * 4.0 - 2.0).collect();
                    let (mut q, mut kv) = (vec![0.0; qw], vec![0.0; 2 * kw]);
                    g.qkv_one_region(&a, &mut q, &mut kv);
                    let tag = format!("{hidden} {heads}/{kv_heads}x{hd} {fmt:?} bias {bias}");
                    let want = |l: &Linear| l.apply(&a, 1, ActMode::Int8);
                    assert_eq!(bits(&q), bits(&want(&g.q)), "{tag}: q");
                    assert_eq!(bits(&kv[..kw]), bits(&want(&g.k)), "{tag}: k");
                    assert_eq!(bits(&kv[kw..]), bits(&want(&g.v)), "{tag}: v");
                    let mut plain = vec![0.0; qw];
                    g.q.w.matmul_i8act(&a, 1, &mut plain);
                    checked_bias |= bias && bits(&plain) != bits(&q);
                }
            }
        }
        assert!(checked_bias, "no bias changed a bit of q");
    }

    #[test]
    fn a_sink_takes_its_share_of_the_denominator() {
        let mut x = vec![1.0f32, 2.0];
        softmax_with_sink(&mut x, 0.5);
        let z = 1f32.exp() + 2f32.exp() + 0.5f32.exp();
        assert!((x[0] - 1f32.exp() / z).abs() < 1e-6, "{x:?}");
        assert!((x[1] - 2f32.exp() / z).abs() < 1e-6, "{x:?}");
        // A sink above every logit: the maximum is the sink's.
        let mut y = vec![0.0f32];
        softmax_with_sink(&mut y, 30.0);
        assert!(y[0] > 0.0 && y[0] < 1e-12, "{y:?}");
    }
}
