//! int8 activations, quantized once per call and laid out for the kernels.
//!
//! Each position `s` is quantized with `sx = amax/127`,
//! `xq = clamp(rint(x/sx), -127, 127)` (all zero, `sx = 0`, when the amax is
//! zero or not finite), then written in the order the weight format's
//! kernels read ([`Layout`]), zero padded to a multiple of [`ACT_BLOCK`]
//! (twice that for int2).
//! The exact sum of each 64-group of `xq` is kept too: the int4/int3 kernels
//! multiply the unsigned stored fields and subtract `8 * sum` (`4 * sum`).
//!
//! Buffers: a thread-local [`ActBuf`] is taken for the call and put back
//! after it ([`with_act_buf`]), so the decode path does not allocate once
//! the buffers have grown to the largest shape seen.  Taking (instead of
//! borrowing) makes re-entrancy safe: if a rayon worker that is inside a
//! matmul steals another matmul job, the nested call finds an empty buffer
//! and allocates its own, and the bigger one is kept when both are returned.

use std::cell::Cell;

use super::pack::{n_groups, GROUP};
use super::scalar::{split2_index, t3_index};
use super::{KernelSet, QFormat};

/// Activation rows are padded to a multiple of this many elements (one
/// 64-byte block of int4 weights).
pub(crate) const ACT_BLOCK: usize = 128;

/// Order of the int8 activations of one position, chosen by weight format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Element `k` at `k` (int8).
    Natural,
    /// Per 128-element block: 64 even elements then 64 odd ones, so the low
    /// and high nibbles of 64 packed int4 bytes each meet 64 contiguous
    /// activations (int4 per row and g64).
    Split4,
    /// Per 64-group, transposed as 4 x 16: element `4j + f` at `16f + j`, so
    /// 2-bit field `f` of int3 low-plane byte `j` meets it (int3-g64).
    T3,
    /// Per 256-element block, four runs of 64: element `4j + f` at `64f + j`,
    /// so 2-bit field `f` of 64 packed int2 bytes meets 64 contiguous
    /// activations (int2).
    Split2,
    /// llama.cpp's 8-bit blocks for a GGUF type's dot product (`ggml/act.rs`), kept in
    /// [`ActBuf::q8`].
    Ggml(super::ggml::ActKind),
}

impl Layout {
    pub(crate) fn of(fmt: QFormat) -> Layout {
        match fmt {
            QFormat::I4Row | QFormat::I4G64 => Layout::Split4,
            QFormat::I3G64 => Layout::T3,
            QFormat::I2Row => Layout::Split2,
            QFormat::Ggml(t) => Layout::Ggml(
                super::ggml::act_kind(t).expect("a ggml matrix's type is computed as stored"),
            ),
            _ => Layout::Natural,
        }
    }

    /// Rows are zero padded to a multiple of this many elements.
    pub(crate) fn block(self) -> usize {
        match self {
            Layout::Split2 => 2 * ACT_BLOCK,
            _ => ACT_BLOCK,
        }
    }
}

/// Quantized activations of one call (`n_seq` positions).
#[derive(Default)]
pub(crate) struct ActBuf {
    /// `n_seq * stride` int8 values.
    pub q: Vec<i8>,
    /// Per-position scale.
    pub sx: Vec<f32>,
    /// `n_seq * groups` exact sums of each 64-group of `q`.
    pub xg: Vec<i32>,
    /// Per-position sum of all of `q`.
    pub xs: Vec<i32>,
    pub stride: usize,
    pub groups: usize,
    pub layout: Option<Layout>,
    /// Scratch: one position in natural order (non-natural layouts).
    pub nat: Vec<i8>,
    /// The positions again in the order of the grouped GEMM kernels (`KernelSet::gemm_i4g64`
    /// and `gemm_i3g64`: each 1024-byte chunk of 16 groups transposed by dwords, so a lane
    /// meets one group), `xt_stride` bytes a position; built by [`ActBuf::fill_xt`] only for
    /// the calls that take those kernels.
    pub xt: Vec<i8>,
    /// 0 until [`ActBuf::fill_xt`] has run for the current fill.
    pub xt_stride: usize,
    /// The positions as llama.cpp's 8-bit blocks ([`Layout::Ggml`] only).
    pub q8: super::ggml::Q8Act,
}

