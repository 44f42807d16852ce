//! Which expert a full layer cache gives up (`--cache-policy`): the eviction keys of every
//! expert of one layer, cached or not (frequency must be known before an expert is admitted
//! for admission to be frequency-aware). The lowest key goes, a newcomer included, so an
//! expert colder than everything cached is used once and not kept.
//!
//! ```text
//! lru   key = recency stamp
//! lfu   key = (selections in this session, halved every 8 x n_experts requests; then recency)
//! slru  key = (protected?, recency): an expert first read by a prefill batch is on probation
//!       until it is asked for again, so a long prompt's sweep does not flush the decode set
//! ```
//!
//! Keys only move at request time (never when a load completes), so with `--pipe` the kept set
//! is the same whatever order the I/O workers finish in, as for the plain LRU.

use std::cmp::Ordering;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CachePolicy {
    Lru,
    #[default]
    Lfu,
    Slru,
}

impl CachePolicy {
    pub const ALL: [CachePolicy; 3] = [CachePolicy::Lru, CachePolicy::Lfu, CachePolicy::Slru];

    pub fn name(self) -> &'static str {
        match self {
            CachePolicy::Lru => "lru",
            CachePolicy::Lfu => "lfu",
            CachePolicy::Slru => "slru",
        }
    }

    pub fn parse(s: &str) -> Result<CachePolicy, String> {
        CachePolicy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("--cache-policy {s:?}: expected one of lru, lfu, slru"))
    }
}

/// Requests (per expert of the layer) between two halvings of the `lfu` counts: long enough
/// to tell a hot expert from a lucky one, short enough that a change of topic shows within a
/// few hundred tokens.
const DECAY_WINDOW_PER_EXPERT: u64 = 8;

/// Rows above which a batch is a prefill for `slru`.
const PREFILL_ROWS: usize = 1;

/// One layer's eviction keys.
pub struct Keys {
    policy: CachePolicy,
    stamp: Vec<u64>,
    freq: Vec<u32>,
    protected: Vec<bool>,
    clock: u64,
    since_decay: u64,
    window: u64,
    prefill: bool,
}

impl Keys {
    pub fn new(n_experts: usize, policy: CachePolicy) -> Keys {
        Keys {
            policy,
            stamp: vec![0; n_experts],
            freq: vec![0; n_experts],
            protected: vec![false; n_experts],
            clock: 0,
            since_decay: 0,
            window: (n_experts as u64 * DECAY_WINDOW_PER_EXPERT).max(1),
            prefill: false,
        }
    }

    pub fn policy(&self) -> CachePolicy {
        self.policy
    }

    /// A batch of `rows` positions begins.
    pub fn begin_batch(&mut self, rows: usize) {
        self.prefill = rows > PREFILL_ROWS;
    }

    /// A fresh recency stamp.
    pub fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Expert `e` is asked for (hit or miss): counted, and stamped now.
    pub fn request(&mut self, e: usize) -> u64 {
        let s = self.tick();
        self.request_stamped(e, s);
        s
    }

    /// [`Keys::request`] with a stamp taken by the caller.
    pub fn request_stamped(&mut self, e: usize, stamp: u64) {
        if e >= self.freq.len() {
            return;
        }
        self.stamp[e] = stamp;
        if self.policy == CachePolicy::Lfu {
            self.freq[e] = self.freq[e].saturating_add(1);
            self.since_decay += 1;
            if self.since_decay >= self.window {
                self.since_decay = 0;
                self.freq.iter_mut().for_each(|f| *f >>= 1);
            }
        }
    }

    /// The recency of `e` (a stamp taken from [`Keys::tick`] when it was asked for).
    pub fn set_stamp(&mut self, e: usize, stamp: u64) {
        if let Some(s) = self.stamp.get_mut(e) {
            *s = stamp;
        }
    }

    /// `e` was found cached: a second use ends its probation.
    pub fn hit(&mut self, e: usize) {
        if let Some(p) = self.protected.get_mut(e) {
            *p = true;
        }
    }

    /// `e` enters the cache: on probation when a prefill read it.
    pub fn admit(&mut self, e: usize) {
        if let Some(p) = self.protected.get_mut(e) {
            *p = !self.prefill;
        }
    }

    /// Eviction order: `Less` means `a` goes before `b`.
    pub fn cmp(&self, a: usize, b: usize) -> Ordering {
        let by_stamp = self.stamp[a].cmp(&self.stamp[b]);
        match self.policy {
            CachePolicy::Lru => by_stamp,
            CachePolicy::Lfu => self.freq[a].cmp(&self.freq[b]).then(by_stamp),
            CachePolicy::Slru => self.protected[a].cmp(&self.protected[b]).then(by_stamp),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_names_are_refused() {
        for p in CachePolicy::ALL {
            assert_eq!(CachePolicy::parse(p.name()), Ok(p));
        }
        let err = CachePolicy::parse("arc").unwrap_err();
        assert!(
            err.contains("\"arc\"") && err.contains("lru, lfu, slru"),
            "{err}"
        );
    }

    #[test]
    fn lfu_counts_decay_so_old_habits_fade() {
        let mut k = Keys::new(2, CachePolicy::Lfu); // window 16 requests
        for _ in 0..15 {
            k.request(0);
        }
        k.request(1); // 16th request: halving, 0 -> 7, 1 -> 0
        assert_eq!((k.freq[0], k.freq[1]), (7, 0));
        assert_eq!(k.cmp(1, 0), Ordering::Less);
        for _ in 0..8 {
            k.request(1);
        }
        assert_eq!(k.cmp(0, 1), Ordering::Less); // 1 is hotter now
    }

    #[test]
    fn slru_puts_prefill_reads_on_probation() {
        let mut k = Keys::new(4, CachePolicy::Slru);
        k.begin_batch(1);
        k.request(0);
        k.admit(0);
        k.begin_batch(64);
        k.request(1);
        k.admit(1);
        // 1 is newer, but on probation: it goes first.
        assert_eq!(k.cmp(1, 0), Ordering::Less);
        k.begin_batch(1);
        k.request(1);
        k.hit(1);
        assert_eq!(k.cmp(0, 1), Ordering::Less);
    }
}
