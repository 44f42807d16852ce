//! `tokenizer.json` loading, text to ids, and ids to **raw bytes**.
//!
//! Encoding goes through the `tokenizers` crate. Decoding does not: its `decode` returns a
//! lossy `String`, while the protocol must stream the exact bytes of every token, including a
//! token that is half of a UTF-8 sequence (CONTRACT.md §3). So at load we build one table,
//! id to bytes: byte-level BPE tokens are mapped back through the inverse of GPT-2's
//! `bytes_to_unicode`, added and special tokens give their content text.
//!
//! Chat prompts are encoded from a [`ChatText`]: the special tokens its template wrote are
//! control tokens, while a message's content that spells one (`<|user|>` typed by a user, or
//! returned by a tool) is read as text, so content cannot forge a turn.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::Value;

/// Highest token id accepted (16M), so a hostile file cannot size a giant table.
const MAX_TOKEN_ID: u32 = (1 << 24) - 1;

/// Peak transient memory of one `encode`, per input byte, with margin. The `tokenizers` crate
/// keeps per-byte alignments and a `String` per token while it encodes; measured on a
/// byte-level BPE vocabulary at 4 MB of input: 149 B/byte for English words, 182 for CJK,
/// 218 for random Unicode, 274 for random ASCII punctuation (one token per byte).
pub const ENCODE_PEAK_BYTES_PER_BYTE: u64 = 320;

/// Why a tokenizer could not be loaded or used.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{origin}: cannot load tokenizer: {msg}")]
    Load { origin: String, msg: String },
    #[error("cannot encode text: {msg}")]
    Encode { msg: String },
}

