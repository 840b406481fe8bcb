//! Everything that calls into macOS, reached through `dlopen`/`dlsym` (no `cfg(target_os)`):
//! the Linux build type-checks every call, and a library that does not open is the typed
//! "no ANE here" error.

pub mod block;
pub mod coreml;
pub mod foundation;
pub mod iosurface;
pub mod loader;
pub mod objc;
pub mod private;
pub mod sysinfo;
