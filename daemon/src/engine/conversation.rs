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

use super::chat::ChatTemplate;
use super::Engine;
use crate::error::EngineError;

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
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Message {
        Message {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
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
    /// properties in this order (a `Value` sorts them).
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
}

impl Engine {
    /// `conv` as the text the model reads, ending with the opening of the assistant's answer.
    pub fn render_conversation(
        &self,
        conv: &Conversation,
        think: bool,
    ) -> Result<String, EngineError> {
        match &self.checkpoint_chat {
            Some(t) => t.conversation(&conversation_json(conv), &conv.tools, think),
            None => Ok(render_builtin(
                ChatTemplate::for_family(self.model.cfg.family),
                conv,
                think,
            )),
        }
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
        ChatTemplate::DeepSeek => format!(
            "## Tools\nYou have access to the following tools:\n\n{list}\n\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
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
    }
    out
}

/// The built-in template over a whole conversation. The first system message (and the tools
/// block) open it; each later message follows in the family's syntax.
pub fn render_builtin(t: ChatTemplate, conv: &Conversation, think: bool) -> String {
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
        ChatTemplate::ChatMl => {
            if let Some(s) = &system {
                out.push_str(&format!("<|im_start|>system\n{s}<|im_end|>\n"));
            }
        }
        ChatTemplate::DeepSeek => {
            out.push_str(&format!(
                "<｜begin▁of▁sentence｜>{}",
                system.as_deref().unwrap_or("")
            ));
        }
    }
    let mut prev: Option<Role> = None;
    for m in &turns {
        match (t, m.role) {
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
            (_, Role::System) => {}
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
        ChatTemplate::DeepSeek => out.push_str(if think {
            "<｜Assistant｜><think>"
        } else {
            "<｜Assistant｜></think>"
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
        }
    }

    #[test]
    fn one_message_is_the_first_turn_of_every_family() {
        for t in [
            ChatTemplate::Glm,
            ChatTemplate::Glm4,
            ChatTemplate::ChatMl,
            ChatTemplate::DeepSeek,
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
        assert!(qwen.contains("<|im_start|>assistant\n<tool_call>\n{\"arguments\":{\"city\":\"Paris\",\"days\":2},\"name\":\"get_weather\"}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n"), "{qwen}");
        let ds = render_builtin(ChatTemplate::DeepSeek, &c, false);
        assert!(ds.contains("<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\":\"Paris\",\"days\":2}<｜tool▁call▁end｜>"), "{ds}");
    }
}
