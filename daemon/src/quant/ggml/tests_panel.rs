//! The rows x positions panels (prefill) against the dot products whose bits they promise:
//! the K-quants' (`kpanel.rs`), the IQ types' (`iqpanel.rs`) and the 32-element types'
//! (`panel_q0.rs`), at many shapes with
//! the extreme blocks and activations of `tests_simd.rs`; the AVX-512 Q8_K activation
//! quantizer against the scalar one; and the ignored panel-vs-tile timings.

use super::tests::Rng;
use super::tests_simd::{extreme_row, extreme_x, same};
use super::*;
use crate::quant::QMatrix;

/// The quantized activations of `n` positions of `cols` for `ty`'s panels: the extreme ones
/// of [`extreme_x`] first, then random.
pub(super) fn panel_acts(ty: GgmlType, cols: usize, n: usize, rng: &mut Rng) -> Q8Act {
    let (mut x, mut have) = extreme_x(cols, rng);
    while have < n {
        x.extend((0..cols).map(|_| rng.unit()));
        have += 1;
    }
    x.truncate(n * cols);
    let mut act = Q8Act::new();
    act.fill(act_kind(ty).unwrap(), &x, n, cols);
    act
}

/// Checks that `panel` gives `reference`'s bits for every output at each `(cols, rows,
/// positions)` of `shapes` and each scale mode of [`extreme_row`] (the weights then passed
/// through `tweak`, which may plant a type's own extremes), in both layouts
/// (`[rows][positions]`, `[positions][rows]`), and writes nothing past a row's positions or a
/// position's rows. `label` names the panel in a failure. Returns the cases checked, so a
/// caller can assert that the panel it meant to test ran.
pub(super) fn check_panel_bits(
    label: &str,
    ty: GgmlType,
    panel: PanelFn,
    reference: impl Fn(&[u8], &Q8Row) -> f32,
    shapes: &[(usize, usize, usize)],
    tweak: &mut dyn FnMut(&mut [u8], u32, &mut Rng),
    rng: &mut Rng,
) -> usize {
    let mut checked = 0;
    for &(cols, rows, n) in shapes {
        for mode in [0, 1, 2] {
            let mut w = extreme_row(ty, rows * cols / ty.block_elems(), mode, rng);
            tweak(&mut w, mode, rng);
            let rb = w.len() / rows;
            let act = panel_acts(ty, cols, n, rng);
            let xr: Vec<Q8Row> = (0..n).map(|s| act.row(s)).collect();
            let stride = n + 3;
            let mut out = vec![f32::NAN; rows * stride];
            panel(&w, cols, &xr, &mut out, stride, 1);
            let ps = rows + 2;
            let mut t = vec![f32::NAN; n * ps];
            panel(&w, cols, &xr, &mut t, 1, ps);
            for r in 0..rows {
                for s in 0..n {
                    let want = reference(&w[r * rb..(r + 1) * rb], &xr[s]);
                    let got = out[r * stride + s];
                    assert!(
                        same(got, want),
                        "{label} {} panel, {cols} wide, {rows} rows, {n} positions, mode {mode}, \
                         row {r} position {s}: {got} vs {want}",
                        ty.name()
                    );
                    assert_eq!(t[s * ps + r].to_bits(), got.to_bits(), "{label} layouts");
                }
                let past = &out[r * stride + n..(r + 1) * stride];
                assert!(past.iter().all(|v| v.is_nan()), "wrote past its positions");
            }
            for s in 0..n {
                let past = &t[s * ps + rows..(s + 1) * ps];
                assert!(past.iter().all(|v| v.is_nan()), "wrote past its rows");
            }
            checked += 1;
        }
    }
    checked
}

