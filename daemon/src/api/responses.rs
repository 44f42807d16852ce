//! OpenAI's `/v1/responses`, the API newer agents speak: `input` as a string or a list of
//! items (messages, `function_call`s, `function_call_output`s), `instructions`, flat function
//! `tools`, `text.format`, and the typed stream of `response.*` events.
//!
//! Stateless, as the rest of the server: every request carries its whole conversation, which
//! is rendered into the chat template and run as a chat completion is (the same tool-call
//! parse, grammars and prefix reuse). Nothing is stored, so `previous_response_id` and
//! `conversation` are refused with a 400 that says so, and `store` is not acted on.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::errors::{ApiError, Flavor};
use super::openai::{grammar_for, now_s, sampling_values, tenant_user};
use super::sse::{self, frame, Encoder};
use super::tools::{self, Hold, ToolMode};
use super::worker::{JobPrompt, Summary, Why};
use super::{read_json, started, typed, AppState, KeyId, Sampling};
use crate::engine::conversation::{Conversation, Message, Role, ToolCall, ToolSpec};

const F: Flavor = Flavor::OpenAi;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResponsesRequest {
    model: Option<String>,
    /// A string (one user message) or a list of items; read by [`conversation`].
    input: Value,
    instructions: Option<String>,
    tools: Option<Vec<ToolIn>>,
    tool_choice: Option<Value>,
    max_output_tokens: Option<u64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    text: Option<TextConfig>,
    #[serde(default)]
    stream: bool,
    /// Refused: nothing is stored to continue from.
    previous_response_id: Option<String>,
    conversation: Option<Value>,
    /// Who the request is for: prefix reuse stays within one key and user (SECURITY.md).
    user: Option<String>,
    safety_identifier: Option<String>,
    prompt_cache_key: Option<String>,
    top_logprobs: Option<u64>,
    background: Option<bool>,
    // Accepted and not acted on: what clients commonly send at their defaults.
    #[allow(dead_code)]
    store: Option<bool>,
    metadata: Option<Value>,
    /// Echoed; an `auto` answer may hold several calls either way.
    parallel_tool_calls: Option<bool>,
    #[allow(dead_code)]
    include: Option<Value>,
    #[allow(dead_code)]
    reasoning: Option<Value>,
    #[allow(dead_code)]
    truncation: Option<Value>,
    #[allow(dead_code)]
    service_tier: Option<Value>,
    #[allow(dead_code)]
    stream_options: Option<Value>,
    #[allow(dead_code)]
    max_tool_calls: Option<Value>,
    #[allow(dead_code)]
    prompt_cache_retention: Option<Value>,
}

/// A tool as the Responses API writes it: flat, not nested under `function`. Unknown fields
/// are tolerated so that a built-in tool (`web_search`, ...) is refused by its type, not by a
/// field it carries.
#[derive(Deserialize)]
struct ToolIn {
    r#type: String,
    name: Option<String>,
    #[serde(default)]
    description: String,
    parameters: Option<Box<RawValue>>,
    strict: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TextConfig {
    format: Option<TextFormat>,
    #[allow(dead_code)]
    verbosity: Option<Value>,
}

/// `{"type": "text" | "json_object" | "json_schema", "name", "schema", ...}`: flat, unlike
/// chat's `response_format`; the schema stays raw text so its key order is the grammar's.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TextFormat {
    r#type: String,
    name: Option<String>,
    schema: Option<Box<RawValue>>,
    strict: Option<bool>,
    description: Option<String>,
}

/// The text of a message's content: a string, or text parts (`input_text`, `output_text`).
fn parts_text(v: Option<&Value>, at: &str) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("input_text" | "output_text" | "text"), Some(t)) => out.push_str(t),
                    // A refusal echoed back as history is what the assistant said.
                    (Some("refusal"), _) => {
                        out.push_str(p.get("refusal").and_then(Value::as_str).unwrap_or(""))
                    }
                    _ => {
                        return Err(ApiError::invalid(
                            format!("{at}[{j}]"),
                            "only text content parts (input_text, output_text) are supported",
                        ))
                    }
                }
            }
            Ok(out)
        }
        Some(_) => Err(ApiError::invalid(
            at,
            "content must be a string or an array of text parts",
        )),
    }
}

fn str_field<'a>(item: &'a Value, key: &str, at: &str) -> Result<&'a str, ApiError> {
    item.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid(format!("{at}.{key}"), format!("{key} must be a string")))
}

