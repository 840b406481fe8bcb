//! LFM2's gated short convolution over a block of channels of one sequence (ARCHITECTURES.md has
//! no section; transformers' `Lfm2ShortConv`): per token `y = C · conv(B · x)`, the conv causal
//! and depthwise over the last `kernel` values of `B · x`, whose last `kernel - 1` are the state.
//! Public: the ANE projection strategy runs this same conv on its host side.

use anelm_model::plan::ShortConv;

/// Tokens `0..n` of one sequence, channels `ch`: `bcx` holds each token's `B | C | x` (`3h`
/// wide), `state` the history of `B · x` (`kernel - 1` rows of `h`, oldest first), `out` each
/// token's `h` outputs. Only channels `ch` of `state` and `out` are written.
pub fn run(
    s: &ShortConv,
    h: usize,
    ch: std::ops::Range<usize>,
    n: usize,
    bcx: &[f32],
    state: &mut [f32],
    out: &mut [f32],
) {
    let (k, hist) = (s.kernel, s.kernel - 1);
    for t in 0..n {
        let row = &bcx[t * 3 * h..(t + 1) * 3 * h];
        for c in ch.clone() {
            let bx = row[c] * row[2 * h + c];
            let w = &s.conv[c * k..(c + 1) * k];
            let mut acc = w[hist] * bx;
            for j in 0..hist {
                acc += w[j] * state[j * h + c];
            }
            if let Some(b) = &s.conv_bias {
                acc += b[c];
            }
            out[t * h + c] = row[h + c] * acc;
            for j in 1..hist {
                state[(j - 1) * h + c] = state[j * h + c];
            }
            if hist > 0 {
                state[(hist - 1) * h + c] = bx;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anelm_model::plan::Linear;
    use anelm_model::Weight;

    fn conv(h: usize, k: usize, w: Vec<f32>) -> ShortConv {
        let lin = |o: usize| Linear {
            weight: Weight::from_f32("w", o, h, &vec![0.0; o * h]),
            bias: None,
        };
        ShortConv {
            kernel: k,
            in_proj: lin(3 * h),
            conv: w,
            conv_bias: None,
            out: lin(h),
        }
    }

    #[test]
    fn token_by_token_equals_the_whole_prompt_and_matches_the_definition() {
        let (h, k, n) = (2, 3, 5);
        let s = conv(h, k, vec![0.5, -1.0, 2.0, 1.0, 0.25, -0.5]);
        let bcx: Vec<f32> = (0..n * 3 * h)
            .map(|i| ((i * 7 % 11) as f32 - 5.0) / 3.0)
            .collect();
        let (mut st, mut out) = (vec![0.0; (k - 1) * h], vec![0.0; n * h]);
        run(&s, h, 0..h, n, &bcx, &mut st, &mut out);
        let (mut st1, mut one) = (vec![0.0; (k - 1) * h], vec![0.0; n * h]);
        for t in 0..n {
            run(
                &s,
                h,
                0..h,
                1,
                &bcx[t * 3 * h..],
                &mut st1,
                &mut one[t * h..],
            );
        }
        assert_eq!(out, one);
        assert_eq!(st, st1);
        // The definition: y[t] = C[t] · Σ_j w[j] · (B·x)[t - (k-1) + j], zero before the start.
        let bx = |t: usize, c: usize| bcx[t * 3 * h + c] * bcx[t * 3 * h + 2 * h + c];
        for t in 0..n {
            for c in 0..h {
                let mut acc = 0.0;
                for j in 0..k {
                    if let Some(tt) = (t + j).checked_sub(k - 1) {
                        acc += s.conv[c * k + j] * bx(tt, c);
                    }
                }
                let want = bcx[t * 3 * h + h + c] * acc;
                assert!((out[t * h + c] - want).abs() < 1e-6, "t {t} c {c}");
            }
        }
    }
}
