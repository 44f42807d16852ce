//! The CPU MLA core's tests: the absorbed path against the reconstruct path, and a decode
//! step's head-by-head core against the key-outer tiles.

use super::*;
use crate::quant::{QFormat, QMatrix};

/// Deterministic values in [-1, 1) (the GPU core's test uses them too).
pub(super) fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// The CPU core of `mla` for `n` query rows `q` at positions `pos0..` over every key of
/// `kv` (restricted to `sel` where it has rows), on `path`, f32 activations, no device:
/// the heads' outputs, `(n, heads * v)`.
pub(super) fn cpu_core(
    mla: &Mla,
    d: MlaDims,
    rope: &Rope,
    path: AttnPath,
    (q, n, pos0): (&[f32], usize, usize),
    kv: &MlaKv,
    sel: &Selection,
) -> Vec<f32> {
    let cx = AttnCtx {
        dims: d,
        rope,
        index_topk: kv.latent.len() / d.kv_lora,
        path,
        act: ActMode::F32,
        place: &crate::model::placement::CPU,
    };
    let (mut by_head, mut heads, mut tile, mut stripes, mut rebuild) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let core = CoreScratch {
        by_head: &mut by_head,
        heads: &mut heads,
        tile: &mut tile,
        stripes: &mut stripes,
        rebuild: &mut rebuild,
    };
    let mut out = vec![0.0; n * d.heads * d.v];
    let mut q = q.to_vec();
    // These tests' rows are one block: `Auto` gives them one path, as the engine would.
    let absorbed = super::split_rows(path, n, pos0, d.nope + d.v) == 0;
    assert!(path != AttnPath::Auto || n <= super::AUTO_BLOCK);
    mla.attend(
        &cx,
        (&mut q, None),
        (n, pos0, absorbed),
        kv,
        sel,
        core,
        &mut out,
    );
    out
}

/// The key-outer absorbed core (several key tasks, several latent stripes, the parallel
/// path, a DSA selection with gaps) computes what the reconstruct path computes.
#[test]
fn absorbed_tiles_agree_with_reconstruct() {
    let d = MlaDims {
        heads: 4,
        nope: 16,
        rope: 8,
        v: 16,
        kv_lora: 3 * STRIPE - 8,
        softmax_factor: 1.0,
        interleave: true,
    };
    let (qk, nv, l) = (d.nope + d.rope, d.nope + d.v, d.kv_lora);
    let total = 3 * KEYS_PER_TASK + 37;
    let linear = |rows: usize, cols: usize, seed: u64| Linear {
        w: QMatrix::from_f32(
            values(rows * cols, seed).iter().map(|v| v * 0.2).collect(),
            rows,
            cols,
        ),
        bias: None,
        slot: Default::default(),
    };
    let mla = Mla {
        q: QProj::LowRank {
            a: linear(8, 8, 1),
            norm: vec![1.0; 8],
            b: linear(d.heads * qk, 8, 2),
        },
        kv_a: linear(l + d.rope, 8, 3),
        kv_a_norm: vec![1.0; l],
        kv_b: linear(d.heads * nv, l, 4),
        o: linear(8, d.heads * d.v, 5),
        indexer: None,
    };
    let kv = MlaKv {
        latent: values(total * l, 6),
        rope: values(total * d.rope, 7),
        ..MlaKv::default()
    };
    let rope = Rope::new(d.rope, 10000.0);
    let n = 2;
    let q = values(n * d.heads * qk, 8);
    let pos0 = total - n;
    // Row 0 attends to every visible key; row 1 to a selection with gaps.
    let mut sel = Selection::with_capacity(n, total);
    sel.begin(n);
    sel.keep(1, (0..total).filter(|t| t % 3 != 1));
    let run = |path| cpu_core(&mla, d, &rope, path, (&q, n, pos0), &kv, &sel);
    let absorbed = run(AttnPath::Absorbed);
    let reconstructed = run(AttnPath::Reconstruct);
    let scale = reconstructed.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(scale > 0.0);
    for (i, (a, r)) in absorbed.iter().zip(&reconstructed).enumerate() {
        assert!(
            (a - r).abs() <= 1e-4 * scale,
            "output {i}: absorbed {a} vs reconstruct {r}"
        );
    }
    // The tiling is fixed, not chosen by the thread count: the same bits on one thread.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    assert_eq!(pool.install(|| run(AttnPath::Absorbed)), absorbed);
}

