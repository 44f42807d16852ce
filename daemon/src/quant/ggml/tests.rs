//! The reference dot products against the dequantized row times the dequantized activations
//! in f64, for every type computed as stored, on random rows with sane scales.

use super::*;
use crate::gguf::dequantize_row;
use crate::quant::QMatrix;

/// xorshift64*: deterministic, dependency-free test data (the SIMD tests' too).
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub(super) fn byte(&mut self) -> u8 {
        (self.next() >> 56) as u8
    }
    /// Uniform in [-1, 1).
    pub(super) fn unit(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

fn put_f16(b: &mut [u8], off: usize, v: f32) {
    b[off..off + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
}

/// A random row of `blocks` blocks of `ty`: random quants and sign bits, finite scales of
/// either sign around 0.01 (random bytes would make f16 infinities and NaNs).
pub(super) fn random_row(ty: GgmlType, blocks: usize, rng: &mut Rng) -> Vec<u8> {
    let bb = ty.block_bytes();
    let mut w: Vec<u8> = (0..blocks * bb).map(|_| rng.byte()).collect();
    for b in w.chunks_exact_mut(bb) {
        let mut scale = |b: &mut [u8], off: usize| {
            let v = 0.01 * (0.25 + rng.unit().abs()) * if rng.byte() & 1 == 0 { 1.0 } else { -1.0 };
            put_f16(b, off, v)
        };
        use GgmlType::*;
        match ty {
            Q4_1 | Q5_1 | Q4_K | Q5_K => {
                scale(b, 0);
                scale(b, 2);
            }
            Q2_K => {
                scale(b, 80);
                scale(b, 82);
            }
            Q3_K => scale(b, 108),
            Q6_K => scale(b, 208),
            MXFP4 => b[0] = 118 + rng.byte() % 16,
            IQ1_M => {
                // The f16 scale lives in the top nibbles of the four scale words.
                let h = half::f16::from_f32(0.01 * (0.25 + rng.unit().abs())).to_bits();
                for k in 0..4 {
                    let at = 48 + 2 * k + 1;
                    b[at] = (b[at] & 0x0F) | ((((h >> (4 * k)) & 0xF) as u8) << 4);
                }
            }
            _ => scale(b, 0),
        }
    }
    w
}

/// `sum w[i] * a[i]` in f64 with `a` the dequantized activations, plus the bound the f32
/// result must meet: the float products and sums round (relative 1e-5 of the magnitude sum;
/// the integer parts are exact). For Q4_1/Q5_1 the minimum term is llama.cpp's: the block's
/// activation sum is the f16 `s` Q8_1 carries, not `d * sum(q)`.
fn reference(ty: GgmlType, w: &[u8], a: &Q8Row) -> (f64, f64) {
    let n = a.qs.len();
    let mut wf = vec![0.0f32; n];
    dequantize_row(ty, w, &mut wf).unwrap();
    let kind = act_kind(ty).unwrap();
    let blk = kind.block();
    let (mut sum, mut mag) = (0.0f64, 0.0f64);
    for (i, (&wv, &q)) in wf.iter().zip(a.qs).enumerate() {
        let x = a.d[i / blk] as f64 * q as f64;
        sum += wv as f64 * x;
        mag += (wv as f64 * x).abs();
    }
    if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
        for (ib, b) in w.chunks_exact(ty.block_bytes()).enumerate() {
            let m = half::f16::from_le_bytes([b[2], b[3]]).to_f32() as f64;
            let qsum: i32 = a.qs[ib * 32..ib * 32 + 32].iter().map(|&q| q as i32).sum();
            sum += m * (a.s[ib] as f64 - a.d[ib] as f64 * qsum as f64);
            mag += (m * a.s[ib] as f64).abs();
        }
    }
    (sum, 1e-5 * mag + 1e-30)
}

#[test]
fn every_type_matches_dequantized_product() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for ty in COMPUTED {
        let kind = act_kind(ty).unwrap();
        let dot = dot_fn(ty).unwrap();
        // Four 256-blocks of inputs: whole blocks of every type.
        let cols = 1024;
        let x: Vec<f32> = (0..2 * cols).map(|_| rng.unit()).collect();
        let mut act = Q8Act::new();
        act.fill(kind, &x, 2, cols);
        for s in 0..2 {
            let a = act.row(s);
            for _ in 0..8 {
                let w = random_row(ty, cols / ty.block_elems(), &mut rng);
                let got = dot(&w, &a) as f64;
                let (want, bound) = reference(ty, &w, &a);
                assert!(
                    (got - want).abs() <= bound,
                    "{}: dot {got} vs f64 {want} (bound {bound})",
                    ty.name()
                );
                assert!(bound > 1e-20, "{}: an all-zero test row", ty.name());
            }
        }
    }
}

