//! Errors as the APIs spell them: OpenAI's `{"error": {"message", "type", "param", "code"}}`
//! and Anthropic's `{"type": "error", "error": {"type", "message"}}`, chosen by the route.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Which API's error shape a response takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavour {
    OpenAi,
    Anthropic,
}

impl Flavour {
    /// Anthropic's routes live under `/v1/messages`; everything else answers as OpenAI does.
    pub fn of_path(path: &str) -> Flavour {
        if path.starts_with("/v1/messages") {
            Flavour::Anthropic
        } else {
            Flavour::OpenAi
        }
    }
}

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The request field at fault (OpenAI's `param`).
    pub param: Option<String>,
    /// OpenAI's machine-readable `code`.
    pub code: Option<&'static str>,
    pub flavour: Flavour,
}

/// Seconds a refused client should wait before trying again.
pub const RETRY_AFTER_SECONDS: u64 = 1;

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code: None,
            flavour: Flavour::OpenAi,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    /// A bad value of request field `param`.
    pub fn bad_param(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param.into()),
            ..ApiError::bad_request(message)
        }
    }

    pub fn unknown_model(asked: &str, served: &str) -> ApiError {
        ApiError {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                format!("The model '{asked}' does not exist; this server serves '{served}'"),
            )
        }
    }

    pub fn context_exceeded(param: &str, prompt_tokens: usize, ctx: usize) -> ApiError {
        ApiError {
            param: Some(param.into()),
            code: Some("context_length_exceeded"),
            ..ApiError::bad_request(format!(
                "This model's context holds {ctx} tokens, and the prompt has {prompt_tokens}: \
                 shorten the prompt"
            ))
        }
    }

    pub fn busy() -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "The server is busy: every generation slot and the queue are full; retry later",
        )
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// The same error in Anthropic's shape.
    pub fn anthropic(self) -> ApiError {
        ApiError {
            flavour: Flavour::Anthropic,
            ..self
        }
    }

    pub fn with_flavour(self, flavour: Flavour) -> ApiError {
        ApiError { flavour, ..self }
    }

    /// The error's body, for streams that fail after their headers went out.
    pub fn body(&self) -> serde_json::Value {
        match self.flavour {
            Flavour::OpenAi => json!({
                "error": {
                    "message": self.message,
                    "type": openai_type(self.status),
                    "param": self.param,
                    "code": self.code,
                }
            }),
            Flavour::Anthropic => json!({
                "type": "error",
                "error": {"type": anthropic_type(self.status), "message": self.message},
            }),
        }
    }
}

fn openai_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        429 => "rate_limit_error",
        500.. => "server_error",
        _ => "invalid_request_error",
    }
}

fn anthropic_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        500.. => "api_error",
        _ => "invalid_request_error",
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
        }
        response
    }
}
