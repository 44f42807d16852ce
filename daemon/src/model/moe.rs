//! Feed-forward blocks (reference §5): the dense SwiGLU MLP, and the MoE layer with its sigmoid
//! router (bias used for selection only), routed experts and shared expert.

use super::linear::{ActMode, Linear};
use super::ops::{sigmoid, silu};
use crate::error::EngineError;
use crate::experts::ExpertStore;
use crate::quant::QMatrix;

/// `down(silu(gate(x)) * up(x))`: the dense MLP, the shared expert and every routed expert.
pub struct Mlp {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

impl Mlp {
    pub fn forward(&self, x: &[f32], n: usize, act: ActMode) -> Vec<f32> {
        swiglu(&self.gate.w, &self.up.w, &self.down.w, x, n, act)
    }
}

fn swiglu(
    gate: &QMatrix,
    up: &QMatrix,
    down: &QMatrix,
    x: &[f32],
    n: usize,
    act: ActMode,
) -> Vec<f32> {
    let inter = gate.rows();
    let mut g = vec![0.0; n * inter];
    let mut u = vec![0.0; n * inter];
    let mm = |w: &QMatrix, x: &[f32], y: &mut [f32]| match act {
        ActMode::F32 => w.matmul(x, n, y),
        ActMode::Int8 => w.matmul_i8act(x, n, y),
    };
    match act {
        // One pass over x for both projections: the activations are quantized once.
        ActMode::Int8 => QMatrix::matmul_pair_i8act(gate, up, x, n, &mut g, &mut u),
        ActMode::F32 => {
            mm(gate, x, &mut g);
            mm(up, x, &mut u);
        }
    }
    for (gv, uv) in g.iter_mut().zip(&u) {
        *gv = silu(*gv) * uv;
    }
    let mut out = vec![0.0; n * down.rows()];
    mm(down, &g, &mut out);
    out
}

/// The experts chosen for one token and their mixing weights.
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    pub experts: Vec<usize>,
    pub weights: Vec<f32>,
}

pub struct Router {
    /// (n_experts, hidden), always f32 (transformers keeps the gate in fp32).
    pub weight: Vec<f32>,
    pub bias: Vec<f32>,
    pub top_k: usize,
    pub norm_topk_prob: bool,
    pub scaling: f32,
}

impl Router {
    pub fn route(&self, x: &[f32]) -> Routing {
        let hidden = x.len();
        let scores: Vec<f32> = self
            .weight
            .chunks_exact(hidden)
            .map(|w| sigmoid(w.iter().zip(x).map(|(a, b)| a * b).sum()))
            .collect();
        // Selection by the biased score; weights from the unbiased sigmoid.
        let mut order: Vec<usize> = (0..scores.len()).collect();
        order.sort_by(|&a, &b| {
            (scores[b] + self.bias[b])
                .total_cmp(&(scores[a] + self.bias[a]))
                .then(a.cmp(&b))
        });
        let experts: Vec<usize> = order[..self.top_k].to_vec();
        let mut weights: Vec<f32> = experts.iter().map(|&e| scores[e]).collect();
        if self.norm_topk_prob {
            let denom = weights.iter().sum::<f32>() + 1e-20;
            weights.iter_mut().for_each(|w| *w /= denom);
        }
        weights.iter_mut().for_each(|w| *w *= self.scaling);
        Routing { experts, weights }
    }

    /// The experts any of the rows of `x` would pick (ascending, distinct): the pilot's guess
    /// of the next layer's experts.
    pub fn predict(&self, x: &[f32], n: usize) -> Vec<usize> {
        let hidden = x.len() / n.max(1);
        let mut picked = vec![false; self.bias.len()];
        for row in x.chunks_exact(hidden) {
            for e in self.route(row).experts {
                picked[e] = true;
            }
        }
        (0..picked.len()).filter(|&e| picked[e]).collect()
    }
}

pub struct Moe {
    pub router: Router,
    pub shared: Mlp,
}

impl Moe {
    /// MoE over `n` rows. The experts of the whole batch are gathered first so each expert's
    /// weights are fetched and read once per batch, whatever the number of rows routed to it.
    pub fn forward(
        &self,
        layer: usize,
        store: &ExpertStore,
        x: &[f32],
        n: usize,
        act: ActMode,
        mut on_route: impl FnMut(usize, &Routing),
    ) -> Result<Vec<f32>, EngineError> {
        let hidden = x.len() / n.max(1);
        let routes: Vec<Routing> = x
            .chunks_exact(hidden)
            .map(|row| self.router.route(row))
            .collect();
        store.observe(layer, &routes);
        // expert -> [(row, weight)], in ascending expert order as transformers accumulates them.
        let mut by_expert: Vec<Vec<(usize, f32)>> = vec![Vec::new(); store.n_experts()];
        for (s, r) in routes.iter().enumerate() {
            on_route(s, r);
            for (&e, &w) in r.experts.iter().zip(&r.weights) {
                by_expert[e].push((s, w));
            }
        }
        let wanted: Vec<usize> = (0..by_expert.len())
            .filter(|&e| !by_expert[e].is_empty())
            .collect();
        // The store yields experts as they become ready (resident first, loads as they
        // complete); each product goes to its own buffer and the sum below runs in ascending
        // expert order, so the output bytes do not depend on the arrival order.
        let mut products: Vec<Option<Vec<f32>>> = vec![None; by_expert.len()];
        let mut gathered = Vec::new();
        for item in store.fetch_layer(layer, &wanted) {
            let (e, expert) = item?;
            let rows = &by_expert[e];
            gathered.clear();
            for &(s, _) in rows {
                gathered.extend_from_slice(&x[s * hidden..(s + 1) * hidden]);
            }
            products[e] = Some(swiglu(
                &expert.gate,
                &expert.up,
                &expert.down,
                &gathered,
                rows.len(),
                act,
            ));
        }
        let mut out = vec![0.0f32; n * hidden];
        for &e in &wanted {
            let y = products[e].as_ref().ok_or_else(|| {
                EngineError::Load(format!("expert {e} of layer {layer} was never delivered"))
            })?;
            for (i, &(s, w)) in by_expert[e].iter().enumerate() {
                for (o, v) in out[s * hidden..(s + 1) * hidden]
                    .iter_mut()
                    .zip(&y[i * hidden..(i + 1) * hidden])
                {
                    *o += v * w;
                }
            }
        }
        let shared = self.shared.forward(x, n, act);
        for (o, v) in out.iter_mut().zip(&shared) {
            *o += v;
        }
        Ok(out)
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
            weight: vec![2.0, 0.0, 1.0, 0.0, -3.0, 0.0],
            bias: vec![-1.0, 0.0, 0.0],
            top_k: 1,
            norm_topk_prob: false,
            scaling: 2.5,
        };
        let r = router.route(&[1.0, 0.0]);
        assert_eq!(r.experts, vec![1]);
        assert!((r.weights[0] - 2.5 * sigmoid(1.0)).abs() < 1e-6);
    }

    #[test]
    fn norm_topk_normalises_before_scaling() {
        let router = Router {
            weight: vec![1.0, -1.0, 0.5],
            bias: vec![0.0; 3],
            top_k: 2,
            norm_topk_prob: true,
            scaling: 2.0,
        };
        let r = router.route(&[1.0]);
        assert_eq!(r.experts, vec![0, 2]);
        assert!((r.weights.iter().sum::<f32>() - 2.0).abs() < 1e-6);
    }
}
