//! The store's side of the pilot (`--pilot`): reading a layer's guessed experts ahead on the
//! I/O pool, scoring each guess when the layer asks for its experts, and the `[PROF] pilot:`
//! report. How deep each layer reads is `pilot`'s; whether guesses are read at all, `regime`'s.

use std::sync::atomic::Ordering;

use super::pipe::{Claim, Pipe};
use super::stats::PrefetchCounts;
use super::{pilot, ExpertStore, LayerState, GB_F};

impl ExpertStore {
    /// Scores the layer's pending pilot guess against what this batch needs from disk, and
    /// says so when the last layer whose guesses paid stops paying (or the first comes back).
    pub(super) fn score_pilot(&self, layer: usize, st: &mut LayerState, wanted: &[usize]) {
        let before = st.pilot.pays();
        let needed: Vec<usize> = wanted
            .iter()
            .copied()
            .filter(|&e| st.pinned[e].is_none() && !st.lru.contains(e))
            .collect();
        let workers = self.pipe.as_ref().map_or(1, |p| p.workers());
        self.pilot_rounds
            .fetch_add(needed.len().div_ceil(workers) as u64, Ordering::Relaxed);
        let change = st.pilot.score(&needed).1;
        if self.cfg.pilot_depth.is_some() {
            return; // a fixed depth: scored for the report only
        }
        if let Some(c) = change {
            crate::elog!("{}", pilot::depth_line(layer, &c, self.top_k));
        }
        let after = st.pilot.pays();
        if before == after {
            return;
        }
        let p = &st.pilot;
        if after {
            if self.pilot_on.fetch_add(1, Ordering::Relaxed) == 0 {
                crate::elog!(
                    "[PILOT] on again: layer {layer}'s guesses pay ({:.0}% precision)",
                    100.0 * p.precision()
                );
            }
        } else if self.pilot_on.fetch_sub(1, Ordering::Relaxed) == 1 {
            crate::elog!(
                "[PILOT] off: no layer's guesses pay (layer {layer}: {:.0}% precision, it pays \
                 from {:.0}%: below that wrong guesses read more bytes than right ones save); \
                 still scoring them",
                100.0 * p.precision(),
                100.0 * pilot::PAYS_AT
            );
        }
    }

    /// Pilot totals over the sparse layers and per layer `(layer, precision, recall)`.
    pub fn pilot_report(&self) -> Option<String> {
        if !self.pilot_enabled() {
            return None;
        }
        let mut tot = pilot::LayerPilot::default();
        let mut per = String::new();
        let mut on = 0;
        for (l, st) in self.layers.iter().enumerate() {
            let Some(st) = st else { continue };
            let p = st.lock().pilot.clone();
            tot.guessed += p.guessed;
            tot.used += p.used;
            tot.needed += p.needed;
            tot.in_time += p.in_time;
            tot.read_used += p.read_used;
            tot.read += p.read;
            tot.cancelled += p.cancelled;
            on += p.pays() as usize;
            per.push_str(&format!(
                " {l}:{:.0}/{:.0}@{}",
                100.0 * p.precision(),
                100.0 * p.recall(),
                self.cfg.pilot_depth.unwrap_or(p.depth()).min(self.top_k)
            ));
        }
        let skipped = self.core.stats.pilot_skipped.load(Ordering::Relaxed);
        let eb = self.expert_bytes as f64 / GB_F;
        let read = tot.read.saturating_sub(skipped);
        Some(format!(
            "[PROF] pilot: precision {:.0}% recall {:.0}% | {} guesses, {read} read ({:.2} GB), \
             {} of them used ({} in time), {skipped} cancelled before reading | wasted {:.2} GB \
             vs {:.2} GB moved off the stall path | layers paying {on} | per layer \
             precision/recall %@depth:{per} | {}",
            100.0 * tot.precision(),
            100.0 * tot.recall(),
            tot.guessed,
            read as f64 * eb,
            tot.read_used,
            tot.in_time,
            read.saturating_sub(tot.read_used) as f64 * eb,
            tot.read_used as f64 * eb,
            self.regime_report(),
        ))
    }

