//! `pattern` and `format` as grammar: a regular expression (regex-syntax's parse, so Rust
//! syntax, which agrees with ECMA-262 on the common forms; `\d`/`\w` are Unicode classes)
//! to GBNF over the *JSON-escaped* text of a string, so the grammar checks the decoded
//! string while the model writes it quoted.
//!
//! A character is written the way serde_json (and every JSON encoder by default) writes it:
//! raw, except `"` and `\` (`\"`, `\\`) and control characters (`\n`-style short escapes or
//! `\u00XX`). `\uXXXX` for an ordinary character is not accepted inside a pattern: the
//! grammar could not tell which character it decodes to without a rule per code point.
//!
//! JSON Schema patterns are searches, not whole matches: a branch not anchored with `^`
//! (or `$`) may have any text before (after) it. Anchors anywhere else and other look-arounds
//! (`\b`) cannot be bounded here and are refused as [`Unsupported`].

use std::collections::HashMap;
use std::fmt::Write;

use regex_syntax::hir::{Class, Hir, HirKind, Look};

/// Largest `{n,m}` count copied out.
const MAX_COUNT: u32 = 1000;
/// Largest GBNF text one pattern may become.
const MAX_TEXT: usize = 256 << 10;

/// Why a pattern cannot become grammar: `Invalid` is the request's fault (400), and
/// `Unsupported` a construct this translation does not bound (a warning, or 400 in strict
/// mode).
#[derive(Debug)]
pub enum PatternError {
    Invalid(String),
    Unsupported(String),
}

/// Translates patterns, sharing a rule per distinct character class.
#[derive(Default)]
pub struct Patterns {
    classes: HashMap<Vec<(u32, u32)>, String>,
    /// Rules written for classes (appended to the grammar).
    pub rules: String,
}

/// A built-in `format` as an anchored pattern; `None` for a format not enforced.
pub fn format_pattern(name: &str) -> Option<&'static str> {
    Some(match name {
        "date" => r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$",
        "time" => {
            r"^([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]+)?([zZ]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"
        }
        "date-time" => {
            r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt]([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]+)?([zZ]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"
        }
        "uuid" => r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
        "email" => {
            r"^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$"
        }
        "uri" => r"^[A-Za-z][A-Za-z0-9+.\-]*:[^\x00-\x20<>\x22\\^`{|}]*$",
        "ipv4" => {
            r"^((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])$"
        }
        _ => return None,
    })
}

impl Patterns {
    /// GBNF for the content of a JSON string (between its quotes) whose decoded text the
    /// pattern finds a match in.
    pub fn string_content(&mut self, pattern: &str) -> Result<String, PatternError> {
        let hir = regex_syntax::ParserBuilder::new()
            .nest_limit(64)
            .build()
            .parse(pattern)
            .map_err(|e| PatternError::Invalid(format!("`{pattern}` is not a valid regex: {e}")))?;
        let mut branches = Vec::new();
        top_branches(&hir, &mut branches);
        let mut alts = Vec::new();
        for b in branches {
            let parts: Vec<&Hir> = match b.kind() {
                HirKind::Concat(v) => v.iter().collect(),
                _ => vec![b],
            };
            let mut lo = 0;
            let mut hi = parts.len();
            let mut start = false;
            let mut end = false;
            while lo < hi && matches!(parts[lo].kind(), HirKind::Look(Look::Start)) {
                start = true;
                lo += 1;
            }
            while hi > lo && matches!(parts[hi - 1].kind(), HirKind::Look(Look::End)) {
                end = true;
                hi -= 1;
            }
            let mut out = String::new();
            if !start {
                out.push_str("char* ");
            }
            for p in &parts[lo..hi] {
                self.node(p, &mut out)?;
                out.push(' ');
                if out.len() + self.rules.len() > MAX_TEXT {
                    return Err(PatternError::Invalid(format!(
                        "`{pattern}` expands past {MAX_TEXT} bytes of grammar"
                    )));
                }
            }
            if !end {
                out.push_str("char*");
            }
            if out.trim().is_empty() {
                out = "\"\"".into();
            }
            alts.push(out);
        }
        Ok(format!("( {} )", alts.join(" | ")))
    }

