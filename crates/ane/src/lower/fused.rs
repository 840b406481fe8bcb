//! The fused strategy: consecutive whole layers in one program ("chunk") — norms, QKV (with
//! biases), QK-norm, RoPE from cos/sin inputs, grouped-query attention written out (matmul,
//! additive mask input, softmax with the maximum subtracted), O, the FFN, residuals — with the
//! final norm and the tiled lm_head in the last chunk. Each chunk has two functions sharing
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
use std::sync::Arc;

use anelm_mil::{DType, FunctionBuilder, Opset, Program, TensorType, ValueId, WeightData};
use anelm_model::plan::{Attention, Ffn, Layer, Linear, Norm, NormKind, Rope, RopePairing};
use anelm_model::{Model, Weight};

use super::graph::{activate, linear, max_row_l1, normalize};
use super::weights::{bias_data, linear_biases, row_range, stacked, stacked_bias};
use super::LoweringOptions;
use crate::error::{AneError, Result};
use crate::unit::CompileUnit;

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
    /// The residual stream is held times `2^-residual_shift`.
    pub residual_shift: i32,
    /// Vocabulary tiles of the head: (first row, rows).
    pub head_tiles: Vec<(usize, usize)>,
}

impl FusedPlan {
    /// Device evaluations per decoded token.
    pub fn dispatches_per_token(&self) -> usize {
        self.chunks.len()
    }
}

fn linear_bytes(l: &Linear) -> u64 {
    (l.out_features() * l.in_features() * 2) as u64
}

fn layer_bytes(l: &Layer) -> u64 {
    let a = l.attention();
    let ffn = match &l.ffn {
        Ffn::Gated { gate, up, down, .. } => {
            linear_bytes(gate) + linear_bytes(up) + linear_bytes(down)
        }
        Ffn::Plain { up, down, .. } => linear_bytes(up) + linear_bytes(down),
    };
    linear_bytes(&a.q) + linear_bytes(&a.k) + linear_bytes(&a.v) + linear_bytes(&a.o) + ffn
}

/// Segments `model` into chunks under both ceilings (layers and weight bytes per program),
/// balanced in layers; the head joins the last chunk if it fits, else gets its own.
pub fn fused_plan(model: &Model, opts: &LoweringOptions) -> Result<FusedPlan> {
    let n = model.n_layers();
    let bytes: Vec<u64> = model.layers.iter().map(layer_bytes).collect();
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
        let a = l.attention();
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
        residual_shift: opts.residual_shift,
        head_tiles,
    })
}

/// A norm's weight (and bias) as constants of `shape`, times `scale`.
struct NormConst {
    kind: NormKind,
    eps: f32,
    weight: Arc<WeightData>,
    bias: Option<Arc<WeightData>>,
}

impl NormConst {
    /// `n` with its weight (and bias) times `scale`, reordered by `order`, for an input held
    /// times `input_scale` (eps scales with the input's square: the norm stays exact).
    fn new(n: &Norm, scale: f32, input_scale: f32, order: Option<&[usize]>) -> NormConst {
        let pick = |v: &[f32]| -> Vec<f32> {
            match order {
                Some(o) => o.iter().map(|&i| v[i] * scale).collect(),
                None => v.iter().map(|x| x * scale).collect(),
            }
        };
        NormConst {
            kind: n.kind,
            eps: n.eps * input_scale * input_scale,
            weight: Arc::new(WeightData::f16_from_f32(&pick(&n.weight))),
            bias: n
                .bias
                .as_ref()
                .map(|b| Arc::new(WeightData::f16_from_f32(&pick(b)))),
        }
    }
}

/// A linear as fp16 data shared by both functions.
struct LinearConst {
    w: Arc<WeightData>,
    rows: usize,
    cols: usize,
    bias: Option<Arc<WeightData>>,
    l1: f32,
}

impl LinearConst {
    fn new(ws: &[&Weight], bias: Option<Vec<f32>>) -> Result<LinearConst> {
        let (rows, cols) = (ws.iter().map(|w| w.rows).sum(), ws[0].cols);
        Ok(Self::of(stacked(ws)?, rows, cols, bias))
    }

