//! Small element-wise operations of the forward pass, in f32 as transformers computes them,
//! and the SwiGLU block every MLP shares (the dense MLP, the shared expert and the routed
//! experts of the tiers all call [`swiglu`] from here).

use crate::quant::{ActMode, QMatrix};

/// RMSNorm over each row of `x` (rows of `w.len()`), in place:
/// `w * (x * rsqrt(mean(x^2) + eps))`, with no `1 + w` offset.
pub fn rms_norm_rows(x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    // Each row's sum of squares is a chain of additions in order (its bits): eight rows' chains
    // interleaved keep the adder busy where one row waited on each addition (a prefill's q and
    // k norms, a row per head, were a chain of 128 additions each on one thread).
    const GROUP: usize = 8;
    for rows in x.chunks_mut(GROUP * n.max(1)) {
        // A sum of squares starts at +0 or -0 alike: no square is -0.
        let mut sums = [0f32; GROUP];
        if rows.len() == GROUP * n {
            let r: [&[f32]; GROUP] = core::array::from_fn(|i| &rows[i * n..][..n]);
            for e in 0..n {
                for (sum, r) in sums.iter_mut().zip(&r) {
                    *sum += r[e] * r[e];
                }
            }
        } else {
            for (sum, row) in sums.iter_mut().zip(rows.chunks_exact(n)) {
                for v in row {
                    *sum += v * v;
                }
            }
        }
        for (row, sum) in rows.chunks_exact_mut(n).zip(sums) {
            let inv = 1.0 / (sum / n as f32 + eps).sqrt();
            for (v, g) in row.iter_mut().zip(w) {
                *v = g * (*v * inv);
            }
        }
    }
}

/// LayerNorm (mean-centred, with bias) over each row, in place. Used by the DSA indexer's key norm.
pub fn layer_norm_rows(x: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
    let n = w.len() as f32;
    for row in x.chunks_exact_mut(w.len()) {
        let mean = row.iter().sum::<f32>() / n;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
        let inv = 1.0 / (var + eps).sqrt();
        for ((v, g), bias) in row.iter_mut().zip(w).zip(b) {
            *v = (*v - mean) * inv * g + bias;
        }
    }
}

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Numerically stable softmax in place: `exp(x - max)` (many lanes at a time, each one
/// `f32::exp`'s bits), then their sum in order.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    crate::quant::expf::exp_shifted(x, max);
    let mut sum = 0.0;
    for v in x.iter() {
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

/// [`softmax`] of each of `lens.len()` rows, row `i` the first `lens[i]` values from
/// `x[i * ld..]`, with each row's bits: the same maximum, exponentials and in-order sum,
/// only the rows' sums interleaved, so that each addition waits on its own row's last one
/// and not on the previous row's whole chain (one row's in-order sum is a chain of dependent
/// additions, the bulk of a short row's softmax). `x` holds whole rows of `ld`
/// (the last may be cut after its `lens` values).
///
/// The maximum is taken sixteen lanes at a time: the maximum of a set is one of its values
/// whatever the order (NaNs skipped as `f32::max` skips them); only a tie of +0 and -0 may come
/// out with the other sign, and a softmax subtracts it without a difference: `x - 0` and
/// `x - (-0)` differ only at `x = -0`, where both exponentials are 1.
pub fn softmax_rows(x: &mut [f32], ld: usize, lens: &[usize]) {
    softmax_rows_of(x, ld, lens, None)
}

/// [`softmax_rows`] of the rows multiplied by `scale` first (each product rounded, as a pass
/// of `*v *= scale` before it leaves them): attention's scores, scaled in the softmax's first
/// pass instead of a pass of their own.
pub fn softmax_rows_scaled(x: &mut [f32], ld: usize, lens: &[usize], scale: f32) {
    softmax_rows_of(x, ld, lens, Some(scale))
}

fn softmax_rows_of(x: &mut [f32], ld: usize, lens: &[usize], scale: Option<f32>) {
    use crate::quant::expf::{div_by, exp_shifted, scale_max};
    // The scale, the maximum, the exponentials and the division go sixteen (eight) lanes at a
    // time where the CPU has AVX-512 (the crate's baseline target vectorized them four wide).
    for (row, &len) in x.chunks_mut(ld).zip(lens) {
        let row = &mut row[..len];
        let max = scale_max(row, scale);
        exp_shifted(row, max);
    }
    // Eight rows' sums at a time, held in registers (eight independent chains keep the adder
    // busy; sixteen would not fit the registers of the baseline target).
    const GROUP: usize = 8;
    let mut groups = x.chunks_mut(GROUP * ld).zip(lens.chunks(GROUP));
    for (rows, lens) in &mut groups {
        let mut sums = [0f32; GROUP];
        let mut common = 0;
        if let Ok(lens8) = <&[usize; GROUP]>::try_from(lens) {
            common = lens8.iter().copied().min().unwrap_or(0);
            let r: [&[f32]; GROUP] = core::array::from_fn(|i| &rows[i * ld..][..common]);
            for k in 0..common {
                for (sum, r) in sums.iter_mut().zip(&r) {
                    *sum += r[k];
                }
            }
        }
        for ((row, &len), sum) in rows.chunks_mut(ld).zip(lens).zip(&mut sums) {
            let row = &mut row[..len];
            for v in &row[common..] {
                *sum += *v;
            }
            div_by(row, *sum);
        }
    }
}

/// `sum a[i] * b[i]` over the shorter length with the f32 kernel of the active kernel set
/// (eight lanes; FMA where the CPU has it). Attention scores spend most of their time here.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    crate::quant::dot_f32(a, b)
}

/// `acc += coef * x` with the active kernels (attention's weighted sums of values).
pub fn axpy(acc: &mut [f32], coef: f32, x: &[f32]) {
    crate::quant::axpy_f32(acc, coef, x)
}

/// `out[i] = dot(q, base[keys[i] * stride..][..q.len()])`, bit for bit, several keys per pass
/// (attention scores against the cache).
pub fn dot_gather(q: &[f32], base: &[f32], stride: usize, keys: &[usize], out: &mut [f32]) {
    crate::quant::dot_f32_gather(q, base, stride, keys, out)
}

/// Four [`dot_gather`]s of queries of one length over the same keys (four heads scoring the
/// same cached latents), bit for bit, each row loaded once for the four.
pub fn dot_gather4(
    qs: [&[f32]; 4],
    base: &[f32],
    stride: usize,
    keys: &[usize],
    outs: [&mut [f32]; 4],
) {
    crate::quant::dot_f32_gather4(qs, base, stride, keys, outs)
}

/// `axpy(acc, coefs[i], base[keys[i] * stride..][..acc.len()])` for each key in order, bit for
/// bit, the accumulator kept in registers across keys (attention's weighted sum of values).
pub fn axpy_gather(acc: &mut [f32], coefs: &[f32], base: &[f32], stride: usize, keys: &[usize]) {
    crate::quant::axpy_f32_gather(acc, coefs, base, stride, keys)
}

/// Four [`axpy_gather`]s over the same keys, one per accumulator with its own coefficients
/// (four heads summing a stripe of the same cached latents), bit for bit, each row loaded once.
pub fn axpy_gather4(
    accs: [&mut [f32]; 4],
    coefs: [&[f32]; 4],
    base: &[f32],
    stride: usize,
    keys: &[usize],
) {
    crate::quant::axpy_f32_gather4(accs, coefs, base, stride, keys)
}

pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best
}

