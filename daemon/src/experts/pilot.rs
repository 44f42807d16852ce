//! How deep the pilot reads, per layer.
//!
//! The pilot guesses a layer's experts from the previous layer's hidden state with the layer's
//! own router: for each row its top-k, ranked. Every guess is scored when that layer's batch
//! asks for its experts, whether or not it was read: a guess of a non-resident expert the
//! batch then wants is *used* (read early, those bytes leave the stall path), any other is
//! *wasted* (bytes read for nothing). Each guess is scored at its rank (the best any row gave
//! it), so precision is known per rank even for ranks not being read.
//!
//! The **depth** (how many ranks are read) is the number of leading ranks whose windowed
//! precision is at least one half: a rank below that wastes more bytes than it saves, and
//! ranks are independent, so reading exactly the paying ones maximises bytes saved minus bytes
//! wasted and keeps bytes wasted at most bytes saved. A rank that was left out comes back
//! only at [`PAYS_AT`] + [`HYSTERESIS`] so a rank near the line does not flap. Depth 0 turns
//! the layer off; its guesses keep being scored, so it comes back when routing turns
//! predictable again.

/// Guesses a rank is scored on before its precision decides anything.
pub const MIN_GUESSES: u64 = 16;
/// Precision at which a guess saves as many bytes on the stall path as wrong ones waste.
pub const PAYS_AT: f64 = 0.5;
/// Extra precision a rank left out needs to be read again.
pub const HYSTERESIS: f64 = 0.05;
/// The window: a rank's counts halve when its guesses reach this, so old routing fades.
const WINDOW: u64 = 256;

/// A change of a layer's depth, for the `[PILOT]` line.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DepthChange {
    pub from: usize,
    pub to: usize,
    /// Windowed precision of the deepest rank now read (`to > from`), or of the first rank
    /// dropped (`to < from`).
    pub precision: f64,
}

#[derive(Clone, Debug, Default)]
pub struct LayerPilot {
    /// The last guess (non-resident experts with their rank), waiting for the layer's batch.
    pub shadow: Vec<(usize, usize)>,
    /// Windowed counts per rank.
    win_guessed: Vec<u64>,
    win_used: Vec<u64>,
    /// Ranks read; `None` until the first score (every rank is read while unmeasured).
    depth: Option<usize>,
    /// Session totals for the report.
    pub guessed: u64,
    pub used: u64,
    /// Used guesses that had been read (queued or done) when the batch asked.
    pub read_used: u64,
    /// Of those, the ones whose read had completed.
    pub in_time: u64,
    /// Non-resident experts the batches asked for (recall's denominator).
    pub needed: u64,
    /// Guesses read (submitted to the I/O pool) and guesses dropped before a worker took them.
    pub read: u64,
    pub cancelled: u64,
}

impl LayerPilot {
    /// Ranks to read now (guesses of rank `< depth()` are read).
    pub fn depth(&self) -> usize {
        self.depth.unwrap_or(usize::MAX)
    }

    /// Whether any of this layer's guesses are worth reading now.
    pub fn pays(&self) -> bool {
        self.depth() > 0
    }

    fn rank_precision(&self, r: usize) -> Option<f64> {
        let g = *self.win_guessed.get(r)?;
        (g >= MIN_GUESSES).then(|| self.win_used[r] as f64 / g as f64)
    }

    /// Scores the pending guess against the experts the batch needs from disk (`needed`:
    /// wanted and neither pinned nor cached), then sets the depth. Returns the guesses used
    /// and the depth change, if any.
    pub fn score(&mut self, needed: &[usize]) -> (usize, Option<DepthChange>) {
        let mut used = 0;
        for &(e, r) in &self.shadow {
            if self.win_guessed.len() <= r {
                self.win_guessed.resize(r + 1, 0);
                self.win_used.resize(r + 1, 0);
            }
            let hit = needed.contains(&e);
            used += hit as usize;
            self.win_guessed[r] += 1;
            self.win_used[r] += hit as u64;
            if self.win_guessed[r] >= WINDOW {
                self.win_guessed[r] /= 2;
                self.win_used[r] /= 2;
            }
        }
        self.guessed += self.shadow.len() as u64;
        self.used += used as u64;
        self.needed += needed.len() as u64;
        self.shadow.clear();
        (used, self.update_depth())
    }

    /// The depth is the first measured rank that does not pay (unmeasured ranks, seen or
    /// not yet, are given a chance), or every rank when none fails.
    fn update_depth(&mut self) -> Option<DepthChange> {
        let from = self.depth.unwrap_or(usize::MAX);
        let to = (0..self.win_guessed.len())
            .find(|&r| {
                let bar = if r < from {
                    PAYS_AT
                } else {
                    PAYS_AT + HYSTERESIS
                };
                self.rank_precision(r).is_some_and(|p| p < bar)
            })
            .unwrap_or(usize::MAX);
        self.depth = Some(to);
        (from != to).then(|| DepthChange {
            from,
            to,
            precision: self.rank_precision(from.min(to)).unwrap_or(0.0),
        })
    }

