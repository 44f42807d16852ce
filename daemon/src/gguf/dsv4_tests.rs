//! deepseek4 (DeepSeek-V4) GGUFs against the published checkpoint llama.cpp's converter made
//! them of (tests/fixtures/tiny-deepseek-v4-published): the same config as its config.json,
//! every tensor the checkpoint's under the engine's names with the same values (the FP8
//! matrices as dequantized, the FP4 experts as repacked into MXFP4 blocks, the hash table as
//! I32), and a file whose per-layer keys contradict its tensors refused naming the key.

use std::path::PathBuf;

use super::snap_tests::{fixtures, same_values};
use super::{snap, GgufError};
use crate::config::ModelConfig;
use crate::weights::{Dtype, ShardSet};

const PUB: &str = "tiny-deepseek-v4-published";

fn gguf(outtype: &str) -> PathBuf {
    fixtures().join(format!("gguf/{PUB}-{outtype}.gguf"))
}

#[test]
fn the_config_is_the_one_config_json_gives() {
    for outtype in ["f32", "q8_0"] {
        let mut from_gguf = snap::model_config(&gguf(outtype)).unwrap();
        let mut from_json = ModelConfig::load(&fixtures().join(PUB)).unwrap();
        from_gguf.eos_token_ids.sort_unstable();
        from_json.eos_token_ids.sort_unstable();
        assert_eq!(
            format!("{from_gguf:#?}"),
            format!("{from_json:#?}"),
            "{outtype}"
        );
    }
}

/// The published FP4 expert `name` (nibbles and their `.qs` E8M0 scales) as f32 values.
fn fp4_values(s: &ShardSet, name: &str) -> Vec<f32> {
    let blocks = s.bytes(name).unwrap();
    let qs = s.bytes(&format!("{name}.qs")).unwrap();
    let scales: Vec<f32> = qs
        .iter()
        .map(|&e| crate::quant::mxfp4::e8m0(e).unwrap())
        .collect();
    let mut out = vec![0.0; blocks.len() * 2];
    crate::quant::mxfp4::dequant_row(blocks, &scales, &mut out);
    out
}

#[test]
fn every_tensor_is_the_checkpoints_read_in_place() {
    let g = ShardSet::open(&[gguf("f32")]).unwrap();
    let s = ShardSet::open(&[fixtures().join(PUB)]).unwrap();
    // The checkpoint's scales are companions of their weights (dequantized with them); the
    // hash layers' router bias is not read (the converter drops it).
    let hash_bias = |n: &str| {
        ["model.layers.0.", "model.layers.1."]
            .iter()
            .any(|l| n.starts_with(l) && n.ends_with("ffn.gate.bias"))
    };
    let mut theirs: Vec<&str> = s
        .names()
        .filter(|n| !n.ends_with(".weight_scale_inv") && !n.ends_with(".qs") && !hash_bias(n))
        .collect();
    let mut ours: Vec<&str> = g.names().collect();
    theirs.sort_unstable();
    ours.sort_unstable();
    assert_eq!(ours, theirs);
    let (experts, rest): (Vec<&str>, Vec<&str>) =
        ours.iter().partition(|n| n.contains(".mlp.experts."));
    same_values(PUB, &g, &s, &rest);
    assert_eq!(experts.len(), 4 * 8 * 3);
    for n in experts {
        let t = g.get(n).unwrap();
        assert_eq!(t.dtype, Dtype::Ggml(super::GgmlType::MXFP4), "{n}");
        let got = g.read_f32(n, &t.shape).unwrap();
        let want = fp4_values(&s, n);
        assert_eq!(
            got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "{n}"
        );
    }
    let table = g.get("model.layers.1.ffn.gate.tid2eid").unwrap();
    assert_eq!(
        (table.dtype, table.shape.as_slice()),
        (Dtype::I32, &[320, 2][..])
    );
}

/// A copy of the F32 GGUF with the u32 or array value of metadata key `key` edited by `edit`
/// (given the bytes from the value's start), in a temp folder.
fn edited(key: &str, tag: &str, edit: impl FnOnce(&mut [u8])) -> PathBuf {
    let mut b = std::fs::read(gguf("f32")).unwrap();
    let k = key.as_bytes();
    let at = b
        .windows(k.len() + 8)
        .position(|w| w[..8] == (k.len() as u64).to_le_bytes() && &w[8..] == k)
        .unwrap();
    // The key, then its u32 type, then the value.
    edit(&mut b[at + 8 + k.len() + 4..]);
    let dir = std::env::temp_dir().join(format!("colibri-dsv4-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("m.gguf");
    std::fs::write(&p, b).unwrap();
    p
}

fn refused_key(p: &PathBuf) -> (String, String) {
    match snap::model_config(p).unwrap_err() {
        GgufError::Metadata { key, reason, .. } => (key, reason),
        e => panic!("refused otherwise: {e}"),
    }
}

#[test]
fn per_layer_keys_contradicting_the_tensors_are_refused_naming_the_key() {
    // Three hash layers: layer 2 routes by score (it has no table).
    let p = edited("deepseek4.hash_layer_count", "hash", |v| {
        assert_eq!(v[..4], 2u32.to_le_bytes());
        v[..4].copy_from_slice(&3u32.to_le_bytes());
    });
    let (key, reason) = refused_key(&p);
    assert_eq!(key, "deepseek4.hash_layer_count");
    assert!(reason.contains("layer 2 has no") && reason.contains("blk.2.ffn_gate_tid2eid"));
    // compress_ratios [0, 4, 8, 4] -> [4, 4, 8, 4]: layer 0 has no compressor.
    let p = edited("deepseek4.attention.compress_ratios", "ratios", |v| {
        // The element type (u32), the count (u64), then the ratios.
        let r = &mut v[4 + 8..];
        assert_eq!(r[..16], [0, 0, 0, 0, 4, 0, 0, 0, 8, 0, 0, 0, 4, 0, 0, 0]);
        r[0] = 4;
    });
    let (key, reason) = refused_key(&p);
    assert_eq!(key, "deepseek4.attention.compress_ratios");
    assert!(
        reason.contains("layer 0's ratio 4") && reason.contains("blk.0.attn_compressor_kv"),
        "{reason}"
    );
    // [0, 4, 8, 8]: layer 3 (CSA in the file) read as HCA would have an indexer it does not use.
    let p = edited("deepseek4.attention.compress_ratios", "ratios-hca", |v| {
        v[4 + 8 + 12] = 8;
    });
    let (key, reason) = refused_key(&p);
    assert_eq!(key, "deepseek4.attention.compress_ratios");
    assert!(reason.contains("layer 3's ratio 8"), "{reason}");
}

#[test]
fn a_router_llama_cpp_does_not_load_is_refused_naming_the_key() {
    let p = edited("deepseek4.expert_gating_func", "gating", |v| {
        assert_eq!(v[..4], 4u32.to_le_bytes());
        v[..4].copy_from_slice(&2u32.to_le_bytes());
    });
    let (key, reason) = refused_key(&p);
    assert_eq!(key, "deepseek4.expert_gating_func");
    assert!(reason.contains("sqrt(softplus)"), "{reason}");
}
