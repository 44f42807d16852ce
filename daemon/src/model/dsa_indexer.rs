//! The DSA "lightning indexer" (reference §4): on full layers it scores every visible key per
//! query and keeps the `index_topk` best; shared layers reuse the latest full layer's choice.

use crate::quant::par_chunks_mut;

use super::batch::Span;
use super::linear::{ActMode, Linear};
use super::ops::{dot_gather, layer_norm_rows};
use super::rope::{Rope, Rotation};
use super::scratch::{grow, IndexScratch};

/// Which keys each query row of a batch attends to. A dense row attends to every visible key:
/// rows with at most `index_topk` visible keys are dense (torch.topk then also returns masked
/// future positions, which stay masked). Reused across forwards: the per-row lists keep their
/// capacity, so a decode step fills them without allocating.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    /// Rows of the current batch; 0 until a full layer of this forward selected.
    n: usize,
    dense: Vec<bool>,
    /// Ascending key positions per row (meaningful where `!dense`).
    lists: Vec<Vec<usize>>,
    /// The row that [`Selection::row`]`(0)` reads: a chunk's attention runs in row groups
    /// (`Mla::forward`), each seeing its own rows from 0.
    first: usize,
}

impl Selection {
    /// Room for `rows` rows of `keys` kept keys each.
    pub fn with_capacity(rows: usize, keys: usize) -> Selection {
        Selection {
            n: 0,
            dense: vec![true; rows],
            lists: (0..rows).map(|_| Vec::with_capacity(keys)).collect(),
            first: 0,
        }
    }

    /// Forgets the selection (a new forward starts).
    pub fn clear(&mut self) {
        self.n = 0;
        self.first = 0;
    }

    /// Rows selected for (0 before the first full layer of a forward).
    pub fn len(&self) -> usize {
        self.n.saturating_sub(self.first)
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Row `s` of what follows is the batch's row `first + s` (0: the whole batch).
    pub(crate) fn start_at(&mut self, first: usize) {
        self.first = first;
    }

    /// The kept keys of row `s`, or `None` when it attends to every visible key.
    pub fn row(&self, s: usize) -> Option<&[usize]> {
        let s = self.first + s;
        (s < self.n && !self.dense[s]).then(|| self.lists[s].as_slice())
    }

    /// Starts a selection of `n` rows, every one dense until `keep` fills it.
    pub(crate) fn begin(&mut self, n: usize) {
        if self.lists.len() < n {
            self.lists.resize_with(n, Vec::new);
            self.dense.resize(n, true);
        }
        self.dense[..n].fill(true);
        self.n = n;
        self.first = 0;
    }

    /// Row `s` keeps `keys` (then sorted ascending).
    pub(crate) fn keep(&mut self, s: usize, keys: impl Iterator<Item = usize>) {
        let list = &mut self.lists[s];
        list.clear();
        list.extend(keys);
        list.sort_unstable();
        self.dense[s] = false;
    }
}

/// Keys scored per parallel task: at GLM-5's 32 heads of 128 a task is 4M multiply-adds over
/// 0.5 MB of keys, far above what a fork costs.
const KEYS_PER_TASK: usize = 1024;

/// Keys scored together: their rows (64 x 128 floats at GLM-5 shapes, 32 KiB) stay in cache
/// while every index head passes over them.
const KEYS_PER_PASS: usize = 64;

/// `sum_h w[h] * relu(scale * <q_h, k>)` for one key: the indexer's score (reference §4).
#[cfg(test)]
fn key_score(q: &[f32], w: &[f32], k: &[f32], scale: f32) -> f32 {
    let di = k.len();
    let mut score = 0.0f32;
    for (qh, wh) in q.chunks_exact(di).zip(w) {
        score += wh * (super::ops::dot(qh, k) * scale).max(0.0);
    }
    score
}

/// `0, 1, ..., KEYS_PER_PASS - 1`: the row offsets of one pass, for the gathered dot kernel.
const PASS_ROWS: [usize; KEYS_PER_PASS] = {
    let mut r = [0; KEYS_PER_PASS];
    let mut i = 0;
    while i < KEYS_PER_PASS {
        r[i] = i;
        i += 1;
    }
    r
};

/// [`key_score`] of every row of `keys` (`di` floats each; `out.len()` of them) into `out`,
/// bit for bit: each head's dot products come from the gathered dot kernel (the same bits as
/// one `dot` per key, with the head's query held in registers across four keys), and each
/// key sums its heads in the same order from 0.0.
fn score_keys(q: &[f32], w: &[f32], keys: &[f32], di: usize, scale: f32, out: &mut [f32]) {
    let mut dots = [0.0f32; KEYS_PER_PASS];
    for (pass, out) in out.chunks_mut(KEYS_PER_PASS).enumerate() {
        out.fill(0.0);
        let base = &keys[pass * KEYS_PER_PASS * di..][..out.len() * di];
        let rows = &PASS_ROWS[..out.len()];
        let dots = &mut dots[..out.len()];
        for (qh, &wh) in q.chunks_exact(di).zip(w) {
            dot_gather(qh, base, di, rows, dots);
            for (o, &d) in out.iter_mut().zip(dots.iter()) {
                *o += wh * (d * scale).max(0.0);
            }
        }
    }
}

pub struct Indexer {
    pub wq_b: Linear,
    pub wk: Linear,
    pub k_norm_w: Vec<f32>,
    pub k_norm_b: Vec<f32>,
    /// Kept in f32 whatever `--dense-bits` says, as transformers keeps it in fp32.
    pub weights_proj: Linear,
    pub n_heads: usize,
    pub head_dim: usize,
    /// Rotate-half (DeepSeek-V3.2's indexer) instead of interleaved pairs (GLM-5's).
    pub rope_half: bool,
}

impl Indexer {
    fn rotate(&self, at: &Rotation, x: &mut [f32]) {
        if self.rope_half {
            at.half(x)
        } else {
            at.interleaved(x)
        }
    }

