//! The few-rows tasks' bits: an expert cut into tasks by rows gives the whole expert's
//! products, and the weighted sum across the threads gives the serial sum's.

use super::run::{expert_rows, task_rows, weighted_sum_par, MAX_TASK_ROWS};
use super::Expert;
use crate::gguf::GgmlType;
use crate::model::ops::swiglu;
use crate::quant::ggml::Q8Act;
use crate::quant::{ActMode, QFormat, QMatrix};
use crate::rng::XorShift64;

/// Every row count is cut into as few tasks as [`MAX_TASK_ROWS`] allows, none longer.
#[test]
fn task_rows_cut_every_count_into_the_fewest_tasks() {
    for rows in 1..=300 {
        let per = task_rows(rows);
        assert!(
            per >= 1 && per <= MAX_TASK_ROWS,
            "{rows} rows: tasks of {per}"
        );
        let tasks = rows.div_ceil(per);
        assert_eq!(
            tasks,
            rows.div_ceil(MAX_TASK_ROWS),
            "{rows} rows: {tasks} tasks of {per}"
        );
    }
}

/// A random matrix of `ty` (`rows` x `cols`), its block scales finite and small.
fn random_matrix(ty: GgmlType, rows: usize, cols: usize, x: &mut XorShift64) -> QMatrix {
    let bb = ty.block_bytes();
    let blocks = rows * cols / ty.block_elems();
    let mut w: Vec<u8> = (0..blocks * bb).map(|_| x.next_u64() as u8).collect();
    for b in w.chunks_exact_mut(bb) {
        // The f16 scale first (both types here): random bytes could be an infinity or NaN.
        let d = half::f16::from_f32(0.002 + 0.01 * x.unit_f32()).to_bits();
        b[..2].copy_from_slice(&d.to_le_bytes());
        if ty == GgmlType::Q4_K {
            let dmin = half::f16::from_f32(0.001 * x.unit_f32()).to_bits();
            b[2..4].copy_from_slice(&dmin.to_le_bytes());
        }
    }
    QMatrix::from_parts(QFormat::Ggml(ty), rows, cols, w, Vec::new()).expect("a whole matrix")
}

/// An expert's rows cut into tasks (and taken in any order of rows), gathered or read from
/// the layer's rows quantized once, give the bits of its whole product: batches of 1, 3, 17, 64 and 100 rows (one task), 130 and 300 (two and
/// three), IQ2_XXS (its AMX planes from 4 positions) and Q4_K, the routed rows out of order.
#[test]
fn an_expert_cut_into_tasks_gives_its_whole_products() {
    let mut x = XorShift64(0x7a5c_0000_0049_0052);
    let (hidden, inter) = (512, 256);
    for ty in [GgmlType::IQ2_XXS, GgmlType::Q4_K] {
        let expert = Expert {
            gate: random_matrix(ty, inter, hidden, &mut x),
            up: random_matrix(ty, inter, hidden, &mut x),
            down: random_matrix(ty, hidden, inter, &mut x),
            oss: None,
        };
        for n in [1, 3, 17, 64, 100, 130, 300] {
            // The layer's rows: more than the expert's, its own picked out of order.
            let total = n + 7;
            let xs: Vec<f32> = (0..total * hidden)
                .map(|_| x.unit_f32() * 4.0 - 2.0)
                .collect();
            let rows: Vec<(usize, f32)> = (0..n).map(|i| ((i * 5 + 3) % total, 0.5)).collect();
            let gathered: Vec<f32> = rows
                .iter()
                .flat_map(|&(s, _)| xs[s * hidden..(s + 1) * hidden].iter().copied())
                .collect();
            let mut want = vec![0f32; n * hidden];
            let (mut g, mut u) = (Vec::new(), Vec::new());
            let mats = [&expert.gate, &expert.up, &expert.down];
            swiglu(
                mats,
                None,
                &gathered,
                n,
                ActMode::Int8,
                (&mut g, &mut u),
                &mut want,
            );
            // The layer's rows quantized once, as `few_rows_batches` does, or gathered and
            // quantized by each task.
            let mut q8 = Q8Act::default();
            let kind = expert.gate.ggml_act().expect("a GGUF type");
            q8.fill(kind, &xs, total, hidden);
            // The rows quantized once reach the panels themselves (not the gathered fallback)
            // from a panel's fewest positions up, where the kernels have panels.
            let panels = crate::quant::KernelSet::active().name() == "avx512vnni";
            if panels && n >= 17 {
                let picks: Vec<usize> = rows.iter().map(|r| r.0).collect();
                let (mut g, mut u) = (vec![0f32; n * inter], vec![0f32; n * inter]);
                let (gate, up) = (&expert.gate, &expert.up);
                assert!(
                    QMatrix::pair_panels_picked(gate, up, &q8, &picks, &mut g, &mut u),
                    "{} expert, {n} rows: the panels of rows quantized once",
                    ty.name()
                );
            }
            for quantized in [None, Some(&q8)] {
                let mut got = vec![f32::NAN; n * hidden];
                let per = task_rows(n);
                for (piece, y) in rows.chunks(per).zip(got.chunks_mut(per * hidden)) {
                    expert_rows(&expert, (&xs, quantized), hidden, piece, y);
                }
                for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                    assert_eq!(
                        w.to_bits(),
                        g.to_bits(),
                        "{} expert, {n} rows in tasks of {per}, quantized once {}: output \
                         {i}: {w} vs {g}",
                        ty.name(),
                        quantized.is_some()
                    );
                }
            }
        }
    }
}

/// The weighted sum across the threads is the serial sum's bits: rows of one to three
/// experts and none, weights of both signs, with and without a shared expert's rows, row
/// counts around the task's sixteen.
#[test]
fn the_weighted_sum_across_threads_is_the_serial_sums_bits() {
    let mut x = XorShift64(0x5a3e_0000_0049_0052);
    let hidden = 24;
    for n in [32, 33, 47, 200] {
        // Experts in ascending order, each with its rows ascending (as `group_by_expert`).
        let mut pairs = Vec::new();
        for e in 0..9 {
            for s in 0..n {
                if (s * 7 + e * 3) % 5 < 2 && s % 11 != 4 {
                    pairs.push((s, x.unit_f32() * 2.0 - 1.0));
                }
            }
        }
        let products: Vec<f32> = (0..pairs.len() * hidden)
            .map(|_| x.unit_f32() * 8.0 - 4.0)
            .collect();
        let shared: Vec<f32> = (0..n * hidden).map(|_| x.unit_f32() - 0.5).collect();
        for with_shared in [false, true] {
            let mut want = vec![0f32; n * hidden];
            for (j, &(s, w)) in pairs.iter().enumerate() {
                for (o, v) in want[s * hidden..(s + 1) * hidden]
                    .iter_mut()
                    .zip(&products[j * hidden..(j + 1) * hidden])
                {
                    *o += v * w;
                }
            }
            if with_shared {
                for (o, v) in want.iter_mut().zip(&shared) {
                    *o += v;
                }
            }
            let mut got = vec![f32::NAN; n * hidden];
            let sh = with_shared.then_some(&shared[..]);
            weighted_sum_par(&mut got, &products, &pairs, hidden, sh);
            for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                assert_eq!(
                    w.to_bits(),
                    g.to_bits(),
                    "{n} rows, shared {with_shared}: {i}"
                );
            }
        }
    }
}
