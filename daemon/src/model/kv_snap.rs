//! Saved recurrent states of a cache with Gated DeltaNet layers (Qwen3.5-MoE), so that the
//! cache can go back to an earlier position bit-exactly although a DeltaNet state cannot be
//! cut (it summarises every position so far).
//!
//! Two kinds, both filled by the DeltaNet forward itself (`delta_net.rs`):
//!
//! - The verify trail. A forward armed with [`KvCache::arm_trail`] (a decode step feeding
//!   drafts, `engine/spec.rs`) writes the state after each of its rows into a buffer of its
//!   own: row `s` reads row `s - 1`'s buffer and writes its own, so the state's first pass
//!   (the decay, `S *= exp(g)`) is done out of place at no extra cost, and nothing is copied.
//!   At the layer's end the last row's buffer is swapped into the cache and the pre-verify
//!   state into that buffer: cutting the rejected drafts swaps the kept row's state back in
//!   (no copy either). Replaying the accepted rows from a copy of the pre-verify state was the
//!   other way: it costs a full copy of every state each verify plus the recurrence again for
//!   the kept rows on a rejection, where the trail costs neither (only `k + 1` states of
//!   memory per session, sized once).
//! - Marks. A forward asked with [`KvCache::mark_at`] copies the state at that position once.
//!   The engine marks each prompt near its end ([`KvCache::mark_prompt_end`]): a next request
//!   of the same conversation, or a regeneration of this one, shares the cache up to about
//!   there. How far before the end is learned, not assumed from a template: a regeneration
//!   shares all but the last token (at least one token is always fed for the logits), and
//!   a template that renders the previous answer differently from how it was generated
//!   (Qwen3.5's drops the `<think>` the generation prompt opened) makes the next prompt part
//!   a few tokens before the end; [`KvCache::note_next_prompt`] records that distance (up to
//!   [`MAX_BACK`]) and the next marks go that far back. The latest [`MAX_MARKS`] are kept.
//!
//! [`KvCache::truncate`] goes back to the latest saved state at or before the cut (the trail
//! first, then the marks), else to 0 as before; `len()` says where it went.
//!
//! A clone of a cache has no saved states (a clone is a copy of the conversation, and
//! copying tens of megabytes of past states with it would tax every clone for a rare gain).

use super::kv::{KvCache, LayerKv};

/// Marks kept per cache: the latest turn's and the one before.
pub const MAX_MARKS: usize = 2;
/// The farthest before a prompt's end a mark goes: a next prompt parting earlier is another
/// conversation, not a re-rendering of this one's last turn.
pub const MAX_BACK: usize = 16;

/// Copies of the recurrent state a cache may hold with drafts of up to `max_draft` tokens: the
/// live one, the pending mark, the marks, and a verify trail row per fed row (the pending
/// token and the drafts). What the RAM clamp counts per session (`engine/tiers.rs`).
pub fn state_copies(max_draft: usize) -> usize {
    let trail = if max_draft > 0 { max_draft + 1 } else { 0 };
    2 + MAX_MARKS + trail
}

/// One layer's saved conv and recurrent state (empty for attention layers).
#[derive(Debug, Default)]
pub(crate) struct LayerState {
    pub conv: Vec<f32>,
    pub state: Vec<f32>,
}

