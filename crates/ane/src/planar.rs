//! Moving activations between the engine's token-major f32 rows and a device's planar I/O
//! buffers (channel rows, one column per token, [`IoLayout`]).

use half::f16;

use crate::device::{IoLayout, IoType};

/// The largest finite fp16: inputs beyond it are saturated rather than sent as infinities.
const FP16_MAX: f32 = 65504.0;

/// Writes `n` tokens of `x` (token-major rows of `layout.channels` values), token `t`
/// multiplied by `scales[t]`, into columns `0..n` of `bytes`.
pub fn scatter(layout: &IoLayout, x: &[f32], n: usize, scales: &[f32], bytes: &mut [u8]) {
    let ch = layout.channels;
    assert!(
        x.len() >= n * ch && n <= layout.width && scales.len() >= n,
        "scatter: {n} tokens of {ch} channels"
    );
    for c in 0..ch {
        let row = &mut bytes[layout.offset(c, 0)..layout.offset(c, n)];
        match layout.dtype {
            IoType::Fp16 => {
                for (t, d) in row.chunks_exact_mut(2).enumerate() {
                    let v = (x[t * ch + c] * scales[t]).clamp(-FP16_MAX, FP16_MAX);
                    d.copy_from_slice(&f16::from_f32(v).to_le_bytes());
                }
            }
            IoType::Fp32 => {
                for (t, d) in row.chunks_exact_mut(4).enumerate() {
                    d.copy_from_slice(&(x[t * ch + c] * scales[t]).to_le_bytes());
                }
            }
        }
    }
}

/// Reads columns `cols` of `bytes` into `out[(t - cols.start) * ld + first + c]`.
pub fn gather(
    layout: &IoLayout,
    bytes: &[u8],
    cols: std::ops::Range<usize>,
    out: &mut [f32],
    ld: usize,
    first: usize,
) {
    let ch = layout.channels;
    let n = cols.len();
    assert!(
        n <= layout.width && first + ch <= ld && out.len() >= (n.max(1) - 1) * ld + first + ch,
        "gather sizes"
    );
    for c in 0..ch {
        let row = &bytes[layout.offset(c, cols.start)..layout.offset(c, cols.end)];
        match layout.dtype {
            IoType::Fp16 => {
                for (t, b) in row.chunks_exact(2).enumerate() {
                    out[t * ld + first + c] = f16::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
            IoType::Fp32 => {
                for (t, b) in row.chunks_exact(4).enumerate() {
                    out[t * ld + first + c] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_through_padded_rows() {
        let l = IoLayout::ane("x", IoType::Fp16, 3, 17);
        assert_eq!(l.row_stride, 64, "34 bytes of data padded to 64");
        let x: Vec<f32> = (0..2 * 3).map(|i| i as f32 - 2.5).collect();
        let mut bytes = vec![0u8; l.size];
        scatter(&l, &x, 2, &[2.0, 1.0], &mut bytes);
        assert_eq!(
            f16::from_le_bytes([bytes[64], bytes[65]]).to_f32(),
            2.0 * x[1],
            "channel 1, token 0"
        );
        let mut out = vec![0f32; 2 * 5];
        gather(&l, &bytes, 0..2, &mut out, 5, 1);
        assert_eq!(&out[1..4], &[2.0 * x[0], 2.0 * x[1], 2.0 * x[2]]);
        assert_eq!(&out[6..9], &x[3..6]);
        scatter(&l, &[1e6, -1e6, f32::NAN], 1, &[1.0], &mut bytes);
        gather(&l, &bytes, 0..1, &mut out, 5, 0);
        let mut one = [0f32; 3];
        gather(&l, &bytes, 1..2, &mut one, 3, 0);
        assert_eq!(one, [x[3], x[4], x[5]], "column 1 alone");
        assert_eq!(&out[0..2], &[65504.0, -65504.0]);
        assert!(out[2].is_nan());
    }
}
