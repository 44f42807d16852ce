//! A DeepSeek-V4 decoder layer inside the engine's [`Model`] (transformers'
//! `DeepseekV4DecoderLayer`): the residual is `hc_mult` streams per token; the attention and
//! the feed-forward each read the streams folded by a hyper-connection (`dsv4_hc.rs`) and
//! put their output back through it.
//!
//! ```text
//! mix = attn_hc(streams); streams = mix.put_back(streams, Attn(attn_norm(mix.collapsed)))
//! mix = ffn_hc(streams);  streams = mix.put_back(streams, Moe(ffn_norm(mix.collapsed)))
//! ```
//!
//! The attention (`dsv4_attn.rs`) runs its weight products over all the batch's rows at once
//! and the rest row by row within each sequence, in order: a row's compressors close a window
//! on the token that fills it, and the next row sees it. A chunk of rows through one layer at
//! a time is then the same computation as one token at a time (the prefill is batched). Its
//! state is the sequence's [`LayerKv::Dsv4`](super::kv::LayerKv::Dsv4). The routed experts
//! go through the [`ExpertStore`] (tiers, pins, prefetch, usage) with their clamped SwiGLU
//! (`OssExpert::dsv4`); the router (sqrt-softplus or sigmoid scores, or the token id's row of
//! `tid2eid` on the hash layers, weighed by the same scores) and the shared expert (clamped
//! the same way) are computed here. The working memory is the model's (`Dsv4Scratch` and the
//! MoE's), so a decode step does not allocate once it has grown.

use super::batch::SeqStep;
use super::dsv4_attn::{rms, Attention as V4Attention, Dsv4Scratch};
use super::dsv4_hc::{layer_prefix, put_back, HyperConnection};
use super::layer::{Attention, Ffn, Layer, LayerWork};
use super::linear::{load_linear, Linear};
use super::model::Model;
use super::moe::{Mlp, Moe, Router, Routing};
use super::ops::sigmoid;
use super::profile::Stage;
use super::rope::Rope;
use super::scratch::{grow, MoeScratch};
use crate::config::{ModelConfig, RouterKind};
use crate::error::EngineError;
use crate::experts::run::LayerBatch;
use crate::experts::{ExpertStore, OssExpert};
use crate::quant::{QFormat, QMatrix};
use crate::weights::ShardSet;

/// What a V4 layer has beyond the shared [`Layer`] fields: its attention and compressors, the
/// two hyper-connections, the hash router's table and the clamped activation.
pub(crate) struct Dsv4Block {
    attn: V4Attention,
    attn_hc: HyperConnection,
    ffn_hc: HyperConnection,
    /// Hash layers: `tid2eid`, `top_k` expert ids per token id.
    hash: Option<Vec<u32>>,
    /// The shared expert's clamped SwiGLU (the routed experts' is the store's).
    act: OssExpert,
    hc: usize,
    main_rope: Rope,
    compress_rope: Rope,
}

