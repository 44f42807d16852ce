//! A layer's batch of experts as they become ready ([`ExpertStore::fetch_layer`], [`Fetch`]):
//! the LRU and hit/miss decisions taken at once in `wanted` order, then resident experts,
//! the pilot's reads that arrived, and loads as they complete. Kept apart from the store's
//! construction and safe points because it is the per-layer hot path: a batch served from
//! RAM allocates nothing (the queues are the previous fetch's, [`FetchBufs`]).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, Select, TryRecvError};

use super::pipe::Reply;
use super::stats::{self, Class};
use super::{Expert, ExpertStore};
use crate::error::EngineError;

impl ExpertStore {
    /// The experts `wanted` (ascending, distinct) of `layer`, yielded as they become ready:
    /// resident ones first, then loads as they complete (on the I/O pool with `--pipe`,
    /// otherwise read here in order). Hits, misses and LRU recency are settled now, in
    /// `wanted` order.
    pub fn fetch_layer(&self, layer: usize, wanted: &[usize]) -> Fetch<'_> {
        // The queues of the previous fetch, emptied: a batch served from RAM allocates nothing.
        let bufs = std::mem::take(&mut *self.spare.lock());
        let mut f = Fetch {
            store: self,
            layer,
            bufs,
            last_yield: None,
            error: None,
            done: false,
        };
        let lstate = match self.layer(layer) {
            Ok(l) => l,
            Err(e) => {
                f.error = Some(e);
                return f;
            }
        };
        if let Some(&bad) = wanted.iter().find(|&&e| e >= self.n_experts) {
            f.error = Some(EngineError::Load(format!(
                "no routed expert {bad} in layer {layer}"
            )));
            return f;
        }
        let FetchBufs {
            classes,
            ready,
            pending,
            lazy,
        } = &mut f.bufs;
        {
            let t = self.track.lock();
            let w = self.window();
            classes.clear();
            classes.extend(
                wanted
                    .iter()
                    .map(|&e| stats::classify(t.dc_pre(layer, e), t.dc_clock, w)),
            );
        }
        let s = &self.core.stats;
        let mut st = lstate.lock();
        if self.pilot_enabled() {
            self.score_pilot(layer, &mut st, wanted);
        }
        let mut cache_requests = 0;
        for (&e, &class) in wanted.iter().zip(classes.iter()) {
            if let Some(x) = &st.pinned[e] {
                s.hits_pin.fetch_add(1, Ordering::Relaxed);
                ready.push_back((e, x.clone()));
                continue;
            }
            cache_requests += 1;
            if let Some(x) = st.lru.get(e) {
                s.hits_lru.fetch_add(1, Ordering::Relaxed);
                ready.push_back((e, x.clone()));
                continue;
            }
            let stamp = st.lru.request(e);
            if let Some(pos) = st.staged.iter().position(|(s, _, _)| *s == e) {
                let (_, rx, claim) = st.staged.swap_remove(pos);
                match rx.try_recv() {
                    Ok(Ok(x)) => {
                        // The pilot read it in time: served from RAM.
                        st.pilot.read_used += 1;
                        st.pilot.in_time += 1;
                        s.hits_lru.fetch_add(1, Ordering::Relaxed);
                        st.lru.insert(e, x.clone(), stamp);
                        ready.push_back((e, x));
                        continue;
                    }
                    // Being read: wait for it rather than read it twice.
                    Err(TryRecvError::Empty) if !self.withdraw_guess(&claim) => {
                        st.pilot.read_used += 1;
                        s.misses.fetch_add(1, Ordering::Relaxed);
                        pending.push((e, stamp, rx));
                        continue;
                    }
                    // Still queued behind other guesses (now withdrawn), or a failed
                    // prefetch: read it as a demand load.
                    _ => {}
                }
            }
            s.misses.fetch_add(1, Ordering::Relaxed);
            match &self.pipe {
                Some(p) => pending.push((e, stamp, p.submit(layer, e, Some(class)))),
                None => lazy.push_back((e, stamp, class)),
            }
        }
        // Guesses for this layer that were not needed: a worker that has not started one
        // skips it.
        st.pilot.cancelled += st.staged.len() as u64;
        for (_, _, claim) in st.staged.drain(..) {
            self.withdraw_guess(&claim);
        }
        if self.shares.is_some() {
            self.share_requests
                .fetch_add(cache_requests, Ordering::Relaxed);
        }
        f
    }

    fn admit(&self, layer: usize, e: usize, x: &Arc<Expert>, stamp: u64) {
        if let Ok(l) = self.layer(layer) {
            l.lock().lru.insert(e, x.clone(), stamp);
        }
    }
}

