//! Whether the pilot's guesses pay, per layer.
//!
//! Every guess for a layer is scored when that layer's batch asks for its experts, whether or
//! not it was read: a guess of a non-resident expert the batch then wants is *used* (its read
//! came early, a stall saved), any other is *wasted* (a read nobody needed). A layer's guesses
//! are read only while its measured precision (used / guessed, over a recent window) is at least
//! one half: below that the pilot reads more bytes for nothing than it takes off the stall
//! path. Guesses keep being scored while a layer is off, so it comes back when routing turns
//! predictable again.

/// Guesses a layer is scored on before its precision decides anything.
pub const MIN_GUESSES: u64 = 32;
/// Precision at which a guess saves as many read bytes on the stall path as wrong ones waste.
pub const PAYS_AT: f64 = 0.5;
/// The window: counts halve when the guesses reach this, so old routing fades.
const WINDOW: u64 = 512;

#[derive(Clone, Debug, Default)]
pub struct LayerPilot {
    /// The last guess (non-resident experts), waiting for the layer's batch.
    pub shadow: Vec<usize>,
    /// Windowed counts deciding on/off.
    win_guessed: u64,
    win_used: u64,
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
    /// Whether this layer's guesses are worth reading now.
    pub fn pays(&self) -> bool {
        self.win_guessed < MIN_GUESSES || self.win_used as f64 >= PAYS_AT * self.win_guessed as f64
    }

    /// Scores the pending guess against the experts the batch needs from disk (`needed`:
    /// wanted and neither pinned nor cached). Returns the guesses that were used.
    pub fn score(&mut self, needed: &[usize]) -> usize {
        let used = self.shadow.iter().filter(|e| needed.contains(e)).count();
        let guessed = self.shadow.len() as u64;
        self.shadow.clear();
        self.guessed += guessed;
        self.used += used as u64;
        self.needed += needed.len() as u64;
        self.win_guessed += guessed;
        self.win_used += used as u64;
        if self.win_guessed >= WINDOW {
            self.win_guessed /= 2;
            self.win_used /= 2;
        }
        used
    }

    pub fn precision(&self) -> f64 {
        ratio(self.used, self.guessed)
    }

    pub fn recall(&self) -> f64 {
        ratio(self.used, self.needed)
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

    #[test]
    fn precision_decides_and_recovers() {
        let mut p = LayerPilot::default();
        assert!(p.pays(), "unmeasured layers are given a chance");
        // 40 guesses, 10 used: 25% precision, off.
        for i in 0..10 {
            p.shadow = vec![i, 100 + i, 200 + i, 300 + i];
            assert_eq!(p.score(&[i, 50]), 1);
        }
        assert!(!p.pays());
        assert_eq!((p.guessed, p.used, p.needed), (40, 10, 20));
        assert_eq!(p.precision(), 0.25);
        assert_eq!(p.recall(), 0.5);
        // Routing becomes predictable: every guess used, precision climbs back over 50%.
        for i in 0..20 {
            p.shadow = vec![i, i + 1];
            p.score(&[i, i + 1]);
        }
        assert!(p.pays());
    }

    #[test]
    fn the_window_forgets_old_routing() {
        let mut p = LayerPilot::default();
        for _ in 0..200 {
            p.shadow = vec![1, 2];
            p.score(&[1, 2]);
        }
        // A long run of wrong guesses turns it off within the window, not after the history.
        let mut turns_off_after = None;
        for i in 0..400 {
            p.shadow = vec![3, 4];
            p.score(&[1]);
            if !p.pays() {
                turns_off_after = Some(i);
                break;
            }
        }
        let n = turns_off_after.expect("never turned off");
        assert!(n < 200, "took {n} batches");
    }
}
