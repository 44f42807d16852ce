//! Anthropic's `/v1/messages`: a system prompt, messages of text / tool_use / tool_result
//! blocks, tools, streaming events (`message_start` ... `message_stop`) and `stop_reason`.

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
use super::openai::{grammar_for, sampling_values};
use super::sse::{self, frame, Encoder};
use super::tools::{self, Hold, ToolMode};
use super::worker::{JobPrompt, Summary, Why};
use super::{read_json, started, typed, AppState, KeyId, Sampling};
use crate::engine::conversation::{Conversation, Message, Role, ToolCall, ToolSpec};

const F: Flavor = Flavor::Anthropic;

#[derive(Deserialize)]
struct MessagesRequest {
    model: Option<String>,
    messages: Vec<MessageIn>,
    max_tokens: u64,
    system: Option<Value>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<u64>,
    /// `{"type": "enabled", "budget_tokens": N}` / `{"type": "disabled"}`: the template's
    /// thinking switch (the budget is not enforced: `max_tokens` bounds the whole answer).
    thinking: Option<Value>,
    stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    stream: bool,
    tools: Option<Vec<ToolIn>>,
    tool_choice: Option<ToolChoice>,
    /// `metadata.user_id`: who the request is for (prefix reuse stays within one key and
    /// user, SECURITY.md).
    metadata: Option<Value>,
    // Accepted and not acted on: what Anthropic clients send for features of their own.
    #[allow(dead_code)]
    cache_control: Option<Value>,
    #[allow(dead_code)]
    service_tier: Option<Value>,
}

#[derive(Deserialize)]
struct MessageIn {
    role: String,
    content: Value,
}

#[derive(Deserialize)]
struct ToolIn {
    name: String,
    #[serde(default)]
    description: String,
    input_schema: Box<RawValue>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ToolChoice {
    Auto {},
    Any {},
    None {},
    Tool { name: String },
}

/// Text of a string or of a list of text blocks.
fn text_of(v: &Value, at: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut out = String::new();
            for b in blocks {
                match (
                    b.get("type").and_then(Value::as_str),
                    b.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    _ => return Err(ApiError::invalid(at, "only text blocks are supported here")),
                }
            }
            Ok(out)
        }
        Value::Null => Ok(String::new()),
        _ => Err(ApiError::invalid(
            at,
            "must be a string or an array of text blocks",
        )),
    }
}

fn conversation(req: &MessagesRequest, tools: Vec<ToolSpec>) -> Result<Conversation, ApiError> {
    let mut messages = Vec::new();
    if let Some(s) = &req.system {
        messages.push(Message::new(Role::System, text_of(s, "system")?));
    }
    for (i, m) in req.messages.iter().enumerate() {
        let role = match m.role.as_str() {
            "user" => Role::User,
            "assistant" => Role::Assistant,
            other => {
                return Err(ApiError::invalid(
                    format!("messages.{i}.role"),
                    format!("role must be user or assistant, not {other:?}"),
                ))
            }
        };
        let blocks = match &m.content {
            Value::String(s) => {
                messages.push(Message::new(role, s.clone()));
                continue;
            }
            Value::Array(b) => b,
            _ => {
                return Err(ApiError::invalid(
                    format!("messages.{i}.content"),
                    "content must be a string or an array of blocks",
                ))
            }
        };
        // Text blocks join into one turn; tool results become tool turns of their own.
        let mut turn = Message::new(role, String::new());
        for (j, b) in blocks.iter().enumerate() {
            let at = format!("messages.{i}.content.{j}");
            match b.get("type").and_then(Value::as_str) {
                Some("text") => turn
                    .content
                    .push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
                Some("tool_use") if role == Role::Assistant => turn.tool_calls.push(ToolCall {
                    id: b
                        .get("id")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    name: b
                        .get("name")
                        .and_then(Value::as_str)
                        .ok_or_else(|| ApiError::invalid(&at, "tool_use needs a name"))?
                        .to_string(),
                    arguments: b
                        .get("input")
                        .cloned()
                        .unwrap_or_else(|| json!({}))
                        .to_string(),
                }),
                Some("tool_result") if role == Role::User => {
                    let mut r = Message::new(
                        Role::Tool,
                        text_of(b.get("content").unwrap_or(&Value::Null), &at)?,
                    );
                    r.tool_call_id = b
                        .get("tool_use_id")
                        .and_then(Value::as_str)
                        .map(str::to_string);
                    messages.push(r);
                }
                _ => {
                    return Err(ApiError::invalid(
                        at,
                        "blocks must be text, tool_use (assistant) or tool_result (user)",
                    ))
                }
            }
        }
        if !turn.content.is_empty() || !turn.tool_calls.is_empty() {
            messages.push(turn);
        }
    }
    if !messages.iter().any(|m| m.role != Role::System) {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    Ok(Conversation {
        messages,
        tools,
        max_effort: false,
    })
}

/// A request's tools and how the model may use them.
fn tools_and_mode(req: &MessagesRequest) -> Result<(Vec<ToolSpec>, ToolMode), ApiError> {
    let tools: Vec<ToolSpec> = req
        .tools
        .iter()
        .flatten()
        .map(|t| ToolSpec {
            name: t.name.clone(),
            description: t.description.clone(),
            parameters: serde_json::from_str(t.input_schema.get()).unwrap_or(Value::Null),
            schema_text: t.input_schema.get().to_string(),
        })
        .collect();
    let mode = match (&req.tool_choice, tools.is_empty()) {
        (_, true) | (Some(ToolChoice::None {}), _) => ToolMode::Off,
        (None | Some(ToolChoice::Auto {}), _) => ToolMode::Auto,
        (Some(ToolChoice::Any {}), _) => ToolMode::Required,
        (Some(ToolChoice::Tool { name }), _) => {
            if !tools.iter().any(|t| &t.name == name) {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("no tool named {name:?}"),
                ));
            }
            ToolMode::Named(name.clone())
        }
    };
    Ok((tools, mode))
}

