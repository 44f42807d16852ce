//! Safe points (between turns and between decode steps): the live re-pin pass, the RSS guard,
//! the usage save; and the telemetry built from the store's state.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use protocol::telemetry::tier;
use protocol::{DiskClass, DriveFigures, Emap, Hits, Repin, Tiers};

use super::ram::GB;
use super::repin::{self, Swap, SWAPS_PER_PASS};
use super::stats::{self, Snapshot};
use super::ExpertStore;

/// What a safe point did: re-pin swaps (for REPIN telemetry) and the guard's line, if any.
#[derive(Debug, Default)]
pub struct SafePoint {
    pub swaps: Vec<Repin>,
    pub guard: Option<String>,
}

/// Tokens between two RSS guard checks.
const GUARD_EVERY: usize = 16;

impl ExpertStore {
    /// A safe point after `tokens` more emitted tokens: re-pin once `--repin N` tokens were
    /// emitted since the last pass, the RSS guard every 16. Nothing may be borrowed from a
    /// layer's batch across this call (the forward is between steps).
    pub fn safe_point(&self, tokens: usize) -> SafePoint {
        let (do_repin, do_guard) = {
            let mut rt = self.runtime.lock();
            rt.since_repin += tokens;
            rt.since_guard += tokens;
            let r = self.cfg.repin > 0 && rt.since_repin >= self.cfg.repin;
            if r {
                rt.since_repin = 0;
            }
            let g = rt.guard.is_some() && rt.since_guard >= GUARD_EVERY;
            if g {
                rt.since_guard = 0;
            }
            (r, g)
        };
        SafePoint {
            swaps: if do_repin {
                self.repin_pass()
            } else {
                Vec::new()
            },
            guard: if do_guard { self.rss_guard() } else { None },
        }
    }

    /// End of a serve turn: saves `.coli_usage` (atomically), flushes the route trace, then
    /// runs the safe point.
    pub fn turn_end(&self, tokens: usize) -> SafePoint {
        self.save_usage();
        self.track.lock().flush_trace();
        self.replan_vram();
        self.safe_point(tokens)
    }

    /// Whether `.coli_usage` is written (`--usage-save`, and the store has something to count).
    pub fn saves_usage(&self) -> bool {
        self.cfg.usage_save
    }

    /// Writes `.coli_usage` now (a no-op without a usage path or with `--usage-save 0`).
    pub fn save_usage(&self) {
        if !self.cfg.usage_save {
            return;
        }
        let Some(path) = self.runtime.lock().usage_path.clone() else {
            return;
        };
        let u = {
            let mut t = self.track.lock();
            if let Some(d) = self.cfg.usage_decay {
                t.usage.decay(d);
            }
            t.usage.clone()
        };
        if let Err(e) = u.save(&path) {
            crate::elog!("[USAGE] saving failed: {e}");
        }
    }

    /// The selections counted so far (the loaded history plus this process's), in
    /// `.coli_usage`'s form: `bench --usage-out` writes it so `plan` can predict with a run's
    /// own routing.
    pub fn usage_now(&self) -> super::usage::Usage {
        self.track.lock().usage.clone()
    }

    /// One live re-pin pass: at most 4 swaps, then every session heat halves.
    pub fn repin_pass(&self) -> Vec<Repin> {
        let n = self.n_experts;
        let candidates: Vec<Swap> = {
            let t = self.track.lock();
            let mut c = Vec::new();
            for (layer, l) in self.layers.iter().enumerate() {
                let Some(l) = l else { continue };
                let pinned: Vec<bool> = l.lock().pinned.iter().map(|p| p.is_some()).collect();
                if !pinned.iter().any(|p| *p) {
                    continue;
                }
                let r = layer * n..(layer + 1) * n;
                if let Some(s) =
                    repin::pick_layer(layer, &t.heat[r.clone()], &t.last[r], t.clock, &pinned)
                {
                    c.push(s);
                }
            }
            c
        };
        let mut out = Vec::new();
        for s in repin::pick(candidates, SWAPS_PER_PASS) {
            let t0 = Instant::now();
            let Ok(l) = self.layer(s.layer) else { continue };
            let cached = l.lock().lru.remove(s.admit);
            let x = match cached {
                Some(x) => x,
                None => match self.core.load(s.layer, s.admit, None) {
                    Ok(x) => Arc::new(x),
                    Err(e) => {
                        crate::elog!(
                            "[REPIN] layer {}: admitting {} failed: {e}",
                            s.layer,
                            s.admit
                        );
                        continue;
                    }
                },
            };
            if self.cfg.mlock {
                let _ = super::pin::mlock(&x);
            }
            {
                let mut st = l.lock();
                st.pinned[s.evict] = None;
                st.pinned[s.admit] = Some(x);
            }
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            crate::elog!(
                "[REPIN] layer {}: evict {} (heat={}) <- admit {} (heat={}) in {:.0} ms",
                s.layer,
                s.evict,
                s.evict_heat,
                s.admit,
                s.admit_heat,
                ms
            );
            out.push(Repin {
                layer: s.layer as u32,
                evicted: s.evict as u32,
                evicted_heat: s.evict_heat,
                admitted: s.admit as u32,
                admitted_heat: s.admit_heat,
                ms,
            });
        }
        repin::decay(&mut self.track.lock().heat);
        out
    }

