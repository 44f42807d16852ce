//! The multi-position products (prefill) of the per-row int8 and int4 formats as register-blocked
//! GEMM tiles ([`KernelSet::gemm_i8`], [`KernelSet::gemm_u4`]): up to 4 weight rows x 4
//! positions per kernel call, each weight block unpacked once per tile, the outputs finished in
//! the kernel and written straight to `y[s * rows + o]` (no `[rows][n_seq]` scratch and no
//! transpose after the parallel region).  The rows are split across the rayon pool in tiles of
//! whole weight rows, so every output is computed by exactly one kernel call, with the same
//! arithmetic wherever it lands: the split never changes a bit, and the kernels give the
//! portable kernel's bits (exact integer sums, then `QMatrix::finish_i8`'s two float operations).

use rayon::prelude::*;

use super::act::ActBuf;
use super::kernel_set::GemmFn;
use super::matmul::Split;
use super::matrix::Storage;
use super::pack::row_bytes;
use super::tuning::{pool_for, Threading, CHUNK_MIN_WORK, PAR_MIN_WORK};
use super::{KernelSet, QFormat, QMatrix};

/// Weight rows and positions of the largest tile.
const TILE: usize = 4;

/// The GEMM tile of `m`'s format in `k`, where `m` is packed in a per-row format that has one.
fn kernel(k: &KernelSet, m: &QMatrix) -> Option<GemmFn> {
    if !matches!(m.data, Storage::Packed(_)) {
        return None;
    }
    match m.fmt {
        QFormat::I8Row => k.gemm_i8,
        QFormat::I4Row => k.gemm_u4,
        _ => None,
    }
}

/// Whether [`run`] takes the int8-activation products of `mats` at `n_seq` positions: more than
/// one position, every matrix in a format `k` has a tile for, and the rayon pool in use (the
/// spin pool keeps the row-chunk path it was tuned with).
pub(super) fn usable(k: &KernelSet, n_seq: usize, mats: &[&QMatrix]) -> bool {
    n_seq >= 2
        && pool_for(n_seq) == Threading::Rayon
        && mats
            .iter()
            .all(|m| kernel(k, m).is_some() && !m.i8_via_f32())
}

/// `y[s * rows + o]` of one matrix, written by several tasks at once.
struct Out {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: `Out` is only a way for the tasks of one parallel region to write disjoint elements of
// a `&mut [f32]` that outlives the region: each task owns a distinct range of weight rows `o`
// and writes only `y[s * rows + o]` for its own rows (see `tile_rows`), so no element is written
// twice or read while written.
unsafe impl Sync for Out {}

impl Out {
    fn new(y: &mut [f32]) -> Out {
        Out {
            ptr: y.as_mut_ptr(),
            len: y.len(),
        }
    }

    #[inline]
    fn set(&self, i: usize, v: f32) {
        assert!(i < self.len, "gemm output index out of range");
        // SAFETY: in bounds (asserted); the element belongs to the calling task alone (see the
        // `Sync` impl), and the slice outlives the region that holds `self`.
        unsafe { *self.ptr.add(i) = v }
    }
}

/// `y = W x` of one or two matrices (`parts`, the second's output possibly empty) at `n_seq`
/// positions, with the activations quantized in `a`.  Callers check [`usable`] first.
pub(super) fn run(
    k: &KernelSet,
    a: &ActBuf,
    n_seq: usize,
    parts: [(&QMatrix, &mut [f32]); 2],
    split: Split,
) {
    let [(ma, ya), (mb, yb)] = parts;
    let b_rows = if yb.is_empty() { 0 } else { mb.rows };
    let rows = ma.rows + b_rows;
    let cols = ma.cols;
    if cols == 0 {
        ya.fill(0.0);
        yb.fill(0.0);
        return;
    }
    let threads = rayon::current_num_threads();
    let chunk = match split {
        Split::Single => None,
        Split::Chunks(c) => Some(c.max(1)),
        Split::Auto if rows * cols * n_seq <= PAR_MIN_WORK || threads <= 1 => None,
        Split::Auto => {
            let min_rows = CHUNK_MIN_WORK.div_ceil(cols * n_seq);
            // Whole tiles a task, so only a matrix's last task has a short one.
            Some(
                rows.div_ceil(threads * 4)
                    .max(min_rows)
                    .next_multiple_of(TILE),
            )
        }
    };
    let outs = [Out::new(ya), Out::new(yb)];
    let mats = [(ma, ma.rows), (mb, b_rows)];
    let Some(c) = chunk else {
        for ((m, nr), out) in mats.iter().zip(&outs) {
            tile_rows(k, a, m, n_seq, 0, *nr, out);
        }
        return;
    };
    let ta = ma.rows.div_ceil(c);
    let tasks = ta + b_rows.div_ceil(c);
    let task = |t: usize| {
        let (i, t) = if t < ta { (0, t) } else { (1, t - ta) };
        let (m, nr) = mats[i];
        tile_rows(k, a, m, n_seq, t * c, ((t + 1) * c).min(nr), &outs[i]);
    };
    if tasks <= 1 {
        (0..tasks).for_each(task);
    } else {
        (0..tasks).into_par_iter().for_each(task);
    }
}

/// Rows `r0..r1` of `m` at every position into `out` (`y[s * m.rows + o]`): row tiles of 4
/// (the last may be shorter) outer, position tiles of 4 inner, so a tile's weight rows are
/// read from memory once and from L1 for every later group of positions.  The first position
/// group asks for the next row tile's lines ahead of use.
fn tile_rows(
    k: &KernelSet,
    a: &ActBuf,
    m: &QMatrix,
    n_seq: usize,
    r0: usize,
    r1: usize,
    out: &Out,
) {
    let Some(f) = kernel(k, m) else {
        unreachable!("gemm::run is only called where `usable` holds")
    };
    let Storage::Packed(data) = &m.data else {
        unreachable!("checked by `kernel`")
    };
    let rb = row_bytes(m.fmt, m.cols);
    let mut o = [0f32; TILE * TILE];
    let mut r = r0;
    while r < r1 {
        let nr = (r1 - r).min(TILE);
        let w = &data[r * rb..(r + nr) * rb];
        let ws = &m.scales[r..r + nr];
        let mut s = 0;
        while s < n_seq {
            let np = (n_seq - s).min(TILE);
            let pf = if s == 0 && r + nr < r1 { nr * rb } else { 0 };
            let x = &a.q[s * a.stride..(s + np) * a.stride];
            f(
                w,
                rb,
                nr,
                x,
                a.stride,
                np,
                &a.xs[s..s + np],
                &a.sx[s..s + np],
                ws,
                pf,
                &mut o,
            );
            for p in 0..np {
                let at = (s + p) * m.rows + r;
                for j in 0..nr {
                    out.set(at + j, o[p * nr + j]);
                }
            }
            s += np;
        }
        r += nr;
    }
}
