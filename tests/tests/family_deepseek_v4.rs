//! The `deepseek_v4` family (DeepSeek-V4-Flash / Pro) end to end on its tiny fixture
//! (scripts/make_fixture_deepseek_v4.py: sliding, compressed-sparse and heavily-compressed
//! layers, CSA rate 4 and HCA rate 8 under a window of 8, an indexer keeping 4 entries, three
//! hyper-connection streams, hash-routed and sqrt-softplus-routed experts with the clamped
//! SwiGLU, a grouped output projection, YaRN on the compressed layers). `colibri validate`
//! finds it transformers' token for token, teacher-forced and greedy, on a short case and a
//! long one past the window, several HCA blocks and more CSA entries than the indexer keeps.
//! A config the family cannot run is refused naming the key, the value and what is allowed,
//! with exit 2, before any weight is read or any shard converted.

use std::path::Path;
use std::process::Output;

use colibri_e2e::oracle::{self, copy_with_config};
use colibri_e2e::{colibri, fixture, last_line, run_refused, tensor_bytes};

const HF: &str = "tiny-deepseek-v4";

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `colibri validate` of the fixture against its reference `case`: the last line of stdout.
fn validate(case: &str) -> String {
    let snap = fixture(HF);
    let o = colibri()
        .arg("validate")
        .arg("--snap")
        .arg(&snap)
        .arg("--ref")
        .arg(snap.join("ref.json"))
        .args(["--case", case])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(out.contains("VALIDATE tf="), "no result: {}", stderr(&o));
    assert!(o.status.success(), "{out}{}", stderr(&o));
    let logits = out.lines().find(|l| l.starts_with("LOGITS ")).unwrap_or("");
    // f32 against f32: the logits agree to rounding, far inside the smallest top-1/top-2
    // gap the fixture script accepted (1e-4).
    let max_abs = colibri_e2e::oracle::logits_max_abs(&out);
    assert!(max_abs < 1e-4, "{case}: {logits}");
    last_line(out.as_bytes())
}

fn assert_exact(line: &str) {
    let v: Vec<&str> = line.split([' ', '=', '/']).collect();
    assert_eq!(v[0], "VALIDATE", "{line}");
    assert_eq!(v[2], v[3], "teacher forcing not exact: {line}");
    assert_eq!(v[5], v[6], "generation not exact: {line}");
    assert!(v[3].parse::<usize>().unwrap() > 0, "{line}");
}

#[test]
fn it_is_transformers_token_for_token_short_and_long() {
    for case in ["short", "long"] {
        assert_exact(&validate(case));
    }
}

/// `run` and `convert` on `bad` both exit 2 naming `named`, and convert writes nothing.
fn refused_by_run_and_convert(bad: &Path, tag: &str, named: &[&str]) {
    let err = run_refused(bad);
    for n in named {
        assert!(err.contains(n), "{n}: {err}");
    }
    let (e, to) = oracle::convert_refused(bad, tag);
    assert!(e.contains(named[0]), "{e}");
    assert!(
        !to.exists() || std::fs::read_dir(&to).unwrap().next().is_none(),
        "convert wrote something"
    );
}

#[test]
fn an_unknown_layer_type_is_refused_by_run_and_convert() {
    let bad = copy_with_config(&fixture(HF), "dsv4-bad-type", |v| {
        v["layer_types"][2] = "linear_attention".into();
    });
    refused_by_run_and_convert(
        &bad,
        "dsv4-bad-type-out",
        &[
            "\"layer_types\" = \"linear_attention\"",
            "\"heavily_compressed_attention\"",
        ],
    );
}

#[test]
fn groups_that_do_not_divide_the_heads_are_refused() {
    let bad = copy_with_config(&fixture(HF), "dsv4-bad-groups", |v| {
        v["o_groups"] = 3.into();
    });
    refused_by_run_and_convert(
        &bad,
        "dsv4-bad-groups-out",
        &["\"o_groups\" = 3", "must divide num_attention_heads (4)"],
    );
}

#[test]
fn a_compress_ratio_it_does_not_know_is_refused() {
    let bad = copy_with_config(&fixture(HF), "dsv4-bad-ratio", |v| {
        v.as_object_mut().unwrap().remove("layer_types");
        v["compress_ratios"] = serde_json::json!([0, 4, 8, 4]);
    });
    refused_by_run_and_convert(&bad, "dsv4-bad-ratio-out", &["\"compress_ratios\" = 8"]);
}

