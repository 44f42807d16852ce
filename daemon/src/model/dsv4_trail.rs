//! DeepSeek-V4's verify trail: what a decode step feeding drafts keeps so that cutting the
//! rejected ones leaves a layer's state ([`Dsv4Kv`]) exactly as if only the kept rows had been
//! fed (`kv_snap.rs` holds one per layer and calls [`LayerTrail::restore`]).
//!
//! The state is not a row per position but it is a deterministic function of the rows fed,
//! so rather than copying it after every row (the HCA compressor's open window alone is
//! `rate * head_dim` values per layer) the forward logs what it takes in: the window's keys it
//! pushes out, and each compressor's kv and biased gate row per fed row, next to a copy of the
//! compressors' open windows and overlaps before the step. Keeping `k` rows is then:
//!
//! - the window: drop the rows past `k`, take back the rows pushed out, up to its size;
//! - a compressor: its input so far is the open window before the step followed by the logged
//!   rows; a window closes every `rate` of them, so `k` rows closed `(open + k) / rate`
//!   windows: the entries past those go, the open window is the rows after the last close,
//!   and CSA's overlap is the first series of the last closed window (else the one before).
//!
//! Entries the kept rows closed are not computed again: the forward made them from the same
//! numbers, so the cut is bit-exact. Buffers are kept and reused across steps.

use super::dsv4_attn::{LayerState, Series};
use super::kv::Dsv4Kv;

/// One compressor's log over a verify step.
#[derive(Debug, Default)]
pub(crate) struct SeriesTrail {
    /// Whether the layer has this compressor (HCA has no indexer, sliding layers neither).
    used: bool,
    /// Row width of a logged input (`series * dim`), rows per window, entry width, CSA.
    w: usize,
    rate: usize,
    dim: usize,
    overlap: bool,
    /// The open window and overlap before the step, and the entries then closed.
    base_kv: Vec<f32>,
    base_gate: Vec<f32>,
    base_prior: Option<(Vec<f32>, Vec<f32>)>,
    base_entries: usize,
    /// The kv and biased gate rows fed during the step, in order.
    fed_kv: Vec<f32>,
    fed_gate: Vec<f32>,
}

/// What a compressor is, for its log: (row width, rate, entry width, overlap).
pub(crate) type Shape = (usize, usize, usize, bool);

fn copy_into(dst: &mut Vec<f32>, src: &[f32]) {
    dst.clear();
    dst.extend_from_slice(src);
}

/// `dst` set to `src`, reusing `dst`'s buffers.
fn copy_prior(dst: &mut Option<(Vec<f32>, Vec<f32>)>, src: &Option<(Vec<f32>, Vec<f32>)>) {
    match (dst.as_mut(), src) {
        (_, None) => *dst = None,
        (Some((dk, dg)), Some((sk, sg))) => {
            copy_into(dk, sk);
            copy_into(dg, sg);
        }
        (None, Some(p)) => *dst = Some(p.clone()),
    }
}

impl SeriesTrail {
    /// The step starts: `st` as it stands, for a compressor of `shape`.
    fn begin(&mut self, st: &Series, (w, rate, dim, overlap): Shape) {
        (self.used, self.w, self.rate, self.dim, self.overlap) = (true, w, rate, dim, overlap);
        copy_into(&mut self.base_kv, &st.buf_kv);
        copy_into(&mut self.base_gate, &st.buf_gate);
        copy_prior(&mut self.base_prior, &st.prior);
        self.base_entries = st.len();
        self.fed_kv.clear();
        self.fed_gate.clear();
    }

    /// A row fed: its kv and biased gate rows.
    pub(crate) fn log(&mut self, kv: &[f32], gate: &[f32]) {
        self.fed_kv.extend_from_slice(kv);
        self.fed_gate.extend_from_slice(gate);
    }

    /// Row `r` of the input since the step's base (the open window, then the logged rows).
    fn row<'a>(&self, base: &'a [f32], fed: &'a [f32], r: usize) -> &'a [f32] {
        let (w, b0) = (self.w, self.base_kv.len() / self.w);
        match r.checked_sub(b0) {
            None => &base[r * w..(r + 1) * w],
            Some(f) => &fed[f * w..(f + 1) * w],
        }
    }

    /// `st` as if only the first `k` logged rows had been fed.
    fn restore(&self, st: &mut Series, k: usize) {
        if !self.used {
            return;
        }
        let t = self.base_kv.len() / self.w + k;
        let closes = t / self.rate;
        st.truncate(self.base_entries + closes);
        st.buf_kv.clear();
        st.buf_gate.clear();
        for r in closes * self.rate..t {
            st.buf_kv
                .extend_from_slice(self.row(&self.base_kv, &self.fed_kv, r));
            st.buf_gate
                .extend_from_slice(self.row(&self.base_gate, &self.fed_gate, r));
        }
        if !self.overlap {
            return;
        }
        if closes == 0 {
            copy_prior(&mut st.prior, &self.base_prior);
            return;
        }
        // The last closed window's first series, as `Compressor::feed` keeps it.
        let (pk, pg) = st.prior.get_or_insert_with(Default::default);
        pk.clear();
        pg.clear();
        for r in (closes - 1) * self.rate..closes * self.rate {
            pk.extend_from_slice(&self.row(&self.base_kv, &self.fed_kv, r)[..self.dim]);
            pg.extend_from_slice(&self.row(&self.base_gate, &self.fed_gate, r)[..self.dim]);
        }
    }
}

