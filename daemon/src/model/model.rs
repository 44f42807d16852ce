//! The model every family runs: embedding, the decoder layers (`layer.rs`), the final norm and
//! lm_head, and the forward over a batch of sequences, as transformers computes it
//! (../shared/reference/glm_moe_dsa-forward.md for GLM-5; the other families differ only in
//! their layers' attention and router, see `config::family`).
//!
//! ```text
//! h = embed_tokens[ids]
//! for each layer: h += Attention(input_layernorm(h)); h += Ffn(post_attention_layernorm(h))
//! logits = lm_head(norm(h))
//! ```

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::batch::SeqStep;
use super::dsa_indexer::Selection;
use super::kv::KvCache;
use super::layer::{Attention, Ffn, Layer, LayerWork};
use super::linear::{load_linear, load_matrix, load_matrix_warm, ActMode, Linear};
use super::mla::{AttnCtx, AttnPath, MlaDims};
use super::moe::{Mlp, Routing};
use super::ops::rms_norm_rows;
use super::profile::{Profile, Stage};
use super::rope::Rope;
use super::scratch::{grow, Scratch};
use crate::config::{Attn, MlpKind, ModelConfig};
use crate::error::EngineError;
use crate::experts::{ExpertShape, ExpertStore, TierConfig};
use crate::gpu::Gpu;
use crate::quant::{QFormat, QMatrix};
use crate::weights::{ShardSet, Warm};

#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Routed experts.
    pub expert_fmt: QFormat,
    /// Every other matrix but the router (always f32); embedding and lm_head keep >= 8 bits.
    pub dense_fmt: QFormat,
    pub act: ActMode,
    pub attn_path: AttnPath,
    /// Overrides the config's `index_topk` (validate's `--index-topk`).
    pub index_topk: Option<usize>,
    /// Quantize, then keep the dequantized values as f32 weights: the f32 model "on the same
    /// weights" that quantized outputs are measured against.
    pub fake_quant: bool,
    /// Expert tiers: cache, pins, I/O mode, pipe, pilot (`--cache`, `--pin`, `--direct`, ...).
    pub tiers: TierConfig,
    /// Load the MTP head when the checkpoint has one (`MTP=0` turns it off).
    pub mtp: bool,
    /// Most drafted tokens per decode step (`--draft`, 0: no speculative decoding).
    pub draft: usize,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            expert_fmt: QFormat::F32,
            dense_fmt: QFormat::F32,
            act: ActMode::F32,
            attn_path: AttnPath::Auto,
            index_topk: None,
            fake_quant: false,
            tiers: TierConfig::default(),
            mtp: true,
            draft: 0,
        }
    }
}

pub struct Model {
    pub cfg: ModelConfig,
    pub opts: LoadOptions,
    embed: QMatrix,
    layers: Vec<Layer>,
    final_norm: Vec<f32>,
    lm_head: Linear,
    rope: Rope,
    pub experts: ExpertStore,
    /// The MTP head, when the checkpoint has one and `LoadOptions::mtp` asks for it.
    pub mtp: Option<super::mtp::Mtp>,
    /// DeepSeek-V4's final fold of its `hc_mult` residual streams into one (`None` for the
    /// families with one stream).
    hc_head: Option<super::dsv4_hc::HyperHead>,
    pub profile: Profile,
    /// Where attention, the norms and the dense weights run (`placement`).
    place: super::placement::Placement,
    /// The forward's working memory (see `scratch`). Locked for a whole forward: forwards of
    /// one model run one at a time.
    scratch: Mutex<Scratch>,
    /// The shards the dense matrices are read in place from: each forward first checks that
    /// none was cut short under them (`weights::in_place`).
    shards: Arc<ShardSet>,
}

/// Which positions of a forward need logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    Last,
    All,
    /// None (a prefill chunk that is not a prompt's last).
    None,
}

