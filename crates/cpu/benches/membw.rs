//! Streaming read bandwidth with 1 and 2 threads over a 256 MiB buffer (far beyond the caches):
//! the ceiling of decode speed, which reads every weight once per token.
//! `cargo bench -p anelm-cpu --bench membw`; compare with `anelm bench`'s GB/s.

use divan::counter::BytesCount;
use divan::Bencher;

const BYTES: usize = 256 << 20;

fn main() {
    divan::main();
}

/// XOR of every u64 (LLVM vectorises it; the result keeps the loads alive).
fn fold(s: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    for c in s.chunks_exact(8) {
        for k in 0..8 {
            acc[k] ^= c[k];
        }
    }
    acc.iter().fold(0, |a, b| a ^ b)
}

#[divan::bench(args = [1, 2])]
fn stream_read(b: Bencher, threads: usize) {
    let buf: Vec<u64> = (0..BYTES / 8).map(|i| i as u64).collect();
    let part = buf.len() / threads;
    b.counter(BytesCount::new(BYTES)).bench_local(|| {
        std::thread::scope(|s| {
            let hs: Vec<_> = buf.chunks(part).map(|c| s.spawn(move || fold(c))).collect();
            divan::black_box(
                hs.into_iter()
                    .map(|h| h.join().unwrap_or(0))
                    .fold(0, |a, b| a ^ b),
            )
        })
    });
}
