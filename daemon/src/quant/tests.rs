//! Tests for the quantized-weight module.

use super::pack::{i2_at, i3_at, i4_at, n_groups};
use super::*;

/// The crate's generator with the test data's helpers; seeds are spread so that small
/// neighbouring seeds give unrelated streams.
pub(super) struct Rng(crate::rng::Rng);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(crate::rng::Rng::new(
            seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
        ))
    }
    pub(super) fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in [-1, 1).
    pub(super) fn f(&mut self) -> f32 {
        self.0.unit_f32() * 2.0 - 1.0
    }
    pub(super) fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    pub(super) fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f()).collect()
    }
    /// Random weights with occasional outliers and exact zeros.
    pub(super) fn weights(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| match self.below(16) {
                0 => 0.0,
                1 => self.f() * 8.0,
                _ => self.f() * 0.1,
            })
            .collect()
    }
}

pub(super) const QUANT_FORMATS: [QFormat; 5] = [
    QFormat::I8Row,
    QFormat::I4Row,
    QFormat::I2Row,
    QFormat::I4G64,
    QFormat::I3G64,
];
const ODD_WIDTHS: [usize; 9] = [1, 2, 3, 63, 64, 65, 127, 130, 200];

/// Reference (range, qmin, qmax, group) of a format, straight from the spec.
fn spec(fmt: QFormat, cols: usize) -> (f32, f32, f32, usize) {
    match fmt {
        QFormat::I8Row => (127.0, -128.0, 127.0, cols),
        QFormat::I4Row => (7.0, -8.0, 7.0, cols),
        QFormat::I2Row => (1.0, -2.0, 1.0, cols),
        QFormat::I4G64 => (7.0, -8.0, 7.0, 64),
        QFormat::I3G64 => (3.0, -4.0, 3.0, 64),
        QFormat::F32 | QFormat::Mxfp4 | QFormat::Ggml(_) => unreachable!(),
    }
}

/// Independent re-implementation of the quantization math: the expected
/// dequantized matrix and the scale of every element.
fn reference_dequant(w: &[f32], rows: usize, cols: usize, fmt: QFormat) -> (Vec<f32>, Vec<f32>) {
    let (qr, lo, hi, group) = spec(fmt, cols);
    let mut deq = vec![0f32; rows * cols];
    let mut sc = vec![0f32; rows * cols];
    for r in 0..rows {
        for g0 in (0..cols).step_by(group.max(1)) {
            let g1 = (g0 + group).min(cols);
            let amax = w[r * cols + g0..r * cols + g1]
                .iter()
                .fold(0f32, |m, v| m.max(v.abs()));
            let s = (amax / qr).max(1e-8);
            for i in g0..g1 {
                let q = (w[r * cols + i] / s).round_ties_even().clamp(lo, hi);
                deq[r * cols + i] = q * s;
                sc[r * cols + i] = s;
            }
        }
    }
    (deq, sc)
}

/// f64 reference product `W x` plus the sum of |w x| (the error scale).
pub(super) fn ref_matmul(
    w: &[f32],
    rows: usize,
    cols: usize,
    x: &[f32],
    n_seq: usize,
) -> Vec<(f64, f64)> {
    let mut out = vec![(0.0, 0.0); rows * n_seq];
    for s in 0..n_seq {
        for o in 0..rows {
            let (mut acc, mut mag) = (0f64, 0f64);
            for i in 0..cols {
                let p = w[o * cols + i] as f64 * x[s * cols + i] as f64;
                acc += p;
                mag += p.abs();
            }
            out[s * rows + o] = (acc, mag);
        }
    }
    out
}

/// Every kernel set this CPU can run, and the VNNI set without the GFNI/VBMI int3 rows
/// where the CPU would give it them (so `int3.rs`'s VNNI kernels are compared too).
pub(super) fn kernel_sets() -> Vec<&'static KernelSet> {
    let mut sets = KernelSet::available();
    #[cfg(target_arch = "x86_64")]
    {
        static PLAIN: std::sync::OnceLock<Option<KernelSet>> = std::sync::OnceLock::new();
        sets.extend(
            PLAIN
                .get_or_init(super::x86::avx512vnni_without_vbmi)
                .as_ref(),
        );
    }
    sets
}

