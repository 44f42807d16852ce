//! One layer's cache of experts, indexed by expert id, evicting by `--cache-policy`
//! ([`super::policy`]; plain LRU by default in the unit tests below).
//!
//! Recency is a stamp handed out when an expert is *requested*, not when its load completes,
//! and eviction always drops the lowest key among the entries present and the one being
//! inserted. So the set kept after a batch of inserts is the `cap` highest keys whatever
//! order the I/O workers finish in: the cache (and the hit rate) stay deterministic with
//! `--pipe`.

use super::policy::{CachePolicy, Keys};
use super::shares::ReuseMeter;

pub struct Lru<V> {
    cap: usize,
    slots: Vec<Option<V>>,
    len: usize,
    keys: Keys,
    /// With `--cache-shares`: where every request, hit or miss, sat in the policy's keep order.
    reuse: Option<ReuseMeter>,
}

impl<V> Lru<V> {
    /// An empty LRU over experts `0..n` holding at most `cap` (>= 1 unless 0 = nothing).
    pub fn new(n: usize, cap: usize) -> Lru<V> {
        Lru::with_policy(n, cap, CachePolicy::Lru)
    }

    pub fn with_policy(n: usize, cap: usize, policy: CachePolicy) -> Lru<V> {
        Lru {
            cap,
            slots: (0..n).map(|_| None).collect(),
            len: 0,
            keys: Keys::new(n, policy),
            reuse: None,
        }
    }

    /// Starts measuring the layer's reuse ([`ReuseMeter`]) for per-layer shares.
    pub fn measure_reuse(&mut self) {
        if self.reuse.is_none() {
            self.reuse = Some(ReuseMeter::new(self.slots.len(), self.keys.policy()));
        }
    }

    pub fn reuse(&self) -> Option<&ReuseMeter> {
        self.reuse.as_ref()
    }

    pub fn reuse_mut(&mut self) -> Option<&mut ReuseMeter> {
        self.reuse.as_mut()
    }