    /// The indexer's projections of every row of a batch (each sequence's rows rotated at its
    /// own positions): keys, and with `queries` the queries and head weights, into `sc`, for
    /// [`Indexer::select_rows`] (which reads no query of a row that keeps every key).
    pub(crate) fn project(
        &self,
        rope: &Rope,
        a: &[f32],
        q_resid: &[f32],
        spans: &[Span],
        queries: bool,
        sc: &mut IndexScratch,
    ) {
        // The top-k cut is a discrete decision with gaps as small as 1e-4 on real inputs: the
        // indexer's products always take f32 activations so int8 rounding never flips it.
        let act = ActMode::F32;
        let n: usize = spans.iter().map(|s| s.n).sum();
        let (hi, di, r) = (self.n_heads, self.head_dim, rope.dim());
        // k = LayerNorm(wk(a)) with eps 1e-6, one key head shared by all index heads.
        let k = grow(&mut sc.k, n * di);
        self.wk.forward(a, n, k, act);
        layer_norm_rows(k, &self.k_norm_w, &self.k_norm_b, 1e-6);
        for span in spans {
            let ks = &mut k[span.start * di..][..span.n * di];
            for (s, row) in ks.chunks_exact_mut(di).enumerate() {
                self.rotate(&rope.at(span.pos0 + s), &mut row[..r]);
            }
        }
        if !queries {
            return;
        }
        // q = wq_b(q_resid).view(Hi, Di), split [rope | pass]: rope FIRST here (reference §10.2).
        let q = grow(&mut sc.q, n * hi * di);
        self.wq_b.forward(q_resid, n, q, act);
        for span in spans {
            let qs = &mut q[span.start * hi * di..][..span.n * hi * di];
            for (s, row) in qs.chunks_exact_mut(hi * di).enumerate() {
                let at = rope.at(span.pos0 + s);
                for head in row.chunks_exact_mut(di) {
                    self.rotate(&at, &mut head[..r]);
                }
            }
        }
        // w[s,h] = weights_proj(a)[s,h] * Hi^-0.5
        let w = grow(&mut sc.w, n * hi);
        self.weights_proj.forward(a, n, w, ActMode::F32);
        let head_scale = (hi as f32).powf(-0.5);
        w.iter_mut().for_each(|v| *v *= head_scale);
    }

    /// Appends one sequence's projected keys to its cache `keys`.
    pub(crate) fn push_keys(&self, span: &Span, keys: &mut Vec<f32>, sc: &IndexScratch) {
        let di = self.head_dim;
        keys.extend_from_slice(&sc.k[span.start * di..][..span.n * di]);
    }

    /// [`Indexer::select`] on the GPU, over `keys`, the device copy of the sequence's key
    /// cache (its keys already pushed).
    pub(crate) fn select_gpu(
        &self,
        g: &crate::gpu::AttnGpu,
        span: &Span,
        keys: &crate::gpu::DeviceBuffer,
        index_topk: usize,
        sc: &IndexScratch,
        sel: &mut Selection,
    ) -> Result<(), crate::gpu::GpuError> {
        let (hi, di) = (self.n_heads, self.head_dim);
        let (n, pos0) = (span.n, span.pos0);
        let q = &sc.q[span.start * hi * di..][..n * hi * di];
        let w = &sc.w[span.start * hi..][..n * hi];
        sel.begin(n);
        let kept = g.index_select(q, w, keys, (hi, di), n, pos0, index_topk)?;
        // Rows with at most `index_topk` visible keys stay dense, as on the CPU.
        if let Some(kept) = kept {
            for s in (0..n).filter(|s| pos0 + s + 1 > index_topk) {
                sel.keep(s, kept.row(s));
            }
        }
        Ok(())
    }

