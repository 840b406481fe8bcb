//! The fused strategy: consecutive whole layers in one program ("chunk") — norms, QKV (with
//! biases), QK-norm, RoPE from cos/sin inputs, grouped-query attention written out (matmul,
//! additive mask input, softmax with the maximum subtracted), O, the FFN (a mixture with every
//! expert dense: [`moe`]), residuals — or LFM2's short conv in place of attention
//! ([`shortconv`]) — with the final norm and the tiled lm_head in the last chunk. Each chunk has two functions sharing
//! its weights: [`PREFILL`] (`width` columns) and [`DECODE`] (one column).
//!
//! The KV cache enters a chunk as inputs `k{l}`/`v{l}` (`[1, kv_dim, 1, context]`, positions
//! as columns) that the engine keeps bound between steps; the new tokens' keys and values come
//! out as `k{l}_new`/`v{l}_new` and the engine writes them into those buffers ([`KvForm::Inputs`],
//! the private path). Attention runs over the cache and the new tokens side by side, the mask
//! saying which of them each query sees (causal, sliding window, filled length) — so no
//! position input is needed. For Core ML packages the cache is instead a state written in the
//! graph at the `kv_begin`/`kv_end` position inputs ([`KvForm::States`]; its mask spans the
//! state, `context + width` positions, in both functions).
//!
//! fp16 safety: the residual stream is held as `x · 2^-residual_shift` (Gemma 3's reaches 1e5,
//! beyond fp16); norms are scale-invariant, so only the layer outputs and the sandwich norms'
//! weights carry the shift. Every norm first divides its input by its largest magnitude (no
//! square overflows), and every conv or matmul input is normalised per column
//! ([`super::graph::normalize`]) so partial sums stay below 2^15 and products above the flush
//! threshold.

use std::ops::Range;

mod consts;
mod delta_chunks;
mod deltanet;
mod graph;
mod moe;
mod shortconv;

use anelm_mil::{FunctionBuilder, Program, TensorType};
use anelm_model::plan::{Ffn, Layer, Linear, Mixer, Rope};
use anelm_model::Model;

use super::encode::WeightTarget;
use super::graph::{linear, normalize};
use super::weights::row_range;
use super::{LoweringOptions, WeightPolicy};
use crate::error::{AneError, Result};
use crate::support::ensure_fusable;
use crate::unit::CompileUnit;
use consts::{LayerConsts, LinearConst, NormConst};
use graph::ChunkGraph;

/// The function of a chunk that processes up to `width` tokens.
pub const PREFILL: &str = "prefill";
/// The function of a chunk that processes one token.
pub const DECODE: &str = "decode";
/// A masked-out attention score (finite in fp16; `exp` of it is 0).
pub const MASKED: f32 = -30000.0;

/// Where the KV cache lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvForm {
    /// Inputs bound by the engine; the new keys and values are outputs.
    Inputs,
    /// Core ML states written in the graph at a position given as input.
    States,
}

/// Consecutive layers compiled as one program.
#[derive(Clone, Debug, PartialEq)]
pub struct ChunkSpec {
    pub name: String,
    pub layers: Range<usize>,
    /// Whether the final norm and the lm_head are in this chunk (the last one).
    pub head: bool,
    /// fp16 weight bytes.
    pub weight_bytes: u64,
}

/// The chunks of a model and the tables they take as inputs.
#[derive(Clone, Debug)]
pub struct FusedPlan {
    pub chunks: Vec<ChunkSpec>,
    /// Distinct RoPE settings; a layer's index into it, if it rotates.
    pub ropes: Vec<Rope>,
    pub layer_rope: Vec<Option<usize>>,
    /// Distinct attention windows (None: global); a layer's index into it.
    pub windows: Vec<Option<usize>>,
    pub layer_window: Vec<usize>,
    /// Cached positions every chunk holds.
    pub context: usize,
    /// Columns of the prefill functions.
    pub width: usize,
    /// Tokens per sub-chunk of a DeltaNet's chunked form in the prefill functions.
    pub delta_chunk: usize,
    /// The residual stream is held times `2^-residual_shift`.
    pub residual_shift: i32,
    /// Vocabulary tiles of the head: (first row, rows).
    pub head_tiles: Vec<(usize, usize)>,
    /// How weight matrices are held.
    pub weights: WeightPolicy,
    /// The MIL dialect of every chunk.
    pub dialect: crate::dialect::MilDialect,
    /// Ops written another way ([`super::Alternatives`]).
    pub alternatives: super::Alternatives,
    /// The integer weight forms the machine takes.
    pub weight_forms: super::Forms,
}

