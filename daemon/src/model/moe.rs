//! Feed-forward blocks (reference §5): the dense SwiGLU MLP, and the MoE layer with its sigmoid
//! router (bias used for selection only), routed experts and shared expert.

use super::linear::{ActMode, Linear};
use super::ops::{sigmoid, softmax};
use super::scratch::{grow, DecodeBatch, MlpScratch, MoeScratch};
use crate::config::RouterKind;
use crate::error::EngineError;
use crate::experts::{ExpertStore, Fetch};
use crate::quant::expf::{silu_mul, silu_mul_into};
use crate::quant::QMatrix;

/// `down(silu(gate(x)) * up(x))`: the dense MLP, the shared expert and every routed expert.
pub struct Mlp {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

impl Mlp {
    /// The MLP of the `n` rows of `x` into `out` (`(n, hidden)`).
    pub(crate) fn forward(
        &self,
        x: &[f32],
        n: usize,
        act: ActMode,
        sc: &mut MlpScratch,
        out: &mut [f32],
    ) {
        swiglu(
            &self.gate.w,
            &self.up.w,
            &self.down.w,
            x,
            n,
            act,
            (&mut sc.g, &mut sc.u),
            out,
        );
    }
}

/// `out = down(silu(gate(x)) * up(x))` for `n` rows; `gu` holds the two intermediates.
#[allow(clippy::too_many_arguments)]
fn swiglu(
    gate: &QMatrix,
    up: &QMatrix,
    down: &QMatrix,
    x: &[f32],
    n: usize,
    act: ActMode,
    gu: (&mut Vec<f32>, &mut Vec<f32>),
    out: &mut [f32],
) {
    let inter = gate.rows();
    let g = grow(gu.0, n * inter);
    let u = grow(gu.1, n * inter);
    let mm = |w: &QMatrix, x: &[f32], y: &mut [f32]| match act {
        ActMode::F32 => w.matmul(x, n, y),
        ActMode::Int8 => w.matmul_i8act(x, n, y),
    };
    match act {
        // One pass over x for both projections: the activations are quantized once.
        ActMode::Int8 => QMatrix::matmul_pair_i8act(gate, up, x, n, g, u),
        ActMode::F32 => {
            mm(gate, x, g);
            mm(up, x, u);
        }
    }
    silu_mul(g, u);
    mm(down, g, out);
}

pub use crate::routing::Routing;

pub struct Router {
    /// (n_experts, hidden), always f32 (transformers keeps the gate in fp32).
    pub weight: QMatrix,
    /// `e_score_correction_bias` of a sigmoid router (selection only); zeros for a softmax one.
    pub bias: Vec<f32>,
    pub kind: RouterKind,
    pub top_k: usize,
    /// Group-limited routing: only experts of the best `topk_group` of `n_group` equal groups
    /// (by the sum of each group's two best biased scores) are eligible. 1 and 1: off.
    pub n_group: usize,
    pub topk_group: usize,
    pub norm_topk_prob: bool,
    pub scaling: f32,
}

impl Router {
    pub fn route(&self, x: &[f32]) -> Routing {
        let mut r = Routing::default();
        self.route_into(x, &mut Vec::new(), &mut Vec::new(), &mut r);
        r
    }

    /// `route` into `out`, with `scores` and `order` as working space: allocation-free once
    /// the vectors have their capacity.
    pub(crate) fn route_into(
        &self,
        x: &[f32],
        scores: &mut Vec<f32>,
        order: &mut Vec<usize>,
        out: &mut Routing,
    ) {
        let scores = grow(scores, self.weight.rows());
        // The f32 kernels, split across the threads when big enough.
        self.weight.matmul(x, 1, scores);
        self.select(scores, order, out);
    }

    /// [`Router::route_into`] from the router's logits of one row (`scores`, overwritten with
    /// their sigmoids): the selection and the weights.
    pub(crate) fn select(&self, scores: &mut [f32], order: &mut Vec<usize>, out: &mut Routing) {
        match self.kind {
            RouterKind::SigmoidBias => scores.iter_mut().for_each(|v| *v = sigmoid(*v)),
            // Probabilities over every expert, as transformers' softmax in f32.
            RouterKind::Softmax => softmax(scores),
        }
        // Selection by the biased score; weights from the unbiased sigmoid. The comparison is
        // a strict total order (ties go to the lower id), so the unstable sort, which needs no
        // buffer, gives the one possible order.
        order.clear();
        if self.n_group > 1 {
            self.eligible_groups(scores, order);
        } else {
            order.extend(0..scores.len());
        }
        order.sort_unstable_by(|&a, &b| {
            (scores[b] + self.bias[b])
                .total_cmp(&(scores[a] + self.bias[a]))
                .then(a.cmp(&b))
        });
        let Routing { experts, weights } = out;
        experts.clear();
        experts.extend_from_slice(&order[..self.top_k]);
        weights.clear();
        weights.extend(experts.iter().map(|&e| scores[e]));
        if self.norm_topk_prob {
            let denom = weights.iter().sum::<f32>() + 1e-20;
            weights.iter_mut().for_each(|w| *w /= denom);
        }
        weights.iter_mut().for_each(|w| *w *= self.scaling);
    }