    /// Whether a transient allocation of `need` bytes fits the RAM budget now
    /// ([`super::ram::Guard::transient_fits`]); `Err((budget, rss, room))` when it does not: the
    /// budget, the resident set and what the guard's threshold leaves above it. Fits before
    /// the tiers start.
    pub fn transient_fits(&self, need: u64) -> Result<(), (u64, u64, u64)> {
        let Some(guard) = self.runtime.lock().guard else {
            return Ok(());
        };
        // An ordinary prompt needs no look at the resident set (a /proc read).
        if need <= guard.covered {
            return Ok(());
        }
        let rss = (crate::telemetry::rss_gb() * GB) as u64;
        if guard.transient_fits(need, rss) {
            return Ok(());
        }
        Err((guard.budget, rss, guard.threshold().saturating_sub(rss)))
    }

    /// Drops LRU entries when the measured RSS is over the guard's budget x 1.02 + slack.
    fn rss_guard(&self) -> Option<String> {
        let guard = self.runtime.lock().guard?;
        let rss = (crate::telemetry::rss_gb() * GB) as u64;
        let cap = self.cap();
        let new_cap = guard.cap(rss, cap, self.n_sparse(), self.expert_bytes);
        if new_cap >= cap {
            return None;
        }
        let before = self.resident_split().1 .0;
        self.set_cap(new_cap);
        let after = self.resident_split().1 .0;
        let line = format!(
            "[RAM-GUARD] RSS {:.1} GB over the {:.1} GB budget: dropped {} cached experts, \
             cap -> {new_cap} (RSS {:.1} MB > {:.1} MB = budget x 1.02 + {:.1} MB)",
            rss as f64 / GB,
            guard.budget as f64 / GB,
            before - after,
            rss as f64 / 1e6,
            guard.threshold() as f64 / 1e6,
            guard.slack as f64 / 1e6,
        );
        crate::elog!("{line}");
        Some(line)
    }

    /// TIERS: the VRAM tier; pinned + cached in RAM; the rest on disk.
    pub fn tiers(&self) -> Tiers {
        let total = (self.n_sparse() * self.n_experts) as u32;
        let (n, bytes) = self.resident();
        let (nv, vbytes) = self.vram_resident();
        Tiers {
            vram_experts: nv as u32,
            ram_experts: n as u32,
            disk_experts: total.saturating_sub((n + nv) as u32),
            vram_gb: vbytes as f64 / GB,
            ram_gb: bytes as f64 / GB,
        }
    }

    /// EMAP: one row per sparse layer, `(tier << 6) | heat`, heat = bit length of the
    /// persistent usage count.
    pub fn emap(&self) -> Emap {
        let rows: Vec<usize> = (0..self.sparse.len()).filter(|&l| self.sparse[l]).collect();
        let mut m = Emap::new(rows.len() as u32, self.n_experts as u32);
        let t = self.track.lock();
        for (r, &layer) in rows.iter().enumerate() {
            let Ok(l) = self.layer(layer) else { continue };
            let st = l.lock();
            for e in 0..self.n_experts {
                let resident = st.pinned[e].is_some() || st.lru.contains(e);
                let t_ = if self.in_vram(layer, e) {
                    tier::VRAM
                } else if resident {
                    tier::RAM
                } else {
                    tier::DISK
                };
                m.set(
                    r as u32,
                    e as u32,
                    t_,
                    stats::heat_bits(t.usage.get(layer, e)),
                );
            }
        }
        m
    }

    /// HITS: experts routed since the previous call (which this clears).
    pub fn take_hits(&self) -> Hits {
        let rows: Vec<usize> = (0..self.sparse.len()).filter(|&l| self.sparse[l]).collect();
        let mut h = Hits::new(rows.len() as u32, self.n_experts as u32);
        let mut t = self.track.lock();
        for (r, &layer) in rows.iter().enumerate() {
            for e in 0..self.n_experts {
                let i = layer * self.n_experts + e;
                if t.hit[i] {
                    h.set(r as u32, e as u32);
                    t.hit[i] = false;
                }
            }
        }
        h
    }

