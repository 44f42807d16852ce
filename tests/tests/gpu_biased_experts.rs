//! The VRAM tier for experts with biases and a clamped SwiGLU, through the real binary, on
//! Mesa's lavapipe where there is no GPU (`.ci/run` installs it): gpt-oss converted to int4,
//! gpt-oss with its published MXFP4 experts (converted, and read in place from the published
//! checkpoint), and DeepSeek-V4 converted to int4 each give the CPU's very LOGITS and VALIDATE
//! lines with every expert in VRAM and with a few beside CPU ones, and `colibri run`'s greedy
//! answer is the CPU's. Without a Vulkan driver the tests say they are skipped and why.

use std::path::{Path, PathBuf};

use colibri_e2e::gpu::{run, stderr};
use colibri_e2e::{colibri, fixture, run_ok, temp_dir};

/// The formats of every conversion here, given again to `validate` and `run`: a converted
/// container keeps its stored formats whatever they say, but these options still choose int8
/// activations (the only ones the VRAM tier computes) over the f32 ones of `--dense-bits 16`.
const FORMATS: [&str; 4] = ["--expert-bits", "4", "--dense-bits", "8"];

/// `colibri convert --from <fixture from> --to <tag dir>/c <args>`: the output dir.
fn convert(from: &str, tag: &str, args: &[&str]) -> PathBuf {
    let to = temp_dir(tag).join("c");
    let mut cmd = colibri();
    cmd.arg("convert")
        .arg("--from")
        .arg(fixture(from))
        .arg("--to")
        .arg(&to)
        .args(args)
        .env_remove("COLI_CONVERT_STOP_AFTER")
        .env_remove("COLI_CONVERT_FREE_BYTES");
    run_ok(&mut cmd);
    to
}

/// `colibri validate` of `snap` against fixture `reference`'s long case with `extra`: its
/// LOGITS and VALIDATE lines, and stderr.
fn validate(snap: &Path, reference: &str, extra: &[&str]) -> (String, String) {
    let reference = fixture(reference).join("ref.json");
    let mut args = vec![
        "validate",
        "--snap",
        snap.to_str().unwrap(),
        "--ref",
        reference.to_str().unwrap(),
        "--case",
        "long",
    ];
    args.extend_from_slice(&FORMATS);
    args.extend_from_slice(extra);
    let o = run(&args, &[]);
    let lines: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.starts_with("LOGITS") || l.starts_with("VALIDATE"))
        .map(str::to_string)
        .collect();
    let err = stderr(&o);
    assert_eq!(lines.len(), 2, "{extra:?}: {lines:?}\n{err}");
    (lines.join("\n"), err)
}

/// `colibri run --raw`'s greedy answer of 24 tokens on `snap` with `extra`, and stderr.
fn answer(snap: &Path, extra: &[&str]) -> (Vec<u8>, String) {
    let state = temp_dir("gpubias-run");
    let mut args = vec![
        "run",
        "--snap",
        snap.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
        "--max-tokens",
        "24",
        "--temp",
        "0",
    ];
    args.extend_from_slice(&FORMATS);
    args.extend_from_slice(extra);
    // Raw: gpt-oss's chat template alone would fill the fixture's context of 256.
    args.extend_from_slice(&["--raw", "Tell me about the sea."]);
    let o = run(&args, &[]);
    let err = stderr(&o);
    assert!(o.status.success(), "{extra:?}: {err}");
    (o.stdout, err)
}

/// The count in `[GPU] ...: N experts in VRAM`.
fn placed(err: &str) -> usize {
    err.find(" experts in VRAM")
        .and_then(|at| err[..at].rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no placement line in {err}"))
}

/// `snap` (a conversion of fixture `reference`) with its experts on the VRAM tier: all of
/// them, then a few beside CPU ones in the same layers, gives the CPU's LOGITS and VALIDATE
/// lines, and the greedy answer is the CPU's. False (the test is skipped, and says so) when
/// no Vulkan adapter opens.
fn answers_as_the_cpu(test: &str, snap: &Path, reference: &str) -> bool {
    let (cpu, _) = validate(snap, reference, &[]);
    let mut counts = Vec::new();
    for vram in ["1", "0.00002"] {
        let args = ["--gpu", "vulkan", "--vram-gb", vram];
        let (gpu, err) = validate(snap, reference, &args);
        if !err.contains(" experts in VRAM") {
            eprintln!("{test}: skipped: no Vulkan adapter (install mesa-vulkan-drivers): {err}");
            return false;
        }
        let n = placed(&err);
        assert!(n > 0, "{reference} --vram-gb {vram}: {err}");
        assert_eq!(gpu, cpu, "{reference} --vram-gb {vram}: {err}");
        counts.push(n);
    }
    assert!(counts[1] < counts[0], "{reference}: {counts:?} placed");
    let (cpu, _) = answer(snap, &[]);
    let (gpu, err) = answer(snap, &["--gpu", "vulkan", "--vram-gb", "1"]);
    assert!(placed(&err) > 0, "{err}");
    assert!(!err.contains("VRAM tier is off"), "{err}");
    assert_eq!(
        String::from_utf8_lossy(&gpu),
        String::from_utf8_lossy(&cpu),
        "{err}"
    );
    true
}

#[test]
fn gpt_oss_converted_to_int4_answers_on_the_vram_tier_as_on_the_cpu() {
    let snap = convert("tiny-gpt-oss", "gpubias-oss-int4", &FORMATS);
    answers_as_the_cpu(
        "gpt_oss_converted_to_int4_answers_on_the_vram_tier_as_on_the_cpu",
        &snap,
        "tiny-gpt-oss",
    );
}

/// The published MXFP4 experts are uploaded as they are (no int4 of them): converted, and
/// read in place from the published checkpoint (each expert's byte ranges in the fused
/// tensors).
#[test]
fn gpt_oss_mxfp4_experts_answer_on_the_vram_tier_as_on_the_cpu() {
    answers_as_the_cpu(
        "gpt_oss_mxfp4_experts_answer_on_the_vram_tier_as_on_the_cpu",
        &fixture("tiny-gpt-oss-mxfp4"),
        "tiny-gpt-oss-mxfp4",
    );
    let snap = convert("tiny-gpt-oss-mxfp4", "gpubias-oss-mxfp4", &FORMATS);
    let o = run(&["info", "--snap", snap.to_str().unwrap()], &[]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("mxfp4 (stored)"), "{text}");
    answers_as_the_cpu(
        "gpt_oss_mxfp4_experts_answer_on_the_vram_tier_as_on_the_cpu",
        &snap,
        "tiny-gpt-oss-mxfp4",
    );
}

#[test]
fn deepseek_v4_converted_to_int4_answers_on_the_vram_tier_as_on_the_cpu() {
    let snap = convert("tiny-deepseek-v4", "gpubias-dsv4-int4", &FORMATS);
    answers_as_the_cpu(
        "deepseek_v4_converted_to_int4_answers_on_the_vram_tier_as_on_the_cpu",
        &snap,
        "tiny-deepseek-v4",
    );
}
