//! A memory-read bandwidth probe: the limit decode speed is measured against when the experts
//! are in RAM. Sums a buffer much larger than the caches with every worker thread.

use rayon::prelude::*;
use std::time::Instant;

/// Best-of-`rounds` read bandwidth in GB/s (1e9 bytes) over a `mb`-megabyte buffer.
pub fn read_bandwidth_gbs(mb: usize, rounds: usize) -> f64 {
    let words = mb * 1024 * 1024 / 8;
    // Written once so every page is really backed before timing.
    let buf: Vec<u64> = (0..words as u64).collect();
    let chunk = (words / (rayon::current_num_threads() * 8)).max(4096);
    let mut best = 0.0f64;
    for _ in 0..rounds.max(1) {
        let t0 = Instant::now();
        let sum: u64 = buf
            .par_chunks(chunk)
            .map(|c| {
                // Eight independent lanes so the loop is bound by loads, not by one add chain.
                let mut acc = [0u64; 8];
                for block in c.chunks_exact(8) {
                    for (a, &b) in acc.iter_mut().zip(block) {
                        *a = a.wrapping_add(b);
                    }
                }
                acc.iter().fold(0u64, |a, &b| a.wrapping_add(b))
            })
            .reduce(|| 0, |a, b| a.wrapping_add(b));
        let secs = t0.elapsed().as_secs_f64();
        std::hint::black_box(sum);
        best = best.max((words * 8) as f64 / secs / 1e9);
    }
    best
}
