//! OpenAI's `/v1/completions`: a prompt string continued as is (no template), with `n`
//! choices, logprobs and `echo`, whole or streamed.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};

use super::errors::{ApiError, Flavor};
use super::openai::{
    choices_tail, finish_reason, now_s, sampling_values, usage, usage_chunk, Stop, StreamOptions,
};
use super::sse::{self, frame, Encoder};
use super::tools::{self, Hold, ToolMode};
use super::worker::{JobPrompt, Summary, TokenLp, Why};
use super::{logprobs, params};
use super::{read_json, started, typed, AppState, KeyId, Sampling};
use crate::engine::conversation::ToolCall;

const F: Flavor = Flavor::OpenAi;

#[derive(Deserialize)]
struct CompletionRequest {
    model: Option<String>,
    prompt: Value,
    max_tokens: Option<u64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    stop: Option<Stop>,
    seed: Option<u64>,
    n: Option<u64>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    user: Option<String>,
    frequency_penalty: Option<f64>,
    presence_penalty: Option<f64>,
    top_k: Option<u64>,
    min_p: Option<f64>,
    repetition_penalty: Option<f64>,
    /// The alternatives each token's logprobs list (0..=5).
    logprobs: Option<u64>,
    /// Put the prompt before the answer in the text.
    #[serde(default)]
    echo: bool,
}

pub async fn completions(
    State(st): State<Arc<AppState>>,
    Extension(key): Extension<KeyId>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match completions_inner(&st, key, &headers, body).await {
        Ok(r) => r,
        Err(e) => e.flavor(F).into_response(),
    }
}

async fn completions_inner(
    st: &AppState,
    key: KeyId,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let req: CompletionRequest = typed(&read_json(st, headers, body, F).await?, F)?;
    st.check_model(req.model.as_deref(), F)?;
    let n = params::choices(req.n, F)?;
    let logprobs = match req.logprobs {
        Some(k) if k > params::MAX_COMPLETION_LOGPROBS => {
            return Err(ApiError::out_of_range(
                "logprobs",
                format!(
                    "logprobs must be in 0..={}; got {k}",
                    params::MAX_COMPLETION_LOGPROBS
                ),
            ))
        }
        k => k.map(|k| k as usize),
    };
    let prompt = match &req.prompt {
        Value::String(s) => s.clone(),
        Value::Array(v) if v.len() == 1 && v[0].is_string() => {
            v[0].as_str().unwrap_or("").to_string()
        }
        _ => return Err(ApiError::invalid("prompt", "prompt must be a string")),
    };
    let max_tokens = st.max_tokens(req.max_tokens, F)?;
    let (temperature, top_p) = sampling_values(st, req.temperature, req.top_p, F)?;
    let stop = Stop::strings(req.stop.as_ref())?;
    let knobs = params::Knobs {
        top_k: req.top_k,
        min_p: req.min_p,
        repetition_penalty: req.repetition_penalty,
        frequency_penalty: req.frequency_penalty,
        presence_penalty: req.presence_penalty,
    };
    let sampling = Sampling {
        max_tokens,
        temperature,
        top_p,
        params: knobs.params(st.cfg.params, F)?,
        seed: req.seed,
        stop,
        grammar: None,
        tenant: key.tenant(req.user.as_deref()),
        think: None,
        logprobs,
        echo: req.echo && logprobs.is_some(),
    };
    let echoed = if req.echo {
        prompt.clone()
    } else {
        String::new()
    };
    let mut rxs = st.submit_n(n, || JobPrompt::Text(prompt.clone()), sampling, F)?;
    let mut counts = Vec::with_capacity(n);
    for rx in &mut rxs {
        counts.push(started(rx, F).await?);
    }
    let (prompt_tokens, cached) = counts[0];
    let id = tools::call_id("cmpl-");
    let model = st.cfg.model_id.clone();
    let created = now_s();
    // With `echo` and `logprobs` the engine reads the prompt out: its tokens' logprobs come
    // first, at offset 0; with `echo` alone the prompt text is simply put in front.
    let read_out = req.echo && logprobs.is_some();
    if req.stream {
        let include_usage = req.stream_options.is_some_and(|o| o.include_usage);
        let mut head = String::new();
        let mut choices = Vec::with_capacity(n);
        for (index, rx) in rxs.into_iter().enumerate() {
            let mut enc = CompletionChunks {
                id: id.clone(),
                model: model.clone(),
                created,
                prompt_tokens,
                cached,
                include_usage,
                logprobs: logprobs.map(|_| Vec::new()),
                offset: 0,
                index,
                closes: n == 1,
                echoed: read_out.then(|| echoed.clone()),
            };
            if !read_out && !echoed.is_empty() {
                head += &enc.text(&echoed);
            }
            choices.push((rx, Hold::new(ToolMode::Off), enc));
        }
        if n == 1 {
            let (rx, hold, enc) = choices.pop().expect("n is 1");
            return Ok(sse::stream(rx, hold, enc, head));
        }
        let counts = (prompt_tokens, cached);
        let tail = choices_tail("text_completion", id, created, model, counts, include_usage);
        return Ok(sse::stream_n(choices, head, tail));
    }
    let mut choices = Vec::with_capacity(n);
    let mut completion_tokens = 0;
    let mut last = None;
    for (i, rx) in rxs.into_iter().enumerate() {
        let (text, _, summary, lps) = sse::collect_logprobs(rx, Hold::new(ToolMode::Off)).await;
        let Some(s) = summary.filter(|s| s.why != Why::Failed) else {
            return Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the engine failed on this request",
            ));
        };
        // Read out, the prompt's tokens come first in `lps`, from offset 0.
        let from = if read_out { 0 } else { echoed.len() };
        let lp = logprobs.map_or(Value::Null, |_| logprobs::completion(&lps, from));
        choices.push(
            json!({"index": i, "text": format!("{echoed}{text}"), "logprobs": lp,
                            "finish_reason": finish_reason(Some(&s), &[])}),
        );
        completion_tokens += s.completion_tokens;
        last = Some(s);
    }
    let s = last.expect("n >= 1");
    let mut r = Json(json!({
        "id": id, "object": "text_completion", "created": created, "model": model,
        "choices": choices,
        "usage": s.with_colibri(usage(prompt_tokens, cached, completion_tokens)),
    }))
    .into_response();
    sse::warn_header(&mut r, Some(&s));
    Ok(r)
}

