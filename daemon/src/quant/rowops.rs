//! Products with a range of a matrix's rows, on the calling thread. Attention's weight
//! absorption works one head at a time, inside its own head-parallel loop, on the rows of
//! `kv_b_proj` that belong to that head: these use the same kernels as the whole-matrix
//! products instead of building f32 copies of the rows.

use super::act::{with_act_buf, with_row_scratch, with_tmp_scratch, Layout};
use super::matmul::{as_i8, transpose_into, Act};
use super::matrix::Storage;
use super::{KernelSet, QFormat, QMatrix};

impl QMatrix {
    /// `y[s * nrows + j] = W[r0 + j] . x[s]` for the `n_seq` rows of `x`, on the calling
    /// thread: with int8 activations when `i8act` (each output as [`QMatrix::matmul_i8act`]
    /// computes it), else f32 ones (as [`QMatrix::matmul`]). Panics if the rows are out of
    /// range or a length does not match.
    pub fn matmul_rows(
        &self,
        r0: usize,
        nrows: usize,
        x: &[f32],
        n_seq: usize,
        y: &mut [f32],
        i8act: bool,
    ) {
        assert!(r0 + nrows <= self.rows, "matmul_rows: rows out of range");
        assert_eq!(
            x.len(),
            n_seq * self.cols,
            "matmul_rows: x.len() != n_seq*cols"
        );
        assert_eq!(
            y.len(),
            n_seq * nrows,
            "matmul_rows: y.len() != n_seq*nrows"
        );
        if n_seq == 0 || nrows == 0 {
            return;
        }
        let k = KernelSet::active();
        // `rows_into` writes `[nrows][n_seq]`: one position needs no reordering.
        let run = |act: &Act, y: &mut [f32]| {
            let len = match act {
                Act::F32(_) if self.fmt != QFormat::F32 => self.cols,
                _ => 0,
            };
            let rows = |out: &mut [f32]| {
                with_row_scratch(len, |row| self.rows_into(k, act, r0, n_seq, out, row))
            };
            if n_seq == 1 {
                rows(y);
            } else {
                with_tmp_scratch(nrows * n_seq, |t| {
                    rows(t);
                    transpose_into(t, n_seq, y);
                });
            }
        };
        if i8act && !self.i8_via_f32() {
            with_act_buf(|a| {
                a.fill_with(k, x, n_seq, self.cols, Layout::of(self.fmt));
                run(&Act::I8(a), y);
            });
        } else {
            run(&Act::F32(x), y);
        }
    }