/// Activations whose int8 quantization is exactly `xq` (`xq[0]` forced to
/// 127 so that `sx = 1`), laid out for `fmt`.
pub(super) fn act_exact(xq: &mut [i8], fmt: QFormat) -> super::act::ActBuf {
    xq[0] = 127;
    let x: Vec<f32> = xq.iter().map(|&v| v as f32).collect();
    let mut a = super::act::ActBuf::default();
    a.fill(&x, 1, xq.len(), super::act::Layout::of(fmt));
    assert_eq!(a.sx[0], 1.0);
    a
}

/// The shared float order of the grouped kernels, from exact group sums.
pub(super) fn combine_ref(sums: &[i32], s: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    for (g, (&v, &sc)) in sums.iter().zip(s).enumerate() {
        acc[g % 16] += v as f32 * sc;
    }
    super::scalar::combine16(&acc)
}

// ---------------------------------------------------------------------------
// Formats and errors
// ---------------------------------------------------------------------------

#[test]
fn from_bits_names_and_errors() {
    assert_eq!(QFormat::from_bits(16, 0).unwrap(), QFormat::F32);
    assert_eq!(QFormat::from_bits(16, 64).unwrap(), QFormat::F32);
    assert_eq!(QFormat::from_bits(8, 64).unwrap(), QFormat::I8Row);
    assert_eq!(QFormat::from_bits(4, 0).unwrap(), QFormat::I4Row);
    assert_eq!(QFormat::from_bits(4, 64).unwrap(), QFormat::I4G64);
    assert_eq!(QFormat::from_bits(3, 64).unwrap(), QFormat::I3G64);
    assert_eq!(QFormat::from_bits(2, 0).unwrap(), QFormat::I2Row);
    for (b, g) in [(3, 0), (5, 64), (32, 0), (4, 128), (8, 32), (1, 0)] {
        let e = QFormat::from_bits(b, g).unwrap_err();
        assert_eq!(
            e,
            QuantError::BadBits {
                bits: b,
                group_size: g
            }
        );
        let msg = e.to_string();
        assert!(msg.contains(&format!("bits={b}")) && msg.contains(&format!("group_size={g}")));
        assert!(
            msg.contains("16") && msg.contains("64") && msg.contains(" 2 "),
            "{msg}"
        );
    }
    let names: Vec<_> = QFormat::ALL.iter().map(|f| f.name()).collect();
    assert_eq!(
        names,
        ["f32", "int8", "int4", "int2", "int4-g64", "int3-g64"]
    );
    let bits: Vec<_> = QFormat::ALL.iter().map(|f| f.bits()).collect();
    assert_eq!(bits, [32, 8, 4, 2, 4, 3]);
    assert!(KernelSet::available()
        .iter()
        .any(|k| k.name() == kernel_name()));
}

#[test]
fn layout_sizes() {
    // The table of the spec, for O = 3, I = 130 (ng = 3).
    let (o, i) = (3, 130);
    let expect = [
        (QFormat::F32, o * i * 4, 0),
        (QFormat::I8Row, o * i, o),
        (QFormat::I4Row, o * 65, o),
        (QFormat::I2Row, o * 33, o),
        (QFormat::I4G64, o * 65, o * 3),
        (QFormat::I3G64, o * 3 * 24, o * 3),
    ];
    for (f, d, s) in expect {
        let w = Rng::new(1).vec(o * i);
        let m = QMatrix::quantize(&w, o, i, f);
        assert_eq!((m.data().len(), m.scales().len()), (d, s), "{f}");
        assert_eq!(m.resident_bytes(), d + 4 * s);
        assert_eq!((m.rows(), m.cols(), m.format()), (o, i, f));
    }
}

// ---------------------------------------------------------------------------
// Hand-checked byte layouts
// ---------------------------------------------------------------------------

#[test]
fn int8_bytes() {
    // amax = 127 -> s = 1 exactly.
    let w = [127.0, -127.0, 2.5, 3.5, -2.5, 0.4, -0.6, 1e-9];
    let m = QMatrix::quantize(&w, 1, 8, QFormat::I8Row);
    assert_eq!(m.scales(), &[1.0]);
    assert_eq!(m.data(), &[127, 129, 2, 4, 254, 0, 255, 0]);
    assert_eq!(
        m.dequantize(),
        vec![127.0, -127.0, 2.0, 4.0, -2.0, 0.0, -1.0, 0.0]
    );
}

