//! Acceptance tests of the loading layer: safetensors shards (valid and hostile), config.json
//! validation, and the byte-exact tokenizer.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use colibri::config::{ConfigError, IndexerKind, MlpKind, ModelConfig};
use colibri::tokenizer::Tokenizer;
use colibri::weights::{Dtype, ShardSet, WeightsError};

// ---------------------------------------------------------------------------------------------
// helpers

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("colibri-loading-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    fn sub(&self, name: &str) -> PathBuf {
        let d = self.0.join(name);
        std::fs::create_dir_all(&d).expect("create subdir");
        d
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes `8-byte length + header + data` verbatim.
fn write_raw(path: &Path, header: &str, data: &[u8]) {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    std::fs::write(path, bytes).expect("write shard");
}

/// Writes a well-formed shard with tensors laid out back to back.
fn write_shard(path: &Path, tensors: &[(&str, &str, &[usize], Vec<u8>)]) {
    let mut entries = Vec::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let begin = data.len();
        data.extend_from_slice(bytes);
        entries.push(format!(
            r#""{name}":{{"dtype":"{dtype}","shape":{shape:?},"data_offsets":[{begin},{}]}}"#,
            data.len()
        ));
    }
    let header = format!(
        r#"{{"__metadata__":{{"format":"pt"}},{}}}"#,
        entries.join(",")
    );
    write_raw(path, &header, &data);
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn u16_bytes(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn open_err(dirs: &[PathBuf]) -> WeightsError {
    match ShardSet::open(dirs) {
        Ok(_) => panic!("open succeeded; expected an error"),
        Err(e) => e,
    }
}

/// Opens a single shard holding `header` + `data` and returns the error it must produce.
fn broken_shard(tag: &str, header: &str, data: &[u8]) -> (TempDir, WeightsError) {
    let tmp = TempDir::new(tag);
    write_raw(&tmp.join("model.safetensors"), header, data);
    let err = open_err(&[tmp.path().to_path_buf()]);
    (tmp, err)
}

fn assert_tensor_err(err: &WeightsError, tensor: &str, needle: &str) {
    match err {
        WeightsError::Tensor {
            file,
            tensor: t,
            reason,
        } => {
            assert!(file.ends_with("model.safetensors"), "{err}");
            assert_eq!(t, tensor, "{err}");
            assert!(reason.contains(needle), "{err}");
        }
        other => panic!("expected a Tensor error about {tensor}, got {other:?}"),
    }
}

fn assert_header_err(err: &WeightsError, needle: &str) {
    match err {
        WeightsError::Header { file, reason } => {
            assert!(file.ends_with("model.safetensors"), "{err}");
            assert!(reason.contains(needle), "{err}");
        }
        other => panic!("expected a Header error, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// safetensors: valid sets

#[test]
fn two_shards_across_two_directories_first_wins_by_file_name() {
    let tmp = TempDir::new("twodirs");
    let a = tmp.sub("a");
    let b = tmp.sub("b");
    write_shard(
        &a.join("model-00001.safetensors"),
        &[("x.weight", "F32", &[2], f32_bytes(&[1.0, 2.0]))],
    );
    // Same file name in both: a's copy wins, so b's "y" (a duplicate otherwise) is never read.
    write_shard(
        &a.join("model-00002.safetensors"),
        &[("y.weight", "F32", &[1], f32_bytes(&[10.0]))],
    );
    write_shard(
        &b.join("model-00002.safetensors"),
        &[("y.weight", "F32", &[1], f32_bytes(&[20.0]))],
    );
    write_shard(
        &b.join("model-00003.safetensors"),
        &[("z.weight", "U8", &[3], vec![7, 8, 9])],
    );
    std::fs::write(b.join("README.md"), "not a shard").unwrap();

    let set = ShardSet::open(&[a.clone(), b.clone()]).expect("open");
    assert_eq!(set.num_files(), 3);
    let names: Vec<&str> = set.names().collect();
    assert_eq!(names, ["x.weight", "y.weight", "z.weight"]);
    assert_eq!(set.read_f32("y.weight", &[1]).unwrap(), vec![10.0]);
    let y = set.get("y.weight").unwrap();
    assert_eq!(set.file_path(y.file), a.join("model-00002.safetensors"));
    let z = set.get("z.weight").unwrap();
    assert_eq!(set.file_path(z.file), b.join("model-00003.safetensors"));
    assert_eq!(
        (z.dtype, z.shape.as_slice(), z.len),
        (Dtype::U8, &[3][..], 3)
    );
    assert!(set.contains("x.weight") && !set.contains("w.weight"));
    assert_eq!(set.bytes("z.weight").unwrap(), &[7, 8, 9]);

    // read_at sees the same bytes as the map, at the absolute offset.
    let mut buf = [0u8; 3];
    set.read_at(z.file, z.offset, &mut buf).unwrap();
    assert_eq!(buf, [7, 8, 9]);

    // Reversed search path: b's copy of model-00002 wins now.
    let set = ShardSet::open(&[b, a]).expect("open reversed");
    assert_eq!(set.read_f32("y.weight", &[1]).unwrap(), vec![20.0]);
}

#[test]
fn bf16_f16_f32_convert_to_f32() {
    let tmp = TempDir::new("dtypes");
    // bf16: 1.0, -2.5, 0.15625, 3.140625, -0.0
    let bf16 = u16_bytes(&[0x3F80, 0xC020, 0x3E20, 0x4049, 0x8000]);
    // f16: 1.0, -2.0, 0.5, 65504 (max), 2^-24 (smallest subnormal)
    let f16 = u16_bytes(&[0x3C00, 0xC000, 0x3800, 0x7BFF, 0x0001]);
    let f32v = [0.1f32, -7.25, 1e-30, f32::MAX, 0.0, 42.0];
    write_shard(
        &tmp.join("model.safetensors"),
        &[
            ("a.bf16", "BF16", &[5], bf16),
            ("b.f16", "F16", &[5], f16),
            ("c.f32", "F32", &[2, 3], f32_bytes(&f32v)),
            ("d.i8", "I8", &[2], vec![0xFF, 0x01]),
            ("e.empty", "F32", &[0, 4], Vec::new()),
        ],
    );
    let set = ShardSet::open(&[tmp.path().to_path_buf()]).unwrap();
    assert_eq!(
        set.read_f32("a.bf16", &[5]).unwrap(),
        vec![1.0, -2.5, 0.15625, 3.140625, -0.0]
    );
    assert_eq!(
        set.read_f32("b.f16", &[5]).unwrap(),
        vec![1.0, -2.0, 0.5, 65504.0, 2f32.powi(-24)]
    );
    assert_eq!(set.read_f32("c.f32", &[2, 3]).unwrap(), f32v.to_vec());
    assert_eq!(set.read_f32("e.empty", &[0, 4]).unwrap(), Vec::<f32>::new());
    assert_eq!(set.bytes("d.i8").unwrap(), &[0xFF, 0x01]);
    match set.read_f32("d.i8", &[2]) {
        Err(WeightsError::Dtype { name, dtype }) => {
            assert_eq!((name.as_str(), dtype), ("d.i8", Dtype::I8));
        }
        other => panic!("expected Dtype error, got {other:?}"),
    }
}

#[test]
fn missing_tensor_is_named() {
    let tmp = TempDir::new("missing");
    write_shard(
        &tmp.join("model.safetensors"),
        &[("a", "F32", &[1], f32_bytes(&[1.0]))],
    );
    let set = ShardSet::open(&[tmp.path().to_path_buf()]).unwrap();
    match set.read_f32("model.norm.weight", &[1]) {
        Err(e @ WeightsError::Missing { .. }) => {
            assert_eq!(
                e.to_string(),
                "tensor \"model.norm.weight\" is not in any shard"
            );
        }
        other => panic!("expected Missing, got {other:?}"),
    }
    assert!(matches!(
        set.bytes("nope"),
        Err(WeightsError::Missing { name }) if name == "nope"
    ));
}

#[test]
fn shape_mismatch_names_expected_and_found() {
    let tmp = TempDir::new("shape");
    write_shard(
        &tmp.join("model.safetensors"),
        &[("w", "F32", &[2, 3], f32_bytes(&[0.0; 6]))],
    );
    let set = ShardSet::open(&[tmp.path().to_path_buf()]).unwrap();
    match set.read_f32("w", &[3, 2]) {
        Err(e @ WeightsError::Shape { .. }) => {
            assert_eq!(
                e.to_string(),
                "tensor \"w\" has shape [2, 3], expected [3, 2]"
            );
        }
        other => panic!("expected Shape, got {other:?}"),
    }
}

#[test]
fn read_at_past_the_end_or_after_truncation_is_an_error() {
    let tmp = TempDir::new("readat");
    let path = tmp.join("model.safetensors");
    write_shard(&path, &[("w", "U8", &[64], vec![5u8; 64])]);
    let set = ShardSet::open(&[tmp.path().to_path_buf()]).unwrap();
    let w = set.get("w").unwrap().clone();
    let mut buf = vec![0u8; 64];
    set.read_at(w.file, w.offset, &mut buf).unwrap();
    assert!(buf.iter().all(|b| *b == 5));

    // Truncate the file under the open set: pread reports it, naming file and offset.
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(w.offset + 10).unwrap();
    drop(f);
    match set.read_at(w.file, w.offset, &mut buf) {
        Err(e @ WeightsError::Read { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("model.safetensors"), "{msg}");
            assert!(msg.contains(&format!("offset {}", w.offset)), "{msg}");
        }
        other => panic!("expected Read error, got {other:?}"),
    }
    assert!(matches!(
        set.read_at(99, 0, &mut buf),
        Err(WeightsError::Read { .. })
    ));
}

// ---------------------------------------------------------------------------------------------
// safetensors: hostile and broken files

#[test]
fn header_length_larger_than_file() {
    let tmp = TempDir::new("hdrlen");
    let mut bytes = 1000u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    std::fs::write(tmp.join("model.safetensors"), bytes).unwrap();
    let err = open_err(&[tmp.path().to_path_buf()]);
    assert_header_err(
        &err,
        "header length 1000 runs past the end of the 10-byte file",
    );
}

#[test]
fn header_length_over_limit() {
    let tmp = TempDir::new("hdrhuge");
    let mut bytes = u64::MAX.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    std::fs::write(tmp.join("model.safetensors"), bytes).unwrap();
    let err = open_err(&[tmp.path().to_path_buf()]);
    assert_header_err(&err, "exceeds the 100000000-byte limit");
}

#[test]
fn header_not_json() {
    let (_t, err) = broken_shard("notjson", "this is not json", &[]);
    assert_header_err(&err, "not a JSON object");
    let (_t, err) = broken_shard("notobject", "[1, 2, 3]", &[]);
    assert_header_err(&err, "not a JSON object");
}

#[test]
fn data_offsets_past_the_end_truncated_shard() {
    let tmp = TempDir::new("trunc");
    let path = tmp.join("model.safetensors");
    write_shard(
        &path,
        &[
            ("a", "F32", &[4], f32_bytes(&[1.0; 4])),
            ("b", "F32", &[4], f32_bytes(&[2.0; 4])),
        ],
    );
    let full = std::fs::read(&path).unwrap();
    std::fs::write(&path, &full[..full.len() - 5]).unwrap();
    let err = open_err(&[tmp.path().to_path_buf()]);
    assert_tensor_err(&err, "b", "run past the end of the 27-byte data section");
}

#[test]
fn overlapping_tensors() {
    let header = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                     "b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    let (_t, err) = broken_shard("overlap", header, &[0u8; 12]);
    assert_tensor_err(&err, "b", "overlap tensor \"a\"");
}

#[test]
fn dtype_times_shape_differs_from_byte_length() {
    let header = r#"{"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}}"#;
    let (_t, err) = broken_shard("bytelen", header, &[0u8; 8]);
    assert_tensor_err(&err, "w", "is 6 bytes but data_offsets [0, 8] hold 8");
}

#[test]
fn unknown_dtype_is_named() {
    let header = r#"{"w":{"dtype":"F8_E5M2","shape":[4],"data_offsets":[0,4]}}"#;
    let (_t, err) = broken_shard("dtype", header, &[0u8; 4]);
    assert_tensor_err(&err, "w", "dtype \"F8_E5M2\" is not supported");
}

#[test]
fn huge_shape_overflows_without_allocating() {
    let header =
        r#"{"w":{"dtype":"F32","shape":[1099511627776,1099511627776],"data_offsets":[0,4]}}"#;
    let (_t, err) = broken_shard("overflow", header, &[0u8; 4]);
    assert_tensor_err(&err, "w", "overflow");
    let header = r#"{"w":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,4]}}"#;
    let (_t, err) = broken_shard("bigdim", header, &[0u8; 4]);
    assert_tensor_err(&err, "w", "not an integer in 0..=");
}

#[test]
fn begin_after_end_and_malformed_entries() {
    let header = r#"{"w":{"dtype":"U8","shape":[0],"data_offsets":[4,2]}}"#;
    let (_t, err) = broken_shard("beginend", header, &[0u8; 4]);
    assert_tensor_err(&err, "w", "begin > end");
    let header = r#"{"w":{"dtype":"U8","shape":[2]}}"#;
    let (_t, err) = broken_shard("nooffsets", header, &[0u8; 4]);
    assert_tensor_err(&err, "w", "data_offsets");
    let header = r#"{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},
                     "w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
    let (_t, err) = broken_shard("dupkey", header, &[0u8; 2]);
    assert_tensor_err(&err, "w", "listed twice");
}

#[test]
fn duplicate_tensor_across_files_names_both() {
    let tmp = TempDir::new("dup");
    write_shard(
        &tmp.join("model-1.safetensors"),
        &[("w", "U8", &[1], vec![1])],
    );
    write_shard(
        &tmp.join("model-2.safetensors"),
        &[("w", "U8", &[1], vec![2])],
    );
    match open_err(&[tmp.path().to_path_buf()]) {
        WeightsError::Duplicate {
            name,
            first,
            second,
        } => {
            assert_eq!(name, "w");
            assert_eq!(first, tmp.join("model-1.safetensors"));
            assert_eq!(second, tmp.join("model-2.safetensors"));
        }
        other => panic!("expected Duplicate, got {other:?}"),
    }
}

#[test]
fn zero_length_file() {
    let tmp = TempDir::new("empty");
    std::fs::write(tmp.join("model.safetensors"), b"").unwrap();
    let err = open_err(&[tmp.path().to_path_buf()]);
    assert_header_err(&err, "0 bytes");
    assert!(err.to_string().contains("model.safetensors"), "{err}");
}

#[test]
fn directory_with_no_shards() {
    let tmp = TempDir::new("noshards");
    std::fs::write(tmp.join("config.json"), "{}").unwrap();
    match open_err(&[tmp.path().to_path_buf()]) {
        e @ WeightsError::NoShards { .. } => {
            assert!(e.to_string().contains("no *.safetensors files in"), "{e}");
            assert!(e.to_string().contains(&tmp.path().display().to_string()));
        }
        other => panic!("expected NoShards, got {other:?}"),
    }
    let gone = tmp.join("does-not-exist");
    assert!(matches!(
        open_err(std::slice::from_ref(&gone)),
        WeightsError::Io { path, .. } if path == gone
    ));
}

// ---------------------------------------------------------------------------------------------
// config.json

/// The tiny model of the reference (§6): V=674, hidden 64, 4 layers, 16 experts.
const TINY: &str = r#"{
  "architectures": ["GlmMoeDsaForCausalLM"],
  "model_type": "glm_moe_dsa",
  "vocab_size": 674, "hidden_size": 64, "intermediate_size": 128,
  "moe_intermediate_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
  "num_key_value_heads": 4, "n_shared_experts": 1, "n_routed_experts": 16,
  "num_experts_per_tok": 4, "routed_scaling_factor": 2.5, "norm_topk_prob": true,
  "n_group": 1, "topk_group": 1, "kv_lora_rank": 32, "q_lora_rank": 32,
  "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16, "head_dim": 8,
  "hidden_act": "silu", "rms_norm_eps": 1e-05,
  "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
  "attention_bias": false, "index_topk": 16, "index_head_dim": 16, "index_n_heads": 32,
  "first_k_dense_replace": 1,
  "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
  "indexer_types": ["full", "shared", "full", "shared"],
  "eos_token_id": [660, 663, 665], "bos_token_id": null, "pad_token_id": 0,
  "max_position_embeddings": 4096, "tie_word_embeddings": false,
  "num_nextn_predict_layers": 1, "indexer_rope_interleave": true
}"#;

/// TINY with `key` replaced by the JSON `value` (or removed when `value` is None).
fn tiny_with(edits: &[(&str, Option<&str>)]) -> String {
    let mut v: serde_json::Value = serde_json::from_str(TINY).unwrap();
    let obj = v.as_object_mut().unwrap();
    for (key, value) in edits {
        match value {
            Some(val) => {
                obj.insert(key.to_string(), serde_json::from_str(val).unwrap());
            }
            None => {
                obj.remove(*key);
            }
        }
    }
    v.to_string()
}

fn cfg(edits: &[(&str, Option<&str>)]) -> Result<ModelConfig, ConfigError> {
    ModelConfig::from_json(&tiny_with(edits))
}

fn cfg_err(edits: &[(&str, Option<&str>)]) -> ConfigError {
    match cfg(edits) {
        Ok(c) => panic!("config {edits:?} accepted: {c:?}"),
        Err(e) => e,
    }
}

#[test]
fn full_valid_config() {
    let c = ModelConfig::from_json(TINY).unwrap();
    assert_eq!(c.vocab_size, 674);
    assert_eq!(c.hidden_size, 64);
    assert_eq!(c.intermediate_size, 128);
    assert_eq!(c.moe_intermediate_size, 32);
    assert_eq!(c.num_hidden_layers, 4);
    assert_eq!(c.num_attention_heads, 4);
    assert_eq!((c.n_shared_experts, c.n_routed_experts), (1, 16));
    assert_eq!(c.num_experts_per_tok, 4);
    assert_eq!(c.routed_scaling_factor, 2.5);
    assert!(c.norm_topk_prob);
    let m = c.mla().unwrap();
    assert_eq!((m.kv_lora_rank, m.q_lora_rank), (32, Some(32)));
    assert_eq!(
        (m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim),
        (8, 16, 16)
    );
    assert_eq!(m.qk_head_dim(), 24);
    assert_eq!(c.rms_norm_eps, 1e-5);
    assert_eq!(c.rope_theta, 1e6);
    assert!(!c.attention_bias);
    let ix = c.indexer().unwrap();
    assert_eq!(
        (ix.index_topk, ix.index_head_dim, ix.index_n_heads),
        (16, 16, 32)
    );
    use IndexerKind::{Full, Shared};
    use MlpKind::{Dense, Sparse};
    assert_eq!(c.mlp_layer_types, [Dense, Sparse, Sparse, Sparse]);
    assert_eq!(c.n_sparse_layers(), 3);
    assert_eq!(
        c.indexer().unwrap().indexer_types,
        [Full, Shared, Full, Shared]
    );
    assert_eq!(c.eos_token_ids, [660, 663, 665]);
    assert_eq!(c.bos_token_id, None);
    assert_eq!(c.max_position_embeddings, 4096);
    assert!(!c.tie_word_embeddings);
}

#[test]
fn load_reads_config_json_from_dir() {
    let tmp = TempDir::new("config");
    assert!(matches!(
        ModelConfig::load(tmp.path()),
        Err(ConfigError::Io { path, .. }) if path == tmp.join("config.json")
    ));
    std::fs::write(tmp.join("config.json"), TINY).unwrap();
    assert_eq!(ModelConfig::load(tmp.path()).unwrap().vocab_size, 674);
    std::fs::write(tmp.join("config.json"), "{ nope").unwrap();
    assert!(matches!(
        ModelConfig::load(tmp.path()),
        Err(ConfigError::Json { path, .. }) if path == tmp.join("config.json")
    ));
}

#[test]
fn out_of_range_message_names_key_value_and_range() {
    let e = cfg_err(&[("hidden_size", Some("0"))]);
    assert_eq!(
        e.to_string(),
        r#"config.json: "hidden_size" = 0 is out of range (allowed 1..=65536)"#
    );
}

#[test]
fn every_dimension_is_bounded() {
    let cases: &[(&str, &str, &str)] = &[
        ("vocab_size", "0", "1..=1048576"),
        ("vocab_size", "1048577", "1..=1048576"),
        ("hidden_size", "65537", "1..=65536"),
        ("intermediate_size", "0", "1..=262144"),
        ("moe_intermediate_size", "1000000000", "1..=262144"),
        ("num_hidden_layers", "0", "1..=256"),
        ("num_hidden_layers", "257", "1..=256"),
        ("num_attention_heads", "1025", "1..=1024"),
        ("n_shared_experts", "65", "0..=64"),
        ("n_routed_experts", "0", "1..=4096"),
        ("n_routed_experts", "4097", "1..=4096"),
        ("num_experts_per_tok", "17", "1..=16"),
        ("num_experts_per_tok", "0", "1..=16"),
        ("kv_lora_rank", "0", "1..=65536"),
        ("q_lora_rank", "70000", "1..=65536"),
        ("qk_rope_head_dim", "4098", "1..=4096"),
        ("qk_nope_head_dim", "0", "1..=4096"),
        ("v_head_dim", "5000", "1..=4096"),
        ("index_topk", "0", "1..=1048576"),
        ("index_topk", "1048577", "1..=1048576"),
        ("index_head_dim", "4097", "1..=4096"),
        ("index_n_heads", "0", "1..=1024"),
        ("max_position_embeddings", "0", "1..=16777216"),
        ("first_k_dense_replace", "5", "0..=4"),
        ("eos_token_id", "674", "0..=673"),
        ("eos_token_id", "[1, -1]", "0..=673"),
        ("bos_token_id", "100000", "0..=673"),
        ("hidden_size", "-64", "1..=65536"),
        ("rms_norm_eps", "0", "(0, 1)"),
        ("rms_norm_eps", "1.5", "(0, 1)"),
        ("routed_scaling_factor", "0", "> 0"),
        ("routed_scaling_factor", "-2.5", "> 0"),
        ("rope_theta", "-1", "> 0"),
        ("index_topk_freq", "0", "1..=65536"),
    ];
    for (key, value, allowed) in cases {
        let mut edits = vec![(*key, Some(*value))];
        match *key {
            // Keys only read when the explicit per-layer lists are absent.
            "first_k_dense_replace" => edits.push(("mlp_layer_types", None)),
            "index_topk_freq" => edits.push(("indexer_types", None)),
            "rope_theta" => edits.push(("rope_parameters", None)),
            _ => {}
        }
        let e = cfg_err(&edits);
        let msg = e.to_string();
        assert!(
            matches!(&e, ConfigError::OutOfRange { key: k, .. } if k == key),
            "{key}={value}: {msg}"
        );
        assert!(msg.contains(&format!("\"{key}\"")), "{msg}");
        assert!(msg.contains(allowed), "{key}={value}: {msg}");
    }
    // rope_theta inside rope_parameters
    let e = cfg_err(&[(
        "rope_parameters",
        Some(r#"{"rope_type":"default","rope_theta":0}"#),
    )]);
    assert!(e.to_string().contains("rope_parameters.rope_theta"), "{e}");
}

#[test]
fn wrong_types_are_named() {
    let e = cfg_err(&[("hidden_size", Some(r#""64""#))]);
    assert!(
        matches!(&e, ConfigError::WrongType { key, .. } if key == "hidden_size"),
        "{e}"
    );
    let e = cfg_err(&[("norm_topk_prob", Some("1"))]);
    assert!(
        matches!(&e, ConfigError::WrongType { key, .. } if key == "norm_topk_prob"),
        "{e}"
    );
    let e = cfg_err(&[("mlp_layer_types", Some(r#""dense""#))]);
    assert!(
        matches!(&e, ConfigError::WrongType { key, .. } if key == "mlp_layer_types"),
        "{e}"
    );
}

fn assert_unsupported(e: &ConfigError, key: &str) {
    assert!(
        matches!(e, ConfigError::Unsupported { key: k, .. } if k == key),
        "expected Unsupported {key}, got {e}"
    );
}

#[test]
fn group_limited_routing_is_read_and_checked() {
    // GlmMoeDsa routes group-limited as DeepSeek-V3 does (transformers' GlmMoeDsaMoE).
    let c = cfg(&[("n_group", Some("4")), ("topk_group", Some("2"))]).unwrap();
    assert_eq!((c.n_group, c.topk_group), (4, 2));
    let e = cfg_err(&[("n_group", Some("3")), ("topk_group", Some("1"))]);
    assert!(
        matches!(&e, ConfigError::Invalid { key, .. } if key == "n_group"),
        "{e}"
    );
    // 16 experts in 8 groups of 2: one group cannot hold the top 4.
    let e = cfg_err(&[("n_group", Some("8")), ("topk_group", Some("1"))]);
    assert!(
        matches!(&e, ConfigError::Invalid { key, .. } if key == "topk_group"),
        "{e}"
    );
}

#[test]
fn yarn_rope_is_read_and_other_scalings_refused() {
    let c = cfg(&[(
        "rope_parameters",
        Some(r#"{"rope_type":"yarn","factor":4.0,"rope_theta":10000,"original_max_position_embeddings":32}"#),
    )])
    .unwrap();
    let y = c.yarn.expect("yarn");
    assert_eq!((y.factor, y.original_max_position_embeddings), (4.0, 32.0));
    assert_eq!(c.rope_theta, 10000.0);
    // YaRN without the pretraining context is refused by name.
    let e = cfg_err(&[(
        "rope_parameters",
        Some(r#"{"rope_type":"yarn","factor":4.0,"rope_theta":10000}"#),
    )]);
    assert!(
        e.to_string().contains("original_max_position_embeddings"),
        "{e}"
    );
    // Legacy form that is plain RoPE.
    let c = cfg(&[
        ("rope_parameters", None),
        ("rope_scaling", Some("null")),
        ("rope_theta", Some("500000")),
    ])
    .unwrap();
    assert_eq!(c.rope_theta, 500000.0);
    let c = cfg(&[("rope_parameters", None)]).unwrap();
    assert_eq!(c.rope_theta, 10000.0);
    // A scaling other than YaRN is refused wherever it is written.
    let e = cfg_err(&[
        ("rope_parameters", None),
        (
            "rope_scaling",
            Some(r#"{"rope_type":"linear","factor":2.0}"#),
        ),
    ]);
    assert_unsupported(&e, "rope_scaling.rope_type");
}

#[test]
fn other_refusals_are_named() {
    assert_unsupported(
        &cfg_err(&[("model_type", Some(r#""llama""#))]),
        "model_type",
    );
    assert_unsupported(&cfg_err(&[("hidden_act", Some(r#""gelu""#))]), "hidden_act");
    assert_unsupported(
        &cfg_err(&[("num_key_value_heads", Some("1"))]),
        "num_key_value_heads",
    );
    let e = cfg_err(&[("qk_rope_head_dim", Some("7"))]);
    assert!(
        matches!(&e, ConfigError::Invalid { key, .. } if key == "qk_rope_head_dim"),
        "{e}"
    );
    let e = cfg_err(&[("mlp_layer_types", Some(r#"["dense","sparse"]"#))]);
    assert!(
        matches!(&e, ConfigError::Invalid { key, .. } if key == "mlp_layer_types"),
        "{e}"
    );
    let e = cfg_err(&[(
        "mlp_layer_types",
        Some(r#"["dense","sparse","moe","sparse"]"#),
    )]);
    assert_unsupported(&e, "mlp_layer_types");
    let e = cfg_err(&[("num_local_experts", Some("8"))]);
    assert!(
        matches!(&e, ConfigError::Invalid { key, .. } if key == "num_local_experts"),
        "{e}"
    );
    // model_type absent is accepted (transformers' defaults are GLM-5's).
    assert!(cfg(&[("model_type", None)]).is_ok());
}

#[test]
fn eos_as_number_list_or_null() {
    assert_eq!(
        cfg(&[("eos_token_id", Some("5"))]).unwrap().eos_token_ids,
        [5]
    );
    assert_eq!(
        cfg(&[("eos_token_id", Some("[3, 4]"))])
            .unwrap()
            .eos_token_ids,
        [3, 4]
    );
    assert!(cfg(&[("eos_token_id", Some("null"))])
        .unwrap()
        .eos_token_ids
        .is_empty());
    assert_eq!(
        cfg(&[("bos_token_id", Some("7"))]).unwrap().bos_token_id,
        Some(7)
    );
}

#[test]
fn routed_expert_aliases() {
    let c = cfg(&[("n_routed_experts", None), ("num_local_experts", Some("8"))]).unwrap();
    assert_eq!(c.n_routed_experts, 8);
    let c = cfg(&[("n_routed_experts", None), ("num_experts", Some("12"))]).unwrap();
    assert_eq!(c.n_routed_experts, 12);
}

#[test]
fn mlp_layer_types_win_over_first_k_dense_replace() {
    use MlpKind::{Dense, Sparse};
    let c = cfg(&[
        ("first_k_dense_replace", Some("3")),
        (
            "mlp_layer_types",
            Some(r#"["dense","dense","sparse","dense"]"#),
        ),
    ])
    .unwrap();
    assert_eq!(c.mlp_layer_types, [Dense, Dense, Sparse, Dense]);
    let c = cfg(&[
        ("first_k_dense_replace", Some("2")),
        ("mlp_layer_types", None),
    ])
    .unwrap();
    assert_eq!(c.mlp_layer_types, [Dense, Dense, Sparse, Sparse]);
    // Absent both: HF's default of 3 dense layers.
    let c = cfg(&[("first_k_dense_replace", None), ("mlp_layer_types", None)]).unwrap();
    assert_eq!(c.mlp_layer_types, [Dense, Dense, Dense, Sparse]);
}

/// `full iff max(i - offset + 1, 0) % freq == 0` (reference §4.3).
fn rule(layers: usize, freq: i64, offset: i64) -> Vec<IndexerKind> {
    (0..layers as i64)
        .map(|i| {
            if (i - offset + 1).max(0) % freq == 0 {
                IndexerKind::Full
            } else {
                IndexerKind::Shared
            }
        })
        .collect()
}

#[test]
fn indexer_types_from_freq_and_offset() {
    use IndexerKind::{Full as F, Shared as S};
    let c = cfg(&[
        ("num_hidden_layers", Some("12")),
        ("mlp_layer_types", None),
        ("indexer_types", None),
        ("index_topk_freq", Some("4")),
        ("index_skip_topk_offset", Some("3")),
    ])
    .unwrap();
    // i - 2 for i >= 2: 0 F, 1 F, 2 F, 3 S, 4 S, 5 S, 6 F, 7 S, 8 S, 9 S, 10 F, 11 S
    assert_eq!(
        c.indexer().unwrap().indexer_types,
        [F, F, F, S, S, S, F, S, S, S, F, S]
    );
    assert_eq!(c.indexer().unwrap().indexer_types, rule(12, 4, 3));

    // Defaults (freq 1): every layer full.
    let c = cfg(&[("indexer_types", None)]).unwrap();
    assert_eq!(c.indexer().unwrap().indexer_types, [F, F, F, F]);

    for (freq, offset) in [(2, 1), (3, 2), (5, 7), (2, 4)] {
        let c = cfg(&[
            ("num_hidden_layers", Some("16")),
            ("mlp_layer_types", None),
            ("indexer_types", None),
            ("index_topk_freq", Some(&freq.to_string())),
            ("index_skip_topk_offset", Some(&offset.to_string())),
        ])
        .unwrap();
        assert_eq!(
            c.indexer().unwrap().indexer_types,
            rule(16, freq, offset),
            "freq {freq} offset {offset}"
        );
    }
}

#[test]
fn indexer_types_from_pattern() {
    use IndexerKind::{Full as F, Shared as S};
    let c = cfg(&[
        ("indexer_types", None),
        ("index_topk_pattern", Some(r#""FSSF""#)),
    ])
    .unwrap();
    assert_eq!(c.indexer().unwrap().indexer_types, [F, S, S, F]);
    let c = cfg(&[
        ("indexer_types", None),
        ("index_topk_pattern", Some(r#"["F","F","S","full"]"#)),
    ])
    .unwrap();
    assert_eq!(c.indexer().unwrap().indexer_types, [F, F, S, F]);
    // indexer_types wins over the pattern.
    let c = cfg(&[("index_topk_pattern", Some(r#""FFFF""#))]).unwrap();
    assert_eq!(c.indexer().unwrap().indexer_types, [F, S, F, S]);
    let e = cfg_err(&[
        ("indexer_types", None),
        ("index_topk_pattern", Some(r#""FSX F""#)),
    ]);
    assert!(e.to_string().contains("index_topk_pattern"), "{e}");
    let e = cfg_err(&[
        ("indexer_types", None),
        ("index_topk_pattern", Some(r#""FSXF""#)),
    ]);
    assert_unsupported(&e, "index_topk_pattern");
}

#[test]
fn layer_zero_shared_refused() {
    let assert_layer0 = |e: ConfigError, key: &str| {
        assert!(
            matches!(&e, ConfigError::Invalid { key: k, .. } if k == key),
            "expected layer-0 refusal on {key}, got {e}"
        );
        assert!(e.to_string().contains("layer 0"), "{e}");
    };
    assert_layer0(
        cfg_err(&[("indexer_types", Some(r#"["shared","full","full","full"]"#))]),
        "indexer_types",
    );
    assert_layer0(
        cfg_err(&[
            ("indexer_types", None),
            ("index_topk_pattern", Some(r#""SFFF""#)),
        ]),
        "index_topk_pattern",
    );
    // offset 0, freq 2: layer 0 gives max(1, 0) % 2 = 1, shared.
    assert_layer0(
        cfg_err(&[
            ("indexer_types", None),
            ("index_topk_freq", Some("2")),
            ("index_skip_topk_offset", Some("0")),
        ]),
        "index_topk_freq",
    );
}

// ---------------------------------------------------------------------------------------------
// tokenizer

/// GPT-2's bytes_to_unicode, written independently of the crate under test.
fn byte_to_char() -> Vec<char> {
    let printable = |b: u32| {
        (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    let mut next = 256u32;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap()
            } else {
                let c = char::from_u32(next).unwrap();
                next += 1;
                c
            }
        })
        .collect()
}

fn mapped(bytes: &[u8]) -> String {
    let table = byte_to_char();
    bytes.iter().map(|b| table[*b as usize]).collect()
}

/// A byte-level BPE: the 256 byte tokens (id = byte value), five merges (ids 256..=260), and
/// GLM special tokens as added tokens (ids 261..=265; the crate numbers added tokens after the
/// model vocabulary whatever ids the JSON gives).
fn test_tokenizer_json() -> String {
    let mut vocab = serde_json::Map::new();
    for b in 0..=255u8 {
        vocab.insert(mapped(&[b]), b.into());
    }
    // Merges: "é" (C3 A9) whole, "€" (E2 82 AC) split as [E2 82] + [AC], " the", "he".
    let merges = [
        (mapped(&[0xC3]), mapped(&[0xA9])),
        (mapped(&[0xE2]), mapped(&[0x82])),
        (mapped(b"h"), mapped(b"e")),
        (mapped(b" "), mapped(b"t")),
        (mapped(b" t"), mapped(b"he")),
    ];
    let mut merge_strs = Vec::new();
    for (i, (a, b)) in merges.iter().enumerate() {
        vocab.insert(format!("{a}{b}"), (256 + i).into());
        merge_strs.push(format!("{a} {b}"));
    }
    let specials = [
        "<|endoftext|>",
        "[gMASK]",
        "<sop>",
        "<|user|>",
        "<|assistant|>",
    ];
    let added: Vec<serde_json::Value> = specials
        .iter()
        .enumerate()
        .map(|(i, s)| {
            serde_json::json!({
                "id": 261 + i, "content": s, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true
            })
        })
        .collect();
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false,
                          "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true,
                    "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merge_strs}
    })
    .to_string()
}

#[test]
fn tokenizer_special_tokens_are_single_ids() {
    let tok = Tokenizer::from_bytes(test_tokenizer_json().as_bytes()).unwrap();
    assert_eq!(tok.vocab_size(), 266);
    assert_eq!(tok.token_id("<|endoftext|>"), Some(261));
    assert_eq!(tok.token_id("[gMASK]"), Some(262));
    assert_eq!(tok.token_id("not a token"), None);
    let ids = tok.encode("[gMASK]<sop><|user|>hi<|assistant|>").unwrap();
    assert_eq!(ids, [262, 263, 264, b'h' as u32, b'i' as u32, 265]);
    assert_eq!(tok.token_bytes(262), b"[gMASK]");
    assert_eq!(tok.token_bytes(261), b"<|endoftext|>");
    // No BOS or other special token is added automatically.
    assert_eq!(tok.encode("hi").unwrap(), [b'h' as u32, b'i' as u32]);
}

#[test]
fn tokenizer_partial_utf8_tokens_give_raw_bytes() {
    let tok = Tokenizer::from_bytes(test_tokenizer_json().as_bytes()).unwrap();
    // "€" = E2 82 AC: the merge makes [E2 82] one token, AC another; neither is valid UTF-8.
    let ids = tok.encode("€").unwrap();
    assert_eq!(ids, [257, 0xAC]);
    assert_eq!(tok.token_bytes(257), &[0xE2, 0x82]);
    assert_eq!(tok.token_bytes(0xAC), &[0xAC]);
    assert_eq!(tok.encode("é").unwrap(), [256]);
    assert_eq!(tok.token_bytes(256), "é".as_bytes());
    assert_eq!(tok.token_bytes(b' ' as u32), b" ");
    assert_eq!(tok.token_bytes(b'\n' as u32), b"\n");
    assert_eq!(tok.token_bytes(0), &[0]);
    assert_eq!(tok.token_bytes(260), b" the");
    assert_eq!(tok.token_bytes(100_000), b"");
}

#[test]
fn tokenizer_decode_bytes_round_trips() {
    let tok = Tokenizer::from_bytes(test_tokenizer_json().as_bytes()).unwrap();
    for s in [
        "hello the world\n\ttabs  and spaces",
        "the theme",
        "café € 100 — naïve 日本語 🦀",
        "[gMASK]<sop><|user|>你好<|assistant|>",
        "",
    ] {
        let ids = tok.encode(s).unwrap();
        assert_eq!(tok.decode_bytes(&ids), s.as_bytes(), "{s:?} -> {ids:?}");
    }
    assert!(tok.encode(" the").unwrap().contains(&260));
}

#[test]
fn tokenizer_file_errors_are_named() {
    let tmp = TempDir::new("tok");
    let path = tmp.join("tokenizer.json");
    let err = Tokenizer::from_file(&path).unwrap_err();
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
    std::fs::write(&path, "{ not json").unwrap();
    let err = Tokenizer::from_file(&path).unwrap_err();
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
    std::fs::write(&path, test_tokenizer_json()).unwrap();
    assert_eq!(Tokenizer::from_file(&path).unwrap().vocab_size(), 266);
}

#[test]
fn non_byte_level_tokenizer_uses_token_text_and_byte_tokens() {
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "unk_token": "<unk>",
                  "vocab": {"<unk>": 0, "héllo": 1, "<0xE2>": 2, "world": 3}}
    })
    .to_string();
    let tok = Tokenizer::from_bytes(json.as_bytes()).unwrap();
    assert_eq!(tok.token_bytes(1), "héllo".as_bytes());
    assert_eq!(tok.token_bytes(2), &[0xE2]);
    assert_eq!(tok.encode("héllo world").unwrap(), [1, 3]);
}

#[test]
fn dangling_shard_symlink_is_reported_not_skipped() {
    let tmp = TempDir::new("dangling");
    write_shard(
        &tmp.join("model-1.safetensors"),
        &[("a", "U8", &[1], vec![1])],
    );
    let link = tmp.join("model-2.safetensors");
    std::os::unix::fs::symlink(tmp.join("blobs/missing"), &link).unwrap();
    std::fs::create_dir(tmp.join("sub.safetensors")).unwrap(); // a directory: skipped
    assert!(matches!(
        open_err(&[tmp.path().to_path_buf()]),
        WeightsError::Io { path, .. } if path == link
    ));
}