    /// What the pilot's reads ahead became so far, summed over the layers (all zero without
    /// the pilot).
    pub fn prefetch_counts(&self) -> PrefetchCounts {
        if !self.pilot_enabled() {
            return PrefetchCounts::default();
        }
        let (mut sent, mut used, mut in_time) = (0, 0, 0);
        for st in self.layers.iter().flatten() {
            let st = st.lock();
            sent += st.pilot.read;
            used += st.pilot.read_used;
            in_time += st.pilot.in_time;
        }
        let skipped = self.core.stats.pilot_skipped.load(Ordering::Relaxed);
        PrefetchCounts::from_totals(sent, skipped, used, in_time)
    }

    /// [`ExpertStore::prefetch_counts`] in bytes, for the STAT suffix; `None` unless the
    /// pilot was asked for by name (`--pilot on`): without it, and with the default `auto`,
    /// the STAT line stays upstream's, whatever `auto` decided.
    pub fn prefetch_bytes(&self) -> Option<protocol::PrefetchBytes> {
        (self.cfg.pilot == super::args::PilotMode::On && self.pilot_enabled())
            .then(|| self.prefetch_counts().bytes(self.expert_bytes))
    }

    /// Takes a staged guess back (not needed, or needed now and read as a demand load): true
    /// when no worker had started it, which is then never read and counted as skipped now,
    /// so the counts settle as the layer's experts are fetched (see `Stats::pilot_skipped`).
    pub(super) fn withdraw_guess(&self, claim: &Claim) -> bool {
        let withdrawn = claim.withdraw();
        if withdrawn {
            self.core
                .stats
                .pilot_skipped
                .fetch_add(1, Ordering::Relaxed);
        }
        withdrawn
    }

    /// Whether the pilot reads guesses ahead (`--pilot on`, or `auto` where
    /// [`ExpertStore::start`] found experts that decoding reads from disk).
    /// Whether some routed expert is read from disk while decoding (the tiers cannot hold
    /// them all): the LRU's slots then churn, and remapping them in huge pages would copy
    /// memory that is soon evicted.
    pub fn streams_from_disk(&self) -> bool {
        self.streams.load(Ordering::Relaxed)
    }

    pub fn pilot_enabled(&self) -> bool {
        self.pilot_active.load(Ordering::Relaxed) && self.pipe.is_some()
    }

    /// Pilot: reads the guesses `(expert, rank)` of `layer` ahead on the I/O pool (behind every
    /// demand load), those of a rank below the layer's depth ([`pilot`]); all are scored. They
    /// are handed to the cache only if the next [`ExpertStore::fetch_layer`] of that layer asks
    /// for them; the others are withdrawn then, and so is a wanted one no worker has started
    /// (it is read as a demand load).
    pub fn prefetch(&self, layer: usize, guess: &[(usize, usize)]) {
        let (Some(p), Ok(l)) = (&self.pipe, self.layer(layer)) else {
            return;
        };
        let mut st = l.lock();
        st.pilot.shadow.clear();
        // A regime where guesses cost more disk time than they save reads none (scored only).
        let depth = match self.cfg.pilot_depth {
            Some(d) => d,
            None if self.regime_reading() => st.pilot.depth(),
            None => 0,
        };
        for &(e, rank) in guess {
            if e >= self.n_experts
                || st.pinned[e].is_some()
                || st.lru.contains(e)
                || st.pilot.shadow.iter().any(|g| g.0 == e)
            {
                continue;
            }
            st.pilot.shadow.push((e, rank));
            if rank >= depth || st.staged.iter().any(|(s, _, _)| *s == e) {
                continue;
            }
            let (req, rx, claim) = Pipe::guess(layer, e);
            p.send_guess(req);
            st.staged.push((e, rx, claim));
            st.pilot.read += 1;
        }
    }
}
