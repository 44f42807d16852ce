//! The JSON Schema keywords past the suite's cases: numeric ranges checked value by value,
//! patterns over escaped text, formats, Pydantic's shapes (`$defs` / `$ref`, `Optional` as
//! `anyOf` with null), recursion, extra members, warnings and strict mode.

use std::sync::Arc;

use super::{json_schema, Grammar, GrammarState};

fn schema(text: &str) -> Arc<Grammar> {
    Arc::new(Grammar::from_json_schema(text).unwrap_or_else(|e| panic!("{e}\n{text}")))
}

fn accepts(g: &Arc<Grammar>, s: &str) -> bool {
    let mut st = GrammarState::new(g.clone());
    st.advance_bytes(s.as_bytes()) && st.accepting()
}

#[test]
fn numeric_bounds_accept_exactly_the_values_within() {
    // Bounds as written in schemas (draft 4's booleans and the numeric exclusive form), each
    // checked against every value of a grid by direct comparison.
    let cases: [(&str, bool, Option<(f64, bool)>, Option<(f64, bool)>); 9] = [
        (
            r#"{"type":"integer","minimum":-17,"maximum":230}"#,
            true,
            Some((-17.0, false)),
            Some((230.0, false)),
        ),
        (
            r#"{"type":"integer","exclusiveMinimum":-1.5,"exclusiveMaximum":99}"#,
            true,
            Some((-1.5, true)),
            Some((99.0, true)),
        ),
        (
            r#"{"type":"integer","minimum":5,"exclusiveMinimum":true}"#,
            true,
            Some((5.0, true)),
            None,
        ),
        (
            r#"{"type":"integer","maximum":-3}"#,
            true,
            None,
            Some((-3.0, false)),
        ),
        (
            r#"{"type":"number","minimum":1.1,"maximum":3.25}"#,
            false,
            Some((1.1, false)),
            Some((3.25, false)),
        ),
        (
            r#"{"type":"number","exclusiveMinimum":-2.05,"exclusiveMaximum":0}"#,
            false,
            Some((-2.05, true)),
            Some((0.0, true)),
        ),
        (
            r#"{"type":"number","minimum":0}"#,
            false,
            Some((0.0, false)),
            None,
        ),
        (
            r#"{"type":"number","maximum":-0.5,"minimum":-120.75}"#,
            false,
            Some((-120.75, false)),
            Some((-0.5, false)),
        ),
        (
            r#"{"type":"number","exclusiveMinimum":0.3,"maximum":0.3}"#,
            false,
            Some((0.3, true)),
            Some((0.3, false)),
        ),
    ];
    for (text, integer, lo, hi) in cases {
        let gr = Arc::new(match Grammar::from_json_schema(text) {
            Ok(g) => g,
            // An empty range: nothing to accept.
            Err(e) => {
                assert!(text.contains("0.3"), "{text}: {e}");
                continue;
            }
        });
        let within = |x: f64| {
            lo.is_none_or(|(l, ex)| if ex { x > l } else { x >= l })
                && hi.is_none_or(|(h, ex)| if ex { x < h } else { x <= h })
        };
        for i in -30_000..=30_000i64 {
            // Hundredths from -300 to 300, written the way serde_json writes them.
            let x = i as f64 / 100.0;
            let t = if i % 100 == 0 {
                format!("{}", i / 100)
            } else {
                let s = format!("{:.2}", x);
                s.trim_end_matches('0').to_string()
            };
            let ok = within(x) && (!integer || i % 100 == 0);
            assert_eq!(accepts(&gr, &t), ok, "{text}: {t}");
        }
        assert!(!accepts(&gr, "1e2"), "{text}: no exponent under bounds");
    }
}