    pub fn precision(&self) -> f64 {
        ratio(self.used, self.guessed)
    }

    pub fn recall(&self) -> f64 {
        ratio(self.used, self.needed)
    }
}

/// The `[PILOT]` line for a layer's depth change (`ranks` is the router's top-k).
pub fn depth_line(layer: usize, c: &DepthChange, ranks: usize) -> String {
    let show = |d: usize| {
        if d >= ranks {
            format!("all {ranks}")
        } else {
            d.to_string()
        }
    };
    let (from, to) = (show(c.from), show(c.to));
    if c.to == 0 {
        format!(
            "[PILOT] layer {layer}: off (depth {from} -> 0): its best-ranked guesses are used \
             {:.0}% of the time, below {:.0}% wrong guesses read more bytes than right ones \
             save; still scoring them",
            100.0 * c.precision,
            100.0 * PAYS_AT
        )
    } else if c.to < c.from {
        format!(
            "[PILOT] layer {layer}: depth {from} -> {to}: rank {} guesses used {:.0}% of the \
             time, below {:.0}% they read more bytes than they save",
            c.to + 1,
            100.0 * c.precision,
            100.0 * PAYS_AT
        )
    } else {
        format!(
            "[PILOT] layer {layer}: depth {from} -> {to}: rank {} guesses used {:.0}% of the time",
            c.from + 1,
            100.0 * c.precision
        )
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One batch: guesses `(expert, rank)`, then the batch needs `needed`.
    fn batch(
        p: &mut LayerPilot,
        guesses: &[(usize, usize)],
        needed: &[usize],
    ) -> Option<DepthChange> {
        p.shadow = guesses.to_vec();
        p.score(needed).1
    }

    #[test]
    fn depth_follows_each_ranks_precision() {
        let mut p = LayerPilot::default();
        assert!(p.pays(), "unmeasured layers are given a chance");
        assert_eq!(p.depth(), usize::MAX);
        // Rank 0 always right, rank 1 right half the time, ranks 2-3 never.
        let mut changes = Vec::new();
        for i in 0..40 {
            let g = [(i, 0), (100 + i, 1), (200 + i, 2), (300 + i, 3)];
            let need: Vec<usize> = if i % 2 == 0 {
                vec![i, 100 + i]
            } else {
                vec![i]
            };
            changes.extend(batch(&mut p, &g, &need));
        }
        assert_eq!(p.depth(), 2, "{changes:?}");
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert_eq!((changes[0].from, changes[0].to), (usize::MAX, 2));
        assert_eq!(changes[0].precision, 0.0);
        // Bytes read at this depth never exceed what they save: rank 0 + rank 1 = 60 used of 80.
        assert_eq!((p.guessed, p.used, p.needed), (160, 60, 60));
        assert_eq!(p.precision(), 60.0 / 160.0);
        assert_eq!(p.recall(), 1.0);
        let line = depth_line(3, &changes[0], 4);
        assert!(
            line.starts_with("[PILOT] layer 3: depth all 4 -> 2: rank 3 guesses used 0%"),
            "{line}"
        );
    }

    #[test]
    fn a_layer_turns_off_and_comes_back_with_hysteresis() {
        let mut p = LayerPilot::default();
        // Every guess wrong: off.
        let mut last = None;
        for i in 0..20 {
            last = batch(&mut p, &[(i, 0), (50 + i, 1)], &[99]).or(last);
        }
        assert!(!p.pays());
        let c = last.expect("a change");
        assert_eq!(c.to, 0);
        assert!(depth_line(5, &c, 8).contains("layer 5: off (depth all 8 -> 0)"));
        // Rank 0 becomes right exactly half the time: 50% is not enough to come back (55%).
        for i in 0..600 {
            let need = if i % 2 == 0 { vec![i] } else { vec![] };
            batch(&mut p, &[(i, 0)], &need);
        }
        assert!(!p.pays(), "came back at 50%");
        // Then always right: back on at depth 1 (rank 1 is still measured as wrong).
        let mut back = None;
        for i in 0..200 {
            back = batch(&mut p, &[(i, 0)], &[i]).or(back);
        }
        assert_eq!(p.depth(), 1);
        let c = back.expect("came back");
        assert_eq!((c.from, c.to), (0, 1));
        assert!(
            depth_line(5, &c, 8).starts_with("[PILOT] layer 5: depth 0 -> 1: rank 1 guesses used")
        );
    }

    #[test]
    fn the_window_forgets_old_routing() {
        let mut p = LayerPilot::default();
        for _ in 0..200 {
            batch(&mut p, &[(1, 0), (2, 1)], &[1, 2]);
        }
        assert_eq!(p.depth(), usize::MAX, "both ranks pay");
        // A long run of wrong guesses turns it off within the window, not after the history.
        let mut turns_off_after = None;
        for i in 0..400 {
            batch(&mut p, &[(3, 0), (4, 1)], &[1]);
            if !p.pays() {
                turns_off_after = Some(i);
                break;
            }
        }
        let n = turns_off_after.expect("never turned off");
        assert!(n < 200, "took {n} batches");
    }
}