/// The K-quant and IQ panels (issue 49): every set's panel gives the set's dot bits for every
/// output, in either layout (`[rows][positions]`, `[positions][rows]`), at row counts that are
/// not whole microkernel calls, 1 to 40 positions (whole and partial groups of sixteen, last
/// groups of at most eight and of more), the models' widths, and extreme blocks and
/// activations.
#[test]
fn k_panels_give_the_dot_bits_at_every_shape() {
    let mut rng = Rng(0x0049_9A2E_0000_0006);
    let mut seen = 0usize;
    for k in crate::quant::KernelSet::available() {
        for ty in [
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::Q3_K,
            GgmlType::Q2_K,
            GgmlType::IQ4_XS,
            GgmlType::IQ2_XXS,
            GgmlType::IQ2_XS,
            GgmlType::IQ2_S,
            GgmlType::IQ3_XXS,
            GgmlType::IQ3_S,
        ] {
            let Some(panel) = panel_for(k, ty) else {
                continue;
            };
            let dot = dot_for(k, ty).unwrap();
            let shapes = [
                (256, 1, 1),
                (256, 9, 40),
                (2048, 17, 9),
                (2048, 40, 33),
                (2816, 3, 16),
                (7168, 8, 7),
                (768, 12, 24),
                (768, 33, 17),
            ];
            seen += check_panel_bits(
                k.name(),
                ty,
                panel,
                dot,
                &shapes,
                &mut |_, _, _| {},
                &mut rng,
            );
        }
    }
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl") {
        assert!(seen >= 10 * 8 * 3, "{seen} panel shapes");
    }
    let _ = seen;
}

/// Timing for the ignored AMX benches: one thread, a [768, 2048] matrix of each of `types`
/// (an expert's gate) against each of `positions` by the VNNI panel and the AMX panel
/// (`panels` gives both for a type), in one run; GMAC/s and the ratio.
pub(super) fn amx_against_vnni(
    types: &[GgmlType],
    positions: &[usize],
    panels: impl Fn(GgmlType) -> (Option<PanelFn>, Option<PanelFn>),
    rng: &mut Rng,
) {
    let (rows, cols) = (768, 2048);
    // Each in the two output layouts: `[row][position]` and `[position][row]` (the experts',
    // whose AMX outputs go through the tile sums' 16 x 16 transpose).
    println!("type     pos  vnni GMAC/s  amx GMAC/s  x vnni   [pos][row]: vnni    amx  x vnni");
    for &ty in types {
        let (Some(amx), Some(vnni)) = panels(ty) else {
            println!("no AMX or VNNI panel here");
            return;
        };
        let w = extreme_row(ty, rows * cols / 256, 2, rng);
        for &n in positions {
            let act = panel_acts(ty, cols, n, rng);
            let xr: Vec<Q8Row> = (0..n).map(|s| act.row(s)).collect();
            let mut out = vec![0f32; rows * n];
            let reps = (1 << 28) / (rows * n * cols) + 1;
            let mut time = |p: PanelFn, [rs, ps]: [usize; 2]| {
                let mut best = f64::INFINITY;
                for _ in 0..5 {
                    let t = std::time::Instant::now();
                    for _ in 0..reps {
                        p(&w, cols, &xr, &mut out, rs, ps);
                    }
                    best = best.min(t.elapsed().as_secs_f64());
                }
                std::hint::black_box(&out);
                (reps * rows * cols * n) as f64 / best / 1e9
            };
            let (v, a) = (time(vnni, [n, 1]), time(amx, [n, 1]));
            let (vt, at) = (time(vnni, [1, rows]), time(amx, [1, rows]));
            println!(
                "{:<8} {n:4} {v:12.1} {a:11.1} {:6.2}x {vt:18.1} {at:6.1} {:6.2}x",
                ty.name(),
                a / v,
                at / vt
            );
        }
    }
}

/// The shapes the AMX panels are checked at: row counts that are not whole sixteens, 1 to
/// 130 positions (one group, a last single group paired with itself, partial groups).
pub(super) const AMX_SHAPES: [(usize, usize, usize); 9] = [
    (256, 1, 1),
    (256, 17, 40),
    (2048, 16, 16),
    (2048, 16, 20),
    (768, 32, 64),
    (2048, 33, 17),
    (768, 40, 33),
    (2048, 18, 130),
    (768, 5, 48),
];