    /// `f` with `x`'s `n_seq` rows prepared once (int8-quantized when `i8act`, as
    /// [`QMatrix::matmul_rows`] takes them) for several [`PreparedRows::rows_by_output`] calls,
    /// which any thread may make: a head-parallel loop then runs each head's rows of one
    /// product on its own thread, without quantizing the activations once per head.
    pub fn with_prepared<R>(
        &self,
        x: &[f32],
        n_seq: usize,
        i8act: bool,
        f: impl FnOnce(&PreparedRows<'_>) -> R,
    ) -> R {
        assert_eq!(
            x.len(),
            n_seq * self.cols,
            "with_prepared: x.len() != n_seq*cols"
        );
        let k = KernelSet::active();
        if i8act && !self.i8_via_f32() {
            with_act_buf(|a| {
                a.fill_with(k, x, n_seq, self.cols, Layout::of(self.fmt));
                f(&PreparedRows {
                    m: self,
                    act: Act::I8(a),
                    n_seq,
                })
            })
        } else {
            f(&PreparedRows {
                m: self,
                act: Act::F32(x),
                n_seq,
            })
        }
    }

    /// `acc += sum_j coefs[j] * W[r0 + j]`, row by row in order: the same result as
    /// [`QMatrix::axpy_row`] for each row, bit for bit, with int8 rows summed by a kernel that
    /// keeps the accumulator in registers across them. Panics if the rows are out of range or
    /// `acc.len() != cols`.
    pub fn axpy_rows(&self, r0: usize, coefs: &[f32], acc: &mut [f32]) {
        assert!(
            r0 + coefs.len() <= self.rows,
            "axpy_rows: rows {r0}..{} out of range ({} rows)",
            r0 + coefs.len(),
            self.rows
        );
        assert_eq!(acc.len(), self.cols, "axpy_rows: acc.len() != cols");
        let k = KernelSet::active();
        match (&self.data, k.axpy_i8_rows) {
            (Storage::Packed(d), Some(f)) if self.fmt == QFormat::I8Row => {
                // The per-row coefficient axpy_row would pass: coef times the row's scale.
                const CHUNK: usize = 64;
                let mut c = [0f32; CHUNK];
                for (j0, part) in coefs.chunks(CHUNK).enumerate() {
                    let r = r0 + j0 * CHUNK;
                    for ((cj, &q), &s) in c.iter_mut().zip(part).zip(&self.scales[r..]) {
                        *cj = q * s;
                    }
                    let rows = &d[r * self.cols..(r + part.len()) * self.cols];
                    f(acc, &c[..part.len()], as_i8(rows), self.cols);
                }
            }
            _ => {
                for (j, &q) in coefs.iter().enumerate() {
                    self.axpy_row(r0 + j, q, acc);
                }
            }
        }
    }

    /// `acc += coef * W[r]`: one row scaled into an accumulator (int8 rows are widened and
    /// scaled in the same pass, `(coef * scale) * w`). Panics if `r` is out of range or
    /// `acc.len() != cols`.
    pub fn axpy_row(&self, r: usize, coef: f32, acc: &mut [f32]) {
        assert!(
            r < self.rows,
            "axpy_row: row {r} out of range ({} rows)",
            self.rows
        );
        assert_eq!(acc.len(), self.cols, "axpy_row: acc.len() != cols");
        let k = KernelSet::active();
        match &self.data {
            Storage::F32(v) => (k.axpy_f32)(acc, coef, &v[r * self.cols..(r + 1) * self.cols]),
            Storage::Packed(_) if self.fmt == QFormat::I8Row => {
                (k.axpy_i8)(acc, coef * self.scales[r], as_i8(self.row_packed(r)))
            }
            Storage::Packed(_) => with_row_scratch(self.cols, |row| {
                self.dequant_row(r, row);
                (k.axpy_f32)(acc, coef, row)
            }),
        }
    }
}

/// A matrix with the activations of one product, prepared by [`QMatrix::with_prepared`].
pub struct PreparedRows<'a> {
    m: &'a QMatrix,
    act: Act<'a>,
    n_seq: usize,
}