#[test]
fn types_outside_the_list_have_no_product() {
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::TQ1_0,
        GgmlType::Q8_K,
    ] {
        assert!(
            act_kind(ty).is_none() && dot_fn(ty).is_none(),
            "{}",
            ty.name()
        );
    }
    for ty in COMPUTED {
        assert_eq!(
            ty.block_elems() % act_kind(ty).unwrap().block(),
            0,
            "{}",
            ty.name()
        );
    }
}

#[test]
fn q8_0_rounds_half_away_and_scales_by_amax() {
    // amax 127 -> scale 1: quants are round(x), halves away from zero.
    let mut x = [0.0f32; 32];
    x[0] = 127.0;
    x[1] = 2.5;
    x[2] = -2.5;
    x[3] = 0.49;
    let (mut qs, mut d, mut s) = ([0i8; 32], [0.0f32; 1], [0.0f32; 1]);
    quantize_q8_0(&x, &mut qs, &mut d, &mut s);
    assert_eq!((d[0], qs[0], qs[1], qs[2], qs[3]), (1.0, 127, 3, -3, 0));
    assert_eq!(s[0], 127.0);
    // An all-zero block: scale 0, quants 0.
    quantize_q8_0(&[0.0; 32], &mut qs, &mut d, &mut s);
    assert_eq!((d[0], qs, s[0]), (0.0, [0i8; 32], 0.0));
}

#[test]
fn q8_k_rounds_ties_even_from_the_signed_max() {
    let mut x = [0.0f32; 256];
    x[0] = -127.0; // the max by magnitude, negative: iscale = 1.
    x[1] = 2.5;
    x[2] = 3.5;
    x[17] = 1.0;
    let (mut qs, mut d, mut bs) = ([0i8; 256], [0.0f32; 1], [0i16; 16]);
    quantize_q8_k(&x, &mut qs, &mut d, &mut bs);
    assert_eq!((d[0], qs[0], qs[1], qs[2], qs[17]), (1.0, -127, 2, 4, 1));
    assert_eq!((bs[0], bs[1]), (-121, 1));
    // Positive max: the quants are negated, the scale negative, the product the same.
    for v in x.iter_mut() {
        *v = -*v;
    }
    quantize_q8_k(&x, &mut qs, &mut d, &mut bs);
    assert_eq!((d[0], qs[0], qs[1], qs[2]), (-1.0, -127, 2, 4));
}

