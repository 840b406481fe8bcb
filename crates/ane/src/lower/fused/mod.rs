//! The fused strategy: consecutive whole layers in one program ("chunk") — norms, QKV (with
//! biases), QK-norm, RoPE from cos/sin inputs, grouped-query attention written out (matmul,
//! additive mask input, softmax with the maximum subtracted), O, the FFN (a mixture with every
//! expert dense: [`moe`]), residuals — or LFM2's short conv in place of attention
//! ([`shortconv`]) — with the final norm and the tiled lm_head in the last chunk; a mixture
//! over the per-program ceiling is split by experts across chunks ([`segment`]). Each chunk has
//! two functions sharing its weights: [`PREFILL`] (`width` columns) and [`DECODE`] (one column),
//! and with [`LoweringOptions::decode_batch`] > 1 a third, [`BATCH`]: one decode step of that
//! many sequences, column `j` over slot `j`'s own cache inputs (`k{l}_s{j}`, `conv{l}_s{j}`,
//! `s{l}_s{j}`), op for op what [`DECODE`] does for each — so every weight is read once for
//! all of them.
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

mod consts;
mod delta_chunks;
mod deltanet;
mod graph;
mod moe;
mod segment;
mod shortconv;

pub use segment::{ChunkSpec, ExpertSlice};

use anelm_mil::{FunctionBuilder, Program, TensorType};
use anelm_model::plan::{Ffn, Mixer, Rope};
use anelm_model::Model;

use super::encode::WeightTarget;
use super::graph::{linear, normalize};
use super::weights::row_range;
use super::{LoweringOptions, WeightPolicy};
use crate::error::{AneError, Result};
use crate::support::ensure_fusable;
use crate::unit::CompileUnit;
use consts::{LayerConsts, LinearConst, NormConst, ResumeConsts};
use graph::ChunkGraph;

/// The function of a chunk that processes up to `width` tokens.
pub const PREFILL: &str = "prefill";
/// The function of a chunk that processes one token.
pub const DECODE: &str = "decode";
/// The function of a chunk that processes one token of each of several sequences.
pub const BATCH: &str = "batch";
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
    /// Columns (sequences) of the [`BATCH`] functions; ≤ 1: none.
    pub decode_batch: usize,
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

/// Segments `model` into chunks ([`segment`]) and gathers the tables they take.
pub fn fused_plan(model: &Model, opts: &LoweringOptions) -> Result<FusedPlan> {
    ensure_fusable(model)?;
    let chunks = segment::segment(model, opts)?;
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
        decode_batch: opts.decode_batch,
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
    /// More experts of a mixture an earlier chunk began.
    resume: Option<(usize, ResumeConsts)>,
    layers: Vec<(usize, LayerConsts)>,
    /// Whether the last layer's mixture continues in the next chunk (`hm` goes out).
    cut: bool,
    head: Option<(NormConst, Vec<LinearConst>)>,
}

impl ChunkConsts {
    /// What became of each weight tensor, in program order.
    fn reports(&self) -> Vec<super::TensorReport> {
        let resume = self.resume.iter().flat_map(|(_, r)| r.linears());
        let layers = resume.chain(self.layers.iter().flat_map(|(_, c)| c.linears()));
        let head = self.head.iter().flat_map(|(_, tiles)| tiles.iter());
        layers
            .chain(head)
            .flat_map(|c| c.w.reports.iter().cloned())
            .collect()
    }
}