    /// Pushes to `order` the experts of the `topk_group` best groups, each group scored by
    /// the sum of its two best biased scores (ties go to the lower group, the lower id).
    fn eligible_groups(&self, scores: &[f32], order: &mut Vec<usize>) {
        let per = scores.len() / self.n_group;
        let biased = |e: usize| scores[e] + self.bias[e];
        let group_score = |g: usize| {
            let (mut first, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
            for e in g * per..(g + 1) * per {
                let v = biased(e);
                if v > first {
                    second = first;
                    first = v;
                } else if v > second {
                    second = v;
                }
            }
            first + second
        };
        // Published checkpoints have 8 groups: sorted on the stack, so routing never allocates
        // (a config with more than MAX_GROUPS groups sorts on the heap).
        const MAX_GROUPS: usize = 64;
        let rank = |groups: &mut [(f32, usize)], order: &mut Vec<usize>| {
            groups.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            for &(_, g) in &groups[..self.topk_group] {
                order.extend(g * per..(g + 1) * per);
            }
        };
        if self.n_group <= MAX_GROUPS {
            let mut groups = [(0f32, 0usize); MAX_GROUPS];
            for (g, slot) in groups.iter_mut().enumerate().take(self.n_group) {
                *slot = (group_score(g), g);
            }
            rank(&mut groups[..self.n_group], order);
        } else {
            let mut groups: Vec<(f32, usize)> =
                (0..self.n_group).map(|g| (group_score(g), g)).collect();
            rank(&mut groups, order);
        }
    }

    /// The experts any of the rows of `x` would pick (ascending, distinct): the pilot's guess
    /// of the next layer's experts.
    pub fn predict(&self, x: &[f32], n: usize) -> Vec<usize> {
        let mut sc = MoeScratch::default();
        let mut e: Vec<usize> = self
            .predict_into(x, n, &mut sc)
            .iter()
            .map(|g| g.0)
            .collect();
        e.sort_unstable();
        e
    }

    /// `predict` in `sc`'s pilot buffers (its routing buffers are reused too), as
    /// `(expert, rank)` with the best (lowest) rank any row gave the expert, ordered by rank
    /// then expert: the pilot reads the first ranks of it.
    pub(crate) fn predict_into<'a>(
        &self,
        x: &[f32],
        n: usize,
        sc: &'a mut MoeScratch,
    ) -> &'a [(usize, usize)] {
        let hidden = x.len() / n.max(1);
        let best = grow(&mut sc.best_rank, self.weight.rows());
        best.fill(u32::MAX);
        for row in x.chunks_exact(hidden) {
            self.route_into(row, &mut sc.scores, &mut sc.order, &mut sc.guess);
            for (r, &e) in sc.guess.experts.iter().enumerate() {
                best[e] = best[e].min(r as u32);
            }
        }
        sc.guessed.clear();
        sc.guessed.extend(
            (0..best.len())
                .filter(|&e| best[e] != u32::MAX)
                .map(|e| (e, best[e] as usize)),
        );
        sc.guessed.sort_unstable_by_key(|&(e, r)| (r, e));
        &sc.guessed
    }
}

pub struct Moe {
    pub router: Router,
    /// The shared expert every row also goes through (GLM-5, DeepSeek); `None` in families
    /// without one (Qwen3-MoE).
    pub shared: Option<Mlp>,
}

