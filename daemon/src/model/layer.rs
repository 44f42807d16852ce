//! One decoder layer: its attention (MLA, with the DSA indexer where the family has one, or
//! grouped-query attention) and feed-forward (a dense MLP or a mixture of experts), the
//! loading of an MLA layer's tensors (`gqa_moe.rs` loads the grouped-query ones), and the
//! layer's forward, which every family shares.

use std::time::Instant;

use super::batch::SeqStep;
use super::dsa_indexer::{Indexer, Selection};
use super::linear::load_linear;
use super::mla::{AttnCtx, Mla, QProj};
use super::model::Model;
use super::moe::{Mlp, Moe, Router, Routing};
use super::profile::Stage;
use crate::config::{IndexerKind, LayerKind, MlpKind, ModelConfig, RouterKind};
use crate::error::EngineError;
use crate::experts::ExpertStore;
use crate::quant::{QFormat, QMatrix};
use crate::weights::ShardSet;

pub(crate) enum Ffn {
    Dense(Mlp),
    Moe(Moe),
}

/// A layer's attention: GLM-5's MLA, or grouped-query attention (the other families). Boxed:
/// the two differ in size, and a model holds one kind for all its layers.
pub(crate) enum Attention {
    Mla(Box<Mla>),
    Gqa(Box<super::gqa::Gqa>),
    /// Qwen3.5-MoE's Gated DeltaNet (its full-attention layers are `Gqa`).
    Delta(Box<super::delta_net::DeltaNet>),
    /// DeepSeek-V4's attention with its hyper-connections (its layer runs its own forward).
    Dsv4(Box<super::dsv4_layer::Dsv4Block>),
}

pub(crate) struct Layer {
    pub(crate) input_norm: Vec<f32>,
    pub(crate) post_norm: Vec<f32>,
    pub(crate) attn: Attention,
    pub(crate) ffn: Ffn,
}

/// Layer `l` of any family, by the loader its row of the family table names: attention (with
/// the DSA indexer of `ix_kind`, where an MLA family has one) and the feed-forward of
/// `mlp_kind`. Shared by the main layers and the MTP head's layer (at `l = num_hidden_layers`,
/// past the config's per-layer lists).
pub(crate) fn load(
    s: &ShardSet,
    c: &ModelConfig,
    l: usize,
    dense: QFormat,
    ix_kind: IndexerKind,
    mlp_kind: MlpKind,
) -> Result<Layer, EngineError> {
    match c.family.spec().layers {
        LayerKind::Mla => load_mla(s, c, l, dense, ix_kind, mlp_kind),
        LayerKind::Gqa => super::gqa_moe::load_layer(s, c, l, dense, mlp_kind),
        LayerKind::GptOss => super::gpt_oss::load_layer(s, c, l, dense),
        LayerKind::Hybrid => super::qwen35::load_layer(s, c, l, dense),
        LayerKind::Dsv4 => super::dsv4_layer::load_layer(s, c, l, dense),
    }
}

