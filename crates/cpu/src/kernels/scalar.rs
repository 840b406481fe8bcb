//! The reference kernels: plain Rust, one input row at a time. Integer block sums are exact; the
//! float combination is the definition the SIMD kernels are tested against:
//! - 32-value types: `Σ_b (d_w · d_x) · Σ (w_q · x_q) + m_w · s_x`, where the weight is
//!   `d_w · w_q + m_w` (`m_w` is `-8 d`, `-16 d`, the stored min, or 0 with signed `w_q`);
//! - k-quants: per 256-value block `(d · d_x) · Σ_j sc_j Σ (w_q · x_q) − (dmin · d_x) · Σ_j m_j Σ x_q`
//!   (Q6_K: `(d · d_x) · Σ_g sc_g Σ ((w_q − 32) · x_q)`).

use super::{bytes, f16_at, k4_scales_mins, QK};
use crate::q8::{Q8Row, QK_K};

fn each_row(xs: &[Q8Row<'_>], out: &mut [f32], dot: impl Fn(&Q8Row<'_>) -> f32) {
    for (o, x) in out.iter_mut().zip(xs) {
        *o = dot(x);
    }
}

/// `Σ a·b` of two equally long byte runs as integers.
fn isum(w: impl Iterator<Item = i32>, x: &[i8]) -> i32 {
    w.zip(x).map(|(w, &x)| w * i32::from(x)).sum()
}

/// The 32 unsigned 4-bit values of a legacy block's 16 nibble bytes: low nibbles first.
fn nibbles(qs: &[u8]) -> impl Iterator<Item = i32> + '_ {
    qs.iter()
        .map(|&q| i32::from(q & 0xf))
        .chain(qs.iter().map(|&q| i32::from(q >> 4)))
}

/// The 32 unsigned 5-bit values of a Q5 block: nibbles plus bit `i` of `qh` as bit 4 of value `i`.
fn five_bits(qs: &[u8], qh: u32) -> impl Iterator<Item = i32> + '_ {
    nibbles(qs)
        .enumerate()
        .map(move |(i, v)| v | ((((qh >> i) & 1) as i32) << 4))
}

fn qh_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Dot product of a row of 32-value blocks: `block(b) = (d, m, Σ w_q x_q)`.
fn legacy(
    row: &[u8],
    block_bytes: usize,
    x: &Q8Row<'_>,
    block: impl Fn(&[u8], &[i8]) -> (f32, f32, i32),
) -> f32 {
    let mut acc = 0f32;
    for (i, b) in row.chunks_exact(block_bytes).enumerate() {
        let (d, m, s) = block(b, &x.qs[i * QK..(i + 1) * QK]);
        acc += (d * x.d[i]) * s as f32 + m * x.s[i];
    }
    acc
}

