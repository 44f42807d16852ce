//! A memory-read bandwidth probe: the limit decode speed is measured against when the experts
//! are in RAM. Every worker thread sums its share of a buffer much larger than the caches with
//! the widest vector loads the detected kernels use, each line asked for a few KiB ahead as
//! the decode kernels ask for theirs (narrow loads under-report: on an AVX-512 machine, 16-byte
//! loads reached about two thirds of what 64-byte loads did, and leaving the lines to the
//! hardware prefetcher another 10-15% less).

use crate::quant::KernelSet;
use rayon::prelude::*;
use std::time::Instant;

/// Best-of-`rounds` read bandwidth in GB/s (1e9 bytes) over a `mb`-megabyte buffer.
pub fn read_bandwidth_gbs(mb: usize, rounds: usize) -> f64 {
    let bytes = mb * 1024 * 1024;
    // In the page size the weights are held in (crate::quant::hugepages), then written once
    // (in parallel) so every page is really backed before timing.
    let mut buf: Vec<u8> = Vec::with_capacity(bytes);
    crate::quant::hugepages::advise_huge(buf.as_mut_ptr(), bytes);
    buf.resize(bytes, 0);
    buf.par_chunks_mut(1 << 20)
        .enumerate()
        .for_each(|(i, c)| c.fill(i as u8 | 1));
    let k = KernelSet::detected();
    // One contiguous share per thread: each streams its own range, as the row-split matmuls do.
    let share = bytes.div_ceil(rayon::current_num_threads()).max(1 << 20);
    let mut best = 0.0f64;
    for _ in 0..rounds.max(1) {
        let t0 = Instant::now();
        let sum: u64 = buf
            .par_chunks(share)
            .map(|c| k.read_sum(c))
            .reduce(|| 0, |a, b| a.wrapping_add(b));
        let secs = t0.elapsed().as_secs_f64();
        std::hint::black_box(sum);
        best = best.max(bytes as f64 / secs / 1e9);
    }
    best
}