/// `info` on the fixture names the family and counts every tensor it holds (the hash
/// layers' token-id tables included).
#[test]
fn info_reads_the_fixture() {
    let o = colibri()
        .args(["info", "--json", "--snap"])
        .arg(fixture(HF))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["family"], "deepseek_v4", "{v}");
}

// ---- The engine's fronts on the fixture: run, serve (legacy and mux), api, score, bench,
// ---- convert, `.coli_kv` across a kill, batched sessions, prefix reuse.

const P1: &str = "<｜begin▁of▁sentence｜><｜User｜>Tell me about the sea.<｜Assistant｜></think>";
const MORE: &str = "<｜end▁of▁sentence｜><｜User｜>And the sky?<｜Assistant｜></think>";

fn args(snap: &Path) -> Vec<String> {
    [
        "--snap",
        snap.to_str().unwrap(),
        "--ctx",
        "128",
        "--temp",
        "0",
    ]
    .map(String::from)
    .to_vec()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// `colibri run --raw` answers what a fresh in-process greedy engine answers.
#[test]
fn run_answers_as_the_in_process_greedy_run() {
    let snap = fixture(HF);
    let got = oracle::run_greedy(&snap, &["--raw", P1]);
    assert_eq!(got, colibri_e2e::greedy_answer(&snap, P1, 6, false).1);
}

#[test]
fn v4_answers_as_the_in_process_greedy_run_in_both_protocols() {
    let snap = fixture(HF);
    let a = args(&snap);
    oracle::serves_greedy_in_both_protocols(&snap, &strs(&a), P1, "dsv4");
}

/// Two turns: killed after the first and resumed from `.coli_kv` plus its state snapshot
/// (the window's keys, the compressors' open windows and entries), the daemon answers the
/// second turn as one that never stopped; with the snapshot damaged it resumes nothing and
/// still answers the same (computed again).
#[test]
fn a_v4_conversation_resumes_after_a_kill_exactly() {
    let a = args(&fixture(HF));
    colibri_e2e::state::assert_resumes_after_a_kill(&strs(&a), P1, MORE, "dsv4");
}

/// A prompt that shares only part of the cached conversation (the state cannot be cut back
/// to it): the daemon computes it again and answers as a fresh run does; the first
/// conversation asked again answers as before.
#[test]
fn v4_prefix_reuse_is_exact() {
    let snap = fixture(HF);
    let a = args(&snap);
    let other = "<｜begin▁of▁sentence｜><｜User｜>Tell me about the sky.<｜Assistant｜></think>";
    colibri_e2e::state::assert_partial_prefix_is_recomputed(&snap, &strs(&a), P1, other, "dsv4");
}

/// Three sessions decoded in one batch (each layer's state advanced by its own rows) answer
/// as three single runs.
#[test]
fn v4_batched_sessions_answer_as_single_runs() {
    let prompts = [
        P1.to_string(),
        "<｜begin▁of▁sentence｜><｜User｜>Tell me about the sky.<｜Assistant｜></think>".into(),
        "<｜begin▁of▁sentence｜><｜User｜>Hello! How are you?<｜Assistant｜></think>".into(),
    ];
    batched_answer_as_single_runs(&prompts, 8, &[], "dsv4-batch");
}

/// `prompts` submitted at once to a multiplexed daemon with one slot each (and `extra`
/// arguments), `max_tokens` each: every answer is a fresh single greedy run's.
fn batched_answer_as_single_runs(prompts: &[String], max_tokens: u32, extra: &[&str], tag: &str) {
    use colibri_e2e::mux::{data_of, submit_bytes, MuxDaemon};
    use colibri_e2e::{greedy_answer, temp_dir};
    let snap = fixture(HF);
    let mut a = args(&snap);
    a.extend(["--kv-slots", &prompts.len().to_string()].map(String::from));
    a.extend(extra.iter().map(|s| s.to_string()));
    let (mut d, _) = MuxDaemon::start(&strs(&a), &temp_dir(tag));
    let mut batch = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        batch.extend(submit_bytes(i as u64 + 1, i as u32, p, max_tokens));
    }
    d.send(&batch);
    let mut replies = Vec::new();
    let mut ended = 0;
    while ended < prompts.len() {
        let r = d.next();
        if matches!(
            r,
            protocol::mux::MuxReply::Done { .. } | protocol::mux::MuxReply::Error { .. }
        ) {
            ended += 1;
        }
        replies.push(r);
    }
    for (i, p) in prompts.iter().enumerate() {
        let id = i as u64 + 1;
        assert_eq!(
            data_of(&replies, id),
            greedy_answer(&snap, p, max_tokens as usize, true).1,
            "slot {i} {extra:?}"
        );
    }
    d.kill9();
}

