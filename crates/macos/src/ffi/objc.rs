//! The Objective-C runtime through `dlsym`: classes, selectors, `objc_msgSend` called through the
//! exact non-variadic prototype of each call (FACTS §3.8), retain/release ownership and
//! autorelease pools.

use std::ffi::{c_char, c_void, CStr};
use std::sync::OnceLock;

use libloading::Library;

use super::loader::{self, OBJC};
use crate::error::Unavailable;

/// An Objective-C object pointer (`id`); may be nil.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Id(*mut c_void);

impl Id {
    pub const NIL: Id = Id(std::ptr::null_mut());

    pub fn is_nil(self) -> bool {
        self.0.is_null()
    }
}

/// A selector (`SEL`).
#[repr(transparent)]
#[derive(Clone, Copy, Debug)]
pub struct Sel(*const c_void);

/// A class (`Class`), itself an object: the receiver of class methods.
#[repr(transparent)]
#[derive(Clone, Copy, Debug)]
pub struct Class(*mut c_void);

impl Class {
    pub fn is_nil(self) -> bool {
        self.0.is_null()
    }
}

// SAFETY: classes and selectors are registered once and never freed or mutated through these
// handles; the runtime's own functions on them are thread-safe.
unsafe impl Send for Class {}
// SAFETY: as above.
unsafe impl Sync for Class {}
// SAFETY: as above.
unsafe impl Send for Sel {}
// SAFETY: as above.
unsafe impl Sync for Sel {}

/// `BOOL` as a return value: one byte (`bool` on arm64, `signed char` on x86_64, FACTS §3.8),
/// read as an integer so no value is invalid; true when non-zero.
pub type ObjcBool = i8;
pub const YES: ObjcBool = 1;
pub const NO: ObjcBool = 0;
/// `NSInteger` / `NSUInteger` are pointer-sized on 64-bit Apple platforms.
pub type NsInteger = isize;
pub type NsUInteger = usize;

/// `objc_msgSend` as the exact `unsafe extern "C" fn` type of one call shape (FACTS §3.8: never
/// variadic; arm64 passes variadic arguments on the stack while the method reads registers).
/// Expands to an expression that is only valid inside `unsafe`.
macro_rules! msg {
    ($rt:expr, fn($($arg:ty),* $(,)?) -> $ret:ty) => {
        ::std::mem::transmute::<*const ::std::ffi::c_void, unsafe extern "C" fn($($arg),*) -> $ret>($rt.msg_send_ptr())
    };
    ($rt:expr, fn($($arg:ty),* $(,)?)) => {
        ::std::mem::transmute::<*const ::std::ffi::c_void, unsafe extern "C" fn($($arg),*)>($rt.msg_send_ptr())
    };
}
pub(crate) use msg;

/// The runtime functions the drivers use.
pub(crate) struct Objc {
    _lib: Library,
    get_class: unsafe extern "C" fn(*const c_char) -> Class,
    register_name: unsafe extern "C" fn(*const c_char) -> Sel,
    /// `objc_msgSend`: only ever called through [`msg!`].
    msg_send: CodeAddress,
    retain: unsafe extern "C" fn(Id) -> Id,
    release: unsafe extern "C" fn(Id),
    pool_push: unsafe extern "C" fn() -> *mut c_void,
    pool_pop: unsafe extern "C" fn(*mut c_void),
    responds_to: unsafe extern "C" fn(Class, Sel) -> ObjcBool,
    class_method: unsafe extern "C" fn(Class, Sel) -> *mut c_void,
}

/// The address of a function; calling it needs a cast to its prototype.
#[derive(Clone, Copy)]
struct CodeAddress(*const c_void);

// SAFETY: a code address is immutable and valid from any thread.
unsafe impl Send for CodeAddress {}
// SAFETY: as above.
unsafe impl Sync for CodeAddress {}

/// The runtime of this process, loaded on first use.
pub(crate) fn objc() -> Result<&'static Objc, Unavailable> {
    static OBJC_RUNTIME: OnceLock<Result<Objc, Unavailable>> = OnceLock::new();
    OBJC_RUNTIME.get_or_init(Objc::load).as_ref().map_err(Clone::clone)
}

impl Objc {
    fn load() -> Result<Objc, Unavailable> {
        let lib = loader::open(OBJC)?;
        // SAFETY: each type is the public prototype in <objc/runtime.h> / <objc/message.h>
        // (objc_retain, objc_release and the pool functions are the ARC entry points libobjc
        // exports); objc_msgSend's own type is irrelevant: it is stored as an address.
        unsafe {
            Ok(Objc {
                get_class: loader::symbol(&lib, OBJC, c"objc_getClass")?,
                register_name: loader::symbol(&lib, OBJC, c"sel_registerName")?,
                msg_send: CodeAddress(loader::symbol::<*const c_void>(&lib, OBJC, c"objc_msgSend")?),
                retain: loader::symbol(&lib, OBJC, c"objc_retain")?,
                release: loader::symbol(&lib, OBJC, c"objc_release")?,
                pool_push: loader::symbol(&lib, OBJC, c"objc_autoreleasePoolPush")?,
                pool_pop: loader::symbol(&lib, OBJC, c"objc_autoreleasePoolPop")?,
                responds_to: loader::symbol(&lib, OBJC, c"class_respondsToSelector")?,
                class_method: loader::symbol(&lib, OBJC, c"class_getClassMethod")?,
                _lib: lib,
            })
        }
    }

    /// For [`msg!`] only.
    pub(crate) fn msg_send_ptr(&self) -> *const c_void {
        self.msg_send.0
    }