    fn node(&mut self, h: &Hir, out: &mut String) -> Result<(), PatternError> {
        match h.kind() {
            HirKind::Empty => out.push_str("\"\""),
            HirKind::Literal(l) => {
                let text = std::str::from_utf8(&l.0)
                    .map_err(|_| PatternError::Unsupported("a non-UTF-8 literal".into()))?;
                out.push_str("( ");
                for ch in text.chars() {
                    out.push_str(&char_expr(ch));
                    out.push(' ');
                }
                out.push(')');
            }
            HirKind::Class(Class::Unicode(c)) => {
                let ranges: Vec<(u32, u32)> = c
                    .ranges()
                    .iter()
                    .map(|r| (r.start() as u32, r.end() as u32))
                    .collect();
                out.push_str(&self.class(ranges));
            }
            HirKind::Class(Class::Bytes(_)) => {
                return Err(PatternError::Unsupported("a byte class".into()))
            }
            HirKind::Look(l) => {
                return Err(PatternError::Unsupported(format!(
                    "the assertion {l:?} inside the pattern (only a leading `^` and a trailing `$` are bounded)"
                )))
            }
            HirKind::Repetition(r) => {
                if r.min > MAX_COUNT || r.max.is_some_and(|m| m > MAX_COUNT) {
                    return Err(PatternError::Invalid(format!(
                        "a repetition count past {MAX_COUNT}"
                    )));
                }
                out.push_str("( ");
                self.node(&r.sub, out)?;
                match r.max {
                    None => {
                        let _ = write!(out, " ){{{},}}", r.min);
                    }
                    Some(m) => {
                        let _ = write!(out, " ){{{},{m}}}", r.min);
                    }
                }
            }
            HirKind::Capture(c) => self.node(&c.sub, out)?,
            HirKind::Concat(v) => {
                out.push_str("( ");
                for x in v {
                    self.node(x, out)?;
                    out.push(' ');
                }
                out.push(')');
            }
            HirKind::Alternation(v) => {
                out.push_str("( ");
                for (i, x) in v.iter().enumerate() {
                    if i > 0 {
                        out.push_str(" | ");
                    }
                    self.node(x, out)?;
                }
                out.push_str(" )");
            }
        }
        Ok(())
    }

    /// A rule for one character class, as JSON-escaped text.
    fn class(&mut self, ranges: Vec<(u32, u32)>) -> String {
        if let Some(r) = self.classes.get(&ranges) {
            return r.clone();
        }
        let name = format!("rx{}", self.classes.len());
        let mut alts = Vec::new();
        // The characters written raw: the class less `"`, `\` and the controls.
        let mut raw = String::new();
        for &(lo, hi) in &ranges {
            for (a, b) in minus_specials(lo, hi) {
                let _ = write!(raw, "\\U{a:08X}-\\U{b:08X}");
            }
        }
        if !raw.is_empty() {
            alts.push(format!("[{raw}]"));
        }
        let has = |c: u32| ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi);
        let controls: Vec<u32> = (0..0x20).filter(|&c| has(c)).collect();
        if controls.len() == 0x20 {
            alts.push(r#""\\" [bfnrt]"#.into());
            alts.push(r#""\\u00" [01] [0-9a-fA-F]"#.into());
        } else {
            for c in controls {
                alts.push(char_expr(char::from_u32(c).expect("a control character")));
            }
        }
        for c in ['"', '\\'] {
            if has(c as u32) {
                alts.push(char_expr(c));
            }
        }
        let body = if alts.is_empty() {
            // An empty class matches nothing: a rule with no way to finish would be refused
            // by the compiler, so a literal no JSON string contains stands in.
            "\"\\x00\"".to_string()
        } else {
            alts.join(" | ")
        };
        let _ = writeln!(self.rules, "{name} ::= {body}");
        self.classes.insert(ranges, name.clone());
        name
    }
}

/// The top-level alternatives, through capture groups (`(^a|b$)` anchors each branch).
fn top_branches<'h>(h: &'h Hir, out: &mut Vec<&'h Hir>) {
    match h.kind() {
        HirKind::Alternation(v) => v.iter().for_each(|x| top_branches(x, out)),
        HirKind::Capture(c) if matches!(c.sub.kind(), HirKind::Alternation(_)) => {
            top_branches(&c.sub, out)
        }
        _ => out.push(h),
    }
}

/// `lo..=hi` less `"`, `\` and 0x00..=0x1F.
fn minus_specials(lo: u32, hi: u32) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let mut cur = lo.max(0x20);
    for cut in [0x22u32, 0x5C] {
        if cur > hi {
            break;
        }
        if cut >= cur && cut <= hi {
            if cut > cur {
                out.push((cur, cut - 1));
            }
            cur = cut + 1;
        }
    }
    if cur <= hi {
        out.push((cur, hi));
    }
    out
}

/// One decoded character as the JSON text that writes it.
fn char_expr(ch: char) -> String {
    let c = ch as u32;
    let short = match ch {
        '"' => Some("\"\\\\\\\"\""),
        '\\' => Some("\"\\\\\\\\\""),
        '\u{8}' => Some("\"\\\\b\""),
        '\u{c}' => Some("\"\\\\f\""),
        '\n' => Some("\"\\\\n\""),
        '\r' => Some("\"\\\\r\""),
        '\t' => Some("\"\\\\t\""),
        _ => None,
    };
    if c < 0x20 {
        let lo = c & 0xF;
        let hex = format!("\"\\\\u00{}\" [{:x}{:X}]", c >> 4, lo, lo);
        return match short {
            Some(s) => format!("( {s} | {hex} )"),
            None => format!("( {hex} )"),
        };
    }
    if let Some(s) = short {
        return s.to_string();
    }
    format!("[\\U{c:08X}]")
}
