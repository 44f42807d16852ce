//! Whether reading guesses ahead pays in the regime the store runs in.
//!
//! The per-layer depth ([`super::pilot`]) counts bytes: a rank is read when its guesses are
//! right at least half the time. That is the whole story only while the disk has idle time.
//! When it is the bottleneck a right guess removes no byte from it, it only lets it work while
//! the CPU computes, and a wrong one costs its full read time; demand loads also queue behind
//! guesses already in flight. What counts is then the compute thread's wait for reads, and
//! that is measured directly: decode steps alternate between reading guesses and not (guesses
//! are scored either way), and the wait per read round is compared: a layer needing `n`
//! experts from disk takes `ceil(n / workers)` rounds of parallel reads, so a cold layer
//! (bandwidth-bound) and a warm one with a miss or two (latency-bound) are both weighed by
//! what the disk had to do. The LRU's decisions do not depend on the pilot, so the same
//! steps need the same experts whether guesses are read or not; alternating in A B B A order
//! keeps drift (prompt, routing, other load on the disk) and an odd/even pattern of the steps
//! out of the comparison. Guesses are read only when they cut that wait by [`MARGIN_PCT`] and
//! the whole step does not take longer with them: where the dense part binds (DeepSeek-V3's
//! shapes at 8 layers, 10 GB: 2.52 tok/s with the pilot against 2.90 without) the reads the
//! guesses save are not what the step waits on, and their reads, copies and scoring take the
//! cores and the memory bandwidth the dense products need, a cost the wait for reads does not
//! see. The trial is repeated every [`RETRY_EVERY`] steps so the pilot comes back when the
//! cache warms or the disk frees up.

use std::sync::atomic::Ordering;

use super::ExpertStore;

/// Forwards of at most this many rows (decode, speculative verification) take part in the
/// trial; a long prefill waits on far more experts per step and would swamp it.
pub const TRIAL_ROWS: usize = 4;
/// Steps with guesses scored but not read before the first trial, so each rank's precision
/// (and with it the depth the trial reads at) is measured first.
pub const WARMUP: u64 = 16;
/// Steps of one trial, half of them reading guesses.
pub const TRIAL: u64 = 16;
/// Steps from the end of one trial to the start of the next.
pub const RETRY_EVERY: u64 = 256;
/// Read rounds over each half of a trial below which it says nothing (a warm cache: guesses
/// then read next to nothing either way, and reading them is kept).
pub const MIN_ROUNDS: u64 = 8;

/// What a step of the trial measured: the compute thread's wait for reads, the read rounds
/// its layers needed (per layer, its experts needed from disk over the I/O workers, rounded up)
/// and the whole step's time (from its forward's start to the next's).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Tally {
    pub steps: u64,
    pub wait_ns: u64,
    pub rounds: u64,
    pub step_ns: u64,
}

/// What one step measured: its wait for reads, its read rounds and its whole time, ns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    pub wait_ns: u64,
    pub rounds: u64,
    pub step_ns: u64,
}

impl Tally {
    fn add(&mut self, s: Sample) {
        self.steps += 1;
        self.wait_ns += s.wait_ns;
        self.rounds += s.rounds;
        self.step_ns += s.step_ns;
    }

    /// Milliseconds a step took, on average.
    pub fn ms_per_step(&self) -> f64 {
        if self.steps == 0 {
            0.0
        } else {
            self.step_ns as f64 / 1e6 / self.steps as f64
        }
    }

    /// Milliseconds of wait per read round.
    pub fn ms_per_round(&self) -> f64 {
        if self.rounds == 0 {
            0.0
        } else {
            self.wait_ns as f64 / 1e6 / self.rounds as f64
        }
    }
}

/// A trial's outcome.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verdict {
    pub with: Tally,
    pub without: Tally,
    pub read: bool,
}

