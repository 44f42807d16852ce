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
//! time.  Dispatch order: x86-64 AVX-512 VNNI, AVX-512BW, AVX2+FMA; aarch64
//! NEON; else portable scalar (always built, the reference).  Integer
//! kernels return exact i32 sums and the grouped-row kernels follow one
//! float order (`scalar.rs`), so every set gives bit-identical
//! `matmul_i8act` results.

#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

#[cfg(target_arch = "aarch64")]
mod aarch64;
mod act;
mod batch;
mod pack;
pub mod pool;
mod rowops;
mod scalar;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_matmul;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

use rayon::prelude::*;

use act::{with_act_buf, with_row_scratch, with_tmp_scratch, ActBuf, Layout};
use pack::{row_bytes, scales_per_row, GROUP};

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
    /// The one name of a layout that two formats share: an int4-g64 matrix with a single
    /// group per row (cols <= 64) is stored, scaled and decoded exactly as int4 per row, so it
    /// is int4 per row, and both the at-load and the pre-quantized paths give the same bits.
    pub fn canonical(self, cols: usize) -> QFormat {
        if self == QFormat::I4G64 && cols <= 64 {
            QFormat::I4Row
        } else {
            self
        }
    }

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
/// grouped-row kernels return the row sum before the activation scale in
/// the shared float order (see `scalar.rs`).  Activation slices are int8 in
/// `[-127, 127]`, zero padded to whole 128-element blocks, in the format's
/// `act::Layout`.
#[derive(Clone, Copy)]
pub struct KernelSet {
    name: &'static str,
    /// f32 dot over `min(a.len(), b.len())` elements.
    dot_f32: fn(&[f32], &[f32]) -> f32,
    /// `acc[i] += c * x[i]` over `min(acc.len(), x.len())` elements (fused
    /// where the CPU has FMA).
    axpy_f32: fn(&mut [f32], f32, &[f32]),
    /// As `axpy_f32` with int8 `x` (widened exactly to f32 first).
    axpy_i8: fn(&mut [f32], f32, &[i8]),
    /// int8 x int8 over `w.len()` elements (natural layout).
    dot_i8: fn(&[i8], &[i8]) -> i32,
    /// `sum u x`: packed int4 bytes (`u` the stored nibble) x split layout.
    dot_u4: fn(&[u8], &[i8]) -> i32,
    /// `sum u x`: packed int2 row (`u` the stored field) x split2 layout.
    dot_i2: fn(&[u8], &[i8]) -> i32,
    /// int4-g64 row (split-layout x).
    row_i4g64: GroupedRowFn,
    /// int3-g64 row (int3-layout x).
    row_i3g64: GroupedRowFn,
    /// Largest `|v|` (NaN skipped): `scalar::amax`, any order.
    amax: fn(&[f32]) -> f32,
    /// f32 -> int8 in natural order, exactly as `scalar::quant_i8`.
    quant_i8: fn(&[f32], f32, &mut [i8]),
    /// Wrapping sum of the buffer as little-endian u64 lanes (any order):
    /// the memory-read probe, with the widest loads the kernels use.
    read_sum: fn(&[u8]) -> u64,
    /// Tiles of several rows or positions per call (`None`: the single
    /// kernels above, one call per output).  Each output of a tile equals
    /// the single kernel's result bit for bit.
    dot_i8_tile: Option<IntTileFn>,
    /// As `dot_i8_tile` for `dot_u4` (int4 per row).
    dot_u4_tile: Option<IntTileFn>,
    /// As `dot_i8_tile` for `row_i4g64`.
    row_i4g64_tile: Option<GroupedTileFn>,
    /// As `dot_i8_tile` for `row_i3g64`.
    row_i3g64_tile: Option<GroupedTileFn>,
}

/// An integer tile: `out[r * np + p]` = the single kernel of weight row `r`
/// (`nr` rows of `rb` bytes, back to back in `w`) and position `p` (`np`
/// activation rows `xs` apart in `x`).  Shapes `(4, 1)` and `(1, 4)` are
/// the fast ones; any other falls back to one output at a time.  `xsum[p]`
/// is the exact sum of position `p`'s activations (the int8 kernels may
/// use it to multiply offset weights `w + 128`).
type IntTileFn = fn(
    w: &[u8],
    rb: usize,
    nr: usize,
    x: &[i8],
    xs: usize,
    np: usize,
    xsum: &[i32],
    out: &mut [i32],
);

