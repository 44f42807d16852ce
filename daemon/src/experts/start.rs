//! Start of a session: the usage history, the pinned set (from `--pin`, or autopin), the RAM
//! clamp of the LRU, and the parallel load of the pinned experts.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::args::{PinGb, PinSource};
use super::ram::{self, CapChange, RamInputs, GB};
use super::usage::Usage;
use super::{pin, shares, ExpertStore};
use crate::error::EngineError;

/// What the store needs from the caller to place experts: where the history lives and what
/// else will take RAM.
pub struct TierStart<'a> {
    /// `.coli_usage` of this model (None: no history is read or written).
    pub usage_path: Option<PathBuf>,
    /// The weights' content fingerprint (`crate::identity`): a history counted on other
    /// weights is set aside, and saves record it. `None`: not checked, not recorded.
    pub weights: Option<u64>,
    /// Dense weights resident, bytes.
    pub dense_bytes: u64,
    /// KV pool of every slot: `kv_slots * ctx * bytes_per_position`.
    pub kv_pool: u64,
    /// The k/v reconstruction buffer: `ctx * heads * (qk_nope + v_head) * 4`.
    pub kvb: u64,
    /// Working-set bytes of one prefill row (`model::scratch::row_bytes`): what a chunk longer
    /// than [`super::chunk::DECODE_CHUNK`] adds to the budget.
    pub prefill_row_bytes: u64,
    /// Called with (done, total) as pinned experts load (PROGRESS telemetry).
    pub progress: Option<&'a mut dyn FnMut(u64, u64)>,
}

/// `.coli_usage` beside the state files.
pub fn usage_path(state_dir: &Path) -> PathBuf {
    state_dir.join(".coli_usage")
}

