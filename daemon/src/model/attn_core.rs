//! Attention's quadratic part for grouped-query attention: a chunk's queries against the
//! cached keys and values, `softmax(q . k * scale) . v` per query row and head, causal, with
//! gpt-oss's sliding window and sinks. `gqa.rs` runs every CPU layer through it and the plan's
//! probe (`cmd/plan/probe.rs`) times it, so the plan measures what the model runs.
//!
//! The cache is `[position][kv_head][head_dim]`, each key-value head serving `heads /
//! kv_heads` consecutive query heads. Walking it one query head and one row at a time read
//! every key and value row once per query head and row (8x per group at 32 heads on 4, times
//! the chunk's rows), one short call a key: the loads, not the arithmetic, set the pace. Here
//! a tile of up to [`TILE_ROWS`] rows takes, for each key-value head, all the query vectors of
//! its group (rows x group heads) through the keys a chunk at a time: four queries by four
//! keys a pass (`dot_gather4`, whose sixteen horizontal sums share their additions), then
//! four outputs a pass over the same chunk of values (`axpy_gather4`, a stripe of 64 of each
//! head at a time: sixteen accumulators in registers), so a chunk is read from memory once
//! per tile and from L1 by the rest. A chunk of [`COLS_MIN_ROWS`] rows or more first lays the
//! keys it sees out by column ([`KeyCols`]) and scores four queries by sixteen keys a pass
//! (`dot_f32_cols4`): no horizontal sums, each column of keys loaded once for the four.
//!
//! The bits are the one-query-at-a-time loop's (the tests keep it as the oracle): each score
//! is `dot(q, k) * scale` (the gathered kernels promise `dot`'s bits), each softmax the same
//! function over the same scores, and each output element takes `p * v` over its keys in
//! ascending order (`axpy`'s fused multiply-add, which the gathered kernels keep). Only the
//! order between different queries changes.

use std::ops::Range;

use super::ops::{axpy_gather, axpy_gather4, dot_gather, dot_gather4, softmax_rows_scaled};
use super::scratch::grow;
use crate::quant::{dot_f32_cols4, has_dot_f32_cols4, par_chunk_pairs, par_chunks_mut};

/// Query rows a tile takes through the keys together: with a group of 8 heads, 32 queries
/// share each chunk of keys and values.
pub const TILE_ROWS: usize = 4;

/// Keys a chunk holds: 64 rows of 128 floats (32 KiB) stay in L1 while the tile's queries go
/// through them, and their indices wait on the stack.
const KEY_CHUNK: usize = 64;

/// Fewest rows for which a chunk's keys are laid out by column ([`KeyCols`]): the copy reads
/// every visible key once, and pays for itself when each key is scored by many queries.
const COLS_MIN_ROWS: usize = 16;

/// Heads and scale of a grouped-query layer.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Multiplies each score before the softmax (`head_dim^-1/2` for the families here).
    pub scale: f32,
}

/// Which cached keys each query row sees: row `s` of the chunk sits at position `pos0 + s`
/// and sees every position up to its own, or in a sliding layer the last `window` of them.
#[derive(Clone, Copy, Debug)]
pub struct Visible {
    pub pos0: usize,
    pub window: Option<usize>,
}

impl Visible {
    /// The positions row `s` attends to.
    pub fn keys(&self, s: usize) -> Range<usize> {
        let end = self.pos0 + s + 1;
        let first = self.window.map_or(0, |w| end.saturating_sub(w));
        first..end
    }
}

/// The inputs every tile reads.
#[derive(Clone, Copy)]
pub struct Attend<'a> {
    pub shape: AttnShape,
    /// Queries `(rows, heads, head_dim)`.
    pub q: &'a [f32],
    /// The cache's keys and values, `(positions, kv_heads, head_dim)` each, holding every
    /// position a row sees.
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub visible: Visible,
    /// gpt-oss: one logit per query head in its softmax's denominator.
    pub sinks: Option<&'a [f32]>,
}

