//! Foundation objects the drivers make and read: NSString, NSData, NSNumber, NSArray,
//! NSDictionary, NSURL, NSError, and `NSTemporaryDirectory()`. Objects are made with
//! `alloc`/`init…` so they are owned (+1) without relying on a pool; what the frameworks return
//! is read inside the caller's autorelease pool.

use std::ffi::{c_char, c_longlong, c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libloading::Library;

use super::loader::{self, FOUNDATION};
use super::objc::{
    alloc, msg, objc, Class, Id, NsInteger, NsUInteger, Objc, ObjcBool, Retained, Sel, NO,
};
use crate::error::{MacError, NsErrorInfo, Result, Unavailable};
use crate::saved::Plain;

/// `NSUTF8StringEncoding`.
const UTF8: NsUInteger = 4;
/// How deep [`Foundation::to_json`] descends (attribute dictionaries are 4–5 levels deep).
const MAX_DEPTH: usize = 16;

pub(crate) struct Foundation {
    pub rt: &'static Objc,
    _lib: Library,
    temporary_directory: unsafe extern "C" fn() -> Id,
    string: Class,
    data: Class,
    number: Class,
    array: Class,
    dictionary: Class,
    url: Class,
}

pub(crate) fn foundation() -> Result<&'static Foundation, Unavailable> {
    static FOUNDATION_FRAMEWORK: OnceLock<Result<Foundation, Unavailable>> = OnceLock::new();
    FOUNDATION_FRAMEWORK
        .get_or_init(Foundation::load)
        .as_ref()
        .map_err(Clone::clone)
}

