//! llama.cpp's qwen35moe against the checkpoint its converter read: every tensor of the
//! tiny fixture's GGUF is the safetensors one under the converter's transform (`+ 1` on the
//! zero-centred norms, `-exp` of `A_log`, the conv squeezed, the DeltaNet's value heads
//! tiled), and putting the heads back in grouped order gives the checkpoint's bits again.

use std::collections::BTreeSet;
use std::path::PathBuf;

use crate::model::delta_net::key_head;
use crate::weights::ShardSet;

const NAME: &str = "tiny-qwen35-moe";

fn open() -> (ShardSet, ShardSet) {
    let f = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let gguf = f.join(format!("gguf/{NAME}-f32.gguf"));
    (
        ShardSet::open(std::slice::from_ref(&gguf)).unwrap(),
        ShardSet::open(&[f.join(NAME)]).unwrap(),
    )
}

/// The converter's `_reorder_v_heads` as a permutation of `n_k * per_k` heads of `dim`
/// values: position `p` of the tiled order holds grouped position `tiled[p]` (the grouped
/// `(key head, value head in its group, d)` read as `(value head in its group, key head, d)`).
fn tiled(n_k: usize, per_k: usize, dim: usize) -> Vec<usize> {
    let mut out = Vec::with_capacity(n_k * per_k * dim);
    for v in 0..per_k {
        for k in 0..n_k {
            out.extend((0..dim).map(|d| (k * per_k + v) * dim + d));
        }
    }
    out
}

/// Rows `at..at + perm.len()` of a (rows, cols) matrix taken in the order `perm` gives
/// (`perm[p]`: the row, from `at`, that goes to position `p`); `inverse`: put back.
fn permute_rows(w: &[f32], cols: usize, at: usize, perm: &[usize], inverse: bool) -> Vec<f32> {
    let mut out = w.to_vec();
    for (p, &from) in perm.iter().enumerate() {
        let (dst, src) = match inverse {
            false => (at + p, at + from),
            true => (at + from, at + p),
        };
        out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
    }
    out
}