thread_local! {
    /// A tile's probabilities, per worker thread (grown once per thread).
    static PROBS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The chunk's keys by column ([`KeyCols`]), on the thread that starts the tiles.
    static KEY_COLS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The keys a chunk's rows see, each key-value head's laid out by column in blocks of
/// [`COL_BLOCK`] keys: element `e` of the key `i` places after `lo + b * COL_BLOCK` at
/// `kt[((g * blocks + b) * head_dim + e) * COL_BLOCK + i]`. Scored this way sixteen keys fill
/// a vector and no score ends in a horizontal sum ([`dot_f32_cols4`], the bits of one `dot` a
/// key), about a fifth of the operations of a score from keys stored by row at head_dim 128. A
/// block is one contiguous run (32 KiB at head_dim 128, as a chunk of rows): columns as long
/// as the context put each element a page apart at long contexts, and missed the TLB.
struct KeyCols<'a> {
    kt: &'a [f32],
    /// The first position held.
    lo: usize,
    /// Blocks a key-value head.
    blocks: usize,
}

/// Keys a block of [`KeyCols`] holds: a chunk's ([`KEY_CHUNK`]).
const COL_BLOCK: usize = KEY_CHUNK;

impl KeyCols<'_> {
    /// `outs[h][i] = dot(qs[h], key keys.start + i)` of key-value head `g` (the bits of
    /// `dot_gather4`), a block at a time.
    fn score4(&self, g: usize, qs: [&[f32]; 4], keys: Range<usize>, mut outs: [&mut [f32]; 4]) {
        let hd = qs[0].len();
        let mut t = keys.start;
        while t < keys.end {
            let (b, at) = ((t - self.lo) / COL_BLOCK, (t - self.lo) % COL_BLOCK);
            let n = (COL_BLOCK - at).min(keys.end - t);
            let block = &self.kt[(g * self.blocks + b) * hd * COL_BLOCK..][..hd * COL_BLOCK];
            let [a, b, c, d] = outs.map(|o| o.split_at_mut(n));
            dot_f32_cols4(qs, &block[at..], COL_BLOCK, [a.0, b.0, c.0, d.0]);
            outs = [a.1, b.1, c.1, d.1];
            t += n;
        }
    }
}