impl FusedPlan {
    /// The weight policy in the plan's dialect.
    pub fn weight_target(&self) -> WeightTarget {
        WeightTarget {
            policy: self.weights,
            dialect: self.dialect,
            forms: self.weight_forms,
        }
    }

    /// Device evaluations per decoded token.
    pub fn dispatches_per_token(&self) -> usize {
        self.chunks.len()
    }
}

fn linear_bytes(l: &Linear) -> u64 {
    (l.out_features() * l.in_features() * 2) as u64
}

fn layer_bytes(l: &Layer, index: usize) -> Result<u64> {
    let mixer: u64 = l.mixer.linears().into_iter().map(linear_bytes).sum();
    let ffn = match &l.ffn {
        Ffn::Gated { gate, up, down, .. } => {
            linear_bytes(gate) + linear_bytes(up) + linear_bytes(down)
        }
        Ffn::Plain { up, down, .. } => linear_bytes(up) + linear_bytes(down),
        Ffn::Moe(m) => moe::moe_bytes(m, index)?,
    };
    Ok(mixer + ffn)
}

/// Segments `model` into chunks under both ceilings (layers and weight bytes per program),
/// balanced in layers; the head joins the last chunk if it fits, else gets its own.
pub fn fused_plan(model: &Model, opts: &LoweringOptions) -> Result<FusedPlan> {
    ensure_fusable(model)?;
    let n = model.n_layers();
    let bytes = (model.layers.iter().enumerate())
        .map(|(i, l)| layer_bytes(l, i))
        .collect::<Result<Vec<u64>>>()?;
    if let Some((i, b)) = bytes
        .iter()
        .enumerate()
        .find(|(_, &b)| b > opts.chunk_bytes)
    {
        return Err(AneError::Unsupported(format!(
            "layer {i} holds {b} bytes of fp16 weights, more than one program's {}",
            opts.chunk_bytes
        )));
    }
    let total: u64 = bytes.iter().sum();
    let n_chunks = n
        .div_ceil(opts.chunk_layers.max(1))
        .max(total.div_ceil(opts.chunk_bytes.max(1)) as usize)
        .max(1);
    let per_chunk = n.div_ceil(n_chunks).max(1);
    let mut ranges: Vec<(Range<usize>, u64)> = Vec::new();
    for (i, &b) in bytes.iter().enumerate() {
        match ranges.last_mut() {
            Some((r, rb)) if r.len() < per_chunk && *rb + b <= opts.chunk_bytes => {
                r.end = i + 1;
                *rb += b;
            }
            _ => ranges.push((i..i + 1, b)),
        }
    }
    let head_bytes = (model.lm_head.rows * model.lm_head.cols * 2) as u64;
    if ranges
        .last()
        .is_none_or(|(_, b)| b + head_bytes > opts.chunk_bytes)
    {
        ranges.push((n..n, 0));
    }
    let last = ranges.len() - 1;
    let chunks = ranges
        .into_iter()
        .enumerate()
        .map(|(c, (layers, b))| ChunkSpec {
            name: format!("chunk{c}"),
            layers,
            head: c == last,
            weight_bytes: b + if c == last { head_bytes } else { 0 },
        })
        .collect();

    let mut ropes: Vec<Rope> = Vec::new();
    let mut windows: Vec<Option<usize>> = Vec::new();
    let (mut layer_rope, mut layer_window) = (Vec::new(), Vec::new());
    for l in &model.layers {
        // A short conv has no RoPE and no mask (window index 0, never declared).
        let Some(a) = l.attention() else {
            layer_rope.push(None);
            layer_window.push(0);
            continue;
        };
        layer_rope.push(a.rope.as_ref().map(|r| {
            match ropes
                .iter()
                .position(|s| s.dims == r.dims && s.inv_freq == r.inv_freq && s.mscale == r.mscale)
            {
                Some(i) => i,
                None => {
                    ropes.push(r.clone());
                    ropes.len() - 1
                }
            }
        }));
        layer_window.push(match windows.iter().position(|w| *w == a.window) {
            Some(i) => i,
            None => {
                windows.push(a.window);
                windows.len() - 1
            }
        });
    }
    let vocab = model.lm_head.rows;
    let tile = opts.head_tile_rows.max(1);
    let head_tiles = (0..vocab)
        .step_by(tile)
        .map(|r| (r, tile.min(vocab - r)))
        .collect();
    Ok(FusedPlan {
        chunks,
        ropes,
        layer_rope,
        windows,
        layer_window,
        context: opts.context,
        width: opts.width,
        delta_chunk: opts.delta_chunk.max(1),
        residual_shift: opts.residual_shift,
        head_tiles,
        weights: opts.weights,
        dialect: opts.dialect,
        alternatives: opts.alternatives.clone(),
        weight_forms: opts.weight_forms,
    })
}

