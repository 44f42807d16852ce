//! gpt-oss's harmony chat format, as its published chat template renders it (openai/gpt-oss-120b
//! `chat_template.jinja` after OpenAI's fix of it; the copy read is ggml-org/llama.cpp
//! `models/templates/openai-gpt-oss-120b.jinja`, committed as
//! `tests/fixtures/templates/openai-gpt-oss-120b.jinja` and rendered against this in the tests;
//! an earlier copy, EchoCog/gpt-oss-20b @ f81fef1, ended calls with `<|end|>`, wrote the tools'
//! channel line without tools and no blank line after the instructions): a system message the template writes itself
//! (identity, knowledge cutoff, today's date, reasoning effort, the valid channels), a
//! developer message with the client's system prompt as `# Instructions` and its tools as a
//! TypeScript-like `functions` namespace, then `<|start|>{role}<|message|>...<|end|>` turns.
//! The model answers in channels: `analysis` (its reasoning), `final` (the answer), and
//! `commentary` addressed `to=functions.NAME` for a tool call whose JSON arguments end at
//! `<|call|>`. [`parse`] splits an answer into those parts.

use serde_json::Value;

use super::conversation::{ToolCall, ToolSpec};

/// The system message: what the template writes from its defaults (model identity, reasoning
/// effort `effort`) and today's date; where the developer message defines tools, the channel
/// their calls go to.
pub fn system_message(effort: &str, tools: bool) -> String {
    format!(
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n\
         Knowledge cutoff: 2024-06\nCurrent date: {}\n\nReasoning: {effort}\n\n\
         # Valid channels: analysis, commentary, final. Channel must be included for every \
         message.{}<|end|>",
        today(),
        if tools {
            "\nCalls to these tools must go to the commentary channel: 'functions'."
        } else {
            ""
        }
    )
}

/// The developer message, when there are instructions (the client's system prompt) or tools.
pub fn developer_message(instructions: Option<&str>, tools: &[ToolSpec]) -> String {
    if instructions.is_none_or(str::is_empty) && tools.is_empty() {
        return String::new();
    }
    let mut out = "<|start|>developer<|message|>".to_string();
    if let Some(i) = instructions.filter(|i| !i.is_empty()) {
        out.push_str("# Instructions\n\n");
        out.push_str(i);
        out.push_str("\n\n");
    }
    if !tools.is_empty() {
        out.push_str("# Tools\n\n");
        out.push_str(&namespace(tools));
    }
    out.push_str("<|end|>");
    out
}

/// The template's `render_tool_namespace("functions", tools)`.
fn namespace(tools: &[ToolSpec]) -> String {
    let mut out = "## functions\n\nnamespace functions {\n\n".to_string();
    for t in tools {
        out.push_str(&format!("// {}\ntype {} = (", t.description, t.name));
        let props = t.parameters.get("properties").and_then(Value::as_object);
        match props.filter(|p| !p.is_empty()) {
            Some(props) => {
                let required = required(&t.parameters);
                out.push_str("_: {\n");
                let n = props.len();
                for (i, (name, spec)) in props.iter().enumerate() {
                    let desc = spec
                        .get("description")
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    out.push_str(&format!("// {desc}\n{name}"));
                    if !required.contains(&name.as_str()) {
                        out.push('?');
                    }
                    out.push_str(": ");
                    out.push_str(&ts_type(spec));
                    if let Some(d) = spec.get("default") {
                        out.push_str(&format!(", // default: {d}"));
                    }
                    if i + 1 < n {
                        out.push_str(",\n");
                    }
                }
                out.push_str(",\n}) => any;\n");
            }
            None => out.push_str("\n}) => any;\n"),
        }
    }
    out.push_str("\n} // namespace functions");
    out
}

