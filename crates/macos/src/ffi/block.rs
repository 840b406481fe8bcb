//! The smallest Objective-C block a synchronous handler needs: a *stack* block literal laid out
//! as Clang's "Block Implementation Specification" (clang.llvm.org/docs/Block-ABI-Apple.html)
//! says, so `-[MLMultiArray getMutableBytesWithHandler:]` can call back into Rust without the
//! `block2` crate or a C shim.
//!
//! ```text
//! struct Block_literal_1 {          // offset (64-bit)
//!     void *isa;                    //  0  &_NSConcreteStackBlock (libSystem)
//!     int flags;                    //  8  BLOCK_HAS_SIGNATURE (1 << 30)
//!     int reserved;                 // 12  0
//!     R (*invoke)(struct Block_literal_1 *, P...);   // 16
//!     struct Block_descriptor_1 *descriptor;         // 24
//!     /* imported variables */      // 32  here: the Rust closure
//! };
//! struct Block_descriptor_1 { unsigned long reserved; unsigned long size; const char *signature; };
//! ```
//!
//! No copy/dispose helpers (flag bit 25 clear): if the callee copies the block, the runtime
//! copies its bytes, and the copy must not outlive the call. That holds for the handler APIs we
//! call, which run the handler before they return; [`HandlerBlock::ran`] lets the caller check
//! it did rather than trust it.

use std::ffi::{c_char, c_void, CStr};

use super::objc::{Id, NsInteger};

/// `BLOCK_HAS_SIGNATURE` (Block ABI): the descriptor carries an Objective-C type encoding.
pub const BLOCK_HAS_SIGNATURE: i32 = 1 << 30;
/// `BLOCK_HAS_COPY_DISPOSE`: never set here (the closure is plain data to the runtime).
pub const BLOCK_HAS_COPY_DISPOSE: i32 = 1 << 25;

/// Encoding of `void (^)(void *mutableBytes, NSInteger size, NSArray<NSNumber *> *strides)`:
/// return `v`, frame 32 bytes, the block itself `@?` at 0, `^v` at 8, `q` at 16, `@` at 24.
pub const MUTABLE_BYTES_SIGNATURE: &CStr = c"v32@?0^v8q16@24";

#[repr(C)]
pub struct Descriptor {
    reserved: usize,
    size: usize,
    signature: *const c_char,
}

/// A stack block for `void (^)(void *, NSInteger, id)` handlers, over closure `F`.
#[repr(C)]
pub struct HandlerBlock<F> {
    isa: *const c_void,
    flags: i32,
    reserved: i32,
    invoke: unsafe extern "C" fn(*mut HandlerBlock<F>, *mut c_void, NsInteger, Id),
    descriptor: *const Descriptor,
    closure: Option<F>,
    /// Kept inside the block so its `size` can name this block's type; pointed to by
    /// `descriptor` once the block is in place ([`HandlerBlock::as_block`]).
    descriptor_storage: Descriptor,
}

unsafe extern "C" fn invoke<F: FnOnce(*mut c_void, NsInteger, Id)>(
    block: *mut HandlerBlock<F>,
    bytes: *mut c_void,
    size: NsInteger,
    strides: Id,
) {
    // SAFETY: the runtime passes the block it was given (or its bitwise copy, whose closure
    // field is the same bytes); `as_block` handed out a pointer to a live HandlerBlock<F>.
    let block = unsafe { &mut *block };
    // A handler run twice (it never is) finds nothing to run the second time.
    if let Some(f) = block.closure.take() {
        // A panic must not unwind into Objective-C frames.
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(bytes, size, strides)))
            .is_err()
        {
            std::process::abort();
        }
    }
}