#[test]
fn v4_scores_and_benches() {
    oracle::scores_and_benches(&fixture(HF));
}

/// The API: a streamed chat completion's pieces concatenate to the answer it gives
/// unstreamed, and it ends the same way.
#[test]
fn the_api_streams_the_answer_it_gives_whole() {
    use colibri_e2e::http::{chat_stream_content, ApiServer};
    let snap = fixture(HF);
    let s = ApiServer::start("api-dsv4", &["--snap", snap.to_str().unwrap()]);
    let req = |stream: bool| {
        serde_json::json!({"model": HF, "max_tokens": 8, "temperature": 0, "stream": stream,
            "messages": [{"role": "user", "content": "Tell me about the sea."}]})
    };
    let v = s.post("/v1/chat/completions", &req(false)).json();
    let whole = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(v["usage"]["completion_tokens"].as_u64() > Some(0), "{v}");
    let r = s.post("/v1/chat/completions", &req(true));
    assert_eq!(r.status, 200, "{}", r.text());
    let (text, finish) = chat_stream_content(&r);
    assert_eq!(text, whole, "{}", r.text());
    assert_eq!(finish, v["choices"][0]["finish_reason"].as_str().unwrap());
}

/// The f32 checkpoint converted (int4 and int8 experts with f32 dense; int4 experts with int8
/// dense: the attention's and compressors' projections and the shared expert quantized, the
/// router, hyper-connections and position biases kept f32) validates exactly as the same
/// formats quantized at load (the store reads the converted experts in place).
#[test]
fn converted_checkpoints_validate_as_quantized_at_load() {
    use colibri_e2e::{run_ok, temp_dir};
    let from = fixture(HF);
    for (experts, dense, io) in [("4", "16", "16"), ("8", "16", "16"), ("4", "8", "8")] {
        let out = temp_dir(&format!("dsv4-convert-{experts}-{dense}"));
        let to = out.join("c");
        let args = ["--expert-bits", experts, "--dense-bits", dense];
        let mut cmd = colibri();
        cmd.arg("convert")
            .arg("--from")
            .arg(&from)
            .arg("--to")
            .arg(&to)
            .args(args)
            .args(["--io-bits", io])
            .env_remove("COLI_CONVERT_STOP_AFTER")
            .env_remove("COLI_CONVERT_FREE_BYTES");
        run_ok(&mut cmd);
        let converted = oracle::validate(&to, HF, "long", &[]);
        let at_load = oracle::validate(&from, HF, "long", &args);
        assert_eq!(converted, at_load, "experts {experts} bits, dense {dense}");
        assert!(converted.contains("LOGITS"), "{converted}");
        let _ = std::fs::remove_dir_all(&out);
    }
}

// ---- DeepSeek-V4 as published (scripts/make_fixture_deepseek_v4_published.py) ----
//
// The same architecture stored the way deepseek-ai ships DeepSeek-V4-Flash: DeepSeek's own
// names (`embed.weight`, `layers.{l}.attn.wq_a.weight`, `hc_head_fn`, ...), routed experts
// as I8 FP4 (two e2m1 a byte) with F8_E8M0 scales per 32 inputs, attention and shared expert
// as F8_E4M3 with F8_E8M0 scales per 128x128 block, the rest BF16/F32/I64, in two shards. Its
// reference is transformers' run of the dequantized weights.

const PUB: &str = "tiny-deepseek-v4-published";

