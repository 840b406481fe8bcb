//! The LayerPlan: what every layer computes, with its weights. Executors (CPU, ANE lowering)
//! dispatch on these enums, never on weight shapes or file formats; family quirks (GGUF's stored
//! `1 + w`, permuted Q/K rows, transposed GPT-2 weights) are resolved by the loaders.

use crate::weight::Weight;

/// A normalisation with its (already effective) weight: `y = norm(x) * weight (+ bias)`.
/// Gemma's `(1 + w)` is folded into `weight` at load time.
#[derive(Debug)]
pub struct Norm {
    pub kind: NormKind,
    pub eps: f32,
    pub weight: Vec<f32>,
    pub bias: Option<Vec<f32>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormKind {
    /// `x / sqrt(mean(x²) + eps)`
    Rms,
    /// `(x - mean) / sqrt(var + eps)`
    Layer,
}

/// `y = x W^T (+ b)`.
#[derive(Debug)]
pub struct Linear {
    pub weight: Weight,
    pub bias: Option<Vec<f32>>,
}

impl Linear {
    pub fn out_features(&self) -> usize {
        self.weight.rows
    }
    pub fn in_features(&self) -> usize {
        self.weight.cols
    }
}

/// Which elements of a head RoPE rotates together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopePairing {
    /// `(i, i + d/2)`: HF "rotate_half", llama.cpp NEOX.
    HalfSplit,
    /// `(2i, 2i + 1)`: llama.cpp's normal mode, used by GGUF llama files whose Q/K rows were permuted.
    Adjacent,
}

/// Rotary position embedding of the first `dims` elements of each head.
#[derive(Clone, Debug)]
pub struct Rope {
    pub dims: usize,
    pub pairing: RopePairing,
    /// One inverse frequency per rotated pair (`dims / 2`), scaling already applied.
    pub inv_freq: Vec<f32>,
    /// Multiplier of cos/sin (YaRN's attention factor; 1 otherwise).
    pub mscale: f32,
}

impl Rope {
    /// `theta^(-2i/dims)` for `i < dims/2`, computed as transformers does (f32 powers of the
    /// integer exponents).
    pub fn plain_inv_freq(theta: f64, dims: usize) -> Vec<f32> {
        (0..dims / 2)
            .map(|i| (1.0 / theta.powf((2 * i) as f64 / dims as f64)) as f32)
            .collect()
    }

    /// cos and sin of the angle `pos * inv_freq[i]` for every pair.
    pub fn angles(&self, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
        for (i, &f) in self.inv_freq.iter().enumerate() {
            let a = pos as f32 * f;
            cos[i] = a.cos() * self.mscale;
            sin[i] = a.sin() * self.mscale;
        }
    }
}

