//! HTTP errors in the shape each API's clients parse: OpenAI's
//! `{"error":{"message","type","param","code"}}` and Anthropic's
//! `{"type":"error","error":{"type","message"}}`, with the status that says what now.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::engine::Refusal;

/// Which API's error shape a route answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    OpenAi,
    Anthropic,
}

impl Flavor {
    /// Anthropic's routes are under `/v1/messages`; everything else speaks OpenAI.
    pub fn of_path(path: &str) -> Flavor {
        if path.starts_with("/v1/messages") {
            Flavor::Anthropic
        } else {
            Flavor::OpenAi
        }
    }
}

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The offending field, when one is to blame.
    pub param: Option<String>,
    /// OpenAI's machine-readable code (`context_length_exceeded`, ...).
    pub code: Option<&'static str>,
    pub flavor: Flavor,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code: None,
            flavor: Flavor::OpenAi,
        }
    }

    pub fn bad_json(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    /// A field with a wrong type or value, or one this server does not know (`""`: no one
    /// field is to blame, and `param` is null).
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        let param: String = param.into();
        ApiError {
            param: (!param.is_empty()).then_some(param),
            ..ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, message)
        }
    }

    /// A field past one of this server's limits (`n`, `top_logprobs`): 400 naming it.
    pub fn out_of_range(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param.to_string()),
            ..ApiError::new(StatusCode::BAD_REQUEST, message)
        }
    }

    pub fn with_code(self, code: &'static str) -> ApiError {
        ApiError {
            code: Some(code),
            ..self
        }
    }

    pub fn flavor(self, flavor: Flavor) -> ApiError {
        ApiError { flavor, ..self }
    }

    /// The engine's refusal of a request.
    pub fn refused(r: &Refusal) -> ApiError {
        match r {
            Refusal::TooManyBytes {
                bytes,
                at_least,
                max_prompt_tokens,
            } => ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("the prompt is {bytes} bytes, so at least {at_least} tokens; this server takes at most {max_prompt_tokens} prompt tokens (--ctx); nothing was truncated"),
            )
            .with_code("context_length_exceeded"),
            Refusal::ContextExceeded {
                tokens,
                max_prompt_tokens,
            } => ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("the prompt is {tokens} tokens; this server takes at most {max_prompt_tokens} prompt tokens (--ctx); nothing was truncated"),
            )
            .with_code("context_length_exceeded"),
            Refusal::EmptyPrompt => ApiError::invalid("messages", "the prompt is empty after tokenization"),
            Refusal::EncodeBudget(why) => ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, why.clone()),
            Refusal::NoFreeSlot | Refusal::SlotBusy { .. } => overloaded("every session is busy"),
            Refusal::Tokenizer(why) | Refusal::Engine(why) => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, why.clone())
            }
            Refusal::NoSuchSlot { slot, slots } => ApiError::invalid(
                "slot",
                format!("slot {slot} is not one of the {slots} sessions"),
            ),
        }
    }

    fn openai_type(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "service_unavailable",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    fn anthropic_type(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
            s if s.is_server_error() => "api_error",
            _ => "invalid_request_error",
        }
    }
}

/// The server cannot take the request now (engine loading, overloaded): 503.
pub fn overloaded(why: &str) -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, why.to_string())
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = match self.flavor {
            Flavor::OpenAi => json!({"error": {
                "message": self.message,
                "type": self.openai_type(),
                "param": self.param,
                "code": self.code,
            }}),
            Flavor::Anthropic => json!({"type": "error", "error": {
                "type": self.anthropic_type(),
                "message": self.message,
            }}),
        };
        let mut r = (self.status, axum::Json(body)).into_response();
        if matches!(
            self.status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        ) {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}