impl ActBuf {
    /// Quantize `x` (`n_seq * cols`) in `layout` with the portable
    /// kernels, reusing the buffers.
    #[cfg(test)]
    pub(crate) fn fill(&mut self, x: &[f32], n_seq: usize, cols: usize, layout: Layout) {
        self.fill_with(KernelSet::portable(), x, n_seq, cols, layout)
    }

    /// Quantize `x` (`n_seq * cols`) in `layout` with `k`'s `amax` and
    /// `quant_i8` (bit-identical across sets), reusing the buffers.
    pub(crate) fn fill_with(
        &mut self,
        k: &KernelSet,
        x: &[f32],
        n_seq: usize,
        cols: usize,
        layout: Layout,
    ) {
        debug_assert_eq!(x.len(), n_seq * cols);
        if let Layout::Ggml(kind) = layout {
            self.layout = Some(layout);
            self.xt_stride = 0;
            self.q8.fill(kind, x, n_seq, cols);
            return;
        }
        let stride = cols.div_ceil(layout.block()) * layout.block();
        let groups = n_groups(cols);
        self.stride = stride;
        self.groups = groups;
        self.layout = Some(layout);
        self.xt_stride = 0;
        resize(&mut self.q, n_seq * stride, 0);
        resize(&mut self.sx, n_seq, 0.0);
        resize(&mut self.xg, n_seq * groups, 0);
        resize(&mut self.xs, n_seq, 0);
        if layout != Layout::Natural {
            resize(&mut self.nat, cols, 0);
        }
        let (q, xg) = (
            &mut self.q[..n_seq * stride],
            &mut self.xg[..n_seq * groups],
        );
        let (sx, xs) = (&mut self.sx[..n_seq], &mut self.xs[..n_seq]);
        if cols == 0 {
            // Nothing to scale: every position is all zero (an amax of 0).
            sx.fill(0.0);
            xs.fill(0);
            return;
        }
        if n_seq > 1 && n_seq * cols >= PAR_QUANT_ELEMS {
            // A prefill's positions are independent: quantized on every thread, each with its
            // own natural-order scratch, instead of on the caller while the others wait (the
            // second thread idled a sixth of a 1024-position prefill, this among the causes).
            use rayon::prelude::*;
            q.par_chunks_mut(stride)
                .zip(xg.par_chunks_mut(groups))
                .zip(sx.par_iter_mut().zip(xs.par_iter_mut()))
                .enumerate()
                .for_each(|(s, ((q, xg), (sx, xs)))| {
                    NAT.with(|c| {
                        let mut nat = c.take();
                        resize(&mut nat, cols, 0);
                        (*sx, *xs) = quantize_position(
                            k,
                            &x[s * cols..(s + 1) * cols],
                            layout,
                            q,
                            xg,
                            &mut nat,
                        );
                        c.set(nat);
                    })
                });
        } else {
            for (s, ((q, xg), (sx, xs))) in q
                .chunks_mut(stride)
                .zip(xg.chunks_mut(groups))
                .zip(sx.iter_mut().zip(xs.iter_mut()))
                .enumerate()
            {
                let x = &x[s * cols..(s + 1) * cols];
                (*sx, *xs) = quantize_position(k, x, layout, q, xg, &mut self.nat);
            }
        }
    }

    /// Builds [`ActBuf::xt`] from the `n_seq` positions of the current fill (split layout for
    /// int4, int3 layout for int3).
    pub(crate) fn fill_xt(&mut self, n_seq: usize) {
        let transpose = match self.layout {
            Some(Layout::Split4) => transpose_split4,
            Some(Layout::T3) => transpose_t3,
            other => unreachable!("no grouped GEMM reads the {other:?} layout"),
        };
        if self.stride == 0 {
            // No columns: the products are all zero without a kernel.
            return;
        }
        let ts = self.stride.div_ceil(1024) * 1024;
        resize(&mut self.xt, n_seq * ts, 0);
        for (src, dst) in self.q[..n_seq * self.stride]
            .chunks_exact(self.stride)
            .zip(self.xt.chunks_exact_mut(ts))
        {
            transpose(src, dst);
        }
        self.xt_stride = ts;
    }