impl ExpertStore {
    /// Loads the usage history, chooses and loads the pinned set, and clamps the LRU to the
    /// RAM budget. Exit-2 error when not even one expert per layer fits.
    pub fn start(&self, mut s: TierStart<'_>) -> Result<(), EngineError> {
        let n_layers = self.sparse.len();
        let n_experts = self.n_experts;
        let nsp = self.n_sparse();
        if nsp == 0 {
            return Ok(());
        }
        // 1. history
        let mut save_path = s.usage_path.clone();
        if let Some(p) = &s.usage_path {
            match Usage::load(p, n_layers, n_experts, false) {
                Ok((u, _))
                    if u.weights.is_some() && s.weights.is_some() && u.weights != s.weights =>
                {
                    // Counts of other weights pick the wrong experts to pin: never used.
                    match crate::durable::set_aside(p) {
                        Ok(to) => crate::elog!(
                            "[USAGE] {} was counted on other weights (their fingerprint differs): set aside as {}; starting a new history",
                            p.display(),
                            to.display()
                        ),
                        Err(e) => {
                            crate::elog!(
                                "[USAGE] {} was counted on other weights and cannot be set aside ({e}): not used, not updated",
                                p.display()
                            );
                            save_path = None;
                        }
                    }
                }
                Ok((u, warnings)) => {
                    warnings.iter().for_each(|w| crate::elog!("[USAGE] {w}"));
                    if u.total() > 0 {
                        crate::elog!(
                            "[USAGE] history: {} selections from {}",
                            u.total(),
                            p.display()
                        );
                    }
                    self.track.lock().usage = u;
                    if let Some(d) = self.cfg.usage_decay {
                        crate::elog!("[USAGE] decay {d} at each save (COLI_USAGE_DECAY)");
                    }
                }
                Err(e) => {
                    crate::elog!("[USAGE] ignoring {e}; it is left as it is and not updated");
                    save_path = None;
                }
            }
        }
        if s.weights.is_some() {
            // Recorded at every save from now on.
            self.track.lock().usage.weights = s.weights;
        }
        // 1b. the VRAM tier, from the same history
        if self.cfg.vram_gb.is_some() {
            let usage = self.track.lock().usage.clone();
            self.place_vram(&usage);
        }
        // 2. budget
        // With no --ram-gb, MemAvailable at start and the cgroup's limit (named in a refusal).
        let mut mem_available = None;
        let budget = match self.cfg.ram_gb {
            Some(g) => (g * GB) as u64,
            None => {
                let avail = crate::telemetry::meminfo().1;
                let limit = crate::telemetry::cgroup_memory_limit();
                mem_available = Some((avail, limit));
                let (b, warn) = ram::auto_budget(avail, limit);
                if let Some(w) = warn {
                    crate::elog!("{w}");
                }
                b
            }
        };
        let reserve = self.cfg.reserve(budget);
        let eb = self.expert_bytes.max(1);
        let mut base = RamInputs {
            budget,
            dense: s.dense_bytes,
            pinned: 0,
            expert_bytes: eb,
            sparse_layers: nsp,
            n_experts,
            kv_pool: s.kv_pool,
            kvb: s.kvb,
            reserve,
            prefill_ws: 0,
        };
        // 2b. the prefill chunk, before the room is shared out: a longer one's rows take
        // their working set from the experts' cache.
        let in_vram = self.vram_resident().0 as u64;
        let all_experts = (nsp as u64 * n_experts as u64).saturating_sub(in_vram) * eb;
        let chunk = super::chunk::choose(
            self.cfg.prefill_chunk,
            &base,
            all_experts,
            s.prefill_row_bytes,
        );
        crate::elog!(
            "[PREFILL] chunk {} positions while no session decodes (at most {} while one does): {}",
            chunk.rows,
            super::chunk::DECODE_CHUNK.min(chunk.rows),
            chunk.why
        );
        base.prefill_ws = chunk.extra_bytes;
        self.prefill_chunk.store(chunk.rows, Ordering::Relaxed);
        // Pins never take the last LRU slot of a layer.
        let room = base.expert_room();
        let max_pins = ((room / eb as i128) - nsp as i128).max(0) as usize;
        // 3. the pinned set
        let (source, pin_gb, from): (Option<Usage>, Option<f64>, String) = match &self.cfg.pin {
            Some(PinSource::File(p)) => match Usage::load(p, n_layers, n_experts, true) {
                Ok((u, w)) => {
                    w.iter().for_each(|w| crate::elog!("[PIN] {w}"));
                    (Some(u), self.pin_gb_value(), p.display().to_string())
                }
                Err(e) => return Err(EngineError::Usage(format!("--pin: {e}"))),
            },
            Some(PinSource::Auto) => {
                let u = self.track.lock().usage.clone();
                if u.total() > 0 {
                    (Some(u), self.pin_gb_value(), "the usage history".into())
                } else {
                    crate::elog!("[PIN] auto: no usage history yet: nothing pinned");
                    (None, None, String::new())
                }
            }
            None if self.cfg.autopin => {
                let u = self.track.lock().usage.clone();
                match self.autopin_plan(u.total(), &base) {
                    Some(gb) => (Some(u), Some(gb), "the usage history (autopin)".into()),
                    None => (None, None, String::new()),
                }
            }
            None => (None, None, String::new()),
        };
        // An empty history pins nothing, unless PIN_FILL makes every expert a candidate.
        let source = source.filter(|u| u.total() > 0 || self.cfg.pin_fill);
        let want = match (&source, pin_gb) {
            (Some(_), Some(gb)) => (gb * GB / eb as f64) as usize,
            (Some(_), None) => max_pins, // --pin-gb all
            _ => 0,
        };
        if want > max_pins && source.is_some() {
            crate::elog!(
                "[PIN] {want} experts do not fit the {:.1} GB budget: pinning {max_pins}",
                budget as f64 / GB
            );
        }
        let mut list = source
            .as_ref()
            .map(|u| pin::select(u, &self.sparse, want.min(max_pins), self.cfg.pin_fill))
            .unwrap_or_default();
        // What the VRAM tier holds takes no RAM.
        list.retain(|&(l, e)| !self.in_vram(l, e));
        if let Some(u) = &source {
            let unseen = list.iter().filter(|&&(l, e)| u.get(l, e) == 0).count();
            if unseen > 0 {
                crate::elog!(
                    "[PIN] fill: {unseen} experts the history never selected pinned after the \
                     {} it did (PIN_FILL=1)",
                    list.len() - unseen
                );
            }
        }
        // 4. the LRU clamp
        let inputs = RamInputs {
            pinned: list.len() as u64 * eb,
            ..base
        };
        let plan = match ram::plan(&inputs, self.cfg.cache, self.cfg.cap_raise) {
            Ok(p) => p,
            Err(refusal) => {
                if std::env::var("COLI_RAM_OVERCOMMIT").is_ok_and(|v| v == "1") {
                    crate::elog!(
                        "[RAM] WARNING: {refusal}; going on with cap 1 (COLI_RAM_OVERCOMMIT=1)"
                    );
                    ram::RamPlan {
                        cap: 1,
                        change: CapChange::Lowered {
                            from: ram::start_cap(self.cfg.cache, n_experts),
                        },
                        projected_peak: inputs.projected_peak(1),
                    }
                } else if let Some((avail, limit)) = mem_available {
                    // The user typed no --ram-gb: say where the budget came from.
                    let cgroup = limit
                        .filter(|&l| l < avail)
                        .map(|l| format!(" and the cgroup's memory limit {:.2} GB", l as f64 / GB))
                        .unwrap_or_default();
                    return Err(EngineError::Usage(format!(
                        "{refusal} (no --ram-gb was given: the budget came from MemAvailable {:.2} GB{cgroup})",
                        avail as f64 / GB
                    )));
                } else {
                    return Err(EngineError::Usage(refusal.to_string()));
                }
            }
        };
        // A long chunk's working set is the cache's only while such a chunk runs
        // (`ExpertStore::long_chunk`): the rest of the time, decoding above all, the cache has
        // the cap the budget gives without it, and the `[RAM]` line says that one.
        let held_cap = plan.cap;
        let plan = match inputs.prefill_ws {
            0 => plan,
            _ => {
                let without = RamInputs {
                    prefill_ws: 0,
                    ..inputs
                };
                ram::plan(&without, self.cfg.cache, self.cfg.cap_raise)
                    .ok()
                    .filter(|w| w.cap > held_cap)
                    .unwrap_or(plan)
            }
        };
        let slots = plan.cap - held_cap;
        self.chunk_slots.store(slots, Ordering::Relaxed);
        if slots > 0 {
            crate::elog!(
                "[PREFILL] the cache gives up {slots} experts a layer ({}) only while a chunk longer than {} positions runs: {held_cap} a layer then, {} otherwise",
                super::chunk::size_text((slots * nsp) as u64 * eb),
                super::chunk::DECODE_CHUNK,
                plan.cap
            );
        }
        let peak = plan.projected_peak as f64 / GB;
        match plan.change {
            CapChange::Lowered { from } => crate::elog!(
                "[RAM] budget {:.2} GB: cap lowered {from}->{} per layer (projected peak {peak:.2} GB)",
                budget as f64 / GB,
                plan.cap
            ),
            CapChange::Raised { from } => crate::elog!(
                "[RAM] budget {:.2} GB: cap raised {from}->{} per layer (projected peak {peak:.2} GB)",
                budget as f64 / GB,
                plan.cap
            ),
            CapChange::Kept => crate::elog!(
                "[RAM] budget {:.2} GB: cap={} ok per layer (projected peak {peak:.2} GB){}",
                budget as f64 / GB,
                plan.cap,
                if self.cfg.cache.is_none() && !self.cfg.cap_raise && plan.cap < n_experts {
                    " (CAP_RAISE=0: not raised)"
                } else {
                    ""
                }
            ),
        }
        self.set_cap(plan.cap);
        self.decide_pilot(&list, plan.cap);
        {
            let mut rt = self.runtime.lock();
            let guard = ram::Guard::new(self.cfg.rss_guard.unwrap_or(budget), reserve);
            rt.guard = Some(guard);
            rt.usage_path = save_path;
        }
        // 5. load the pins
        if !list.is_empty() {
            let progress = s.progress.take();
            self.load_pins(&list, &from, progress)?;
        }
        Ok(())
    }

