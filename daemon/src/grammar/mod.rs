//! Grammar-constrained output: GBNF (llama.cpp's format) and a JSON-Schema subset compiled to
//! one byte-level pushdown automaton, a matcher state over it, and the token mask.
//!
//! Everything works on bytes: a character class becomes its UTF-8 byte-range sequences at
//! compile time, so a token that ends inside a character, or a character spread over several
//! tokens, needs no special case. Independent of the engine: the engine holds a
//! [`GrammarState`] per constrained request and asks it for a [`TokenTrie`] mask per token.

mod cache;
mod compile;
mod gbnf;
pub mod json_schema;
mod mask;
mod matcher;
mod shortest;
mod utf8;

#[cfg(test)]
mod schema_tests;
#[cfg(test)]
mod suite_tests;
#[cfg(test)]
mod tests;

pub use cache::SchemaCache;
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

impl Sym {
    const BYTES: u32 = 1 << 31;
    const END: u32 = u32::MAX;

    /// Four bytes rather than the enum's eight: a grammar is mostly symbols, and a queued
    /// request holds its grammar. Rule ids stay below 2^31 (compile bounds the symbols).
    fn pack(self) -> u32 {
        match self {
            Sym::Rule(r) => r,
            Sym::Bytes(lo, hi) => Sym::BYTES | (lo as u32) << 8 | hi as u32,
            Sym::End => Sym::END,
        }
    }

    fn unpack(v: u32) -> Sym {
        if v == Sym::END {
            Sym::End
        } else if v & Sym::BYTES != 0 {
            Sym::Bytes((v >> 8) as u8, v as u8)
        } else {
            Sym::Rule(v)
        }
    }
}

/// A compiled grammar: rules of alternatives, each alternative a run of symbols ending in
/// [`Sym::End`].
///
/// Flat arrays of packed symbols rather than a vector per rule: a big schema has a hundred
/// thousand small rules, and a vector each (24 bytes and an allocation) would double the
/// memory that each queued request holds.
#[derive(Debug)]
pub struct Grammar {
    /// [`Sym::pack`]ed.
    syms: Vec<u32>,
    /// The start in `syms` of every alternative, rule after rule.
    pub(crate) alt_starts: Vec<u32>,
    /// Rule `r`'s alternatives are `alt_starts[rule_alts[r]..rule_alts[r + 1]]`.
    pub(crate) rule_alts: Vec<u32>,
    pub(crate) root: u32,
    /// Per rule: the length of the shortest sentence it derives ([`shortest`]).
    pub(crate) min_len: Vec<u32>,
    /// Per rule: which alternative derives it.
    pub(crate) min_alt: Vec<u32>,
}

impl Grammar {
    /// Symbol `i`.
    pub(crate) fn sym(&self, i: u32) -> Sym {
        Sym::unpack(self.syms[i as usize])
    }

    /// The start in `syms` of each of rule `r`'s alternatives.
    pub(crate) fn alts(&self, r: u32) -> &[u32] {
        let r = r as usize;
        &self.alt_starts[self.rule_alts[r] as usize..self.rule_alts[r + 1] as usize]
    }

    /// The shortest length from symbol `i` to the end of its alternative.
    pub(crate) fn rest_len(&self, mut i: u32) -> u64 {
        let mut n = 0u64;
        loop {
            match self.sym(i) {
                Sym::End => return n,
                Sym::Bytes(..) => n += 1,
                Sym::Rule(r) => n += self.min_len[r as usize] as u64,
            }
            i += 1;
        }
    }

    /// Appends the shortest bytes from symbol `i` to the end of its alternative (each byte
    /// range's lowest byte). Iterative: a chain of rules may be deep.
    pub(crate) fn write_rest(&self, i: u32, out: &mut Vec<u8>) {
        let mut todo = vec![i];
        while let Some(mut i) = todo.pop() {
            loop {
                match self.sym(i) {
                    Sym::End => break,
                    Sym::Bytes(lo, _) => out.push(lo),
                    Sym::Rule(r) => {
                        todo.push(i + 1);
                        let k = self.min_alt[r as usize] as usize;
                        todo.push(self.alts(r)[k]);
                        break;
                    }
                }
                i += 1;
            }
        }
    }

    /// The memory the compiled grammar holds, in bytes.
    pub fn heap_bytes(&self) -> usize {
        (self.syms.capacity()
            + self.alt_starts.capacity()
            + self.rule_alts.capacity()
            + self.min_len.capacity()
            + self.min_alt.capacity())
            * 4
    }

    /// Compiles GBNF text; the start rule is `root`.
    pub fn from_gbnf(text: &str) -> Result<Grammar, GrammarError> {
        let defs = gbnf::parse(text)?;
        compile::compile(text, &defs)
    }

    /// Compiles a JSON Schema (the coverage in [`json_schema`]), relaxing what it cannot
    /// enforce.
    pub fn from_json_schema(text: &str) -> Result<Grammar, GrammarError> {
        Grammar::from_json_schema_checked(text, false).map(|(g, _)| g)
    }

    /// Compiles a JSON Schema; with the warnings for the keywords relaxed, or (`strict`)
    /// an error naming the first such keyword and its schema path.
    pub fn from_json_schema_checked(
        text: &str,
        strict: bool,
    ) -> Result<(Grammar, Vec<String>), GrammarError> {
        let c = json_schema::compile(text, strict)?;
        let g = Grammar::from_gbnf(&c.gbnf).map_err(|e| GrammarError {
            msg: format!("the schema cannot be compiled to a grammar: {}", e.msg),
            line: 1,
            col: 1,
            offset: 0,
        })?;
        Ok((g, c.warnings))
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