/// The whole product split across threads by positions (each task writes its own positions'
/// rows of `y`, no transpose): one matrix and a gate/up pair (the same or different panel
/// types), every split (one thread; tasks of 1, 3, 16, 17 and 64 positions; the driver's own)
/// at positions 1 to 40 and past the panel chunk, rows that are not whole microkernel calls:
/// every output is the dot's bits, and nothing past `y`'s own outputs is written.
#[test]
fn products_split_by_positions_give_the_dot_bits() {
    use crate::quant::matmul::Split;
    let mut rng = Rng(0x0049_5D17_0000_0001);
    let splits = [
        Split::Single,
        Split::Chunks(1),
        Split::Chunks(3),
        Split::Chunks(16),
        Split::Chunks(17),
        Split::Chunks(64),
        Split::Auto,
    ];
    let positions: Vec<usize> = (1..=40).chain([48, 64, 65, 97, 130, 300]).collect();
    let mut checked = 0usize;
    for k in crate::quant::KernelSet::available() {
        for (ta, tb, rows, cols) in [
            (GgmlType::Q4_K, GgmlType::Q4_K, 37, 512),
            (GgmlType::Q4_K, GgmlType::Q6_K, 8, 256),
            (GgmlType::Q6_K, GgmlType::Q5_K, 19, 512),
            (GgmlType::Q8_0, GgmlType::Q4_0, 21, 320),
            (GgmlType::IQ2_XXS, GgmlType::IQ3_S, 19, 512),
            (GgmlType::IQ2_XS, GgmlType::IQ2_S, 9, 256),
            (GgmlType::IQ3_XXS, GgmlType::IQ4_XS, 17, 256),
            (GgmlType::Q2_K, GgmlType::IQ2_XXS, 11, 512),
        ] {
            if panel_for(k, ta).is_none() {
                continue;
            }
            let kind = act_kind(ta).unwrap();
            let nb = cols / ta.block_elems();
            let (wa, wb) = (
                extreme_row(ta, rows * nb, 2, &mut rng),
                extreme_row(tb, rows * nb, 2, &mut rng),
            );
            let ma = QMatrix::from_ggml(ta, rows, cols, wa.clone()).unwrap();
            let mb = QMatrix::from_ggml(tb, rows, cols, wb.clone()).unwrap();
            let (da, db) = (dot_for(k, ta).unwrap(), dot_for(k, tb).unwrap());
            let (ra, rb) = (wa.len() / rows, wb.len() / rows);
            let mut act = Q8Act::new();
            for &n in &positions {
                let x: Vec<f32> = (0..n * cols).map(|_| rng.unit() * 4.0 - 2.0).collect();
                act.fill(kind, &x, n, cols);
                let check = |y: &[f32], w: &[u8], rw: usize, dot: DotFn, what: &str| {
                    for s in 0..n {
                        for r in 0..rows {
                            let want = dot(&w[r * rw..(r + 1) * rw], &act.row(s));
                            let got = y[s * rows + r];
                            assert!(
                                same(got, want),
                                "{} {what}: {rows}x{cols}, {n} positions, row {r} position \
                                 {s}: {got} vs {want}",
                                k.name()
                            );
                        }
                    }
                    assert!(y[n * rows..].iter().all(|v| v.is_nan()), "wrote past y");
                };
                for split in splits {
                    let mut y = vec![f32::NAN; n * rows + 5];
                    ma.matmul_i8act_split(k, &x, n, &mut y[..n * rows], split);
                    check(&y, &wa, ra, da, &format!("{} alone, {split:?}", ta.name()));
                    let (mut g, mut u) =
                        (vec![f32::NAN; n * rows + 5], vec![f32::NAN; n * rows + 5]);
                    QMatrix::matmul_pair_split(
                        k,
                        &ma,
                        &mb,
                        &x,
                        n,
                        &mut g[..n * rows],
                        &mut u[..n * rows],
                        split,
                    );
                    check(&g, &wa, ra, da, &format!("{} gate, {split:?}", ta.name()));
                    check(&u, &wb, rb, db, &format!("{} up, {split:?}", tb.name()));
                    checked += 1;
                }
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl") {
        assert!(checked >= 8 * 46 * 7, "{checked} products checked");
    }
    let _ = checked;
}

// Timing (not a correctness test): `cargo test --release -p colibri --lib
// quant::ggml::tests_simd::bench_k_panels -- --ignored --nocapture`. One thread, the caches'
// speed: a [rows, 2048] matrix against 3 to 256 positions, by the set's 4-position tile (and
// row dots for the rest; row dots only where the type has no tile) and by its panel, in one run; GMAC/s and the panel's ratio.
#[test]
#[ignore]
fn bench_k_panels() {
    let mut rng = Rng(0xBE_4C_9A_2E);
    let cols = 2048;
    println!("type   set         rows pos  tile GMAC/s  panel GMAC/s  x tile");
    for k in crate::quant::KernelSet::available() {
        for ty in [
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::IQ2_XXS,
            GgmlType::IQ2_S,
            GgmlType::IQ3_S,
            GgmlType::IQ4_XS,
            GgmlType::Q2_K,
        ] {
            let Some(panel) = panel_for(k, ty) else {
                continue;
            };
            // The IQ lattice types have no tile: row dots, what prefill ran before the panels.
            let tile = tile_for(k, ty);
            let dot = dot_for(k, ty).unwrap();
            for (rows, n) in [
                (64, 3),
                (64, 4),
                (64, 5),
                (64, 6),
                (16, 8),
                (64, 8),
                (64, 16),
                (64, 32),
                (256, 64),
                (768, 32),
                (768, 64),
                (768, 128),
                (768, 256),
            ] {
                let x: Vec<f32> = (0..n * cols).map(|_| rng.unit()).collect();
                let mut act = Q8Act::new();
                act.fill(act_kind(ty).unwrap(), &x, n, cols);
                let xr: Vec<Q8Row> = (0..n).map(|s| act.row(s)).collect();
                let w = extreme_row(ty, rows * cols / ty.block_elems(), 2, &mut rng);
                let mut out = vec![0f32; rows * n];
                let reps = (1 << 26) / (rows * n * cols) + 1;
                let mut scratch = vec![0f32; rows * n];
                let macs = rows * cols * n;
                let by_tile = gmacs(macs, reps, &mut scratch, &mut |o| {
                    tiles_then_dots(tile, dot, &w, &xr, o)
                });
                let by_panel = gmacs(macs, reps, &mut scratch, &mut |o| {
                    panel(&w, cols, &xr, o, n, 1)
                });
                panel(&w, cols, &xr, &mut out, n, 1);
                println!(
                    "{:<6} {:<11} {:4} {:3} {:12.2} {:13.2} {:6.2}x",
                    ty.name(),
                    k.name(),
                    rows,
                    n,
                    by_tile,
                    by_panel,
                    by_panel / by_tile
                );
            }
        }
    }
}

/// The AVX-512 Q8_K block quantizer gives the scalar one's quants, sums and scale bit for bit:
/// random blocks at every magnitude, ties at scale 1, the largest magnitude at both signs (the
/// first wins), zeros of both signs, subnormals, a NaN inside, infinities.
#[test]
fn q8_k_activation_blocks_match_the_scalar_quantizer() {
    #[cfg(target_arch = "x86_64")]
    {
        if !is_x86_feature_detected!("avx512f") || !is_x86_feature_detected!("avx512bw") {
            return;
        }
        let mut rng = Rng(0x0049_AC70_000B_0002);
        let mut blocks: Vec<Vec<f32>> = Vec::new();
        for e in [-40, -30, -3, 0, 3, 20, 37] {
            for _ in 0..50 {
                blocks.push((0..256).map(|_| rng.unit() * 10f32.powi(e)).collect());
            }
        }
        for amax in [127.0f32, -127.0, 63.5] {
            blocks.push(
                (0..256)
                    .map(|i| match i {
                        0 => amax,
                        _ if i % 2 == 0 => (i % 126) as f32 + 0.5,
                        _ => -((i % 126) as f32 + 0.5),
                    })
                    .collect(),
            );
        }
        for first in [2.0f32, -2.0] {
            let mut b: Vec<f32> = (0..256).map(|_| rng.unit()).collect();
            b[40] = first;
            b[200] = -first;
            blocks.push(b);
        }
        blocks.push(vec![0.0; 256]);
        blocks.push(
            (0..256)
                .map(|i| if i % 3 == 0 { -0.0 } else { 0.0 })
                .collect(),
        );
        blocks.push((0..256).map(|i| if i == 9 { 1e-40 } else { 0.0 }).collect());
        let mut nan: Vec<f32> = (0..256).map(|_| rng.unit()).collect();
        nan[77] = f32::NAN;
        blocks.push(nan);
        blocks.push(vec![f32::NAN; 256]);
        for inf in [f32::INFINITY, f32::NEG_INFINITY] {
            let mut b: Vec<f32> = (0..256).map(|_| rng.unit()).collect();
            b[130] = inf;
            b[131] = -inf;
            blocks.push(b);
        }
        for (n, b) in blocks.iter().enumerate() {
            let (mut qs, mut qv) = ([0i8; 256], [0i8; 256]);
            let (mut bs, mut bv) = ([0i16; 16], [0i16; 16]);
            let d = act::q8_k_block(b, &mut qs, &mut bs);
            // SAFETY: AVX-512 F and BW were detected above.
            let dv = unsafe { act::q8_k_block_avx512(b, &mut qv, &mut bv) };
            assert_eq!(qv, qs, "block {n}");
            assert_eq!(bv, bs, "block {n}");
            assert_eq!(dv.to_bits(), d.to_bits(), "block {n}");
        }
    }
}

/// The 32-element types, in their order of use.
const BLOCK32_TYPES: [GgmlType; 7] = [
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::MXFP4,
    GgmlType::IQ4_NL,
    GgmlType::Q5_0,
    GgmlType::Q4_1,
    GgmlType::Q5_1,
];

/// `n` positions of `cols` activations: [`extreme_x`]'s five kinds over and over, each with
/// fresh random values.
fn extreme_positions(cols: usize, n: usize, rng: &mut Rng) -> Vec<f32> {
    let mut x = Vec::new();
    while x.len() < n * cols {
        x.extend(extreme_x(cols, rng).0);
    }
    x.truncate(n * cols);
    x
}

/// The rows x positions panels (issue 49) give the set's dot bits for every output: rows
/// 1 to 40 (partial panels of 16), positions 1 to 40 (partial microkernel calls of 8), odd
/// and even block counts up to 4096 inputs (sets of eight blocks left partly empty), blocks
/// with extreme, raw and sane scales against extreme activations; and through the whole
/// product, whose driver takes the panel from `panel_min` positions, over chunk edges.
#[test]
fn panels_give_the_dot_bits_at_every_shape() {
    use crate::quant::matmul::Split;
    let mut rng = Rng(0x0049_9A4E_0032_0001);
    let mut panels = 0usize;
    for k in crate::quant::KernelSet::available() {
        #[cfg(target_arch = "x86_64")]
        if k.name() == "avx512vnni" {
            for ty in BLOCK32_TYPES {
                assert!(panel_for(k, ty).is_some(), "{}", ty.name());
            }
        }
        for ty in BLOCK32_TYPES {
            let Some(panel) = panel_for(k, ty) else {
                continue;
            };
            let dot = dot_for(k, ty).unwrap();
            let shapes = [
                (1, 1, 32),
                (3, 5, 64),
                (16, 8, 96),
                (17, 9, 224),
                (15, 7, 288),
                (31, 16, 544),
                (33, 17, 2048),
                (40, 40, 2880),
                (5, 3, 4096),
                (20, 12, 7 * 32),
            ];
            for (rows, npos, cols) in shapes {
                let x = extreme_positions(cols, npos, &mut rng);
                let mut act = Q8Act::new();
                act.fill(ActKind::Q8_0, &x, npos, cols);
                let xs: Vec<Q8Row> = (0..npos).map(|p| act.row(p)).collect();
                for mode in [0, 1, 2] {
                    let w = extreme_row(ty, rows * cols / 32, mode, &mut rng);
                    let rb = w.len() / rows;
                    // A stride past the positions: the panel must leave the gaps alone.
                    let stride = npos + 3;
                    let mut out = vec![7.0f32; rows * stride];
                    panel(&w, cols, &xs, &mut out, stride, 1);
                    for r in 0..rows {
                        for p in 0..stride {
                            let got = out[r * stride + p];
                            if p >= npos {
                                assert_eq!(got, 7.0, "{} gap written", ty.name());
                                continue;
                            }
                            let want = dot(&w[r * rb..(r + 1) * rb], &xs[p]);
                            assert!(
                                same(got, want),
                                "{} {} panel {rows}x{npos}x{cols}, mode {mode}, row {r} \
                                 position {p}: {got} vs {want}",
                                k.name(),
                                ty.name()
                            );
                        }
                    }
                    panels += 1;
                }
            }
            let (rows, cols) = (37, 320);
            let w = extreme_row(ty, rows * cols / 32, 2, &mut rng);
            let m = QMatrix::from_ggml(ty, rows, cols, w.clone()).unwrap();
            let rb = w.len() / rows;
            let mut act = Q8Act::new();
            for n_seq in [2, 3, 4, 5, 8, 13, 64, 70] {
                let x: Vec<f32> = (0..n_seq * cols).map(|_| rng.unit()).collect();
                let mut y = vec![0f32; n_seq * rows];
                m.matmul_i8act_split(k, &x, n_seq, &mut y, Split::Single);
                act.fill(ActKind::Q8_0, &x, n_seq, cols);
                for s in 0..n_seq {
                    for r in 0..rows {
                        let want = dot(&w[r * rb..(r + 1) * rb], &act.row(s));
                        assert!(
                            same(y[s * rows + r], want),
                            "{} {}: {n_seq} positions, row {r} position {s}",
                            k.name(),
                            ty.name()
                        );
                    }
                }
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512bw") {
        assert!(panels >= 7 * 30, "{panels} panels checked");
    }
    let _ = panels;
}

// Timing (not a correctness test): `cargo test --release -p colibri --lib
// quant::ggml::tests_simd::bench_panels -- --ignored --nocapture`. Each set's 32-element
// panels against its tiles (plus row dots for the last positions, as the driver does) in one
// run, 1 thread: 64 rows of 2048 inputs (the caches' speed) at 1 to 64 positions, best of 7;
// GMAC/s and the panel's ratio to the tiles (where the driver should switch: `panel_min`).
#[test]
#[ignore]
fn bench_panels() {
    let mut rng = Rng(0xBE_4C_9A_4E);
    let (rows, cols) = (64, 2048);
    println!("type   set         positions  tiles GMAC/s  panel GMAC/s  panel/tiles");
    for k in crate::quant::KernelSet::available() {
        for ty in BLOCK32_TYPES {
            let Some(panel) = panel_for(k, ty) else {
                continue;
            };
            let tile = tile_for(k, ty);
            let dot = dot_for(k, ty).unwrap();
            let w = extreme_row(ty, rows * cols / 32, 2, &mut rng);
            for npos in [1, 2, 3, 4, 8, 16, 32, 64] {
                let x: Vec<f32> = (0..npos * cols).map(|_| rng.unit()).collect();
                let mut act = Q8Act::new();
                act.fill(ActKind::Q8_0, &x, npos, cols);
                let xs: Vec<Q8Row> = (0..npos).map(|p| act.row(p)).collect();
                let mut out = vec![0f32; rows * npos];
                let macs = rows * cols * npos;
                let tiles = gmacs(macs, 1, &mut out, &mut |o| {
                    tiles_then_dots(tile, dot, &w, &xs, o)
                });
                let panel_g = gmacs(macs, 1, &mut out, &mut |o| panel(&w, cols, &xs, o, npos, 1));
                println!(
                    "{:<6} {:<11} {:>9} {:>13.2} {:>13.2} {:>11.2}x",
                    ty.name(),
                    k.name(),
                    npos,
                    tiles,
                    panel_g,
                    panel_g / tiles
                );
            }
        }
    }
}

/// What the driver did before the panels: `xs.len()` positions against every row of `w` (whole
/// rows, `out` as `[row][position]`), four positions a call of `tile` where there is one, the
/// rest by `dot`.
fn tiles_then_dots(tile: Option<DotTileFn>, dot: DotFn, w: &[u8], xs: &[Q8Row], out: &mut [f32]) {
    let n = xs.len();
    let rows = out.len() / n;
    let rb = w.len() / rows;
    for r in 0..rows {
        let wr = &w[r * rb..(r + 1) * rb];
        let mut s = 0;
        if let Some(tile) = tile {
            while s + 4 <= n {
                let four: &[Q8Row; 4] = xs[s..s + 4].try_into().unwrap();
                out[r * n + s..r * n + s + 4].copy_from_slice(&tile(wr, four));
                s += 4;
            }
        }
        for p in s..n {
            out[r * n + p] = dot(wr, &xs[p]);
        }
    }
}

/// GMAC/s of `f` doing `macs` multiply-adds a call into `out`: the best of 7 timings of `reps`
/// calls each.
fn gmacs(macs: usize, reps: usize, out: &mut [f32], f: &mut dyn FnMut(&mut [f32])) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..7 {
        let t = std::time::Instant::now();
        for _ in 0..reps {
            f(out);
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(&out);
    (reps * macs) as f64 / best / 1e9
}
