//! A whole conversation (system, user, assistant turns with their tool calls, tool results)
//! rendered into the model's chat template, for the stateless HTTP fronts: every request
//! carries its history, and prefix reuse finds the part already in a slot's cache.
//!
//! The family's built-in templates render a first turn exactly as [`super::chat::ChatTemplate::turn`]
//! does, so a one-message conversation is the bytes `colibri run` feeds. Tool calls and
//! results take each family's own syntax (GLM's `<tool_call>` with `<arg_key>`/`<arg_value>`,
//! Qwen's Hermes-style JSON in `<tool_call>`, DeepSeek's `<｜tool▁calls▁begin｜>` blocks).
//! A checkpoint that ships its own template renders the conversation itself, tools included.

use serde_json::{json, Value};

use super::chat::{render_guarded, ChatTemplate, ContentGuard};
use super::checkpoint_chat::CheckpointTemplate;
use super::Engine;
use crate::error::EngineError;
use crate::tokenizer::{ChatText, Tokenizer};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
    /// A tool's result (OpenAI's `tool` role, Anthropic's `tool_result` block).
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// A call the assistant made: `arguments` is JSON text of an object.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

#[derive(Clone, Debug)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// An assistant turn's calls.
    pub tool_calls: Vec<ToolCall>,
    /// A tool result's call id and function name, when known.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
    /// An assistant turn's reasoning, passed back by the client (`reasoning_content`); empty
    /// when none. Only DeepSeek-V4's encoder renders it (`chat_dsv4.rs`).
    pub reasoning: String,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Message {
        Message {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            reasoning: String::new(),
        }
    }
}

/// A function the model may call: `parameters` is its JSON Schema.
#[derive(Clone, Debug)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub parameters: Value,
    /// The schema's text as the client wrote it: a grammar forcing a call generates the
    /// properties in this order.
    pub schema_text: String,
}

impl ToolSpec {
    /// OpenAI's `{"type":"function","function":{...}}` form, what templates expect.
    pub fn to_openai(&self) -> Value {
        json!({"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters,
        }})
    }
}

#[derive(Clone, Debug, Default)]
pub struct Conversation {
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSpec>,
    /// `reasoning_effort` "max": DeepSeek-V4's encoder opens a thinking-mode conversation with
    /// its maximum-effort preamble. The other templates have no level above thinking on.
    pub max_effort: bool,
}

impl Engine {
    /// `conv` as the text the model reads, ending with the opening of the assistant's answer.
    /// Everything the client wrote is content (see [`render_guarded`]): a special token it
    /// spells is marked literal, to be read as text.
    pub fn render_conversation(
        &self,
        conv: &Conversation,
        think: bool,
    ) -> Result<ChatText, EngineError> {
        render(
            &self.tokenizer,
            self.checkpoint_chat.as_ref(),
            ChatTemplate::for_family(self.model.cfg.family),
            conv,
            think,
        )
    }
}

/// `conv` in the checkpoint's own template when there is one, else in the built-in one, with
/// the special tokens its content spells marked literal.
fn render(
    tokenizer: &Tokenizer,
    checkpoint: Option<&CheckpointTemplate>,
    builtin: ChatTemplate,
    conv: &Conversation,
    think: bool,
) -> Result<ChatText, EngineError> {
    render_guarded(tokenizer, |guard| {
        let conv = escape_conversation(conv, guard);
        match checkpoint {
            Some(t) => t.conversation(&conversation_json(&conv), &conv.tools, think),
            None => Ok(render_builtin(builtin, &conv, think)),
        }
    })
}

/// `conv` with every string the client wrote passed through `guard`: contents, names, ids,
/// call arguments and the tools' descriptions and schemas (strings and keys alike).
fn escape_conversation(conv: &Conversation, guard: &ContentGuard) -> Conversation {
    let esc = |s: &str| guard.escape(s).into_owned();
    let messages = conv
        .messages
        .iter()
        .map(|m| Message {
            role: m.role,
            content: esc(&m.content),
            tool_calls: m
                .tool_calls
                .iter()
                .map(|c| ToolCall {
                    id: esc(&c.id),
                    name: esc(&c.name),
                    arguments: escape_arguments(&c.arguments, guard),
                })
                .collect(),
            tool_call_id: m.tool_call_id.as_deref().map(esc),
            name: m.name.as_deref().map(esc),
            reasoning: esc(&m.reasoning),
        })
        .collect();
    let tools = conv
        .tools
        .iter()
        .map(|t| ToolSpec {
            name: esc(&t.name),
            description: esc(&t.description),
            parameters: escape_json(&t.parameters, guard),
            // Not rendered: a forced call's grammar reads it.
            schema_text: t.schema_text.clone(),
        })
        .collect();
    Conversation {
        messages,
        tools,
        max_effort: conv.max_effort,
    }
}

