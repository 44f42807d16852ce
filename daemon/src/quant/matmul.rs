//! Driving the products: [`QMatrix::matmul`] and its int8-activation variants quantize the
//! activations once, split the output rows across threads, and run each thread's rows through
//! the kernel set (tiles where it has them).  Every output is computed by one call with the same
//! arithmetic wherever it lands, so the thread split never changes a bit of the result.

use rayon::prelude::*;

use super::act::{with_act_buf, with_row_scratch, with_tmp_scratch, ActBuf, Layout};
use super::gemm;
use super::matrix::Storage;
use super::pack::{self, row_bytes, scales_per_row};
use super::pool;
use super::tuning::{
    decode_tuning, pool_for, pool_threads, Threading, CHUNK_MIN_WORK, GUIDED_MIN_WORK, PAR_MIN_WORK,
};
use super::{KernelSet, QFormat, QMatrix};

/// Widest row whose int8 x int8 sum is exact in i32: 128 * 127 * 2^17 <
/// 2^31.  Per-row formats wider than this take the f32 path in
/// `matmul_i8act` (grouped formats sum at most 64 products per i32).
const MAX_I32_ROW_COLS: usize = 1 << 17;

/// How to split rows across threads (tests pin it; callers use `Auto`).
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) enum Split {
    Auto,
    Single,
    Chunks(usize),
}