    /// One sequence's part of the batch projected by [`Indexer::project`]: scores each of its
    /// query rows against every visible key of its cache `keys` (its own keys already pushed,
    /// [`Indexer::push_keys`]) and writes the selection to `sel`.
    pub(crate) fn select_rows(
        &self,
        span: &Span,
        keys: &[f32],
        index_topk: usize,
        sc: &mut IndexScratch,
        sel: &mut Selection,
    ) {
        let (hi, di) = (self.n_heads, self.head_dim);
        let (n, pos0) = (span.n, span.pos0);
        let softmax_scale = (di as f32).powf(-0.5);

        sel.begin(n);
        for s in 0..n {
            let visible = pos0 + s + 1;
            if visible <= index_topk {
                continue;
            }
            // (Read only here: `project` leaves them out when no row gets this far.)
            let row = span.start + s;
            let qs = &sc.q[row * hi * di..(row + 1) * hi * di];
            let ws = &sc.w[row * hi..(row + 1) * hi];
            // One pass over the compact key cache: each key's score against all heads, keys
            // split across the threads when there are enough of them to pay for a fork.
            let key_scores = grow(&mut sc.key_scores, visible);
            let score = |first: usize, out: &mut [f32]| {
                score_keys(qs, ws, &keys[first * di..], di, softmax_scale, out);
            };
            if visible >= 2 * KEYS_PER_TASK {
                par_chunks_mut(key_scores, KEYS_PER_TASK, n, |c, out| {
                    score(c * KEYS_PER_TASK, out)
                });
            } else {
                score(0, key_scores);
            }
            let scores = &mut sc.scores;
            scores.clear();
            scores.extend(key_scores.iter().copied().zip(0..));
            // Highest scores first; ties go to the earlier key. A total order, so the
            // partition keeps exactly the set a full sort would. The ReLU of each head's
            // score makes exact ties common: a key every head scores at or below zero scores
            // 0.0, and a row with fewer than index_topk keys above zero cuts among them.
            // Neither transformers nor DeepSeek's own inference code (DeepSeek-V3.2-Exp
            // inference/model.py) defines that cut: both take torch.topk, which promises
            // nothing among equal values. Earliest-first is deterministic, the same on every
            // thread count and on the GPU (`gpu::AttnGpu::index_select`), and such rows are
            // counted (`IndexCuts`) so `validate` tells a mismatch there from a bug.
            let order =
                |a: &(f32, usize), b: &(f32, usize)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
            if index_topk > 0 {
                scores.select_nth_unstable_by(index_topk - 1, order);
                let kth = scores[index_topk - 1].0;
                let next = scores[index_topk..]
                    .iter()
                    .map(|p| p.0)
                    .max_by(f32::total_cmp);
                sc.cuts.rows += 1;
                sc.cuts.ties += u64::from(next == Some(kth));
            }
            sel.keep(s, scores[..index_topk].iter().map(|&(_, t)| t));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The blocked scoring gives exactly the per-key scores, at sizes with every remainder
    /// (keys not a multiple of the pass or of four, a head dim with a tail).
    #[test]
    fn blocked_scores_equal_per_key_scores_bit_for_bit() {
        let mut x = crate::rng::XorShift64(0x2545f4914f6cdd1d);
        let mut rnd = || x.unit_f32() * 2.0 - 1.0;
        for (heads, di, n) in [(4, 128, 203), (3, 40, 64), (8, 17, 5), (64, 128, 131)] {
            let q: Vec<f32> = (0..heads * di).map(|_| rnd()).collect();
            let w: Vec<f32> = (0..heads).map(|_| rnd()).collect();
            let keys: Vec<f32> = (0..n * di).map(|_| rnd()).collect();
            let mut got = vec![f32::NAN; n];
            score_keys(&q, &w, &keys, di, 0.125, &mut got);
            for t in 0..n {
                let want = key_score(&q, &w, &keys[t * di..(t + 1) * di], 0.125);
                assert_eq!(
                    got[t].to_bits(),
                    want.to_bits(),
                    "heads {heads} di {di} key {t}"
                );
            }
        }
    }

    /// The GPU's selection (`gpu::AttnGpu::index_select`) is the CPU's, key for key: 1, 3 and
    /// 17 query rows, caches not a multiple of a workgroup long, rows on both sides of
    /// `index_topk` (the short ones dense on both).
    #[test]
    fn gpu_selection_equals_the_cpus() {
        use crate::gpu::{AttnGpu, GpuChoice, KvMirror};
        let g = match crate::gpu::shared(GpuChoice::Vulkan) {
            // Only a missing adapter skips: a kernel the device rejects fails.
            Ok(gpu) => AttnGpu::new(gpu).unwrap(),
            Err(e) => {
                crate::elog!("gpu_selection_equals_the_cpus: skipped: {e}");
                return;
            }
        };
        let mut x = crate::rng::XorShift64(0x9e3779b97f4a7c15);
        let mut rnd = || x.unit_f32() * 2.0 - 1.0;
        for (hi, di, topk) in [(3, 20, 16), (4, 64, 7)] {
            let indexer = selection_only(hi, di);
            // The last case: every query zero, so every score is 0 and all keys tie (the
            // earliest are kept); the one before it, a cache of several workgroups.
            let cases = [
                (1, 37),
                (3, 19),
                (17, 130),
                (1, 200),
                (17, 17),
                (2, 700),
                (3, 90),
            ];
            for (c, (n, total)) in cases.into_iter().enumerate() {
                let pos0 = total - n;
                let keys: Vec<f32> = (0..total * di).map(|_| rnd()).collect();
                let ties = c == cases.len() - 1;
                let mut sc = IndexScratch {
                    q: (0..n * hi * di)
                        .map(|_| if ties { 0.0 } else { rnd() })
                        .collect(),
                    w: (0..n * hi).map(|_| rnd()).collect(),
                    ..IndexScratch::default()
                };
                let span = Span { start: 0, n, pos0 };
                let mut want = Selection::default();
                indexer.select_rows(&span, &keys, topk, &mut sc, &mut want);
                let mut mirror = KvMirror::default();
                let [dev] = mirror.sync(g.kernels(), 0, [&keys[..]]).unwrap();
                let mut got = Selection::default();
                indexer
                    .select_gpu(&g, &span, dev, topk, &sc, &mut got)
                    .unwrap();
                assert_eq!(got.len(), want.len());
                for s in 0..n {
                    assert_eq!(
                        got.row(s),
                        want.row(s),
                        "{hi}x{di} top {topk}, {n} rows of {total}, row {s}"
                    );
                }
            }
        }
    }

    /// An indexer of `hi` heads of `di` whose projections are never used: the tests hand
    /// `select_rows` their queries and keys directly.
    fn selection_only(hi: usize, di: usize) -> Indexer {
        let none = || Linear {
            w: crate::quant::QMatrix::from_f32(vec![0.0], 1, 1),
            bias: None,
            slot: Default::default(),
        };
        Indexer {
            wq_b: none(),
            wk: none(),
            k_norm_w: Vec::new(),
            k_norm_b: Vec::new(),
            weights_proj: none(),
            n_heads: hi,
            head_dim: di,
            rope_half: false,
        }
    }

    /// Keys every head scores below zero tie at exactly 0.0: the earliest are kept and the
    /// row is counted as a tie at the cut; distinct scores are kept by score and not counted.
    #[test]
    fn ties_at_the_cut_keep_the_earliest_keys_and_are_counted() {
        let (hi, di, topk) = (2, 4, 3);
        let indexer = selection_only(hi, di);
        // Both heads read the key's first value; keys 2 and 5 are positive, the rest negative.
        let firsts = [-1.0, -2.0, 0.5, -0.25, -3.0, 2.0, -1.5];
        let keys: Vec<f32> = firsts.iter().flat_map(|&v| [v, 0.0, 0.0, 0.0]).collect();
        let one_row = |q0: f32| IndexScratch {
            q: [q0, 0.0, 0.0, 0.0].repeat(hi),
            w: vec![1.0; hi],
            ..IndexScratch::default()
        };
        // The last row sees all 7 keys: 5 and 2 score above zero, the third place is a tie
        // among the five zeros, and goes to key 0.
        let span = Span {
            start: 0,
            n: 1,
            pos0: firsts.len() - 1,
        };
        let mut sc = one_row(1.0);
        let mut sel = Selection::default();
        indexer.select_rows(&span, &keys, topk, &mut sc, &mut sel);
        assert_eq!(sel.row(0), Some(&[0, 2, 5][..]));
        assert_eq!(sc.cuts, crate::model::IndexCuts { rows: 1, ties: 1 });
        // The opposite query: the five negative keys score above zero, all distinct; no tie.
        let mut sc = one_row(-1.0);
        indexer.select_rows(&span, &keys, topk, &mut sc, &mut sel);
        assert_eq!(sel.row(0), Some(&[1, 4, 6][..]));
        assert_eq!(sc.cuts, crate::model::IndexCuts { rows: 1, ties: 0 });
    }
}
