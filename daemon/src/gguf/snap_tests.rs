//! `--snap FILE.gguf` against the checkpoint it was converted from: the GGUF that llama.cpp's
//! converter made of a tiny fixture (scripts/make_gguf_fixtures.sh) gives the same config,
//! tokenizer and tensors as the fixture's safetensors folder.

use std::path::PathBuf;

use super::snap;
use super::GgufError;
use crate::config::ModelConfig;
use crate::tokenizer::Tokenizer;
use crate::weights::ShardSet;

pub(super) fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

/// Each tensor of `names` has the same shape and the same f32 values in the GGUF's set `g`
/// as in the checkpoint's `s` (`name`, the fixture, for the messages).
pub(super) fn same_values(name: &str, g: &ShardSet, s: &ShardSet, names: &[&str]) {
    for &n in names {
        let (a, b) = (g.get(n).unwrap(), s.get(n).unwrap());
        assert_eq!(a.shape, b.shape, "{name}: {n}");
        assert_eq!(
            g.read_f32(n, &a.shape).unwrap(),
            s.read_f32(n, &b.shape).unwrap(),
            "{name}: {n}"
        );
    }
}

/// (the GGUF, the folder it was converted from).
fn pair(name: &str) -> (PathBuf, PathBuf) {
    let f = fixtures();
    (f.join(format!("gguf/{name}-f32.gguf")), f.join(name))
}

/// The fixtures with a GGUF: llama.cpp's glm4moe, its qwen3moe (which holds no dense layer,
/// hence the all-sparse Qwen3 fixture), gpt-oss, and minimax-m2 (its two shapes: q/k norms
/// over 4 and 8 heads, rotary on half and a quarter of each head, the GQA one tied).
const FAMILIES: [&str; 5] = [
    "tiny-glm4-moe",
    "tiny-qwen3-moe-sparse",
    "tiny-gpt-oss",
    "tiny-minimax-m2",
    "tiny-minimax-m2-gqa",
];

/// The folder holding the same tensors under the engine's names as the GGUF of `name`:
/// gpt-oss's fixture keeps the published fused experts, its `-split` twin the same model split
/// per expert (what llama.cpp's converter de-interleaves them into).
fn same_tensors(name: &str) -> PathBuf {
    match name {
        "tiny-gpt-oss" => fixtures().join("tiny-gpt-oss-split"),
        _ => fixtures().join(name),
    }
}

/// Those and qwen35moe, whose tensors its converter transforms (`qwen35_tests`).
const WITH_QWEN35: [&str; 3] = ["tiny-glm4-moe", "tiny-qwen3-moe-sparse", "tiny-qwen35-moe"];

#[test]
fn the_config_is_the_one_config_json_gives() {
    for name in WITH_QWEN35 {
        let (gguf, dir) = pair(name);
        let mut from_gguf = snap::model_config(&gguf).unwrap();
        let mut from_json = ModelConfig::load(&dir).unwrap();
        // The end-of-generation ids are a set: llama.cpp keeps no order for them.
        from_gguf.eos_token_ids.sort_unstable();
        // llama.cpp also ends generation at <|endoftext|> (312 here), as gpt-oss's published
        // generation_config.json does; the tiny config.json lists only <|return|> and <|call|>.
        if name == "tiny-gpt-oss" {
            from_json.eos_token_ids.push(312);
        }
        from_json.eos_token_ids.sort_unstable();
        // ModelConfig has no PartialEq: its Debug form lists every field.
        assert_eq!(
            format!("{from_gguf:#?}"),
            format!("{from_json:#?}"),
            "{name}"
        );
        // The folder hook takes the file for a folder too.
        let mut via_load = ModelConfig::load(&gguf).unwrap();
        via_load.eos_token_ids.sort_unstable();
        assert_eq!(format!("{via_load:?}"), format!("{from_json:?}"));
        assert!(!from_json.eos_token_ids.is_empty(), "{name}");
    }
}

