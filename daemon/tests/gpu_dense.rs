//! The GPU products of every weight format against the CPU kernels, on whatever Vulkan adapter
//! the machine has (Mesa's lavapipe where there is no GPU). With int8 activations every
//! quantized format is bit for bit the CPU's (exact integer sums, then the CPU's float order
//! with each product rounded on its own). With f32 activations the device follows the order
//! of the CPU kernels in use; the AVX2 and AVX-512 ones chain fused multiply-adds, which a
//! device may not fuse (lavapipe does not), so these are held to
//! `|gpu - cpu| <= 2^-20 * sum_k |w_k x_k|` per output (sixteen units in the last place of the
//! summed magnitudes) and the same argmax per position, and are bit for bit the CPU's with
//! the portable kernels (no fused operation). Without a Vulkan driver each test says it is
//! skipped.

#[path = "common/gpu.rs"]
mod gpu_common;

use colibri::gpu::{Gpu, GpuMatrix, Product};
use colibri::model::ActMode;
use colibri::quant::{QFormat, QMatrix};
use gpu_common::{values, vulkan};

/// One test at a time: one of them switches the CPU's kernels for the whole process.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Odd shapes: rows and columns off the multiples of 64 and 8, a single group, a long row.
const SHAPES: [(usize, usize); 7] = [
    (37, 200),
    (64, 129),
    (5, 2056),
    (130, 64),
    (1, 7),
    (17, 67),
    (3, 1000),
];

/// A matrix of `fmt` whose row 1 (where there is one) is all zero.
fn matrix(fmt: QFormat, rows: usize, cols: usize) -> QMatrix {
    let mut w = values(rows * cols, (rows * 31 + cols) as u64);
    if rows > 1 {
        w[cols..2 * cols].fill(0.0);
    }
    if fmt == QFormat::F32 {
        QMatrix::from_f32(w, rows, cols)
    } else {
        QMatrix::quantize(&w, rows, cols, fmt)
    }
}

/// `n` positions, the second all zero (scale 0 in int8).
fn input(cols: usize, n: usize) -> Vec<f32> {
    let mut x = values(n * cols, (cols + 7 * n) as u64);
    if n > 1 {
        x[cols..2 * cols].fill(0.0);
    }
    x
}

fn cpu(m: &QMatrix, x: &[f32], n: usize, act: ActMode) -> Vec<f32> {
    let mut y = vec![0.0; n * m.rows()];
    match act {
        ActMode::Int8 => m.matmul_i8act(x, n, &mut y),
        ActMode::F32 => m.matmul(x, n, &mut y),
    }
    y
}

fn gpu_run(gpu: &Gpu, g: &GpuMatrix, x: &[f32], n: usize, act: ActMode) -> Vec<f32> {
    let mut out = vec![Vec::new()];
    let p = Product {
        matrix: g,
        x,
        n,
        act,
    };
    gpu.run(&[p], &mut out).unwrap();
    out.pop().unwrap()
}

/// The largest `|gpu - cpu| / sum_k |w_k x_k|` over the outputs, after checking each against
/// the bound and each position's argmax.
fn within_bound(m: &QMatrix, x: &[f32], n: usize, got: &[f32], want: &[f32], what: &str) -> f64 {
    let (rows, cols) = (m.rows(), m.cols());
    let w = m.dequantize();
    let mut worst = 0f64;
    for s in 0..n {
        let xs = &x[s * cols..(s + 1) * cols];
        for r in 0..rows {
            let mag: f64 = (w[r * cols..(r + 1) * cols].iter().zip(xs))
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            let (g, c) = (got[s * rows + r], want[s * rows + r]);
            let err = (g as f64 - c as f64).abs();
            assert!(
                err <= mag * 2f64.powi(-20),
                "{what}: row {r} position {s}: gpu {g} cpu {c} (sum |w x| {mag})"
            );
            if mag > 0.0 {
                worst = worst.max(err / mag);
            }
        }
        let argmax = |v: &[f32]| {
            (0..rows).fold(0, |b, r| {
                if v[s * rows + r] > v[s * rows + b] {
                    r
                } else {
                    b
                }
            })
        };
        assert_eq!(argmax(got), argmax(want), "{what}: argmax of position {s}");
    }
    worst
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn int8_activations_are_bit_exact_in_every_quantized_format() {
    let _one = serial();
    let Some(gpu) = vulkan("int8_activations_are_bit_exact_in_every_quantized_format") else {
        return;
    };
    for fmt in QFormat::ALL.into_iter().filter(|&f| f != QFormat::F32) {
        for (rows, cols) in SHAPES {
            let m = matrix(fmt, rows, cols);
            let g = GpuMatrix::upload(&gpu, &m).unwrap();
            for n in [1, 3, 17] {
                let x = input(cols, n);
                let got = gpu_run(&gpu, &g, &x, n, ActMode::Int8);
                let want = cpu(&m, &x, n, ActMode::Int8);
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{fmt} {rows}x{cols}, {n} positions"
                );
            }
        }
    }
}

