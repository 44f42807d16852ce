//! OpenAI's routes: `/v1/chat/completions` (messages, tools, `response_format`, streaming,
//! `n`, logprobs), `/v1/models` (`/v1/completions` is `completions`).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::errors::{ApiError, Flavor};
use super::sse::{self, frame, Encoder};
use super::tools::{self, Hold, ToolMode};
use super::worker::{JobPrompt, Summary, TokenLp, Why};
use super::{logprobs, params};
use super::{read_json, started, typed, AppState, KeyId, Sampling};
use crate::engine::conversation::{Conversation, Message, Role, ToolCall, ToolSpec};
use crate::grammar::{Grammar, SchemaCache};

const F: Flavor = Flavor::OpenAi;

#[derive(Deserialize)]
struct ChatRequest {
    model: Option<String>,
    messages: Vec<ChatMessage>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    stop: Option<Stop>,
    seed: Option<u64>,
    n: Option<u64>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    tools: Option<Vec<FunctionTool>>,
    tool_choice: Option<Value>,
    response_format: Option<ResponseFormat>,
    // Accepted and not acted on: what clients commonly send at their defaults.
    #[allow(dead_code)]
    parallel_tool_calls: Option<bool>,
    /// Who the request is for: prefix reuse stays within one key and user (SECURITY.md).
    user: Option<String>,
    safety_identifier: Option<String>,
    /// A conversation's cache key: requests with another key never share its prefix.
    prompt_cache_key: Option<String>,
    #[allow(dead_code)]
    metadata: Option<Value>,
    #[allow(dead_code)]
    store: Option<bool>,
    frequency_penalty: Option<f64>,
    presence_penalty: Option<f64>,
    logprobs: Option<bool>,
    top_logprobs: Option<u64>,
    // Not OpenAI's, but what vLLM, llama.cpp and their clients send.
    top_k: Option<u64>,
    min_p: Option<f64>,
    repetition_penalty: Option<f64>,
    /// The template's thinking switch (`none`/`minimal`: off; `low`..`max`: on; `max` is
    /// DeepSeek-V4's maximum effort too).
    reasoning_effort: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct StreamOptions {
    #[serde(default)]
    pub(super) include_usage: bool,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    /// A request's `stop` as its strings (none without one); an empty string is refused.
    pub(super) fn strings(stop: Option<&Stop>) -> Result<Vec<String>, ApiError> {
        let v = match stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if v.iter().any(String::is_empty) {
            return Err(ApiError::invalid("stop", "stop strings must not be empty"));
        }
        Ok(v)
    }
}

/// Unknown message fields are tolerated: SDKs echo back an answer's whole message
/// (`refusal`, `annotations`, ...) as history.
#[derive(Deserialize)]
struct ChatMessage {
    role: String,
    content: Option<Value>,
    name: Option<String>,
    tool_calls: Option<Vec<CallIn>>,
    tool_call_id: Option<String>,
    /// An earlier answer's reasoning, passed back as DeepSeek's API and vLLM name it
    /// (`reasoning`: vLLM's newer name, OpenRouter's).
    reasoning_content: Option<String>,
    reasoning: Option<String>,
}

#[derive(Deserialize)]
struct CallIn {
    id: Option<String>,
    function: FunctionCall,
}

#[derive(Deserialize)]
struct FunctionCall {
    name: String,
    arguments: Value,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FunctionTool {
    r#type: String,
    function: FunctionDef,
}

#[derive(Deserialize)]
struct FunctionDef {
    name: String,
    #[serde(default)]
    description: String,
    parameters: Option<Box<RawValue>>,
    strict: Option<bool>,
}

/// `{"type": "text" | "json_object" | "json_schema", "json_schema": {...}}` (a struct, not a
/// tagged enum: the schema stays raw text, which serde cannot buffer inside a tagged enum).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResponseFormat {
    r#type: String,
    json_schema: Option<JsonSchemaFormat>,
}

#[derive(Deserialize)]
struct JsonSchemaFormat {
    #[allow(dead_code)]
    name: Option<String>,
    schema: Option<Box<RawValue>>,
    strict: Option<bool>,
    #[allow(dead_code)]
    description: Option<String>,
}

/// A message's content: a string, or text parts.
fn content_text(v: &Option<Value>, at: &str) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = String::new();
            for p in parts {
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    _ => {
                        return Err(ApiError::invalid(
                            at,
                            "only text content parts are supported",
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

/// A temperature in 0..=2 and a top_p in (0, 1], with the server's defaults.
pub(super) fn sampling_values(
    st: &AppState,
    temperature: Option<f64>,
    top_p: Option<f64>,
    flavor: Flavor,
) -> Result<(f32, f32), ApiError> {
    let t = temperature.map_or(st.cfg.temperature, |t| t as f32);
    if !(0.0..=2.0).contains(&t) {
        return Err(
            ApiError::invalid("temperature", "temperature must be in 0..=2").flavor(flavor),
        );
    }
    let p = top_p.map_or(st.cfg.top_p, |p| p as f32);
    if !(p > 0.0 && p <= 1.0) {
        return Err(ApiError::invalid("top_p", "top_p must be in (0, 1]").flavor(flavor));
    }
    Ok((t, p))
}

/// Schema compiles running at once, each on a blocking thread: a big schema takes a core and
/// several times its size in memory while it compiles, so a burst of them waits here
/// (asynchronously) rather than taking every core and one of tokio's 512 blocking threads
/// each.
static COMPILES: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// The grammar a request's output must follow: a forced tool call's, or a JSON schema's.
/// Refused past `--max-schema-bytes`; compiled off the async threads (a big schema takes
/// a while, and `/health` and the streams must not wait on it), or shared from the cache of
/// recent schemas (an agent sends the same tools every time). A keyword the grammar cannot
/// enforce is relaxed and logged, or with `strict` refused with a 400 naming it and its
/// schema path, as OpenAI's strict mode refuses what it does not support.
pub(super) async fn grammar_for(
    st: &AppState,
    tools: &[ToolSpec],
    mode: &ToolMode,
    schema: Option<&str>,
    strict: bool,
    flavor: Flavor,
) -> Result<Option<Arc<Grammar>>, ApiError> {
    let (schema, param) = if mode.forced() {
        (tools::forced_schema(tools, mode), "tools")
    } else if let Some(s) = schema {
        (s.to_string(), "response_format")
    } else {
        return Ok(None);
    };
    let limit = st.cfg.max_schema;
    if schema.len() > limit {
        let what = if param == "tools" {
            "the tools' schemas together are"
        } else {
            "the schema is"
        };
        return Err(ApiError {
            param: Some(param.into()),
            ..ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "{what} {} bytes, over the limit of {limit} bytes (--max-schema-bytes)",
                    schema.len()
                ),
            )
        }
        .flavor(flavor));
    }
    let bad_schema = |msg: String| {
        ApiError {
            param: Some(param.into()),
            ..ApiError::new(StatusCode::BAD_REQUEST, msg)
        }
        .flavor(flavor)
    };
    let cache = SchemaCache::shared();
    let (grammar, warnings) = match cache.cached_checked(&schema) {
        Some(c) => c,
        None => {
            let internal = |e: &dyn std::fmt::Display| {
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("compiling the schema failed: {e}"),
                )
                .flavor(flavor)
            };
            // Never closed (no one closes a static); an error all the same, not a panic. The
            // permit goes with the compile: a client that hangs up does not end the compile,
            // so its slot stays taken until the compile does.
            let permit = COMPILES.acquire().await.map_err(|e| internal(&e))?;
            let compiled = tokio::task::spawn_blocking(move || {
                let _permit = permit;
                cache.json_schema_checked(&schema)
            })
            .await
            .map_err(|e| internal(&e))?;
            compiled.map_err(|e| bad_schema(format!("the schema cannot be enforced: {e}")))?
        }
    };
    if let Some(w) = warnings.first() {
        if strict {
            return Err(bad_schema(format!(
                "strict mode: the schema uses what the grammar cannot enforce: {w}"
            )));
        }
        for w in warnings.iter() {
            crate::elog!("[schema] relaxed: {w}");
        }
    }
    Ok(Some(grammar))
}

fn tool_mode(choice: Option<&Value>, tools: &[ToolSpec]) -> Result<ToolMode, ApiError> {
    if tools.is_empty() {
        return match choice {
            None | Some(Value::Null) => Ok(ToolMode::Off),
            Some(Value::String(s)) if s == "none" || s == "auto" => Ok(ToolMode::Off),
            Some(_) => Err(ApiError::invalid("tool_choice", "tool_choice needs tools")),
        };
    }
    match choice {
        None | Some(Value::Null) => Ok(ToolMode::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => Ok(ToolMode::Auto),
            "none" => Ok(ToolMode::Off),
            "required" => Ok(ToolMode::Required),
            other => Err(ApiError::invalid(
                "tool_choice",
                format!("unknown tool_choice {other:?}"),
            )),
        },
        Some(v) => {
            let name = v
                .pointer("/function/name")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::invalid("tool_choice", "tool_choice must be auto, none, required or {\"type\":\"function\",\"function\":{\"name\":...}}"))?;
            if !tools.iter().any(|t| t.name == name) {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("no tool named {name:?}"),
                ));
            }
            Ok(ToolMode::Named(name.to_string()))
        }
    }
}

