//! glm-dsa (GLM-5) and deepseek32 (DeepSeek-V3.2) GGUFs against the checkpoints llama.cpp's
//! converter made them of: the same config as their config.json, every tensor the
//! checkpoint's read in place (kv_b_proj rebuilt from its halves), and a file whose
//! per-layer keys contradict its tensors refused naming the key.

use std::path::{Path, PathBuf};

use super::snap_tests::{fixtures, same_values};
use super::{snap, GgufError};
use crate::config::ModelConfig;
use crate::weights::ShardSet;

/// The fixtures: GLM-5 with attention biases and every indexer full, GLM-5 with a dense
/// layer and shared indexers, DeepSeek-V3.2 (YaRN, grouped routing).
const FIXTURES: [&str; 3] = ["tiny-moe-bias", "tiny-dense-shared", "tiny-deepseek-v32"];

fn gguf(name: &str) -> PathBuf {
    fixtures().join(format!("gguf/{name}-f32.gguf"))
}

#[test]
fn the_config_is_the_one_config_json_gives() {
    for name in FIXTURES {
        let mut from_gguf = snap::model_config(&gguf(name)).unwrap();
        let mut from_json = ModelConfig::load(&fixtures().join(name)).unwrap();
        from_gguf.eos_token_ids.sort_unstable();
        from_json.eos_token_ids.sort_unstable();
        // tiny-dense-shared's config.json says first_k_dense_replace 3 against mlp_layer_types'
        // one dense layer (transformers reads the list); the GGUF's key says the list's 1
        // (make_gguf_fixtures.sh), which places the layers as the list does.
        assert_eq!(
            format!("{from_gguf:#?}"),
            format!("{from_json:#?}"),
            "{name}"
        );
    }
}

#[test]
fn every_tensor_is_the_checkpoints_read_in_place() {
    for name in FIXTURES {
        let g = ShardSet::open(&[gguf(name)]).unwrap();
        let s = ShardSet::open(&[fixtures().join(name)]).unwrap();
        let mut theirs: Vec<&str> = s.names().filter(|n| !n.contains("kv_b_proj")).collect();
        let mut ours: Vec<&str> = g
            .names()
            .filter(|n| !n.contains("k_b_proj") && !n.contains("v_b_proj"))
            .collect();
        theirs.sort_unstable();
        ours.sort_unstable();
        assert_eq!(ours, theirs, "{name}");
        assert!(ours.iter().any(|n| n.contains("indexer.wq_b")), "{name}");
        same_values(name, &g, &s, &ours);
    }
}

