//! Quantized weight matrices and their matmul kernels.
//!
//! A [`QMatrix`] holds a `[rows, cols]` weight (PyTorch `Linear` layout,
//! `y = W x`, one row per output) in one of the [`QFormat`]s.  The packed
//! byte layouts match upstream's pre-quantized containers (see
//! `pack.rs`).  Two products are offered:
//!
//! * [`QMatrix::matmul`]: f32 activations, the weight row is dequantized on
//!   the fly and products are accumulated in f32 (the exact path);
//! * [`QMatrix::matmul_i8act`]: activations quantized to int8 per sequence
//!   position, exact integer dot products per row (or per 64-group), then
//!   scaled (the fast decode path).
//!
//! Kernels come as a [`KernelSet`] of function pointers chosen once at run
//! time (AVX2+FMA on x86-64 when available, else portable scalar).  Integer
//! kernels only return exact i32 sums; all float scaling happens here, in
//! one place, so the AVX2 and portable results are bit-identical.

mod pack;
mod scalar;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_matmul;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use rayon::prelude::*;

use pack::{n_groups, row_bytes, scales_per_row, GROUP};

/// Storage format of a weight matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QFormat {
    /// Plain f32.
    F32,
    /// int8, one scale per row.
    I8Row,
    /// int4, one scale per row.
    I4Row,
    /// int2, one scale per row.
    I2Row,
    /// int4, one scale per 64 inputs.
    I4G64,
    /// int3, one scale per 64 inputs (24 bytes per group).
    I3G64,
}

impl QFormat {
    /// All formats, for iteration in tools and tests.
    pub const ALL: [QFormat; 6] = [
        QFormat::F32,
        QFormat::I8Row,
        QFormat::I4Row,
        QFormat::I2Row,
        QFormat::I4G64,
        QFormat::I3G64,
    ];

    /// From CLI bits: 16 -> F32, 8 -> I8Row, 4 -> I4G64 (group_size 64) or
    /// I4Row (group_size 0), 3 -> I3G64 (group_size must be 64), 2 -> I2Row.
    /// For 16, 8 and 2 the group size must still be 0 or 64 and is ignored.
    pub fn from_bits(bits: u32, group_size: u32) -> Result<QFormat, QuantError> {
        let bad = QuantError::BadBits { bits, group_size };
        if group_size != 0 && group_size != 64 {
            return Err(bad);
        }
        match (bits, group_size) {
            (16, _) => Ok(QFormat::F32),
            (8, _) => Ok(QFormat::I8Row),
            (4, 0) => Ok(QFormat::I4Row),
            (4, _) => Ok(QFormat::I4G64),
            (3, 64) => Ok(QFormat::I3G64),
            (2, _) => Ok(QFormat::I2Row),
            _ => Err(bad),
        }
    }

    /// Short name: "f32", "int8", "int4", "int2", "int4-g64", "int3-g64".
    pub fn name(self) -> &'static str {
        match self {
            QFormat::F32 => "f32",
            QFormat::I8Row => "int8",
            QFormat::I4Row => "int4",
            QFormat::I2Row => "int2",
            QFormat::I4G64 => "int4-g64",
            QFormat::I3G64 => "int3-g64",
        }
    }

    /// Bits per stored weight value (F32: 32; scales not counted).
    pub fn bits(self) -> u32 {
        match self {
            QFormat::F32 => 32,
            QFormat::I8Row => 8,
            QFormat::I4Row | QFormat::I4G64 => 4,
            QFormat::I3G64 => 3,
            QFormat::I2Row => 2,
        }
    }

    /// Inputs per scale group: 64 for the grouped formats, 0 for per-row
    /// (and F32).
    pub fn group_size(self) -> u32 {
        match self {
            QFormat::I4G64 | QFormat::I3G64 => GROUP as u32,
            _ => 0,
        }
    }

    /// Packed data bytes of a `[rows, cols]` matrix in this format.
    pub fn data_len(self, rows: usize, cols: usize) -> usize {
        rows * row_bytes(self, cols)
    }

    /// Number of f32 scales of a `[rows, cols]` matrix in this format.
    pub fn scales_len(self, rows: usize, cols: usize) -> usize {
        rows * scales_per_row(self, cols)
    }
}

