//! `tokenizer.json` loading, text to ids, and ids to **raw bytes**.
//!
//! Encoding goes through the `tokenizers` crate. Decoding does not: its `decode` returns a
//! lossy `String`, while the protocol must stream the exact bytes of every token, including a
//! token that is half of a UTF-8 sequence (CONTRACT.md §3). So at load we build one table,
//! id to bytes: byte-level BPE tokens are mapped back through the inverse of GPT-2's
//! `bytes_to_unicode`, added and special tokens give their content text.

use std::path::{Path, PathBuf};

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