impl Attend<'_> {
    /// Every row's output into `out` (`(rows, heads, head_dim)`, overwritten) on this thread,
    /// the probabilities in `probs` (grown to a tile's need, so a decode step that reserved
    /// it does not allocate).
    pub fn run(&self, out: &mut [f32], probs: &mut Vec<f32>) {
        let qw = self.shape.heads * self.shape.head_dim;
        for (t, o) in out.chunks_mut(TILE_ROWS * qw).enumerate() {
            self.tile(t * TILE_ROWS, o, probs, None);
        }
    }

    /// [`Attend::run`] with the tiles across the threads (the pool of a chunk of `rows`); a
    /// chunk of [`COLS_MIN_ROWS`] or more scores its keys by column where the CPU has the
    /// kernel (the same bits).
    pub fn run_par(&self, out: &mut [f32]) {
        let qw = self.shape.heads * self.shape.head_dim;
        let rows = out.len() / qw.max(1);
        if rows < COLS_MIN_ROWS || !has_dot_f32_cols4() || self.shape.kv_heads == 0 {
            return self.tiles_par(out, None);
        }
        KEY_COLS.with(|buf| match buf.try_borrow_mut() {
            Ok(mut buf) => self.tiles_par(out, Some(&self.key_cols(rows, &mut buf))),
            // Only a nested call on this thread finds it taken: it gets a buffer of its own.
            Err(_) => self.tiles_par(out, Some(&self.key_cols(rows, &mut Vec::new()))),
        })
    }

    /// [`Attend::run_par`] with every key scored from the cache's rows, as a CPU without the
    /// column kernel runs it: the tests and the benchmark hold the two side by side.
    pub fn run_par_by_row(&self, out: &mut [f32]) {
        self.tiles_par(out, None)
    }

    fn tiles_par(&self, out: &mut [f32], cols: Option<&KeyCols>) {
        let qw = self.shape.heads * self.shape.head_dim;
        let rows = out.len() / qw.max(1);
        par_chunks_mut(out, TILE_ROWS * qw, rows, |t, o| {
            PROBS.with(|p| self.tile(t * TILE_ROWS, o, &mut p.borrow_mut(), cols))
        });
    }

    /// The keys rows `0..rows` see, by column, in `buf` (grown to their need).
    fn key_cols<'b>(&self, rows: usize, buf: &'b mut Vec<f32>) -> KeyCols<'b> {
        let AttnShape {
            kv_heads,
            head_dim: hd,
            ..
        } = self.shape;
        let kw = kv_heads * hd;
        // A window's start and the end both grow with the row.
        let (lo, hi) = (self.visible.keys(0).start, self.visible.keys(rows - 1).end);
        let blocks = (hi - lo).div_ceil(COL_BLOCK);
        let kt = grow(buf, kv_heads * blocks * hd * COL_BLOCK);
        par_chunks_mut(kt, blocks * hd * COL_BLOCK, rows, |g, kt| {
            for (b, block) in kt.chunks_exact_mut(hd * COL_BLOCK).enumerate() {
                let t0 = lo + b * COL_BLOCK;
                let keys = t0..(t0 + COL_BLOCK).min(hi);
                for (e, col) in block.chunks_exact_mut(COL_BLOCK).enumerate() {
                    for (c, t) in col.iter_mut().zip(keys.clone()) {
                        *c = self.k[t * kw + g * hd + e];
                    }
                }
            }
        });
        KeyCols { kt, lo, blocks }
    }

    /// [`Attend::run`] of one query row (a decode step), its key-value heads across the
    /// threads: one row has no tiles to share out, but each key-value head's queries, keys and
    /// outputs are its own. `probs` is cut in one block a head (grown to `heads` times the
    /// row's keys, so a decode step that reserved it does not allocate). Same bits as `run`:
    /// each head goes through exactly the passes `run` gives it.
    pub fn run_row_par(&self, out: &mut [f32], probs: &mut Vec<f32>) {
        let AttnShape {
            heads,
            kv_heads,
            head_dim: hd,
            ..
        } = self.shape;
        assert_eq!(out.len(), heads * hd, "run_row_par: one row of outputs");
        let group = heads / kv_heads.max(1);
        if group == 0 {
            out.fill(0.0);
            return;
        }
        let most = self.visible.keys(0).len().max(1);
        let probs = grow(probs, kv_heads * group * most);
        par_chunk_pairs(out, group * hd, probs, group * most, 1, |g, o, p| {
            o.fill(0.0);
            self.group_pass(0, g, 1, o, |x| x * hd, p, None);
        });
    }

    /// Rows `s0..` of the chunk, as many as `out` holds (at most [`TILE_ROWS`]), their keys
    /// by column where `cols` holds them.
    fn tile(&self, s0: usize, out: &mut [f32], probs: &mut Vec<f32>, cols: Option<&KeyCols>) {
        let AttnShape {
            heads,
            kv_heads,
            head_dim: hd,
            ..
        } = self.shape;
        let qw = heads * hd;
        let group = heads / kv_heads;
        let rows = out.len() / qw;
        out.fill(0.0);
        if rows == 0 || group == 0 {
            return;
        }
        let most = self.most_keys(s0, rows);
        let probs = grow(probs, rows * group * most);
        for g in 0..kv_heads {
            let out_at = |x: usize| (x / group) * qw + (g * group + x % group) * hd;
            self.group_pass(s0, g, rows, out, out_at, probs, cols);
        }
    }

    /// The most keys any of rows `s0..s0 + rows` sees: the length of a query's scores.
    fn most_keys(&self, s0: usize, rows: usize) -> usize {
        (0..rows)
            .map(|i| self.visible.keys(s0 + i).len())
            .max()
            .unwrap_or(0)
    }

    /// Key-value head `g`'s queries of rows `s0..s0 + rows` through their keys and values:
    /// query vector `x` (row `x / group`, head `x % group` of the group) accumulates into
    /// `out[out_at(x)..][..head_dim]`, which starts at zero; `probs` holds at least `rows *
    /// group * most_keys` floats. The shared keys of four queries are scored from `cols`
    /// where given (it holds every key the rows see), else from the cache's rows.
    #[allow(clippy::too_many_arguments)]
    fn group_pass(
        &self,
        s0: usize,
        g: usize,
        rows: usize,
        out: &mut [f32],
        out_at: impl Fn(usize) -> usize,
        probs: &mut [f32],
        cols: Option<&KeyCols>,
    ) {
        let AttnShape {
            heads,
            kv_heads,
            head_dim: hd,
            scale,
        } = self.shape;
        let (qw, kw) = (heads * hd, kv_heads * hd);
        let group = heads / kv_heads;
        // Query vector `x` of a key-value head is row `x / group`, head `x % group` of its
        // group; all the tile's vectors of one head share its keys, row by row.
        let nq = rows * group;
        let range = |x: usize| self.visible.keys(s0 + x / group);
        // The window's start and the end both grow with the row: the tile spans from its first
        // row's start to its last row's end.
        let span = range(0).start..range(nq - 1).end;
        let most = self.most_keys(s0, rows);
        let mut idx = [0usize; KEY_CHUNK];
        {
            let (kb, vb) = (&self.k[g * hd..], &self.v[g * hd..]);
            let query = |x: usize| {
                let (i, j) = (x / group, x % group);
                &self.q[(s0 + i) * qw + (g * group + j) * hd..][..hd]
            };
            for c0 in span.clone().step_by(KEY_CHUNK) {
                let chunk = c0..(c0 + KEY_CHUNK).min(span.end);
                for (slot, t) in idx.iter_mut().zip(chunk.clone()) {
                    *slot = t;
                }
                let keys = |r: Range<usize>| &idx[r.start - c0..r.end - c0];
                // Scores, four queries a pass over the keys they share, each query's own keys
                // (a window's or a row's edge) one at a time.
                for_quads(nq, &range, &chunk, |quad, common| {
                    let x0 = quad.start;
                    if let Some(common) = &common {
                        let qs = [0, 1, 2, 3].map(|j| query(x0 + j));
                        let starts = [0, 1, 2, 3].map(|j| range(x0 + j).start);
                        let block = &mut probs[x0 * most..(x0 + 4) * most];
                        let (a, rest) = block.split_at_mut(most);
                        let (b, rest) = rest.split_at_mut(most);
                        let (c, d) = rest.split_at_mut(most);
                        let len = common.len();
                        let outs = [a, b, c, d]
                            .into_iter()
                            .zip(starts)
                            .map(|(o, s)| &mut o[common.start - s..][..len]);
                        let outs: [&mut [f32]; 4] = array4(outs);
                        match cols {
                            Some(c) => c.score4(g, qs, common.clone(), outs),
                            None => dot_gather4(qs, kb, kw, keys(common.clone()), outs),
                        }
                    }
                    for x in quad {
                        for part in own_parts(range(x), &chunk, common.as_ref()) {
                            let dst = &mut probs[x * most + part.start - range(x).start..];
                            dot_gather(query(x), kb, kw, keys(part.clone()), dst);
                        }
                    }
                });
            }
            self.softmax(g * group, group, nq, most, &range, scale, probs);
            // Values: each output over its keys in order, chunk by chunk.
            for c0 in span.clone().step_by(KEY_CHUNK) {
                let chunk = c0..(c0 + KEY_CHUNK).min(span.end);
                for (slot, t) in idx.iter_mut().zip(chunk.clone()) {
                    *slot = t;
                }
                let keys = |r: Range<usize>| &idx[r.start - c0..r.end - c0];
                let coefs = |x: usize, r: &Range<usize>| {
                    let s = range(x).start;
                    &probs[x * most + r.start - s..x * most + r.end - s]
                };
                for_quads(nq, &range, &chunk, |quad, common| {
                    // Each output's keys in order: its own keys before the shared ones,
                    // the shared ones four outputs a pass, then its own keys after them.
                    let parts = |x: usize| own_parts(range(x), &chunk, common.as_ref());
                    for x in quad.clone() {
                        for part in parts(x).into_iter().filter(|p| is_before(p, &common)) {
                            let acc = &mut out[out_at(x)..][..hd];
                            axpy_gather(acc, coefs(x, &part), vb, kw, keys(part.clone()));
                        }
                    }
                    if let Some(common) = &common {
                        let x0 = quad.start;
                        let accs = four_accs(out, [0, 1, 2, 3].map(|j| out_at(x0 + j)), hd);
                        let cs = [0, 1, 2, 3].map(|j| coefs(x0 + j, common));
                        axpy_gather4(accs, cs, vb, kw, keys(common.clone()));
                    }
                    for x in quad {
                        for part in parts(x).into_iter().filter(|p| !is_before(p, &common)) {
                            let acc = &mut out[out_at(x)..][..hd];
                            axpy_gather(acc, coefs(x, &part), vb, kw, keys(part.clone()));
                        }
                    }
                });
            }
        }
    }

    /// The softmax of each query vector's scores times `scale`, of the key-value head whose
    /// first query head is `h0`: `softmax` (several rows at once, the same bits) or
    /// gpt-oss's with its sink.
    #[allow(clippy::too_many_arguments)]
    fn softmax(
        &self,
        h0: usize,
        group: usize,
        nq: usize,
        most: usize,
        range: &impl Fn(usize) -> Range<usize>,
        scale: f32,
        probs: &mut [f32],
    ) {
        match self.sinks {
            None => {
                // Eight rows a call: `softmax_rows` interleaves eight rows' sums.
                for (b, block) in probs[..nq * most].chunks_mut(8 * most).enumerate() {
                    let n = block.len() / most.max(1);
                    let lens: [usize; 8] =
                        core::array::from_fn(|i| if i < n { range(8 * b + i).len() } else { 0 });
                    softmax_rows_scaled(block, most, &lens[..n], scale);
                }
            }
            Some(sinks) => {
                for x in 0..nq {
                    let scores = &mut probs[x * most..][..range(x).len()];
                    for p in scores.iter_mut() {
                        *p *= scale;
                    }
                    super::gqa::softmax_with_sink(scores, sinks[h0 + x % group]);
                }
            }
        }
    }
}

