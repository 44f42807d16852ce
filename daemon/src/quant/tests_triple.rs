//! [`QMatrix::matmul_triple_i8act`] (attention's q, k and v over rows quantized once) against
//! three [`QMatrix::matmul_i8act`] calls, bit for bit: every kernel set, thread split and
//! row count from one position to a prefill's 512, odd widths, and layouts that differ (the
//! fallback). The GGUF types' twin is in `ggml::tests`.

use super::matmul::Split;
use super::tests::{kernel_sets, Rng};
use super::*;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn triple_equals_separate_calls() {
    let mut rng = Rng::new(52);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    let formats = [
        [QFormat::I4G64; 3],
        [QFormat::I8Row; 3],
        [QFormat::I3G64, QFormat::I3G64, QFormat::I3G64],
        [QFormat::I4Row, QFormat::I4G64, QFormat::I4G64],
        [QFormat::I8Row, QFormat::I4G64, QFormat::F32],
    ];
    let rows = [40, 16, 24];
    for fmts in formats {
        for cols in [130, 257] {
            let m: Vec<QMatrix> = (0..3)
                .map(|j| QMatrix::quantize(&rng.weights(rows[j] * cols), rows[j], cols, fmts[j]))
                .collect();
            for n_seq in [1, 17, 64, 512] {
                let x = rng.vec(cols * n_seq);
                for k in kernel_sets() {
                    let want: Vec<Vec<f32>> = m
                        .iter()
                        .map(|m| {
                            let mut y = vec![0f32; m.rows() * n_seq];
                            m.matmul_i8act_with(k, &x, n_seq, &mut y);
                            y
                        })
                        .collect();
                    for split in [Split::Auto, Split::Single, Split::Chunks(5)] {
                        let mut got: Vec<Vec<f32>> =
                            m.iter().map(|m| vec![1f32; m.rows() * n_seq]).collect();
                        let [a, b, c] = &mut got[..] else {
                            unreachable!("three outputs")
                        };
                        pool.install(|| {
                            QMatrix::matmul_triple_split(
                                k,
                                [&m[0], &m[1], &m[2]],
                                &x,
                                n_seq,
                                [a, b, c],
                                split,
                            )
                        });
                        for j in 0..3 {
                            let tag = format!("{k:?} {fmts:?} {j} x{cols} n{n_seq} {split:?}");
                            assert_eq!(bits(&got[j]), bits(&want[j]), "{tag}");
                        }
                    }
                }
            }
        }
    }
}
