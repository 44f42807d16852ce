//! Every SIMD path of every type against the portable reference, forced one path at a time
//! (not just the best set this CPU picks): random blocks with extreme scales (zero, f16
//! subnormals, the f16 maximum, and raw bytes, so infinities and NaNs too), extreme
//! activations, and several row lengths (odd block counts included, which the four-block
//! AVX-512 kernels finish one block at a time). Equal means the same bits, or NaN on both
//! sides (the same float operations on the same values, so only a NaN's payload may differ).
//! Also the ignored per-path timing of a 4096-wide row.

use super::tests::Rng;
use super::*;
use crate::quant::QMatrix;

/// Where a block of `ty` keeps its f16 scales (MXFP4's e8m0 byte and IQ1_M's scattered
/// nibbles are set apart).
fn scale_offsets(ty: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match ty {
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        MXFP4 | IQ1_M => &[],
        _ => &[0],
    }
}

/// f16 scales at the edges: zero (both signs), the smallest subnormal, the largest normal,
/// and ordinary values.
const EXTREME: [f32; 9] = [
    0.0, -0.0, 5.96e-8, -5.96e-8, 65504.0, -65504.0, 1.0, -0.01, 6.1e-5,
];

/// A row of `blocks` blocks of `ty`: random quants and sign bits; scales by `mode`: 0 raw
/// random bytes (any f16, infinities and NaNs included), 1 from [`EXTREME`], 2 sane.
pub(super) fn extreme_row(ty: GgmlType, blocks: usize, mode: u32, rng: &mut Rng) -> Vec<u8> {
    let bb = ty.block_bytes();
    let mut w: Vec<u8> = (0..blocks * bb).map(|_| rng.byte()).collect();
    if mode == 0 {
        return w;
    }
    for b in w.chunks_exact_mut(bb) {
        let mut pick = || match mode {
            1 => EXTREME[rng.byte() as usize % EXTREME.len()],
            _ => 0.01 * (0.25 + rng.unit().abs()),
        };
        for &off in scale_offsets(ty) {
            b[off..off + 2].copy_from_slice(&half::f16::from_f32(pick()).to_le_bytes());
        }
        match ty {
            // e8m0: the extremes 0, 1 (subnormal halves) and 254, 255, or a sane 118..134.
            GgmlType::MXFP4 => {
                b[0] = if mode == 1 {
                    [0u8, 1, 254, 255, 127][rng.byte() as usize % 5]
                } else {
                    118 + rng.byte() % 16
                }
            }
            GgmlType::IQ1_M => {
                let h = half::f16::from_f32(pick()).to_bits();
                for k in 0..4 {
                    let at = 48 + 2 * k + 1;
                    b[at] = (b[at] & 0x0F) | ((((h >> (4 * k)) & 0xF) as u8) << 4);
                }
            }
            _ => {}
        }
    }
    w
}

/// Activations for `n` positions of `cols`: random, all at the quant extremes (+-127 with
/// mixed signs), huge (an f16 scale of infinity for Q8_0), tiny (a zero f16 scale), zero.
pub(super) fn extreme_x(cols: usize, rng: &mut Rng) -> (Vec<f32>, usize) {
    let mut x = Vec::new();
    x.extend((0..cols).map(|_| rng.unit()));
    x.extend((0..cols).map(|i| if i % 3 == 0 { -1.0 } else { 1.0 }));
    x.extend((0..cols).map(|_| rng.unit() * 1e30));
    x.extend((0..cols).map(|_| rng.unit() * 1e-30));
    x.extend((0..cols).map(|_| 0.0));
    (x, 5)
}