#[test]
fn int4_row_bytes_odd_width() {
    // amax = 7 -> s = 1; I = 7 so the last high nibble is padding (8).
    let w = [1.0, 2.0, -3.0, 7.0, 0.5, -7.0, 1.5];
    let m = QMatrix::quantize(&w, 1, 7, QFormat::I4Row);
    assert_eq!(m.scales(), &[1.0]);
    assert_eq!(m.data(), &[0xA9, 0xF5, 0x18, 0x8A]);
    assert_eq!(m.dequantize(), vec![1.0, 2.0, -3.0, 7.0, 0.0, -7.0, 2.0]);
}

#[test]
fn int4_g64_groups_and_short_tail() {
    // I = 130: groups of 64, 64 and 2 with scales 1, 2 and 0.5.
    let mut w = vec![0f32; 130];
    w[0] = 7.0;
    w[1] = -3.0;
    w[64] = -14.0;
    w[65] = 4.0;
    w[128] = 3.5;
    w[129] = -0.7;
    let m = QMatrix::quantize(&w, 1, 130, QFormat::I4G64);
    assert_eq!(m.scales(), &[1.0, 2.0, 0.5]);
    let d = m.data();
    assert_eq!(d.len(), 65);
    assert_eq!(d[0], 15 | (5 << 4));
    assert_eq!(d[1], 0x88);
    assert_eq!(d[32], 1 | (10 << 4));
    assert_eq!(d[64], 15 | (7 << 4));
    let deq = m.dequantize();
    assert_eq!(
        (deq[0], deq[1], deq[64], deq[65], deq[128], deq[129]),
        (7.0, -3.0, -14.0, 4.0, 3.5, -0.5)
    );
}

#[test]
fn int2_fields() {
    // amax = 1 -> s = 1; I = 6, padding fields hold 2 (value 0).
    let w = [1.0, -1.0, 0.4, -0.6, 0.5, -0.5];
    let m = QMatrix::quantize(&w, 1, 6, QFormat::I2Row);
    assert_eq!(m.scales(), &[1.0]);
    assert_eq!(m.data(), &[0x67, 0xAA]);
    assert_eq!(m.dequantize(), vec![1.0, -1.0, 0.0, -1.0, 0.0, 0.0]);
    // A -2 field decodes (the converter never writes it for symmetric data,
    // but the format allows it).
    let m = QMatrix::from_parts(QFormat::I2Row, 1, 4, vec![0b00_01_10_11], vec![0.5]).unwrap();
    assert_eq!(m.dequantize(), vec![0.5, 0.0, -0.5, -1.0]);
}

#[test]
fn int3_planes_short_group() {
    // amax = 3 -> s = 1; I = 5 so values 5..64 are padding (u = 4).
    let w = [3.0, -3.0, 1.0, -2.0, 0.5];
    let m = QMatrix::quantize(&w, 1, 5, QFormat::I3G64);
    assert_eq!(m.scales(), &[1.0]);
    let mut expect = [0u8; 24];
    expect[0] = 151; // low bits of u = [7, 1, 5, 2]
    expect[16] = 0b1111_0101; // bit 2 of u = [1, 0, 1, 0, 1, 1, 1, 1]
    for b in &mut expect[17..] {
        *b = 0xFF;
    }
    assert_eq!(m.data(), &expect);
    assert_eq!(m.dequantize(), vec![3.0, -3.0, 1.0, -2.0, 0.0]);
    // Two groups (I = 65): 48 bytes, 2 scales per row.
    let w = Rng::new(3).vec(2 * 65);
    let m = QMatrix::quantize(&w, 2, 65, QFormat::I3G64);
    assert_eq!((m.data().len(), m.scales().len()), (96, 4));
}

// ---------------------------------------------------------------------------
// Round trips
// ---------------------------------------------------------------------------