impl Moe {
    /// MoE over `n` rows into `out` (`(n, hidden)`). The experts of the whole batch are
    /// gathered first so each expert's weights are fetched and read once per batch, whatever
    /// the number of rows routed to it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &self,
        layer: usize,
        store: &ExpertStore,
        x: &[f32],
        n: usize,
        act: ActMode,
        sc: &mut MoeScratch,
        mlp: &mut MlpScratch,
        out: &mut [f32],
        mut on_route: impl FnMut(usize, &Routing),
    ) -> Result<(), EngineError> {
        let hidden = x.len() / n.max(1);
        let ne = store.n_experts();
        let MoeScratch {
            routes,
            scores,
            order,
            pairs,
            start,
            cursor,
            wanted,
            delivered,
            products,
            shared,
            ..
        } = sc;
        if routes.len() < n {
            routes.resize_with(n, Routing::default);
        }
        let routes = &mut routes[..n];
        if n > 1 {
            // Every row's logits in one product (one parallel region, not one a row): each is
            // the same f32 dot of the row, so the same bits as routing the rows one by one.
            let ne_r = self.router.weight.rows();
            let all = grow(scores, n * ne_r);
            self.router.weight.matmul(x, n, all);
            for (logits, r) in all.chunks_exact_mut(ne_r).zip(routes.iter_mut()) {
                self.router.select(logits, order, r);
            }
        } else {
            for (row, r) in x.chunks_exact(hidden).zip(routes.iter_mut()) {
                self.router.route_into(row, scores, order, r);
            }
        }
        store.observe(layer, routes);
        // expert -> [(row, weight)] as one counting sort: ascending expert, and within an
        // expert ascending row, the order transformers accumulates them in.
        let start = grow(start, ne + 1);
        start.fill(0);
        for (s, r) in routes.iter().enumerate() {
            on_route(s, r);
            for &e in &r.experts {
                start[e + 1] += 1;
            }
        }
        for e in 0..ne {
            start[e + 1] += start[e];
        }
        let cursor = grow(cursor, ne);
        cursor.copy_from_slice(&start[..ne]);
        let pairs = grow(pairs, start[ne]);
        for (s, r) in routes.iter().enumerate() {
            for (&e, &w) in r.experts.iter().zip(&r.weights) {
                pairs[cursor[e]] = (s, w);
                cursor[e] += 1;
            }
        }
        wanted.clear();
        wanted.extend((0..ne).filter(|&e| start[e + 1] > start[e]));
        let delivered = grow(delivered, ne);
        delivered.fill(false);
        // The store yields experts as they become ready (resident first, loads as they
        // complete); each product goes to its own rows of `products` and the sum below runs in
        // ascending expert order, so the output bytes do not depend on the arrival order.
        let products = grow(products, pairs.len() * hidden);
        let shared = grow(shared, n * hidden);
        let mut fetch = store.fetch_layer(layer, wanted);
        let shared_done = if n == 1 && act == ActMode::Int8 {
            let sink = DecodeSink {
                start,
                products,
                delivered,
                shared,
            };
            self.decode_batches(&mut fetch, x, sink, &mut sc.batch)?;
            true
        } else if act == ActMode::Int8 && (n <= FEW_ROWS || most_rows(wanted, start) <= TASK_ROWS) {
            few_rows_batches(&mut fetch, x, hidden, pairs, start, products, delivered)?;
            false
        } else {
            for item in &mut fetch {
                let (e, expert) = item?;
                let rows = &pairs[start[e]..start[e + 1]];
                let gathered = grow(&mut mlp.gathered, rows.len() * hidden);
                for (g, &(s, _)) in gathered.chunks_exact_mut(hidden).zip(rows) {
                    g.copy_from_slice(&x[s * hidden..(s + 1) * hidden]);
                }
                swiglu(
                    &expert.gate,
                    &expert.up,
                    &expert.down,
                    gathered,
                    rows.len(),
                    act,
                    (&mut mlp.g, &mut mlp.u),
                    &mut products[start[e] * hidden..start[e + 1] * hidden],
                );
                delivered[e] = true;
            }
            false
        };
        drop(fetch);
        out.fill(0.0);
        for &e in wanted.iter() {
            if !delivered[e] {
                return Err(EngineError::Load(format!(
                    "expert {e} of layer {layer} was never delivered"
                )));
            }
            let y = &products[start[e] * hidden..start[e + 1] * hidden];
            for (i, &(s, w)) in pairs[start[e]..start[e + 1]].iter().enumerate() {
                for (o, v) in out[s * hidden..(s + 1) * hidden]
                    .iter_mut()
                    .zip(&y[i * hidden..(i + 1) * hidden])
                {
                    *o += v * w;
                }
            }
        }
        if let Some(expert) = &self.shared {
            if !shared_done {
                expert.forward(x, n, act, mlp, shared);
            }
            for (o, v) in out.iter_mut().zip(shared.iter()) {
                *o += v;
            }
        }
        Ok(())
    }
}

/// Rows at or below which a multi-row MoE step (several sessions decoding together) computes
/// its experts one per thread, each expert's products on that thread alone, instead of
/// splitting every expert's small matmuls across the threads (two forks and joins per expert).
const FEW_ROWS: usize = 32;

