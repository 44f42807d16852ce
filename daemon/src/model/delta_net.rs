//! Qwen3.5-MoE's Gated DeltaNet (transformers' `Qwen3_5MoeGatedDeltaNet`), in the recurrent
//! form (`torch_recurrent_gated_delta_rule`), one position at a time, prefill included.
//!
//! Per row: `qkv = in_proj_qkv(x)` runs through a causal depthwise conv1d of
//! `conv_kernel` taps (its input history is the layer's conv state) and SiLU, then splits into
//! queries and keys (`key_heads` heads of `key_head_dim`) and values (`value_heads` heads of
//! `value_head_dim`); each value head reads query/key head `h / (value_heads / key_heads)`
//! (in a GGUF's tiled head order, `h % key_heads`).
//! Queries and keys are L2-normalised, queries scaled by `key_head_dim^-1/2`. With
//! `beta = sigmoid(in_proj_b(x))` and the decay `g = -exp(A_log) * softplus(in_proj_a(x) +
//! dt_bias)`, each value head's state `S` (key_head_dim x value_head_dim) takes
//! `S *= exp(g)`, `S += k (beta (v - S^T k))^T` and yields `o = S^T q`. The output heads are
//! RMSNorm'd (plain weight, not zero-centred) and multiplied by `silu(in_proj_z(x))`, then
//! `out_proj` maps them back to the hidden size.
//!
//! transformers runs a prefill through the chunked form of the same rule
//! (`torch_chunk_gated_delta_rule`); both are exact rewritings of one recurrence, and the
//! fixtures check that the two agree on every token (`tests/tests/family_qwen35.rs`).

use super::batch::{SeqStep, Span};
use super::kv::{KvCache, LayerKv, LinearKv};
use super::linear::{ActMode, Linear};
use super::ops::sigmoid;
use super::scratch::grow;
use crate::config::DeltaNetConfig;

pub(crate) struct DeltaNet {
    pub in_qkv: Linear,
    pub in_z: Linear,
    pub in_b: Linear,
    pub in_a: Linear,
    /// (conv_dim, conv_kernel): channel `c`'s taps, oldest input first.
    pub conv: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// `-exp(A_log)` per value head, as transformers computes it in f32.
    pub neg_a: Vec<f32>,
    /// Whether the value heads are in llama.cpp's tiled order (a GGUF's, `gguf::qwen35`):
    /// value head `j` is head `j / key_heads` of key head `j % key_heads`'s group, rather
    /// than transformers' grouped order (head `j % group` of key head `j / group`'s).
    pub tiled: bool,
    /// The gated RMSNorm's weight (`value_head_dim`).
    pub norm: Vec<f32>,
    pub out: Linear,
    pub cfg: DeltaNetConfig,
    pub eps: f32,
    /// The layer's own working buffers: a forward holds the model's scratch elsewhere, and
    /// layers run one at a time, so this lock is never contended.
    pub scratch: std::sync::Mutex<DeltaScratch>,
}

/// The working buffers of one DeltaNet forward.
#[derive(Default)]
pub(crate) struct DeltaScratch {
    qkv: Vec<f32>,
    z: Vec<f32>,
    b: Vec<f32>,
    a: Vec<f32>,
    conv_out: Vec<f32>,
    heads: Vec<f32>,
    delta: Vec<f32>,
}

/// torch's `F.softplus` (beta 1, threshold 20: linear above it).
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Where row `s` of a forward reads a state from and writes it to: in place (`None`), or,
/// with a trail (`kv_snap.rs`), from the previous row's entry (the cache's for the first)
/// into its own.
fn row_io<'a>(
    cur: &'a mut [f32],
    trail: &'a mut [Vec<f32>],
    s: usize,
) -> (Option<&'a [f32]>, &'a mut [f32]) {
    match s {
        _ if trail.is_empty() => (None, cur),
        0 => (Some(cur), &mut trail[0]),
        _ => {
            let (done, rest) = trail.split_at_mut(s);
            (Some(&done[s - 1]), &mut rest[0])
        }
    }
}

