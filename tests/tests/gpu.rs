//! The VRAM tier through the real binary, on Mesa's lavapipe where there is no GPU (`.ci/run`
//! installs it): `validate` gives the CPU's very LOGITS and VALIDATE lines with experts on the
//! GPU (all of them, or some beside CPU ones in the same layer; a DSA family past
//! `index_topk`), a device lost mid-turn falls back to the CPU with the same answer, no adapter
//! is one `[GPU]` line and the CPU path, and a bad `--gpu` is a usage error. Without a Vulkan
//! driver the tests say they are skipped and why.

use colibri_e2e::gpu::{self, run, stderr};
use colibri_e2e::{fixture, temp_dir};

/// `validate` of `model`'s long case with 8-bit dense weights: its LOGITS and VALIDATE
/// lines, and stderr.
fn validate(model: &str, extra: &[&str]) -> (String, String) {
    let args: Vec<&str> = ["--dense-bits", "8"].iter().chain(extra).copied().collect();
    let (lines, err) = gpu::validate(model, "long", &args, &[]);
    assert_eq!(lines.len(), 2, "{model} {extra:?}: {lines:?}\n{err}");
    (lines.join("\n"), err)
}

/// Whether a Vulkan adapter opens; says the test is skipped when not.
fn have_vulkan(test: &str) -> bool {
    let (_, err) = validate(
        "tiny-moe-bias",
        &["--expert-bits", "8", "--gpu", "vulkan", "--vram-gb", "1"],
    );
    if err.contains("experts in VRAM") {
        return true;
    }
    eprintln!("{test}: skipped: no Vulkan adapter (install mesa-vulkan-drivers): {err}");
    false
}

