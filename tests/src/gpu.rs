//! What the GPU tests share: the options that put work on Mesa's lavapipe (or any Vulkan
//! adapter), running the daemon with an environment, and a greedy `run` answer to compare the
//! CPU's against.

use std::process::Output;

use crate::{colibri, fixture, root, temp_dir};

/// The Vulkan adapter with a budget that holds every fixture's weights.
pub const GPU: [&str; 4] = ["--gpu", "vulkan", "--vram-gb", "1"];

/// `colibri args` with `env`, to completion (the runtime dir set, as a desktop session has).
pub fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = colibri();
    cmd.args(args).env("XDG_RUNTIME_DIR", std::env::temp_dir());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

pub use crate::stderr;

/// `colibri run`'s greedy answer of `max_tokens` to `prompt` on fixture `model`, with
/// `extra` options and `env`, in a fresh state dir; and stderr. A failed run fails the test.
pub fn answer(
    model: &str,
    max_tokens: usize,
    prompt: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (Vec<u8>, String) {
    let snap = fixture(model);
    let state = temp_dir("gpu-run");
    let max = max_tokens.to_string();
    let mut args = vec![
        "run",
        "--snap",
        snap.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
        "--max-tokens",
        &max,
        "--temp",
        "0",
    ];
    args.extend_from_slice(extra);
    args.push(prompt);
    let o = run(&args, env);
    assert!(o.status.success(), "{model} {extra:?}: {}", stderr(&o));
    let err = stderr(&o);
    (o.stdout, err)
}

/// `colibri validate` of fixture `model`'s `case` (the bundled demo model's for
/// `demo-trained`) with `extra` and `env`: the LOGITS and VALIDATE lines it printed, and
/// stderr. A quantized mode is not exact and exits with a failing status: the lines are what
/// the tests compare.
pub fn validate(
    model: &str,
    case: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (Vec<String>, String) {
    let snap = match model {
        "demo-trained" => root().join("daemon").join("demo"),
        _ => fixture(model),
    };
    let reference = fixture(model).join("ref.json");
    let mut args = vec![
        "validate",
        "--snap",
        snap.to_str().unwrap(),
        "--ref",
        reference.to_str().unwrap(),
        "--case",
        case,
    ];
    args.extend_from_slice(extra);
    let o = run(&args, env);
    let lines = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.starts_with("LOGITS") || l.starts_with("VALIDATE"))
        .map(str::to_string)
        .collect();
    (lines, stderr(&o))
}