pub fn q4_0(row: &[u8], xs: &[Q8Row<'_>], out: &mut [f32]) {
    each_row(xs, out, |x| {
        legacy(row, bytes::Q4_0, x, |b, q| {
            let d = f16_at(b, 0);
            (d, -8.0 * d, isum(nibbles(&b[2..18]), q))
        })
    });
}

pub fn q4_1(row: &[u8], xs: &[Q8Row<'_>], out: &mut [f32]) {
    each_row(xs, out, |x| {
        legacy(row, bytes::Q4_1, x, |b, q| {
            (f16_at(b, 0), f16_at(b, 2), isum(nibbles(&b[4..20]), q))
        })
    });
}

pub fn q5_0(row: &[u8], xs: &[Q8Row<'_>], out: &mut [f32]) {
    each_row(xs, out, |x| {
        legacy(row, bytes::Q5_0, x, |b, q| {
            let d = f16_at(b, 0);
            (d, -16.0 * d, isum(five_bits(&b[6..22], qh_at(b, 2)), q))
        })
    });
}

pub fn q5_1(row: &[u8], xs: &[Q8Row<'_>], out: &mut [f32]) {
    each_row(xs, out, |x| {
        legacy(row, bytes::Q5_1, x, |b, q| {
            (
                f16_at(b, 0),
                f16_at(b, 2),
                isum(five_bits(&b[8..24], qh_at(b, 4)), q),
            )
        })
    });
}

pub fn q8_0(row: &[u8], xs: &[Q8Row<'_>], out: &mut [f32]) {
    each_row(xs, out, |x| {
        legacy(row, bytes::Q8_0, x, |b, q| {
            (
                f16_at(b, 0),
                0.0,
                isum(b[2..34].iter().map(|&v| i32::from(v as i8)), q),
            )
        })
    });
}

/// Q4_K and Q5_K: `quant(sb, j, l)` is value `l` of sub-block `j` of super-block bytes `sb`.
fn k4(
    row: &[u8],
    block_bytes: usize,
    x: &Q8Row<'_>,
    quant: impl Fn(&[u8], usize, usize) -> i32,
) -> f32 {
    let mut acc = 0f32;
    for (i, sb) in row.chunks_exact(block_bytes).enumerate() {
        let (d, dmin) = (f16_at(sb, 0), f16_at(sb, 2));
        let (sc, mn) = k4_scales_mins(&sb[4..16]);
        let qs = &x.qs[i * QK_K..(i + 1) * QK_K];
        let (mut scaled, mut mins) = (0i32, 0i32);
        for j in 0..8 {
            let s: i32 = (0..32)
                .map(|l| quant(sb, j, l) * i32::from(qs[32 * j + l]))
                .sum();
            scaled += i32::from(sc[j]) * s;
            mins += i32::from(mn[j])
                * (i32::from(x.sums[16 * i + 2 * j]) + i32::from(x.sums[16 * i + 2 * j + 1]));
        }
        acc += (d * x.d[i]) * scaled as f32 - (dmin * x.d[i]) * mins as f32;
    }
    acc
}

pub fn q4_k(row: &[u8], xs: &[Q8Row<'_>], out: &mut [f32]) {
    each_row(xs, out, |x| {
        k4(row, bytes::Q4_K, x, |sb, j, l| {
            i32::from((sb[16 + 32 * (j / 2) + l] >> (4 * (j % 2))) & 0xf)
        })
    });
}

pub fn q5_k(row: &[u8], xs: &[Q8Row<'_>], out: &mut [f32]) {
    each_row(xs, out, |x| {
        k4(row, bytes::Q5_K, x, |sb, j, l| {
            let low = (sb[48 + 32 * (j / 2) + l] >> (4 * (j % 2))) & 0xf;
            let high = (sb[16 + l] >> j) & 1;
            i32::from(low | (high << 4))
        })
    });
}

pub fn q6_k(row: &[u8], xs: &[Q8Row<'_>], out: &mut [f32]) {
    each_row(xs, out, |x| {
        let mut acc = 0f32;
        for (i, sb) in row.chunks_exact(bytes::Q6_K).enumerate() {
            let d = f16_at(sb, 208);
            let qs = &x.qs[i * QK_K..(i + 1) * QK_K];
            let mut total = 0i32;
            for g in 0..16 {
                let (half, plane, first) = (g / 8, (g % 8) / 2, 16 * (g % 2));
                let s: i32 = (0..16)
                    .map(|l| {
                        let lo = (sb[64 * half + 32 * (plane % 2) + first + l]
                            >> (4 * (plane / 2)))
                            & 0xf;
                        let hi = (sb[128 + 32 * half + first + l] >> (2 * plane)) & 3;
                        (i32::from(lo | (hi << 4)) - 32) * i32::from(qs[16 * g + l])
                    })
                    .sum();
                total += i32::from(sb[192 + g] as i8) * s;
            }
            acc += (d * x.d[i]) * total as f32;
        }
        acc
    });
}

/// f32 dot product with eight partial sums (the order the tests of the exact path were
/// written against; LLVM vectorises it).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    let mut s = acc.iter().sum::<f32>();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// Widens a row of `W`-byte values into `buf` and dots it with every input row.
fn float_rows<const W: usize>(
    row: &[u8],
    xs: &[&[f32]],
    out: &mut [f32],
    widen: impl Fn([u8; W]) -> f32,
) {
    let n = row.len() / W;
    let mut acc = [0f32; super::MAX_ROWS];
    // Chunks of 64 values keep the widened copy on the stack.
    let mut buf = [0f32; 64];
    for (c, chunk) in row.chunks(64 * W).enumerate() {
        let len = chunk.len() / W;
        for (v, b) in buf.iter_mut().zip(chunk.chunks_exact(W)) {
            *v = widen(b.try_into().expect("chunks_exact gives W bytes"));
        }
        for (a, x) in acc.iter_mut().zip(xs) {
            *a += dot(&buf[..len], &x[64 * c..64 * c + len]);
        }
    }
    debug_assert!(xs.iter().all(|x| x.len() == n));
    out.copy_from_slice(&acc[..out.len()]);
}

pub fn f32(row: &[u8], xs: &[&[f32]], out: &mut [f32]) {
    float_rows(row, xs, out, f32::from_le_bytes);
}

pub fn f16(row: &[u8], xs: &[&[f32]], out: &mut [f32]) {
    float_rows(row, xs, out, |b| half::f16::from_le_bytes(b).to_f32());
}

pub fn bf16(row: &[u8], xs: &[&[f32]], out: &mut [f32]) {
    float_rows(row, xs, out, |b| {
        f32::from_bits(u32::from(u16::from_le_bytes(b)) << 16)
    });
}
