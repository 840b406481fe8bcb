//! Errors of the format readers. Each names the file and says what is wrong with it.

use std::path::PathBuf;

use crate::GgmlType;

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file's structure is wrong: bad magic, truncated, inconsistent sizes.
    #[error("{path}: {msg}")]
    Malformed { path: PathBuf, msg: String },
    #[error("{path}: tensor '{tensor}' has unknown ggml type id {id}")]
    UnknownType {
        path: PathBuf,
        tensor: String,
        id: u32,
    },
    #[error("{path}: missing tensor '{name}'")]
    MissingTensor { path: PathBuf, name: String },
    #[error("{path}: missing metadata key '{key}'")]
    MissingKey { path: PathBuf, key: String },
    #[error("{path}: metadata key '{key}': {msg}")]
    BadValue {
        path: PathBuf,
        key: String,
        msg: String,
    },
    #[error("{dtype}: {len} bytes is not a whole number of blocks for {n} elements")]
    BadQuantLength {
        dtype: GgmlType,
        len: usize,
        n: usize,
    },
}

pub type Result<T, E = FormatError> = std::result::Result<T, E>;

impl FormatError {
    pub(crate) fn malformed(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        FormatError::Malformed {
            path: path.into(),
            msg: msg.into(),
        }
    }
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        FormatError::Io {
            path: path.into(),
            source,
        }
    }
}
