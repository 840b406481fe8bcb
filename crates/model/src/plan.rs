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
        (0..dims / 2).map(|i| (1.0 / theta.powf((2 * i) as f64 / dims as f64)) as f32).collect()
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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Silu,
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x³)))`
    GeluTanh,
}

#[derive(Debug)]
pub enum Ffn {
    /// `down(act(gate(x)) * up(x))`: SwiGLU, GeGLU.
    Gated { act: Activation, gate: Linear, up: Linear, down: Linear },
    /// `down(act(up(x)))`: GPT-2's MLP.
    Plain { act: Activation, up: Linear, down: Linear },
}

impl Ffn {
    pub fn hidden_features(&self) -> usize {
        match self {
            Ffn::Gated { up, .. } | Ffn::Plain { up, .. } => up.out_features(),
        }
    }
}

#[derive(Debug)]
pub enum Mixer {
    Attention(Attention),
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
    pub fn attention(&self) -> &Attention {
        match &self.mixer {
            Mixer::Attention(a) => a,
        }
    }
}