    fn of(w: Arc<WeightData>, rows: usize, cols: usize, bias: Option<Vec<f32>>) -> LinearConst {
        LinearConst {
            l1: max_row_l1(&w, cols),
            w,
            rows,
            cols,
            bias: bias_data(bias),
        }
    }
}

struct LayerConsts {
    attn_norm: NormConst,
    qkv: LinearConst,
    q_norm: Option<NormConst>,
    k_norm: Option<NormConst>,
    o: LinearConst,
    post_attn_norm: Option<NormConst>,
    ffn_norm: NormConst,
    /// Gate (if gated) and up, stacked: one normalised input for both.
    gate_up: LinearConst,
    gated: bool,
    down: LinearConst,
    post_ffn_norm: Option<NormConst>,
}

/// Row order that turns GGUF llama's adjacent-pair RoPE layout back into half-split (undoing
/// llama.cpp's permutation of Q/K rows per head, ARCHITECTURES.md §5), for `heads` heads.
fn half_split_order(heads: usize, head_dim: usize, dims: usize) -> Vec<usize> {
    let half = dims / 2;
    (0..heads)
        .flat_map(|h| {
            (0..head_dim).map(move |r| {
                h * head_dim
                    + if r < half {
                        2 * r
                    } else if r < dims {
                        2 * (r - half) + 1
                    } else {
                        r
                    }
            })
        })
        .collect()
}

impl LayerConsts {
    fn new(l: &Layer, shift: f32) -> Result<LayerConsts> {
        let a = l.attention();
        // Adjacent pairs become half-split pairs by permuting Q/K rows (and their biases and
        // QK-norm weights); the attention scores are unchanged.
        let orders = match &a.rope {
            Some(r) if r.pairing == RopePairing::Adjacent => Some((
                half_split_order(a.n_heads, a.head_dim, r.dims),
                half_split_order(a.n_kv_heads, a.head_dim, r.dims),
                half_split_order(1, a.head_dim, r.dims),
            )),
            _ => None,
        };
        let permuted = orders
            .as_ref()
            .map(|(qo, ko, _)| (a.q.weight.permute_rows(qo), a.k.weight.permute_rows(ko)));
        let (qw, kw) = match &permuted {
            Some((q, k)) => (q, k),
            None => (&a.q.weight, &a.k.weight),
        };
        let perm_bias = |b: &Option<Vec<f32>>, o: Option<&Vec<usize>>| match (b, o) {
            (Some(b), Some(o)) => Some(o.iter().map(|&i| b[i]).collect::<Vec<f32>>()),
            (b, _) => b.clone(),
        };
        let (qb, kb) = (
            perm_bias(&a.q.bias, orders.as_ref().map(|o| &o.0)),
            perm_bias(&a.k.bias, orders.as_ref().map(|o| &o.1)),
        );
        let (qd, kvd) = (a.q.out_features(), a.k.out_features());
        let qkv = LinearConst::new(
            &[qw, kw, &a.v.weight],
            stacked_bias(&[
                (qb.as_deref(), qd),
                (kb.as_deref(), kvd),
                (a.v.bias.as_deref(), kvd),
            ]),
        )?;
        let head_order = orders.as_ref().map(|o| o.2.as_slice());
        let (gate_up, gated, down) = match &l.ffn {
            Ffn::Gated { gate, up, down, .. } => (
                LinearConst::new(&[&gate.weight, &up.weight], linear_biases(&[gate, up]))?,
                true,
                down,
            ),
            Ffn::Plain { up, down, .. } => (
                LinearConst::new(&[&up.weight], linear_biases(&[up]))?,
                false,
                down,
            ),
        };
        // Layer outputs join the residual stream scaled by 2^-shift: through the sandwich norm
        // when there is one, else through the projection.
        let out_scale = |post: &Option<Norm>| if post.is_some() { 1.0 } else { shift };
        let scaled_bias =
            |b: &Option<Vec<f32>>, s: f32| b.as_ref().map(|b| b.iter().map(|v| v * s).collect());
        let o_scale = out_scale(&l.post_attn_norm);
        let d_scale = out_scale(&l.post_ffn_norm);
        Ok(LayerConsts {
            attn_norm: NormConst::new(&l.attn_norm, 1.0, shift, None),
            qkv,
            q_norm: a
                .q_norm
                .as_ref()
                .map(|n| NormConst::new(n, 1.0, 1.0, head_order)),
            k_norm: a
                .k_norm
                .as_ref()
                .map(|n| NormConst::new(n, 1.0, 1.0, head_order)),
            o: LinearConst::new(&[&a.o.weight], scaled_bias(&a.o.bias, o_scale))?,
            post_attn_norm: l
                .post_attn_norm
                .as_ref()
                .map(|n| NormConst::new(n, shift, 1.0, None)),
            ffn_norm: NormConst::new(&l.ffn_norm, 1.0, shift, None),
            gate_up,
            gated,
            down: LinearConst::new(&[&down.weight], scaled_bias(&down.bias, d_scale))?,
            post_ffn_norm: l
                .post_ffn_norm
                .as_ref()
                .map(|n| NormConst::new(n, shift, 1.0, None)),
        })
    }
}