#[test]
fn round_trip_all_formats_odd_widths() {
    let mut rng = Rng::new(7);
    for fmt in QUANT_FORMATS {
        for cols in ODD_WIDTHS {
            let rows = 3;
            let w = rng.weights(rows * cols);
            let m = QMatrix::quantize(&w, rows, cols, fmt);
            let (expect, sc) = reference_dequant(&w, rows, cols, fmt);
            let deq = m.dequantize();
            assert_eq!(deq, expect, "{fmt} cols={cols}");
            for (i, (&a, &b)) in deq.iter().zip(&w).enumerate() {
                assert!((a - b).abs() <= sc[i] * 0.5001, "{fmt} cols={cols} i={i}");
            }
            let mut row = vec![0f32; cols];
            for r in 0..rows {
                m.dequant_row(r, &mut row);
                assert_eq!(row, &deq[r * cols..(r + 1) * cols]);
            }
            // Repacking the container reproduces the matrix.
            let m2 = QMatrix::from_parts(fmt, rows, cols, m.data().to_vec(), m.scales().to_vec())
                .unwrap();
            assert_eq!(m2.dequantize(), deq);
        }
    }
}

#[test]
fn decode_arbitrary_bytes_matches_per_element() {
    // Any byte pattern (not only what `quantize` writes) decodes as the
    // per-element definition of the layout, and the integer kernels agree
    // with it.
    let mut rng = Rng::new(13);
    let p = KernelSet::portable();
    for cols in ODD_WIDTHS {
        let rows = 2;
        for fmt in QUANT_FORMATS {
            let data: Vec<u8> = (0..fmt.data_len(rows, cols))
                .map(|_| rng.next_u64() as u8)
                .collect();
            let scales: Vec<f32> = (0..fmt.scales_len(rows, cols))
                .map(|_| rng.f().abs() + 0.01)
                .collect();
            let m = QMatrix::from_parts(fmt, rows, cols, data, scales).unwrap();
            let rb = m.data().len() / rows;
            let spr = m.scales().len() / rows;
            let deq = m.dequantize();
            let mut xq: Vec<i8> = (0..cols)
                .map(|_| (rng.below(255) as i32 - 127) as i8)
                .collect();
            let act = act_exact(&mut xq, fmt);
            let (xa, xg, xs, _) = act.pos(0);
            for r in 0..rows {
                let row = &m.data()[r * rb..(r + 1) * rb];
                let sc = &m.scales()[r * spr..(r + 1) * spr];
                let q: Vec<i32> = (0..cols)
                    .map(|k| match fmt {
                        QFormat::I8Row => row[k] as i8 as i32,
                        QFormat::I4Row | QFormat::I4G64 => i4_at(row, k),
                        QFormat::I2Row => i2_at(row, k),
                        QFormat::I3G64 => i3_at(&row[(k / 64) * 24..], k % 64),
                        QFormat::F32 | QFormat::Mxfp4 | QFormat::Ggml(_) => unreachable!(),
                    })
                    .collect();
                for k in 0..cols {
                    let s = if spr == 1 { sc[0] } else { sc[k / 64] };
                    assert_eq!(
                        deq[r * cols + k],
                        q[k] as f32 * s,
                        "{fmt} cols={cols} k={k}"
                    );
                }
                // Integer sums against the definition (per row or group).
                let want = |g0: usize, g1: usize| -> i32 {
                    (g0..g1.min(cols)).map(|k| q[k] * xq[k] as i32).sum()
                };
                let group_sums: Vec<i32> = (0..n_groups(cols))
                    .map(|g| want(g * 64, g * 64 + 64))
                    .collect();
                match fmt {
                    QFormat::I8Row => {
                        let wi: Vec<i8> = row.iter().map(|&b| b as i8).collect();
                        assert_eq!((p.dot_i8)(&wi, xa), want(0, cols));
                    }
                    QFormat::I4Row => {
                        assert_eq!((p.dot_u4)(row, xa) - 8 * xs, want(0, cols));
                    }
                    QFormat::I2Row => {
                        assert_eq!((p.dot_i2)(row, xa) - 2 * xs, want(0, cols));
                    }
                    QFormat::I4G64 => assert_eq!(
                        (p.row_i4g64)(row, xa, xg, sc).to_bits(),
                        combine_ref(&group_sums, sc).to_bits(),
                        "{fmt} cols={cols}"
                    ),
                    QFormat::I3G64 => assert_eq!(
                        (p.row_i3g64)(row, xa, xg, sc).to_bits(),
                        combine_ref(&group_sums, sc).to_bits(),
                        "{fmt} cols={cols}"
                    ),
                    QFormat::F32 | QFormat::Mxfp4 | QFormat::Ggml(_) => unreachable!(),
                }
            }
        }
    }
}

