//! DeepSeek-V4 through the engine's [`Model`] against transformers' oracle
//! (`tests/fixtures/tiny-deepseek-v4`, `scripts/make_fixture_deepseek_v4.py`): teacher-forced
//! logits and greedy continuations, one token a step and whole chunks a step (the batched
//! prefill), a batch of two sequences against each alone, and a state copied midway.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::batch::SeqStep;
use super::{KvCache, LoadOptions, Logits, Model};
use crate::config::ModelConfig;
use crate::weights::ShardSet;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-deepseek-v4")
}

fn load() -> Model {
    let dir = fixture();
    let cfg = ModelConfig::load(&dir).unwrap();
    let s = Arc::new(ShardSet::open(&[dir]).unwrap());
    Model::load(cfg, s, LoadOptions::default()).unwrap()
}

fn reference() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(fixture().join("ref.json")).unwrap()).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn argmax(x: &[f32]) -> u32 {
    super::ops::argmax(x) as u32
}

/// The logits of `tokens` fed `chunk` at a time from an empty cache, every position's.
fn teacher_forced(m: &Model, tokens: &[u32], chunk: usize) -> Vec<f32> {
    let mut kv = m.new_cache();
    let mut out = Vec::new();
    for c in tokens.chunks(chunk) {
        out.extend(m.forward(&mut kv, c, Logits::All).unwrap());
    }
    assert_eq!(kv.len(), tokens.len());
    out
}

/// Teacher-forced over the oracle's whole sequence (one token a step, and in chunks of 5 and
/// whole): every position's argmax and logits as transformers' uncached forward gives them;
/// then greedy from the prompt (prefilled whole), token for token the oracle's continuation.
fn check(case: &str) {
    let m = load();
    let r = reference();
    let c = &r[case];
    let full = ids(&c["full_ids"]);
    let prompt = ids(&c["prompt_ids"]);
    let tf = ids(&c["tf_pred"]);
    let raw = std::fs::read(fixture().join(c["logits_file"].as_str().unwrap())).unwrap();
    let want = crate::weights::f32_le(&raw);
    let v = m.cfg.vocab_size;
    let one = teacher_forced(&m, &full, 1);
    for chunk in [5, full.len()] {
        // Rows of a chunk through a layer at a time: the same numbers as one a step.
        assert_eq!(
            teacher_forced(&m, &full, chunk),
            one,
            "{case}: chunks of {chunk}"
        );
    }
    let mut worst = 0f32;
    for (p, row) in one.chunks_exact(v).enumerate() {
        assert_eq!(argmax(row), tf[p], "{case}: teacher-forced argmax at {p}");
        for (g, w) in row.iter().zip(&want[p * v..(p + 1) * v]) {
            worst = worst.max((g - w).abs());
        }
    }
    assert!(worst < 1e-3, "{case}: logits differ by up to {worst}");
    let mut kv = m.new_cache();
    let mut seq = prompt.clone();
    let mut logits = m.forward(&mut kv, &prompt, Logits::Last).unwrap();
    while seq.len() < full.len() {
        let t = argmax(&logits);
        seq.push(t);
        logits = m.forward(&mut kv, &[t], Logits::Last).unwrap();
    }
    assert_eq!(seq, full, "{case}: greedy continuation");
}

#[test]
fn short_case_is_token_exact_against_transformers() {
    check("short");
}

#[test]
fn long_case_past_every_window_and_rate_is_token_exact() {
    let r = reference();
    let n = r["long"]["full_ids"].as_array().unwrap().len();
    let cfg = ModelConfig::load(&fixture()).unwrap();
    let d = cfg.dsv4().unwrap();
    // The case is long enough to mean something: past the window, several HCA blocks,
    // and more CSA entries than the indexer keeps.
    assert!(n > 2 * d.sliding_window && n >= 4 * d.hca_rate);
    assert!(n / d.csa_rate > 2 * d.index_topk);
    assert!(r["long"]["sparse_rows"].as_u64().unwrap() > 0);
    check("long");
}

