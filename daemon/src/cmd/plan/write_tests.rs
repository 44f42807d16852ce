//! `plan --measure`'s writer: the exact shapes of the published configs, the skew as stated,
//! a written model the loader reads back, the refusals, and the parse of bench's lines.

use std::path::{Path, PathBuf};

use super::measure::{parse, Run};
use super::write::{self, Fill, Formats};
use crate::config::{ModelConfig, UNFINISHED_MARKER};
use crate::quant::QFormat;

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

fn config(rel: &str, layers: Option<usize>) -> (serde_json::Value, ModelConfig) {
    let text = std::fs::read_to_string(repo(rel)).unwrap();
    let v = write::measured_config(&text, layers).unwrap();
    let cfg = ModelConfig::from_json(&v.to_string()).unwrap();
    (v, cfg)
}

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("colibri-measure-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn i4() -> Formats {
    Formats::new(QFormat::I4G64, QFormat::I8Row)
}

#[test]
fn the_tensors_have_exactly_the_published_shapes() {
    // The parameter count of what is written equals the count from the shapes alone (the
    // count a test checks against every oracle fixture's tensors and the published totals).
    for rel in [
        "tests/fixtures/configs/qwen3-30b-a3b.json",
        "tests/fixtures/configs/glm-4.5-air.json",
        "tests/fixtures/configs/deepseek-v3.json",
        "tests/fixtures/tiny-qwen3-moe/config.json",
        "tests/fixtures/tiny-glm4-moe/config.json",
        "tests/fixtures/tiny-deepseek-v3/config.json",
    ] {
        let (_, cfg) = config(rel, None);
        let units = write::tensors(&cfg, &i4(), 0.08, 1).unwrap();
        let written: u64 = units.iter().flatten().map(|s| s.params()).sum();
        let want = crate::config::params::count_params(&cfg, 0).total;
        assert_eq!(written, want, "{rel}");
        // Every routed expert is one unit of its three matrices at the expert format.
        let experts = units
            .iter()
            .filter(|u| u.iter().all(|s| s.name.contains(".mlp.experts.")))
            .count();
        let sparse = cfg
            .mlp_layer_types
            .iter()
            .filter(|k| **k == crate::config::MlpKind::Sparse)
            .count();
        assert_eq!(experts, sparse * cfg.n_routed_experts, "{rel}");
    }
}

#[test]
fn the_qwen3_30b_model_is_the_size_plan_predicts() {
    let (_, cfg) = config("tests/fixtures/configs/qwen3-30b-a3b.json", None);
    let units = write::tensors(&cfg, &i4(), 0.08, 1).unwrap();
    let shards = write::shards(units, write::shard_bytes()).unwrap();
    let bytes = write::total_bytes(&shards);
    let shape = super::Shape::from_config(&cfg);
    let sizes = super::Sizes::converted(&shape, QFormat::I4G64, QFormat::I8Row);
    // The plan's dense part estimates per-row scales as none: within a percent of the total.
    let off = (bytes as f64 - sizes.disk as f64).abs() / bytes as f64;
    assert!(off < 0.01, "written {bytes}, predicted {}", sizes.disk);
    assert!(bytes > 16_000_000_000 && bytes < 19_000_000_000, "{bytes}");
    // No shard is far over the size asked for (an expert is never split).
    assert!(shards
        .iter()
        .all(|s| s.bytes < write::shard_bytes() + 10_000_000));
}

#[test]
fn the_router_bias_carries_the_stated_skew() {
    let (_, cfg) = config("tests/fixtures/configs/glm-4.5-air.json", Some(3));
    let units = write::tensors(&cfg, &i4(), 0.2, 7).unwrap();
    let biases: Vec<&Vec<f32>> = units
        .iter()
        .flatten()
        .filter(|s| s.name.ends_with("e_score_correction_bias"))
        .map(|s| match &s.fill {
            Fill::Values(v) => v,
            other => panic!("{other:?}"),
        })
        .collect();
    // GLM-4.5-Air's first layer is dense: two sparse layers of three.
    assert_eq!(biases.len(), 2);
    for b in &biases {
        let mut got: Vec<f32> = b.to_vec();
        got.sort_by(|a, b| b.partial_cmp(a).unwrap());
        for (rank, v) in got.iter().enumerate() {
            assert_eq!(*v, -0.2 * (1.0 + rank as f32).ln());
        }
    }
    // Each layer ranks its experts in its own random order.
    assert_ne!(biases[0], biases[1]);
    // A softmax router (Qwen3-MoE) has no bias to write.
    let (_, q) = config("tests/fixtures/configs/qwen3-30b-a3b.json", Some(2));
    let units = write::tensors(&q, &i4(), 0.2, 7).unwrap();
    assert!(!units
        .iter()
        .flatten()
        .any(|s| s.name.contains("correction_bias")));
}

