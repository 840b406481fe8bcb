//! anelm's macOS drivers, compiled on every platform (DESIGN.md principle 4).
//!
//! - [`PrivateAne`]: the private in-memory path of AppleNeuralEngine.framework (FACTS §3): MIL
//!   text and weight blobs in, [`AneModel`] out; I/O over IOSurfaces bound by an [`AneRequest`].
//! - [`CoreMl`]: a `.mlpackage` compiled and loaded for CPU_AND_NE, predictions over
//!   `MLMultiArray`s that wrap the caller's buffers, [`MlState`] for stateful packages.
//! - [`info::system_report`]: what this process finds (`anelm info`).
//!
//! Everything that touches macOS is in [`ffi`] and reached through `dlopen`/`dlsym`; every
//! `objc_msgSend` call site casts it to the exact prototype of that call and names the FACTS
//! section it follows. Off a Mac, opening a driver is [`MacError::Unavailable`] — the normal
//! "no ANE here" path, never a panic.
//!
//! The logic that needs no Mac is apart and unit-tested: [`layout`] (I/O order and strides from
//! `modelAttributes`), [`saved`] (attributes and MIL text kept for failures), [`staging`]
//! (weights dictionary keys, staging paths), [`error`] (NSError
//! domains and codes), [`retry`], [`budget`], [`multiarray`], [`surface`].

pub mod budget;
pub mod error;
pub mod ffi;
pub mod info;
pub mod layout;
pub mod multiarray;
pub mod retry;
pub mod saved;
pub mod staging;
pub mod surface;

pub use error::{MacError, NsErrorInfo, NsErrorKind, Result, Step, Unavailable};
pub use ffi::coreml::{CompiledModel, CoreMl, Input, MlModel, MlState, Prediction};
pub use ffi::iosurface::IoSurface;
pub use ffi::private::{AneModel, AneRequest, LoadOptions, PrivateAne};
pub use ffi::sysinfo::{machine_info, MachineInfo};
pub use layout::{DeclaredFunction, DeclaredTensor, ElemType, ProcedureIo, TensorSlot};
pub use multiarray::Planar;