    /// Autopin's plan in GB for `history` selections, capped so the LRU keeps the cap it
    /// would get without pins (upstream's `[PIN] auto: ... capped ...` rule); `None` when
    /// the history is too short or what is left is under 0.5 GB.
    fn autopin_plan(&self, history: u64, base: &RamInputs) -> Option<f64> {
        let room = base.expert_room().max(0) as f64;
        let model = base.sparse_layers as f64 * base.n_experts as f64 * base.expert_bytes as f64;
        if history >= pin::AUTOPIN_MIN_HISTORY && model / GB < pin::AUTOPIN_MIN_GB {
            // Said, so that a long history that pins nothing is not a mystery.
            crate::elog!(
                "[PIN] auto: {history} selections of history, pinning nothing: the model's \
                 experts total {:.2} GB, under autopin's {} GB floor",
                model / GB,
                pin::AUTOPIN_MIN_GB
            );
            return None;
        }
        let planned = pin::autopin_gb(history, room, model)?;
        let allowed = ram::autopin_room(base, self.cfg.cache) as f64 / GB;
        let gb = if planned > allowed {
            crate::elog!(
                "[PIN] auto: {planned:.1} GB plan capped to {allowed:.1} GB to preserve the \
                 no-pin LRU cap {}/layer",
                ram::no_pin_cap(base, self.cfg.cache)
            );
            allowed
        } else {
            planned
        };
        if gb < pin::AUTOPIN_MIN_GB {
            return None;
        }
        crate::elog!("[PIN] auto: {history} selections of history, pinning {gb:.1} GB");
        Some(gb)
    }