/// Activations of one call.
pub(super) enum Act<'a> {
    F32(&'a [f32]),
    /// Quantized, in the layout of the matrix's format.
    I8(&'a ActBuf),
}

impl QMatrix {
    /// `y[s*rows + o] = sum_i W[o,i] * x[s*cols + i]` for `s in 0..n_seq`,
    /// f32 activations (weight dequantized on the fly, f32 accumulation).
    pub fn matmul(&self, x: &[f32], n_seq: usize, y: &mut [f32]) {
        self.matmul_with(KernelSet::active(), x, n_seq, y)
    }

    /// [`QMatrix::matmul`] with an explicit kernel set.
    pub fn matmul_with(&self, k: &KernelSet, x: &[f32], n_seq: usize, y: &mut [f32]) {
        self.matmul_split(k, x, n_seq, y, Split::Auto)
    }

    /// Same product with activations quantized to int8 per position
    /// (`sx = amax/127`, `xq = rint(x/sx)`), exact integer dots per row (or
    /// per 64-group), scaled by `sx * sw`.  For F32 identical to `matmul`
    /// (also for per-row formats with more than 2^17 columns, where an i32
    /// row sum could overflow).  A position whose activations are all zero
    /// (or non-finite in amax) gets `sx = 0` and contributes 0.  Does not
    /// allocate once the thread-local buffers have grown (see `act.rs`).
    pub fn matmul_i8act(&self, x: &[f32], n_seq: usize, y: &mut [f32]) {
        self.matmul_i8act_with(KernelSet::active(), x, n_seq, y)
    }

    /// [`QMatrix::matmul_i8act`] with an explicit kernel set.
    pub fn matmul_i8act_with(&self, k: &KernelSet, x: &[f32], n_seq: usize, y: &mut [f32]) {
        self.matmul_i8act_split(k, x, n_seq, y, Split::Auto)
    }

    /// [`QMatrix::matmul_i8act`] computed on the calling thread only, for
    /// callers that parallelise over independent matmuls themselves (e.g.
    /// one routed expert per thread).  Same bits as `matmul_i8act`.
    pub fn matmul_i8act_on_caller(&self, x: &[f32], n_seq: usize, y: &mut [f32]) {
        self.matmul_i8act_split(KernelSet::active(), x, n_seq, y, Split::Single)
    }

    /// [`QMatrix::matmul_pair_i8act`] computed on the calling thread only (as
    /// [`QMatrix::matmul_i8act_on_caller`]): the activations quantized once for both.  Same
    /// bits as two `matmul_i8act` calls.
    pub fn matmul_pair_i8act_on_caller(
        gate: &QMatrix,
        up: &QMatrix,
        x: &[f32],
        n_seq: usize,
        yg: &mut [f32],
        yu: &mut [f32],
    ) {
        QMatrix::matmul_pair_split(
            KernelSet::active(),
            gate,
            up,
            x,
            n_seq,
            yg,
            yu,
            Split::Single,
        )
    }

    /// `matmul_i8act` of two matrices with the same input (an expert's gate
    /// and up projections): the activations are quantized once and the
    /// rows of both matrices are split across threads in one parallel
    /// region.  `yg`, `yu` are bit-identical to two separate
    /// [`QMatrix::matmul_i8act`] calls.  Panics if the column counts
    /// differ.
    pub fn matmul_pair_i8act(
        gate: &QMatrix,
        up: &QMatrix,
        x: &[f32],
        n_seq: usize,
        yg: &mut [f32],
        yu: &mut [f32],
    ) {
        QMatrix::matmul_pair_i8act_with(KernelSet::active(), gate, up, x, n_seq, yg, yu)
    }

    /// [`QMatrix::matmul_pair_i8act`] with an explicit kernel set.
    pub fn matmul_pair_i8act_with(
        k: &KernelSet,
        gate: &QMatrix,
        up: &QMatrix,
        x: &[f32],
        n_seq: usize,
        yg: &mut [f32],
        yu: &mut [f32],
    ) {
        QMatrix::matmul_pair_split(k, gate, up, x, n_seq, yg, yu, Split::Auto)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn matmul_pair_split(
        k: &KernelSet,
        gate: &QMatrix,
        up: &QMatrix,
        x: &[f32],
        n_seq: usize,
        yg: &mut [f32],
        yu: &mut [f32],
        split: Split,
    ) {
        assert_eq!(
            gate.cols, up.cols,
            "matmul_pair: gate and up column counts differ"
        );
        let same_layout = Layout::of(gate.fmt) == Layout::of(up.fmt);
        if gate.i8_via_f32() || up.i8_via_f32() || !same_layout {
            gate.matmul_i8act_split(k, x, n_seq, yg, split);
            up.matmul_i8act_split(k, x, n_seq, yu, split);
            return;
        }
        assert_eq!(x.len(), n_seq * gate.cols, "matmul: x.len() != n_seq*cols");
        assert_eq!(yu.len(), n_seq * up.rows, "matmul: y.len() != n_seq*rows");
        with_act_buf(|a| {
            a.fill_with(k, x, n_seq, gate.cols, Layout::of(gate.fmt));
            if takes_g64_gemm(k, gate, n_seq) || takes_g64_gemm(k, up, n_seq) {
                a.fill_xt(n_seq);
            }
            run(k, &Act::I8(a), n_seq, [(gate, yg), (up, yu)], split);
        });
    }

    /// Three matrices over the same rows `x` (attention's q, k and v): the rows quantized
    /// once for the three, `a` in one parallel region and `b`, `c` in a second (as
    /// [`QMatrix::matmul_pair_i8act`]), where a prefill quantized them twice. Bit-identical to
    /// three [`QMatrix::matmul_i8act`] calls; where a layout differs or a matrix takes the f32
    /// path, it is `a`'s call and `b`, `c`'s pair. Panics if the column counts differ.
    pub fn matmul_triple_i8act(mats: [&QMatrix; 3], x: &[f32], n_seq: usize, ys: [&mut [f32]; 3]) {
        QMatrix::matmul_triple_split(KernelSet::active(), mats, x, n_seq, ys, Split::Auto)
    }

    pub(crate) fn matmul_triple_split(
        k: &KernelSet,
        [a, b, c]: [&QMatrix; 3],
        x: &[f32],
        n_seq: usize,
        [ya, yb, yc]: [&mut [f32]; 3],
        split: Split,
    ) {
        assert!(
            a.cols == b.cols && a.cols == c.cols,
            "matmul_triple: column counts differ"
        );
        let layout = Layout::of(a.fmt);
        if [a, b, c]
            .iter()
            .any(|m| m.i8_via_f32() || Layout::of(m.fmt) != layout)
        {
            a.matmul_i8act_split(k, x, n_seq, ya, split);
            return QMatrix::matmul_pair_split(k, b, c, x, n_seq, yb, yc, split);
        }
        assert_eq!(x.len(), n_seq * a.cols, "matmul: x.len() != n_seq*cols");
        assert_eq!(yc.len(), n_seq * c.rows, "matmul: y.len() != n_seq*rows");
        with_act_buf(|buf| {
            buf.fill_with(k, x, n_seq, a.cols, layout);
            if [a, b, c].iter().any(|m| takes_g64_gemm(k, m, n_seq)) {
                buf.fill_xt(n_seq);
            }
            let act = Act::I8(buf);
            run(k, &act, n_seq, [(a, ya), (a, &mut [])], split);
            run(k, &act, n_seq, [(b, yb), (c, yc)], split);
        });
    }

    /// Whether `matmul_i8act` takes the f32 path: F32 by definition,
    /// over-wide per-row formats because a whole row's i32 sum could
    /// overflow (never for real model shapes).
    pub(super) fn i8_via_f32(&self) -> bool {
        let row_format = matches!(self.fmt, QFormat::I8Row | QFormat::I4Row | QFormat::I2Row);
        // MXFP4 always meets f32 activations (see `mxfp4.rs`).
        self.fmt == QFormat::F32
            || self.fmt == QFormat::Mxfp4
            || (row_format && self.cols > MAX_I32_ROW_COLS)
    }

    pub(crate) fn matmul_split(
        &self,
        k: &KernelSet,
        x: &[f32],
        n_seq: usize,
        y: &mut [f32],
        split: Split,
    ) {
        assert_eq!(x.len(), n_seq * self.cols, "matmul: x.len() != n_seq*cols");
        run(k, &Act::F32(x), n_seq, [(self, y), (self, &mut [])], split);
    }

    pub(crate) fn matmul_i8act_split(
        &self,
        k: &KernelSet,
        x: &[f32],
        n_seq: usize,
        y: &mut [f32],
        split: Split,
    ) {
        if self.i8_via_f32() {
            return self.matmul_split(k, x, n_seq, y, split);
        }
        assert_eq!(x.len(), n_seq * self.cols, "matmul: x.len() != n_seq*cols");
        with_act_buf(|a| {
            a.fill_with(k, x, n_seq, self.cols, Layout::of(self.fmt));
            if takes_g64_gemm(k, self, n_seq) {
                a.fill_xt(n_seq);
            }
            run(k, &Act::I8(a), n_seq, [(self, y), (self, &mut [])], split);
        });
    }

    /// Rows `r0 ..` into `out` (`[nr][n_seq]`): weight row outer, positions
    /// inner, so each weight row is read once for all positions.  `row` is
    /// scratch of `cols` f32 for the f32 path (dequantized row).
    pub(super) fn rows_into(
        &self,
        k: &KernelSet,
        act: &Act,
        r0: usize,
        n_seq: usize,
        out: &mut [f32],
        row: &mut [f32],
    ) {
        if let Act::I8(a) = *act {
            return self.rows_i8(k, a, r0, n_seq, out);
        }
        // MXFP4: its own kernels, the rows decoded in registers (no scratch).
        if let (Act::F32(x), QFormat::Mxfp4) = (act, self.fmt) {
            return super::mxfp4::rows_into(k, self, r0, x, n_seq, out);
        }
        let cols = self.cols;
        if let (Act::F32(x), Storage::F32(w)) = (act, &self.data) {
            if n_seq >= F32_QUAD_MIN_POSITIONS {
                return f32_rows_by_quads(k, &w[r0 * cols..], cols, x, n_seq, out);
            }
        }
        for (j, o) in out.chunks_exact_mut(n_seq).enumerate() {
            let r = r0 + j;
            match *act {
                Act::F32(x) => {
                    let w: &[f32] = match &self.data {
                        Storage::F32(v) => &v[r * cols..(r + 1) * cols],
                        Storage::Packed(_) => {
                            let row = &mut row[..cols];
                            pack::dequant_row(
                                self.fmt,
                                self.row_packed(r),
                                self.row_scales(r),
                                row,
                            );
                            row
                        }
                    };
                    for (s, ys) in o.iter_mut().enumerate() {
                        *ys = (k.dot_f32)(w, &x[s * cols..(s + 1) * cols]);
                    }
                }
                Act::I8(_) => unreachable!("handled above"),
            }
        }
    }

    /// The int8-activation part of `rows_into`: rows `r0 ..` into `out`
    /// (`[nr][n_seq]`).  With tile kernels, four rows per call at one
    /// position, or one row at four positions; every output is computed
    /// as by the single kernels (same exact integer sums, same float
    /// operations in [`QMatrix::finish_i8`]).
    fn rows_i8(&self, k: &KernelSet, a: &ActBuf, r0: usize, n_seq: usize, out: &mut [f32]) {
        if let QFormat::Ggml(ty) = self.fmt {
            return self.rows_ggml(k, ty, &a.q8, r0, n_seq, out);
        }
        let nrows = out.len() / n_seq;
        let rb = row_bytes(self.fmt, self.cols);
        let spr = scales_per_row(self.fmt, self.cols);
        let data = match &self.data {
            Storage::Packed(d) => d,
            Storage::F32(_) => unreachable!("F32 uses the f32 path"),
        };
        // Decode streams each row once from memory, so its bytes are asked
        // for ahead of use: inside the four-row tiles, one line per line
        // read, a whole number of tiles (at least `prefetch_bytes`) ahead;
        // in the one-row path, whole rows `ahead` of the one being read.
        let tuning = decode_tuning();
        let decode = n_seq == 1 && tuning.prefetch_bytes > 0;
        let tile_pf = if decode {
            tuning.prefetch_bytes.div_ceil(4 * rb) * 4 * rb
        } else {
            0
        };
        // One tile of `nr` rows from `r` x `np` positions from `s` into
        // `o[j * np + p]` (`nr * np <= 16`); false if `k` has no tile for
        // this format.
        let tile = |r: usize, nr: usize, s: usize, np: usize, o: &mut [f32; 16]| -> bool {
            let w = &data[r * rb..(r + nr) * rb];
            let x = &a.q[s * a.stride..(s + np) * a.stride];
            match self.fmt {
                QFormat::I8Row | QFormat::I4Row | QFormat::I2Row => {
                    let f = match self.fmt {
                        QFormat::I8Row => k.dot_i8_tile,
                        QFormat::I4Row => k.dot_u4_tile,
                        _ => k.dot_i2_tile,
                    };
                    let Some(f) = f else { return false };
                    let mut raw = [0i32; 16];
                    f(
                        w,
                        rb,
                        nr,
                        x,
                        a.stride,
                        np,
                        &a.xs[s..s + np],
                        tile_pf,
                        &mut raw,
                    );
                    for j in 0..nr {
                        for p in 0..np {
                            let v = Raw::Int(raw[j * np + p]);
                            o[j * np + p] = self.finish_i8(a, r + j, s + p, v);
                        }
                    }
                    true
                }
                QFormat::I4G64 | QFormat::I3G64 => {
                    let f = if self.fmt == QFormat::I4G64 {
                        k.row_i4g64_tile
                    } else {
                        k.row_i3g64_tile
                    };
                    let Some(f) = f else { return false };
                    let mut raw = [0f32; 16];
                    let xg = &a.xg[s * a.groups..(s + np) * a.groups];
                    let sc = &self.scales[r * spr..(r + nr) * spr];
                    f(
                        w, rb, nr, x, a.stride, np, xg, a.groups, sc, spr, tile_pf, &mut raw,
                    );
                    for j in 0..nr {
                        for p in 0..np {
                            let v = Raw::Grouped(raw[j * np + p]);
                            o[j * np + p] = self.finish_i8(a, r + j, s + p, v);
                        }
                    }
                    true
                }
                _ => false,
            }
        };
        // Rows as long as the distance or longer go without in the one-row
        // path: the hardware prefetcher follows a long row by itself.
        let ahead = if decode && rb < tuning.prefetch_bytes {
            tuning.prefetch_bytes.div_ceil(rb.max(1))
        } else {
            0
        };
        let prefetch_row = |j: usize| {
            if ahead > 0 && j < nrows {
                let r = r0 + j;
                prefetch(&data[r * rb..(r + 1) * rb], tuning.prefetch_l2);
                prefetch(&self.scales[r * spr..(r + 1) * spr], tuning.prefetch_l2);
            }
        };
        let gemm = k.grouped_gemm(self.fmt);
        if let Some(f) = gemm.filter(|_| n_seq >= 2 && a.xt_stride > 0) {
            // Prefill of a grouped format: every row at every position in one call (its raw
            // grouped sums in `out`, then the same float end as the single kernels).
            f(
                &data[r0 * rb..(r0 + nrows) * rb],
                rb,
                nrows,
                &a.xt[..n_seq * a.xt_stride],
                a.xt_stride,
                n_seq,
                &a.xg[..n_seq * a.groups],
                a.groups,
                &self.scales[r0 * spr..(r0 + nrows) * spr],
                spr,
                out,
            );
            for (j, o) in out.chunks_exact_mut(n_seq).enumerate() {
                for (p, v) in o.iter_mut().enumerate() {
                    *v = self.finish_i8(a, r0 + j, p, Raw::Grouped(*v));
                }
            }
            return;
        }
        let mut done = 0;
        let mut o = [0f32; 16];
        if n_seq == 1 && rb >= tuning.tile_min_row_bytes {
            // Decode: four rows per call share each activation load.
            while done + 4 <= nrows && tile(r0 + done, 4, 0, 1, &mut o) {
                out[done..done + 4].copy_from_slice(&o[..4]);
                done += 4;
            }
        } else if n_seq >= 4 {
            // Prefill: each weight block is unpacked once for four
            // positions and four rows share each activation load (4 x 4
            // tiles; rows left over go one at a time, 1 x 4).
            let rt = 4;
            'rows: while done < nrows {
                let nr = if done + rt <= nrows { rt } else { 1 };
                let mut s = 0;
                while s + 4 <= n_seq {
                    if !tile(r0 + done, nr, s, 4, &mut o) {
                        break 'rows;
                    }
                    for j in 0..nr {
                        let d = (done + j) * n_seq + s;
                        out[d..d + 4].copy_from_slice(&o[j * 4..j * 4 + 4]);
                    }
                    s += 4;
                }
                for j in done..done + nr {
                    for p in s..n_seq {
                        out[j * n_seq + p] = self.single_i8(k, a, r0 + j, p);
                    }
                }
                done += nr;
            }
        }
        (done..done + ahead).for_each(prefetch_row);
        for (j, o) in out.chunks_exact_mut(n_seq).enumerate().skip(done) {
            prefetch_row(j + ahead);
            for (p, ys) in o.iter_mut().enumerate() {
                *ys = self.single_i8(k, a, r0 + j, p);
            }
        }
    }

    /// Output of row `r` at position `s` with the single kernels.
    #[inline]
    fn single_i8(&self, k: &KernelSet, a: &ActBuf, r: usize, s: usize) -> f32 {
        let wb = self.row_packed(r);
        let ws = self.row_scales(r);
        let (xq, xg, _, _) = a.pos(s);
        let raw = match self.fmt {
            QFormat::I8Row => Raw::Int((k.dot_i8)(as_i8(wb), xq)),
            QFormat::I4Row => Raw::Int((k.dot_u4)(wb, xq)),
            QFormat::I2Row => Raw::Int((k.dot_i2)(wb, xq)),
            QFormat::I4G64 => Raw::Grouped((k.row_i4g64)(wb, xq, xg, ws)),
            QFormat::I3G64 => Raw::Grouped((k.row_i3g64)(wb, xq, xg, ws)),
            QFormat::F32 | QFormat::Mxfp4 => unreachable!("F32 and MXFP4 use the f32 path"),
            QFormat::Ggml(_) => unreachable!("ggml blocks take rows_ggml"),
        };
        self.finish_i8(a, r, s, raw)
    }

    /// The float end of one output, shared by the single and tile paths.
    #[inline]
    fn finish_i8(&self, a: &ActBuf, r: usize, s: usize, raw: Raw) -> f32 {
        let sx = a.sx[s];
        match raw {
            Raw::Int(i) => {
                let ws = self.scales[r * scales_per_row(self.fmt, self.cols)];
                // Per-row int4 and int2 kernels sum the unsigned stored fields.
                let i = match self.fmt {
                    QFormat::I4Row => i.wrapping_sub(8i32.wrapping_mul(a.xs[s])),
                    QFormat::I2Row => i.wrapping_sub(2i32.wrapping_mul(a.xs[s])),
                    _ => i,
                };
                i as f32 * (sx * ws)
            }
            Raw::Grouped(f) => f * sx,
        }
    }
}

/// A kernel's result before the activation scale: an exact integer sum
/// (per-row formats) or a grouped row's float sum.
#[derive(Clone, Copy)]
enum Raw {
    Int(i32),
    Grouped(f32),
}

/// Fewest positions for which [`f32_rows_by_quads`] takes an f32 matrix's rows: below it a
/// row's positions are one `dot_f32` each, as before (a decode step's router).
const F32_QUAD_MIN_POSITIONS: usize = 4;

/// Positions a block of [`f32_rows_by_quads`]: sixteen rows of a 2048-wide input (128 KiB)
/// stay in L2 while every quad of weight rows goes through them.
const F32_QUAD_POSITIONS: usize = 16;

/// `out[j][s] = dot_f32(w row j, x row s)` for the rows of `w` (`cols` wide, as many as
/// `out` holds `n_seq` outputs for) and the `n_seq` positions of `x`: a prefill's f32 router
/// (64 experts by 2048 at 512 positions). One row at a time against every position streamed
/// all of `x` (4 MiB) from L3 for each row, and the dots' horizontal sums were one a product;
/// here four rows go through a block of [`F32_QUAD_POSITIONS`] positions together
/// (`dot_f32_gather4`, each loaded vector serving four products, the sums of sixteen shared),
/// the block's inputs read from L2 by every quad. The same bits as one `dot_f32` a product:
/// `dot_f32_gather4` promises them, with each row as its "query" in `dot_f32`'s first operand,
/// as the loop below and the one-row path give it. Rows past the last quad go one at a time.
fn f32_rows_by_quads(
    k: &KernelSet,
    w: &[f32],
    cols: usize,
    x: &[f32],
    n_seq: usize,
    out: &mut [f32],
) {
    // The block's positions as `dot_f32_gather4`'s key indices into it.
    const POSITIONS: [usize; F32_QUAD_POSITIONS] =
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];
    let rows = out.len() / n_seq;
    let quads = rows / 4;
    let row = |j: usize| &w[j * cols..][..cols];
    for s0 in (0..n_seq).step_by(F32_QUAD_POSITIONS) {
        let bn = F32_QUAD_POSITIONS.min(n_seq - s0);
        let (base, keys) = (&x[s0 * cols..], &POSITIONS[..bn]);
        for (q, o) in out[..quads * 4 * n_seq]
            .chunks_exact_mut(4 * n_seq)
            .enumerate()
        {
            let ws = [0, 1, 2, 3].map(|h| row(4 * q + h));
            let mut outs = o.chunks_exact_mut(n_seq).map(|o| &mut o[s0..s0 + bn]);
            let outs = [0; 4].map(|_| outs.next().expect("four rows of outputs"));
            match k.dot_f32_gather4 {
                Some(f) => f(ws, base, cols, keys, outs),
                None => {
                    for (w, o) in ws.into_iter().zip(outs) {
                        for (y, &s) in o.iter_mut().zip(keys) {
                            *y = (k.dot_f32)(w, &base[s * cols..][..cols]);
                        }
                    }
                }
            }
        }
    }
    for (j, o) in out.chunks_exact_mut(n_seq).enumerate().skip(quads * 4) {
        for (s, y) in o.iter_mut().enumerate() {
            *y = (k.dot_f32)(row(j), &x[s * cols..(s + 1) * cols]);
        }
    }
}

