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

// ---------------------------------------------------------------------------
// Tiles and SIMD activation quantization
// ---------------------------------------------------------------------------

/// Every tile kernel against the portable single kernels, output by output:
/// odd widths, tail blocks and groups, every tile shape (fast and
/// fallback), extreme int8 values.
#[test]
fn tiles_match_portable_single_kernels() {
    use super::act::{ActBuf, Layout};
    let p = KernelSet::portable();
    let mut rng = Rng::new(101);
    let widths = (1..140).chain([191, 255, 256, 257, 511, 1000, 2048 + 64 + 3, 6144 + 37]);
    for cols in widths {
        for fmt in [
            QFormat::I8Row,
            QFormat::I4Row,
            QFormat::I4G64,
            QFormat::I3G64,
        ] {
            let fmt = fmt.canonical(cols);
            let rb = row_bytes(fmt, cols);
            let spr = scales_per_row(fmt, cols);
            for (nr, np) in [(4usize, 1usize), (1, 4), (4, 4), (1, 1), (3, 1), (2, 3)] {
                let extreme = cols % 5 == 0;
                let w: Vec<u8> = (0..nr * rb)
                    .map(|i| match (extreme, i % 3) {
                        (true, 0) => 0x80,
                        (true, 1) => 0x7F,
                        _ => rng.next_u64() as u8,
                    })
                    .collect();
                let s: Vec<f32> = (0..nr * spr).map(|_| rng.f()).collect();
                let x: Vec<f32> = (0..np * cols)
                    .map(|i| if extreme && i % 2 == 0 { -1.0 } else { rng.f() })
                    .collect();
                let mut a = ActBuf::default();
                a.fill(&x, np, cols, Layout::of(fmt));
                for k in kernel_sets() {
                    let tag = format!("{} {fmt} cols={cols} tile {nr}x{np}", k.name());
                    let xq = &a.q[..np * a.stride];
                    let xsum = &a.xs[..np];
                    let mut oi = [0i32; 16];
                    let mut of = [0f32; 16];
                    // Prefetching a tile ahead (past the weights' end, too) changes no output.
                    let pf = nr * rb;
                    let tile = match fmt {
                        QFormat::I8Row => k.dot_i8_tile.map(|f| {
                            f(&w, rb, nr, xq, a.stride, np, xsum, pf, &mut oi);
                        }),
                        QFormat::I4Row => k.dot_u4_tile.map(|f| {
                            f(&w, rb, nr, xq, a.stride, np, xsum, pf, &mut oi);
                        }),
                        QFormat::I3G64 => k.row_i3g64_tile.map(|f| {
                            let xg = &a.xg[..np * a.groups];
                            f(
                                &w, rb, nr, xq, a.stride, np, xg, a.groups, &s, spr, pf, &mut of,
                            );
                        }),
                        _ => k.row_i4g64_tile.map(|f| {
                            let xg = &a.xg[..np * a.groups];
                            f(
                                &w, rb, nr, xq, a.stride, np, xg, a.groups, &s, spr, pf, &mut of,
                            );
                        }),
                    };
                    if tile.is_none() {
                        continue;
                    }
                    for r in 0..nr {
                        let wr = &w[r * rb..(r + 1) * rb];
                        for q in 0..np {
                            let (xa, xg, _, _) = a.pos(q);
                            let o = r * np + q;
                            match fmt {
                                QFormat::I8Row => {
                                    assert_eq!(oi[o], (p.dot_i8)(as_i8(wr), xa), "{tag}")
                                }
                                QFormat::I4Row => {
                                    assert_eq!(oi[o], (p.dot_u4)(wr, xa), "{tag}")
                                }
                                _ => {
                                    let sr = &s[r * spr..(r + 1) * spr];
                                    let want = if fmt == QFormat::I3G64 {
                                        (p.row_i3g64)(wr, xa, xg, sr)
                                    } else {
                                        (p.row_i4g64)(wr, xa, xg, sr)
                                    };
                                    assert_eq!(of[o].to_bits(), want.to_bits(), "{tag}");
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Rows not a multiple of 4, positions not a multiple of 4, tails: every
/// set gives the portable bits, and `n_seq = k` equals `k` single calls.
#[test]
fn tiled_matmuls_match_portable_and_single_positions() {
    let p = KernelSet::portable();
    let mut rng = Rng::new(103);
    for case in 0..27 {
        let rows = [1, 3, 4, 5, 7, 9, 13, 16][case % 8];
        // Up to 4133 (> 2 KB rows in every format: decode tiles too).
        let cols = [1, 37, 64, 65, 130, 200, 1000, 4133, 6144 + 65][(case / 3) % 9];
        let n_seq = [1, 3, 4, 5, 7, 9][case % 6];
        let w = rng.weights(rows * cols);
        let x = rng.vec(cols * n_seq);
        for fmt in QUANT_FORMATS {
            let m = QMatrix::quantize(&w, rows, cols, fmt);
            let mut want = vec![0f32; rows * n_seq];
            m.matmul_i8act_split(p, &x, n_seq, &mut want, Split::Single);
            for k in kernel_sets() {
                let tag = format!("{} {fmt} {rows}x{cols}x{n_seq}", k.name());
                for split in [Split::Single, Split::Chunks(3), Split::Chunks(8)] {
                    let mut y = vec![0f32; rows * n_seq];
                    m.matmul_i8act_split(k, &x, n_seq, &mut y, split);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&y), bits(&want), "{tag} {split:?}");
                }
                for s in 0..n_seq {
                    let mut y1 = vec![0f32; rows];
                    m.matmul_i8act_with(k, &x[s * cols..(s + 1) * cols], 1, &mut y1);
                    for o in 0..rows {
                        let v = want[s * rows + o];
                        assert_eq!(y1[o].to_bits(), v.to_bits(), "{tag} s={s} o={o}");
                    }
                }
            }
        }
    }
}

/// The SIMD `amax` / `quant_i8` give the portable activation buffers bit
/// for bit: ties (x.5 at scale 1), NaN, signed zeros, infinities, tiny and
/// subnormal scales, every layout, widths with tails.
#[test]
fn simd_activation_quantization_exact() {
    use super::act::{ActBuf, Layout};
    let mut rng = Rng::new(107);
    let mut cases: Vec<Vec<f32>> = Vec::new();
    for cols in [1usize, 2, 7, 15, 16, 17, 31, 33, 63, 64, 65, 129, 300, 1031] {
        // amax 127 -> scale 1: exact ties at k + 0.5.
        let mut v: Vec<f32> = (0..cols)
            .map(|i| (i % 255) as f32 - 127.0 + if i % 2 == 0 { 0.5 } else { 0.0 })
            .collect();
        v[0] = 127.0;
        cases.push(v.iter().map(|&a| a.clamp(-127.0, 127.0)).collect());
        cases.push(rng.vec(cols));
        let mut nan = rng.vec(cols);
        nan[cols / 2] = f32::NAN;
        if cols > 3 {
            nan[1] = -0.0;
        }
        cases.push(nan);
        let mut inf = rng.vec(cols);
        inf[cols - 1] = f32::NEG_INFINITY;
        cases.push(inf);
        cases.push(rng.vec(cols).iter().map(|v| v * 1e-38).collect());
        cases.push(rng.vec(cols).iter().map(|v| v * 1e-43).collect());
        cases.push(rng.vec(cols).iter().map(|v| v * 3e38).collect());
        cases.push(vec![0.0; cols]);
    }
    for x in &cases {
        let cols = x.len();
        for layout in [Layout::Natural, Layout::Split4, Layout::T3, Layout::Split2] {
            let mut want = ActBuf::default();
            want.fill(x, 1, cols, layout);
            for k in kernel_sets() {
                let mut a = ActBuf::default();
                // Reuse a dirty buffer: stale values must not leak.
                a.fill_with(k, &rng.vec(2 * cols), 2, cols, layout);
                a.fill_with(k, x, 1, cols, layout);
                let tag = format!("{} {layout:?} cols={cols} x[0]={}", k.name(), x[0]);
                assert_eq!(a.pos(0).0, want.pos(0).0, "{tag}");
                assert_eq!(a.pos(0).1, want.pos(0).1, "{tag}");
                assert_eq!(a.pos(0).2, want.pos(0).2, "{tag}");
                assert_eq!(a.pos(0).3.to_bits(), want.pos(0).3.to_bits(), "{tag}");
            }
        }
    }
}

#[test]
#[ignore]
fn bench_decode_hot() {
    use std::time::Instant;
    let mut rng = Rng::new(95);
    for (rows, cols) in [(1024, 2048), (256, 6144)] {
        let w = rng.weights(rows * cols);
        let x = rng.vec(cols);
        let mut y = vec![0f32; rows];
        for fmt in QUANT_FORMATS {
            let m = QMatrix::quantize(&w, rows, cols, fmt);
            for k in kernel_sets() {
                let mut dt = f64::MAX;
                for _ in 0..200 {
                    let t = Instant::now();
                    m.matmul_i8act_split(k, &x, 1, &mut y, Split::Single);
                    dt = dt.min(t.elapsed().as_secs_f64());
                }
                crate::elog!(
                    "{rows}x{cols} {:>9} {:>10}: {:7.1} us {:6.2} GB/s (one thread, hot)",
                    fmt.name(),
                    k.name(),
                    dt * 1e6,
                    m.resident_bytes() as f64 / dt / 1e9
                );
            }
        }
    }
}

#[test]
#[ignore]
fn bench_decode_stream_tiles() {
    use std::time::Instant;
    let mut rng = Rng::new(97);
    let (rows, cols) = (6144, 2048);
    for fmt in [QFormat::I4Row, QFormat::I4G64, QFormat::I3G64] {
        let one = fmt.data_len(rows, cols) + 4 * fmt.scales_len(rows, cols);
        let count = (1usize << 29).div_ceil(one);
        let ms: Vec<QMatrix> = (0..count)
            .map(|_| {
                let data = (0..fmt.data_len(rows, cols))
                    .map(|_| rng.next_u64() as u8)
                    .collect();
                let s = vec![0.01; fmt.scales_len(rows, cols)];
                QMatrix::from_parts(fmt, rows, cols, data, s).unwrap()
            })
            .collect();
        let x = rng.vec(cols);
        let mut y = vec![0f32; rows];
        let k = *kernel_sets()[0];
        let mut untiled = k;
        untiled.dot_u4_tile = None;
        untiled.row_i4g64_tile = None;
        untiled.row_i3g64_tile = None;
        for _ in 0..2 {
            for (name, k) in [("tiles", &k), ("no tiles", &untiled)] {
                let mut dt = f64::MAX;
                for _ in 0..3 {
                    let t = Instant::now();
                    for m in &ms {
                        m.matmul_i8act_with(k, &x, 1, &mut y);
                    }
                    dt = dt.min(t.elapsed().as_secs_f64());
                }
                let gbs = (count * one) as f64 / dt / 1e9;
                crate::elog!("{fmt} {rows}x{cols} decode stream {name}: {gbs:.2} GB/s");
            }
        }
    }
}

/// The GEMM tiles (int8 and int4 per row, several positions): odd row counts (row tiles of 1,
/// 2 and 3 at the ends of a task), positions not a multiple of 4 (position tiles of 1 to 3),
/// widths with weight tails inside a 64-byte block, every split and a 3-thread pool, single
/// matmuls and gate/up pairs: the portable bits everywhere.
#[test]
fn gemm_tiles_match_portable_at_odd_shapes() {
    let p = KernelSet::portable();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let mut rng = Rng::new(211);
    for case in 0..30 {
        let rows = [1, 2, 3, 5, 6, 7, 13, 34][case % 8];
        // Past one 1024-element chunk of the int4-g64 GEMM (512 packed bytes), whole and with
        // a short last chunk, block and group.
        let cols = [1, 63, 64, 65, 129, 200, 1000, 2048 + 65, 1024, 1536 + 32][(case / 3) % 10];
        // Past the int4-g64 kernel's 16-position block.
        let n_seq = [2, 3, 5, 6, 8, 17, 33][case % 7];
        let w = rng.weights(rows * cols);
        let w2 = rng.weights(rows * cols);
        let x = rng.vec(cols * n_seq);
        for fmt in [
            QFormat::I8Row,
            QFormat::I4Row,
            QFormat::I4G64,
            QFormat::I3G64,
        ] {
            let m = QMatrix::quantize(&w, rows, cols, fmt);
            let m2 = QMatrix::quantize(&w2, rows, cols, fmt);
            let mut want = vec![0f32; rows * n_seq];
            let mut want2 = vec![0f32; rows * n_seq];
            m.matmul_i8act_split(p, &x, n_seq, &mut want, Split::Single);
            m2.matmul_i8act_split(p, &x, n_seq, &mut want2, Split::Single);
            for k in kernel_sets() {
                let tag = format!("{} {fmt} {rows}x{cols}x{n_seq}", k.name());
                for split in [
                    Split::Single,
                    Split::Chunks(1),
                    Split::Chunks(5),
                    Split::Auto,
                ] {
                    let run = || {
                        let mut y = vec![f32::NAN; rows * n_seq];
                        m.matmul_i8act_split(k, &x, n_seq, &mut y, split);
                        y
                    };
                    assert_eq!(bits(&run()), bits(&want), "{tag} {split:?}");
                    assert_eq!(
                        bits(&pool.install(run)),
                        bits(&want),
                        "{tag} {split:?} pool"
                    );
                    let (mut g, mut u) = (vec![f32::NAN; rows * n_seq], vec![0f32; rows * n_seq]);
                    QMatrix::matmul_pair_split(k, &m, &m2, &x, n_seq, &mut g, &mut u, split);
                    assert_eq!(bits(&g), bits(&want), "{tag} {split:?} pair gate");
                    assert_eq!(bits(&u), bits(&want2), "{tag} {split:?} pair up");
                }
            }
        }
    }
}
