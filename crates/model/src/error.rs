//! Errors of model loading. Each names the file and what is wrong.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Format(#[from] anelm_formats::FormatError),
    #[error("{path}: unsupported architecture '{arch}' (supported: {supported})")]
    UnsupportedArch {
        path: PathBuf,
        arch: String,
        supported: String,
    },
    #[error("{path}: tensor '{tensor}': {msg}")]
    Shape {
        path: PathBuf,
        tensor: String,
        msg: String,
    },
    #[error("{path}: {msg}")]
    Invalid { path: PathBuf, msg: String },
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;

impl ModelError {
    pub fn shape(path: &Path, tensor: &str, msg: impl Into<String>) -> Self {
        ModelError::Shape {
            path: path.to_path_buf(),
            tensor: tensor.to_string(),
            msg: msg.into(),
        }
    }
    pub fn invalid(path: &Path, msg: impl Into<String>) -> Self {
        ModelError::Invalid {
            path: path.to_path_buf(),
            msg: msg.into(),
        }
    }
}
