//! JSON Schema to GBNF, the coverage of the structured-output libraries (llguidance's):
//! `type` (a name or a list, `null` included), `properties` / `required` /
//! `additionalProperties` (true, false or a schema), `items` / `prefixItems` /
//! `additionalItems` with `minItems` / `maxItems`, `minLength` / `maxLength`, `pattern`,
//! `format` (date-time, date, time, uuid, email, uri, ipv4), `minimum` / `maximum` and their
//! exclusive forms (draft 4's booleans too), `enum` / `const`, `anyOf` / `oneOf` / `allOf`,
//! `$ref` into `$defs` / `definitions` or any local JSON pointer (recursion included: a ref is
//! a rule), `uniqueItems` where it decides nothing (at most one item). Annotations (`title`,
//! `description`, `default`, `examples`, ...) are ignored.
//!
//! The route: our own compiler extended, not the llguidance crate. Our grammar engine (one
//! byte-level pushdown automaton for GBNF and schemas alike) already carries the guarantees
//! the server relies on (linear compile, bounded nesting, the forced-span drafts, the budget's
//! shortest completion) and a second engine for schemas would duplicate each of them; the
//! pieces llguidance adds are each small here: numeric ranges as digit automata
//! ([`numbers`]), patterns through regex-syntax (already in the build, [`regex`]), `allOf` by
//! keyword merging ([`merge`]), refs as rules.
//!
//! Semantics a grammar cannot hold, and what happens to them:
//! - `oneOf` is `anyOf` (exclusivity is not context-free);
//! - properties are written in the schema's order, extra ones after them, and only where
//!   `additionalProperties` is given (true or a schema; or the schema has no `properties`):
//!   a model left free wanders into keys of its own, and what it writes validates anyway;
//! - `multipleOf`, `not`, `patternProperties`, `dependencies`, `minProperties` /
//!   `maxProperties`, `contains`, `uniqueItems` over more than one item, `propertyNames`,
//!   `if`/`then`/`else`, other formats and a pattern with a length are *relaxed*: named in a
//!   warning, the value left free in that respect, as OpenAI's non-strict mode accepts them;
//!   with `strict` each is an error naming the keyword and its schema path.
//!
//! Output is JSON with at most one blank or newline between tokens (a model left free to
//! pad spends its tokens on whitespace) and nothing after the top-level value, so a
//! generation ends when the value does. Compact JSON (serde_json's) is always accepted.

mod merge;
mod numbers;
mod objects;
mod regex;
mod value;

use std::collections::{HashMap, HashSet};
use std::fmt::Write;

use super::GrammarError;
use numbers::{Bound, Dec};
pub use value::Json;