impl Model {
    pub fn load(
        cfg: ModelConfig,
        shards: Arc<ShardSet>,
        opts: LoadOptions,
    ) -> Result<Model, EngineError> {
        let c = &cfg;
        if c.oss.is_some() {
            super::gpt_oss::check_tensors(&shards, c)?;
        }
        let dense = opts.dense_fmt;
        // Embedding and lm_head keep at least 8 bits: at 4 bits the logits lose their ordering.
        let io_fmt = if dense.bits() < 8 {
            QFormat::I8Row
        } else {
            dense
        };
        let s = &*shards;
        let sparse: Vec<bool> = c
            .mlp_layer_types
            .iter()
            .map(|k| *k == MlpKind::Sparse)
            .collect();
        // The experts first: how they are read decides whether the dense part may stay in the
        // page cache's pages (`weights::in_place`). Their error, if any, waits for the dense
        // part's loads, whose errors name what is missing first (the embedding, a layer
        // pattern against the config's key), as before.
        let experts = ExpertStore::new(
            shards.clone(),
            &sparse,
            ExpertShape {
                n_experts: c.n_routed_experts,
                top_k: c.num_experts_per_tok,
                hidden: c.hidden_size,
                inter: c.moe_intermediate_size,
                oss: c.oss.as_ref().map(|o| (o.swiglu_alpha, o.swiglu_limit)),
                dsv4_limit: c.dsv4().map(|d| d.swiglu_limit),
            },
            opts.expert_fmt,
            opts.fake_quant,
            &opts.tiers,
        );
        if let Ok(e) = &experts {
            if !e.io_choice().keeps_dense_pages() && s.in_place_allowed() {
                s.copy_dense();
                crate::elog!(
                    "[load] dense weights copied, not read in place: {}",
                    e.io_choice().why_dense_is_copied()
                );
            }
        }
        // A token reads one row of it: read in place, its pages map as rows are read rather
        // than all at load (unless it is also the lm_head, below).
        let embed = load_matrix_warm(
            s,
            "model.embed_tokens.weight",
            c.vocab_size,
            c.hidden_size,
            io_fmt,
            Warm::ByRows,
        )?;
        // DeepSeek-V4's transformers checkpoints name the output head `head`.
        let head_name = match c.dsv4().is_some() && s.contains("head.weight") {
            true => "head",
            false => "lm_head",
        };
        let lm_head = if c.tie_word_embeddings && !s.contains("lm_head.weight") {
            Linear {
                w: load_matrix(
                    s,
                    "model.embed_tokens.weight",
                    c.vocab_size,
                    c.hidden_size,
                    io_fmt,
                )?,
                bias: None,
                slot: Default::default(),
            }
        } else {
            load_linear(s, head_name, c.vocab_size, c.hidden_size, io_fmt, false)?
        };
        let hc_head = match c.dsv4() {
            Some(d) => Some(super::dsv4_hc::HyperHead::load(
                s,
                d.hc_mult,
                c.hidden_size,
                d.hc_eps,
                c.rms_norm_eps,
            )?),
            None => None,
        };
        let h = c.hidden_size;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for l in 0..c.num_hidden_layers {
            let (ix, mlp) = (c.indexer_kind(l), c.mlp_layer_types[l]);
            layers.push(super::layer::load(s, c, l, dense, ix, mlp)?);
        }
        let final_norm = match c.hybrid() {
            // Qwen3.5-MoE's RMSNorm is zero-centred: x * (1 + w).
            Some(_) => super::qwen35::centred_norm(s, "model.norm", h)?,
            None => s.read_f32("model.norm.weight", &[h])?,
        };
        let experts = experts?;
        let mtp = if opts.mtp && opts.draft > 0 && super::mtp::Mtp::present(s, c) {
            let fmt = super::mtp::Mtp::format_for(opts.dense_fmt);
            Some(super::mtp::Mtp::load(
                &shards,
                c,
                fmt,
                opts.fake_quant,
                &lm_head,
            )?)
        } else {
            None
        };
        // The rotated width: MLA's rope part, or grouped-query attention's rotary share of a
        // head (YaRN's ramp runs over that width, as transformers' `dim` is).
        let rope_dim = match &c.attn {
            Attn::Mla(m) => m.qk_rope_head_dim,
            Attn::Gqa(g) => g.rotary_dim,
            Attn::Hybrid(hy) => hy.gqa.rotary_dim,
            Attn::Dsv4(d) => d.rope_dim,
        };
        let rope = match c.yarn {
            Some(y) => Rope::yarn(rope_dim, c.rope_theta, &y),
            None => Rope::new(rope_dim, c.rope_theta),
        };
        let scratch = Mutex::new(Scratch::new(c, opts.index_topk.unwrap_or(c.index_topk())));
        // f32 weights (or fake-quantized ones) take f32 activations whatever `act` says.
        let int8 = opts.act == ActMode::Int8 && opts.dense_fmt != QFormat::F32 && !opts.fake_quant;
        let place = super::placement::Placement::open(&opts.tiers, c, int8);
        let mut model = Model {
            shards,
            cfg,
            opts,
            embed,
            layers,
            final_norm,
            lm_head,
            rope,
            experts,
            mtp,
            hc_head,
            profile: Profile::default(),
            place,
            scratch,
        };
        if model.opts.fake_quant {
            model.embed = QMatrix::from_f32(
                model.embed.dequantize(),
                model.embed.rows(),
                model.embed.cols(),
            );
            model.for_each_linear(|l| {
                l.w = QMatrix::from_f32(l.w.dequantize(), l.w.rows(), l.w.cols())
            });
        }
        model.place_dense_in_vram();
        Ok(model)
    }

