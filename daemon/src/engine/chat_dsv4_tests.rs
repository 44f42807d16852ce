//! The encoder's bytes: tests/fixtures/dsv4-chat-cases.json holds conversations rendered by
//! DeepSeek's `encoding_dsv4.py` (scripts/dsv4_encoding_cases.py), in chat and thinking mode,
//! some at `reasoning_effort` "max" or "high", some with earlier answers' reasoning.

use serde_json::Value;

use super::super::conversation::{Conversation, Message, Role, ToolCall, ToolSpec};
use super::*;

/// An OpenAI request's messages and tools as the API builds them.
fn conversation(messages: &Value, tools: &Value, effort: &Value) -> Conversation {
    let role = |r: &str| match r {
        "system" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "tool" => Role::Tool,
        other => panic!("role {other} in the fixture"),
    };
    let messages = messages
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let mut msg = Message::new(
                role(m["role"].as_str().unwrap()),
                m["content"].as_str().unwrap(),
            );
            msg.tool_call_id = m["tool_call_id"].as_str().map(String::from);
            msg.reasoning = m["reasoning_content"].as_str().unwrap_or("").into();
            for c in m["tool_calls"].as_array().into_iter().flatten() {
                msg.tool_calls.push(ToolCall {
                    id: c["id"].as_str().unwrap().into(),
                    name: c["function"]["name"].as_str().unwrap().into(),
                    arguments: c["function"]["arguments"].as_str().unwrap().into(),
                });
            }
            msg
        })
        .collect();
    let tools = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| ToolSpec {
            name: t["function"]["name"].as_str().unwrap().into(),
            description: t["function"]["description"].as_str().unwrap().into(),
            parameters: t["function"]["parameters"].clone(),
            schema_text: String::new(),
        })
        .collect();
    let max_effort = match effort.as_str() {
        None | Some("high") => false,
        Some("max") => true,
        Some(other) => panic!("reasoning_effort {other} in the fixture"),
    };
    Conversation {
        messages,
        tools,
        max_effort,
    }
}

fn cases() -> Vec<Value> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/dsv4-chat-cases.json");
    let text = std::fs::read_to_string(&path).unwrap();
    serde_json::from_str::<Value>(&text)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn every_case_is_the_published_encoders_bytes() {
    let cases = cases();
    assert!(cases.len() >= 28, "{} cases", cases.len());
    for case in &cases {
        let conv = conversation(&case["messages"], &case["tools"], &case["reasoning_effort"]);
        let think = case["thinking"].as_bool().unwrap();
        assert_eq!(
            render(&conv, think),
            case["expected"].as_str().unwrap(),
            "case {} (thinking {think})",
            case["name"]
        );
    }
}

/// `run --chat`'s first turn is the conversation of that one turn; a later turn closes the
/// answer before with its stop token, as the encoder renders the answer.
#[test]
fn turns_are_the_encoders_conversation_of_one_turn() {
    for think in [false, true] {
        for system in [None, Some("Be brief.")] {
            let mut messages = Vec::new();
            if let Some(s) = system {
                messages.push(Message::new(Role::System, s));
            }
            messages.push(Message::new(Role::User, "Hi"));
            let conv = Conversation {
                messages,
                tools: Vec::new(),
                max_effort: false,
            };
            assert_eq!(turn(system, "Hi", true, think), render(&conv, think));
        }
    }
    assert_eq!(
        turn(None, "More", false, false),
        "<｜end▁of▁sentence｜><｜User｜>More<｜Assistant｜></think>"
    );
}

/// The parts of a DSML call: string values as they are, others as Python's JSON, arguments
/// that are no JSON object as one `arguments` string.
#[test]
fn calls_write_strings_as_is_and_other_values_as_json() {
    let call = |arguments: &str| ToolCall {
        id: "c".into(),
        name: "f".into(),
        arguments: arguments.into(),
    };
    assert_eq!(
        render_calls(&[call(r#"{"s":"a \"q\"","n":[1,{"b":null}]}"#)]),
        "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n\
         <｜DSML｜parameter name=\"s\" string=\"true\">a \"q\"</｜DSML｜parameter>\n\
         <｜DSML｜parameter name=\"n\" string=\"false\">[1, {\"b\": null}]</｜DSML｜parameter>\n\
         </｜DSML｜invoke>\n</｜DSML｜tool_calls>"
    );
    assert!(render_calls(&[call("[1]")])
        .contains("<｜DSML｜parameter name=\"arguments\" string=\"true\">[1]</｜DSML｜parameter>"));
    assert_eq!(render_calls(&[]), "");
}

/// The fixture's cases of the two features, so that a fixture without them cannot pass: the
/// preamble is written in thinking mode at "max" only, and a passed-back reasoning is in the
/// prompt exactly where the encoder keeps it.
#[test]
fn the_fixture_covers_max_effort_and_passed_back_reasoning() {
    let cases = cases();
    let preamble = |c: &Value| c["expected"].as_str().unwrap().contains(EFFORT_MAX);
    let at = |effort: &str, think: bool| {
        cases
            .iter()
            .filter(|c| c["reasoning_effort"] == effort && c["thinking"] == think)
            .collect::<Vec<_>>()
    };
    assert!(at("max", true).len() >= 3 && at("max", true).iter().all(|c| preamble(c)));
    assert!(!at("max", false).is_empty() && !at("max", false).iter().any(|c| preamble(c)));
    assert!(!at("high", true).is_empty() && !at("high", true).iter().any(|c| preamble(c)));
    let loop_case = cases
        .iter()
        .find(|c| c["name"] == "reasoning_in_a_tool_loop" && c["thinking"] == true)
        .unwrap();
    let text = loop_case["expected"].as_str().unwrap();
    for r in [
        "I need the weather tool.",
        "The tool said sunny.",
        "Call again, days=2.",
    ] {
        assert!(text.contains(&format!("<think>{r}</think>")), "{r}");
    }
    // Dropped before the last user turn without tools, kept after it.
    let before = cases
        .iter()
        .find(|c| c["name"] == "reasoning_before_the_last_user_turn" && c["thinking"] == true)
        .unwrap();
    let text = before["expected"].as_str().unwrap();
    assert!(
        !text.contains("think about a") && text.contains("<think>now c\nin two lines</think>d")
    );
}