impl fmt::Display for QFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Errors from format selection and container parsing.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuantError {
    #[error(
        "unsupported quantization bits={bits} group_size={group_size}: allowed bits are \
         16 (f32), 8 (int8 per row), 4 (int4; group size 0 = per row, 64 = per 64 inputs), \
         3 (int3, group size must be 64), 2 (int2 per row); allowed group sizes are 0 and 64"
    )]
    BadBits { bits: u32, group_size: u32 },
    #[error(
        "cannot infer the quantized layout of a [{rows} x {cols}] matrix from {data_len} data \
         bytes and {scales_len} scales; expected (data bytes, scales) to be one of: {}",
        layouts(*rows, *cols)
    )]
    UnknownLayout {
        rows: usize,
        cols: usize,
        data_len: usize,
        scales_len: usize,
    },
    #[error(
        "length mismatch for a {fmt} matrix: expected {expected_data} data bytes and \
         {expected_scales} scales, got {got_data} data bytes and {got_scales} scales"
    )]
    LengthMismatch {
        fmt: QFormat,
        expected_data: usize,
        got_data: usize,
        expected_scales: usize,
        got_scales: usize,
    },
}

/// The accepted (data bytes, scales) pairs of a `[rows, cols]` matrix, for
/// error messages.
fn layouts(rows: usize, cols: usize) -> String {
    QFormat::ALL[1..]
        .iter()
        .map(|f| {
            format!(
                "{} ({}, {})",
                f,
                f.data_len(rows, cols),
                f.scales_len(rows, cols)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

// ---------------------------------------------------------------------------
// Kernel selection
// ---------------------------------------------------------------------------

/// One set of inner kernels.  Integer kernels return exact i32 sums; the
/// callers do all float scaling.  Activation slices are int8 in
/// `[-127, 127]`, zero padded to a multiple of 64 elements.
#[derive(Clone, Copy)]
pub struct KernelSet {
    name: &'static str,
    /// f32 dot over `min(a.len(), b.len())` elements.
    dot_f32: fn(&[f32], &[f32]) -> f32,
    /// int8 x int8 over `w.len()` elements.
    dot_i8: fn(&[i8], &[i8]) -> i32,
    /// packed int4 row (`nb` bytes) x int8 (`2 nb` elements).
    dot_i4: fn(&[u8], &[i8]) -> i32,
    /// packed int2 row (`nb` bytes) x int8 (`4 nb` elements).
    dot_i2: fn(&[u8], &[i8]) -> i32,
    /// packed int4-g64 row x int8 -> one i32 per group.
    dot_i4g64: fn(&[u8], &[i8], &mut [i32]),
    /// packed int3-g64 row x int8 -> one i32 per group.
    dot_i3g64: fn(&[u8], &[i8], &mut [i32]),
}

static PORTABLE: KernelSet = KernelSet {
    name: "portable",
    dot_f32: scalar::dot_f32,
    dot_i8: scalar::dot_i8,
    dot_i4: scalar::dot_i4,
    dot_i2: scalar::dot_i2,
    dot_i4g64: scalar::dot_i4g64,
    dot_i3g64: scalar::dot_i3g64,
};

static DETECTED: OnceLock<KernelSet> = OnceLock::new();
static FORCE_PORTABLE: AtomicBool = AtomicBool::new(false);

impl KernelSet {
    /// The portable scalar kernels (always available; the reference).
    pub fn portable() -> &'static KernelSet {
        &PORTABLE
    }

    /// The AVX2+FMA kernels, if this CPU supports them.
    pub fn avx2() -> Option<&'static KernelSet> {
        #[cfg(target_arch = "x86_64")]
        {
            static AVX2: OnceLock<Option<KernelSet>> = OnceLock::new();
            AVX2.get_or_init(x86::avx2_kernels).as_ref()
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            None
        }
    }

    /// The best kernels for this CPU (detected once).
    pub fn detected() -> &'static KernelSet {
        DETECTED.get_or_init(|| KernelSet::avx2().copied().unwrap_or(PORTABLE))
    }

    /// The kernels [`QMatrix::matmul`] uses now: [`KernelSet::detected`]
    /// unless [`set_force_portable`] is on.
    pub fn active() -> &'static KernelSet {
        if FORCE_PORTABLE.load(Ordering::Relaxed) {
            &PORTABLE
        } else {
            KernelSet::detected()
        }
    }

    /// "avx2" or "portable".
    pub fn name(&self) -> &'static str {
        self.name
    }
}

