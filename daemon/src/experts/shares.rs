//! Per-layer capacity shares (`--cache-shares`): the same number of cached experts in all,
//! but split between the layers by how much each one's hit rate gains from another slot.
//!
//! Layers do not reuse alike: one keeps coming back to a handful of experts, another spreads
//! its picks over many. A flat cap gives both the same slots; shares move slots to where they
//! hit. Each layer's cache measures its own reuse as LRU stack distances ([`ReuseMeter`]):
//! a request found at depth `d` of the layer's recency stack would hit in any cache of more
//! than `d` slots, so the histogram is the hits each further slot buys. [`split`] hands the
//! slots out one at a time to the layer gaining most. The store re-splits every
//! [`RESPLIT_EVERY`] requests per layer, halving the histograms each time so the split follows
//! what the model does now.

use super::policy::CachePolicy;

/// Requests per sparse layer between two splits (and between two halvings of the
/// histograms). Chosen on route traces of the medium and demo models (`examples/cache_sim`,
/// `lfu`): at 256 the shares beat the flat cap at 4, 8 and 16 slots on a 600-token medium
/// trace (0.489 / 0.902 / 0.975 against 0.467 / 0.898 / 0.942) and stay within 1.5% of it on
/// the 3-layer demo; at 16 and 64 the histograms were too thin and the split lost at 4 or 8.
pub const RESPLIT_EVERY: u64 = 256;

/// One layer's reuse: per depth `d`, how many requests a cache of `d + 1` slots would have
/// hit and one of `d` would not, under the layer's policy. For the recency policies the depth
/// is the LRU stack distance (the stack of the experts that reached the cache, most recent
/// first). `lfu` keeps the most requested experts, so there the depth is the expert's rank in
/// that order (experts requested more often, or as often and more recently); its counts halve
/// with the histogram.
pub struct ReuseMeter {
    stack: Vec<u32>,
    hist: Vec<u64>,
    count: Vec<u64>,
    /// When each expert was last recorded (`lfu` breaks count ties by recency).
    last: Vec<u64>,
    clock: u64,
    by_freq: bool,
}

impl ReuseMeter {
    /// A meter for a cache run under `policy`: frequency ranks for `lfu`, stack distances for
    /// the recency policies.
    pub fn new(n_experts: usize, policy: CachePolicy) -> ReuseMeter {
        ReuseMeter {
            stack: Vec::with_capacity(n_experts),
            hist: vec![0; n_experts],
            count: vec![0; n_experts],
            last: vec![0; n_experts],
            clock: 0,
            by_freq: policy == CachePolicy::Lfu,
        }
    }

    /// Expert `e` is asked of the cache (hit or miss). A first use counts at no depth.
    pub fn record(&mut self, e: usize) {
        if e >= self.hist.len() {
            return;
        }
        if self.by_freq {
            let key = (self.count[e], self.last[e]);
            // Seen before (its count may have halved to 0 since).
            if key.1 > 0 {
                // Its place in lfu's keep order: more requests, or as many and more recent.
                let rank = self
                    .count
                    .iter()
                    .zip(&self.last)
                    .filter(|&(&c, &l)| (c, l) > key)
                    .count();
                self.hist[rank] += 1;
            }
            self.clock += 1;
            self.count[e] += 1;
            self.last[e] = self.clock;
            return;
        }
        if let Some(d) = self.stack.iter().position(|&x| x as usize == e) {
            self.hist[d] += 1;
            self.stack.remove(d);
        }
        self.stack.insert(0, e as u32);
    }

    /// Requests found at each stack depth since the histogram began (halved by [`age`]).
    ///
    /// [`age`]: ReuseMeter::age
    pub fn hist(&self) -> &[u64] {
        &self.hist
    }

    /// Halves the histogram: what was measured a split ago counts half as much as what comes.
    pub fn age(&mut self) {
        self.hist.iter_mut().for_each(|h| *h /= 2);
        self.count.iter_mut().for_each(|c| *c /= 2);
    }
}

/// Slots per layer, `total` in all (at least one per layer, none above `n_experts`), given
/// to the layer whose next slots gain most. A layer's gain from `c` slots on is the best
/// average over its next few slots (hits at depths `c..=k` over `k + 1 - c` slots), so a layer
/// cycling over a set of `k` experts, which hits nothing until it has all `k`, is not starved
/// by layers gaining a little from the very next slot. Slots no measured reuse asks for are
/// spread evenly. Ties go to the lower layer: the split is a function of the histograms.
pub fn split<H: AsRef<[u64]>>(hists: &[H], total: usize, n_experts: usize) -> Vec<usize> {
    let mut out = Vec::new();
    split_into(hists, total, n_experts, &mut out, &mut Vec::new());
    out
}

