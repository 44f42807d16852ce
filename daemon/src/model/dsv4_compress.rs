//! DeepSeek-V4's compressors (transformers' `DeepseekV4HCACompressor` / `CSACompressor`):
//! every token's input is projected to a kv row and a gate row (`series * dim` wide: CSA's two
//! overlapping series, HCA's one); every `rate` tokens the window closes into one entry, each
//! value a softmax over the window's slots by their gates (CSA: the previous window's first
//! series, then this window's second), normalised and rotated to the window's first position.
//!
//! The projections of a batch's rows run as one product ([`Compressor::project`]); the
//! windows close row by row in each sequence's order ([`Compressor::feed`]). The entries are
//! one flat buffer per sequence ([`Series`]), reserved up front to the session's context, so a
//! decode step that closes a window does not allocate.

use super::dsv4_attn::{rms, rotate_tail};
use super::dsv4_trail::{SeriesTrail, Shape};
use super::linear::{load_linear, ActMode, Linear};
use super::rope::Rope;
use crate::error::EngineError;
use crate::quant::QFormat;
use crate::weights::ShardSet;

/// One compressor: `kv` and `gate` projections of `series * dim` (CSA's two overlapping
/// series, HCA's one), the per-slot position biases (`ape`), the entries' norm.
pub(crate) struct Compressor {
    rate: usize,
    dim: usize,
    overlap: bool,
    kv: Linear,
    gate: Linear,
    bias: Vec<f32>,
    norm: Vec<f32>,
}

/// One compressor's state in one sequence.
#[derive(Clone, Debug, Default)]
pub(crate) struct Series {
    /// The inputs of the window not yet closed: per token its kv and biased gate rows.
    pub buf_kv: Vec<f32>,
    pub buf_gate: Vec<f32>,
    /// CSA: the last closed window's first series (kv, biased gate), `rate * dim` each.
    pub prior: Option<(Vec<f32>, Vec<f32>)>,
    /// The entries emitted so far, `width` values each, one after the other, each rotated to
    /// its window's first position.
    pub entries: Vec<f32>,
    /// An entry's values (the compressor's `dim`; 0 until one is set).
    pub width: usize,
}

/// The width of no entries is no part of the state (a state cut back to none of its entries
/// equals one that never had any).
impl PartialEq for Series {
    fn eq(&self, o: &Series) -> bool {
        let width = self.entries.is_empty() || self.width == o.width;
        (self.buf_kv == o.buf_kv)
            && (self.buf_gate == o.buf_gate)
            && (self.prior == o.prior)
            && (self.entries == o.entries)
            && width
    }
}

impl Series {
    /// The entries emitted so far.
    pub(crate) fn len(&self) -> usize {
        self.entries.len().checked_div(self.width).unwrap_or(0)
    }

    /// Entry `i`.
    pub(crate) fn entry(&self, i: usize) -> &[f32] {
        &self.entries[i * self.width..(i + 1) * self.width]
    }

    /// Keeps the first `n` entries.
    pub(crate) fn truncate(&mut self, n: usize) {
        self.entries.truncate(n * self.width);
    }
}

impl Compressor {
    /// `{p}.wkv`, `{p}.wgate` in `fmt` (`--dense-bits`, or as converted), `{p}.ape` and
    /// `{p}.norm` f32; `h` is the model's hidden size.
    pub(crate) fn load(
        s: &ShardSet,
        p: &str,
        rate: usize,
        dim: usize,
        overlap: bool,
        h: usize,
        fmt: QFormat,
    ) -> Result<Self, EngineError> {
        let w = if overlap { 2 * dim } else { dim };
        Ok(Compressor {
            rate,
            dim,
            overlap,
            kv: load_linear(s, &format!("{p}.wkv"), w, h, fmt, false)?,
            gate: load_linear(s, &format!("{p}.wgate"), w, h, fmt, false)?,
            bias: s.read_f32(&format!("{p}.ape"), &[rate, w])?,
            norm: s.read_f32(&format!("{p}.norm.weight"), &[dim])?,
        })
    }

    /// A projected row's width (`series * dim`).
    pub(crate) fn width(&self) -> usize {
        self.kv.out_dim()
    }

    /// Its two projections.
    pub(crate) fn linears(&self) -> [&Linear; 2] {
        [&self.kv, &self.gate]
    }