/// `f(quad, common)` for the query vectors `0..nq` four at a time (a last short group one at
/// a time, with no `common`), `common` the keys of `chunk` all four see (`None` if none).
fn for_quads(
    nq: usize,
    range: &impl Fn(usize) -> Range<usize>,
    chunk: &Range<usize>,
    mut f: impl FnMut(Range<usize>, Option<Range<usize>>),
) {
    let mut x = 0;
    while x < nq {
        if x + 4 <= nq {
            let rs = [0, 1, 2, 3].map(|j| range(x + j));
            let start = rs.iter().map(|r| r.start).max().unwrap_or(0);
            let end = rs.iter().map(|r| r.end).min().unwrap_or(0);
            let common = start.max(chunk.start)..end.min(chunk.end);
            f(x..x + 4, (!common.is_empty()).then_some(common));
            x += 4;
        } else {
            f(x..x + 1, None);
            x += 1;
        }
    }
}

/// The keys of `chunk` that query range `r` sees outside `common` (all of them in the chunk
/// when there is no `common`): at most one run before it and one after, in key order.
fn own_parts(r: Range<usize>, chunk: &Range<usize>, common: Option<&Range<usize>>) -> Vec2 {
    let mine = r.start.max(chunk.start)..r.end.min(chunk.end);
    let mut parts = Vec2::default();
    match common {
        None => parts.push(mine),
        Some(c) => {
            parts.push(mine.start..c.start.min(mine.end));
            parts.push(c.end.max(mine.start)..mine.end);
        }
    }
    parts
}

