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
    // Strict mode names a keyword the grammar cannot enforce, with its schema path.
    let e = json_schema::compile(r#"{"properties":{"a":{"multipleOf":2}}}"#, true).unwrap_err();
    assert!(e.msg.contains("$.properties.a.multipleOf"), "{e}");
    let e = Grammar::from_json_schema(r#"{"type":"thing"}"#).unwrap_err();
    assert!(e.msg.contains("unknown type `thing`"), "{e}");
    let e = Grammar::from_json_schema(r##"{"$ref":"#/$defs/nope"}"##).unwrap_err();
    assert!(e.msg.contains("$.$ref") && e.msg.contains("nope"), "{e}");
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

/// A deterministic generator, so a failing walk can be replayed.
struct Rng(crate::rng::XorShift64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        (self.0.next_u64() % n as u64) as usize
    }
}

/// A random sentence of the grammar: each byte drawn among those it allows next, ending
/// (when it may) one time in `stop_one_in`; `None` past `max` bytes.
fn random_sentence(
    g: &Arc<Grammar>,
    rng: &mut Rng,
    stop_one_in: usize,
    max: usize,
) -> Option<Vec<u8>> {
    let mut st = GrammarState::new(g.clone());
    let mut out = Vec::new();
    loop {
        if st.accepting() && (!st.can_continue() || rng.below(stop_one_in) == 0) {
            return Some(out);
        }
        if out.len() >= max {
            return None;
        }
        let ok = st.next_bytes();
        let choices: Vec<u8> = (0..=255u8).filter(|&b| ok[b as usize]).collect();
        let b = choices[rng.below(choices.len())];
        assert!(
            st.advance_bytes(&[b]),
            "a byte next_bytes allows is accepted"
        );
        out.push(b);
    }
}

const TWO_53: f64 = 9_007_199_254_740_992.0;

#[test]
fn every_number_the_grammar_admits_parses_as_a_finite_f64() {
    let number = schema(r#"{"type":"number"}"#);
    let integer = schema(r#"{"type":"integer"}"#);
    // The extremes: the longest digit runs and exponents admitted are finite, and integers
    // stay within 2^53.
    for s in [
        "999999999999999.9999999999999999e99",
        "-999999999999999.9999999999999999E+99",
        "0.0000000000000001e-99",
        "-0.0000000000000001E-99",
        "999999999999999",
        "0e00",
    ] {
        assert!(accepts(&number, s.as_bytes()), "{s}");
        let v: f64 = serde_json::from_str(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        assert!(v.is_finite(), "{s}");
    }
    for s in ["999999999999999", "-999999999999999", "0", "7"] {
        assert!(accepts(&integer, s.as_bytes()), "{s}");
        let v: i64 = serde_json::from_str(s).unwrap();
        assert!((v as f64).abs() < TWO_53, "{s}");
    }
    // One digit more anywhere, and what a model wrote in the wild, are refused.
    for s in [
        "1e999",
        "2102E+406",
        "1e100",
        "1234567890123456",
        "1234567890123456.5",
        "1.12345678901234567",
        "9007199254740993",
    ] {
        assert!(!accepts(&number, s.as_bytes()), "{s}");
    }
    for s in [
        "1234567890123456",
        "9007199254740993",
        "-1234567890123456",
        "1e5",
        "-0",
    ] {
        assert!(!accepts(&integer, s.as_bytes()), "{s}");
    }
    // And what a walk over the grammar writes, ending late so digit runs reach their bounds.
    let mut rng = Rng(crate::rng::XorShift64(0x9E37_79B9_7F4A_7C15));
    for _ in 0..3000 {
        let s = random_sentence(&number, &mut rng, 40, 200).expect("numbers are short");
        let v: f64 = serde_json::from_slice(&s)
            .unwrap_or_else(|e| panic!("{}: {e}", String::from_utf8_lossy(&s)));
        assert!(v.is_finite(), "{}", String::from_utf8_lossy(&s));
        let s = random_sentence(&integer, &mut rng, 40, 200).expect("integers are short");
        let v: i64 = serde_json::from_slice(&s)
            .unwrap_or_else(|e| panic!("{}: {e}", String::from_utf8_lossy(&s)));
        assert!((v as f64).abs() < TWO_53, "{v}");
    }
}

#[test]
fn every_value_any_rule_admits_parses() {
    // Numbers reach the output through `value`, `anyOf`, `enum` and `const` as well; strings
    // through escapes. Whatever a walk writes must parse in serde_json (the strictest
    // client parser: it refuses numbers past f64 and lone surrogates).
    let gr = schema(
        r#"{"type":"object","properties":{
            "any":{},
            "one":{"anyOf":[{"type":"number"},{"type":"integer"},{"type":"string"}]},
            "pick":{"enum":[1e300,-12345678901234567890,0.5,"x"]},
            "fixed":{"const":{"n":[1.5e-300,18446744073709551615]}},
            "list":{"type":"array","items":{"type":["number","null","string"]}}
        },"required":["any","one","pick","fixed","list"]}"#,
    );
    let mut rng = Rng(crate::rng::XorShift64(0x2545_F491_4F6C_DD1D));
    let mut parsed = 0;
    for _ in 0..3000 {
        let Some(s) = random_sentence(&gr, &mut rng, 8, 600) else {
            continue;
        };
        let v: serde_json::Value = serde_json::from_slice(&s)
            .unwrap_or_else(|e| panic!("{}: {e}", String::from_utf8_lossy(&s)));
        assert!(v.is_object());
        parsed += 1;
    }
    assert!(parsed > 100, "only {parsed} walks ended");
}

#[test]
fn unicode_escapes_are_scalar_values_or_surrogate_pairs() {
    let gr = schema(r#"{"type":"string"}"#);
    for s in [
        r#""\u00e9""#,
        r#""\ud83d\ude00""#,
        r#""\uD83D\uDE00x""#,
        r#""\uffff""#,
    ] {
        assert!(accepts(&gr, s.as_bytes()), "{s}");
        serde_json::from_str::<String>(s).unwrap();
    }
    for s in [
        r#""\ud800""#,
        r#""\udc00""#,
        r#""\ud800x""#,
        r#""\ud800\u0041""#,
    ] {
        assert!(!accepts(&gr, s.as_bytes()), "{s}");
        assert!(serde_json::from_str::<String>(s).is_err(), "{s}");
    }
}

/// A schema of `n` properties: `required` lists every other one when `some_required`.
fn wide_object(n: usize, some_required: bool) -> String {
    let props: Vec<String> = (0..n)
        .map(|i| format!(r#""key{i}":{{"type":"integer"}}"#))
        .collect();
    let required: Vec<String> = (0..n)
        .filter(|i| some_required && i % 2 == 1)
        .map(|i| format!(r#""key{i}""#))
        .collect();
    format!(
        r#"{{"type":"object","properties":{{{}}},"required":[{}]}}"#,
        props.join(","),
        required.join(",")
    )
}

/// As [`schema`], not printing the (big) text when it fails.
fn big_schema(text: &str) -> Arc<Grammar> {
    Arc::new(Grammar::from_json_schema(text).unwrap_or_else(|e| panic!("{e}")))
}

/// The best of three timings of `f`, in this thread's CPU time: the other tests of the
/// binary run beside it, and wall time would count their load as this work's.
fn best_of_three(mut f: impl FnMut()) -> std::time::Duration {
    use nix::time::{clock_gettime, ClockId};
    let cpu = || {
        clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID)
            .map(std::time::Duration::from)
            .expect("the thread's CPU clock")
    };
    (0..3)
        .map(|_| {
            let t0 = cpu();
            f();
            cpu().saturating_sub(t0)
        })
        .min()
        .expect("three runs")
}

/// `small` and `big` timings of 10x the work: linear is 10x; allow for caches and page
/// faults (thread CPU time counts the kernel's zeroing of fresh pages, which the big case's
/// allocations meet more often while the suite's other tests allocate beside it: 36x was
/// seen so once in the full suite, where alone it passes), not for the 100x of a quadratic step.
fn assert_linear(what: &str, small: std::time::Duration, big: std::time::Duration) {
    let ratio = big.as_secs_f64() / small.as_secs_f64().max(1e-6);
    assert!(
        ratio < 60.0,
        "{what}: {small:?}, then {big:?} for 10x the size ({ratio:.1}x)"
    );
}

#[test]
fn a_hundred_thousand_keys_compile_in_linear_time() {
    // The schema's JSON and its GBNF at 10k and 100k keys: the duplicate-key check was a
    // scan per key (20 s at 100k), `required` a scan per property.
    for some_required in [false, true] {
        let to_gbnf = |n| {
            let text = wide_object(n, some_required);
            best_of_three(|| {
                json_schema::to_gbnf(&text).expect("the schema converts");
            })
        };
        assert_linear(
            &format!("to_gbnf, some required: {some_required}"),
            to_gbnf(10_000),
            to_gbnf(100_000),
        );
    }
    // Compile and the matcher's first member, end to end, at 10x apart. An object of 100k
    // members is past the compiler's symbol bound (its schema is past `--max-schema-bytes`
    // too), so objects go from 3k to 30k members; enum values and anyOf branches to 100k.
    type Shape = fn(usize) -> (String, Vec<u8>);
    let shapes: [(&str, usize, Shape); 4] = [
        ("optional members", 3_000, |n| {
            let first = format!("{{\"key{}\":1", n - 1);
            (wide_object(n, false), first.into_bytes())
        }),
        ("every other member required", 3_000, |n| {
            (wide_object(n, true), b"{\"key1\":1,\"key3\":2".to_vec())
        }),
        ("enum values", 10_000, |n| {
            let vals: Vec<String> = (0..n).map(|i| i.to_string()).collect();
            let text = format!(r#"{{"enum":[{}]}}"#, vals.join(","));
            (text, (n - 1).to_string().into_bytes())
        }),
        ("anyOf branches", 10_000, |n| {
            let alts: Vec<String> = (0..n).map(|i| format!(r#"{{"const":{i}}}"#)).collect();
            let text = format!(r#"{{"anyOf":[{}]}}"#, alts.join(","));
            (text, (n - 1).to_string().into_bytes())
        }),
    ];
    for (what, small, shape) in shapes {
        let run = |n: usize| {
            let (text, first) = shape(n);
            best_of_three(|| {
                let mut st = GrammarState::new(big_schema(&text));
                assert!(st.advance_bytes(&first), "{what}");
            })
        };
        assert_linear(what, run(small), run(small * 10));
    }
}

#[test]
fn nullable_choices_in_a_row_expand_once() {
    // 60 groups that may each match nothing: the frame after them is reached along 2^60
    // paths, which an expansion that does not remember what it expanded walks one by one.
    let gr = g("root ::= ( \"a\"? | \"b\"? ){60} \"c\"\n");
    assert!(accepts(&gr, b"c"));
    assert!(accepts(&gr, b"abbac"));
    assert!(!accepts(&gr, b"abd"));
}

#[test]
fn nesting_past_the_bound_is_an_error_not_a_stack_overflow() {
    // Each would recurse once per level in the parser, the compiler or the drop.
    let deep_groups = format!(
        "root ::= {}\"a\"{}\n",
        "(".repeat(100_000),
        ")".repeat(100_000)
    );
    assert!(err(&deep_groups).msg.contains("nested"), "deep groups");
    let stacked = format!("root ::= \"a\"{}\n", "?".repeat(100_000));
    assert!(err(&stacked).msg.contains("nested"), "stacked repetitions");
    // Within the bound, still fine.
    assert!(Grammar::from_gbnf(&format!(
        "root ::= {}\"a\"{}\n",
        "(".repeat(100),
        ")".repeat(100)
    ))
    .is_ok());
    // A schema nested past serde_json's depth limit is refused as JSON.
    let deep = format!(
        "{}{}",
        r#"{"type":"array","items":"#.repeat(5000),
        "{}".to_string() + &"}".repeat(5000)
    );
    assert!(Grammar::from_json_schema(&deep).is_err());
    // And one just within it compiles.
    let ok = format!(
        "{}{}",
        r#"{"anyOf":["#.repeat(60),
        "{}".to_string() + &"]}".repeat(60)
    );
    assert!(Grammar::from_json_schema(&ok).is_ok());
}

#[test]
fn a_long_chain_of_optional_members_does_not_grow_the_call_stack() {
    // The first state expands through every optional member's rule, 35k deep: a recursive
    // expansion would take that on the thread's stack, here a small one to make sure.
    let gr = big_schema(&wide_object(35_000, false));
    let walk = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(move || {
            let mut st = GrammarState::new(gr);
            st.advance_bytes(b"{\"key34999\":7}") && st.complete()
        })
        .expect("spawning a thread");
    assert!(walk.join().expect("the walk does not panic"));
}

#[test]
fn the_schema_cache_shares_one_grammar_per_text() {
    let cache = SchemaCache::new(2, 1 << 30);
    let a = r#"{"type":"integer"}"#;
    let b = r#"{"type":"string"}"#;
    let c = r#"{"type":"boolean"}"#;
    let first = cache.json_schema(a).unwrap();
    assert!(Arc::ptr_eq(&first, &cache.json_schema(a).unwrap()));
    assert!(Arc::ptr_eq(&first, &cache.cached(a).unwrap()));
    assert!(!Arc::ptr_eq(&first, &cache.json_schema(b).unwrap()));
    // Two kept, the least recently used goes.
    cache.json_schema(c).unwrap();
    assert_eq!(cache.len(), 2);
    assert!(cache.cached(a).is_none());
    assert!(cache.cached(c).is_some());
    // Errors are errors, not cached grammars.
    assert!(cache.json_schema(r#"{"type":"thing"}"#).is_err());
    assert_eq!(cache.len(), 2);
    // A byte budget: nothing kept that would not fit.
    let small = SchemaCache::new(16, 10);
    small.json_schema(a).unwrap();
    assert!(small.is_empty());
}