/// A loaded tokenizer plus its id-to-bytes table.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Concatenated bytes of every token, id order.
    bytes: Vec<u8>,
    /// `bytes[offsets[id]..offsets[id + 1]]` is token `id`; `len() == vocab_size + 1`.
    offsets: Vec<usize>,
    /// Ids of special added tokens (sorted): control tokens, never text a grammar matches.
    special: Vec<u32>,
    /// The special added tokens as the encoder finds them in text.
    specials: Vec<Special>,
    /// Indices into `specials` by the first byte of their text, longest text first, so the
    /// first that matches at a position is the leftmost-longest match the encoder takes.
    by_first_byte: Box<[Vec<u32>; 256]>,
    /// The same tokenizer with special-token matching off (`encode_special_tokens`), for the
    /// runs of a chat prompt that hold content; built the first time one needs it.
    plain: OnceLock<tokenizers::Tokenizer>,
    /// The longest token's bytes, when every input byte is known to land in some token
    /// (byte-level, no normalizer, all 256 bytes in the vocabulary); see [`Self::min_tokens`].
    bound_token_bytes: Option<usize>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Loads a `tokenizer.json` file.
    pub fn from_file(path: &Path) -> Result<Tokenizer, TokenizerError> {
        let json = std::fs::read(path).map_err(|source| TokenizerError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::load(&json, &path.display().to_string())
    }

    /// Loads the text of a `tokenizer.json`.
    pub fn from_bytes(json: &[u8]) -> Result<Tokenizer, TokenizerError> {
        Self::load(json, "tokenizer.json")
    }

    fn load(json: &[u8], origin: &str) -> Result<Tokenizer, TokenizerError> {
        let load_err = |msg: String| TokenizerError::Load {
            origin: origin.to_string(),
            msg,
        };
        // The tokenizers crate panics on some malformed files (an `expect` in its decoder
        // deserializer, found by the fuzz tests): a bad file must be an error, not a crash.
        let parsed = std::panic::catch_unwind(|| tokenizers::Tokenizer::from_bytes(json))
            .map_err(|_| load_err("malformed tokenizer definition (the parser gave up)".into()))?;
        let inner = parsed.map_err(|e| load_err(e.to_string()))?;
        // The crate does not expose the decoder's structure, so read those two keys ourselves
        // (serde skips the rest, vocabulary included, without building values).
        let pipeline: Pipeline =
            serde_json::from_slice(json).map_err(|e| load_err(e.to_string()))?;
        let byte_level =
            has_byte_level(&pipeline.decoder) || has_byte_level(&pipeline.pre_tokenizer);

        let vocab = inner.get_vocab(false);
        let added = inner.get_added_tokens_decoder();
        let max_id = vocab.values().chain(added.keys()).copied().max();
        let n = match max_id {
            None => 0,
            Some(id) if id > MAX_TOKEN_ID => {
                return Err(load_err(format!(
                    "token id {id} is beyond the supported maximum {MAX_TOKEN_ID}"
                )))
            }
            Some(id) => id as usize + 1,
        };
        // The id table is dense: an id far past the number of entries would size it by a
        // number the file merely states (found by the fuzz tests), so such files are refused.
        let entries = vocab.len() + added.len();
        if n > 2 * entries + 1024 {
            return Err(load_err(format!(
                "token id {} with only {entries} vocabulary entries: ids must be dense (at most {})",
                n - 1,
                2 * entries + 1023
            )));
        }

        let mut table: Vec<Vec<u8>> = vec![Vec::new(); n];
        for (token, id) in &vocab {
            table[*id as usize] = if byte_level {
                byte_level_bytes(token)
            } else {
                plain_bytes(token)
            };
        }
        // Added tokens win over a model entry with the same id, as in the crate's decode.
        for (id, token) in &added {
            table[*id as usize] = token.content.as_bytes().to_vec();
        }

        let mut special: Vec<u32> = added
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| *id)
            .collect();
        special.sort_unstable();
        let mut specials: Vec<Special> = added
            .iter()
            .filter(|(_, t)| t.special && !t.content.is_empty())
            .map(|(id, t)| Special {
                content: t.content.clone(),
                id: *id,
                lstrip: t.lstrip,
                rstrip: t.rstrip,
                single_word: t.single_word,
            })
            .collect();
        specials.sort_unstable_by_key(|s| s.id);
        let mut by_first_byte: Box<[Vec<u32>; 256]> = Box::new(std::array::from_fn(|_| Vec::new()));
        for (i, s) in specials.iter().enumerate() {
            by_first_byte[s.content.as_bytes()[0] as usize].push(i as u32);
        }
        for bucket in by_first_byte.iter_mut() {
            bucket.sort_by_key(|&i| std::cmp::Reverse(specials[i as usize].content.len()));
        }

        let mut bytes = Vec::with_capacity(table.iter().map(Vec::len).sum());
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0);
        for t in &table {
            bytes.extend_from_slice(t);
            offsets.push(bytes.len());
        }
        let every_byte = {
            let mut seen = [false; 256];
            for t in table.iter().filter(|t| t.len() == 1) {
                seen[t[0] as usize] = true;
            }
            seen.iter().all(|&b| b)
        };
        let bound_token_bytes = (byte_level && pipeline.normalizer.is_null() && every_byte)
            .then(|| table.iter().map(Vec::len).max())
            .flatten()
            .filter(|&m| m > 0);
        Ok(Tokenizer {
            inner,
            bytes,
            offsets,
            special,
            specials,
            by_first_byte,
            plain: OnceLock::new(),
            bound_token_bytes,
        })
    }

    /// Text to ids without adding any special tokens automatically; special and added tokens
    /// written in the text (e.g. `"[gMASK]<sop><|user|>"`) are recognised as single tokens.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| TokenizerError::Encode { msg: e.to_string() })?;
        Ok(enc.get_ids().to_vec())
    }

    /// A chat template's output to ids: the special tokens the template wrote are control
    /// tokens, the `literal` ranges (special tokens that message content spelled) are text.
    ///
    /// As transformers encodes a conversation with `split_special_tokens` for its content:
    /// the text is cut at the template's special tokens, and each run between two of them is
    /// encoded whole with special-token matching off, so the BPE merges across a boundary
    /// between template text and content exactly as they would in one string. Without
    /// literal ranges this is [`Self::encode`].
    pub fn encode_chat(&self, chat: &ChatText) -> Result<Vec<u32>, TokenizerError> {
        if chat.literal.is_empty() {
            return self.encode(&chat.text);
        }
        self.encode_outside(&chat.text, &chat.literal)
    }

    /// [`Self::encode_chat`] with literal ranges: the encoder's own added-token split (the
    /// leftmost-longest special token, `lstrip`/`rstrip`/`single_word` applied), except that
    /// no special token is matched where it would overlap a literal range.
    fn encode_outside(
        &self,
        text: &str,
        literal: &[Range<usize>],
    ) -> Result<Vec<u32>, TokenizerError> {
        let plain = self.plain.get_or_init(|| {
            let mut t = self.inner.clone();
            t.set_encode_special_tokens(true);
            t
        });
        let encode_run = |ids: &mut Vec<u32>, run: &str| -> Result<(), TokenizerError> {
            let enc = plain
                .encode(run, false)
                .map_err(|e| TokenizerError::Encode { msg: e.to_string() })?;
            ids.extend_from_slice(enc.get_ids());
            Ok(())
        };
        let bytes = text.as_bytes();
        let mut ids = Vec::new();
        let mut literal = literal.iter().peekable();
        // `run..` is not encoded yet; `at` is where the next special token may start.
        let (mut run, mut at) = (0, 0);
        while at < bytes.len() {
            while literal.next_if(|r| r.end <= at).is_some() {}
            let limit = match literal.peek() {
                Some(r) if r.start <= at => {
                    at = r.end;
                    continue;
                }
                Some(r) => r.start,
                None => bytes.len(),
            };
            let Some(i) = self.special_at(bytes, at, limit) else {
                at += 1;
                continue;
            };
            let s = &self.specials[i];
            let (mut start, mut end) = (at, at + s.content.len());
            at = end;
            if s.single_word && (ends_with_word(&text[..start]) || starts_with_word(&text[end..])) {
                // The encoder skips such a match and goes on after it.
                continue;
            }
            if s.lstrip {
                start = run.max(start - trailing_space(&text[..start]));
            }
            if s.rstrip {
                end += leading_space(&text[end..]);
                at = end;
            }
            if run < start {
                encode_run(&mut ids, &text[run..start])?;
            }
            ids.push(s.id);
            run = end;
        }
        if run < bytes.len() {
            encode_run(&mut ids, &text[run..])?;
        }
        Ok(ids)
    }

    /// The special token the encoder would take at byte `at` of `bytes` (the longest whose
    /// text starts there and ends by `limit`), as an index into `specials`.
    fn special_at(&self, bytes: &[u8], at: usize, limit: usize) -> Option<usize> {
        self.by_first_byte[bytes[at] as usize]
            .iter()
            .map(|&i| i as usize)
            .find(|&i| {
                let c = self.specials[i].content.as_bytes();
                at + c.len() <= limit && bytes[at..].starts_with(c)
            })
    }

    /// The first special token spelled in `text` at or after byte `from` (leftmost, then
    /// longest).
    pub fn find_special(&self, text: &str, from: usize) -> Option<SpecialMatch> {
        let bytes = text.as_bytes();
        (from..bytes.len()).find_map(|at| {
            self.special_at(bytes, at, bytes.len())
                .map(|index| SpecialMatch {
                    start: at,
                    end: at + self.specials[index].content.len(),
                    index,
                })
        })
    }

    /// The text of special token `index` (as [`SpecialMatch::index`] numbers them).
    pub fn special_text(&self, index: usize) -> Option<&str> {
        self.specials.get(index).map(|s| s.content.as_str())
    }

    /// The fewest tokens a text of `len` bytes can encode to, without encoding it: each
    /// token covers at most the longest token's bytes, and no byte is dropped. `None` when
    /// this tokenizer gives no such guarantee. Lets a prompt far past the context be
    /// refused before the encoder spends hundreds of bytes of memory per input byte.
    pub fn min_tokens(&self, len: usize) -> Option<usize> {
        self.bound_token_bytes.map(|m| len.div_ceil(m))
    }

    /// The most memory encoding a text of `len` bytes may take while it runs.
    pub fn encode_peak_bytes(len: usize) -> u64 {
        len as u64 * ENCODE_PEAK_BYTES_PER_BYTE
    }

    /// Raw bytes of one token (possibly a partial UTF-8 sequence). An id outside the
    /// vocabulary gives no bytes.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        let i = id as usize;
        match (self.offsets.get(i), self.offsets.get(i + 1)) {
            (Some(&a), Some(&b)) => &self.bytes[a..b],
            _ => &[],
        }
    }

    /// Concatenation of [`Tokenizer::token_bytes`] for `ids`.
    pub fn decode_bytes(&self, ids: &[u32]) -> Vec<u8> {
        let mut out = Vec::new();
        for &id in ids {
            out.extend_from_slice(self.token_bytes(id));
        }
        out
    }

    /// Exact vocabulary or added-token lookup, e.g. `"<|endoftext|>"`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.inner.token_to_id(text)
    }

    /// Whether `id` is a special added token (`<|user|>`, `<|endoftext|>`, ...).
    pub fn is_special(&self, id: u32) -> bool {
        self.special.binary_search(&id).is_ok()
    }

    /// Number of ids (largest id + 1).
    pub fn vocab_size(&self) -> usize {
        self.offsets.len() - 1
    }
}

