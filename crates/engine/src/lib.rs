//! anelm's engine: sessions (KV cache ownership, prefix reuse) and generation, above any
//! [`anelm_model::Executor`] — CPU, ANE simulator or ANE.

pub mod error;
pub mod greedy;
pub mod loaded;
pub mod session;
pub mod utf8_stream;

pub use error::{EngineError, Result};
pub use greedy::{argmax, generate_greedy};
pub use loaded::{LoadError, LoadedModel};
pub use session::Session;
pub use utf8_stream::Utf8Stream;
