//! The kernel sets' float kernels against their references: `read_sum` and the f32 dot
//! and axpy against `scalar.rs`, and attention's gathered, column-stored and four-query
//! variants bit for bit against one `dot_f32` / `axpy_f32` call per key, on every kernel
//! set this CPU has (widths at the chain and tail edges, odd key counts, special values).

use super::tests::{kernel_sets, Rng};
use super::*;

#[test]
fn read_sum_is_the_same_on_every_kernel_set() {
    let mut rng = Rng::new(9);
    let buf: Vec<u8> = (0..5000).map(|_| rng.next_u64() as u8).collect();
    // Lengths around the 128/256-byte steps and the 8-byte lanes, at odd offsets.
    for (off, len) in [
        (0, 0),
        (0, 7),
        (1, 64),
        (3, 255),
        (0, 256),
        (5, 1000),
        (0, 4999),
    ] {
        let b = &buf[off..off + len];
        let want = scalar::read_sum(b);
        for k in kernel_sets() {
            assert_eq!(k.read_sum(b), want, "{} off {off} len {len}", k.name());
        }
    }
    // Little-endian lanes: bytes 1, 0 x7 then 2, 0 x7 sum to 3.
    let mut two = [0u8; 16];
    two[0] = 1;
    two[8] = 2;
    assert_eq!(scalar::read_sum(&two), 3);
}

#[test]
fn f32_dot_and_axpy_agree_with_portable() {
    // Fused multiply-adds and other lane orders round differently: within a
    // few ulps of the magnitudes involved, and exact lengths respected.
    let mut rng = Rng::new(13);
    for n in (0..70).chain([255, 256, 512, 1000]) {
        let (a, b) = (rng.vec(n + 3), rng.vec(n));
        let c = rng.f();
        let mag: f32 = a.iter().zip(&b).map(|(x, y)| (x * y).abs()).sum();
        let want = scalar::dot_f32(&a, &b);
        let mut want_acc = rng.vec(n + 5);
        let before = want_acc.clone();
        scalar::axpy_f32(&mut want_acc, c, &b);
        for k in kernel_sets() {
            let got = (k.dot_f32)(&a, &b);
            assert!(
                (got - want).abs() <= 1e-5 * mag + 1e-30,
                "{} n={n}",
                k.name()
            );
            let mut acc = before.clone();
            (k.axpy_f32)(&mut acc, c, &b);
            for (i, (&g, &w)) in acc.iter().zip(&want_acc).enumerate() {
                let bound = 1e-6 * (before[i].abs() + (c * b.get(i).unwrap_or(&0.0)).abs());
                assert!(
                    (g - w).abs() <= bound,
                    "{} n={n} i={i}: {g} vs {w}",
                    k.name()
                );
            }
            // Elements past the shorter slice are untouched.
            assert_eq!(&acc[n..], &before[n..], "{} n={n}", k.name());
        }
    }
}

/// The gathered dot and axpy (attention's scores and weighted values) equal one `dot_f32` /
/// `axpy_f32` per key bit for bit on every kernel set: widths under one vector, at the chain
/// and register-block edges and ragged; key lists of every remainder mod 4, repeats included.
#[test]
fn gathered_dots_and_axpys_equal_one_call_per_key() {
    let mut rng = Rng::new(91);
    for n in [
        1, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 200, 256, 300, 512, 576, 1000,
    ] {
        let stride = n + 7;
        let rows = 23;
        let base = rng.vec(rows * stride);
        let q = rng.vec(n);
        for nk in [0, 1, 3, 4, 5, 9, 16, 17, 35, 70] {
            let keys: Vec<usize> = (0..nk).map(|_| rng.below(rows)).collect();
            let coefs = rng.vec(nk);
            let acc0 = rng.vec(n);
            for k in kernel_sets() {
                let row = |t: usize| &base[t * stride..][..n];
                let want: Vec<u32> = keys
                    .iter()
                    .map(|&t| (k.dot_f32)(&q, row(t)).to_bits())
                    .collect();
                let mut want_acc = acc0.clone();
                for (&c, &t) in coefs.iter().zip(&keys) {
                    (k.axpy_f32)(&mut want_acc, c, row(t));
                }
                if let Some(f) = k.dot_f32_gather {
                    let mut out = vec![f32::NAN; nk];
                    f(&q, &base, stride, &keys, &mut out);
                    let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(got, want, "{} dot n={n} keys={nk}", k.name());
                }
                if let Some(f) = k.axpy_f32_gather {
                    let mut acc = acc0.clone();
                    f(&mut acc, &coefs, &base, stride, &keys);
                    let same = acc
                        .iter()
                        .zip(&want_acc)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{} axpy n={n} keys={nk}", k.name());
                }
            }
        }
    }
}