    /// DISK-CLASS figures, with the per-drive tail ([`super::drives::Drives`]).
    pub fn disk_class(&self) -> DiskClass {
        DiskClass {
            drives: self.drives(),
            ..self.core.stats.disk_class()
        }
    }

    /// Per drive ([`super::drives::Drives`]): reads, bytes, thread-seconds, wall seconds busy
    /// and failed reads (each retried on another copy).
    pub fn drives(&self) -> Vec<DriveFigures> {
        let drives = &self.core.io.drives;
        drives
            .stats
            .iter()
            .map(|d| DriveFigures {
                reads: d.reads.load(Ordering::Relaxed),
                bytes: d.bytes.load(Ordering::Relaxed),
                thread_s: d.ns.load(Ordering::Relaxed) as f64 / 1e9,
                busy_s: d.busy_wall_s(),
                failed: d.failures.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// The `[PROF]` lines of a run (`colibri run`'s stderr): I/O totals per token, DISK-CLASS,
    /// residency, and reads per model directory when there are several.
    pub fn report_lines(&self, d: &Snapshot, tokens: usize, wall_s: f64) -> Vec<String> {
        let gb = d.bytes_read as f64 / GB;
        let tok = tokens.max(1) as f64;
        let (hit, _, _) = d.hit_pcts();
        let mut v = vec![format!(
            "[PROF] expert I/O: {gb:.3} GB fetched ({:.1} MB/token, {:.2} GB/s over the run) | hit {hit:.1}% ({} pin + {} lru / {} load) | {:.1} loads/token | {:.1}s read service / {:.1}s felt wait",
            d.bytes_read as f64 / 1e6 / tok,
            if wall_s > 0.0 { gb / wall_s } else { 0.0 },
            d.hits_pin,
            d.hits_lru,
            d.loads,
            d.loads as f64 / tok,
            d.load_s,
            d.wait_s
        )];
        v.push(stats::disk_class_line(
            &self.disk_class(),
            self.core.stats.disk_busy_s(),
            wall_s,
        ));
        let ((np, bp), (nl, bl)) = self.resident_split();
        v.push(format!(
            "[PROF] resident experts: {np} pinned ({:.1} GB) + {nl} in LRU ({:.1} GB, cap {}/layer{}) | reads: {} | pipe {} | pilot {}",
            bp as f64 / GB,
            bl as f64 / GB,
            self.cap(),
            match self.share_range() {
                Some((lo, hi)) => format!(", shares {lo}-{hi}"),
                None => String::new(),
            },
            format!(
                "{}{}",
                match self.core.io.mode {
                    super::IoMode::Direct if !self.core.io.direct_active() =>
                        "buffered (O_DIRECT refused)",
                    mode => mode.label(),
                },
                if self.cfg.io == super::IoMode::Auto {
                    " (auto)"
                } else {
                    ""
                }
            ),
            self.pipe.as_ref().map_or(0, |p| p.workers()),
            if self.pilot_enabled() { "on" } else { "off" }
        ));
        v.extend(self.pilot_report());
        if self.pilot_enabled() {
            v.push(self.prefetch_counts().line(self.expert_bytes, tokens));
        }
        v.extend(self.route_counts().prof_line());
        let io = &self.core.io;
        if io.drives.len() > 1 {
            let drives = self.drives();
            let total: u64 = drives.iter().map(|d| d.bytes).sum();
            for (i, d) in drives.iter().enumerate() {
                let b = d.bytes as f64 / GB;
                v.push(format!(
                    "[PROF] drive {}: {} reads, {b:.2} GB ({:.0}% of bytes), {:.2} GB/s-thread, busy {:.2}s @ {:.2} GB/s-wall (avg-conc {:.1}), {} failed reads retried on another copy",
                    io.drives.label(i),
                    d.reads,
                    100.0 * d.bytes as f64 / total.max(1) as f64,
                    if d.thread_s > 0.0 { b / d.thread_s } else { 0.0 },
                    d.busy_s,
                    d.rate_gbs(),
                    d.queue_depth(),
                    d.failed,
                ));
            }
        }
        // Several directories of one search path, one drive: reads per directory.
        if io.dirs.len() > 1 && io.drives.len() == 1 {
            for (dir, s) in io.dirs.iter().zip(&io.dir_stats) {
                let b = s.bytes.load(Ordering::Relaxed) as f64 / GB;
                let secs = s.ns.load(Ordering::Relaxed) as f64 / 1e9;
                v.push(format!(
                    "[PROF] dir {}: {} reads, {b:.2} GB, {:.2} GB/s-thread",
                    dir.display(),
                    s.reads.load(Ordering::Relaxed),
                    if secs > 0.0 { b / secs } else { 0.0 }
                ));
            }
        }
        v
    }
}