/// Whether `m`'s int8-activation product at `n_seq` positions takes one of `k`'s grouped
/// GEMMs, which read the transposed activations ([`ActBuf::fill_xt`]).
fn takes_g64_gemm(k: &KernelSet, m: &QMatrix, n_seq: usize) -> bool {
    n_seq >= 2 && k.grouped_gemm(m.fmt).is_some() && matches!(m.data, Storage::Packed(_))
}

/// Run one or two matrices (same input) into their outputs; the second may
/// have an empty output (single matmul).
fn run(k: &KernelSet, act: &Act, n_seq: usize, parts: [(&QMatrix, &mut [f32]); 2], split: Split) {
    let [(a, ya), (b, yb)] = parts;
    assert_eq!(ya.len(), n_seq * a.rows, "matmul: y.len() != n_seq*rows");
    assert!(
        yb.is_empty() || yb.len() == n_seq * b.rows,
        "matmul: y.len() != n_seq*rows"
    );
    let b_rows = if yb.is_empty() { 0 } else { b.rows };
    if n_seq == 0 || a.rows + b_rows == 0 {
        return;
    }
    if let Act::I8(buf) = *act {
        let mats: &[&QMatrix] = if yb.is_empty() { &[a] } else { &[a, b] };
        if gemm::usable(k, n_seq, mats) {
            return gemm::run(k, buf, n_seq, [(a, ya), (b, yb)], split);
        }
    }
    if n_seq == 1 {
        compute(k, act, 1, a, ya, b, yb, split);
        return;
    }
    // GGUF panels write `y`'s own layout, the threads splitting the positions: no scratch,
    // no transpose.
    if let Act::I8(buf) = act {
        let parts = [(a, &mut *ya), (b, &mut *yb)];
        if super::ggml::panels_by_positions(k, &buf.q8, n_seq, parts, split) {
            return;
        }
    }
    // Row-major [rows][n_seq] so each thread owns whole rows, then
    // scatter to y[s*rows + o].
    let (na, nb) = (a.rows * n_seq, b_rows * n_seq);
    with_tmp_scratch(na + nb, |tmp| {
        let (ta, tb) = tmp.split_at_mut(na);
        compute(k, act, n_seq, a, ta, b, tb, split);
        for (t, y) in [(&*ta, ya), (&*tb, yb)] {
            transpose_into(t, n_seq, y);
        }
    });
}

