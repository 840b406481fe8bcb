use anelm_mil::MilError;
use anelm_model::{ExecError, ModelError};

use crate::device::DeviceError;

#[derive(Debug, thiserror::Error)]
pub enum AneError {
    #[error(transparent)]
    Mil(#[from] MilError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// A model or setting the lowering cannot express.
    #[error("{0}")]
    Unsupported(String),
}

impl From<AneError> for ExecError {
    fn from(e: AneError) -> ExecError {
        match e {
            AneError::Exec(e) => e,
            other => ExecError::Device(other.to_string()),
        }
    }
}

pub type Result<T, E = AneError> = std::result::Result<T, E>;
