//! Kernel micro-benchmarks: one 1536 × 576 weight matrix of each type times 1 (decode) or 4
//! (prefill) activation rows, on every instruction set this CPU has, single-threaded.
//! `cargo bench -p anelm-cpu --bench kernels`; compare the bytes/s of decode with the machine's
//! memory bandwidth and the rows × tokens / s of prefill across instruction sets.

use anelm_cpu::kernels::{select, Kernel, MAX_ROWS};
use anelm_cpu::q8::{ActKind, Q8Buf};
use anelm_cpu::Isa;
use anelm_formats::GgmlType;
use divan::counter::BytesCount;
use divan::Bencher;

const ROWS: usize = 1536;
const COLS: usize = 576 / 64 * 64 * 4; // 2304: whole 256-value blocks for the k-quants

const TYPES: [GgmlType; 11] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::F32,
];

fn main() {
    divan::main();
}

/// A matrix of plausible blocks: pseudo-random quants with small finite f16 scales.
fn matrix(t: GgmlType) -> Vec<u8> {
    let bytes = t.bytes_for(ROWS * COLS).expect("whole blocks");
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut v: Vec<u8> = (0..bytes)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let scale = half::f16::from_f32(0.01).to_le_bytes();
    let fields: &[usize] = match t {
        GgmlType::Q6K => &[208],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::F16 | GgmlType::BF16 | GgmlType::F32 => &[],
        _ => &[0],
    };
    match t {
        GgmlType::F32 => {
            v = (0..ROWS * COLS)
                .flat_map(|i| ((i % 17) as f32 * 0.01).to_le_bytes())
                .collect()
        }
        GgmlType::F16 | GgmlType::BF16 => v.iter_mut().skip(1).step_by(2).for_each(|b| *b &= 0x3f),
        _ => {
            for block in v.chunks_exact_mut(t.block_bytes()) {
                for &at in fields {
                    block[at..at + 2].copy_from_slice(&scale);
                }
            }
        }
    }
    v
}

fn activations(kind: ActKind, tokens: usize) -> (Q8Buf, Vec<f32>) {
    let x: Vec<f32> = (0..tokens * COLS)
        .map(|i| ((i * 7919) % 1000) as f32 * 0.002 - 1.0)
        .collect();
    let mut q = Q8Buf::new(kind, tokens, COLS);
    if kind != ActKind::F32 {
        for t in 0..tokens {
            q.quantize_row(t, &x[t * COLS..(t + 1) * COLS]);
        }
    }
    (q, x)
}

fn run(b: Bencher, t: GgmlType, isa: Isa, tokens: usize) {
    if !Isa::available().contains(&isa) {
        return;
    }
    let w = matrix(t);
    let rb = w.len() / ROWS;
    let kernel = select(t, isa);
    let (q, x) = activations(kernel.act(), tokens);
    let mut out = vec![0f32; MAX_ROWS];
    b.counter(BytesCount::new(w.len())).bench_local(|| {
        for r in 0..ROWS {
            let row = &w[r * rb..(r + 1) * rb];
            match kernel {
                Kernel::Q8 { f, .. } => {
                    let xs: Vec<_> = (0..tokens).map(|i| q.row(i)).collect();
                    // SAFETY: `isa` is available.
                    unsafe { f(row, &xs, &mut out[..tokens]) };
                }
                Kernel::F32(f) | Kernel::Dequant(f) => {
                    let xs: Vec<&[f32]> =
                        (0..tokens).map(|i| &x[i * COLS..(i + 1) * COLS]).collect();
                    // SAFETY: as above.
                    unsafe { f(row, &xs, &mut out[..tokens]) };
                }
            }
        }
        divan::black_box(&out);
    });
}

#[divan::bench(args = TYPES, consts = [1, 4])]
fn scalar<const T: usize>(b: Bencher, t: GgmlType) {
    run(b, t, Isa::Scalar, T);
}

#[divan::bench(args = TYPES, consts = [1, 4])]
fn avx2<const T: usize>(b: Bencher, t: GgmlType) {
    run(b, t, Isa::Avx2, T);
}

#[divan::bench(args = TYPES, consts = [1, 4])]
fn avx512<const T: usize>(b: Bencher, t: GgmlType) {
    run(b, t, Isa::Avx512, T);
}

/// The sixteen-row packed layout of the 32-value types, by its AVX2 and AVX-512 kernels.
#[cfg(target_arch = "x86_64")]
fn packed_run(b: Bencher, t: GgmlType, isa: Isa, tokens: usize) {
    use anelm_cpu::kernels::packed;
    if !Isa::available().contains(&isa) {
        return;
    }
    let w = matrix(t);
    let rb = w.len() / ROWS;
    let p = packed::pack(t, ROWS, COLS / 32, |r| &w[r * rb..(r + 1) * rb], |_| {})
        .expect("a packable type");
    let lay = packed::Layout::of(t).expect("a packable type");
    let (q, _) = activations(ActKind::Q8B32, tokens);
    let mut out = vec![0f32; tokens * ROWS];
    b.counter(BytesCount::new(w.len())).bench_local(|| {
        let xs: Vec<_> = (0..tokens).map(|i| q.row(i)).collect();
        // SAFETY: the CPU has `isa`.
        unsafe {
            anelm_cpu::kernels::x86_packed::packed_dot(isa, &p, COLS / 32, lay, &xs, &mut out)
        };
        divan::black_box(&out);
    });
}

#[cfg(target_arch = "x86_64")]
const PACKED: [GgmlType; 5] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
];

#[cfg(target_arch = "x86_64")]
#[divan::bench(args = PACKED, consts = [1, 4, 8])]
fn avx2_packed<const T: usize>(b: Bencher, t: GgmlType) {
    packed_run(b, t, Isa::Avx2, T);
}

#[cfg(target_arch = "x86_64")]
#[divan::bench(args = PACKED, consts = [1, 4, 8])]
fn avx512_packed<const T: usize>(b: Bencher, t: GgmlType) {
    packed_run(b, t, Isa::Avx512, T);
}