struct CompletionChunks {
    id: String,
    model: String,
    created: u64,
    prompt_tokens: usize,
    cached: usize,
    include_usage: bool,
    /// With logprobs: those of the tokens not yet sent, and the text sent so far.
    logprobs: Option<Vec<TokenLp>>,
    offset: usize,
    /// The choice's index (`n` > 1).
    index: usize,
    /// Whether its end closes the stream (usage, `[DONE]`): not so for one of several
    /// choices, whose stream closes after the last ([`sse::stream_n`]).
    closes: bool,
    /// The prompt, sent with its read-out when that comes (`echo` with `logprobs`).
    echoed: Option<String>,
}

impl CompletionChunks {
    fn chunk(&mut self, text: &str, finish: Option<&str>) -> String {
        let lp = match &mut self.logprobs {
            Some(pending) if !pending.is_empty() => {
                logprobs::completion(&std::mem::take(pending), self.offset)
            }
            _ => Value::Null,
        };
        self.offset += text.len();
        frame(
            None,
            &json!({"id": self.id, "object": "text_completion", "created": self.created,
            "model": self.model,
            "choices": [{"index": self.index, "text": text, "logprobs": lp, "finish_reason": finish}]}),
        )
    }
}

impl Encoder for CompletionChunks {
    fn text(&mut self, text: &str) -> String {
        self.chunk(text, None)
    }

    fn logprob(&mut self, lp: TokenLp) {
        if let Some(pending) = &mut self.logprobs {
            pending.push(lp);
        }
    }

    fn echo(&mut self, lps: Vec<TokenLp>) -> Option<String> {
        let text = self.echoed.take()?;
        if let Some(pending) = &mut self.logprobs {
            pending.extend(lps);
        }
        Some(self.chunk(&text, None))
    }

    fn end(&mut self, rest: &str, _: &[ToolCall], s: Option<&Summary>) -> String {
        let mut out = String::new();
        if !rest.is_empty() {
            out += &self.chunk(rest, None);
        }
        out += &self.chunk("", Some(finish_reason(s, &[])));
        if !self.closes {
            return out;
        }
        if self.include_usage {
            let counts = (self.prompt_tokens, self.cached);
            out += &usage_chunk(
                "text_completion",
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