/// The same on the columns of a (rows, cols) matrix.
fn permute_cols(w: &[f32], cols: usize, perm: &[usize], inverse: bool) -> Vec<f32> {
    let mut out = w.to_vec();
    for r in 0..w.len() / cols {
        for (p, &from) in perm.iter().enumerate() {
            let (dst, src) = match inverse {
                false => (p, from),
                true => (from, p),
            };
            out[r * cols + dst] = w[r * cols + src];
        }
    }
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn every_tensor_is_the_checkpoints_under_the_converters_transform_and_back() {
    let (g, s) = open();
    let cfg = super::snap::model_config(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(format!("../tests/fixtures/gguf/{NAME}-f32.gguf")),
    )
    .unwrap();
    let d = cfg.hybrid().unwrap().delta;
    let per_k = d.value_heads / d.key_heads;
    assert!(
        per_k > 1,
        "the fixture must have grouped value heads to test their order"
    );
    let heads = tiled(d.key_heads, per_k, d.value_head_dim);
    let scalars = tiled(d.key_heads, per_k, 1);
    let qk = 2 * d.key_dim();
    let mut seen = BTreeSet::new();
    for n in g.names() {
        let gi = g.get(n).unwrap();
        let ours = g.read_f32(n, &gi.shape).unwrap();
        // (the checkpoint's name, its values as the converter writes them, and the GGUF's
        // put back as the checkpoint holds them, where that is a permutation).
        let (hf, forward, back): (String, Vec<f32>, Option<Vec<f32>>) =
            if let Some(base) = n.strip_suffix(".centred_weight") {
                let hf = format!("{base}.weight");
                let w = s.read_f32(&hf, &s.get(&hf).unwrap().shape).unwrap();
                (hf, w.iter().map(|x| x + 1.0).collect(), None)
            } else if let Some(base) = n.strip_suffix(".A") {
                let hf = format!("{base}.A_log");
                let w = s.read_f32(&hf, &[d.value_heads]).unwrap();
                let a: Vec<f32> = w.iter().map(|x| -x.exp()).collect();
                let back = permute_rows(&ours, 1, 0, &scalars, true);
                // torch's exp and Rust's may differ in the last place; the log takes it back.
                for (x, y) in back.iter().zip(&a) {
                    assert!((x - y).abs() <= y.abs() * f32::EPSILON, "{n}: {x} {y}");
                }
                seen.insert(hf);
                continue;
            } else if n.contains(".linear_attn.") {
                let hf = n.to_string();
                let w = s.read_f32(&hf, &s.get(&hf).unwrap().shape).unwrap();
                // A vector's values are rows of one.
                let cols = if gi.shape.len() == 1 {
                    1
                } else {
                    *gi.shape.last().unwrap()
                };
                let (fwd, back) = match n.rsplit('.').nth(1).unwrap() {
                    "in_proj_qkv" | "conv1d" => (
                        permute_rows(&w, cols, qk, &heads, false),
                        permute_rows(&ours, cols, qk, &heads, true),
                    ),
                    "in_proj_z" => (
                        permute_rows(&w, cols, 0, &heads, false),
                        permute_rows(&ours, cols, 0, &heads, true),
                    ),
                    "in_proj_a" | "in_proj_b" | "linear_attn" => (
                        permute_rows(&w, cols, 0, &scalars, false),
                        permute_rows(&ours, cols, 0, &scalars, true),
                    ),
                    "out_proj" => (
                        permute_cols(&w, cols, &heads, false),
                        permute_cols(&ours, cols, &heads, true),
                    ),
                    // The gated norm's weight is one head's, shared by all.
                    "norm" => (w.clone(), ours.clone()),
                    other => panic!("{n}: a DeltaNet tensor this test does not know ({other})"),
                };
                (hf, fwd, Some(back))
            } else {
                let w = s.read_f32(n, &s.get(n).unwrap().shape).unwrap();
                (n.to_string(), w.clone(), Some(w))
            };
        let hf_values = s.read_f32(&hf, &s.get(&hf).unwrap().shape).unwrap();
        assert_eq!(bits(&ours), bits(&forward), "{n}");
        if let Some(back) = back {
            assert_eq!(bits(&back), bits(&hf_values), "{n} put back");
        }
        assert!(seen.insert(hf.clone()), "{hf} twice");
    }
    // Nothing of the checkpoint left out (it has no MTP block).
    let all: BTreeSet<String> = s.names().map(str::to_string).collect();
    assert_eq!(seen, all);
}

/// In the tiled order value head `j` holds grouped head `tiled[j]`: the DeltaNet's tiled
/// mapping gives it that head's key head, so each state sees the queries and keys it did.
#[test]
fn a_tiled_value_head_reads_the_key_head_its_grouped_self_did() {
    for (n_k, per_k) in [(2, 2), (16, 2), (2, 16), (3, 5), (4, 1)] {
        let perm = tiled(n_k, per_k, 1);
        for (j, &h) in perm.iter().enumerate() {
            assert_eq!(
                key_head(j, per_k, n_k, true),
                key_head(h, per_k, n_k, false),
                "{n_k} key heads, {per_k} value heads each: tiled {j} is grouped {h}"
            );
        }
        // A permutation: putting it back gives every head once.
        let back = permute_rows(
            &perm.iter().map(|&x| x as f32).collect::<Vec<_>>(),
            1,
            0,
            &perm,
            true,
        );
        assert_eq!(back, (0..n_k * per_k).map(|x| x as f32).collect::<Vec<_>>());
    }
}

/// The converter keeps a published Qwen3.5's MTP block unless told `--no-mtp` (blk.3 past
/// the trunk, a full-attention layer and its nextn.*): colibri has no Qwen3.5 draft head, so
/// none of it is read, the trunk is the same tensors at the same bytes as the GGUF without
/// it, and no name lands where GLM's MTP loader would look (`model.layers.3.eh_proj`).
#[test]
fn the_mtp_block_is_left_unread() {
    let f = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gguf");
    let with = ShardSet::open(&[f.join(format!("{NAME}-mtp-f32.gguf"))]).unwrap();
    let (without, _) = open();
    let names = |s: &ShardSet| s.names().map(String::from).collect::<BTreeSet<_>>();
    assert_eq!(names(&with), names(&without));
    assert!(!with.names().any(|n| n.starts_with("model.layers.3.")));
    for n in without.names() {
        let (a, b) = (with.get(n).unwrap(), without.get(n).unwrap());
        assert_eq!((a.dtype, &a.shape), (b.dtype, &b.shape), "{n}");
        assert_eq!(
            bits(&with.read_f32(n, &a.shape).unwrap()),
            bits(&without.read_f32(n, &b.shape).unwrap()),
            "{n}"
        );
    }
    // The metadata counts the block (4 blocks, 1 MTP layer): the trunk is still 3 layers.
    let cfg = super::snap::model_config(&f.join(format!("{NAME}-mtp-f32.gguf"))).unwrap();
    assert_eq!(cfg.num_hidden_layers, 3);
}
