//! Errors of this crate. Parse errors carry a 1-based line and column; file errors name the file.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum MilError {
    /// MIL text that does not parse or does not type-check, at `line:col` (1-based).
    #[error("{line}:{col}: {msg}")]
    Parse {
        line: usize,
        col: usize,
        msg: String,
    },
    /// A malformed program or an invalid builder call (type errors, unknown names, ...).
    #[error("{0}")]
    Invalid(String),
    /// A file whose content is wrong (blob storage, package, manifest).
    #[error("{path}: {msg}")]
    Format { path: PathBuf, msg: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, MilError>;

impl MilError {
    pub fn invalid(msg: impl Into<String>) -> MilError {
        MilError::Invalid(msg.into())
    }

    pub fn format(path: impl AsRef<Path>, msg: impl Into<String>) -> MilError {
        MilError::Format {
            path: path.as_ref().to_path_buf(),
            msg: msg.into(),
        }
    }

    pub fn io(path: impl AsRef<Path>, source: std::io::Error) -> MilError {
        MilError::Io {
            path: path.as_ref().to_path_buf(),
            source,
        }
    }

    /// Prefixes the message of an `Invalid` error with context (op or function name).
    pub fn context(self, what: impl std::fmt::Display) -> MilError {
        match self {
            MilError::Invalid(m) => MilError::Invalid(format!("{what}: {m}")),
            other => other,
        }
    }
}
