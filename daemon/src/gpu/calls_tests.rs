//! The kernels' grow-only buffers (`calls.rs`) against new buffers a call: the attention
//! cores, the indexer's selection and the norms give the same bits after larger and smaller
//! calls left their data in the slots as on kernels that never ran, and a repeated call
//! grows nothing.

use std::sync::Arc;

use super::super::{AttnGpu, GpuChoice, GqaShape, KvMirror, MlaShape};

/// Attention kernels on the shared Vulkan adapter, or `None` (skipped) without one.
fn vulkan(test: &str) -> Option<Arc<super::super::Gpu>> {
    match super::super::shared(GpuChoice::Vulkan) {
        Ok(gpu) => Some(gpu),
        Err(e) => {
            crate::elog!("{test}: skipped: {e}");
            None
        }
    }
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// One call of each kind on `g` at size `(n, total)`: the grouped-query core, the MLA core
/// over a DSA-like selection, the indexer's kept keys and an RMSNorm, as bits.
fn calls(g: &AttnGpu, n: usize, total: usize, seed: u64) -> Vec<Vec<u32>> {
    let k = g.kernels();
    let pos0 = total - n;
    let mut out = Vec::new();
    // Grouped-query: 4 heads over 2 key-value heads of 16.
    let gqa = GqaShape {
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        scale: 0.25,
    };
    let q = values(n * 4 * 16, seed);
    let (kc, vc) = (values(total * 32, seed + 1), values(total * 32, seed + 2));
    let mut mirror = KvMirror::default();
    let [kd, vd] = mirror.sync(k, 0, [&kc[..], &vc[..]]).unwrap();
    out.push(bits(&g.gqa_core(gqa, &q, n, pos0, (kd, vd)).unwrap()));
    // MLA: 3 heads, latent 40, every other row restricted to the even keys.
    let mla = MlaShape {
        heads: 3,
        nope: 16,
        rope: 8,
        v: 12,
        kv_lora: 40,
        scale: 0.2,
    };
    let kv_b = g.upload(&values(3 * 28 * 40, seed + 3)).unwrap();
    let q = values(n * 3 * 24, seed + 4);
    let (latent, rope) = (values(total * 40, seed + 5), values(total * 8, seed + 6));
    let [ld, rd] = mirror.sync(k, 1, [&latent[..], &rope[..]]).unwrap();
    let even: Vec<Vec<usize>> = (0..n)
        .map(|s| (0..=pos0 + s).step_by(2).collect())
        .collect();
    let sel = |s: usize| (s % 2 == 1).then(|| &even[s][..]);
    out.push(bits(
        &g.mla_core(mla, &kv_b, &q, n, pos0, ld, rd, sel).unwrap(),
    ));
    // The indexer: 2 heads of 8 over the keys, the best 5 (a stale flag would add keys).
    let (iq, iw) = (values(n * 16, seed + 7), values(n * 2, seed + 8));
    let keys = values(total * 8, seed + 9);
    let [kd] = mirror.sync(k, 2, [&keys[..]]).unwrap();
    let kept = g.index_select(&iq, &iw, kd, (2, 8), n, pos0, 5).unwrap();
    let kept = kept.expect("rows past the top 5");
    for s in 0..n {
        out.push(kept.row(s).map(|t| t as u32).collect());
    }
    let mut x = values(n * 24, seed + 10);
    k.rms_norm_rows(&mut x, &values(24, seed + 11), 1e-6)
        .unwrap();
    out.push(bits(&x));
    out
}

/// After larger calls filled the slots (and a smaller one after them), each call gives the
/// bits kernels with new buffers give; the same call again makes no buffer.
#[test]
fn reused_kernel_buffers_give_the_bits_of_new_ones() {
    let Some(gpu) = vulkan("reused_kernel_buffers_give_the_bits_of_new_ones") else {
        return;
    };
    let reused = AttnGpu::new(gpu.clone()).unwrap();
    calls(&reused, 17, 90, 1);
    calls(&reused, 9, 60, 2);
    for (n, total, seed) in [(3, 40, 3), (1, 33, 4), (5, 70, 5)] {
        let fresh = AttnGpu::new(gpu.clone()).unwrap();
        let want = calls(&fresh, n, total, seed);
        let grows = reused.kernels().buffer_grows();
        assert_eq!(calls(&reused, n, total, seed), want, "{n} rows of {total}");
        assert_eq!(
            reused.kernels().buffer_grows(),
            grows,
            "{n} rows of {total}: smaller than the calls before, yet a buffer grew"
        );
    }
    // A fresh kernel set grows its buffers once per slot, then no more for the same call.
    let fresh = AttnGpu::new(gpu).unwrap();
    calls(&fresh, 3, 40, 6);
    let grows = fresh.kernels().buffer_grows();
    assert!(grows > 0);
    calls(&fresh, 3, 40, 6);
    assert_eq!(fresh.kernels().buffer_grows(), grows);
}
