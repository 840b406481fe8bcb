//! NEON kernels for aarch64 (NEON is part of the baseline there): the 32-value types against
//! 8-bit activations and the float types against f32. The k-quants use the scalar kernels on
//! aarch64 for now. Compiled and type-checked on x86 hosts with `--target aarch64-*`; the
//! property tests run them wherever the tests run on aarch64.
//!
//! 8-bit products widen to i16 (`vmull_s8`) and accumulate pairwise into i32 (`vpadalq_s16`),
//! which needs no optional feature (the `dotprod` extension would halve the instructions).

use std::arch::aarch64::*;

use super::{bytes, f16_at, MAX_ROWS};
use crate::q8::Q8Row;

/// The 32-value types, which share one body here.
#[derive(Clone, Copy)]
enum LegacyKind {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
}

/// `Σ w·x` of 32 bytes each (`w` values fit in i8: nibbles, 5-bit values or Q8_0 quants).
#[inline(always)]
unsafe fn dot32(w: &[i8; 32], x: *const i8) -> i32 {
    let mut acc = vdupq_n_s32(0);
    for h in 0..2 {
        let wv = vld1q_s8(w.as_ptr().add(16 * h));
        let xv = vld1q_s8(x.add(16 * h));
        acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(wv), vget_low_s8(xv)));
        acc = vpadalq_s16(acc, vmull_high_s8(wv, xv));
    }
    vaddvq_s32(acc)
}

/// The 32 values of a legacy block as bytes (low nibbles, then high ones; plus fifth bits),
/// with `d` and `m` such that `w = d · q + m`.
#[inline(always)]
fn unpack(t: LegacyKind, b: &[u8]) -> ([i8; 32], f32, f32) {
    use LegacyKind::*;
    let mut q = [0i8; 32];
    let nib = |q: &mut [i8; 32], qs: &[u8]| {
        for j in 0..16 {
            q[j] = (qs[j] & 0xf) as i8;
            q[j + 16] = (qs[j] >> 4) as i8;
        }
    };
    let five = |q: &mut [i8; 32], qh: u32| {
        for (j, v) in q.iter_mut().enumerate() {
            *v |= (((qh >> j) & 1) << 4) as i8;
        }
    };
    let u32_at = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let d = f16_at(b, 0);
    match t {
        Q4_0 => {
            nib(&mut q, &b[2..18]);
            (q, d, -8.0 * d)
        }
        Q4_1 => {
            nib(&mut q, &b[4..20]);
            (q, d, f16_at(b, 2))
        }
        Q5_0 => {
            nib(&mut q, &b[6..22]);
            five(&mut q, u32_at(2));
            (q, d, -16.0 * d)
        }
        Q5_1 => {
            nib(&mut q, &b[8..24]);
            five(&mut q, u32_at(4));
            (q, d, f16_at(b, 2))
        }
        Q8_0 => {
            for (v, &s) in q.iter_mut().zip(&b[2..34]) {
                *v = s as i8;
            }
            (q, d, 0.0)
        }
    }
}

fn legacy(t: LegacyKind, block: usize, row: &[u8], xs: &[Q8Row<'_>], out: &mut [f32]) {
    let mut acc = [0f32; MAX_ROWS];
    for (i, b) in row.chunks_exact(block).enumerate() {
        let (q, d, m) = unpack(t, b);
        for (a, x) in acc.iter_mut().zip(xs) {
            // SAFETY: NEON is baseline on aarch64; the activation row holds 32 values per block.
            let s = unsafe { dot32(&q, x.qs.as_ptr().add(32 * i)) };
            *a += (d * x.d[i]) * s as f32 + if m != 0.0 { m * x.s[i] } else { 0.0 };
        }
    }
    out.copy_from_slice(&acc[..out.len()]);
}

pub fn q4_0(row: &[u8], xs: &[Q8Row<'_>], out: &mut [f32]) {
    legacy(LegacyKind::Q4_0, bytes::Q4_0, row, xs, out);
}
pub fn q4_1(row: &[u8], xs: &[Q8Row<'_>], out: &mut [f32]) {
    legacy(LegacyKind::Q4_1, bytes::Q4_1, row, xs, out);
}
pub fn q5_0(row: &[u8], xs: &[Q8Row<'_>], out: &mut [f32]) {
    legacy(LegacyKind::Q5_0, bytes::Q5_0, row, xs, out);
}
pub fn q5_1(row: &[u8], xs: &[Q8Row<'_>], out: &mut [f32]) {
    legacy(LegacyKind::Q5_1, bytes::Q5_1, row, xs, out);
}
pub fn q8_0(row: &[u8], xs: &[Q8Row<'_>], out: &mut [f32]) {
    legacy(LegacyKind::Q8_0, bytes::Q8_0, row, xs, out);
}
pub use super::scalar::{q4_k, q5_k, q6_k};

/// f32 dot products over chunks of four lanes, the weights widened by `widen` (W bytes each).
fn float<const W: usize>(
    row: &[u8],
    xs: &[&[f32]],
    out: &mut [f32],
    widen: impl Fn([u8; W]) -> f32,
) {
    let n = row.len() / W;
    let mut acc = [0f32; MAX_ROWS];
    let mut buf = [0f32; 64];
    for (c, chunk) in row.chunks(64 * W).enumerate() {
        let len = chunk.len() / W;
        for (v, b) in buf.iter_mut().zip(chunk.chunks_exact(W)) {
            *v = widen(b.try_into().expect("W bytes"));
        }
        for (a, x) in acc.iter_mut().zip(xs) {
            let x = &x[64 * c..64 * c + len];
            // SAFETY: NEON is baseline on aarch64; both slices hold `len` values.
            unsafe {
                let mut v = vdupq_n_f32(0.0);
                let l4 = len / 4 * 4;
                for i in (0..l4).step_by(4) {
                    v = vfmaq_f32(
                        v,
                        vld1q_f32(buf.as_ptr().add(i)),
                        vld1q_f32(x.as_ptr().add(i)),
                    );
                }
                *a += vaddvq_f32(v) + (l4..len).map(|i| buf[i] * x[i]).sum::<f32>();
            }
        }
    }
    debug_assert!(xs.iter().all(|x| x.len() == n));
    out.copy_from_slice(&acc[..out.len()]);
}

pub fn f32(row: &[u8], xs: &[&[f32]], out: &mut [f32]) {
    float(row, xs, out, f32::from_le_bytes);
}
pub fn f16(row: &[u8], xs: &[&[f32]], out: &mut [f32]) {
    float(row, xs, out, |b| half::f16::from_le_bytes(b).to_f32());
}
pub fn bf16(row: &[u8], xs: &[&[f32]], out: &mut [f32]) {
    float(row, xs, out, |b| {
        f32::from_bits(u32::from(u16::from_le_bytes(b)) << 16)
    });
}

/// The f32-activation kernel for `name`.
pub fn f32_kernel(name: &str) -> super::F32Kernel {
    match name {
        "f16" => f16,
        "bf16" => bf16,
        _ => f32,
    }
}