fn required(schema: &Value) -> Vec<&str> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The template's `render_typescript_type` for the common JSON Schema types.
fn ts_type(spec: &Value) -> String {
    let nullable = if spec.get("nullable").and_then(Value::as_bool) == Some(true) {
        " | null"
    } else {
        ""
    };
    match spec.get("type").and_then(Value::as_str) {
        Some("array") => {
            let inner = match spec.get("items") {
                None => return format!("any[]{nullable}"),
                Some(items) => match items.get("type").and_then(Value::as_str) {
                    Some("string") => "string".to_string(),
                    Some("number" | "integer") => "number".to_string(),
                    Some("boolean") => "boolean".to_string(),
                    _ => {
                        let t = ts_type(items);
                        if t == "object | object" || t.len() > 50 {
                            return format!("any[]{nullable}");
                        }
                        t
                    }
                },
            };
            format!("{inner}[]{nullable}")
        }
        Some("string") => match spec.get("enum").and_then(Value::as_array) {
            Some(e) => {
                let v: Vec<&str> = e.iter().filter_map(Value::as_str).collect();
                format!("\"{}\"", v.join("\" | \""))
            }
            None => format!("string{nullable}"),
        },
        Some("number" | "integer") => "number".into(),
        Some("boolean") => "boolean".into(),
        Some("object") => match spec.get("properties").and_then(Value::as_object) {
            Some(props) if !props.is_empty() => {
                let req = required(spec);
                let fields: Vec<String> = props
                    .iter()
                    .map(|(k, v)| {
                        let q = if req.contains(&k.as_str()) { "" } else { "?" };
                        format!("{k}{q}: {}", ts_type(v))
                    })
                    .collect();
                format!("{{\n{}}}", fields.join(", "))
            }
            _ => "object".into(),
        },
        _ => "any".into(),
    }
}

/// An assistant turn's tool call, as the template renders it: ended by `<|call|>`, the token
/// the model ended it with (the published template wrote `<|end|>` until OpenAI's fix of it).
pub fn render_call(c: &ToolCall) -> String {
    format!(
        "<|start|>assistant to=functions.{}<|channel|>commentary json<|message|>{}<|call|>",
        c.name, c.arguments
    )
}

/// A tool's result, addressed back to the assistant (the template writes its content as a
/// JSON string).
pub fn render_result(name: &str, content: &str) -> String {
    format!(
        "<|start|>functions.{name} to=assistant<|channel|>commentary<|message|>{}<|end|>",
        Value::String(content.to_string())
    )
}

/// An answer in channels.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Answer {
    /// The `analysis` channel's text (the reasoning), its messages joined by newlines.
    pub reasoning: String,
    /// The `final` channel's text (the answer proper).
    pub content: String,
    pub calls: Vec<ToolCall>,
}

/// Whether `text` is written in harmony's channels.
pub fn is_harmony(text: &str) -> bool {
    text.contains("<|channel|>")
}

/// Splits a harmony answer (the text after the prompt's `<|start|>assistant`) into its
/// channels: each message is a header (`<|channel|>NAME`, maybe ` to=functions.F`, maybe
/// `<|constrain|>json`), `<|message|>`, and a body up to `<|end|>`, `<|call|>`, `<|return|>`
/// or the end of the text; a message is opened by `<|start|>assistant` after the first.
pub fn parse(text: &str) -> Answer {
    let mut a = Answer::default();
    for msg in text.split("<|start|>") {
        let msg = msg.strip_prefix("assistant").unwrap_or(msg);
        let Some((header, body)) = msg.split_once("<|message|>") else {
            continue;
        };
        let body = ["<|end|>", "<|call|>", "<|return|>"]
            .iter()
            .filter_map(|m| body.find(m))
            .min()
            .map_or(body, |at| &body[..at]);
        let channel = header
            .split("<|channel|>")
            .nth(1)
            .map(|c| c.split([' ', '<']).next().unwrap_or(""))
            .unwrap_or("");
        let to = header
            .split("to=")
            .nth(1)
            .map(|t| t.split([' ', '<']).next().unwrap_or(""));
        match (channel, to) {
            (_, Some(target)) if target.starts_with("functions.") => {
                let name = &target["functions.".len()..];
                let arguments = serde_json::from_str::<Value>(body.trim())
                    .map(|v| v.to_string())
                    .unwrap_or_else(|_| body.trim().to_string());
                a.calls.push(ToolCall {
                    id: format!("call_{}", a.calls.len()),
                    name: name.to_string(),
                    arguments,
                });
            }
            ("analysis", _) => {
                if !a.reasoning.is_empty() {
                    a.reasoning.push('\n');
                }
                a.reasoning.push_str(body);
            }
            _ => a.content.push_str(body),
        }
    }
    a
}