/// A prefill's experts also go one per thread while no expert has more rows than this: each
/// expert's share of a chunk is then too small to split well (4 rows an expert at 64 positions,
/// 16 at 256 with 8 of 128 experts), and a task is at most this big, so the threads stay
/// balanced. Larger shares keep the split products, each matmul across all threads.
const TASK_ROWS: usize = 64;

/// The most rows any of the `wanted` experts has (`start` as in [`Moe::forward`]).
fn most_rows(wanted: &[usize], start: &[usize]) -> usize {
    wanted
        .iter()
        .map(|&e| start[e + 1] - start[e])
        .max()
        .unwrap_or(0)
}

thread_local! {
    /// A worker's gathered rows and gate / up products in [`few_rows_batches`] (taken, then
    /// put back, so a nested task finds it empty and grows its own).
    static FEW: std::cell::Cell<[Vec<f32>; 3]> = std::cell::Cell::new(Default::default());
}

/// The few-rows MoE step: the experts the store can hand over without waiting go through
/// together, one task per expert (compute still overlaps the loads in flight), each writing
/// its own rows of `products`. Each product is bit-identical to [`swiglu`]'s: the same kernels,
/// run on one thread.
fn few_rows_batches(
    fetch: &mut Fetch,
    x: &[f32],
    hidden: usize,
    pairs: &[(usize, f32)],
    start: &[usize],
    products: &mut [f32],
    delivered: &mut [bool],
) -> Result<(), EngineError> {
    use rayon::prelude::*;
    let mut batch = Vec::new();
    loop {
        batch.clear();
        match fetch.next() {
            Some(item) => batch.push(item?),
            None => return Ok(()),
        }
        while let Some(item) = fetch.next_ready() {
            batch.push(item?);
        }
        // Each expert's rows of `products`, carved in ascending expert order.
        batch.sort_unstable_by_key(|(e, _)| *e);
        let mut jobs = Vec::with_capacity(batch.len());
        let mut rest = &mut products[..];
        let mut at = 0;
        for (e, expert) in &batch {
            let (lo, hi) = (start[*e] * hidden, start[e + 1] * hidden);
            let tail = std::mem::take(&mut rest).split_at_mut(lo - at).1;
            let (mine, tail) = tail.split_at_mut(hi - lo);
            jobs.push((*e, expert, mine));
            rest = tail;
            at = hi;
        }
        jobs.par_iter_mut().for_each(|(e, expert, y)| {
            let rows = &pairs[start[*e]..start[*e + 1]];
            let n = rows.len();
            let inter = expert.gate.rows();
            let mut bufs = FEW.with(|c| c.take());
            let [gathered, g, u] = &mut bufs;
            let gathered = grow(gathered, n * hidden);
            for (gr, &(s, _)) in gathered.chunks_exact_mut(hidden).zip(rows) {
                gr.copy_from_slice(&x[s * hidden..(s + 1) * hidden]);
            }
            let (g, u) = (grow(g, n * inter), grow(u, n * inter));
            expert.gate.matmul_i8act_on_caller(gathered, n, g);
            expert.up.matmul_i8act_on_caller(gathered, n, u);
            silu_mul(g, u);
            expert.down.matmul_i8act_on_caller(g, n, y);
            FEW.with(|c| c.set(bufs));
        });
        for (e, _, _) in &jobs {
            delivered[*e] = true;
        }
    }
}

/// Where a decode step's expert products go: expert `e`'s one product to
/// `products[start[e] * hidden..]`, the shared expert's to `shared`.
struct DecodeSink<'a> {
    start: &'a [usize],
    products: &'a mut [f32],
    delivered: &'a mut [bool],
    shared: &'a mut [f32],
}