/// `y[s * rows + o] = t[o * n_seq + s]` (`t` is `[rows][n_seq]`), a block of 16 rows at a
/// time so each position's writes fill whole cache lines and the block's reads stay in L1
/// (element by element, every write landed a row of `y` apart).
pub(super) fn transpose_into(t: &[f32], n_seq: usize, y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was just detected.
        return unsafe { transpose_into_avx2(t, n_seq, y) };
    }
    transpose_into_scalar(t, n_seq, y)
}

fn transpose_into_scalar(t: &[f32], n_seq: usize, y: &mut [f32]) {
    const BLOCK: usize = 16;
    let rows = t.len() / n_seq;
    for (b, tb) in t.chunks(BLOCK * n_seq).enumerate() {
        let o0 = b * BLOCK;
        let nb = tb.len() / n_seq;
        for (s, ys) in y.chunks_exact_mut(rows).enumerate() {
            for (j, v) in ys[o0..o0 + nb].iter_mut().enumerate() {
                *v = tb[j * n_seq + s];
            }
        }
    }
}

/// [`transpose_into`] by 8 x 8 blocks in AVX2 registers (prefill's panels write `[rows][n_seq]`
/// and the element-by-element scatter cost a tenth of a Q4_K prefill): rows and positions past
/// the last whole eight go element by element. Moves values only, so `y` is the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn transpose_into_avx2(t: &[f32], n_seq: usize, y: &mut [f32]) {
    use std::arch::x86_64::*;
    let rows = t.len() / n_seq;
    let (r8, s8) = (rows / 8 * 8, n_seq / 8 * 8);
    for o0 in (0..r8).step_by(8) {
        for s0 in (0..s8).step_by(8) {
            let r: [__m256i; 8] = std::array::from_fn(|j| {
                let v = &t[(o0 + j) * n_seq + s0..][..8];
                // SAFETY: `v` is 8 readable f32 (32 bytes); the load is unaligned.
                unsafe { _mm256_loadu_si256(v.as_ptr() as *const __m256i) }
            });
            // The f32 move as 32-bit words: the same bits.
            let cols = crate::quant::x86::transpose8x8_epi32(r);
            for (k, v) in cols.into_iter().enumerate() {
                let d = &mut y[(s0 + k) * rows + o0..][..8];
                // SAFETY: `d` is 8 writable f32 (32 bytes); the store is unaligned.
                unsafe { _mm256_storeu_si256(d.as_mut_ptr() as *mut __m256i, v) };
            }
        }
        for s in s8..n_seq {
            for j in 0..8 {
                y[s * rows + o0 + j] = t[(o0 + j) * n_seq + s];
            }
        }
    }
    for o in r8..rows {
        for s in 0..n_seq {
            y[s * rows + o] = t[o * n_seq + s];
        }
    }
}