impl fmt::Debug for KernelSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KernelSet({})", self.name)
    }
}

/// Name of the kernels in use ("avx2" or "portable").
pub fn kernel_name() -> &'static str {
    KernelSet::active().name
}

/// Force the portable kernels for all later matmuls (e.g. a CLI switch or
/// a debugging aid).  Tests should prefer the `*_with` methods.
pub fn set_force_portable(on: bool) {
    FORCE_PORTABLE.store(on, Ordering::Relaxed);
}

// ---------------------------------------------------------------------------
// QMatrix
// ---------------------------------------------------------------------------

#[derive(Clone)]
enum Storage {
    F32(Vec<f32>),
    Packed(Vec<u8>),
}

/// A weight matrix `[rows, cols]` in some [`QFormat`].
#[derive(Clone)]
pub struct QMatrix {
    fmt: QFormat,
    rows: usize,
    cols: usize,
    data: Storage,
    scales: Vec<f32>,
}

impl fmt::Debug for QMatrix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QMatrix")
            .field("fmt", &self.fmt)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("resident_bytes", &self.resident_bytes())
            .finish()
    }
}

/// Widest row whose int8 x int8 sum is exact in i32: 128 * 127 * 2^17 <
/// 2^31.  Per-row formats wider than this take the f32 path in
/// `matmul_i8act` (grouped formats sum at most 64 products per i32).
const MAX_I32_ROW_COLS: usize = 1 << 17;

/// Below this many multiply-adds a matmul runs on the calling thread.
const PAR_MIN_WORK: usize = 1 << 16;
/// Minimum multiply-adds per parallel chunk.
const CHUNK_MIN_WORK: usize = 1 << 14;

/// How to split rows across threads (tests pin it; callers use `Auto`).
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) enum Split {
    Auto,
    Single,
    Chunks(usize),
}

/// Activations of one call.
enum Act<'a> {
    F32(&'a [f32]),
    I8 {
        /// `n_seq * stride` int8 values, zero padded per position.
        q: &'a [i8],
        stride: usize,
        /// per-position scale.
        sx: &'a [f32],
    },
}

/// Per-thread scratch, allocated once per call (or per rayon job).
struct Scratch {
    row: Vec<f32>,
    groups: Vec<i32>,
}

impl QMatrix {
    /// An F32 matrix.  Panics if `w.len() != rows * cols` (a caller bug).
    pub fn from_f32(w: Vec<f32>, rows: usize, cols: usize) -> QMatrix {
        assert_eq!(w.len(), rows * cols, "QMatrix::from_f32: len != rows*cols");
        QMatrix {
            fmt: QFormat::F32,
            rows,
            cols,
            data: Storage::F32(w),
            scales: Vec::new(),
        }
    }

    /// Quantize `w` (`rows * cols`, row major) to `fmt` (F32 copies).
    /// Panics if `w.len() != rows * cols`.
    pub fn quantize(w: &[f32], rows: usize, cols: usize, fmt: QFormat) -> QMatrix {
        assert_eq!(w.len(), rows * cols, "QMatrix::quantize: len != rows*cols");
        if fmt == QFormat::F32 {
            return QMatrix::from_f32(w.to_vec(), rows, cols);
        }
        let rb = row_bytes(fmt, cols);
        let spr = scales_per_row(fmt, cols);
        let mut data = vec![0u8; rows * rb];
        let mut scales = vec![0f32; rows * spr];
        if rows > 0 && cols > 0 {
            let job = |(r, (d, s)): (usize, (&mut [u8], &mut [f32]))| {
                pack::quantize_row(fmt, &w[r * cols..(r + 1) * cols], d, s);
            };
            if rows * cols >= PAR_MIN_WORK {
                data.par_chunks_mut(rb)
                    .zip(scales.par_chunks_mut(spr))
                    .enumerate()
                    .for_each(job);
            } else {
                data.chunks_mut(rb)
                    .zip(scales.chunks_mut(spr))
                    .enumerate()
                    .for_each(job);
            }
        }
        QMatrix {
            fmt,
            rows,
            cols,
            data: Storage::Packed(data),
            scales,
        }
    }

