//! A prompt's prefill chunks through the CPU MLA attention core (`Mla::attend`, the engine's own
//! code) on synthetic weights and cache, for `colibri plan`'s attention probe: the plan prices
//! an MLA model's prefill attention at the speed of what a chunk actually runs (each head
//! rebuilding its keys and values from the whole cached latent, then its scores and values),
//! not at a grouped-query core's.

use super::{AttnCtx, AttnPath, CoreScratch, Mla, MlaDims, MlaKv, QProj, Selection};
use crate::model::linear::{ActMode, Linear};
use crate::model::rope::Rope;
use crate::quant::{QFormat, QMatrix};

/// A prompt fed through the core in chunks, as the engine's prefill feeds it: each chunk's
/// latents appended to the cache, then its query rows attending over the cache up to them,
/// with `kv_b_proj` in a given format. Run it with [`PrefillProbe::run`].
pub(crate) struct PrefillProbe {
    mla: Mla,
    dims: MlaDims,
    rope: Rope,
    act: ActMode,
    /// Every position's latent and rotary key (`(prompt, kv_lora)`, `(prompt, rope)`).
    latent: Vec<f32>,
    rope_keys: Vec<f32>,
    /// Every position's query heads, `(prompt, heads * (nope + rope))`.
    q: Vec<f32>,
    chunks: Vec<usize>,
    /// The cache as the chunks fill it.
    kv: MlaKv,
    sel: Selection,
    scratch: [Vec<f32>; 5],
    out: Vec<f32>,
}

impl PrefillProbe {
    /// `dims` as the model's (any head count: heads are independent tasks), `kv_b_proj` in
    /// `fmt` (the dense format) met by `act` activations, a prompt of `chunks` rows after rows.
    pub(crate) fn new(dims: MlaDims, fmt: QFormat, act: ActMode, chunks: &[usize]) -> Self {
        let chunks: Vec<usize> = chunks.iter().copied().filter(|&c| c > 0).collect();
        let prompt: usize = chunks.iter().sum();
        let (qk, nv, l) = (dims.nope + dims.rope, dims.nope + dims.v, dims.kv_lora);
        let mut x = crate::rng::XorShift64(0x3c6e_f372_fe94_f82b);
        let mut values = |n: usize, scale: f32| -> Vec<f32> {
            (0..n).map(|_| (x.unit_f32() - 0.5) * scale).collect()
        };
        // Only kv_b_proj is read by the core; the other projections are placeholders.
        let tiny = || Linear::new(QMatrix::from_f32(vec![1.0], 1, 1), None);
        let kv_b = QMatrix::quantize(
            &values(dims.heads * nv * l, 1.0 / (l as f32).sqrt()),
            dims.heads * nv,
            l,
            fmt,
        );
        let mla = Mla {
            q: QProj::Full(tiny()),
            kv_a: tiny(),
            kv_a_norm: vec![1.0],
            kv_b: Linear::new(kv_b, None),
            o: tiny(),
            indexer: None,
        };
        let most = chunks.iter().copied().max().unwrap_or(0);
        PrefillProbe {
            mla,
            dims,
            rope: Rope::new(dims.rope.max(2), 10000.0),
            act: if fmt == QFormat::F32 {
                ActMode::F32
            } else {
                act
            },
            latent: values(prompt * l, 2.0),
            rope_keys: values(prompt * dims.rope, 2.0),
            q: values(prompt * dims.heads * qk, 2.0),
            chunks,
            kv: MlaKv::default(),
            // Empty: every row attends to every visible key (no DSA indexer).
            sel: Selection::default(),
            scratch: Default::default(),
            out: vec![0.0; most * dims.heads * dims.v],
        }
    }

    /// One pass of the prompt through the core, chunk after chunk on the engine's automatic
    /// path (the reconstruct path for chunks of a prompt's size); the last chunk's outputs
    /// (`(rows, heads * v)`).
    pub(crate) fn run(&mut self) -> &[f32] {
        let d = self.dims;
        let cx = AttnCtx {
            dims: d,
            rope: &self.rope,
            index_topk: usize::MAX,
            path: AttnPath::Auto,
            act: self.act,
            place: &crate::model::placement::CPU,
        };
        let qk = d.nope + d.rope;
        self.kv.latent.clear();
        self.kv.rope.clear();
        let mut pos0 = 0;
        let mut last = 0;
        // `attend` may project deferred queries in place; these are whole, but it takes them
        // mutably: a copy per chunk, as the engine's own buffer is.
        let mut q = Vec::new();
        for &n in &self.chunks {
            self.kv
                .latent
                .extend_from_slice(&self.latent[pos0 * d.kv_lora..][..n * d.kv_lora]);
            self.kv
                .rope
                .extend_from_slice(&self.rope_keys[pos0 * d.rope..][..n * d.rope]);
            q.clear();
            q.extend_from_slice(&self.q[pos0 * d.heads * qk..][..n * d.heads * qk]);
            let [by_head, heads, tile, stripes, rebuild] = &mut self.scratch;
            let core = CoreScratch {
                by_head,
                heads,
                tile,
                stripes,
                rebuild,
            };
            let out = &mut self.out[..n * d.heads * d.v];
            // The probe's chunks are the engine's (256 rows or fewer): one path each.
            let absorbed = super::split_rows(cx.path, n, pos0, d.nope + d.v) == 0;
            let rows = (n, pos0, absorbed);
            self.mla
                .attend(&cx, (&mut q, None), rows, &self.kv, &self.sel, core, out);
            pos0 += n;
            last = n;
        }
        &self.out[..last * d.heads * d.v]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The probe's chunks are the core's: the last chunk's outputs are those of the
    /// reconstruct path run directly (the tests' `cpu_core`) over the whole cache, and not all
    /// zeros; a second pass gives the same bits.
    #[test]
    fn the_probe_runs_the_engines_core() {
        let dims = MlaDims {
            heads: 3,
            nope: 16,
            rope: 8,
            v: 12,
            kv_lora: 32,
            softmax_factor: 1.0,
            interleave: true,
        };
        let mut p = PrefillProbe::new(dims, QFormat::F32, ActMode::F32, &[30, 0, 24]);
        assert_eq!(p.chunks, [30, 24]);
        let got = p.run().to_vec();
        assert_eq!(got.len(), 24 * 3 * 12);
        assert!(got.iter().any(|v| *v != 0.0));
        assert_eq!(p.kv.latent.len(), 54 * 32);
        let qk = dims.nope + dims.rope;
        let want = super::super::tests::cpu_core(
            &p.mla,
            dims,
            &p.rope,
            AttnPath::Reconstruct,
            (&p.q[30 * 3 * qk..], 24, 30),
            &p.kv,
            &p.sel,
        );
        assert_eq!(got, want);
        assert_eq!(p.run(), &want[..]);
    }
}
