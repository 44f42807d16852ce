//! Live re-pin (upstream `c/tier.h` `tier_pick_lfru`, §3.4): at safe points, swap the coldest
//! pinned expert of a layer for the hottest unpinned one when the session heat says so.
//!
//! Score `(heat << 8) | recent`, `recent = 255 - age` for an age (in positions) under 255,
//! else 0. A swap needs `hot > cold + cold/4 + (4 << 8)` (25% + 4 hysteresis, so two experts
//! of similar heat do not trade places every pass); its gain is `(hot - cold) >> 8`. At most
//! `limit` swaps per pass, the largest gains first; after a pass every heat is halved.

/// `last` value of an expert never selected.
pub const NEVER: u64 = u64::MAX;

/// Swaps per pass (upstream RFC #11).
pub const SWAPS_PER_PASS: usize = 4;

pub fn score(heat: u32, last: u64, clock: u64) -> u64 {
    let recent = if last == NEVER {
        0
    } else {
        255u64.saturating_sub(clock.saturating_sub(last))
    };
    ((heat as u64) << 8) | recent
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Swap {
    pub layer: usize,
    pub evict: usize,
    pub evict_heat: u32,
    pub admit: usize,
    pub admit_heat: u32,
    pub gain: u64,
}

/// The best swap of one layer, if it clears the hysteresis. `pinned[e]` marks the pinned set.
pub fn pick_layer(
    layer: usize,
    heat: &[u32],
    last: &[u64],
    clock: u64,
    pinned: &[bool],
) -> Option<Swap> {
    let s = |e: usize| score(heat[e], last[e], clock);
    let cold = (0..pinned.len())
        .filter(|&e| pinned[e])
        .min_by_key(|&e| (s(e), e))?;
    let hot = (0..pinned.len())
        .filter(|&e| !pinned[e])
        .max_by_key(|&e| (s(e), std::cmp::Reverse(e)))?;
    let (cs, hs) = (s(cold), s(hot));
    (hs > cs + cs / 4 + (4 << 8)).then_some(Swap {
        layer,
        evict: cold,
        evict_heat: heat[cold],
        admit: hot,
        admit_heat: heat[hot],
        gain: (hs - cs) >> 8,
    })
}

/// The `limit` best swaps, largest gain first (ties: lower layer first).
pub fn pick(mut candidates: Vec<Swap>, limit: usize) -> Vec<Swap> {
    candidates.sort_by(|a, b| b.gain.cmp(&a.gain).then(a.layer.cmp(&b.layer)));
    candidates.truncate(limit);
    candidates
}

/// Halves every heat (after each pass).
pub fn decay(heat: &mut [u32]) {
    heat.iter_mut().for_each(|h| *h >>= 1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn score_mixes_heat_and_recency() {
        assert_eq!(score(3, 100, 100), (3 << 8) | 255);
        assert_eq!(score(3, 90, 100), (3 << 8) | 245);
        assert_eq!(score(3, 0, 1000), 3 << 8);
        assert_eq!(score(0, NEVER, 5), 0);
    }

    #[test]
    fn hysteresis_needs_25_percent_plus_4() {
        let pinned = [true, false];
        let last = [NEVER, NEVER];
        // cold 16 -> needs hot > 16 + 4 + 4 = 24 (in heat units, no recency)
        assert_eq!(pick_layer(0, &[16, 24], &last, 0, &pinned), None);
        let s = pick_layer(0, &[16, 25], &last, 0, &pinned).unwrap();
        assert_eq!((s.evict, s.admit, s.gain), (0, 1, 9));
        // near-equal heat never swaps back and forth
        assert_eq!(pick_layer(0, &[10, 12], &last, 0, &pinned), None);
        // a pinned set with nothing unpinned, or nothing pinned: no swap
        assert_eq!(pick_layer(0, &[1, 100], &last, 0, &[true, true]), None);
        assert_eq!(pick_layer(0, &[1, 100], &last, 0, &[false, false]), None);
    }

    #[test]
    fn picks_coldest_pinned_and_hottest_unpinned() {
        let pinned = [true, true, false, false];
        let heat = [40, 2, 30, 90];
        let last = [NEVER; 4];
        let s = pick_layer(7, &heat, &last, 0, &pinned).unwrap();
        assert_eq!(
            (s.layer, s.evict, s.evict_heat, s.admit, s.admit_heat),
            (7, 1, 2, 3, 90)
        );
    }

    #[test]
    fn limit_keeps_largest_gains_and_decay_halves() {
        let mk = |layer, gain| Swap {
            layer,
            evict: 0,
            evict_heat: 0,
            admit: 1,
            admit_heat: 0,
            gain,
        };
        let c = vec![mk(0, 5), mk(1, 50), mk(2, 7), mk(3, 50), mk(4, 1), mk(5, 9)];
        let got: Vec<usize> = pick(c, SWAPS_PER_PASS).iter().map(|s| s.layer).collect();
        assert_eq!(got, vec![1, 3, 5, 2]);
        let mut h = [9, 1, 0, 1000];
        decay(&mut h);
        assert_eq!(h, [4, 0, 0, 500]);
        // heat that stopped coming decays until the hysteresis blocks it again
        let pinned = [true, false];
        let mut heat = [0u32, 40];
        assert!(pick_layer(0, &heat, &[NEVER; 2], 0, &pinned).is_some());
        for _ in 0..3 {
            decay(&mut heat);
        }
        assert!(pick_layer(0, &heat, &[NEVER; 2], 0, &pinned).is_some()); // 5 > 0 + 4
        decay(&mut heat);
        assert!(pick_layer(0, &heat, &[NEVER; 2], 0, &pinned).is_none()); // 2 <= 0 + 4
    }
}
