//! Checked weights: `colibri verify` against the checksums `colibri convert` writes, a damaged
//! expert (NaN scales; with `--verify-reads`, any changed byte) failing the request that
//! touches it in both protocols while the daemon stays up, and the next request after the
//! file is restored answering exactly as a fresh daemon does.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use colibri_e2e::mux::{data_of, error_of, MuxDaemon};
use colibri_e2e::{colibri, fixture, stderr, temp_dir, Daemon};
use protocol::mux::ErrorCode;

/// The BF16 copy of tiny-moe-bias (3 MoE layers of 16 experts), converted at the defaults.
fn converted(tag: &str) -> PathBuf {
    let to = temp_dir(tag).join("model");
    let o = colibri()
        .arg("convert")
        .arg("--from")
        .arg(fixture("hf-bf16-moe"))
        .arg("--to")
        .arg(&to)
        .env_remove("COLI_CONVERT_STOP_AFTER")
        .env_remove("COLI_CONVERT_FREE_BYTES")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    to
}

fn verify(snap: &Path) -> Output {
    colibri()
        .arg("verify")
        .arg("--snap")
        .arg(snap)
        .output()
        .unwrap()
}

/// The shard holding tensor `name` and the tensor's byte range in it.
fn span(model: &Path, name: &str) -> (PathBuf, u64, u64) {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(model.join("model.safetensors.index.json")).unwrap())
            .unwrap();
    let shard = model.join(index["weight_map"][name].as_str().unwrap());
    let bytes = std::fs::read(&shard).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n as usize]).unwrap();
    let o = &header[name]["data_offsets"];
    let (a, b) = (o[0].as_u64().unwrap(), o[1].as_u64().unwrap());
    (shard, 8 + n + a, b - a)
}

/// Writes `bytes` at `at` of `path` in place (the inode a running daemon has open).
fn write_at(path: &Path, at: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, at).unwrap();
}

fn read_at(path: &Path, at: u64, len: usize) -> Vec<u8> {
    std::fs::read(path).unwrap()[at as usize..at as usize + len].to_vec()
}

fn recorded_hash(model: &Path, name: &str) -> String {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(model.join("colibri-checksums.json")).unwrap())
            .unwrap();
    v["tensors"][name]["xxh3"].as_str().unwrap().to_string()
}

#[test]
fn verify_passes_a_good_container_and_names_a_flipped_byte() {
    let model = converted("verify-good");
    let o = verify(&model);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let last = out.lines().last().unwrap_or("");
    assert!(last.starts_with("VERIFY tensors="), "{out}");
    assert!(last.contains(" bad=0 "), "{out}");

    let name = "model.layers.2.mlp.experts.7.up_proj.weight";
    let (shard, at, len) = span(&model, name);
    let mid = at + len / 2;
    let b = read_at(&shard, mid, 1);
    write_at(&shard, mid, &[b[0] ^ 0x10]);
    let o = verify(&model);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    let last = err.lines().last().unwrap();
    let file = shard.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        last.contains(&format!("tensor \"{name}\" in ")) && last.contains(&file),
        "{err}"
    );
    assert!(
        last.contains(&format!(
            "xxh3 expected {}, found ",
            recorded_hash(&model, name)
        )),
        "{err}"
    );
    assert!(err.contains("1 of "), "{err}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.lines().last().unwrap().contains(" bad=1 "), "{out}");
    // Put back, it verifies again.
    write_at(&shard, mid, &b);
    assert_eq!(verify(&model).status.code(), Some(0));
}

#[test]
fn verify_without_checksums_exits_2_and_says_how_to_get_them() {
    // A model colibri convert did not make.
    let o = verify(&fixture("tiny-moe-bias"));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("colibri-checksums.json"), "{err}");
    assert!(err.contains("not made by colibri convert"), "{err}");
    assert!(err.contains("run `colibri convert"), "{err}");
    // A converted one whose checksums are gone.
    let model = converted("verify-none");
    std::fs::remove_file(model.join("colibri-checksums.json")).unwrap();
    let o = verify(&model);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // --verify-reads cannot work there either: refused at start, naming the option.
    let o = colibri()
        .args([
            "run",
            "--raw",
            "--prompt",
            "In the beginning",
            "--max-tokens",
            "2",
        ])
        .arg("--snap")
        .arg(&model)
        .arg("--state-dir")
        .arg(model.parent().unwrap())
        .arg("--verify-reads")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--verify-reads"), "{}", stderr(&o));
}

