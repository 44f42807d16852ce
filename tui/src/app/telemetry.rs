//! The dashboard's data and the telemetry lines that feed it (tiers, expert map and hits,
//! live rates, disk reads, re-pins, engine state, mux sessions, speculative decoding).

use std::collections::VecDeque;
use std::time::Instant;

use protocol::{
    DiskClass, Emap, EngineState, Hits, HwInfo, Live, Prof, Progress, Repin, SessionInfo, Spec,
    Telemetry, Tiers,
};

use super::{App, Phase};

/// Rates derived from two successive DISKCLASS lines.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DiskRates {
    /// Fraction of the interval the cold class had a load in flight (0..=1).
    pub cold_busy: f64,
    /// Same for the warm class.
    pub warm_busy: f64,
}

/// One drive's figures over the last DISKCLASS interval.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DriveRate {
    /// GB/s delivered over the interval's wall time.
    pub gbs: f64,
    /// Fraction of the interval with a read in flight (0..=1).
    pub busy: f64,
}

/// Everything the dashboard shows.
#[derive(Clone, Debug, Default)]
pub struct Dashboard {
    /// Machine description.
    pub hwinfo: Option<HwInfo>,
    /// Expert counts per tier.
    pub tiers: Option<Tiers>,
    /// The expert map.
    pub emap: Option<Emap>,
    /// Per expert cell (same indexing as `emap.cells`): pulse intensity 0..=1 from HITS,
    /// fading with ticks.
    pub pulse: Vec<f32>,
    /// Hit-rate samples, percent (LIVE lines and turn ends).
    pub hit_hist: VecDeque<f64>,
    /// Tokens-per-second samples.
    pub tps_hist: VecDeque<f64>,
    /// Cumulative DISK-CLASS figures.
    pub disk: Option<DiskClass>,
    /// Busy fractions over the last DISKCLASS interval.
    pub disk_rates: Option<DiskRates>,
    /// Per drive, over the last DISKCLASS interval (drives of the line's optional tail).
    pub drive_rates: Vec<DriveRate>,
    disk_prev: Option<(Instant, DiskClass)>,
    /// Recent live re-pin swaps, newest last.
    pub repins: VecDeque<Repin>,
    /// Re-pin swaps seen in all.
    pub repin_total: u64,
    /// Load / pin / prefill progress, cleared when the phase moves on.
    pub progress: Option<Progress>,
    /// The last PROF line.
    pub prof: Option<Prof>,
    /// The last SESSIONS line (mux mode): every listed slot's session.
    pub sessions: Option<Vec<SessionInfo>>,
    /// The last SPEC line: a finished request's drafts and acceptance per source.
    pub spec: Option<Spec>,
    /// Tokens per forward: the streaming turn's (LIVE) or else the last request's (SPEC).
    pub tokens_per_forward: Option<f64>,
}

/// Samples kept for the sparklines.
pub const HISTORY_LEN: usize = 240;
/// Re-pin swaps kept.
pub const REPIN_LEN: usize = 32;

/// A HITS pulse keeps this fraction of its intensity per tick (100 ms): gone in ~1.5 s.
pub const PULSE_DECAY: f32 = 0.7;

impl App {
    /// One telemetry line (from stdout between turns, or from the telemetry fd).
    pub fn on_telemetry(&mut self, t: Telemetry) {
        match t {
            Telemetry::HwInfo(h) => self.dash.hwinfo = Some(h),
            Telemetry::Tiers(t) => self.dash.tiers = Some(t),
            Telemetry::Emap(e) => {
                let n = e.cells.len();
                if self.dash.pulse.len() != n {
                    self.dash.pulse = vec![0.0; n];
                }
                self.dash.emap = Some(e);
            }
            Telemetry::Hits(h) => self.on_hits(&h),
            Telemetry::Prof(p) => self.dash.prof = Some(p),
            Telemetry::Progress(p) => {
                // In mux mode the phase follows the requests in flight.
                if p.phase == protocol::ProgressPhase::Prefill
                    && self.phase == Phase::Idle
                    && !self.shared_engine()
                {
                    self.phase = Phase::Prefill;
                }
                self.dash.progress = Some(p);
            }
            Telemetry::Live(l) => self.on_live(&l),
            Telemetry::Repin(r) => {
                self.dash.repin_total += 1;
                if self.dash.repins.len() == REPIN_LEN {
                    self.dash.repins.pop_front();
                }
                self.dash.repins.push_back(r);
            }
            Telemetry::DiskClass(d) => self.on_diskclass(d),
            Telemetry::State(s) => self.on_state(s),
            Telemetry::Sessions(list) => self.dash.sessions = Some(list),
            Telemetry::Spec(x) => {
                self.dash.tokens_per_forward = Some(x.tokens_per_forward());
                self.dash.spec = Some(x);
            }
            Telemetry::KvSave(k) => self.notice(format!(
                "warning: slot {}'s conversation was not saved ({}): it will not survive a restart",
                k.slot, k.reason
            )),
            // Only the cut-short case is worth a line in the conversation: a complete
            // answer is what the grammar promised.
            Telemetry::Grammar(g) if !g.complete => self.notice(format!(
                "warning: request {}'s answer stopped before its grammar was complete: it does not match it",
                g.id
            )),
            Telemetry::Grammar(_) | Telemetry::Unknown(_) => {}
        }
    }

