//! The web chat: one self-contained page (styles, script and markdown renderer inline, nothing
//! fetched from elsewhere), built into the binary.

use axum::http::header;
use axum::response::IntoResponse;

const PAGE: &str = include_str!("webui/index.html");

/// `GET /`.
pub async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // The page runs its own inline script and talks to this server only.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'",
            ),
        ],
        PAGE,
    )
}
