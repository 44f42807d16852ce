//! What cache-aware routing (`crate::cache_route`) asks the store: whether each expert of a
//! layer is resident (pinned, in the LRU or in the VRAM tier), and its counters.

use crate::cache_route::{CacheRoute, RouteCounts};

use super::ExpertStore;

impl ExpertStore {
    /// The cache-aware routing, when `--cache-route` turned it on.
    pub fn cache_route(&self) -> Option<&CacheRoute> {
        self.cache_route.as_ref()
    }

    /// Its counters since the start (all zero, `on: false`, when off).
    pub fn route_counts(&self) -> RouteCounts {
        self.cache_route
            .as_ref()
            .map_or_else(RouteCounts::default, CacheRoute::counts)
    }

    /// `mask[e]`: whether expert `e` of `layer` would be served without a read from disk. One
    /// lock for the whole layer; allocation-free once `mask` has its length. An expert a pilot
    /// guess is still reading counts as not resident: the read may not be done in time. A
    /// dense layer has none resident.
    pub(crate) fn resident_mask(&self, layer: usize, mask: &mut Vec<bool>) {
        mask.clear();
        mask.resize(self.n_experts, false);
        let Ok(l) = self.layer(layer) else {
            return;
        };
        let st = l.lock();
        for (e, m) in mask.iter_mut().enumerate() {
            *m = st.pinned[e].is_some() || st.lru.contains(e) || self.in_vram(layer, e);
        }
    }
}
