//! What the store learns from routing: the persistent usage counts, the session heat and
//! recency of live re-pin, the DISK-CLASS private clock, the HITS bitmap and the route trace.

use std::io::Write;

use super::repin::NEVER;
use super::usage::Usage;
use crate::routing::Routing;

pub struct Track {
    pub n_experts: usize,
    /// Persistent history (`.coli_usage`), per model layer.
    pub usage: Usage,
    /// Session heat per (layer, expert), halved after each re-pin pass.
    pub heat: Vec<u32>,
    /// Position clock of the last selection (re-pin recency), `NEVER` before the first.
    pub last: Vec<u64>,
    /// Positions processed.
    pub clock: u64,
    /// DISK-CLASS clock: one tick per selected (position, expert).
    pub dc_clock: u64,
    pub dc_last: Vec<u64>,
    /// `dc_last` before the current call's own bump.
    pub dc_pre: Vec<u64>,
    /// Routed since the last HITS, per (layer, expert).
    pub hit: Vec<bool>,
    /// Forward calls so far.
    pub calls: u64,
    /// Position clock at the start of the current forward.
    pub call_clock: u64,
    pub trace: Option<std::io::BufWriter<std::fs::File>>,
}

impl Track {
    pub fn new(n_layers: usize, n_experts: usize) -> Track {
        let cells = n_layers * n_experts;
        Track {
            n_experts,
            usage: Usage::new(n_layers, n_experts),
            heat: vec![0; cells],
            last: vec![NEVER; cells],
            clock: 0,
            dc_clock: 0,
            dc_last: vec![NEVER; cells],
            dc_pre: vec![NEVER; cells],
            hit: vec![false; cells],
            calls: 0,
            call_clock: 0,
            trace: None,
        }
    }

    pub fn begin_forward(&mut self, rows: usize) {
        self.calls += 1;
        self.call_clock = self.clock;
        self.clock += rows as u64;
    }

    /// Records the routing of every row of one layer's batch.
    pub fn observe(&mut self, layer: usize, routes: &[Routing]) {
        let base = layer * self.n_experts;
        for r in routes {
            for &e in r.experts.iter() {
                self.dc_pre[base + e] = self.dc_last[base + e];
            }
        }
        for (row, r) in routes.iter().enumerate() {
            let (experts, weights) = (&r.experts, &r.weights);
            for &e in experts.iter() {
                let i = base + e;
                self.usage.add(layer, e, 1);
                self.heat[i] = self.heat[i].saturating_add(1);
                self.last[i] = self.call_clock + row as u64 + 1;
                self.dc_clock += 1;
                self.dc_last[i] = self.dc_clock;
                self.hit[i] = true;
            }
            if let Some(w) = &mut self.trace {
                let mut line = format!("{} {} {}", self.calls.saturating_sub(1), row, layer);
                for (e, g) in experts.iter().zip(weights.iter()) {
                    line.push_str(&format!(" {e}:{g:.4}"));
                }
                line.push('\n');
                if w.write_all(line.as_bytes()).is_err() {
                    crate::elog!("[TRACE] writing the route trace failed: trace stopped");
                    self.trace = None;
                }
            }
        }
    }

    /// The DISK-CLASS `pre` tick of expert `e` of `layer` (None when never touched before).
    pub fn dc_pre(&self, layer: usize, e: usize) -> Option<u64> {
        let t = self.dc_pre[layer * self.n_experts + e];
        (t != NEVER).then_some(t)
    }

    pub fn flush_trace(&mut self) {
        if let Some(w) = &mut self.trace {
            let _ = w.flush();
        }
    }
}