/// The weights of one chunk, shared by its two functions.
struct ChunkConsts {
    layers: Vec<(usize, LayerConsts)>,
    head: Option<(NormConst, Vec<LinearConst>)>,
}

impl ChunkConsts {
    /// What became of each weight tensor, in program order.
    fn reports(&self) -> Vec<super::TensorReport> {
        let layers = self.layers.iter().flat_map(|(_, c)| c.linears());
        let head = self.head.iter().flat_map(|(_, tiles)| tiles.iter());
        layers
            .chain(head)
            .flat_map(|c| c.w.reports.iter().cloned())
            .collect()
    }
}

fn build_function(
    model: &Model,
    plan: &FusedPlan,
    consts: &ChunkConsts,
    name: &str,
    w: usize,
    form: KvForm,
) -> Result<anelm_mil::Function> {
    let h = model.config.hidden_size;
    let mut g = ChunkGraph {
        f: FunctionBuilder::new(name, plan.dialect.opset()),
        model,
        plan,
        w,
        form,
        inputs: Vec::new(),
    };
    // Inputs first (MIL declares them before any op): the hidden state, tables, masks, caches.
    g.declare("x", TensorType::fp16([1, h, 1, w]), false)?;
    for (li, _) in &consts.layers {
        match &model.layers[*li].mixer {
            Mixer::ShortConv(c) => {
                let hist = c.kernel - 1;
                g.declare(
                    &format!("conv{li}"),
                    TensorType::fp16([1, h, 1, hist]),
                    false,
                )?;
                continue;
            }
            Mixer::DeltaNet(d) => {
                let (ch, hist) = (d.conv_channels(), d.conv_kernel - 1);
                let s = d.n_v_heads * d.k_dim * d.v_dim;
                g.declare(
                    &format!("conv{li}"),
                    TensorType::fp16([1, ch, 1, hist]),
                    false,
                )?;
                g.declare(&format!("s{li}"), TensorType::fp16([1, s, 1, 1]), false)?;
                continue;
            }
            Mixer::Attention(_) => {}
        }
        if let Some(r) = plan.layer_rope[*li] {
            let d2 = plan.ropes[r].dims / 2;
            g.declare(&format!("cos{r}"), TensorType::fp16([1, d2, 1, w]), false)?;
            g.declare(&format!("sin{r}"), TensorType::fp16([1, d2, 1, w]), false)?;
        }
        let kv_len = g.kv_len();
        g.declare(
            &format!("mask{}", plan.layer_window[*li]),
            TensorType::fp16([1, w, 1, kv_len]),
            false,
        )?;
    }
    for (li, _) in &consts.layers {
        let Some(a) = model.layers[*li].attention() else {
            continue;
        };
        let kvd = a.n_kv_heads * a.head_dim;
        for kind in ["k", "v"] {
            match form {
                KvForm::Inputs => g.declare(
                    &format!("{kind}{li}"),
                    TensorType::fp16([1, kvd, 1, plan.context]),
                    false,
                )?,
                KvForm::States => g.declare(
                    &format!("{kind}{li}"),
                    TensorType::fp16([1, kvd, 1, plan.context + plan.width]),
                    true,
                )?,
            }
        }
    }
    // A mixture's forced choices (the host's f32 settling of router near-ties).
    for (li, _) in &consts.layers {
        if let Ffn::Moe(m) = &model.layers[*li].ffn {
            let e = m.experts.len();
            g.declare(&format!("route{li}"), TensorType::fp16([1, e, 1, w]), false)?;
        }
    }
    // Which columns hold tokens (1) and which are padding (0): a DeltaNet's padding must leave
    // its state alone.
    let recurrent =
        (consts.layers.iter()).any(|(li, _)| matches!(model.layers[*li].mixer, Mixer::DeltaNet(_)));
    if recurrent && w > 1 {
        g.declare("live", TensorType::fp16([1, 1, 1, w]), false)?;
    }
    let attends = (consts.layers.iter()).any(|(li, _)| model.layers[*li].attention().is_some());
    if form == KvForm::States && attends {
        g.declare("kv_begin", TensorType::int32([4]), false)?;
        g.declare("kv_end", TensorType::int32([4]), false)?;
    }
    let mut x = g.input("x")?;
    for (li, c) in &consts.layers {
        x = match &model.layers[*li].mixer {
            Mixer::ShortConv(_) => g.short_conv(*li, x, c)?,
            Mixer::DeltaNet(_) => g.delta_net(*li, x, c)?,
            Mixer::Attention(_) => g.attention(*li, x, c)?,
        };
        x = g.ffn(*li, x, c)?;
    }
    match &consts.head {
        None => {
            g.f.rename(x, "y")?;
            g.f.output(x)?;
        }
        Some((norm, tiles)) => {
            let xf = g.norm("final_norm", x, 1, h, vec![1, h, 1, 1], norm)?;
            g.f.rename(xf, "xf")?;
            g.f.output(xf)?;
            let l1 = tiles.iter().map(|t| t.l1).fold(0.0, f32::max);
            let (xs, back) = normalize(&mut g.f, "head", xf, &[1], l1, 1.0, &plan.alternatives)?;
            for (t, c) in tiles.iter().enumerate() {
                let y = linear(&mut g.f, &format!("logits{t}"), xs, Some(back), &c.w, None)?;
                g.f.output(y)?;
            }
        }
    }
    Ok(g.f.finish()?)
}