/// The query/key head value head `h` reads: `h`'s group (`group` value heads per key
/// head) in transformers' grouped order, its position among the `key_heads` in llama.cpp's
/// tiled one.
pub(crate) fn key_head(h: usize, group: usize, key_heads: usize, tiled: bool) -> usize {
    match tiled {
        true => h % key_heads,
        false => h / group,
    }
}

/// `x * rsqrt(sum(x^2) + 1e-6)`, transformers' `l2norm` (the FLA library's).
fn l2norm(x: &mut [f32]) {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    let inv = 1.0 / (ss + 1e-6).sqrt();
    x.iter_mut().for_each(|v| *v *= inv);
}

impl DeltaNet {
    /// The layer over the batch's rows `a_in` (normalised hidden states) into `out`
    /// (`(rows, hidden)`); each sequence's conv and recurrent state advance by its rows.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &self,
        layer: usize,
        a_in: &[f32],
        spans: &[Span],
        seqs: &mut [SeqStep<'_>],
        act: ActMode,
        out: &mut [f32],
    ) {
        let mut guard = self
            .scratch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let sc = &mut *guard;
        let d = self.cfg;
        let rows: usize = spans.iter().map(|s| s.n).sum();
        let hidden = a_in.len() / rows.max(1);
        let (cd, kd, vd) = (d.conv_dim(), d.key_dim(), d.value_dim());
        let (nv, dk, dv) = (d.value_heads, d.key_head_dim, d.value_head_dim);
        let group = nv / d.key_heads;
        let taps = d.conv_kernel;
        let qkv = grow(&mut sc.qkv, rows * cd);
        self.in_qkv.forward(a_in, rows, qkv, act);
        let z = grow(&mut sc.z, rows * vd);
        self.in_z.forward(a_in, rows, z, act);
        let b = grow(&mut sc.b, rows * nv);
        self.in_b.forward(a_in, rows, b, act);
        let a = grow(&mut sc.a, rows * nv);
        self.in_a.forward(a_in, rows, a, act);
        let heads_out = grow(&mut sc.heads, rows * vd);
        let conv_out = grow(&mut sc.conv_out, cd);
        let delta = grow(&mut sc.delta, dv);
        let scale = 1.0 / (dk as f32).sqrt();
        for (span, seq) in spans.iter().zip(seqs.iter_mut()) {
            let KvCache { layers, snaps, .. } = &mut *seq.kv;
            let LayerKv::Linear(st) = &mut layers[layer] else {
                // The cache was made from this model's config (`KvCache::new`).
                unreachable!("a DeltaNet layer's cache holds attention keys");
            };
            let LinearKv { conv, state, pos } = st;
            let saves = snaps.layer(layer, *pos, span.n);
            let (trail_conv, trail_state, mut mark) = (saves.conv, saves.state, saves.mark);
            for s in 0..span.n {
                let row = span.start + s;
                let x = &qkv[row * cd..(row + 1) * cd];
                let (conv_src, conv_dst) = row_io(conv, trail_conv, s);
                // The conv over the last `taps - 1` inputs (the state, oldest first) and this
                // one, then SiLU; the state shifts by one input.
                let hist_all: &[f32] = conv_src.unwrap_or(&*conv_dst);
                for c in 0..cd {
                    let w = &self.conv[c * taps..(c + 1) * taps];
                    let hist = &hist_all[c * (taps - 1)..(c + 1) * (taps - 1)];
                    let mut acc = 0.0f32;
                    for (k, h) in hist.iter().enumerate() {
                        acc += w[k] * h;
                    }
                    acc += w[taps - 1] * x[c];
                    conv_out[c] = silu(acc);
                }
                if taps > 1 {
                    for (c, &xc) in x.iter().enumerate() {
                        let at = c * (taps - 1)..(c + 1) * (taps - 1);
                        match conv_src {
                            Some(src) => conv_dst[at.start..at.end - 1]
                                .copy_from_slice(&src[at.start + 1..at.end]),
                            None => conv_dst[at.clone()].copy_within(1.., 0),
                        }
                        conv_dst[at.end - 1] = xc;
                    }
                }
                let (state_src, state_dst) = row_io(state, trail_state, s);
                let (q, rest) = conv_out.split_at_mut(kd);
                let (k, v) = rest.split_at_mut(kd);
                for qh in q.chunks_exact_mut(dk) {
                    l2norm(qh);
                    qh.iter_mut().for_each(|x| *x *= scale);
                }
                for kh in k.chunks_exact_mut(dk) {
                    l2norm(kh);
                }
                for h in 0..nv {
                    let kh = key_head(h, group, d.key_heads, self.tiled);
                    let (qh, khv) = (&q[kh * dk..(kh + 1) * dk], &k[kh * dk..(kh + 1) * dk]);
                    let vh = &v[h * dv..(h + 1) * dv];
                    let beta = sigmoid(b[row * nv + h]);
                    let g = self.neg_a[h] * softplus(a[row * nv + h] + self.dt_bias[h]);
                    let decay = g.exp();
                    let at = h * dk * dv..(h + 1) * dk * dv;
                    let s_h = &mut state_dst[at.clone()];
                    // Out of place along a trail: the same product, into the row's own state.
                    match state_src {
                        Some(src) => s_h
                            .iter_mut()
                            .zip(&src[at])
                            .for_each(|(d, x)| *d = *x * decay),
                        None => s_h.iter_mut().for_each(|x| *x *= decay),
                    }
                    // kv_mem = S^T k, summed over the key dimension in order.
                    delta.fill(0.0);
                    for (i, &ki) in khv.iter().enumerate() {
                        for (m, &sv) in delta.iter_mut().zip(&s_h[i * dv..(i + 1) * dv]) {
                            *m += sv * ki;
                        }
                    }
                    for (m, &vj) in delta.iter_mut().zip(vh) {
                        *m = (vj - *m) * beta;
                    }
                    for (i, &ki) in khv.iter().enumerate() {
                        for (sv, &m) in s_h[i * dv..(i + 1) * dv].iter_mut().zip(delta.iter()) {
                            *sv += ki * m;
                        }
                    }
                    let o = &mut heads_out[row * vd + h * dv..row * vd + (h + 1) * dv];
                    o.fill(0.0);
                    for (i, &qi) in qh.iter().enumerate() {
                        for (ov, &sv) in o.iter_mut().zip(&s_h[i * dv..(i + 1) * dv]) {
                            *ov += sv * qi;
                        }
                    }
                }
                if let Some((_, m)) = mark.take_if(|(at, _)| *at == s) {
                    m.conv.clear();
                    m.conv.extend_from_slice(conv_dst);
                    m.state.clear();
                    m.state.extend_from_slice(state_dst);
                }
            }
            // The trail's last row is the state now; its entry keeps the state before.
            if let (Some(c), Some(st)) = (trail_conv.last_mut(), trail_state.last_mut()) {
                std::mem::swap(conv, c);
                std::mem::swap(state, st);
            }
            *pos += span.n;
        }
        // The gated RMSNorm per value head: norm first, then times silu(z).
        for (o, zr) in heads_out.chunks_exact_mut(dv).zip(z.chunks_exact(dv)) {
            let ms = o.iter().map(|v| v * v).sum::<f32>() / dv as f32;
            let inv = 1.0 / (ms + self.eps).sqrt();
            for ((v, w), zv) in o.iter_mut().zip(&self.norm).zip(zr) {
                *v = w * (*v * inv) * silu(*zv);
            }
        }
        self.out
            .forward(heads_out, rows, &mut out[..rows * hidden], act);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softplus_follows_torch_around_its_threshold() {
        assert_eq!(softplus(25.0), 25.0);
        assert!((softplus(0.0) - 2f32.ln()).abs() < 1e-7);
        assert!((softplus(-30.0) - (-30f32).exp()).abs() < 1e-20);
    }

    #[test]
    fn l2norm_gives_unit_rows() {
        let mut x = [3.0, 4.0];
        l2norm(&mut x);
        assert!((x[0] - 0.6).abs() < 1e-6 && (x[1] - 0.8).abs() < 1e-6);
    }
}
