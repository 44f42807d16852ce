//! DeepSeek-V4's chat encoding, built in. DeepSeek ships no jinja template for V4 (its
//! tokenizer_config.json has none): the checkpoint's `encoding/encoding_dsv4.py` renders
//! conversations, and this file is that encoder's `encode_messages` (copy read: supermy/ds4rs
//! `encoding/encoding_dsv4.py` @ 2ecc534c; `scripts/dsv4_encoding_cases.py` renders the cases
//! the tests compare with).
//!
//! ```text
//! <｜begin▁of▁sentence｜>{system}\n\n## Tools ...{tool schemas, one JSON a line}...\n
//! <｜User｜>{text}<｜Assistant｜></think>{content}\n\n<｜DSML｜tool_calls>\n
//! <｜DSML｜invoke name="f">\n<｜DSML｜parameter name="k" string="true">v</｜DSML｜parameter>\n
//! </｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>
//! <｜User｜><tool_result>{result}</tool_result>\n\n{next user text}<｜Assistant｜></think>
//! ```
//!
//! V4 has no tool role: a run of tool results and user messages is one user turn, its parts
//! joined by a blank line, the results in the order of the calls they answer. An answer opens
//! with `<think>` in thinking mode, `</think>` in chat mode. In thinking mode the answers
//! before the last user turn lose their reasoning and their `</think>` (the encoder's
//! `drop_thinking`), unless tools are given: then every answer keeps its `</think>` and every
//! user turn opens thinking. A kept thinking block holds the reasoning the client passed back
//! with the answer (`reasoning_content`), empty without. The tools go on the first message when
//! it is a system message, else on an empty system message put first (vLLM's DeepSeek-V4
//! tokenizer does the same). `reasoning_effort` "max" puts the encoder's preamble before the
//! first message in thinking mode ("high", like no effort, adds nothing).

use serde_json::Value;

use super::conversation::{Conversation, Message, Role, ToolCall, ToolSpec};

const BOS: &str = "<｜begin▁of▁sentence｜>";
const EOS: &str = "<｜end▁of▁sentence｜>";
const USER: &str = "<｜User｜>";
const ASSISTANT: &str = "<｜Assistant｜>";
const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
/// The encoder's `REASONING_EFFORT_MAX`, written before the first message when thinking at
/// effort "max".
const EFFORT_MAX: &str = "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n\
You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n\
Explicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";
/// The prefix of every tool-call tag (`<｜DSML｜invoke`, `</｜DSML｜parameter>`), fullwidth bars.
pub const DSML: &str = "｜DSML｜";

/// One user turn and the opening of the answer; see `ChatTemplate::turn`. The first is what
/// the encoder renders for `[system, user]`; a later one follows an answer whose stop token
/// was sampled but not fed, so it writes it.
pub(super) fn turn(system: Option<&str>, text: &str, first: bool, think: bool) -> String {
    let open = if first {
        format!("{BOS}{}", system.unwrap_or(""))
    } else {
        EOS.to_string()
    };
    let answer = if think { THINK_OPEN } else { THINK_CLOSE };
    format!("{open}{USER}{text}{ASSISTANT}{answer}")
}

/// The tools section the system message ends with (the encoder's `TOOLS_TEMPLATE`).
pub(super) fn tools_block(tools: &[ToolSpec]) -> String {
    let schemas: Vec<String> = tools
        .iter()
        .map(|t| py_json(&t.to_openai()["function"]))
        .collect();
    format!(
        "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by writing a \"<{DSML}tool_calls>\" block like the following:\n\n\
<{DSML}tool_calls>\n<{DSML}invoke name=\"$TOOL_NAME\">\n<{DSML}parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</{DSML}parameter>\n...\n</{DSML}invoke>\n<{DSML}invoke name=\"$TOOL_NAME2\">\n...\n</{DSML}invoke>\n</{DSML}tool_calls>\n\n\
String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n\
If thinking_mode is enabled (triggered by {THINK_OPEN}), you MUST output your complete reasoning inside {THINK_OPEN}...{THINK_CLOSE} BEFORE any tool calls or final response.\n\n\
Otherwise, output directly after {THINK_CLOSE} with tool calls or final response.\n\n\
### Available Tool Schemas\n\n{}\n\n\
You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n",
        schemas.join("\n")
    )
}

/// An answer's calls: one `<｜DSML｜tool_calls>` block after a blank line. A string argument
/// is written as it is with `string="true"`, any other value as JSON with `string="false"`;
/// arguments that are not a JSON object are one string parameter named `arguments` (the
/// encoder's fallback for text that is not JSON).
pub(super) fn render_calls(calls: &[ToolCall]) -> String {
    if calls.is_empty() {
        return String::new();
    }
    let invokes: Vec<String> = calls
        .iter()
        .map(|c| {
            let params: Vec<String> = match serde_json::from_str::<Value>(&c.arguments) {
                Ok(Value::Object(args)) => args.iter().map(|(k, v)| parameter(k, v)).collect(),
                _ => vec![parameter("arguments", &Value::String(c.arguments.clone()))],
            };
            format!(
                "<{DSML}invoke name=\"{}\">\n{}\n</{DSML}invoke>",
                c.name,
                params.join("\n")
            )
        })
        .collect();
    format!(
        "\n\n<{DSML}tool_calls>\n{}\n</{DSML}tool_calls>",
        invokes.join("\n")
    )
}

