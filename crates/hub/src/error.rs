//! The ways a reference can fail to become local files, each one line a user can act on.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The text names no model in any form we take.
    #[error("{0}")]
    BadReference(String),
    /// The reference is well formed but nothing is there (no repository, file, manifest...).
    #[error("{0}")]
    NotFound(String),
    /// The Hub refused us: a gated or private repository, or a bad token.
    #[error("{0}")]
    Denied(String),
    /// HF_HUB_OFFLINE is set and the cache cannot answer.
    #[error("{0}")]
    Offline(String),
    /// A downloaded file is not the file the Hub described; it was removed.
    #[error("{0}")]
    Integrity(String),
    /// Talking to the Hub failed (connection, protocol, unexpected status).
    #[error("{0}")]
    Http(String),
    /// A name matches several models.
    #[error("{0}")]
    Ambiguous(String),
}

impl HubError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> HubError {
        HubError::Io {
            path: path.into(),
            source,
        }
    }
}