#[test]
fn activation_quantization() {
    use super::act::{ActBuf, Layout};
    // amax = 127 -> sx = 1; rint is round half to even.
    let x = [127.0, -63.5, 2.5, -0.5, 0.0, 1.5, -127.0];
    let mut a = ActBuf::default();
    a.fill(&x, 1, 7, Layout::Natural);
    let (q, xg, xs, sx) = a.pos(0);
    assert_eq!((q.len(), sx), (128, 1.0));
    assert_eq!(&q[..7], &[127, -64, 2, 0, 0, 2, -127]);
    assert!(q[7..].iter().all(|&v| v == 0));
    assert_eq!((xg, xs), (&[-60][..], -60));
    // Two positions, the second all zero; the buffers are reused.
    a.fill(&[0.254, -0.127, 0.0, 0.0], 2, 2, Layout::Natural);
    assert_eq!(a.stride, 128);
    assert_eq!(a.pos(0).3, 0.254f32 / 127.0);
    assert_eq!(&a.pos(0).0[..3], &[127, -64, 0]);
    assert_eq!((a.pos(1).1, a.pos(1).2, a.pos(1).3), (&[0][..], 0, 0.0));
    assert!(a.pos(1).0.iter().all(|&v| v == 0));
    // Layouts are permutations of the natural order (odd width, 3 groups).
    let cols = 150;
    let x: Vec<f32> = (0..cols).map(|k| k as f32 - 20.0).collect();
    let mut nat = ActBuf::default();
    nat.fill(&x, 1, cols, Layout::Natural);
    for (layout, index) in [
        (
            Layout::Split4,
            (|k| (k / 128) * 128 + (k % 128) / 2 + 64 * (k % 2)) as fn(usize) -> usize,
        ),
        (Layout::T3, |k| (k / 64) * 64 + 16 * (k % 4) + (k % 64) / 4),
        (Layout::Split2, |k| {
            (k / 256) * 256 + 64 * (k % 4) + (k % 256) / 4
        }),
    ] {
        let mut b = ActBuf::default();
        b.fill(&x, 1, cols, layout);
        assert_eq!(b.stride, 256);
        assert_eq!((b.pos(0).1, b.pos(0).2), (nat.pos(0).1, nat.pos(0).2));
        for k in 0..cols {
            assert_eq!(b.pos(0).0[index(k)], nat.pos(0).0[k], "{layout:?} k={k}");
        }
        let nz = b.pos(0).0.iter().filter(|&&v| v != 0).count();
        assert_eq!(nz, nat.pos(0).0.iter().filter(|&&v| v != 0).count());
    }
}

#[test]
fn from_packed_ambiguities_are_documented() {
    // Widths where two formats have the same (data, scales) lengths, other
    // than int4 vs int4-g64 with one group (which decode identically).
    let mut amb = Vec::new();
    for cols in 1..=4096 {
        let fmts: Vec<QFormat> = QUANT_FORMATS
            .iter()
            .copied()
            .filter(|f| !(*f == QFormat::I4G64 && cols <= 64))
            .collect();
        let n = fmts.len();
        let hit = (0..n).any(|a| {
            (a + 1..n).any(|b| {
                let (fa, fb) = (fmts[a], fmts[b]);
                fa.data_len(2, cols) == fb.data_len(2, cols)
                    && fa.scales_len(2, cols) == fb.scales_len(2, cols)
            })
        });
        if hit {
            amb.push(cols);
        }
    }
    assert_eq!(amb, [1, 2, 24, 47, 48, 95, 96, 143, 144]);
}

#[test]
fn f32_storage() {
    let w = Rng::new(9).vec(6);
    let m = QMatrix::from_f32(w.clone(), 2, 3);
    assert_eq!(m.dequantize(), w);
    assert_eq!(m.resident_bytes(), 24);
    assert!(m.scales().is_empty());
    let q = QMatrix::quantize(&w, 2, 3, QFormat::F32);
    assert_eq!(q.data(), m.data());
    let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    let p = QMatrix::from_parts(QFormat::F32, 2, 3, bytes, vec![]).unwrap();
    assert_eq!(p.dequantize(), w);
}

