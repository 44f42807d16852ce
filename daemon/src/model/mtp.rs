//! The MTP ("nextn") head of GLM-5, DeepSeek-V3/V3.2 and GLM-4.5 checkpoints, stored as layer
//! `num_hidden_layers`: from the main model's last hidden state at position t (before the
//! final norm) and the token at t + 1 it predicts the token at t + 2.
//!
//! ```text
//! x = eh_proj([enorm(embed(token[t+1])) ; hnorm(h[t])])      (embedding half first)
//! x = decoder layer (the family's attention (MLA, with its own indexer where the family has
//!     one, or grouped-query), MoE, its own KV at position t)
//! logits = lm_head(shared_head.norm(x))   (shared_head.head when the checkpoint has one)
//! ```
//!
//! The order of the concatenation and norms follows scripts/demo/train.py's `Mtp` (the module
//! the demo's head was trained as), which is vLLM's `DeepSeekMultiTokenPredictorLayer`
//! (vllm/model_executor/models/deepseek_mtp.py) but for one thing: vLLM zeroes the embedding at
//! position 0, train.py does not, and neither do we. Chained drafts feed the head its own output
//! hidden state (before `shared_head.norm`) as the next position's `h`, as vLLM does with one
//! MTP layer.
//!
//! The head's matrices and experts keep at least 8 bits whatever `--expert-bits` (upstream
//! measured its int4 head at 0-4% acceptance): f32 when the dense weights are f32, int8 per
//! row otherwise. Its experts sit in a store of their own, every one resident once read.

use parking_lot::Mutex;

use super::batch::SeqStep;
use super::dsa_indexer::Selection;
use super::kv::KvCache;
use super::layer::{Layer, LayerWork};
use super::linear::{load_linear, Linear};
use super::model::Model;
use super::ops::rms_norm_rows;
use super::scratch::{grow, Scratch};
use super::Logits;
use crate::config::{IndexerKind, MlpKind, ModelConfig};
use crate::error::EngineError;
use crate::experts::{ExpertShape, ExpertStore, IoMode, TierConfig};
use crate::quant::{QFormat, QMatrix};
use crate::weights::ShardSet;

pub struct Mtp {
    /// Its layer index in the checkpoint (`num_hidden_layers`).
    pub index: usize,
    enorm: Vec<f32>,
    hnorm: Vec<f32>,
    eh_proj: Linear,
    layer: Layer,
    head_norm: Vec<f32>,
    /// `shared_head.head` when the checkpoint stores one; else the main lm_head.
    own_head: Option<Linear>,
    /// An int8-per-row copy of that head for drafting when it is f32 (it is most of a draft's
    /// cost on a small model; a draft is only a proposal the main model verifies, so a
    /// cheaper head changes acceptance, never the output). `None`: drafts use the head itself.
    draft_head: Option<Linear>,
    experts: ExpertStore,
    pub fmt: QFormat,
    scratch: Mutex<Scratch>,
}

/// One sequence's part of an MTP forward: positions `kv.len()..` of the head's cache, each
/// with the main model's hidden state there and the token after it.
pub struct MtpStep<'a> {
    pub kv: &'a mut KvCache,
    /// `token[t + 1]` for each position t fed.
    pub next_tokens: &'a [u32],
    /// `h[t]` for each position t fed, `(n, hidden)`.
    pub hidden: &'a [f32],
    pub logits: Logits,
}

impl Mtp {
    /// Whether `shards` hold an MTP head for `cfg`.
    pub fn present(shards: &ShardSet, cfg: &ModelConfig) -> bool {
        shards.contains(&format!(
            "model.layers.{}.eh_proj.weight",
            cfg.num_hidden_layers
        ))
    }

    /// The format of the head's matrices for dense weights of `dense`: at least int8.
    pub fn format_for(dense: QFormat) -> QFormat {
        if dense == QFormat::F32 {
            QFormat::F32
        } else {
            QFormat::I8Row
        }
    }