    /// A pre-quantized container tensor (U8 blob + f32 scales), the format
    /// inferred from the lengths.  Where two formats give the same lengths
    /// (only for `cols` in {1, 2, 24, 47, 48, 95, 96, 143, 144}, or int4 with
    /// a single group) the first match in the order int8, int4 (per row),
    /// int4-g64, int3-g64, int2 wins.  For a single group per row int4 and
    /// int4-g64 decode identically; int4 (per row) is picked.
    pub fn from_packed(
        rows: usize,
        cols: usize,
        data: Vec<u8>,
        scales: Vec<f32>,
    ) -> Result<QMatrix, QuantError> {
        const ORDER: [QFormat; 5] = [
            QFormat::I8Row,
            QFormat::I4Row,
            QFormat::I4G64,
            QFormat::I3G64,
            QFormat::I2Row,
        ];
        let found = ORDER.iter().copied().find(|f| {
            f.data_len(rows, cols) == data.len() && f.scales_len(rows, cols) == scales.len()
        });
        match found {
            Some(fmt) => QMatrix::from_parts(fmt, rows, cols, data, scales),
            None => Err(QuantError::UnknownLayout {
                rows,
                cols,
                data_len: data.len(),
                scales_len: scales.len(),
            }),
        }
    }

    /// A matrix from its parts in a known format (lengths checked).  For
    /// F32, `data` is the little-endian f32 bytes and `scales` is empty.
    pub fn from_parts(
        fmt: QFormat,
        rows: usize,
        cols: usize,
        data: Vec<u8>,
        scales: Vec<f32>,
    ) -> Result<QMatrix, QuantError> {
        let expected_data = fmt.data_len(rows, cols);
        let expected_scales = fmt.scales_len(rows, cols);
        if data.len() != expected_data || scales.len() != expected_scales {
            return Err(QuantError::LengthMismatch {
                fmt,
                expected_data,
                got_data: data.len(),
                expected_scales,
                got_scales: scales.len(),
            });
        }
        let data = match fmt {
            QFormat::F32 => Storage::F32(
                data.chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            ),
            _ => Storage::Packed(data),
        };
        Ok(QMatrix {
            fmt,
            rows,
            cols,
            data,
            scales,
        })
    }

    pub fn format(&self) -> QFormat {
        self.fmt
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held in memory: packed data plus scales.
    pub fn resident_bytes(&self) -> usize {
        self.data().len() + self.scales.len() * 4
    }

    /// Packed bytes (F32: the f32 values as native-endian bytes).
    pub fn data(&self) -> &[u8] {
        match &self.data {
            Storage::Packed(d) => d,
            // SAFETY: a `[f32]` is `len * 4` initialized bytes at an address
            // aligned for f32 (u8 needs no alignment); every byte pattern is
            // a valid u8 and the borrow keeps the Vec alive and unmodified.
            Storage::F32(v) => unsafe {
                std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * 4)
            },
        }
    }