#[test]
fn f32_activations_are_within_the_bound() {
    let _one = serial();
    let Some(gpu) = vulkan("f32_activations_are_within_the_bound") else {
        return;
    };
    // f32 weights take f32 activations in either mode, as on the CPU.
    let cases = std::iter::once((QFormat::F32, ActMode::Int8))
        .chain(QFormat::ALL.iter().map(|&f| (f, ActMode::F32)));
    for (fmt, act) in cases {
        let (mut worst, mut exact, mut total) = (0f64, 0, 0);
        for (rows, cols) in SHAPES {
            let m = matrix(fmt, rows, cols);
            let g = GpuMatrix::upload(&gpu, &m).unwrap();
            for n in [1, 3, 17] {
                let x = input(cols, n);
                let got = gpu_run(&gpu, &g, &x, n, act);
                let want = cpu(&m, &x, n, act);
                let what = format!("{fmt} {act:?} {rows}x{cols}, {n} positions");
                worst = worst.max(within_bound(&m, &x, n, &got, &want, &what));
                exact += got
                    .iter()
                    .zip(&want)
                    .filter(|(a, b)| a.to_bits() == b.to_bits())
                    .count();
                total += got.len();
                // The zero row is zero on both.
                if rows > 1 {
                    assert!((0..n).all(|s| got[s * rows + 1] == 0.0), "{what}");
                }
            }
        }
        eprintln!(
            "{fmt} x {act:?} activations: {exact}/{total} outputs bit-equal to the CPU, max |err| / sum |w x| = {worst:.3e}"
        );
    }
}

/// Several products of different formats and modes in one batch give what each gives alone,
/// and a stream of like batches reuses the shared buffers (made once, never again).
#[test]
fn batches_mix_formats_and_reuse_their_buffers() {
    let _one = serial();
    let Some(gpu) = vulkan("batches_mix_formats_and_reuse_their_buffers") else {
        return;
    };
    let specs = [
        (QFormat::I8Row, 33, 130, ActMode::Int8),
        (QFormat::I3G64, 9, 200, ActMode::Int8),
        (QFormat::F32, 20, 70, ActMode::F32),
        (QFormat::I4G64, 65, 129, ActMode::F32),
        (QFormat::I2Row, 4, 31, ActMode::Int8),
    ];
    let mats: Vec<(QMatrix, GpuMatrix, Vec<f32>, usize, ActMode)> = specs
        .iter()
        .enumerate()
        .map(|(i, &(fmt, rows, cols, act))| {
            let m = matrix(fmt, rows, cols);
            let g = GpuMatrix::upload(&gpu, &m).unwrap();
            let n = 1 + 2 * i;
            (m, g, input(cols, n), n, act)
        })
        .collect();
    let alone: Vec<Vec<f32>> = mats
        .iter()
        .map(|(_, g, x, n, act)| gpu_run(&gpu, g, x, *n, *act))
        .collect();
    let batch: Vec<Product> = mats
        .iter()
        .map(|(_, g, x, n, act)| Product {
            matrix: g,
            x,
            n: *n,
            act: *act,
        })
        .collect();
    let mut out = vec![Vec::new(); batch.len()];
    gpu.run(&batch, &mut out).unwrap();
    let grown = gpu.buffer_grows();
    for _ in 0..5 {
        gpu.run(&batch, &mut out).unwrap();
        for (i, (o, a)) in out.iter().zip(&alone).enumerate() {
            assert_eq!(bits(o), bits(a), "product {i} of the batch");
        }
    }
    assert_eq!(gpu.buffer_grows(), grown, "like batches made new buffers");
    // A smaller batch fits the buffers too.
    gpu.run(&batch[..2], &mut out[..2]).unwrap();
    assert_eq!(gpu.buffer_grows(), grown);
}

/// With the portable CPU kernels (eight partial sums, no fused multiply-add) the device's f32
/// products are the CPU's bit for bit: WGSL's f32 adds and multiplies are correctly rounded.
#[test]
fn f32_activations_are_bit_exact_against_the_portable_kernels() {
    let _one = serial();
    let Some(gpu) = vulkan("f32_activations_are_bit_exact_against_the_portable_kernels") else {
        return;
    };
    colibri::quant::set_force_portable(true);
    let mut mismatch = None;
    for fmt in QFormat::ALL {
        for (rows, cols) in SHAPES {
            let m = matrix(fmt, rows, cols);
            let g = GpuMatrix::upload(&gpu, &m).unwrap();
            for n in [1, 3, 17] {
                let x = input(cols, n);
                let got = gpu_run(&gpu, &g, &x, n, ActMode::F32);
                let want = cpu(&m, &x, n, ActMode::F32);
                if bits(&got) != bits(&want) && mismatch.is_none() {
                    mismatch = Some(format!("{fmt} {rows}x{cols}, {n} positions"));
                }
            }
        }
    }
    colibri::quant::set_force_portable(false);
    assert_eq!(mismatch, None);
}
