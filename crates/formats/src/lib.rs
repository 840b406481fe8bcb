//! Model file formats: GGUF (metadata + tensors on a memory map), ggml quantisation types and
//! their dequantisation, safetensors (single or sharded), and Hugging Face `config.json`.

pub mod error;
pub mod fuzz;
pub mod ggml_type;
pub mod gguf;
pub mod gguf_writer;
pub mod hf_config;
pub mod quant;
pub mod safetensors;
pub mod store;

pub use error::{FormatError, Result};
pub use ggml_type::GgmlType;
pub use gguf::{Gguf, MetaValue, Metadata};
pub use hf_config::{HfConfig, RopeParams};
pub use store::{Tensor, TensorInfo, TensorStore};
