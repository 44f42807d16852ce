//! A JSON-Schema subset to GBNF: `type` (object, array, string, number, integer, boolean,
//! null, or a list of them), `properties` (in the schema's order) with `required`, `items`
//! with `minItems` / `maxItems`, `minLength` / `maxLength` on strings, `enum`, `const`,
//! `anyOf` / `oneOf`, and `{}` / `true` for any JSON value. Annotations (`title`,
//! `description`, `$schema`, `default`, `examples`, `$id`, `$comment`) are ignored; any other
//! keyword is refused with its location, so a schema is never silently loosened.
//!
//! Output is JSON with at most one blank or newline between tokens (a model left free to
//! pad spends its tokens on whitespace) and nothing after the top-level value, so a
//! generation ends when the value does.

use std::collections::HashSet;
use std::fmt::Write;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use super::GrammarError;

/// A JSON value that keeps object members in document order (serde_json's map sorts them
/// unless its `preserve_order` feature is on, and properties are generated in order).
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Num(serde_json::Number),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

/// Object keys checked for duplicates by a scan; past this many, by a set.
const SCAN_KEYS: usize = 8;

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Json, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Json;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_unit<E>(self) -> Result<Json, E> {
                Ok(Json::Null)
            }
            fn visit_bool<E>(self, b: bool) -> Result<Json, E> {
                Ok(Json::Bool(b))
            }
            fn visit_i64<E>(self, n: i64) -> Result<Json, E> {
                Ok(Json::Num(n.into()))
            }
            fn visit_u64<E>(self, n: u64) -> Result<Json, E> {
                Ok(Json::Num(n.into()))
            }
            fn visit_f64<E: de::Error>(self, n: f64) -> Result<Json, E> {
                serde_json::Number::from_f64(n)
                    .map(Json::Num)
                    .ok_or_else(|| E::custom("a finite number"))
            }
            fn visit_str<E>(self, s: &str) -> Result<Json, E> {
                Ok(Json::Str(s.to_string()))
            }
            fn visit_string<E>(self, s: String) -> Result<Json, E> {
                Ok(Json::Str(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Json, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = a.next_element()? {
                    v.push(x);
                }
                Ok(Json::Arr(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Json, A::Error> {
                let mut v: Vec<(String, Json)> = Vec::new();
                // A schema keyword object has a handful of keys, which a scan checks fastest;
                // `properties` may have 100k, where a scan per key is quadratic (20 s).
                let mut seen: HashSet<String> = HashSet::new();
                while let Some((k, x)) = a.next_entry::<String, Json>()? {
                    let dup = if v.len() < SCAN_KEYS {
                        v.iter().any(|(key, _)| *key == k)
                    } else {
                        if seen.is_empty() {
                            seen.extend(v.iter().map(|(key, _)| key.clone()));
                        }
                        !seen.insert(k.clone())
                    };
                    if dup {
                        return Err(de::Error::custom(format!("duplicate key `{k}`")));
                    }
                    v.push((k, x));
                }
                Ok(Json::Obj(v))
            }
        }
        d.deserialize_any(V)
    }
}

impl Json {
    fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(m) => m.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// Compact JSON text.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        self.write_text(&mut out);
        out
    }

    /// Appends the compact text: one buffer for the whole value (a string per level would
    /// copy a deep value once per level).
    fn write_text(&self, out: &mut String) {
        let quoted = |out: &mut String, s: &str| {
            out.push_str(&serde_json::to_string(s).expect("strings serialize"));
        };
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Num(n) => out.push_str(&n.to_string()),
            Json::Str(s) => quoted(out, s),
            Json::Arr(v) => {
                out.push('[');
                for (i, x) in v.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    x.write_text(out);
                }
                out.push(']');
            }
            Json::Obj(m) => {
                out.push('{');
                for (i, (k, x)) in m.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    quoted(out, k);
                    out.push(':');
                    x.write_text(out);
                }
                out.push('}');
            }
        }
    }
}

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

/// A JSON Schema's text to GBNF text (start rule `root`).
pub fn to_gbnf(text: &str) -> Result<String, GrammarError> {
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
        rules: String::new(),
        n: 0,
    };
    let root = c.schema(&schema, "")?;
    Ok(format!("root ::= {root}\n{PRIMITIVES}{}", c.rules))
}