    /// `--vram-gb` with an adapter `--gpu` allows: every dense projection goes to VRAM first,
    /// in `for_each_linear`'s order while it fits; the expert tier gets what is left.
    fn place_dense_in_vram(&mut self) {
        // The absorbed MLA core on the device reads kv_b dequantized to f32.
        let kv_b: usize = self
            .layers
            .iter()
            .filter_map(|l| match &l.attn {
                Attention::Mla(a) => Some(a.kv_b.out_dim() * a.kv_b.in_dim() * 4),
                Attention::Gqa(_) | Attention::Delta(_) | Attention::Dsv4(_) => None,
            })
            .sum();
        let Some(mut placer) = self.place.dense_placer(&self.opts.tiers, kv_b as u64) else {
            return;
        };
        self.for_each_linear(|l| placer.offer(&l.w, &mut l.slot));
        let placed = self.place.dense_placed(placer);
        self.experts.set_dense_vram(placed);
    }

    /// The device the dense weights are on, when they are.
    pub fn gpu(&self) -> Option<&Arc<Gpu>> {
        self.place.dense_gpu()
    }

    fn for_each_linear(&mut self, mut f: impl FnMut(&mut Linear)) {
        f(&mut self.lm_head);
        for layer in &mut self.layers {
            match &mut layer.attn {
                Attention::Mla(a) => {
                    for l in a.q.linears_mut() {
                        f(l);
                    }
                    for l in [&mut a.kv_a, &mut a.kv_b, &mut a.o] {
                        f(l);
                    }
                    if let Some(ix) = &mut a.indexer {
                        f(&mut ix.wq_b);
                        f(&mut ix.wk);
                    }
                }
                Attention::Gqa(a) => {
                    for l in [&mut a.q, &mut a.k, &mut a.v, &mut a.o] {
                        f(l);
                    }
                }
                Attention::Delta(a) => {
                    for l in [
                        &mut a.in_qkv,
                        &mut a.in_z,
                        &mut a.in_b,
                        &mut a.in_a,
                        &mut a.out,
                    ] {
                        f(l);
                    }
                }
                // Its attention's projections stay on the CPU (the device has no V4 core).
                Attention::Dsv4(_) => {}
            }
            let mlp = match &mut layer.ffn {
                Ffn::Dense(m) => Some(m),
                Ffn::Moe(m) => m.shared.as_mut(),
            };
            if let Some(mlp) = mlp {
                for l in [&mut mlp.gate, &mut mlp.up, &mut mlp.down] {
                    f(l);
                }
            }
        }
    }