    /// Whether the engine's state is more than this client's turn (mux sessions, or a
    /// server's other clients when attached): its phase then follows its own requests only.
    fn shared_engine(&self) -> bool {
        self.config.mux || self.attached()
    }

    fn on_hits(&mut self, h: &Hits) {
        let Some(e) = &self.dash.emap else { return };
        if (h.rows, h.cols) != (e.rows, e.cols) {
            return;
        }
        if self.dash.pulse.len() != e.cells.len() {
            self.dash.pulse = vec![0.0; e.cells.len()];
        }
        for (i, p) in self.dash.pulse.iter_mut().enumerate() {
            if h.bits.get(i / 8).is_some_and(|b| b >> (i % 8) & 1 == 1) {
                *p = 1.0;
            }
        }
    }

    fn on_live(&mut self, l: &Live) {
        // Mux mode: several sessions decode at once; the status bar follows the current slot.
        if self.config.mux && l.slot != self.slot {
            return;
        }
        // Attached: the server's LIVE lines are any client's; the status bar's figures are
        // this client's own answer (its STAT), the sparklines the server's.
        if self.attached() {
            self.figures.hit_pct = l.hit_pct;
            self.figures.rss_gb = l.rss_gb;
            push_sample(&mut self.dash.hit_hist, l.hit_pct);
            push_sample(&mut self.dash.tps_hist, l.tok_per_s);
            return;
        }
        if self.phase == Phase::Prefill && l.tokens > 0 && !self.config.mux {
            self.phase = Phase::Generating;
            self.dash.progress = None;
        }
        self.figures.tokens = l.tokens;
        self.figures.tok_per_s = l.tok_per_s;
        self.figures.hit_pct = l.hit_pct;
        self.figures.rss_gb = l.rss_gb;
        if let Some(tpf) = l.tokens_per_forward {
            self.dash.tokens_per_forward = Some(tpf);
        }
        push_sample(&mut self.dash.hit_hist, l.hit_pct);
        push_sample(&mut self.dash.tps_hist, l.tok_per_s);
    }

    fn on_diskclass(&mut self, d: DiskClass) {
        if let (Some(now), Some((then, prev))) = (self.now, &self.dash.disk_prev) {
            let dt = now.saturating_duration_since(*then).as_secs_f64();
            if dt > 0.0 {
                let frac = |a: f64, b: f64| ((a - b) / dt).clamp(0.0, 1.0);
                self.dash.disk_rates = Some(DiskRates {
                    cold_busy: frac(d.cold.busy_s, prev.cold.busy_s),
                    warm_busy: frac(d.warm.busy_s, prev.warm.busy_s),
                });
                self.dash.drive_rates = d
                    .drives
                    .iter()
                    .zip(&prev.drives)
                    .map(|(now, then)| DriveRate {
                        gbs: now.bytes.saturating_sub(then.bytes) as f64 / 1e9 / dt,
                        busy: frac(now.busy_s, then.busy_s),
                    })
                    .collect();
            }
        }
        if let Some(now) = self.now {
            self.dash.disk_prev = Some((now, d.clone()));
        }
        self.dash.disk = Some(d);
    }

    fn on_state(&mut self, s: EngineState) {
        // Mux mode: the phase follows the requests in flight (SESSIONS has the details).
        if self.phase == Phase::Dead || (self.shared_engine() && s != EngineState::Loading) {
            return;
        }
        match s {
            EngineState::Loading => self.phase = Phase::Loading,
            // Idle comes from END + STAT on stdout, which may lag the telemetry fd.
            EngineState::Idle => {
                if self.pending.is_none() && self.phase != Phase::Loading {
                    self.phase = Phase::Idle;
                }
                self.dash.progress = None;
            }
            // The telemetry fd may also trail stdout the other way: a prefill or generating
            // line that arrives after the turn's STAT is stale, and only a request in
            // flight can be prefilling or generating.
            EngineState::Prefill if self.pending.is_some() => self.phase = Phase::Prefill,
            EngineState::Generating if self.pending.is_some() => {
                self.phase = Phase::Generating;
                self.dash.progress = None;
            }
            EngineState::Prefill | EngineState::Generating => {}
        }
    }
}

pub(super) fn push_sample(hist: &mut VecDeque<f64>, v: f64) {
    if hist.len() == HISTORY_LEN {
        hist.pop_front();
    }
    hist.push_back(if v.is_finite() { v.max(0.0) } else { 0.0 });
}