/// The stateless refusal of a field that points at something stored.
fn stateless(param: &str) -> ApiError {
    ApiError {
        param: Some(param.into()),
        ..ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("{param} is not supported: this server stores no responses or conversations; send the whole conversation in `input`"),
        )
    }
}

/// `instructions` and `input` as the conversation the template renders. A `function_call`
/// joins the assistant turn before it (an answer's text and its calls are one turn); a
/// `function_call_output` is a tool turn named after its call.
fn conversation(req: &ResponsesRequest, tools: Vec<ToolSpec>) -> Result<Conversation, ApiError> {
    let mut messages: Vec<Message> = Vec::new();
    if let Some(i) = req.instructions.as_deref().filter(|i| !i.is_empty()) {
        messages.push(Message::new(Role::System, i));
    }
    let one;
    let items: &[Value] = match &req.input {
        Value::String(s) => {
            one = [json!({"role": "user", "content": s})];
            &one
        }
        Value::Array(items) => items,
        _ => {
            return Err(ApiError::invalid(
                "input",
                "input must be a string or an array of items",
            ))
        }
    };
    // Whether the last message is an assistant turn that a following call belongs to.
    let mut assistant_open = false;
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message");
        match kind {
            "message" => {
                let role = match str_field(item, "role", &at)? {
                    "system" | "developer" => Role::System,
                    "user" => Role::User,
                    "assistant" => Role::Assistant,
                    other => {
                        return Err(ApiError::invalid(
                            format!("{at}.role"),
                            format!("unknown role {other:?}"),
                        ))
                    }
                };
                let text = parts_text(item.get("content"), &format!("{at}.content"))?;
                messages.push(Message::new(role, text));
                assistant_open = role == Role::Assistant;
            }
            "function_call" => {
                let call = ToolCall {
                    id: str_field(item, "call_id", &at)?.to_string(),
                    name: str_field(item, "name", &at)?.to_string(),
                    arguments: str_field(item, "arguments", &at)?.to_string(),
                };
                match messages.last_mut() {
                    Some(m) if assistant_open => m.tool_calls.push(call),
                    _ => {
                        let mut m = Message::new(Role::Assistant, String::new());
                        m.tool_calls.push(call);
                        messages.push(m);
                        assistant_open = true;
                    }
                }
            }
            "function_call_output" => {
                let call_id = str_field(item, "call_id", &at)?;
                let mut m = Message::new(
                    Role::Tool,
                    parts_text(item.get("output"), &format!("{at}.output"))?,
                );
                // The function's name, for templates that write it into the result.
                m.name = messages
                    .iter()
                    .flat_map(|m| &m.tool_calls)
                    .find(|c| c.id == call_id)
                    .map(|c| c.name.clone());
                m.tool_call_id = Some(call_id.to_string());
                messages.push(m);
                assistant_open = false;
            }
            // This server never writes reasoning items; one another server wrote, echoed
            // back as history, carries nothing this template can render.
            "reasoning" => {}
            "item_reference" => return Err(stateless(&format!("{at} (item_reference)"))),
            other => {
                return Err(ApiError::invalid(
                    format!("{at}.type"),
                    format!("input items of type {other:?} are not supported (message, function_call, function_call_output)"),
                ))
            }
        }
    }
    if !messages.iter().any(|m| m.role != Role::System) {
        return Err(ApiError::invalid("input", "input must not be empty"));
    }
    Ok(Conversation {
        messages,
        tools,
        max_effort: false,
    })
}

/// The function tools, and their echo in the response (`tools` as the client gave them).
fn function_tools(req: &ResponsesRequest) -> Result<(Vec<ToolSpec>, Vec<Value>), ApiError> {
    let mut specs = Vec::new();
    let mut echo = Vec::new();
    for (i, t) in req.tools.iter().flatten().enumerate() {
        if t.r#type != "function" {
            return Err(ApiError::invalid(
                format!("tools[{i}].type"),
                format!("only function tools are supported, not {:?}", t.r#type),
            ));
        }
        let Some(name) = t.name.clone() else {
            return Err(ApiError::invalid(
                format!("tools[{i}].name"),
                "a function tool needs a name",
            ));
        };
        let text = t.parameters.as_ref().map_or("", |r| r.get());
        let parameters: Value = serde_json::from_str(text).unwrap_or(Value::Null);
        echo.push(
            json!({"type": "function", "name": name, "description": t.description,
                         "parameters": parameters, "strict": t.strict}),
        );
        specs.push(ToolSpec {
            name,
            description: t.description.clone(),
            parameters,
            schema_text: text.to_string(),
        });
    }
    Ok((specs, echo))
}