impl Moe {
    /// Decode (one row, int8 activations): the experts that are ready go through together, in
    /// two parallel regions per batch (every gate and up, then every down) instead of two per
    /// expert, and the shared expert rides with the first batch. A batch is whatever the store
    /// can hand over without waiting, so compute still overlaps the loads in flight. Every
    /// product is bit-identical to [`swiglu`]'s.
    fn decode_batches(
        &self,
        fetch: &mut Fetch,
        x: &[f32],
        sink: DecodeSink,
        b: &mut DecodeBatch,
    ) -> Result<(), EngineError> {
        let hidden = x.len();
        let shared = self
            .shared
            .as_ref()
            .map(|s| [&s.gate.w, &s.up.w, &s.down.w]);
        let mut with_shared = shared.is_some();
        loop {
            b.experts.clear();
            match fetch.next() {
                Some(item) => b.experts.push(item?),
                None if with_shared => {}
                None => break,
            }
            while let Some(item) = fetch.next_ready() {
                b.experts.push(item?);
            }
            let experts = &b.experts;
            let ne = experts.len();
            let members = ne + with_shared as usize;
            // Member `i`: a routed expert, or (last, in the first batch) the shared one.
            let mats = |i: usize| -> [&QMatrix; 3] {
                match (experts.get(i), shared) {
                    (Some((_, e)), _) => [&e.gate, &e.up, &e.down],
                    (None, Some(s)) => s,
                    // `members` counts a member past the experts only when there is a
                    // shared expert.
                    (None, None) => unreachable!("a batch member past the routed experts"),
                }
            };
            // Gate and up of member `i` at `2 * off(i)`, its SwiGLU product at `off(i)`.
            let inter = experts.first().map_or(0, |(_, e)| e.gate.rows());
            let off = |i: usize| i * inter;
            let last = mats(members - 1)[0].rows();
            let total = off(members - 1) + last;
            let gu = grow(&mut b.gu, 2 * total);
            let gate_up = |j: usize| (mats(j / 2)[j % 2], x);
            QMatrix::matmul_batch_i8act(2 * members, gate_up, gu);
            let h = grow(&mut b.h, total);
            for i in 0..members {
                let rows = mats(i)[0].rows();
                let (g, u) = gu[2 * off(i)..2 * off(i) + 2 * rows].split_at(rows);
                silu_mul_into(&mut h[off(i)..off(i) + rows], g, u);
            }
            let y = grow(&mut b.out, members * hidden);
            let h = &*h;
            let down = |i: usize| {
                let w = mats(i)[2];
                (w, &h[off(i)..off(i) + w.cols()])
            };
            QMatrix::matmul_batch_i8act(members, down, y);
            for (i, yi) in y.chunks_exact(hidden).enumerate() {
                match experts.get(i) {
                    Some(&(e, _)) => {
                        let at = sink.start[e] * hidden;
                        sink.products[at..at + hidden].copy_from_slice(yi);
                        sink.delivered[e] = true;
                    }
                    None => sink.shared.copy_from_slice(yi),
                }
            }
            with_shared = false;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bias_selects_but_does_not_weigh() {
        // Expert 0 has the higher sigmoid but a large negative bias: expert 1 is chosen and its
        // weight comes from its own unbiased score.
        let router = Router {
            weight: QMatrix::from_f32(vec![2.0, 0.0, 1.0, 0.0, -3.0, 0.0], 3, 2),
            bias: vec![-1.0, 0.0, 0.0],
            kind: RouterKind::SigmoidBias,
            top_k: 1,
            n_group: 1,
            topk_group: 1,
            norm_topk_prob: false,
            scaling: 2.5,
        };
        let r = router.route(&[1.0, 0.0]);
        assert_eq!(r.experts, vec![1]);
        assert!((r.weights[0] - 2.5 * sigmoid(1.0)).abs() < 1e-6);
    }

    #[test]
    fn a_softmax_router_weighs_by_probability_over_every_expert() {
        // Logits 2, 1, 0: softmax p = e^(2, 1, 0) / sum. Top 2 are experts 0 and 1, weighed
        // by their probabilities over all three (the third counts in the denominator).
        let router = Router {
            weight: QMatrix::from_f32(vec![2.0, 1.0, 0.0], 3, 1),
            bias: vec![0.0; 3],
            kind: RouterKind::Softmax,
            top_k: 2,
            n_group: 1,
            topk_group: 1,
            norm_topk_prob: false,
            scaling: 1.0,
        };
        let r = router.route(&[1.0]);
        assert_eq!(r.experts, vec![0, 1]);
        let z = 2f32.exp() + 1f32.exp() + 1.0;
        assert!(
            (r.weights[0] - 2f32.exp() / z).abs() < 1e-6,
            "{:?}",
            r.weights
        );
        assert!(
            (r.weights[1] - 1f32.exp() / z).abs() < 1e-6,
            "{:?}",
            r.weights
        );
    }

    #[test]
    fn norm_topk_normalises_before_scaling() {
        let router = Router {
            weight: QMatrix::from_f32(vec![1.0, -1.0, 0.5], 3, 1),
            bias: vec![0.0; 3],
            kind: RouterKind::SigmoidBias,
            top_k: 2,
            n_group: 1,
            topk_group: 1,
            norm_topk_prob: true,
            scaling: 2.0,
        };
        let r = router.route(&[1.0]);
        assert_eq!(r.experts, vec![0, 2]);
        assert!((r.weights.iter().sum::<f32>() - 2.0).abs() < 1e-6);
    }
}