    /// `--pilot auto` decided from the split just made: on when the pinned set, the VRAM tier
    /// and `cap` LRU slots per layer leave some routed expert to be read from disk while
    /// decoding (and there is an I/O pool), with a `[PILOT]` line saying why.
    fn decide_pilot(&self, pinned: &[(usize, usize)], cap: usize) {
        let n = self.n_experts;
        let mut pins = vec![0usize; self.sparse.len()];
        for &(l, _) in pinned {
            pins[l] += 1;
        }
        let (mut held, mut in_vram) = (0u64, 0u64);
        for (l, _) in self.sparse.iter().enumerate().filter(|(_, s)| **s) {
            let vram = (0..n).filter(|&e| self.in_vram(l, e)).count();
            held += (pins[l] + vram + cap).min(n) as u64;
            in_vram += vram as u64;
        }
        let facts = super::pilot_auto::PilotFacts {
            experts: (self.n_sparse() * n) as u64,
            held,
            in_vram,
            expert_bytes: self.expert_bytes,
            pipe: if self.pipe.is_some() {
                self.cfg.pipe
            } else {
                0
            },
        };
        self.streams
            .store(facts.held < facts.experts, Ordering::Relaxed);
        let choice = super::pilot_auto::choose_pilot(self.cfg.pilot, facts);
        if self.cfg.pilot == super::args::PilotMode::Auto {
            crate::elog!("[PILOT] {choice}");
        }
        self.pilot_active.store(choice.on, Ordering::Relaxed);
    }

    /// Prompt positions of a prefill chunk while no session decodes ([`super::chunk`]):
    /// chosen by [`ExpertStore::start`], [`super::chunk::DECODE_CHUNK`] before it or without
    /// routed experts.
    pub fn prefill_chunk(&self) -> usize {
        self.prefill_chunk.load(Ordering::Relaxed)
    }

    fn pin_gb_value(&self) -> Option<f64> {
        match self.cfg.pin_gb {
            PinGb::Gb(g) => Some(g),
            PinGb::All => None,
        }
    }

    /// Says whether the next forward runs a prefill chunk longer than
    /// [`super::chunk::DECODE_CHUNK`] positions: while one does, every layer's cache gives up
    /// the slots its rows' working set needs (set at start, `chunk.rs`), and takes them back
    /// once none does. Returns whether that changed (the caller then sheds the rows' buffers
    /// when `long` is false).
    pub fn long_chunk(&self, long: bool) -> bool {
        if self.chunk_held.swap(long, Ordering::Relaxed) == long {
            return false;
        }
        let slots = self.chunk_slots.load(Ordering::Relaxed);
        if slots > 0 {
            let cap = self.cap();
            self.set_cap(if long {
                cap.saturating_sub(slots)
            } else {
                cap + slots
            });
        }
        true
    }

    /// Sets the LRU capacity of every layer: `cap` each, or with `--cache-shares` `cap` x
    /// layers split by each layer's measured reuse.
    pub fn set_cap(&self, cap: usize) {
        let cap = cap.max(1);
        match &self.shares {
            Some(s) => {
                let mut s = s.lock();
                s.flat = cap;
                self.apply_shares(&mut s, false);
            }
            None => {
                for l in self.layers.iter().flatten() {
                    l.lock().lru.set_cap(cap);
                }
            }
        }
    }

    /// At the start of a forward: once `share_every` ([`shares::RESPLIT_EVERY`]) requests per
    /// sparse layer have reached the caches since the last split, split again (and age the
    /// histograms).
    pub(super) fn resplit_when_due(&self) {
        let Some(s) = &self.shares else { return };
        let due = self.cfg.share_every.max(1) * self.n_sparse() as u64;
        if self.share_requests.load(Ordering::Relaxed) < due {
            return;
        }
        self.share_requests.store(0, Ordering::Relaxed);
        self.apply_shares(&mut s.lock(), true);
    }