    /// Position `s`'s activations, group sums, total and scale.
    #[inline]
    pub(crate) fn pos(&self, s: usize) -> (&[i8], &[i32], i32, f32) {
        (
            &self.q[s * self.stride..(s + 1) * self.stride],
            &self.xg[s * self.groups..(s + 1) * self.groups],
            self.xs[s],
            self.sx[s],
        )
    }
}

/// One position of [`ActBuf::xt`] from its split-layout activations `src` (read as zero past
/// `src.len()`; `dst` is `1024 * ceil(src.len() / 1024)` bytes).  In each 1024-byte chunk
/// (16 groups), dword `32 k + 16 h + L` is split-layout dword `32 (L / 2) + 8 (L % 2) + k +
/// 16 h`: the activations that meet dword `k` of group `L`'s packed int4 weights, low nibbles
/// (`h = 0`) then high, so a vector of 16 dwords meets one dword of each of 16 groups.
fn transpose_split4(src: &[i8], dst: &mut [i8]) {
    transpose_chunks(
        src,
        dst,
        |k, h, l| 32 * (l / 2) + 8 * (l % 2) + k + 16 * h,
        |k, h, l| 32 * k + 16 * h + l,
    )
}

/// As [`transpose_split4`] for the int3 layout, where each group is 64 contiguous bytes and a
/// weight group unpacks to 16 dwords in the same order: dword `16 m + L` of a chunk is dword
/// `m` of group `L`.
fn transpose_t3(src: &[i8], dst: &mut [i8]) {
    transpose_chunks(
        src,
        dst,
        |m, h, l| 16 * l + 8 * h + m,
        |m, h, l| 16 * (8 * h + m) + l,
    )
}

/// `dst` dword `to(k, h, l)` of each 1024-byte chunk is `src` dword `from(k, h, l)` of the
/// same chunk, for `k < 8, h < 2, l < 16`; `src` reads as zero past its end.
fn transpose_chunks(
    src: &[i8],
    dst: &mut [i8],
    from: impl Fn(usize, usize, usize) -> usize,
    to: impl Fn(usize, usize, usize) -> usize,
) {
    debug_assert_eq!(dst.len(), src.len().div_ceil(1024) * 1024);
    for (c, out) in dst.chunks_exact_mut(1024).enumerate() {
        for k in 0..8 {
            for h in 0..2 {
                for l in 0..16 {
                    let at = c * 1024 + 4 * from(k, h, l);
                    let word = &mut out[4 * to(k, h, l)..][..4];
                    match src.get(at..at + 4) {
                        Some(v) => word.copy_from_slice(v),
                        None => word.fill(0),
                    }
                }
            }
        }
    }
}

/// Elements at or above which a multi-position fill splits its positions across threads.
const PAR_QUANT_ELEMS: usize = 1 << 15;

/// One position's int8 activations in natural order, exactly as every CPU kernel sees them
/// (the same scale and values, in another order for the packed formats): `q[..x.len()]` gets
/// the values (the rest of `q` zero), and the result is `(scale, sum of the values)`; an
/// all-zero or non-finite position is all zero with scale 0. For compute backends that must
/// match the CPU bit for bit (the GPU tier).
pub fn quantize_natural(x: &[f32], q: &mut [i8]) -> (f32, i32) {
    let mut group_sums = vec![0; n_groups(x.len())];
    quantize_position(
        KernelSet::active(),
        x,
        Layout::Natural,
        q,
        &mut group_sums,
        &mut [],
    )
}