/// The program of chunk `index` of `plan`: functions [`PREFILL`] and [`DECODE`] sharing weights.
pub fn build_chunk(
    model: &Model,
    plan: &FusedPlan,
    index: usize,
    form: KvForm,
) -> Result<CompileUnit> {
    let spec = plan
        .chunks
        .get(index)
        .ok_or_else(|| AneError::Unsupported(format!("no chunk {index}")))?;
    if form == KvForm::States && !plan.dialect.has_states_and_multifunction() {
        return Err(AneError::Unsupported(format!(
            "{}: Core ML states need iOS18 (dialect A); in dialect {} the KV cache is inputs and outputs",
            spec.name, plan.dialect
        )));
    }
    let shift = 2f32.powi(-plan.residual_shift);
    let layers = spec
        .layers
        .clone()
        .map(|i| {
            Ok((
                i,
                LayerConsts::new(&model.layers[i], i, shift, plan.weight_target())?,
            ))
        })
        .collect::<Result<_>>()?;
    let head = if spec.head {
        let tiles = plan
            .head_tiles
            .iter()
            .map(|&(first, rows)| {
                Ok(LinearConst::of(
                    row_range(&model.lm_head, first, rows, plan.weight_target())?,
                    None,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        Some((NormConst::new(&model.final_norm, 1.0, shift, None), tiles))
    } else {
        None
    };
    let consts = ChunkConsts { layers, head };
    let mut program = Program::new(plan.dialect.mil());
    for (name, w) in [(PREFILL, plan.width), (DECODE, 1)] {
        program.add_function(build_function(model, plan, &consts, name, w, form)?)?;
    }
    Ok(CompileUnit::new(&spec.name, program)?.with_weight_reports(consts.reports()))
}