/// `colibri validate --snap snap` against the published fixture's reference `case` (plus
/// `extra`): stdout, which must hold a result with logits within 1e-4 of transformers'.
fn validate_pub(snap: &Path, case: &str, extra: &[&str]) -> String {
    let o = colibri()
        .arg("validate")
        .arg("--snap")
        .arg(snap)
        .arg("--ref")
        .arg(fixture(PUB).join("ref.json"))
        .args(["--case", case])
        .args(extra)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(out.contains("VALIDATE tf="), "no result: {}", stderr(&o));
    assert!(o.status.success(), "{out}{}", stderr(&o));
    // The FP4 and FP8 products are exact in f32 (an e2m1 or e4m3 value times a power of two),
    // so only the order of the sums differs from transformers': rounding, far inside the
    // smallest top-1/top-2 gap the fixture script accepted (1e-3 here; 1e-4 at the least).
    let logits = out.lines().find(|l| l.starts_with("LOGITS ")).unwrap_or("");
    let max_abs = colibri_e2e::oracle::logits_max_abs(&out);
    assert!(max_abs < 1e-4, "{case}: {logits}");
    out
}

fn info_text(snap: &Path) -> String {
    let o = colibri()
        .arg("info")
        .arg("--snap")
        .arg(snap)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The published checkpoint run as it is (`--snap` on it, no `convert`): names read as the
/// engine's, FP8 matrices dequantized exactly at load, FP4 experts computed as stored by the
/// MXFP4 kernels; transformers' tokens, teacher-forced and greedy, on both cases, the same
/// through the memory map and with 2 experts a layer cached. `info` says the experts are
/// stored MXFP4.
#[test]
fn the_published_fp4_fp8_checkpoint_runs_in_place_token_for_token() {
    let snap = fixture(PUB);
    for case in ["short", "long"] {
        let direct = validate_pub(&snap, case, &[]);
        assert_exact(&last_line(direct.as_bytes()));
        for tiers in [&["--mmap"][..], &["--cache", "2"]] {
            assert_eq!(direct, validate_pub(&snap, case, tiers), "{tiers:?}");
        }
    }
    let text = info_text(&snap);
    assert!(text.contains("mxfp4 (stored)"), "{text}");
}

/// `convert` reads the published names and dtypes: the FP4 experts are kept byte for byte
/// (nibbles and E8M0 scales, whatever `--expert-bits` says), the FP8 matrices are dequantized
/// and written in the container's formats as DeepSeek-V3's are, and the converted model gives
/// the same `validate` lines as the published one.
#[test]
fn convert_keeps_the_fp4_experts_and_reads_the_fp8_matrices() {
    let to = colibri_e2e::temp_dir("dsv4-pub-convert").join("c");
    let o = colibri()
        .arg("convert")
        .arg("--from")
        .arg(fixture(PUB))
        .arg("--to")
        .arg(&to)
        .args([
            "--expert-bits",
            "4",
            "--dense-bits",
            "16",
            "--io-bits",
            "16",
        ])
        .env_remove("COLI_CONVERT_STOP_AFTER")
        .env_remove("COLI_CONVERT_FREE_BYTES")
        .output()
        .unwrap();
    assert!(o.status.success(), "convert failed: {}", stderr(&o));
    let src = fixture(PUB);
    assert_eq!(
        tensor_bytes(&to, "model.layers.2.mlp.experts.5.down_proj.weight"),
        tensor_bytes(&src, "layers.2.ffn.experts.5.w2.weight")
    );
    assert_eq!(
        tensor_bytes(&to, "model.layers.1.mlp.experts.3.up_proj.weight.qs"),
        tensor_bytes(&src, "layers.1.ffn.experts.3.w3.scale")
    );
    for case in ["short", "long"] {
        let direct = validate_pub(&src, case, &[]);
        assert_eq!(direct, validate_pub(&to, case, &[]), "{case}");
    }
    assert!(info_text(&to).contains("mxfp4 (stored)"));
}

/// `dir`'s shard `file` with the header bytes `from` replaced by `to` (the same length, so
/// every offset stays valid), which must occur once.
fn patch_header(dir: &Path, file: &str, from: &str, to: &str) {
    assert_eq!(from.len(), to.len());
    let path = dir.join(file);
    let mut bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(bytes[8..8 + n].to_vec()).unwrap();
    assert_eq!(header.matches(from).count(), 1, "{from}");
    bytes[8..8 + n].copy_from_slice(header.replace(from, to).as_bytes());
    std::fs::write(&path, bytes).unwrap();
}

const EXPERTS: &str = "model-00002-of-00002.safetensors";

/// An E8M0 scale grid that does not fit its FP4 weight (the same bytes as [32, 1] read as
/// [16, 2]) is refused by `run` and by `convert`, naming the scale, its shape and the one
/// it must have, before any weight is read or a shard written.
#[test]
fn fp4_scales_of_the_wrong_shape_are_refused() {
    let bad = copy_with_config(&fixture(PUB), "dsv4-pub-bad-scale", |_| {});
    patch_header(
        &bad,
        EXPERTS,
        r#""layers.1.ffn.experts.0.w1.scale":{"dtype":"F8_E8M0","shape":[32,1]"#,
        r#""layers.1.ffn.experts.0.w1.scale":{"dtype":"F8_E8M0","shape":[16,2]"#,
    );
    refused_by_run_and_convert(
        &bad,
        "dsv4-pub-bad-scale-out",
        &[
            "model.layers.1.mlp.experts.0.gate_proj.scale",
            "[16, 2]",
            "needs [32, 1]",
        ],
    );
}

/// An I8 expert whose scales are gone (renamed away) is refused by `run` and by `convert`,
/// naming the weight, its dtype and the scales it lacks.
#[test]
fn an_fp4_expert_without_its_scales_is_refused() {
    let bad = copy_with_config(&fixture(PUB), "dsv4-pub-no-scale", |_| {});
    patch_header(
        &bad,
        EXPERTS,
        r#""layers.3.ffn.experts.6.w2.scale""#,
        r#""layers.3.ffn.experts.6.w2.sca1e""#,
    );
    refused_by_run_and_convert(
        &bad,
        "dsv4-pub-no-scale-out",
        &[
            "model.layers.3.mlp.experts.6.down_proj.weight",
            "I8",
            "model.layers.3.mlp.experts.6.down_proj.scale (F8_E8M0",
        ],
    );
}

/// An FP8 matrix's E8M0 block scales of the wrong shape ([1] for a [16, 32] matrix's one
/// block) are refused naming them (under the name transformers gives them), the shape and the
/// one they must have.
#[test]
fn fp8_block_scales_of_the_wrong_shape_are_refused() {
    let bad = copy_with_config(&fixture(PUB), "dsv4-pub-bad-fp8", |_| {});
    patch_header(
        &bad,
        "model-00001-of-00002.safetensors",
        r#""layers.0.attn.wq_a.scale":{"dtype":"F8_E8M0","shape":[1,1]"#,
        r#""layers.0.attn.wq_a.scale":{"dtype":"F8_E8M0","shape":[1]  "#,
    );
    refused_by_run_and_convert(
        &bad,
        "dsv4-pub-bad-fp8-out",
        &[
            "model.layers.0.attn.wq_a.weight_scale_inv",
            "has shape [1], expected [1, 1]",
        ],
    );
}

// ---- Drafts (`--draft N`): a rejected draft is cut from the window and the compressors by
// ---- the verify trail (daemon/src/model/dsv4_trail.rs), so greedy answers never change.

/// A prompt that repeats itself, so that prompt lookup drafts (and some drafts fail).
const REPEATS: &str =
    "<｜begin▁of▁sentence｜><｜User｜>the sea the sky the sea the sky the sea the sky \
    the sea the sky the sea<｜Assistant｜></think>";

/// `colibri run --raw -v` of `prompt` for `max` tokens with `extra`: stdout and stderr.
fn run_raw(prompt: &str, max: usize, extra: &[&str]) -> (Vec<u8>, String) {
    let out = colibri()
        .arg("run")
        .arg("--snap")
        .arg(fixture(HF))
        .args(["--ctx", "128", "--temp", "0", "--raw", "-v", "--max-tokens"])
        .arg(max.to_string())
        .args(extra)
        .arg("--state-dir")
        .arg(colibri_e2e::temp_dir("dsv4-draft-run"))
        .arg("--prompt")
        .arg(prompt)
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "{extra:?}: {err}");
    (out.stdout, err)
}

