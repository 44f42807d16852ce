//! The forward's working memory, kept between calls so a decode step never touches the heap.
//!
//! Every per-forward buffer lives here: the residual stream and its normalised copies,
//! attention intermediates (with one block per head for the head-parallel loop), the DSA
//! indexer's scores and keep lists, MoE routing and the per-expert products, the SwiGLU
//! intermediates. [`Scratch::new`] sizes it for a one-row decode step; a larger batch (prefill)
//! or a longer context grows a buffer on first need and it stays that size (grow-only), so
//! after the first step at a given shape nothing is allocated. [`Scratch::reserve_context`]
//! sizes the context-dependent parts ahead of a generation, because amortized growth would
//! still reallocate now and then in the middle of decode.
//!
//! Buffers are handed out with [`grow`] (contents unspecified: the caller overwrites them) or
//! [`zeroed`] (for accumulators), always cut to the exact length the step needs, so the
//! arithmetic never sees a stale or differently sized buffer.
//!
//! Not here, on purpose: the reconstruct attention path's `(context, heads, nope + v)`
//! expansion of the whole cache (the RAM clamp's "k/v rebuild buffer"). It scales with the
//! context, not the batch, and `AttnPath::Auto` takes that path only for batches that are
//! large against the context (prefill), never for a one-token step past the first position;
//! held between calls it would keep gigabytes resident at long contexts for no decode gain.
//! So a decode step forced onto that path (`AttnPath::Reconstruct`) still allocates.
//!
//! What is here stays at the largest batch seen up to 256 rows: on the order of 0.2 GB for
//! GLM-5-sized layers, the peak the per-call vectors reached before. The chunk is longer where
//! the experts stream from disk (`experts/chunk.rs`), [`batch_row_bytes`] is what each of its
//! rows adds, which the expert cache gives up while such a chunk runs; after it the engine
//! calls [`Scratch::shed_rows`], so decode runs with the cache whole.

use super::batch::Span;
use super::dsa_indexer::Selection;
use super::moe::Routing;
use crate::config::{MlpKind, ModelConfig};
use crate::experts::run::RunScratch;

pub(crate) use crate::experts::run::grow;

/// `buf[..len]` set to zero: for accumulators.
pub(crate) fn zeroed(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    let s = grow(buf, len);
    s.fill(0.0);
    s
}

/// Bytes the buffers here grow by for each row of a batch, with the floats per row of every
/// buffer that scales with the rows (the context-sized ones scale with the context, which the
/// RAM budget's k/v buffer and KV pool count): the residual stream and its copies, the
/// attention's projections, the router's scores and the per-expert products (each row's
/// `top_k` gathered inputs, gate and up outputs and products), the shared and dense MLPs'
/// intermediates. An upper bound: each buffer at its widest layer kind, all at once.
pub fn batch_row_bytes(cfg: &ModelConfig) -> u64 {
    use crate::config::Attn;
    let c = cfg;
    let (h, heads) = (c.hidden_size, c.num_attention_heads);
    let gqa = |g: &crate::config::GqaConfig| 5 * heads * g.head_dim + 2 * g.kv_heads * g.head_dim;
    let index = c.indexer().map_or(0, |ix| {
        ix.index_n_heads * (ix.index_head_dim + 1) + ix.index_head_dim
    });
    let (attn, streams) = match &c.attn {
        Attn::Gqa(g) => (gqa(g), 1),
        // The DeltaNet layers' projections are within a few hidden widths of the gated
        // attention's.
        Attn::Hybrid(x) => (gqa(&x.gqa).max(8 * h), 1),
        Attn::Mla(m) => (
            m.q_lora_rank.unwrap_or(0)
                + heads * (m.qk_head_dim() + 2 * m.v_head_dim)
                + m.kv_lora_rank
                + m.qk_rope_head_dim,
            1,
        ),
        Attn::Dsv4(d) => (
            4 * heads * d.head_dim + d.q_lora_rank + d.o_lora_rank,
            d.hc_mult,
        ),
    };
    // x, a, m, delta, the hidden rows kept for drafts, the int8 copy of a row (a quarter).
    let residual = 6 * h * streams.max(1);
    let k = c.num_experts_per_tok;
    let moe = if c.mlp_layer_types.contains(&MlpKind::Sparse) {
        let shared = c.moe_intermediate_size * c.n_shared_experts;
        k * (2 * h + 2 * c.moe_intermediate_size) + c.n_routed_experts + 3 * shared + h
    } else {
        0
    };
    let dense = if c.mlp_layer_types.contains(&MlpKind::Dense) {
        2 * c.intermediate_size
    } else {
        0
    };
    4 * (residual + attn + index + moe + dense) as u64
}