impl PreparedRows<'_> {
    /// `out[j * n_seq + s] = W[r0 + j] . x[s]` for `out.len() / n_seq` rows from `r0`: the
    /// layout `(rows, n_seq)`, the transpose of [`QMatrix::matmul_rows`]'s (which is this then
    /// transposed), on the calling thread. Each output is the one `matmul_rows` (and so the
    /// whole product) computes: the row kernels give every output the same bits whichever
    /// rows a call starts from or ends at. Panics if the rows are out of range.
    pub fn rows_by_output(&self, r0: usize, out: &mut [f32]) {
        let (m, n_seq) = (self.m, self.n_seq);
        if n_seq == 0 {
            return;
        }
        let nrows = out.len() / n_seq;
        assert_eq!(
            out.len(),
            nrows * n_seq,
            "rows_by_output: out.len() % n_seq != 0"
        );
        assert!(r0 + nrows <= m.rows, "rows_by_output: rows out of range");
        let len = match self.act {
            Act::F32(_) if m.fmt != QFormat::F32 => m.cols,
            _ => 0,
        };
        let k = KernelSet::active();
        with_row_scratch(len, |row| m.rows_into(k, &self.act, r0, n_seq, out, row));
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::Rng;
    use super::*;

    #[test]
    fn row_ranges_equal_the_whole_product() {
        let mut rng = Rng::new(5);
        let (rows, cols) = (37, 300);
        let w = rng.weights(rows * cols);
        for fmt in QFormat::ALL {
            let m = QMatrix::quantize(&w, rows, cols, fmt);
            for n_seq in [1, 3] {
                let x = rng.vec(n_seq * cols);
                for i8act in [false, true] {
                    let mut whole = vec![0f32; n_seq * rows];
                    if i8act {
                        m.matmul_i8act(&x, n_seq, &mut whole);
                    } else {
                        m.matmul(&x, n_seq, &mut whole);
                    }
                    let (r0, nrows) = (5, 17);
                    let mut part = vec![f32::NAN; n_seq * nrows];
                    m.matmul_rows(r0, nrows, &x, n_seq, &mut part, i8act);
                    for s in 0..n_seq {
                        for j in 0..nrows {
                            let (a, b) = (part[s * nrows + j], whole[s * rows + r0 + j]);
                            assert_eq!(a.to_bits(), b.to_bits(), "{fmt} {n_seq} {i8act}");
                        }
                    }
                }
            }
        }
    }

    /// Rows by output from one preparation, over ranges that start and end off the 4-row tiles,
    /// at position counts on and off the 4-position tiles (the GEMM path of the whole product
    /// included): the whole product's bits, transposed.
    #[test]
    fn prepared_rows_equal_the_whole_product() {
        let mut rng = Rng::new(9);
        let (rows, cols) = (37, 256);
        let w = rng.weights(rows * cols);
        for fmt in QFormat::ALL {
            let m = QMatrix::quantize(&w, rows, cols, fmt);
            for n_seq in [1, 5, 16, 23] {
                let x = rng.vec(n_seq * cols);
                for i8act in [false, true] {
                    let mut whole = vec![0f32; n_seq * rows];
                    if i8act {
                        m.matmul_i8act(&x, n_seq, &mut whole);
                    } else {
                        m.matmul(&x, n_seq, &mut whole);
                    }
                    m.with_prepared(&x, n_seq, i8act, |p| {
                        for (r0, nrows) in [(0, rows), (5, 17), (3, 1), (30, 7)] {
                            let mut part = vec![f32::NAN; n_seq * nrows];
                            p.rows_by_output(r0, &mut part);
                            for s in 0..n_seq {
                                for j in 0..nrows {
                                    let (a, b) = (part[j * n_seq + s], whole[s * rows + r0 + j]);
                                    assert_eq!(a.to_bits(), b.to_bits(), "{fmt} {n_seq} {i8act}");
                                }
                            }
                        }
                    });
                }
            }
        }
    }

    /// Widths past and between the 256-element register blocks, row counts past the
    /// coefficient chunk, every format: the same bits as one `axpy_row` per row.
    #[test]
    fn axpy_rows_equal_one_axpy_row_each() {
        let mut rng = Rng::new(8);
        for cols in [7, 256, 300, 512, 777] {
            let rows = 150;
            let w = rng.weights(rows * cols);
            for fmt in QFormat::ALL {
                let m = QMatrix::quantize(&w, rows, cols, fmt);
                for (r0, nr) in [(0, 0), (3, 1), (5, 70), (10, 140)] {
                    let coefs = rng.vec(nr);
                    let base = rng.vec(cols);
                    let mut want = base.clone();
                    for (j, &c) in coefs.iter().enumerate() {
                        m.axpy_row(r0 + j, c, &mut want);
                    }
                    let mut got = base.clone();
                    m.axpy_rows(r0, &coefs, &mut got);
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{fmt} cols={cols} rows {r0}+{nr}");
                }
            }
        }
    }

    #[test]
    fn axpy_row_is_the_scaled_row() {
        let mut rng = Rng::new(6);
        let (rows, cols) = (4, 150);
        let w = rng.weights(rows * cols);
        for fmt in QFormat::ALL {
            let m = QMatrix::quantize(&w, rows, cols, fmt);
            let deq = m.dequantize();
            let base = rng.vec(cols);
            let mut acc = base.clone();
            m.axpy_row(2, 0.75, &mut acc);
            for (i, (&a, &b)) in acc.iter().zip(&base).enumerate() {
                let want = b + 0.75 * deq[2 * cols + i];
                let tol = 1e-6 * (b.abs() + (0.75 * deq[2 * cols + i]).abs()) + 1e-7;
                assert!((a - want).abs() <= tol, "{fmt} {i}: {a} vs {want}");
            }
        }
    }
}
