//! A [`QMatrix`] over a GGUF tensor's blocks, as stored: building one (its own bytes, or bytes
//! shared with a shard's map) and the int8-activation rows of its products.

use std::sync::Arc;

use rayon::prelude::*;

use super::{act_kind, PanelFn, Q8Act, Q8Row};
use crate::gguf::GgmlType;
use crate::quant::matmul::Split;
use crate::quant::matrix::{PackedBytes, Storage};
use crate::quant::tuning::{pool_for, pool_threads, Threading, PAR_MIN_WORK};
use crate::quant::{pool, KernelSet, QFormat, QMatrix, SharedBytes};

/// Why `len` bytes are not a `[rows, cols]` matrix of `ty` computed as stored.
fn check(ty: GgmlType, rows: usize, cols: usize, len: usize) -> Result<(), String> {
    if act_kind(ty).is_none() {
        return Err(format!(
            "type {} is not one colibri computes as stored (it reads {})",
            ty.name(),
            super::COMPUTED.map(|t| t.name()).join(", ")
        ));
    }
    let be = ty.block_elems();
    if !cols.is_multiple_of(be) {
        return Err(format!(
            "{cols} inputs a row: {} rows are whole blocks of {be}",
            ty.name()
        ));
    }
    let want = rows * (cols / be) * ty.block_bytes();
    if len != want {
        return Err(format!(
            "{len} bytes for a [{rows}, {cols}] {} matrix, which has {want}",
            ty.name()
        ));
    }
    Ok(())
}

/// How many weight rows ahead of the one computed decode asks the cache for: a warm decode
/// streams each weight once from memory, and the request for a row two rows on overlaps its
/// misses with the rows before it.
const PREFETCH_AHEAD: usize = 2;

/// Positions from which prefill takes type `ty`'s rows x positions panel (where its kernel set
/// has one) over its 1 x 4 tile and row dots: below it the panel's unpacking of the weights
/// is not repaid. Measured with `bench_panels` (tests_simd.rs, 1 thread): Q8_0's dot needs
/// no decoding and Q4_1/Q5_1's panel adds a minimum pass, so they cross over between 4
/// (0.86-0.97x) and 8 positions (1.44-1.59x); the other 32-element types win from 3
/// (1.3-1.6x). The K-quants' panels (`bench_k_panels`, 64 rows) lose to the 4-position tile
/// at 4 positions (Q4_K/Q5_K 0.78-0.88x, Q6_K 0.65x) and win from 6 (1.48x, 1.71x, 1.18x);
/// at 5 the tile leaves a row dot, so Q4_K/Q5_K take the panel there. The IQ lattice types
/// have no tile, and their panels (`iqpanel.rs`) beat the row dots from 3 positions (IQ2_XXS
/// 2.1x, IQ2_S 1.5x, IQ3_S 2.0x); IQ4_XS's loses to its tile up to 5 (0.6-0.9x) and wins
/// from 6 (1.1x, 2.4x at 16); Q2_K's (the same panel with a min term) loses to its tile up
/// to 5 (0.5-0.9x), is even at 6 (0.99x) and wins from 8 (1.2-1.4x, 2.3x at 16).
fn panel_min(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q8_0 | GgmlType::Q4_1 | GgmlType::Q5_1 => 6,
        GgmlType::Q4_K | GgmlType::Q5_K => 5,
        GgmlType::Q6_K | GgmlType::IQ4_XS | GgmlType::Q2_K => 6,
        _ => 3,
    }
}

/// Positions a panel call or a run of tiles takes: the positions' rows are made once a chunk,
/// not once a weight row, and a panel unpacks each weight block once a call. 128 quantized
/// positions (128 x cols bytes) stay in L2 across the weight rows; `bench_k_panels` (one
/// thread, 768 x 2048 Q4_K) gave 173 GMAC/s at 64 positions a call, 178 at 128 and 161 at 256
/// (a block's activations of 256 positions, 64 KiB, no longer fit L1).
const CHUNK: usize = 128;

/// Positions a task of a product split by positions starts on a multiple of: the K-quant
/// panels' group (sixteen positions a 512-bit vector; a last partial group costs a whole
/// one), two of the 32-element panels' groups of eight.
const POS_GROUP: usize = 16;

/// Asks the caches for every 64-byte line of `bytes` (a hint: nothing is read or faulted).
#[inline]
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: SSE is in every x86-64 CPU; a prefetch is a hint that never faults, and
        // the address is inside `bytes`.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr() as *const i8) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// The rows after a panel's current group of `rows`, asked for one block step's share at a
