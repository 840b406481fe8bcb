//! IOSurfaces for ANE I/O (FACTS §3.4): created from the one-row property dictionary every project
//! uses, written and read between `IOSurfaceLock`/`IOSurfaceUnlock`, released with `CFRelease`
//! (`IOSurfaceCreate` returns +1, FACTS §3.8).

use std::ffi::c_void;
use std::sync::OnceLock;

use libloading::Library;

use super::foundation::{foundation, Foundation};
use super::loader::{self, CORE_FOUNDATION, IOSURFACE};
use super::objc::{AutoreleasePool, Id};
use crate::error::{MacError, Result, Unavailable};
use crate::surface::{property_values, PROPERTY_KEYS};

/// `kIOSurfaceLockReadOnly` (FACTS §3.4).
const LOCK_READ_ONLY: u32 = 1;

type SurfaceRef = *mut c_void;

pub(crate) struct IoSurfaceApi {
    fnd: &'static Foundation,
    _surface_lib: Library,
    _cf_lib: Library,
    create: unsafe extern "C" fn(Id) -> SurfaceRef,
    lock: unsafe extern "C" fn(SurfaceRef, u32, *mut u32) -> i32,
    unlock: unsafe extern "C" fn(SurfaceRef, u32, *mut u32) -> i32,
    base_address: unsafe extern "C" fn(SurfaceRef) -> *mut c_void,
    alloc_size: unsafe extern "C" fn(SurfaceRef) -> usize,
    bytes_per_row: unsafe extern "C" fn(SurfaceRef) -> usize,
    plane_count: unsafe extern "C" fn(SurfaceRef) -> usize,
    cf_release: unsafe extern "C" fn(*const c_void),
    /// The `kIOSurface*` key constants, in [`PROPERTY_KEYS`] order (CFStringRef, toll-free
    /// bridged to NSString).
    keys: [KeyRef; 6],
}

/// A `const CFStringRef` read from IOSurface.framework; immutable for the life of the process.
#[derive(Clone, Copy)]
struct KeyRef(Id);

// SAFETY: the constants are immutable CFStrings owned by the framework.
unsafe impl Send for KeyRef {}
// SAFETY: as above.
unsafe impl Sync for KeyRef {}

pub(crate) fn iosurface() -> Result<&'static IoSurfaceApi, Unavailable> {
    static IOSURFACE_API: OnceLock<Result<IoSurfaceApi, Unavailable>> = OnceLock::new();
    IOSURFACE_API.get_or_init(IoSurfaceApi::load).as_ref().map_err(Clone::clone)
}

impl IoSurfaceApi {
    fn load() -> Result<IoSurfaceApi, Unavailable> {
        let fnd = foundation()?;
        let lib = loader::open(IOSURFACE)?;
        let cf = loader::open(CORE_FOUNDATION)?;
        let mut keys = [KeyRef(Id::NIL); 6];
        for (slot, name) in keys.iter_mut().zip(PROPERTY_KEYS) {
            let cname = std::ffi::CString::new(name).map_err(|e| Unavailable { component: name.into(), reason: e.to_string() })?;
            // SAFETY: each kIOSurface* symbol is a `const CFStringRef` variable: its address
            // is a pointer to an object pointer, valid for the life of the process.
            let at: *const Id = unsafe { loader::symbol(&lib, IOSURFACE, &cname)? };
            // SAFETY: as above; the variable is initialized when the framework loads.
            *slot = KeyRef(unsafe { at.read() });
        }
        // SAFETY: each type is the prototype in <IOSurface/IOSurfaceRef.h> or
        // <CoreFoundation/CFBase.h> (CFDictionaryRef is passed as the NSDictionary it bridges).
        unsafe {
            Ok(IoSurfaceApi {
                fnd,
                create: loader::symbol(&lib, IOSURFACE, c"IOSurfaceCreate")?,
                lock: loader::symbol(&lib, IOSURFACE, c"IOSurfaceLock")?,
                unlock: loader::symbol(&lib, IOSURFACE, c"IOSurfaceUnlock")?,
                base_address: loader::symbol(&lib, IOSURFACE, c"IOSurfaceGetBaseAddress")?,
                alloc_size: loader::symbol(&lib, IOSURFACE, c"IOSurfaceGetAllocSize")?,
                bytes_per_row: loader::symbol(&lib, IOSURFACE, c"IOSurfaceGetBytesPerRow")?,
                plane_count: loader::symbol(&lib, IOSURFACE, c"IOSurfaceGetPlaneCount")?,
                cf_release: loader::symbol(&cf, CORE_FOUNDATION, c"CFRelease")?,
                keys,
                _surface_lib: lib,
                _cf_lib: cf,
            })
        }
    }
}