/// A grouped-format tile, as [`IntTileFn`]: position `p`'s group sums at
/// `xg[p * xgs..]`, row `r`'s scales at `s[r * spr..]` (`spr` groups).
#[allow(clippy::type_complexity)]
type GroupedTileFn = fn(
    w: &[u8],
    rb: usize,
    nr: usize,
    x: &[i8],
    xs: usize,
    np: usize,
    xg: &[i32],
    xgs: usize,
    s: &[f32],
    spr: usize,
    out: &mut [f32],
);

/// A grouped-format row kernel: (packed row, activations in the format's
/// layout, per-group activation sums, group scales) -> the row's sum before
/// the activation scale, in the shared float order.
type GroupedRowFn = fn(&[u8], &[i8], &[i32], &[f32]) -> f32;

static PORTABLE: KernelSet = KernelSet {
    name: "portable",
    dot_f32: scalar::dot_f32,
    axpy_f32: scalar::axpy_f32,
    axpy_i8: scalar::axpy_i8,
    dot_i8: scalar::dot_i8,
    dot_u4: scalar::dot_u4,
    dot_i2: scalar::dot_i2,
    row_i4g64: scalar::row_i4g64,
    row_i3g64: scalar::row_i3g64,
    amax: scalar::amax,
    quant_i8: scalar::quant_i8,
    read_sum: scalar::read_sum,
    dot_i8_tile: None,
    dot_u4_tile: None,
    row_i4g64_tile: None,
    row_i3g64_tile: None,
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
        x86_set(X86Set::Avx2)
    }

    /// The AVX-512BW kernels (no VNNI), if this CPU supports them.
    pub fn avx512bw() -> Option<&'static KernelSet> {
        x86_set(X86Set::Avx512Bw)
    }

    /// The AVX-512 VNNI kernels, if this CPU supports them.
    pub fn avx512vnni() -> Option<&'static KernelSet> {
        x86_set(X86Set::Avx512Vnni)
    }

    /// The NEON kernels (every aarch64 CPU has NEON).
    pub fn neon() -> Option<&'static KernelSet> {
        #[cfg(target_arch = "aarch64")]
        {
            Some(&aarch64::NEON)
        }
        #[cfg(not(target_arch = "aarch64"))]
        {
            None
        }
    }

    /// Every kernel set this CPU can run, best first (the portable one last).
    pub fn available() -> Vec<&'static KernelSet> {
        [
            KernelSet::avx512vnni(),
            KernelSet::avx512bw(),
            KernelSet::avx2(),
            KernelSet::neon(),
            Some(KernelSet::portable()),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// The best kernels for this CPU (detected once): the first of
    /// [`KernelSet::available`].
    pub fn detected() -> &'static KernelSet {
        DETECTED.get_or_init(|| *KernelSet::available()[0])
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

    /// "avx512vnni", "avx512bw", "avx2", "neon" or "portable".
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Wrapping sum of `buf` read as u64 lanes, with this set's widest
    /// loads (the memory-read bandwidth probe).
    pub fn read_sum(&self, buf: &[u8]) -> u64 {
        (self.read_sum)(buf)
    }
}

/// The x86-64 kernel sets, each detected once.
#[derive(Clone, Copy)]
enum X86Set {
    Avx2,
    Avx512Bw,
    Avx512Vnni,
}

#[cfg(target_arch = "x86_64")]
fn x86_set(which: X86Set) -> Option<&'static KernelSet> {
    static SETS: [OnceLock<Option<KernelSet>>; 3] = [const { OnceLock::new() }; 3];
    SETS[which as usize]
        .get_or_init(|| match which {
            X86Set::Avx2 => x86::avx2_kernels(),
            X86Set::Avx512Bw => x86::avx512_kernels(false),
            X86Set::Avx512Vnni => x86::avx512_kernels(true),
        })
        .as_ref()
}

#[cfg(not(target_arch = "x86_64"))]
fn x86_set(_: X86Set) -> Option<&'static KernelSet> {
    None
}

impl fmt::Debug for KernelSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KernelSet({})", self.name)
    }
}

