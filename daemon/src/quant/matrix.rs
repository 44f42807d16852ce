//! The weight matrix itself: building one (quantizing f32, or adopting a pre-quantized
//! container's bytes after checking their lengths), its accessors, and dequantizing rows.  The
//! products over it live in `matmul.rs`; this file is only what a [`QMatrix`] is.

use std::fmt;
use std::sync::Arc;

use rayon::prelude::*;

use super::pack::{self, row_bytes, scales_per_row};
use super::tuning::PAR_MIN_WORK;
use super::{QFormat, QuantError};

#[derive(Clone)]
pub(super) enum Storage {
    F32(Vec<f32>),
    Packed(PackedBytes),
}

/// Bytes some other owner keeps alive and unchanged for as long as any handle to them lives
/// (a range of a shard's memory map): a matrix over them is used without a copy.
pub trait SharedBytes: Send + Sync {
    fn bytes(&self) -> &[u8];
}

/// A packed matrix's bytes: its own buffer, or bytes shared with their owner (zero-copy).
#[derive(Clone)]
pub(super) enum PackedBytes {
    Owned(Vec<u8>),
    Shared(Arc<dyn SharedBytes>),
}

impl std::ops::Deref for PackedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            PackedBytes::Owned(v) => v,
            PackedBytes::Shared(s) => s.bytes(),
        }
    }
}

/// A weight matrix `[rows, cols]` in some [`QFormat`].
#[derive(Clone)]
pub struct QMatrix {
    pub(super) fmt: QFormat,
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) data: Storage,
    pub(super) scales: Vec<f32>,
}

/// The packed format whose lengths these are (see [`QMatrix::from_packed`] for ties).
fn infer_packed(
    rows: usize,
    cols: usize,
    data_len: usize,
    scales_len: usize,
) -> Result<QFormat, QuantError> {
    QFormat::infer(rows, cols, data_len, scales_len).ok_or(QuantError::UnknownLayout {
        rows,
        cols,
        data_len,
        scales_len,
    })
}

/// `fmt` in its canonical form for `cols`, once the data and scale lengths match it.
fn checked_format(
    fmt: QFormat,
    rows: usize,
    cols: usize,
    data_len: usize,
    scales_len: usize,
) -> Result<QFormat, QuantError> {
    let fmt = fmt.canonical(cols);
    let expected_data = fmt.data_len(rows, cols);
    let expected_scales = fmt.scales_len(rows, cols);
    if data_len != expected_data || scales_len != expected_scales {
        return Err(QuantError::LengthMismatch {
            fmt,
            expected_data,
            got_data: data_len,
            expected_scales,
            got_scales: scales_len,
        });
    }
    Ok(fmt)
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
            data: Storage::Packed(PackedBytes::Owned(data)),
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
        let fmt = infer_packed(rows, cols, data.len(), scales.len())?;
        QMatrix::from_parts(fmt, rows, cols, data, scales)
    }

    /// As [`QMatrix::from_packed`], over bytes another owner keeps (no copy): the products
    /// read them where they are (packed layouts only: f32 is converted, never shared).
    pub fn from_shared(
        rows: usize,
        cols: usize,
        data: Arc<dyn SharedBytes>,
        scales: Vec<f32>,
    ) -> Result<QMatrix, QuantError> {
        let len = data.bytes().len();
        let fmt = infer_packed(rows, cols, len, scales.len())?;
        let fmt = checked_format(fmt, rows, cols, len, scales.len())?;
        Ok(QMatrix {
            fmt,
            rows,
            cols,
            data: Storage::Packed(PackedBytes::Shared(data)),
            scales,
        })
    }

    /// Whether the packed bytes are shared with another owner (see [`QMatrix::from_shared`]).
    pub fn is_shared(&self) -> bool {
        matches!(self.data, Storage::Packed(PackedBytes::Shared(_)))
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
        let fmt = checked_format(fmt, rows, cols, data.len(), scales.len())?;
        let data = match fmt {
            QFormat::F32 => Storage::F32(
                data.chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            ),
            _ => Storage::Packed(PackedBytes::Owned(data)),
        };
        Ok(QMatrix {
            fmt,
            rows,
            cols,
            data,
            scales,
        })
    }

    /// Moves the packed bytes out (for reuse by a later load), leaving an empty matrix that
    /// must not be used again. `None` for f32 storage.
    pub fn take_packed(&mut self) -> Option<Vec<u8>> {
        match &mut self.data {
            Storage::Packed(PackedBytes::Owned(d)) => Some(std::mem::take(d)),
            Storage::Packed(PackedBytes::Shared(_)) | Storage::F32(_) => None,
        }
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

    /// The stored bytes (as [`QMatrix::data`]) and the scales, without a copy.
    pub fn into_parts(self) -> (Vec<u8>, Vec<f32>) {
        match self.data {
            Storage::Packed(PackedBytes::Owned(d)) => (d, self.scales),
            Storage::Packed(d) => (d.to_vec(), self.scales),
            Storage::F32(v) => (
                v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                self.scales,
            ),
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
    pub(super) fn row_packed(&self, r: usize) -> &[u8] {
        let rb = row_bytes(self.fmt, self.cols);
        match &self.data {
            Storage::Packed(d) => &d[r * rb..(r + 1) * rb],
            Storage::F32(_) => unreachable!(),
        }
    }

    #[inline]
    pub(super) fn row_scales(&self, r: usize) -> &[f32] {
        let n = scales_per_row(self.fmt, self.cols);
        &self.scales[r * n..(r + 1) * n]
    }
}
