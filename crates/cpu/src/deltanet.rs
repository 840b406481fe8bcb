//! Gated DeltaNet (ARCHITECTURES.md §4.4) for one key-head group: the causal depthwise conv of
//! the group's channels, then per value head the decayed delta-rule update of its state and the
//! gated RMSNorm of the read-out. Groups touch disjoint channels, states and outputs, so the
//! threads of a forward pass run different groups at once. Public: the ANE projection
//! strategy runs this same recurrence on its host side ([`run_layer`]).

use anelm_model::plan::{DeltaNet, KeyHeadMap};

/// Value heads served by key head `g`.
pub fn value_heads(d: &DeltaNet, g: usize) -> impl Iterator<Item = usize> + '_ {
    let r = d.n_v_heads / d.n_k_heads;
    (0..r).map(move |j| match d.key_head_of {
        KeyHeadMap::Grouped => g * r + j,
        KeyHeadMap::Tiled => g + j * d.n_k_heads,
    })
}

/// Scratch floats [`run_group`] needs.
pub fn scratch_len(d: &DeltaNet) -> usize {
    2 * d.k_dim + 4 * d.v_dim
}

/// The token-by-token inputs of one layer: rows of the flat `q | k | v` projection (`qkv`,
/// `channels` wide), of `z` (`n_v * dv`), and of `b` and `a` (`n_v`).
pub struct Inputs<'a> {
    pub qkv: &'a [f32],
    pub z: &'a [f32],
    pub b: &'a [f32],
    pub a: &'a [f32],
}

/// The parts of a layer's recurrent state and output that group `g` owns.
pub struct GroupState<'a> {
    /// `[channels][K - 1]` previous conv inputs, oldest first (whole layer; the group touches
    /// only its channels).
    pub conv: &'a mut [f32],
    /// `[n_v][dk][dv]` states (whole layer; the group touches only its heads).
    pub s: &'a mut [f32],
    /// `[n][n_v * dv]` outputs (whole chunk; the group writes only its heads).
    pub out: &'a mut [f32],
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

fn softplus(x: f32) -> f32 {
    // torch's threshold: above 20 the result is x to f32 precision.
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

fn l2_normalize(v: &mut [f32]) {
    let inv = 1.0 / (v.iter().map(|x| x * x).sum::<f32>() + 1e-6).sqrt();
    v.iter_mut().for_each(|x| *x *= inv);
}

/// The conv output (after SiLU) of `channel` at chunk token `t`: the last `K` inputs, those
/// before the chunk taken from the conv state.
fn conv_at(
    d: &DeltaNet,
    channels: usize,
    io: &Inputs<'_>,
    conv_state: &[f32],
    channel: usize,
    t: usize,
) -> f32 {
    let k = d.conv_kernel;
    let w = &d.conv[channel * k..(channel + 1) * k];
    let hist = &conv_state[channel * (k - 1)..(channel + 1) * (k - 1)];
    let mut acc = 0f32;
    for (j, wj) in w.iter().enumerate() {
        // Input at chunk position t - (K-1) + j.
        let back = k - 1 - j;
        let x = if back <= t {
            io.qkv[(t - back) * channels + channel]
        } else {
            hist[k - 1 - (back - t)]
        };
        acc += wj * x;
    }
    silu(acc)
}

/// Runs every key group of a layer over `n` tokens, one after another: `conv` and `s` are the
/// layer's whole conv history and states, `out` the `n` rows of outputs (`n_v * dv` each).
pub fn run_layer(
    d: &DeltaNet,
    n: usize,
    io: &Inputs<'_>,
    conv: &mut [f32],
    s: &mut [f32],
    out: &mut [f32],
) {
    let mut scratch = vec![0f32; scratch_len(d)];
    let mut st = GroupState { conv, s, out };
    for g in 0..d.n_k_heads {
        run_group(d, g, n, io, &mut st, &mut scratch);
    }
}

/// Runs key group `g` over `n` tokens, updating its conv history and states and writing its
/// value heads' outputs.
pub fn run_group(
    d: &DeltaNet,
    g: usize,
    n: usize,
    io: &Inputs<'_>,
    st: &mut GroupState<'_>,
    scratch: &mut [f32],
) {
    let (dk, dv, k) = (d.k_dim, d.v_dim, d.conv_kernel);
    let channels = d.conv_channels();
    let key_dim = d.n_k_heads * dk;
    let vd = d.n_v_heads * dv;
    let (q, rest) = scratch.split_at_mut(dk);
    let (kk, rest) = rest.split_at_mut(dk);
    let (v, rest) = rest.split_at_mut(dv);
    let (kv, rest) = rest.split_at_mut(dv);
    let o = &mut rest[..dv];
    let q_scale = (dk as f32).powf(-0.5);
    for t in 0..n {
        for i in 0..dk {
            q[i] = conv_at(d, channels, io, st.conv, g * dk + i, t);
            kk[i] = conv_at(d, channels, io, st.conv, key_dim + g * dk + i, t);
        }
        l2_normalize(q);
        l2_normalize(kk);
        q.iter_mut().for_each(|x| *x *= q_scale);
        for h in value_heads(d, g) {
            for (j, vj) in v.iter_mut().enumerate() {
                *vj = conv_at(d, channels, io, st.conv, 2 * key_dim + h * dv + j, t);
            }
            let beta = 1.0 / (1.0 + (-io.b[t * d.n_v_heads + h]).exp());
            let decay = (d.neg_a[h] * softplus(io.a[t * d.n_v_heads + h] + d.dt_bias[h])).exp();
            let s = &mut st.s[h * dk * dv..(h + 1) * dk * dv];
            s.iter_mut().for_each(|x| *x *= decay);
            kv.fill(0.0);
            for (i, row) in s.chunks_exact(dv).enumerate() {
                row.iter()
                    .zip(kv.iter_mut())
                    .for_each(|(sij, acc)| *acc += sij * kk[i]);
            }
            // delta = beta (v - S^T k), reusing `v`.
            v.iter_mut()
                .zip(kv.iter())
                .for_each(|(vj, kvj)| *vj = beta * (*vj - kvj));
            o.fill(0.0);
            for (i, row) in s.chunks_exact_mut(dv).enumerate() {
                for j in 0..dv {
                    row[j] += kk[i] * v[j];
                    o[j] += row[j] * q[i];
                }
            }
            let inv = 1.0 / (o.iter().map(|x| x * x).sum::<f32>() / dv as f32 + d.norm.eps).sqrt();
            let out = &mut st.out[t * vd + h * dv..t * vd + (h + 1) * dv];
            let z = &io.z[t * vd + h * dv..t * vd + (h + 1) * dv];
            for j in 0..dv {
                out[j] = o[j] * inv * d.norm.weight[j] * silu(z[j]);
            }
        }
    }
    // The conv history keeps the last K-1 inputs of the group's channels.
    let own = (g * dk..(g + 1) * dk)
        .chain(key_dim + g * dk..key_dim + (g + 1) * dk)
        .chain(value_heads(d, g).flat_map(|h| 2 * key_dim + h * dv..2 * key_dim + (h + 1) * dv));
    for c in own {
        let hist = &mut st.conv[c * (k - 1)..(c + 1) * (k - 1)];
        for i in 0..k - 1 {
            // Position n - (K-1) + i of the chunk, or older history.
            let back = k - 1 - i;
            hist[i] = if back <= n {
                io.qkv[(n - back) * channels + c]
            } else {
                hist[i + n]
            };
        }
    }
}