/// A chat template's output, and the byte ranges in it where a message's content spelled a
/// special token: [`Tokenizer::encode_chat`] reads those as text, and special tokens anywhere
/// else as control tokens.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChatText {
    pub text: String,
    /// Sorted, disjoint ranges of `text`, each the text of one special token.
    pub literal: Vec<Range<usize>>,
}

impl ChatText {
    /// Text with no content to protect (a template's own words, or a test's).
    pub fn template(text: impl Into<String>) -> ChatText {
        ChatText {
            text: text.into(),
            literal: Vec::new(),
        }
    }
}

/// Where [`Tokenizer::find_special`] found a special token: bytes `start..end`, token `index`
/// of the tokenizer's special tokens ([`Tokenizer::special_text`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpecialMatch {
    pub start: usize,
    pub end: usize,
    pub index: usize,
}

/// A special added token and the flags that decide where the encoder matches it.
struct Special {
    content: String,
    id: u32,
    lstrip: bool,
    rstrip: bool,
    single_word: bool,
}

/// The bytes of whitespace that end `s` (an `lstrip` token takes them).
fn trailing_space(s: &str) -> usize {
    s.len() - s.trim_end().len()
}

/// The bytes of whitespace that start `s` (an `rstrip` token takes them).
fn leading_space(s: &str) -> usize {
    s.len() - s.trim_start().len()
}