/// `tool_choice`: `auto`, `none`, `required` or `{"type": "function", "name": ...}`.
fn tool_mode(choice: Option<&Value>, tools: &[ToolSpec]) -> Result<ToolMode, ApiError> {
    let mode = match choice {
        None | Some(Value::Null) => ToolMode::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolMode::Auto,
            "none" => ToolMode::Off,
            "required" => ToolMode::Required,
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("unknown tool_choice {other:?}"),
                ))
            }
        },
        Some(v) => {
            let name = (v.get("type").and_then(Value::as_str) == Some("function"))
                .then(|| v.get("name").and_then(Value::as_str))
                .flatten()
                .ok_or_else(|| {
                    ApiError::invalid(
                        "tool_choice",
                        "tool_choice must be auto, none, required or {\"type\":\"function\",\"name\":...}",
                    )
                })?;
            if !tools.iter().any(|t| t.name == name) {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("no tool named {name:?}"),
                ));
            }
            ToolMode::Named(name.to_string())
        }
    };
    match (tools.is_empty(), &mode) {
        (true, ToolMode::Required | ToolMode::Named(_)) => {
            Err(ApiError::invalid("tool_choice", "tool_choice needs tools"))
        }
        (true, _) => Ok(ToolMode::Off),
        _ => Ok(mode),
    }
}

