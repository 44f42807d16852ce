//! An integer compute probe: the limit prefill speed is measured against. Every worker thread
//! runs the widest 8-bit multiply-accumulate the CPU has (AVX-512 VNNI `vpdpbusd`, AVX-VNNI,
//! or AVX2's `vpmaddubsw` + `vpmaddwd` + `vpaddd`) on registers only, with enough independent
//! accumulators to hide the instruction latency, so the figure is the cores' u8 x i8 peak, not
//! a kernel's. Reported in multiply-accumulates (one u8 x i8 product added into an i32) per
//! second, the unit the prefill's parameter count gives directly.

use rayon::prelude::*;
use std::time::Instant;

/// Best-of-`rounds` 8-bit multiply-accumulates per second over all rayon threads, in units
/// of 1e9, and the instruction it used.
pub fn int8_peak_gmacs(rounds: usize) -> (f64, &'static str) {
    let (per_call, name, f): (u64, &str, fn(u64) -> i32) = pick();
    const ITERS: u64 = 1 << 22;
    let threads = rayon::current_num_threads();
    let mut best = 0.0f64;
    for _ in 0..rounds.max(1) {
        let t0 = Instant::now();
        let sink: i64 = (0..threads)
            .into_par_iter()
            .map(|i| f(ITERS + i as u64 % 2) as i64)
            .sum();
        std::hint::black_box(sink);
        let secs = t0.elapsed().as_secs_f64();
        best = best.max((threads as u64 * ITERS * per_call) as f64 / secs / 1e9);
    }
    (best, name)
}

/// (multiply-accumulates per loop iteration, name, loop).
fn pick() -> (u64, &'static str, fn(u64) -> i32) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("avx512bw")
        {
            return (8 * 64, "avx512-vnni vpdpbusd", |n| {
                // SAFETY: returned only once the features it is compiled for were detected
                // (CPU features do not change while the process runs).
                unsafe { x86::vnni512(n) }
            });
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            return (8 * 32, "avx2 vpmaddubsw+vpmaddwd", |n| {
                // SAFETY: as above, for AVX2.
                unsafe { x86::avx2(n) }
            });
        }
    }
    (8, "portable", portable)
}

/// Eight independent i32 multiply-accumulate chains.
fn portable(n: u64) -> i32 {
    let mut acc = [0i32; 8];
    let (a, b) = (std::hint::black_box(3i32), std::hint::black_box(-5i32));
    for _ in 0..n {
        let a = std::hint::black_box(a);
        for (i, v) in acc.iter_mut().enumerate() {
            *v = v.wrapping_add((a + i as i32).wrapping_mul(b));
        }
    }
    acc.iter().fold(0, |s, v| s.wrapping_add(*v))
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// `n` iterations of eight independent `vpdpbusd` (64 u8 x i8 products each).
    ///
    /// # Safety
    /// The CPU must have AVX-512F/BW and AVX-512 VNNI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn vnni512(n: u64) -> i32 {
        let u = _mm512_set1_epi8(std::hint::black_box(3));
        let x = _mm512_set1_epi8(std::hint::black_box(-2));
        let mut a = [_mm512_setzero_si512(); 8];
        for _ in 0..n {
            for v in a.iter_mut() {
                *v = _mm512_dpbusd_epi32(*v, u, x);
            }
        }
        let mut s = a[0];
        for v in &a[1..] {
            s = _mm512_add_epi32(s, *v);
        }
        _mm512_reduce_add_epi32(s)
    }

    /// `n` iterations of eight independent u8 x i8 -> i32 chains of 32 products each (the
    /// three-instruction AVX2 sequence the int8 kernels use).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn avx2(n: u64) -> i32 {
        let u = _mm256_set1_epi8(std::hint::black_box(3));
        let x = _mm256_set1_epi8(std::hint::black_box(-2));
        let ones = _mm256_set1_epi16(1);
        let mut a = [_mm256_setzero_si256(); 8];
        for _ in 0..n {
            // Through memory once per iteration, so the products cannot be hoisted out of
            // the loop (they do not depend on the accumulators).
            let u = std::hint::black_box(u);
            for v in a.iter_mut() {
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), ones);
                *v = _mm256_add_epi32(*v, p);
            }
        }
        let mut s = a[0];
        for v in &a[1..] {
            s = _mm256_add_epi32(s, *v);
        }
        let mut out = [0i32; 8];
        _mm256_storeu_si256(out.as_mut_ptr().cast(), s);
        out.iter().fold(0, |t, v| t.wrapping_add(*v))
    }
}