/// A copy of `name`'s GGUF with `edit` applied to its bytes, in a temp folder.
fn edited(name: &str, tag: &str, edit: impl FnOnce(&mut Vec<u8>)) -> PathBuf {
    let mut b = std::fs::read(gguf(name)).unwrap();
    edit(&mut b);
    let dir = std::env::temp_dir().join(format!("colibri-gguf-dsa-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("{name}-{tag}.gguf"));
    std::fs::write(&p, b).unwrap();
    p
}

/// The byte offset of metadata key `key`'s value (after its u64 length, bytes and u32 type).
fn value_at(b: &[u8], key: &str) -> usize {
    let k = key.as_bytes();
    let at = b
        .windows(k.len() + 8)
        .position(|w| w[..8] == (k.len() as u64).to_le_bytes() && &w[8..] == k)
        .unwrap_or_else(|| panic!("no key {key}"));
    at + 8 + k.len() + 4
}

fn refused_key(p: &Path) -> (String, String) {
    let e = snap::model_config(p).unwrap_err();
    assert_eq!(e.exit_code(), 2, "{e}");
    match &e {
        GgufError::Metadata { key, .. } => (key.clone(), e.to_string()),
        other => panic!("{other}"),
    }
}

#[test]
fn per_layer_keys_contradicting_the_tensors_are_refused_naming_the_key() {
    // tiny-dense-shared's indexer types [full, shared, full, shared] with layer 1 made full:
    // it has no indexer tensors. The array: u32 element type, u64 count, then one byte each.
    let p = edited("tiny-dense-shared", "types", |b| {
        let v = value_at(b, "glm-dsa.attention.indexer.types") + 4 + 8;
        assert_eq!(b[v..v + 4], [1, 0, 1, 0]);
        b[v + 1] = 1;
    });
    let (key, msg) = refused_key(&p);
    assert_eq!(key, "glm-dsa.attention.indexer.types", "{msg}");
    assert!(msg.contains("layer 1 is full"), "{msg}");
    // Its leading dense layers 1 -> 2: layer 1 has a router.
    let p = edited("tiny-dense-shared", "dense", |b| {
        let v = value_at(b, "glm-dsa.leading_dense_block_count");
        assert_eq!(b[v..v + 4], 1u32.to_le_bytes());
        b[v..v + 4].copy_from_slice(&2u32.to_le_bytes());
    });
    let (key, msg) = refused_key(&p);
    assert_eq!(key, "glm-dsa.leading_dense_block_count", "{msg}");
    assert!(msg.contains("layer 1 has a router"), "{msg}");
    // DeepSeek-V3.2's 1 -> 0: layer 0 is dense.
    let p = edited("tiny-deepseek-v32", "dense", |b| {
        let v = value_at(b, "deepseek32.leading_dense_block_count");
        b[v..v + 4].copy_from_slice(&0u32.to_le_bytes());
    });
    let (key, msg) = refused_key(&p);
    assert_eq!(key, "deepseek32.leading_dense_block_count", "{msg}");
    assert!(msg.contains("layer 0 has no router"), "{msg}");
    // The indexer's head count is the tensors' (the shape check the parser cannot make is
    // the loader's): absent, refused naming it.
    let p = edited("tiny-deepseek-v32", "heads", |b| {
        let at = value_at(b, "deepseek32.attention.indexer.head_count");
        let k = b"deepseek32.attention.indexer.head_count";
        // Rename the key in place (same length), so the file holds no such key.
        let start = at - 4 - k.len();
        b[start..start + k.len()].copy_from_slice(b"deepseek32.attention.indexer.xxxx_count");
    });
    let (key, msg) = refused_key(&p);
    assert_eq!(key, "deepseek32.attention.indexer.head_count", "{msg}");
    std::fs::remove_dir_all(p.parent().unwrap()).unwrap();
}

#[test]
fn an_mtp_block_is_mapped_as_the_heads_loader_reads_it() {
    // tiny-moe-bias plus an MTP block (make_gguf_fixtures.sh): blk.3 is layer 2's weights
    // with the head's own; the trunk is tiny-moe-bias's, tensor for tensor.
    let mtp = ShardSet::open(&[fixtures().join("gguf/tiny-moe-bias-mtp-f32.gguf")]).unwrap();
    let trunk = ShardSet::open(&[gguf("tiny-moe-bias")]).unwrap();
    let cfg = snap::model_config(&fixtures().join("gguf/tiny-moe-bias-mtp-f32.gguf")).unwrap();
    assert_eq!(cfg.num_hidden_layers, 3);
    assert!(crate::model::mtp::Mtp::present(&mtp, &cfg));
    assert!(!crate::model::mtp::Mtp::present(&trunk, &cfg));
    let (head, rest): (Vec<&str>, Vec<&str>) =
        mtp.names().partition(|n| n.starts_with("model.layers.3."));
    let mut want: Vec<&str> = trunk.names().collect();
    let mut rest = rest;
    want.sort_unstable();
    rest.sort_unstable();
    assert_eq!(rest, want);
    for n in [
        "eh_proj.weight",
        "enorm.weight",
        "hnorm.weight",
        "shared_head.norm.weight",
    ] {
        assert!(
            head.contains(&format!("model.layers.3.{n}").as_str()),
            "{n}"
        );
    }
    for n in head
        .iter()
        .filter(|n| !n.contains("norm") && !n.contains("eh_proj"))
    {
        let twin = n.replace("model.layers.3.", "model.layers.2.");
        let (a, b) = (mtp.get(n).unwrap(), trunk.get(&twin).unwrap());
        assert_eq!(a.shape, b.shape, "{n}");
        assert_eq!(
            mtp.read_f32(n, &a.shape).unwrap(),
            trunk.read_f32(&twin, &b.shape).unwrap(),
            "{n}"
        );
    }
}
