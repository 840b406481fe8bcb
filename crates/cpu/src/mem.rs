//! Memory for weights: giving back the pages of mapped weights once a copy replaces them, so
//! that copying does not double the resident size of a model, and regions on huge pages.

/// The address ranges of this process's file-backed mappings (from /proc/self/maps; empty where
/// that file does not exist).
pub fn file_mappings() -> Vec<(usize, usize)> {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return Vec::new();
    };
    maps.lines()
        .filter_map(|line| {
            // "start-end perms offset dev inode path"; inode 0 means anonymous.
            let mut f = line.split_whitespace();
            let (range, inode) = (f.next()?, f.nth(3)?);
            if inode == "0" {
                return None;
            }
            let (a, b) = range.split_once('-')?;
            Some((
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
            ))
        })
        .collect()
}

/// Whether `bytes` lies in one of the file mappings `maps`.
pub fn mapped(bytes: &[u8], maps: &[(usize, usize)]) -> bool {
    let start = bytes.as_ptr() as usize;
    let end = start + bytes.len();
    maps.iter().any(|&(a, b)| a <= start && end <= b)
}

/// Drops this process's pages of `bytes` (whole pages inside it) if `bytes` lies in one of the
/// file mappings `maps`. The file's contents stay in the page cache and come back on the next
/// read, unchanged: a read-only file mapping loses nothing. Anything else is left alone
/// (dropping anonymous memory would zero it).
pub fn release(bytes: &[u8], maps: &[(usize, usize)]) {
    #[cfg(unix)]
    {
        if !mapped(bytes, maps) {
            return;
        }
        let (start, end) = (
            bytes.as_ptr() as usize,
            bytes.as_ptr() as usize + bytes.len(),
        );
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as usize;
        let (a, b) = (start.next_multiple_of(page), end / page * page);
        if a < b {
            // SAFETY: [a, b) is inside a file mapping of this process that nothing writes; for
            // such a mapping MADV_DONTNEED only unmaps pages, which the next access faults back in.
            unsafe { libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_DONTNEED) };
        }
    }
    #[cfg(not(unix))]
    let _ = (bytes, maps);
}

/// Huge pages' size on x86-64 and the alignment that lets the kernel use them.
const HUGE_PAGE: usize = 2 << 20;

/// Zeroed anonymous memory of a fixed size, asked for on 2 MiB pages where Linux's transparent
/// huge pages allow (elsewhere, or when not asked, on ordinary pages). Streaming reads from huge
/// pages miss the TLB once per 2 MiB instead of once per 4 KiB; compare
/// `cargo bench -p anelm-cpu --bench membw` with and without them.
pub struct Region {
    /// The mapping (with room to align `start`), or nothing for an empty region.
    map: Option<(*mut u8, usize)>,
    start: *mut u8,
    len: usize,
}

// SAFETY: the region is plain memory owned by this value; shared access only reads it.
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

impl Region {
    pub fn new(len: usize, huge_pages: bool) -> Region {
        if len == 0 {
            return Region {
                map: None,
                start: std::ptr::NonNull::dangling().as_ptr(),
                len: 0,
            };
        }
        let map_len = len + HUGE_PAGE;
        // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(
            base != libc::MAP_FAILED,
            "out of memory mapping {len} bytes for weights"
        );
        let base = base as *mut u8;
        let start = base.wrapping_add(base.align_offset(HUGE_PAGE));
        #[cfg(target_os = "linux")]
        if huge_pages {
            // SAFETY: [start, start + len) lies inside the mapping; the advice only changes the
            // page size the kernel backs it with (failure leaves ordinary pages: harmless).
            unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
        }
        #[cfg(not(target_os = "linux"))]
        let _ = huge_pages;
        Region {
            map: Some((base, map_len)),
            start,
            len,
        }
    }
}

impl std::ops::Deref for Region {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `start..start + len` is mapped, zero-initialised and owned by self.
        unsafe { std::slice::from_raw_parts(self.start, self.len) }
    }
}

impl std::ops::DerefMut for Region {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.start, self.len) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Some((base, len)) = self.map {
            // SAFETY: the mapping made in `new`, unmapped once.
            unsafe { libc::munmap(base as *mut libc::c_void, len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_is_zeroed_writable_and_aligned() {
        for (len, huge) in [(0, true), (1, true), (4096, false), ((2 << 20) + 3, true)] {
            let mut r = Region::new(len, huge);
            assert_eq!(r.len(), len);
            assert!(r.iter().all(|&b| b == 0));
            if len > 0 {
                assert_eq!(r.as_ptr() as usize % HUGE_PAGE, 0);
                r[len - 1] = 7;
                assert_eq!(r[len - 1], 7);
            }
        }
    }
}