/// Layer `l` of a DeepSeek-V4 checkpoint (`model.layers.{l}` as transformers saves it, or
/// `layers.{l}` as published; the names under it are the reference's).
pub(crate) fn load_layer(
    s: &ShardSet,
    c: &ModelConfig,
    l: usize,
    dense: QFormat,
) -> Result<Layer, EngineError> {
    let d = c
        .dsv4()
        .ok_or_else(|| EngineError::Load("a DeepSeek-V4 layer without its config".into()))?;
    let (h, eps) = (c.hidden_size, c.rms_norm_eps);
    let p = layer_prefix(s, l);
    let hc = |which: &str| {
        HyperConnection::load(
            s,
            &p,
            which,
            d.hc_mult,
            h,
            d.hc_sinkhorn_iters,
            d.hc_eps,
            eps,
        )
    };
    let (e, k, inter) = (
        c.n_routed_experts,
        c.num_experts_per_tok,
        c.moe_intermediate_size,
    );
    let f = format!("{p}.ffn");
    let hashed = d.hash.get(l).copied().unwrap_or(false);
    let hash = match hashed {
        false => None,
        true => {
            let name = format!("{f}.gate.tid2eid");
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
    };
    let router = Router {
        weight: QMatrix::from_f32(s.read_f32(&format!("{f}.gate.weight"), &[e, h])?, e, h),
        // The hash layers' router only weighs (its table picks): no selection bias.
        bias: match hashed {
            true => vec![0.0; e],
            false => s.read_f32(&format!("{f}.gate.bias"), &[e])?,
        },
        kind: c.router,
        top_k: k,
        n_group: 1,
        topk_group: 1,
        norm_topk_prob: true,
        scaling: c.routed_scaling_factor,
    };
    let shared_inter = inter * c.n_shared_experts.max(1);
    let se = format!("{f}.shared_experts");
    let shared = Mlp {
        gate: load_linear(s, &format!("{se}.w1"), shared_inter, h, dense, false)?,
        up: load_linear(s, &format!("{se}.w3"), shared_inter, h, dense, false)?,
        down: load_linear(s, &format!("{se}.w2"), h, shared_inter, dense, false)?,
    };
    let compress_rope = match &d.compress_yarn {
        Some(y) => Rope::yarn(d.rope_dim, d.compress_rope_theta, y),
        None => Rope::new(d.rope_dim, d.compress_rope_theta),
    };
    let block = Dsv4Block {
        attn: V4Attention::load(s, &p, l, d, h, c.num_attention_heads, eps, dense)?,
        attn_hc: hc("attn")?,
        ffn_hc: hc("ffn")?,
        hash,
        act: OssExpert::dsv4(shared_inter, h, d.swiglu_limit),
        hc: d.hc_mult,
        main_rope: Rope::new(d.rope_dim, c.rope_theta),
        compress_rope,
    };
    Ok(Layer {
        input_norm: s.read_f32(&format!("{p}.attn_norm.weight"), &[h])?,
        post_norm: s.read_f32(&format!("{p}.ffn_norm.weight"), &[h])?,
        attn: Attention::Dsv4(Box::new(block)),
        ffn: Ffn::Moe(Moe {
            router,
            shared: Some(shared),
            shared_gate: None,
        }),
    })
}

/// DeepSeek-V4's part of `layers` that `Linear` does not hold (`Model::dense_bytes`,
/// `prefill_macs_per_position`): (f32-sized values, multiply-accumulates per position). Per
/// layer the attention's norms, sinks and position biases, both hyper-connections' mixers, the
/// two norms, the hash table (u32 ids) and the score router's selection bias; the attention's
/// projections ([`Dsv4Block::linears`]), the shared expert and the router's matrix are
/// `Linear`s, counted with every family's.
pub(crate) fn counts(layers: &[Layer]) -> (u64, u64) {
    let (mut values, mut macs) = (0, 0);
    for layer in layers {
        let Attention::Dsv4(b) = &layer.attn else {
            continue;
        };
        let parts = [b.attn_hc.counts(), b.ffn_hc.counts()];
        values += b.attn.values() + parts.iter().map(|p| p.0).sum::<u64>();
        macs += parts.iter().map(|p| p.1).sum::<u64>();
        values += (layer.input_norm.len() + layer.post_norm.len()) as u64;
        values += b.hash.as_ref().map_or(0, |t| t.len() as u64);
        // The hash layers' router has no bias of its own (a zero one, not in the checkpoint).
        if let (None, Ffn::Moe(m)) = (&b.hash, &layer.ffn) {
            values += m.router.bias.len() as u64;
        }
    }
    (values, macs)
}

impl Dsv4Block {
    /// Its attention's weight products (`Model`'s sums count them with every `Linear`).
    pub(crate) fn linears(&self) -> Vec<&Linear> {
        self.attn.linears()
    }

    /// The format its projections compute in (`Model::dense_format`): the output's.
    pub(crate) fn out_format(&self) -> QFormat {
        self.attn.out_format()
    }

    /// The layer over the batch; `w.x` holds `hc_mult` streams per row (`(n, hc, hidden)`),
    /// the other buffers one row of `hidden` each. `(store_layer, kv_layer)` and `next` as
    /// [`Layer::forward`] takes them.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &self,
        layer: &Layer,
        model: &Model,
        (store_layer, kv_layer): (usize, usize),
        store: &ExpertStore,
        next: Option<&Layer>,
        seqs: &mut [SeqStep<'_>],
        w: LayerWork<'_>,
        on_route: &mut impl FnMut(usize, usize, &Routing),
    ) -> Result<(), EngineError> {
        let c = &model.cfg;
        let (h, eps, hc) = (c.hidden_size, c.rms_norm_eps, self.hc);
        let n = w.spans.iter().map(|s| s.n).sum::<usize>();
        let streams = |r: usize| r * hc * h..(r + 1) * hc * h;
        let Dsv4Scratch {
            hc: hsc,
            mixes,
            tokens,
            attn: asc,
        } = &mut w.attn.dsv4;
        let ml = self.attn_hc.mix_len();
        let mixes = grow(mixes, n * ml);
        // Attention: fold, normalise, attend (each sequence's rows in order), put back.
        let t = std::time::Instant::now();
        for (r, mix) in mixes.chunks_exact_mut(ml).enumerate() {
            let row = &mut w.a[r * h..(r + 1) * h];
            self.attn_hc.mix_into(&w.x[streams(r)], hsc, row, mix);
            rms(row, &layer.input_norm, eps);
        }
        let ropes = (&self.main_rope, &self.compress_rope);
        let act = model.opts.act;
        let (a, delta) = (&w.a[..n * h], &mut w.delta[..n * h]);
        self.attn
            .forward(a, seqs, w.spans, kv_layer, ropes, act, asc, delta)?;
        for (r, mix) in mixes.chunks_exact(ml).enumerate() {
            put_back(mix, &mut w.x[streams(r)], &w.delta[r * h..(r + 1) * h], hsc);
        }
        model.profile.add(Stage::Attention, t);
        // Feed-forward.
        for (r, mix) in mixes.chunks_exact_mut(ml).enumerate() {
            let row = &mut w.m[r * h..(r + 1) * h];
            self.ffn_hc.mix_into(&w.x[streams(r)], hsc, row, mix);
            rms(row, &layer.post_norm, eps);
        }
        let Ffn::Moe(moe) = &layer.ffn else {
            return Err(EngineError::Load(format!(
                "layer {kv_layer}: a DeepSeek-V4 layer without its experts"
            )));
        };
        if store.pilot_enabled() {
            if let Some(Ffn::Moe(next)) = next.map(|x| &x.ffn) {
                let guess = next.router.predict_into(w.m, n, w.moe);
                store.prefetch(store_layer + 1, guess);
            }
        }
        let t = std::time::Instant::now();
        tokens.clear();
        tokens.extend(seqs.iter().flat_map(|s| s.tokens.iter().copied()));
        self.moe(
            moe,
            store_layer,
            store,
            tokens,
            w.moe,
            w.m,
            w.delta,
            model,
            on_route,
        )?;
        model.profile.add(Stage::Moe, t);
        for (r, mix) in mixes.chunks_exact(ml).enumerate() {
            put_back(mix, &mut w.x[streams(r)], &w.delta[r * h..(r + 1) * h], hsc);
        }
        Ok(())
    }

    /// The routed experts (through the store) plus the shared expert of the rows of `x` into
    /// `out`; `tokens` are the rows' token ids (the hash layers route by them).
    #[allow(clippy::too_many_arguments)]
    fn moe(
        &self,
        moe: &Moe,
        layer: usize,
        store: &ExpertStore,
        tokens: &[u32],
        sc: &mut MoeScratch,
        x: &[f32],
        out: &mut [f32],
        model: &Model,
        on_route: &mut impl FnMut(usize, usize, &Routing),
    ) -> Result<(), EngineError> {
        let n = tokens.len();
        let h = x.len() / n.max(1);
        let ne = store.n_experts();
        let r = &moe.router;
        let MoeScratch {
            routes,
            scores,
            order,
            pairs,
            start,
            cursor,
            wanted,
            run,
            gated,
            gated_out,
            ..
        } = sc;
        if routes.len() < n {
            routes.resize_with(n, Routing::default);
        }
        let routes = &mut routes[..n];
        for ((row, &tok), route) in x.chunks_exact(h).zip(tokens).zip(routes.iter_mut()) {
            match &self.hash {
                None => r.route_into(row, scores, order, route),
                Some(table) => {
                    // The table picks; the weights are the picked experts' scores,
                    // normalised, then scaled (as the score-routed layers weigh theirs).
                    let scores = grow(scores, ne);
                    r.weight.matmul(row, 1, scores);
                    let at = tok as usize * r.top_k;
                    route.experts.clear();
                    route
                        .experts
                        .extend(table[at..at + r.top_k].iter().map(|&e| e as usize));
                    // The config's `scoring_func`, as `Router::select` scores: transformers'
                    // hash router weighs by it too. sqrt(softplus), torch's softplus linear
                    // past 20, or the sigmoid.
                    let s = |e: usize| {
                        let v = scores[e];
                        match r.kind {
                            RouterKind::SigmoidBias => sigmoid(v),
                            _ => if v > 20.0 { v } else { v.exp().ln_1p() }.sqrt(),
                        }
                    };
                    let sum = route.experts.iter().map(|&e| s(e)).sum::<f32>() + 1e-20;
                    route.weights.clear();
                    route
                        .weights
                        .extend(route.experts.iter().map(|&e| s(e) / sum * r.scaling));
                }
            }
        }
        store.observe(layer, routes);
        let (start, pairs) =
            super::moe::group_by_expert(routes, ne, start, cursor, pairs, wanted, |s, route| {
                on_route(layer, s, route)
            });
        let act = model.opts.act;
        store.run_layer(
            LayerBatch {
                layer,
                x,
                n,
                act,
                pairs,
                start,
                wanted,
                shared: None,
                shared_gu: None,
            },
            run,
            out,
        )?;
        // The shared expert, clamped like the routed ones, added after them.
        if let Some(mlp) = &moe.shared {
            let y = grow(gated_out, n * h);
            super::ops::swiglu(
                [&mlp.gate.w, &mlp.up.w, &mlp.down.w],
                Some(&self.act),
                x,
                n,
                act,
                (&mut gated.g, &mut gated.u),
                y,
            );
            out.iter_mut().zip(&*y).for_each(|(o, v)| *o += v);
        }
        Ok(())
    }
}