    fn apply_shares(&self, s: &mut ShareState, age: bool) {
        for (h, l) in s.hists.iter_mut().zip(self.layers.iter().flatten()) {
            h.clear();
            if let Some(m) = l.lock().lru.reuse() {
                h.extend_from_slice(m.hist());
            }
        }
        let total = s.flat * s.hists.len();
        let ShareState {
            hists, caps, gains, ..
        } = s;
        shares::split_into(hists, total, self.n_experts, caps, gains);
        for (&c, l) in caps.iter().zip(self.layers.iter().flatten()) {
            let mut st = l.lock();
            st.lru.set_cap(c);
            if age {
                if let Some(m) = st.lru.reuse_mut() {
                    m.age();
                }
            }
        }
    }

    /// The smallest and largest layer capacity with `--cache-shares`.
    pub fn share_range(&self) -> Option<(usize, usize)> {
        let s = self.shares.as_ref()?.lock();
        Some((
            s.caps.iter().copied().min().unwrap_or(0),
            s.caps.iter().copied().max().unwrap_or(0),
        ))
    }

    /// Pins `list` ((layer, expert) pairs), reading them in parallel.
    pub fn pin(&self, list: &[(usize, usize)]) -> Result<(), EngineError> {
        self.load_pins(list, "a list", None)
    }

    fn load_pins(
        &self,
        list: &[(usize, usize)],
        from: &str,
        progress: Option<&mut dyn FnMut(u64, u64)>,
    ) -> Result<(), EngineError> {
        let t0 = Instant::now();
        let total = list.len();
        crate::elog!(
            "[PIN] loading {total} experts ({:.2} GB) from {from}",
            total as f64 * self.expert_bytes as f64 / GB
        );
        let threads = self.cfg.pipe.max(4).min(total);
        let next = AtomicUsize::new(0);
        let (tx, rx) = crossbeam_channel::unbounded();
        let core = &self.core;
        let mut progress = progress;
        let mut first_err = None;
        let mut mlock_warned = false;
        std::thread::scope(|scope| {
            for _ in 0..threads {
                let tx = tx.clone();
                let next = &next;
                scope.spawn(move || loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(layer, e)) = list.get(i) else {
                        return;
                    };
                    let r = core.load(layer, e, None);
                    let failed = r.is_err();
                    if tx.send((layer, e, r)).is_err() || failed {
                        // Stop the others at the next expert.
                        next.store(list.len(), Ordering::Relaxed);
                        return;
                    }
                });
            }
            drop(tx);
            let mut done = 0u64;
            let mut last_pct = 0;
            for (layer, e, r) in rx {
                match r {
                    Ok(x) => {
                        if self.cfg.mlock && !mlock_warned {
                            if let Err(err) = pin::mlock(&x) {
                                crate::elog!(
                                    "[PIN] mlock refused ({err}): pinned experts may be paged out"
                                );
                                mlock_warned = true;
                            }
                        }
                        if let Ok(l) = self.layer(layer) {
                            let mut st = l.lock();
                            st.lru.remove(e);
                            st.pinned[e] = Some(Arc::new(x));
                        }
                        done += 1;
                        if let Some(p) = progress.as_mut() {
                            p(done, total as u64);
                        }
                        let pct = done * 100 / total as u64;
                        if pct >= last_pct + 10 || done == total as u64 {
                            last_pct = pct;
                            crate::elog!("[PIN] {done}/{total} ({pct}%)");
                        }
                    }
                    Err(err) => {
                        if first_err.is_none() {
                            first_err = Some(err);
                        }
                    }
                }
            }
        });
        if let Some(e) = first_err {
            return Err(e);
        }
        crate::elog!(
            "[PIN] placement: 0 VRAM + {total} RAM experts ({:.1} GB warm) in {:.1}s from {from}",
            total as f64 * self.expert_bytes as f64 / GB,
            t0.elapsed().as_secs_f64()
        );
        Ok(())
    }
}

/// `--cache-shares`: the flat cap the budget gives every layer, and the split of its total
/// last applied, with the buffers a split reuses (it runs in the middle of decode, which
/// allocates nothing).
pub(super) struct ShareState {
    /// Slots per layer on average: the total is `flat` x sparse layers.
    pub(super) flat: usize,
    caps: Vec<usize>,
    hists: Vec<Vec<u64>>,
    gains: Vec<f64>,
}

impl ShareState {
    pub(super) fn new(flat: usize, n_sparse: usize, n_experts: usize) -> ShareState {
        ShareState {
            flat,
            caps: vec![flat; n_sparse],
            hists: (0..n_sparse)
                .map(|_| Vec::with_capacity(n_experts))
                .collect(),
            gains: Vec::with_capacity(n_sparse),
        }
    }
}
