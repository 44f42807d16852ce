//! The dense weights in VRAM through the real binary, on Mesa's lavapipe where there is no GPU
//! (`.ci/run` installs it): `validate` in full precision stays token for token exact with
//! every dense product on the GPU (every oracle fixture and case, a DSA family past
//! `index_topk` included), each quantized mode gives the CPU's very LOGITS and VALIDATE lines,
//! the start line counts the dense matrices and the experts, and a device lost mid-turn falls
//! back to the CPU with one line and the same answer. `colibri info` names the adapter (or
//! why there is none) and HWINFO counts the GPU the weights are on. Without a Vulkan driver
//! the tests say they are skipped and why.

use colibri_e2e::gpu::{self, run, stderr, GPU};
use colibri_e2e::mux::MuxDaemon;
use colibri_e2e::{fixture, temp_dir};
use protocol::mux::MuxReply;
use protocol::Telemetry;

/// `validate` of `model`'s `case`: its LOGITS and VALIDATE lines, and stderr.
fn validate(model: &str, case: &str, extra: &[&str]) -> (String, String) {
    let (lines, err) = gpu::validate(model, case, extra, &[]);
    assert_eq!(lines.len(), 2, "{model} {case} {extra:?}: {lines:?}\n{err}");
    (lines.join("\n"), err)
}

