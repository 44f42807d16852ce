//! `colibri convert` and `colibri info` tell the truth: the converted folder carries the
//! checkpoint's chat template, tokenizer files and generation config byte for byte, and `run`
//! on it uses that template; a source `run` would refuse (an unsupported family, no
//! tokenizer, a config the family's parser refuses, a template that does not compile) is
//! refused before anything is written; `info` and the `[MODEL]` line report the formats
//! stored in the container, not those of the flags.

use std::path::{Path, PathBuf};
use std::process::Output;

use colibri_e2e::{colibri, fixture, stderr, temp_dir};
use serde_json::{json, Value};

/// A template unlike the family's built-in one, short.
const JINJA: &str = "{% for m in messages %}<<{{ m.content }}>>{% endfor %}\
                     {% if add_generation_prompt %}=>{% endif %}";
/// tokenizer_config.json's template, long: transformers prefers chat_template.jinja to it.
const CONFIG_TEMPLATE: &str = "{% for m in messages %}The user says, at some length: \
                               {{ m.content }} and nothing more.{% endfor %}\
                               {% if add_generation_prompt %} The answer follows:{% endif %}";

/// The files a checkpoint's tokenizer and chat template live in, as the test source has them.
const TOKENIZER_FILES: [&str; 5] = [
    "chat_template.jinja",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
];

/// hf-bf16-moe (glm_moe_dsa, BF16) with a chat_template.jinja, a tokenizer_config.json that
/// has a template of its own, and a special_tokens_map.json.
fn source(dir: &Path) -> PathBuf {
    let src = dir.join("src");
    std::fs::create_dir_all(&src).unwrap();
    for e in std::fs::read_dir(fixture("hf-bf16-moe")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), src.join(e.file_name())).unwrap();
    }
    std::fs::write(src.join("chat_template.jinja"), JINJA).unwrap();
    let config = json!({"chat_template": CONFIG_TEMPLATE, "eos_token": "<|endoftext|>"});
    std::fs::write(src.join("tokenizer_config.json"), config.to_string()).unwrap();
    std::fs::write(
        src.join("special_tokens_map.json"),
        json!({"eos_token": "<|endoftext|>"}).to_string(),
    )
    .unwrap();
    src
}

fn convert(from: &Path, to: &Path, extra: &[&str]) -> Output {
    colibri()
        .arg("convert")
        .arg("--from")
        .arg(from)
        .arg("--to")
        .arg(to)
        .args(extra)
        .env_remove("COLI_CONVERT_STOP_AFTER")
        .env_remove("COLI_CONVERT_FREE_BYTES")
        .output()
        .unwrap()
}