/// `text.format` as the schema the output must follow (`None`: free text), and its echo.
fn text_format(text: Option<&TextConfig>) -> Result<(Option<String>, Value), ApiError> {
    let Some(f) = text.and_then(|t| t.format.as_ref()) else {
        return Ok((None, json!({"type": "text"})));
    };
    match (f.r#type.as_str(), &f.schema) {
        ("text", _) => Ok((None, json!({"type": "text"}))),
        ("json_object", _) => Ok((
            Some(r#"{"type":"object"}"#.to_string()),
            json!({"type": "json_object"}),
        )),
        ("json_schema", Some(s)) => {
            let schema: Value = serde_json::from_str(s.get()).unwrap_or(Value::Null);
            Ok((
                Some(s.get().to_string()),
                json!({"type": "json_schema", "name": f.name, "schema": schema,
                       "strict": f.strict, "description": f.description}),
            ))
        }
        ("json_schema", None) => Err(ApiError::invalid(
            "text.format.schema",
            "a json_schema format needs its schema",
        )),
        (other, _) => Err(ApiError::invalid(
            "text.format.type",
            format!("unknown text.format type {other:?}"),
        )),
    }
}

pub async fn create(
    State(st): State<Arc<AppState>>,
    Extension(key): Extension<KeyId>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match inner(&st, key, &headers, body).await {
        Ok(r) => r,
        Err(e) => e.flavor(F).into_response(),
    }
}

async fn inner(
    st: &AppState,
    key: KeyId,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let req: ResponsesRequest = typed(&read_json(st, headers, body, F).await?, F)?;
    st.check_model(req.model.as_deref(), F)?;
    if req.previous_response_id.is_some() {
        return Err(stateless("previous_response_id"));
    }
    if req.conversation.is_some() {
        return Err(stateless("conversation"));
    }
    if req.background == Some(true) {
        return Err(ApiError::invalid(
            "background",
            "background responses are not supported (nothing is stored to poll)",
        ));
    }
    if req.top_logprobs.is_some_and(|n| n > 0) {
        return Err(ApiError::invalid(
            "top_logprobs",
            "logprobs are not supported",
        ));
    }
    if req.max_output_tokens == Some(0) {
        return Err(ApiError::invalid(
            "max_output_tokens",
            "max_output_tokens must be at least 1",
        ));
    }
    let max_tokens = st.max_tokens(req.max_output_tokens, F)?;
    let (temperature, top_p) = sampling_values(st, req.temperature, req.top_p, F)?;
    let (tools, tools_echo) = function_tools(&req)?;
    let mode = tool_mode(req.tool_choice.as_ref(), &tools)?;
    let (schema, format_echo) = text_format(req.text.as_ref())?;
    // `strict: true` (on the forced tool, or on text.format otherwise) refuses a keyword the
    // grammar cannot enforce instead of relaxing it, as chat completions do.
    let strict = if mode.forced() {
        req.tools.iter().flatten().any(|t| {
            t.strict == Some(true)
                && match &mode {
                    ToolMode::Named(n) => t.name.as_deref() == Some(n.as_str()),
                    _ => true,
                }
        })
    } else {
        req.text
            .as_ref()
            .and_then(|t| t.format.as_ref())
            .is_some_and(|f| f.strict == Some(true))
    };
    let grammar = grammar_for(st, &tools, &mode, schema.as_deref(), strict, F)
        .await
        .map_err(|e| match e.param.as_deref() {
            Some("response_format") => ApiError {
                param: Some("text.format.schema".into()),
                ..e
            },
            _ => e,
        })?;
    let shown = if mode == ToolMode::Off {
        Vec::new()
    } else {
        tools
    };
    let conv = conversation(&req, shown)?;
    let user = tenant_user(
        req.user.as_deref().or(req.safety_identifier.as_deref()),
        req.prompt_cache_key.as_deref(),
    );
    let sampling = Sampling {
        max_tokens,
        temperature,
        top_p,
        params: st.cfg.params,
        seed: None,
        stop: Vec::new(),
        grammar,
        tenant: key.tenant(user.as_deref()),
        think: None,
        logprobs: None,
        echo: false,
    };
    let mut rx = st.submit(JobPrompt::Chat(conv), sampling, F)?;
    // The counts come again in the answer's summary.
    started(&mut rx, F).await?;
    // The response object less its outcome: what `response.created` carries, and the frame
    // the finished one fills in.
    let skeleton = json!({
        "id": tools::call_id("resp_"), "object": "response", "created_at": now_s(),
        "status": "in_progress", "error": null, "incomplete_details": null,
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "model": st.cfg.model_id, "output": [],
        "parallel_tool_calls": req.parallel_tool_calls.unwrap_or(true),
        "previous_response_id": null, "temperature": temperature, "top_p": top_p,
        "tool_choice": req.tool_choice.clone().unwrap_or_else(|| json!("auto")),
        "tools": tools_echo, "text": {"format": format_echo}, "truncation": "disabled",
        "store": false, "metadata": req.metadata.clone().unwrap_or_else(|| json!({})),
        "usage": null,
    });
    let hold = Hold::new(mode);
    if req.stream {
        let mut enc = Events {
            skeleton,
            seq: 0,
            message_id: tools::call_id("msg_"),
            text: String::new(),
            open: false,
        };
        let created = enc.skeleton.clone();
        let head = enc.event("response.created", json!({"response": created}))
            + &enc.event("response.in_progress", json!({"response": created}));
        return Ok(sse::stream(rx, hold, enc, head));
    }
    let (text, calls, summary) = sse::collect(rx, hold).await;
    let Some(s) = summary.as_ref().filter(|s| s.why != Why::Failed) else {
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the engine failed on this request",
        ));
    };
    let status = status_of(Some(s));
    let mut output = Vec::new();
    if !text.is_empty() || calls.is_empty() {
        output.push(message_item(&tools::call_id("msg_"), &text, status));
    }
    output.extend(
        calls
            .iter()
            .map(|c| call_item(&call_item_id(c), c, "completed")),
    );
    let mut r = Json(finished(skeleton, output, status, s)).into_response();
    sse::warn_header(&mut r, Some(s));
    Ok(r)
}

/// `completed`, or `incomplete` when the answer was cut by its budget or the timeout
/// (`failed` when the engine went away).
fn status_of(s: Option<&Summary>) -> &'static str {
    match s.map(|s| s.why) {
        None | Some(Why::Failed) => "failed",
        Some(Why::Length | Why::Timeout) => "incomplete",
        _ => "completed",
    }
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "message", "id": id, "status": status, "role": "assistant",
           "content": [output_text(text)]})
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// A call's item id (`fc_...`), distinct from its `call_id` as OpenAI's are.
fn call_item_id(c: &ToolCall) -> String {
    match c.id.strip_prefix("call_") {
        Some(rest) => format!("fc_{rest}"),
        None => format!("fc_{}", c.id),
    }
}

fn call_item(id: &str, c: &ToolCall, status: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": c.id, "name": c.name,
           "arguments": c.arguments, "status": status})
}