/// time: each row is a short stream (a few hundred bytes to a few KiB), too short for the
/// hardware prefetcher, and in a product split by positions every thread streams the whole
/// matrix. Without it the K-quant panels' unpacking waited on the weights (pp512 profile:
/// Q4_K unpacking 610 -> 148 samples, Q6_K 136 -> 53).
#[cfg(target_arch = "x86_64")]
pub(super) struct NextRows<'a> {
    next: &'a [u8],
    share: usize,
}

#[cfg(target_arch = "x86_64")]
impl<'a> NextRows<'a> {
    /// The `rows` rows of `row_bytes` each after row `r0 + rows - 1` of `w`, cut into
    /// `blocks` shares of whole cache lines.
    pub(super) fn new(
        w: &'a [u8],
        row_bytes: usize,
        r0: usize,
        rows: usize,
        blocks: usize,
    ) -> Self {
        let start = ((r0 + rows) * row_bytes).min(w.len());
        let end = ((r0 + 2 * rows) * row_bytes).min(w.len());
        let next = &w[start..end];
        let share = next
            .len()
            .div_ceil(blocks.max(1))
            .next_multiple_of(64)
            .max(64);
        Self { next, share }
    }

    /// Asks the caches for block step `i`'s share (nothing past the matrix's end).
    #[inline]
    pub(super) fn block(&self, i: usize) {
        if let Some(lines) = self.next.chunks(self.share).nth(i) {
            prefetch(lines);
        }
    }
}

impl QMatrix {
    /// A `[rows, cols]` matrix of GGUF type `ty` over its stored bytes (rows of whole
    /// blocks). Refused: a type not computed as stored, a row that is not whole blocks,
    /// a length that does not match.
    pub fn from_ggml(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: Vec<u8>,
    ) -> Result<QMatrix, String> {
        check(ty, rows, cols, data.len())?;
        Ok(QMatrix {
            fmt: QFormat::Ggml(ty),
            rows,
            cols,
            data: Storage::Packed(PackedBytes::Owned(data)),
            scales: Vec::new(),
        })
    }

    /// As [`QMatrix::from_ggml`], over bytes another owner keeps (no copy).
    pub fn from_ggml_shared(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: Arc<dyn SharedBytes>,
    ) -> Result<QMatrix, String> {
        check(ty, rows, cols, data.bytes().len())?;
        Ok(QMatrix {
            fmt: QFormat::Ggml(ty),
            rows,
            cols,
            data: Storage::Packed(PackedBytes::Shared(data)),
            scales: Vec::new(),
        })
    }

    /// Rows `r0 ..` into `out` (`[nr][n_seq]`) against the quantized positions `a`: from
    /// `panel_min` positions the type's rows x positions panel where it has one, else four
    /// positions a call of its tile where it has one, the rest one call of its dot product
    /// each; a panel's and a tile's outputs are the dot's bits, so neither the thread split
    /// nor the number of positions changes any.
    pub(in crate::quant) fn rows_ggml(
        &self,
        k: &KernelSet,
        ty: GgmlType,
        a: &Q8Act,
        r0: usize,
        n_seq: usize,
        out: &mut [f32],
    ) {
        let dot = super::dot_for(k, ty).expect("a ggml matrix's type is computed as stored");
        if n_seq == 1 {
            // Decode: one activation row for every weight row, made once.
            let x = a.row(0);
            let nr = out.len();
            for (j, y) in out.iter_mut().enumerate() {
                if j + PREFETCH_AHEAD < nr {
                    prefetch(self.row_packed(r0 + j + PREFETCH_AHEAD));
                }
                *y = dot(self.row_packed(r0 + j), &x);
            }
            return;
        }
        let tile = super::tile_for(k, ty).filter(|_| n_seq >= 4);
        let panel = super::panel_for(k, ty).filter(|_| n_seq >= panel_min(ty));
        let nr = out.len() / n_seq;
        if nr == 0 {
            return;
        }
        let rb = self.row_packed(r0).len();
        let mut rows = [a.row(0); CHUNK];
        for c0 in (0..n_seq).step_by(CHUNK) {
            let cn = CHUNK.min(n_seq - c0);
            for (p, r) in rows[..cn].iter_mut().enumerate() {
                *r = a.row(c0 + p);
            }
            let rows = &rows[..cn];
            if let Some(panel) = panel {
                let w = match &self.data {
                    Storage::Packed(d) => &d[r0 * rb..(r0 + nr) * rb],
                    Storage::F32(_) => unreachable!("a ggml matrix is packed"),
                };
                panel(w, self.cols, rows, &mut out[c0..], n_seq, 1);
                continue;
            }
            for j in 0..nr {
                // Each weight row streams once for a few positions (an expert with a handful
                // of a prefill's rows, the most of a pp64 forward's experts): the row
                // `PREFETCH_AHEAD` on is asked for, as in decode (`bench_pp64_experts`: 7%
                // less time).
                if c0 == 0 && j + PREFETCH_AHEAD < nr {
                    prefetch(self.row_packed(r0 + j + PREFETCH_AHEAD));
                }
                let w = self.row_packed(r0 + j);
                let o = &mut out[j * n_seq + c0..j * n_seq + c0 + cn];
                let mut s = 0;
                if let Some(tile) = tile {
                    while s + 4 <= cn {
                        let four: &[Q8Row; 4] = rows[s..s + 4].try_into().expect("four rows");
                        o[s..s + 4].copy_from_slice(&tile(w, four));
                        s += 4;
                    }
                }
                for (y, x) in o[s..].iter_mut().zip(&rows[s..]) {
                    *y = dot(w, x);
                }
            }
        }
    }