/// Two sequences in one forward give each the logits it gets alone, bit for bit, and leave
/// each cache as its own forward does.
#[test]
fn a_batch_of_two_equals_each_alone() {
    let m = load();
    let r = reference();
    let (a, b) = (ids(&r["long"]["full_ids"]), ids(&r["short"]["full_ids"]));
    let alone = |t: &[u32], pre: &[u32]| {
        let mut kv = m.new_cache();
        m.forward(&mut kv, pre, Logits::None).unwrap();
        (m.forward(&mut kv, t, Logits::All).unwrap(), kv)
    };
    let (want_a, kva) = alone(&a[13..20], &a[..13]);
    let (want_b, kvb) = alone(&b[4..6], &b[..4]);
    let (mut ka, mut kb) = (m.new_cache(), m.new_cache());
    m.forward(&mut ka, &a[..13], Logits::None).unwrap();
    m.forward(&mut kb, &b[..4], Logits::None).unwrap();
    let mut seqs = [
        SeqStep {
            kv: &mut ka,
            tokens: &a[13..20],
            logits: Logits::All,
        },
        SeqStep {
            kv: &mut kb,
            tokens: &b[4..6],
            logits: Logits::All,
        },
    ];
    let mut got = Vec::new();
    m.forward_batch(&mut seqs, &mut got).unwrap();
    let split = want_a.len();
    assert!(got[..split] == want_a[..] && got[split..] == want_b[..]);
    let state = |kv: &KvCache| format!("{:?}", kv.layers);
    assert_eq!((state(&ka), state(&kb)), (state(&kva), state(&kvb)));
}

/// A cache copied midway continues as the original does; cut below its end it forgets the
/// whole state (which cannot be cut) and, fed again, gives the same logits.
#[test]
fn a_state_copied_or_cut_resumes_exactly() {
    let m = load();
    let full = ids(&reference()["long"]["full_ids"]);
    let mut a = m.new_cache();
    m.forward(&mut a, &full[..21], Logits::None).unwrap();
    let mut b = a.clone();
    let rest = &full[21..];
    assert_eq!(
        m.forward(&mut a, rest, Logits::All).unwrap(),
        m.forward(&mut b, rest, Logits::All).unwrap()
    );
    let mut c = a.clone();
    c.truncate(30);
    assert_eq!(c.len(), 0, "a V4 state is not cut back: forgotten whole");
    let again = m.forward(&mut c, &full, Logits::All).unwrap();
    assert_eq!(again, teacher_forced(&m, &full, 1));
}

/// The state snapshot `.coli_kv` keeps beside its records gives back the state exactly.
#[test]
fn the_state_snapshot_resumes_exactly() {
    let m = load();
    let full = ids(&reference()["long"]["full_ids"]);
    let mut kv = m.new_cache();
    m.forward(&mut kv, &full[..27], Logits::None).unwrap();
    let bytes = crate::kv_state::encode(&kv);
    let mut back = m.new_cache();
    for &t in &full[..27] {
        back.push_record(t, &[]);
    }
    crate::kv_state::apply(&mut back, &bytes).unwrap();
    assert_eq!(format!("{:?}", back.layers), format!("{:?}", kv.layers));
    let rest = &full[27..];
    assert_eq!(
        m.forward(&mut back, rest, Logits::All).unwrap(),
        m.forward(&mut kv, rest, Logits::All).unwrap()
    );
}

/// The RAM clamp's figures for a V4 cache (`dsv4_state::sizes`) bound what the state holds at
/// every length of the long case: the window and open compressor windows never pass the fixed
/// part, the compressed entries never pass the per-position part and trail it by less than a
/// window of every compressor.
#[test]
fn the_clamp_counts_bound_the_state_at_every_length() {
    use super::kv::LayerKv;
    let m = load();
    let full = ids(&reference()["long"]["full_ids"]);
    let d = m.cfg.dsv4().unwrap();
    let (fixed, per_pos) = super::dsv4_state::sizes(d, m.cfg.num_hidden_layers);
    let mut kv = m.new_cache();
    assert_eq!(kv.state_bytes(), fixed * 4);
    assert_eq!(kv.bytes_per_position(), per_pos * 4);
    let slack = per_pos * d.csa_rate.max(d.hca_rate);
    for (p, &t) in full.iter().enumerate() {
        m.forward(&mut kv, &[t], Logits::None).unwrap();
        let (mut held, mut entries) = (0, 0);
        for l in &kv.layers {
            let LayerKv::Dsv4(s) = l else {
                panic!("V4 layers")
            };
            held += s.state.window.iter().map(Vec::len).sum::<usize>();
            for c in [&s.state.compressor, &s.state.indexer] {
                held += c.buf_kv.len() + c.buf_gate.len();
                held += c.prior.as_ref().map_or(0, |(k, g)| k.len() + g.len());
                entries += c.entries.len();
            }
        }
        assert!(held <= fixed, "position {p}: {held} > {fixed}");
        assert!(entries <= per_pos * (p + 1), "position {p}");
        assert!(per_pos * (p + 1) - entries <= slack, "position {p}");
    }
}