#[test]
fn filling_again_reuses_the_buffers() {
    let mut act = Q8Act::new();
    let x: Vec<f32> = (0..4 * 512).map(|i| (i as f32 * 0.37).sin()).collect();
    act.fill(ActKind::Q8K, &x, 4, 512);
    let before = (act.row(0).qs.as_ptr(), act.row(0).d.as_ptr());
    act.fill(ActKind::Q8K, &x[..512], 1, 512);
    assert_eq!(before, (act.row(0).qs.as_ptr(), act.row(0).d.as_ptr()));
    // Same values for the same input whatever was filled before.
    let mut one = Q8Act::new();
    one.fill(ActKind::Q8K, &x[..512], 1, 512);
    assert_eq!(one.row(0).qs, act.row(0).qs);
    assert_eq!(one.row(0).bsums, act.row(0).bsums);
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

/// tests/fixtures/gguf/dot/reference.json: llama.cpp's own quantizers, activation blocks and
/// portable dot products (scripts/ggml_dot/make_reference.py).
fn llama_reference() -> serde_json::Value {
    let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/gguf/dot/reference.json");
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

fn f16_bits(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_le_bytes()
}

/// Our activation blocks of `x`, packed as llama.cpp's structs (`block_q8_0`, `block_q8_1`,
/// `block_q8_K`), to compare byte for byte.
fn packed_act(kind: &str, x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut act = Q8Act::new();
    match kind {
        "q8_0" | "q8_1" => {
            act.fill(ActKind::Q8_0, x, 1, x.len());
            let a = act.row(0);
            for (b, q) in a.qs.chunks_exact(32).enumerate() {
                out.extend(f16_bits(a.d[b]));
                if kind == "q8_1" {
                    out.extend(f16_bits(a.s[b]));
                }
                out.extend(q.iter().map(|&v| v as u8));
            }
        }
        _ => {
            act.fill(ActKind::Q8K, x, 1, x.len());
            let a = act.row(0);
            for (b, q) in a.qs.chunks_exact(256).enumerate() {
                out.extend(a.d[b].to_le_bytes());
                out.extend(q.iter().map(|&v| v as u8));
                for s in &a.bsums[b * 16..(b + 1) * 16] {
                    out.extend(s.to_le_bytes());
                }
            }
        }
    }
    out
}

#[test]
fn activation_blocks_are_llama_cpps_byte_for_byte() {
    let r = llama_reference();
    for (p, xs) in r["x"].as_array().unwrap().iter().enumerate() {
        let x: Vec<f32> = xs
            .as_array()
            .unwrap()
            .iter()
            .map(|v| f32::from_bits(v.as_u64().unwrap() as u32))
            .collect();
        for kind in ["q8_0", "q8_1", "q8_K"] {
            let want = unhex(r["act"][kind][p].as_str().unwrap());
            assert_eq!(packed_act(kind, &x), want, "{kind} position {p}");
        }
    }
}

/// The types whose reference adds its exact integers in another float order than llama.cpp's
/// generic code, the one SIMD computes without shuffling: Q3_K's eight float lanes take
/// element `n` in lane `(n % 32) / 4` (llama.cpp's: `n % 8`), Q4_K, Q5_K and Q6_K take one
/// float product of a block's exact total (llama.cpp's: eight lanes), IQ4_XS scales its groups in
/// i32 and takes one float product a block (llama.cpp's: one a group), and the 32-element
/// types sum their blocks in SIMD lanes (`dot_q0.rs`; llama.cpp's: one block after another).
/// Their last bits may differ.
fn lanes_differ(ty: GgmlType) -> bool {
    use GgmlType::*;
    ty.block_elems() == 32 || matches!(ty, Q3_K | Q4_K | Q5_K | Q6_K | IQ4_XS)
}

/// Bit for bit, except the types of [`lanes_differ`], which are held to the float rounding.
#[test]
fn every_type_equals_llama_cpps_portable_dot_bit_for_bit() {
    let r = llama_reference();
    let cols = r["cols"].as_u64().unwrap() as usize;
    let xs: Vec<f32> = r["x"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap().clone())
        .map(|v| f32::from_bits(v.as_u64().unwrap() as u32))
        .collect();
    let n_seq = xs.len() / cols;
    let mut seen = 0;
    for ty in COMPUTED {
        let t = &r["types"][ty.name()];
        let rows = unhex(t["rows"].as_str().unwrap());
        let mut act = Q8Act::new();
        act.fill(act_kind(ty).unwrap(), &xs, n_seq, cols);
        let dot = dot_fn(ty).unwrap();
        let rb = cols / ty.block_elems() * ty.block_bytes();
        for (ri, want) in t["dots"].as_array().unwrap().iter().enumerate() {
            for (s, bits) in want.as_array().unwrap().iter().enumerate() {
                let row = &rows[ri * rb..(ri + 1) * rb];
                let got = dot(row, &act.row(s));
                let want = f32::from_bits(bits.as_u64().unwrap() as u32);
                if lanes_differ(ty) {
                    // Other float lanes than llama.cpp's (`dot_q0` sums the 32-element blocks
                    // in SIMD lanes where llama.cpp's portable code sums one after another;
                    // the K-quants assign elements to lanes as SIMD does): the same exact
                    // integers, so its value within the f32 rounding.
                    let bound = reference(ty, row, &act.row(s)).1;
                    assert!(
                        (got as f64 - want as f64).abs() <= bound,
                        "{} row {ri} position {s}: {got} vs llama.cpp's {want} (bound {bound})",
                        ty.name()
                    );
                    continue;
                }
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{} row {ri} position {s}: {got} vs llama.cpp's {want}",
                    ty.name()
                );
            }
        }
        seen += 1;
    }
    assert_eq!(seen, 20);
}

#[test]
fn every_kernel_set_gives_the_portable_bits() {
    let mut rng = Rng(0x5151_2024_0049_0002);
    let cols = 1024;
    for k in crate::quant::KernelSet::available() {
        for ty in COMPUTED {
            let kind = act_kind(ty).unwrap();
            let (simd, portable) = (dot_for(k, ty).unwrap(), dot_fn(ty).unwrap());
            // Extreme activations too: a position of +-127 quants everywhere.
            let mut x: Vec<f32> = (0..3 * cols).map(|_| rng.unit()).collect();
            for (i, v) in x[2 * cols..].iter_mut().enumerate() {
                *v = if i % 3 == 0 { -1.0 } else { 1.0 };
            }
            let mut act = Q8Act::new();
            act.fill(kind, &x, 3, cols);
            for _ in 0..6 {
                let w = random_row(ty, cols / ty.block_elems(), &mut rng);
                for s in 0..3 {
                    let (a, b) = (simd(&w, &act.row(s)), portable(&w, &act.row(s)));
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{} {}: {a} vs {b}",
                        k.name(),
                        ty.name()
                    );
                }
            }
        }
    }
}