fn conversation(req: &ChatRequest, tools: Vec<ToolSpec>) -> Result<Conversation, ApiError> {
    let mut messages = Vec::new();
    for (i, m) in req.messages.iter().enumerate() {
        let at = format!("messages[{i}].content");
        let role = match m.role.as_str() {
            "system" | "developer" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            other => {
                return Err(ApiError::invalid(
                    format!("messages[{i}].role"),
                    format!("unknown role {other:?}"),
                ))
            }
        };
        let mut msg = Message::new(role, content_text(&m.content, &at)?);
        msg.name = m.name.clone();
        msg.tool_call_id = m.tool_call_id.clone();
        if role == Role::Assistant {
            msg.reasoning = m
                .reasoning_content
                .clone()
                .or_else(|| m.reasoning.clone())
                .unwrap_or_default();
        }
        for c in m.tool_calls.iter().flatten() {
            msg.tool_calls.push(ToolCall {
                id: c.id.clone().unwrap_or_else(|| tools::call_id("call_")),
                name: c.function.name.clone(),
                arguments: match &c.function.arguments {
                    Value::String(s) => s.clone(),
                    v => v.to_string(),
                },
            });
        }
        messages.push(msg);
    }
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    Ok(Conversation {
        messages,
        tools,
        // Checked by `params::effort_think` before.
        max_effort: req.reasoning_effort.as_deref() == Some("max"),
    })
}

