//! The reader against files gguf-py's `GGUFWriter` wrote (tests/fixtures/gguf/small.gguf and
//! a two-part split set, with what gguf-py's `GGUFReader` reads from them in the .json next
//! to each), and against corrupted copies of them.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::*;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/gguf")
        .join(name)
}

fn json(name: &str) -> Value {
    serde_json::from_slice(&std::fs::read(fixture(name)).unwrap()).unwrap()
}

/// Our value as gguf-py's `contents()` renders it, for comparison with the .json.
fn to_json(v: &GgufValue) -> Value {
    match v {
        GgufValue::U8(x) => (*x).into(),
        GgufValue::I8(x) => (*x).into(),
        GgufValue::U16(x) => (*x).into(),
        GgufValue::I16(x) => (*x).into(),
        GgufValue::U32(x) => (*x).into(),
        GgufValue::I32(x) => (*x).into(),
        GgufValue::F32(x) => (*x as f64).into(),
        GgufValue::Bool(x) => (*x).into(),
        GgufValue::String(x) => x.clone().into(),
        GgufValue::U64(x) => (*x).into(),
        GgufValue::I64(x) => (*x).into(),
        GgufValue::F64(x) => (*x).into(),
        GgufValue::Array(_, xs) => Value::Array(xs.iter().map(to_json).collect()),
    }
}