/// `max_tokens` whenever the budget ended the answer, a forced call included (closed within
/// the budget, so its input parses).
fn stop_reason(s: Option<&Summary>, calls: &[ToolCall]) -> &'static str {
    match s.map(|s| s.why) {
        Some(Why::Length | Why::Timeout) => "max_tokens",
        _ if !calls.is_empty() => "tool_use",
        Some(Why::StopString) => "stop_sequence",
        _ => "end_turn",
    }
}

/// Anthropic's usage: `input_tokens` are the prompt tokens not read from the cache, so
/// `input_tokens + cache_read_input_tokens + cache_creation_input_tokens` is the whole prompt
/// (nothing is billed as written to a cache here: every prompt is kept for reuse).
fn usage(prompt_tokens: usize, cached: usize, output_tokens: usize) -> Value {
    json!({"input_tokens": prompt_tokens.saturating_sub(cached), "output_tokens": output_tokens,
           "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0})
}

/// A call as a `tool_use` block; `input` keeps the arguments' keys in the order written
/// (serde_json's `preserve_order`: a client reading them as a schema-ordered form sees them so).
fn tool_use_json(c: &ToolCall) -> Value {
    let input: Value = serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
    json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input})
}

pub async fn messages(
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
    let req: MessagesRequest = typed(&read_json(st, headers, body, F).await?, F)?;
    st.check_model(req.model.as_deref(), F)?;
    let max_tokens = st.max_tokens(Some(req.max_tokens), F)?;
    let (temperature, top_p) = sampling_values(st, req.temperature, req.top_p, F)?;
    let (tools, mode) = tools_and_mode(&req)?;
    let grammar = grammar_for(st, &tools, &mode, None, false, F).await?;
    let shown = if mode == ToolMode::Off {
        Vec::new()
    } else {
        tools
    };
    let conv = conversation(&req, shown)?;
    let stop = req.stop_sequences.clone().unwrap_or_default();
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid(
            "stop_sequences",
            "stop sequences must not be empty",
        ));
    }
    let knobs = super::params::Knobs {
        top_k: req.top_k,
        ..Default::default()
    };
    let sampling = Sampling {
        max_tokens,
        temperature,
        top_p,
        params: knobs.params(st.cfg.params, F)?,
        think: super::params::anthropic_think(req.thinking.as_ref(), F)?,
        logprobs: None,
        seed: None,
        stop,
        grammar,
        tenant: key.tenant(
            req.metadata
                .as_ref()
                .and_then(|m| m.get("user_id"))
                .and_then(Value::as_str),
        ),
        echo: false,
    };
    let mut rx = st.submit(JobPrompt::Chat(conv), sampling, F)?;
    let (prompt_tokens, cached) = started(&mut rx, F).await?;
    let id = tools::call_id("msg_");
    let model = st.cfg.model_id.clone();
    let hold = Hold::new(mode);
    if req.stream {
        let start = json!({"type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": usage(prompt_tokens, cached, 0)}});
        let head = frame(Some("message_start"), &start);
        let enc = Events {
            block: 0,
            text_open: false,
        };
        return Ok(sse::stream(rx, hold, enc, head));
    }
    let (text, calls, summary) = sse::collect(rx, hold).await;
    let Some(s) = summary.as_ref().filter(|s| s.why != Why::Failed) else {
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the engine failed on this request",
        ));
    };
    let mut content = Vec::new();
    if !text.is_empty() || calls.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    content.extend(calls.iter().map(tool_use_json));
    let mut r = Json(json!({
        "id": id, "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": stop_reason(Some(s), &calls), "stop_sequence": s.stop_sequence,
        "usage": s.with_colibri(usage(s.prompt_tokens, s.cached, s.completion_tokens)),
    }))
    .into_response();
    sse::warn_header(&mut r, Some(s));
    Ok(r)
}