/// Keys stored by column for the column-score tests, `(keys, stride)`: none, one, fewer than
/// a vector, exactly one, one past, an odd count at its own stride, several vectors and a tail
/// inside a wider stride.
const KEY_COLUMNS: [(usize, usize); 7] = [
    (0, 3),
    (1, 1),
    (5, 9),
    (16, 16),
    (17, 40),
    (33, 33),
    (70, 75),
];

/// Keys stored by column score the bits of one `dot_f32` a key on every kernel set (the
/// native kernel where there is one, else the portable gather): widths at every chain and
/// tail edge, key counts of every remainder mod 16, a stride wider than the keys.
#[test]
fn column_scores_equal_one_dot_per_key() {
    let mut rng = Rng::new(93);
    for n in [
        1, 15, 16, 17, 32, 48, 63, 64, 65, 127, 128, 192, 200, 256, 300, 576,
    ] {
        for (m, ld) in KEY_COLUMNS {
            let kt = rng.vec(n * ld);
            let q = rng.vec(n);
            for k in kernel_sets() {
                let want: Vec<u32> = (0..m)
                    .map(|t| {
                        let key: Vec<f32> = (0..n).map(|e| kt[e * ld + t]).collect();
                        (k.dot_f32)(&q, &key).to_bits()
                    })
                    .collect();
                if let Some(f) = k.dot_f32_cols {
                    let mut out = vec![f32::NAN; m];
                    f(&q, &kt, ld, &mut out);
                    let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(got, want, "{} n={n} m={m} ld={ld}", k.name());
                }
            }
        }
    }
    // The active kernels' entry point, native or not.
    let (n, m, ld) = (48, 21, 30);
    let kt = rng.vec(n * ld);
    let q = rng.vec(n);
    let mut out = vec![0.0; m];
    super::dot_f32_cols(&q, &kt, ld, &mut out);
    for (t, o) in out.iter().enumerate() {
        let key: Vec<f32> = (0..n).map(|e| kt[e * ld + t]).collect();
        assert_eq!(o.to_bits(), super::dot_f32(&q, &key).to_bits(), "key {t}");
    }
}

/// Four queries against keys stored by column score the bits of one `dot_f32` per query and
/// key on every kernel set (the native kernel where there is one, else four `dot_f32_cols`):
/// widths at every chain and tail edge (attention's heads of 64 and 128 among them), key
/// counts of every remainder mod 16, a stride wider than the keys whose extra columns are
/// NaN (a lane read past the keys would show), queries that differ.
#[test]
fn four_query_column_scores_equal_one_dot_per_key() {
    let mut rng = Rng::new(94);
    for n in [
        1, 15, 16, 17, 24, 48, 63, 64, 65, 80, 127, 128, 130, 192, 256,
    ] {
        for (m, ld) in KEY_COLUMNS {
            let mut kt = rng.vec(n * ld);
            for (i, v) in kt.iter_mut().enumerate() {
                if i % ld >= m {
                    *v = f32::NAN;
                }
            }
            let qs: Vec<Vec<f32>> = (0..4).map(|_| rng.vec(n)).collect();
            let key = |t: usize| (0..n).map(|e| kt[e * ld + t]).collect::<Vec<f32>>();
            for k in kernel_sets() {
                let want: Vec<Vec<u32>> = qs
                    .iter()
                    .map(|q| (0..m).map(|t| (k.dot_f32)(q, &key(t)).to_bits()).collect())
                    .collect();
                let Some(f) = k.dot_f32_cols4 else {
                    continue;
                };
                let mut got = vec![vec![f32::NAN; m]; 4];
                let [a, b, c, d] = &mut got[..] else {
                    unreachable!()
                };
                f([&qs[0], &qs[1], &qs[2], &qs[3]], &kt, ld, [a, b, c, d]);
                for h in 0..4 {
                    let g: Vec<u32> = got[h].iter().map(|v| v.to_bits()).collect();
                    assert_eq!(g, want[h], "{} n={n} m={m} ld={ld} query {h}", k.name());
                }
            }
        }
    }
    // The active kernels' entry point, native or not.
    let (n, m, ld) = (128, 21, 30);
    let kt = rng.vec(n * ld);
    let qs: Vec<Vec<f32>> = (0..4).map(|_| rng.vec(n)).collect();
    let mut got = vec![vec![0.0; m]; 4];
    let [a, b, c, d] = &mut got[..] else {
        unreachable!()
    };
    super::dot_f32_cols4([&qs[0], &qs[1], &qs[2], &qs[3]], &kt, ld, [a, b, c, d]);
    for (q, out) in qs.iter().zip(&got) {
        for (t, o) in out.iter().enumerate() {
            let key: Vec<f32> = (0..n).map(|e| kt[e * ld + t]).collect();
            assert_eq!(o.to_bits(), super::dot_f32(q, &key).to_bits(), "key {t}");
        }
    }
}

