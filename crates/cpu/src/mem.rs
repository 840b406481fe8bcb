//! Giving back the memory of mapped weights once a packed copy replaces them, so that packing
//! does not double the resident size of a model.

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

/// Drops this process's pages of `bytes` (whole pages inside it) if `bytes` lies in one of the
/// file mappings `maps`. The file's contents stay in the page cache and come back on the next
/// read, unchanged: a read-only file mapping loses nothing. Anything else is left alone
/// (dropping anonymous memory would zero it).
pub fn release(bytes: &[u8], maps: &[(usize, usize)]) {
    #[cfg(unix)]
    {
        let (start, end) = (
            bytes.as_ptr() as usize,
            bytes.as_ptr() as usize + bytes.len(),
        );
        if !maps.iter().any(|&(a, b)| a <= start && end <= b) {
            return;
        }
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
