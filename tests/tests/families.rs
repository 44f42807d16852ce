//! The model families beside GLM-5 through the real daemon: a `qwen3_moe` checkpoint serves
//! both protocols with the answers of a fresh in-process greedy run, and its grouped-query
//! KV cache survives a kill: resumed from `.coli_kv`, the next turn answers exactly as a
//! daemon that never stopped.

use colibri_e2e::oracle::run_greedy;
use colibri_e2e::{fixture, greedy_answer, temp_dir, Daemon};

const QWEN: &str = "tiny-qwen3-moe";
const P1: &str = "<|im_start|>user\nTell me about the sea.<|im_end|>\n<|im_start|>assistant\n";

/// `colibri run --snap snap --max-tokens 6 <args>`: its output.
fn run(snap: &std::path::Path, args: &[&str]) -> std::process::Output {
    colibri_e2e::colibri()
        .arg("run")
        .arg("--snap")
        .arg(snap)
        .args(["--max-tokens", "6"])
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn qwen3_moe_answers_as_the_in_process_greedy_run_in_both_protocols() {
    let snap = fixture(QWEN);
    let args = [
        "--snap",
        snap.to_str().unwrap(),
        "--ctx",
        "512",
        "--temp",
        "0",
    ];
    colibri_e2e::oracle::serves_greedy_in_both_protocols(&snap, &args, P1, "qwen");
}

/// Two turns of `model` (`p1`, then `p1`, its answer and `more`): killed after the first and
/// resumed from `.coli_kv` (every position of the turn, or all but the last, whose keys the
/// next forward writes), the daemon answers the second turn as one that never stopped.
fn resumes_after_a_kill_exactly(model: &str, p1: &str, more: &str) {
    let snap = fixture(model);
    let args = [
        "--snap",
        snap.to_str().unwrap(),
        "--ctx",
        "512",
        "--temp",
        "0",
    ];
    // Uninterrupted: two turns in one daemon.
    let (mut d, _) = Daemon::start(&args, &temp_dir(&format!("{model}-kv-ref")));
    let (a1, _) = d.prompt(p1, 6, None);
    let p2 = format!("{p1}{}{more}", String::from_utf8_lossy(&a1));
    let (want, _) = d.prompt(&p2, 6, None);
    assert!(d.finish().success());
    // Killed after the first turn, resumed, second turn.
    let state = temp_dir(&format!("{model}-kv"));
    let (mut d, _) = Daemon::start(&args, &state);
    let (b1, stat) = d.prompt(p1, 6, None);
    assert_eq!(a1, b1, "{model}");
    d.kill9();
    let (mut d, _) = Daemon::start(&args, &state);
    let err = d.stderr();
    let f: Vec<&str> = stat.split_whitespace().collect();
    let turn: usize = f[1].parse::<usize>().unwrap() + f[5].parse::<usize>().unwrap();
    let resumed: usize = err
        .split("resumed conversation from disk: ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{model}: no resume: {err}"));
    assert!(
        resumed == turn || resumed + 1 == turn,
        "{model}: {resumed} of {turn}"
    );
    let (got, _) = d.prompt(&p2, 6, None);
    assert_eq!(got, want, "{model}");
    assert!(d.finish().success());
}

#[test]
fn a_qwen3_moe_conversation_resumes_after_a_kill_exactly() {
    resumes_after_a_kill_exactly(
        QWEN,
        P1,
        "<|im_end|>\n<|im_start|>user\nAnd the sky?<|im_end|>\n<|im_start|>assistant\n",
    );
}

/// With YaRN (the Qwen3 card's recipe over an original context of 64, which the second turn
/// reaches) and with `attention_bias` (o_proj biased too), the cache resumed from disk answers
/// as a daemon that never stopped.
#[test]
fn qwen3_moe_yarn_and_bias_conversations_resume_after_a_kill_exactly() {
    for model in ["tiny-qwen3-moe-yarn", "tiny-qwen3-moe-bias"] {
        resumes_after_a_kill_exactly(
            model,
            P1,
            "<|im_end|>\n<|im_start|>user\nAnd the sky?<|im_end|>\n<|im_start|>assistant\n",
        );
    }
}