/// Multi-head latent attention.
#[derive(Default)]
pub(crate) struct AttnScratch {
    /// (n, q_lora)
    pub q_resid: Vec<f32>,
    /// (n, heads, nope + rope)
    pub q: Vec<f32>,
    /// (n, kv_lora + rope)
    pub ckv: Vec<f32>,
    /// (heads, n, v): one block per head-parallel task.
    pub by_head: Vec<f32>,
    /// (n, heads * v): what o_proj reads.
    pub heads_out: Vec<f32>,
    /// One block per head for the head-parallel loop (see `mla::head_block_len`): q_lat and
    /// ctx_lat of the absorbed path, and the softmax probabilities. Indexed by head, not by thread, so work stealing cannot make two tasks
    /// share a block or make a worker allocate its own.
    pub heads: Vec<f32>,
    /// The absorbed path's scores of one row, (key chunk, head, key).
    pub tile: Vec<f32>,
    /// The absorbed path's weighted latent sums of one row, (column stripe, head, column).
    pub stripes: Vec<f32>,
    /// The reconstruct path's per-head blocks with each head's keys and values of the whole
    /// context: emptied after every forward ([`AttnScratch::release_context`]), as it scales
    /// with the context (see the module's note), but kept from layer to layer within one,
    /// which spares a prefill chunk's every layer the page faults of fresh memory.
    pub rebuild: Vec<f32>,
    /// DeepSeek-V4's layers' own (`dsv4_attn.rs`).
    pub dsv4: super::dsv4_attn::Dsv4Scratch,
}

impl AttnScratch {
    /// Frees what scales with the context (`rebuild`).
    pub fn release_context(&mut self) {
        self.rebuild = Vec::new();
    }
}

/// The DSA indexer of full layers.
#[derive(Default)]
pub(crate) struct IndexScratch {
    /// (n, index_heads, index_dim)
    pub q: Vec<f32>,
    /// (n, index_dim)
    pub k: Vec<f32>,
    /// (n, index_heads)
    pub w: Vec<f32>,
    /// `(score, key)` of one query row over every visible key.
    pub scores: Vec<(f32, usize)>,
    /// The same scores as computed, by key (filled in parallel).
    pub key_scores: Vec<f32>,
    /// What the CPU's selections met at their cut since [`Model::take_index_cuts`].
    ///
    /// [`Model::take_index_cuts`]: super::Model::take_index_cuts
    pub cuts: IndexCuts,
}

/// The DSA indexer's top-k cuts, counted per row of a full layer that selects (more visible
/// keys than `index_topk`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexCuts {
    /// Rows (layer x position) that selected.
    pub rows: u64,
    /// Of those, rows whose `index_topk`-th best score equals the best score left out: the
    /// cut falls inside a tie, which the selection settles by its rule (earliest key first)
    /// where torch.topk settles it arbitrarily.
    pub ties: u64,
}