/// The n-gram drafts proposed and accepted, from `run -v`'s acceptance line.
fn ngram_counts(err: &str) -> (u64, u64) {
    let Some(at) = err.find("ngram=") else {
        return (0, 0);
    };
    let rest = &err[at..];
    let inner = &rest[rest.find('(').unwrap() + 1..rest.find(')').unwrap()];
    let (a, p) = inner.split_once('/').unwrap();
    (p.parse().unwrap(), a.parse().unwrap())
}

/// Greedy with `--draft N` (several N, one past the window of 8) is the plain greedy answer,
/// on a short answer and on long ones whose drafts cross the window and close compressor
/// windows (HCA every 8, CSA every 4 positions); drafts were proposed and some rejected.
#[test]
fn v4_drafts_do_not_change_the_answer_short_and_long() {
    let (mut proposed, mut accepted) = (0, 0);
    // The tiny model's greedy answer to the last one rejects its drafts (n-gram lookup
    // proposes, the verify disagrees).
    let cases = [
        (P1, 8usize),
        (REPEATS, 70),
        ("hello hello hello hello hello hello hello", 70),
    ];
    for (prompt, max) in cases {
        let want = colibri_e2e::greedy_answer(&fixture(HF), prompt, max, false).1;
        let (plain, _) = run_raw(prompt, max, &[]);
        assert_eq!(plain, want, "drafts off");
        for n in ["1", "2", "4", "9"] {
            let (got, err) = run_raw(prompt, max, &["--draft", n]);
            assert_eq!(
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(&want),
                "--draft {n} {max} tokens: {err}"
            );
            let (p, a) = ngram_counts(&err);
            (proposed, accepted) = (proposed + p, accepted + a);
        }
    }
    assert!(
        proposed > accepted,
        "{proposed} proposed, {accepted} accepted"
    );
}

