use std::sync::Arc;

use super::*;

fn g(text: &str) -> Arc<Grammar> {
    Arc::new(Grammar::from_gbnf(text).unwrap_or_else(|e| panic!("{e}\n{text}")))
}

/// Whether the whole of `s` is a sentence of the grammar.
fn accepts(g: &Arc<Grammar>, s: &[u8]) -> bool {
    let mut st = GrammarState::new(g.clone());
    st.advance_bytes(s) && st.accepting()
}

/// Whether `s` is a prefix of some sentence.
fn prefix(g: &Arc<Grammar>, s: &[u8]) -> bool {
    GrammarState::new(g.clone()).allows(s)
}

#[test]
fn literals_alternation_groups() {
    let gr = g(r#"root ::= "a" ("b" | "cd") "e"  # comment"#);
    assert!(accepts(&gr, b"abe"));
    assert!(accepts(&gr, b"acde"));
    assert!(!accepts(&gr, b"ace"));
    assert!(!accepts(&gr, b"ab"));
    assert!(prefix(&gr, b"ac"));
    assert!(!prefix(&gr, b"x"));
}

#[test]
fn repetitions() {
    let gr = g("root ::= \"x\"* \"y\"+ \"z\"? [0-9]{2,3} \"w\"{2} \"v\"{1,}\n");
    assert!(accepts(&gr, b"y12wwv"));
    assert!(accepts(&gr, b"xxxyyz123wwvvv"));
    assert!(!accepts(&gr, b"12wwv")); // y+ needs one
    assert!(!accepts(&gr, b"y1wwv")); // {2,3}
    assert!(!accepts(&gr, b"y1234wwv"));
    assert!(!accepts(&gr, b"y12wv"));
    assert!(!accepts(&gr, b"y12ww"));
}

#[test]
fn classes_ranges_negation_and_unicode() {
    let gr = g(r#"root ::= [a-cX] [^a-z] . "é\u00e8\U0001F600\x41\n\"\\""#);
    assert!(accepts(&gr, "aZ€éè😀A\n\"\\".as_bytes()));
    assert!(accepts(&gr, "X!xéè😀A\n\"\\".as_bytes()));
    assert!(!accepts(&gr, "dZxéè😀A\n\"\\".as_bytes()));
    assert!(!accepts(&gr, "aqxéè😀A\n\"\\".as_bytes()));
    // The class works per byte: a two-byte character arrives in two pieces.
    let gr = g("root ::= [^a-z]+\n");
    let mut st = GrammarState::new(gr.clone());
    let e = "é".as_bytes();
    assert!(st.advance_bytes(&e[..1]));
    assert!(!st.accepting(), "half a character is not a sentence");
    assert!(st.advance_bytes(&e[1..]));
    assert!(st.accepting());
    // Not valid UTF-8 after a lead byte.
    assert!(!st.allows(&[0xC3, 0x41]));
}

#[test]
fn multi_line_rules_and_references() {
    let gr = g(r#"
# a list of items
root ::= item ("," item)*
item ::= "a" |
         "b" | sub
sub  ::= (
    "c"
    "d"
)
"#);
    assert!(accepts(&gr, b"a,b,cd"));
    assert!(!accepts(&gr, b"a,c"));
}

#[test]
fn right_recursion_does_not_grow_the_stack() {
    let gr = g("root ::= \"a\" root | \"b\"\n");
    let mut st = GrammarState::new(gr);
    for _ in 0..10_000 {
        assert!(st.advance_bytes(b"a"));
    }
    assert!(st.frames_held() < 16, "{}", st.frames_held());
    assert!(st.advance_bytes(b"b"));
    assert!(st.complete());
}

#[test]
fn forced_bytes_stop_at_a_choice() {
    let gr = g(r#"root ::= "{\"id\":" ("1" | "2") "}""#);
    let mut st = GrammarState::new(gr);
    assert_eq!(st.forced_bytes(64), b"{\"id\":");
    let mut st2 = st.clone();
    assert!(st2.advance_bytes(b"{\"id\":2"));
    assert_eq!(st2.forced_bytes(64), b"}");
    assert!(st2.advance_bytes(b"}"));
    assert!(st2.complete());
    assert!(st2.forced_bytes(64).is_empty());
}

fn err(text: &str) -> GrammarError {
    match Grammar::from_gbnf(text) {
        Ok(_) => panic!("accepted: {text}"),
        Err(e) => e,
    }
}

#[test]
fn errors_name_the_position() {
    let e = err("root ::= \"a\"\nitem ::= \"b\" | [a-\n");
    assert_eq!((e.line, e.col), (2, 16), "{e}");
    assert!(e.msg.contains("]"), "{e}");

    let e = err("root ::= foo\n");
    assert_eq!((e.line, e.col, e.offset), (1, 10, 9), "{e}");
    assert!(e.msg.contains("`foo` is never defined"), "{e}");

    let e = err("root ::= \"abc\n");
    assert_eq!((e.line, e.col), (1, 10), "{e}");

    let e = err("root := \"a\"\n");
    assert_eq!((e.line, e.col), (1, 6), "{e}");
    assert!(e.msg.contains("::="), "{e}");

    let e = err("root ::= \"a\"{3,2}\n");
    assert_eq!((e.line, e.col), (1, 16), "{e}");

    let e = err("root ::= \"\\q\"\n");
    assert_eq!((e.line, e.col), (1, 11), "{e}");

    let e = err("item ::= \"a\"\n");
    assert!(e.msg.contains("root"), "{e}");

    let e = err("root ::= x\nx ::= x \"a\" | \"b\"\n");
    assert_eq!(e.line, 2, "{e}");
    assert!(e.msg.contains("left recursion"), "{e}");

    let e = err("root ::= \"a\" x\nx ::= \"b\" x\n");
    assert_eq!(e.line, 2, "{e}");
    assert!(e.msg.contains("can finish"), "{e}");

    let e = err("root ::= \"a\" )\n");
    assert_eq!((e.line, e.col), (1, 14), "{e}");

    // Display carries the position.
    assert!(err("root ::= [\n")
        .to_string()
        .starts_with("grammar error at line 1, column 10"));
}

fn trie(tokens: &[&str]) -> TokenTrie {
    TokenTrie::new(
        tokens.len(),
        tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (i as u32, t.as_bytes())),
    )
}

#[test]
fn mask_follows_partial_tokens_and_prefixes() {
    let toks = [
        "{", "{\"", "\"", "a", "ab", "b\"}", "}", "x", "é", "\u{e9}\"", "",
    ];
    let t = trie(&toks);
    let gr = g(r#"root ::= "{\"" [a-zé]+ "\"}""#);
    let mut st = GrammarState::new(gr);
    let mut allowed = vec![false; toks.len()];
    let allowed_names = |st: &mut GrammarState, allowed: &mut Vec<bool>| -> Vec<&str> {
        st.fill_mask(&t, allowed);
        (0..toks.len())
            .filter(|&i| allowed[i])
            .map(|i| toks[i])
            .collect()
    };
    assert_eq!(allowed_names(&mut st, &mut allowed), vec!["{", "{\""]);
    assert!(st.advance_bytes(b"{"));
    assert_eq!(allowed_names(&mut st, &mut allowed), vec!["\""]);
    assert!(st.advance_bytes(b"\""));
    assert_eq!(
        allowed_names(&mut st, &mut allowed),
        vec!["a", "ab", "b\"}", "x", "é", "é\""]
    );
    assert!(st.advance_bytes("é".as_bytes()));
    assert!(allowed_names(&mut st, &mut allowed).contains(&"\""));
    assert!(st.advance_bytes(b"\"}"));
    assert!(st.complete());
    assert!(allowed_names(&mut st, &mut allowed).is_empty());
}

fn schema(text: &str) -> Arc<Grammar> {
    Arc::new(Grammar::from_json_schema(text).unwrap_or_else(|e| panic!("{e}\n{text}")))
}

#[test]
fn json_schema_object_with_required_and_optional() {
    let gr = schema(
        r#"{"type":"object","properties":{
            "name":{"type":"string"},
            "age":{"type":"integer"},
            "tags":{"type":"array","items":{"enum":["a","b"]}},
            "ok":{"type":"boolean"},
            "score":{"type":["number","null"]}
        },"required":["name","ok"]}"#,
    );
    assert!(accepts(&gr, br#"{"name":"x","ok":true}"#));
    assert!(accepts(
        &gr,
        br#"{"name":"x","age":-3,"tags":["a","b"],"ok":false,"score":null}"#
    ));
    assert!(accepts(
        &gr,
        br#"{ "name": "\u00e9 \"q\"", "ok": true, "score": 1.5e3 }"#
    ));
    assert!(accepts(
        &gr,
        "{\"name\":\"日本語 é\",\"ok\":true}".as_bytes()
    ));
    assert!(!accepts(&gr, br#"{"ok":true}"#), "name is required");
    assert!(!accepts(&gr, br#"{"ok":true,"name":"x"}"#), "schema order");
    assert!(!accepts(&gr, br#"{"name":"x","ok":true,}"#));
    assert!(!accepts(&gr, br#"{"name":"x","tags":["c"],"ok":true}"#));
    assert!(!accepts(&gr, br#"{"name":"x","age":1.5,"ok":true}"#));
    assert!(!accepts(&gr, br#"{"name":"x","age":-0,"ok":true}"#));
    assert!(accepts(&gr, br#"{"name":"x","ok":true,"score":-0.5}"#));
    assert!(
        !accepts(&gr, br#"{"name":"x","ok":true} "#),
        "nothing after the value"
    );
    // Every accepted sentence is JSON.
    for s in [
        r#"{"name":"x","ok":true}"#,
        r#"{"name":"x","age":-3,"tags":["a","b"],"ok":false,"score":null}"#,
    ] {
        serde_json::from_str::<serde_json::Value>(s).unwrap();
    }
}

#[test]
fn json_schema_arrays_strings_and_any() {
    let gr = schema(
        r#"{"type":"array","items":{"type":"string","maxLength":2},"minItems":1,"maxItems":2}"#,
    );
    assert!(accepts(&gr, br#"["ab"]"#));
    assert!(accepts(&gr, r#"["", "é"]"#.as_bytes()));
    assert!(!accepts(&gr, br#"[]"#));
    assert!(!accepts(&gr, br#"["a","b","c"]"#));
    assert!(!accepts(&gr, br#"["abc"]"#));
    let any = schema("{}");
    assert!(accepts(&any, br#"{"a":[1,{"b":null}],"c":"d"}"#));
    assert!(!accepts(&any, br#"{"a":}"#));
    let c = schema(r#"{"anyOf":[{"const":{"k":1}},{"type":"integer"}]}"#);
    assert!(accepts(&c, br#"{"k":1}"#));
    assert!(accepts(&c, b"42"));
    assert!(!accepts(&c, br#"{"k":2}"#));
}

#[test]
fn json_schema_errors_name_where() {
    let e = Grammar::from_json_schema("{\"type\":\n \"object\",}").unwrap_err();
    assert_eq!(e.line, 2, "{e}");
    let e = Grammar::from_json_schema(r#"{"properties":{"a":{"pattern":"x+"}}}"#).unwrap_err();
    assert!(
        e.msg.contains("/properties/a") && e.msg.contains("pattern"),
        "{e}"
    );
    let e = Grammar::from_json_schema(r#"{"type":"thing"}"#).unwrap_err();
    assert!(e.msg.contains("unknown type `thing`"), "{e}");
    let e = Grammar::from_json_schema(r#"{"properties":{"a":{}},"required":["b"]}"#).unwrap_err();
    assert!(e.msg.contains("`b`"), "{e}");
}

#[test]
fn request_text_picks_the_format() {
    assert!(Grammar::from_request(b"  {\"type\":\"integer\"}").is_ok());
    assert!(Grammar::from_request(b"root ::= \"a\"").is_ok());
    let e = Grammar::from_request(b"root ::= \xff").unwrap_err();
    assert_eq!(e.offset, 9);
}

/// The trie walk (with its whole-subtree shortcut) against feeding every token on its own,
/// on the demo model's real vocabulary, at states inside and between JSON tokens.
#[test]
fn mask_equals_token_by_token_check_on_the_demo_vocabulary() {
    let tok = crate::tokenizer::Tokenizer::from_bytes(include_bytes!("../../demo/tokenizer.json"))
        .unwrap();
    let n = tok.vocab_size();
    let trie = TokenTrie::new(n, (0..n as u32).map(|id| (id, tok.token_bytes(id))));
    let gr = schema(
        r#"{"type":"object","properties":{"name":{"type":"string"},"n":{"type":"number"},
            "list":{"type":"array","items":{"enum":["é","x"]}}},"required":["name"]}"#,
    );
    let mut allowed = vec![false; n];
    for prefix in [
        "",
        "{",
        "{\"name\": \"The quick ",
        "{\"name\": \"caf\u{e9}",
        "{\"name\":\"a\\",
        "{\"name\":\"a\\u00",
        "{\"name\":\"a\",\"n\":-1.5",
        "{\"name\":\"a\",\"list\":[\"",
        "{\"name\":\"a\"}",
    ] {
        let mut st = GrammarState::new(gr.clone());
        assert!(st.advance_bytes(prefix.as_bytes()), "{prefix}");
        let count = st.fill_mask(&trie, &mut allowed);
        assert_eq!(count, allowed.iter().filter(|&&a| a).count(), "{prefix}");
        for id in 0..n as u32 {
            let bytes = tok.token_bytes(id);
            let want = !bytes.is_empty() && st.allows(bytes);
            assert_eq!(
                allowed[id as usize], want,
                "{prefix:?} token {id} {bytes:?}"
            );
        }
    }
}
