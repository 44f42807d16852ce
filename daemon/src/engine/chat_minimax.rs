//! MiniMax-M2's chat template, built in: what its `chat_template.jinja` renders. The copy
//! read is ggml-org/llama.cpp `models/templates/unsloth-MiniMax-M2.jinja` @
//! a21f05affbf67c90f2ac574f1bdd7197ccbe2369 (kept as tests/fixtures/templates/), Unsloth's
//! fixes of MiniMaxAI/MiniMax-M2's published template. Its rendering (by transformers, and
//! by the engine's jinja: the tests) is this file's, but for one newline after
//! `</minimax:tool_call>` that a comment Unsloth added leaves; the published template, whose
//! structure a second copy mirrors (its `{{- toolcall_end_token}}` followed directly by
//! `{%- set ... %}`), writes none, and neither does this file.
//!
//! ```text
//! ]~!b[]~b]system\n{system, or "You are a helpful assistant."}{tools}[e~[\n
//! ]~b]user\n{text}[e~[\n
//! ]~b]ai\n{content}\n<minimax:tool_call>\n<invoke name="f">\n<parameter name="k">v</parameter>\n</invoke>\n</minimax:tool_call>[e~[\n
//! ]~b]tool\n<response>{result}</response>\n<response>{next result}</response>[e~[\n
//! ]~b]ai\n<think>\n
//! ```
//!
//! The answer always opens in thinking (`<think>\n`): the template has no switch to turn it
//! off, so `think` changes nothing here. Earlier answers are rendered without their
//! reasoning (the template keeps only the reasoning after the last user turn, and the API
//! passes answers' content without it).

use serde_json::Value;

use super::conversation::{Conversation, Role, ToolCall, ToolSpec};

const BEGIN: &str = "]~!b[";
const END: &str = "[e~[\n";
/// The system turn the template writes when the conversation has none.
const DEFAULT_SYSTEM: &str = "You are a helpful assistant.";
const CALL_OPEN: &str = "<minimax:tool_call>";
const CALL_CLOSE: &str = "</minimax:tool_call>";

/// One user turn and the opening of the answer; see `ChatTemplate::turn`. A later turn
/// follows an answer whose stop token (`[e~[`) was sampled but not fed, so it closes it.
pub(super) fn turn(system: Option<&str>, text: &str, first: bool) -> String {
    let open = if first {
        format!(
            "{BEGIN}]~b]system\n{}{END}",
            system.unwrap_or(DEFAULT_SYSTEM)
        )
    } else {
        END.to_string()
    };
    format!("{open}]~b]user\n{text}{END}]~b]ai\n<think>\n")
}

/// The tools part of the system turn.
pub(super) fn tools_block(tools: &[ToolSpec]) -> String {
    if tools.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "\n\n# Tools\nYou may call one or more tools to assist with the user query.\nHere are the tools available in JSONSchema format:\n\n<tools>\n",
    );
    for t in tools {
        out.push_str(&format!(
            "<tool>{}</tool>\n",
            py_json(&t.to_openai()["function"])
        ));
    }
    out.push_str("</tools>\n\nWhen making tool calls, use XML format to invoke tools and pass parameters:\n\n<minimax:tool_call>\n<invoke name=\"tool-name-1\">\n<parameter name=\"param-key-1\">param-value-1</parameter>\n<parameter name=\"param-key-2\">param-value-2</parameter>\n...\n</invoke>\n</minimax:tool_call>");
    out
}

/// An answer's calls: one `<minimax:tool_call>` block of `<invoke>`s; a string argument
/// as it is, any other value as JSON (`tojson`).
pub(super) fn render_calls(calls: &[ToolCall]) -> String {
    if calls.is_empty() {
        return String::new();
    }
    let mut out = format!("{CALL_OPEN}\n");
    for c in calls {
        out.push_str(&format!("<invoke name=\"{}\">\n", c.name));
        if let Ok(Value::Object(args)) = serde_json::from_str::<Value>(&c.arguments) {
            for (k, v) in args {
                let v = match v {
                    Value::String(s) => s,
                    other => py_json(&other),
                };
                out.push_str(&format!("<parameter name=\"{k}\">{v}</parameter>\n"));
            }
        }
        out.push_str("</invoke>\n");
    }
    out.push_str(CALL_CLOSE);
    out
}

/// The whole conversation. The first system message is the system turn (later ones are not
/// rendered, as in the template); a run of tool results shares one `]~b]tool` turn.
pub(super) fn render(conv: &Conversation) -> String {
    let system = conv
        .messages
        .iter()
        .find(|m| m.role == Role::System)
        .map_or(DEFAULT_SYSTEM, |m| m.content.as_str());
    let mut out = format!(
        "{BEGIN}]~b]system\n{system}{}{END}",
        tools_block(&conv.tools)
    );
    let turns: Vec<_> = conv
        .messages
        .iter()
        .filter(|m| m.role != Role::System)
        .collect();
    for (i, m) in turns.iter().enumerate() {
        match m.role {
            Role::User => out.push_str(&format!("]~b]user\n{}{END}", m.content)),
            Role::Assistant => {
                out.push_str("]~b]ai\n");
                out.push_str(&m.content);
                if !m.tool_calls.is_empty() {
                    out.push('\n');
                    out.push_str(&render_calls(&m.tool_calls));
                }
                out.push_str(END);
            }
            Role::Tool => {
                if i == 0 || turns[i - 1].role != Role::Tool {
                    out.push_str("]~b]tool");
                }
                out.push_str(&format!("\n<response>{}</response>", m.content));
                if turns.get(i + 1).is_none_or(|n| n.role != Role::Tool) {
                    out.push_str(END);
                }
            }
            Role::System => {}
        }
    }
    out.push_str("]~b]ai\n<think>\n");
    out
}

