//! The I/O worker pool of `--pipe` / `--pilot`.
//!
//! Workers own an `Arc` of the store's loading core and nothing else. They receive
//! `LoadRequest`s on two channels, demand first (a layer's misses the compute thread waits
//! for) and prefetch second (pilot guesses), and answer each on the request's own reply
//! channel with the loaded expert or the error. Lifecycle: the `Pipe` holds the only request
//! senders; dropping it closes both channels, each worker's receive fails and it returns, and
//! `Drop` joins them. A reply whose receiver is gone (a forward that failed part-way, a
//! prefetch nobody asked for) is dropped.
//!
//! A read in flight cannot be preempted, so the channel order alone does not keep demand
//! loads from waiting behind guesses: a demand load that arrives while every worker reads a
//! guess waits for one of them. The [`Gate`] caps the guesses in flight (a worker takes a
//! guess only holding one of its `cap` slots); the other workers wait on the demand channel
//! only, so a demand load finds a free worker while at most `cap` guesses are read.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Select, Sender, TryRecvError};

use super::stats::Class;
use super::{Core, Expert};
use crate::error::EngineError;

pub type Reply = Result<Arc<Expert>, EngineError>;

pub struct LoadRequest {
    pub layer: usize,
    pub e: usize,
    /// DISK-CLASS of a demand load; `None` for a prefetch.
    pub class: Option<Class>,
    pub reply: Sender<Reply>,
    /// A guess's claim: withdrawn by the store when it is no longer wanted or is wanted now
    /// (then read as a demand load), so a worker that has not started it skips it.
    pub claim: Option<Arc<Claim>>,
}

/// Who reads a guess: the worker that starts it, or nobody once the store withdrew it first.
/// A guess still queued when its layer asks for it is withdrawn and read as a demand load
/// (first in line, on any worker) rather than waited for behind the other guesses.
#[derive(Default)]
pub struct Claim(AtomicU8);

const QUEUED: u8 = 0;
const STARTED: u8 = 1;
const WITHDRAWN: u8 = 2;