/// Builds one function of a chunk.
struct ChunkGraph<'a> {
    f: FunctionBuilder,
    model: &'a Model,
    plan: &'a FusedPlan,
    /// Columns of this function.
    w: usize,
    form: KvForm,
    /// Inputs created on first use: (name, value).
    inputs: Vec<(String, ValueId)>,
}

impl ChunkGraph<'_> {
    /// The input `name`, declared by [`build_function`] before any op.
    fn input(&self, name: &str) -> Result<ValueId> {
        self.inputs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
            .ok_or_else(|| AneError::Unsupported(format!("input {name} was not declared")))
    }

    fn declare(&mut self, name: &str, ty: TensorType, state: bool) -> Result<()> {
        if self.inputs.iter().all(|(n, _)| n != name) {
            let v = if state {
                self.f.state_input(name, ty)?
            } else {
                self.f.input(name, ty)?
            };
            self.inputs.push((name.to_string(), v));
        }
        Ok(())
    }

    fn constant(
        &mut self,
        name: &str,
        shape: Vec<usize>,
        data: &Arc<WeightData>,
    ) -> Result<ValueId> {
        Ok(self.f.weight(name, TensorType::fp16(shape), data.clone())?)
    }

    /// RMSNorm or LayerNorm of `x` over `axis` (of length `n`), weight shaped `wshape`. The
    /// input is first divided by its largest magnitude: no square can overflow.
    fn norm(
        &mut self,
        p: &str,
        x: ValueId,
        axis: i32,
        n: usize,
        wshape: Vec<usize>,
        c: &NormConst,
    ) -> Result<ValueId> {
        let f = &mut self.f;
        let a = f.name_next(&format!("{p}_abs")).unary("abs", x)?;
        let m = f
            .name_next(&format!("{p}_max"))
            .reduce("reduce_max", a, &[axis], true)?;
        let m = f
            .name_next(&format!("{p}_maxf"))
            .binary_scalar("add", m, 6.1e-5)?;
        let one = f.scalar(&format!("{p}_one"), DType::Fp16, 1.0)?;
        let r = f.name_next(&format!("{p}_r")).real_div(one, m)?;
        let xs = f.name_next(&format!("{p}_xs")).mul(x, r)?;
        // eps scales with the input: (r · √eps)², which stays within fp16 where eps alone may not.
        let er = f
            .name_next(&format!("{p}_er"))
            .binary_scalar("mul", r, c.eps.sqrt())?;
        let eps = f.name_next(&format!("{p}_eps")).mul(er, er)?;
        let centred = match c.kind {
            NormKind::Rms => xs,
            NormKind::Layer => {
                let s = f
                    .name_next(&format!("{p}_sum"))
                    .reduce("reduce_sum", xs, &[axis], true)?;
                let mean =
                    f.name_next(&format!("{p}_mean"))
                        .binary_scalar("mul", s, 1.0 / n as f32)?;
                f.name_next(&format!("{p}_d")).sub(xs, mean)?
            }
        };
        let sq = f.name_next(&format!("{p}_sq")).mul(centred, centred)?;
        let ss = f
            .name_next(&format!("{p}_ss"))
            .reduce("reduce_sum", sq, &[axis], true)?;
        let ms = f
            .name_next(&format!("{p}_ms"))
            .binary_scalar("mul", ss, 1.0 / n as f32)?;
        let v = f.name_next(&format!("{p}_v")).add(ms, eps)?;
        let inv = f
            .name_next(&format!("{p}_inv"))
            .binary_scalar("pow", v, -0.5)?;
        let y = f.name_next(&format!("{p}_n")).mul(centred, inv)?;
        let wt = self.constant(&format!("{p}_w"), wshape.clone(), &c.weight)?;
        let mut y = self.f.name_next(&format!("{p}_y")).mul(y, wt)?;
        if let Some(b) = &c.bias {
            let bt = self.constant(&format!("{p}_b"), wshape, b)?;
            y = self.f.name_next(&format!("{p}_yb")).add(y, bt)?;
        }
        Ok(y)
    }

    /// A linear over a `[1, C, 1, W]` value, its input normalised per column; the result is
    /// multiplied by `out_scale`.
    fn linear(
        &mut self,
        name: &str,
        x: ValueId,
        c: &LinearConst,
        out_scale: f32,
    ) -> Result<ValueId> {
        let (xs, back) = normalize(&mut self.f, name, x, &[1], c.l1, out_scale)?;
        linear(
            &mut self.f,
            name,
            xs,
            Some(back),
            c.w.clone(),
            c.rows,
            c.cols,
            c.bias.clone(),
        )
    }

    /// Half-split RoPE of `t` (`[1, heads, hd, W]`) over its first `dims` dimensions.
    fn rope(&mut self, p: &str, t: ValueId, heads: usize, hd: usize, r: usize) -> Result<ValueId> {
        let (w, dims) = (self.w as i32, self.plan.ropes[r].dims);
        let d2 = dims / 2;
        let cos = self.input(&format!("cos{r}"))?;
        let sin = self.input(&format!("sin{r}"))?;
        let f = &mut self.f;
        let cos = f
            .name_next(&format!("{p}_cos"))
            .reshape(cos, &[1, 1, d2 as i32, w])?;
        let sin = f
            .name_next(&format!("{p}_sin"))
            .reshape(sin, &[1, 1, d2 as i32, w])?;
        let (h, d2i) = (heads as i32, d2 as i32);
        let x1 =
            f.name_next(&format!("{p}_x1"))
                .slice_by_size(t, &[0, 0, 0, 0], &[1, h, d2i, w])?;
        let x2 =
            f.name_next(&format!("{p}_x2"))
                .slice_by_size(t, &[0, 0, d2i, 0], &[1, h, d2i, w])?;
        let a = f.name_next(&format!("{p}_a")).mul(x1, cos)?;
        let b = f.name_next(&format!("{p}_b")).mul(x2, sin)?;
        let r1 = f.name_next(&format!("{p}_r1")).sub(a, b)?;
        let c = f.name_next(&format!("{p}_c")).mul(x2, cos)?;
        let d = f.name_next(&format!("{p}_d")).mul(x1, sin)?;
        let r2 = f.name_next(&format!("{p}_r2")).add(c, d)?;
        let mut parts = vec![r1, r2];
        if dims < hd {
            parts.push(f.name_next(&format!("{p}_pass")).slice_by_size(
                t,
                &[0, 0, dims as i32, 0],
                &[1, h, (hd - dims) as i32, w],
            )?);
        }
        Ok(f.name_next(&format!("{p}_rot")).concat(&parts, 2)?)
    }

    /// Positions attention runs over: the cache and the new tokens side by side (inputs form),
    /// or the state, which holds the prefill width beyond the context so that both functions
    /// share one state shape and a write near the end stays inside it (states form).
    fn kv_len(&self) -> usize {
        match self.form {
            KvForm::Inputs => self.plan.context + self.w,
            KvForm::States => self.plan.context + self.plan.width,
        }
    }

    /// The layer's keys (`k4`, `[1, nkv, hd, W]`) and values with the cached ones:
    /// `[nkv, hd, kv_len]` each. States form: written into the states first.
    fn keys_values(
        &mut self,
        li: usize,
        a: &Attention,
        k4: ValueId,
        v4: ValueId,
    ) -> Result<(ValueId, ValueId)> {
        let (w, kvd) = (self.w, a.n_kv_heads * a.head_dim);
        let (nkv, hd, total) = (a.n_kv_heads as i32, a.head_dim as i32, self.kv_len() as i32);
        let mut out = Vec::new();
        for (kind, new) in [("k", k4), ("v", v4)] {
            let name = format!("{kind}{li}");
            let flat = self
                .f
                .name_next(&format!("{name}_flat"))
                .reshape(new, &[1, kvd as i32, 1, w as i32])?;
            let all = match self.form {
                KvForm::Inputs => {
                    self.f.rename(flat, &format!("{name}_new"))?;
                    self.f.output(flat)?;
                    let cache = self.input(&name)?;
                    self.f
                        .name_next(&format!("{name}_all"))
                        .concat(&[cache, flat], 3)?
                }
                KvForm::States => {
                    let (state, begin, end) = (
                        self.input(&name)?,
                        self.input("kv_begin")?,
                        self.input("kv_end")?,
                    );
                    let cache = self
                        .f
                        .name_next(&format!("{name}_read"))
                        .read_state(state)?;
                    let upd = self
                        .f
                        .name_next(&format!("{name}_upd"))
                        .slice_update_at(cache, flat, begin, end)?;
                    self.f
                        .name_next(&format!("{name}_all"))
                        .update_state(state, upd)?
                }
            };
            out.push(
                self.f
                    .name_next(&format!("{name}_heads"))
                    .reshape(all, &[nkv, hd, total])?,
            );
        }
        Ok((out[0], out[1]))
    }

    fn attention(&mut self, li: usize, x: ValueId, c: &LayerConsts) -> Result<ValueId> {
        let m = self.model;
        let a = m.layers[li].attention();
        let (h, w) = (m.config.hidden_size, self.w);
        let (nh, nkv, hd) = (a.n_heads, a.n_kv_heads, a.head_dim);
        let (qd, kvd, g) = (nh * hd, nkv * hd, nh / nkv);
        let p = format!("l{li}");
        let xn = self.norm(
            &format!("{p}_attn_norm"),
            x,
            1,
            h,
            vec![1, h, 1, 1],
            &c.attn_norm,
        )?;
        let qkv = self.linear(&format!("{p}_qkv"), xn, &c.qkv, 1.0)?;
        let parts = self.f.name_next(&format!("{p}_split")).split_sizes(
            qkv,
            1,
            &[qd as i32, kvd as i32, kvd as i32],
        )?;
        let (wi, hdi) = (w as i32, hd as i32);
        let mut q = self
            .f
            .name_next(&format!("{p}_q4"))
            .reshape(parts[0], &[1, nh as i32, hdi, wi])?;
        let mut k = self
            .f
            .name_next(&format!("{p}_k4"))
            .reshape(parts[1], &[1, nkv as i32, hdi, wi])?;
        let v = self
            .f
            .name_next(&format!("{p}_v4"))
            .reshape(parts[2], &[1, nkv as i32, hdi, wi])?;
        if let Some(n) = &c.q_norm {
            q = self.norm(&format!("{p}_q_norm"), q, 2, hd, vec![1, 1, hd, 1], n)?;
        }
        if let Some(n) = &c.k_norm {
            k = self.norm(&format!("{p}_k_norm"), k, 2, hd, vec![1, 1, hd, 1], n)?;
        }
        if let Some(r) = self.plan.layer_rope[li] {
            q = self.rope(&format!("{p}_qr"), q, nh, hd, r)?;
            k = self.rope(&format!("{p}_kr"), k, nkv, hd, r)?;
        }
        let (kk, vv) = self.keys_values(li, a, k, v)?;
        let total = self.kv_len();
        let f = &mut self.f;
        let q = f
            .name_next(&format!("{p}_qs"))
            .binary_scalar("mul", q, a.scale)?;
        // Queries grouped per KV head: the g heads of a group become g·W rows.
        let q = f
            .name_next(&format!("{p}_qg"))
            .reshape(q, &[nkv as i32, g as i32, hdi, wi])?;
        let q = f
            .name_next(&format!("{p}_qt"))
            .transpose(q, &[0, 2, 1, 3])?;
        let q = f
            .name_next(&format!("{p}_qm"))
            .reshape(q, &[nkv as i32, hdi, (g * w) as i32])?;
        let mut s = f
            .name_next(&format!("{p}_scores"))
            .matmul(q, kk, true, false)?;
        if let Some(cap) = a.softcap {
            let t = f
                .name_next(&format!("{p}_capin"))
                .binary_scalar("mul", s, 1.0 / cap)?;
            let t = f.name_next(&format!("{p}_tanh")).tanh(t)?;
            s = f
                .name_next(&format!("{p}_capped"))
                .binary_scalar("mul", t, cap)?;
        }
        let s = f
            .name_next(&format!("{p}_s4"))
            .reshape(s, &[nkv as i32, g as i32, wi, total as i32])?;
        let mask_name = format!("mask{}", self.plan.layer_window[li]);
        let mask = self.input(&mask_name)?;
        let f = &mut self.f;
        let mask = f
            .name_next(&format!("{p}_mask"))
            .reshape(mask, &[1, 1, wi, total as i32])?;
        let s = f.name_next(&format!("{p}_masked")).add(s, mask)?;
        let mx = f
            .name_next(&format!("{p}_smax"))
            .reduce("reduce_max", s, &[3], true)?;
        let d = f.name_next(&format!("{p}_sd")).sub(s, mx)?;
        let e = f.name_next(&format!("{p}_e")).exp(d)?;
        let z = f
            .name_next(&format!("{p}_z"))
            .reduce("reduce_sum", e, &[3], true)?;
        // Weights ≤ 1 over S + W positions: values normalised per KV head to keep Σ e·v ≤ 2^14.
        let (vn, vback) = normalize(f, &format!("{p}_vn"), vv, &[1, 2], total as f32, 1.0)?;
        let e = f
            .name_next(&format!("{p}_e3"))
            .reshape(e, &[nkv as i32, (g * w) as i32, total as i32])?;
        let o = f.name_next(&format!("{p}_pv")).matmul(e, vn, false, true)?;
        let o = f
            .name_next(&format!("{p}_o4"))
            .reshape(o, &[nkv as i32, g as i32, wi, hdi])?;
        let o = f.name_next(&format!("{p}_oz")).real_div(o, z)?;
        let vback = f
            .name_next(&format!("{p}_vb4"))
            .reshape(vback, &[nkv as i32, 1, 1, 1])?;
        let o = f.name_next(&format!("{p}_ov")).mul(o, vback)?;
        let o = f
            .name_next(&format!("{p}_ot"))
            .transpose(o, &[0, 1, 3, 2])?;
        let o = f
            .name_next(&format!("{p}_att"))
            .reshape(o, &[1, qd as i32, 1, wi])?;
        let shift = if c.post_attn_norm.is_some() {
            1.0
        } else {
            self.shift()
        };
        let mut y = self.linear(&format!("{p}_o"), o, &c.o, shift)?;
        if let Some(n) = &c.post_attn_norm {
            y = self.norm(&format!("{p}_post_attn"), y, 1, h, vec![1, h, 1, 1], n)?;
        }
        Ok(self.f.name_next(&format!("{p}_h")).add(x, y)?)
    }

    fn shift(&self) -> f32 {
        2f32.powi(-self.plan.residual_shift)
    }

    fn ffn(&mut self, li: usize, x: ValueId, c: &LayerConsts) -> Result<ValueId> {
        let h = self.model.config.hidden_size;
        let act = match &self.model.layers[li].ffn {
            Ffn::Gated { act, .. } | Ffn::Plain { act, .. } => *act,
        };
        let p = format!("l{li}");
        let xn = self.norm(
            &format!("{p}_ffn_norm"),
            x,
            1,
            h,
            vec![1, h, 1, 1],
            &c.ffn_norm,
        )?;
        let gu = self.linear(&format!("{p}_gate_up"), xn, &c.gate_up, 1.0)?;
        let hidden = if c.gated {
            let half = (c.gate_up.rows / 2) as i32;
            let parts = self
                .f
                .name_next(&format!("{p}_gu"))
                .split_sizes(gu, 1, &[half, half])?;
            let a = activate(&mut self.f, act, parts[0], &format!("{p}_act"))?;
            self.f.name_next(&format!("{p}_hidden")).mul(a, parts[1])?
        } else {
            activate(&mut self.f, act, gu, &format!("{p}_hidden"))?
        };
        let shift = if c.post_ffn_norm.is_some() {
            1.0
        } else {
            self.shift()
        };
        let mut y = self.linear(&format!("{p}_down"), hidden, &c.down, shift)?;
        if let Some(n) = &c.post_ffn_norm {
            y = self.norm(&format!("{p}_post_ffn"), y, 1, h, vec![1, h, 1, 1], n)?;
        }
        Ok(self.f.name_next(&format!("{p}_out")).add(x, y)?)
    }
}