/// Whether `part` lies before the shared keys (`common`; with none, every part is "after").
fn is_before(part: &Range<usize>, common: &Option<Range<usize>>) -> bool {
    common.as_ref().is_some_and(|c| part.end <= c.start)
}

/// Up to two non-empty key ranges, on the stack.
#[derive(Default)]
struct Vec2 {
    parts: [Range<usize>; 2],
    len: usize,
}

impl Vec2 {
    fn push(&mut self, r: Range<usize>) {
        if !r.is_empty() {
            self.parts[self.len] = r;
            self.len += 1;
        }
    }
}

impl IntoIterator for Vec2 {
    type Item = Range<usize>;
    type IntoIter = std::iter::Take<std::array::IntoIter<Range<usize>, 2>>;
    fn into_iter(self) -> Self::IntoIter {
        self.parts.into_iter().take(self.len)
    }
}

/// The four outputs of a quad, `hd` floats at each of `at` (distinct, non-overlapping).
fn four_accs(out: &mut [f32], at: [usize; 4], hd: usize) -> [&mut [f32]; 4] {
    // Each query vector of a tile owns its own `hd` floats of `out`: split them off in order
    // of their offsets, then hand them back in the quad's order.
    let mut order = [0, 1, 2, 3];
    order.sort_by_key(|&j| at[j]);
    let mut rest = out;
    let mut base = 0;
    let mut got: [Option<&mut [f32]>; 4] = [None, None, None, None];
    for &j in &order {
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(at[j] - base);
        let (acc, tail) = tail.split_at_mut(hd);
        got[j] = Some(acc);
        rest = tail;
        base = at[j] + hd;
    }
    got.map(|a| a.expect("four outputs"))
}

