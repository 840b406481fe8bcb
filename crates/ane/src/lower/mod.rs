//! Lowering: the LayerPlan as MIL programs, weights as fp16 or as the file's own integer blocks.
//!
//! The projection strategy (DESIGN.md): every linear layer is a 1×1 convolution over
//! `[1, C, 1, W]` fp16 activations of a fixed width `W` (one column per token; prefill fills up
//! to `W`, decode one), per layer one fused QKV kernel (biases added after the conv: a conv
//! `bias` fails to compile, FACTS §1.5), one O kernel and one fused FFN kernel (SwiGLU, GeGLU,
//! GELU-tanh MLP, from ops that compile: conv, sigmoid, mul, add — no `gelu`), and the lm_head
//! tiled along the vocabulary. Norms, RoPE, attention and sampling stay on the CPU, so GGUF
//! llama's adjacent-pair RoPE needs nothing here.
//!
//! fp16 range: the ANE flushes products below 2^-14 to zero and returns 0 when a partial sum
//! reaches 2^15 (FACTS §3.6b). Normed activations with a few huge channels (Gemma's residual
//! stream reaches 1e5) leave the other channels so small that their products are flushed. So
//! every kernel takes its input pre-multiplied per token by a power of two `2^s`, chosen on the
//! CPU so that `max|x| · 2^s · (largest row L1 norm of the weights reading x) ≤ 2^14` — partial
//! sums can then never reach 2^15, and products are as far from the flush threshold as that
//! allows — and a second input [`DESCALE`] `[1, 1, 1, W]` holding `2^-s` per column, which the
//! kernel multiplies into each such conv's output before any bias or activation. Powers of two
//! are exact in fp16 (outside the subnormal range), so the result is the unscaled projection.

pub mod alternatives;
pub mod encode;
pub mod fused;
mod graph;
mod projection;
mod weights;

pub use alternatives::Alternatives;
pub use encode::{Encoded, Encoding, Forms, TensorReport, WeightPolicy, WeightTarget};
pub use projection::{build_unit, projection_kernels, Lowered};

/// The name of every kernel's per-column descale input.
pub const DESCALE: &str = "descale";

/// The power of two `s` a token's input is multiplied by before a kernel, from the largest
/// magnitude in the token's input and the kernel's input bound (the largest row L1 norm of the
/// weights reading the input): the bound times `max_abs · 2^s` stays ≤ 2^14, as does
/// `max_abs · 2^s` itself. `2^-s` is representable in fp16 (`s` in -15..=24).
pub fn input_exponent(max_abs: f32, bound: f32) -> i32 {
    if !(max_abs > 0.0 && max_abs.is_finite()) {
        return 0;
    }
    let worst = max_abs as f64 * (bound as f64).max(1.0);
    ((16384.0 / worst).log2().floor() as i32).clamp(-15, 24)
}

/// Settings of the lowering.
#[derive(Clone, Debug, PartialEq)]
pub struct LoweringOptions {
    /// Columns (tokens) of every activation.
    pub width: usize,
    /// Most vocabulary rows per lm_head tile (FACTS §4: ALM/FG chunk the head at 16384).
    pub head_tile_rows: usize,
    /// Most fp16 weight bytes per lm_head program (tiles beyond it go to another program).
    pub head_program_bytes: usize,
    /// Fused strategy: positions of the KV cache every chunk holds.
    pub context: usize,
    /// Fused strategy: most layers per program (large graphs fail to compile without
    /// diagnostics, Espresso issue #18; this project's budget is 24).
    pub chunk_layers: usize,
    /// Fused strategy: most fp16 weight bytes per program (~1.5 GB is the largest reported
    /// compiling, ANEForge PR #45; FACTS §4).
    pub chunk_bytes: u64,
    /// Fused strategy: columns of the batch function, one sequence per column over its own KV
    /// cache and recurrent state (a decode step of that many conversations in one dispatch
    /// per chunk); 1: no batch function.
    pub decode_batch: usize,
    /// Fused strategy: tokens per sub-chunk of a gated DeltaNet's chunked prefill (its
    /// forward substitution is this many steps; transformers uses 64).
    pub delta_chunk: usize,
    /// Fused strategy: the residual stream is held times `2^-residual_shift` (Gemma 3's
    /// reaches 1e5, beyond fp16's 65504; SmolLM2's 2.3e4).
    pub residual_shift: i32,
    /// Where compiled programs are cached ([`crate::cache`]); None: compile every time.
    pub cache_dir: Option<std::path::PathBuf>,
    /// How weight matrices are held ([`encode`]).
    pub weights: WeightPolicy,
    /// The MIL dialect of every program ([`crate::dialect`]).
    pub dialect: crate::dialect::MilDialect,
    /// Ops written another way because this machine refused them ([`alternatives`]).
    pub alternatives: Alternatives,
    /// The integer weight forms the machine takes ([`encode::Forms`]).
    pub weight_forms: encode::Forms,
}

impl LoweringOptions {
    /// The weight policy in this dialect.
    pub fn weight_target(&self) -> encode::WeightTarget {
        encode::WeightTarget {
            policy: self.weights,
            dialect: self.dialect,
            forms: self.weight_forms,
        }
    }
}

impl Default for LoweringOptions {
    fn default() -> Self {
        LoweringOptions {
            width: 64,
            head_tile_rows: 16384,
            head_program_bytes: 512 << 20,
            context: 1024,
            chunk_layers: 24,
            chunk_bytes: 1_600_000_000,
            delta_chunk: 64,
            decode_batch: 1,
            residual_shift: 4,
            cache_dir: None,
            weights: WeightPolicy::Auto,
            dialect: crate::dialect::MilDialect::A,
            alternatives: Alternatives::default(),
            weight_forms: encode::Forms::all(),
        }
    }
}

/// What a projection kernel computes, by its place in the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Projection {
    /// The mixer's input projections stacked ([`crate::support::mixer_inputs`]): attention
    /// `[q; k; v (; gate)] = x [Wq; Wk; Wv (; Wg)]ᵀ (+ biases)`, DeltaNet `qkv | z | b | a`,
    /// short conv `B | C | x`.
    Qkv(usize),
    /// The mixer's output projection (attention `o`, DeltaNet and short conv `out`).
    O(usize),
    /// The whole FFN: `down(act(gate x) * up x)` or `down(act(up x))`.
    Ffn(usize),
    /// Expert `e`'s FFN of layer `i`, run on the tokens the host routed to it (the router runs
    /// in f32 on the host: [`crate::exec`]).
    Expert(usize, usize),
    /// The shared expert's FFN (ungated: the host applies `sigmoid` of the router's last row).
    Shared(usize),
    /// Logits from the final-normed hidden state (possibly several programs of tiles).
    Head,
}

/// One input or output of a kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Port {
    pub name: String,
    pub channels: usize,
    /// The first row of the projection's result this output holds (vocabulary offset of a
    /// head tile; 0 otherwise).
    pub first: usize,
}

/// One program of the projection strategy.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelSpec {
    /// Also the name of its files (`layer03_ffn`, `lm_head`).
    pub name: String,
    pub projection: Projection,
    pub input: Port,
    pub outputs: Vec<Port>,
    /// Rows of the whole projection's result (`q + 2 kv`, hidden, vocabulary).
    pub total_rows: usize,
}
