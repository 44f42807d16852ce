//! Objects and arrays: members in the schema's order (optional ones skippable), extra
//! members after them where `additionalProperties` allows, and arrays as a prefix of
//! positional item schemas then a run of the rest, counted by `minItems` / `maxItems`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write;

use super::{bad, lit, Gen, GrammarError, Json, MAX_COUNT};

impl Gen<'_> {
    pub(super) fn object(&mut self, s: &Json, path: &str) -> Result<Option<String>, GrammarError> {
        let mut props: Vec<(String, Json)> = match s.get("properties") {
            None => Vec::new(),
            Some(Json::Obj(p)) => p.clone(),
            Some(_) => {
                return Err(bad(
                    &format!("{path}.properties"),
                    "`properties` must be an object".into(),
                ))
            }
        };
        // Undeclared members are written only where `additionalProperties` says so: left
        // free, a model wanders off into keys of its own (every answer is still valid, the
        // spec's default being `true`; what the grammar leaves out is only extra members).
        // A schema with no `properties` at all is a free object.
        let extra = s.get("additionalProperties").cloned().unwrap_or(Json::Bool(
            s.get("properties").is_none() && s.get("required").is_none(),
        ));
        // A required name with no schema of its own takes any value unless
        // `additionalProperties` gives one.
        let undeclared_schema = s
            .get("additionalProperties")
            .cloned()
            .unwrap_or(Json::Bool(true));
        // Sets, not scans: `properties` and `required` may each name 100k keys.
        let mut required: HashSet<String> = HashSet::new();
        match s.get("required") {
            None => {}
            Some(Json::Arr(r)) => {
                let names: HashSet<&str> = props.iter().map(|(k, _)| k.as_str()).collect();
                let mut undeclared = Vec::new();
                for x in r {
                    match x {
                        Json::Str(k) => {
                            if !names.contains(k.as_str()) {
                                undeclared.push(k.clone());
                            }
                            required.insert(k.clone());
                        }
                        _ => {
                            return Err(bad(
                                &format!("{path}.required"),
                                "`required` must list strings".into(),
                            ))
                        }
                    }
                }
                // A required name with no schema of its own takes `additionalProperties`'s.
                for k in undeclared {
                    if !props.iter().any(|(p, _)| *p == k) {
                        props.push((k, undeclared_schema.clone()));
                    }
                }
            }
            Some(_) => {
                return Err(bad(
                    &format!("{path}.required"),
                    "`required` must be an array".into(),
                ))
            }
        }
        let extra_value = self.schema(&extra, &format!("{path}.additionalProperties"))?;
        if props.is_empty() && extra_value.as_deref() == Some("value") {
            return Ok(Some("object".into()));
        }
        // Each member (key and value) is a rule of its own, referenced by both tails that may
        // write it, so its key is compiled once.
        let mut kvs = Vec::with_capacity(props.len());
        for (k, sub) in &props {
            let req = required.contains(k.as_str());
            let Some(v) = self.schema(sub, &format!("{path}.properties.{k}"))? else {
                if req {
                    return Ok(None);
                }
                continue;
            };
            let key = lit(&serde_json::to_string(k).expect("strings serialize"));
            kvs.push((self.rule(format!("{key} ws \":\" ws {v}")), req));
        }
        // Extra members come after the declared ones, with keys none of them has.
        let ends = match extra_value {
            None => ["\"\"".to_string(), "\"\"".to_string()],
            Some(v) => {
                let key = self.key_not_in(props.iter().map(|(k, _)| k.as_str()));
                let x = self.rule(format!("{key} ws \":\" ws {v}"));
                let more = self.rule(format!("( ws \",\" ws {x} )*"));
                [more.clone(), format!("( {x} {more} )?")]
            }
        };
        // tail(i, first): the members from i on, `first` when none was written yet (so no
        // comma before the next one); an optional member may be skipped. Built from the end,
        // `next` holding tail(i + 1, _). Only the tails some rule refers to are written:
        // tail(0, false) never is, nor a `first` one past the first required member.
        let n = kvs.len();
        let first_required = kvs.iter().position(|&(_, req)| req).unwrap_or(n);
        let mut next = ends;
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
        Ok(Some(self.rule(format!("\"{{\" ws {} ws \"}}\"", next[1]))))
    }

    /// A JSON string (quotes included) that is none of `names`. A trie of the names: at each
    /// node a character no name continues with (or any escape) leaves the set, and the
    /// closing quote is allowed where no name ends. Linear in the names' total length.
    fn key_not_in<'k>(&mut self, names: impl Iterator<Item = &'k str>) -> String {
        let mut children: Vec<BTreeMap<char, usize>> = vec![BTreeMap::new()];
        let mut ends = vec![false];
        let mut any = false;
        for name in names {
            any = true;
            let mut cur = 0;
            for ch in name.chars() {
                cur = match children[cur].get(&ch) {
                    Some(&c) => c,
                    None => {
                        children.push(BTreeMap::new());
                        ends.push(false);
                        let id = children.len() - 1;
                        children[cur].insert(ch, id);
                        id
                    }
                };
            }
            ends[cur] = true;
        }
        if !any {
            return "string".into();
        }
        self.n += 1;
        let base = format!("k{}_", self.n);
        let rest = format!("{base}rest");
        let _ = writeln!(self.rules, "{rest} ::= char* \"\\\"\"");
        let mut other: HashMap<String, String> = HashMap::new();
        // A node where a name ends and none goes on (most of them): one shared rule, "at
        // least one more character".
        let leaf = format!("{base}leaf");
        let name = |id: usize| {
            if children[id].is_empty() {
                leaf.clone()
            } else {
                format!("{base}{id}")
            }
        };
        let mut leaf_written = false;
        for (id, kids) in children.iter().enumerate() {
            if kids.is_empty() && leaf_written {
                continue;
            }
            let mut excluded = String::new();
            for &ch in kids.keys() {
                let _ = write!(excluded, "\\U{:08X}", ch as u32);
            }
            let n_other = other.len();
            let diff = other
                .entry(excluded.clone())
                .or_insert_with(|| format!("{base}o{n_other}"))
                .clone();
            if other.len() > n_other {
                let _ = writeln!(
                    self.rules,
                    "{diff} ::= [^\"\\\\\\x00-\\x1F{excluded}] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" uesc )"
                );
            }
            let mut alts = vec![format!("{diff} {rest}")];
            // Characters that lead to a leaf share one class (a wide object's keys end in
            // digits: ten edges become one).
            let mut to_leaf = String::new();
            for (&ch, &kid) in kids {
                let text = serde_json::to_string(&ch.to_string()).expect("strings serialize");
                let inner = &text[1..text.len() - 1];
                if children[kid].is_empty() && inner.len() == ch.len_utf8() {
                    let _ = write!(to_leaf, "\\U{:08X}", ch as u32);
                } else {
                    alts.push(format!("{} {}", lit(inner), name(kid)));
                }
            }
            if !to_leaf.is_empty() {
                alts.push(format!("[{to_leaf}] {leaf}"));
            }
            if !ends[id] {
                alts.push("\"\\\"\"".into());
            }
            if kids.is_empty() {
                leaf_written = true;
            }
            let _ = writeln!(self.rules, "{} ::= {}", name(id), alts.join(" | "));
        }
        format!("( \"\\\"\" {} )", name(0))
    }

    pub(super) fn array(&mut self, s: &Json, path: &str) -> Result<Option<String>, GrammarError> {
        // Positional schemas: 2020-12's `prefixItems`, or draft 4's `items` as an array.
        let (prefix, rest): (Vec<Json>, Json) = match (s.get("prefixItems"), s.get("items")) {
            (Some(Json::Arr(p)), items) => (p.clone(), items.cloned().unwrap_or(Json::Bool(true))),
            (Some(_), _) => {
                return Err(bad(
                    &format!("{path}.prefixItems"),
                    "`prefixItems` must be an array".into(),
                ))
            }
            (None, Some(Json::Arr(p))) => (
                p.clone(),
                s.get("additionalItems")
                    .cloned()
                    .unwrap_or(Json::Bool(true)),
            ),
            (None, items) => (Vec::new(), items.cloned().unwrap_or(Json::Bool(true))),
        };
        let min = Self::count(s, "minItems", path)?.unwrap_or(0);
        let max = Self::count(s, "maxItems", path)?;
        if min > MAX_COUNT || max.is_some_and(|m| m > MAX_COUNT) {
            let k = if min > MAX_COUNT {
                "minItems"
            } else {
                "maxItems"
            };
            return Err(bad(
                &format!("{path}.{k}"),
                format!("`{k}` past {MAX_COUNT} (the grammar copies each item out)"),
            ));
        }
        if s.get("uniqueItems") == Some(&Json::Bool(true)) && max.is_none_or(|m| m > 1) {
            self.relax(path, "uniqueItems", "distinct items are not context-free")?;
        }
        let mut items = Vec::new();
        for (i, p) in prefix.iter().enumerate() {
            items.push(self.schema(p, &format!("{path}.prefixItems[{i}]"))?);
        }
        let rest_path = format!("{path}.items");
        let rest = self.schema(&rest, &rest_path)?;
        let max = max.map(|m| m as usize);
        let min = min as usize;
        if max.is_some_and(|m| m < min) {
            return Ok(None);
        }
        // The positions that may be written: the prefix up to `max`, then the rest.
        let p = prefix.len().min(max.unwrap_or(usize::MAX));
        // tail(i): the items from position i on (a comma before each but the first). Built
        // from the end.
        let sep = |i: usize| if i == 0 { "" } else { "ws \",\" ws " };
        let rest_min = min.saturating_sub(p);
        let rest_max = max.map(|m| m.saturating_sub(p));
        let mut tail: Option<String> = match (&rest, rest_max) {
            (_, Some(0)) => Some("\"\"".into()),
            (None, _) => (rest_min == 0).then(|| "\"\"".into()),
            (Some(r), _) if p == 0 => {
                let more = format!("( ws \",\" ws {r} )");
                Some(match (rest_min, rest_max) {
                    (0, None) => format!("( {r} {more}* )?"),
                    (0, Some(m)) => format!("( {r} {more}{{0,{}}} )?", m - 1),
                    (n, None) => format!("{r} {more}{{{},}}", n - 1),
                    (n, Some(m)) => format!("{r} {more}{{{},{}}}", n - 1, m - 1),
                })
            }
            (Some(r), _) => {
                let more = format!("( ws \",\" ws {r} )");
                Some(match rest_max {
                    None => format!("{more}{{{rest_min},}}"),
                    Some(m) => format!("{more}{{{rest_min},{m}}}"),
                })
            }
        };
        for i in (0..p).rev() {
            let item = items[i].clone();
            let take = match (&item, &tail) {
                (Some(it), Some(t)) => Some(format!("{}{it} {t}", sep(i))),
                _ => None,
            };
            tail = if i >= min {
                // The array may end before position i.
                Some(match take {
                    Some(t) => format!("( {t} )?"),
                    None => "\"\"".into(),
                })
            } else {
                take
            };
            if let Some(t) = &tail {
                tail = Some(self.rule(t.clone()));
            }
        }
        Ok(tail.map(|t| self.rule(format!("\"[\" ws {t} ws \"]\""))))
    }
}