/// The count before `what` on the `[GPU]` start line (`N dense matrices`, `N experts in VRAM`).
fn count(err: &str, what: &str) -> usize {
    err.lines()
        .filter(|l| l.starts_with("[GPU]"))
        .find_map(|l| {
            let at = l.find(what)?;
            l[..at].rsplit(' ').next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no `{what}` on a [GPU] line in {err}"))
}

/// Whether a Vulkan adapter opens; says the test is skipped when not.
fn have_vulkan(test: &str) -> bool {
    let (_, err) = validate("tiny-moe-bias", "short", &GPU);
    if err.contains(" dense matrices") {
        return true;
    }
    eprintln!("{test}: skipped: no Vulkan adapter (install mesa-vulkan-drivers): {err}");
    false
}

/// `VALIDATE tf=a/b gen=c/d`: both fractions whole.
fn exact(line: &str) -> bool {
    let v = line.lines().last().unwrap_or("");
    let f: Vec<&str> = v.split([' ', '=', '/']).collect();
    f.len() >= 7 && f[0] == "VALIDATE" && f[2] == f[3] && f[5] == f[6]
}

#[test]
fn validate_in_f32_with_the_dense_weights_on_the_gpu_is_token_exact() {
    if !have_vulkan("validate_in_f32_with_the_dense_weights_on_the_gpu_is_token_exact") {
        return;
    }
    let cases: &[(&str, &str, &[&str])] = &[
        ("tiny-dense-shared", "short", &[]),
        ("tiny-dense-shared", "long", &[]),
        ("tiny-dense-shared", "long_dense", &["--index-topk", "4096"]),
        ("tiny-moe-bias", "short", &[]),
        ("tiny-moe-bias", "long", &[]),
        ("tiny-moe-bias", "long_dense", &["--index-topk", "4096"]),
        ("tiny-qwen3-moe", "short", &[]),
        ("tiny-qwen3-moe", "long", &[]),
        ("tiny-qwen3-moe-step", "long", &[]),
        ("tiny-glm4-moe", "long", &[]),
        ("tiny-glm4-moe-groups", "long", &[]),
        ("tiny-deepseek-v3", "long", &[]),
        ("tiny-deepseek-v32", "short", &[]),
        // Past index_topk: the DSA indexer's own projections on the GPU too.
        ("tiny-deepseek-v32", "long", &[]),
        ("demo-trained", "long", &[]),
    ];
    for &(model, case, extra) in cases {
        let mut args = extra.to_vec();
        args.extend_from_slice(&GPU);
        let (gpu, err) = validate(model, case, &args);
        assert!(exact(&gpu), "{model} {case}: {gpu}\n{err}");
        assert!(count(&err, " dense matrices") > 0, "{model}: {err}");
        // The CPU's verdict too (its LOGITS differ in the last bits: see daemon/tests/gpu_dense.rs).
        let (cpu, _) = validate(model, case, extra);
        assert_eq!(gpu.lines().last(), cpu.lines().last(), "{model} {case}");
    }
}

#[test]
fn quantized_validate_with_the_dense_weights_on_the_gpu_gives_the_cpus_lines() {
    if !have_vulkan("quantized_validate_with_the_dense_weights_on_the_gpu_gives_the_cpus_lines") {
        return;
    }
    let modes: [&[&str]; 5] = [
        &["--dense-bits", "8", "--expert-bits", "8"],
        &["--dense-bits", "4", "--expert-bits", "4"],
        &[
            "--dense-bits",
            "4",
            "--group-size",
            "0",
            "--expert-bits",
            "4",
        ],
        &["--dense-bits", "3", "--expert-bits", "3"],
        &["--dense-bits", "2", "--expert-bits", "2"],
    ];
    for model in [
        "tiny-moe-bias",
        "tiny-deepseek-v32",
        "tiny-qwen3-moe",
        "tiny-glm4-moe",
    ] {
        for mode in modes {
            let (cpu, _) = validate(model, "long", mode);
            let mut args = mode.to_vec();
            args.extend_from_slice(&GPU);
            let (gpu, err) = validate(model, "long", &args);
            assert_eq!(gpu, cpu, "{model} {mode:?}: {err}");
            // Every dense matrix and every expert fits in 1 GB.
            assert!(count(&err, " dense matrices") > 0, "{model}: {err}");
            assert!(count(&err, " experts in VRAM") > 0, "{model}: {err}");
        }
    }
}

/// The dense weights come first: a budget too small for the first of them (lm_head) leaves it
/// all to the experts, and the line says so.
#[test]
fn the_dense_weights_take_the_budget_first() {
    if !have_vulkan("the_dense_weights_take_the_budget_first") {
        return;
    }
    let mode = ["--dense-bits", "8", "--expert-bits", "8"];
    let (cpu, _) = validate("tiny-moe-bias", "long", &mode);
    let mut all = mode.to_vec();
    all.extend_from_slice(&GPU);
    let (_, err) = validate("tiny-moe-bias", "long", &all);
    let (dense, experts) = (
        count(&err, " dense matrices"),
        count(&err, " experts in VRAM"),
    );
    let mut tight = mode.to_vec();
    tight.extend_from_slice(&["--gpu", "vulkan", "--vram-gb", "0.00002"]);
    let (gpu, err) = validate("tiny-moe-bias", "long", &tight);
    assert_eq!(gpu, cpu, "{err}");
    assert_eq!(count(&err, " dense matrices"), 0, "{err}");
    let few = count(&err, " experts in VRAM");
    assert!(few > 0 && few < experts, "{few} of {experts}: {err}");
    assert!(dense > 0, "{dense}");
}

#[test]
fn a_device_lost_mid_turn_moves_the_dense_weights_to_the_cpu_with_the_same_answer() {
    if !have_vulkan(
        "a_device_lost_mid_turn_moves_the_dense_weights_to_the_cpu_with_the_same_answer",
    ) {
        return;
    }
    let answer = |extra: &[&str], env: &[(&str, &str)]| {
        gpu::answer("tiny-moe-bias", 24, "Is the sea wide?", extra, env)
    };
    // f32 (the dense weights only) and int8 (dense weights and experts).
    for mode in [&[][..], &["--dense-bits", "8", "--expert-bits", "8"]] {
        let (cpu, _) = answer(mode, &[]);
        let mut gpu = mode.to_vec();
        gpu.extend_from_slice(&GPU);
        // The first batch fails (inside the prompt's first layer), or a later one.
        for after in ["0", "5", "40"] {
            let (lost, err) = answer(&gpu, &[("COLI_GPU_FAIL_AFTER", after)]);
            assert_eq!(lost, cpu, "{mode:?} after {after}: {err}");
            let said: Vec<&str> = err.lines().filter(|l| l.contains("device lost")).collect();
            assert_eq!(said.len(), 1, "{mode:?} after {after}: {err}");
            assert!(
                said[0].starts_with("[GPU]") && said[0].contains("dense matrices run on the CPU"),
                "{err}"
            );
        }
    }
}

/// `colibri info`'s `[GPU]` line (stderr) and the JSON's `gpu`.
fn info_gpu(gpu: &str) -> (String, serde_json::Value) {
    let snap = fixture("tiny-moe-bias");
    let state = temp_dir("gpu-dense-info");
    let args = |json: bool| {
        let mut a = vec!["info", "--snap", snap.to_str().unwrap()];
        a.extend_from_slice(&["--state-dir", state.to_str().unwrap(), "--gpu", gpu]);
        if json {
            a.push("--json");
        }
        a
    };
    let o = run(&args(false), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let line = stderr(&o)
        .lines()
        .find(|l| l.starts_with("[GPU]"))
        .unwrap_or_else(|| panic!("no [GPU] line: {}", stderr(&o)))
        .to_string();
    let o = run(&args(true), &[]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    (line, v)
}

#[test]
fn info_names_the_adapter_or_says_why_there_is_none() {
    let (line, v) = info_gpu("off");
    assert_eq!(line, "[GPU] off (--gpu off)");
    assert_eq!(v["gpu"], "off (--gpu off)");
    if cfg!(target_os = "linux") {
        let (line, _) = info_gpu("metal");
        assert!(line.starts_with("[GPU] no GPU adapter: "), "{line}");
    }
    if !have_vulkan("info_names_the_adapter_or_says_why_there_is_none") {
        return;
    }
    let (line, v) = info_gpu("vulkan");
    // `[GPU] <adapter> (Vulkan, <driver>): largest buffer <size>`
    assert!(
        line.contains(" (Vulkan, ") && line.contains("): largest buffer "),
        "{line}"
    );
    let size = line.rsplit("largest buffer ").next().unwrap();
    assert!(size.ends_with(" MB") || size.ends_with(" GB"), "{line}");
    assert_eq!(v["gpu"].as_str(), line.strip_prefix("[GPU] "));
}

/// The HWINFO line of a mux daemon's start-up block, decoded and as bytes.
fn hwinfo(extra: &[&str]) -> (protocol::HwInfo, String) {
    let state = temp_dir("gpu-dense-hwinfo");
    let snap = fixture("tiny-moe-bias");
    let mut args = vec!["--snap", snap.to_str().unwrap(), "--expert-bits", "8"];
    args.extend_from_slice(extra);
    let (d, startup) = MuxDaemon::start(&args, &state);
    let info = startup
        .iter()
        .find_map(|r| match r {
            MuxReply::Telemetry(Telemetry::HwInfo(h)) => Some(h.clone()),
            _ => None,
        })
        .expect("HWINFO at start-up");
    let raw = String::from_utf8_lossy(&d.raw).into_owned();
    let line = raw
        .lines()
        .find(|l| l.starts_with("HWINFO "))
        .expect("HWINFO line")
        .to_string();
    d.kill9();
    (info, line)
}

#[test]
fn hwinfo_counts_the_gpu_the_weights_are_on() {
    // No GPU: upstream's CPU build, `0 0.0` and an empty name.
    let (cpu, line) = hwinfo(&["--gpu", "off", "--vram-gb", "1"]);
    assert_eq!(
        (cpu.ngpu, cpu.vram_total_gb, cpu.gpu_name.as_str()),
        (0, 0.0, "")
    );
    assert!(line.ends_with('|') && line.contains(" 0 0.0 "), "{line}");
    if !have_vulkan("hwinfo_counts_the_gpu_the_weights_are_on") {
        return;
    }
    let (gpu, line) = hwinfo(&["--gpu", "vulkan", "--vram-gb", "1.5"]);
    assert_eq!((gpu.ngpu, gpu.vram_total_gb), (1, 1.5), "{line}");
    assert!(
        gpu.gpu_name.ends_with(" x1") && gpu.gpu_name.len() > 3,
        "{line}"
    );
    // The same fields in the same places: only the GPU's are filled in.
    assert_eq!(gpu.cores, cpu.cores);
    assert_eq!(gpu.cpu_name, cpu.cpu_name);
    assert!(
        line.contains(" 1 1.5 ") && line.ends_with(&format!("|{}", gpu.gpu_name)),
        "{line}"
    );
}