    /// Loads the head; `main_head` is the main model's lm_head (the head's own unless the
    /// checkpoint has a `shared_head.head`), of which an f32 one gets an int8 drafting copy.
    pub fn load(
        shards: &std::sync::Arc<ShardSet>,
        cfg: &ModelConfig,
        fmt: QFormat,
        fake_quant: bool,
        main_head: &Linear,
    ) -> Result<Mtp, EngineError> {
        let (n, h) = (cfg.num_hidden_layers, cfg.hidden_size);
        let s = &**shards;
        let p = format!("model.layers.{n}");
        let layer = super::layer::load(s, cfg, n, fmt, Mtp::indexer_kind(cfg), MlpKind::Sparse)?;
        let own_head = if s.contains(&format!("{p}.shared_head.head.weight")) {
            Some(load_linear(
                s,
                &format!("{p}.shared_head.head"),
                cfg.vocab_size,
                h,
                fmt,
                false,
            )?)
        } else {
            None
        };
        let head = own_head.as_ref().unwrap_or(main_head);
        let draft_head = (head.w.format() == QFormat::F32).then(|| Linear {
            w: QMatrix::quantize(
                &head.w.dequantize(),
                head.out_dim(),
                head.in_dim(),
                QFormat::I8Row,
            ),
            bias: head.bias.clone(),
            slot: Default::default(),
        });
        let mut sparse = vec![false; n + 1];
        sparse[n] = true;
        let experts = ExpertStore::new(
            shards.clone(),
            &sparse,
            ExpertShape {
                n_experts: cfg.n_routed_experts,
                top_k: cfg.num_experts_per_tok,
                hidden: h,
                inter: cfg.moe_intermediate_size,
                oss: cfg.oss.as_ref().map(|o| (o.swiglu_alpha, o.swiglu_limit)),
                dsv4_limit: cfg.dsv4().map(|d| d.swiglu_limit),
            },
            fmt,
            fake_quant,
            // One layer's experts, read buffered as ever (and no second `[IO]` line at start).
            &TierConfig {
                io: IoMode::Buffered,
                ..TierConfig::default()
            },
        )?;
        Ok(Mtp {
            index: n,
            enorm: s.read_f32(&format!("{p}.enorm.weight"), &[h])?,
            hnorm: s.read_f32(&format!("{p}.hnorm.weight"), &[h])?,
            eh_proj: load_linear(s, &format!("{p}.eh_proj"), h, 2 * h, fmt, false)?,
            layer,
            head_norm: s.read_f32(&format!("{p}.shared_head.norm.weight"), &[h])?,
            own_head,
            draft_head,
            experts,
            fmt,
            scratch: Mutex::new(Scratch::new(cfg, cfg.index_topk())),
        })
    }

    /// The head's layer has an indexer of its own where the family has one (GLM-5,
    /// DeepSeek-V3.2); DeepSeek-V3's attends to every key, and the grouped-query families'
    /// have none to speak of.
    fn indexer_kind(cfg: &ModelConfig) -> IndexerKind {
        if cfg.indexer().is_some() {
            IndexerKind::Full
        } else {
            IndexerKind::Shared
        }
    }

    /// A cache for the head: one layer, with its indexer's keys when it has an indexer.
    pub fn new_cache(&self, cfg: &ModelConfig) -> KvCache {
        KvCache::with_layers(cfg, vec![Mtp::indexer_kind(cfg) == IndexerKind::Full])
    }

