//! Feed-forward blocks (reference §5): the dense SwiGLU MLP, and the MoE layer's router
//! (sigmoid with a correction bias used for selection only, or softmax; group-limited). The
//! routed experts and the shared expert run behind the tiers ([`ExpertStore::run_layer`] in
//! `experts/run.rs`): the model routes, the store computes.

use super::linear::{ActMode, Linear};
use super::ops::{sigmoid, softmax, swiglu};
use super::scratch::{grow, MlpScratch, MoeScratch};
use crate::config::RouterKind;
use crate::error::EngineError;
use crate::experts::run::LayerBatch;
use crate::experts::ExpertStore;
use crate::quant::{QFormat, QMatrix};

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
            [&self.gate.w, &self.up.w, &self.down.w],
            None,
            x,
            n,
            act,
            (&mut sc.g, &mut sc.u),
            out,
        );
    }
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
            // gpt-oss: the router is a biased linear layer; its top k by logit are picked and
            // weighed by a softmax over those k alone (below).
            RouterKind::SoftmaxTopk => scores.iter_mut().zip(&self.bias).for_each(|(s, b)| *s += b),
            // DeepSeek-V4: sqrt(softplus(x)) as torch's softplus (linear past x = 20).
            RouterKind::SqrtSoftplus => scores
                .iter_mut()
                .for_each(|v| *v = if *v > 20.0 { *v } else { v.exp().ln_1p() }.sqrt()),
        }
        // The bias that selects without weighing (a sigmoid router's correction bias; zeros for
        // a plain softmax one); gpt-oss's is in the logits already.
        let select_bias = |e: usize| match self.kind {
            RouterKind::SoftmaxTopk => 0.0,
            _ => self.bias[e],
        };
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
            (scores[b] + select_bias(b))
                .total_cmp(&(scores[a] + select_bias(a)))
                .then(a.cmp(&b))
        });
        out.experts.clear();
        out.experts.extend_from_slice(&order[..self.top_k]);
        self.weigh(scores, out);
    }

    /// The weights of `out.experts` from their scores (as [`Router::select`] leaves them):
    /// what the family's router gives its choice, and cache-aware routing a changed one.
    pub(crate) fn weigh(&self, scores: &[f32], out: &mut Routing) {
        let Routing { experts, weights } = out;
        weights.clear();
        weights.extend(experts.iter().map(|&e| scores[e]));
        if self.kind == RouterKind::SoftmaxTopk {
            softmax(weights);
        }
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
    /// `shared_expert_gate` (Qwen3.5-MoE, `hidden` weights): the shared expert's output is
    /// scaled per row by `sigmoid(gate . x)`. `None`: ungated.
    pub shared_gate: Option<Vec<f32>>,
}