/// Fill `oa` (`[a.rows][n_seq]`) and `ob` (`[b.rows][n_seq]`, possibly
/// empty), splitting rows across threads.  Each output is computed by
/// exactly one call of `rows_into` with the same arithmetic, so the split
/// never changes the result.
#[allow(clippy::too_many_arguments)]
fn compute(
    k: &KernelSet,
    act: &Act,
    n_seq: usize,
    a: &QMatrix,
    oa: &mut [f32],
    b: &QMatrix,
    ob: &mut [f32],
    split: Split,
) {
    let cols = a.cols;
    if cols == 0 {
        oa.fill(0.0);
        ob.fill(0.0);
        return;
    }
    let rows = (oa.len() + ob.len()) / n_seq;
    let work = rows * cols * n_seq;
    let need_row = |m: &QMatrix| matches!(act, Act::F32(_)) && m.fmt != QFormat::F32;
    let row_len = if need_row(a) || need_row(b) { cols } else { 0 };
    let pool = pool_for(n_seq);
    let chunk_rows = match split {
        Split::Single => None,
        Split::Chunks(c) => Some(c.max(1)),
        Split::Auto => {
            let threads = pool_threads(pool);
            if work <= PAR_MIN_WORK || threads <= 1 {
                None
            } else {
                let min_rows = CHUNK_MIN_WORK.div_ceil(cols * n_seq);
                Some(rows.div_ceil(threads * 4).max(min_rows))
            }
        }
    };
    match chunk_rows {
        Some(c) if c < rows && pool == Threading::Spin && decode_tuning().guided => {
            let min = GUIDED_MIN_WORK.div_ceil(cols * n_seq);
            let split = pool::Guided::new(oa.len() + ob.len(), n_seq, pool_threads(pool), min);
            pool::SpinPool::global().for_each_guided2(oa, ob, &split, |s, e0, ch| {
                let m = if s == 0 { a } else { b };
                with_row_scratch(row_len, |row| {
                    m.rows_into(k, act, e0 / n_seq, n_seq, ch, row)
                })
            });
        }
        Some(c) if c < rows && pool == Threading::Spin => {
            pool::SpinPool::global().for_each_chunk_mut2(oa, ob, c * n_seq, |s, ci, ch| {
                let m = if s == 0 { a } else { b };
                with_row_scratch(row_len, |row| m.rows_into(k, act, ci * c, n_seq, ch, row))
            });
        }
        Some(c) if c < rows => {
            let ia = oa
                .par_chunks_mut(c * n_seq)
                .enumerate()
                .map(|(i, ch)| (a, i * c, ch));
            let ib = ob
                .par_chunks_mut(c * n_seq)
                .enumerate()
                .map(|(i, ch)| (b, i * c, ch));
            ia.chain(ib).for_each(|(m, r0, ch)| {
                with_row_scratch(row_len, |row| m.rows_into(k, act, r0, n_seq, ch, row))
            });
        }
        _ => with_row_scratch(row_len, |row| {
            a.rows_into(k, act, 0, n_seq, oa, row);
            b.rows_into(k, act, 0, n_seq, ob, row);
        }),
    }
}

