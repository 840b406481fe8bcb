//! The packed Q4_1 dot kernel over matrices that do not fit in cache (48 of SmolLM2's
//! 2304 × 1536 FFN shape, about 100 MiB, the size of the model's weights), on two threads, one
//! input row against four: whether a decode step of four sequences costs more weight streaming
//! than a step of one. `cargo run --release -p anelm-cpu --example streamdot` (x86-64; the best
//! instruction set the CPU has, or `ANELM_ISA`). Prints the best of five passes, three times.

#[cfg(target_arch = "x86_64")]
fn main() {
    use anelm_cpu::kernels::{packed, x86_packed};
    use anelm_cpu::q8::{ActKind, Q8Buf};
    use anelm_cpu::Isa;
    use anelm_formats::GgmlType;
    use std::time::Instant;

    let isa = Isa::detect();
    if isa == Isa::Scalar {
        eprintln!("the packed kernels need AVX2 or AVX-512");
        return;
    }
    let (rows, cols, mats) = (2304usize, 1536usize, 48usize);
    let nb = cols / 32;
    // A Q4_1 block: f16 scale and minimum (small, finite), then sixteen bytes of nibbles.
    let rb = nb * 20;
    let mut seed = 12345u64;
    let raw: Vec<u8> = (0..rows * rb)
        .map(|i| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            match i % 20 {
                0 | 2 => 0x00,
                1 | 3 => 0x20,
                _ => seed as u8,
            }
        })
        .collect();
    let one = packed::pack(
        GgmlType::Q4_1,
        rows,
        nb,
        |r| &raw[r * rb..(r + 1) * rb],
        |_| {},
    )
    .expect("Q4_1 packs");
    let ms: Vec<Vec<u8>> = (0..mats).map(|_| one.clone()).collect();
    let lay = packed::Layout::of(GgmlType::Q4_1).expect("Q4_1 packs");
    let mut q = Q8Buf::new(ActKind::Q8B32, 4, cols);
    for t in 0..4 {
        let x: Vec<f32> = (0..cols)
            .map(|i| ((i * 31 + t * 7) % 97) as f32 / 97.0 - 0.5)
            .collect();
        q.quantize_row(t, &x);
    }
    let bytes: usize = ms.iter().map(|m| m.len()).sum();
    println!(
        "{isa:?}, {:.1} MiB of packed weights, two threads",
        bytes as f64 / (1 << 20) as f64
    );
    for _ in 0..3 {
        for tokens in [1usize, 4] {
            let mut best = f64::MAX;
            for _ in 0..5 {
                let start = Instant::now();
                std::thread::scope(|s| {
                    for th in 0..2 {
                        let (ms, q) = (&ms, &q);
                        s.spawn(move || {
                            let mut out = vec![0f32; tokens * rows];
                            let xs: Vec<_> = (0..tokens).map(|i| q.row(i)).collect();
                            for m in ms.iter().skip(th).step_by(2) {
                                // SAFETY: `isa` was detected on this CPU.
                                unsafe { x86_packed::packed_dot(isa, m, nb, lay, &xs, &mut out) };
                            }
                            std::hint::black_box(&out);
                        });
                    }
                });
                best = best.min(start.elapsed().as_secs_f64());
            }
            println!(
                "{tokens} input row(s): {:.2} ms, {:.1} GB/s of weights",
                best * 1e3,
                bytes as f64 / best / 1e9
            );
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    eprintln!("the packed kernels are x86-64 only");
}
