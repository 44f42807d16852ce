//! Product, SIMD-vs-portable and threading tests (helpers in `tests.rs`).

use super::matmul::{as_i8, Split};
use super::pack::{row_bytes, scales_per_row, GROUP};
use super::tests::{act_exact, kernel_sets, ref_matmul, Rng, QUANT_FORMATS};
use super::tuning::PAR_MIN_WORK;
use super::*;

// ---------------------------------------------------------------------------
// Products
// ---------------------------------------------------------------------------

const SHAPES: [(usize, usize, usize); 8] = [
    (1, 1, 1),
    (5, 3, 2),
    (7, 63, 1),
    (4, 65, 3),
    (9, 127, 2),
    (3, 130, 1),
    (16, 256, 4),
    (33, 1000, 2),
];

#[test]
fn matmul_f32_path_matches_dequantized_product() {
    // Tolerance: the exact path differs from the f64 reference only by f32
    // summation rounding, bounded here by 1e-5 * sum |w x|.
    let mut rng = Rng::new(21);
    for k in kernel_sets() {
        for fmt in QFormat::ALL {
            for (rows, cols, n_seq) in SHAPES {
                let w = rng.weights(rows * cols);
                let x = rng.vec(cols * n_seq);
                let m = QMatrix::quantize(&w, rows, cols, fmt);
                let deq = m.dequantize();
                let reference = ref_matmul(&deq, rows, cols, &x, n_seq);
                let mut y = vec![f32::NAN; rows * n_seq];
                m.matmul_with(k, &x, n_seq, &mut y);
                for (i, (&got, &(want, mag))) in y.iter().zip(&reference).enumerate() {
                    let err = (got as f64 - want).abs();
                    assert!(
                        err <= 1e-5 * mag + 1e-30,
                        "{} {fmt} {rows}x{cols}x{n_seq} i={i}: {got} vs {want}",
                        k.name()
                    );
                }
            }
        }
    }
}

