//! Throughput of the simulator's multiply-accumulate core on the shapes of SmolLM2's kernels:
//! `cargo run --release -p anelm-mil --example sim_bench`.

use std::time::Instant;

use anelm_mil::sim::mac::gemm;
use half::f16;

fn main() {
    // (rows, channels): SmolLM2's QKV, FFN down, and one lm_head tile.
    for (m, k) in [(960, 576), (576, 1536), (16384, 576)] {
        let a: Vec<f16> = (0..m * k)
            .map(|i| f16::from_f32(((i * 7919 % 1000) as f32 - 500.0) * 1e-4))
            .collect();
        for n in [1, 64] {
            let b: Vec<f32> = (0..k * 64)
                .map(|i| f16::from_f32(((i * 104729 % 1000) as f32 - 500.0) * 1e-3).to_f32())
                .collect();
            let mut y = vec![0f32; m * 64];
            let reps = if n == 1 { 200 } else { 10 };
            let t = Instant::now();
            for _ in 0..reps {
                gemm(&a, m, k, &b, 64, n, &mut y, 64);
            }
            let s = t.elapsed().as_secs_f64() / reps as f64;
            println!(
                "m {m:>5} k {k:>4} n {n:>2}: {:8.3} ms  {:6.2} GMAC/s",
                s * 1e3,
                (m * k * n) as f64 / s / 1e9
            );
        }
    }
}