/// Router and expert bookkeeping of a MoE layer.
#[derive(Default)]
pub(crate) struct MoeScratch {
    /// One routing per row; kept so each row's expert/weight lists are reused.
    pub routes: Vec<Routing>,
    /// Router sigmoid scores and the expert order of one row.
    pub scores: Vec<f32>,
    pub order: Vec<usize>,
    /// `(row, weight)` pairs grouped by expert, ascending expert then ascending row: expert
    /// `e` owns `pairs[start[e]..start[e + 1]]`.
    pub pairs: Vec<(usize, f32)>,
    /// n_experts + 1 prefix offsets into `pairs`.
    pub start: Vec<usize>,
    /// The next free slot of each expert while `pairs` is filled.
    pub cursor: Vec<usize>,
    /// Experts with at least one row, ascending.
    pub wanted: Vec<usize>,
    /// The pilot's guess of the next layer's experts: one row's routing, the best rank any
    /// row gave each expert (`u32::MAX`: none), and the picked ones as `(expert, rank)`.
    pub guess: Routing,
    pub best_rank: Vec<u32>,
    pub guessed: Vec<(usize, usize)>,
    /// The shared expert's gate then up outputs of a decode row, computed with the router's
    /// logits (`Moe::forward`).
    pub shared_gu: Vec<f32>,
    /// The routed experts' products and the shared expert's output.
    pub run: RunScratch,
    /// A gated shared expert's (Qwen3.5-MoE) SwiGLU intermediates and output, `(n, hidden)`:
    /// it runs beside the store, so its buffers are the model's like every other.
    pub gated: MlpScratch,
    pub gated_out: Vec<f32>,
    /// Cache-aware routing: whether each expert of the layer being routed is resident.
    pub resident: Vec<bool>,
}

/// SwiGLU intermediates of a dense MLP.
#[derive(Default)]
pub(crate) struct MlpScratch {
    pub g: Vec<f32>,
    pub u: Vec<f32>,
}

/// Everything one forward needs besides the weights, the KV cache and the logits.
#[derive(Default)]
pub(crate) struct Scratch {
    /// The residual stream, (n, hidden).
    pub x: Vec<f32>,
    /// input_layernorm(x) and post_attention_layernorm(x).
    pub a: Vec<f32>,
    pub m: Vec<f32>,
    /// The attention or feed-forward output added to `x`.
    pub delta: Vec<f32>,
    /// Each sequence's DSA selection, carried from a full layer to the shared layers after it.
    pub sels: Vec<Selection>,
    /// Where each sequence's rows sit in the batch.
    pub spans: Vec<Span>,
    /// The rows that need logits, gathered for lm_head, (rows, hidden).
    pub head_rows: Vec<f32>,
    pub attn: AttnScratch,
    pub index: IndexScratch,
    pub moe: MoeScratch,
    pub mlp: MlpScratch,
    /// The most cached positions [`Scratch::reserve_context`] was asked for, kept so that
    /// [`Scratch::shed_rows`] can size the fresh buffers the same.
    pub(super) context: usize,
}

