//! DeepSeek-V4's feed-forward (transformers' `DeepseekV4SparseMoeBlock`): routed experts
//! picked by token id (`DeepseekV4HashRouter`, the `hash_moe` layers) or by
//! `sqrt(softplus(logit))` score plus correction bias (`DeepseekV4TopKRouter`), weighted by
//! their normalised scores times `routed_scaling_factor`, plus one shared expert; every
//! expert's SwiGLU clamps its gate from above and its up projection on both sides at
//! `swiglu_limit`.

use super::dsv4_hc::Mat;
use crate::config::{ModelConfig, RouterKind};
use crate::error::EngineError;
use crate::weights::ShardSet;

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// torch's `softplus` (linear past 20), then the square root.
pub(crate) fn sqrt_softplus(x: f32) -> f32 {
    let sp = if x > 20.0 { x } else { x.exp().ln_1p() };
    sp.sqrt()
}

/// `down(silu(min(gate, limit)) * clamp(up, -limit, limit))` of one expert: `gate_up` is its
/// `[2 * inter, hidden]` matrix (gate rows first), `down` its `[hidden, inter]`.
fn swiglu(
    gate_up: &[f32],
    down: &[f32],
    inter: usize,
    limit: f32,
    x: &[f32],
    out: &mut [f32],
    weight: f32,
) {
    let h = x.len();
    let dot = |row: &[f32]| row.iter().zip(x).map(|(a, b)| a * b).sum::<f32>();
    let act: Vec<f32> = (0..inter)
        .map(|i| {
            let g = dot(&gate_up[i * h..(i + 1) * h]).min(limit);
            let u = dot(&gate_up[(inter + i) * h..(inter + i + 1) * h]).clamp(-limit, limit);
            silu(g) * u
        })
        .collect();
    for (o, row) in out.iter_mut().zip(down.chunks_exact(inter)) {
        *o += weight * row.iter().zip(&act).map(|(a, b)| a * b).sum::<f32>();
    }
}

pub(crate) struct Moe {
    router: Mat,
    scoring: RouterKind,
    /// Hash layers: `tid2eid`, `top_k` expert ids per token id.
    table: Option<Vec<u32>>,
    bias: Vec<f32>,
    top_k: usize,
    scaling: f32,
    limit: f32,
    inter: usize,
    /// `[experts, 2 * inter, hidden]` and `[experts, hidden, inter]`.
    gate_up: Vec<f32>,
    down: Vec<f32>,
    shared_gate_up: Vec<f32>,
    shared_down: Vec<f32>,
}

impl Moe {
    /// Layer `lp`'s feed-forward (`{lp}.ffn.*`, the reference's names: experts split,
    /// `w1` gate, `w3` up, `w2` down).
    pub(crate) fn load(
        s: &ShardSet,
        c: &ModelConfig,
        lp: &str,
        hash: bool,
        limit: f32,
    ) -> Result<Self, EngineError> {
        let p = format!("{lp}.ffn");
        let (h, e, k, i) = (
            c.hidden_size,
            c.n_routed_experts,
            c.num_experts_per_tok,
            c.moe_intermediate_size,
        );
        let table = match hash {
            true => {
                let name = format!("{p}.gate.tid2eid");
                let ids = s.read_f32(&name, &[c.vocab_size, k])?;
                // Expert ids: a table entry outside 0..experts is a broken checkpoint.
                let bad = ids
                    .iter()
                    .position(|&v| v < 0.0 || v as usize >= e || v.fract() != 0.0);
                if let Some(at) = bad {
                    return Err(EngineError::Load(format!(
                        "{name}: entry {at} = {} is not an expert id (0..{e})",
                        ids[at]
                    )));
                }
                Some(ids.iter().map(|&v| v as u32).collect())
            }
            false => None,
        };
        let bias = match hash {
            true => vec![0.0; e],
            false => s.read_f32(&format!("{p}.gate.bias"), &[e])?,
        };
        // Per expert, its gate rows then its up rows (`[2 * inter, hidden]`), and its down.
        let expert = |q: &str| -> Result<(Vec<f32>, Vec<f32>), EngineError> {
            let mut gate_up = s.read_f32(&format!("{q}.w1.weight"), &[i, h])?;
            gate_up.extend(s.read_f32(&format!("{q}.w3.weight"), &[i, h])?);
            Ok((gate_up, s.read_f32(&format!("{q}.w2.weight"), &[h, i])?))
        };
        let (mut gate_up, mut down) = (
            Vec::with_capacity(e * 2 * i * h),
            Vec::with_capacity(e * h * i),
        );
        for x in 0..e {
            let (gu, dn) = expert(&format!("{p}.experts.{x}"))?;
            gate_up.extend(gu);
            down.extend(dn);
        }
        let (shared_gate_up, shared_down) = expert(&format!("{p}.shared_experts"))?;
        Ok(Moe {
            router: Mat::read(s, &format!("{p}.gate.weight"), e, h)?,
            scoring: c.router,
            table,
            bias,
            top_k: k,
            scaling: c.routed_scaling_factor,
            limit,
            inter: i,
            gate_up,
            down,
            shared_gate_up,
            shared_down,
        })
    }

    /// The experts token `token` goes to, with their weights.
    pub(crate) fn route(&self, x: &[f32], token: u32) -> Vec<(usize, f32)> {
        let scores: Vec<f32> = self
            .router
            .apply(x)
            .into_iter()
            .map(|v| match self.scoring {
                RouterKind::SigmoidBias => 1.0 / (1.0 + (-v).exp()),
                _ => sqrt_softplus(v),
            })
            .collect();
        let picked: Vec<usize> = match &self.table {
            Some(t) => {
                let row = token as usize * self.top_k;
                t[row..row + self.top_k]
                    .iter()
                    .map(|&e| e as usize)
                    .collect()
            }
            None => {
                let mut order: Vec<usize> = (0..scores.len()).collect();
                let biased = |e: usize| scores[e] + self.bias[e];
                order.sort_by(|&a, &b| biased(b).total_cmp(&biased(a)).then(a.cmp(&b)));
                order.truncate(self.top_k);
                order
            }
        };
        let sum: f32 = picked.iter().map(|&e| scores[e]).sum::<f32>() + 1e-20;
        picked
            .into_iter()
            .map(|e| (e, scores[e] / sum * self.scaling))
            .collect()
    }

    pub(crate) fn forward(&self, x: &[f32], token: u32) -> Vec<f32> {
        let h = x.len();
        let i = self.inter;
        let mut out = vec![0.0f32; h];
        for (e, w) in self.route(x, token) {
            let gu = &self.gate_up[e * 2 * i * h..(e + 1) * 2 * i * h];
            let dn = &self.down[e * h * i..(e + 1) * h * i];
            swiglu(gu, dn, i, self.limit, x, &mut out, w);
        }
        swiglu(
            &self.shared_gate_up,
            &self.shared_down,
            i,
            self.limit,
            x,
            &mut out,
            1.0,
        );
        out
    }
}