/// The skeleton with its outcome: status, output and usage (the prompt's cached tokens are
/// among its `input_tokens`, OpenAI's way).
fn finished(mut r: Value, output: Vec<Value>, status: &str, s: &Summary) -> Value {
    let (prompt_tokens, cached) = (s.prompt_tokens, s.cached);
    r["status"] = json!(status);
    if status == "incomplete" {
        r["incomplete_details"] = json!({"reason": "max_output_tokens"});
    }
    r["output"] = Value::Array(output);
    r["usage"] = s.with_colibri(json!({
        "input_tokens": prompt_tokens, "output_tokens": s.completion_tokens,
        "total_tokens": prompt_tokens + s.completion_tokens,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }));
    r
}

/// The `response.*` events: the message item opened at the first text, its text deltas,
/// then each call as an item of its own, then `response.completed` (or `.incomplete`,
/// `.failed`) with the whole response. Every event carries its `type` and a
/// `sequence_number` counting from 0.
struct Events {
    skeleton: Value,
    seq: u64,
    message_id: String,
    /// The message's text so far (its `done` events and the final output repeat it).
    text: String,
    open: bool,
}

impl Events {
    fn event(&mut self, kind: &str, mut data: Value) -> String {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        frame(Some(kind), &data)
    }

    fn open_message(&mut self) -> String {
        if self.open {
            return String::new();
        }
        self.open = true;
        let item = json!({"type": "message", "id": self.message_id, "status": "in_progress",
                          "role": "assistant", "content": []});
        let id = self.message_id.clone();
        self.event(
            "response.output_item.added",
            json!({"output_index": 0, "item": item}),
        ) + &self.event(
            "response.content_part.added",
            json!({"item_id": id, "output_index": 0, "content_index": 0,
                   "part": output_text("")}),
        )
    }
}

impl Encoder for Events {
    fn text(&mut self, text: &str) -> String {
        let mut out = self.open_message();
        self.text.push_str(text);
        let id = self.message_id.clone();
        out += &self.event(
            "response.output_text.delta",
            json!({"item_id": id, "output_index": 0, "content_index": 0, "delta": text,
                   "logprobs": []}),
        );
        out
    }

    fn end(&mut self, rest: &str, calls: &[ToolCall], s: Option<&Summary>) -> String {
        let mut out = String::new();
        if !rest.is_empty() {
            out += &self.text(rest);
        }
        let status = status_of(s);
        let mut output = Vec::new();
        if calls.is_empty() {
            out += &self.open_message();
        }
        if self.open {
            let (id, text) = (self.message_id.clone(), self.text.clone());
            out += &self.event(
                "response.output_text.done",
                json!({"item_id": id, "output_index": 0, "content_index": 0, "text": text,
                       "logprobs": []}),
            );
            out += &self.event(
                "response.content_part.done",
                json!({"item_id": id, "output_index": 0, "content_index": 0,
                       "part": output_text(&text)}),
            );
            let item = message_item(&id, &text, status);
            out += &self.event(
                "response.output_item.done",
                json!({"output_index": 0, "item": item}),
            );
            output.push(item);
        }
        for c in calls {
            let index = output.len();
            let id = call_item_id(c);
            let mut item = call_item(&id, c, "in_progress");
            item["arguments"] = json!("");
            out += &self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
            );
            out += &self.event(
                "response.function_call_arguments.delta",
                json!({"item_id": id, "output_index": index, "delta": c.arguments}),
            );
            out += &self.event(
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": index, "name": c.name,
                       "arguments": c.arguments}),
            );
            let item = call_item(&id, c, "completed");
            out += &self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            );
            output.push(item);
        }
        let response = match s.filter(|s| s.why != Why::Failed) {
            Some(s) => {
                let r = finished(self.skeleton.clone(), output, status, s);
                let kind = if status == "incomplete" {
                    "response.incomplete"
                } else {
                    "response.completed"
                };
                return out + &self.event(kind, json!({"response": r}));
            }
            None => {
                let mut r = self.skeleton.clone();
                r["status"] = json!("failed");
                r["output"] = Value::Array(output);
                r["error"] = json!({"code": "server_error",
                                    "message": "the engine failed on this request"});
                r
            }
        };
        out + &self.event("response.failed", json!({"response": response}))
    }
}

#[cfg(test)]
mod tests;