    /// The panel this matrix's whole product at `n_seq` positions takes with kernel set `k`
    /// (see [`QMatrix::ggml_panel_into`]), `None` where `rows_ggml` would take tiles or dots.
    pub(in crate::quant) fn ggml_panel(&self, k: &KernelSet, n_seq: usize) -> Option<PanelFn> {
        match self.fmt {
            QFormat::Ggml(ty) if self.rows > 0 && n_seq >= panel_min(ty) => super::panel_for(k, ty),
            _ => None,
        }
    }

    /// Positions `s0 .. s0 + n` of the product into `y` as `[n][rows]`, the products' own
    /// layout, by `panel` ([`QMatrix::ggml_panel`]) in chunks of positions as `rows_ggml`: the
    /// panel writes each output in place, with no `[rows][n_seq]` scratch to transpose. Each
    /// output is the panel's and so the dot's bits, whichever positions a call takes: a
    /// product split across threads by positions is the same bits as one on a single thread.
    pub(in crate::quant) fn ggml_panel_into(
        &self,
        panel: PanelFn,
        a: &Q8Act,
        s0: usize,
        n: usize,
        y: &mut [f32],
    ) {
        let w = match &self.data {
            Storage::Packed(d) => &d[..self.rows * self.row_packed(0).len()],
            Storage::F32(_) => unreachable!("a ggml matrix is packed"),
        };
        let mut rows = [a.row(s0); CHUNK];
        for c0 in (0..n).step_by(CHUNK) {
            let cn = CHUNK.min(n - c0);
            for (p, r) in rows[..cn].iter_mut().enumerate() {
                *r = a.row(s0 + c0 + p);
            }
            panel(
                w,
                self.cols,
                &rows[..cn],
                &mut y[c0 * self.rows..],
                1,
                self.rows,
            );
        }
    }
}

impl QMatrix {
    /// The activations this matrix's int8 products are quantized to (`None`: not a GGUF
    /// type computed as stored).
    pub(crate) fn ggml_act(&self) -> Option<super::ActKind> {
        match self.fmt {
            QFormat::Ggml(ty) => act_kind(ty),
            _ => None,
        }
    }

    /// [`QMatrix::matmul_pair_i8act_on_caller`] of rows `picks` of `x`, quantized already to
    /// both matrices' activations ([`QMatrix::ggml_act`]), into `yg`, `yu` (`[picks.len()]
    /// [rows]`), on this thread: the calls that product makes of the same panels on the same
    /// quantized rows (each row is quantized on its own), so the same bits, without gathering
    /// the rows or quantizing them again (a prefill quantized each row once for each expert it
    /// was routed to). False, with nothing written, where that product would not take the
    /// panels (too few positions, another format or activation kind).
    pub(crate) fn pair_panels_picked(
        gate: &QMatrix,
        up: &QMatrix,
        x: &Q8Act,
        picks: &[usize],
        yg: &mut [f32],
        yu: &mut [f32],
    ) -> bool {
        let k = KernelSet::active();
        let n = picks.len();
        let kind = x.kind();
        // One position goes through the single-row kernels, not the panels (`matmul::run`).
        if n < 2 || kind.is_none() || gate.ggml_act() != kind || up.ggml_act() != kind {
            return false;
        }
        if gate.cols != x.cols() || up.cols != x.cols() {
            return false;
        }
        let (Some(pg), Some(pu)) = (gate.ggml_panel(k, n), up.ggml_panel(k, n)) else {
            return false;
        };
        assert!(
            yg.len() == n * gate.rows && yu.len() == n * up.rows,
            "pair_panels_picked: outputs of other shapes"
        );
        for (m, panel, y) in [(gate, pg, yg), (up, pu, yu)] {
            let w = match &m.data {
                Storage::Packed(d) => &d[..m.rows * m.row_packed(0).len()],
                Storage::F32(_) => unreachable!("a ggml matrix is packed"),
            };
            // As `ggml_panel_into`: the positions a panel call at a time.
            let mut rows = [x.row(picks[0]); CHUNK];
            for c0 in (0..n).step_by(CHUNK) {
                let cn = CHUNK.min(n - c0);
                for (r, &s) in rows[..cn].iter_mut().zip(&picks[c0..c0 + cn]) {
                    *r = x.row(s);
                }
                panel(w, m.cols, &rows[..cn], &mut y[c0 * m.rows..], 1, m.rows);
            }
        }
        true
    }
}