struct Gen {
    rules: String,
    n: usize,
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

fn bad(path: &str, msg: String) -> GrammarError {
    GrammarError {
        line: 1,
        col: 1,
        offset: 0,
        msg: format!(
            "at schema path `{}`: {msg}",
            if path.is_empty() { "/" } else { path }
        ),
    }
}

const IGNORED: &[&str] = &[
    "title",
    "description",
    "$schema",
    "$id",
    "$comment",
    "default",
    "examples",
    "additionalProperties",
];

impl Gen {
    fn rule(&mut self, body: String) -> String {
        self.n += 1;
        let name = format!("s{}", self.n);
        let _ = writeln!(self.rules, "{name} ::= {body}");
        name
    }

    fn count(s: &Json, key: &str, path: &str) -> Result<Option<u32>, GrammarError> {
        match s.get(key) {
            None => Ok(None),
            Some(Json::Num(n)) => match n.as_u64() {
                Some(v) if v <= 1000 => Ok(Some(v as u32)),
                _ => Err(bad(path, format!("`{key}` must be an integer in 0..=1000"))),
            },
            Some(_) => Err(bad(path, format!("`{key}` must be an integer in 0..=1000"))),
        }
    }

    /// An expression (rule name or parenthesized alternation) matching `s`.
    fn schema(&mut self, s: &Json, path: &str) -> Result<String, GrammarError> {
        let m = match s {
            Json::Bool(true) => return Ok("value".into()),
            Json::Bool(false) => return Err(bad(path, "`false` allows no value".into())),
            Json::Obj(m) => m,
            _ => return Err(bad(path, "a schema must be an object or `true`".into())),
        };
        for (k, _) in m {
            let known = [
                "type",
                "properties",
                "required",
                "items",
                "enum",
                "const",
                "anyOf",
                "oneOf",
                "minItems",
                "maxItems",
                "minLength",
                "maxLength",
            ];
            if !known.contains(&k.as_str()) && !IGNORED.contains(&k.as_str()) {
                return Err(bad(path, format!("unsupported keyword `{k}`")));
            }
        }
        if let Some(v) = s.get("const") {
            return Ok(lit(&v.to_text()));
        }
        if let Some(e) = s.get("enum") {
            let Json::Arr(vals) = e else {
                return Err(bad(path, "`enum` must be an array".into()));
            };
            if vals.is_empty() {
                return Err(bad(path, "`enum` must list at least one value".into()));
            }
            let alts: Vec<String> = vals.iter().map(|v| lit(&v.to_text())).collect();
            return Ok(format!("( {} )", alts.join(" | ")));
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(list) = s.get(key) {
                let Json::Arr(v) = list else {
                    return Err(bad(path, format!("`{key}` must be an array of schemas")));
                };
                if v.is_empty() {
                    return Err(bad(path, format!("`{key}` must list at least one schema")));
                }
                let mut alts = Vec::new();
                for (i, sub) in v.iter().enumerate() {
                    alts.push(self.schema(sub, &format!("{path}/{key}/{i}"))?);
                }
                return Ok(format!("( {} )", alts.join(" | ")));
            }
        }
        let types: Vec<&str> = match s.get("type") {
            None => {
                if s.get("properties").is_some() {
                    vec!["object"]
                } else if s.get("items").is_some() {
                    vec!["array"]
                } else {
                    return Ok("value".into());
                }
            }
            Some(Json::Str(t)) => vec![t.as_str()],
            Some(Json::Arr(ts)) if !ts.is_empty() => {
                let mut v = Vec::new();
                for t in ts {
                    match t {
                        Json::Str(t) => v.push(t.as_str()),
                        _ => return Err(bad(path, "`type` entries must be strings".into())),
                    }
                }
                v
            }
            Some(_) => {
                return Err(bad(
                    path,
                    "`type` must be a type name or a non-empty list of them".into(),
                ))
            }
        };
        let mut alts = Vec::new();
        for t in types {
            alts.push(match t {
                "string" => self.string(s, path)?,
                "number" => "number".into(),
                "integer" => "integer".into(),
                "boolean" => "boolean".into(),
                "null" => "null".into(),
                "object" => self.object(s, path)?,
                "array" => self.array(s, path)?,
                other => {
                    return Err(bad(
                        path,
                        format!(
                            "unknown type `{other}` (expected object, array, string, number, integer, boolean or null)"
                        ),
                    ))
                }
            });
        }
        Ok(if alts.len() == 1 {
            alts.pop().expect("one")
        } else {
            format!("( {} )", alts.join(" | "))
        })
    }