/// The count in `[GPU] ...: N experts in VRAM`.
fn placed(err: &str) -> usize {
    err.find(" experts in VRAM")
        .and_then(|at| err[..at].rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no placement line in {err}"))
}

#[test]
fn validate_on_the_vram_tier_gives_the_cpus_lines() {
    if !have_vulkan("validate_on_the_vram_tier_gives_the_cpus_lines") {
        return;
    }
    for model in [
        "tiny-moe-bias",
        "tiny-deepseek-v32",
        "tiny-qwen3-moe",
        "tiny-glm4-moe",
    ] {
        for format in [
            &["--expert-bits", "8"][..],
            &["--expert-bits", "4", "--group-size", "0"],
        ] {
            let (cpu, _) = validate(model, format);
            // All the experts, then a few beside CPU ones in the same layers.
            for vram in ["1", "0.00002"] {
                let mut args = format.to_vec();
                args.extend_from_slice(&["--gpu", "vulkan", "--vram-gb", vram]);
                let (gpu, err) = validate(model, &args);
                assert_eq!(gpu, cpu, "{model} {args:?}: {err}");
                let n = placed(&err);
                assert!(n > 0, "{model} {args:?}: {err}");
                if vram != "1" {
                    assert!(n < 24, "{model}: {n} placed at {vram} GB: {err}");
                }
            }
        }
    }
}

/// `colibri run`'s answer in int8, and stderr.
fn answer(extra: &[&str], env: &[(&str, &str)]) -> (Vec<u8>, String) {
    let int8 = ["--expert-bits", "8", "--dense-bits", "8"];
    let args: Vec<&str> = int8.iter().chain(extra).copied().collect();
    gpu::answer("tiny-moe-bias", 24, "Is the sea wide?", &args, env)
}

#[test]
fn a_device_lost_mid_turn_falls_back_to_the_cpu_with_the_same_answer() {
    if !have_vulkan("a_device_lost_mid_turn_falls_back_to_the_cpu_with_the_same_answer") {
        return;
    }
    let (cpu, _) = answer(&[], &[]);
    let gpu = ["--gpu", "vulkan", "--vram-gb", "1"];
    let (all_gpu, err) = answer(&gpu, &[]);
    assert_eq!(all_gpu, cpu, "{err}");
    assert!(!err.contains("VRAM tier is off"), "{err}");
    // The fourth batch of products fails, inside the prompt's first forward or a step.
    for after in ["3", "40"] {
        let (lost, err) = answer(&gpu, &[("COLI_GPU_FAIL_AFTER", after)]);
        assert_eq!(lost, cpu, "after {after}: {err}");
        assert!(
            err.contains("device lost (simulated")
                && err.contains("the VRAM tier is off")
                && err.matches("the VRAM tier is off").count() == 1,
            "{err}"
        );
    }
}

#[test]
fn no_adapter_is_one_line_and_the_cpu_path() {
    let (cpu, _) = answer(&[], &[]);
    // No Metal on Linux; on a Mac this names a backend that exists, so only Linux checks.
    if cfg!(target_os = "linux") {
        let (out, err) = answer(&["--gpu", "metal", "--vram-gb", "1"], &[]);
        assert_eq!(out, cpu);
        assert!(
            err.contains("[GPU] no GPU adapter") && err.contains("every expert runs on the CPU"),
            "{err}"
        );
    }
    // --gpu off never looks.
    let (out, err) = answer(&["--gpu", "off", "--vram-gb", "1"], &[]);
    assert_eq!(out, cpu);
    assert!(!err.contains("[GPU]"), "{err}");
}

#[test]
fn bad_gpu_options_are_usage_errors() {
    let snap = fixture("tiny-moe-bias");
    for (args, says) in [
        (&["--gpu", "cuda"][..], "auto, vulkan, metal, dx12 or off"),
        (
            &["--vram-gb", "-1"][..],
            "--vram-gb -1: must be a number of GB from 0",
        ),
    ] {
        let mut all = vec!["run", "--snap", snap.to_str().unwrap()];
        all.extend_from_slice(args);
        all.push("hi");
        let o = run(&all, &[]);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
    }
}

/// A served conversation with a VRAM tier of a few experts: between turns the tier takes the
/// experts the conversation made hot (a `[GPU] re-plan` line), and every turn's answer is the
/// CPU daemon's.
#[test]
fn the_vram_tier_is_replanned_between_turns_and_answers_as_the_cpu() {
    if !have_vulkan("the_vram_tier_is_replanned_between_turns_and_answers_as_the_cpu") {
        return;
    }
    let snap = fixture("tiny-moe-bias");
    let turns = [
        "Tell me about the sea.",
        "And the wind over it?",
        "Why is the sky blue?",
    ];
    let transcript = |extra: &[&str]| {
        let state = temp_dir("gpu-serve");
        let mut args = vec![
            "--snap",
            snap.to_str().unwrap(),
            "--temp",
            "0",
            "--expert-bits",
            "8",
            "--dense-bits",
            "8",
        ];
        args.extend_from_slice(extra);
        let (mut d, _) = colibri_e2e::Daemon::start(&args, &state);
        let texts: Vec<Vec<u8>> = turns.iter().map(|t| d.prompt(t, 24, None).0).collect();
        let err = d.stderr();
        assert!(d.finish().success(), "{err}");
        (texts, err)
    };
    let (cpu, _) = transcript(&[]);
    let (gpu, err) = transcript(&["--gpu", "vulkan", "--vram-gb", "0.00002"]);
    assert_eq!(gpu, cpu, "{err}");
    let first = placed(&err);
    assert!(first > 0 && first < 24, "{err}");
    assert!(err.contains("[GPU] re-plan: "), "{err}");
}

#[test]
fn bench_measures_the_devices_read_bandwidth_beside_the_token() {
    if !have_vulkan("bench_measures_the_devices_read_bandwidth_beside_the_token") {
        return;
    }
    let snap = fixture("tiny-moe-bias");
    let o = run(
        &[
            "bench",
            "--snap",
            snap.to_str().unwrap(),
            "--prompt-tokens",
            "2",
            "--gen-tokens",
            "3",
            "--no-disk-probe",
            "--dense-bits",
            "8",
            "--expert-bits",
            "8",
            "--gpu",
            "vulkan",
            "--vram-gb",
            "1",
        ],
        &[],
    );
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("[bench] gpu: "))
        .unwrap_or_else(|| panic!("no gpu line: {err}"));
    let gbs: f64 = line
        .split("read bandwidth ")
        .nth(1)
        .and_then(|r| r.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no bandwidth in {line}"));
    assert!(gbs > 0.0 && gbs.is_finite(), "{line}");
    let n = placed(&err);
    assert!(
        line.contains(&format!("; {n} experts (")),
        "{line} / {n} placed"
    );
    assert!(line.contains("the whole token's "), "{line}");
    // The weights line the GPU script sizes its budgets from.
    assert!(
        err.lines().any(|l| l.starts_with("[bench] weights: dense ")
            && l.contains(" layers of routed experts of ")),
        "{err}"
    );
    // Without a GPU in use there is no gpu line.
    let o = run(
        &[
            "bench",
            "--snap",
            snap.to_str().unwrap(),
            "--prompt-tokens",
            "2",
            "--gen-tokens",
            "3",
            "--no-disk-probe",
            "--gpu",
            "off",
        ],
        &[],
    );
    assert!(!stderr(&o).contains("[bench] gpu:"), "{}", stderr(&o));
}