/// Four items of an iterator as an array.
fn array4<T>(mut it: impl Iterator<Item = T>) -> [T; 4] {
    core::array::from_fn(|_| it.next().expect("four items"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ops::{axpy, dot, softmax};

    /// The loop `gqa.rs` ran before the tiles, kept as the oracle: each row, each head, its
    /// scores key by key, the softmax, then `axpy` of each value in key order.
    fn one_query_at_a_time(a: &Attend, rows: usize) -> Vec<f32> {
        let AttnShape {
            heads,
            kv_heads,
            head_dim: hd,
            scale,
        } = a.shape;
        let (qw, kw, group) = (heads * hd, kv_heads * hd, heads / kv_heads);
        let mut out = vec![0f32; rows * qw];
        let mut scores = Vec::new();
        for s in 0..rows {
            let keys = a.visible.keys(s);
            for h in 0..heads {
                let kvh = h / group;
                let qh = &a.q[s * qw + h * hd..][..hd];
                scores.clear();
                scores.extend(
                    keys.clone()
                        .map(|t| dot(qh, &a.k[t * kw + kvh * hd..][..hd]) * scale),
                );
                match a.sinks {
                    None => softmax(&mut scores),
                    Some(sinks) => crate::model::gqa::softmax_with_sink(&mut scores, sinks[h]),
                }
                let oh = &mut out[s * qw + h * hd..][..hd];
                for (p, t) in scores.iter().zip(keys.clone()) {
                    axpy(oh, *p, &a.v[t * kw + kvh * hd..][..hd]);
                }
            }
        }
        out
    }

    fn values(n: usize, x: &mut crate::rng::XorShift64) -> Vec<f32> {
        (0..n).map(|_| x.unit_f32() * 4.0 - 2.0).collect()
    }

    /// The tiles give every output the oracle's bits: single rows (decode) and chunks around
    /// the tile's four rows, contexts of one key and around the 64-key chunk, groups of one,
    /// two, four and eight heads, heads short enough for four accumulators and longer, with and
    /// without gpt-oss's window and sinks, on this thread and across the threads. Chunks of 16
    /// rows and more score their keys by column (odd lengths, cached keys before them, windows
    /// that drop keys within a tile), and by row beside them.
    #[test]
    fn tiles_give_the_one_query_loops_bits() {
        let mut x = crate::rng::XorShift64(0x51ce_a77e_c0de_1234);
        let mut cases = 0;
        for (heads, kv_heads) in [(2, 2), (4, 2), (16, 2), (16, 4)] {
            for hd in [24, 64, 128] {
                for (rows, pos0) in [(1, 0), (1, 64), (1, 200), (3, 0), (3, 62), (64, 0)]
                    .into_iter()
                    .chain([(67, 0), (67, 61), (64, 129), (17, 3), (33, 100)])
                {
                    for (window, sinks) in [(None, false), (Some(5), false), (Some(100), true)]
                        .into_iter()
                        .chain([(None, true)])
                    {
                        let ctx = pos0 + rows;
                        let q = values(rows * heads * hd, &mut x);
                        let k = values(ctx * kv_heads * hd, &mut x);
                        let v = values(ctx * kv_heads * hd, &mut x);
                        let sink_logits = values(heads, &mut x);
                        let a = Attend {
                            shape: AttnShape {
                                heads,
                                kv_heads,
                                head_dim: hd,
                                scale: (hd as f32).powf(-0.5),
                            },
                            q: &q,
                            k: &k,
                            v: &v,
                            visible: Visible { pos0, window },
                            sinks: sinks.then_some(&sink_logits[..]),
                        };
                        let want = one_query_at_a_time(&a, rows);
                        // Stale values in the outputs and the scratch must not matter.
                        let mut got = vec![f32::NAN; want.len()];
                        let mut probs = vec![f32::NAN; 3];
                        a.run(&mut got, &mut probs);
                        let mut par = vec![f32::NAN; want.len()];
                        a.run_par(&mut par);
                        // Chunks of 16 rows and more score their keys by column: by row too.
                        let mut by_row = vec![f32::NAN; want.len()];
                        a.run_par_by_row(&mut by_row);
                        if rows == 1 {
                            // A decode row's heads across the threads.
                            let mut by_head = vec![f32::NAN; want.len()];
                            a.run_row_par(&mut by_head, &mut vec![f32::NAN; 5]);
                            assert_eq!(
                                by_head.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                                "{heads}/{kv_heads} heads of {hd} at {pos0}, window {window:?}, \
                                 sinks {sinks}: heads across the threads"
                            );
                        }
                        for (i, (((w, g), p), r)) in
                            want.iter().zip(&got).zip(&par).zip(&by_row).enumerate()
                        {
                            let case = format!(
                                "{heads}/{kv_heads} heads of {hd}, {rows} rows at {pos0}, \
                                 window {window:?}, sinks {sinks}: output {i}"
                            );
                            assert_eq!(w.to_bits(), g.to_bits(), "{case}: {w} vs {g}");
                            assert_eq!(w.to_bits(), p.to_bits(), "{case} (threads): {w} vs {p}");
                            assert_eq!(w.to_bits(), r.to_bits(), "{case} (by row): {w} vs {r}");
                        }
                        cases += 1;
                    }
                }
            }
        }
        assert_eq!(cases, 4 * 3 * 11 * 4);
    }

    /// A window shorter than the tile: rows of one tile whose keys do not overlap at all.
    #[test]
    fn a_window_of_one_key_sees_only_its_own_position() {
        let (heads, kv_heads, hd, rows) = (8, 2, 32, 6);
        let mut x = crate::rng::XorShift64(7);
        let q = values(rows * heads * hd, &mut x);
        let k = values(rows * kv_heads * hd, &mut x);
        let v = values(rows * kv_heads * hd, &mut x);
        let a = Attend {
            shape: AttnShape {
                heads,
                kv_heads,
                head_dim: hd,
                scale: 0.1,
            },
            q: &q,
            k: &k,
            v: &v,
            visible: Visible {
                pos0: 0,
                window: Some(1),
            },
            sinks: None,
        };
        let mut out = vec![0f32; rows * heads * hd];
        a.run(&mut out, &mut Vec::new());
        // One key: probability 1, the output is that position's value row.
        for s in 0..rows {
            for h in 0..heads {
                let (o, val) = (
                    &out[(s * heads + h) * hd..][..hd],
                    &v[(s * kv_heads + h / 4) * hd..][..hd],
                );
                assert_eq!(o, val, "row {s} head {h}");
            }
        }
    }
}