// Timing (not a correctness test): `cargo test --release -p colibri --lib
// quant::ggml::tests::bench -- --ignored --nocapture`. A decode-shaped product (one position)
// of a 2048 x 6144 matrix of each type, per kernel set, on one thread and on all; GB/s of the
// matrix's bytes, beside the memory-read probe's figure.
#[test]
#[ignore]
fn bench_decode_ggml() {
    use crate::quant::matmul::Split;
    use std::time::Instant;
    let mut rng = Rng(0xBE_4C_00_49);
    let (rows, cols) = (2048, 6144);
    let x: Vec<f32> = (0..cols).map(|_| rng.unit()).collect();
    let mut y = vec![0f32; rows];
    crate::elog!(
        "memory probe: {:.1} GB/s",
        crate::membw::read_bandwidth_gbs(512, 3)
    );
    for ty in COMPUTED {
        let w = random_row(ty, rows * cols / ty.block_elems(), &mut rng);
        let m = QMatrix::from_ggml(ty, rows, cols, w).unwrap();
        for k in crate::quant::KernelSet::available() {
            for split in [Split::Single, Split::Auto] {
                let iters = 10;
                m.matmul_i8act_split(k, &x, 1, &mut y, split);
                let t = Instant::now();
                for _ in 0..iters {
                    m.matmul_i8act_split(k, &x, 1, &mut y, split);
                }
                let dt = t.elapsed().as_secs_f64() / iters as f64;
                crate::elog!(
                    "{:>8} {:>10} {:?}: {:8.3} ms {:7.2} GB/s",
                    ty.name(),
                    k.name(),
                    split,
                    dt * 1e3,
                    m.resident_bytes() as f64 / dt / 1e9
                );
            }
        }
    }
}