/// Four accumulators summed over the same gathered rows give the bits of one `axpy_f32` per
/// key and accumulator, on every kernel set that has the four-head kernel, at widths up to 64.
#[test]
fn four_head_gathered_sums_equal_one_call_per_key_bit_for_bit() {
    let mut rng = Rng::new(92);
    let (stride, rows) = (80, 40);
    let base = rng.vec(stride * rows);
    for nk in [0, 1, 5, 17] {
        let keys: Vec<usize> = (0..nk).map(|_| rng.below(rows)).collect();
        let coefs: Vec<Vec<f32>> = (0..4).map(|_| rng.vec(nk)).collect();
        for n in [1, 15, 16, 17, 33, 48, 63, 64] {
            let init: Vec<Vec<f32>> = (0..4).map(|_| rng.vec(n)).collect();
            for k in kernel_sets() {
                let Some(f) = k.axpy_f32_gather4 else {
                    continue;
                };
                let mut want = init.clone();
                for (acc, c) in want.iter_mut().zip(&coefs) {
                    for (&cj, &t) in c.iter().zip(&keys) {
                        (k.axpy_f32)(acc, cj, &base[t * stride..][..n]);
                    }
                }
                let mut got = init.clone();
                let [a, b, c, d] = &mut got[..] else {
                    unreachable!()
                };
                let cs = [&coefs[0][..], &coefs[1][..], &coefs[2][..], &coefs[3][..]];
                f([a, b, c, d], cs, &base, stride, &keys);
                for h in 0..4 {
                    let same = got[h]
                        .iter()
                        .zip(&want[h])
                        .all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "{} n={n} keys={nk} head {h}", k.name());
                }
            }
        }
    }
}

/// Four queries scored against the same gathered rows give the bits of one `dot_f32` per query
/// and key on every kernel set that has the four-query tile: widths under one vector, at the
/// chain edges (64) and ragged, key lists of every remainder mod 4, repeats included.
#[test]
fn four_query_gathered_dots_equal_one_call_per_key_bit_for_bit() {
    let mut rng = Rng::new(93);
    for n in [1, 15, 16, 17, 48, 63, 64, 65, 127, 128, 200, 512, 576] {
        let (stride, rows) = (n + 3, 19);
        let base = rng.vec(stride * rows);
        let qs: Vec<Vec<f32>> = (0..4).map(|_| rng.vec(n)).collect();
        for nk in [0, 1, 3, 4, 5, 8, 9, 17] {
            let keys: Vec<usize> = (0..nk).map(|_| rng.below(rows)).collect();
            for k in kernel_sets() {
                let Some(f) = k.dot_f32_gather4 else {
                    continue;
                };
                let mut got = vec![vec![f32::NAN; nk]; 4];
                let [a, b, c, d] = &mut got[..] else {
                    unreachable!()
                };
                let q4 = [&qs[0][..], &qs[1][..], &qs[2][..], &qs[3][..]];
                f(q4, &base, stride, &keys, [a, b, c, d]);
                for (h, q) in qs.iter().enumerate() {
                    for (i, &t) in keys.iter().enumerate() {
                        let want = (k.dot_f32)(q, &base[t * stride..][..n]);
                        assert_eq!(
                            got[h][i].to_bits(),
                            want.to_bits(),
                            "{} n={n} keys={nk} query {h} key {i}",
                            k.name()
                        );
                    }
                }
            }
        }
    }
}

