//! Attention on the GPU through the real binary, on Mesa's lavapipe where there is no GPU
//! (`.ci/run` installs it): `validate` in f32 stays token-exact on every fixture, short and
//! long (the DSA families past `index_topk`), with `--gpu vulkan --vram-gb 1`; a device lost
//! mid-turn turns GPU attention off with one line and the CPU gives the same answer; a served
//! multi-turn conversation is the CPU daemon's; `COLI_GPU_ATTN=0` keeps attention on the CPU,
//! as int8 activations do unless `COLI_GPU_ATTN=1`.
//! Without a Vulkan driver the tests say they are skipped and why.

use colibri_e2e::gpu::{self, GPU};
use colibri_e2e::oracle::is_exact as exact;
use colibri_e2e::{fixture, temp_dir};

/// `validate` of `model`'s `case` in f32: its VALIDATE line, and stderr.
fn validate(model: &str, case: &str, extra: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let (lines, err) = gpu::validate(model, case, extra, env);
    let line = lines
        .into_iter()
        .find(|l| l.starts_with("VALIDATE"))
        .unwrap_or_else(|| panic!("{model} {case} {extra:?}: no VALIDATE line\n{err}"));
    (line, err)
}

/// Whether a Vulkan adapter opens (the expert tier places int8 experts on it); says the test
/// is skipped when not. Only a missing adapter skips: GPU attention failing to start on one
/// fails the tests.
fn have_vulkan(test: &str) -> bool {
    let probe: Vec<&str> = ["--expert-bits", "8"].iter().chain(&GPU).copied().collect();
    let (_, err) = validate("tiny-moe-bias", "short", &probe, &[]);
    if err.contains("experts in VRAM") {
        assert!(err.contains("[GPU] attention on"), "{err}");
        return true;
    }
    eprintln!("{test}: skipped: no Vulkan adapter (install mesa-vulkan-drivers): {err}");
    false
}

#[test]
fn validate_in_f32_with_gpu_attention_is_token_exact_on_every_fixture() {
    if !have_vulkan("validate_in_f32_with_gpu_attention_is_token_exact_on_every_fixture") {
        return;
    }
    for model in [
        "tiny-moe-bias",
        "tiny-deepseek-v32",
        "tiny-deepseek-v3",
        "tiny-dense-shared",
        "tiny-qwen3-moe",
        "tiny-qwen3-moe-step",
        "tiny-glm4-moe",
        "tiny-glm4-moe-groups",
    ] {
        for case in ["short", "long"] {
            let (cpu, _) = validate(model, case, &[], &[]);
            let (gpu, err) = validate(model, case, &GPU, &[]);
            assert!(exact(&cpu), "{model} {case}: the CPU's own line {cpu}");
            assert!(exact(&gpu), "{model} {case}: {gpu}\n{err}");
            assert_eq!(gpu, cpu, "{model} {case}");
            assert!(err.contains("[GPU] attention on"), "{model} {case}: {err}");
            assert!(!err.contains("attention is off"), "{model} {case}: {err}");
            // The MLA families' f32 kv_b is set aside in the budget before anything else.
            let mla = !model.contains("qwen3") && !model.contains("glm4");
            assert_eq!(
                err.contains("attention's kv_b ("),
                mla,
                "{model} {case}: {err}"
            );
        }
    }
    // The DSA families with sparsity off (every key kept) too.
    for model in ["tiny-moe-bias", "tiny-dense-shared"] {
        let topk = ["--index-topk", "4096"];
        let args: Vec<&str> = GPU.iter().chain(&topk).copied().collect();
        let (gpu, err) = validate(model, "long_dense", &args, &[]);
        assert!(exact(&gpu), "{model} long_dense: {gpu}\n{err}");
    }
}

/// `colibri run`'s greedy answer on the DSA fixture in f32, and stderr.
fn answer(extra: &[&str], env: &[(&str, &str)]) -> (Vec<u8>, String) {
    let prompt = "Is the sea wide? Tell me about the waves and the wind over the water.";
    gpu::answer("tiny-deepseek-v32", 40, prompt, extra, env)
}

#[test]
fn a_device_lost_mid_turn_turns_gpu_attention_off_with_the_same_answer() {
    if !have_vulkan("a_device_lost_mid_turn_turns_gpu_attention_off_with_the_same_answer") {
        return;
    }
    let (cpu, _) = answer(&[], &[]);
    let (gpu, err) = answer(&GPU, &[]);
    assert_eq!(gpu, cpu, "{err}");
    assert!(err.contains("[GPU] attention on"), "{err}");
    assert!(!err.contains("attention is off"), "{err}");
    // The fourth batch fails inside the prompt's forward; the 400th in a decode step.
    for after in ["3", "400"] {
        let (lost, err) = answer(&GPU, &[("COLI_GPU_FAIL_AFTER", after)]);
        assert_eq!(lost, cpu, "after {after}: {err}");
        assert_eq!(err.matches("attention is off").count(), 1, "{err}");
        assert!(err.contains("device lost (simulated"), "{err}");
    }
    // COLI_GPU_ATTN=0: the expert tier may still use the GPU, attention does not.
    let (out, err) = answer(&GPU, &[("COLI_GPU_ATTN", "0")]);
    assert_eq!(out, cpu);
    assert!(!err.contains("[GPU] attention"), "{err}");
    // With int8 activations attention stays on the CPU unless COLI_GPU_ATTN=1 asks: the
    // answer is then the CPU's int8 one, bit for bit.
    let int8 = ["--expert-bits", "8", "--dense-bits", "8"];
    let (cpu8, _) = answer(&int8, &[]);
    let args: Vec<&str> = int8.iter().chain(&GPU).copied().collect();
    let (out, err) = answer(&args, &[]);
    assert_eq!(out, cpu8, "{err}");
    assert!(
        err.contains("[GPU] attention stays on the CPU with int8 activations"),
        "{err}"
    );
    let (_, err) = answer(&args, &[("COLI_GPU_ATTN", "1")]);
    assert!(err.contains("[GPU] attention on"), "{err}");
    assert!(!err.contains("attention is off"), "{err}");
}

/// A served conversation of three turns with attention on the GPU: every answer is the CPU
/// daemon's (the device mirror of the session's cache grows turn by turn).
#[test]
fn a_served_conversation_with_gpu_attention_answers_as_the_cpu() {
    if !have_vulkan("a_served_conversation_with_gpu_attention_answers_as_the_cpu") {
        return;
    }
    let turns = [
        "Tell me about the sea.",
        "And the wind over it?",
        "Why is the sky blue?",
    ];
    for model in ["tiny-deepseek-v32", "tiny-qwen3-moe"] {
        let snap = fixture(model);
        let transcript = |extra: &[&str]| {
            let state = temp_dir("gpu-attn-serve");
            let mut args = vec!["--snap", snap.to_str().unwrap(), "--temp", "0"];
            args.extend_from_slice(extra);
            let (mut d, _) = colibri_e2e::Daemon::start(&args, &state);
            let texts: Vec<Vec<u8>> = turns.iter().map(|t| d.prompt(t, 24, None).0).collect();
            let err = d.stderr();
            assert!(d.finish().success(), "{err}");
            (texts, err)
        };
        let (cpu, _) = transcript(&[]);
        let (gpu, err) = transcript(&GPU);
        assert_eq!(gpu, cpu, "{model}: {err}");
        assert!(err.contains("[GPU] attention on"), "{model}: {err}");
        assert!(!err.contains("attention is off"), "{model}: {err}");
    }
}
