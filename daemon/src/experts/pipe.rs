//! The I/O worker pool of `--pipe` / `--pilot`.
//!
//! Workers own an `Arc` of the store's loading core and nothing else. They receive
//! `LoadRequest`s on two channels, demand first (a layer's misses the compute thread waits
//! for) and prefetch second (pilot guesses), and answer each on the request's own reply
//! channel with the loaded expert or the error. Lifecycle: the `Pipe` holds the only request
//! senders; dropping it closes both channels, each worker's receive fails and it returns, and
//! `Drop` joins them. A reply whose receiver is gone (a forward that failed part-way, a
//! prefetch nobody asked for) is dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Select, Sender, TryRecvError};

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
    /// Set when a guess is no longer wanted: a worker that has not started it skips it, so a
    /// stale guess costs no read.
    pub cancel: Option<Arc<AtomicBool>>,
}

pub struct Pipe {
    demand: Option<Sender<LoadRequest>>,
    prefetch: Option<Sender<LoadRequest>>,
    workers: Vec<JoinHandle<()>>,
}

impl Pipe {
    pub fn new(core: Arc<Core>, n: usize) -> Pipe {
        let (dtx, drx) = crossbeam_channel::unbounded::<LoadRequest>();
        let (ptx, prx) = crossbeam_channel::unbounded::<LoadRequest>();
        let workers = (0..n.max(1))
            .map(|i| {
                let core = core.clone();
                let (drx, prx) = (drx.clone(), prx.clone());
                std::thread::Builder::new()
                    .name(format!("colibri-io-{i}"))
                    .spawn(move || worker(&core, &drx, &prx))
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

    /// Queues a load; the answer arrives on the returned receiver. A load with a `cancel` flag
    /// is a prefetch (queued behind every demand load).
    pub fn submit(
        &self,
        layer: usize,
        e: usize,
        class: Option<Class>,
        cancel: Option<Arc<AtomicBool>>,
    ) -> Receiver<Reply> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let prefetch = cancel.is_some();
        let req = LoadRequest {
            layer,
            e,
            class,
            reply: tx,
            cancel,
        };
        let ch = if prefetch {
            &self.prefetch
        } else {
            &self.demand
        };
        if let Some(ch) = ch {
            // Fails only once the workers are gone; the receiver then reports it.
            let _ = ch.send(req);
        }
        rx
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

fn serve(core: &Core, req: LoadRequest) {
    if req
        .cancel
        .as_ref()
        .is_some_and(|c| c.load(Ordering::Relaxed))
    {
        core.stats
            .pilot_skipped
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return;
    }
    let r = core.load(req.layer, req.e, req.class).map(Arc::new);
    let _ = req.reply.send(r);
}

fn worker(core: &Core, demand: &Receiver<LoadRequest>, prefetch: &Receiver<LoadRequest>) {
    loop {
        match demand.try_recv() {
            Ok(req) => {
                serve(core, req);
                continue;
            }
            Err(TryRecvError::Disconnected) => return,
            Err(TryRecvError::Empty) => {}
        }
        let mut sel = Select::new();
        let d = sel.recv(demand);
        sel.recv(prefetch);
        let op = sel.select();
        let got = if op.index() == d {
            op.recv(demand)
        } else {
            op.recv(prefetch)
        };
        match got {
            Ok(req) => serve(core, req),
            Err(_) => return, // the Pipe was dropped
        }
    }
}