    pub fn policy(&self) -> CachePolicy {
        self.keys.policy()
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn contains(&self, e: usize) -> bool {
        self.slots.get(e).is_some_and(|s| s.is_some())
    }

    /// A batch of `rows` positions is about to ask for its experts.
    pub fn begin_batch(&mut self, rows: usize) {
        self.keys.begin_batch(rows);
    }

    /// A fresh recency stamp (newer than every stamp handed out before).
    pub fn stamp(&mut self) -> u64 {
        self.keys.tick()
    }

    /// Expert `e` is asked for and is not cached: counted for the policy; the stamp to insert
    /// it with once loaded.
    pub fn request(&mut self, e: usize) -> u64 {
        if let Some(m) = &mut self.reuse {
            m.record(e);
        }
        self.keys.request(e)
    }

    /// The entry for `e`, marked as used now.
    pub fn get(&mut self, e: usize) -> Option<&V> {
        if !self.contains(e) {
            return None;
        }
        if let Some(m) = &mut self.reuse {
            m.record(e);
        }
        self.keys.request(e);
        self.keys.hit(e);
        self.slots[e].as_ref()
    }

    /// The entry for `e` without touching its recency.
    pub fn peek(&self, e: usize) -> Option<&V> {
        self.slots.get(e)?.as_ref()
    }

    /// Inserts `v` for `e` with `stamp` (from [`Lru::stamp`] or [`Lru::request`]), then evicts
    /// the lowest keys (possibly `e` itself) until `cap` fit. Returns the evicted ids.
    pub fn insert(&mut self, e: usize, v: V, stamp: u64) -> Vec<usize> {
        if e >= self.slots.len() {
            return Vec::new();
        }
        if self.slots[e].is_none() {
            self.len += 1;
        }
        self.slots[e] = Some(v);
        self.keys.set_stamp(e, stamp);
        self.keys.admit(e);
        self.shrink_to(self.cap)
    }

    pub fn remove(&mut self, e: usize) -> Option<V> {
        let v = self.slots.get_mut(e)?.take()?;
        self.len -= 1;
        Some(v)
    }

    /// Changes the capacity, evicting the lowest keys when it shrinks.
    pub fn set_cap(&mut self, cap: usize) -> Vec<usize> {
        self.cap = cap;
        self.shrink_to(cap)
    }

    fn shrink_to(&mut self, n: usize) -> Vec<usize> {
        let mut evicted = Vec::new();
        while self.len > n {
            let victim = (0..self.slots.len())
                .filter(|&i| self.slots[i].is_some())
                .min_by(|&a, &b| self.keys.cmp(a, b));
            match victim {
                Some(i) => {
                    self.slots[i] = None;
                    self.len -= 1;
                    evicted.push(i);
                }
                None => break,
            }
        }
        evicted
    }

    /// Ids present, in id order.
    pub fn ids(&self) -> impl Iterator<Item = usize> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|_| i))
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.slots.iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used() {
        let mut l = Lru::new(8, 2);
        let s = l.stamp();
        assert!(l.insert(1, "a", s).is_empty());
        let s = l.stamp();
        assert!(l.insert(2, "b", s).is_empty());
        assert_eq!(l.get(1), Some(&"a")); // 1 is now newer than 2
        let s = l.stamp();
        assert_eq!(l.insert(3, "c", s), vec![2]);
        assert!(l.contains(1) && l.contains(3) && !l.contains(2));
        assert_eq!(l.len(), 2);
    }

    #[test]
    fn capacity_one_keeps_only_the_newest() {
        let mut l = Lru::new(4, 1);
        for e in 0..4 {
            let s = l.stamp();
            l.insert(e, e, s);
            assert_eq!(l.ids().collect::<Vec<_>>(), vec![e]);
        }
    }

    #[test]
    fn insertion_order_does_not_matter() {
        // Stamps taken at request time: completing in reverse order keeps the same set.
        let run = |order: &[usize]| {
            let mut l = Lru::new(8, 2);
            let stamps: Vec<u64> = (0..4).map(|_| l.stamp()).collect();
            for &e in order {
                l.insert(e, (), stamps[e]);
            }
            l.ids().collect::<Vec<_>>()
        };
        assert_eq!(run(&[0, 1, 2, 3]), vec![2, 3]);
        assert_eq!(run(&[3, 2, 1, 0]), vec![2, 3]);
        assert_eq!(run(&[1, 3, 0, 2]), vec![2, 3]);
    }

    #[test]
    fn shrinking_the_cap_evicts_oldest() {
        let mut l = Lru::new(8, 4);
        for e in [5, 6, 7, 0] {
            let s = l.stamp();
            l.insert(e, (), s);
        }
        assert_eq!(l.set_cap(2), vec![5, 6]);
        assert_eq!(l.ids().collect::<Vec<_>>(), vec![0, 7]);
        assert_eq!(l.remove(7), Some(()));
        assert_eq!(l.len(), 1);
        assert!(l.peek(0).is_some());
    }

    #[test]
    fn lfu_refuses_an_expert_colder_than_everything_cached() {
        let mut l = Lru::with_policy(8, 2, CachePolicy::Lfu);
        for e in [0, 1] {
            let s = l.request(e);
            l.insert(e, (), s);
        }
        for _ in 0..3 {
            assert!(l.get(0).is_some() && l.get(1).is_some());
        }
        // 5 is newer but asked for once: used, and not kept.
        let s = l.request(5);
        assert_eq!(l.insert(5, (), s), vec![5]);
        assert_eq!(l.ids().collect::<Vec<_>>(), vec![0, 1]);
        // Asked for often enough, it displaces the colder of the two.
        for _ in 0..4 {
            assert!(l.get(0).is_some());
        }
        for _ in 0..5 {
            let s = l.request(5);
            l.insert(5, (), s);
        }
        assert_eq!(l.ids().collect::<Vec<_>>(), vec![0, 5]);
    }
}