#[derive(Clone, Debug)]
enum Phase {
    /// Guesses are not read until `until` steps were seen.
    Warmup { until: u64 },
    /// Alternating in pairs from the step at `started`: read, not, not, read, read, not...
    Trial {
        started: u64,
        with: Tally,
        without: Tally,
    },
    /// The last verdict holds until step `until`.
    Settled { until: u64 },
}

/// The trial's state machine, driven once per forward.
#[derive(Clone, Debug)]
pub struct Regime {
    steps: u64,
    phase: Phase,
    /// Whether the step in progress reads guesses.
    reading: bool,
    /// Whether the step in progress takes part in the trial.
    counted: bool,
    pub last: Option<Verdict>,
    /// Steps that read guesses and steps that did not, over the session.
    pub steps_read: u64,
    pub steps_total: u64,
    /// The store's cumulative wait and read rounds, and the clock, when the step in progress
    /// began.
    marks: Sample,
    /// The clock [`ExpertStore::regime_begin`] reads the steps' times on.
    epoch: std::time::Instant,
}

impl Default for Regime {
    fn default() -> Self {
        Regime {
            steps: 0,
            phase: Phase::Warmup { until: WARMUP },
            reading: false,
            counted: false,
            last: None,
            steps_read: 0,
            steps_total: 0,
            marks: Sample::default(),
            epoch: std::time::Instant::now(),
        }
    }
}

impl Regime {
    /// Whether the step in progress reads guesses.
    pub fn reading(&self) -> bool {
        self.reading
    }

    /// [`Regime::begin`] from the store's cumulative wait and read rounds and the clock
    /// (`now.step_ns`, ns since any fixed instant) now: the previous step measured what they
    /// grew by since it began.
    pub fn begin_at(&mut self, rows: usize, now: Sample) -> Option<Verdict> {
        let m = std::mem::replace(&mut self.marks, now);
        let prev = Sample {
            wait_ns: now.wait_ns.saturating_sub(m.wait_ns),
            rounds: now.rounds.saturating_sub(m.rounds),
            step_ns: now.step_ns.saturating_sub(m.step_ns),
        };
        self.begin(rows, prev)
    }

    /// Nanoseconds since the regime began: the clock [`Regime::begin_at`] takes.
    pub fn clock_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// A forward of `rows` rows begins; `prev` is what the previous one measured. Returns the
    /// verdict when a trial just ended.
    pub fn begin(&mut self, rows: usize, prev: Sample) -> Option<Verdict> {
        let mut verdict = None;
        if let (true, Phase::Trial { with, without, .. }) = (self.counted, &mut self.phase) {
            if self.reading {
                with.add(prev);
            } else {
                without.add(prev);
            }
        }
        let eligible = rows <= TRIAL_ROWS;
        if eligible {
            self.steps += 1;
        }
        let s = self.steps;
        match self.phase.clone() {
            Phase::Warmup { until } | Phase::Settled { until } if eligible && s > until => {
                self.phase = Phase::Trial {
                    started: s,
                    with: Tally::default(),
                    without: Tally::default(),
                };
            }
            Phase::Trial {
                started,
                with,
                without,
            } if eligible && s >= started + TRIAL => {
                let read = decide(&with, &without);
                let v = Verdict {
                    with,
                    without,
                    read,
                };
                self.last = Some(v);
                self.phase = Phase::Settled {
                    until: s + RETRY_EVERY,
                };
                self.reading = read;
                verdict = Some(v);
            }
            _ => {}
        }
        self.counted = false;
        if let Phase::Trial { started, .. } = self.phase {
            if eligible {
                let i = s - started;
                self.reading = i.is_multiple_of(2) == (i / 2).is_multiple_of(2);
                self.counted = true;
            }
        }
        self.steps_total += 1;
        self.steps_read += self.reading as u64;
        verdict
    }
}

