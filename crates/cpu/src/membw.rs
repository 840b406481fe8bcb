//! The bandwidth limit of decode: a streaming read of a buffer far beyond the caches by several
//! threads at once. Decode reads every weight once per token, so no kernel can go faster than
//! this; `anelm bench` and the `membw` benchmark measure it beside the model's speed, so that the
//! two are compared on the same machine at the same moment.

use std::time::Instant;

use crate::mem::Region;

/// Bytes the limit is measured over: well beyond any L3 of today's CPUs.
pub const STREAM_BYTES: usize = 256 << 20;

/// A buffer to read, every page touched on creation (so that a read never faults), on huge
/// pages or not (the CPU engine keeps its weights on huge pages).
pub struct StreamBuffer {
    region: Region,
}

impl StreamBuffer {
    pub fn new(bytes: usize, huge_pages: bool) -> StreamBuffer {
        let mut region = Region::new(bytes / 8 * 8, huge_pages);
        for (i, w) in region.chunks_exact_mut(8).enumerate() {
            w.copy_from_slice(&(i as u64).to_le_bytes());
        }
        StreamBuffer { region }
    }

    pub fn bytes(&self) -> usize {
        self.region.len()
    }

    fn words(&self) -> &[u64] {
        // SAFETY: the region is 2 MiB- (or page-) aligned and a whole number of words long, and
        // any bytes are a valid u64.
        unsafe {
            std::slice::from_raw_parts(self.region.as_ptr() as *const u64, self.region.len() / 8)
        }
    }

    /// Reads the whole buffer, each of `threads` threads its own contiguous part; returns a
    /// fold of every word (which keeps the loads alive).
    pub fn read(&self, threads: usize) -> u64 {
        let words = self.words();
        let part = words.len().div_ceil(threads.max(1)).max(1);
        std::thread::scope(|s| {
            let hs: Vec<_> = words
                .chunks(part)
                .map(|c| s.spawn(move || fold(c)))
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0, |a, b| a ^ b)
        })
    }

    /// GB/s (10⁹ bytes) of one [`StreamBuffer::read`].
    pub fn gb_s(&self, threads: usize) -> f64 {
        let start = Instant::now();
        std::hint::black_box(self.read(threads));
        self.bytes() as f64 / start.elapsed().as_secs_f64() / 1e9
    }
}

/// XOR of every word, in eight independent lanes (LLVM vectorises it).
fn fold(s: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut chunks = s.chunks_exact(8);
    for c in &mut chunks {
        for k in 0..8 {
            acc[k] ^= c[k];
        }
    }
    let tail = chunks.remainder().iter().fold(0, |a, b| a ^ b);
    acc.iter().fold(tail, |a, b| a ^ b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_is_read_once_whatever_the_split() {
        // Words 0..n XOR to a known value; an odd length leaves a remainder for some thread.
        let buf = StreamBuffer::new(8 * 1001, true);
        let want = (0..1001u64).fold(0, |a, b| a ^ b);
        for threads in [1, 2, 3, 7] {
            assert_eq!(buf.read(threads), want, "{threads} threads");
        }
        assert!(buf.gb_s(2) > 0.0);
    }
}
