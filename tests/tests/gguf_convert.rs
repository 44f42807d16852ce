//! `colibri convert --from FILE.gguf --to DIR`: the GGUF fixtures (scripts/make_gguf_fixtures.sh)
//! rewritten as our container, each tensor in its own type, answer token for token as the
//! GGUF does; an expert is one read; `verify` checks the folder; a rerun keeps what is done;
//! and a GGUF colibri cannot run is refused before anything is written, naming the key, the
//! tensor or the missing file.

use std::path::{Path, PathBuf};

use colibri_e2e::oracle::{self, assert_exact, convert_refused};
use colibri_e2e::{colibri, fixture, last_line, run_ok, stderr, temp_dir};
use serde_json::Value;

const GLM: &str = "tiny-glm4-moe";

fn gguf(ty: &str) -> PathBuf {
    fixture("gguf").join(format!("{GLM}-{ty}.gguf"))
}

/// `colibri convert --from from --to <fresh>/c`, which must succeed: the folder and stderr.
fn convert(from: &Path, tag: &str) -> (PathBuf, String) {
    let to = temp_dir(tag).join("c");
    let o = run_ok(
        colibri()
            .arg("convert")
            .arg("--from")
            .arg(from)
            .arg("--to")
            .arg(&to),
    );
    (to, stderr(&o))
}

/// `validate`'s verdict line on `snap` (exact or not), int8 activation blocks as by default.
fn verdict(snap: &Path, case: &str) -> String {
    last_line(oracle::validate(snap, GLM, case, &[]).as_bytes())
}

/// The safetensors header of `file`: tensor name to (dtype, shape, [begin, end]).
fn header(file: &Path) -> Vec<(String, String, Vec<u64>, u64, u64)> {
    let bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let v: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    v.as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, e)| {
            let shape = e["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .collect();
            let off = e["data_offsets"].as_array().unwrap();
            (
                k.clone(),
                e["dtype"].as_str().unwrap().to_string(),
                shape,
                off[0].as_u64().unwrap(),
                off[1].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Every tensor of the converted folder `dir`: (shard, name, dtype, shape, begin, end).
fn tensors(dir: &Path) -> Vec<(String, String, String, Vec<u64>, u64, u64)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            let shard = p.file_name().unwrap().to_string_lossy().into_owned();
            for (n, d, s, b, e) in header(&p) {
                out.push((shard.clone(), n, d, s, b, e));
            }
        }
    }
    out
}

#[test]
fn a_converted_gguf_answers_token_for_token_as_the_gguf() {
    for ty in ["f32", "q8_0", "q4_0", "iq4_nl", "mxfp4"] {
        let file = gguf(ty);
        let (dir, err) = convert(&file, &format!("gguf-convert-{ty}"));
        assert!(err.contains("[DONE]"), "{ty}: {err}");
        for case in ["short", "long"] {
            let want = verdict(&file, case);
            assert_eq!(verdict(&dir, case), want, "{ty} {case}");
            if ty == "f32" {
                assert_exact(&want, &format!("{ty} {case}"));
            }
        }
        // In the chat template (chat_template.jinja and its bos/eos texts came along).
        let args = ["Tell me about the sea."];
        assert_eq!(
            oracle::run_greedy(&dir, &args),
            oracle::run_greedy(&file, &args),
            "{ty}"
        );
    }
}

#[test]
fn a_split_gguf_converts_to_the_same_folder_as_the_single_file() {
    let (one, _) = convert(&gguf("f32"), "gguf-convert-one");
    let split = fixture("gguf").join(format!("{GLM}-f32-split-00001-of-00002.gguf"));
    let (two, _) = convert(&split, "gguf-convert-split");
    for f in ["out-00000.safetensors", "config.json", "tokenizer.json"] {
        assert!(
            std::fs::read(one.join(f)).unwrap() == std::fs::read(two.join(f)).unwrap(),
            "{f} differs"
        );
    }
}