impl Claim {
    /// A worker is about to read it: false when the store withdrew it.
    pub(super) fn start(&self) -> bool {
        self.0
            .compare_exchange(QUEUED, STARTED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The store takes it back: true when no worker had started it (and none will).
    pub fn withdraw(&self) -> bool {
        self.0
            .compare_exchange(QUEUED, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

pub struct Pipe {
    demand: Option<Sender<LoadRequest>>,
    prefetch: Option<Sender<LoadRequest>>,
    workers: Vec<JoinHandle<()>>,
}

impl Pipe {
    /// `n` workers, at most `guess_cap` of them reading a guess at a time.
    pub fn new(core: Arc<Core>, n: usize, guess_cap: usize) -> Pipe {
        let (dtx, drx) = crossbeam_channel::unbounded::<LoadRequest>();
        let (ptx, prx) = crossbeam_channel::unbounded::<LoadRequest>();
        let gate = Arc::new(Gate::new(guess_cap));
        let workers = (0..n.max(1))
            .map(|i| {
                let core = core.clone();
                let lanes = Lanes {
                    demand: drx.clone(),
                    prefetch: prx.clone(),
                    gate: gate.clone(),
                };
                std::thread::Builder::new()
                    .name(format!("colibri-io-{i}"))
                    .spawn(move || lanes.run(|req| serve(&core, req)))
                    .expect("spawning an I/O worker thread (out of threads?)")
            })
            .collect();
        Pipe {
            demand: Some(dtx),
            prefetch: Some(ptx),
            workers,
        }
    }

    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// Queues a demand load; the answer arrives on the returned receiver.
    pub fn submit(&self, layer: usize, e: usize, class: Option<Class>) -> Receiver<Reply> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let req = LoadRequest {
            layer,
            e,
            class,
            reply: tx,
            claim: None,
        };
        if let Some(ch) = &self.demand {
            // Fails only once the workers are gone; the receiver then reports it.
            let _ = ch.send(req);
        }
        rx
    }

    /// A guess, not yet queued ([`Pipe::send_guess`]): the request, where its answer will
    /// arrive, and its claim.
    pub fn guess(layer: usize, e: usize) -> (LoadRequest, Receiver<Reply>, Arc<Claim>) {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let claim = Arc::new(Claim::default());
        let req = LoadRequest {
            layer,
            e,
            class: None,
            reply: tx,
            claim: Some(claim.clone()),
        };
        (req, rx, claim)
    }

    /// Queues a guess behind every demand load.
    pub fn send_guess(&self, req: LoadRequest) {
        if let Some(ch) = &self.prefetch {
            let _ = ch.send(req);
        }
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        self.demand.take();
        self.prefetch.take();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Reads one request. A guess withdrawn before a worker reached it costs no read (the store
/// counted it when it withdrew it).
fn serve(core: &Core, req: LoadRequest) {
    if req.claim.as_ref().is_some_and(|c| !c.start()) {
        return;
    }
    let r = core.load(req.layer, req.e, req.class).map(Arc::new);
    let _ = req.reply.send(r);
}

/// How often a worker without a guess slot looks again whether one came free. The workers
/// holding the slots take the next guesses themselves as they finish (a slot given up for a
/// demand load is taken back right after it), so this only matters when a holder stays on
/// demand loads; and an idle daemon's slotless workers wake this often, so not every
/// millisecond (a thousand wake-ups a second each, for nothing).
const RECHECK: Duration = Duration::from_millis(20);

/// The guess slots shared by the pool's workers.
pub struct Gate {
    in_flight: AtomicUsize,
    cap: usize,
}

impl Gate {
    pub fn new(cap: usize) -> Gate {
        Gate {
            in_flight: AtomicUsize::new(0),
            cap: cap.max(1),
        }
    }

    /// A slot if fewer than `cap` are taken.
    fn take(&self) -> Option<Slot<'_>> {
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.cap).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(self))
    }
}

/// A taken guess slot; dropping it frees it.
struct Slot<'a>(&'a Gate);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One worker's view of the pool: the two request channels and the guess gate. Generic over
/// the request so the scheduling is testable without a model.
struct Lanes<T> {
    demand: Receiver<T>,
    prefetch: Receiver<T>,
    gate: Arc<Gate>,
}

impl<T> Lanes<T> {
    /// Serves requests until the channels close: every queued demand request before a guess,
    /// and a guess only holding a gate slot.
    fn run(&self, mut serve: impl FnMut(T)) {
        loop {
            match self.demand.try_recv() {
                Ok(req) => {
                    serve(req);
                    continue;
                }
                Err(TryRecvError::Disconnected) => return,
                Err(TryRecvError::Empty) => {}
            }
            let Some(slot) = self.gate.take() else {
                // Enough guesses are being read: this worker is kept for demand.
                match self.demand.recv_timeout(RECHECK) {
                    Ok(req) => serve(req),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => return,
                }
                continue;
            };
            let mut sel = Select::new();
            let d = sel.recv(&self.demand);
            sel.recv(&self.prefetch);
            let op = sel.select();
            if op.index() == d {
                drop(slot);
                match op.recv(&self.demand) {
                    Ok(req) => serve(req),
                    Err(_) => return, // the Pipe was dropped
                }
                continue;
            }
            let Ok(guess) = op.recv(&self.prefetch) else {
                return;
            };
            // Demand that arrived meanwhile goes first (the slot stays taken: this guess is
            // next on this worker).
            while let Ok(req) = self.demand.try_recv() {
                serve(req);
            }
            serve(guess);
            drop(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guess_is_read_by_a_worker_or_withdrawn_never_both() {
        let c = Claim::default();
        assert!(c.withdraw());
        assert!(!c.start(), "a withdrawn guess is skipped");
        assert!(!c.withdraw());
        let c = Claim::default();
        assert!(c.start());
        assert!(
            !c.withdraw(),
            "a guess being read is waited for, not read again"
        );
        assert!(!c.start());
    }
    use std::sync::Mutex;
    use std::time::Instant;

    /// A request of the test pool: a guess or not, and when it was sent.
    struct Req {
        guess: bool,
        sent: Instant,
    }

    /// Four workers, cap 1: a flood of guesses never has more than one in flight, and demand
    /// sent behind it is served at once by a free worker, long before the guesses drain.
    #[test]
    fn guesses_in_flight_stay_under_the_cap_and_demand_does_not_wait() {
        for cap in [1, 2] {
            let (dtx, drx) = crossbeam_channel::unbounded::<Req>();
            let (ptx, prx) = crossbeam_channel::unbounded::<Req>();
            let gate = Arc::new(Gate::new(cap));
            let guesses_now = Arc::new(AtomicUsize::new(0));
            let max_guesses = Arc::new(AtomicUsize::new(0));
            let guesses_done = Arc::new(AtomicUsize::new(0));
            // (guesses done when it finished, how long it waited) per demand request.
            let demand_log = Arc::new(Mutex::new(Vec::new()));
            let workers: Vec<_> = (0..4)
                .map(|_| {
                    let lanes = Lanes {
                        demand: drx.clone(),
                        prefetch: prx.clone(),
                        gate: gate.clone(),
                    };
                    let (now, max, done, log) = (
                        guesses_now.clone(),
                        max_guesses.clone(),
                        guesses_done.clone(),
                        demand_log.clone(),
                    );
                    std::thread::spawn(move || {
                        lanes.run(|r: Req| {
                            if r.guess {
                                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                                max.fetch_max(n, Ordering::SeqCst);
                                std::thread::sleep(Duration::from_millis(10));
                                now.fetch_sub(1, Ordering::SeqCst);
                                done.fetch_add(1, Ordering::SeqCst);
                            } else {
                                let waited = r.sent.elapsed();
                                std::thread::sleep(Duration::from_millis(2));
                                log.lock()
                                    .unwrap()
                                    .push((done.load(Ordering::SeqCst), waited));
                            }
                        })
                    })
                })
                .collect();
            let n_guesses = 24;
            for _ in 0..n_guesses {
                ptx.send(Req {
                    guess: true,
                    sent: Instant::now(),
                })
                .unwrap();
            }
            std::thread::sleep(Duration::from_millis(15));
            for _ in 0..4 {
                dtx.send(Req {
                    guess: false,
                    sent: Instant::now(),
                })
                .unwrap();
            }
            // Let every guess run, then close the pool.
            while guesses_done.load(Ordering::SeqCst) < n_guesses {
                std::thread::sleep(Duration::from_millis(5));
            }
            drop((dtx, ptx));
            for w in workers {
                w.join().unwrap();
            }
            assert!(max_guesses.load(Ordering::SeqCst) <= cap, "cap {cap}");
            assert_eq!(gate.in_flight.load(Ordering::SeqCst), 0, "slots leaked");
            let log = demand_log.lock().unwrap();
            assert_eq!(log.len(), 4);
            for &(done, waited) in log.iter() {
                // Served while most guesses were still queued, and not behind a guess read.
                assert!(
                    done < n_guesses / 2,
                    "cap {cap}: demand after {done} guesses"
                );
                assert!(
                    waited < Duration::from_millis(200),
                    "cap {cap}: demand waited {waited:?}"
                );
            }
        }
    }

    /// With every slot free a lone worker still reads guesses, and demand queued with them
    /// goes first.
    #[test]
    fn queued_demand_goes_before_guesses() {
        let (dtx, drx) = crossbeam_channel::unbounded::<Req>();
        let (ptx, prx) = crossbeam_channel::unbounded::<Req>();
        for g in [true, true, false, true, false] {
            let ch = if g { &ptx } else { &dtx };
            ch.send(Req {
                guess: g,
                sent: Instant::now(),
            })
            .unwrap();
        }
        drop((dtx, ptx));
        let lanes = Lanes {
            demand: drx,
            prefetch: prx,
            gate: Arc::new(Gate::new(1)),
        };
        let mut order = Vec::new();
        lanes.run(|r: Req| order.push(r.guess));
        // The channels close once the demand channel is drained and empty; the guesses left
        // are dropped with the pool, as they were before the gate.
        assert_eq!(order[..2], [false, false], "{order:?}");
    }
}