#[test]
fn fewer_layers_cut_the_per_layer_lists() {
    let (v, cfg) = config("tests/fixtures/configs/deepseek-v3.json", Some(5));
    assert_eq!(cfg.num_hidden_layers, 5);
    assert_eq!(v["num_nextn_predict_layers"], 0);
    assert!(v.get("quantization_config").is_none());
    // DeepSeek-V3: three dense layers first.
    let dense = cfg
        .mlp_layer_types
        .iter()
        .filter(|k| **k == crate::config::MlpKind::Dense)
        .count();
    assert_eq!(dense, 3);
    let text = std::fs::read_to_string(repo("tests/fixtures/configs/deepseek-v3.json")).unwrap();
    for bad in [0, 62] {
        let e = write::measured_config(&text, Some(bad))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("--layers {bad}")) && e.contains("1..=61"),
            "{e}"
        );
    }
}

#[test]
fn the_demo_tokenizer_needs_its_vocabulary() {
    // A published config (no tokenizer beside it) gets the demo's; a vocabulary below its ids
    // is refused naming the key.
    let published = repo("tests/fixtures/configs/qwen3-30b-a3b.json");
    assert_eq!(
        write::tokenizer_for(Some(&published), 151_936).unwrap(),
        crate::demo::tokenizer_json()
    );
    let e = write::tokenizer_for(Some(&published), 512)
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"vocab_size\" = 512"), "{e}");
    // A model's folder: its own tokenizer.
    let own = repo("tests/fixtures/tiny-qwen3-moe/config.json");
    assert_eq!(
        write::tokenizer_for(Some(&own), 512).unwrap(),
        std::fs::read(repo("tests/fixtures/tiny-qwen3-moe/tokenizer.json")).unwrap()
    );
}

#[test]
fn another_family_is_refused_naming_it() {
    let (_, cfg) = config("tests/fixtures/configs/gpt-oss-20b.json", None);
    let e = write::tensors(&cfg, &i4(), 0.0, 1).unwrap_err().to_string();
    assert!(e.contains("\"gpt_oss\"") && e.contains("qwen3_moe"), "{e}");
}