    /// f32 scales (empty for F32).
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// The full matrix as f32 (`rows * cols`), each value `q * scale`.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        if self.cols > 0 {
            for (r, o) in out.chunks_mut(self.cols).enumerate() {
                self.dequant_row(r, o);
            }
        }
        out
    }

    /// One row as f32 into `out` (len = cols), e.g. an embedding lookup.
    pub fn dequant_row(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows, "row {r} out of range ({} rows)", self.rows);
        assert_eq!(out.len(), self.cols, "dequant_row: out.len() != cols");
        match &self.data {
            Storage::F32(v) => out.copy_from_slice(&v[r * self.cols..(r + 1) * self.cols]),
            Storage::Packed(_) => {
                pack::dequant_row(self.fmt, self.row_packed(r), self.row_scales(r), out)
            }
        }
    }

    #[inline]
    fn row_packed(&self, r: usize) -> &[u8] {
        let rb = row_bytes(self.fmt, self.cols);
        match &self.data {
            Storage::Packed(d) => &d[r * rb..(r + 1) * rb],
            Storage::F32(_) => unreachable!(),
        }
    }

    #[inline]
    fn row_scales(&self, r: usize) -> &[f32] {
        let n = scales_per_row(self.fmt, self.cols);
        &self.scales[r * n..(r + 1) * n]
    }

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
    /// (or non-finite in amax) gets `sx = 0` and contributes 0.
    pub fn matmul_i8act(&self, x: &[f32], n_seq: usize, y: &mut [f32]) {
        self.matmul_i8act_with(KernelSet::active(), x, n_seq, y)
    }

    /// [`QMatrix::matmul_i8act`] with an explicit kernel set.
    pub fn matmul_i8act_with(&self, k: &KernelSet, x: &[f32], n_seq: usize, y: &mut [f32]) {
        self.matmul_i8act_split(k, x, n_seq, y, Split::Auto)
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
        self.run(k, &Act::F32(x), n_seq, y, split);
    }

    pub(crate) fn matmul_i8act_split(
        &self,
        k: &KernelSet,
        x: &[f32],
        n_seq: usize,
        y: &mut [f32],
        split: Split,
    ) {
        let row_format = matches!(self.fmt, QFormat::I8Row | QFormat::I4Row | QFormat::I2Row);
        if self.fmt == QFormat::F32 || (row_format && self.cols > MAX_I32_ROW_COLS) {
            // F32 by definition; over-wide per-row formats because a whole
            // row's i32 sum could overflow (never for real model shapes).
            return self.matmul_split(k, x, n_seq, y, split);
        }
        assert_eq!(x.len(), n_seq * self.cols, "matmul: x.len() != n_seq*cols");
        let (q, stride, sx) = quantize_act(x, n_seq, self.cols);
        let act = Act::I8 {
            q: &q,
            stride,
            sx: &sx,
        };
        self.run(k, &act, n_seq, y, split);
    }

    fn run(&self, k: &KernelSet, act: &Act, n_seq: usize, y: &mut [f32], split: Split) {
        assert_eq!(y.len(), n_seq * self.rows, "matmul: y.len() != n_seq*rows");
        if self.rows == 0 || n_seq == 0 {
            return;
        }
        if self.cols == 0 {
            y.fill(0.0);
            return;
        }
        if n_seq == 1 {
            self.compute(k, act, 1, y, split);
        } else {
            // Row-major [rows][n_seq] so each thread owns whole rows, then
            // scatter to y[s*rows + o].
            let mut tmp = vec![0f32; self.rows * n_seq];
            self.compute(k, act, n_seq, &mut tmp, split);
            for (o, t) in tmp.chunks_exact(n_seq).enumerate() {
                for (s, &v) in t.iter().enumerate() {
                    y[s * self.rows + o] = v;
                }
            }
        }
    }

    /// Fill `out` (`[rows][n_seq]`), splitting rows across threads.  Each
    /// output is computed by exactly one call of `rows_into` with the same
    /// arithmetic, so the split never changes the result.
    fn compute(&self, k: &KernelSet, act: &Act, n_seq: usize, out: &mut [f32], split: Split) {
        let work = self.rows * self.cols * n_seq;
        let chunk_rows = match split {
            Split::Single => None,
            Split::Chunks(c) => Some(c.max(1)),
            Split::Auto => {
                let threads = rayon::current_num_threads();
                if work <= PAR_MIN_WORK || threads <= 1 {
                    None
                } else {
                    let min_rows = CHUNK_MIN_WORK.div_ceil(self.cols * n_seq);
                    Some(self.rows.div_ceil(threads * 4).max(min_rows))
                }
            }
        };
        match chunk_rows {
            Some(c) if c < self.rows => {
                out.par_chunks_mut(c * n_seq).enumerate().for_each_init(
                    || self.scratch(act),
                    |sc, (ci, chunk)| self.rows_into(k, act, ci * c, n_seq, chunk, sc),
                );
            }
            _ => {
                let mut sc = self.scratch(act);
                self.rows_into(k, act, 0, n_seq, out, &mut sc);
            }
        }
    }

    fn scratch(&self, act: &Act) -> Scratch {
        let need_row = matches!(act, Act::F32(_)) && self.fmt != QFormat::F32;
        Scratch {
            row: vec![0f32; if need_row { self.cols } else { 0 }],
            groups: vec![0i32; n_groups(self.cols)],
        }
    }

    /// Rows `r0 ..` into `out` (`[nr][n_seq]`): weight row outer, positions
    /// inner, so each weight row is read once for all positions.
    fn rows_into(
        &self,
        k: &KernelSet,
        act: &Act,
        r0: usize,
        n_seq: usize,
        out: &mut [f32],
        sc: &mut Scratch,
    ) {
        let cols = self.cols;
        for (j, o) in out.chunks_exact_mut(n_seq).enumerate() {
            let r = r0 + j;
            match *act {
                Act::F32(x) => {
                    let w: &[f32] = match &self.data {
                        Storage::F32(v) => &v[r * cols..(r + 1) * cols],
                        Storage::Packed(_) => {
                            pack::dequant_row(
                                self.fmt,
                                self.row_packed(r),
                                self.row_scales(r),
                                &mut sc.row,
                            );
                            &sc.row
                        }
                    };
                    for (s, ys) in o.iter_mut().enumerate() {
                        *ys = (k.dot_f32)(w, &x[s * cols..(s + 1) * cols]);
                    }
                }
                Act::I8 { q, stride, sx } => {
                    let wb = self.row_packed(r);
                    let ws = self.row_scales(r);
                    for (s, ys) in o.iter_mut().enumerate() {
                        let xq = &q[s * stride..(s + 1) * stride];
                        *ys = match self.fmt {
                            QFormat::I8Row => (k.dot_i8)(as_i8(wb), xq) as f32 * (sx[s] * ws[0]),
                            QFormat::I4Row => (k.dot_i4)(wb, xq) as f32 * (sx[s] * ws[0]),
                            QFormat::I2Row => (k.dot_i2)(wb, xq) as f32 * (sx[s] * ws[0]),
                            QFormat::I4G64 | QFormat::I3G64 => {
                                if self.fmt == QFormat::I4G64 {
                                    (k.dot_i4g64)(wb, xq, &mut sc.groups);
                                } else {
                                    (k.dot_i3g64)(wb, xq, &mut sc.groups);
                                }
                                let mut acc = 0f32;
                                for (&g, &s_w) in sc.groups.iter().zip(ws) {
                                    acc += g as f32 * s_w;
                                }
                                acc * sx[s]
                            }
                            QFormat::F32 => unreachable!("F32 uses the f32 path"),
                        };
                    }
                }
            }
        }
    }
}