impl Scratch {
    /// Sized for a one-row decode step of `cfg` (the context-dependent parts are sized by
    /// [`Scratch::reserve_context`]).
    pub fn new(cfg: &ModelConfig, index_topk: usize) -> Scratch {
        let c = cfg;
        let h = c.hidden_size;
        let heads = c.num_attention_heads;
        // MLA's buffers and the indexer's; a grouped-query model grows its own as it goes.
        let (q_lora, kv_lora, rope, qk, v) = c.mla().map_or((0, 0, 0, 0, 0), |m| {
            let q_lora = m.q_lora_rank.unwrap_or(0);
            (
                q_lora,
                m.kv_lora_rank,
                m.qk_rope_head_dim,
                m.qk_head_dim(),
                m.v_head_dim,
            )
        });
        let (ix_heads, ix_dim) = c
            .indexer()
            .map_or((0, 0), |ix| (ix.index_n_heads, ix.index_head_dim));
        let top_k = c.num_experts_per_tok;
        let ne = c.n_routed_experts;
        let sparse = c.mlp_layer_types.contains(&MlpKind::Sparse);
        let dense = c.mlp_layer_types.contains(&MlpKind::Dense);
        let inter = [
            if dense { c.intermediate_size } else { 0 },
            if sparse {
                c.moe_intermediate_size * c.n_shared_experts.max(1)
            } else {
                0
            },
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        let f = |len: usize| vec![0.0f32; len];
        let moe = if sparse {
            MoeScratch {
                routes: vec![Routing {
                    experts: Vec::with_capacity(top_k),
                    weights: Vec::with_capacity(top_k),
                }],
                scores: Vec::with_capacity(ne),
                order: Vec::with_capacity(ne),
                pairs: vec![(0, 0.0); top_k],
                start: vec![0; ne + 1],
                cursor: vec![0; ne],
                wanted: Vec::with_capacity(top_k),
                guess: Routing {
                    experts: Vec::with_capacity(top_k),
                    weights: Vec::with_capacity(top_k),
                },
                best_rank: vec![u32::MAX; ne],
                guessed: Vec::with_capacity(top_k),
                shared_gu: f(2 * c.moe_intermediate_size * c.n_shared_experts),
                run: RunScratch::for_decode(h, ne, top_k, c.moe_intermediate_size, inter),
                // Sized by the prompt's prefill, which always runs before a decode step.
                gated: MlpScratch::default(),
                gated_out: Vec::new(),
                resident: Vec::with_capacity(ne),
            }
        } else {
            MoeScratch::default()
        };
        let mut s = Scratch {
            x: f(h),
            a: f(h),
            m: f(h),
            delta: f(h),
            sels: vec![Selection::with_capacity(1, index_topk)],
            spans: Vec::with_capacity(1),
            head_rows: f(h),
            attn: AttnScratch {
                q_resid: f(q_lora),
                q: f(heads * qk),
                ckv: f(kv_lora + rope),
                by_head: f(heads * v),
                heads_out: f(heads * v),
                heads: Vec::new(),
                tile: Vec::new(),
                stripes: f(heads * kv_lora),
                rebuild: Vec::new(),
                dsv4: Default::default(),
            },
            index: IndexScratch {
                q: f(ix_heads * ix_dim),
                k: f(ix_dim),
                w: f(ix_heads),
                scores: Vec::new(),
                key_scores: Vec::new(),
                cuts: IndexCuts::default(),
            },
            moe,
            mlp: MlpScratch {
                g: f(inter),
                u: f(inter),
            },
            context: 0,
        };
        s.reserve_context(cfg, 1);
        s
    }

    /// Gives back what a long prefill chunk grew: every buffer returns to its decode-step size
    /// (the context reservation and the indexer's counters kept). The chunk's rows took their
    /// working set from the expert cache only while they ran (`experts/chunk.rs`); held on,
    /// it would push the resident set over the budget once the cache has its room back. The
    /// next forward regrows what it needs, once.
    pub fn shed_rows(&mut self, cfg: &ModelConfig, index_topk: usize) {
        let cuts = std::mem::take(&mut self.index.cuts);
        let context = self.context;
        *self = Scratch::new(cfg, index_topk);
        self.reserve_context(cfg, context);
        self.index.cuts = cuts;
    }

    /// Sizes the parts that grow with the context for a one-row step over `positions` cached
    /// positions: the per-head blocks (softmax over up to `positions` keys) and the indexer's
    /// scores.
    pub fn reserve_context(&mut self, cfg: &ModelConfig, positions: usize) {
        // Capacity only: the pages are touched when a step first reaches that context.
        fn room<T>(v: &mut Vec<T>, len: usize) {
            v.reserve(len.saturating_sub(v.len()));
        }
        self.context = self.context.max(positions);
        let kv_lora = cfg.mla().map_or(0, |m| m.kv_lora_rank);
        let block = super::mla::head_block_len(kv_lora, 1, positions);
        room(&mut self.attn.heads, cfg.num_attention_heads * block);
        room(&mut self.attn.tile, cfg.num_attention_heads * positions);
        room(&mut self.index.scores, positions);
        room(&mut self.index.key_scores, positions);
    }
}