fn info(snap: &Path, extra: &[&str]) -> Value {
    let o = colibri()
        .args(["info", "--json"])
        .args(extra)
        .arg("--snap")
        .arg(snap)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// `run` of one user turn `hello`, one token long, its state kept out of the model folder.
fn run_hello(snap: &Path) -> Output {
    colibri()
        .args(["run", "--max-tokens", "1", "--state-dir"])
        .arg(snap.with_extension("state"))
        .arg("--snap")
        .arg(snap)
        .arg("hello")
        .output()
        .unwrap()
}

/// The prompt's token count `run` reports for one user turn `hello`.
fn prompt_tokens(snap: &Path) -> u32 {
    let o = run_hello(snap);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    err.lines()
        .find_map(|l| l.strip_prefix("[run] "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no [run] line in {err}"))
}

#[test]
fn the_converted_folder_keeps_the_template_and_run_uses_it() {
    let dir = temp_dir("convert-truth");
    let src = source(&dir);
    let to = dir.join("c");
    let o = convert(&src, &to, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    for name in TOKENIZER_FILES.iter().chain(&["config.json"]) {
        assert_eq!(
            std::fs::read(to.join(name)).unwrap_or_default(),
            std::fs::read(src.join(name)).unwrap(),
            "{name} is not the source's"
        );
    }
    assert!(stderr(&o).contains("chat_template.jinja"), "{}", stderr(&o));

    // info names the template run will use: the converted folder's chat_template.jinja.
    let v = info(&to, &[]);
    assert_eq!(
        v["chat_template"],
        to.join("chat_template.jinja").display().to_string()
    );
    // run on the converted folder renders the turn as run on the source does.
    let converted = prompt_tokens(&to);
    assert_eq!(converted, prompt_tokens(&src));

    // Without the .jinja, tokenizer_config.json's (longer) template is used; without both,
    // the family's built-in one.
    std::fs::remove_file(to.join("chat_template.jinja")).unwrap();
    let v = info(&to, &[]);
    assert!(
        v["chat_template"]
            .as_str()
            .unwrap()
            .ends_with("tokenizer_config.json (chat_template)"),
        "{v}"
    );
    assert!(prompt_tokens(&to) > converted + 5);
    std::fs::remove_file(to.join("tokenizer_config.json")).unwrap();
    assert_eq!(info(&to, &[])["chat_template"], "built-in (glm_moe_dsa)");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `convert` on `src` is refused with exit 2 naming `needle`, and `--to` stays as it was:
/// absent, or an empty folder.
fn refused(src: &Path, dir: &Path, needle: &str) {
    let to = dir.join("absent");
    let o = convert(src, &to, &[]);
    assert_eq!(o.status.code(), Some(2), "{needle}: {}", stderr(&o));
    assert!(stderr(&o).contains(needle), "{needle}: {}", stderr(&o));
    assert!(
        !to.exists(),
        "{needle}: the refused conversion created {to:?}"
    );
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let o = convert(src, &empty, &[]);
    assert_eq!(o.status.code(), Some(2), "{needle}: {}", stderr(&o));
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0, "{needle}");
}

fn edit_config(src: &Path, f: impl FnOnce(&mut Value)) {
    let path = src.join("config.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&path, v.to_string()).unwrap();
}

#[test]
fn what_run_would_refuse_is_refused_before_writing() {
    let dir = temp_dir("convert-refused");

    let src = source(&dir.join("family"));
    edit_config(&src, |v| v["model_type"] = json!("llama"));
    refused(&src, &dir.join("family"), "model_type");

    let src = source(&dir.join("parser"));
    edit_config(&src, |v| v["hidden_act"] = json!("gelu"));
    refused(&src, &dir.join("parser"), "hidden_act");

    let src = source(&dir.join("tokenizer"));
    std::fs::remove_file(src.join("tokenizer.json")).unwrap();
    refused(&src, &dir.join("tokenizer"), "tokenizer.json");

    let src = source(&dir.join("template"));
    std::fs::write(src.join("chat_template.jinja"), "{% if %}").unwrap();
    refused(&src, &dir.join("template"), "chat_template.jinja");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn info_and_the_model_line_report_the_stored_formats() {
    let dir = temp_dir("convert-formats");
    let src = source(&dir);
    let to = dir.join("c");
    let o = convert(&src, &to, &["--expert-bits", "2", "--dense-bits", "8"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // Whatever the flags ask, the container's formats are what the engine computes in.
    for flags in [&[][..], &["--expert-bits", "4", "--dense-bits", "16"][..]] {
        let v = info(&to, flags);
        assert_eq!(v["expert_format"], "int2 (stored)", "{flags:?}: {v}");
        assert_eq!(v["dense_format"], "int8 (stored)", "{flags:?}: {v}");
    }
    // The unconverted source is quantized at load to the flags' formats.
    let v = info(&src, &["--expert-bits", "4", "--dense-bits", "8"]);
    assert_eq!(v["expert_format"], "int4 (at load)", "{v}");
    assert_eq!(v["dense_format"], "int8 (at load)", "{v}");

    let o = run_hello(&to);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    let line = err
        .lines()
        .find(|l| l.starts_with("[MODEL] "))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        line.contains("| experts int2 (stored) dense int8 (stored) |"),
        "{line}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