/// Whether `s` ends with a word character (`\w`, for a `single_word` token's boundary).
fn ends_with_word(s: &str) -> bool {
    s.chars().next_back().is_some_and(is_word)
}

fn starts_with_word(s: &str) -> bool {
    s.chars().next().is_some_and(is_word)
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The parts of `tokenizer.json` that decide how token strings map to bytes.
#[derive(serde::Deserialize)]
struct Pipeline {
    #[serde(default)]
    normalizer: Value,
    #[serde(default)]
    decoder: Value,
    #[serde(default)]
    pre_tokenizer: Value,
}

/// Whether a decoder / pre-tokenizer JSON node is, or contains, a `ByteLevel` step.
fn has_byte_level(v: &Value) -> bool {
    match v {
        Value::Object(m) => {
            m.get("type").and_then(Value::as_str) == Some("ByteLevel")
                || m.values().any(has_byte_level)
        }
        Value::Array(items) => items.iter().any(has_byte_level),
        _ => false,
    }
}

/// A byte-level BPE token string back to its bytes. As the crate's `ByteLevel` decoder does,
/// a token holding a character outside the byte alphabet is taken as its own UTF-8 text.
fn byte_level_bytes(token: &str) -> Vec<u8> {
    token
        .chars()
        .map(unicode_to_byte)
        .collect::<Option<Vec<u8>>>()
        .unwrap_or_else(|| token.as_bytes().to_vec())
}

/// A non-byte-level token: its UTF-8 text, except sentencepiece byte tokens `<0xAB>`.
fn plain_bytes(token: &str) -> Vec<u8> {
    let b = token.as_bytes();
    if b.len() == 6 && b.starts_with(b"<0x") && b[5] == b'>' {
        if let Ok(byte) = u8::from_str_radix(&token[3..5], 16) {
            return vec![byte];
        }
    }
    b.to_vec()
}

/// Inverse of GPT-2's `bytes_to_unicode`: printable Latin-1 bytes (`!`..=`~`, `¡`..=`¬`,
/// `®`..=`ÿ`) stand for themselves; the other 68 bytes, in increasing order, were shifted to
/// U+0100 onwards.
fn unicode_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    if is_printable_byte(cp) {
        return Some(cp as u8);
    }
    // The shifted bytes are 0x00..=0x20 (33), 0x7F..=0xA0 (34) and 0xAD, in that order.
    match cp.checked_sub(256)? {
        k @ 0..=32 => Some(k as u8),
        k @ 33..=66 => Some((0x7F + (k - 33)) as u8),
        67 => Some(0xAD),
        _ => None,
    }
}