#[test]
fn a_ggml_matrix_computes_as_its_rows_do() {
    // The whole product path (activations quantized once, rows split over threads, several
    // positions) against the row dot product, for one type of each activation kind.
    let mut rng = Rng(7);
    let (rows, cols, n_seq) = (37, 512, 3);
    for ty in [GgmlType::Q4_K, GgmlType::Q8_0] {
        let w = random_row(ty, rows * cols / ty.block_elems(), &mut rng);
        let m = QMatrix::from_ggml(ty, rows, cols, w.clone()).unwrap();
        let x: Vec<f32> = (0..n_seq * cols).map(|_| rng.unit()).collect();
        let mut y = vec![0f32; n_seq * rows];
        m.matmul_i8act(&x, n_seq, &mut y);
        let mut act = Q8Act::new();
        act.fill(act_kind(ty).unwrap(), &x, n_seq, cols);
        let rb = cols / ty.block_elems() * ty.block_bytes();
        for s in 0..n_seq {
            for r in 0..rows {
                let want = dot_fn(ty).unwrap()(&w[r * rb..(r + 1) * rb], &act.row(s));
                assert_eq!(
                    y[s * rows + r].to_bits(),
                    want.to_bits(),
                    "{} {r} {s}",
                    ty.name()
                );
            }
        }
        // f32 activations: the dequantized row times x.
        m.matmul(&x, n_seq, &mut y);
        let deq = m.dequantize();
        let want: f32 = deq[..cols].iter().zip(&x[..cols]).map(|(a, b)| a * b).sum();
        assert!(
            (y[0] - want).abs() <= 1e-4 * want.abs().max(1.0),
            "{} {} {want}",
            ty.name(),
            y[0]
        );
        // Refused: a row that is not whole blocks, a length that does not match.
        assert!(QMatrix::from_ggml(ty, 1, 100, vec![0; 100]).is_err());
        assert!(QMatrix::from_ggml(ty, 2, cols, vec![0; rb]).is_err());
    }
    assert!(QMatrix::from_ggml(GgmlType::TQ2_0, 1, 256, vec![0; 66]).is_err());
}

/// `quantize_q8_k` rounds in the FPU (`rint_clamped`) instead of calling `round_ties_even`:
/// the same quants, scales and sums as the libm rounding on random blocks of every
/// magnitude, on blocks of exact ties (`iscale` = +-1 with halves of every parity), and on
/// blocks with infinities, NaN, subnormals and values one ulp either side of a half.
#[test]
fn q8_k_fpu_rounding_matches_round_ties_even() {
    fn by_libm(x: &[f32], qs: &mut [i8], d: &mut [f32], bsums: &mut [i16]) {
        for (((xb, qb), db), bb) in x
            .chunks_exact(256)
            .zip(qs.chunks_exact_mut(256))
            .zip(d.iter_mut())
            .zip(bsums.chunks_exact_mut(16))
        {
            let (mut amax, mut max) = (0.0f32, 0.0f32);
            for &v in xb {
                if v.abs() > amax {
                    amax = v.abs();
                    max = v;
                }
            }
            if amax == 0.0 {
                qb.fill(0);
                bb.fill(0);
                *db = 0.0;
                continue;
            }
            let iscale = -127.0f32 / max;
            for (q, &v) in qb.iter_mut().zip(xb) {
                *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
            }
            for (b, q16) in bb.iter_mut().zip(qb.chunks_exact(16)) {
                *b = q16.iter().map(|&q| q as i16).sum();
            }
            *db = 1.0 / iscale;
        }
    }
    let mut rng = Rng(0x0049_0A57_7135_0001);
    let blocks = 64;
    let mut x = vec![0f32; blocks * 256];
    let mut ties = 0usize;
    for round in 0..200 {
        for (b, xb) in x.chunks_exact_mut(256).enumerate() {
            let mode = (round + b) % 5;
            let scale = 10f32.powi((rng.next() % 40) as i32 - 20);
            for (n, v) in xb.iter_mut().enumerate() {
                *v = match mode {
                    // Exact halves: the max is -+127, so iscale is +-1.
                    0 | 1 => {
                        let k = (rng.next() % 254) as f32 - 127.0;
                        (k + 0.5).clamp(-126.5, 126.5)
                    }
                    // One ulp either side of a half.
                    2 => {
                        let h = (rng.next() % 250) as f32 - 125.0 + 0.5;
                        let bits = h.to_bits();
                        f32::from_bits(if n % 2 == 0 { bits + 1 } else { bits - 1 })
                    }
                    3 => rng.unit() * scale,
                    _ => match rng.next() % 8 {
                        0 => f32::from_bits((rng.next() % 0x007F_FFFF) as u32),
                        1 => f32::INFINITY,
                        2 => f32::NAN,
                        _ => rng.unit() * scale,
                    },
                };
            }
            if mode < 2 {
                xb[(rng.next() % 256) as usize] = if mode == 0 { -127.0 } else { 127.0 };
                ties += 1;
            }
        }
        let (mut qs, mut d, mut bs) = (
            vec![0i8; x.len()],
            vec![0f32; blocks],
            vec![0i16; 16 * blocks],
        );
        let (mut qs2, mut d2, mut bs2) = (qs.clone(), d.clone(), bs.clone());
        quantize_q8_k(&x, &mut qs, &mut d, &mut bs);
        by_libm(&x, &mut qs2, &mut d2, &mut bs2);
        assert_eq!(qs, qs2, "round {round}");
        assert_eq!(bs, bs2, "round {round}");
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&d), bits(&d2), "round {round}");
    }
    assert!(ties > 1000);
}