/// A cache's saved states (see the module doc).
#[derive(Debug, Default)]
pub struct Snaps {
    /// Rows of the next forward to keep a trail of (0: none).
    armed: usize,
    /// The latest forward's trail while the cache still ends where that forward left it:
    /// `(base, rows)`, the length before it and its rows.
    trail: Option<(usize, usize)>,
    /// Per layer, per row: the conv and recurrent state after that row (after the forward,
    /// the last row's entries hold the state before it).
    conv_rows: Vec<Vec<Vec<f32>>>,
    state_rows: Vec<Vec<Vec<f32>>>,
    /// Per layer, DeepSeek-V4's trail: what its forward logged to cut the rows after any
    /// (`dsv4_trail.rs`).
    dsv4: Vec<super::dsv4_trail::LayerTrail>,
    /// The position whose state the next forward copies (None: none).
    mark_at: Option<usize>,
    /// Per layer: the state at `mark_at`, as the forward copies it.
    pub(crate) pending: Vec<LayerState>,
    /// Saved states by ascending position, each per layer.
    marks: Vec<(usize, Vec<LayerState>)>,
    /// How many times a cut went back to a saved state rather than to 0, by kind.
    pub restored_trail: u64,
    pub restored_mark: u64,
    /// The end of the latest prompt, and how far before a prompt's end the next one parted
    /// (at least 1: a regeneration's).
    prompt_end: Option<usize>,
    back: usize,
    /// The tokens a failed forward cost the cache (`KvCache::rollback`): the positions after
    /// the saved state it went back to, to be fed again before the retry.
    lost: Vec<u32>,
}

impl Clone for Snaps {
    /// The learned distance goes with a clone; the saved states do not (module doc).
    fn clone(&self) -> Snaps {
        Snaps {
            prompt_end: self.prompt_end,
            back: self.back,
            ..Snaps::default()
        }
    }
}

/// What the DeltaNet forward of one layer saves for one sequence.
pub(crate) struct LayerSnaps<'a> {
    /// The conv and recurrent state after each row (empty: they advance in place).
    pub conv: &'a mut [Vec<f32>],
    pub state: &'a mut [Vec<f32>],
    /// The row after which to copy the state, and where to.
    pub mark: Option<(usize, &'a mut LayerState)>,
}

impl Snaps {
    /// The pending state becomes the mark at `p` (the oldest mark's buffers take it when
    /// the list is full).
    fn push_pending(&mut self, p: usize) {
        let mut layers = if self.marks.len() >= MAX_MARKS {
            self.marks.remove(0).1
        } else {
            Vec::new()
        };
        layers.resize_with(self.pending.len(), Default::default);
        for (dst, src) in layers.iter_mut().zip(&mut self.pending) {
            std::mem::swap(dst, src);
        }
        self.marks.push((p, layers));
    }

    /// What layer `layer`'s forward of `n` rows from position `pos0` saves.
    pub(crate) fn layer(&mut self, layer: usize, pos0: usize, n: usize) -> LayerSnaps<'_> {
        let (conv, state): (&mut [Vec<f32>], &mut [Vec<f32>]) = if self.armed == n && n > 0 {
            (
                &mut self.conv_rows[layer][..n],
                &mut self.state_rows[layer][..n],
            )
        } else {
            (Default::default(), Default::default())
        };
        let mark = match self.mark_at {
            Some(p) if p > pos0 && p <= pos0 + n => Some((p - pos0 - 1, &mut self.pending[layer])),
            _ => None,
        };
        LayerSnaps { conv, state, mark }
    }

    /// DeepSeek-V4 layer `layer`'s trail, when the forward of `n` rows is armed for one.
    pub(crate) fn dsv4_trail(
        &mut self,
        layer: usize,
        n: usize,
    ) -> Option<&mut super::dsv4_trail::LayerTrail> {
        (self.armed == n && n > 0)
            .then(|| self.dsv4.get_mut(layer))
            .flatten()
    }
}

/// Copies `src` into `dst`, reusing its buffer.
fn copy_into(dst: &mut Vec<f32>, src: &[f32]) {
    dst.clear();
    dst.extend_from_slice(src);
}