#[test]
fn matmul_i8act_within_derived_bound() {
    // With x' = sx * xq, |x'_i - x_i| <= sx/2 (rint; the clamp at 127 is
    // never active since |x_i| <= amax = 127 sx).  So
    //   |sum w_i x'_i - sum w_i x_i| <= sx/2 * sum |w_i|
    // (w the dequantized weight; integer sums are exact).  The remaining
    // f32 steps (i32 -> f32, group accumulation, the scale products) add a
    // relative error far below 1e-5 of sum |w_i| (|x_i| + sx).
    let mut rng = Rng::new(31);
    for k in kernel_sets() {
        for fmt in QFormat::ALL {
            for (rows, cols, n_seq) in SHAPES {
                let w = rng.weights(rows * cols);
                let mut x = rng.vec(cols * n_seq);
                if cols > 4 {
                    x[cols / 2] *= 20.0; // an outlier position
                }
                let m = QMatrix::quantize(&w, rows, cols, fmt);
                let deq = m.dequantize();
                let mut y = vec![f32::NAN; rows * n_seq];
                m.matmul_i8act_with(k, &x, n_seq, &mut y);
                for s in 0..n_seq {
                    let xs = &x[s * cols..(s + 1) * cols];
                    let sx = xs.iter().fold(0f32, |a, v| a.max(v.abs())) as f64 / 127.0;
                    for o in 0..rows {
                        let wr = &deq[o * cols..(o + 1) * cols];
                        let want: f64 = wr.iter().zip(xs).map(|(&a, &b)| a as f64 * b as f64).sum();
                        let wabs: f64 = wr.iter().map(|v| v.abs() as f64).sum();
                        let wx: f64 = wr
                            .iter()
                            .zip(xs)
                            .map(|(&a, &b)| (a as f64).abs() * ((b as f64).abs() + sx))
                            .sum();
                        let bound = if fmt == QFormat::F32 {
                            1e-5 * wx
                        } else {
                            sx / 2.0 * wabs + 1e-5 * wx
                        } + 1e-30;
                        let got = y[s * rows + o] as f64;
                        assert!(
                            (got - want).abs() <= bound,
                            "{} {fmt} {rows}x{cols}x{n_seq} s={s} o={o}: {got} vs {want} (bound {bound})",
                            k.name()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn f32_i8act_equals_matmul_and_zero_activations() {
    let mut rng = Rng::new(41);
    let (rows, cols) = (6, 70);
    let w = rng.vec(rows * cols);
    let x = rng.vec(cols * 2);
    let m = QMatrix::from_f32(w.clone(), rows, cols);
    let (mut a, mut b) = (vec![0f32; rows * 2], vec![0f32; rows * 2]);
    let k = KernelSet::detected();
    m.matmul_with(k, &x, 2, &mut a);
    m.matmul_i8act_with(k, &x, 2, &mut b);
    assert_eq!(a, b);
    for fmt in QUANT_FORMATS {
        let m = QMatrix::quantize(&w, rows, cols, fmt);
        let mut y = vec![f32::NAN; rows];
        m.matmul_i8act(&vec![0.0; cols], 1, &mut y);
        assert!(y.iter().all(|&v| v == 0.0), "{fmt}");
    }
}

#[test]
fn n_seq_layout_matches_single_positions() {
    // y[s*rows + o] equals the single-position product, bit for bit.
    let mut rng = Rng::new(51);
    let (rows, cols, n_seq) = (13, 130, 5);
    let w = rng.weights(rows * cols);
    let x = rng.vec(cols * n_seq);
    for (fmt, k) in QFormat::ALL
        .into_iter()
        .flat_map(|f| kernel_sets().into_iter().map(move |k| (f, k)))
    {
        let m = QMatrix::quantize(&w, rows, cols, fmt);
        for i8act in [false, true] {
            let mut y = vec![0f32; rows * n_seq];
            let run = |x: &[f32], n: usize, y: &mut [f32]| {
                if i8act {
                    m.matmul_i8act_with(k, x, n, y)
                } else {
                    m.matmul_with(k, x, n, y)
                }
            };
            run(&x, n_seq, &mut y);
            for s in 0..n_seq {
                let mut y1 = vec![0f32; rows];
                run(&x[s * cols..(s + 1) * cols], 1, &mut y1);
                assert_eq!(&y[s * rows..(s + 1) * rows], &y1[..], "{fmt} i8act={i8act}");
            }
        }
    }
}

/// An f32 matrix at four positions and more takes its rows four at a time through blocks of
/// positions (`f32_rows_by_quads`, a prefill's router): every output keeps the bits of the
/// one-position product (one `dot_f32`), with every kernel set, at row counts that leave no
/// quad, a part quad or none, positions around the block of sixteen, a router's 64 by 2048
/// at 512 positions, widths with and without a tail past the vectors.
#[test]
fn f32_rows_by_quads_keep_the_one_position_bits() {
    let mut rng = Rng::new(0x52_0001);
    let shapes = [
        (1, 130, 4),
        (4, 17, 17),
        (17, 2048, 17),
        (7, 64, 64),
        (64, 2048, 512),
        (6, 100, 33),
    ];
    for (rows, cols, n_seq) in shapes {
        let m = QMatrix::from_f32(rng.weights(rows * cols), rows, cols);
        let x = rng.vec(cols * n_seq);
        for k in kernel_sets() {
            let mut y = vec![f32::NAN; rows * n_seq];
            m.matmul_with(k, &x, n_seq, &mut y);
            for s in 0..n_seq {
                let mut y1 = vec![f32::NAN; rows];
                m.matmul_with(k, &x[s * cols..(s + 1) * cols], 1, &mut y1);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&y[s * rows..(s + 1) * rows]),
                    bits(&y1),
                    "{} {rows}x{cols} at {n_seq} positions: position {s}",
                    k.name()
                );
            }
        }
    }
}

#[test]
fn force_portable_switch() {
    // Other tests use explicit kernel sets, so toggling the global is safe.
    let m = QMatrix::quantize(&Rng::new(5).vec(8 * 100), 8, 100, QFormat::I4G64);
    let x = Rng::new(6).vec(100);
    let (mut a, mut b) = (vec![0f32; 8], vec![0f32; 8]);
    set_force_portable(true);
    assert_eq!(kernel_name(), "portable");
    m.matmul_i8act(&x, 1, &mut a);
    set_force_portable(false);
    assert_eq!(kernel_name(), KernelSet::detected().name());
    m.matmul_i8act(&x, 1, &mut b);
    assert_eq!(a, b);
}

#[test]
fn degenerate_shapes() {
    for fmt in QFormat::ALL {
        let m = QMatrix::quantize(&[], 0, 5, fmt);
        m.matmul(&[0.0; 10], 2, &mut []);
        let m = QMatrix::quantize(&[], 3, 0, fmt);
        let mut y = vec![1.0; 6];
        m.matmul_i8act(&[], 2, &mut y);
        assert_eq!(y, vec![0.0; 6]);
    }
}

// ---------------------------------------------------------------------------
// AVX2 vs portable
// ---------------------------------------------------------------------------

#[test]
fn simd_kernels_exact() {
    let p = KernelSet::portable();
    let sets: Vec<_> = kernel_sets()
        .into_iter()
        .filter(|k| k.name() != "portable")
        .collect();
    crate::elog!("SIMD kernel sets here: {sets:?}");
    let mut rng = Rng::new(61);
    for cols in (1..300).chain([511, 512, 1000, 4096 + 37, 6144, 6144 + 64]) {
        // Activations are int8 in [-127, 127]; include the extremes.
        let xq: Vec<i8> = (0..cols)
            .map(|i| match i % 7 {
                0 => 127,
                1 => -127,
                _ => (rng.below(255) as i32 - 127) as i8,
            })
            .collect();
        for fmt in QUANT_FORMATS {
            let wb: Vec<u8> = (0..row_bytes(fmt, cols))
                .map(|_| rng.next_u64() as u8)
                .collect();
            let s: Vec<f32> = (0..scales_per_row(fmt, cols)).map(|_| rng.f()).collect();
            let act = act_exact(&mut xq.clone(), fmt);
            let (xa, xg, _, _) = act.pos(0);
            for k in &sets {
                let tag = format!("{} {fmt} cols={cols}", k.name());
                match fmt {
                    QFormat::I8Row => {
                        assert_eq!(
                            (k.dot_i8)(as_i8(&wb), xa),
                            (p.dot_i8)(as_i8(&wb), xa),
                            "{tag}"
                        )
                    }
                    QFormat::I4Row => assert_eq!((k.dot_u4)(&wb, xa), (p.dot_u4)(&wb, xa), "{tag}"),
                    QFormat::I2Row => assert_eq!((k.dot_i2)(&wb, xa), (p.dot_i2)(&wb, xa), "{tag}"),
                    QFormat::I4G64 => assert_eq!(
                        (k.row_i4g64)(&wb, xa, xg, &s).to_bits(),
                        (p.row_i4g64)(&wb, xa, xg, &s).to_bits(),
                        "{tag}"
                    ),
                    QFormat::I3G64 => assert_eq!(
                        (k.row_i3g64)(&wb, xa, xg, &s).to_bits(),
                        (p.row_i3g64)(&wb, xa, xg, &s).to_bits(),
                        "{tag}"
                    ),
                    QFormat::F32 | QFormat::Mxfp4 | QFormat::Ggml(_) => unreachable!(),
                }
            }
        }
    }
    // Extreme values: all int8 weights -128 against all activations +-127
    // (the |w| = 128 case of the sign trick), and all-15 / all-0 nibbles.
    for k in &sets {
        for n in [64usize, 96, 200] {
            let w = vec![-128i8; n];
            for v in [127i8, -127] {
                let mut x = vec![v; n.div_ceil(128) * 128];
                assert_eq!((k.dot_i8)(&w, &x), -128 * v as i32 * n as i32, "{k:?}");
                x[n..].fill(0);
                for b in [0xFFu8, 0x00] {
                    let wb = vec![b; n / 2];
                    assert_eq!((k.dot_u4)(&wb, &x), (p.dot_u4)(&wb, &x), "{k:?}");
                }
            }
        }
    }
}

#[test]
fn every_kernel_set_gives_the_same_bits() {
    let p = KernelSet::portable();
    let mut rng = Rng::new(71);
    for _ in 0..40 {
        let rows = 1 + rng.below(20);
        let cols = 1 + rng.below(700);
        let n_seq = 1 + rng.below(4);
        let w = rng.weights(rows * cols);
        let x = rng.vec(cols * n_seq);
        for fmt in QFormat::ALL {
            let m = QMatrix::quantize(&w, rows, cols, fmt);
            let mut want = vec![0f32; rows * n_seq];
            m.matmul_i8act_with(p, &x, n_seq, &mut want);
            let want_bits: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
            let mut want_f32 = vec![0f32; rows * n_seq];
            m.matmul_with(p, &x, n_seq, &mut want_f32);
            let deq = m.dequantize();
            let reference = ref_matmul(&deq, rows, cols, &x, n_seq);
            for k in kernel_sets() {
                let mut a = vec![0f32; rows * n_seq];
                // Integer paths: bit-identical (same i32 sums, same float ops).
                m.matmul_i8act_with(k, &x, n_seq, &mut a);
                if fmt != QFormat::F32 {
                    let bits: Vec<u32> = a.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(bits, want_bits, "{k:?} {fmt} {rows}x{cols}x{n_seq}");
                }
                // f32 path: summation order differs only; 1e-5 of sum |w x|.
                m.matmul_with(k, &x, n_seq, &mut a);
                for ((&va, &vb), &(_, mag)) in a.iter().zip(&want_f32).zip(&reference) {
                    assert!(
                        ((va - vb) as f64).abs() <= 1e-5 * mag + 1e-30,
                        "{k:?} {fmt} {rows}x{cols}x{n_seq}: {va} vs {vb}"
                    );
                }
            }
        }
    }
}

#[test]
fn pair_equals_separate_calls() {
    let mut rng = Rng::new(75);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    let fmt_pairs = [
        (QFormat::I4G64, QFormat::I4G64),
        (QFormat::I8Row, QFormat::I8Row),
        (QFormat::I4Row, QFormat::I4G64),
        (QFormat::I3G64, QFormat::I3G64),
        (QFormat::I8Row, QFormat::I4G64),
        (QFormat::F32, QFormat::I2Row),
    ];
    for (fa, fb) in fmt_pairs {
        for &(ra, rb, cols, n_seq) in &[(5, 7, 130, 1), (300, 200, 640, 1), (64, 48, 257, 3)] {
            let a = QMatrix::quantize(&rng.weights(ra * cols), ra, cols, fa);
            let b = QMatrix::quantize(&rng.weights(rb * cols), rb, cols, fb);
            let x = rng.vec(cols * n_seq);
            for k in kernel_sets() {
                let (mut ya, mut yb) = (vec![0f32; ra * n_seq], vec![0f32; rb * n_seq]);
                a.matmul_i8act_with(k, &x, n_seq, &mut ya);
                b.matmul_i8act_with(k, &x, n_seq, &mut yb);
                for split in [Split::Auto, Split::Single, Split::Chunks(5)] {
                    let (mut pa, mut pb) = (vec![1f32; ra * n_seq], vec![1f32; rb * n_seq]);
                    pool.install(|| {
                        QMatrix::matmul_pair_split(k, &a, &b, &x, n_seq, &mut pa, &mut pb, split)
                    });
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    let tag = format!("{k:?} {fa}/{fb} {ra},{rb}x{cols}x{n_seq} {split:?}");
                    assert_eq!(bits(&pa), bits(&ya), "{tag}");
                    assert_eq!(bits(&pb), bits(&yb), "{tag}");
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Threading
// ---------------------------------------------------------------------------

#[test]
fn thread_split_is_bit_exact() {
    let mut rng = Rng::new(81);
    let (rows, cols) = (300, 1030);
    let w = rng.weights(rows * cols);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(4)
        .build()
        .unwrap();
    for n_seq in [1usize, 3] {
        let x = rng.vec(cols * n_seq);
        assert!(rows * cols * n_seq > PAR_MIN_WORK);
        for fmt in QFormat::ALL {
            let m = QMatrix::quantize(&w, rows, cols, fmt);
            for k in kernel_sets() {
                for i8act in [false, true] {
                    let run = |split: Split| {
                        let mut y = vec![0f32; rows * n_seq];
                        if i8act {
                            m.matmul_i8act_split(k, &x, n_seq, &mut y, split);
                        } else {
                            m.matmul_split(k, &x, n_seq, &mut y, split);
                        }
                        y.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
                    };
                    let single = run(Split::Single);
                    for split in [Split::Auto, Split::Chunks(1), Split::Chunks(7)] {
                        assert_eq!(pool.install(|| run(split)), single, "{fmt} {split:?}");
                    }
                    assert_eq!(run(Split::Auto), single);
                    // The spinning pool splits the same way (global switch:
                    // harmless to concurrent tests, results are identical).
                    // Guided or equal tasks, the same rows to the same kernels.
                    set_threading(Threading::Spin);
                    for guided in [true, false] {
                        set_decode_tuning(DecodeTuning {
                            guided,
                            ..DecodeTuning::default()
                        });
                        assert_eq!(run(Split::Auto), single, "{fmt} spin, guided {guided}");
                    }
                    set_decode_tuning(DecodeTuning::default());
                    set_threading(Threading::Rayon);
                }
            }
        }
    }
    // Quantization itself is row-parallel and must not depend on it either.
    let big = QMatrix::quantize(&w, rows, cols, QFormat::I4G64);
    let small: Vec<u8> = (0..rows)
        .flat_map(|r| {
            QMatrix::quantize(&w[r * cols..(r + 1) * cols], 1, cols, QFormat::I4G64)
                .data()
                .to_vec()
        })
        .collect();
    assert_eq!(big.data(), &small[..]);
    assert_eq!(GROUP, 64);
}

// ---------------------------------------------------------------------------
// Timing (not a correctness test): `cargo test --release -p colibri --lib
// quant::tests::bench -- --ignored --nocapture`
// ---------------------------------------------------------------------------

#[test]
#[ignore]
fn bench_decode_matmul() {
    use std::time::Instant;
    let mut rng = Rng::new(91);
    let (rows, cols) = (2048, 6144);
    let w = rng.weights(rows * cols);
    let x = rng.vec(cols);
    let mut y = vec![0f32; rows];
    for fmt in QFormat::ALL {
        let m = QMatrix::quantize(&w, rows, cols, fmt);
        for k in kernel_sets() {
            for (label, i8act) in [("f32act", false), ("i8act", true)] {
                for split in [Split::Single, Split::Auto] {
                    let iters = 20;
                    let t = Instant::now();
                    for _ in 0..iters {
                        if i8act {
                            m.matmul_i8act_split(k, &x, 1, &mut y, split);
                        } else {
                            m.matmul_split(k, &x, 1, &mut y, split);
                        }
                    }
                    let dt = t.elapsed().as_secs_f64() / iters as f64;
                    crate::elog!(
                        "{:>9} {:>8} {:>6} {:?}: {:8.3} ms  {:6.2} GB/s weights",
                        fmt.name(),
                        k.name(),
                        label,
                        split,
                        dt * 1e3,
                        m.resident_bytes() as f64 / dt / 1e9
                    );
                }
            }
        }
    }
}

#[test]
#[ignore]
fn bench_prefill_matmul() {
    use std::time::Instant;
    // One thread, the 8-bit compute probe on that thread beside each figure (best of a few
    // alternated passes: the machine may be shared).
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let mut rng = Rng::new(93);
    // A GLM-5 dense shape (from memory) and a medium-model expert's gate (in L2).
    for (rows, cols) in [(2048, 6144), (768, 2048)] {
        let w = rng.weights(rows * cols);
        let x = rng.vec(cols * 64);
        let mut y = vec![0f32; rows * 64];
        for k in kernel_sets() {
            for fmt in [
                QFormat::I8Row,
                QFormat::I4Row,
                QFormat::I4G64,
                QFormat::I3G64,
            ] {
                let m = QMatrix::quantize(&w, rows, cols, fmt);
                for n_seq in [4, 16, 64] {
                    let (x, y) = (&x[..n_seq * cols], &mut y[..n_seq * rows]);
                    m.matmul_i8act_split(k, x, n_seq, y, Split::Single);
                    let (mut dt, mut peak) = (f64::MAX, 0f64);
                    for _ in 0..5 {
                        peak = peak.max(one.install(|| crate::computebw::int8_peak_gmacs(1).0));
                        for _ in 0..6 {
                            let t = Instant::now();
                            m.matmul_i8act_split(k, x, n_seq, y, Split::Single);
                            dt = dt.min(t.elapsed().as_secs_f64());
                        }
                    }
                    let g = (rows * cols * n_seq) as f64 / dt / 1e9;
                    crate::elog!(
                        "{rows}x{cols} {:>9} {:>10} n={n_seq:>2}: {:8.3} ms {:6.1} GMAC/s, probe {peak:6.1}, ratio {:.3}",
                        fmt.name(),
                        k.name(),
                        dt * 1e3,
                        g,
                        g / peak
                    );
                }
            }
        }
    }
}