/// One position: `x` quantized into `q` (its `stride` bytes, zeroed first) in `layout`, the
/// group sums into `xg`; returns the scale and the total. `nat` is scratch of at least
/// `x.len()` for the layouts that are not natural.
fn quantize_position(
    k: &KernelSet,
    x: &[f32],
    layout: Layout,
    q: &mut [i8],
    xg: &mut [i32],
    nat: &mut [i8],
) -> (f32, i32) {
    let cols = x.len();
    q.fill(0);
    xg.fill(0);
    let amax = (k.amax)(x);
    let scale = amax / 127.0;
    if !(scale > 0.0 && scale.is_finite()) {
        return (0.0, 0);
    }
    // Natural order first (in place for the natural layout).
    let nat: &[i8] = if layout == Layout::Natural {
        (k.quant_i8)(x, scale, &mut q[..cols]);
        &q[..cols]
    } else {
        let nat = &mut nat[..cols];
        (k.quant_i8)(x, scale, nat);
        match layout {
            Layout::Split4 => {
                for (b, blk) in nat.chunks(ACT_BLOCK).enumerate() {
                    let q = &mut q[b * ACT_BLOCK..(b + 1) * ACT_BLOCK];
                    let (ev, od) = q.split_at_mut(ACT_BLOCK / 2);
                    let mut pairs = blk.chunks_exact(2);
                    for ((e, o), p) in ev.iter_mut().zip(od.iter_mut()).zip(&mut pairs) {
                        *e = p[0];
                        *o = p[1];
                    }
                    if let [last] = pairs.remainder() {
                        ev[blk.len() / 2] = *last;
                    }
                }
            }
            Layout::T3 => {
                for (g, grp) in nat.chunks(GROUP).enumerate() {
                    let q = &mut q[g * GROUP..(g + 1) * GROUP];
                    for (r, &v) in grp.iter().enumerate() {
                        q[t3_index(r)] = v;
                    }
                }
            }
            Layout::Split2 => {
                for (k, &v) in nat.iter().enumerate() {
                    q[split2_index(k)] = v;
                }
            }
            Layout::Natural | Layout::Ggml(_) => unreachable!(),
        }
        nat
    };
    let mut total = 0i32;
    for (sum, grp) in xg.iter_mut().zip(nat.chunks(GROUP)) {
        *sum = grp.iter().map(|&v| v as i32).sum();
        total += *sum;
    }
    (scale, total)
}

/// Grow `v` to at least `n` elements (never shrinks; the slack is reused).
fn resize<T: Copy>(v: &mut Vec<T>, n: usize, fill: T) {
    if v.len() < n {
        v.resize(n, fill);
    }
}

thread_local! {
    static ACT: Cell<ActBuf> = Cell::new(ActBuf::default());
    /// The buffer of a call made inside another's (a head-parallel loop's row products run
    /// inside the prepared rows of a product it started): its own, kept between steps.
    static ACT_NESTED: Cell<ActBuf> = Cell::new(ActBuf::default());
    /// Calls of [`with_act_buf`] open on this thread.
    static ACT_DEPTH: Cell<usize> = const { Cell::new(0) };
    /// A worker's natural-order scratch in a parallel fill.
    static NAT: Cell<Vec<i8>> = const { Cell::new(Vec::new()) };
    static ROW: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    static TMP: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// Run `f` with this thread's activation buffer (taken, then put back): the outermost call
/// takes one, a call inside it another, so one level of nesting reuses its buffer too.
pub(crate) fn with_act_buf<R>(f: impl FnOnce(&mut ActBuf) -> R) -> R {
    let depth = ACT_DEPTH.with(|d| d.replace(d.get() + 1));
    let slot = if depth == 0 { &ACT } else { &ACT_NESTED };
    let mut buf = slot.with(|c| c.take());
    let r = f(&mut buf);
    ACT_DEPTH.with(|d| d.set(depth));
    slot.with(|c| {
        let prev = c.take();
        // A nested call may have put back its own buffer: keep the bigger.
        c.set(if prev.q.capacity() > buf.q.capacity() {
            prev
        } else {
            buf
        });
    });
    r
}

/// Run `f` with `n` f32 of the thread-local `slot` (taken, then put back;
/// same re-entrancy rule as [`with_act_buf`]).
fn with_f32<R>(
    slot: &'static std::thread::LocalKey<Cell<Vec<f32>>>,
    n: usize,
    f: impl FnOnce(&mut [f32]) -> R,
) -> R {
    let mut v = slot.with(|c| c.take());
    resize(&mut v, n, 0.0);
    let r = f(&mut v[..n]);
    slot.with(|c| {
        let prev = c.take();
        c.set(if prev.capacity() > v.capacity() {
            prev
        } else {
            v
        });
    });
    r
}

/// Scratch for one dequantized weight row (f32 path), per worker thread.
pub(crate) fn with_row_scratch<R>(n: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    with_f32(&ROW, n, f)
}

/// Scratch for the `[rows][n_seq]` outputs of a multi-position call.
pub(crate) fn with_tmp_scratch<R>(n: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    with_f32(&TMP, n, f)
}