/// Softmax attention over a KV cache.
#[derive(Debug)]
pub struct Attention {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Multiplier of `q·k` (usually `head_dim^-0.5`).
    pub scale: f32,
    /// Sliding window: each query sees this many keys including itself.
    pub window: Option<usize>,
    /// `s = cap * tanh(s / cap)` on the scaled scores, before the mask (Gemma 2).
    pub softcap: Option<f32>,
    pub rope: Option<Rope>,
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    /// Per-head norms of q and k after projection, before RoPE (Qwen3, Gemma 3).
    pub q_norm: Option<Norm>,
    pub k_norm: Option<Norm>,
    /// Output gate (Qwen3-Next, Qwen3.5): `o_proj(attn * sigmoid(x W_g^T))`, `W_g` with one row
    /// per query-head element.
    pub output_gate: Option<Linear>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Silu,
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x³)))`
    GeluTanh,
}

/// A gated MLP `down(act(gate(x)) * up(x))`: one expert of a mixture, or a shared expert.
#[derive(Debug)]
pub struct GatedMlp {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

#[derive(Debug)]
pub enum Ffn {
    /// `down(act(gate(x)) * up(x))`: SwiGLU, GeGLU.
    Gated {
        act: Activation,
        gate: Linear,
        up: Linear,
        down: Linear,
    },
    /// `down(act(up(x)))`: GPT-2's MLP.
    Plain {
        act: Activation,
        up: Linear,
        down: Linear,
    },
    /// A mixture of experts (ARCHITECTURES.md §3).
    Moe(Moe),
}

/// Per token: `p = softmax(x W_r^T)` over all experts (f32), the `top_k` most probable experts
/// run, their outputs weighted by `p` (renormalised to sum 1 when `norm_top_k`), plus an optional
/// shared expert scaled by `sigmoid(x · w_sg)`.
#[derive(Debug)]
pub struct Moe {
    pub act: Activation,
    /// `[n_experts, hidden]`.
    pub router: Weight,
    pub experts: Vec<GatedMlp>,
    pub top_k: usize,
    pub norm_top_k: bool,
    pub shared: Option<SharedExpert>,
}

#[derive(Debug)]
pub struct SharedExpert {
    pub mlp: GatedMlp,
    /// `[1, hidden]`: the shared expert's output is scaled by `sigmoid(x · gate)`.
    pub gate: Option<Weight>,
}

impl Ffn {
    /// Width of the hidden activation (the widest expert for a mixture).
    pub fn hidden_features(&self) -> usize {
        match self {
            Ffn::Gated { up, .. } | Ffn::Plain { up, .. } => up.out_features(),
            Ffn::Moe(m) => {
                let e = m
                    .experts
                    .iter()
                    .map(|e| e.up.out_features())
                    .max()
                    .unwrap_or(0);
                e.max(m.shared.as_ref().map_or(0, |s| s.mlp.up.out_features()))
            }
        }
    }
}

/// Which key head serves value head `h` in a gated DeltaNet with `r = n_v / n_k`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyHeadMap {
    /// `h / r` (transformers' repeat_interleave; Qwen3-Next GGUF).
    Grouped,
    /// `h % n_k` (Qwen3.5 GGUF, whose value heads are stored tiled).
    Tiled,
}

/// Gated DeltaNet linear attention (ARCHITECTURES.md §4.4). Per token: project `q | k | v`
/// (flat), causal depthwise conv over the last `conv_kernel` inputs then SiLU, L2-normalise q and
/// k (q also × dk^-0.5), decay the per-value-head state `S` by `exp(g)` with
/// `g = neg_a * softplus(a + dt_bias)`, delta-rule update with `beta = sigmoid(b)`, read
/// `o = S^T q`, gated RMSNorm `norm(o) * silu(z)`, then `out`.
#[derive(Debug)]
pub struct DeltaNet {
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    pub conv_kernel: usize,
    pub key_head_of: KeyHeadMap,
    /// `[2 * n_k * dk + n_v * dv, hidden]`, rows `q | k | v`.
    pub qkv: Linear,
    /// `[n_v * dv, hidden]`.
    pub z: Linear,
    /// `[n_v, hidden]`: `beta = sigmoid(x b^T)`.
    pub b: Linear,
    /// `[n_v, hidden]`: the decay's input.
    pub a: Linear,
    /// Depthwise conv weights `[channels][conv_kernel]`; the last tap multiplies the current token.
    pub conv: Vec<f32>,
    /// `-exp(A_log)` per value head.
    pub neg_a: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// Plain-weight RMSNorm over `dv`, shared by all value heads.
    pub norm: Norm,
    /// `[hidden, n_v * dv]`.
    pub out: Linear,
}

impl DeltaNet {
    /// Channels of the conv: `2 * n_k * dk + n_v * dv`.
    pub fn conv_channels(&self) -> usize {
        2 * self.n_k_heads * self.k_dim + self.n_v_heads * self.v_dim
    }

    /// The key head serving value head `h`.
    pub fn key_head(&self, h: usize) -> usize {
        match self.key_head_of {
            KeyHeadMap::Grouped => h / (self.n_v_heads / self.n_k_heads),
            KeyHeadMap::Tiled => h % self.n_k_heads,
        }
    }
}

/// LFM2's gated short convolution: `B | C | x = in_proj(x)`, then per channel a causal depthwise
/// conv of `B * x` over the last `kernel` tokens, times `C`, then `out`. Its state is the last
/// `kernel - 1` values of `B * x` per channel.
#[derive(Debug)]
pub struct ShortConv {
    pub kernel: usize,
    /// `[3 * hidden, hidden]`, rows `B | C | x`.
    pub in_proj: Linear,
    /// Depthwise conv weights `[hidden][kernel]`; the last tap multiplies the current token.
    pub conv: Vec<f32>,
    pub conv_bias: Option<Vec<f32>>,
    pub out: Linear,
}

#[derive(Debug)]
pub enum Mixer {
    Attention(Attention),
    DeltaNet(DeltaNet),
    ShortConv(ShortConv),
}

impl Mixer {
    /// Every linear layer of the mixer.
    pub fn linears(&self) -> Vec<&Linear> {
        match self {
            Mixer::Attention(a) => {
                let mut v = vec![&a.q, &a.k, &a.v, &a.o];
                v.extend(a.output_gate.as_ref());
                v
            }
            Mixer::DeltaNet(d) => vec![&d.qkv, &d.z, &d.b, &d.a, &d.out],
            Mixer::ShortConv(c) => vec![&c.in_proj, &c.out],
        }
    }
}

/// One transformer block: `h = x + post_attn(mixer(attn_norm(x)))`,
/// `out = h + post_ffn(ffn(ffn_norm(h)))`; the post norms exist only in sandwich-norm models.
#[derive(Debug)]
pub struct Layer {
    pub attn_norm: Norm,
    pub mixer: Mixer,
    pub post_attn_norm: Option<Norm>,
    pub ffn_norm: Norm,
    pub ffn: Ffn,
    pub post_ffn_norm: Option<Norm>,
}

impl Layer {
    /// The softmax attention of this layer, if it has one.
    pub fn attention(&self) -> Option<&Attention> {
        match &self.mixer {
            Mixer::Attention(a) => Some(a),
            Mixer::DeltaNet(_) | Mixer::ShortConv(_) => None,
        }
    }
}