pub(super) fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Each SIMD path forced by name, with the kernel it has for a type (`None`: no kernel for
/// that type, or this CPU lacks the path's features).
type Path = (&'static str, fn(GgmlType) -> Option<DotFn>);

fn paths() -> Vec<Path> {
    #[cfg(target_arch = "x86_64")]
    {
        vec![
            ("avx2", |t| {
                x86_q0::dot(t)
                    .or_else(|| x86::dot(t))
                    .or_else(|| x86_rest::dot(t))
            }),
            ("avx512bw", |t| {
                avx512_q0::dot(t, false).or_else(|| avx512::dot(t, false))
            }),
            ("avx512vnni", |t| {
                avx512_q0::dot(t, true).or_else(|| avx512::dot(t, true))
            }),
        ]
    }
    #[cfg(target_arch = "aarch64")]
    {
        vec![("neon", neon::dot)]
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        Vec::new()
    }
}

/// Row lengths for `ty`: one block, odd and even block counts (for the 32-element kernels'
/// eight-block steps: none, one and two steps with every remainder of pairs and a lone
/// block), a 4096-wide row.
fn lengths(ty: GgmlType) -> Vec<usize> {
    let be = ty.block_elems();
    [1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 14, 15, 16, 17, 23]
        .into_iter()
        .map(|n| n * be)
        .chain([4096])
        .collect()
}

#[test]
fn every_simd_path_gives_the_portable_bits_on_extreme_blocks() {
    let mut rng = Rng(0x0049_5157_D07A_0002);
    let mut checked = 0usize;
    for (name, path) in paths() {
        for ty in COMPUTED {
            let Some(simd) = path(ty) else { continue };
            let portable = dot_fn(ty).unwrap();
            for cols in lengths(ty) {
                let (x, n) = extreme_x(cols, &mut rng);
                let mut act = Q8Act::new();
                act.fill(act_kind(ty).unwrap(), &x, n, cols);
                for mode in [0, 1, 1, 2] {
                    let w = extreme_row(ty, cols / ty.block_elems(), mode, &mut rng);
                    for s in 0..n {
                        let (a, b) = (simd(&w, &act.row(s)), portable(&w, &act.row(s)));
                        assert!(
                            same(a, b),
                            "{name} {}: {cols} wide, scales mode {mode}, position {s}: \
                             {a} ({:#x}) vs portable {b} ({:#x})",
                            ty.name(),
                            a.to_bits(),
                            b.to_bits()
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    // Every path this CPU has was exercised (on x86 with AVX2 and on aarch64, at least one).
    let any = paths()
        .iter()
        .any(|(_, p)| COMPUTED.iter().any(|&t| p(t).is_some()));
    assert_eq!(checked > 0, any);
}

/// Which types each path covers: AVX2 every type, the AVX-512 sets the hot ones, where the
/// CPU has them (this machine has AVX-512 BW and VNNI, so CI here runs all three).
#[test]
fn simd_paths_cover_the_types_they_promise() {
    use GgmlType::*;
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") {
            for ty in COMPUTED {
                assert!(
                    x86_q0::dot(ty)
                        .or_else(|| x86::dot(ty))
                        .or_else(|| x86_rest::dot(ty))
                        .is_some(),
                    "no AVX2 kernel for {}",
                    ty.name()
                );
            }
        }
        let hot = [Q8_0, Q4_0, IQ4_NL, MXFP4, Q6_K];
        for (vnni, set) in [
            (false, crate::quant::KernelSet::avx512bw()),
            (true, crate::quant::KernelSet::avx512vnni()),
        ] {
            let Some(set) = set else { continue };
            for ty in hot {
                assert!(
                    avx512_q0::dot(ty, vnni)
                        .or_else(|| avx512::dot(ty, vnni))
                        .is_some(),
                    "{} {}",
                    set.name(),
                    ty.name()
                );
                // The set hands out a kernel that is not the portable reference.
                assert_ne!(
                    dot_for(set, ty).unwrap() as usize,
                    dot_fn(ty).unwrap() as usize,
                    "{} {}",
                    set.name(),
                    ty.name()
                );
            }
        }
        // The portable set stays the reference.
        for ty in COMPUTED {
            assert_eq!(
                dot_for(crate::quant::KernelSet::portable(), ty).unwrap() as usize,
                dot_fn(ty).unwrap() as usize
            );
        }
    }
    #[cfg(target_arch = "aarch64")]
    for ty in [Q8_0, Q4_0, Q4_K, Q6_K] {
        assert!(neon::dot(ty).is_some(), "{}", ty.name());
    }
}

/// The 1-row x 4-position tiles give the row dot's bits: directly (four positions of extreme
/// and random activations against extreme blocks), and through the whole product at the
/// shapes the models have (256 to 7168 inputs) with 1 to 9 positions, so the last tile of a
/// row is partial and its positions go through the dot.
#[test]
fn tiles_give_the_dot_bits_at_every_shape() {
    use crate::quant::matmul::Split;
    let mut rng = Rng(0x0049_7115_0000_0004);
    let mut tiled = 0usize;
    for k in crate::quant::KernelSet::available() {
        for ty in COMPUTED {
            let Some(tile) = tile_for(k, ty) else {
                continue;
            };
            let dot = dot_for(k, ty).unwrap();
            let kind = act_kind(ty).unwrap();
            for cols in [256, 2048, 2816, 7168] {
                let (x, n) = extreme_x(cols, &mut rng);
                let mut act = Q8Act::new();
                act.fill(kind, &x, n, cols);
                for mode in [0, 1, 2] {
                    let w = extreme_row(ty, cols / ty.block_elems(), mode, &mut rng);
                    for s0 in 0..=n - 4 {
                        let rows = [
                            act.row(s0),
                            act.row(s0 + 1),
                            act.row(s0 + 2),
                            act.row(s0 + 3),
                        ];
                        let got = tile(&w, &rows);
                        for (p, g) in got.iter().enumerate() {
                            let want = dot(&w, &rows[p]);
                            assert!(
                                same(*g, want),
                                "{} {} tile, {cols} wide, mode {mode}, position {}: {g} vs {want}",
                                k.name(),
                                ty.name(),
                                s0 + p
                            );
                        }
                    }
                }
                let rows = 3;
                let w = extreme_row(ty, rows * cols / ty.block_elems(), 2, &mut rng);
                let m = QMatrix::from_ggml(ty, rows, cols, w.clone()).unwrap();
                let rb = w.len() / rows;
                for n_seq in 1..=9 {
                    let x: Vec<f32> = (0..n_seq * cols).map(|_| rng.unit()).collect();
                    let mut y = vec![0f32; n_seq * rows];
                    m.matmul_i8act_split(k, &x, n_seq, &mut y, Split::Single);
                    act.fill(kind, &x, n_seq, cols);
                    for s in 0..n_seq {
                        for r in 0..rows {
                            let want = dot(&w[r * rb..(r + 1) * rb], &act.row(s));
                            assert!(
                                same(y[s * rows + r], want),
                                "{} {}: {cols} wide, {n_seq} positions, row {r} position {s}",
                                k.name(),
                                ty.name()
                            );
                        }
                    }
                }
                tiled += 1;
            }
        }
    }
    // On x86 with AVX2 the K-quants have tiles, so the test saw some.
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c") {
        assert!(tiled >= 4 * 5, "{tiled} tiled shapes");
    }
    let _ = tiled;
}

// Timing (not a correctness test): `cargo test --release -p colibri --lib
// quant::ggml::tests_simd::bench_row_dot -- --ignored --nocapture`. One 4096-wide row dot per
// call, over 256 distinct rows (a few MB: the caches' speed, so the kernels' compute, not
// the memory's), best of 7 passes; GB/s of weight bytes per path and the ratio to portable.
#[test]
#[ignore]
fn bench_row_dot() {
    use std::time::Instant;
    let mut rng = Rng(0xBE_4C_00_49);
    let (rows, cols) = (256, 4096);
    let x: Vec<f32> = (0..cols).map(|_| rng.unit()).collect();
    println!("type        path        GB/s   x portable");
    for ty in COMPUTED {
        let mut act = Q8Act::new();
        act.fill(act_kind(ty).unwrap(), &x, 1, cols);
        let a = act.row(0);
        let rb = cols / ty.block_elems() * ty.block_bytes();
        let w = extreme_row(ty, rows * cols / ty.block_elems(), 2, &mut rng);
        let mut all: Vec<(&str, DotFn)> = vec![("portable", dot_fn(ty).unwrap())];
        for (name, path) in paths() {
            if let Some(f) = path(ty) {
                all.push((name, f));
            }
        }
        let mut base = 0.0;
        for (name, f) in all {
            let mut best = f64::INFINITY;
            let mut sink = 0.0f32;
            for _ in 0..7 {
                let t = Instant::now();
                for r in 0..rows {
                    sink += f(&w[r * rb..(r + 1) * rb], &a);
                }
                best = best.min(t.elapsed().as_secs_f64());
            }
            std::hint::black_box(sink);
            let gbs = (rows * rb) as f64 / best / 1e9;
            if name == "portable" {
                base = gbs;
            }
            println!(
                "{:<10} {:<10} {:7.2} {:6.2}x",
                ty.name(),
                name,
                gbs,
                gbs / base
            );
        }
    }
}

/// Prefill past one chunk of positions (`rows_ggml` makes the positions' rows 64 at a time):
/// every output of a product over 63 to 133 positions, 5 rows, equals the row dot's, for
/// every set's tiled and untiled types, so chunk edges and partial tiles at them are covered.
#[test]
fn products_over_several_chunks_give_the_dot_bits() {
    use crate::quant::matmul::Split;
    let mut rng = Rng(0x0049_C4C4_0000_0005);
    let (rows, cols) = (5, 512);
    for k in crate::quant::KernelSet::available() {
        for ty in [
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::Q3_K,
            GgmlType::IQ4_XS,
            GgmlType::Q8_0,
        ] {
            let dot = dot_for(k, ty).unwrap();
            let kind = act_kind(ty).unwrap();
            let w = extreme_row(ty, rows * cols / ty.block_elems(), 2, &mut rng);
            let m = QMatrix::from_ggml(ty, rows, cols, w.clone()).unwrap();
            let rb = w.len() / rows;
            let mut act = Q8Act::new();
            for n_seq in [63, 64, 65, 67, 128, 133] {
                let x: Vec<f32> = (0..n_seq * cols).map(|_| rng.unit()).collect();
                let mut y = vec![0f32; n_seq * rows];
                m.matmul_i8act_split(k, &x, n_seq, &mut y, Split::Single);
                act.fill(kind, &x, n_seq, cols);
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
}

// Timing (not a correctness test): `cargo test --release -p colibri --lib
// quant::ggml::tests_simd::bench_tiles -- --ignored --nocapture`. The prefill kernels of one
// set side by side in one run: 4 positions by four row dots, by the AVX2 tile and by the
// set's own tile, over 128 rows of 2048 inputs (the caches' speed), best of 7; GMAC/s (one
// multiply-add a weight a position) and the ratio to the AVX2 tile.
#[test]
#[ignore]
fn bench_tiles() {
    use std::time::Instant;
    let mut rng = Rng(0xBE_4C_71_1E);
    let (rows, cols) = (128, 2048);
    let x: Vec<f32> = (0..4 * cols).map(|_| rng.unit()).collect();
    println!("type   set         kernel      GMAC/s  x avx2 tile");
    for k in crate::quant::KernelSet::available() {
        for ty in [
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::Q3_K,
            GgmlType::Q2_K,
            GgmlType::IQ4_XS,
        ] {
            let Some(tile) = tile_for(k, ty) else {
                continue;
            };
            let mut act = Q8Act::new();
            act.fill(act_kind(ty).unwrap(), &x, 4, cols);
            let a = [act.row(0), act.row(1), act.row(2), act.row(3)];
            let rb = cols / ty.block_elems() * ty.block_bytes();
            let w = extreme_row(ty, rows * cols / ty.block_elems(), 2, &mut rng);
            let dot = dot_for(k, ty).unwrap();
            let by_dots = move |w: &[u8], a: &[Q8Row; 4]| -> [f32; 4] {
                std::array::from_fn(|p| dot(w, &a[p]))
            };
            #[cfg(target_arch = "x86_64")]
            let avx2 = x86::tile(ty);
            #[cfg(not(target_arch = "x86_64"))]
            let avx2: Option<DotTileFn> = None;
            let time = |f: &dyn Fn(&[u8], &[Q8Row; 4]) -> [f32; 4]| {
                let mut best = f64::INFINITY;
                let mut sink = 0.0f32;
                for _ in 0..7 {
                    let t = Instant::now();
                    for r in 0..rows {
                        sink += f(&w[r * rb..(r + 1) * rb], &a)[3];
                    }
                    best = best.min(t.elapsed().as_secs_f64());
                }
                std::hint::black_box(sink);
                (rows * cols * 4) as f64 / best / 1e9
            };
            let base = avx2.map(|t| time(&t)).unwrap_or(f64::NAN);
            for (name, g) in [
                ("4 dots", time(&by_dots)),
                ("avx2 tile", base),
                ("set tile", time(&tile)),
            ] {
                println!(
                    "{:<6} {:<11} {:<10} {:7.2} {:6.2}x",
                    ty.name(),
                    k.name(),
                    name,
                    g,
                    g / base
                );
            }
        }
    }
}

/// The 32-element types' tiles (issue 49): every SIMD kernel set has one for each of the
/// seven types on x86 with AVX2, and it gives the set's dot bits: directly on every window of
/// four extreme and random activation rows against extreme blocks, at one and two blocks,
/// the models' widths (2048, 2880: not a whole number of eight-block steps, 7168), and
/// through the whole product with 1 to 9 positions (partial last tiles go through the dot).
#[test]
fn block32_tiles_give_the_dot_bits() {
    use crate::quant::matmul::Split;
    const BLOCK32: [GgmlType; 7] = [
        GgmlType::Q8_0,
        GgmlType::MXFP4,
        GgmlType::Q4_0,
        GgmlType::IQ4_NL,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
    ];
    let mut rng = Rng(0x0049_B10C_0032_0001);
    for k in crate::quant::KernelSet::available() {
        #[cfg(target_arch = "x86_64")]
        if k.name() != "portable" && is_x86_feature_detected!("avx2") {
            for ty in BLOCK32 {
                assert!(tile_for(k, ty).is_some(), "{} {}", k.name(), ty.name());
            }
        }
        for ty in BLOCK32 {
            let Some(tile) = tile_for(k, ty) else {
                continue;
            };
            let dot = dot_for(k, ty).unwrap();
            for cols in [32, 64, 2048, 2880, 7168] {
                let (x, n) = extreme_x(cols, &mut rng);
                let mut act = Q8Act::new();
                act.fill(ActKind::Q8_0, &x, n, cols);
                for mode in [0, 1, 2] {
                    let w = extreme_row(ty, cols / 32, mode, &mut rng);
                    for s0 in 0..=n - 4 {
                        let rows: [Q8Row; 4] = std::array::from_fn(|p| act.row(s0 + p));
                        let got = tile(&w, &rows);
                        for (p, g) in got.iter().enumerate() {
                            let want = dot(&w, &rows[p]);
                            assert!(
                                same(*g, want),
                                "{} {} tile, {cols} wide, mode {mode}, position {}: {g} vs {want}",
                                k.name(),
                                ty.name(),
                                s0 + p
                            );
                        }
                    }
                }
                let rows = 2;
                let w = extreme_row(ty, rows * cols / 32, 2, &mut rng);
                let m = QMatrix::from_ggml(ty, rows, cols, w.clone()).unwrap();
                let rb = w.len() / rows;
                for n_seq in 1..=9 {
                    let x: Vec<f32> = (0..n_seq * cols).map(|_| rng.unit()).collect();
                    let mut y = vec![0f32; n_seq * rows];
                    m.matmul_i8act_split(k, &x, n_seq, &mut y, Split::Single);
                    act.fill(ActKind::Q8_0, &x, n_seq, cols);
                    for s in 0..n_seq {
                        for r in 0..rows {
                            let want = dot(&w[r * rb..(r + 1) * rb], &act.row(s));
                            assert!(
                                same(y[s * rows + r], want),
                                "{} {}: {cols} wide, {n_seq} positions, row {r} position {s}",
                                k.name(),
                                ty.name()
                            );
                        }
                    }
                }
            }
        }
    }
}

/// The AVX2 Q8_0 activation quantizer gives the scalar block's quants, scale and sum on
/// random blocks at many magnitudes and on exact halves (ties, both signs, which it must
/// round away from zero), values a hair under a half, zeros, and blocks it must leave to
/// the scalar steps (a NaN, a subnormal maximum whose inverse overflows).
#[cfg(target_arch = "x86_64")]
#[test]
fn q8_0_activation_blocks_match_the_scalar_quantizer() {
    if !is_x86_feature_detected!("avx2") {
        return;
    }
    let mut rng = Rng(0x0049_AC70_0008_0001);
    let mut blocks: Vec<[f32; 32]> = Vec::new();
    for e in [-30, -20, -3, 0, 3, 20, 37] {
        for _ in 0..200 {
            blocks.push(std::array::from_fn(|_| rng.unit() * 10f32.powi(e)));
        }
    }
    // amax 127: the scale is 1 and every k + 0.5 is a tie; amax 63.5: every quant is 2x.
    for amax in [127.0f32, -127.0, 63.5] {
        for k in 0..4 {
            blocks.push(std::array::from_fn(|i| {
                let v = (i as f32 + 31.0 * k as f32) % 126.0 + 0.5;
                let v = if (i + k) % 2 == 0 { v } else { -v };
                if i == 0 {
                    amax
                } else if i % 7 == 0 {
                    0.49999997 * v.signum()
                } else {
                    v * amax.abs() / 127.0
                }
            }));
        }
    }
    blocks.push([0.0; 32]);
    blocks.push(std::array::from_fn(|i| if i == 3 { -0.0 } else { 0.0 }));
    let mut nan = [1.0f32; 32];
    nan[17] = f32::NAN;
    blocks.push(nan);
    blocks.push(std::array::from_fn(|i| if i == 5 { 1e-40 } else { 0.0 }));
    let mut vector = 0;
    for (n, b) in blocks.iter().enumerate() {
        let (mut qs, mut qv) = ([0i8; 32], [0i8; 32]);
        let (scale, sum) = act::q8_0_block(b, &mut qs);
        if let Some((sv, mv)) = x86_q0::q8_0_block(b, &mut qv) {
            assert_eq!(qv, qs, "block {n}: {b:?}");
            assert_eq!((sv.to_bits(), mv), (scale.to_bits(), sum), "block {n}");
            vector += 1;
        }
    }
    // Every block but the NaN and the overflowing ones went through the vector steps.
    assert_eq!(vector, blocks.len() - 2);
    // The ties rounded away from zero: scale 1, 2.5 -> 3, -2.5 -> -3.
    let mut x = [0.0f32; 32];
    (x[0], x[1], x[2]) = (127.0, 2.5, -2.5);
    let mut q = [0i8; 32];
    x86_q0::q8_0_block(&x, &mut q).unwrap();
    assert_eq!((q[0], q[1], q[2]), (127, 3, -3));
}