/// A stream's closing usage chunk (`stream_options.include_usage`): no choices, the prompt
/// and cached `counts` and the completion's tokens.
pub(super) fn usage_chunk(
    object: &str,
    id: &str,
    created: u64,
    model: &str,
    counts: (usize, usize),
    s: Option<&Summary>,
) -> String {
    let completion = s.map_or(0, |s| s.completion_tokens);
    let u = usage(counts.0, counts.1, completion);
    let u = match s {
        Some(s) => s.with_colibri(u),
        None => u,
    };
    frame(
        None,
        &json!({"id": id, "object": object, "created": created, "model": model,
                "choices": [], "usage": u}),
    )
}

/// The end of a stream of several choices ([`sse::stream_n`]): the usage of every choice
/// together when the client asked for it, then the one `[DONE]`.
pub(super) fn choices_tail(
    object: &'static str,
    id: String,
    created: u64,
    model: String,
    (prompt, cached): (usize, usize),
    include_usage: bool,
) -> sse::Tail {
    Box::new(move |ends| {
        let mut out = String::new();
        if include_usage {
            let completion = ends.iter().flatten().map(|s| s.completion_tokens).sum();
            out += &frame(
                None,
                &json!({"id": id, "object": object, "created": created, "model": model,
                        "choices": [], "usage": usage(prompt, cached, completion)}),
            );
        }
        out + "data: [DONE]\n\n"
    })
}