/// [`split`] into `out`, with `gains` as scratch: nothing allocated once both have room for
/// every layer (the store re-splits in the middle of decode).
pub fn split_into<H: AsRef<[u64]>>(
    hists: &[H],
    total: usize,
    n_experts: usize,
    out: &mut Vec<usize>,
    gains: &mut Vec<f64>,
) {
    let n_layers = hists.len();
    let n = n_experts.max(1);
    out.clear();
    out.resize(n_layers, 1);
    let mut left = total.min(n * n_layers).saturating_sub(n_layers);
    let gain = |h: &[u64], c: usize| -> f64 {
        let mut sum = 0u64;
        let mut best = 0.0f64;
        for (k, &g) in h.iter().enumerate().skip(c) {
            sum += g;
            best = best.max(sum as f64 / (k + 1 - c) as f64);
        }
        best
    };
    gains.clear();
    gains.extend(hists.iter().map(|h| gain(h.as_ref(), 1)));
    while left > 0 {
        let best = (0..n_layers)
            .filter(|&l| out[l] < n && gains[l] > 0.0)
            .max_by(|&a, &b| gains[a].total_cmp(&gains[b]).then(b.cmp(&a)));
        let Some(l) = best else { break };
        out[l] += 1;
        gains[l] = gain(hists[l].as_ref(), out[l]);
        left -= 1;
    }
    // What no layer's reuse asks for: evenly, the least-served layer first.
    while left > 0 {
        let Some(l) = (0..n_layers)
            .filter(|&l| out[l] < n)
            .min_by_key(|&l| (out[l], l))
        else {
            break;
        };
        out[l] += 1;
        left -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_distances_count_the_slots_a_hit_needed() {
        let mut m = ReuseMeter::new(8, CachePolicy::Lru);
        // 0 1 2 0: the second 0 is found under 1 and 2 (depth 2); 2 then at depth 1.
        for e in [0, 1, 2, 0, 2] {
            m.record(e);
        }
        assert_eq!(&m.hist()[..4], &[0, 1, 1, 0]);
        m.record(2); // at the top now
        assert_eq!(m.hist()[0], 1);
        m.age();
        assert_eq!(&m.hist()[..4], &[0, 0, 0, 0]);
        m.record(99); // out of range: ignored
    }

    #[test]
    fn under_lfu_the_depth_is_the_rank_by_count() {
        let mut m = ReuseMeter::new(8, CachePolicy::Lfu);
        // 0 three times, 1 twice, then 2: 2's second use ranks under 0 and 1 (depth 2).
        for e in [0, 0, 0, 1, 1, 2, 2] {
            m.record(e);
        }
        // 0: ranks 0, 0; 1: rank 1 (under 0); 2: rank 2.
        assert_eq!(&m.hist()[..4], &[2, 1, 1, 0]);
        m.age();
        assert_eq!(&m.hist()[..4], &[1, 0, 0, 0]);
        // Counts halved too, to 1 each (last used at 3, 5 and 7). Equal counts rank by
        // recency, as lfu evicts them: 1 is under 2.
        m.record(1);
        assert_eq!(m.hist()[1], 1);
        // 0: under 1 (now counted twice) and 2 (as often, more recent).
        m.record(0);
        assert_eq!(m.hist()[2], 1);
    }

    #[test]
    fn slots_go_where_they_hit() {
        // Layer 0 hits at depths 0..4 (a cycle of 4 needs 4 slots); layer 1 only at depth 0.
        let a = [0, 0, 0, 40, 0, 0, 0, 0];
        let b = [40, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(split(&[&a, &b], 6, 8), vec![4, 1 + 1]);
        // The total is kept, and nothing goes past the number of experts.
        assert_eq!(split(&[&a, &b], 20, 8), vec![8, 8]);
        assert_eq!(split(&[&a, &b], 9, 8).iter().sum::<usize>(), 9);
    }

    #[test]
    fn without_measured_reuse_the_split_is_flat() {
        let z = [0u64; 8];
        assert_eq!(split(&[&z, &z, &z], 12, 8), vec![4, 4, 4]);
        assert_eq!(split(&[&z, &z, &z], 13, 8), vec![5, 4, 4]);
        // Fewer slots than layers: every layer still keeps one.
        assert_eq!(split(&[&z, &z, &z], 2, 8), vec![1, 1, 1]);
    }
}
