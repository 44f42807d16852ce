//! The disk's own ceiling for the reads the tiers make (`colibri bench`'s disk probe): random
//! experts read through the same path (buffered, O_DIRECT, mirror) at the queue depth the I/O
//! pool runs, timed apart from any compute.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use super::ExpertStore;

/// What the probe measured.
#[derive(Clone, Copy, Debug)]
pub struct Probe {
    pub reads: usize,
    pub depth: usize,
    pub bytes: u64,
    pub wall_s: f64,
    /// Mean time of one read, seconds.
    pub service_s: f64,
}

impl Probe {
    pub fn gbs(&self) -> f64 {
        self.bytes as f64 / 1e9 / self.wall_s.max(1e-9)
    }

    /// One read's bytes over its own service time (what a single load could reach).
    pub fn per_read_gbs(&self) -> f64 {
        self.bytes as f64 / self.reads.max(1) as f64 / 1e9 / self.service_s.max(1e-12)
    }
}

impl ExpertStore {
    /// Reads `reads` experts chosen at random (a fixed sequence, so runs compare) with `depth`
    /// reads in flight. `None` when the model has no routed experts or a read fails.
    pub fn disk_probe(&self, reads: usize, depth: usize) -> Option<Probe> {
        let targets: Vec<(usize, usize)> = {
            let sparse: Vec<usize> = (0..self.sparse.len()).filter(|&l| self.sparse[l]).collect();
            if sparse.is_empty() || self.n_experts == 0 {
                return None;
            }
            let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
            (0..reads.max(1))
                .map(|_| {
                    // splitmix64: cheap, and spreads over layers and experts alike.
                    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
                    let mut z = x;
                    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                    z ^= z >> 31;
                    let l = sparse[(z % sparse.len() as u64) as usize];
                    let e = ((z >> 32) % self.n_experts as u64) as usize;
                    (l, e)
                })
                .collect()
        };
        let next = AtomicUsize::new(0);
        let failed = AtomicUsize::new(0);
        let bytes = std::sync::atomic::AtomicU64::new(0);
        let service_ns = std::sync::atomic::AtomicU64::new(0);
        let io = &self.core.io;
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..depth.max(1) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(l, e)) = targets.get(i) else {
                        return;
                    };
                    let Ok(layout) = self.core.layout(l, e) else {
                        failed.fetch_add(1, Ordering::Relaxed);
                        return;
                    };
                    let t = Instant::now();
                    match io.read_ceiling(layout, l, e) {
                        Ok(loaded) => {
                            service_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
                            bytes.fetch_add(layout.payload, Ordering::Relaxed);
                            io.recycle(loaded);
                        }
                        Err(_) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                    }
                });
            }
        });
        let wall_s = t0.elapsed().as_secs_f64();
        if failed.load(Ordering::Relaxed) > 0 {
            return None;
        }
        Some(Probe {
            reads: targets.len(),
            depth: depth.max(1),
            bytes: bytes.load(Ordering::Relaxed),
            wall_s,
            service_s: service_ns.load(Ordering::Relaxed) as f64 / 1e9 / targets.len() as f64,
        })
    }

    /// Reads the I/O pool keeps in flight (1 without `--pipe`).
    pub fn queue_depth(&self) -> usize {
        self.pipe.as_ref().map_or(1, |p| p.workers())
    }
}
