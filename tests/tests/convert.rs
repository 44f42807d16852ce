//! `colibri convert` end to end, on the Hugging Face fixtures of scripts/make_hf_fixtures.py
//! (BF16, and FP8 with 128x128 block scales): the output validates exactly as quantizing the
//! source at load does; the bytes are deterministic, also across a kill and a resume; a
//! different conversion into the same folder and a disk too small are refused before a byte
//! is written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use colibri_e2e::{colibri, fixture, stderr, temp_dir};

fn convert(from: &Path, to: &Path, extra: &[&str]) -> Command {
    let mut c = colibri();
    c.arg("convert")
        .arg("--from")
        .arg(from)
        .arg("--to")
        .arg(to)
        .args(extra);
    for v in ["COLI_CONVERT_STOP_AFTER", "COLI_CONVERT_FREE_BYTES"] {
        c.env_remove(v);
    }
    c
}

fn output(cmd: &mut Command) -> Output {
    cmd.output().expect("spawning colibri")
}

fn convert_ok(from: &Path, to: &Path, extra: &[&str]) -> Output {
    let o = output(&mut convert(from, to, extra));
    assert!(o.status.success(), "convert failed: {}", stderr(&o));
    o
}

/// Every file of a folder (lock file aside), name -> bytes.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .expect("listing the output")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.file_name().is_some_and(|n| n != ".convert.lock"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).expect("reading an output file"))
        })
        .collect()
}

fn assert_same_files(a: &Path, b: &Path) {
    let (fa, fb) = (files(a), files(b));
    assert_eq!(
        fa.keys().collect::<Vec<_>>(),
        fb.keys().collect::<Vec<_>>(),
        "different file lists"
    );
    for (name, bytes) in &fa {
        assert!(bytes == &fb[name], "{name} differs between {a:?} and {b:?}");
    }
}

/// The stdout of `validate` (LOGITS and VALIDATE lines), whatever its exit status.
fn validate(snap: &Path, reference: &str, extra: &[&str]) -> String {
    let r = fixture(reference).join("ref.json");
    let o = output(
        colibri()
            .arg("validate")
            .arg("--snap")
            .arg(snap)
            .arg("--ref")
            .arg(&r)
            .args(["--case", "long"])
            .args(extra),
    );
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        out.contains("VALIDATE tf="),
        "validate printed no result: {}",
        stderr(&o)
    );
    out
}