/// The weights of one chunk, shared by its two functions.
struct ChunkConsts {
    layers: Vec<(usize, LayerConsts)>,
    head: Option<(NormConst, Vec<LinearConst>)>,
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
        f: FunctionBuilder::new(name, Opset::Ios18),
        model,
        plan,
        w,
        form,
        inputs: Vec::new(),
    };
    // Inputs first (MIL declares them before any op): the hidden state, tables, masks, caches.
    g.declare("x", TensorType::fp16([1, h, 1, w]), false)?;
    for (li, _) in &consts.layers {
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
        let a = model.layers[*li].attention();
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
    if form == KvForm::States && !consts.layers.is_empty() {
        g.declare("kv_begin", TensorType::int32([4]), false)?;
        g.declare("kv_end", TensorType::int32([4]), false)?;
    }
    let mut x = g.input("x")?;
    for (li, c) in &consts.layers {
        x = g.attention(*li, x, c)?;
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
            let (xs, back) = normalize(&mut g.f, "head", xf, &[1], l1, 1.0)?;
            for (t, c) in tiles.iter().enumerate() {
                let y = linear(
                    &mut g.f,
                    &format!("logits{t}"),
                    xs,
                    Some(back),
                    c.w.clone(),
                    c.rows,
                    c.cols,
                    None,
                )?;
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
    let shift = 2f32.powi(-plan.residual_shift);
    let layers = spec
        .layers
        .clone()
        .map(|i| Ok((i, LayerConsts::new(&model.layers[i], shift)?)))
        .collect::<Result<_>>()?;
    let head = if spec.head {
        let cols = model.lm_head.cols;
        let tiles = plan
            .head_tiles
            .iter()
            .map(|&(first, rows)| {
                Ok(LinearConst::of(
                    row_range(&model.lm_head, first, rows)?,
                    rows,
                    cols,
                    None,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        Some((NormConst::new(&model.final_norm, 1.0, shift, None), tiles))
    } else {
        None
    };
    let consts = ChunkConsts { layers, head };
    let mut program = Program::new(anelm_mil::Dialect::a());
    for (name, w) in [(PREFILL, plan.width), (DECODE, 1)] {
        program.add_function(build_function(model, plan, &consts, name, w, form)?)?;
    }
    Ok(CompileUnit::new(&spec.name, program)?)
}