/// One IOSurface, owned.
pub struct IoSurface {
    surface: SurfaceRef,
    api: &'static IoSurfaceApi,
    /// Bytes the caller asked for (the allocation may be larger).
    len: usize,
}

// SAFETY: an IOSurface is a kernel object usable from any thread; access to its memory goes
// through lock/unlock calls made by the one owner (`&mut self` to write).
unsafe impl Send for IoSurface {}

impl IoSurface {
    /// A surface of `bytes` bytes (FACTS §3.4 properties).
    pub fn new(bytes: usize) -> Result<IoSurface> {
        let api = iosurface()?;
        let fnd = api.fnd;
        let _pool = AutoreleasePool::new(fnd.rt);
        let numbers = property_values(bytes).iter().map(|&v| fnd.number(v)).collect::<Result<Vec<_>>>()?;
        let entries: Vec<(Id, Id)> = api.keys.iter().zip(&numbers).map(|(k, n)| (k.0, n.id())).collect();
        let props = fnd.dictionary(&entries)?;
        // SAFETY: props is a live NSDictionary (toll-free bridged CFDictionaryRef).
        let surface = unsafe { (api.create)(props.id()) };
        if surface.is_null() {
            return Err(MacError::Surface { call: "IOSurfaceCreate", detail: format!("returned NULL for {bytes} bytes") });
        }
        let s = IoSurface { surface, api, len: bytes };
        // SAFETY: surface is live.
        let alloc = unsafe { (api.alloc_size)(surface) };
        if alloc < bytes {
            return Err(MacError::Surface { call: "IOSurfaceGetAllocSize", detail: format!("{alloc} bytes allocated, {bytes} asked for") });
        }
        Ok(s)
    }

    /// Bytes asked for.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `IOSurfaceGetBytesPerRow` and `IOSurfaceGetPlaneCount`, for reports.
    pub fn strides(&self) -> (usize, usize) {
        // SAFETY: surface is live.
        unsafe { ((self.api.bytes_per_row)(self.surface), (self.api.plane_count)(self.surface)) }
    }

    /// The IOSurfaceRef, for `objectWithIOSurface:`.
    pub(crate) fn raw(&self) -> *mut c_void {
        self.surface
    }

    fn locked<R>(&self, options: u32, f: impl FnOnce(*mut u8) -> R) -> Result<R> {
        // SAFETY: surface is live; a null seed pointer is allowed.
        let kr = unsafe { (self.api.lock)(self.surface, options, std::ptr::null_mut()) };
        if kr != 0 {
            return Err(MacError::Surface { call: "IOSurfaceLock", detail: format!("kern_return_t {kr}") });
        }
        // SAFETY: the surface is locked, so its base address is stable.
        let base = unsafe { (self.api.base_address)(self.surface) }.cast::<u8>();
        let r = if base.is_null() { Err(MacError::Surface { call: "IOSurfaceGetBaseAddress", detail: "NULL".into() }) } else { Ok(f(base)) };
        // SAFETY: locked above with the same options.
        let kr = unsafe { (self.api.unlock)(self.surface, options, std::ptr::null_mut()) };
        if kr != 0 && r.is_ok() {
            return Err(MacError::Surface { call: "IOSurfaceUnlock", detail: format!("kern_return_t {kr}") });
        }
        r
    }

    /// Runs `f` on the surface's bytes, locked for writing.
    pub fn write<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> Result<R> {
        let len = self.len;
        // SAFETY: base points at an allocation of at least len bytes (checked in new), locked,
        // and `&mut self` makes this the only access from this process.
        self.locked(0, |base| f(unsafe { std::slice::from_raw_parts_mut(base, len) }))
    }

    /// Runs `f` on the surface's bytes, locked read-only.
    pub fn read<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        let len = self.len;
        // SAFETY: as in write; nothing in this process writes while `&self` is held.
        self.locked(LOCK_READ_ONLY, |base| f(unsafe { std::slice::from_raw_parts(base, len) }))
    }
}

impl Drop for IoSurface {
    fn drop(&mut self) {
        // SAFETY: IOSurfaceCreate returned +1; this is its one release.
        unsafe { (self.api.cf_release)(self.surface.cast_const()) }
    }
}