    pub fn new_cache(&self) -> KvCache {
        KvCache::new(&self.cfg)
    }

    /// Makes room for `positions` cached positions in `kv` and in the forward's working memory,
    /// so one-token steps up to that context do not allocate (amortized growth would still
    /// reallocate now and then).
    pub fn reserve(&self, kv: &mut KvCache, positions: usize) {
        kv.reserve(positions);
        self.scratch.lock().reserve_context(&self.cfg, positions);
    }

    /// Returns the forward's working memory to its decode-step size after a prefill chunk
    /// longer than [`crate::experts::chunk::DECODE_CHUNK`] rows ([`Scratch::shed_rows`]).
    pub fn shed_batch_rows(&self) {
        self.scratch.lock().shed_rows(&self.cfg, self.index_topk());
    }

    /// The embedding row of token `t` (in range: the caller checked it).
    pub(crate) fn embed_row(&self, t: u32, out: &mut [f32]) {
        self.embed.dequant_row(t as usize, out);
    }

    pub(crate) fn lm_head(&self) -> &Linear {
        &self.lm_head
    }

    /// What every layer's attention needs besides its weights; `index_topk` is the DSA
    /// indexer's selection size (the MTP head keeps the checkpoint's).
    pub(crate) fn attn_ctx(&self, index_topk: usize) -> AttnCtx<'_> {
        let c = &self.cfg;
        // Only MLA layers read the dims: a grouped-query model's are empty.
        let m = c.mla();
        AttnCtx {
            dims: MlaDims {
                heads: c.num_attention_heads,
                nope: m.map_or(0, |m| m.qk_nope_head_dim),
                rope: m.map_or(0, |m| m.qk_rope_head_dim),
                v: m.map_or(0, |m| m.v_head_dim),
                kv_lora: m.map_or(0, |m| m.kv_lora_rank),
                // MLA's only: transformers' grouped-query attentions keep head_dim^-1/2.
                softmax_factor: match (m, c.yarn) {
                    (Some(_), Some(y)) => y.softmax_factor() as f32,
                    _ => 1.0,
                },
                interleave: m.is_none_or(|m| m.rope_interleave),
            },
            rope: &self.rope,
            index_topk,
            path: self.opts.attn_path,
            act: self.opts.act,
            place: &self.place,
        }
    }

    pub fn index_topk(&self) -> usize {
        self.opts.index_topk.unwrap_or(self.cfg.index_topk())
    }

    /// The format the dense projections compute in: a pre-quantized container's stored one,
    /// else `--dense-bits` (read off the first layer's o_proj, which every family has).
    pub fn dense_format(&self) -> QFormat {
        if self.opts.fake_quant {
            // Quantized and decoded back to f32 at load: the values are `--dense-bits`'.
            return self.opts.dense_fmt;
        }
        match self.layers.first().map(|l| &l.attn) {
            Some(Attention::Mla(a)) => a.o.w.format(),
            Some(Attention::Gqa(a)) => a.o.w.format(),
            Some(Attention::Delta(a)) => a.out.w.format(),
            Some(Attention::Dsv4(b)) => b.out_format(),
            None => self.opts.dense_fmt,
        }
    }

    /// The DSA indexer's cuts on the CPU since the last call (the GPU's selections are not
    /// counted), and a fresh count from here.
    pub fn take_index_cuts(&self) -> super::scratch::IndexCuts {
        std::mem::take(&mut self.scratch.lock().index.cuts)
    }

    /// `f(matrix, bias length)` summed over every matrix of the decoder layers (attention,
    /// indexer, dense MLP or shared expert and router), not the embedding or lm_head.
    fn sum_layer_matrices(&self, f: impl Fn(&QMatrix, usize) -> u64) -> u64 {
        let lin = |l: &Linear| f(&l.w, l.bias.as_ref().map_or(0, Vec::len));
        let mut total = 0;
        let mlp = |m: &Mlp| lin(&m.gate) + lin(&m.up) + lin(&m.down);
        for layer in &self.layers {
            total += match &layer.attn {
                Attention::Mla(a) => {
                    a.q.linears().into_iter().map(lin).sum::<u64>()
                        + lin(&a.kv_a)
                        + lin(&a.kv_b)
                        + lin(&a.o)
                        + a.indexer
                            .as_ref()
                            .map_or(0, |ix| lin(&ix.wq_b) + lin(&ix.wk) + lin(&ix.weights_proj))
                }
                Attention::Gqa(a) => lin(&a.q) + lin(&a.k) + lin(&a.v) + lin(&a.o),
                Attention::Delta(a) => {
                    lin(&a.in_qkv) + lin(&a.in_z) + lin(&a.in_b) + lin(&a.in_a) + lin(&a.out)
                }
                // Its projections; its f32 tensors are counted apart (`dsv4_layer::counts`).
                Attention::Dsv4(b) => b.linears().into_iter().map(lin).sum(),
            };
            total += match &layer.ffn {
                Ffn::Dense(m) => mlp(m),
                Ffn::Moe(m) => m.shared.as_ref().map_or(0, mlp) + f(&m.router.weight, 0),
            };
        }
        total
    }

    /// Resident bytes of the dense (non-expert) weights.
    pub fn dense_bytes(&self) -> usize {
        let bytes = |w: &QMatrix, bias: usize| (w.resident_bytes() + bias * 4) as u64;
        let io = self.embed.resident_bytes()
            + bytes(
                &self.lm_head.w,
                self.lm_head.bias.as_ref().map_or(0, Vec::len),
            ) as usize
            + self.final_norm.len() * 4;
        // DeepSeek-V4's f32 matrices and tables outside `Linear`, and its streams' final fold.
        let v4 = super::dsv4_layer::counts(&self.layers).0
            + self.hc_head.as_ref().map_or(0, |h| h.values());
        io + self.sum_layer_matrices(bytes) as usize + 4 * v4 as usize
    }

    /// Multiply-accumulates of one prefill position in the weight products (every dense
    /// matrix but the embedding and lm_head, which only the last position needs, and
    /// `num_experts_per_tok` routed experts per MoE layer); the attention core over the keys,
    /// which grows with the context, is left out.
    pub fn prefill_macs_per_position(&self) -> u64 {
        let c = &self.cfg;
        let experts = c.n_sparse_layers()
            * c.num_experts_per_tok
            * 3
            * c.moe_intermediate_size
            * c.hidden_size;
        self.sum_layer_matrices(|w, _| (w.rows() * w.cols()) as u64)
            + experts as u64
            + super::dsv4_layer::counts(&self.layers).1
    }

    /// Weight bytes one decode step reads: every dense matrix once, lm_head, and
    /// `num_experts_per_tok` routed experts per MoE layer (the embedding reads one row).
    pub fn decode_weight_bytes_per_token(&self) -> usize {
        let c = &self.cfg;
        self.dense_bytes() - self.embed.resident_bytes()
            + c.n_sparse_layers() * c.num_experts_per_tok * self.experts.expert_bytes() as usize
    }

    /// Runs `tokens` at positions `kv.len()..`, appending their keys to `kv`, and returns the
    /// logits of the last position or of all of them (`(n, vocab)` row-major). Allocates the
    /// returned vector: loops use [`Model::forward_into`].
    pub fn forward(
        &self,
        kv: &mut KvCache,
        tokens: &[u32],
        which: Logits,
    ) -> Result<Vec<f32>, EngineError> {
        let mut logits = Vec::new();
        self.forward_into(kv, tokens, which, &mut logits)?;
        Ok(logits)
    }

    /// `forward`, writing the logits to `logits` (resized to fit; no allocation once it has
    /// the capacity).
    pub fn forward_into(
        &self,
        kv: &mut KvCache,
        tokens: &[u32],
        which: Logits,
        logits: &mut Vec<f32>,
    ) -> Result<(), EngineError> {
        // The step runs on a rayon worker, so each of its parallel regions forks from inside
        // the pool (onto the worker's own deque, for the other worker to take) rather than
        // being injected from outside and waited for.
        if rayon::current_thread_index().is_none() {
            return rayon::join(|| self.forward_into(kv, tokens, which, logits), || ()).0;
        }
        self.forward_traced(kv, tokens, which, logits, |_, _, _| {})
    }

    /// `forward_into`, reporting every routing decision as `(layer, row, routing)`.
    pub fn forward_traced(
        &self,
        kv: &mut KvCache,
        tokens: &[u32],
        which: Logits,
        logits: &mut Vec<f32>,
        on_route: impl FnMut(usize, usize, &Routing),
    ) -> Result<(), EngineError> {
        let mut seqs = [SeqStep {
            kv,
            tokens,
            logits: which,
        }];
        self.forward_batch_traced(&mut seqs, logits, on_route)
    }

    /// One forward over several sequences: each `seqs[i]` feeds its tokens after what its
    /// cache holds. The logits come back in sequence order, [`SeqStep::logit_rows`] rows of
    /// `vocab` each. Every sequence's logits are bit-identical to a forward of it alone (see
    /// `batch`); what the batch saves is reading each weight once for all of them.
    pub fn forward_batch(
        &self,
        seqs: &mut [SeqStep<'_>],
        logits: &mut Vec<f32>,
    ) -> Result<(), EngineError> {
        if rayon::current_thread_index().is_none() {
            return rayon::join(|| self.forward_batch(seqs, logits), || ()).0;
        }
        self.forward_batch_traced(seqs, logits, |_, _, _| {})
    }

    /// `forward_batch`, reporting every routing decision as `(layer, batch row, routing)`.
    pub fn forward_batch_traced(
        &self,
        seqs: &mut [SeqStep<'_>],
        logits: &mut Vec<f32>,
        on_route: impl FnMut(usize, usize, &Routing),
    ) -> Result<(), EngineError> {
        self.forward_batch_full(seqs, logits, None, on_route)
    }

    /// `forward_batch`, also handing back every row's last hidden state (the residual stream
    /// before the final norm, `(rows, hidden)` in batch order) in `hidden`: what the MTP head
    /// reads.
    pub fn forward_batch_hidden(
        &self,
        seqs: &mut [SeqStep<'_>],
        logits: &mut Vec<f32>,
        hidden: &mut Vec<f32>,
    ) -> Result<(), EngineError> {
        if rayon::current_thread_index().is_none() {
            return rayon::join(|| self.forward_batch_hidden(seqs, logits, hidden), || ()).0;
        }
        self.forward_batch_full(seqs, logits, Some(hidden), |_, _, _| {})
    }

    fn forward_batch_full(
        &self,
        seqs: &mut [SeqStep<'_>],
        logits: &mut Vec<f32>,
        hidden: Option<&mut Vec<f32>>,
        mut on_route: impl FnMut(usize, usize, &Routing),
    ) -> Result<(), EngineError> {
        let c = &self.cfg;
        let h = c.hidden_size;
        if seqs.is_empty() || seqs.iter().any(|s| s.tokens.is_empty()) {
            return Err(EngineError::EmptyForward);
        }
        // Before any weight is read: a shard cut short fails the forward here, naming the
        // file, rather than reading past its end (SIGBUS, fatal).
        self.shards.check_in_place()?;
        let mut guard = self.scratch.lock();
        let Scratch {
            x,
            a,
            m,
            delta,
            sels,
            spans,
            head_rows,
            attn: attn_sc,
            index: index_sc,
            moe: moe_sc,
            mlp: mlp_sc,
            context: _,
        } = &mut *guard;
        let n = super::batch::spans_of(seqs, spans);
        self.experts.begin_forward(n);
        // DeepSeek-V4's residual is hc_mult streams a row, each starting as the embedding.
        let hc = c.dsv4().map_or(1, |d| d.hc_mult);
        let x = grow(x, n * hc * h);
        let tokens = seqs.iter().flat_map(|s| s.tokens.iter());
        for (row, &t) in x.chunks_exact_mut(hc * h).zip(tokens) {
            if t as usize >= c.vocab_size {
                return Err(EngineError::TokenOutOfVocab {
                    token: t,
                    vocab: c.vocab_size,
                });
            }
            let (first, rest) = row.split_at_mut(h);
            self.embed.dequant_row(t as usize, first);
            rest.chunks_exact_mut(h)
                .for_each(|s| s.copy_from_slice(first));
        }
        let cx = self.attn_ctx(self.index_topk());
        if sels.len() < seqs.len() {
            sels.resize_with(seqs.len(), Selection::default);
        }
        let sels = &mut sels[..seqs.len()];
        sels.iter_mut().for_each(Selection::clear);
        // The normalised copies of the residual stream, reused by every layer, and the block
        // output added to it.
        let a = grow(a, n * h);
        let m = grow(m, n * h);
        let delta = grow(delta, n * h);
        for (l, layer) in self.layers.iter().enumerate() {
            let ws = LayerWork {
                x: &mut *x,
                a: &mut *a,
                m: &mut *m,
                delta: &mut *delta,
                spans,
                sels: &mut *sels,
                attn: &mut *attn_sc,
                index: &mut *index_sc,
                moe: &mut *moe_sc,
                mlp: &mut *mlp_sc,
            };
            let next = self.layers.get(l + 1);
            let r = layer.forward(
                self,
                &cx,
                (l, l),
                &self.experts,
                next,
                seqs,
                ws,
                &mut on_route,
            );
            if let Err(e) = r {
                attn_sc.release_context();
                seqs.iter_mut().for_each(|s| s.kv.rollback());
                return Err(e);
            }
        }
        // The reconstruct path's keys and values served every layer of this forward; they
        // scale with the context, so they are not kept for the next.
        attn_sc.release_context();
        if let Some(head) = &self.hc_head {
            head.fold_rows(x, n, h, &mut attn_sc.dsv4.hc);
        }
        let x = &mut x[..n * h];
        if let Some(hidden) = hidden {
            hidden.clear();
            hidden.extend_from_slice(x);
        }
        for s in seqs.iter_mut() {
            s.kv.commit(s.tokens);
        }
        // The rows that need logits, in sequence order: the whole stream when every sequence
        // wants all of its rows, else gathered.
        let rows: &mut [f32] = if seqs.iter().all(|s| s.logits == Logits::All) {
            &mut x[..]
        } else {
            let m: usize = seqs.iter().map(SeqStep::logit_rows).sum();
            let out = grow(head_rows, m * h);
            let mut at = 0;
            for (s, span) in seqs.iter().zip(spans.iter()) {
                let k = s.logit_rows();
                let from = (span.start + span.n - k) * h;
                out[at..at + k * h].copy_from_slice(&x[from..from + k * h]);
                at += k * h;
            }
            out
        };
        let m = rows.len() / h;
        if m == 0 {
            logits.clear();
            return Ok(());
        }
        rms_norm_rows(rows, &self.final_norm, c.rms_norm_eps);
        let t = Instant::now();
        // Every value is overwritten by the product: resizing only sets the length.
        logits.resize(m * self.lm_head.out_dim(), 0.0);
        self.lm_head.forward(rows, m, logits, self.opts.act);
        self.profile.add(Stage::LmHead, t);
        Ok(())
    }
}