/// Guesses are read when they cut the wait per read round by at least [`MARGIN_PCT`] (the
/// stall they take off exceeds the disk time they add by more than a trial's noise) and the
/// steps that read them took no longer than those that did not (what they cost the compute,
/// which the wait does not see). Too few rounds to tell: keep reading (they then cost next to
/// nothing).
pub fn decide(with: &Tally, without: &Tally) -> bool {
    if with.rounds < MIN_ROUNDS || without.rounds < MIN_ROUNDS {
        return true;
    }
    // Cross-multiplied: wait_with / rounds_with < (1 - margin) * wait_without / rounds_without.
    let less_wait = (with.wait_ns as u128) * (without.rounds as u128) * 100
        < (without.wait_ns as u128) * (with.rounds as u128) * (100 - MARGIN_PCT as u128);
    // step_with / steps_with <= step_without / steps_without.
    let no_slower = (with.step_ns as u128) * (without.steps as u128)
        <= (without.step_ns as u128) * (with.steps as u128);
    less_wait && no_slower
}

/// How much (percent) guesses must cut the wait per read round to be read. On a cold,
/// disk-bound medium model, alternated runs of 8 + 8 steps whose guesses cut the wait by
/// 0.7% or added 0.2-4% swung between on and off, and "on" decoded 0.82x of pipe alone where
/// "off" ran level with it: a gain inside that noise is not worth the disk time.
pub const MARGIN_PCT: u64 = 5;

/// The `[PILOT]` line of a verdict that changed whether guesses are read (or the first).
pub fn verdict_line(v: &Verdict) -> String {
    let (w, wo) = (v.with.ms_per_round(), v.without.ms_per_round());
    let steps = format!(
        "{} + {} decode steps of {:.1} / {:.1} ms, {} + {} read rounds",
        v.with.steps,
        v.without.steps,
        v.with.ms_per_step(),
        v.without.ms_per_step(),
        v.with.rounds,
        v.without.rounds
    );
    if v.read {
        format!(
            "[PILOT] on: reading guesses ahead cuts the wait for reads to {w:.2} ms per read \
             round from {wo:.2} without ({steps}); trying again in {RETRY_EVERY} steps"
        )
    } else {
        format!(
            "[PILOT] off: reading guesses ahead does not cut the wait for reads by \
             {MARGIN_PCT}% without slowing the step: {w:.2} ms wait per read round with them, \
             {wo:.2} without ({steps}): the disk has too little idle time to fill, or the \
             compute binds; still scoring them, trying again in {RETRY_EVERY} steps"
        )
    }
}

impl ExpertStore {
    /// A forward of `rows` rows begins: closes the previous step's trial sample and decides
    /// whether this one reads guesses (auto depth only: a fixed `--pilot-depth` always reads).
    pub(super) fn regime_begin(&self, rows: usize) {
        if !self.pilot_enabled() || self.cfg.pilot_depth.is_some() {
            return;
        }
        let wait_ns = self.core.stats.wait_ns.load(Ordering::Relaxed);
        let rounds = self.pilot_rounds.load(Ordering::Relaxed);
        let mut r = self.regime.lock();
        let was = r.last.map(|v| v.read);
        let now = Sample {
            wait_ns,
            rounds,
            step_ns: r.clock_ns(),
        };
        if let Some(v) = r.begin_at(rows, now) {
            if was != Some(v.read) {
                crate::elog!("{}", verdict_line(&v));
            }
        }
    }

    /// Whether guesses are read in the step in progress.
    pub(super) fn regime_reading(&self) -> bool {
        self.cfg.pilot_depth.is_some() || self.regime.lock().reading()
    }