#[test]
fn each_tensor_keeps_its_type_and_an_expert_is_one_read() {
    let (dir, _) = convert(&gguf("q4_0"), "gguf-convert-layout");
    let all = tensors(&dir);
    let find = |name: &str| {
        all.iter()
            .find(|t| t.1 == name)
            .unwrap_or_else(|| panic!("{name} missing"))
    };
    // Norms stay F32; quantized matrices keep their blocks, dense ones too.
    assert_eq!(find("model.norm.weight").2, "F32");
    assert_eq!(find("model.layers.0.self_attn.q_proj.weight").2, "Q4_0");
    let mut experts = 0;
    for t in all
        .iter()
        .filter(|t| t.1.ends_with("gate_proj.weight") && t.1.contains(".experts."))
    {
        let base = t.1.strip_suffix("gate_proj.weight").unwrap();
        let (gate, up, down) = (
            find(&t.1),
            find(&format!("{base}up_proj.weight")),
            find(&format!("{base}down_proj.weight")),
        );
        assert_eq!(gate.2, "Q4_0", "{}", t.1);
        // One shard, back to back: one positional read covers the expert.
        assert!(
            gate.0 == up.0 && up.0 == down.0 && gate.5 == up.4 && up.5 == down.4,
            "{base}: {gate:?} {up:?} {down:?}"
        );
        experts += 1;
    }
    assert!(experts >= 8, "{experts} experts");
    // `colibri verify` checks every tensor against the checksums the conversion wrote.
    let o = colibri()
        .arg("verify")
        .arg("--snap")
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
fn a_rerun_keeps_the_finished_shards_and_rewrites_a_damaged_one() {
    let file = gguf("q8_0");
    let to = temp_dir("gguf-convert-rerun").join("c");
    let conv = || {
        stderr(&run_ok(
            colibri()
                .arg("convert")
                .arg("--from")
                .arg(&file)
                .arg("--to")
                .arg(&to)
                .args(["--shard-size", "100k"]),
        ))
    };
    let first = conv();
    assert!(first.contains("(0 kept)"), "{first}");
    let shards: Vec<PathBuf> = std::fs::read_dir(&to)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    assert!(shards.len() >= 2, "{shards:?}");
    let again = conv();
    assert!(
        again.contains(&format!("0 shard(s) written ({} kept)", shards.len())),
        "{again}"
    );
    // A flipped byte in one shard: that shard alone is rewritten.
    let mut bytes = std::fs::read(&shards[0]).unwrap();
    let at = bytes.len() - 10;
    bytes[at] ^= 0x40;
    std::fs::write(&shards[0], bytes).unwrap();
    let third = conv();
    assert!(
        third.contains(&format!("1 shard(s) written ({} kept)", shards.len() - 1)),
        "{third}"
    );
    let o = colibri()
        .arg("verify")
        .arg("--snap")
        .arg(&to)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
fn a_gguf_colibri_cannot_run_is_refused_before_anything_is_written() {
    let dir = temp_dir("gguf-convert-bad");
    let good = std::fs::read(gguf("f32")).unwrap();
    // Another architecture: `glm4moe` renamed everywhere (its keys follow).
    let mut other = good.clone();
    for i in 0..other.len() - 7 {
        if &other[i..i + 7] == b"glm4moe" {
            other[i..i + 7].copy_from_slice(b"llamaxy");
        }
    }
    let p = dir.join("other.gguf");
    std::fs::write(&p, other).unwrap();
    let (err, to) = convert_refused(&p, "gguf-convert-arch");
    assert!(
        err.contains("general.architecture") && err.contains("llamaxy"),
        "{err}"
    );
    assert!(!to.exists(), "{} was created", to.display());

    // A tensor type colibri does not read: output_norm.weight retyped F32 -> I32.
    let mut bytes = good.clone();
    colibri_e2e::gguf_edit::retype_tensor(&mut bytes, "output_norm.weight", 0, 26);
    let p = dir.join("i32.gguf");
    std::fs::write(&p, bytes).unwrap();
    let (err, to) = convert_refused(&p, "gguf-convert-type");
    assert!(
        err.contains("output_norm.weight") && err.contains("I32"),
        "{err}"
    );
    assert!(!to.exists(), "{} was created", to.display());

    // A split set with its second part missing: that file is named.
    let first = format!("{GLM}-f32-split-00001-of-00002.gguf");
    let p = dir.join(&first);
    std::fs::copy(fixture("gguf").join(&first), &p).unwrap();
    let (err, to) = convert_refused(&p, "gguf-convert-split");
    assert!(
        err.contains(&format!("{GLM}-f32-split-00002-of-00002.gguf")) && err.contains("missing"),
        "{err}"
    );
    assert!(!to.exists(), "{} was created", to.display());
}
