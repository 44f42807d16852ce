//! Timing (not a correctness test) of a pp64 MoE layer's expert products as the few-rows
//! tasks run them (`experts/run.rs`' `expert_rows`): `cargo test --release -p colibri --lib
//! quant::ggml::tests_moe -- --ignored --nocapture`. One thread, experts of the bench model's
//! shape (gate and up Q4_K [768, 2048], down Q6_K [2048, 768]), as many as a pp64 forward of
//! `colibri bench`'s synthetic prompt touches (341 over 12 layers, 1 GB: from memory, as
//! there), each with the rows the route trace gave it; the best of five passes in this thread's CPU time.

use super::tests::{random_row, Rng};
use super::*;
use crate::quant::QMatrix;

/// Rows per expert of a pp64 `colibri bench` forward (route trace, all 12 layers): count of
/// experts with 1, 2, ... rows.
const ROWS: [(usize, usize); 19] = [
    (1, 50),
    (2, 27),
    (3, 29),
    (4, 18),
    (6, 19),
    (8, 20),
    (10, 16),
    (12, 12),
    (14, 15),
    (16, 15),
    (20, 16),
    (24, 6),
    (28, 10),
    (34, 12),
    (40, 9),
    (44, 13),
    (50, 15),
    (55, 13),
    (62, 28),
];

/// This thread's CPU time: the machine's other work would count in wall time.
fn cpu() -> std::time::Duration {
    use nix::time::{clock_gettime, ClockId};
    clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(std::time::Duration::from)
        .expect("the thread's CPU clock")
}

fn matrix(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> QMatrix {
    let data = random_row(ty, rows * cols / 256, rng);
    QMatrix::from_ggml(ty, rows, cols, data).unwrap()
}

#[test]
#[ignore]
fn bench_pp64_experts() {
    bench(GgmlType::Q4_K, GgmlType::Q6_K);
    bench(GgmlType::IQ2_XXS, GgmlType::IQ2_XXS);
}

fn bench(gu: GgmlType, dn: GgmlType) {
    let (hidden, inter) = (2048, 768);
    let mut rng = Rng(0x64_64);
    let counts: Vec<usize> = ROWS
        .iter()
        .flat_map(|&(r, e)| std::iter::repeat_n(r, e))
        .collect();
    let experts: Vec<[QMatrix; 3]> = counts
        .iter()
        .map(|_| {
            [
                matrix(gu, inter, hidden, &mut rng),
                matrix(gu, inter, hidden, &mut rng),
                matrix(dn, hidden, inter, &mut rng),
            ]
        })
        .collect();
    let x: Vec<f32> = (0..64 * hidden).map(|_| rng.unit()).collect();
    let mut q8 = Q8Act::new();
    let (mut g, mut u, mut y) = (
        vec![0f32; 64 * inter],
        vec![0f32; 64 * inter],
        vec![0f32; 64 * hidden],
    );
    let mut gathered = vec![0f32; 64 * hidden];
    let macs: usize = counts.iter().map(|&n| n * 3 * hidden * inter).sum();
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = cpu();
        q8.fill(ActKind::Q8K, &x, 64, hidden);
        for (e, (&n, [gate, up, down])) in counts.iter().zip(&experts).enumerate() {
            let picks: Vec<usize> = (0..n).map(|i| (e * 7 + i * 13) % 64).collect();
            let (g, u, y) = (
                &mut g[..n * inter],
                &mut u[..n * inter],
                &mut y[..n * hidden],
            );
            if !QMatrix::pair_panels_picked(gate, up, &q8, &picks, g, u) {
                for (gr, &s) in gathered.chunks_exact_mut(hidden).zip(&picks) {
                    gr.copy_from_slice(&x[s * hidden..(s + 1) * hidden]);
                }
                QMatrix::matmul_pair_i8act_on_caller(gate, up, &gathered[..n * hidden], n, g, u);
            }
            down.matmul_i8act_on_caller(g, n, y);
        }
        best = best.min((cpu() - t).as_secs_f64());
    }
    eprintln!(
        "pp64 experts {}/{}: {} experts, {} rows: best {:.1} ms, {:.1} GMAC/s",
        gu.name(),
        dn.name(),
        counts.len(),
        counts.iter().sum::<usize>(),
        best * 1e3,
        macs as f64 / best / 1e9
    );
}