/// A decode step's head-by-head core gives the key-outer tiles' bits, over every visible
/// key and over a selection with gaps, in parallel and on one thread.
#[test]
fn absorbed_by_head_matches_by_key_bit_for_bit() {
    let d = MlaDims {
        heads: 6,
        nope: 16,
        rope: 8,
        v: 24,
        kv_lora: 3 * STRIPE - 8,
        softmax_factor: 1.0,
        interleave: true,
    };
    let (qk, nv, l) = (d.nope + d.rope, d.nope + d.v, d.kv_lora);
    let total = 2 * KEYS_PER_TASK + 45;
    let linear = |rows: usize, cols: usize, w: Vec<f32>| Linear {
        w: QMatrix::from_f32(w, rows, cols),
        bias: None,
        slot: Default::default(),
    };
    // Only kv_b_proj takes part in the core; the other projections are placeholders.
    let kv_b: Vec<f32> = values(d.heads * nv * l, 4)
        .iter()
        .map(|v| v * 0.2)
        .collect();
    let mla = Mla {
        q: QProj::Full(linear(d.heads * qk, 8, vec![0.0; d.heads * qk * 8])),
        kv_a: linear(l + d.rope, 8, vec![0.0; (l + d.rope) * 8]),
        kv_a_norm: vec![1.0; l],
        kv_b: linear(d.heads * nv, l, kv_b),
        o: linear(8, d.heads * d.v, vec![0.0; 8 * d.heads * d.v]),
        indexer: None,
    };
    let kv = MlaKv {
        latent: values(total * l, 6),
        rope: values(total * d.rope, 7),
        ..MlaKv::default()
    };
    let rope = Rope::new(d.rope, 10000.0);
    let q = values(d.heads * qk, 8);
    let pos0 = total - 1;
    let all = Selection::with_capacity(1, total);
    let mut gaps = Selection::with_capacity(1, total);
    gaps.begin(1);
    gaps.keep(0, (0..total).filter(|t| t % 5 != 2));
    for act in [ActMode::F32, ActMode::Int8] {
        let cx = AttnCtx {
            dims: d,
            rope: &rope,
            index_topk: total,
            path: AttnPath::Absorbed,
            act,
            place: &crate::model::placement::CPU,
        };
        for sel in [&all, &gaps] {
            let block = head_block_len(l, 1, total);
            let run = |by_key: bool, work: usize| {
                let mut by_head = vec![0.0; d.heads * d.v];
                let mut scratch = vec![0.0; d.heads * block];
                if by_key {
                    let (mut tile, mut stripes) = (Vec::new(), Vec::new());
                    let bufs = (&mut tile, &mut stripes);
                    let (h, s) = (&mut by_head, &mut scratch);
                    mla.absorbed_by_key(&cx, &q, 1, pos0, &kv, sel, h, s, block, bufs);
                } else {
                    let (h, s) = (&mut by_head, &mut scratch);
                    let q = QHeads::Rotated(&q);
                    mla.absorbed_by_head(&cx, q, &kv, (sel, pos0), h, s, block, work);
                }
                by_head
            };
            let want = run(true, 0);
            assert!(want.iter().any(|&v| v != 0.0));
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for work in [0, PARALLEL_WORK] {
                assert_eq!(bits(&run(false, work)), bits(&want), "{act:?}, work {work}");
            }
        }
    }
}

/// A decode step whose query heads the head-by-head core projects in its tasks gives the bits
/// of the heads projected (`q_b_proj`, then the rotation) before the core, with f32 weights
/// and f32 activations and with int8 rows and int8 activations.
#[test]
fn deferred_query_heads_give_the_projected_heads_bits() {
    let d = MlaDims {
        heads: 5,
        nope: 16,
        rope: 8,
        v: 16,
        kv_lora: 96,
        softmax_factor: 1.0,
        interleave: true,
    };
    let (qk, nv, l, rank) = (d.nope + d.rope, d.nope + d.v, d.kv_lora, 40);
    let total = 77;
    let linear = |w: QMatrix| Linear {
        w,
        bias: None,
        slot: Default::default(),
    };
    let f32s = |rows: usize, cols: usize, seed: u64| {
        let w: Vec<f32> = values(rows * cols, seed).iter().map(|v| v * 0.2).collect();
        QMatrix::from_f32(w, rows, cols)
    };
    let kv = MlaKv {
        latent: values(total * l, 6),
        rope: values(total * d.rope, 7),
        ..MlaKv::default()
    };
    let rope = Rope::new(d.rope, 10000.0);
    let q_resid = values(rank, 9);
    let pos0 = total - 1;
    let sel = Selection::with_capacity(1, total);
    for (act, fmt) in [(ActMode::F32, None), (ActMode::Int8, Some(QFormat::I8Row))] {
        let q_b = f32s(d.heads * qk, rank, 2);
        let q_b = match fmt {
            Some(fmt) => QMatrix::quantize(&q_b.dequantize(), d.heads * qk, rank, fmt),
            None => q_b,
        };
        let mla = Mla {
            q: QProj::Full(linear(f32s(d.heads * qk, 8, 1))),
            kv_a: linear(f32s(l + d.rope, 8, 3)),
            kv_a_norm: vec![1.0; l],
            kv_b: linear(f32s(d.heads * nv, l, 4)),
            o: linear(f32s(8, d.heads * d.v, 5)),
            indexer: None,
        };
        let cx = AttnCtx {
            dims: d,
            rope: &rope,
            index_topk: total,
            path: AttnPath::Absorbed,
            act,
            place: &crate::model::placement::CPU,
        };
        let q_b = linear(q_b);
        let dq = DeferredQ {
            q_b: &q_b,
            q_resid: &q_resid,
        };
        let block = head_block_len(l, 1, total);
        let run = |q: QHeads| {
            let mut by_head = vec![0.0; d.heads * d.v];
            let mut scratch = vec![0.0; d.heads * block];
            let (h, s) = (&mut by_head, &mut scratch);
            mla.absorbed_by_head(&cx, q, &kv, (&sel, pos0), h, s, block, PARALLEL_WORK);
            by_head.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        };
        let mut q = vec![0.0; d.heads * qk];
        dq.project(&cx, pos0, &mut q);
        let want = run(QHeads::Rotated(&q));
        assert!(want.iter().any(|&b| b != 0), "{act:?}");
        assert_eq!(run(QHeads::Deferred(dq)), want, "{act:?}");
    }
}