/// Turns a NUL-terminated UTF-8 C string into a String.
///
/// # Safety
/// `p` must be null or point at a NUL-terminated string that lives through the call.
unsafe fn c_string(p: *const c_char) -> Option<String> {
    // SAFETY: caller.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

impl Foundation {
    fn load() -> Result<Foundation, Unavailable> {
        let rt = objc()?;
        let lib = loader::open(FOUNDATION)?;
        // SAFETY: `NSString *NSTemporaryDirectory(void)` (<Foundation/NSPathUtilities.h>).
        let temporary_directory =
            unsafe { loader::symbol(&lib, FOUNDATION, c"NSTemporaryDirectory")? };
        Ok(Foundation {
            rt,
            temporary_directory,
            string: rt.class(c"NSString")?,
            data: rt.class(c"NSData")?,
            number: rt.class(c"NSNumber")?,
            array: rt.class(c"NSArray")?,
            dictionary: rt.class(c"NSDictionary")?,
            url: rt.class(c"NSURL")?,
            _lib: lib,
        })
    }

    fn owned(&self, id: Id, what: &str) -> Result<Retained> {
        // SAFETY: id comes from alloc/init…, which returns +1 or nil.
        unsafe { Retained::from_owned(self.rt, id) }
            .ok_or_else(|| MacError::Invalid(format!("Foundation could not make {what}")))
    }

    pub fn string(&self, s: &str) -> Result<Retained> {
        let rt = self.rt;
        // (id, SEL, const void*, NSUInteger, NSUInteger) -> id — FACTS §3.8 (-[NSString initWithBytes:length:encoding:])
        // SAFETY: the bytes live through the call; NSString copies them.
        let id = unsafe {
            msg!(rt, fn(Id, Sel, *const c_void, NsUInteger, NsUInteger) -> Id)(
                alloc(rt, self.string),
                rt.sel(c"initWithBytes:length:encoding:"),
                s.as_ptr().cast(),
                s.len(),
                UTF8,
            )
        };
        self.owned(id, "an NSString")
    }

    pub fn data(&self, bytes: &[u8]) -> Result<Retained> {
        let rt = self.rt;
        // (id, SEL, const void*, NSUInteger) -> id — FACTS §3.8 (-[NSData initWithBytes:length:]; MIL text goes as NSData, FACTS §3.2)
        // SAFETY: the bytes live through the call; NSData copies them.
        let id = unsafe {
            msg!(rt, fn(Id, Sel, *const c_void, NsUInteger) -> Id)(
                alloc(rt, self.data),
                rt.sel(c"initWithBytes:length:"),
                bytes.as_ptr().cast(),
                bytes.len(),
            )
        };
        self.owned(id, "an NSData")
    }

    pub fn number(&self, v: i64) -> Result<Retained> {
        let rt = self.rt;
        // (id, SEL, long long) -> id — FACTS §3.8 (-[NSNumber initWithLongLong:])
        // SAFETY: plain value argument.
        let id = unsafe {
            msg!(rt, fn(Id, Sel, c_longlong) -> Id)(
                alloc(rt, self.number),
                rt.sel(c"initWithLongLong:"),
                v,
            )
        };
        self.owned(id, "an NSNumber")
    }

    pub fn array(&self, items: &[Id]) -> Result<Retained> {
        let rt = self.rt;
        // (id, SEL, const id*, NSUInteger) -> id — FACTS §3.8 (-[NSArray initWithObjects:count:])
        // SAFETY: items are live objects (callers hold them); the array retains them.
        let id = unsafe {
            msg!(rt, fn(Id, Sel, *const Id, NsUInteger) -> Id)(
                alloc(rt, self.array),
                rt.sel(c"initWithObjects:count:"),
                items.as_ptr(),
                items.len(),
            )
        };
        self.owned(id, "an NSArray")
    }

    /// An NSDictionary of (key, value) pairs.
    pub fn dictionary(&self, entries: &[(Id, Id)]) -> Result<Retained> {
        let (keys, values): (Vec<Id>, Vec<Id>) = entries.iter().copied().unzip();
        let rt = self.rt;
        // (id, SEL, const id*, const id*, NSUInteger) -> id — FACTS §3.8 (-[NSDictionary initWithObjects:forKeys:count:])
        // SAFETY: keys and values are live objects; the dictionary copies keys, retains values.
        let id = unsafe {
            msg!(rt, fn(Id, Sel, *const Id, *const Id, NsUInteger) -> Id)(
                alloc(rt, self.dictionary),
                rt.sel(c"initWithObjects:forKeys:count:"),
                values.as_ptr(),
                keys.as_ptr(),
                keys.len(),
            )
        };
        self.owned(id, "an NSDictionary")
    }

    /// A `file://` URL of a directory (a package or a compiled model).
    pub fn directory_url(&self, path: &Path) -> Result<Retained> {
        let rt = self.rt;
        let s = self.string(&path.to_string_lossy())?;
        // (id, SEL, id NSString*, BOOL) -> id — FACTS §3.8 (-[NSURL initFileURLWithPath:isDirectory:])
        // SAFETY: s is a live NSString.
        let id = unsafe {
            msg!(rt, fn(Id, Sel, Id, ObjcBool) -> Id)(
                alloc(rt, self.url),
                rt.sel(c"initFileURLWithPath:isDirectory:"),
                s.id(),
                1,
            )
        };
        self.owned(id, "an NSURL")
    }

    /// The characters of an NSString; None for nil.
    pub fn read_string(&self, s: Id) -> Option<String> {
        if s.is_nil() {
            return None;
        }
        let rt = self.rt;
        // (id, SEL) -> const char* — FACTS §3.8 (-[NSString UTF8String])
        // SAFETY: s is a live NSString; the returned buffer lives as long as the enclosing pool.
        unsafe {
            c_string(msg!(rt, fn(Id, Sel) -> *const c_char)(
                s,
                rt.sel(c"UTF8String"),
            ))
        }
    }

    /// `-description` of any object.
    pub fn describe(&self, obj: Id) -> Option<String> {
        if obj.is_nil() {
            return None;
        }
        let rt = self.rt;
        // (id, SEL) -> id NSString* — FACTS §3.8 (-[NSObject description]; NSError text, FACTS §3.6)
        // SAFETY: obj is live; the string is autoreleased into the caller's pool.
        let d = unsafe { msg!(rt, fn(Id, Sel) -> Id)(obj, rt.sel(c"description")) };
        self.read_string(d)
    }

    /// The path of a file URL.
    pub fn url_path(&self, url: Id) -> Option<PathBuf> {
        if url.is_nil() {
            return None;
        }
        let rt = self.rt;
        // (id, SEL) -> id NSString* — FACTS §3.8 (-[NSURL path])
        // SAFETY: url is a live NSURL.
        let p = unsafe { msg!(rt, fn(Id, Sel) -> Id)(url, rt.sel(c"path")) };
        self.read_string(p).map(PathBuf::from)
    }

    /// Domain, code and description of an NSError; None for nil.
    pub fn error_info(&self, e: Id) -> Option<NsErrorInfo> {
        if e.is_nil() {
            return None;
        }
        let rt = self.rt;
        // (id, SEL) -> id NSString* — FACTS §3.6 (-[NSError domain])
        // SAFETY: e is a live NSError (filled in by a failed call inside the caller's pool).
        let domain = unsafe { msg!(rt, fn(Id, Sel) -> Id)(e, rt.sel(c"domain")) };
        // (id, SEL) -> NSInteger — FACTS §3.6 (-[NSError code])
        // SAFETY: as above.
        let code = unsafe { msg!(rt, fn(Id, Sel) -> NsInteger)(e, rt.sel(c"code")) };
        Some(NsErrorInfo {
            domain: self.read_string(domain).unwrap_or_default(),
            code: code as i64,
            description: self.describe(e).unwrap_or_default(),
        })
    }

    /// `NSTemporaryDirectory()` (FACTS §3.3: the staging root).
    pub fn temporary_directory(&self) -> Option<PathBuf> {
        // SAFETY: no arguments; returns an autoreleased NSString into the caller's pool.
        let s = unsafe { (self.temporary_directory)() };
        self.read_string(s).map(PathBuf::from)
    }

    pub fn is_kind(&self, obj: Id, class: Class) -> bool {
        let rt = self.rt;
        // (id, SEL, Class) -> BOOL — FACTS §3.8 (-[NSObject isKindOfClass:])
        // SAFETY: obj is live, class is a class.
        unsafe {
            msg!(rt, fn(Id, Sel, Class) -> ObjcBool)(obj, rt.sel(c"isKindOfClass:"), class) != NO
        }
    }

    fn count(&self, collection: Id) -> usize {
        let rt = self.rt;
        // (id, SEL) -> NSUInteger — FACTS §3.8 (-[NSArray count], -[NSDictionary count])
        // SAFETY: collection is a live NSArray or NSDictionary.
        unsafe { msg!(rt, fn(Id, Sel) -> NsUInteger)(collection, rt.sel(c"count")) }
    }

    /// Element `i` of an NSArray (borrowed).
    pub fn array_item(&self, array: Id, i: usize) -> Id {
        let rt = self.rt;
        // (id, SEL, NSUInteger) -> id — FACTS §3.8 (-[NSArray objectAtIndex:])
        // SAFETY: array is a live NSArray and i < count (callers iterate below count).
        unsafe { msg!(rt, fn(Id, Sel, NsUInteger) -> Id)(array, rt.sel(c"objectAtIndex:"), i) }
    }

    /// The elements of an NSArray (borrowed).
    pub fn array_items(&self, array: Id) -> Vec<Id> {
        (0..self.count(array))
            .map(|i| self.array_item(array, i))
            .collect()
    }

    /// An NSArray of NSNumbers as integers.
    pub fn integers(&self, array: Id) -> Vec<i64> {
        let rt = self.rt;
        self.array_items(array)
            .into_iter()
            // (id, SEL) -> long long — FACTS §3.8 (-[NSNumber longLongValue])
            // SAFETY: the items of the arrays read here are NSNumbers (Core ML shapes/strides).
            .map(|n| unsafe { msg!(rt, fn(Id, Sel) -> c_longlong)(n, rt.sel(c"longLongValue")) })
            .collect()
    }

    /// A property list (dictionaries, arrays, strings, numbers) as JSON: how `modelAttributes`
    /// reaches the pure layout code. Other objects become their `-description`.
    pub fn to_json(&self, obj: Id) -> serde_json::Value {
        self.plain_at(obj, 0).to_json()
    }

    /// The object graph as plain data ([`Plain`], converted to JSON in `saved.rs`).
    fn plain_at(&self, obj: Id, depth: usize) -> Plain {
        let rt = self.rt;
        if obj.is_nil() {
            return Plain::Nil;
        }
        if depth >= MAX_DEPTH {
            return Plain::Other(self.describe(obj).unwrap_or_default());
        }
        if self.is_kind(obj, self.dictionary) {
            // (id, SEL) -> id NSArray* — FACTS §3.8 (-[NSDictionary allKeys])
            // SAFETY: obj is a live NSDictionary; the array is autoreleased into the caller's pool.
            let keys = unsafe { msg!(rt, fn(Id, Sel) -> Id)(obj, rt.sel(c"allKeys")) };
            let mut entries = Vec::new();
            for k in self.array_items(keys) {
                // (id, SEL, id) -> id — FACTS §3.8 (-[NSDictionary objectForKey:])
                // SAFETY: k is a key of obj.
                let v =
                    unsafe { msg!(rt, fn(Id, Sel, Id) -> Id)(obj, rt.sel(c"objectForKey:"), k) };
                entries.push((self.plain_at(k, depth + 1), self.plain_at(v, depth + 1)));
            }
            return Plain::Dict(entries);
        }
        if self.is_kind(obj, self.array) {
            return Plain::Array(
                self.array_items(obj)
                    .into_iter()
                    .map(|v| self.plain_at(v, depth + 1))
                    .collect(),
            );
        }
        if self.is_kind(obj, self.string) {
            return self.read_string(obj).map_or(Plain::Nil, Plain::String);
        }
        if self.is_kind(obj, self.number) {
            // (id, SEL) -> const char* — FACTS §3.8 (-[NSNumber objCType])
            // SAFETY: obj is a live NSNumber; the type string is static.
            let ty = unsafe {
                c_string(msg!(rt, fn(Id, Sel) -> *const c_char)(
                    obj,
                    rt.sel(c"objCType"),
                ))
            }
            .unwrap_or_default();
            if ty == "f" || ty == "d" {
                // (id, SEL) -> double — FACTS §3.8 (-[NSNumber doubleValue])
                // SAFETY: as above.
                let v = unsafe { msg!(rt, fn(Id, Sel) -> f64)(obj, rt.sel(c"doubleValue")) };
                return Plain::Float(v);
            }
            // (id, SEL) -> long long — FACTS §3.8 (-[NSNumber longLongValue])
            // SAFETY: as above.
            let v = unsafe { msg!(rt, fn(Id, Sel) -> c_longlong)(obj, rt.sel(c"longLongValue")) };
            return Plain::Integer(v);
        }
        Plain::Other(self.describe(obj).unwrap_or_default())
    }
}

/// The last `NSError**` out-parameter of a call: starts nil, the callee may fill it.
pub(crate) struct ErrorOut(pub Id);

impl ErrorOut {
    pub fn new() -> ErrorOut {
        ErrorOut(Id::NIL)
    }

    pub fn ptr(&mut self) -> *mut Id {
        &mut self.0
    }
}