/// An MLA layer's tensors (`model.layers.{l}.*`): attention with its indexer of `ix_kind`,
/// and the feed-forward of `mlp_kind`.
fn load_mla(
    s: &ShardSet,
    c: &ModelConfig,
    l: usize,
    dense: QFormat,
    ix_kind: IndexerKind,
    mlp_kind: MlpKind,
) -> Result<Layer, EngineError> {
    let m = c
        .mla()
        .ok_or_else(|| EngineError::Load("an MLA family without its attention shape".into()))?;
    let (h, heads) = (c.hidden_size, c.num_attention_heads);
    let qk = m.qk_head_dim();
    let p = format!("model.layers.{l}");
    let a = format!("{p}.self_attn");
    let bias = c.attention_bias;
    let indexer = match ix_kind {
        IndexerKind::Shared => None,
        IndexerKind::Full => {
            // The config gives a full-indexer layer only with an indexer, and an indexer only
            // with a low-rank query (its wq_b reads that residual).
            let (ix, q_lora) = m.indexer.as_ref().zip(m.q_lora_rank).ok_or_else(|| {
                EngineError::Load(format!(
                    "layer {l} has a full DSA indexer without its shape or a low-rank query"
                ))
            })?;
            let (hi, di) = (ix.index_n_heads, ix.index_head_dim);
            Some(Indexer {
                wq_b: load_linear(
                    s,
                    &format!("{a}.indexer.wq_b"),
                    hi * di,
                    q_lora,
                    dense,
                    false,
                )?,
                wk: load_linear(s, &format!("{a}.indexer.wk"), di, h, dense, false)?,
                k_norm_w: s.read_f32(&format!("{a}.indexer.k_norm.weight"), &[di])?,
                k_norm_b: s.read_f32(&format!("{a}.indexer.k_norm.bias"), &[di])?,
                weights_proj: load_linear(
                    s,
                    &format!("{a}.indexer.weights_proj"),
                    hi,
                    h,
                    QFormat::F32,
                    false,
                )?,
                n_heads: hi,
                head_dim: di,
                rope_half: ix.rope_half,
            })
        }
    };
    // No q_lora_rank is config.json's null: one unfactored q_proj (DeepSeek-V2-Lite,
    // Moonlight), which the config allows only without an indexer.
    let q = match m.q_lora_rank {
        None => QProj::Full(load_linear(
            s,
            &format!("{a}.q_proj"),
            heads * qk,
            h,
            dense,
            false,
        )?),
        Some(rank) => QProj::LowRank {
            a: load_linear(s, &format!("{a}.q_a_proj"), rank, h, dense, bias)?,
            norm: s.read_f32(&format!("{a}.q_a_layernorm.weight"), &[rank])?,
            b: load_linear(s, &format!("{a}.q_b_proj"), heads * qk, rank, dense, false)?,
        },
    };
    let attn = Attention::Mla(Box::new(Mla {
        q,
        kv_a: load_linear(
            s,
            &format!("{a}.kv_a_proj_with_mqa"),
            m.kv_lora_rank + m.qk_rope_head_dim,
            h,
            dense,
            bias,
        )?,
        kv_a_norm: s.read_f32(&format!("{a}.kv_a_layernorm.weight"), &[m.kv_lora_rank])?,
        // A GGUF's deepseek2 splits kv_b_proj in two halves: rebuilt (gguf/mla.rs).
        kv_b: match crate::gguf::mla::kv_b(
            s,
            &a,
            heads,
            (m.qk_nope_head_dim, m.v_head_dim, m.kv_lora_rank),
            dense,
        )? {
            Some(kv_b) => kv_b,
            None => load_linear(
                s,
                &format!("{a}.kv_b_proj"),
                heads * (m.qk_nope_head_dim + m.v_head_dim),
                m.kv_lora_rank,
                dense,
                false,
            )?,
        },
        o: load_linear(
            s,
            &format!("{a}.o_proj"),
            h,
            heads * m.v_head_dim,
            dense,
            bias && c.family.spec().o_proj_bias,
        )?,
        indexer,
    }));
    let mlp = |prefix: &str, inter: usize| -> Result<Mlp, EngineError> {
        Ok(Mlp {
            gate: load_linear(s, &format!("{prefix}.gate_proj"), inter, h, dense, false)?,
            up: load_linear(s, &format!("{prefix}.up_proj"), inter, h, dense, false)?,
            down: load_linear(s, &format!("{prefix}.down_proj"), h, inter, dense, false)?,
        })
    };
    mlp_kind_matches_tensors(s, c, l, mlp_kind)?;
    let ffn = match mlp_kind {
        MlpKind::Dense => Ffn::Dense(mlp(&format!("{p}.mlp"), c.intermediate_size)?),
        MlpKind::Sparse => Ffn::Moe(Moe {
            router: Router {
                weight: QMatrix::from_f32(
                    s.read_f32(&format!("{p}.mlp.gate.weight"), &[c.n_routed_experts, h])?,
                    c.n_routed_experts,
                    h,
                ),
                bias: s.read_f32(
                    &format!("{p}.mlp.gate.e_score_correction_bias"),
                    &[c.n_routed_experts],
                )?,
                kind: RouterKind::SigmoidBias,
                top_k: c.num_experts_per_tok,
                n_group: c.n_group,
                topk_group: c.topk_group,
                norm_topk_prob: c.norm_topk_prob,
                scaling: c.routed_scaling_factor,
            },
            shared_gate: None,
            shared: Some(mlp(
                &format!("{p}.mlp.shared_experts"),
                c.moe_intermediate_size * c.n_shared_experts,
            )?),
        }),
    };
    Ok(Layer {
        input_norm: s.read_f32(&format!("{p}.input_layernorm.weight"), &[h])?,
        post_norm: s.read_f32(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
        attn,
        ffn,
    })
}

/// Whether layer `l`'s feed-forward tensors are of the kind the config gives it: a dense
/// layer has `mlp.gate_proj`, a MoE layer the router `mlp.gate`. A disagreement is the
/// config's dense/sparse pattern against the checkpoint, so the error names the key that set
/// it rather than the first tensor found missing.
fn mlp_kind_matches_tensors(
    s: &ShardSet,
    c: &ModelConfig,
    l: usize,
    kind: MlpKind,
) -> Result<(), EngineError> {
    let router = format!("model.layers.{l}.mlp.gate.weight");
    let dense = format!("model.layers.{l}.mlp.gate_proj.weight");
    let found = match kind {
        MlpKind::Dense if s.contains(&router) && !s.contains(&dense) => router,
        MlpKind::Sparse if s.contains(&dense) && !s.contains(&router) => dense,
        _ => return Ok(()),
    };
    let keys = c.family.spec().dense_layer_keys;
    let (said, holds) = match kind {
        MlpKind::Dense => ("dense", "a MoE router"),
        MlpKind::Sparse => ("sparse (MoE)", "a dense MLP"),
    };
    Err(EngineError::Load(format!(
        "config.json's {keys} makes layer {l} {said}, but the checkpoint holds {holds} there \
         ({found}): the config's dense/sparse layer pattern does not match the weights"
    )))
}

/// The working buffers one layer's forward writes: the residual stream `x`, its normalised
/// copies `a` (attention input) and `m` (feed-forward input), the block output `delta`.
pub(crate) struct LayerWork<'a> {
    pub x: &'a mut [f32],
    pub a: &'a mut [f32],
    pub m: &'a mut [f32],
    pub delta: &'a mut [f32],
    pub spans: &'a [super::batch::Span],
    pub sels: &'a mut [Selection],
    pub attn: &'a mut super::scratch::AttnScratch,
    pub index: &'a mut super::scratch::IndexScratch,
    pub moe: &'a mut super::scratch::MoeScratch,
    pub mlp: &'a mut super::scratch::MlpScratch,
}

