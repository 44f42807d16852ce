//! GBNF text (llama.cpp's grammar format) to a syntax tree.
//!
//! Rules are `name ::= alternatives`; a rule ends at a newline unless the newline is inside a
//! group or follows `|`. Terms: `"literal"` (escapes `\n \r \t \\ \" \[ \] \xHH \uHHHH
//! \UHHHHHHHH`), `[class]` with ranges and `^` negation, `.` (any character), `( group )`, rule
//! names, each optionally followed by `*`, `+`, `?` or `{m}`, `{m,}`, `{m,n}`. `#` starts a
//! comment to the end of the line.

use super::GrammarError;

/// One rule as written.
#[derive(Clone, Debug)]
pub struct RuleDef {
    pub name: String,
    /// Byte offset of the name in the text (errors about the rule point here).
    pub at: usize,
    pub alts: Vec<Vec<Term>>,
}

#[derive(Clone, Debug)]
pub enum Term {
    /// Code points, in order.
    Literal(Vec<u32>),
    /// Inclusive code point ranges; `negated` matches every code point outside them.
    Class {
        negated: bool,
        ranges: Vec<(u32, u32)>,
    },
    /// A reference to a rule, with its byte offset (for "undefined rule" errors).
    Ref {
        name: String,
        at: usize,
    },
    Group(Vec<Vec<Term>>),
    /// `min..=max` copies (`max` None: unbounded).
    Repeat {
        term: Box<Term>,
        min: u32,
        max: Option<u32>,
    },
}

/// The most copies `{m,n}` may ask for; each copy is compiled out, so a bound keeps a hostile
/// grammar from sizing a giant automaton.
pub const MAX_REPEAT: u32 = 1000;

/// The deepest a term may nest: groups inside groups, and repetition operators stacked on
/// one term (`"a"?*+`). The parser, the compiler and the tree's drop recurse once per level,
/// so an unbounded depth (a 4 MiB run of `(`) would overflow the stack; a JSON Schema's
/// grammar nests at most about 65 deep (its JSON is at most 128 deep).
pub const MAX_NESTING: usize = 128;

pub fn parse(text: &str) -> Result<Vec<RuleDef>, GrammarError> {
    let mut p = Parser {
        src: text,
        b: text.as_bytes(),
        pos: 0,
        depth: 0,
    };
    let mut rules = Vec::new();
    p.skip_space(true);
    while p.pos < p.b.len() {
        rules.push(p.rule()?);
        p.skip_space(true);
    }
    if rules.is_empty() {
        return Err(p.err(0, "a grammar with at least one rule (`root ::= ...`)"));
    }
    Ok(rules)
}

struct Parser<'a> {
    src: &'a str,
    b: &'a [u8],
    pos: usize,
    /// Groups open around the current position.
    depth: usize,
}

fn is_name_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-' || c == b'_'
}