/// Reinterpret packed int8 weights.
#[inline]
fn as_i8(b: &[u8]) -> &[i8] {
    // SAFETY: u8 and i8 have the same size and alignment and every bit
    // pattern is valid for both; the lifetime is carried over.
    unsafe { std::slice::from_raw_parts(b.as_ptr() as *const i8, b.len()) }
}

/// Quantize activations to int8 per position: `sx = amax/127`,
/// `xq = clamp(rint(x/sx), -127, 127)` (all zero, `sx = 0`, for an all-zero
/// position).  Rows are zero padded to a multiple of 64 (`stride`) so the
/// kernels can run over whole packed bytes and groups.
fn quantize_act(x: &[f32], n_seq: usize, cols: usize) -> (Vec<i8>, usize, Vec<f32>) {
    let stride = cols.div_ceil(GROUP) * GROUP;
    let mut q = vec![0i8; n_seq * stride];
    let mut sx = vec![0f32; n_seq];
    for s in 0..n_seq {
        let xs = &x[s * cols..(s + 1) * cols];
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = amax / 127.0;
        if scale > 0.0 && scale.is_finite() {
            sx[s] = scale;
            for (o, &v) in q[s * stride..s * stride + cols].iter_mut().zip(xs) {
                *o = (v / scale).round_ties_even().clamp(-127.0, 127.0) as i8;
            }
        }
    }
    (q, stride, sx)
}