impl<F: FnOnce(*mut c_void, NsInteger, Id)> HandlerBlock<F> {
    /// A block whose `isa` is `stack_block_class` (`&_NSConcreteStackBlock`).
    pub fn new(stack_block_class: *const c_void, f: F) -> HandlerBlock<F> {
        HandlerBlock {
            isa: stack_block_class,
            flags: BLOCK_HAS_SIGNATURE,
            reserved: 0,
            invoke: invoke::<F>,
            descriptor: std::ptr::null(),
            closure: Some(f),
            descriptor_storage: Descriptor {
                reserved: 0,
                size: std::mem::size_of::<HandlerBlock<F>>(),
                signature: MUTABLE_BYTES_SIGNATURE.as_ptr(),
            },
        }
    }

    /// The block pointer to pass as the handler argument. The block must stay where it is
    /// until the call returns.
    pub fn as_block(&mut self) -> Id {
        self.descriptor = &self.descriptor_storage;
        // SAFETY: Id is a transparent pointer; a block is an object to the runtime.
        unsafe { std::mem::transmute::<*mut HandlerBlock<F>, Id>(self) }
    }

    /// Whether the handler has run.
    pub fn ran(&self) -> bool {
        self.closure.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    type Noop = fn(*mut c_void, NsInteger, Id);

    #[test]
    fn the_literal_is_laid_out_as_the_block_abi_says() {
        assert_eq!(offset_of!(HandlerBlock<Noop>, isa), 0);
        assert_eq!(offset_of!(HandlerBlock<Noop>, flags), 8);
        assert_eq!(offset_of!(HandlerBlock<Noop>, reserved), 12);
        assert_eq!(offset_of!(HandlerBlock<Noop>, invoke), 16);
        assert_eq!(offset_of!(HandlerBlock<Noop>, descriptor), 24);
        assert_eq!(offset_of!(HandlerBlock<Noop>, closure), 32);
        assert_eq!(offset_of!(Descriptor, reserved), 0);
        assert_eq!(offset_of!(Descriptor, size), 8);
        assert_eq!(offset_of!(Descriptor, signature), 16);
        assert_eq!(size_of::<Descriptor>(), 24);
        let mut b = HandlerBlock::new(0x1000 as *const c_void, |_, _, _| {});
        assert_eq!(b.flags & BLOCK_HAS_COPY_DISPOSE, 0);
        assert_eq!(b.flags, BLOCK_HAS_SIGNATURE);
        let id = b.as_block();
        // SAFETY: reading back the words the runtime reads.
        let words =
            unsafe { std::slice::from_raw_parts(std::mem::transmute::<Id, *const usize>(id), 4) };
        assert_eq!(words[0], 0x1000, "isa first");
        let desc = words[3] as *const Descriptor;
        // SAFETY: the descriptor points into the live block.
        let desc = unsafe { &*desc };
        assert_eq!(desc.reserved, 0);
        assert_eq!(desc.size, size_of_val(&b));
        // SAFETY: a static C string.
        let sig = unsafe { CStr::from_ptr(desc.signature) };
        assert_eq!(sig.to_str().unwrap(), "v32@?0^v8q16@24");
    }

    #[test]
    fn invoking_the_literal_runs_the_closure_once_with_the_arguments() {
        let mut buf = [0u8; 8];
        let mut seen = None;
        let mut b = HandlerBlock::new(std::ptr::null(), |p: *mut c_void, n, s: Id| {
            seen = Some((p as usize, n, s.is_nil()));
        });
        assert!(!b.ran());
        let id = b.as_block();
        let lit = std::ptr::addr_of_mut!(b);
        // SAFETY: Id is a transparent pointer.
        assert_eq!(
            unsafe { std::mem::transmute::<Id, *mut c_void>(id) },
            lit.cast()
        );
        // Call it as the runtime does: through the invoke pointer, the block as first argument.
        // SAFETY: lit points to b; the arguments are what the handler type takes.
        unsafe {
            ((*lit).invoke)(lit, buf.as_mut_ptr().cast(), 8, Id::NIL);
            ((*lit).invoke)(lit, std::ptr::null_mut(), 0, Id::NIL);
        }
        assert!(b.ran());
        assert_eq!(
            seen,
            Some((buf.as_mut_ptr() as usize, 8, true)),
            "first call only"
        );
    }
}
