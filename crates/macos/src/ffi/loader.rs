//! `dlopen`/`dlsym` of the system libraries the drivers call (DESIGN.md principle 4): nothing is
//! linked, so the build works on every platform and a library that does not open is the normal
//! "no ANE here" answer.

use std::ffi::CStr;

use libloading::os::unix::{Library as UnixLibrary, RTLD_LOCAL, RTLD_NOW};
use libloading::Library;

use crate::error::Unavailable;

/// A library the drivers open, by the path macOS gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LibrarySpec {
    pub name: &'static str,
    pub path: &'static str,
}

pub const OBJC: LibrarySpec = LibrarySpec { name: "libobjc", path: "/usr/lib/libobjc.A.dylib" };
pub const FOUNDATION: LibrarySpec = LibrarySpec { name: "Foundation", path: "/System/Library/Frameworks/Foundation.framework/Foundation" };
pub const CORE_FOUNDATION: LibrarySpec = LibrarySpec { name: "CoreFoundation", path: "/System/Library/Frameworks/CoreFoundation.framework/CoreFoundation" };
pub const IOSURFACE: LibrarySpec = LibrarySpec { name: "IOSurface", path: "/System/Library/Frameworks/IOSurface.framework/IOSurface" };
/// FACTS §3.1.
pub const APPLE_NEURAL_ENGINE: LibrarySpec = LibrarySpec { name: "AppleNeuralEngine", path: "/System/Library/PrivateFrameworks/AppleNeuralEngine.framework/AppleNeuralEngine" };
pub const CORE_ML: LibrarySpec = LibrarySpec { name: "CoreML", path: "/System/Library/Frameworks/CoreML.framework/CoreML" };
/// Where `sysctlbyname` lives on macOS.
pub const LIBSYSTEM: LibrarySpec = LibrarySpec { name: "libSystem", path: "/usr/lib/libSystem.B.dylib" };

/// Every library, in the order `anelm info` lists them.
pub const ALL: [LibrarySpec; 7] = [OBJC, FOUNDATION, CORE_FOUNDATION, IOSURFACE, APPLE_NEURAL_ENGINE, CORE_ML, LIBSYSTEM];

/// Opens `spec` with `RTLD_NOW` (FACTS §3.1). The library stays open for the life of the
/// process: every caller keeps it in a static.
pub(crate) fn open(spec: LibrarySpec) -> Result<Library, Unavailable> {
    // SAFETY: these are Apple's system libraries; their initializers have no preconditions on
    // the caller. On a system without them dlopen fails and nothing runs.
    let lib = unsafe { UnixLibrary::open(Some(spec.path), RTLD_NOW | RTLD_LOCAL) };
    lib.map(Library::from).map_err(|e| {
        let e = e.to_string();
        // dlerror() usually names the path already.
        let reason = if e.contains(spec.path) { e } else { format!("{}: {e}", spec.path) };
        Unavailable { component: spec.name.into(), reason }
    })
}

/// The address of `name` in `lib`, as `T` (a function pointer type or a pointer to data).
///
/// # Safety
/// `T` must be the exact type of the symbol: the C prototype of a function, or a pointer to
/// the type of a data symbol.
pub(crate) unsafe fn symbol<T: Copy>(lib: &Library, spec: LibrarySpec, name: &CStr) -> Result<T, Unavailable> {
    // SAFETY: the caller guarantees T; libloading checks the symbol exists and is non-null.
    let sym = unsafe { lib.get::<T>(name.to_bytes_with_nul()) };
    sym.map(|s| *s).map_err(|e| Unavailable { component: format!("{}: {}", spec.name, name.to_string_lossy()), reason: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_unavailable_with_its_path() {
        let spec = LibrarySpec { name: "Nothing", path: "/nonexistent/anelm/Nothing.framework/Nothing" };
        let e = open(spec).unwrap_err();
        assert_eq!(e.component, "Nothing");
        assert!(e.reason.contains("/nonexistent/anelm/Nothing.framework/Nothing"), "{e}");
    }
}