/// `dense_bytes` counts every tensor of the f32 fixture but the routed experts (the hash
/// tables' ids as 4 bytes each, as they are held), and `prefill_macs_per_position` every
/// matrix of its layers (the attention's, compressors', indexer's, hyper-connections', the
/// shared expert and the router) plus `num_experts_per_tok` routed experts per layer: the
/// sums of the checkpoint's own tensors, read from its safetensors header.
#[test]
fn dense_bytes_and_prefill_macs_count_every_tensor() {
    let m = load();
    let bytes = std::fs::read(fixture().join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let (mut elems, mut macs) = (0u64, 0u64);
    for (name, t) in header.as_object().unwrap() {
        if name == "__metadata__" || name.contains(".ffn.experts.") {
            continue;
        }
        let shape: Vec<u64> = (t["shape"].as_array().unwrap().iter())
            .map(|d| d.as_u64().unwrap())
            .collect();
        let e: u64 = shape.iter().product();
        elems += e;
        // The compressors' position biases (`ape`) are 2-D but added, not multiplied.
        let matrix = shape.len() == 2 && t["dtype"] == "F32" && !name.ends_with(".ape");
        if name.starts_with("model.layers.") && matrix {
            macs += e;
        }
    }
    let c = &m.cfg;
    let experts = c.num_hidden_layers * c.num_experts_per_tok * 3;
    macs += (experts * c.moe_intermediate_size * c.hidden_size) as u64;
    assert_eq!(m.dense_bytes() as u64, 4 * elems);
    assert_eq!(m.prefill_macs_per_position(), macs);
}

/// The fit check's projection (`engine::projected_dense_bytes`) is what loading takes, at
/// `--dense-bits 8` and 32: the attention's, compressors' and indexer's projections in the
/// format asked for, the hyper-connection mixers, position biases, router and hash tables f32.
/// At 8 bits the model reports int8 and its quantized products keep the batched prefill equal
/// to one token a step, bit for bit, and its greedy tokens mostly the f32 model's.
#[test]
fn the_projected_dense_bytes_are_the_loaded_ones() {
    use crate::quant::QFormat;
    let full = ids(&reference()["long"]["full_ids"]);
    let mut bytes = Vec::new();
    let mut models = Vec::new();
    for fmt in [QFormat::I8Row, QFormat::F32] {
        let dir = fixture();
        let cfg = ModelConfig::load(&dir).unwrap();
        let s = Arc::new(ShardSet::open(&[dir]).unwrap());
        let opts = LoadOptions {
            dense_fmt: fmt,
            ..LoadOptions::default()
        };
        let projected = crate::engine::projected_dense_bytes(&s, &opts);
        let m = Model::load(cfg, s, opts).unwrap();
        assert_eq!(m.dense_format(), fmt);
        assert_eq!(projected, m.dense_bytes() as u64, "{fmt:?}");
        bytes.push(projected);
        models.push(m);
    }
    assert!(
        bytes[0] < bytes[1],
        "int8 projections are smaller: {bytes:?}"
    );
    let q8 = &models[0];
    let one = teacher_forced(q8, &full, 1);
    assert_eq!(teacher_forced(q8, &full, 7), one, "int8: chunks of 7");
    let f32s = teacher_forced(&models[1], &full, 1);
    assert_ne!(one, f32s, "the int8 products are not the f32 ones");
    let v = q8.cfg.vocab_size;
    let same = (one.chunks_exact(v).zip(f32s.chunks_exact(v)))
        .filter(|(a, b)| argmax(a) == argmax(b))
        .count();
    assert!(
        same * 4 >= full.len() * 3,
        "{same} of {} argmaxes agree",
        full.len()
    );
}