/// GBNF for the JSON primitives. Every value they admit is one a client's parser keeps:
/// - an integer has at most 15 digits, so it is within 2^53 (9007199254740992) and exact as
///   a JavaScript number; no `-0` (JSON parsers read it as a float);
/// - a number has at most 15 integer and 16 fraction digits and an exponent of at most 2
///   digits, so its magnitude is below 1e114 (and 0 or at least 1e-115): a finite f64 (3
///   exponent digits let a model write `2102E+406`, which serde_json and others refuse);
/// - a string's `\u` escapes are scalar values or surrogate pairs, never a lone surrogate
///   (serde_json refuses `"\ud800"`).
///
/// Bounded digit runs also keep a number from running forever.
const PRIMITIVES: &str = r#"ws ::= ( " " | "\n" )?
string ::= "\"" char* "\""
char ::= [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" uesc )
uesc ::= [0-9a-cA-Ce-fE-F] hex{3} | [dD] [0-7] hex{2} |
    [dD] [89abAB] hex{2} "\\u" [dD] [c-fC-F] hex{2}
hex ::= [0-9a-fA-F]
integer ::= "0" | "-"? [1-9] [0-9]{0,14}
number ::= "-"? ( "0" | [1-9] [0-9]{0,14} ) ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?
boolean ::= "true" | "false"
null ::= "null"
value ::= object | array | string | number | boolean | null
object ::= "{" ws ( string ws ":" ws value ( ws "," ws string ws ":" ws value )* )? ws "}"
array ::= "[" ws ( value ( ws "," ws value )* )? ws "]"
"#;

/// A compiled schema: the GBNF text and a line per keyword relaxed.
#[derive(Debug)]
pub struct Compiled {
    pub gbnf: String,
    pub warnings: Vec<String>,
}

/// A JSON Schema's text to GBNF text (start rule `root`), relaxing what cannot be enforced.
pub fn to_gbnf(text: &str) -> Result<String, GrammarError> {
    compile(text, false).map(|c| c.gbnf)
}

/// A JSON Schema's text to GBNF; `strict`: a keyword that cannot be enforced is an error
/// naming it and its schema path, rather than a warning.
pub fn compile(text: &str, strict: bool) -> Result<Compiled, GrammarError> {
    let schema: Json = serde_json::from_str(text).map_err(|e| {
        let (line, col) = (e.line(), e.column());
        let offset = text
            .split_inclusive('\n')
            .take(line.saturating_sub(1))
            .map(str::len)
            .sum::<usize>()
            + col.saturating_sub(1);
        GrammarError {
            line,
            col,
            offset,
            msg: format!("expected a JSON Schema document: {e}"),
        }
    })?;
    let mut c = Gen {
        root: &schema,
        rules: String::new(),
        n: 0,
        refs: HashMap::new(),
        warnings: Vec::new(),
        warned: HashSet::new(),
        strict,
        patterns: regex::Patterns::default(),
        merges: 0,
    };
    let root = c
        .schema(&schema, "$")?
        .ok_or_else(|| bad("$", "the schema allows no value".into()))?;
    Ok(Compiled {
        gbnf: format!(
            "root ::= {root}\n{PRIMITIVES}{}{}",
            c.rules, c.patterns.rules
        ),
        warnings: c.warnings,
    })
}

struct Gen<'a> {
    root: &'a Json,
    rules: String,
    n: usize,
    /// `$ref` text to its rule's name (written once, so recursion is a reference).
    refs: HashMap<String, String>,
    warnings: Vec<String>,
    warned: HashSet<String>,
    strict: bool,
    patterns: regex::Patterns,
    merges: usize,
}

/// GBNF literal for arbitrary text.
fn lit(s: &str) -> String {
    let mut out = String::from("\"");
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c == '\u{7F}' => {
                let _ = write!(out, "\\x{:02X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// An error about the schema at `path` (`$.properties.a.pattern` style).
fn bad(path: &str, msg: String) -> GrammarError {
    GrammarError {
        line: 1,
        col: 1,
        offset: 0,
        msg: format!("at schema path `{path}`: {msg}"),
    }
}

/// Keywords that say nothing about the value.
const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "$schema",
    "$id",
    "id",
    "$comment",
    "$anchor",
    "default",
    "examples",
    "readOnly",
    "writeOnly",
    "deprecated",
    "$defs",
    "definitions",
    "discriminator",
    "nullable",
    "contentEncoding",
    "contentMediaType",
];

/// Keywords this compiler enforces.
const ENFORCED: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "prefixItems",
    "additionalItems",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
];

const STRING_KW: &[&str] = &["minLength", "maxLength", "pattern", "format"];
const NUMBER_KW: &[&str] = &[
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
];
const OBJECT_KW: &[&str] = &[
    "properties",
    "required",
    "additionalProperties",
    "minProperties",
    "maxProperties",
    "patternProperties",
    "dependencies",
    "dependentRequired",
    "dependentSchemas",
    "propertyNames",
    "unevaluatedProperties",
];
const ARRAY_KW: &[&str] = &[
    "items",
    "prefixItems",
    "additionalItems",
    "minItems",
    "maxItems",
    "uniqueItems",
    "contains",
    "minContains",
    "maxContains",
    "unevaluatedItems",
];

/// The largest length or count a grammar copies out.
const MAX_COUNT: u64 = 4096;
/// `$ref`s followed through `allOf` merges, nested.
const MAX_REF_CHAIN: usize = 32;

/// The JSON type name of a value (`integer` for a whole number).
fn type_of(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "boolean",
        Json::Num(n) if n.is_i64() || n.is_u64() => "integer",
        Json::Num(_) => "number",
        Json::Str(_) => "string",
        Json::Arr(_) => "array",
        Json::Obj(_) => "object",
    }
}

