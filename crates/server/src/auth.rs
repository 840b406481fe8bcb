//! The API key: when the server has one, every API request must present it, as OpenAI clients
//! do (`Authorization: Bearer KEY`) or as Anthropic clients do (`x-api-key: KEY`).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::{ApiError, Flavour};

pub async fn check(State(key): State<Arc<Option<String>>>, req: Request, next: Next) -> Response {
    match key.as_deref() {
        Some(key) if !presents(req.headers(), key) => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "Invalid or missing API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
        )
        .with_flavour(Flavour::of_path(req.uri().path()))
        .into_response(),
        _ => next.run(req).await,
    }
}

fn presents(headers: &HeaderMap, key: &str) -> bool {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let x_api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    [bearer, x_api_key]
        .into_iter()
        .flatten()
        .any(|given| same(given.trim().as_bytes(), key.as_bytes()))
}

/// Compares without stopping at the first difference, so timing does not reveal the key.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn either_header_carries_the_key() {
        assert!(presents(
            &headers(&[("authorization", "Bearer s3cret")]),
            "s3cret"
        ));
        assert!(presents(&headers(&[("x-api-key", "s3cret")]), "s3cret"));
        assert!(!presents(
            &headers(&[("authorization", "Bearer s3cre")]),
            "s3cret"
        ));
        assert!(!presents(
            &headers(&[("authorization", "s3cret")]),
            "s3cret"
        ));
        assert!(!presents(&headers(&[]), "s3cret"));
    }
}
