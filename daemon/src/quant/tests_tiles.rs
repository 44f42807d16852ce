//! The tile kernels (several rows and positions a call: decode tiles, the GEMM tiles of
//! prefill) and the SIMD activation quantization against the portable single kernels, bit
//! for bit, and the decode tiles' timing (helpers in `tests.rs`).

use super::matmul::{as_i8, Split};
use super::pack::{row_bytes, scales_per_row};
use super::tests::{kernel_sets, Rng, QUANT_FORMATS};
use super::*;

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
            QFormat::I2Row,
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
                        QFormat::I2Row => k.dot_i2_tile.map(|f| {
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
                                QFormat::I2Row => {
                                    assert_eq!(oi[o], (p.dot_i2)(wr, xa), "{tag}")
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
    for fmt in [
        QFormat::I4Row,
        QFormat::I2Row,
        QFormat::I4G64,
        QFormat::I3G64,
    ] {
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
        untiled.dot_i2_tile = None;
        untiled.row_i4g64_tile = None;
        untiled.row_i3g64_tile = None;
        let mut runs = vec![("tiles", &k), ("no tiles", &untiled)];
        // The VNNI tiles beside the GFNI/VBMI int3 rows, where this CPU has both.
        let plain = kernel_sets()
            .into_iter()
            .find(|s| s.name() == "avx512vnni-without-vbmi");
        runs.extend(plain.map(|p| ("tiles without vbmi", p)));
        for _ in 0..2 {
            for &(name, k) in &runs {
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
            QFormat::I2Row,
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