    fn string(&mut self, s: &Json, path: &str) -> Result<String, GrammarError> {
        let min = Self::count(s, "minLength", path)?;
        let max = Self::count(s, "maxLength", path)?;
        if min.is_none() && max.is_none() {
            return Ok("string".into());
        }
        let min = min.unwrap_or(0);
        if max.is_some_and(|m| m < min) {
            return Err(bad(path, "`maxLength` is below `minLength`".into()));
        }
        let rep = match max {
            Some(m) => format!("{{{min},{m}}}"),
            None => format!("{{{min},}}"),
        };
        Ok(self.rule(format!("\"\\\"\" char{rep} \"\\\"\"")))
    }

    fn array(&mut self, s: &Json, path: &str) -> Result<String, GrammarError> {
        let item = match s.get("items") {
            None => "value".to_string(),
            Some(i) => self.schema(i, &format!("{path}/items"))?,
        };
        let min = Self::count(s, "minItems", path)?.unwrap_or(0);
        let max = Self::count(s, "maxItems", path)?;
        if max.is_some_and(|m| m < min) {
            return Err(bad(path, "`maxItems` is below `minItems`".into()));
        }
        let more = format!("( ws \",\" ws {item} )");
        let body = match (min, max) {
            (_, Some(0)) => "\"[\" ws \"]\"".to_string(),
            (0, None) => format!("\"[\" ws ( {item} {more}* )? ws \"]\""),
            (0, Some(m)) => format!("\"[\" ws ( {item} {more}{{0,{}}} )? ws \"]\"", m - 1),
            (n, None) => format!("\"[\" ws {item} {more}{{{},}} ws \"]\"", n - 1),
            (n, Some(m)) => format!("\"[\" ws {item} {more}{{{},{}}} ws \"]\"", n - 1, m - 1),
        };
        Ok(self.rule(body))
    }

    fn object(&mut self, s: &Json, path: &str) -> Result<String, GrammarError> {
        let props = match s.get("properties") {
            None => return Ok("object".into()),
            Some(Json::Obj(p)) => p,
            Some(_) => return Err(bad(path, "`properties` must be an object".into())),
        };
        // Sets, not scans: `properties` and `required` may each name 100k keys.
        let names: HashSet<&str> = props.iter().map(|(k, _)| k.as_str()).collect();
        let required: HashSet<&str> = match s.get("required") {
            None => HashSet::new(),
            Some(Json::Arr(r)) => {
                let mut v = HashSet::with_capacity(r.len());
                for x in r {
                    match x {
                        Json::Str(k) if names.contains(k.as_str()) => {
                            v.insert(k.as_str());
                        }
                        Json::Str(k) => {
                            return Err(bad(
                                path,
                                format!("`required` names `{k}`, which is not in `properties`"),
                            ))
                        }
                        _ => return Err(bad(path, "`required` must list strings".into())),
                    }
                }
                v
            }
            Some(_) => return Err(bad(path, "`required` must be an array".into())),
        };
        // Each member (key and value) is a rule of its own, referenced by both tails that may
        // write it, so its key is compiled once.
        let mut kvs = Vec::with_capacity(props.len());
        for (k, sub) in props {
            let v = self.schema(sub, &format!("{path}/properties/{k}"))?;
            let key = lit(&serde_json::to_string(k).expect("strings serialize"));
            kvs.push((
                self.rule(format!("{key} ws \":\" ws {v}")),
                required.contains(k.as_str()),
            ));
        }
        // tail(i, first): the members from i on, `first` when none was written yet (so no
        // comma before the next one); an optional member may be skipped. Built from the end,
        // `next` holding tail(i + 1, _). Only the tails some rule refers to are written:
        // tail(0, false) never is, nor a `first` one past the first required member.
        let n = kvs.len();
        let first_required = kvs.iter().position(|&(_, req)| req).unwrap_or(n);
        let mut next = ["\"\"".to_string(), "\"\"".to_string()];
        for i in (0..n).rev() {
            let (kv, req) = &kvs[i];
            let mut cur = [String::new(), String::new()];
            for (f, slot) in cur.iter_mut().enumerate() {
                let first = f == 1;
                if (first && i > first_required) || (!first && i == 0) {
                    continue;
                }
                let comma = if first { "" } else { "ws \",\" ws " };
                let take = format!("{comma}{kv} {}", next[0]);
                *slot = self.rule(if *req {
                    take
                } else {
                    format!("{take} | {}", next[f])
                });
            }
            next = cur;
        }
        Ok(self.rule(format!("\"{{\" ws {} ws \"}}\"", next[1])))
    }
}