/// A fill of many rows, quantized across the threads, holds each row's own quantization (the
/// one-row quantizers called on it alone), for both activation kinds, from one row to a
/// prefill's 512 and below and above the parallel bound.
#[test]
fn a_fill_across_threads_is_each_rows_own() {
    let mut rng = Rng(52);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    for (kind, cols) in [
        (ActKind::Q8K, 2048),
        (ActKind::Q8K, 256),
        (ActKind::Q8_0, 96),
    ] {
        for n_seq in [1, 17, 64, 512] {
            let x: Vec<f32> = (0..n_seq * cols).map(|_| rng.unit() * 3.0).collect();
            let mut act = Q8Act::new();
            pool.install(|| act.fill(kind, &x, n_seq, cols));
            let nb = cols / kind.block();
            for s in 0..n_seq {
                let (mut qs, mut d) = (vec![0i8; cols], vec![0f32; nb]);
                let xr = &x[s * cols..(s + 1) * cols];
                let row = act.row(s);
                let tag = format!("{kind:?} x{cols} n{n_seq} row {s}");
                match kind {
                    ActKind::Q8_0 => {
                        let mut sums = vec![0f32; nb];
                        quantize_q8_0(xr, &mut qs, &mut d, &mut sums);
                        let b = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(b(row.s), b(&sums), "{tag}");
                    }
                    ActKind::Q8K => {
                        let mut sums = vec![0i16; cols / 16];
                        quantize_q8_k(xr, &mut qs, &mut d, &mut sums);
                        assert_eq!(row.bsums, &sums[..], "{tag}");
                    }
                }
                assert_eq!(row.qs, &qs[..], "{tag}");
                let b = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(b(row.d), b(&d), "{tag}");
            }
        }
    }
}

/// Attention's q, k and v over rows quantized once ([`QMatrix::matmul_triple_i8act`]) are the
/// bits of three separate products, for the GGUF files' mixes (Q4_K with a Q6_K v, IQ2_XXS with
/// a Q4_K v), a mix of activation kinds (the fallback), one row to 512 (the panels split by
/// rows at 17 and 64, by positions at 512), rows that are not whole panel groups.
#[test]
fn a_ggml_triple_equals_separate_products() {
    use GgmlType::*;
    let mut rng = Rng(53);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    let cols = 512;
    let rows = [40, 16, 24];
    for tys in [
        [Q4_K, Q4_K, Q6_K],
        [IQ2_XXS, IQ2_XXS, Q4_K],
        [Q8_0, Q4_K, Q4_K],
    ] {
        let m: Vec<QMatrix> = (0..3)
            .map(|j| {
                let w = random_row(tys[j], rows[j] * cols / tys[j].block_elems(), &mut rng);
                QMatrix::from_ggml(tys[j], rows[j], cols, w).unwrap()
            })
            .collect();
        for n_seq in [1, 17, 64, 512] {
            let x: Vec<f32> = (0..n_seq * cols).map(|_| rng.unit()).collect();
            let mut want: Vec<Vec<f32>> = m.iter().map(|m| vec![0f32; m.rows() * n_seq]).collect();
            let mut got: Vec<Vec<f32>> = m.iter().map(|m| vec![1f32; m.rows() * n_seq]).collect();
            pool.install(|| {
                for (m, y) in m.iter().zip(want.iter_mut()) {
                    m.matmul_i8act(&x, n_seq, y);
                }
                let [a, b, c] = &mut got[..] else {
                    unreachable!("three outputs")
                };
                QMatrix::matmul_triple_i8act([&m[0], &m[1], &m[2]], &x, n_seq, [a, b, c]);
            });
            for j in 0..3 {
                let b = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                let tag = format!("{} {j} n{n_seq}", tys[j].name());
                assert_eq!(b(&got[j]), b(&want[j]), "{tag}");
            }
        }
    }
}