/// `sum a[i] * b[i]` over the shorter length, with the active kernels' f32 dot.
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    (KernelSet::active().dot_f32)(a, b)
}

/// `acc[i] += c * x[i]` over the shorter length, with the active kernels.
pub fn axpy_f32(acc: &mut [f32], c: f32, x: &[f32]) {
    (KernelSet::active().axpy_f32)(acc, c, x)
}

/// Name of the kernels in use (see [`KernelSet::name`]).
pub fn kernel_name() -> &'static str {
    KernelSet::active().name
}

/// How matmuls split their rows across threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Threading {
    /// rayon's global pool (work stealing; idle workers sleep).
    Rayon,
    /// [`pool::SpinPool::global`] (workers spin briefly between calls).
    Spin,
}

static SPIN_THREADING: AtomicBool = AtomicBool::new(false);

/// Choose the threading of all later matmuls (default [`Threading::Rayon`]).
pub fn set_threading(t: Threading) {
    SPIN_THREADING.store(t == Threading::Spin, Ordering::Relaxed);
}

/// The threading in use.
pub fn threading() -> Threading {
    if SPIN_THREADING.load(Ordering::Relaxed) {
        Threading::Spin
    } else {
        Threading::Rayon
    }
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

/// How decode streams weights: both only move time, never results.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeTuning {
    /// Bytes of weights requested ahead of the row being read (0: none).
    /// Without it each thread's stream stalls on memory latency at every
    /// row; the hardware prefetcher alone fell far short on rows of 1-3 KB.
    pub prefetch_bytes: usize,
    /// Shortest packed row for which decode reads four rows per kernel
    /// call (sharing each activation load); shorter rows go one at a time.
    pub tile_min_row_bytes: usize,
    /// Prefetch into L2 (`prefetcht1`) instead of L1 (`prefetcht0`).
    pub prefetch_l2: bool,
}

/// The values `cargo bench --bench kernels -- tune` picked on the development
/// machine (2 cores, AVX-512 VNNI): 8 KiB ahead into L1, tiles from 256-byte
/// rows.
const DEFAULT_TUNING: DecodeTuning = DecodeTuning {
    prefetch_bytes: 8192,
    tile_min_row_bytes: 256,
    prefetch_l2: false,
};

impl Default for DecodeTuning {
    fn default() -> Self {
        DEFAULT_TUNING
    }
}

static PREFETCH_BYTES: AtomicUsize = AtomicUsize::new(DEFAULT_TUNING.prefetch_bytes);
static TILE_MIN_ROW_BYTES: AtomicUsize = AtomicUsize::new(DEFAULT_TUNING.tile_min_row_bytes);
static PREFETCH_L2: AtomicBool = AtomicBool::new(DEFAULT_TUNING.prefetch_l2);

/// The decode tuning in use ([`DecodeTuning::default`] unless set).
pub fn decode_tuning() -> DecodeTuning {
    DecodeTuning {
        prefetch_bytes: PREFETCH_BYTES.load(Ordering::Relaxed),
        tile_min_row_bytes: TILE_MIN_ROW_BYTES.load(Ordering::Relaxed),
        prefetch_l2: PREFETCH_L2.load(Ordering::Relaxed),
    }
}

