//! anelm's CPU engine: kernels that read ggml blocks in place, a persistent SPMD thread pool,
//! and the forward pass over the LayerPlan.

mod adaptive;
mod attention;
pub mod deltanet;
pub mod encoder;
mod forward;
pub mod kernels;
mod kv;
pub mod kvblock;
pub mod kvdot;
pub mod matmul;
pub mod mem;
pub mod membw;
pub mod moe;
pub mod ops;
pub mod pool;
pub mod q8;
mod resident;
mod shared;
pub mod shortconv;
pub mod simd;
pub mod vecmath;

pub use forward::{check_cache_types, CpuExecutor, CpuOptions, MAX_BATCH};
pub use kv::{CpuKv, KvDtype};
pub use simd::Isa;