/// Anthropic's stream: a text block opened at the first text, closed before any tool_use
/// block, then message_delta and message_stop.
struct Events {
    block: usize,
    text_open: bool,
}

impl Events {
    fn open_text(&mut self) -> String {
        if self.text_open {
            return String::new();
        }
        self.text_open = true;
        frame(
            Some("content_block_start"),
            &json!({"type": "content_block_start", "index": self.block,
            "content_block": {"type": "text", "text": ""}}),
        )
    }

    fn close_text(&mut self) -> String {
        if !self.text_open {
            return String::new();
        }
        self.text_open = false;
        let f = frame(
            Some("content_block_stop"),
            &json!({"type": "content_block_stop", "index": self.block}),
        );
        self.block += 1;
        f
    }
}

impl Encoder for Events {
    fn text(&mut self, text: &str) -> String {
        let mut out = self.open_text();
        out += &frame(
            Some("content_block_delta"),
            &json!({"type": "content_block_delta", "index": self.block,
            "delta": {"type": "text_delta", "text": text}}),
        );
        out
    }

    fn end(&mut self, rest: &str, calls: &[ToolCall], s: Option<&Summary>) -> String {
        let mut out = String::new();
        if !rest.is_empty() || (calls.is_empty() && !self.text_open && self.block == 0) {
            out += &self.text(rest);
        }
        out += &self.close_text();
        for c in calls {
            out += &frame(
                Some("content_block_start"),
                &json!({"type": "content_block_start", "index": self.block,
                "content_block": {"type": "tool_use", "id": c.id, "name": c.name, "input": {}}}),
            );
            out += &frame(
                Some("content_block_delta"),
                &json!({"type": "content_block_delta", "index": self.block,
                "delta": {"type": "input_json_delta", "partial_json": c.arguments}}),
            );
            out += &frame(
                Some("content_block_stop"),
                &json!({"type": "content_block_stop", "index": self.block}),
            );
            self.block += 1;
        }
        out += &frame(
            Some("message_delta"),
            &json!({"type": "message_delta",
            "delta": {"stop_reason": stop_reason(s, calls),
                      "stop_sequence": s.and_then(|s| s.stop_sequence.as_deref())},
            "usage": {"output_tokens": s.map_or(0, |s| s.completion_tokens)}}),
        );
        out += &frame(Some("message_stop"), &json!({"type": "message_stop"}));
        out
    }
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": N}`, N the prompt tokens a
/// `/v1/messages` with the same body reads (the same template, tools and `tool_choice`),
/// counted by the engine thread's tokenizer without running the model.
pub async fn count_tokens(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match count_inner(&st, &headers, body).await {
        Ok(r) => r,
        Err(e) => e.flavor(F).into_response(),
    }
}

async fn count_inner(st: &AppState, headers: &HeaderMap, body: Body) -> Result<Response, ApiError> {
    let bytes = read_json(st, headers, body, F).await?;
    // The body of a /v1/messages without its answer budget; `thinking` turns the template's
    // thinking switch as it does there, so the count is that of the prompt the same request
    // would read.
    let mut v: Value = typed(&bytes, F)?;
    if let Some(o) = v.as_object_mut() {
        o.entry("max_tokens").or_insert(json!(1));
    }
    let req: MessagesRequest = typed(v.to_string().as_bytes(), F)?;
    st.check_model(req.model.as_deref(), F)?;
    let (tools, mode) = tools_and_mode(&req)?;
    let shown = if mode == ToolMode::Off {
        Vec::new()
    } else {
        tools
    };
    let conv = conversation(&req, shown)?;
    let sampling = Sampling {
        max_tokens: 1,
        temperature: 0.0,
        top_p: 1.0,
        params: st.cfg.params,
        seed: None,
        stop: Vec::new(),
        grammar: None,
        tenant: crate::engine::Tenant::LOCAL,
        think: super::params::anthropic_think(req.thinking.as_ref(), F)?,
        logprobs: None,
        echo: false,
    };
    let mut rx = st.submit(JobPrompt::Count(conv), sampling, F)?;
    let (input_tokens, _) = started(&mut rx, F).await?;
    Ok(Json(json!({"input_tokens": input_tokens})).into_response())
}