/// A schema-constrained greedy run drafts the spans its grammar forces: the same answer as
/// with drafts off, and the forced drafts were proposed.
#[test]
fn v4_schema_constrained_drafts_do_not_change_the_answer() {
    let dir = colibri_e2e::temp_dir("dsv4-draft-schema");
    let schema = dir.join("schema.json");
    std::fs::write(
        &schema,
        r#"{"type": "object", "properties": {"answer": {"enum": ["yes", "no"]},
            "why": {"type": "string", "maxLength": 12}},
            "required": ["answer", "why"], "additionalProperties": false}"#,
    )
    .unwrap();
    let schema = ["--json-schema", schema.to_str().unwrap()];
    let (plain, _) = run_raw(P1, 40, &schema);
    for n in ["2", "4"] {
        let (got, err) = run_raw(P1, 40, &[&schema[..], &["--draft", n]].concat());
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&plain),
            "--draft {n}: {err}"
        );
        let line = err
            .lines()
            .find(|l| l.starts_with("[grammar]"))
            .unwrap_or("");
        let forced: u64 = line
            .split("forced-span drafts ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{err}"));
        assert!(forced > 0, "{line}");
    }
}

/// Sessions drafting in one batch (each verify step cut per session) answer as single
/// plain runs, long enough to cross the window and compressor boundaries.
#[test]
fn v4_batched_drafting_sessions_answer_as_single_runs() {
    let prompts = [
        REPEATS.to_string(),
        P1.to_string(),
        "<｜begin▁of▁sentence｜><｜User｜>the sky the sky the sky the sky<｜Assistant｜></think>"
            .into(),
    ];
    batched_answer_as_single_runs(&prompts, 40, &["--draft", "4"], "dsv4-batch-draft");
}

/// Drafting, killed after the first turn and resumed from `.coli_kv` plus its state snapshot
/// (saved after drafted steps were cut), the daemon answers the second turn as one that never
/// stopped.
#[test]
fn a_drafting_v4_conversation_resumes_after_a_kill_exactly() {
    let mut a = args(&fixture(HF));
    a.extend(["--draft", "4"].map(String::from));
    colibri_e2e::state::assert_resumes_after_a_kill(&strs(&a), REPEATS, MORE, "dsv4-draft");
}