fn chat(text: &str) -> String {
    format!("[gMASK]<sop><|user|>{text}<|assistant|><think></think>")
}

/// The first expert the prompt's first forward routes to: (layer, expert).
fn first_routed(model: &Path, prompt: &str) -> (usize, usize) {
    let dir = temp_dir("route");
    let trace = dir.join("trace");
    let o = colibri()
        .args(["run", "--raw", "--max-tokens", "1", "--temp", "0"])
        .arg("--prompt")
        .arg(prompt)
        .arg("--snap")
        .arg(model)
        .arg("--state-dir")
        .arg(&dir)
        .arg("--route-trace")
        .arg(&trace)
        .env("AUTOPIN", "0")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&trace).unwrap();
    // `<call> <row> <layer> <id>:<gate> ...`
    let f: Vec<&str> = text.lines().next().unwrap().split(' ').collect();
    let layer = f[2].parse().unwrap();
    let e = f[3].split(':').next().unwrap().parse().unwrap();
    (layer, e)
}

fn serve(model: &Path, state: &Path, extra: &[&str]) -> Command {
    let mut c = colibri();
    c.env("CAP", "3")
        .env("AUTOPIN", "0")
        .env_remove("COLI_FAULT_READ")
        .env_remove("COLI_VERIFY_READS")
        .args(["serve", "--snap"])
        .arg(model)
        .args(["--ctx", "512", "--ngen", "24", "--temp", "0", "--state-dir"])
        .arg(state)
        .args(extra);
    c
}

/// What a fresh daemon on `model` answers to `prompt` (legacy protocol, greedy).
fn fresh_answer(model: &Path, prompt: &str) -> Vec<u8> {
    let state = temp_dir("fresh");
    let log = state.join("stderr.log");
    let mut d = Daemon::spawn(&mut serve(model, &state, &[]), log).0;
    let (ans, stat) = d.prompt(prompt, 8, None);
    assert!(!stat.starts_with("STAT 0 "), "{stat}");
    assert!(d.finish().success());
    assert!(!ans.is_empty());
    ans
}

fn fresh_mux_answer(model: &Path, prompt: &str) -> Vec<u8> {
    let state = temp_dir("fresh-mux");
    let mut d = MuxDaemon::start_with(&mut serve(model, &state, &["--mux"]), &state).0;
    d.submit(1, 0, prompt, 8);
    let r = d.until_end_of(1);
    assert_eq!(error_of(&r, 1), None, "{r:?}");
    assert!(d.finish().0.success());
    data_of(&r, 1)
}

fn assert_zero_stat(stat: &str) {
    let f: Vec<&str> = stat.trim_end().split(' ').collect();
    assert_eq!(f[0], "STAT", "{stat:?}");
    assert_eq!(&f[1..4], ["0", "0.00", "0.0"], "{stat:?}");
}

/// One damaged tensor of the expert the prompt reaches first, the daemon's options, and what
/// the error must say about it.
struct Damage {
    tensor: String,
    bytes: Vec<u8>,
    /// Offset inside the tensor.
    at: u64,
    options: &'static [&'static str],
    says: &'static str,
}