/// The product of one or two GGUF matrices with the same positions (`b`'s output empty for
/// one) by their panels, written straight into the products' `[n_seq][rows]` layout, split
/// across the threads by positions: each task takes whole positions, so it owns a contiguous
/// piece of each output, reads every weight row once a chunk of positions (as the row split
/// does: the same weight traffic and unpacking a position) and quantized activations rearranged
/// once for all rows, with no `[rows][n_seq]` scratch to transpose. False, with nothing
/// written, where a matrix has no panel at `n_seq` positions or the positions are too few to
/// give each thread four groups (the caller then splits by rows). Every output is the panel's
/// and so the dot's bits, whatever the split.
pub(in crate::quant) fn panels_by_positions(
    k: &KernelSet,
    x: &Q8Act,
    n_seq: usize,
    [(a, ya), (b, yb)]: [(&QMatrix, &mut [f32]); 2],
    split: Split,
) -> bool {
    let Some(pa) = a.ggml_panel(k, n_seq) else {
        return false;
    };
    let pb = if yb.is_empty() {
        None
    } else {
        match b.ggml_panel(k, n_seq) {
            Some(p) => Some(p),
            None => return false,
        }
    };
    let b_rows = if yb.is_empty() { 0 } else { b.rows };
    let pool = pool_for(n_seq);
    let threads = pool_threads(pool);
    let per_task = match split {
        Split::Single => n_seq,
        Split::Chunks(c) => c.max(1),
        Split::Auto if threads <= 1 || (a.rows + b_rows) * a.cols * n_seq <= PAR_MIN_WORK => n_seq,
        Split::Auto => {
            // Each task unpacks every weight row once: with less than 64 positions a thread
            // that is more unpacking than the row split's (each row once a chunk); with
            // shares from two groups up, a pp512 profile's Q4_K unpacking rose from 6 to 11%.
            let groups = n_seq.div_ceil(POS_GROUP);
            if groups < 4 * threads {
                return false;
            }
            // A thread's share of whole groups in one task (at most a panel chunk): each
            // thread then streams each weight row once for all its positions.
            groups.div_ceil(threads).min(CHUNK / POS_GROUP) * POS_GROUP
        }
    };
    let task = |m: &QMatrix, p: PanelFn, i: usize, y: &mut [f32]| {
        let s0 = i * per_task;
        m.ggml_panel_into(p, x, s0, y.len() / m.rows, y);
    };
    if per_task >= n_seq {
        task(a, pa, 0, ya);
        if let Some(pb) = pb {
            task(b, pb, 0, yb);
        }
        return true;
    }
    match (pool, pb) {
        (Threading::Spin, pb) if pb.is_none() || a.rows == b.rows => {
            pool::SpinPool::global().for_each_chunk_mut2(
                ya,
                yb,
                per_task * a.rows,
                |s, i, y| match (s, pb) {
                    (1, Some(pb)) => task(b, pb, i, y),
                    _ => task(a, pa, i, y),
                },
            );
        }
        (Threading::Spin, _) => return false,
        (_, pb) => {
            let ia = ya
                .par_chunks_mut(per_task * a.rows)
                .enumerate()
                .map(|(i, y)| (a, pa, i, y));
            let ib = yb
                .par_chunks_mut(per_task * b.rows.max(1))
                .enumerate()
                .map(|(i, y)| (b, pb.unwrap_or(pa), i, y));
            ia.chain(ib).for_each(|(m, p, i, y)| task(m, p, i, y));
        }
    }
    true
}
