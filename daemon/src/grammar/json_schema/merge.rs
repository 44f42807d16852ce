//! `allOf` and `$ref` without intersecting grammars: the schemas of an `allOf` are merged
//! keyword by keyword into one (the tighter bound, the union of `required`, the common types,
//! properties merged pairwise by a nested `allOf` left for later), and a `$ref` is a JSON
//! pointer into the document. Context-free languages are not closed under intersection, so
//! this is the only sound way a grammar enforces `allOf`; the keywords it cannot merge
//! (two different `pattern`s) are reported back as relaxed.

use super::numbers::Dec;
use super::Json;

/// Merges done per schema at most (an `allOf` of `anyOf`s multiplies out).
pub const MAX_MERGES: usize = 20_000;

/// The schema a local `$ref` points at (`#`, `#/$defs/x`, `#/definitions/x`, any JSON
/// pointer with `~0`, `~1` and %-escapes); `None` for a ref to nowhere (or to another
/// document: nothing is fetched).
pub fn resolve<'a>(root: &'a Json, r: &str) -> Option<&'a Json> {
    let ptr = r.strip_prefix('#')?;
    if ptr.is_empty() {
        return Some(root);
    }
    let ptr = ptr.strip_prefix('/')?;
    let mut cur = root;
    for raw in ptr.split('/') {
        let tok = percent_decode(raw)?.replace("~1", "/").replace("~0", "~");
        cur = match cur {
            Json::Obj(m) => m.iter().find(|(k, _)| *k == tok).map(|(_, v)| v)?,
            Json::Arr(v) => v.get(tok.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Draft 4's boolean `exclusiveMinimum` / `exclusiveMaximum` as the later numeric form, so
/// every other step sees one spelling.
pub fn normalize(s: &Json) -> Json {
    let Json::Obj(m) = s else {
        return s.clone();
    };
    let mut out: Vec<(String, Json)> = Vec::with_capacity(m.len());
    for (k, v) in m {
        match (k.as_str(), v) {
            ("exclusiveMinimum" | "exclusiveMaximum", Json::Bool(b)) => {
                let base = if k == "exclusiveMinimum" {
                    "minimum"
                } else {
                    "maximum"
                };
                if let (true, Some(n)) = (*b, s.get(base)) {
                    out.push((k.clone(), n.clone()));
                }
            }
            _ => out.push((k.clone(), v.clone())),
        }
    }
    // A numeric exclusive bound replaces the inclusive one it came from.
    for (ex, base) in [
        ("exclusiveMinimum", "minimum"),
        ("exclusiveMaximum", "maximum"),
    ] {
        if let (Some(Json::Bool(true)), true) = (s.get(ex), s.get(base).is_some()) {
            out.retain(|(k, _)| k != base);
        }
    }
    Json::Obj(out)
}

/// Keywords of a merge that could not be kept both (each a keyword name).
pub type Relaxed = Vec<&'static str>;

fn both(a: Json, b: Json) -> Json {
    Json::Obj(vec![("allOf".into(), Json::Arr(vec![a, b]))])
}

fn num(j: &Json) -> Option<Dec> {
    match j {
        Json::Num(n) => Dec::parse(&n.to_string()),
        _ => None,
    }
}

/// `a` and `b` as one schema (both already normalized, neither with a top-level `$ref` or
/// `allOf`); `relaxed` collects what one side's value was dropped for.
pub fn merge(a: &Json, b: &Json, relaxed: &mut Relaxed) -> Json {
    let (ma, mb) = match (a, b) {
        (Json::Bool(true), x) | (x, Json::Bool(true)) => return x.clone(),
        (Json::Bool(false), _) | (_, Json::Bool(false)) => return Json::Bool(false),
        (Json::Obj(ma), Json::Obj(mb)) => (ma, mb),
        _ => return Json::Bool(false),
    };
    let mut out = ma.clone();
    let set = |out: &mut Vec<(String, Json)>, k: &str, v: Json| {
        if let Some(slot) = out.iter_mut().find(|(key, _)| key == k) {
            slot.1 = v;
        } else {
            out.push((k.to_string(), v));
        }
    };
    for (k, vb) in mb {
        let Some(va) = a.get(k) else {
            if k != "properties" {
                out.push((k.clone(), vb.clone()));
            }
            continue;
        };
        match k.as_str() {
            "type" => {
                let list = |j: &Json| -> Vec<String> {
                    match j {
                        Json::Str(s) => vec![s.clone()],
                        Json::Arr(v) => v
                            .iter()
                            .filter_map(|x| match x {
                                Json::Str(s) => Some(s.clone()),
                                _ => None,
                            })
                            .collect(),
                        _ => Vec::new(),
                    }
                };
                let (la, lb) = (list(va), list(vb));
                let mut common = Vec::new();
                for t in &la {
                    for u in &lb {
                        let m = match (t.as_str(), u.as_str()) {
                            (x, y) if x == y => Some(x),
                            ("integer", "number") | ("number", "integer") => Some("integer"),
                            _ => None,
                        };
                        if let Some(m) = m {
                            if !common.iter().any(|c: &Json| *c == Json::Str(m.into())) {
                                common.push(Json::Str(m.into()));
                            }
                        }
                    }
                }
                if common.is_empty() {
                    return Json::Bool(false);
                }
                set(&mut out, "type", Json::Arr(common));
            }
            "required" => {
                let mut v = match va {
                    Json::Arr(v) => v.clone(),
                    _ => Vec::new(),
                };
                if let Json::Arr(w) = vb {
                    for x in w {
                        if !v.contains(x) {
                            v.push(x.clone());
                        }
                    }
                }
                set(&mut out, "required", Json::Arr(v));
            }
            "minimum" | "exclusiveMinimum" | "maximum" | "exclusiveMaximum" | "minLength"
            | "maxLength" | "minItems" | "maxItems" | "minProperties" | "maxProperties" => {
                let lower = k.starts_with("min") || k == "exclusiveMinimum";
                let keep_b = match (num(va), num(vb)) {
                    (Some(x), Some(y)) => (y > x) == lower && y != x,
                    _ => false,
                };
                if keep_b {
                    set(&mut out, k, vb.clone());
                }
            }
            "enum" => {
                let (Json::Arr(x), Json::Arr(y)) = (va, vb) else {
                    continue;
                };
                let common: Vec<Json> = x.iter().filter(|v| y.contains(v)).cloned().collect();
                set(&mut out, "enum", Json::Arr(common));
            }
            "const" => {
                if va != vb {
                    return Json::Bool(false);
                }
            }
            "items" | "additionalProperties" | "additionalItems" | "not" | "contains"
                if !matches!(va, Json::Arr(_)) && !matches!(vb, Json::Arr(_)) =>
            {
                set(&mut out, k, both(va.clone(), vb.clone()));
            }
            "anyOf" | "oneOf" => {
                let (Json::Arr(x), Json::Arr(y)) = (va, vb) else {
                    continue;
                };
                let mut alts = Vec::with_capacity(x.len() * y.len());
                for p in x {
                    for q in y {
                        alts.push(both(p.clone(), q.clone()));
                    }
                }
                set(&mut out, k, Json::Arr(alts));
            }
            "properties" => {}
            "title" | "description" | "default" | "examples" | "$comment" | "$schema" | "$id"
            | "$defs" | "definitions" => {}
            _ => {
                if va != vb {
                    relaxed.push(match k.as_str() {
                        "pattern" => "pattern",
                        "format" => "format",
                        "prefixItems" => "prefixItems",
                        "items" => "items",
                        "uniqueItems" => "uniqueItems",
                        "multipleOf" => "multipleOf",
                        _ => "allOf",
                    });
                }
            }
        }
    }
    // Properties: a name on one side only also meets the other side's
    // `additionalProperties`.
    let pa = props(a);
    let pb = props(b);
    if !pa.is_empty() || !pb.is_empty() {
        let mut merged: Vec<(String, Json)> = Vec::new();
        for (k, x) in &pa {
            let v = match pb.iter().find(|(n, _)| n == k) {
                Some((_, y)) => both(x.clone(), y.clone()),
                None => match b.get("additionalProperties") {
                    Some(extra) => both(x.clone(), extra.clone()),
                    None => x.clone(),
                },
            };
            merged.push((k.clone(), v));
        }
        for (k, y) in &pb {
            if pa.iter().any(|(n, _)| n == k) {
                continue;
            }
            let v = match a.get("additionalProperties") {
                Some(extra) => both(extra.clone(), y.clone()),
                None => y.clone(),
            };
            merged.push((k.clone(), v));
        }
        set(&mut out, "properties", Json::Obj(merged));
    }
    Json::Obj(out)
}

fn props(s: &Json) -> Vec<(String, Json)> {
    match s.get("properties") {
        Some(Json::Obj(m)) => m.clone(),
        _ => Vec::new(),
    }
}