#[test]
fn patterns_search_unless_anchored_and_see_the_decoded_text() {
    let gr = schema(r#"{"type":"string","pattern":"^[a-z]+-[0-9]{2}$"}"#);
    assert!(accepts(&gr, r#""ab-12""#));
    assert!(!accepts(&gr, r#""ab-123""#));
    assert!(!accepts(&gr, r#""Ab-12""#));
    let gr = schema(r#"{"type":"string","pattern":"b+c"}"#);
    assert!(accepts(&gr, r#""xxbbcyy""#));
    assert!(accepts(&gr, r#""bc""#));
    assert!(!accepts(&gr, r#""cb""#));
    // A quote and a newline in the pattern are written escaped in the JSON text.
    let gr = schema(r#"{"type":"string","pattern":"^a\"\\n$"}"#);
    assert!(accepts(&gr, r#""a\"\n""#));
    assert!(!accepts(&gr, r#""a\"n""#));
    // Formats.
    let dt = schema(r#"{"type":"string","format":"date-time"}"#);
    assert!(accepts(&dt, r#""2024-02-29T23:59:60.5+05:30""#));
    assert!(!accepts(&dt, r#""2024-13-01T00:00:00Z""#));
    let uuid = schema(r#"{"type":"string","format":"uuid"}"#);
    assert!(accepts(&uuid, r#""123e4567-e89b-12d3-a456-426614174000""#));
    assert!(!accepts(&uuid, r#""123e4567-e89b-12d3-a456""#));
    let ip = schema(r#"{"format":"ipv4"}"#);
    assert!(accepts(&ip, r#""192.168.0.255""#));
    assert!(!accepts(&ip, r#""256.1.1.1""#));
    assert!(accepts(&ip, "12"), "format constrains strings only");
    // A regex the translation cannot bound is a request error naming the field.
    let e = json_schema::compile(r#"{"properties":{"a":{"pattern":"(?=x)"}}}"#, false).unwrap_err();
    assert!(e.msg.contains("$.properties.a.pattern"), "{e}");
}

/// What Pydantic v2 writes for nested models with `Optional`, enums, bounds and patterns.
const PYDANTIC: &str = r##"{
  "$defs": {
    "Color": {"enum": ["red", "green"], "title": "Color", "type": "string"},
    "Address": {
      "properties": {
        "street": {"title": "Street", "type": "string", "minLength": 1},
        "zip": {"pattern": "^[0-9]{5}$", "title": "Zip", "type": "string"}
      },
      "required": ["street", "zip"], "title": "Address", "type": "object"
    }
  },
  "properties": {
    "name": {"title": "Name", "type": "string", "maxLength": 20},
    "age": {"minimum": 1, "maximum": 150, "title": "Age", "type": "integer"},
    "color": {"$ref": "#/$defs/Color", "default": "red"},
    "home": {"anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}], "default": null},
    "tags": {"items": {"type": "string"}, "title": "Tags", "type": "array", "maxItems": 3}
  },
  "required": ["name", "age"], "title": "Person", "type": "object",
  "additionalProperties": false
}"##;

#[test]
fn pydantic_models_with_defs_refs_and_optional() {
    let gr = schema(PYDANTIC);
    assert!(accepts(&gr, r#"{"name":"Ann","age":30}"#));
    assert!(accepts(
        &gr,
        r#"{"name":"Ann","age":30,"color":"green","home":{"street":"Main","zip":"12345"},"tags":["a"]}"#
    ));
    assert!(accepts(&gr, r#"{"name":"Ann","age":30,"home":null}"#));
    for bad in [
        r#"{"name":"Ann","age":0}"#,
        r#"{"name":"Ann","age":151}"#,
        r#"{"name":"Ann","age":30,"color":"blue"}"#,
        r#"{"name":"Ann","age":30,"home":{"street":"Main","zip":"1234"}}"#,
        r#"{"name":"Ann","age":30,"home":{"street":"","zip":"12345"}}"#,
        r#"{"name":"Ann","age":30,"tags":["a","b","c","d"]}"#,
        r#"{"name":"Ann","age":30,"extra":1}"#,
        r#"{"name":"abcdefghijklmnopqrstu","age":30}"#,
    ] {
        assert!(!accepts(&gr, bad), "{bad}");
    }
    // Relaxed nothing: no warning.
    assert!(json_schema::compile(PYDANTIC, true)
        .unwrap()
        .warnings
        .is_empty());
}

#[test]
fn recursive_refs_and_extra_members() {
    let tree = schema(
        r##"{"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
            "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"],
            "additionalProperties":false}},"$ref":"#/$defs/node"}"##,
    );
    assert!(accepts(
        &tree,
        r#"{"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4}]}]}"#
    ));
    assert!(!accepts(&tree, r#"{"v":1,"kids":[{"w":2}]}"#));
    // Left recursion through refs is an error, not a hang.
    assert!(Grammar::from_json_schema(
        r##"{"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"}"##
    )
    .is_err());
    // Extra members: any key but the declared ones where `additionalProperties` allows them
    // (none when it is absent), with a schema's values, or none.
    let open = schema(
        r#"{"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":true}"#,
    );
    assert!(accepts(&open, r#"{"a":1,"b":"x","ab":[]}"#));
    assert!(
        !accepts(&open, r#"{"a":1,"a":"x"}"#),
        "a declared key again"
    );
    let typed = schema(
        r#"{"type":"object","properties":{"a":{}},"additionalProperties":{"type":"boolean"}}"#,
    );
    assert!(accepts(&typed, r#"{"b":true}"#));
    assert!(!accepts(&typed, r#"{"b":1}"#));
    // prefixItems, then the rest.
    let tuple = schema(
        r#"{"type":"array","prefixItems":[{"type":"integer"},{"type":"string"}],"items":{"type":"boolean"},"maxItems":3}"#,
    );
    assert!(accepts(&tuple, r#"[1,"a",true]"#));
    assert!(accepts(&tuple, "[1]"));
    assert!(!accepts(&tuple, r#"["a"]"#));
    assert!(!accepts(&tuple, r#"[1,"a",true,false]"#));
}

#[test]
fn unenforceable_keywords_warn_or_fail_in_strict_mode() {
    let text = r#"{"type":"object","properties":{"n":{"type":"integer","multipleOf":3},
        "s":{"type":"array","uniqueItems":true}}}"#;
    let c = json_schema::compile(text, false).unwrap();
    assert_eq!(c.warnings.len(), 2, "{:?}", c.warnings);
    assert!(
        c.warnings[0].contains("$.properties.n.multipleOf"),
        "{:?}",
        c.warnings
    );
    assert!(
        c.warnings[1].contains("$.properties.s.uniqueItems"),
        "{:?}",
        c.warnings
    );
    // Relaxed: any integer.
    let gr = Arc::new(Grammar::from_gbnf(&c.gbnf).unwrap());
    assert!(accepts(&gr, r#"{"n":4}"#));
    let e = json_schema::compile(text, true).unwrap_err();
    assert!(e.msg.contains("$.properties.n.multipleOf"), "{e}");
}

#[test]
fn the_shortest_completion_closes_every_open_value() {
    let gr = schema(
        r#"{"type":"object","properties":{"note":{"type":"string"},"n":{"type":"integer","minimum":10},
        "list":{"type":"array","items":{"type":"string"},"minItems":1},"opt":{"type":"boolean"}},
        "required":["note","n","list"],"additionalProperties":false}"#,
    );
    for prefix in [
        "",
        "{",
        "{\"note\":\"abc",
        "{\"note\":\"a\\",
        "{\"note\":\"x\",\"n\":",
        "{\"note\":\"x\",\"n\":1",
        "{\"note\":\"x\",\"n\":12,\"list\":[\"q",
        "{\"note\":\"é",
    ] {
        let mut st = GrammarState::new(gr.clone());
        assert!(st.advance_bytes(prefix.as_bytes()), "{prefix}");
        let rest = st.shortest_completion();
        assert_eq!(rest.len(), st.completion_len(), "{prefix}");
        assert!(st.advance_bytes(&rest), "{prefix}");
        assert!(st.accepting(), "{prefix}");
        let text = format!("{prefix}{}", String::from_utf8(rest).unwrap());
        let v: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(v["n"].as_i64().is_some_and(|n| n >= 10), "{text}");
        assert!(!v["list"].as_array().unwrap().is_empty(), "{text}");
    }
}
