//! One forward over several sequences at once: what each sequence brings to the batch, and
//! where its rows sit in it.
//!
//! The rows of every sequence are stacked into one `(rows, hidden)` residual stream, so every
//! dense matrix (attention projections, shared expert, dense MLP, lm_head) and every routed
//! expert selected by any row is read once per step for all of them; attention is the one
//! part that runs per sequence, over that sequence's own cache.

use super::kv::KvCache;
use super::Logits;

/// One sequence's part of a batched forward: its cache (the new positions are appended) and
/// the tokens fed at `kv.len()..`.
pub struct SeqStep<'a> {
    pub kv: &'a mut KvCache,
    pub tokens: &'a [u32],
    /// Which of its positions need logits.
    pub logits: Logits,
}

impl SeqStep<'_> {
    /// Logit rows this sequence gets back.
    pub fn logit_rows(&self) -> usize {
        match self.logits {
            Logits::Last => 1,
            Logits::All => self.tokens.len(),
            Logits::None => 0,
        }
    }
}

/// The rows of one sequence inside the batch: `start..start + n`, at absolute positions
/// `pos0..pos0 + n` of its own cache.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Span {
    pub start: usize,
    pub n: usize,
    pub pos0: usize,
}

/// The spans of `seqs`, in order, into `out`; the total row count.
pub(crate) fn spans_of(seqs: &[SeqStep<'_>], out: &mut Vec<Span>) -> usize {
    out.clear();
    let mut start = 0;
    for s in seqs {
        out.push(Span {
            start,
            n: s.tokens.len(),
            pos0: s.kv.len(),
        });
        start += s.tokens.len();
    }
    start
}
