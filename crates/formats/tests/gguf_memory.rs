//! The GGUF reader's heap stays within the bound its file size justifies
//! (`MEMORY_PER_FILE_BYTE` per byte plus `MEMORY_FLOOR`), measured by a counting allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use anelm_formats::gguf::{MEMORY_FLOOR, MEMORY_PER_FILE_BYTE};
use anelm_formats::Gguf;

/// Counts this thread's live heap bytes and their peak.
struct Counting;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = LIVE.try_with(|live| {
            live.set(live.get() + l.size());
            let _ = PEAK.try_with(|p| p.set(p.get().max(live.get())));
        });
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, l: Layout) {
        let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(l.size())));
        unsafe { System.dealloc(ptr, l) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Peak heap (above what was live before) while parsing `bytes`.
fn peak_parsing(bytes: &[u8]) -> usize {
    let base = LIVE.with(|l| l.get());
    PEAK.with(|p| p.set(base));
    let _ = Gguf::from_bytes("m.gguf", bytes);
    PEAK.with(|p| p.get()) - base
}

fn file_with_array(elem_ty: u32, n: usize, elem: &[u8]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    b.push(b'k');
    b.extend_from_slice(&9u32.to_le_bytes());
    b.extend_from_slice(&elem_ty.to_le_bytes());
    b.extend_from_slice(&(n as u64).to_le_bytes());
    for _ in 0..n {
        b.extend_from_slice(elem);
    }
    b
}

#[test]
fn parsing_peak_heap_is_within_the_stated_bound() {
    let cases = [
        ("u8", file_with_array(0, 1 << 20, &[1])),
        ("bool", file_with_array(7, 1 << 20, &[1])),
        ("i32", file_with_array(5, 1 << 18, &[1, 0, 0, 0])),
        ("empty strings", file_with_array(8, 1 << 17, &[0; 8])),
        ("f64", file_with_array(12, 1 << 17, &[0; 8])),
    ];
    for (what, bytes) in cases {
        let peak = peak_parsing(&bytes);
        // The budget, plus the anonymous copy is a map (not heap), plus slack for error strings.
        let bound = bytes.len() * MEMORY_PER_FILE_BYTE + MEMORY_FLOOR + 4096;
        assert!(
            peak <= bound,
            "{what}: peak heap {peak} for a {}-byte file exceeds {bound}",
            bytes.len()
        );
    }
}