#[test]
fn the_tokenizer_encodes_as_tokenizer_json_does() {
    let texts = [
        "Hello, world! It's 12345 o'clock.",
        "<|user|>\nwhat is 2+2?<|assistant|>\n<think></think>four",
        "  spaces\t\ttabs\n\nnewlines  ",
        "ünïcödé 日本語 — “quotes” ... ???",
        "[gMASK]<sop><|system|>\nYou are terse.<|user|>\nHi<|assistant|>",
        "<|start|>user<|message|>Tell me about the sea.<|end|><|start|>assistant<|return|>",
        "]~b]user\nHi[e~[\n]~b]ai\n<think>\nhm</think>ok[e~[",
    ];
    for name in WITH_QWEN35 {
        let (gguf, dir) = pair(name);
        let files = snap::files(&gguf).unwrap();
        let want = Tokenizer::from_file(&dir.join("tokenizer.json")).unwrap();
        assert_eq!(files.tokenizer.vocab_size(), want.vocab_size(), "{name}");
        for t in texts {
            let (a, b) = (files.tokenizer.encode(t).unwrap(), want.encode(t).unwrap());
            assert_eq!(a, b, "{name}: {t:?}");
            assert_eq!(files.tokenizer.decode_bytes(&a), want.decode_bytes(&b));
        }
        for id in 0..want.vocab_size() as u32 {
            assert_eq!(
                files.tokenizer.token_bytes(id),
                want.token_bytes(id),
                "{name}: token {id}"
            );
            assert_eq!(
                files.tokenizer.is_special(id),
                want.is_special(id),
                "{name}: token {id}"
            );
        }
    }
}

#[test]
fn every_tensor_is_the_checkpoints_read_in_place() {
    for name in FAMILIES {
        let (gguf, _) = pair(name);
        let dir = same_tensors(name);
        let g = ShardSet::open(std::slice::from_ref(&gguf)).unwrap();
        let s = ShardSet::open(&[dir]).unwrap();
        let ours: Vec<&str> = g.names().collect();
        // The converter leaves out no tensor of the model (the fixture has no MTP weights).
        let theirs: Vec<&str> = s.names().collect();
        assert_eq!(ours, theirs, "{name}");
        same_values(name, &g, &s, &ours);
        for n in ours {
            // In place: the bytes are the GGUF file's own, at the tensor's range.
            assert_eq!(g.file_path(g.get(n).unwrap().file), gguf.as_path());
        }
    }
}

/// A copy of the glm4moe fixture with `glm4moe` (the architecture and every key named after
/// it) replaced by `with`, same length.
fn renamed_arch(with: &str) -> PathBuf {
    let (gguf, _) = pair("tiny-glm4-moe");
    let mut b = std::fs::read(gguf).unwrap();
    let from = b"glm4moe";
    assert_eq!(with.len(), from.len());
    let mut i = 0;
    while i + from.len() <= b.len() {
        if &b[i..i + from.len()] == from {
            b[i..i + from.len()].copy_from_slice(with.as_bytes());
        }
        i += 1;
    }
    let dir = std::env::temp_dir().join(format!("colibri-gguf-snap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("{with}.gguf"));
    std::fs::write(&p, b).unwrap();
    p
}

#[test]
fn an_architecture_colibri_does_not_run_is_refused_naming_the_key() {
    let p = renamed_arch("llamaxy");
    let e = snap::model_config(&p).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, GgufError::Metadata { ref key, .. } if key == "general.architecture"),
        "{msg}"
    );
    assert!(
        msg.contains("llamaxy") && msg.contains("glm4moe, qwen3moe"),
        "{msg}"
    );
    assert_eq!(e.exit_code(), 2);
    // The tensors are refused the same way, before any is mapped under a name.
    let e = ShardSet::open(std::slice::from_ref(&p))
        .unwrap_err()
        .to_string();
    assert!(e.contains("general.architecture"), "{e}");
    std::fs::remove_file(p).unwrap();
}

