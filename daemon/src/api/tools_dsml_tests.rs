use serde_json::Value;

use super::super::tools::{parse_calls, Hold, ToolMode};

fn args(call: &crate::engine::conversation::ToolCall) -> Value {
    serde_json::from_str(&call.arguments).unwrap()
}

/// The calls DeepSeek's encoder writes (tests/fixtures/dsv4-chat-cases.json, from its
/// `encoding_dsv4.py`) parse back to the calls it was given: names, and arguments as the
/// same JSON values (strings with `string="true"`, numbers, objects, arrays, booleans with
/// `string="false"`).
#[test]
fn the_encoders_calls_parse_back() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/dsv4-chat-cases.json");
    let cases: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut checked = 0;
    for case in cases.as_array().unwrap() {
        let text = case["expected"].as_str().unwrap();
        for (m, answer) in case["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "assistant")
            .zip(text.split("<｜Assistant｜>").skip(1))
        {
            let Some(calls) = m["tool_calls"].as_array() else {
                continue;
            };
            // The answer as the model writes it: after the thinking switch, to its stop.
            let answer = answer.split("<｜end▁of▁sentence｜>").next().unwrap();
            let answer = answer.rsplit("</think>").next().unwrap();
            let (content, parsed) = parse_calls(answer);
            assert_eq!(content, m["content"].as_str().unwrap(), "{answer}");
            assert_eq!(parsed.len(), calls.len(), "{answer}");
            for (want, got) in calls.iter().zip(&parsed) {
                assert_eq!(got.name, want["function"]["name"].as_str().unwrap());
                let raw = want["function"]["arguments"].as_str().unwrap();
                let want = serde_json::from_str::<Value>(raw)
                    .ok()
                    .filter(Value::is_object)
                    .unwrap_or_else(|| serde_json::json!({ "arguments": raw }));
                assert_eq!(args(got), want, "{answer}");
            }
            checked += 1;
        }
    }
    assert!(checked >= 4, "{checked} answers with calls checked");
}

#[test]
fn values_follow_the_string_flag() {
    let text = "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n\
        <｜DSML｜parameter name=\"n\" string=\"true\">2</｜DSML｜parameter>\n\
        <｜DSML｜parameter name=\"m\" string=\"false\"> 2 </｜DSML｜parameter>\n\
        <｜DSML｜parameter name=\"bad\" string=\"false\">not json</｜DSML｜parameter>\n\
        <｜DSML｜parameter name=\"bare\">[1]</｜DSML｜parameter>\n\
        <｜DSML｜parameter name=\"n\" string=\"true\">3</｜DSML｜parameter>\n\
        </｜DSML｜invoke>\n<｜DSML｜invoke name=\"g\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    let (content, calls) = parse_calls(text);
    assert_eq!(content, "");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].name, "f");
    assert_eq!(
        calls[0].arguments,
        r#"{"n":"3","m":2,"bad":"not json","bare":[1]}"#
    );
    assert_eq!(
        (calls[1].name.as_str(), calls[1].arguments.as_str()),
        ("g", "{}")
    );
    // Cut at the stop token: the block without its close still parses.
    let (_, calls) = parse_calls(
        "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"q\" string=\"true\">a b</｜DSML｜parameter>\n</｜DSML｜invoke>\n",
    );
    assert_eq!(calls[0].arguments, r#"{"q":"a b"}"#);
}

#[test]
fn a_malformed_block_leaves_the_answer_as_text() {
    for text in [
        "<｜DSML｜tool_calls>\n</｜DSML｜tool_calls>",
        "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"q\" string=\"true\">open\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
        "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
        "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"q\" string=\"maybe\">x</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
        "<｜DSML｜tool_calls>\nstray text\n</｜DSML｜tool_calls>",
        "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls> and more",
    ] {
        let (content, calls) = parse_calls(text);
        assert!(calls.is_empty(), "{text}");
        assert_eq!(content, text);
    }
}

/// A streamed `auto` answer: the text before the block goes out as it comes, the blank line
/// and a split marker are held until told apart, the block comes back as the call.
#[test]
fn a_streamed_call_is_held_out_of_the_content() {
    let mut h = Hold::new(ToolMode::Auto);
    let mut sent = String::new();
    for piece in [
        "Checking.\n",
        "\n<｜DS",
        "ML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"q\" string=\"false\">",
        "{\"a\": [1, 2]}</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
    ] {
        sent.push_str(&h.push(piece));
    }
    assert_eq!(sent, "Checking.");
    let (rest, calls) = h.finish();
    assert_eq!(rest, "");
    assert_eq!(
        (calls[0].name.as_str(), calls[0].arguments.as_str()),
        ("f", r#"{"q":{"a":[1,2]}}"#)
    );
    // Newlines that no block follows go out.
    let mut h = Hold::new(ToolMode::Auto);
    assert_eq!(h.push("a\n\n"), "a");
    assert_eq!(h.push("b"), "\n\nb");
}