impl KvCache {
    /// The next forward feeds `rows` rows whose later ones may be cut again (drafts): it keeps
    /// the state after each (sized on first need, then reused: a verify step allocates
    /// nothing). A no-op for a cache without a recurrent state.
    pub fn arm_trail(&mut self, rows: usize) {
        if !self.has_recurrent_state() {
            return;
        }
        if self.has_dsv4_state() {
            // Its log is sized by the forward (`dsv4_trail.rs`).
            self.snaps
                .dsv4
                .resize_with(self.layers.len(), Default::default);
            self.snaps.armed = rows;
            return;
        }
        let Snaps {
            conv_rows,
            state_rows,
            ..
        } = &mut self.snaps;
        conv_rows.resize_with(self.layers.len(), Vec::new);
        state_rows.resize_with(self.layers.len(), Vec::new);
        for ((l, c), st) in self.layers.iter().zip(conv_rows).zip(state_rows) {
            if let LayerKv::Linear(s) = l {
                if c.len() < rows {
                    c.resize_with(rows, || vec![0.0; s.conv.len()]);
                    st.resize_with(rows, || vec![0.0; s.state.len()]);
                }
            }
        }
        self.snaps.armed = rows;
    }

    /// The next forward that passes position `pos` keeps the state there (see the module doc).
    pub fn mark_at(&mut self, pos: usize) {
        // A position already passed has no state left to copy.
        if !self.has_recurrent_state()
            || self.has_dsv4_state()
            || pos == 0
            || pos < self.len()
            || self.marks_hold(pos)
        {
            return;
        }
        self.snaps
            .pending
            .resize_with(self.layers.len(), Default::default);
        if pos == self.len() {
            // Where the cache stands: the state is there to copy now.
            for (l, m) in self.layers.iter().zip(&mut self.snaps.pending) {
                if let LayerKv::Linear(s) = l {
                    copy_into(&mut m.conv, &s.conv);
                    copy_into(&mut m.state, &s.state);
                }
            }
            self.snaps.mark_at = None;
            self.snaps.push_pending(pos);
            return;
        }
        self.snaps.mark_at = Some(pos);
    }

    /// A prompt ends at position `end`: the state `back` positions before it is kept (see
    /// the module doc).
    pub fn mark_prompt_end(&mut self, end: usize) {
        if !self.has_recurrent_state() {
            return;
        }
        self.snaps.prompt_end = Some(end);
        self.mark_at(end.saturating_sub(self.snaps.back.max(1)));
    }

    /// The next prompt shares the cache's first `shared` positions: when it parts shortly
    /// before the latest prompt's end, marks go back that far from now on.
    pub fn note_next_prompt(&mut self, shared: usize) {
        if let Some(end) = self.snaps.prompt_end {
            let back = end.saturating_sub(shared);
            if back > self.snaps.back && back <= MAX_BACK {
                self.snaps.back = back;
            }
        }
    }

    fn marks_hold(&self, pos: usize) -> bool {
        self.snaps.marks.iter().any(|(p, _)| *p == pos)
    }