/// The experts of one layer's batch as they become ready (see [`ExpertStore::fetch_layer`]).
/// Measures how long the compute thread waits for loads and how long it spends on each
/// expert between two `next` calls (PROF `expert_wait_s` / `expert_matmul_s`).
pub struct Fetch<'a> {
    store: &'a ExpertStore,
    layer: usize,
    bufs: FetchBufs,
    last_yield: Option<Instant>,
    error: Option<EngineError>,
    done: bool,
}

/// The queues of one [`Fetch`], kept by the store between fetches (`ExpertStore::spare`) so
/// their capacity is reused.
#[derive(Default)]
pub(super) struct FetchBufs {
    /// DISK-CLASS of each wanted expert, computed before the LRU decisions.
    classes: Vec<Class>,
    ready: VecDeque<(usize, Arc<Expert>)>,
    pending: Vec<(usize, u64, Receiver<Reply>)>,
    lazy: VecDeque<(usize, u64, Class)>,
}

impl Drop for Fetch<'_> {
    /// Hands the emptied queues back to the store. What is still queued is dropped here as it
    /// always was: in-flight loads are abandoned, nothing half-read is admitted.
    fn drop(&mut self) {
        let mut b = std::mem::take(&mut self.bufs);
        b.ready.clear();
        b.pending.clear();
        b.lazy.clear();
        *self.store.spare.lock() = b;
    }
}

impl Fetch<'_> {
    /// The next expert if it can be had without waiting (resident, or its load has already
    /// completed), else `None` (which does not mean the fetch is over: `next` then waits). Lets
    /// the caller gather what is ready into one batch while loads are still in flight.
    pub fn next_ready(&mut self) -> Option<<Self as Iterator>::Item> {
        let b = &self.bufs;
        let now = self.error.is_some()
            || !b.ready.is_empty()
            || b.pending.iter().any(|(_, _, rx)| !rx.is_empty());
        if now && !self.done {
            self.next()
        } else {
            None
        }
    }
}

impl Iterator for Fetch<'_> {
    type Item = Result<(usize, Arc<Expert>), EngineError>;

    fn next(&mut self) -> Option<Self::Item> {
        let stats = &self.store.core.stats;
        if let Some(t) = self.last_yield.take() {
            stats
                .matmul_ns
                .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        if self.done {
            return None;
        }
        if let Some(e) = self.error.take() {
            self.done = true;
            return Some(Err(e));
        }
        let item = if let Some(x) = self.bufs.ready.pop_front() {
            Ok(x)
        } else if !self.bufs.pending.is_empty() {
            let t0 = Instant::now();
            let (i, got) = {
                let mut sel = Select::new();
                for (_, _, rx) in &self.bufs.pending {
                    sel.recv(rx);
                }
                let op = sel.select();
                let i = op.index();
                (i, op.recv(&self.bufs.pending[i].2))
            };
            let (e, stamp, _) = self.bufs.pending.swap_remove(i);
            stats
                .wait_ns
                .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
            match got {
                Ok(Ok(x)) => {
                    self.store.admit(self.layer, e, &x, stamp);
                    Ok((e, x))
                }
                Ok(Err(err)) => Err(err),
                Err(_) => Err(EngineError::Load(format!(
                    "the I/O worker loading expert {e} of layer {} stopped",
                    self.layer
                ))),
            }
        } else if let Some((e, stamp, class)) = self.bufs.lazy.pop_front() {
            let t0 = Instant::now();
            let r = self.store.core.load(self.layer, e, Some(class));
            stats
                .wait_ns
                .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
            r.map(|x| {
                let x = Arc::new(x);
                self.store.admit(self.layer, e, &x, stamp);
                (e, x)
            })
        } else {
            self.done = true;
            return None;
        };
        if item.is_err() {
            // Nothing more from this batch: what is in flight is dropped, nothing half-read
            // was admitted.
            self.done = true;
            self.bufs.pending.clear();
            self.bufs.lazy.clear();
        } else {
            self.last_yield = Some(Instant::now());
        }
        Some(item)
    }
}