#[test]
#[should_panic(expected = "past the end")]
fn gathered_rows_are_bounds_checked() {
    let base = vec![0f32; 100];
    let mut out = [0f32; 1];
    // Row 9 at stride 10 is base[90..101]: one past the end.
    if let Some(f) = KernelSet::detected().dot_f32_gather {
        f(&[0.0; 11], &base, 10, &[9], &mut out);
    } else {
        super::kernel_set::check_gather(11, base.len(), 10, &[9]);
    }
}

/// The active kernels' four-head sums take heads longer than the kernel's 64 a stripe at a
/// time: still one `axpy_f32` per key and accumulator, bit for bit, at attention's widths and
/// ragged ones.
#[test]
fn four_head_sums_of_long_heads_equal_one_call_per_key_bit_for_bit() {
    let mut rng = Rng::new(94);
    for n in [65, 100, 128, 129, 192, 256, 300] {
        let (stride, rows) = (n + 5, 23);
        let base = rng.vec(stride * rows);
        for nk in [0, 1, 4, 17, 64] {
            let keys: Vec<usize> = (0..nk).map(|_| rng.below(rows)).collect();
            let coefs: Vec<Vec<f32>> = (0..4).map(|_| rng.vec(nk)).collect();
            let init: Vec<Vec<f32>> = (0..4).map(|_| rng.vec(n)).collect();
            let mut want = init.clone();
            for (acc, c) in want.iter_mut().zip(&coefs) {
                for (&cj, &t) in c.iter().zip(&keys) {
                    super::axpy_f32(acc, cj, &base[t * stride..][..n]);
                }
            }
            let mut got = init.clone();
            let [a, b, c, d] = &mut got[..] else {
                unreachable!()
            };
            let cs = [&coefs[0][..], &coefs[1][..], &coefs[2][..], &coefs[3][..]];
            super::axpy_f32_gather4([a, b, c, d], cs, &base, stride, &keys);
            for h in 0..4 {
                let same = got[h]
                    .iter()
                    .zip(&want[h])
                    .all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{} n={n} keys={nk} head {h}", kernel_name());
            }
        }
    }
}

/// Four queries' scores keep `dot_f32`'s bits where a row holds signed zeros, infinities or a
/// NaN (the tile's shared horizontal sums add the same operands in the same order).
#[test]
fn four_query_gathered_dots_keep_the_bits_of_special_values() {
    let mut rng = Rng::new(95);
    for n in [16, 64, 128] {
        let rows = 9;
        let mut base = rng.vec(n * rows);
        base[..n].fill(-0.0);
        base[n + 3] = f32::INFINITY;
        base[2 * n + 5] = f32::NEG_INFINITY;
        base[3 * n + 1] = f32::NAN;
        base[4 * n + n / 2] = f32::INFINITY;
        base[4 * n + n / 2 + 1] = f32::NEG_INFINITY;
        let mut qs: Vec<Vec<f32>> = (0..4).map(|_| rng.vec(n)).collect();
        qs[1].fill(0.0);
        qs[2][7] = f32::NAN;
        let keys: Vec<usize> = (0..rows).collect();
        for k in kernel_sets() {
            let Some(f) = k.dot_f32_gather4 else {
                continue;
            };
            let mut got = vec![vec![0f32; rows]; 4];
            let [a, b, c, d] = &mut got[..] else {
                unreachable!()
            };
            let q4 = [&qs[0][..], &qs[1][..], &qs[2][..], &qs[3][..]];
            f(q4, &base, n, &keys, [a, b, c, d]);
            for (h, q) in qs.iter().enumerate() {
                for &t in &keys {
                    let want = (k.dot_f32)(q, &base[t * n..][..n]);
                    let g = got[h][t];
                    assert_eq!(
                        g.to_bits(),
                        want.to_bits(),
                        "{} n={n} q{h} row {t}",
                        k.name()
                    );
                }
            }
        }
    }
}