    /// Runs the head over every sequence's positions, appending them to its cache. Logits of
    /// the rows each asks for go to `logits` in sequence order; the output hidden state of each
    /// sequence's last row (what a chained draft feeds as the next `h`) to `last_hidden`,
    /// `(sequences, hidden)`.
    pub fn forward(
        &self,
        model: &Model,
        seqs: &mut [MtpStep<'_>],
        logits: &mut Vec<f32>,
        last_hidden: &mut Vec<f32>,
    ) -> Result<(), EngineError> {
        let head = self.own_head.as_ref().unwrap_or(model.lm_head());
        self.run(model, seqs, logits, last_hidden, head)
    }

    /// [`Mtp::forward`] for drafting: the logits come from the cheaper int8 copy of the head
    /// when it is f32 (good enough for an argmax the main model checks).
    pub fn forward_draft(
        &self,
        model: &Model,
        seqs: &mut [MtpStep<'_>],
        logits: &mut Vec<f32>,
        last_hidden: &mut Vec<f32>,
    ) -> Result<(), EngineError> {
        let head = match &self.draft_head {
            Some(d) => d,
            None => self.own_head.as_ref().unwrap_or(model.lm_head()),
        };
        self.run(model, seqs, logits, last_hidden, head)
    }

    fn run(
        &self,
        model: &Model,
        seqs: &mut [MtpStep<'_>],
        logits: &mut Vec<f32>,
        last_hidden: &mut Vec<f32>,
        head: &Linear,
    ) -> Result<(), EngineError> {
        if rayon::current_thread_index().is_none() {
            return rayon::join(|| self.run(model, seqs, logits, last_hidden, head), || ()).0;
        }
        let c = &model.cfg;
        let h = c.hidden_size;
        for s in seqs.iter() {
            if s.next_tokens.is_empty() || s.hidden.len() != s.next_tokens.len() * h {
                return Err(EngineError::Usage(format!(
                    "MTP forward: {} tokens with {} hidden values (hidden size {h})",
                    s.next_tokens.len(),
                    s.hidden.len()
                )));
            }
        }
        let mut guard = self.scratch.lock();
        let Scratch {
            x,
            a,
            m,
            delta,
            sels,
            spans,
            head_rows,
            attn,
            index,
            moe,
            mlp,
            context: _,
        } = &mut *guard;
        let n: usize = seqs.iter().map(|s| s.next_tokens.len()).sum();
        // [enorm(embed(next)) ; hnorm(h)] per row.
        let cat = grow(a, n * 2 * h);
        let mut row = 0;
        for s in seqs.iter() {
            for (i, &t) in s.next_tokens.iter().enumerate() {
                if t as usize >= c.vocab_size {
                    return Err(EngineError::TokenOutOfVocab {
                        token: t,
                        vocab: c.vocab_size,
                    });
                }
                let out = &mut cat[row * 2 * h..(row + 1) * 2 * h];
                model.embed_row(t, &mut out[..h]);
                rms_norm_rows(&mut out[..h], &self.enorm, c.rms_norm_eps);
                out[h..].copy_from_slice(&s.hidden[i * h..(i + 1) * h]);
                rms_norm_rows(&mut out[h..], &self.hnorm, c.rms_norm_eps);
                row += 1;
            }
        }
        let x = grow(x, n * h);
        self.eh_proj.forward(cat, n, x, model.opts.act);
        let mut steps: Vec<SeqStep<'_>> = seqs
            .iter_mut()
            .map(|s| SeqStep {
                kv: &mut *s.kv,
                tokens: s.next_tokens,
                logits: s.logits,
            })
            .collect();
        super::batch::spans_of(&steps, spans);
        let cx = model.attn_ctx(c.index_topk());
        if sels.len() < steps.len() {
            sels.resize_with(steps.len(), Selection::default);
        }
        let sels = &mut sels[..steps.len()];
        sels.iter_mut().for_each(Selection::clear);
        self.experts.begin_forward(n);
        let w = LayerWork {
            x: &mut *x,
            a: grow(a, n * h),
            m: grow(m, n * h),
            delta: grow(delta, n * h),
            spans,
            sels,
            attn: &mut *attn,
            index,
            moe,
            mlp,
        };
        let r = self.layer.forward(
            model,
            &cx,
            (self.index, 0),
            &self.experts,
            None,
            &mut steps,
            w,
            &mut |_, _, _| {},
        );
        // What scales with the context is not kept between forwards (see `Scratch`).
        attn.release_context();
        if let Err(e) = r {
            steps.iter_mut().for_each(|s| s.kv.rollback());
            return Err(e);
        }
        for s in steps.iter_mut() {
            s.kv.commit(s.tokens);
        }
        last_hidden.clear();
        for span in spans.iter() {
            let last = span.start + span.n - 1;
            last_hidden.extend_from_slice(&x[last * h..(last + 1) * h]);
        }
        let m: usize = steps.iter().map(SeqStep::logit_rows).sum();
        let rows = grow(head_rows, m * h);
        let mut at = 0;
        for (s, span) in steps.iter().zip(spans.iter()) {
            let k = s.logit_rows();
            let from = (span.start + span.n - k) * h;
            rows[at..at + k * h].copy_from_slice(&x[from..from + k * h]);
            at += k * h;
        }
        if m == 0 {
            logits.clear();
            return Ok(());
        }
        rms_norm_rows(rows, &self.head_norm, c.rms_norm_eps);
        logits.resize(m * head.out_dim(), 0.0);
        head.forward(rows, m, logits, model.opts.act);
        Ok(())
    }
}
