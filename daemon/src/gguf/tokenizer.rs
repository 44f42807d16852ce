//! The tokenizer of a GGUF, from its vocabulary: `tokenizer.ggml.model` `gpt2` (byte-level
//! BPE) with its tokens, merges and token types, and the pre-tokenizer `tokenizer.ggml.pre`
//! names, written as the `tokenizer.json` the Hugging Face tokenizers crate reads, so the
//! engine's [`Tokenizer`] (and everything built on it) is the same for both formats.

use serde_json::{json, Map, Value};

use super::meta::GgufValue;
use super::{GgufError, GgufModel};
use crate::tokenizer::Tokenizer;

/// llama.cpp's token types (`llama_token_type`): control and user-defined tokens are the
/// added tokens of a `tokenizer.json` (matched whole before BPE); the rest are BPE vocabulary.
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

/// o200k's split (gpt-oss's `o200k_harmony`, GPT-4o), as its tokenizer.json writes it:
/// letters split at a lower-to-upper case change, a contraction kept on its word, digits in
/// threes. llama.cpp's `gpt-4o` and `minimax-m2` pre-tokenizers both run it (rewritten for
/// its own regex engine, the same splits).
const O200K: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The split regex of each pre-tokenizer llama.cpp names, as the published tokenizer.json of
/// that family writes it (Qwen2/Qwen3, GLM-4.5, gpt-oss, MiniMax-M2). `None`: GPT-2's own
/// byte-level regex.
const PRE: [(&str, Option<&str>); 6] = [
    ("gpt-2", None),
    ("default", None),
    (
        "qwen2",
        Some(
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ),
    ),
    (
        "glm4",
        Some(
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ),
    ),
    ("gpt-4o", Some(O200K)),
    ("minimax-m2", Some(O200K)),
];

fn bad(m: &GgufModel, key: &str, reason: String) -> GgufError {
    GgufError::Metadata {
        path: m.parts[0].path().to_path_buf(),
        key: key.into(),
        reason,
    }
}

/// The strings of array key `key`.
fn strings<'a>(m: &'a GgufModel, key: &str) -> Result<Vec<&'a str>, GgufError> {
    match m.get(key) {
        Some(GgufValue::Array(_, v)) => v
            .iter()
            .enumerate()
            .map(|(i, x)| {
                x.as_str()
                    .ok_or_else(|| bad(m, key, format!("element {i} is {x:?}, not a string")))
            })
            .collect(),
        Some(v) => Err(bad(
            m,
            key,
            format!("expected an array of strings, found {v:?}"),
        )),
        None => Err(bad(m, key, "missing".into())),
    }
}

/// The `tokenizer.json` of the GGUF's vocabulary.
pub fn tokenizer_json(m: &GgufModel) -> Result<Value, GgufError> {
    let model = m.get("tokenizer.ggml.model").and_then(|v| v.as_str());
    if model != Some("gpt2") {
        return Err(bad(
            m,
            "tokenizer.ggml.model",
            format!("{model:?}; colibri builds gpt2 (byte-level BPE) tokenizers"),
        ));
    }
    let pre_name = m
        .get("tokenizer.ggml.pre")
        .and_then(|v| v.as_str())
        .unwrap_or("default");
    let (_, regex) = PRE.iter().find(|(n, _)| *n == pre_name).ok_or_else(|| {
        bad(
            m,
            "tokenizer.ggml.pre",
            format!(
                "{pre_name:?} is not a pre-tokenizer colibri knows (known: {})",
                PRE.map(|(n, _)| n).join(", ")
            ),
        )
    })?;
    let tokens = strings(m, "tokenizer.ggml.tokens")?;
    let types: Vec<i64> = match m.get("tokenizer.ggml.token_type") {
        Some(GgufValue::Array(_, v)) if v.len() == tokens.len() => v
            .iter()
            .map(|x| match x {
                GgufValue::I32(t) => *t as i64,
                other => other.as_u64().map_or(1, |t| t as i64),
            })
            .collect(),
        Some(v) => {
            return Err(bad(
                m,
                "tokenizer.ggml.token_type",
                format!(
                    "expected {} token types, one per token, found {v:?}",
                    tokens.len()
                )
                .chars()
                .take(200)
                .collect(),
            ))
        }
        None => vec![1; tokens.len()],
    };
    let merges: Vec<Value> = strings(m, "tokenizer.ggml.merges")?
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            s.split_once(' ')
                .map(|(a, b)| json!([a, b]))
                .ok_or_else(|| {
                    bad(
                        m,
                        "tokenizer.ggml.merges",
                        format!("merge {i} {s:?} is not two tokens"),
                    )
                })
        })
        .collect::<Result<_, _>>()?;
    let mut vocab = Map::new();
    let mut added = Vec::new();
    for (id, (tok, ty)) in tokens.iter().zip(&types).enumerate() {
        if *ty == CONTROL || *ty == USER_DEFINED {
            added.push(json!({
                "id": id, "content": tok, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": *ty == CONTROL,
            }));
        } else {
            vocab.insert(tok.to_string(), json!(id));
        }
    }
    let pre_tokenizer = pre_tokenizer(*regex);
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": merges,
        },
    }))
}

/// The tokenizer.json `pre_tokenizer` of a split regex (`None`: GPT-2's byte-level one).
fn pre_tokenizer(regex: Option<&str>) -> Value {
    match regex {
        None => {
            json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})
        }
        Some(r) => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        ]}),
    }
}

/// The `pre_tokenizer` of llama.cpp's pre-tokenizer `name`, if colibri knows it.
#[cfg(test)]
pub(super) fn pre_tokenizer_of(name: &str) -> Option<Value> {
    PRE.iter()
        .find(|(n, _)| *n == name)
        .map(|(_, r)| pre_tokenizer(*r))
}

/// The engine's tokenizer of the GGUF. A vocabulary the tokenizers crate refuses is refused
/// naming `tokenizer.ggml.tokens`.
pub fn tokenizer(m: &GgufModel) -> Result<Tokenizer, GgufError> {
    let json = tokenizer_json(m)?;
    Tokenizer::from_bytes(json.to_string().as_bytes()).map_err(|e| {
        bad(
            m,
            "tokenizer.ggml.tokens",
            format!("the vocabulary does not make a tokenizer: {e}"),
        )
    })
}

/// `tokenizer.chat_template`, when the GGUF has one.
pub fn chat_template(m: &GgufModel) -> Option<&str> {
    m.get("tokenizer.chat_template").and_then(|v| v.as_str())
}