impl Layer {
    /// One decoder layer over the batch: `x += Attention(input_layernorm(x))`, then
    /// `x += Ffn(post_attention_layernorm(x))`. `(store_layer, kv_layer)`: the layer's index in
    /// `store` (its experts) and in the sequences' caches. `next`, when it is a MoE layer, is
    /// what the pilot reads ahead for.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &self,
        model: &Model,
        cx: &AttnCtx,
        (store_layer, kv_layer): (usize, usize),
        store: &ExpertStore,
        next: Option<&Layer>,
        seqs: &mut [SeqStep<'_>],
        w: LayerWork<'_>,
        on_route: &mut impl FnMut(usize, usize, &Routing),
    ) -> Result<(), EngineError> {
        if let Attention::Dsv4(b) = &self.attn {
            // Its residual is hc_mult streams a row: the layer runs its own forward.
            let layers = (store_layer, kv_layer);
            return b.forward(self, model, layers, store, next, seqs, w, on_route);
        }
        let eps = model.cfg.rms_norm_eps;
        let n = w.spans.iter().map(|s| s.n).sum::<usize>();
        w.a.copy_from_slice(w.x);
        cx.place.norm_rows(w.a, &self.input_norm, eps);
        let t = Instant::now();
        match &self.attn {
            Attention::Mla(mla) => mla.forward(
                cx, kv_layer, w.a, w.spans, seqs, w.sels, w.attn, w.index, w.delta,
            ),
            Attention::Gqa(gqa) => gqa.forward(cx, kv_layer, w.a, w.spans, seqs, w.attn, w.delta),
            Attention::Delta(dn) => dn.forward(kv_layer, w.a, w.spans, seqs, cx.act, w.delta),
            Attention::Dsv4(_) => {} // returned above
        }
        model.profile.add(Stage::Attention, t);
        w.x.iter_mut()
            .zip(w.delta.iter())
            .for_each(|(v, d)| *v += d);
        w.m.copy_from_slice(w.x);
        cx.place.norm_rows(w.m, &self.post_norm, eps);
        // Pilot: guess the next layer's experts from this hidden state and read them ahead
        // (behind this layer's own loads). Nothing computed here reaches the output.
        if store.pilot_enabled() {
            if let Some(Ffn::Moe(next)) = next.map(|x| &x.ffn) {
                let guess = next.router.predict_into(w.m, n, w.moe);
                store.prefetch(store_layer + 1, guess);
            }
        }
        let t = Instant::now();
        let act = model.opts.act;
        match &self.ffn {
            Ffn::Dense(mlp) => {
                mlp.forward(w.m, n, act, w.mlp, w.delta);
                model.profile.add(Stage::DenseMlp, t);
            }
            Ffn::Moe(moe) => {
                moe.forward(store_layer, store, w.m, n, act, w.moe, w.delta, |s, r| {
                    on_route(store_layer, s, r)
                })?;
                model.profile.add(Stage::Moe, t);
            }
        }
        w.x.iter_mut()
            .zip(w.delta.iter())
            .for_each(|(v, d)| *v += d);
        Ok(())
    }
}
