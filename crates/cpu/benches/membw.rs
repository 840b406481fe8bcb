//! Streaming read bandwidth with 1 and 2 threads over a 256 MiB buffer (far beyond the caches),
//! on huge pages (as the CPU engine keeps its weights) and on 4 KiB pages: the ceiling of decode
//! speed, which reads every weight once per token.
//! `cargo bench -p anelm-cpu --bench membw`; `anelm bench` measures the same beside the model.

use anelm_cpu::membw::{StreamBuffer, STREAM_BYTES};
use divan::counter::BytesCount;
use divan::Bencher;

fn main() {
    divan::main();
}

#[divan::bench(args = [1, 2])]
fn huge_pages(b: Bencher, threads: usize) {
    stream_read(b, threads, true);
}

#[divan::bench(args = [1, 2])]
fn small_pages(b: Bencher, threads: usize) {
    stream_read(b, threads, false);
}

fn stream_read(b: Bencher, threads: usize, huge: bool) {
    let buf = StreamBuffer::new(STREAM_BYTES, huge);
    b.counter(BytesCount::new(buf.bytes()))
        .bench_local(|| divan::black_box(buf.read(threads)));
}
