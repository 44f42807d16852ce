//! Grammar-constrained output: GBNF (llama.cpp's format) and a JSON-Schema subset compiled to
//! one byte-level pushdown automaton, a matcher state over it, and the token mask.
//!
//! Everything works on bytes: a character class becomes its UTF-8 byte-range sequences at
//! compile time, so a token that ends inside a character, or a character spread over several
//! tokens, needs no special case. Independent of the engine: the engine holds a
//! [`GrammarState`] per constrained request and asks it for a [`TokenTrie`] mask per token.

mod compile;
mod gbnf;
pub mod json_schema;
mod mask;
mod matcher;
mod utf8;

#[cfg(test)]
mod tests;

pub use mask::TokenTrie;
pub use matcher::GrammarState;

/// A grammar refused: where (line and column, 1-based, and byte offset) and what was expected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("grammar error at line {line}, column {col} (byte {offset}): {msg}")]
pub struct GrammarError {
    pub line: usize,
    pub col: usize,
    pub offset: usize,
    pub msg: String,
}

impl GrammarError {
    /// An error at byte `offset` of `src` (columns count characters).
    pub(crate) fn at(src: &str, offset: usize, msg: String) -> GrammarError {
        let offset = offset.min(src.len());
        let mut cut = offset;
        while !src.is_char_boundary(cut) {
            cut -= 1;
        }
        let before = &src[..cut];
        let line = before.matches('\n').count() + 1;
        let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        GrammarError {
            line,
            col,
            offset,
            msg,
        }
    }
}

/// One symbol of the flattened automaton.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sym {
    /// One byte in `lo..=hi`.
    Bytes(u8, u8),
    /// Expand the rule, then continue after this symbol.
    Rule(u32),
    /// The end of an alternative.
    End,
}

/// A compiled grammar: rules of alternatives, each alternative a run of `syms` ending in
/// [`Sym::End`].
#[derive(Debug)]
pub struct Grammar {
    pub(crate) syms: Vec<Sym>,
    /// Per rule, the start of each alternative in `syms`.
    pub(crate) alts: Vec<Vec<u32>>,
    pub(crate) root: u32,
}

impl Grammar {
    /// Compiles GBNF text; the start rule is `root`.
    pub fn from_gbnf(text: &str) -> Result<Grammar, GrammarError> {
        let defs = gbnf::parse(text)?;
        compile::compile(text, &defs)
    }

    /// Compiles a JSON Schema (the subset in [`json_schema`]).
    pub fn from_json_schema(text: &str) -> Result<Grammar, GrammarError> {
        let gbnf = json_schema::to_gbnf(text)?;
        Grammar::from_gbnf(&gbnf).map_err(|e| GrammarError {
            msg: format!("the schema's generated grammar is invalid: {e}"),
            line: 1,
            col: 1,
            offset: 0,
        })
    }

    /// A per-request grammar as upstream takes it: JSON Schema when the text starts with `{`
    /// (a GBNF grammar starts with a rule name), GBNF otherwise.
    pub fn from_request(text: &[u8]) -> Result<Grammar, GrammarError> {
        let text = std::str::from_utf8(text).map_err(|e| GrammarError {
            line: 1,
            col: 1,
            offset: e.valid_up_to(),
            msg: format!(
                "the grammar is not UTF-8 (invalid byte at offset {})",
                e.valid_up_to()
            ),
        })?;
        if text.trim_start().starts_with('{') {
            Grammar::from_json_schema(text)
        } else {
            Grammar::from_gbnf(text)
        }
    }
}