/// Converting and validating the output gives the same LOGITS and VALIDATE lines as
/// validating the source quantized at load with the same formats.
fn same_as_at_load(hf: &str, reference: &str, expert: &str, dense: &str, group: &str) {
    let from = fixture(hf);
    let out = temp_dir("convert-agree");
    let to = out.join("c");
    let args = [
        "--expert-bits",
        expert,
        "--dense-bits",
        dense,
        "--group-size",
        group,
    ];
    convert_ok(&from, &to, &args);
    let converted = validate(&to, reference, &[]);
    let at_load = validate(&from, reference, &args);
    assert_eq!(
        converted, at_load,
        "{hf} at experts {expert} / dense {dense} / group {group}"
    );
    assert!(converted.contains("LOGITS"), "{converted}");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn fp8_converted_validates_as_quantized_at_load() {
    same_as_at_load("hf-fp8-moe", "tiny-moe-bias", "4", "4", "64");
    same_as_at_load("hf-fp8-moe", "tiny-moe-bias", "8", "8", "64");
    same_as_at_load("hf-fp8-dense", "tiny-dense-shared", "4", "8", "0");
}

#[test]
fn bf16_converted_validates_as_quantized_at_load() {
    same_as_at_load("hf-bf16-moe", "tiny-moe-bias", "4", "4", "64");
    same_as_at_load("hf-bf16-moe", "tiny-moe-bias", "2", "8", "64");
}

/// Qwen3-MoE's f32 checkpoint (its own tensor names: q/k/v projections, q/k norms, a router
/// without correction bias, no shared expert), converted, validates as quantized at load.
#[test]
fn qwen3_moe_converted_validates_as_quantized_at_load() {
    same_as_at_load("tiny-qwen3-moe", "tiny-qwen3-moe", "4", "8", "64");
    same_as_at_load("tiny-qwen3-moe-step", "tiny-qwen3-moe-step", "4", "4", "64");
}

/// GLM-4.5's checkpoint (biased q/k/v, correction bias, shared experts, expert groups),
/// converted, validates as quantized at load.
#[test]
fn glm4_moe_converted_validates_as_quantized_at_load() {
    same_as_at_load(
        "tiny-glm4-moe-groups",
        "tiny-glm4-moe-groups",
        "4",
        "8",
        "64",
    );
}

/// DeepSeek-V3's checkpoint (MLA without an indexer, expert groups, YaRN), converted,
/// validates as quantized at load.
#[test]
fn deepseek_v3_converted_validates_as_quantized_at_load() {
    same_as_at_load("tiny-deepseek-v3", "tiny-deepseek-v3", "4", "8", "64");
}

/// DeepSeek-V3 and V3.2 as deepseek-ai ships them (FP8 e4m3 in 128x128 blocks with
/// `weight_scale_inv`, the MTP layer after the last decoder layer), converted, validate as
/// quantized at load.
#[test]
fn deepseek_fp8_converted_validates_as_quantized_at_load() {
    same_as_at_load("hf-fp8-deepseek-v3", "tiny-deepseek-v3", "4", "8", "64");
    same_as_at_load("hf-fp8-deepseek-v32", "tiny-deepseek-v32", "4", "4", "64");
}

/// The FP8 checkpoints load with --snap as they are, close to the f32 oracle they were made
/// from (e4m3 keeps 3 mantissa bits: a few percent of relative error per weight). The DeepSeek
/// fixtures' wide-margin random weights amplify weight error through their layers (int8 per
/// row gives rel_rms 0.13 and 0.18 on tiny-deepseek-v3 and -v32; their FP8 copies loaded here
/// give 0.22 and 0.27, the very figures of the same weights dequantized to f32 by torch); a
/// misplaced block scale gives ~1.
#[test]
fn fp8_loads_directly() {
    for (hf, oracle, bound) in [
        ("hf-fp8-moe", "tiny-moe-bias", 0.15),
        ("hf-fp8-deepseek-v3", "tiny-deepseek-v3", 0.3),
        ("hf-fp8-deepseek-v32", "tiny-deepseek-v32", 0.35),
    ] {
        let out = validate(&fixture(hf), oracle, &[]);
        let rel: f64 = out
            .split("rel_rms=")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no rel_rms in {out}"));
        assert!(
            rel < bound,
            "{hf}: FP8 logits too far from the f32 oracle: {out}"
        );
    }
}

#[test]
fn layout_plan_line_and_metadata() {
    let out = temp_dir("convert-layout");
    let to = out.join("c");
    let o = convert_ok(&fixture("hf-fp8-moe"), &to, &["--shard-size", "100k"]);
    let err = stderr(&o);
    assert!(
        err.starts_with("[PLAN] "),
        "the first line is not [PLAN]: {err}"
    );
    assert!(err.contains("[DONE]"), "{err}");
    let f = files(&to);
    for name in [
        "config.json",
        "tokenizer.json",
        "generation_config.json",
        "model.safetensors.index.json",
        ".colibri-convert.json",
        "out-00000.safetensors",
        "out-00001.safetensors",
        "out-mtp-00000.safetensors",
        "out-idx-00000.safetensors",
    ] {
        assert!(f.contains_key(name), "{name} missing: {:?}", f.keys());
    }
    assert_eq!(
        f["config.json"],
        std::fs::read(fixture("hf-fp8-moe").join("config.json")).unwrap()
    );
    // Upstream's naming: U8 blob + F32 .qs; an expert's three projections adjacent.
    let index: serde_json::Value =
        serde_json::from_slice(&f["model.safetensors.index.json"]).unwrap();
    let map = index["weight_map"].as_object().unwrap();
    assert_eq!(
        map["model.layers.3.eh_proj.weight"],
        "out-mtp-00000.safetensors"
    );
    assert_eq!(
        map["model.layers.0.self_attn.indexer.wk.weight.qs"],
        "out-idx-00000.safetensors"
    );
    assert!(!map.keys().any(|k| k.ends_with("_scale_inv")));
    let shard = &f[map["model.layers.1.mlp.experts.5.gate_proj.weight"]
        .as_str()
        .unwrap()];
    let hlen = u64::from_le_bytes(shard[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&shard[8..8 + hlen]).unwrap();
    let span = |n: &str| {
        let o = header[n]["data_offsets"].as_array().unwrap();
        (o[0].as_u64().unwrap(), o[1].as_u64().unwrap())
    };
    let p = "model.layers.1.mlp.experts.5";
    let order = [
        format!("{p}.gate_proj.weight"),
        format!("{p}.gate_proj.weight.qs"),
        format!("{p}.up_proj.weight"),
        format!("{p}.up_proj.weight.qs"),
        format!("{p}.down_proj.weight"),
        format!("{p}.down_proj.weight.qs"),
    ];
    for w in order.windows(2) {
        assert_eq!(
            span(&w[0]).1,
            span(&w[1]).0,
            "{} and {} not adjacent",
            w[0],
            w[1]
        );
    }
    assert_eq!(header[&order[0]]["dtype"], "U8");
    assert_eq!(header[&order[1]]["dtype"], "F32");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn two_conversions_give_identical_bytes() {
    let out = temp_dir("convert-determinism");
    let (a, b) = (out.join("a"), out.join("b"));
    convert_ok(&fixture("hf-fp8-moe"), &a, &["--shard-size", "50k"]);
    convert_ok(&fixture("hf-fp8-moe"), &b, &["--shard-size", "50k"]);
    assert_same_files(&a, &b);
    // Converting again into a finished folder verifies it and changes nothing.
    let o = convert_ok(&fixture("hf-fp8-moe"), &a, &["--shard-size", "50k"]);
    assert!(stderr(&o).contains("[RESUME]"), "{}", stderr(&o));
    assert_same_files(&a, &b);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn killed_then_resumed_gives_identical_bytes() {
    let out = temp_dir("convert-resume");
    let (whole, cut) = (out.join("whole"), out.join("cut"));
    let args = ["--shard-size", "50k"];
    convert_ok(&fixture("hf-bf16-moe"), &whole, &args);
    // Stopped part way: some shards finished, one half written.
    let o =
        output(convert(&fixture("hf-bf16-moe"), &cut, &args).env("COLI_CONVERT_STOP_AFTER", "60"));
    assert_eq!(o.status.code(), Some(75), "{}", stderr(&o));
    let names: Vec<String> = files(&cut).into_keys().collect();
    assert!(names.iter().any(|n| n.ends_with(".partial")), "{names:?}");
    assert!(
        names.iter().any(|n| n == "out-00000.safetensors"),
        "{names:?}"
    );
    let o = convert_ok(&fixture("hf-bf16-moe"), &cut, &args);
    assert!(stderr(&o).contains("[RESUME]"), "{}", stderr(&o));
    assert_same_files(&whole, &cut);

    // A finished shard altered on disk is found by its hash and redone.
    let victim = cut.join("out-00000.safetensors");
    let mut bytes = std::fs::read(&victim).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    std::fs::write(&victim, &bytes).unwrap();
    convert_ok(&fixture("hf-bf16-moe"), &cut, &args);
    assert_same_files(&whole, &cut);
    let _ = std::fs::remove_dir_all(&out);
}

/// A copy of a fixture whose bytes can be changed.
fn copy_of(name: &str, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// Reverses the order of the elements of every BF16 tensor of every shard in `dir`: sizes,
/// headers and the set of values stay, every matrix changes (and stays finite).
fn shuffle_bf16(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "safetensors") {
            continue;
        }
        let mut bytes = std::fs::read(&p).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        for (name, t) in header.as_object().unwrap() {
            if name == "__metadata__" || t["dtype"] != "BF16" {
                continue;
            }
            let o = &t["data_offsets"];
            let (a, b) = (
                o[0].as_u64().unwrap() as usize,
                o[1].as_u64().unwrap() as usize,
            );
            let data = &mut bytes[8 + n + a..8 + n + b];
            let mut elems: Vec<[u8; 2]> = data.chunks_exact(2).map(|c| [c[0], c[1]]).collect();
            elems.reverse();
            data.copy_from_slice(&elems.concat());
        }
        let before = std::fs::metadata(&p).unwrap().len();
        std::fs::write(&p, &bytes).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), before);
    }
}

#[test]
fn a_changed_source_under_a_resumed_conversion_rewrites_what_changed() {
    let out = temp_dir("convert-changed-source");
    let src = out.join("src");
    copy_of("hf-bf16-moe", &src);
    let args = ["--shard-size", "50k"];
    let before = out.join("before");
    convert_ok(&src, &before, &args);
    // Stopped part way through converting the original source.
    let cut = out.join("cut");
    let o = output(convert(&src, &cut, &args).env("COLI_CONVERT_STOP_AFTER", "60"));
    assert_eq!(o.status.code(), Some(75), "{}", stderr(&o));
    let finished: Vec<String> = files(&cut)
        .into_keys()
        .filter(|n| n.ends_with(".safetensors"))
        .collect();
    assert!(!finished.is_empty(), "no shard finished before the stop");
    // The source changes in place, every file keeping its name and size.
    shuffle_bf16(&src);
    let fresh = out.join("fresh");
    convert_ok(&src, &fresh, &args);
    // The finished shards are made from bytes that changed: kept, they would be wrong.
    let (old, new) = (files(&before), files(&fresh));
    for n in &finished {
        assert!(old[n] != new[n], "{n} does not depend on the change");
    }
    let o = convert_ok(&src, &cut, &args);
    let err = stderr(&o);
    assert!(
        err.contains("source content changed since the record (same sizes): model-00001-of-00002"),
        "{err}"
    );
    assert!(
        err.contains("[SOURCE] 2 file(s) identified by content"),
        "{err}"
    );
    assert_same_files(&fresh, &cut);
    // Converting the unchanged source again keeps everything.
    let o = convert_ok(&src, &cut, &args);
    assert!(
        stderr(&o).contains("0 shard(s) written (5 kept)"),
        "{}",
        stderr(&o)
    );
    assert_same_files(&fresh, &cut);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn other_parameters_into_the_same_folder_are_refused() {
    let out = temp_dir("convert-mix");
    let to = out.join("c");
    convert_ok(&fixture("hf-fp8-moe"), &to, &[]);
    let before = files(&to);
    for other in [
        vec!["--expert-bits", "8"],
        vec!["--group-size", "0"],
        vec!["--mtp-bits", "4"],
        vec!["--shard-size", "10k"],
    ] {
        let o = output(&mut convert(&fixture("hf-fp8-moe"), &to, &other));
        assert_eq!(o.status.code(), Some(2), "{other:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("other parameters"), "{}", stderr(&o));
    }
    // Another source into the same folder is refused too.
    let o = output(&mut convert(&fixture("hf-bf16-moe"), &to, &[]));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        files(&to) == before,
        "a refused conversion changed the folder"
    );
    // So is a folder that holds a checkpoint colibri convert did not write.
    let foreign = out.join("foreign");
    std::fs::create_dir_all(&foreign).unwrap();
    std::fs::copy(
        fixture("hf-bf16-moe").join("config.json"),
        foreign.join("config.json"),
    )
    .unwrap();
    let o = output(&mut convert(&fixture("hf-fp8-moe"), &foreign, &[]));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_disk_too_small_is_refused_before_writing() {
    let out = temp_dir("convert-disk");
    let to: PathBuf = out.join("c");
    let o =
        output(convert(&fixture("hf-fp8-moe"), &to, &[]).env("COLI_CONVERT_FREE_BYTES", "200000"));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.starts_with("[PLAN] "), "{err}");
    assert!(
        err.contains("GB free") && err.contains("nothing was written"),
        "{err}"
    );
    assert!(!to.exists(), "the refused conversion created {to:?}");
    // An existing empty folder stays empty.
    std::fs::create_dir_all(&to).unwrap();
    let o =
        output(convert(&fixture("hf-fp8-moe"), &to, &[]).env("COLI_CONVERT_FREE_BYTES", "200000"));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(files(&to).is_empty());
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn bad_options_are_refused() {
    let out = temp_dir("convert-usage");
    let to = out.join("c");
    for (args, needle) in [
        (vec!["--io-bits", "4"], "--io-bits"),
        (vec!["--expert-bits", "5"], "--expert-bits"),
        (vec!["--expert-bits", "16"], "--expert-bits"),
        (vec!["--group-size", "32"], "group"),
        // int3-g64 on 48 inputs has the byte counts of int4: it would load back as int4.
        (vec!["--expert-bits", "3"], "byte counts"),
    ] {
        let o = output(&mut convert(&fixture("hf-fp8-moe"), &to, &args));
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
        assert!(!to.exists());
    }
    let _ = std::fs::remove_dir_all(&out);
}