/// The template's `tojson`: Python's `json.dumps` (`pyjson.rs`).
fn py_json(v: &Value) -> String {
    super::pyjson::Dumps::default().dumps(v)
}

#[cfg(test)]
mod tests {
    use super::super::conversation::Message;
    use super::*;

    /// A system, user, assistant-with-call, tool, tool conversation with one tool.
    fn weather_conversation() -> Conversation {
        let mut a = Message::new(Role::Assistant, "Let me look.");
        a.tool_calls.push(ToolCall {
            id: "call_1".into(),
            name: "get_weather".into(),
            arguments: r#"{"city":"Paris","days":2}"#.into(),
        });
        Conversation {
            messages: vec![
                Message::new(Role::System, "Be brief."),
                Message::new(Role::User, "Weather?"),
                a,
                Message::new(Role::Tool, "sunny"),
                Message::new(Role::Tool, "18C"),
            ],
            tools: vec![ToolSpec {
                name: "get_weather".into(),
                description: "Weather of a city".into(),
                parameters: serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}}}),
                schema_text: String::new(),
            }],
            max_effort: false,
        }
    }

    /// The published template's bytes for it: transformers' rendering of the template (the
    /// test below), without the newline Unsloth's copy adds after `</minimax:tool_call>`.
    #[test]
    fn a_conversation_with_tools_is_the_templates_bytes() {
        let conv = weather_conversation();
        assert_eq!(
            render(&conv),
            concat!(
                "]~!b[]~b]system\nBe brief.\n\n# Tools\nYou may call one or more tools to assist with the user query.\n",
                "Here are the tools available in JSONSchema format:\n\n<tools>\n",
                "<tool>{\"name\": \"get_weather\", \"description\": \"Weather of a city\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}</tool>\n",
                "</tools>\n\nWhen making tool calls, use XML format to invoke tools and pass parameters:\n\n",
                "<minimax:tool_call>\n<invoke name=\"tool-name-1\">\n<parameter name=\"param-key-1\">param-value-1</parameter>\n",
                "<parameter name=\"param-key-2\">param-value-2</parameter>\n...\n</invoke>\n</minimax:tool_call>[e~[\n",
                "]~b]user\nWeather?[e~[\n",
                "]~b]ai\nLet me look.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n",
                "<parameter name=\"city\">Paris</parameter>\n<parameter name=\"days\">2</parameter>\n",
                "</invoke>\n</minimax:tool_call>[e~[\n",
                "]~b]tool\n<response>sunny</response>\n<response>18C</response>[e~[\n",
                "]~b]ai\n<think>\n"
            )
        );
    }

    /// The template as a checkpoint ships it, rendered by the engine's jinja (as transformers
    /// compiles templates: trimmed blocks, Python's `tojson`), gives transformers' own bytes
    /// (scripts: `render_jinja_template` over the same messages), which are the built-in's but
    /// for one newline: the copy read (llama.cpp's, with Unsloth's fixes) leaves a comment's
    /// newline after `</minimax:tool_call>` that the published template does not write.
    #[test]
    fn the_checkpoints_template_renders_as_transformers_and_the_built_in() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let dir = std::env::temp_dir().join(format!("colibri-minimax-tpl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(
            root.join("tests/fixtures/templates/unsloth-MiniMax-M2.jinja"),
            dir.join("chat_template.jinja"),
        )
        .unwrap();
        let t = super::super::checkpoint_chat::CheckpointTemplate::load(&dir)
            .unwrap()
            .unwrap();
        let conv = weather_conversation();
        let messages = serde_json::json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [{"id": "call_1",
                "type": "function", "function": {"name": "get_weather",
                "arguments": {"city": "Paris", "days": 2}}}]},
            {"role": "tool", "content": "sunny"},
            {"role": "tool", "content": "18C"}
        ]);
        let got = t
            .conversation(messages.as_array().unwrap(), &conv.tools, true)
            .unwrap();
        assert_eq!(
            got,
            render(&conv).replace(
                "</minimax:tool_call>[e~[\n]~b]tool",
                "</minimax:tool_call>\n[e~[\n]~b]tool"
            )
        );
        assert_eq!(
            t.turn(None, "Hi", true, true).unwrap(),
            turn(None, "Hi", true)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn turns_open_the_system_turn_once_and_close_the_answer_before() {
        assert_eq!(
            turn(None, "Hi", true),
            "]~!b[]~b]system\nYou are a helpful assistant.[e~[\n]~b]user\nHi[e~[\n]~b]ai\n<think>\n"
        );
        assert_eq!(
            turn(Some("Be brief."), "More", false),
            "[e~[\n]~b]user\nMore[e~[\n]~b]ai\n<think>\n"
        );
    }
}
