//! The JSON request body, with every failure (too large, not JSON, wrong types) as an API error
//! that names the field at fault.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use serde_json::error::Category;

use crate::error::{ApiError, Flavour};
use crate::models::Models;

pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<Arc<Models>> for JsonBody<T> {
    type Rejection = ApiError;

    /// The body within the server's size and time limits, parsed.
    async fn from_request(req: Request, models: &Arc<Models>) -> Result<Self, ApiError> {
        let flavour = Flavour::of_path(req.uri().path());
        let limits = &models.shared.limits;
        let read = tokio::time::timeout(limits.body_timeout, Bytes::from_request(req, models));
        let bytes = read
            .await
            .map_err(|_| {
                ApiError::new(StatusCode::REQUEST_TIMEOUT, limits.body_too_slow())
                    .with_flavour(flavour)
            })?
            .map_err(|r| {
                let message = if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    limits.body_too_large()
                } else {
                    r.body_text()
                };
                ApiError::new(r.status(), message).with_flavour(flavour)
            })?;
        parse(&bytes)
            .map(JsonBody)
            .map_err(|e| e.with_flavour(flavour))
    }
}

/// Parses a request body; a type error names the path of the field (`messages[0].content`).
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(request_error)?;
    de.end().map_err(|e| not_json(&e))?;
    Ok(value)
}

/// Reads fields collected by `#[serde(flatten)]` (which loses the paths of its errors).
pub fn from_fields<T: DeserializeOwned>(
    fields: serde_json::Map<String, serde_json::Value>,
) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(serde_json::Value::Object(fields)).map_err(request_error)
}

fn request_error(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = e.path().to_string();
    let inner = e.into_inner();
    match inner.classify() {
        Category::Data if path != "." => {
            ApiError::bad_param(&path, format!("Invalid value for '{path}': {inner}"))
        }
        Category::Data => ApiError::bad_request(format!("Invalid request body: {inner}")),
        _ => not_json(&inner),
    }
}

fn not_json(e: &serde_json::Error) -> ApiError {
    ApiError::bad_request(format!("The request body is not valid JSON: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Req {
        model: String,
        messages: Vec<Msg>,
    }
    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Msg {
        role: String,
    }

    #[test]
    fn type_errors_name_the_field() {
        let e = parse::<Req>(br#"{"model": "m", "messages": [{"role": 5}]}"#).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
        assert!(
            e.message.contains("invalid type: integer `5`"),
            "{}",
            e.message
        );
    }

    #[test]
    fn syntax_errors_say_json() {
        for body in [
            &br#"{"model": "m", "#[..],
            b"not json",
            br#"{"model": "m", "messages": []} trailing"#,
            b"",
        ] {
            let e = parse::<Req>(body).unwrap_err();
            assert!(
                e.message.starts_with("The request body is not valid JSON"),
                "{}",
                e.message
            );
            assert_eq!(e.param, None);
        }
    }

    #[test]
    fn a_missing_field_is_a_bad_request() {
        let e = parse::<Req>(br#"{"messages": []}"#).unwrap_err();
        assert!(e.message.contains("missing field `model`"), "{}", e.message);
    }
}