#[test]
fn a_split_set_opened_from_its_first_part_is_the_single_file() {
    let f = fixtures().join("gguf");
    let one = f.join("tiny-glm4-moe-f32.gguf");
    let first = f.join("tiny-glm4-moe-f32-split-00001-of-00002.gguf");
    let a = ShardSet::open(std::slice::from_ref(&one)).unwrap();
    let b = ShardSet::open(std::slice::from_ref(&first)).unwrap();
    assert_eq!(b.num_files(), 2);
    assert_eq!(a.names().collect::<Vec<_>>(), b.names().collect::<Vec<_>>());
    let mut in_second = 0;
    for n in a.names() {
        let (x, y) = (a.get(n).unwrap(), b.get(n).unwrap());
        assert_eq!(
            a.read_f32(n, &x.shape).unwrap(),
            b.read_f32(n, &y.shape).unwrap(),
            "{n}"
        );
        in_second += usize::from(y.file == 1);
    }
    assert!(in_second > 0, "no tensor read from the second part");
    assert_eq!(
        format!("{:?}", snap::model_config(&first).unwrap()),
        format!("{:?}", snap::model_config(&one).unwrap())
    );
    // The first part alone: refused naming the part that is missing.
    let dir = std::env::temp_dir().join(format!("colibri-gguf-split-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lone = dir.join(first.file_name().unwrap());
    std::fs::copy(&first, &lone).unwrap();
    let e = snap::model_config(&lone).unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::MissingPart {
                part: 2,
                count: 2,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(e.exit_code(), 2);
    let e = ShardSet::open(std::slice::from_ref(&lone))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tiny-glm4-moe-f32-split-00002-of-00002.gguf") && e.contains("missing"),
        "{e}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// The pieces `pre` (a `pre_tokenizer` of a tokenizer.json) splits `text` into, as slices of it.
fn pre_split(pre: serde_json::Value, text: &str) -> Vec<String> {
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
    let p: tokenizers::PreTokenizerWrapper = serde_json::from_value(pre).unwrap();
    let mut pts = PreTokenizedString::from(text);
    p.pre_tokenize(&mut pts).unwrap();
    pts.get_splits(OffsetReferential::Original, OffsetType::Byte)
        .into_iter()
        .map(|(_, (a, b), _)| text[a..b].to_string())
        .collect()
}

/// gpt-oss's and MiniMax-M2's pre-tokenizer (llama.cpp's `gpt-4o` and `minimax-m2`: o200k's
/// split) splits as o200k does, not as GPT-2's: letters at a case change, a contraction kept
/// on its word, digits in threes, a slash with its newlines. The expected pieces are Python
/// `regex`'s findall of the regex in gpt-oss's tokenizer.json.
#[test]
fn the_o200k_pre_tokenizer_splits_as_o200k() {
    let text = "HelloWorld don't SHOUTing 12345 x/\n\n  \u{c9}coleNormale's";
    let o200k = [
        "Hello",
        "World",
        " don't",
        " SHOUTing",
        " ",
        "123",
        "45",
        " x",
        "/\n\n",
        " ",
        " \u{c9}cole",
        "Normale's",
    ];
    for name in ["gpt-4o", "minimax-m2"] {
        let pre = super::tokenizer::pre_tokenizer_of(name).unwrap();
        assert_eq!(pre_split(pre, text), o200k, "{name}");
    }
    // GPT-2's split of the same text, which the test tells apart.
    let gpt2 = [
        "HelloWorld",
        " don",
        "'t",
        " SHOUTing",
        " 12345",
        " x",
        "/",
        "\n\n ",
        " \u{c9}coleNormale",
        "'s",
    ];
    let pre = super::tokenizer::pre_tokenizer_of("gpt-2").unwrap();
    assert_eq!(pre_split(pre, text), gpt2);
}
