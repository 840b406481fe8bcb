//! Attention kernel micro-benchmarks: one tile of 64 cached positions against a group of
//! query heads (scores), and the probabilities back over the values (mix), for SmolLM2's shape
//! (3 heads of 64 per KV head) and Gemma 3's (4 of 256), f16 and q8_0 caches, on every
//! instruction set this CPU has, single-threaded. `cargo bench -p anelm-cpu --bench kvdot`;
//! the counter is multiply-adds per second.

use anelm_cpu::kvblock::{BlockQ8_0, KvBlock};
use anelm_cpu::{kvdot, Isa};
use divan::counter::ItemsCount;
use divan::Bencher;
use half::f16;

const N: usize = 64;
/// (query heads per KV head, head dim, KV heads).
const SHAPES: [(usize, usize, usize); 2] = [(3, 64, 3), (4, 256, 1)];

fn main() {
    divan::main();
}

fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn rows<B: KvBlock>(x: &[f32]) -> Vec<B> {
    let mut r = vec![B::ZERO; x.len() / B::N];
    B::quantize(&mut r, x);
    r
}

fn run<B: KvBlock>(b: Bencher, isa: Isa, shape: (usize, usize, usize), mix: bool) {
    if !Isa::available().contains(&isa) {
        return;
    }
    let (g, hd, kvh) = shape;
    let kv_dim = hd * kvh;
    let q = values(g * hd, 1);
    let cache = rows::<B>(&values(N * kv_dim, 2));
    let stride = kv_dim / B::N;
    let mut s = values(g * N, 3);
    let mut out = vec![0f32; g * hd];
    b.counter(ItemsCount::new(g * hd * N)).bench_local(|| {
        if mix {
            kvdot::mix(isa, &s, g, hd, &cache, stride, N, &mut out);
        } else {
            kvdot::scores(isa, &q, g, hd, &cache, stride, N, 0.125, &mut s);
        }
        divan::black_box((&s, &out));
    });
}

#[divan::bench(args = SHAPES)]
fn scores_f16_avx2(b: Bencher, shape: (usize, usize, usize)) {
    run::<f16>(b, Isa::Avx2, shape, false);
}
#[divan::bench(args = SHAPES)]
fn scores_f16_avx512(b: Bencher, shape: (usize, usize, usize)) {
    run::<f16>(b, Isa::Avx512, shape, false);
}
#[divan::bench(args = SHAPES)]
fn mix_f16_avx2(b: Bencher, shape: (usize, usize, usize)) {
    run::<f16>(b, Isa::Avx2, shape, true);
}
#[divan::bench(args = SHAPES)]
fn mix_f16_avx512(b: Bencher, shape: (usize, usize, usize)) {
    run::<f16>(b, Isa::Avx512, shape, true);
}
#[divan::bench(args = SHAPES)]
fn scores_q8_0_avx2(b: Bencher, shape: (usize, usize, usize)) {
    run::<BlockQ8_0>(b, Isa::Avx2, shape, false);
}
#[divan::bench(args = SHAPES)]
fn scores_q8_0_avx512(b: Bencher, shape: (usize, usize, usize)) {
    run::<BlockQ8_0>(b, Isa::Avx512, shape, false);
}
#[divan::bench(args = SHAPES)]
fn mix_q8_0_avx2(b: Bencher, shape: (usize, usize, usize)) {
    run::<BlockQ8_0>(b, Isa::Avx2, shape, true);
}
#[divan::bench(args = SHAPES)]
fn mix_q8_0_avx512(b: Bencher, shape: (usize, usize, usize)) {
    run::<BlockQ8_0>(b, Isa::Avx512, shape, true);
}

/// A row of shifted scores through exp (a softmax before its normalisation): a tile's 64 and a
/// deep cache's 4096 positions, the scores' maximum subtracted as attention does.
#[divan::bench(args = [64, 4096])]
fn exp_shift_avx2(b: Bencher, n: usize) {
    if !Isa::available().contains(&Isa::Avx2) {
        return;
    }
    let x: Vec<f32> = values(n, 4).iter().map(|v| 8.0 * v).collect();
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut row = x.clone();
    b.counter(ItemsCount::new(n)).bench_local(|| {
        row.copy_from_slice(&x);
        divan::black_box(anelm_cpu::vecmath::exp_shift(Isa::Avx2, &mut row, m));
    });
}