pub(super) fn usage(prompt: usize, cached: usize, completion: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

/// `length` whenever the budget ended the answer, a forced call included (its arguments were
/// closed within the budget, so they parse, but the model did not choose to end there).
pub(super) fn finish_reason(s: Option<&Summary>, calls: &[ToolCall]) -> &'static str {
    match s.map(|s| s.why) {
        Some(Why::Length | Why::Timeout) => "length",
        _ if !calls.is_empty() => "tool_calls",
        _ => "stop",
    }
}

fn calls_json(calls: &[ToolCall]) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({"index": i, "id": c.id, "type": "function",
                   "function": {"name": c.name, "arguments": c.arguments}})
        })
        .collect()
}

/// Whose cached prefixes a request may reuse: its `user` (or `safety_identifier`), narrowed
/// by `prompt_cache_key` where one is given.
pub(super) fn tenant_user(user: Option<&str>, cache_key: Option<&str>) -> Option<String> {
    match (user, cache_key) {
        (u, Some(k)) => Some(format!("{}\u{0}{k}", u.unwrap_or(""))),
        (u, None) => u.map(str::to_string),
    }
}

pub(super) fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub async fn chat(
    State(st): State<Arc<AppState>>,
    Extension(key): Extension<KeyId>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match chat_inner(&st, key, &headers, body).await {
        Ok(r) => r,
        Err(e) => e.flavor(F).into_response(),
    }
}