#[test]
fn a_written_model_loads_with_its_shapes_and_formats() {
    for (rel, expert) in [
        ("tests/fixtures/tiny-qwen3-moe/config.json", QFormat::I4G64),
        (
            "tests/fixtures/tiny-deepseek-v3/config.json",
            QFormat::I3G64,
        ),
        ("tests/fixtures/tiny-glm4-moe/config.json", QFormat::I2Row),
    ] {
        let (v, cfg) = config(rel, None);
        let f = Formats::new(expert, QFormat::I8Row);
        let units = write::tensors(&cfg, &f, 0.08, 3).unwrap();
        let specs: Vec<_> = units.iter().flatten().cloned().collect();
        // Small shards: several files, experts never split.
        let shards = write::shards(units, 200_000).unwrap();
        assert!(shards.len() > 1, "{rel}");
        let dir = temp("load");
        let params = write::params(&v, &f, 0.08, 3);
        assert_eq!(write::inspect(&dir, &params).unwrap(), write::Found::Empty);
        let tok = write::tokenizer_for(Some(&repo(rel)), cfg.vocab_size).unwrap();
        let w = write::write(&dir, &v, &tok, &shards, &params, 3).unwrap();
        assert_eq!(w.bytes, write::total_bytes(&shards));
        assert!(!dir.join(UNFINISHED_MARKER).exists());
        let back = ModelConfig::load(&dir).unwrap();
        assert_eq!(back.num_hidden_layers, cfg.num_hidden_layers);
        let set = crate::weights::ShardSet::open(std::slice::from_ref(&dir)).unwrap();
        for s in &specs {
            let t = set
                .get(&s.name)
                .unwrap_or_else(|| panic!("{rel}: {}", s.name));
            match &s.fill {
                Fill::Quant(fmt) => {
                    let qs = set.get(&format!("{}.qs", s.name)).unwrap();
                    let (rows, cols) = (s.shape[0], s.shape[1]);
                    assert_eq!(t.len as usize, fmt.data_len(rows, cols), "{}", s.name);
                    assert_eq!(
                        qs.len as usize,
                        4 * fmt.scales_len(rows, cols),
                        "{}",
                        s.name
                    );
                    let read = QFormat::infer(rows, cols, t.len as usize, qs.len as usize / 4);
                    // A single group of 64 reads as one scale per row (the same numbers).
                    if cols % 64 == 0 && cols > 64 || fmt.group_size() == 0 {
                        assert_eq!(read, Some(*fmt), "{rel}: {}", s.name);
                    } else {
                        assert!(read.is_some(), "{rel}: {}", s.name);
                    }
                    if s.name.contains(".mlp.experts.") {
                        assert_eq!(*fmt, expert);
                    }
                }
                _ => assert_eq!(t.shape, s.shape, "{rel}: {}", s.name),
            }
        }
        // The same parameters find the model finished; others are refused.
        assert_eq!(write::inspect(&dir, &params).unwrap(), write::Found::Same);
        let other = write::params(&v, &f, 0.5, 3);
        let e = write::inspect(&dir, &other).unwrap_err().to_string();
        assert!(e.contains("other parameters"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn a_folder_that_is_not_empty_is_refused() {
    let dir = temp("full");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("notes.txt"), "mine").unwrap();
    let (v, _) = config("tests/fixtures/tiny-qwen3-moe/config.json", None);
    let e = write::inspect(&dir, &write::params(&v, &i4(), 0.08, 1))
        .unwrap_err()
        .to_string();
    assert!(e.contains("not empty"), "{e}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_half_written_model_is_refused_at_load_and_by_measure() {
    let (v, cfg) = config("tests/fixtures/tiny-qwen3-moe/config.json", None);
    let units = write::tensors(&cfg, &i4(), 0.08, 1).unwrap();
    let shards = write::shards(units, write::shard_bytes()).unwrap();
    let dir = temp("half");
    let params = write::params(&v, &i4(), 0.08, 1);
    let rel = "tests/fixtures/tiny-qwen3-moe/config.json";
    let tok = write::tokenizer_for(Some(&repo(rel)), cfg.vocab_size).unwrap();
    write::write(&dir, &v, &tok, &shards, &params, 1).unwrap();
    // As a kill part way leaves it: the marker still there.
    std::fs::write(dir.join(UNFINISHED_MARKER), "").unwrap();
    let e = ModelConfig::load(&dir).unwrap_err().to_string();
    assert!(
        e.contains("interrupted `colibri plan --measure`") && e.contains("delete the folder"),
        "{e}"
    );
    let e = write::inspect(&dir, &params).unwrap_err().to_string();
    assert!(e.contains("half-written") && e.contains("rm -r"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_model_bigger_than_the_disk_is_refused_stating_the_bytes() {
    let dir = temp("room");
    let free = write::free_bytes(&dir).unwrap();
    let need = free + 1;
    let e = write::check_room(&dir, need).unwrap_err().to_string();
    assert!(
        e.contains(&format!("needs {need} bytes")) && e.contains(&format!("{free} bytes")),
        "{e}"
    );
    assert!(!dir.exists());
    write::check_room(&dir, 1000).unwrap();
}

#[test]
fn bench_lines_parse() {
    // The lines as `colibri bench` prints them (cmd/bench.rs).
    let stdout = vec![
        "BENCH prefill_pos_s=812.50 decode_tok_s=3.21 hit_pct=61.5 read_gbs=0.912".to_string(),
    ];
    let stderr = vec![
        "[bench] synthetic ids: 1 prompt positions prefilled, 256 decode steps".to_string(),
        "[bench] 1 prefill positions in 0.412s, 256 decode steps in 79.751s | experts 2.65 MB each (int4-g64) / dense int8 | act Int8".to_string(),
        "[bench] decode: 40.10 expert loads/token, 106.27 MB read/token".to_string(),
    ];
    let mut r = Run::default();
    parse(&stdout, &stderr, &mut r);
    assert_eq!(r.decode_tok_s, 3.21);
    assert_eq!(r.hit_pct, 61.5);
    assert_eq!(r.prefill_positions, 1);
    assert_eq!(r.prefill_s, 0.412);
    assert_eq!(r.decode_steps, 256);
    assert_eq!(r.decode_s, 79.751);
    assert_eq!(r.expert_loads_per_token, 40.10);
    assert_eq!(r.mb_read_per_token, 106.27);
    assert!((r.disk_gb_s() - 106.27 * 3.21 / 1e3).abs() < 1e-12);
    assert_eq!(r.prefetch_mb, None);
    // With --pilot, the prefetch split per token follows.
    let stdout = vec![
        "BENCH prefill_pos_s=812.50 decode_tok_s=3.21 hit_pct=61.5 read_gbs=0.912 \
         prefetch_in_time_mb=12.40 prefetch_late_mb=3.10 prefetch_unused_mb=20.75"
            .to_string(),
    ];
    let mut r = Run::default();
    parse(&stdout, &stderr, &mut r);
    assert_eq!(r.prefetch_mb, Some((12.40, 3.10, 20.75)));
}

#[test]
fn bench_load_lines_parse_as_bench_writes_them() {
    // The decode loads line from the function bench prints it with, and the prefill line
    // with its device part.
    let store = crate::experts::Snapshot {
        all_loads: 10,
        bytes_read: 110_000_000,
        load_s: 0.031,
        read_s: 0.022,
        check_s: 0.001,
        build_s: 0.008,
        wait_s: 0.5,
        ..Default::default()
    };
    let loads = crate::experts::stats::load_line("decode", &store, Some(33_000_000), 5);
    let stderr = vec![
        "[bench] prefill: 22 expert loads, 243.21 MB read, 120.50 MB of them from the device"
            .to_string(),
        format!("[bench] {loads}"),
    ];
    let mut r = Run::default();
    parse(&[], &stderr, &mut r);
    assert_eq!(r.prefill_mb_read, 243.21);
    assert_eq!(r.prefill_device_mb, Some(120.5));
    assert_eq!(r.device_mb_per_token, Some(6.6));
    assert_eq!(r.wait_ms_per_token, Some(100.0));
    let l = r.load_ms.expect("the load times");
    assert_eq!((l.each, l.read, l.check, l.build), (3.1, 2.2, 0.1, 0.8));
    r.decode_tok_s = 2.0;
    assert!((r.device_gb_s().unwrap() - 6.6 * 2.0 / 1e3).abs() < 1e-12);
    // Where the kernel did not count (and a decode with no loads): no device figures.
    let mut r = Run::default();
    parse(
        &[],
        &["[bench] prefill: 22 expert loads, 243.21 MB read".to_string()],
        &mut r,
    );
    assert_eq!(r.prefill_mb_read, 243.21);
    assert_eq!(r.prefill_device_mb, None);
    assert_eq!((r.device_mb_per_token, r.load_ms), (None, None));
}

#[test]
fn the_cold_window_reads_what_a_filling_cache_misses() {
    let (_, cfg) = config("tests/fixtures/configs/qwen3-30b-a3b.json", None);
    let shape = super::Shape::from_config(&cfg);
    let sizes = super::Sizes::converted(&shape, QFormat::I4G64, QFormat::I8Row);
    let probes = super::Probes {
        disk_gbs: 1.5,
        disk_how: String::new(),
        mem_gbs: 10.0,
        mem_how: String::new(),
        copy_gbs: 5.0,
        copy_how: String::new(),
        dense_gbs: 10.0,
        dense_how: String::new(),
        expert_decode_gbs: 10.0,
        expert_decode_how: String::new(),
        prefill_gmacs: 50.0,
        prefill_how: String::new(),
        expert_gmacs: 25.0,
        expert_how: String::new(),
        attention_gmacs: 5.0,
        attention_how: String::new(),
    };
    let budget = |ram: u64| super::Budget {
        ram,
        vram: 0,
        ctx: 4096,
        kv_slots: 1,
        page_cache: 0,
        copied: false,
    };
    let expert = sizes.expert_disk as f64 * shape.sparse_layers as f64;
    // Everything fits: the window reads each expert it touches once, E(1-(1-k/E)^n) per layer.
    let all = super::predict(
        &shape,
        &sizes,
        &probes,
        &budget(100_000_000_000),
        &super::Routing::Uniform,
    );
    let w = super::cold_window(&shape, &sizes, &probes, &all, false, 256);
    let (fast, read) = (w.tok_s, w.disk_bytes);
    let touched = 128.0 * (1.0 - (1.0 - 8.0 / 128.0f64).powi(256));
    assert!(
        (read - touched * expert / 256.0).abs() < 1e-6 * read,
        "{read}"
    );
    // One token: every pick is read, the plan's cold figure.
    let w1 = super::cold_window(&shape, &sizes, &probes, &all, false, 1);
    let (one, read1) = (w1.tok_s, w1.disk_bytes);
    assert!((read1 - 8.0 * expert).abs() < 1e-6 * read1);
    assert!((one - all.decode_tok_s).abs() < 1e-9 * one);
    assert!(fast > one);
    // A small cache: after it fills, the share 1 - held/E of the picks is read each token.
    let small = super::predict(
        &shape,
        &sizes,
        &probes,
        &budget(8_000_000_000),
        &super::Routing::Uniform,
    );
    let held = small.split.experts_in_ram as f64;
    assert!(held > 0.0 && held < 128.0);
    let long = super::cold_window(&shape, &sizes, &probes, &small, false, 100_000).disk_bytes;
    let steady = 8.0 * (1.0 - held / 128.0) * expert;
    assert!((long - steady).abs() < 0.01 * steady, "{long} {steady}");
}

/// The tensor's stored bytes.
fn stored(set: &crate::weights::ShardSet, name: &str) -> Vec<u8> {
    use std::io::{Read as _, Seek as _};
    let t = set.get(name).unwrap_or_else(|| panic!("{name}"));
    let mut f = std::fs::File::open(set.file_path(t.file)).unwrap();
    f.seek(std::io::SeekFrom::Start(t.offset)).unwrap();
    let mut b = vec![0u8; t.len as usize];
    f.read_exact(&mut b).unwrap();
    b
}

#[test]
fn the_written_weights_are_zero_mean() {
    // Random codes read as `u - 2^(b-1)` have mean -1/2: with positive scales every expert
    // matrix carried one common offset, which grew layer after layer until the router sent
    // every token to the same experts (GLM-4.5-Air's shapes at int3 read 33.6 experts per
    // token of 296 picks). The mean of each format's dequantized weights, against their
    // spread, was -0.45 at int2, -0.22 at int3, -0.11 at int4 and now is near 0.
    let rel = "tests/fixtures/tiny-glm4-moe/config.json";
    let (v, cfg) = config(rel, None);
    for expert in [QFormat::I2Row, QFormat::I3G64, QFormat::I4G64] {
        let f = Formats::new(expert, QFormat::I8Row);
        let units = write::tensors(&cfg, &f, 0.08, 5).unwrap();
        let specs: Vec<_> = units.iter().flatten().cloned().collect();
        let shards = write::shards(units, 1 << 30).unwrap();
        let dir = temp(&format!("mean-{}", expert.name()));
        let params = write::params(&v, &f, 0.08, 5);
        let tok = write::tokenizer_for(Some(&repo(rel)), cfg.vocab_size).unwrap();
        write::write(&dir, &v, &tok, &shards, &params, 5).unwrap();
        let set = crate::weights::ShardSet::open(std::slice::from_ref(&dir)).unwrap();
        let (mut n, mut sum, mut sq) = (0f64, 0f64, 0f64);
        for s in specs.iter().filter(|s| s.name.contains(".mlp.experts.")) {
            let (rows, cols) = (s.shape[0], s.shape[1]);
            let data = stored(&set, &s.name);
            let scales = crate::weights::f32_le(&stored(&set, &format!("{}.qs", s.name)));
            let m = crate::quant::QMatrix::from_parts(expert, rows, cols, data, scales).unwrap();
            for w in m.dequantize() {
                n += 1.0;
                sum += w as f64;
                sq += (w as f64).powi(2);
            }
        }
        let mean = sum / n;
        let std = (sq / n - mean * mean).sqrt();
        assert!(n > 100_000.0, "{expert}: {n} weights");
        assert!(
            (mean / std).abs() < 0.05,
            "{expert}: mean {mean:e} against a spread of {std:e} over {n} weights"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