/// Ask the CPU to start loading `v` into L1 (or only L2): a hint, with no
/// effect on results; nothing where the target has no prefetch instruction.
#[inline]
fn prefetch<T>(v: &[T], l2: bool) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
        let p = v.as_ptr() as *const i8;
        for off in (0..std::mem::size_of_val(v)).step_by(64) {
            // SAFETY: `off` is inside `v`; prefetches never fault and
            // change no program state.
            unsafe {
                if l2 {
                    _mm_prefetch::<_MM_HINT_T1>(p.add(off))
                } else {
                    _mm_prefetch::<_MM_HINT_T0>(p.add(off))
                }
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (v, l2);
}

/// Reinterpret packed int8 weights.
#[inline]
pub(super) fn as_i8(b: &[u8]) -> &[i8] {
    // SAFETY: u8 and i8 have the same size and alignment and every bit
    // pattern is valid for both; the lifetime is carried over.
    unsafe { std::slice::from_raw_parts(b.as_ptr() as *const i8, b.len()) }
}

#[cfg(test)]
mod transpose_tests {
    /// The AVX2 transpose moves every value where the element-by-element one does, at row
    /// and position counts around whole 8 x 8 blocks (and NaN payloads and signed zeros
    /// keep their bits).
    #[test]
    fn transpose_into_places_every_value_as_the_scalar_one() {
        for rows in [1, 7, 8, 9, 16, 23, 64, 768] {
            for n_seq in [1, 2, 7, 8, 9, 17, 32, 64] {
                let t: Vec<f32> = (0..rows * n_seq)
                    .map(|i| match i % 5 {
                        0 => -0.0,
                        1 => f32::from_bits(0x7FC0_1234 + i as u32),
                        _ => i as f32 * 0.5 - 3.0,
                    })
                    .collect();
                let mut want = vec![1.0f32; rows * n_seq];
                super::transpose_into_scalar(&t, n_seq, &mut want);
                let mut got = vec![2.0f32; rows * n_seq];
                super::transpose_into(&t, n_seq, &mut got);
                for s in 0..n_seq {
                    for o in 0..rows {
                        let (g, w) = (got[s * rows + o], want[s * rows + o]);
                        assert_eq!(g.to_bits(), w.to_bits(), "{rows}x{n_seq} at {s},{o}");
                        assert_eq!(w.to_bits(), t[o * n_seq + s].to_bits());
                    }
                }
            }
        }
    }
}