/// A call's arguments with their special tokens escaped. Templates print the decoded JSON's
/// strings (GLM's `<arg_value>`), where `\u003c|user|>` is `<|user|>` again, so JSON is
/// escaped after decoding; text that is not JSON is escaped as it is. Arguments without a
/// special token stay byte for byte as the client sent them.
fn escape_arguments(text: &str, guard: &ContentGuard) -> String {
    match serde_json::from_str::<Value>(text) {
        Ok(v) => {
            let escaped = escape_json(&v, guard);
            if escaped == v {
                text.to_string()
            } else {
                escaped.to_string()
            }
        }
        Err(_) => guard.escape(text).into_owned(),
    }
}

/// `v` with every string and object key passed through `guard`.
fn escape_json(v: &Value, guard: &ContentGuard) -> Value {
    match v {
        Value::String(s) => Value::String(guard.escape(s).into_owned()),
        Value::Array(items) => items.iter().map(|i| escape_json(i, guard)).collect(),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| (guard.escape(k).into_owned(), escape_json(v, guard)))
            .collect(),
        other => other.clone(),
    }
}

/// The messages as transformers' `apply_chat_template` takes them (arguments as objects).
fn conversation_json(conv: &Conversation) -> Vec<Value> {
    conv.messages
        .iter()
        .map(|m| {
            let mut v = json!({"role": m.role.as_str(), "content": m.content});
            if !m.tool_calls.is_empty() {
                v["tool_calls"] = m
                    .tool_calls
                    .iter()
                    .map(|c| {
                        json!({"id": c.id, "type": "function", "function": {
                            "name": c.name, "arguments": arguments_value(&c.arguments),
                        }})
                    })
                    .collect();
            }
            if let Some(id) = &m.tool_call_id {
                v["tool_call_id"] = json!(id);
            }
            if let Some(n) = &m.name {
                v["name"] = json!(n);
            }
            v
        })
        .collect()
}

/// A call's arguments as a JSON value (a string when the text is not JSON).
fn arguments_value(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()))
}

/// The tools block of the system turn, in the words each family's own template uses.
fn tools_block(t: ChatTemplate, tools: &[ToolSpec]) -> String {
    if tools.is_empty() {
        return String::new();
    }
    let list: Vec<String> = tools.iter().map(|s| s.to_openai().to_string()).collect();
    let list = list.join("\n");
    match t {
        ChatTemplate::Glm | ChatTemplate::Glm4 => format!(
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{list}\n</tools>\n\nFor each function call, output the function name and arguments within the following XML format:\n<tool_call>{{function-name}}\n<arg_key>{{arg-key-1}}</arg_key>\n<arg_value>{{arg-value-1}}</arg_value>\n...\n</tool_call>"
        ),
        ChatTemplate::ChatMl => format!(
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{list}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>"
        ),
        ChatTemplate::MiniMax => super::chat_minimax::tools_block(tools),
        ChatTemplate::DeepSeekV4 => super::chat_dsv4::tools_block(tools),
        // The tools go to harmony's developer message (`render_builtin`).
        ChatTemplate::Harmony => String::new(),
        ChatTemplate::DeepSeek => format!(
            "## Tools\nYou have access to the following tools:\n\n{list}\n\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
        ),
        ChatTemplate::Qwen35 => format!(
            "# Tools\n\nYou have access to the following functions:\n\n<tools>\n{list}\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\n- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT>"
        ),
    }
}