#[test]
#[should_panic]
fn from_f32_len_mismatch_panics() {
    let _ = QMatrix::from_f32(vec![0.0; 5], 2, 3);
}

// ---------------------------------------------------------------------------
// Container detection
// ---------------------------------------------------------------------------

#[test]
fn from_packed_detects_each_format() {
    let mut rng = Rng::new(11);
    for cols in [256usize, 130, 200, 4096 + 64] {
        for fmt in QUANT_FORMATS {
            let rows = 3;
            let w = rng.weights(rows * cols);
            let m = QMatrix::quantize(&w, rows, cols, fmt);
            let p =
                QMatrix::from_packed(rows, cols, m.data().to_vec(), m.scales().to_vec()).unwrap();
            assert_eq!(p.format(), fmt, "cols={cols}");
            assert_eq!(p.dequantize(), m.dequantize());
        }
    }
    // One group per row: int4-g64 and int4 coincide; int4 is picked and
    // decodes the same.
    let w = rng.weights(2 * 64);
    let g = QMatrix::quantize(&w, 2, 64, QFormat::I4G64);
    let p = QMatrix::from_packed(2, 64, g.data().to_vec(), g.scales().to_vec()).unwrap();
    assert_eq!(p.format(), QFormat::I4Row);
    assert_eq!(p.dequantize(), g.dequantize());
}

#[test]
fn from_packed_and_from_parts_errors() {
    let e = QMatrix::from_packed(4, 256, vec![0; 100], vec![0.0; 4]).unwrap_err();
    assert_eq!(
        e,
        QuantError::UnknownLayout {
            rows: 4,
            cols: 256,
            data_len: 100,
            scales_len: 4
        }
    );
    let msg = e.to_string();
    assert!(
        msg.contains("100") && msg.contains("int8 (1024, 4)"),
        "{msg}"
    );
    assert!(msg.contains("int3-g64 (384, 16)"), "{msg}");
    // Right data length for int4, wrong scale count.
    assert!(QMatrix::from_packed(4, 256, vec![0; 512], vec![0.0; 5]).is_err());

    let e = QMatrix::from_parts(QFormat::I4G64, 4, 256, vec![0; 512], vec![0.0; 4]).unwrap_err();
    assert_eq!(
        e,
        QuantError::LengthMismatch {
            fmt: QFormat::I4G64,
            expected_data: 512,
            got_data: 512,
            expected_scales: 16,
            got_scales: 4
        }
    );
    assert!(e.to_string().contains("int4-g64"), "{e}");
    assert!(QMatrix::from_parts(QFormat::F32, 1, 2, vec![0; 7], vec![]).is_err());
}

/// The FPU rounding used at quantization equals `round_ties_even` (as a value: zero's sign
/// aside) on every value that can survive the clamp, ties included, and clamps the same way
/// outside.
#[test]
fn rint_clamped_is_round_ties_even() {
    use super::pack::rint_clamped;
    let mut rng = Rng::new(77);
    let mut vals: Vec<f32> = (-600..=600).map(|i| i as f32 * 0.25).collect();
    vals.extend((0..20_000).map(|_| rng.vec(1)[0] * 300.0));
    vals.extend([
        0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 127.5, -127.5, 0.49999997, -0.0,
    ]);
    vals.extend([4_194_303.5, -4_194_303.5, 8_388_609.0, 1e30, -1e30]);
    // Equal as the integers the quantizers keep (-0.5 gives +0 here, -0 in libm).
    let q = |r: f32| r.clamp(-128.0, 127.0) as i32;
    for v in vals {
        assert_eq!(q(rint_clamped(v)), q(v.round_ties_even()), "{v}");
        if v.abs() < 4_194_304.0 {
            assert_eq!(rint_clamped(v), v.round_ties_even(), "{v}");
        }
    }
    for v in [f32::INFINITY, f32::NEG_INFINITY] {
        assert_eq!(rint_clamped(v).clamp(-127.0, 127.0), v.clamp(-127.0, 127.0));
    }
    assert!(rint_clamped(f32::NAN).is_nan());
}
