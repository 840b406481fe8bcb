//! anelm's ANE path: the LayerPlan lowered to MIL programs with fp16 weight blobs
//! ([`lower`]), devices that compile and run them ([`device`]: the simulator here; the macOS
//! drivers implement the same trait), and an executor that runs a model on any device
//! ([`exec`]) — so the engine drives the ANE exactly as it drives the CPU.

pub mod cache;
pub mod check;
pub mod compare;
pub mod dequant;
pub mod device;
pub mod dialect;
pub mod error;
pub mod exec;
pub mod lower;
pub mod planar;
pub mod probe;
pub mod strategy;
pub mod support;
pub mod unit;
pub mod verify;

pub use device::{Device, DeviceError, SimDevice};
pub use dialect::{DialectChoice, MilDialect};
pub use error::{AneError, Result};
pub use exec::{DeviceProjections, ProjectionExecutor, Projections, ReferenceProjections};
pub use lower::{LoweringOptions, Projection};
pub use strategy::{AneExecutor, DevicePath, Strategy};
pub use unit::CompileUnit;