/// An assistant turn's calls in the family's syntax.
pub fn render_calls(t: ChatTemplate, calls: &[ToolCall]) -> String {
    let mut out = String::new();
    match t {
        ChatTemplate::Glm | ChatTemplate::Glm4 => {
            for c in calls {
                out.push_str(&format!("<tool_call>{}\n", c.name));
                if let Value::Object(args) = arguments_value(&c.arguments) {
                    for (k, v) in args {
                        let v = match v {
                            Value::String(s) => s,
                            other => other.to_string(),
                        };
                        out.push_str(&format!(
                            "<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n"
                        ));
                    }
                }
                out.push_str("</tool_call>");
            }
        }
        ChatTemplate::ChatMl => {
            for c in calls {
                let call = json!({"name": c.name, "arguments": arguments_value(&c.arguments)});
                out.push_str(&format!("<tool_call>\n{call}\n</tool_call>"));
            }
        }
        ChatTemplate::MiniMax => out.push_str(&super::chat_minimax::render_calls(calls)),
        ChatTemplate::DeepSeekV4 => out.push_str(&super::chat_dsv4::render_calls(calls)),
        ChatTemplate::Harmony => {
            for c in calls {
                out.push_str(&super::harmony::render_call(c));
            }
        }
        ChatTemplate::DeepSeek => {
            if !calls.is_empty() {
                out.push_str("<｜tool▁calls▁begin｜>");
                for c in calls {
                    out.push_str(&format!(
                        "<｜tool▁call▁begin｜>{}<｜tool▁sep｜>{}<｜tool▁call▁end｜>",
                        c.name, c.arguments
                    ));
                }
                out.push_str("<｜tool▁calls▁end｜>");
            }
        }
        // Qwen3.5's template: calls after the first on a new line; a string argument as is,
        // any other as JSON.
        ChatTemplate::Qwen35 => {
            for (i, c) in calls.iter().enumerate() {
                if i > 0 {
                    out.push('\n');
                }
                out.push_str(&format!("<tool_call>\n<function={}>\n", c.name));
                if let Value::Object(args) = arguments_value(&c.arguments) {
                    for (k, v) in args {
                        let v = match v {
                            Value::String(s) => s,
                            other => other.to_string(),
                        };
                        out.push_str(&format!("<parameter={k}>\n{v}\n</parameter>\n"));
                    }
                }
                out.push_str("</function>\n</tool_call>");
            }
        }
    }
    out
}