    /// The class named `name`, registered by a framework already opened.
    pub fn class(&self, name: &CStr) -> Result<Class, Unavailable> {
        // SAFETY: objc_getClass takes a NUL-terminated string and returns nil when unknown.
        let c = unsafe { (self.get_class)(name.as_ptr()) };
        if c.is_nil() {
            return Err(Unavailable { component: format!("class {}", name.to_string_lossy()), reason: "objc_getClass returned nil".into() });
        }
        Ok(c)
    }

    pub fn sel(&self, name: &CStr) -> Sel {
        // SAFETY: sel_registerName takes a NUL-terminated string and always returns a selector.
        unsafe { (self.register_name)(name.as_ptr()) }
    }

    /// Checks that instances of `class` respond to `selector`: sending an unknown selector
    /// raises an Objective-C exception, which aborts a Rust process, so every private method is
    /// checked before the first call.
    pub fn require_method(&self, class: Class, class_name: &CStr, selector: &CStr) -> Result<(), Unavailable> {
        // SAFETY: class is a live class; class_respondsToSelector only reads its method lists.
        let ok = unsafe { (self.responds_to)(class, self.sel(selector)) } != NO;
        ok.then_some(()).ok_or_else(|| missing(class_name, '-', selector))
    }

    /// As [`Self::require_method`], for a class method.
    pub fn require_class_method(&self, class: Class, class_name: &CStr, selector: &CStr) -> Result<(), Unavailable> {
        // SAFETY: as above; class_getClassMethod returns null when there is no such method.
        let m = unsafe { (self.class_method)(class, self.sel(selector)) };
        (!m.is_null()).then_some(()).ok_or_else(|| missing(class_name, '+', selector))
    }

    pub fn responds(&self, class: Class, selector: &CStr) -> bool {
        // SAFETY: as in require_method.
        unsafe { (self.responds_to)(class, self.sel(selector)) != NO }
    }
}

fn missing(class: &CStr, kind: char, selector: &CStr) -> Unavailable {
    Unavailable { component: format!("{kind}[{} {}]", class.to_string_lossy(), selector.to_string_lossy()), reason: "the class has no such method in this OS version".into() }
}

/// An object this code owns one reference to; released on drop.
pub(crate) struct Retained {
    id: Id,
    rt: &'static Objc,
}

// SAFETY: retain/release are thread-safe (atomic reference counts), and the objects kept here
// (Foundation value objects, the ANE model, requests, Core ML models) are used by one thread at
// a time: every mutating call goes through `&mut` or an owning device.
unsafe impl Send for Retained {}

impl Retained {
    /// Takes over a +1 reference (from `alloc`/`init`, `new…`, `copy…`); None for nil.
    ///
    /// # Safety
    /// `id` must be nil or an object the caller owns a reference to.
    pub unsafe fn from_owned(rt: &'static Objc, id: Id) -> Option<Retained> {
        (!id.is_nil()).then_some(Retained { id, rt })
    }

    /// Retains an object the caller does not own (autoreleased or borrowed); None for nil.
    ///
    /// # Safety
    /// `id` must be nil or a live object.
    pub unsafe fn retain(rt: &'static Objc, id: Id) -> Option<Retained> {
        if id.is_nil() {
            return None;
        }
        // SAFETY: id is a live object (caller).
        Some(Retained { id: unsafe { (rt.retain)(id) }, rt })
    }

    pub fn id(&self) -> Id {
        self.id
    }
}

impl Drop for Retained {
    fn drop(&mut self) {
        // SAFETY: this value owns one reference to a live object.
        unsafe { (self.rt.release)(self.id) }
    }
}

/// An autorelease pool for the calls of one scope: factory methods return autoreleased objects
/// (FACTS §3.8), and Rust threads have no pool of their own.
pub(crate) struct AutoreleasePool {
    token: *mut c_void,
    rt: &'static Objc,
}

impl AutoreleasePool {
    pub fn new(rt: &'static Objc) -> AutoreleasePool {
        // SAFETY: objc_autoreleasePoolPush has no preconditions; the token is popped on the
        // same thread (the pool holds a raw pointer, so it is neither Send nor Sync).
        AutoreleasePool { token: unsafe { (rt.pool_push)() }, rt }
    }
}

impl Drop for AutoreleasePool {
    fn drop(&mut self) {
        // SAFETY: token came from objc_autoreleasePoolPush on this thread, and pools are
        // dropped in reverse order of creation (they are scoped values).
        unsafe { (self.rt.pool_pop)(self.token) }
    }
}

/// `+alloc` then the caller's `-init…`: the first half of making an owned object.
pub(crate) fn alloc(rt: &'static Objc, class: Class) -> Id {
    // (Class, SEL) -> id — FACTS §3.8 (NSObject +alloc)
    // SAFETY: every class answers +alloc.
    unsafe { msg!(rt, fn(Class, Sel) -> Id)(class, rt.sel(c"alloc")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_is_unavailable_off_a_mac() {
        // This test documents the Linux path; on a Mac the runtime loads.
        if std::env::consts::OS == "macos" {
            assert!(objc().is_ok());
        } else {
            let e = objc().err().unwrap();
            assert!(e.component == "libobjc" && e.reason.contains("/usr/lib/libobjc.A.dylib"), "{e}");
        }
    }

    #[test]
    fn msg_casts_are_pointer_sized_function_types() {
        // The macro's transmute only compiles for a same-size target; a function pointer.
        assert_eq!(std::mem::size_of::<unsafe extern "C" fn(Id, Sel, u32, Id, *mut Id) -> ObjcBool>(), std::mem::size_of::<*const c_void>());
        assert_eq!(std::mem::size_of::<Id>(), 8);
        assert_eq!(std::mem::size_of::<Option<Retained>>(), std::mem::size_of::<Retained>());
    }
}