#[test]
fn run_wraps_a_qwen3_message_in_chatml() {
    // `run` without --raw on a qwen3_moe model answers what the raw ChatML prompt answers.
    let snap = fixture(QWEN);
    let templated = run_greedy(&snap, &["--think", "1", "Tell me about the sea."]);
    let raw = run_greedy(&snap, &["--think", "1", "--raw", "--prompt", P1]);
    assert_eq!(templated, raw);
    assert_eq!(raw, greedy_answer(&snap, P1, 6, false).1);
}

/// A family's fixture through the daemon: the answer to `p1` (the family's own chat template
/// around "Tell me about the sea.") is the in-process greedy one, the conversation resumes
/// after a kill, and `colibri run` wraps the plain message in that same template.
fn serves_resumes_and_wraps_in_its_template(model: &str, p1: &str) {
    let snap = fixture(model);
    let want = greedy_answer(&snap, p1, 6, false).1;
    let state = temp_dir(model);
    let args = [
        "--snap",
        snap.to_str().unwrap(),
        "--ctx",
        "512",
        "--temp",
        "0",
    ];
    let (mut d, _) = Daemon::start(&args, &state);
    assert_eq!(d.prompt(p1, 6, None).0, want, "{model}");
    d.kill9();
    let (d, _) = Daemon::start(&args, &state);
    let err = d.stderr();
    assert!(
        err.contains("resumed conversation from disk"),
        "{model}: {err}"
    );
    d.kill9();
    assert_eq!(
        run_greedy(&snap, &["Tell me about the sea."]),
        want,
        "{model}"
    );
}

#[test]
fn glm4_moe_serves_resumes_and_wraps_messages_in_its_template() {
    serves_resumes_and_wraps_in_its_template(
        "tiny-glm4-moe",
        "[gMASK]<sop><|user|>\nTell me about the sea.<|assistant|>\n<think></think>",
    );
}

/// DeepSeek-V3.2's cache (the MLA latent and every layer's indexer keys) and DeepSeek-V3's
/// (also with an unfactored q_proj) survive a kill.
#[test]
fn deepseek_conversations_resume_after_a_kill_exactly() {
    for model in [
        "tiny-deepseek-v32",
        "tiny-deepseek-v3",
        "tiny-deepseek-v3-q-proj",
    ] {
        resumes_after_a_kill_exactly(
            model,
            "<｜begin▁of▁sentence｜><｜User｜>Tell me about the sea.<｜Assistant｜></think>",
            "<｜end▁of▁sentence｜><｜User｜>And the sky?<｜Assistant｜></think>",
        );
    }
}

/// GLM-4.5's grouped-query K/V cache survives a kill.
#[test]
fn a_glm4_moe_conversation_resumes_after_a_kill_exactly() {
    resumes_after_a_kill_exactly(
        "tiny-glm4-moe",
        "[gMASK]<sop><|user|>\nTell me about the sea.<|assistant|>\n<think></think>",
        "<|user|>\nAnd the sky?<|assistant|>\n<think></think>",
    );
}

#[test]
fn deepseek_v3_serves_resumes_and_wraps_messages_in_its_template() {
    serves_resumes_and_wraps_in_its_template(
        "tiny-deepseek-v3",
        "<｜begin▁of▁sentence｜><｜User｜>Tell me about the sea.<｜Assistant｜></think>",
    );
}