    /// The f32 values it holds besides its projections: the position biases and the norm.
    pub(crate) fn values(&self) -> u64 {
        (self.bias.len() + self.norm.len()) as u64
    }

    /// What its verify trail needs to know of it (`dsv4_trail.rs`).
    pub(crate) fn shape(&self) -> Shape {
        (self.width(), self.rate, self.dim, self.overlap)
    }

    /// The kv and (unbiased) gate rows of the `n` inputs `a`, in one product.
    pub(crate) fn project(
        &self,
        a: &[f32],
        n: usize,
        act: ActMode,
        kv: &mut [f32],
        gate: &mut [f32],
    ) {
        Linear::forward_pair(&self.kv, &self.gate, a, n, kv, gate, act);
    }

    /// The entries `positions` positions close.
    pub(crate) fn most(&self, positions: usize) -> usize {
        positions / self.rate.max(1)
    }

    /// Room for the entries of `positions` positions, so closing windows up to there does not
    /// reallocate (a no-op once there is).
    pub(crate) fn reserve(&self, st: &mut Series, positions: usize) {
        let want = self.most(positions) * self.dim;
        st.entries
            .reserve_exact(want.saturating_sub(st.entries.len()));
    }

    /// Feeds one token's projected rows (`kv`, and `gate` before its slot's bias); when they
    /// close a window, appends the window's entry. `log` (a verify step) keeps the row fed;
    /// `cs` is the rotation's scratch.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn feed(
        &self,
        st: &mut Series,
        kv: &[f32],
        gate: &[f32],
        rope: &Rope,
        eps: f32,
        log: Option<&mut SeriesTrail>,
        cs: &mut Vec<f32>,
    ) {
        let w = self.width();
        let slot = st.buf_kv.len() / w;
        st.buf_kv.extend_from_slice(kv);
        let g0 = st.buf_gate.len();
        st.buf_gate.extend_from_slice(gate);
        (st.buf_gate[g0..].iter_mut())
            .zip(&self.bias[slot * w..(slot + 1) * w])
            .for_each(|(g, b)| *g += b);
        if let Some(log) = log {
            log.log(kv, &st.buf_gate[g0..]);
        }
        if st.buf_kv.len() < self.rate * w {
            return;
        }
        let (d, rate) = (self.dim, self.rate);
        let Series {
            buf_kv,
            buf_gate,
            prior,
            entries,
            width,
        } = st;
        *width = d;
        // Per value: the slots of the window (CSA: the previous window's first series, then
        // this window's second), softmaxed over the slots by their gates.
        let before = match (self.overlap, prior.as_ref()) {
            (true, Some(p)) => Some(p),
            _ => None,
        };
        let n_before = if before.is_some() { rate } else { 0 };
        let off = if self.overlap { d } else { 0 };
        let slot = |i: usize, j: usize| -> (f32, f32) {
            if let (true, Some((pk, pg))) = (i < n_before, before) {
                return (pk[i * d + j], pg[i * d + j]);
            }
            let at = (i - n_before) * w + off + j;
            (buf_kv[at], buf_gate[at])
        };
        let slots = n_before + rate;
        let start = entries.len();
        let count = start / d;
        entries.resize(start + d, 0.0);
        let entry = &mut entries[start..];
        for (j, e) in entry.iter_mut().enumerate() {
            let max = (0..slots)
                .map(|i| slot(i, j).1)
                .fold(f32::NEG_INFINITY, f32::max);
            let sum: f32 = (0..slots).map(|i| (slot(i, j).1 - max).exp()).sum();
            *e = (0..slots)
                .map(|i| {
                    let (k, g) = slot(i, j);
                    k * ((g - max).exp() / sum)
                })
                .sum();
        }
        rms(entry, &self.norm, eps);
        rotate_tail(rope, entry, d, count * rate, false, cs);
        if self.overlap {
            // This window's first series, for the next window.
            let (pk, pg) = prior.get_or_insert_with(Default::default);
            pk.clear();
            pg.clear();
            for i in 0..rate {
                pk.extend_from_slice(&buf_kv[i * w..i * w + d]);
                pg.extend_from_slice(&buf_gate[i * w..i * w + d]);
            }
        }
        buf_kv.clear();
        buf_gate.clear();
    }
}