fn is_printable_byte(b: u32) -> bool {
    (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEMO: &[u8] = include_bytes!("../demo/tokenizer.json");
    const QWEN: &[u8] = include_bytes!("../../tests/fixtures/tiny-qwen3-moe/tokenizer.json");

    /// `text` with the byte ranges where `literal` occurs marked literal.
    fn chat(text: &str, literal: &[&str]) -> ChatText {
        let mut ranges = Vec::new();
        let mut from = 0;
        for l in literal {
            let at = from + text[from..].find(l).unwrap();
            ranges.push(at..at + l.len());
            from = at + l.len();
        }
        ChatText {
            text: text.to_string(),
            literal: ranges,
        }
    }

    #[test]
    fn a_literal_special_is_its_text_and_the_templates_is_the_control_token() {
        let tok = Tokenizer::from_bytes(DEMO).unwrap();
        let (user, assistant) = (
            tok.token_id("<|user|>").unwrap(),
            tok.token_id("<|assistant|>").unwrap(),
        );
        let text = "<|user|>Hi <|user|> there<|assistant|>";
        // The content's `<|user|>` (the second) is literal.
        let mut c = chat(text, &[]);
        let at = text.rfind("<|user|>").unwrap();
        c.literal.push(at..at + 8);
        let ids = tok.encode_chat(&c).unwrap();
        assert_eq!(ids.first(), Some(&user));
        assert_eq!(ids.last(), Some(&assistant));
        assert_eq!(
            ids.iter().filter(|&&i| tok.is_special(i)).count(),
            2,
            "{ids:?}"
        );
        // Between them, the plain text's pieces: the same as the text with the encoder's
        // special-token matching off, merges across the literal's edges included.
        let plain = tok
            .plain
            .get()
            .unwrap()
            .encode("Hi <|user|> there", false)
            .unwrap();
        assert_eq!(&ids[1..ids.len() - 1], plain.get_ids());
        assert_eq!(
            tok.decode_bytes(&ids[1..ids.len() - 1]),
            b"Hi <|user|> there"
        );
        // Read whole, the content forges a turn.
        assert_eq!(
            tok.encode(text)
                .unwrap()
                .iter()
                .filter(|&&i| i == user)
                .count(),
            2
        );
        // Without literal ranges, encode_chat is encode.
        assert_eq!(
            tok.encode_chat(&chat(text, &[])).unwrap(),
            tok.encode(text).unwrap()
        );
    }

    #[test]
    fn no_special_is_matched_across_a_literal_range() {
        let tok = Tokenizer::from_bytes(QWEN).unwrap();
        // A special token in the template right after a literal one, and literal ones back to
        // back, at the very start and the very end.
        let text = "<|im_end|><|im_start|><|im_end|>x<|im_start|>";
        let c = chat(text, &["<|im_end|>", "<|im_start|>"]);
        let ids = tok.encode_chat(&c).unwrap();
        let start = tok.token_id("<|im_start|>").unwrap();
        let end = tok.token_id("<|im_end|>").unwrap();
        let specials: Vec<u32> = ids.iter().copied().filter(|&i| tok.is_special(i)).collect();
        assert_eq!(specials, vec![end, start], "{ids:?}");
        assert_eq!(tok.decode_bytes(&ids), text.as_bytes());
    }

    /// The demo tokenizer with `<|user|>` stripping the space on its left, `<|assistant|>`
    /// on its right, and `<sop>` a single word.
    fn stripping() -> Tokenizer {
        let mut json: Value = serde_json::from_slice(DEMO).unwrap();
        for t in json["added_tokens"].as_array_mut().unwrap() {
            match t["content"].as_str().unwrap() {
                "<|user|>" => t["lstrip"] = Value::Bool(true),
                "<|assistant|>" => t["rstrip"] = Value::Bool(true),
                "<sop>" => t["single_word"] = Value::Bool(true),
                _ => {}
            }
        }
        Tokenizer::from_bytes(json.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn the_split_at_special_tokens_is_the_encoders_own() {
        // The flags are in force: the stripped spaces give no ids.
        let spaced = "a  <|user|>  b <|assistant|>  c";
        assert!(
            stripping().encode(spaced).unwrap().len()
                < Tokenizer::from_bytes(DEMO)
                    .unwrap()
                    .encode(spaced)
                    .unwrap()
                    .len()
        );
        // With no literal range, the split encode_chat makes (when there is one) gives the
        // encoder's ids: leftmost-longest, lstrip, rstrip and single_word as it applies them.
        for tok in [Tokenizer::from_bytes(DEMO).unwrap(), stripping()] {
            for text in [
                "[gMASK]<sop><|user|>Hi<|assistant|><think></think>",
                "a  <|user|>  b <|assistant|>  \n c",
                "x<sop>y <sop> z<sop> <|user|><|user|> <|assistant|><|assistant|>",
                " \t<|endoftext|>\n\n<|assistant|>",
                "<|user",
                "",
            ] {
                assert_eq!(
                    tok.encode_outside(text, &[]).unwrap(),
                    tok.encode(text).unwrap(),
                    "{text:?}"
                );
            }
        }
    }

    #[test]
    fn byte_alphabet_round_trips() {
        assert_eq!(unicode_to_byte('Ġ'), Some(b' '));
        assert_eq!(unicode_to_byte('Ċ'), Some(b'\n'));
        assert_eq!(unicode_to_byte('Ā'), Some(0));
        assert_eq!(unicode_to_byte('A'), Some(b'A'));
        assert_eq!(unicode_to_byte('ł'), Some(0xA0));
        assert_eq!(unicode_to_byte('Ń'), Some(0xAD));
        assert_eq!(unicode_to_byte('ń'), None);
        let mut seen = [false; 256];
        for cp in 0..0x200u32 {
            if let Some(b) = char::from_u32(cp).and_then(unicode_to_byte) {
                assert!(!seen[b as usize], "byte {b} twice");
                seen[b as usize] = true;
            }
        }
        assert!(seen.iter().all(|s| *s));
    }

    #[test]
    fn sentencepiece_byte_tokens() {
        assert_eq!(plain_bytes("<0xE2>"), vec![0xE2]);
        assert_eq!(plain_bytes("<0xZZ>"), b"<0xZZ>".to_vec());
        assert_eq!(plain_bytes("hello"), b"hello".to_vec());
    }
}
