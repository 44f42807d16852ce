//! JSON as Python's `json.dumps` writes it, which is what a Hugging Face chat template's
//! `tojson` prints (transformers defines the filter as `json.dumps(x, ensure_ascii=False,
//! indent=None, separators=None, sort_keys=False)` with those keywords open to the template):
//! `", "` and `": "` between items (`","` and `": "` with an indent), members in their order,
//! non-ASCII kept unless `ensure_ascii`. minijinja's own `tojson` writes compact JSON and
//! refuses `ensure_ascii=False`, which MiniMax-M2's and GLM's templates pass.

use serde_json::Value;

/// `json.dumps`' keywords.
#[derive(Clone, Debug, Default)]
pub struct Dumps {
    pub ensure_ascii: bool,
    pub indent: Option<usize>,
    /// (item, key) separators; `None`: Python's default for the indent.
    pub separators: Option<(String, String)>,
    pub sort_keys: bool,
}

impl Dumps {
    pub fn dumps(&self, v: &Value) -> String {
        let mut out = String::new();
        self.write(v, 0, &mut out);
        out
    }

    fn write(&self, v: &Value, depth: usize, out: &mut String) {
        let (item, key) = match &self.separators {
            Some((i, k)) => (i.as_str(), k.as_str()),
            None if self.indent.is_some() => (",", ": "),
            None => (", ", ": "),
        };
        // Python writes an empty container as `[]` / `{}` whatever the indent.
        let open = |out: &mut String, d: usize| {
            if let Some(n) = self.indent {
                out.push('\n');
                out.push_str(&" ".repeat(n * d));
            }
        };
        match v {
            Value::Array(items) if !items.is_empty() => {
                out.push('[');
                for (i, x) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(item);
                    }
                    open(out, depth + 1);
                    self.write(x, depth + 1, out);
                }
                open(out, depth);
                out.push(']');
            }
            Value::Object(map) if !map.is_empty() => {
                let mut members: Vec<(&String, &Value)> = map.iter().collect();
                if self.sort_keys {
                    members.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (k, x)) in members.into_iter().enumerate() {
                    if i > 0 {
                        out.push_str(item);
                    }
                    open(out, depth + 1);
                    self.string(k, out);
                    out.push_str(key);
                    self.write(x, depth + 1, out);
                }
                open(out, depth);
                out.push('}');
            }
            Value::String(s) => self.string(s, out),
            other => out.push_str(&other.to_string()),
        }
    }

    fn string(&self, s: &str, out: &mut String) {
        let quoted = Value::String(s.to_string()).to_string();
        if !self.ensure_ascii || s.is_ascii() {
            out.push_str(&quoted);
            return;
        }
        for c in quoted.chars() {
            if c.is_ascii() {
                out.push(c);
            } else {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Python 3's `json.dumps` of the same value with each set of keywords.
    #[test]
    fn writes_what_python_writes() {
        let v: Value = serde_json::from_str(
            r#"{"name": "get_weather", "b": [1, 2.5, true, null], "é": "naïve 😀\n", "e": {}, "l": []}"#,
        )
        .unwrap();
        assert_eq!(
            Dumps::default().dumps(&v),
            r#"{"name": "get_weather", "b": [1, 2.5, true, null], "é": "naïve 😀\n", "e": {}, "l": []}"#
        );
        let ascii = Dumps {
            ensure_ascii: true,
            ..Dumps::default()
        };
        assert_eq!(ascii.dumps(&v["é"]), r#""na\u00efve \ud83d\ude00\n""#);
        let pretty = Dumps {
            indent: Some(2),
            sort_keys: true,
            ..Dumps::default()
        };
        assert_eq!(
            pretty.dumps(&serde_json::json!({"z": [1, {"a": 2}], "e": {}})),
            "{\n  \"e\": {},\n  \"z\": [\n    1,\n    {\n      \"a\": 2\n    }\n  ]\n}"
        );
        let compact = Dumps {
            separators: Some((",".into(), ":".into())),
            ..Dumps::default()
        };
        assert_eq!(
            compact.dumps(&serde_json::json!({"a": [1, 2]})),
            r#"{"a":[1,2]}"#
        );
    }
}