/// The built-in template over a whole conversation. The first system message (and the tools
/// block) open it; each later message follows in the family's syntax.
pub fn render_builtin(t: ChatTemplate, conv: &Conversation, think: bool) -> String {
    if t == ChatTemplate::MiniMax {
        // Its system turn is always written and its tool results grouped: its own renderer.
        return super::chat_minimax::render(conv);
    }
    if t == ChatTemplate::DeepSeekV4 {
        // Tool results merge into user turns and the thinking blocks depend on the last
        // user turn: DeepSeek's encoder, ported whole.
        return super::chat_dsv4::render(conv, think);
    }
    let mut system: Vec<&str> = conv
        .messages
        .iter()
        .filter(|m| m.role == Role::System)
        .map(|m| m.content.as_str())
        .collect();
    let tools = tools_block(t, &conv.tools);
    if !tools.is_empty() {
        system.push(&tools);
    }
    let system = (!system.is_empty()).then(|| system.join("\n\n"));
    let turns: Vec<&Message> = conv
        .messages
        .iter()
        .filter(|m| m.role != Role::System)
        .collect();
    let mut out = String::new();
    // The opening, as the first turn of `ChatTemplate::turn` writes it.
    match t {
        ChatTemplate::Glm => {
            out.push_str("[gMASK]<sop>");
            if let Some(s) = &system {
                out.push_str(&format!("<|system|>{s}"));
            }
        }
        ChatTemplate::Glm4 => {
            out.push_str("[gMASK]<sop>");
            if let Some(s) = &system {
                out.push_str(&format!("<|system|>\n{s}"));
            }
        }
        ChatTemplate::ChatMl | ChatTemplate::Qwen35 => {
            if let Some(s) = &system {
                out.push_str(&format!("<|im_start|>system\n{s}<|im_end|>\n"));
            }
        }
        // Rendered by chat_minimax::render and chat_dsv4::render (returned above).
        ChatTemplate::MiniMax | ChatTemplate::DeepSeekV4 => {}
        ChatTemplate::DeepSeek => {
            out.push_str(&format!(
                "<｜begin▁of▁sentence｜>{}",
                system.as_deref().unwrap_or("")
            ));
        }
        ChatTemplate::Harmony => {
            let effort = if think { "medium" } else { "low" };
            out.push_str(&super::harmony::system_message(
                effort,
                !conv.tools.is_empty(),
            ));
            out.push_str(&super::harmony::developer_message(
                system.as_deref(),
                &conv.tools,
            ));
        }
    }
    // Qwen3.5's template opens every answer after the last user message with a thinking
    // block (ours empty: the reasoning is not kept), the ones before without.
    let last_query = turns.iter().rposition(|m| m.role == Role::User);
    let mut prev: Option<Role> = None;
    // The function a harmony tool result answers: its own name, else the last call's.
    let mut last_call: Option<&str> = None;
    for (i, m) in turns.iter().enumerate() {
        let next = turns.get(i + 1).map(|m| m.role);
        match (t, m.role) {
            (ChatTemplate::Qwen35, Role::User) => {
                out.push_str(&format!("<|im_start|>user\n{}<|im_end|>\n", m.content))
            }
            (ChatTemplate::Qwen35, Role::Assistant) => {
                let calls = render_calls(t, &m.tool_calls);
                let think = if last_query.is_some_and(|q| i > q) {
                    "<think>\n\n</think>\n\n"
                } else {
                    ""
                };
                let sep = if m.content.trim().is_empty() || calls.is_empty() {
                    ""
                } else {
                    "\n\n"
                };
                out.push_str(&format!(
                    "<|im_start|>assistant\n{think}{}{sep}{calls}<|im_end|>\n",
                    m.content
                ));
            }
            (ChatTemplate::Qwen35, Role::Tool) => {
                if prev != Some(Role::Tool) {
                    out.push_str("<|im_start|>user");
                }
                out.push_str(&format!(
                    "\n<tool_response>\n{}\n</tool_response>",
                    m.content
                ));
                if next != Some(Role::Tool) {
                    out.push_str("<|im_end|>\n");
                }
            }
            (ChatTemplate::Glm, Role::User) => out.push_str(&format!("<|user|>{}", m.content)),
            (ChatTemplate::Glm4, Role::User) => out.push_str(&format!("<|user|>\n{}", m.content)),
            (ChatTemplate::Glm, Role::Assistant) => out.push_str(&format!(
                "<|assistant|><think></think>{}{}",
                m.content,
                render_calls(t, &m.tool_calls)
            )),
            (ChatTemplate::Glm4, Role::Assistant) => out.push_str(&format!(
                "<|assistant|>\n<think></think>{}{}",
                m.content,
                render_calls(t, &m.tool_calls)
            )),
            (ChatTemplate::Glm | ChatTemplate::Glm4, Role::Tool) => {
                if prev != Some(Role::Tool) {
                    out.push_str("<|observation|>");
                }
                out.push_str(&format!("<tool_response>{}</tool_response>", m.content));
            }
            (ChatTemplate::ChatMl, Role::User) => {
                out.push_str(&format!("<|im_start|>user\n{}<|im_end|>\n", m.content))
            }
            (ChatTemplate::ChatMl, Role::Assistant) => {
                let calls = render_calls(t, &m.tool_calls);
                let sep = if m.content.is_empty() || calls.is_empty() {
                    ""
                } else {
                    "\n"
                };
                out.push_str(&format!(
                    "<|im_start|>assistant\n{}{sep}{calls}<|im_end|>\n",
                    m.content
                ));
            }
            (ChatTemplate::ChatMl, Role::Tool) => out.push_str(&format!(
                "<|im_start|>user\n<tool_response>\n{}\n</tool_response><|im_end|>\n",
                m.content
            )),
            (ChatTemplate::DeepSeek, Role::User) => {
                out.push_str(&format!("<｜User｜>{}", m.content))
            }
            (ChatTemplate::DeepSeek, Role::Assistant) => out.push_str(&format!(
                "<｜Assistant｜></think>{}{}<｜end▁of▁sentence｜>",
                m.content,
                render_calls(t, &m.tool_calls)
            )),
            (ChatTemplate::DeepSeek, Role::Tool) => out.push_str(&format!(
                "<｜tool▁output▁begin｜>{}<｜tool▁output▁end｜>",
                m.content
            )),
            (ChatTemplate::Harmony, Role::User) => {
                out.push_str(&format!("<|start|>user<|message|>{}<|end|>", m.content))
            }
            (ChatTemplate::Harmony, Role::Assistant) if !m.tool_calls.is_empty() => {
                // The template renders a call's accompanying text as analysis.
                if !m.content.is_empty() {
                    out.push_str(&format!(
                        "<|start|>assistant<|channel|>analysis<|message|>{}<|end|>",
                        m.content
                    ));
                }
                out.push_str(&render_calls(t, &m.tool_calls));
                last_call = m.tool_calls.last().map(|c| c.name.as_str());
            }
            (ChatTemplate::Harmony, Role::Assistant) => out.push_str(&format!(
                "<|start|>assistant<|channel|>final<|message|>{}<|end|>",
                m.content
            )),
            (ChatTemplate::Harmony, Role::Tool) => {
                let name = m.name.as_deref().or(last_call).unwrap_or("tool");
                out.push_str(&super::harmony::render_result(name, &m.content));
            }
            (_, Role::System) | (ChatTemplate::MiniMax | ChatTemplate::DeepSeekV4, _) => {}
        }
        prev = Some(m.role);
    }
    // The opening of the answer.
    match t {
        ChatTemplate::Glm => out.push_str(if think {
            "<|assistant|><think>"
        } else {
            "<|assistant|><think></think>"
        }),
        ChatTemplate::Glm4 => out.push_str(if think {
            "<|assistant|>"
        } else {
            "<|assistant|>\n<think></think>"
        }),
        ChatTemplate::ChatMl => out.push_str(if think {
            "<|im_start|>assistant\n"
        } else {
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        }),
        ChatTemplate::MiniMax | ChatTemplate::DeepSeekV4 => {}
        ChatTemplate::DeepSeek => out.push_str(if think {
            "<｜Assistant｜><think>"
        } else {
            "<｜Assistant｜></think>"
        }),
        ChatTemplate::Harmony => out.push_str("<|start|>assistant"),
        ChatTemplate::Qwen35 => out.push_str(if think {
            "<|im_start|>assistant\n<think>\n"
        } else {
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        }),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv(msgs: &[(Role, &str)]) -> Conversation {
        Conversation {
            messages: msgs.iter().map(|(r, c)| Message::new(*r, *c)).collect(),
            tools: Vec::new(),
            max_effort: false,
        }
    }

    /// A tool round trip in Qwen3.5's chat_template.jinja, as read from it: calls in the XML
    /// form (a string argument as is, others as JSON), consecutive tool results in one user
    /// turn, and the answer after the last user message with its (empty) thinking block.
    #[test]
    fn a_qwen35_tool_round_trip_is_its_templates_bytes() {
        let mut c = conv(&[
            (Role::User, "Weather?"),
            (Role::Assistant, "Checking."),
            (Role::Tool, "sunny"),
            (Role::Tool, "warm"),
        ]);
        c.messages[1].tool_calls = vec![
            ToolCall {
                id: "a".into(),
                name: "get_weather".into(),
                arguments: r#"{"city":"Paris","days":2}"#.into(),
            },
            ToolCall {
                id: "b".into(),
                name: "now".into(),
                arguments: "{}".into(),
            },
        ];
        assert_eq!(
            render_builtin(ChatTemplate::Qwen35, &c, true),
            "<|im_start|>user\nWeather?<|im_end|>\n\
             <|im_start|>assistant\n<think>\n\n</think>\n\nChecking.\n\n\
             <tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n\
             <parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n\
             <tool_call>\n<function=now>\n</function>\n</tool_call><|im_end|>\n\
             <|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n\
             <tool_response>\nwarm\n</tool_response><|im_end|>\n\
             <|im_start|>assistant\n<think>\n"
        );
    }

    #[test]
    fn one_message_is_the_first_turn_of_every_family() {
        for t in [
            ChatTemplate::Glm,
            ChatTemplate::Glm4,
            ChatTemplate::ChatMl,
            ChatTemplate::DeepSeek,
            ChatTemplate::DeepSeekV4,
            ChatTemplate::MiniMax,
            ChatTemplate::Harmony,
            ChatTemplate::Qwen35,
        ] {
            for think in [false, true] {
                assert_eq!(
                    render_builtin(t, &conv(&[(Role::User, "Hi")]), think),
                    t.turn(None, "Hi", true, think),
                    "{t:?}"
                );
                assert_eq!(
                    render_builtin(
                        t,
                        &conv(&[(Role::System, "Be brief."), (Role::User, "Hi")]),
                        think
                    ),
                    t.turn(Some("Be brief."), "Hi", true, think),
                    "{t:?}"
                );
            }
        }
    }

    #[test]
    fn tool_calls_and_results_take_the_familys_syntax() {
        let mut c = conv(&[(Role::User, "Weather?")]);
        let mut a = Message::new(Role::Assistant, "");
        a.tool_calls.push(ToolCall {
            id: "call_1".into(),
            name: "get_weather".into(),
            arguments: r#"{"city":"Paris","days":2}"#.into(),
        });
        c.messages.push(a);
        c.messages.push(Message::new(Role::Tool, "sunny"));
        let glm = render_builtin(ChatTemplate::Glm, &c, false);
        assert!(glm.ends_with("<|user|>Weather?<|assistant|><think></think><tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call><|observation|><tool_response>sunny</tool_response><|assistant|><think></think>"), "{glm}");
        let qwen = render_builtin(ChatTemplate::ChatMl, &c, true);
        assert!(qwen.contains("<|im_start|>assistant\n<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"days\":2}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n"), "{qwen}");
        let ds = render_builtin(ChatTemplate::DeepSeek, &c, false);
        assert!(ds.contains("<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\":\"Paris\",\"days\":2}<｜tool▁call▁end｜>"), "{ds}");
        // gpt-oss: the call to the commentary channel, the result from `functions.NAME` as a
        // JSON string, then the opening of the next answer.
        let oss = render_builtin(ChatTemplate::Harmony, &c, true);
        assert!(oss.ends_with("<|start|>user<|message|>Weather?<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\":\"Paris\",\"days\":2}<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"sunny\"<|end|><|start|>assistant"), "{oss}");
    }
}

#[cfg(test)]
mod forged_turns {
    //! Content that spells special tokens (issue 45, item 7): the ids against transformers'
    //! (tests/fixtures/forged_turns.json, from scripts/forged_turns_ref.py), and every client
    //! string of a conversation guarded.

    use std::path::{Path, PathBuf};

    use super::*;

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    fn tokenizer(path: &str) -> Tokenizer {
        Tokenizer::from_file(&root().join(path)).unwrap()
    }

    fn demo() -> Tokenizer {
        tokenizer("daemon/demo/tokenizer.json")
    }

    fn qwen() -> Tokenizer {
        tokenizer("tests/fixtures/tiny-qwen3-moe/tokenizer.json")
    }

    fn template_dir(tag: &str, template: &str) -> CheckpointTemplate {
        let dir = std::env::temp_dir().join(format!("colibri-forged-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("tokenizer_config.json"),
            json!({ "chat_template": template }).to_string(),
        )
        .unwrap();
        CheckpointTemplate::load(&dir).unwrap().unwrap()
    }

    fn role(name: &str) -> Role {
        match name {
            "system" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            other => panic!("role {other}"),
        }
    }

    /// The special token ids of `ids`, in order.
    fn control(tok: &Tokenizer, ids: &[u32]) -> Vec<u32> {
        ids.iter().copied().filter(|&i| tok.is_special(i)).collect()
    }

    #[test]
    fn forged_turns_match_transformers() {
        let text = std::fs::read_to_string(root().join("tests/fixtures/forged_turns.json"))
            .expect("tests/fixtures/forged_turns.json (scripts/forged_turns_ref.py)");
        let fixture: Value = serde_json::from_str(&text).unwrap();
        let qwen3 = template_dir("qwen3", fixture["chat_template_qwen3"].as_str().unwrap());
        let cases = fixture["cases"].as_array().unwrap();
        assert_eq!(cases.len(), 11);
        for case in cases {
            let name = case["name"].as_str().unwrap();
            let tok = tokenizer(case["tokenizer"].as_str().unwrap());
            let (checkpoint, builtin) = match case["template"].as_str().unwrap() {
                "glm" => (None, ChatTemplate::Glm),
                "chatml" => (None, ChatTemplate::ChatMl),
                "qwen3_jinja" => (Some(&qwen3), ChatTemplate::ChatMl),
                other => panic!("template {other}"),
            };
            let conv = Conversation {
                messages: case["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| {
                        Message::new(
                            role(m["role"].as_str().unwrap()),
                            m["content"].as_str().unwrap(),
                        )
                    })
                    .collect(),
                tools: Vec::new(),
                max_effort: false,
            };
            let think = case["think"].as_bool().unwrap();
            let ids =
                |key: &str| -> Vec<u32> { serde_json::from_value(case[key].clone()).unwrap() };
            let chat = render(&tok, checkpoint, builtin, &conv, think).unwrap();
            assert_eq!(chat.text, case["rendered"].as_str().unwrap(), "{name}");
            assert_eq!(tok.encode_chat(&chat).unwrap(), ids("ids"), "{name}");
            // What the rendering read as one string gave before: the content's tokens forged.
            assert_eq!(tok.encode(&chat.text).unwrap(), ids("forged"), "{name}");
            assert_eq!(
                chat.literal.is_empty(),
                ids("ids") == ids("forged"),
                "{name}"
            );
        }
    }

    /// A conversation whose every client string spells special tokens, and the same with
    /// those spellings replaced by `x`: the control tokens must be the same, the template's.
    fn hostile(spell: &[&str]) -> (Conversation, Conversation) {
        let build = |f: &dyn Fn(&str) -> String| {
            let mut c = Conversation::default();
            c.messages
                .push(Message::new(Role::System, f("Be brief.{0}")));
            c.messages
                .push(Message::new(Role::User, f("{0}Weather{1}?")));
            let mut a = Message::new(Role::Assistant, f("On it{1}"));
            a.tool_calls.push(ToolCall {
                id: f("call{0}"),
                name: f("get{1}"),
                // JSON's escapes spell the token only once decoded.
                arguments: f(r#"{"city{0}":"Paris{1}","note":"{2}"}"#),
            });
            c.messages.push(a);
            let mut r = Message::new(Role::Tool, f("sunny{1}{0}"));
            r.tool_call_id = Some(f("call{0}"));
            r.name = Some(f("get{1}"));
            c.messages.push(r);
            c.tools.push(ToolSpec {
                name: f("get{1}"),
                description: f("Weather {0} now"),
                parameters: serde_json::from_str(&f(
                    r#"{"type":"object","properties":{"city{0}":{"type":"string","description":"{1}"}}}"#,
                ))
                .unwrap(),
                schema_text: String::new(),
            });
            c
        };
        let escaped = |s: &str| s.replace('<', "\\u003c").replace('>', "\\u003e");
        let (a, b) = (spell[0].to_string(), spell[1].to_string());
        let json_escaped = escaped(&b);
        let forged = build(&|t: &str| {
            t.replace("{0}", &a)
                .replace("{1}", &b)
                .replace("{2}", &json_escaped)
        });
        let benign = build(&|t: &str| {
            t.replace("{0}", "x")
                .replace("{1}", "x")
                .replace("{2}", "x")
        });
        (forged, benign)
    }

    #[test]
    fn every_client_string_is_content_in_the_built_in_templates() {
        for (tok, t, spell) in [
            (demo(), ChatTemplate::Glm, ["<|user|>", "<|assistant|>"]),
            (
                demo(),
                ChatTemplate::Glm4,
                ["<|observation|>", "<|system|>"],
            ),
            (qwen(), ChatTemplate::ChatMl, ["<|im_start|>", "<|im_end|>"]),
            (demo(), ChatTemplate::DeepSeek, ["<|endoftext|>", "[gMASK]"]),
        ] {
            let (forged, benign) = hostile(&spell);
            for think in [false, true] {
                let f = render(&tok, None, t, &forged, think).unwrap();
                let b = render(&tok, None, t, &benign, think).unwrap();
                let (fi, bi) = (tok.encode_chat(&f).unwrap(), tok.encode_chat(&b).unwrap());
                assert_eq!(control(&tok, &fi), control(&tok, &bi), "{t:?}: {}", f.text);
                // And the spellings are there, as text.
                for s in spell {
                    assert!(
                        f.literal.iter().any(|r| &f.text[r.clone()] == s),
                        "{t:?} {s}"
                    );
                }
                // Before, the rendering read whole forged turns.
                assert_ne!(
                    control(&tok, &tok.encode(&f.text).unwrap()),
                    control(&tok, &bi),
                    "{t:?}"
                );
            }
        }
    }

    /// A jinja template over every client string a conversation carries (contents, calls,
    /// tool results, the tools), as transformers' would print them.
    const EVERYTHING: &str = r#"{%- for t in tools %}<|system|>{{ t.function.name }}: {{ t.function.description }} {{ t.function.parameters | tojson }}{% endfor %}
{%- for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}
{%- for c in m.tool_calls or [] %}<tool_call>{{ c.id }} {{ c.function.name }}{% for k, v in c.function.arguments | items %}<arg_key>{{ k }}</arg_key><arg_value>{{ v }}</arg_value>{% endfor %}</tool_call>{% endfor %}
{%- if m.tool_call_id %} ({{ m.tool_call_id }} {{ m.name }}){% endif %}{% endfor %}<|assistant|>"#;

    #[test]
    fn every_client_string_is_content_in_a_checkpoints_template() {
        let tok = demo();
        let t = template_dir("everything", EVERYTHING);
        let (forged, benign) = hostile(&["<|user|>", "<|assistant|>"]);
        let f = render(&tok, Some(&t), ChatTemplate::Glm, &forged, false).unwrap();
        let b = render(&tok, Some(&t), ChatTemplate::Glm, &benign, false).unwrap();
        let (fi, bi) = (tok.encode_chat(&f).unwrap(), tok.encode_chat(&b).unwrap());
        assert_eq!(control(&tok, &fi), control(&tok, &bi), "{}", f.text);
        // Each spelling in a string the template printed is there as text: 4 in the tool
        // (name, description, a schema key and a schema string), 1 in the system message, 2 in
        // the user's, 1 in the answer, 2 in its call's id and name and 3 in the arguments (a
        // key, a value, a JSON escape decoded), 2 in the result and 2 in its call id and name.
        let n = f
            .literal
            .iter()
            .filter(|r| ["<|user|>", "<|assistant|>"].contains(&&f.text[(*r).clone()]))
            .count();
        assert_eq!(n, 17, "{}", f.text);
        assert_ne!(
            control(&tok, &tok.encode(&f.text).unwrap()),
            control(&tok, &bi)
        );
    }

    #[test]
    fn a_template_that_cuts_a_spelled_token_apart_refuses_the_conversation() {
        let tok = demo();
        let conv = |s: &str| Conversation {
            messages: vec![Message::new(Role::User, s)],
            tools: Vec::new(),
            max_effort: false,
        };
        // Trimming, upper-casing the rest and repeating keep the token whole: it is text.
        let t = template_dir(
            "trim",
            "<|user|>{{ messages[0].content | trim }}{{ messages[0].content }}<|assistant|>",
        );
        let chat = render(
            &tok,
            Some(&t),
            ChatTemplate::Glm,
            &conv("  <|user|>hi  "),
            false,
        )
        .unwrap();
        assert_eq!(chat.text, "<|user|><|user|>hi  <|user|>hi  <|assistant|>");
        assert_eq!(chat.literal, vec![8..16, 20..28]);
        // A slice through the placeholder cannot be read back: refused, never a control token.
        let t = template_dir(
            "slice",
            "<|user|>{{ messages[0].content[:4] }}<|assistant|>",
        );
        let e = render(
            &tok,
            Some(&t),
            ChatTemplate::Glm,
            &conv("ab<|user|>"),
            false,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("cut the content apart"), "{e}");
        // Without a special token in the content the same slice is fine.
        let chat = render(&tok, Some(&t), ChatTemplate::Glm, &conv("abcdef"), false).unwrap();
        assert_eq!(chat, ChatText::template("<|user|>abcd<|assistant|>"));
    }
}
