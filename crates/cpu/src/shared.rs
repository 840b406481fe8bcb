//! Slices that the threads of one forward pass write in disjoint parts between barriers.

use std::marker::PhantomData;
use std::ops::Range;

/// A mutable slice shared by the pool's threads. References are only ever made to the ranges a
/// thread uses: between two barriers, the ranges one thread writes are touched by no other.
pub struct SharedSlice<'a, T> {
    ptr: *mut T,
    len: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: see the type's contract; the methods that hand out references are unsafe.
unsafe impl<T: Send> Sync for SharedSlice<'_, T> {}
unsafe impl<T: Send> Send for SharedSlice<'_, T> {}

impl<'a, T> SharedSlice<'a, T> {
    pub fn new(s: &'a mut [T]) -> Self {
        SharedSlice {
            ptr: s.as_mut_ptr(),
            len: s.len(),
            _borrow: PhantomData,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// # Safety
    /// No other thread touches `r` until the next barrier.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn range_mut(&self, r: Range<usize>) -> &mut [T] {
        assert!(r.start <= r.end && r.end <= self.len, "shared slice range");
        std::slice::from_raw_parts_mut(self.ptr.add(r.start), r.end - r.start)
    }

    /// # Safety
    /// No thread writes `r` until the next barrier.
    pub unsafe fn range(&self, r: Range<usize>) -> &[T] {
        assert!(r.start <= r.end && r.end <= self.len, "shared slice range");
        std::slice::from_raw_parts(self.ptr.add(r.start), r.end - r.start)
    }

    /// # Safety
    /// No other thread touches element `i` until the next barrier.
    pub unsafe fn write(&self, i: usize, v: T) {
        assert!(i < self.len, "shared slice index");
        self.ptr.add(i).write(v);
    }
}