#[test]
fn a_checkpoints_own_chat_template_wraps_the_message() {
    // A copy of the Qwen fixture whose chat_template.jinja adds a system turn of its own: `run`
    // without --raw answers what the template's rendering answers, raw.
    let snap = temp_dir("own-template").join("model");
    std::fs::create_dir_all(&snap).unwrap();
    for e in std::fs::read_dir(fixture(QWEN)).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            std::fs::copy(&p, snap.join(p.file_name().unwrap())).unwrap();
        }
    }
    std::fs::write(
        snap.join("chat_template.jinja"),
        "<|im_start|>system\nYou are terse.<|im_end|>\n{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )
    .unwrap();
    let rendered = "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nTell me about the sea.<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(
        run_greedy(&snap, &["Tell me about the sea."]),
        greedy_answer(&snap, rendered, 6, false).1
    );
    // A template that cannot render is refused naming its file, and nothing is generated.
    std::fs::write(
        snap.join("chat_template.jinja"),
        "{{ raise_exception('no chat here') }}",
    )
    .unwrap();
    let out = run(&snap, &["Tell me about the sea."]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("chat_template.jinja") && err.contains("no chat here"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn every_family_scores_and_benches() {
    for model in [
        "tiny-qwen3-moe",
        "tiny-glm4-moe",
        "tiny-deepseek-v3",
        "tiny-deepseek-v32",
        "tiny-deepseek-v3-q-proj",
        "tiny-deepseek-v32-mlp-types",
    ] {
        colibri_e2e::oracle::scores_and_benches(&fixture(model));
    }
}

/// Every family under every expert format: with a one-expert LRU, pins filled and re-planned,
/// the pilot reading ahead and drafts on, a schema-constrained greedy answer is the bytes of the
/// plain run's (the tiers and drafts change where weights come from and how many tokens a
/// forward checks, never the answer), and a finished answer parses as the schema's JSON.
#[test]
fn every_family_answers_alike_under_every_format_tier_draft_and_schema() {
    let dir = temp_dir("family-tiers");
    let schema = dir.join("schema.json");
    std::fs::write(
        &schema,
        r#"{"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
            "required": ["answer"], "additionalProperties": false}"#,
    )
    .unwrap();
    let schema = schema.to_str().unwrap();
    let formats: [&[&str]; 5] = [
        &["--expert-bits", "8"],
        &["--expert-bits", "4"],
        &["--expert-bits", "4", "--group-size", "0"],
        &["--expert-bits", "3"],
        &["--expert-bits", "2"],
    ];
    for model in [
        "tiny-moe-bias",
        "tiny-qwen3-moe",
        "tiny-glm4-moe-groups",
        "tiny-deepseek-v3",
        "tiny-deepseek-v32",
        "tiny-deepseek-v3-q-proj",
        "tiny-qwen35-moe",
    ] {
        let snap = fixture(model);
        for (i, format) in formats.iter().enumerate() {
            let answer = |state: &str, extra: &[&str]| {
                let state = dir.join(format!("{model}-{i}-{state}"));
                let mut args = vec!["--temp", "0", "--dense-bits", "8", "--json-schema", schema];
                args.extend_from_slice(format);
                args.extend_from_slice(extra);
                args.extend_from_slice(&["--state-dir", state.to_str().unwrap()]);
                args.push("Is the sea wide?");
                let out = colibri_e2e::colibri()
                    .arg("run")
                    .arg("--snap")
                    .arg(&snap)
                    .args(["--max-tokens", "24"])
                    .args(&args)
                    .output()
                    .unwrap();
                let code = out.status.code();
                let err = String::from_utf8_lossy(&out.stderr).into_owned();
                assert!(
                    code == Some(0) || code == Some(3),
                    "{model} {format:?} {extra:?}: {err}"
                );
                ((code, out.stdout), err)
            };
            let (plain, _) = answer("plain", &[]);
            // Twice on one state folder: the second run pins from the first one's usage.
            let tiers = [
                "--cache",
                "1",
                "--pin",
                "auto",
                "--pin-gb",
                "0.0005",
                "--pin-fill",
                "1",
                "--repin",
                "4",
                "--pilot",
                "--draft",
                "2",
                "-v",
            ];
            for run in 0..2 {
                let (tiered, err) = answer("tiered", &tiers);
                assert_eq!(
                    tiered,
                    plain,
                    "{model} {format:?} run {run}: {} vs {}",
                    String::from_utf8_lossy(&tiered.1),
                    String::from_utf8_lossy(&plain.1)
                );
                let unpinned = err.contains("resident experts: 0 pinned");
                assert_eq!(unpinned, run == 0, "{model} {format:?} run {run}: {err}");
            }
            if plain.0 == Some(0) {
                let v: serde_json::Value = serde_json::from_slice(&plain.1)
                    .unwrap_or_else(|e| panic!("{model} {format:?}: {e}"));
                assert!(v["answer"] == "yes" || v["answer"] == "no", "{model}: {v}");
            }
        }
    }
}