async fn chat_inner(
    st: &AppState,
    key: KeyId,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let req: ChatRequest = typed(&read_json(st, headers, body, F).await?, F)?;
    st.check_model(req.model.as_deref(), F)?;
    let n = params::choices(req.n, F)?;
    let logprobs = chat_logprobs(req.logprobs, req.top_logprobs)?;
    let knobs = params::Knobs {
        top_k: req.top_k,
        min_p: req.min_p,
        repetition_penalty: req.repetition_penalty,
        frequency_penalty: req.frequency_penalty,
        presence_penalty: req.presence_penalty,
    };
    let sampling_params = knobs.params(st.cfg.params, F)?;
    let think = params::effort_think(req.reasoning_effort.as_deref(), F)?;
    let max_tokens = st.max_tokens(req.max_completion_tokens.or(req.max_tokens), F)?;
    let (temperature, top_p) = sampling_values(st, req.temperature, req.top_p, F)?;
    let mut tools = Vec::new();
    for (i, t) in req.tools.iter().flatten().enumerate() {
        if t.r#type != "function" {
            return Err(ApiError::invalid(
                format!("tools[{i}].type"),
                "only function tools are supported",
            ));
        }
        let text = t.function.parameters.as_ref().map_or("", |r| r.get());
        tools.push(ToolSpec {
            name: t.function.name.clone(),
            description: t.function.description.clone(),
            parameters: serde_json::from_str(text).unwrap_or(Value::Null),
            schema_text: text.to_string(),
        });
    }
    let mode = tool_mode(req.tool_choice.as_ref(), &tools)?;
    // OpenAI's `strict: true`, on the forced tool (any of them for `required`) or the
    // response format.
    let strict_tool = |t: &FunctionTool| {
        t.function.strict == Some(true)
            && match &mode {
                ToolMode::Named(n) => t.function.name == *n,
                _ => true,
            }
    };
    let strict = if mode.forced() {
        req.tools.iter().flatten().any(strict_tool)
    } else {
        req.response_format
            .as_ref()
            .and_then(|f| f.json_schema.as_ref())
            .is_some_and(|j| j.strict == Some(true))
    };
    let schema = match &req.response_format {
        None => None,
        Some(f) => match (f.r#type.as_str(), &f.json_schema) {
            ("text", _) => None,
            ("json_object", _) => Some(r#"{"type":"object"}"#.to_string()),
            (
                "json_schema",
                Some(JsonSchemaFormat {
                    schema: Some(s), ..
                }),
            ) => Some(s.get().to_string()),
            ("json_schema", _) => {
                return Err(ApiError::invalid(
                    "response_format.json_schema.schema",
                    "a json_schema response_format needs its schema",
                ))
            }
            (other, _) => {
                return Err(ApiError::invalid(
                    "response_format.type",
                    format!("unknown response_format type {other:?}"),
                ))
            }
        },
    };
    let grammar = grammar_for(st, &tools, &mode, schema.as_deref(), strict, F).await?;
    let shown = if mode == ToolMode::Off {
        Vec::new()
    } else {
        tools
    };
    let conv = conversation(&req, shown)?;
    let stop = Stop::strings(req.stop.as_ref())?;
    let user = tenant_user(
        req.user.as_deref().or(req.safety_identifier.as_deref()),
        req.prompt_cache_key.as_deref(),
    );
    let sampling = Sampling {
        max_tokens,
        temperature,
        top_p,
        params: sampling_params,
        seed: req.seed,
        stop,
        grammar,
        tenant: key.tenant(user.as_deref()),
        think,
        logprobs,
        echo: false,
    };
    let mut rxs = st.submit_n(n, || JobPrompt::Chat(conv.clone()), sampling, F)?;
    let mut counts = Vec::with_capacity(n);
    for rx in &mut rxs {
        counts.push(started(rx, F).await?);
    }
    let (prompt_tokens, cached) = counts[0];
    let id = tools::call_id("chatcmpl-");
    let model = st.cfg.model_id.clone();
    let created = now_s();
    if req.stream {
        let include_usage = req.stream_options.is_some_and(|o| o.include_usage);
        let mut head = String::new();
        let mut choices = Vec::with_capacity(n);
        for (index, rx) in rxs.into_iter().enumerate() {
            let mut enc = ChatChunks {
                id: id.clone(),
                model: model.clone(),
                created,
                prompt_tokens,
                cached,
                include_usage,
                logprobs: logprobs.map(|_| Vec::new()),
                index,
                closes: n == 1,
            };
            let role = enc.chunk(json!({"role": "assistant", "content": ""}), None);
            head += &frame(None, &role);
            choices.push((rx, Hold::new(mode.clone()), enc));
        }
        if n == 1 {
            let (rx, hold, enc) = choices.pop().expect("n is 1");
            return Ok(sse::stream(rx, hold, enc, head));
        }
        let counts = (prompt_tokens, cached);
        let tail = choices_tail(
            "chat.completion.chunk",
            id,
            created,
            model,
            counts,
            include_usage,
        );
        return Ok(sse::stream_n(choices, head, tail));
    }
    let mut choices = Vec::with_capacity(n);
    let mut completion_tokens = 0;
    let mut last = None;
    for (i, rx) in rxs.into_iter().enumerate() {
        let sse::Collected {
            content,
            reasoning,
            calls,
            summary,
            logprobs: lps,
        } = sse::collect_all(rx, Hold::new(mode.clone())).await;
        let Some(s) = summary.filter(|s| s.why != Why::Failed) else {
            return Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the engine failed on this request",
            ));
        };
        let mut message = json!({"role": "assistant", "content": if calls.is_empty() || !content.is_empty() { Value::String(content) } else { Value::Null }});
        // gpt-oss's analysis channel, where vLLM and the other OpenAI-compatible servers
        // put it.
        if !reasoning.is_empty() {
            message["reasoning_content"] = Value::String(reasoning);
        }
        if !calls.is_empty() {
            message["tool_calls"] = calls_json(&calls)
                .into_iter()
                .map(|mut c| {
                    if let Some(o) = c.as_object_mut() {
                        o.remove("index");
                    }
                    c
                })
                .collect();
        }
        let lp = logprobs.map_or(Value::Null, |_| logprobs::chat(&lps));
        choices.push(json!({"index": i, "message": message, "logprobs": lp,
                            "finish_reason": finish_reason(Some(&s), &calls)}));
        completion_tokens += s.completion_tokens;
        last = Some(s);
    }
    let s = last.expect("n >= 1");
    let mut r = Json(json!({
        "id": id, "object": "chat.completion", "created": created, "model": model,
        "choices": choices,
        "usage": s.with_colibri(usage(prompt_tokens, cached, completion_tokens)),
    }))
    .into_response();
    sse::warn_header(&mut r, Some(&s));
    Ok(r)
}