/// `colibri api` on a copy of the fixture that takes 4096 positions (the tools section and
/// the "max" preamble are past the fixture's 128; both sides of each comparison run on the
/// copy, so its rotary numbers need no reference), and the encoder's cases
/// (tests/fixtures/dsv4-chat-cases.json, from `encoding_dsv4.py`). `tag` names the copy and
/// the server.
fn api_with_encoder_cases(tag: &str) -> (colibri_e2e::http::ApiServer, serde_json::Value) {
    let snap = copy_with_config(&fixture(HF), &format!("dsv4-api-{tag}-model"), |v| {
        v["max_position_embeddings"] = serde_json::json!(4096)
    });
    let s = colibri_e2e::http::ApiServer::start(
        &format!("api-dsv4-{tag}"),
        &["--snap", snap.to_str().unwrap(), "--ctx", "4096"],
    );
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/dsv4-chat-cases.json");
    let cases = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    (s, cases)
}

/// The greedy 4-token completion of `case`'s encoder bytes sent raw.
fn raw_completion(s: &colibri_e2e::http::ApiServer, case: &serde_json::Value) -> serde_json::Value {
    s.post(
        "/v1/completions",
        &serde_json::json!({"model": HF, "max_tokens": 4, "temperature": 0,
                            "prompt": case["expected"]}),
    )
    .json()
}