fn without(s: &Json, keys: &[&str]) -> Json {
    match s {
        Json::Obj(m) => Json::Obj(
            m.iter()
                .filter(|(k, _)| !keys.contains(&k.as_str()))
                .cloned()
                .collect(),
        ),
        x => x.clone(),
    }
}

fn has_any(s: &Json, keys: &[&str]) -> bool {
    keys.iter().any(|k| s.get(k).is_some())
}

/// `$.a.b` for `#/a/b`.
fn ref_path(r: &str) -> String {
    let mut p = String::from("$");
    for part in r
        .trim_start_matches('#')
        .split('/')
        .filter(|s| !s.is_empty())
    {
        p.push('.');
        p.push_str(part);
    }
    p
}

impl Gen<'_> {
    fn rule(&mut self, body: String) -> String {
        self.n += 1;
        let name = format!("s{}", self.n);
        let _ = writeln!(self.rules, "{name} ::= {body}");
        name
    }

    /// `keyword` at `path` cannot be enforced: a warning (the value is left free in that
    /// respect), or in strict mode an error naming both.
    fn relax(&mut self, path: &str, keyword: &str, why: &str) -> Result<(), GrammarError> {
        let at = format!("{path}.{keyword}");
        if self.strict {
            return Err(bad(
                &at,
                format!(
                    "`{keyword}` cannot be enforced by the grammar ({why}); strict mode refuses it"
                ),
            ));
        }
        if self.warned.insert(at.clone()) {
            self.warnings
                .push(format!("{at}: `{keyword}` not enforced ({why})"));
        }
        Ok(())
    }

    fn count(s: &Json, key: &str, path: &str) -> Result<Option<u64>, GrammarError> {
        match s.get(key) {
            None => Ok(None),
            Some(Json::Num(n)) => match n.as_u64().or_else(|| {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && *f >= 0.0)
                    .map(|f| f as u64)
            }) {
                Some(v) => Ok(Some(v)),
                None => Err(bad(
                    &format!("{path}.{key}"),
                    format!("`{key}` must be a non-negative integer"),
                )),
            },
            Some(_) => Err(bad(
                &format!("{path}.{key}"),
                format!("`{key}` must be a non-negative integer"),
            )),
        }
    }

    /// An expression matching the values `s` allows; `None` when it allows none.
    fn schema(&mut self, s: &Json, path: &str) -> Result<Option<String>, GrammarError> {
        match s {
            Json::Bool(true) => return Ok(Some("value".into())),
            Json::Bool(false) => return Ok(None),
            Json::Obj(_) => {}
            _ => return Err(bad(path, "a schema must be an object or a boolean".into())),
        }
        let s = merge::normalize(s);
        if let Some(r) = s.get("$ref") {
            let Json::Str(r) = r else {
                return Err(bad(
                    &format!("{path}.$ref"),
                    "`$ref` must be a string".into(),
                ));
            };
            let mut keys = ANNOTATIONS.to_vec();
            keys.push("$ref");
            if let Json::Obj(rest) = without(&s, &keys) {
                if rest.is_empty() {
                    return self.reference(r, path).map(Some);
                }
            }
        }
        if s.get("allOf").is_some() || s.get("$ref").is_some() {
            let merged = self.all_of(&s, path, 0)?;
            return self.schema_merged(&merged, path);
        }
        self.schema_merged(&s, path)
    }

    /// The rule for `$ref` `r`, written once.
    fn reference(&mut self, r: &str, path: &str) -> Result<String, GrammarError> {
        if let Some(name) = self.refs.get(r) {
            return Ok(name.clone());
        }
        let root = self.root;
        let target = merge::resolve(root, r).ok_or_else(|| {
            bad(
                &format!("{path}.$ref"),
                format!(
                    "`$ref` `{r}` points nowhere in this schema (only local refs are followed)"
                ),
            )
        })?;
        self.n += 1;
        let name = format!("ref{}", self.n);
        self.refs.insert(r.to_string(), name.clone());
        let body = self.schema(target, &ref_path(r))?.ok_or_else(|| {
            bad(
                &format!("{path}.$ref"),
                format!("`$ref` `{r}` allows no value"),
            )
        })?;
        let _ = writeln!(self.rules, "{name} ::= {body}");
        Ok(name)
    }

    /// `s` with its `allOf` (and a `$ref` beside other keywords) merged into one schema.
    fn all_of(&mut self, s: &Json, path: &str, depth: usize) -> Result<Json, GrammarError> {
        if depth > MAX_REF_CHAIN {
            return Err(bad(
                path,
                format!("`allOf` / `$ref` nest past {MAX_REF_CHAIN} levels (a cycle?)"),
            ));
        }
        let mut parts = Vec::new();
        if let Some(all) = s.get("allOf") {
            let Json::Arr(v) = all else {
                return Err(bad(
                    &format!("{path}.allOf"),
                    "`allOf` must be an array".into(),
                ));
            };
            parts.extend(v.iter().cloned());
        }
        if let Some(Json::Str(r)) = s.get("$ref") {
            let root = self.root;
            let target = merge::resolve(root, r).ok_or_else(|| {
                bad(
                    &format!("{path}.$ref"),
                    format!(
                        "`$ref` `{r}` points nowhere in this schema (only local refs are followed)"
                    ),
                )
            })?;
            parts.push(target.clone());
        }
        let mut acc = without(s, &["allOf", "$ref"]);
        for p in parts {
            let p = merge::normalize(&p);
            let p = if p.get("allOf").is_some() || p.get("$ref").is_some() {
                self.all_of(&p, path, depth + 1)?
            } else {
                p
            };
            self.merges += 1;
            if self.merges > merge::MAX_MERGES {
                return Err(bad(
                    path,
                    format!("`allOf` multiplies out past {} merges", merge::MAX_MERGES),
                ));
            }
            let mut relaxed = Vec::new();
            acc = merge::merge(&acc, &p, &mut relaxed);
            for k in relaxed {
                self.relax(path, k, "two different values under `allOf`")?;
            }
        }
        Ok(acc)
    }

    /// [`Self::schema`] past `$ref` and `allOf`.
    fn schema_merged(&mut self, s: &Json, path: &str) -> Result<Option<String>, GrammarError> {
        let m = match s {
            Json::Obj(m) => m,
            other => return self.schema(other, path),
        };
        for (k, _) in m {
            if !ENFORCED.contains(&k.as_str()) && !ANNOTATIONS.contains(&k.as_str()) {
                self.relax(path, k, "not a keyword the grammar enforces")?;
            }
        }
        let types = self.types(s, path)?;
        if let Some(v) = s.get("const") {
            return Ok(types
                .iter()
                .any(|t| *t == type_of(v) || (*t == "number" && type_of(v) == "integer"))
                .then(|| lit(&v.to_text())));
        }
        if let Some(e) = s.get("enum") {
            let Json::Arr(vals) = e else {
                return Err(bad(
                    &format!("{path}.enum"),
                    "`enum` must be an array".into(),
                ));
            };
            let alts: Vec<String> = vals
                .iter()
                .filter(|v| {
                    types
                        .iter()
                        .any(|t| *t == type_of(v) || (*t == "number" && type_of(v) == "integer"))
                })
                .map(|v| lit(&v.to_text()))
                .collect();
            return Ok((!alts.is_empty()).then(|| format!("( {} )", alts.join(" | "))));
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(list) = s.get(key) {
                let Json::Arr(v) = list else {
                    return Err(bad(
                        &format!("{path}.{key}"),
                        format!("`{key}` must be an array of schemas"),
                    ));
                };
                let mut keys = ANNOTATIONS.to_vec();
                keys.push(key);
                let rest = without(s, &keys);
                let plain = matches!(&rest, Json::Obj(m) if m.is_empty());
                let mut alts = Vec::new();
                for (i, sub) in v.iter().enumerate() {
                    let sub_path = format!("{path}.{key}[{i}]");
                    let branch = if plain {
                        self.schema(sub, &sub_path)?
                    } else {
                        let both = Json::Obj(vec![(
                            "allOf".into(),
                            Json::Arr(vec![rest.clone(), sub.clone()]),
                        )]);
                        self.schema(&both, &sub_path)?
                    };
                    alts.extend(branch);
                }
                if alts.is_empty() {
                    return Ok(None);
                }
                return Ok(Some(format!("( {} )", alts.join(" | "))));
            }
        }
        let explicit = s.get("type").is_some();
        let any_kw = [STRING_KW, NUMBER_KW, OBJECT_KW, ARRAY_KW]
            .iter()
            .any(|kws| has_any(s, kws));
        if !explicit && !any_kw {
            return Ok(Some("value".into()));
        }
        let mut alts = Vec::new();
        for t in &types {
            // `integer` beside `number` adds nothing.
            if *t == "integer" && types.contains(&"number") {
                continue;
            }
            let e = match *t {
                "string" => self.string(s, path)?,
                "number" | "integer" => self.number(s, path, *t == "integer")?,
                "boolean" => Some("boolean".into()),
                "null" => Some("null".into()),
                "object" => self.object(s, path)?,
                "array" => self.array(s, path)?,
                _ => unreachable!("types() checks the names"),
            };
            alts.extend(e);
        }
        Ok(match alts.len() {
            0 => None,
            1 => alts.pop(),
            _ => Some(format!("( {} )", alts.join(" | "))),
        })
    }

    /// The types a schema allows (every type when it names none).
    fn types(&self, s: &Json, path: &str) -> Result<Vec<&'static str>, GrammarError> {
        const ALL: [&str; 7] = [
            "null", "boolean", "object", "array", "string", "number", "integer",
        ];
        let name = |t: &str| -> Result<&'static str, GrammarError> {
            ALL.iter().copied().find(|a| *a == t).ok_or_else(|| {
                bad(
                    &format!("{path}.type"),
                    format!(
                        "unknown type `{t}` (expected object, array, string, number, integer, boolean or null)"
                    ),
                )
            })
        };
        match s.get("type") {
            None => Ok(ALL.to_vec()),
            Some(Json::Str(t)) => Ok(vec![name(t)?]),
            Some(Json::Arr(ts)) => {
                let mut v = Vec::new();
                for t in ts {
                    match t {
                        Json::Str(t) => v.push(name(t)?),
                        _ => {
                            return Err(bad(
                                &format!("{path}.type"),
                                "`type` entries must be strings".into(),
                            ))
                        }
                    }
                }
                Ok(v)
            }
            Some(_) => Err(bad(
                &format!("{path}.type"),
                "`type` must be a type name or a list of them".into(),
            )),
        }
    }

    fn bound(&mut self, s: &Json, key: &str, path: &str) -> Result<Option<Dec>, GrammarError> {
        match s.get(key) {
            None => Ok(None),
            Some(Json::Num(n)) => match Dec::parse(&n.to_string()) {
                Some(d) => Ok(Some(d)),
                None => {
                    self.relax(path, key, "a bound with more than 16 fraction digits")?;
                    Ok(None)
                }
            },
            Some(_) => Err(bad(
                &format!("{path}.{key}"),
                format!("`{key}` must be a number"),
            )),
        }
    }

    fn number(
        &mut self,
        s: &Json,
        path: &str,
        integer: bool,
    ) -> Result<Option<String>, GrammarError> {
        let min = self.bound(s, "minimum", path)?;
        let xmin = self.bound(s, "exclusiveMinimum", path)?;
        let max = self.bound(s, "maximum", path)?;
        let xmax = self.bound(s, "exclusiveMaximum", path)?;
        // The tighter of each pair; at a tie the exclusive one.
        let lo: Option<Bound> = match (min, xmin) {
            (Some(a), Some(b)) => Some(if b >= a { (b, true) } else { (a, false) }),
            (Some(a), None) => Some((a, false)),
            (None, Some(b)) => Some((b, true)),
            (None, None) => None,
        };
        let hi: Option<Bound> = match (max, xmax) {
            (Some(a), Some(b)) => Some(if b <= a { (b, true) } else { (a, false) }),
            (Some(a), None) => Some((a, false)),
            (None, Some(b)) => Some((b, true)),
            (None, None) => None,
        };
        if lo.is_none() && hi.is_none() {
            return Ok(Some(if integer { "integer" } else { "number" }.into()));
        }
        Ok(numbers::range(lo.as_ref(), hi.as_ref(), integer).map(|e| self.rule(e)))
    }

    fn string(&mut self, s: &Json, path: &str) -> Result<Option<String>, GrammarError> {
        let min = Self::count(s, "minLength", path)?;
        let mut max = Self::count(s, "maxLength", path)?;
        let mut pattern = match s.get("pattern") {
            None => None,
            Some(Json::Str(p)) => Some((p.clone(), "pattern")),
            Some(_) => {
                return Err(bad(
                    &format!("{path}.pattern"),
                    "`pattern` must be a string".into(),
                ))
            }
        };
        if let Some(f) = s.get("format") {
            let Json::Str(f) = f else {
                return Err(bad(
                    &format!("{path}.format"),
                    "`format` must be a string".into(),
                ));
            };
            match regex::format_pattern(f) {
                None => self.relax(
                    path,
                    "format",
                    &format!("the format `{f}` is not one the grammar knows"),
                )?,
                Some(_) if pattern.is_some() => {
                    self.relax(path, "format", "a `pattern` beside it is enforced instead")?
                }
                Some(p) => pattern = Some((p.to_string(), "format")),
            }
        }
        if let Some((p, kw)) = pattern {
            if min.is_some() || max.is_some() {
                let k = if min.is_some() {
                    "minLength"
                } else {
                    "maxLength"
                };
                self.relax(path, k, &format!("a length beside `{kw}`"))?;
            }
            match self.patterns.string_content(&p) {
                Ok(content) => return Ok(Some(self.rule(format!("\"\\\"\" {content} \"\\\"\"")))),
                Err(regex::PatternError::Invalid(m)) => {
                    return Err(bad(&format!("{path}.{kw}"), m))
                }
                Err(regex::PatternError::Unsupported(m)) => self.relax(path, kw, &m)?,
            }
            return Ok(Some("string".into()));
        }
        if min.is_none() && max.is_none() {
            return Ok(Some("string".into()));
        }
        let min = min.unwrap_or(0);
        if min > MAX_COUNT {
            return Err(bad(
                &format!("{path}.minLength"),
                format!("`minLength` past {MAX_COUNT} (the grammar copies each character out)"),
            ));
        }
        if max.is_some_and(|m| m > MAX_COUNT) {
            self.relax(path, "maxLength", &format!("past {MAX_COUNT}"))?;
            max = None;
        }
        if max.is_some_and(|m| m < min) {
            return Ok(None);
        }
        let rep = match max {
            Some(m) => format!("{{{min},{m}}}"),
            None => format!("{{{min},}}"),
        };
        Ok(Some(self.rule(format!("\"\\\"\" char{rep} \"\\\"\""))))
    }
}