/// Change the decode tuning of all later matmuls (the benchmark's sweep).
pub fn set_decode_tuning(t: DecodeTuning) {
    PREFETCH_BYTES.store(t.prefetch_bytes, Ordering::Relaxed);
    TILE_MIN_ROW_BYTES.store(t.tile_min_row_bytes, Ordering::Relaxed);
    PREFETCH_L2.store(t.prefetch_l2, Ordering::Relaxed);
}

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
    /// Quantized, in the layout of the matrix's format.
    I8(&'a ActBuf),
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
        let fmt = fmt.canonical(cols);
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
        let fmt = fmt.canonical(cols);
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
            run(k, &Act::I8(a), n_seq, [(gate, yg), (up, yu)], split);
        });
    }

    /// Whether `matmul_i8act` takes the f32 path: F32 by definition,
    /// over-wide per-row formats because a whole row's i32 sum could
    /// overflow (never for real model shapes).
    fn i8_via_f32(&self) -> bool {
        let row_format = matches!(self.fmt, QFormat::I8Row | QFormat::I4Row | QFormat::I2Row);
        self.fmt == QFormat::F32 || (row_format && self.cols > MAX_I32_ROW_COLS)
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
            run(k, &Act::I8(a), n_seq, [(self, y), (self, &mut [])], split);
        });
    }

    /// Rows `r0 ..` into `out` (`[nr][n_seq]`): weight row outer, positions
    /// inner, so each weight row is read once for all positions.  `row` is
    /// scratch of `cols` f32 for the f32 path (dequantized row).
    fn rows_into(
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
        let cols = self.cols;
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
        let nrows = out.len() / n_seq;
        let rb = row_bytes(self.fmt, self.cols);
        let spr = scales_per_row(self.fmt, self.cols);
        let data = match &self.data {
            Storage::Packed(d) => d,
            Storage::F32(_) => unreachable!("F32 uses the f32 path"),
        };
        // One tile of `nr` rows from `r` x `np` positions from `s` into
        // `o[j * np + p]` (`nr * np <= 16`); false if `k` has no tile for
        // this format.
        let tile = |r: usize, nr: usize, s: usize, np: usize, o: &mut [f32; 16]| -> bool {
            let w = &data[r * rb..(r + nr) * rb];
            let x = &a.q[s * a.stride..(s + np) * a.stride];
            match self.fmt {
                QFormat::I8Row | QFormat::I4Row => {
                    let f = if self.fmt == QFormat::I8Row {
                        k.dot_i8_tile
                    } else {
                        k.dot_u4_tile
                    };
                    let Some(f) = f else { return false };
                    let mut raw = [0i32; 16];
                    f(w, rb, nr, x, a.stride, np, &a.xs[s..s + np], &mut raw);
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
                    f(w, rb, nr, x, a.stride, np, xg, a.groups, sc, spr, &mut raw);
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
        // Decode streams each row once: ask for the rows `ahead` of the one
        // being read so their bytes are on the way while this one computes.
        let tuning = decode_tuning();
        let ahead = tuning.prefetch_bytes.div_ceil(rb.max(1));
        let prefetch_row = |j: usize| {
            if n_seq == 1 && ahead > 0 && j < nrows {
                let r = r0 + j;
                prefetch(&data[r * rb..(r + 1) * rb], tuning.prefetch_l2);
                prefetch(&self.scales[r * spr..(r + 1) * spr], tuning.prefetch_l2);
            }
        };
        (0..ahead).for_each(prefetch_row);
        let mut done = 0;
        let mut o = [0f32; 16];
        if n_seq == 1 && rb >= tuning.tile_min_row_bytes {
            // Decode: four rows per call share each activation load.
            let next = ahead.max(4);
            while done + 4 <= nrows && tile(r0 + done, 4, 0, 1, &mut o) {
                (done + next..done + next + 4).for_each(prefetch_row);
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
            QFormat::F32 => unreachable!("F32 uses the f32 path"),
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
    if n_seq == 1 {
        compute(k, act, 1, a, ya, b, yb, split);
    } else {
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
}

/// `y[s * rows + o] = t[o * n_seq + s]` (`t` is `[rows][n_seq]`), a block of 16 rows at a
/// time so each position's writes fill whole cache lines and the block's reads stay in L1
/// (element by element, every write landed a row of `y` apart).
fn transpose_into(t: &[f32], n_seq: usize, y: &mut [f32]) {
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
    let chunk_rows = match split {
        Split::Single => None,
        Split::Chunks(c) => Some(c.max(1)),
        Split::Auto => {
            let threads = match threading() {
                Threading::Rayon => rayon::current_num_threads(),
                Threading::Spin => pool::SpinPool::global().threads(),
            };
            if work <= PAR_MIN_WORK || threads <= 1 {
                None
            } else {
                let min_rows = CHUNK_MIN_WORK.div_ceil(cols * n_seq);
                Some(rows.div_ceil(threads * 4).max(min_rows))
            }
        }
    };
    match chunk_rows {
        Some(c) if c < rows && threading() == Threading::Spin => {
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
fn as_i8(b: &[u8]) -> &[i8] {
    // SAFETY: u8 and i8 have the same size and alignment and every bit
    // pattern is valid for both; the lifetime is carried over.
    unsafe { std::slice::from_raw_parts(b.as_ptr() as *const i8, b.len()) }
}