/// The API renders a V4 conversation with DeepSeek's encoder: tools, an answer with two calls
/// and their results (out of call order) take the tokens of the encoder's own bytes
/// (tests/fixtures/dsv4-chat-cases.json, from `encoding_dsv4.py`) sent raw, and the same
/// greedy answer, in chat and thinking mode; a forced call comes back as a call, and renders
/// back with its result.
#[test]
fn the_api_renders_the_encoders_conversation_and_forced_calls() {
    use serde_json::{json, Value};
    let (s, cases) = api_with_encoder_cases("tools");
    let content = |v: &Value| {
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let mut checked = 0;
    for case in cases.as_array().unwrap() {
        if case["name"] != "tool_round_trip" {
            continue;
        }
        let effort = if case["thinking"] == true {
            "high"
        } else {
            "none"
        };
        let req = json!({"model": HF, "max_tokens": 4, "temperature": 0,
            "messages": case["messages"], "tools": case["tools"], "reasoning_effort": effort});
        let v = s.post("/v1/chat/completions", &req).json();
        let raw = raw_completion(&s, case);
        assert!(raw["usage"]["prompt_tokens"].as_u64() > Some(100), "{raw}");
        assert_eq!(
            raw["usage"]["prompt_tokens"], v["usage"]["prompt_tokens"],
            "{raw} {v}"
        );
        assert_eq!(
            raw["choices"][0]["text"].as_str().unwrap(),
            content(&v),
            "{raw} {v}"
        );
        checked += 1;
    }
    assert_eq!(checked, 2);
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object",
                       "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]}},
                       "required": ["city"]}}}]);
    // An enum keeps a random model's forced call short.
    let req = json!({"model": HF, "max_tokens": 60, "temperature": 0, "tools": tools,
        "tool_choice": "required",
        "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    let v = s.post("/v1/chat/completions", &req).json();
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    let call = &v["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather", "{v}");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(
        ["Paris", "Rome", "Oslo"].contains(&args["city"].as_str().unwrap()),
        "{args}"
    );
    let back = json!({"model": HF, "max_tokens": 4, "temperature": 0, "tools": tools,
        "messages": [{"role": "user", "content": "Weather in Paris?"},
                     {"role": "assistant", "content": null, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]});
    let r = s.post("/v1/chat/completions", &back);
    assert_eq!(r.status, 200, "{}", r.text());
}

/// `reasoning_effort` "max" and earlier reasoning passed back (`reasoning_content`): the API
/// renders the encoder's bytes for them (tests/fixtures/dsv4-chat-cases.json, from
/// `encoding_dsv4.py` at that effort): the chat request takes the tokens of those bytes sent
/// raw and gives the same greedy answer, in chat and thinking mode. The preamble is in the
/// prompt at "max" in thinking mode only, the passed-back reasoning where tools keep it, and
/// an effort the API does not know is refused (422) naming the field, the value and the allowed
/// ones.
#[test]
fn the_api_renders_max_effort_and_passed_back_reasoning_as_the_encoder() {
    use serde_json::{json, Value};
    let (s, cases) = api_with_encoder_cases("effort");
    let chat = |case: &Value, effort: &str| {
        let req = json!({"model": HF, "max_tokens": 4, "temperature": 0,
            "messages": case["messages"], "tools": case["tools"], "reasoning_effort": effort});
        let r = s.post("/v1/chat/completions", &req);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    let prompt_tokens = |v: &Value| v["usage"]["prompt_tokens"].as_u64().unwrap();
    let names = [
        "effort_max_one_turn",
        "effort_max_system_and_history",
        "effort_max_tools_without_system",
        "reasoning_in_a_tool_loop",
        "reasoning_in_a_tool_loop_at_max",
    ];
    let mut checked = 0;
    for case in cases.as_array().unwrap() {
        if !names.contains(&case["name"].as_str().unwrap()) {
            continue;
        }
        let think = case["thinking"] == true;
        let effort = match (think, case["reasoning_effort"].as_str()) {
            (false, _) => "none",
            (true, None) => "high",
            (true, Some(e)) => e,
        };
        let v = chat(case, effort);
        let raw = raw_completion(&s, case);
        let what = format!("{} thinking {think}: {raw} {v}", case["name"]);
        assert_eq!(prompt_tokens(&raw), prompt_tokens(&v), "{what}");
        assert_eq!(
            raw["choices"][0]["text"],
            v["choices"][0]["message"]["content"].as_str().unwrap_or(""),
            "{what}"
        );
        // What "max" and the reasoning add: the same request at "high" without the
        // reasoning is shorter in thinking mode, and the same in chat mode.
        let mut plain = case.clone();
        for m in plain["messages"].as_array_mut().unwrap() {
            m.as_object_mut().unwrap().remove("reasoning_content");
        }
        let high = chat(&plain, if think { "high" } else { "none" });
        let adds = case["reasoning_effort"] == "max" || case["name"] == "reasoning_in_a_tool_loop";
        if think && adds {
            assert!(prompt_tokens(&high) < prompt_tokens(&v), "{what} {high}");
        } else {
            assert_eq!(prompt_tokens(&high), prompt_tokens(&v), "{what} {high}");
        }
        checked += 1;
    }
    assert_eq!(checked, 2 * names.len());
    let one = &cases[0];
    for bad in ["xhigh", "MAX", ""] {
        let req = json!({"model": HF, "max_tokens": 1, "messages": one["messages"],
            "reasoning_effort": bad});
        let r = s.post("/v1/chat/completions", &req);
        // 422: the API's status for a field's wrong value (docs/api.md).
        assert_eq!(r.status, 422, "{}", r.text());
        let e = &r.json()["error"];
        assert_eq!(e["param"], "reasoning_effort", "{e}");
        let msg = e["message"].as_str().unwrap();
        assert!(
            msg.contains(&format!("{bad:?}")) && msg.contains("high or max"),
            "{msg}"
        );
    }
}

/// `"scoring_func": "sigmoid"` weighs the hash layers' experts by the sigmoid too, as
/// transformers' hash router does (scripts/sweep_families.py found them weighed by
/// sqrt-softplus whatever the key: every sigmoid point a mismatch): the fixture's weights read
/// with that key are transformers' token for token (tests/fixtures/dsv4-sigmoid-ref, made by
/// scripts/dsv4_sigmoid_ref.py).
#[test]
fn sigmoid_scores_weigh_the_hash_layers_too() {
    let snap = copy_with_config(&fixture(HF), "dsv4-sigmoid-model", |v| {
        v["scoring_func"] = serde_json::json!("sigmoid")
    });
    let reference = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/dsv4-sigmoid-ref");
    let o = colibri()
        .arg("validate")
        .arg("--snap")
        .arg(&snap)
        .arg("--ref")
        .arg(reference.join("ref.json"))
        .args(["--case", "short"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{out}{}", stderr(&o));
    let logits = out.lines().find(|l| l.starts_with("LOGITS ")).unwrap_or("");
    let max_abs = colibri_e2e::oracle::logits_max_abs(&out);
    assert!(max_abs < 1e-4, "{logits}");
    assert_exact(&last_line(out.as_bytes()));
}
