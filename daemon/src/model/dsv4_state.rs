//! A DeepSeek-V4 layer's state ([`Dsv4Kv`]) as a flat run of f32 values, the form the
//! `.coli_kv` state snapshot stores (`kv_state.rs`). Its parts grow with the conversation (one
//! compressed entry per `rate` tokens) and the window fills up to `sliding_window`, so the run
//! describes itself: every count is written before what it counts, as an f32 (exact: counts
//! stay far below 2^24).
//!
//! ```text
//! pos | window: rows, width, values | compressor series | indexer series
//! series: buf_kv: len, values | buf_gate: len, values | prior: 0, or 1 then kv and gate as
//!         len, values each | entries: rows, width, values
//! ```

use std::collections::VecDeque;

use super::dsv4_attn::{LayerState, Series};
use super::kv::Dsv4Kv;
use crate::config::{Dsv4Attn, Dsv4Config};

fn put_vec(out: &mut Vec<f32>, v: &[f32]) {
    out.push(v.len() as f32);
    out.extend_from_slice(v);
}

fn put_rows<'a>(out: &mut Vec<f32>, rows: impl ExactSizeIterator<Item = &'a Vec<f32>> + Clone) {
    let width = rows.clone().next().map_or(0, Vec::len);
    out.push(rows.len() as f32);
    out.push(width as f32);
    for r in rows {
        out.extend_from_slice(r);
    }
}

fn put_series(out: &mut Vec<f32>, s: &Series) {
    put_vec(out, &s.buf_kv);
    put_vec(out, &s.buf_gate);
    match &s.prior {
        None => out.push(0.0),
        Some((k, g)) => {
            out.push(1.0);
            put_vec(out, k);
            put_vec(out, g);
        }
    }
    out.push(s.len() as f32);
    out.push(s.width as f32);
    out.extend_from_slice(&s.entries);
}

/// Appends `kv`'s flat form to `out`.
pub(crate) fn encode(kv: &Dsv4Kv, out: &mut Vec<f32>) {
    out.push(kv.pos as f32);
    put_rows(out, kv.state.window.iter());
    put_series(out, &kv.state.compressor);
    put_series(out, &kv.state.indexer);
}

/// Reads the values of a run one at a time; `None` once it is short or a count is not one.
struct Reader<'a> {
    vals: &'a [f32],
    at: usize,
}

impl Reader<'_> {
    fn value(&mut self) -> Option<f32> {
        let v = *self.vals.get(self.at)?;
        self.at += 1;
        Some(v)
    }

    fn count(&mut self) -> Option<usize> {
        let v = self.value()?;
        (v >= 0.0 && v.fract() == 0.0 && v < (1u32 << 24) as f32).then_some(v as usize)
    }

    fn take(&mut self, n: usize) -> Option<Vec<f32>> {
        let end = self.at.checked_add(n)?;
        let v = self.vals.get(self.at..end)?.to_vec();
        self.at = end;
        Some(v)
    }

    fn vec(&mut self) -> Option<Vec<f32>> {
        let n = self.count()?;
        self.take(n)
    }

    fn rows(&mut self) -> Option<Vec<Vec<f32>>> {
        let (rows, width) = (self.count()?, self.count()?);
        (0..rows).map(|_| self.take(width)).collect()
    }

    fn series(&mut self) -> Option<Series> {
        let buf_kv = self.vec()?;
        let buf_gate = self.vec()?;
        let prior = match self.count()? {
            0 => None,
            1 => Some((self.vec()?, self.vec()?)),
            _ => return None,
        };
        let (rows, width) = (self.count()?, self.count()?);
        let entries = self.take(rows.checked_mul(width)?)?;
        Some(Series {
            buf_kv,
            buf_gate,
            prior,
            entries,
            width,
        })
    }
}

/// Reads one layer's state from the front of `vals`: the state and the values it took, or
/// `None` when they are not one (short, or a count that is not a whole number).
pub(crate) fn decode(vals: &[f32]) -> Option<(Dsv4Kv, usize)> {
    let mut r = Reader { vals, at: 0 };
    let pos = r.count()?;
    let window: VecDeque<Vec<f32>> = r.rows()?.into();
    let compressor = r.series()?;
    let indexer = r.series()?;
    let kv = Dsv4Kv {
        state: LayerState {
            window,
            compressor,
            indexer,
        },
        pos,
    };
    Some((kv, r.at))
}

/// The f32 values of layers `0..layers` of a V4 cache, for the RAM clamp (`KvCache`'s
/// `state_bytes` and `bytes_per_position`): what stays the same size at every length (the
/// window full, each compressor's open window and CSA's overlap, all full), and what grows
/// per position (a compressed entry per `rate` positions, rounded up so it never counts short).
pub(crate) fn sizes(d: &Dsv4Config, layers: usize) -> (usize, usize) {
    let hd = d.head_dim;
    // A compressor of entries `dim` wide: (fixed, per position).
    let series = |rate: usize, dim: usize, overlap: bool| {
        let w = if overlap { 2 * dim } else { dim };
        let prior = if overlap { 2 * rate * dim } else { 0 };
        (2 * rate * w + prior, dim.div_ceil(rate.max(1)))
    };
    let (mut fixed, mut per_pos) = (0, 0);
    for l in 0..layers {
        fixed += d.sliding_window * hd;
        let parts = match d.layer_types.get(l) {
            Some(Dsv4Attn::Csa) => vec![
                series(d.csa_rate, hd, true),
                series(d.csa_rate, d.index_head_dim, true),
            ],
            Some(Dsv4Attn::Hca) => vec![series(d.hca_rate, hd, false)],
            _ => vec![],
        };
        for (f, p) in parts {
            fixed += f;
            per_pos += p;
        }
    }
    (fixed, per_pos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_reads_back_as_it_was_written() {
        let series = |k: f32| Series {
            buf_kv: vec![k, k + 1.0, -0.0],
            buf_gate: vec![f32::MIN_POSITIVE, 7.5, k],
            prior: Some((vec![1.0, 2.0], vec![3.0, 4.0])),
            entries: vec![k, k, k, k, -k, -k, -k, -k],
            width: 4,
        };
        let kv = Dsv4Kv {
            state: LayerState {
                window: vec![vec![0.25, -1.5], vec![3.0, 1e-30]].into(),
                compressor: series(2.0),
                indexer: Series::default(),
            },
            pos: 37,
        };
        let mut flat = vec![];
        encode(&kv, &mut flat);
        flat.push(99.0);
        let (back, used) = decode(&flat).unwrap();
        assert_eq!(used, flat.len() - 1);
        assert_eq!((back.state, back.pos), (kv.state.clone(), 37));
        // Short, or a count that is not a whole number, is no state.
        assert!(decode(&flat[..used - 1]).is_none());
        let mut bad = flat.clone();
        bad[1] = 1.5;
        assert!(decode(&bad).is_none());
    }
}