impl Parser<'_> {
    fn err(&self, at: usize, expected: &str) -> GrammarError {
        GrammarError::at(self.src, at, format!("expected {expected}"))
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.pos).copied()
    }

    /// Skips blanks and comments; newlines too when `newlines` (inside groups, after `|`,
    /// between rules).
    fn skip_space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                b' ' | b'\t' => self.pos += 1,
                b'\r' | b'\n' if newlines => self.pos += 1,
                b'#' => {
                    while let Some(c) = self.peek() {
                        if c == b'\n' {
                            break;
                        }
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Option<(String, usize)> {
        let start = self.pos;
        while self.peek().is_some_and(is_name_byte) {
            self.pos += 1;
        }
        (self.pos > start).then(|| (self.src[start..self.pos].to_string(), start))
    }

    fn rule(&mut self) -> Result<RuleDef, GrammarError> {
        let (name, at) = self
            .name()
            .ok_or_else(|| self.err(self.pos, "a rule name ([A-Za-z0-9_-]+)"))?;
        self.skip_space(false);
        if !self.b[self.pos..].starts_with(b"::=") {
            return Err(self.err(self.pos, &format!("`::=` after the rule name `{name}`")));
        }
        self.pos += 3;
        self.skip_space(true);
        let alts = self.alternatives(false)?;
        match self.peek() {
            None | Some(b'\n') | Some(b'\r') => {}
            Some(_) => return Err(self.err(self.pos, "a term, `|`, or the end of the rule's line")),
        }
        Ok(RuleDef { name, at, alts })
    }

    /// `seq ( | seq )*`, stopping at `)` (nested) or the end of line (top level).
    fn alternatives(&mut self, nested: bool) -> Result<Vec<Vec<Term>>, GrammarError> {
        let mut alts = vec![self.sequence(nested)?];
        while self.peek() == Some(b'|') {
            self.pos += 1;
            self.skip_space(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(alts)
    }

    fn sequence(&mut self, nested: bool) -> Result<Vec<Term>, GrammarError> {
        let mut seq = Vec::new();
        while let Some(c) = self.peek() {
            let start = self.pos;
            let term = match c {
                b'"' => Term::Literal(self.literal()?),
                b'[' => self.class()?,
                b'.' => {
                    self.pos += 1;
                    Term::Class {
                        negated: true,
                        ranges: Vec::new(),
                    }
                }
                b'(' => {
                    if self.depth >= MAX_NESTING {
                        return Err(
                            self.err(start, &format!("groups nested at most {MAX_NESTING} deep"))
                        );
                    }
                    self.pos += 1;
                    self.skip_space(true);
                    self.depth += 1;
                    let alts = self.alternatives(true);
                    self.depth -= 1;
                    let alts = alts?;
                    if self.peek() != Some(b')') {
                        let open = GrammarError::at(self.src, start, String::new());
                        return Err(self.err(
                            self.pos,
                            &format!(
                                "`)` closing the group opened at line {}, column {}",
                                open.line, open.col
                            ),
                        ));
                    }
                    self.pos += 1;
                    Term::Group(alts)
                }
                c if is_name_byte(c) => {
                    let (name, at) = self.name().expect("a name byte starts a name");
                    // `name ::=` here is the next rule, not a reference.
                    let save = self.pos;
                    self.skip_space(false);
                    if self.b[self.pos..].starts_with(b"::=") {
                        return Err(self.err(
                            at,
                            "a newline before the next rule (a rule ends at the end of its line)",
                        ));
                    }
                    self.pos = save;
                    Term::Ref { name, at }
                }
                _ => break,
            };
            let term = self.repetition(term)?;
            seq.push(term);
            self.skip_space(nested);
        }
        Ok(seq)
    }

    fn repetition(&mut self, mut term: Term) -> Result<Term, GrammarError> {
        let mut stacked = 0;
        loop {
            if matches!(self.peek(), Some(b'*' | b'+' | b'?' | b'{')) {
                stacked += 1;
                if self.depth + stacked > MAX_NESTING {
                    return Err(self.err(
                        self.pos,
                        &format!(
                            "terms nested at most {MAX_NESTING} deep (groups and repetitions together)"
                        ),
                    ));
                }
            }
            let (min, max) = match self.peek() {
                Some(b'*') => (0, None),
                Some(b'+') => (1, None),
                Some(b'?') => (0, Some(1)),
                Some(b'{') => {
                    self.pos += 1;
                    let (min, max) = self.braces()?;
                    term = Term::Repeat {
                        term: Box::new(term),
                        min,
                        max,
                    };
                    continue;
                }
                _ => return Ok(term),
            };
            self.pos += 1;
            term = Term::Repeat {
                term: Box::new(term),
                min,
                max,
            };
        }
    }

    fn number(&mut self) -> Result<u32, GrammarError> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        let digits = &self.src[start..self.pos];
        match digits.parse::<u32>() {
            Ok(n) if n <= MAX_REPEAT => Ok(n),
            _ => Err(self.err(start, &format!("a repetition count in 0..={MAX_REPEAT}"))),
        }
    }

    /// After `{`: `m}`, `m,}` or `m,n}`.
    fn braces(&mut self) -> Result<(u32, Option<u32>), GrammarError> {
        self.skip_space(false);
        let min = self.number()?;
        self.skip_space(false);
        let max = match self.peek() {
            Some(b'}') => Some(min),
            Some(b',') => {
                self.pos += 1;
                self.skip_space(false);
                if self.peek() == Some(b'}') {
                    None
                } else {
                    let at = self.pos;
                    let n = self.number()?;
                    if n < min {
                        return Err(self.err(at, &format!("a maximum of at least {min}")));
                    }
                    self.skip_space(false);
                    Some(n)
                }
            }
            _ => return Err(self.err(self.pos, "`}` or `,` in a repetition")),
        };
        if self.peek() != Some(b'}') {
            return Err(self.err(self.pos, "`}` closing the repetition"));
        }
        self.pos += 1;
        Ok((min, max))
    }

    /// One character of a literal or class body, escapes decoded.
    fn char_at(&mut self, what: &str) -> Result<u32, GrammarError> {
        let start = self.pos;
        let rest = &self.src[self.pos..];
        let Some(c) = rest.chars().next() else {
            return Err(self.err(start, &format!("{what}, not the end of the text")));
        };
        if c != '\\' {
            self.pos += c.len_utf8();
            return Ok(c as u32);
        }
        self.pos += 1;
        let Some(e) = self.peek() else {
            return Err(self.err(self.pos, "an escape after `\\`"));
        };
        self.pos += 1;
        let hex = |p: &mut Self, n: usize| -> Result<u32, GrammarError> {
            let s = p.src.get(p.pos..p.pos + n).unwrap_or("");
            let v = (s.len() == n && s.bytes().all(|c| c.is_ascii_hexdigit()))
                .then(|| u32::from_str_radix(s, 16).ok())
                .flatten();
            match v {
                Some(v) if char::from_u32(v).is_some() => {
                    p.pos += n;
                    Ok(v)
                }
                _ => Err(p.err(
                    p.pos,
                    &format!("{n} hex digits naming a Unicode scalar value"),
                )),
            }
        };
        Ok(match e {
            b'n' => '\n' as u32,
            b'r' => '\r' as u32,
            b't' => '\t' as u32,
            b'0' => 0,
            b'\\' | b'"' | b'[' | b']' | b'-' | b'^' => e as u32,
            b'x' => hex(self, 2)?,
            b'u' => hex(self, 4)?,
            b'U' => hex(self, 8)?,
            _ => return Err(self.err(
                start,
                "an escape: \\n \\r \\t \\0 \\\\ \\\" \\[ \\] \\- \\^ \\xHH \\uHHHH \\UHHHHHHHH",
            )),
        })
    }

    fn literal(&mut self) -> Result<Vec<u32>, GrammarError> {
        let open = self.pos;
        self.pos += 1;
        let mut out = Vec::new();
        loop {
            match self.peek() {
                None | Some(b'\n') => {
                    return Err(self.err(open, "a closing `\"` for the literal opened here"))
                }
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(_) => out.push(self.char_at("a character of the literal")?),
            }
        }
    }

    fn class(&mut self) -> Result<Term, GrammarError> {
        let open = self.pos;
        self.pos += 1;
        let negated = self.peek() == Some(b'^');
        if negated {
            self.pos += 1;
        }
        let mut ranges = Vec::new();
        loop {
            match self.peek() {
                None | Some(b'\n') => {
                    return Err(self.err(open, "a closing `]` for the class opened here"))
                }
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Term::Class { negated, ranges });
                }
                Some(_) => {
                    let lo_at = self.pos;
                    let lo = self.char_at("a character of the class")?;
                    let hi = if self.peek() == Some(b'-') && self.b.get(self.pos + 1) != Some(&b']')
                    {
                        self.pos += 1;
                        if matches!(self.peek(), None | Some(b'\n')) {
                            return Err(self.err(open, "a closing `]` for the class opened here"));
                        }
                        let hi = self.char_at("the end of a range")?;
                        if hi < lo {
                            return Err(self.err(lo_at, "a range whose end is not below its start"));
                        }
                        hi
                    } else {
                        lo
                    };
                    ranges.push((lo, hi));
                }
            }
        }
    }
}