/// Today's date (UTC) as `YYYY-MM-DD`, as the template's `strftime_now("%Y-%m-%d")` writes it.
fn today() -> String {
    super::strftime::Civil::now().format("%Y-%m-%d")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_splits_into_reasoning_content_and_calls() {
        let text = "<|channel|>analysis<|message|>User wants weather.<|end|>\
                    <|start|>assistant<|channel|>commentary to=functions.get_weather \
                    <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>";
        let a = parse(text);
        assert_eq!(a.reasoning, "User wants weather.");
        assert_eq!(a.content, "");
        assert_eq!(a.calls.len(), 1);
        assert_eq!(a.calls[0].name, "get_weather");
        assert_eq!(a.calls[0].arguments, r#"{"city":"Paris"}"#);
        let text = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant\
                    <|channel|>final<|message|>It is sunny.<|return|>";
        let a = parse(text);
        assert_eq!(
            (a.reasoning.as_str(), a.content.as_str()),
            ("Think.", "It is sunny.")
        );
        assert!(a.calls.is_empty());
        // `to=` before the channel, as the template renders a call; cut short at the end.
        let a = parse(" to=functions.f<|channel|>commentary json<|message|>{\"a\": 1");
        assert_eq!(
            (a.calls[0].name.as_str(), a.calls[0].arguments.as_str()),
            ("f", "{\"a\": 1")
        );
    }

    #[test]
    fn the_developer_message_holds_instructions_and_the_tools_namespace() {
        let tool = ToolSpec {
            name: "get_weather".into(),
            description: "Weather of a city".into(),
            parameters: serde_json::json!({"type": "object", "required": ["city"],
                "properties": {"city": {"type": "string", "description": "The city"},
                               "unit": {"type": "string", "enum": ["c", "f"],
                                        "description": "Unit"}}}),
            schema_text: String::new(),
        };
        assert_eq!(
            developer_message(Some("Be brief."), &[tool]),
            "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n\
             ## functions\n\nnamespace functions {\n\n// Weather of a city\n\
             type get_weather = (_: {\n// The city\ncity: string,\n// Unit\n\
             unit?: \"c\" | \"f\",\n}) => any;\n\n} // namespace functions<|end|>"
        );
        assert_eq!(developer_message(None, &[]), "");
        assert_eq!(
            developer_message(Some("Be brief."), &[]),
            "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>"
        );
        assert!(!system_message("low", false).contains("Calls to these tools"));
        let s = system_message("medium", true);
        assert!(
            s.starts_with("<|start|>system<|message|>You are ChatGPT"),
            "{s}"
        );
        assert!(s.contains("\nReasoning: medium\n\n# Valid channels: analysis, commentary, final."));
        let date = &s[s.find("Current date: ").unwrap() + 14..][..10];
        assert!(
            date.starts_with("20") && date.as_bytes()[4] == b'-',
            "{date}"
        );
    }

    /// gpt-oss's published template (the copy read: ggml-org/llama.cpp
    /// `models/templates/openai-gpt-oss-120b.jinja`, what a GGUF carries as
    /// `tokenizer.chat_template`) rendered by the engine's jinja gives the built-in's bytes:
    /// a conversation with instructions, tools, a call and its result, and a plain first turn.
    #[test]
    fn the_published_template_renders_as_the_built_in() {
        use super::super::chat::ChatTemplate;
        use super::super::checkpoint_chat::CheckpointTemplate;
        use super::super::conversation::{render_builtin, Conversation, Message, Role};
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let path = root.join("tests/fixtures/templates/openai-gpt-oss-120b.jinja");
        let source = std::fs::read_to_string(&path).unwrap();
        let t = CheckpointTemplate::from_source(
            source,
            path.display().to_string(),
            "<|startoftext|>".into(),
            "<|return|>".into(),
        )
        .unwrap();
        let tool = ToolSpec {
            name: "get_weather".into(),
            description: "Weather of a city".into(),
            parameters: serde_json::json!({"type": "object", "required": ["city"],
                "properties": {"city": {"type": "string", "description": "The city"}}}),
            schema_text: String::new(),
        };
        let mut call = Message::new(Role::Assistant, "");
        call.tool_calls.push(ToolCall {
            id: "call_1".into(),
            name: "get_weather".into(),
            // As Python's `tojson` spells the arguments (the template re-serializes them;
            // the built-in writes the call's text as the model wrote it).
            arguments: r#"{"city": "Paris"}"#.into(),
        });
        let conv = Conversation {
            messages: vec![
                Message::new(Role::System, "Be brief."),
                Message::new(Role::User, "Weather?"),
                call,
                Message::new(Role::Tool, "sunny"),
            ],
            tools: vec![tool.clone()],
            max_effort: false,
        };
        let messages = serde_json::json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1",
                "type": "function", "function": {"name": "get_weather",
                "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "sunny"}
        ]);
        let got = t
            .conversation(messages.as_array().unwrap(), &[tool], true)
            .unwrap();
        assert_eq!(got, render_builtin(ChatTemplate::Harmony, &conv, true));
        for system in [None, Some("Be brief.")] {
            assert_eq!(
                t.turn(system, "Hi", true, true).unwrap(),
                ChatTemplate::Harmony.turn(system, "Hi", true, true),
                "{system:?}"
            );
        }
    }
}