/// Builds function `name` of `w` columns; `slots` > 0: the [`BATCH`] function (`w == slots`).
fn build_function(
    model: &Model,
    plan: &FusedPlan,
    consts: &ChunkConsts,
    name: &str,
    (w, slots): (usize, usize),
    form: KvForm,
) -> Result<anelm_mil::Function> {
    let h = model.config.hidden_size;
    let mut g = ChunkGraph {
        f: FunctionBuilder::new(name, plan.dialect.opset()),
        model,
        plan,
        w,
        slots,
        form,
        inputs: Vec::new(),
    };
    // Per-sequence inputs: `name`, or one per slot in the batch function.
    let per_seq = |name: String| -> Vec<String> {
        if slots == 0 {
            vec![name]
        } else {
            (0..slots).map(|j| format!("{name}_s{j}")).collect()
        }
    };
    // Inputs first (MIL declares them before any op): the hidden state, tables, masks, caches.
    g.declare("x", TensorType::fp16([1, h, 1, w]), false)?;
    for (li, _) in &consts.layers {
        match &model.layers[*li].mixer {
            Mixer::ShortConv(c) => {
                let hist = c.kernel - 1;
                for n in per_seq(format!("conv{li}")) {
                    g.declare(&n, TensorType::fp16([1, h, 1, hist]), false)?;
                }
                continue;
            }
            Mixer::DeltaNet(d) => {
                let (ch, hist) = (d.conv_channels(), d.conv_kernel - 1);
                let s = d.n_v_heads * d.k_dim * d.v_dim;
                for n in per_seq(format!("conv{li}")) {
                    g.declare(&n, TensorType::fp16([1, ch, 1, hist]), false)?;
                }
                for n in per_seq(format!("s{li}")) {
                    g.declare(&n, TensorType::fp16([1, s, 1, 1]), false)?;
                }
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
                KvForm::Inputs => {
                    for n in per_seq(format!("{kind}{li}")) {
                        g.declare(&n, TensorType::fp16([1, kvd, 1, plan.context]), false)?;
                    }
                }
                KvForm::States => g.declare(
                    &format!("{kind}{li}"),
                    TensorType::fp16([1, kvd, 1, plan.context + plan.width]),
                    true,
                )?,
            }
        }
    }
    // A split mixture's pre-FFN residual, from the chunk that began it.
    if consts.resume.is_some() {
        g.declare("hm", TensorType::fp16([1, h, 1, w]), false)?;
    }
    // A mixture's forced choices (the host's f32 settling of router near-ties).
    let resumed = consts.resume.iter().map(|(li, _)| li);
    for li in resumed.chain(consts.layers.iter().map(|(li, _)| li)) {
        if let Ffn::Moe(m) = &model.layers[*li].ffn {
            let e = m.experts.len();
            g.declare(&format!("route{li}"), TensorType::fp16([1, e, 1, w]), false)?;
        }
    }
    // Which columns hold tokens (1) and which are padding (0): a DeltaNet's padding must leave
    // its state alone.
    let recurrent =
        (consts.layers.iter()).any(|(li, _)| matches!(model.layers[*li].mixer, Mixer::DeltaNet(_)));
    if recurrent && w > 1 && slots == 0 {
        g.declare("live", TensorType::fp16([1, 1, 1, w]), false)?;
    }
    let attends = (consts.layers.iter()).any(|(li, _)| model.layers[*li].attention().is_some());
    if form == KvForm::States && attends {
        g.declare("kv_begin", TensorType::int32([4]), false)?;
        g.declare("kv_end", TensorType::int32([4]), false)?;
    }
    let mut x = g.input("x")?;
    if let Some((li, r)) = &consts.resume {
        let hm = g.input("hm")?;
        x = g.ffn_onto(*li, hm, x, &r.ffn_norm, &r.ffn, None)?;
    }
    let last = consts.layers.last().map(|(li, _)| *li);
    for (li, c) in &consts.layers {
        x = match &model.layers[*li].mixer {
            Mixer::ShortConv(_) => g.short_conv(*li, x, c)?,
            Mixer::DeltaNet(_) => g.delta_net(*li, x, c)?,
            Mixer::Attention(_) => g.attention(*li, x, c)?,
        };
        if consts.cut && Some(*li) == last {
            // The next chunk adds the rest of this mixture onto the same residual.
            let hm = g.f.name_next("hm").identity(x)?;
            g.f.output(hm)?;
        }
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
    let target = plan.weight_target();
    let layers = spec
        .layers
        .clone()
        .map(|i| {
            let experts = (spec.cut.as_ref())
                .filter(|c| c.layer == i)
                .map(|c| c.experts.clone());
            Ok((
                i,
                LayerConsts::new(&model.layers[i], i, shift, target, experts)?,
            ))
        })
        .collect::<Result<_>>()?;
    let resume = (spec.resume.as_ref())
        .map(|r| -> Result<_> {
            let l = &model.layers[r.layer];
            let c = ResumeConsts::new(l, r.layer, shift, target, r.experts.clone())?;
            Ok((r.layer, c))
        })
        .transpose()?;
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
    let consts = ChunkConsts {
        resume,
        layers,
        cut: spec.cut.is_some(),
        head,
    };
    let mut program = Program::new(plan.dialect.mil());
    let mut functions = vec![(PREFILL, (plan.width, 0)), (DECODE, (1, 0))];
    if plan.decode_batch > 1 {
        if form == KvForm::States {
            return Err(AneError::Unsupported(format!(
                "{}: a batch function needs the KV cache as inputs (the private path); Core ML \
                 states hold one sequence",
                spec.name
            )));
        }
        functions.push((BATCH, (plan.decode_batch, plan.decode_batch)));
    }
    for (name, shape) in functions {
        program.add_function(build_function(model, plan, &consts, name, shape, form)?)?;
    }
    Ok(CompileUnit::new(&spec.name, program)?.with_weight_reports(consts.reports()))
}