impl Moe {
    /// MoE over `n` rows into `out` (`(n, hidden)`): the router picks each row's experts and
    /// weights, and the store runs them ([`ExpertStore::run_layer`]), the experts of the whole
    /// batch gathered first so each expert's weights are fetched and read once per batch,
    /// whatever the number of rows routed to it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &self,
        layer: usize,
        store: &ExpertStore,
        x: &[f32],
        n: usize,
        act: ActMode,
        sc: &mut MoeScratch,
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
            run,
            gated: gated_sc,
            gated_out,
            resident,
            shared_gu,
            ..
        } = sc;
        // Cache-aware routing (opt-in): which experts of this layer are resident, taken once
        // for the batch, as its loads start only once every row is routed.
        let cache_route = store.cache_route();
        if cache_route.is_some() {
            store.resident_mask(layer, resident);
        }
        let resident = &resident[..];
        if routes.len() < n {
            routes.resize_with(n, Routing::default);
        }
        let routes = &mut routes[..n];
        let gated = self.shared_gate.as_ref().zip(self.shared.as_ref());
        // One decode row with an ungated shared expert: the shared expert's gate and up read x
        // alone, so they run in the router's parallel region, and the routing (selection,
        // usage, grouping) runs on whichever thread finishes the logits, beside the shared
        // expert's rows, instead of on the caller while the other threads wait.
        // (An f32 router, as every loader makes it: the batch's f32 products are then the
        // router's own `matmul`.)
        let f32_router = self.router.weight.format() == QFormat::F32;
        let shared_first = match &self.shared {
            Some(s) if n == 1 && act == ActMode::Int8 && gated.is_none() && f32_router => Some(s),
            _ => None,
        };
        let mut shared_done: Option<&[f32]> = None;
        if let Some(s) = shared_first {
            let router = &self.router;
            let logits = grow(scores, router.weight.rows());
            let gu = grow(shared_gu, 2 * s.gate.w.rows());
            let mats = [&router.weight, &s.gate.w, &s.up.w];
            let route = |logits: &mut [f32]| {
                let r = &mut routes[0];
                router.select(logits, order, r);
                if let Some(cr) = cache_route {
                    cr.apply(order, r, resident, |r| router.weigh(logits, r));
                }
                store.observe(layer, routes);
                group_by_expert(routes, ne, start, cursor, pairs, wanted, |_, _| {});
            };
            QMatrix::matmul_batch_i8act_then(3, 1, |j| (mats[j], x), logits, gu, route);
            shared_done = Some(gu);
            on_route(0, &routes[0]);
        } else if n > 1 {
            // Every row's logits in one product (one parallel region, not one a row): each is
            // the same f32 dot of the row, so the same bits as routing the rows one by one.
            let ne_r = self.router.weight.rows();
            let all = grow(scores, n * ne_r);
            self.router.weight.matmul(x, n, all);
            for (logits, r) in all.chunks_exact_mut(ne_r).zip(routes.iter_mut()) {
                self.router.select(logits, order, r);
                if let Some(cr) = cache_route {
                    cr.apply(order, r, resident, |r| self.router.weigh(logits, r));
                }
            }
        } else {
            for (row, r) in x.chunks_exact(hidden).zip(routes.iter_mut()) {
                self.router.route_into(row, scores, order, r);
                if let Some(cr) = cache_route {
                    cr.apply(order, r, resident, |r| self.router.weigh(scores, r));
                }
            }
        }
        let (start, pairs): (&[usize], &[(usize, f32)]) = if shared_done.is_some() {
            // Grouped in the region above.
            (&start[..ne + 1], &pairs[..start[ne]])
        } else {
            store.observe(layer, routes);
            group_by_expert(routes, ne, start, cursor, pairs, wanted, on_route)
        };
        // A gated shared expert runs here, after the routed ones (the store adds an ungated
        // one itself): routed sum first, then the gated shared output, as transformers adds.
        store.run_layer(
            LayerBatch {
                layer,
                x,
                n,
                act,
                pairs,
                start,
                wanted,
                shared: self
                    .shared
                    .as_ref()
                    .filter(|_| gated.is_none())
                    .map(|s| [&s.gate.w, &s.up.w, &s.down.w]),
                shared_gu: shared_done,
            },
            run,
            out,
        )?;
        if let Some((gate_w, mlp)) = gated {
            let y = grow(gated_out, n * hidden);
            swiglu(
                [&mlp.gate.w, &mlp.up.w, &mlp.down.w],
                None,
                x,
                n,
                act,
                (&mut gated_sc.g, &mut gated_sc.u),
                y,
            );
            for ((o, yr), xr) in out
                .chunks_exact_mut(hidden)
                .zip(y.chunks_exact(hidden))
                .zip(x.chunks_exact(hidden))
            {
                let s = sigmoid(super::ops::dot(gate_w, xr));
                for (ov, yv) in o.iter_mut().zip(yr) {
                    *ov += s * yv;
                }
            }
        }
        Ok(())
    }
}

/// Groups the rows of `routes` by expert as one counting sort: `(row, weight)` pairs in
/// ascending expert, and within an expert ascending row, the order transformers accumulates
/// them in. Returns `start` (expert `e` owns `pairs[start[e]..start[e + 1]]`) and the pairs,
/// and fills `wanted` with the experts that have a row; `on_route` sees each row's routing.
pub(crate) fn group_by_expert<'a>(
    routes: &[Routing],
    ne: usize,
    start: &'a mut Vec<usize>,
    cursor: &mut Vec<usize>,
    pairs: &'a mut Vec<(usize, f32)>,
    wanted: &mut Vec<usize>,
    mut on_route: impl FnMut(usize, &Routing),
) -> (&'a [usize], &'a [(usize, f32)]) {
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
    (start, pairs)
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
    fn a_softmax_topk_router_adds_its_bias_and_weighs_the_chosen_alone() {
        // Logits 2, 1, 0 plus biases 0, 0, 1.5: biased 2, 1, 1.5. Top 2: experts 0 and 2,
        // weighed by a softmax over 2 and 1.5 only (gpt-oss's GptOssTopKRouter).
        let router = Router {
            weight: QMatrix::from_f32(vec![2.0, 1.0, 0.0], 3, 1),
            bias: vec![0.0, 0.0, 1.5],
            kind: RouterKind::SoftmaxTopk,
            top_k: 2,
            n_group: 1,
            topk_group: 1,
            norm_topk_prob: false,
            scaling: 1.0,
        };
        let r = router.route(&[1.0]);
        assert_eq!(r.experts, vec![0, 2]);
        let z = 2f32.exp() + 1.5f32.exp();
        assert!(
            (r.weights[0] - 2f32.exp() / z).abs() < 1e-6,
            "{:?}",
            r.weights
        );
        assert!(
            (r.weights[1] - 1.5f32.exp() / z).abs() < 1e-6,
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
