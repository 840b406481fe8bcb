//! Where a model named on the command line (or in a request) lives: a path, a repository on the
//! Hugging Face Hub (downloaded into, and read from, the Hub's own cache layout), a model in
//! Ollama's store, or a name from `anelm list`. Everything that turns a reference into local
//! files is here, so the CLI and the server take models the same way.

mod download;
mod error;
pub mod hf_cache;
pub mod hub;
pub mod inventory;
pub mod ollama;
mod reference;
pub mod remove;
mod resolve;
pub mod select;
mod settings;
mod verify;

pub use error::HubError;
pub use hub::{FileProgress, Hub, NoProgress, Progress, Snapshot};
pub use reference::{ModelRef, Pick};
pub use resolve::{Resolved, Resolver};
pub use settings::{anelm_models_dir, Settings};
pub use verify::{git_blob_sha1, sha256_file, Etag};

pub type Result<T, E = HubError> = std::result::Result<T, E>;