    /// The positions with a saved state, ascending (the marks).
    pub fn mark_positions(&self) -> impl Iterator<Item = usize> + '_ {
        self.snaps.marks.iter().map(|(p, _)| *p)
    }

    /// Times a cut went back to a saved state: (the verify trail, a mark).
    pub fn restores(&self) -> (u64, u64) {
        (self.snaps.restored_trail, self.snaps.restored_mark)
    }

    /// After a forward from length `before` committed `rows` rows: its trail becomes the
    /// cache's recent past, its pending mark a mark.
    pub(crate) fn snaps_after_forward(&mut self, before: usize, rows: usize) {
        let s = &mut self.snaps;
        s.lost.clear();
        s.trail = (s.armed == rows && rows > 0).then_some((before, rows));
        s.armed = 0;
        if let Some(p) = s.mark_at.take_if(|p| *p > before && *p <= before + rows) {
            s.push_pending(p);
        }
    }

    /// A forward failed part-way: nothing it saved is kept.
    pub(crate) fn snaps_after_failure(&mut self) {
        self.snaps.lost.clear();
        self.snaps.armed = 0;
        self.snaps.trail = None;
        self.snaps.mark_at = None;
    }

    /// After a failed forward went back to a saved state (`KvCache::rollback`): the tokens
    /// of the positions it cost, which a retry feeds again first (empty when none were).
    pub fn take_lost(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.snaps.lost)
    }

    /// The cache went back from `len` to `p` after a failure: what it cost, for the retry.
    pub(crate) fn note_lost(&mut self, lost: Vec<u32>) {
        self.snaps.lost = lost;
    }

    /// Sets the recurrent states to the latest saved state at or before `n` (the cache's
    /// length is still above `n`) and returns its position, 0 when there is none (the
    /// states are then zeroed by the caller's cut). Saved states past the new length go.
    pub(crate) fn restore_at_most(&mut self, n: usize) -> usize {
        let len = self.len();
        let trail = self.snaps.trail.take();
        self.snaps.armed = 0;
        self.snaps.mark_at = None;
        if let Some((base, rows)) = trail.filter(|&(b, r)| b + r == len && n >= b) {
            if self.has_dsv4_state() {
                return self.restore_dsv4(n);
            }
            // The last row's entry holds the state before the forward (swapped at its end).
            let i = if n == base { rows - 1 } else { n - base - 1 };
            let Snaps {
                conv_rows,
                state_rows,
                ..
            } = &mut self.snaps;
            for ((l, c), st) in self.layers.iter_mut().zip(conv_rows).zip(state_rows) {
                if let LayerKv::Linear(s) = l {
                    std::mem::swap(&mut s.conv, &mut c[i]);
                    std::mem::swap(&mut s.state, &mut st[i]);
                    s.pos = n;
                }
            }
            self.snaps.marks.retain(|(p, _)| *p <= n);
            self.snaps.restored_trail += 1;
            return n;
        }
        self.snaps.marks.retain(|(p, _)| *p <= n);
        let Some((p, saved)) = self.snaps.marks.last() else {
            return 0;
        };
        for (l, m) in self.layers.iter_mut().zip(saved) {
            if let LayerKv::Linear(s) = l {
                copy_into(&mut s.conv, &m.conv);
                copy_into(&mut s.state, &m.state);
                s.pos = *p;
            }
        }
        self.snaps.restored_mark += 1;
        *p
    }

    /// DeepSeek-V4's layers cut back to `n` within the latest forward, from its log: `n`,
    /// or 0 when a layer has no log reaching there (every layer of a forward logs it, so
    /// that is a broken invariant; the states are then zeroed by the caller's cut).
    fn restore_dsv4(&mut self, n: usize) -> usize {
        let mut ok = true;
        for (l, t) in self.layers.iter_mut().zip(&mut self.snaps.dsv4) {
            if let LayerKv::Dsv4(s) = l {
                ok &= t.restore(s, n);
            }
        }
        if !ok {
            return 0;
        }
        self.snaps.marks.retain(|(p, _)| *p <= n);
        self.snaps.restored_trail += 1;
        n
    }

    /// The saved state of `other` at `pos` (one of its marks) into this cache's layers, when
    /// it has one: adopting another cache's prefix that ends at a mark.
    pub(crate) fn adopt_mark(&mut self, other: &KvCache, pos: usize) -> bool {
        let Some((_, saved)) = other.snaps.marks.iter().find(|(p, _)| *p == pos) else {
            return false;
        };
        for (l, m) in self.layers.iter_mut().zip(saved) {
            if let LayerKv::Linear(s) = l {
                copy_into(&mut s.conv, &m.conv);
                copy_into(&mut s.state, &m.state);
                s.pos = pos;
            }
        }
        true
    }

    /// The most of `other`'s first `upto` positions `extend_from` can give this cache:
    /// `upto`, unless a recurrent state would have to be cut there; then `other`'s latest
    /// mark at or before it, else what this cache holds (nothing to adopt).
    pub fn adoptable_upto(&self, other: &KvCache, upto: usize) -> usize {
        if self.can_extend_from(other, upto) {
            return upto;
        }
        other
            .mark_positions()
            .filter(|&p| p <= upto && self.can_extend_from(other, p))
            .max()
            .unwrap_or(0)
            .max(self.len())
    }

    /// Whether this cache has a saved state at `pos`.
    pub fn has_mark(&self, pos: usize) -> bool {
        self.marks_hold(pos)
    }
}