/// One layer's log over a verify step.
#[derive(Debug, Default)]
pub(crate) struct LayerTrail {
    /// The position the step started at, and the sliding window's size.
    base: usize,
    window: usize,
    /// The window's keys pushed out during the step, in order.
    pub(crate) popped: Vec<Vec<f32>>,
    pub(crate) compressor: SeriesTrail,
    pub(crate) indexer: SeriesTrail,
}

impl LayerTrail {
    /// The step starts at `kv` as it stands; `window` is the layer's sliding window,
    /// `compressor` and `indexer` its compressors' shapes (None: it has none).
    pub(crate) fn begin(
        &mut self,
        kv: &Dsv4Kv,
        window: usize,
        compressor: Option<Shape>,
        indexer: Option<Shape>,
    ) {
        (self.base, self.window) = (kv.pos, window);
        self.popped.clear();
        self.compressor.used = false;
        self.indexer.used = false;
        if let Some(s) = compressor {
            self.compressor.begin(&kv.state.compressor, s);
        }
        if let Some(s) = indexer {
            self.indexer.begin(&kv.state.indexer, s);
        }
    }

    /// `kv` (now past the step's rows) as if only its first `n - base` rows had been fed.
    /// False when `n` is not within the step (nothing is changed then).
    pub(crate) fn restore(&mut self, kv: &mut Dsv4Kv, n: usize) -> bool {
        if n < self.base || n > kv.pos {
            return false;
        }
        let (k, st): (usize, &mut LayerState) = (n - self.base, &mut kv.state);
        // Past the base, the rows in order are the pushed-out ones then the window: drop the
        // last ones, then refill the window from the pushed-out ones, latest first.
        for _ in 0..kv.pos - n {
            if st.window.pop_back().is_none() {
                self.popped.pop();
            }
        }
        while st.window.len() < self.window {
            match self.popped.pop() {
                Some(r) => st.window.push_front(r),
                None => break,
            }
        }
        self.compressor.restore(&mut st.compressor, k);
        self.indexer.restore(&mut st.indexer, k);
        kv.pos = n;
        true
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use super::super::kv::LayerKv;
    use super::super::{KvCache, LoadOptions, Logits, Model};
    use crate::config::ModelConfig;
    use crate::weights::ShardSet;

    fn load() -> Model {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-deepseek-v4");
        let cfg = ModelConfig::load(&dir).unwrap();
        let s = Arc::new(ShardSet::open(&[dir]).unwrap());
        Model::load(cfg, s, LoadOptions::default()).unwrap()
    }

    /// The fixture's long case: past the window of 8, several HCA blocks of 8 and CSA
    /// blocks of 4.
    fn tokens() -> Vec<u32> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-deepseek-v4");
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("ref.json")).unwrap()).unwrap();
        (r["long"]["full_ids"].as_array().unwrap().iter())
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    }

    fn states(kv: &KvCache) -> Vec<(super::LayerState, usize)> {
        (kv.layers.iter())
            .map(|l| match l {
                LayerKv::Dsv4(s) => (s.state.clone(), s.pos),
                _ => panic!("a V4 cache holds V4 layers"),
            })
            .collect()
    }

    /// A verify step of `rows` rows from every base, cut to every `k` below it: the state is
    /// the one of a cache fed only the kept rows (window refilled, compressors' open windows,
    /// overlaps and entries back), bit for bit, and it goes on giving the same logits. Steps
    /// of up to 11 rows cross the window (8) and close HCA (8) and CSA (4) windows inside.
    #[test]
    fn a_cut_verify_step_is_the_state_of_its_kept_rows() {
        let m = load();
        let full = tokens();
        assert!(full.len() >= 40, "the long case crosses several blocks");
        let mut cuts = 0;
        for base in [0usize, 1, 3, 6, 7, 8, 13, 15, 16, 22, 27] {
            let mut before = m.new_cache();
            if base > 0 {
                m.forward(&mut before, &full[..base], Logits::None).unwrap();
            }
            for rows in [2usize, 3, 5, 9, 11] {
                let step = &full[base..base + rows];
                for k in 0..rows {
                    // A clone has no trail (`kv_snap.rs`): the step again for each cut.
                    let mut cut = before.clone();
                    cut.arm_trail(rows);
                    m.forward(&mut cut, step, Logits::All).unwrap();
                    cut.truncate(base + k);
                    assert_eq!(cut.len(), base + k, "base {base} rows {rows} k {k}");
                    let mut want = before.clone();
                    if k > 0 {
                        m.forward(&mut want, &step[..k], Logits::None).unwrap();
                    }
                    assert!(
                        states(&cut) == states(&want),
                        "base {base} rows {rows} k {k}"
                    );
                    let next = &full[base + k..base + k + 3];
                    assert_eq!(
                        m.forward(&mut cut, next, Logits::All).unwrap(),
                        m.forward(&mut want, next, Logits::All).unwrap()
                    );
                    cuts += 1;
                }
            }
        }
        assert_eq!(cuts, 11 * (2 + 3 + 5 + 9 + 11));
    }

    /// The trail serves the forward it was armed for: a later forward (not armed) leaves
    /// nothing to cut back to, and a cut then forgets the state as before.
    #[test]
    fn only_the_latest_armed_forward_is_cut_back() {
        let m = load();
        let full = tokens();
        let mut kv = m.new_cache();
        m.forward(&mut kv, &full[..10], Logits::None).unwrap();
        kv.arm_trail(4);
        m.forward(&mut kv, &full[10..14], Logits::All).unwrap();
        m.forward(&mut kv, &full[14..15], Logits::Last).unwrap();
        kv.truncate(12);
        assert_eq!(kv.len(), 0);
        assert_eq!(kv.restores(), (0, 0));
    }
}