/// Checks one file's metadata and tensors against gguf-py's description of it.
fn check_against(model: &GgufModel, part: &GgufFile, want: &Value) {
    let meta = want["metadata"].as_object().unwrap();
    assert_eq!(
        part.metadata.len(),
        meta.len(),
        "{}: key count",
        part.path().display()
    );
    for (key, w) in meta {
        let got = part.get(key).unwrap_or_else(|| panic!("key {key} missing"));
        let mut types = vec![got.type_id()];
        if let GgufValue::Array(elem, _) = got {
            types.push(*elem);
        }
        let want_types: Vec<u32> = w["types"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(types, want_types, "key {key}: types");
        assert_eq!(to_json(got), w["value"], "key {key}: value");
    }
    let tensors = want["tensors"].as_array().unwrap();
    assert_eq!(part.tensors.len(), tensors.len());
    for w in tensors {
        let name = w["name"].as_str().unwrap();
        let t = model
            .tensor(name)
            .unwrap_or_else(|| panic!("tensor {name} missing"));
        let ne: Vec<u64> = w["ne"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        assert_eq!(t.ne, ne, "{name}: ne");
        assert_eq!(
            t.ty.id() as u64,
            w["type"].as_u64().unwrap(),
            "{name}: type"
        );
        assert_eq!(t.offset, w["offset"].as_u64().unwrap(), "{name}: offset");
        assert_eq!(t.n_bytes, w["n_bytes"].as_u64().unwrap(), "{name}: bytes");
        let mut got = vec![0f32; t.n_elems() as usize];
        model.dequantize(t, &mut got).unwrap();
        let want_bits: Vec<u32> = w["f32_bits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        let got_bits: Vec<u32> = got.iter().map(|x| x.to_bits()).collect();
        assert_eq!(got_bits, want_bits, "{name}: dequantized values");
    }
}

#[test]
fn reads_what_gguf_py_wrote() {
    let m = GgufModel::open(&fixture("small.gguf")).unwrap();
    assert_eq!(m.parts.len(), 1);
    assert_eq!(m.parts[0].version, 3);
    assert_eq!(m.parts[0].alignment, 32);
    check_against(&m, &m.parts[0], &json("small.json"));
    let tokens = m.get("tokenizer.ggml.tokens").unwrap();
    assert_eq!(
        to_json(tokens),
        serde_json::json!(["<unk>", "hello", " wörld", "\n"])
    );
}

#[test]
fn reads_a_split_set_from_its_first_part() {
    let m = GgufModel::open(&fixture("split-00001-of-00002.gguf")).unwrap();
    assert_eq!(m.parts.len(), 2);
    let want = json("split.json");
    for (i, part) in m.parts.iter().enumerate() {
        check_against(&m, part, &want["parts"][i]);
    }
    assert_eq!(m.tensors().count(), 5);
    let exps = m.tensor("blk.0.ffn_gate_exps.weight").unwrap();
    assert_eq!(exps.part, 1);
    assert_eq!(m.tensor_path(exps), fixture("split-00002-of-00002.gguf"));
}

/// A scratch directory of this test's own.
fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("colibri-gguf-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn a_missing_split_part_is_refused_by_name() {
    let d = scratch("split");
    let first = d.join("m-00001-of-00002.gguf");
    std::fs::copy(fixture("split-00001-of-00002.gguf"), &first).unwrap();
    let err = GgufModel::open(&first).unwrap_err();
    let missing = d.join("m-00002-of-00002.gguf");
    assert!(
        matches!(&err, GgufError::MissingPart { path, part: 2, count: 2 } if *path == missing),
        "{err}"
    );
    // The second part alone is not a model either: it is not the first.
    std::fs::copy(fixture("split-00002-of-00002.gguf"), &missing).unwrap();
    let err = GgufModel::open(&missing).unwrap_err();
    assert!(matches!(err, GgufError::Split { .. }), "{err}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// Byte position of tensor `name`'s info fields: (dims start, type id, offset).
fn tensor_info_at(b: &[u8], name: &str) -> (usize, usize, usize) {
    let mut pat = (name.len() as u64).to_le_bytes().to_vec();
    pat.extend_from_slice(name.as_bytes());
    let at = b
        .windows(pat.len())
        .position(|w| w == pat.as_slice())
        .unwrap()
        + pat.len();
    let n_dims = u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
    let ty = at + 4 + 8 * n_dims;
    (at + 4, ty, ty + 4)
}

/// Writes `bytes` to a scratch file and opens it.
fn open_bytes(tag: &str, bytes: &[u8]) -> (PathBuf, GgufError) {
    let d = scratch(tag);
    let p = d.join("bad.gguf");
    std::fs::write(&p, bytes).unwrap();
    let err = GgufModel::open(&p).expect_err("a corrupted file was accepted");
    std::fs::remove_dir_all(&d).unwrap();
    (p, err)
}

fn tensor_of(err: &GgufError) -> Option<&str> {
    match err {
        GgufError::Tensor { tensor, .. }
        | GgufError::UnknownType { tensor, .. }
        | GgufError::Contradiction { tensor, .. } => Some(tensor),
        _ => None,
    }
}

#[test]
fn corrupted_files_are_refused_naming_what_is_wrong() {
    let good = std::fs::read(fixture("small.gguf")).unwrap();
    let last = "blk.0.ffn_down.weight";

    let mut b = good.clone();
    b[0..4].copy_from_slice(b"GGUG");
    let (_, err) = open_bytes("magic", &b);
    assert!(
        matches!(&err, GgufError::BadMagic { found, .. } if found == b"GGUG"),
        "{err}"
    );

    // Cut inside the header, then inside the last tensor's data.
    for cut in [3, 20, 100, 700] {
        let (_, err) = open_bytes("trunc-header", &good[..cut]);
        assert!(
            matches!(
                err,
                GgufError::Truncated { .. } | GgufError::AbsurdCount { .. }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("truncated"), "{err}");
    }
    let (_, err) = open_bytes("trunc-data", &good[..good.len() - 10]);
    assert_eq!(err.exit_code(), 2);
    assert_eq!(tensor_of(&err), Some(last), "{err}");
    assert!(err.to_string().contains("past the end"), "{err}");

    let mut b = good.clone();
    let (_, ty, off) = tensor_info_at(&b, last);
    b[off..off + 8].copy_from_slice(&(1u64 << 20).to_le_bytes());
    let (_, err) = open_bytes("offset", &b);
    assert_eq!(tensor_of(&err), Some(last), "{err}");
    assert!(err.to_string().contains("past the end"), "{err}");

    let mut b = good.clone();
    b[ty..ty + 4].copy_from_slice(&31u32.to_le_bytes());
    let (_, err) = open_bytes("type", &b);
    assert!(
        matches!(&err, GgufError::UnknownType { tensor, id: 31, .. } if tensor == last),
        "{err}"
    );

    // Point the last tensor at the first one's bytes.
    let mut b = good.clone();
    let (_, _, first_off) = tensor_info_at(&b, "token_embd.weight");
    let first = b[first_off..first_off + 8].to_vec();
    b[off..off + 8].copy_from_slice(&first);
    let (_, err) = open_bytes("overlap", &b);
    assert!(err.to_string().contains("overlap"), "{err}");

    // A row length that is not a whole number of blocks (Q4_K blocks are 256).
    let mut b = good.clone();
    let (dims, _, _) = tensor_info_at(&b, last);
    b[dims..dims + 8].copy_from_slice(&100u64.to_le_bytes());
    let (_, err) = open_bytes("block", &b);
    assert_eq!(tensor_of(&err), Some(last), "{err}");
    assert!(err.to_string().contains("multiple of Q4_K"), "{err}");
}

#[test]
fn hostile_counts_are_refused_before_allocating() {
    let good = std::fs::read(fixture("small.gguf")).unwrap();
    for (at, what) in [(8, "tensor infos"), (16, "metadata key/values")] {
        let mut b = good.clone();
        b[at..at + 8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
        let (_, err) = open_bytes("count", &b);
        assert!(
            matches!(&err, GgufError::AbsurdCount { what: w, .. } if w == what),
            "{err}"
        );
    }
    // An array claiming 2^40 strings.
    let mut b = good.clone();
    let key = b"tokenizer.ggml.tokens";
    let at = b.windows(key.len()).position(|w| w == key).unwrap() + key.len() + 4 + 4;
    b[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let (_, err) = open_bytes("array", &b);
    assert!(
        matches!(&err, GgufError::AbsurdCount { what, .. } if what == "tokenizer.ggml.tokens"),
        "{err}"
    );
}

#[test]
fn metadata_contradicting_a_shape_is_refused_naming_key_and_tensor() {
    let mut b = std::fs::read(fixture("small.gguf")).unwrap();
    let key = b"llama.expert_count";
    let at = b.windows(key.len()).position(|w| w == key).unwrap() + key.len() + 4;
    b[at..at + 4].copy_from_slice(&5u32.to_le_bytes());
    let (_, err) = open_bytes("contradiction", &b);
    assert!(
        matches!(&err, GgufError::Contradiction { key, tensor, .. }
            if key == "llama.expert_count" && tensor == "blk.0.ffn_gate_exps.weight"),
        "{err}"
    );
}

#[test]
fn expert_ranges_are_the_experts_rows() {
    let m = GgufModel::open(&fixture("small.gguf")).unwrap();
    let t = m.tensor("blk.0.ffn_gate_exps.weight").unwrap();
    assert_eq!(
        (t.ne.as_slice(), t.ty),
        (&[64u64, 4, 3][..], GgmlType::Q4_0)
    );
    let mut all = vec![0f32; t.n_elems() as usize];
    m.dequantize(t, &mut all).unwrap();
    let file = m.parts[t.part].bytes();
    let per_expert = (64 * 4) as usize;
    let mut prev_end = t.offset;
    for e in 0..3u64 {
        let r = expert_range(t, e).unwrap();
        assert_eq!(
            r.start,
            prev_end,
            "expert {e} follows expert {}",
            e.wrapping_sub(1)
        );
        assert_eq!(r.end - r.start, 4 * 2 * 18, "4 rows of two Q4_0 blocks");
        prev_end = r.end;
        let mut one = vec![0f32; per_expert];
        dequantize_row(t.ty, &file[r.start as usize..r.end as usize], &mut one).unwrap();
        let e = e as usize;
        assert_eq!(one, all[e * per_expert..(e + 1) * per_expert], "expert {e}");
    }
    assert_eq!(prev_end, t.offset + t.n_bytes);
    assert!(matches!(
        expert_range(t, 3),
        Err(GgufError::NotExperts { .. })
    ));
    let flat = m.tensor("token_embd.weight").unwrap();
    assert!(matches!(
        expert_range(flat, 0),
        Err(GgufError::NotExperts { .. })
    ));
}

#[test]
fn parse_never_panics_on_any_prefix_or_single_byte_flip() {
    // Every prefix of the file and every byte set to 0xFF: an error or a model, never a
    // panic or an allocation the file's size does not bound.
    let good = std::fs::read(fixture("small.gguf")).unwrap();
    let path = Path::new("fuzz.gguf");
    for n in 0..good.len() {
        let _ = file::parse(&good[..n], path, 0);
    }
    for i in 0..good.len() {
        let mut b = good.clone();
        b[i] = 0xFF;
        let _ = file::parse(&b, path, 0);
    }
}

#[test]
fn a_150k_token_vocabulary_parses_quickly() {
    // The size of a large tokenizer.ggml.tokens (Qwen/GLM vocabularies are ~150k).
    const N: usize = 150_000;
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    let key = b"tokenizer.ggml.tokens";
    b.extend_from_slice(&(key.len() as u64).to_le_bytes());
    b.extend_from_slice(key);
    b.extend_from_slice(&9u32.to_le_bytes());
    b.extend_from_slice(&8u32.to_le_bytes());
    b.extend_from_slice(&(N as u64).to_le_bytes());
    for i in 0..N {
        let s = format!("tok{i}");
        b.extend_from_slice(&(s.len() as u64).to_le_bytes());
        b.extend_from_slice(s.as_bytes());
    }
    let t0 = std::time::Instant::now();
    let p = file::parse(&b, Path::new("vocab.gguf"), 0).unwrap();
    let took = t0.elapsed();
    eprintln!("parsed {N} token strings ({} bytes) in {took:?}", b.len());
    let GgufValue::Array(8, toks) = &p.metadata[0].1 else {
        panic!("not an array of strings")
    };
    assert_eq!(toks.len(), N);
    assert_eq!(toks[N - 1], GgufValue::String(format!("tok{}", N - 1)));
}

/// A GGUF v3 file from parts: `kvs` as (key, value type, encoded value), `tensors` as
/// (name, ne, type id, offset), then `data` zero bytes after the 32-aligned data start.
fn build(
    kvs: &[(&str, u32, Vec<u8>)],
    tensors: &[(&str, &[u64], u32, u64)],
    data: usize,
) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    b.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
    let string = |b: &mut Vec<u8>, s: &str| {
        b.extend_from_slice(&(s.len() as u64).to_le_bytes());
        b.extend_from_slice(s.as_bytes());
    };
    for (k, ty, v) in kvs {
        string(&mut b, k);
        b.extend_from_slice(&ty.to_le_bytes());
        b.extend_from_slice(v);
    }
    for (name, ne, ty, off) in tensors {
        string(&mut b, name);
        b.extend_from_slice(&(ne.len() as u32).to_le_bytes());
        for d in *ne {
            b.extend_from_slice(&d.to_le_bytes());
        }
        b.extend_from_slice(&ty.to_le_bytes());
        b.extend_from_slice(&off.to_le_bytes());
    }
    b.resize(b.len().div_ceil(32) * 32 + data, 0);
    b
}

#[test]
fn malformed_tables_are_refused_by_name() {
    let p = Path::new("built.gguf");
    let ok = build(&[], &[("a", &[32], 0, 0), ("b", &[32], 0, 128)], 256);
    let parsed = file::parse(&ok, p, 0).unwrap();
    assert_eq!(
        parsed.tensors[1].range().end - parsed.tensors[1].range().start,
        128
    );

    let dup = build(&[], &[("a", &[32], 0, 0), ("a", &[32], 0, 128)], 256);
    let err = file::parse(&dup, p, 0).err().unwrap();
    assert!(
        matches!(&err, GgufError::Tensor { tensor, reason, .. } if tensor == "a" && reason.contains("twice")),
        "{err}"
    );

    let dims = build(&[], &[("five", &[1, 1, 1, 1, 32], 0, 0)], 128);
    let err = file::parse(&dims, p, 0).err().unwrap();
    assert!(
        matches!(&err, GgufError::Tensor { tensor, .. } if tensor == "five"),
        "{err}"
    );

    let unaligned = build(&[], &[("a", &[32], 0, 4)], 256);
    let err = file::parse(&unaligned, p, 0).err().unwrap();
    assert!(err.to_string().contains("alignment"), "{err}");

    let key = |k: &str, v: u32| (k.to_string(), 4u32, v.to_le_bytes().to_vec());
    let (k, t, v) = key("general.alignment", 48);
    let err = file::parse(&build(&[(&k, t, v)], &[], 0), p, 0)
        .err()
        .unwrap();
    assert!(
        matches!(&err, GgufError::Metadata { key, .. } if key == "general.alignment"),
        "{err}"
    );

    let (k, t, v) = key("x", 1);
    let err = file::parse(&build(&[(&k, t, v.clone()), (&k, t, v)], &[], 0), p, 0)
        .err()
        .unwrap();
    assert!(
        matches!(&err, GgufError::Metadata { key, reason, .. } if key == "x" && reason.contains("twice")),
        "{err}"
    );

    let err = file::parse(&build(&[("y", 13, vec![0; 8])], &[], 0), p, 0)
        .err()
        .unwrap();
    assert!(
        matches!(&err, GgufError::Metadata { key, .. } if key == "y"),
        "{err}"
    );

    let mut v1 = build(&[], &[], 0);
    v1[4] = 1;
    let err = file::parse(&v1, p, 0).err().unwrap();
    assert!(
        matches!(err, GgufError::Version { version: 1, .. }),
        "{err}"
    );
}