fn parameter(key: &str, value: &Value) -> String {
    let (string, text) = match value {
        Value::String(s) => ("true", s.clone()),
        other => ("false", py_json(other)),
    };
    format!("<{DSML}parameter name=\"{key}\" string=\"{string}\">{text}</{DSML}parameter>")
}

/// A message after the encoder's `merge_tool_messages`.
enum Turn<'c> {
    System {
        content: &'c str,
        tools: bool,
    },
    /// Texts and tool results (`<tool_result>` already around), joined by a blank line.
    User(Vec<Part<'c>>),
    Assistant(&'c Message),
}

struct Part<'c> {
    /// The call a tool result answers (`""` for text and results without an id).
    call_id: &'c str,
    result: bool,
    text: &'c str,
}

/// The turns the encoder renders: tools on the first system message (or a new one), every
/// run of user and tool messages merged into one user turn, its results in call order.
fn turns(conv: &Conversation) -> Vec<Turn<'_>> {
    let mut out: Vec<Turn> = Vec::new();
    let tools = !conv.tools.is_empty();
    if tools && conv.messages.first().is_none_or(|m| m.role != Role::System) {
        out.push(Turn::System {
            content: "",
            tools: true,
        });
    }
    for (i, m) in conv.messages.iter().enumerate() {
        let part = |result| Part {
            call_id: m.tool_call_id.as_deref().unwrap_or(""),
            result,
            text: &m.content,
        };
        match m.role {
            Role::System => out.push(Turn::System {
                content: &m.content,
                tools: tools && i == 0,
            }),
            Role::Assistant => out.push(Turn::Assistant(m)),
            Role::User | Role::Tool => {
                let p = part(m.role == Role::Tool);
                match out.last_mut() {
                    Some(Turn::User(parts)) => parts.push(p),
                    _ => out.push(Turn::User(vec![p])),
                }
            }
        }
    }
    sort_results(&mut out);
    out
}

/// The encoder's `sort_tool_results_by_call_order`: in a user turn with several results,
/// the results (in the places results hold) follow the order of the last calls made; an id
/// that names none of them sorts as the first call (a stable sort).
fn sort_results(turns: &mut [Turn]) {
    let mut order: Vec<&str> = Vec::new();
    for t in turns.iter_mut() {
        match t {
            Turn::Assistant(m) if !m.tool_calls.is_empty() => {
                order = m
                    .tool_calls
                    .iter()
                    .map(|c| c.id.as_str())
                    .filter(|id| !id.is_empty())
                    .collect();
            }
            Turn::User(parts) => {
                let slots: Vec<usize> = (0..parts.len()).filter(|&i| parts[i].result).collect();
                if slots.len() < 2 || order.is_empty() {
                    continue;
                }
                let rank = |id: &str| order.iter().position(|o| *o == id).unwrap_or(0);
                let mut results: Vec<(usize, &str, &str)> = slots
                    .iter()
                    .map(|&i| (rank(parts[i].call_id), parts[i].call_id, parts[i].text))
                    .collect();
                results.sort_by_key(|r| r.0);
                for (&slot, (_, id, text)) in slots.iter().zip(results) {
                    parts[slot].call_id = id;
                    parts[slot].text = text;
                }
            }
            _ => {}
        }
    }
}

/// The whole conversation, as `encode_messages(messages, thinking_mode)` renders it.
pub(super) fn render(conv: &Conversation, think: bool) -> String {
    let turns = turns(conv);
    // The encoder keeps every thinking block when tools are given.
    let drop_thinking = conv.tools.is_empty();
    let last_user = turns.iter().rposition(|t| matches!(t, Turn::User(_)));
    let mut out = String::from(BOS);
    for (i, t) in turns.iter().enumerate() {
        if i == 0 && think && conv.max_effort {
            out.push_str(EFFORT_MAX);
        }
        match t {
            Turn::System { content, tools } => {
                out.push_str(content);
                if *tools {
                    out.push_str("\n\n");
                    out.push_str(&tools_block(&conv.tools));
                }
            }
            Turn::User(parts) => {
                out.push_str(USER);
                for (j, p) in parts.iter().enumerate() {
                    if j > 0 {
                        out.push_str("\n\n");
                    }
                    if p.result {
                        out.push_str(&format!("<tool_result>{}</tool_result>", p.text));
                    } else {
                        out.push_str(p.text);
                    }
                }
            }
            Turn::Assistant(m) => {
                // An answer before the last user turn loses its reasoning with its
                // `</think>` (without tools).
                if think && (!drop_thinking || last_user.is_none_or(|u| i > u)) {
                    out.push_str(&m.reasoning);
                    out.push_str(THINK_CLOSE);
                }
                out.push_str(&m.content);
                out.push_str(&render_calls(&m.tool_calls));
                out.push_str(EOS);
            }
        }
        // The answer's opening follows a user turn that an answer (or the end) follows.
        let next_is_answer = turns
            .get(i + 1)
            .is_none_or(|n| matches!(n, Turn::Assistant(_)));
        if next_is_answer && matches!(t, Turn::User(_)) {
            out.push_str(ASSISTANT);
            let open = think && (!drop_thinking || last_user.is_some_and(|u| i >= u));
            out.push_str(if open { THINK_OPEN } else { THINK_CLOSE });
        }
    }
    out
}

/// The encoder's `to_json`: Python's `json.dumps(v, ensure_ascii=False)` (`pyjson.rs`).
fn py_json(v: &Value) -> String {
    super::pyjson::Dumps::default().dumps(v)
}

#[cfg(test)]
#[path = "chat_dsv4_tests.rs"]
mod tests;