/// Legacy then mux: the damaged request fails naming tensor, shard, layer and expert; the
/// daemon stays up; after the file is restored in place the same request answers as a fresh
/// daemon on the intact model does.
fn fails_until_restored(model: &Path, prompt: &str, layer: usize, e: usize, d: &Damage) {
    let want = fresh_answer(model, prompt);
    let want_mux = fresh_mux_answer(model, prompt);
    let (shard, start, _) = span(model, &d.tensor);
    let file = shard.file_name().unwrap().to_string_lossy().into_owned();
    let original = read_at(&shard, start + d.at, d.bytes.len());
    assert_ne!(original, d.bytes);
    let check = |line: &str| {
        assert!(line.contains(&format!("tensor \"{}\"", d.tensor)), "{line}");
        assert!(line.contains(&file), "{line}");
        assert!(
            line.contains(&format!("expert {e} of layer {layer}")),
            "{line}"
        );
        assert!(line.contains(d.says), "{line}");
    };

    let state = temp_dir("damaged");
    let log = state.join("stderr.log");
    let mut daemon = Daemon::spawn(&mut serve(model, &state, d.options), log).0;
    write_at(&shard, start + d.at, &d.bytes);
    let (body, stat) = daemon.prompt(prompt, 8, None);
    assert!(body.is_empty(), "{body:?}");
    assert_zero_stat(&stat);
    let err = daemon.stderr();
    let line = err
        .lines()
        .find(|l| l.starts_with("[serve] turn failed: "))
        .unwrap_or_else(|| panic!("no failure line in\n{err}"));
    check(line);
    // Still damaged: it fails again (nothing bad was kept), then restored it answers.
    let (body, _) = daemon.prompt(prompt, 8, None);
    assert!(body.is_empty(), "{body:?}");
    write_at(&shard, start + d.at, &original);
    let (again, _) = daemon.prompt(prompt, 8, None);
    assert_eq!(again, want);
    assert!(daemon.finish().success());

    let state = temp_dir("damaged-mux");
    let mut opts = vec!["--mux"];
    opts.extend(d.options);
    let mut daemon = MuxDaemon::start_with(&mut serve(model, &state, &opts), &state).0;
    write_at(&shard, start + d.at, &d.bytes);
    daemon.submit(1, 0, prompt, 8);
    let r = daemon.until_end_of(1);
    assert_eq!(error_of(&r, 1), Some(ErrorCode::EngineError), "{r:?}");
    let err = daemon.stderr();
    let line = err
        .lines()
        .find(|l| l.contains("request 1 (slot 0) failed: "))
        .unwrap_or_else(|| panic!("no failure line in\n{err}"));
    check(line);
    write_at(&shard, start + d.at, &original);
    daemon.submit(2, 0, prompt, 8);
    let r = daemon.until_end_of(2);
    assert_eq!(error_of(&r, 2), None, "{r:?}");
    assert_eq!(data_of(&r, 2), want_mux);
    assert!(daemon.finish().0.success());
}

#[test]
fn nan_scales_in_an_expert_fail_the_request_until_the_file_is_restored() {
    let model = converted("nan");
    let prompt = chat("Tell me about the sea.");
    let (layer, e) = first_routed(&model, &prompt);
    let nan = f32::NAN.to_le_bytes();
    let damage = Damage {
        tensor: format!("model.layers.{layer}.mlp.experts.{e}.gate_proj.weight.qs"),
        bytes: [nan, nan].concat(),
        at: 4,
        options: &[],
        says: "2 of ",
    };
    fails_until_restored(&model, &prompt, layer, e, &damage);
}

#[test]
fn verify_reads_catches_changed_bytes_in_an_expert() {
    let model = converted("verify-reads");
    let prompt = chat("Tell me about the sea.");
    let (layer, e) = first_routed(&model, &prompt);
    let tensor = format!("model.layers.{layer}.mlp.experts.{e}.down_proj.weight");
    let (shard, start, _) = span(&model, &tensor);
    // Bytes that differ from the stored ones everywhere: random-looking, every one changed.
    let stored = read_at(&shard, start + 16, 48);
    let bytes: Vec<u8> = stored
        .iter()
        .enumerate()
        .map(|(i, b)| b ^ (1 + (i as u8).wrapping_mul(37) % 254))
        .collect();
    let damage = Damage {
        tensor,
        bytes,
        at: 16,
        options: &["--verify-reads"],
        says: "the checksum colibri convert recorded",
    };
    fails_until_restored(&model, &prompt, layer, e, &damage);
}