/// `logprobs: true` with `top_logprobs` (0..=20 alternatives): `Some(alternatives)`; a
/// `top_logprobs` past 20 is a 400 naming it.
fn chat_logprobs(on: Option<bool>, top: Option<u64>) -> Result<Option<usize>, ApiError> {
    match (on.unwrap_or(false), top) {
        (_, Some(n)) if n > params::MAX_TOP_LOGPROBS => Err(ApiError::out_of_range(
            "top_logprobs",
            format!(
                "top_logprobs must be in 0..={}; got {n}",
                params::MAX_TOP_LOGPROBS
            ),
        )),
        (false, Some(n)) if n > 0 => Err(ApiError::invalid(
            "top_logprobs",
            "top_logprobs needs logprobs: true",
        )),
        (true, n) => Ok(Some(n.unwrap_or(0) as usize)),
        (false, _) => Ok(None),
    }
}

/// `chat.completion.chunk` events.
struct ChatChunks {
    id: String,
    model: String,
    created: u64,
    prompt_tokens: usize,
    cached: usize,
    include_usage: bool,
    /// With logprobs: those of the tokens not yet sent, for the next chunk.
    logprobs: Option<Vec<TokenLp>>,
    /// The choice's index (`n` > 1).
    index: usize,
    /// Whether its end closes the stream (usage, `[DONE]`): not so for one of several
    /// choices, whose stream closes after the last ([`sse::stream_n`]).
    closes: bool,
}

impl ChatChunks {
    fn chunk(&mut self, delta: Value, finish: Option<&str>) -> Value {
        let lp = match &mut self.logprobs {
            Some(pending) if !pending.is_empty() => logprobs::chat(&std::mem::take(pending)),
            _ => Value::Null,
        };
        json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
               "model": self.model,
               "choices": [{"index": self.index, "delta": delta, "logprobs": lp, "finish_reason": finish}]})
    }
}

impl Encoder for ChatChunks {
    fn text(&mut self, text: &str) -> String {
        frame(None, &self.chunk(json!({"content": text}), None))
    }

    fn reasoning(&mut self, text: &str) -> String {
        frame(None, &self.chunk(json!({"reasoning_content": text}), None))
    }

    fn logprob(&mut self, lp: TokenLp) {
        if let Some(pending) = &mut self.logprobs {
            pending.push(lp);
        }
    }

    fn end(&mut self, rest: &str, calls: &[ToolCall], s: Option<&Summary>) -> String {
        let mut out = String::new();
        if !rest.is_empty() {
            out += &self.text(rest);
        }
        if !calls.is_empty() {
            out += &frame(
                None,
                &self.chunk(json!({"tool_calls": calls_json(calls)}), None),
            );
        }
        out += &frame(None, &self.chunk(json!({}), Some(finish_reason(s, calls))));
        if !self.closes {
            return out;
        }
        if self.include_usage {
            let counts = (self.prompt_tokens, self.cached);
            out += &usage_chunk(
                "chat.completion.chunk",
                &self.id,
                self.created,
                &self.model,
                counts,
                s,
            );
        }
        out + "data: [DONE]\n\n"
    }
}

fn model_json(st: &AppState, id: &str) -> Value {
    json!({"id": id, "object": "model", "created": st.cfg.created, "owned_by": "colibri"})
}

/// The model's id, then its `--model-alias`es.
pub async fn models(State(st): State<Arc<AppState>>) -> Response {
    let data: Vec<Value> = std::iter::once(&st.cfg.model_id)
        .chain(&st.cfg.aliases)
        .map(|id| model_json(&st, id))
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

/// An id or alias as itself; without `--strict-model-name` any other name as the model's id
/// (it would be served by it).
pub async fn model(State(st): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    if st.names(&id) {
        return Json(model_json(&st, &id)).into_response();
    }
    if !st.cfg.strict_model {
        return Json(model_json(&st, &st.cfg.model_id)).into_response();
    }
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("the model `{id}` does not exist"),
    )
    .with_code("model_not_found")
    .into_response()
}
