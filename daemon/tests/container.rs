//! Pre-quantized containers (a U8 blob plus `<name>.qs` f32 scales, upstream's layout) are used
//! as stored, and give bit-for-bit the model that quantizing the f32 source at load gives.

use std::path::{Path, PathBuf};

use colibri::cmd::validate::{check, Reference};
use colibri::engine::Engine;
use colibri::model::{ActMode, LoadOptions};
use colibri::quant::{QFormat, QMatrix};
use colibri::weights::writer::SafetensorsWriter;
use colibri::weights::{Dtype, ShardSet};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

/// Rewrites `src` with every routed expert (and, if `dense`, every other 2-D matrix but the
/// router and the indexer's weights_proj, which stay f32) packed in `dense`.
fn write_container(src: &Path, out: &Path, fmt: QFormat, dense: Option<QFormat>) {
    std::fs::create_dir_all(out).unwrap();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(src.join(f), out.join(f)).unwrap();
    }
    let shards = ShardSet::open(&[src.to_path_buf()]).unwrap();
    let mut w = SafetensorsWriter::new();
    let names: Vec<String> = shards.names().map(String::from).collect();
    for name in &names {
        let info = shards.get(name).unwrap().clone();
        let values = shards.read_f32(name, &info.shape).unwrap();
        let target = if name.contains(".mlp.experts.") {
            Some(fmt)
        } else if info.shape.len() == 2
            && !name.ends_with("mlp.gate.weight")
            && !name.contains("weights_proj")
        {
            // Embedding and lm_head included: at int8 they are what --dense-bits 8 gives too.
            dense
        } else {
            None
        };
        match target {
            Some(f) => {
                let (rows, cols) = (info.shape[0], info.shape[1]);
                let q = QMatrix::quantize(&values, rows, cols, f);
                w.add(name, Dtype::U8, &[q.data().len()], q.data().to_vec());
                w.add_f32(&format!("{name}.qs"), &[q.scales().len()], q.scales());
            }
            None => w.add_f32(name, &info.shape, &values),
        }
    }
    w.write(&out.join("model.safetensors")).unwrap();
}

fn logits(dir: &Path, opts: LoadOptions) -> Vec<f32> {
    let r = Reference::load(&fixture("tiny-dense-shared").join("ref.json"), Some("long")).unwrap();
    let mut engine = Engine::open(vec![dir.to_path_buf()], opts).unwrap();
    check(&mut engine, &r).unwrap().tf_logits
}

#[test]
fn packed_experts_equal_quantizing_at_load() {
    let src = fixture("tiny-dense-shared");
    for fmt in [
        QFormat::I8Row,
        QFormat::I4Row,
        QFormat::I4G64,
        QFormat::I3G64,
        QFormat::I2Row,
    ] {
        for dense in [None, Some(QFormat::I8Row)] {
            let out = std::env::temp_dir().join(format!(
                "colibri-container-{}-{}-{dense:?}",
                std::process::id(),
                fmt.name()
            ));
            write_container(&src, &out, fmt, dense);
            for act in [ActMode::F32, ActMode::Int8] {
                // The container's stored formats win over the load options given here.
                let packed = logits(
                    &out,
                    LoadOptions {
                        act,
                        ..LoadOptions::default()
                    },
                );
                let at_load = logits(
                    &src,
                    LoadOptions {
                        expert_fmt: fmt,
                        dense_fmt: dense.unwrap_or(QFormat::F32),
                        act,
                        ..LoadOptions::default()
                    },
                );
                assert!(
                    packed
                        .iter()
                        .zip(&at_load)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{} dense {dense:?} act {act:?}: logits differ",
                    fmt.name()
                );
            }
            let _ = std::fs::remove_dir_all(&out);
        }
    }
}

/// With `--mmap` a packed container's experts compute on the shard map's pages (no copy of
/// their own), and the logits are the bits that reading them with pread gives.
#[test]
fn mapped_packed_experts_are_zero_copy_and_bit_identical() {
    use colibri::experts::IoMode;
    let src = fixture("tiny-dense-shared");
    let out = std::env::temp_dir().join(format!("colibri-container-mmap-{}", std::process::id()));
    write_container(&src, &out, QFormat::I4Row, None);
    let opts = |io: IoMode| {
        let mut o = LoadOptions {
            act: ActMode::Int8,
            ..LoadOptions::default()
        };
        o.tiers.io = io;
        o.tiers.cache = Some(1);
        o
    };
    let read = logits(&out, opts(IoMode::Buffered));
    let mapped = logits(&out, opts(IoMode::Mmap));
    assert!(
        read.iter()
            .zip(&mapped)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "mmap logits differ from pread's"
    );
    for (io, want) in [(IoMode::Buffered, false), (IoMode::Mmap, true)] {
        let engine = Engine::open(vec![out.clone()], opts(io)).unwrap();
        // The first MoE layer (dense layers come first and have no routed experts).
        let e = (0..64)
            .find_map(|layer| engine.model_for_tests().experts.get(layer, 0).ok())
            .expect("a layer with routed experts");
        for m in [&e.gate, &e.up, &e.down] {
            assert_eq!(m.is_shared(), want, "{io:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&out);
}
