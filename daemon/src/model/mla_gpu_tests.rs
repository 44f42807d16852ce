//! The GPU's MLA core against the CPU's (a child of `mla`, so it reaches the private core).

use super::tests::{cpu_core, values};
use super::*;
use crate::quant::QMatrix;

/// The GPU's absorbed core (`gpu::AttnGpu::mla_core`, over the device mirror of the cache)
/// against the CPU's, on odd shapes: 1, 3 and 17 query rows, caches of lengths that are
/// not multiples of a workgroup, every row dense or a DSA selection with gaps, YaRN's
/// softmax factor. Within 1e-5 of the largest output (f32 sums in another order).
#[test]
fn gpu_core_matches_the_cpu_core() {
    let g = match crate::gpu::shared(crate::gpu::GpuChoice::Vulkan) {
        // Only a missing adapter skips: a kernel the device rejects fails.
        Ok(gpu) => AttnGpu::new(gpu).unwrap(),
        Err(e) => {
            crate::elog!("gpu_core_matches_the_cpu_core: skipped: {e}");
            return;
        }
    };
    let d = MlaDims {
        heads: 3,
        nope: 16,
        rope: 8,
        v: 12,
        kv_lora: 40,
        softmax_factor: 1.3,
        interleave: true,
    };
    let (qk, nv, l) = (d.nope + d.rope, d.nope + d.v, d.kv_lora);
    let kv_b = QMatrix::from_f32(values(d.heads * nv * l, 4), d.heads * nv, l);
    let mla = Mla {
        q: QProj::Full(Linear {
            w: QMatrix::from_f32(vec![0.0], 1, 1),
            bias: None,
            slot: Default::default(),
        }),
        kv_a: Linear {
            w: QMatrix::from_f32(vec![0.0], 1, 1),
            bias: None,
            slot: Default::default(),
        },
        kv_a_norm: Vec::new(),
        kv_b: Linear {
            w: kv_b.clone(),
            bias: None,
            slot: Default::default(),
        },
        o: Linear {
            w: QMatrix::from_f32(vec![0.0], 1, 1),
            bias: None,
            slot: Default::default(),
        },
        indexer: None,
    };
    let kv_b_rows = g.upload(&kv_b.dequantize()).unwrap();
    let rope = Rope::new(d.rope, 10000.0);
    let mut worst = 0f32;
    for (n, total) in [(1, 1), (3, 37), (17, 17), (1, 200), (17, 130)] {
        let pos0 = total - n;
        let kv = MlaKv {
            latent: values(total * l, total as u64),
            rope: values(total * d.rope, 3 + total as u64),
            ..MlaKv::default()
        };
        let q = values(n * d.heads * qk, n as u64);
        for gaps in [false, true] {
            let mut sel = Selection::with_capacity(n, total);
            if gaps {
                sel.begin(n);
                for s in 0..n {
                    sel.keep(s, (0..pos0 + s + 1).filter(|t| t % 3 != 1 || *t == 0));
                }
            }
            let want = cpu_core(&mla, d, &rope, AttnPath::Absorbed, (&q, n, pos0), &kv, &sel);
            let mut mirror = KvMirror::default();
            let [latent, rope_keys] = mirror
                .sync(g.kernels(), 0, [&kv.latent[..], &kv.rope[..]])
                .unwrap();
            let shape = MlaShape {
                heads: d.heads,
                nope: d.nope,
                rope: d.rope,
                v: d.v,
                kv_lora: l,
                scale: Mla::scaling(d),
            };
            let got = g
                .mla_core(shape, &kv_b_rows, &q, n, pos0, latent, rope_keys, |s| {
                    sel.row(s)
                })
                .unwrap();
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                let err = (a - b).abs() / scale;
                worst = worst.max(err);
                assert!(
                    err <= 1e-5,
                    "{n} rows, {total} keys, gaps {gaps}, out {i}: {a} vs {b}"
                );
            }
        }
    }
    crate::elog!("MLA core: worst relative error {worst:e}");
}
