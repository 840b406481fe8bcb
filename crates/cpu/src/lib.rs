//! anelm's CPU engine: the reference executor of the LayerPlan and the engine wherever there is
//! no ANE.

mod attention;
mod forward;
mod kv;
pub mod matmul;
pub mod ops;

pub use forward::CpuExecutor;
pub use kv::CpuKv;