/// `out = down(silu(gate(x)) * up(x))` for `n` rows; `gu` holds the two intermediates. With
/// `oss` (gpt-oss's experts) the biases are added and the SwiGLU is the clamped one.
#[allow(clippy::too_many_arguments)]
pub(crate) fn swiglu(
    [gate, up, down]: [&QMatrix; 3],
    oss: Option<&crate::experts::OssExpert>,
    x: &[f32],
    n: usize,
    act: ActMode,
    gu: (&mut Vec<f32>, &mut Vec<f32>),
    out: &mut [f32],
) {
    let inter = gate.rows();
    let g = super::scratch::grow(gu.0, n * inter);
    let u = super::scratch::grow(gu.1, n * inter);
    let mm = |w: &QMatrix, x: &[f32], y: &mut [f32]| match act {
        ActMode::F32 => w.matmul(x, n, y),
        ActMode::Int8 => w.matmul_i8act(x, n, y),
    };
    match act {
        // One pass over x for both projections: the activations are quantized once.
        ActMode::Int8 => QMatrix::matmul_pair_i8act(gate, up, x, n, g, u),
        ActMode::F32 => {
            mm(gate, x, g);
            mm(up, x, u);
        }
    }
    match oss {
        None => crate::quant::expf::silu_mul(g, u),
        Some(o) => o.glu(g, u),
    }
    mm(down, g, out);
    if let Some(o) = oss {
        o.add_down_bias(&mut out[..n * down.rows()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_matches_hand_computation() {
        let mut x = vec![1.0, 2.0, 3.0, 4.0];
        rms_norm_rows(&mut x, &[1.0, 1.0, 2.0, 0.5], 0.0);
        let r = (30.0f32 / 4.0).sqrt();
        assert!((x[0] - 1.0 / r).abs() < 1e-6);
        assert!((x[2] - 6.0 / r).abs() < 1e-6);
        assert!((x[3] - 2.0 / r).abs() < 1e-6);
    }

    /// Eight rows at a time give each row's own bits: the one-row loop as it was, on whole
    /// groups and a short last one, rows short and long, with a NaN and zeros among them.
    #[test]
    fn rms_norm_rows_equal_one_row_at_a_time() {
        let mut x = crate::rng::XorShift64(0xfeed_f00d_1357_9bdf);
        for (n, rows) in [(128, 21), (7, 8), (2048, 9), (64, 3), (1, 17)] {
            let w: Vec<f32> = (0..n).map(|_| x.unit_f32() * 2.0).collect();
            let mut got: Vec<f32> = (0..n * rows).map(|_| x.unit_f32() * 8.0 - 4.0).collect();
            got[n..2 * n].fill(0.0);
            got[3 * n - 1] = f32::NAN;
            let mut want = got.clone();
            for row in want.chunks_exact_mut(n) {
                let ms = row.iter().map(|v| v * v).sum::<f32>() / n as f32;
                let inv = 1.0 / (ms + 1e-6).sqrt();
                for (v, g) in row.iter_mut().zip(&w) {
                    *v = g * (*v * inv);
                }
            }
            rms_norm_rows(&mut got, &w, 1e-6);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{rows} rows of {n}");
        }
    }

    #[test]
    fn layer_norm_centres_and_scales() {
        let mut x = vec![1.0, 3.0];
        layer_norm_rows(&mut x, &[1.0, 1.0], &[0.5, 0.5], 0.0);
        assert!((x[0] + 0.5).abs() < 1e-6 && (x[1] - 1.5).abs() < 1e-6);
    }

    /// Several rows at once give each row's own softmax, bit for bit: rows of every length
    /// around the sixteen lanes, more rows than one pass takes, ties of signed zeros, NaNs
    /// and infinities among the scores.
    #[test]
    fn softmax_rows_equal_one_softmax_each() {
        let mut x = crate::rng::XorShift64(0x9e37_79b9_7f4a_7c15);
        let mut rnd = || x.unit_f32() * 16.0 - 8.0;
        let ld = 70;
        let lens: Vec<usize> = (0..37)
            .map(|i| [1, 15, 16, 17, 33, 64, 70][i % 7])
            .collect();
        let mut rows: Vec<f32> = (0..lens.len() * ld).map(|_| rnd()).collect();
        rows[ld..ld + 15].fill(0.0);
        rows[2 * ld + 3] = -0.0;
        rows[2 * ld..2 * ld + 16]
            .iter_mut()
            .for_each(|v| *v = -v.abs() - 1.0);
        rows[2 * ld + 5] = -0.0;
        rows[2 * ld + 9] = 0.0;
        rows[3 * ld + 4] = f32::NAN;
        rows[4 * ld + 20] = f32::NEG_INFINITY;
        let mut want = rows.clone();
        for (row, &len) in want.chunks_mut(ld).zip(&lens) {
            softmax(&mut row[..len]);
        }
        softmax_rows(&mut rows, ld, &lens);
        for (i, &len) in lens.iter().enumerate() {
            for k in 0..len {
                let (a, b) = (rows[i * ld + k], want[i * ld + k]);
                assert_eq!(a.to_bits(), b.to_bits(), "row {i} key {k}: {a} vs {b}");
            }
        }
    }

    /// The scaled rows give the bits of a pass of `*v *= scale`, then one softmax a row.
    #[test]
    fn scaled_rows_equal_a_scale_pass_then_softmax() {
        let mut x = crate::rng::XorShift64(0x1234_5678_9abc_def1);
        let ld = 131;
        let lens: Vec<usize> = (0..21).map(|i| [1, 7, 8, 9, 63, 64, 131][i % 7]).collect();
        let rows: Vec<f32> = (0..lens.len() * ld)
            .map(|_| x.unit_f32() * 60.0 - 30.0)
            .collect();
        for scale in [0.088_388_35f32, 0.125, 1.7] {
            let mut want = rows.clone();
            for (row, &len) in want.chunks_mut(ld).zip(&lens) {
                let row = &mut row[..len];
                row.iter_mut().for_each(|v| *v *= scale);
                softmax(row);
            }
            let mut got = rows.clone();
            softmax_rows_scaled(&mut got, ld, &lens, scale);
            for (i, &len) in lens.iter().enumerate() {
                for k in 0..len {
                    let (a, b) = (got[i * ld + k], want[i * ld + k]);
                    assert_eq!(a.to_bits(), b.to_bits(), "scale {scale} row {i} key {k}");
                }
            }
        }
    }

    #[test]
    fn softmax_sums_to_one() {
        let mut x = vec![1.0, 2.0, 3.0, -1e30];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert_eq!(x[3], 0.0);
    }
}