    /// The regime part of the `[PROF] pilot:` line.
    pub(super) fn regime_report(&self) -> String {
        if self.cfg.pilot_depth.is_some() {
            return "regime: fixed depth, guesses read in every step".into();
        }
        let r = self.regime.lock().clone();
        let last = match r.last {
            None => "no trial yet".to_string(),
            Some(v) => format!(
                "last trial {:.2} ms wait per read round with guesses read vs {:.2} without, \
                 {:.1} vs {:.1} ms a step -> {}",
                v.with.ms_per_round(),
                v.without.ms_per_round(),
                v.with.ms_per_step(),
                v.without.ms_per_step(),
                if v.read { "read" } else { "not read" }
            ),
        };
        format!(
            "regime: guesses read in {} of {} steps, {last}",
            r.steps_read, r.steps_total
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `n` decode steps; `wait(reading)` is what a step waits for reads (4 read rounds),
    /// the step taking 100 ms plus that wait.
    fn run(r: &mut Regime, n: usize, wait: impl Fn(bool) -> u64) -> Vec<Verdict> {
        run_timed(r, n, |read| {
            let w = wait(read);
            (w, 100_000_000 + w)
        })
    }

    /// Runs `n` decode steps; `cost(reading)` is a step's (wait, whole time), 4 read rounds.
    fn run_timed(r: &mut Regime, n: usize, cost: impl Fn(bool) -> (u64, u64)) -> Vec<Verdict> {
        let mut out = Vec::new();
        let mut prev = Sample::default();
        for _ in 0..n {
            out.extend(r.begin(1, prev));
            let (wait_ns, step_ns) = cost(r.reading());
            prev = Sample {
                wait_ns,
                rounds: 4,
                step_ns,
            };
        }
        out
    }

    #[test]
    fn guesses_that_add_disk_time_are_turned_off() {
        let mut r = Regime::default();
        // Warm-up: scored, not read.
        run(&mut r, WARMUP as usize, |_| 0);
        assert!(!r.reading());
        // Reading guesses makes every step wait 30 ms instead of 20: off.
        let v = run(
            &mut r,
            TRIAL as usize + 1,
            |read| if read { 30 } else { 20 } * 1_000_000,
        );
        assert_eq!(v.len(), 1, "{v:?}");
        let v = v[0];
        assert!(!v.read);
        assert_eq!((v.with.steps, v.without.steps), (TRIAL / 2, TRIAL / 2));
        assert_eq!(v.with.ms_per_round(), 7.5);
        assert_eq!(v.without.ms_per_round(), 5.0);
        assert!(!r.reading());
        let line = verdict_line(&v);
        assert!(
            line.starts_with("[PILOT] off: reading guesses ahead does not cut"),
            "{line}"
        );
        assert!(line.contains("7.50 ms wait per read round with them, 5.00"));
        assert!(line.contains("decode steps of 130.0 / 120.0 ms"), "{line}");
        // Settled: nothing read until the next trial, which turns them on when they pay.
        run(&mut r, RETRY_EVERY as usize - 1, |_| 0);
        assert!(!r.reading());
        let v = run(
            &mut r,
            TRIAL as usize + 2,
            |read| if read { 10 } else { 20 },
        );
        assert_eq!(v.len(), 1);
        assert!(v[0].read);
        assert!(r.reading());
        assert!(verdict_line(&v[0]).starts_with("[PILOT] on: reading guesses ahead cuts"));
    }

    #[test]
    fn the_trial_alternates_and_skips_prefill() {
        let mut r = Regime::default();
        run(&mut r, WARMUP as usize, |_| 0);
        let mut seen = Vec::new();
        let mut prev = Sample::default();
        for i in 0..6 {
            // A prefill forward in the middle neither counts nor moves the alternation.
            if i == 3 {
                r.begin(100, prev);
                prev = Sample {
                    wait_ns: 5,
                    rounds: 5,
                    step_ns: 5,
                };
                seen.push(None);
                continue;
            }
            r.begin(1, prev);
            prev = Sample::default();
            seen.push(Some(r.reading()));
        }
        // A B B A order: read, not, not, (prefill), read, read.
        assert_eq!(
            seen,
            [
                Some(true),
                Some(false),
                Some(false),
                None,
                Some(true),
                Some(true)
            ]
        );
        let Phase::Trial { with, without, .. } = r.phase else {
            panic!("{:?}", r.phase)
        };
        // The prefill's (5, 5, 5) went nowhere.
        assert_eq!(with.rounds + without.rounds, 0);
        assert_eq!(with.step_ns + without.step_ns, 0);
        assert_eq!(with.steps + without.steps, 4);
    }

    #[test]
    fn without_disk_reads_there_is_nothing_to_decide() {
        let few = Tally {
            steps: 8,
            wait_ns: 100,
            rounds: MIN_ROUNDS - 1,
            step_ns: 800,
        };
        let many = Tally {
            steps: 8,
            wait_ns: 1,
            rounds: 100,
            step_ns: 800,
        };
        assert!(decide(&few, &many));
        assert!(decide(&many, &few));
        let slower = Tally {
            wait_ns: 1000,
            ..many
        };
        assert!(!decide(&slower, &many));
        assert!(decide(&many, &slower));
        assert!(!decide(&many, &many), "a tie is not a saving");
        // Inside the margin: 4% less wait is not enough, 6% is.
        let by = |pct: u64| Tally {
            wait_ns: 100 * (100 - pct),
            ..many
        };
        let base = Tally {
            wait_ns: 100 * 100,
            ..many
        };
        assert!(!decide(&by(4), &base));
        assert!(decide(&by(6), &base));
    }

    /// Guesses that cut the wait for reads but slow the whole step (the dense-bound shape:
    /// their reads and copies take the cores the products need) are turned off; the same cut
    /// with faster steps (the disk-bound shape) keeps them.
    #[test]
    fn guesses_that_slow_the_step_are_turned_off() {
        let mut r = Regime::default();
        run(&mut r, WARMUP as usize, |_| 0);
        // With guesses: 10 ms of wait instead of 20, but 390 ms a step instead of 345.
        let v = run_timed(&mut r, TRIAL as usize + 1, |read| {
            if read {
                (10_000_000, 390_000_000)
            } else {
                (20_000_000, 345_000_000)
            }
        });
        assert_eq!(v.len(), 1, "{v:?}");
        let v = v[0];
        assert!(v.with.ms_per_round() < v.without.ms_per_round());
        assert_eq!(
            (v.with.ms_per_step(), v.without.ms_per_step()),
            (390.0, 345.0)
        );
        assert!(!v.read);
        assert!(!r.reading());
        assert!(
            verdict_line(&v).contains("or the compute binds"),
            "{}",
            verdict_line(&v)
        );
        // Disk-bound: the same cut of the wait, and the steps faster with it: read.
        run(&mut r, RETRY_EVERY as usize - 1, |_| 0);
        let v = run_timed(&mut r, TRIAL as usize + 2, |read| {
            if read {
                (10_000_000, 300_000_000)
            } else {
                (20_000_000, 410_000_000)
            }
        });
        assert_eq!(v.len(), 1);
        assert!(v[0].read);
        assert!(r.reading());
    }

    /// The step's time is measured between forwards' starts on the clock given.
    #[test]
    fn a_step_lasts_from_its_forward_to_the_next() {
        let mut r = Regime::default();
        let at = |wait_ns, rounds, step_ns| Sample {
            wait_ns,
            rounds,
            step_ns,
        };
        // Warm-up steps measure nothing that is kept; the trial's first step starts here.
        for i in 0..=WARMUP {
            r.begin_at(1, at(0, 0, i * 1000));
        }
        assert!(r.reading());
        r.begin_at(1, at(7, 3, (WARMUP + 1) * 1000 + 250));
        let Phase::Trial { with, without, .. } = r.phase else {
            panic!("{:?}", r.phase)
        };
        assert_eq!(without, Tally::default());
        assert_eq!(
            with,
            Tally {
                steps: 1,
                wait_ns: 7,
                rounds: 3,
                step_ns: 1250
            }
        );
    }
}
