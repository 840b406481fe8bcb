//! The interpreter: a [`Function`] prepared once into steps (constants materialised, constant
//! operands parsed, conv weights packed as fp16), then run on input tensors as often as needed.

use crate::dtype::DType;
use crate::error::{MilError, Result};
use crate::ir::{Argument, Binding, Function, Operation, ValueDef};
use crate::literal::Literal;
use crate::ops::norm_axis;
use crate::types::{TensorType, ValueType};
use std::collections::HashMap;
use std::sync::Arc;

use super::dequant;
use super::elementwise::{self, Binary, Compare, Unary};
use super::linalg::{self, ConvWeights};
use super::reduce::{self, Reduce};
use super::shape::{self, Slice};
use super::tensor::Tensor;

mod prepare;
use prepare::Builder;

/// Index of a value (a [`crate::ValueId`], or an extra slot for an inline literal).
type Slot = usize;

/// Slice bounds: constant, or an int32 tensor computed at run time (the KV-cache position).
#[derive(Debug, Clone)]
enum Bounds {
    Static(Vec<i64>),
    Runtime(Slot),
}

#[derive(Debug, Clone)]
enum Kind {
    Conv {
        x: Slot,
        w: Arc<ConvWeights>,
        bias: Option<Slot>,
    },
    Matmul {
        x: Slot,
        y: Slot,
        tx: bool,
        ty: bool,
    },
    Unary {
        x: Slot,
        f: Unary,
        eps: f32,
    },
    Binary {
        x: Slot,
        y: Slot,
        f: Binary,
    },
    Compare {
        x: Slot,
        y: Slot,
        f: Compare,
    },
    Logical {
        op: String,
        x: Slot,
        y: Option<Slot>,
    },
    Select {
        cond: Slot,
        a: Slot,
        b: Slot,
    },
    Reduce {
        x: Slot,
        f: Reduce,
        axes: Option<Vec<i64>>,
        keep: bool,
    },
    Argmax {
        x: Slot,
        axis: i64,
        keep: bool,
    },
    Softmax {
        x: Slot,
        axis: i64,
    },
    LayerNorm {
        x: Slot,
        axes: Option<Vec<i64>>,
        gamma: Option<Slot>,
        beta: Option<Slot>,
        eps: f32,
    },
    /// reshape / expand_dims / squeeze: the declared output shape.
    Reshape {
        x: Slot,
        shape: Vec<usize>,
    },
    Transpose {
        x: Slot,
        perm: Vec<i64>,
    },
    Concat {
        xs: Vec<Slot>,
        axis: i64,
    },
    Split {
        x: Slot,
        axis: i64,
        sizes: Option<Vec<usize>>,
        parts: usize,
    },
    SliceBySize {
        x: Slot,
        begin: Bounds,
        size: Vec<i64>,
    },
    SliceByIndex {
        x: Slot,
        begin: Bounds,
        end: Bounds,
        stride: Option<Vec<i64>>,
        begin_mask: Option<Vec<bool>>,
        end_mask: Option<Vec<bool>>,
        out_shape: Vec<usize>,
    },
    SliceUpdate {
        x: Slot,
        update: Slot,
        begin: Bounds,
        end: Bounds,
        stride: Option<Vec<i64>>,
        begin_mask: Option<Vec<bool>>,
        end_mask: Option<Vec<bool>>,
    },
    Cast {
        x: Slot,
        dtype: DType,
    },
}

#[derive(Debug, Clone)]
struct Step {
    /// `<output name> (<op type>)`, for errors.
    label: String,
    kind: Kind,
    outputs: Vec<Slot>,
    /// Slots whose last reader is this step (freed after it).
    frees: Vec<Slot>,
}

/// A function ready to run. See the [module docs](super) for the numerics.
#[derive(Debug, Clone)]
pub struct Simulator {
    function: String,
    inputs: Vec<(String, TensorType, Slot)>,
    outputs: Vec<(String, TensorType, Slot)>,
    consts: Vec<Option<Tensor>>,
    steps: Vec<Step>,
    width: Option<usize>,
}

impl Simulator {
    /// Prepares `f`; its weights must be loaded (not `BLOBFILE` references). Ops the simulator
    /// does not execute are an error naming the op.
    pub fn new(f: &Function) -> Result<Simulator> {
        let mut b = Builder {
            f,
            consts: vec![None; f.values().len()],
            conv_weights: HashMap::new(),
        };
        let mut steps = Vec::new();
        for op in f.ops() {
            // Constexpr ops run once, here, when a step reads their output (see `dequant`).
            if op.is_const() || crate::constexpr::is_evaluated(&op.op_type) {
                continue;
            }
            let label = format!(
                "{} ({})",
                op.outputs.first().map(|&o| f.name_of(o)).unwrap_or("?"),
                op.op_type
            );
            let kind = b
                .kind(op)
                .map_err(|e| e.context(format!("function {}, {label}", f.name)))?;
            steps.push(Step {
                label,
                kind,
                outputs: op.outputs.iter().map(|o| o.index()).collect(),
                frees: Vec::new(),
            });
        }
        let tensor_io = |ids: &[crate::ValueId],
                         what: &str|
         -> Result<Vec<(String, TensorType, Slot)>> {
            ids.iter()
                .map(|&id| match f.type_of(id) {
                    ValueType::Tensor(t) => Ok((f.name_of(id).to_string(), t.clone(), id.index())),
                    ValueType::State(_) => Err(MilError::invalid(format!(
                        "function {}: state {what} {} is not supported by the simulator yet",
                        f.name,
                        f.name_of(id)
                    ))),
                })
                .collect()
        };
        let inputs = tensor_io(f.inputs(), "input")?;
        let outputs = tensor_io(f.outputs(), "output")?;
        let mut sim = Simulator {
            function: f.name.clone(),
            inputs,
            outputs,
            consts: b.consts,
            steps,
            width: None,
        };
        sim.plan_frees();
        sim.width = sim.column_width();
        Ok(sim)
    }

    pub fn function(&self) -> &str {
        &self.function
    }

    /// Inputs in declaration order: name and type.
    pub fn inputs(&self) -> impl Iterator<Item = (&str, &TensorType)> {
        self.inputs.iter().map(|(n, t, _)| (n.as_str(), t))
    }

    /// Outputs in return order: name and type.
    pub fn outputs(&self) -> impl Iterator<Item = (&str, &TensorType)> {
        self.outputs.iter().map(|(n, t, _)| (n.as_str(), t))
    }

    /// `Some(W)` when every input and output is `[1, C, 1, W]` and every op keeps the columns
    /// (the last axis) independent — conv 1×1, elementwise ops with constants constant along
    /// the columns, casts, channel concat/split, reductions / softmax / layer_norm over other
    /// axes (keeping dims). Such a function may be run on the first
    /// `n ≤ W` columns only: the results are exactly those columns of a full run.
    pub fn column_width(&self) -> Option<usize> {
        let w = self.inputs.first().and_then(|(_, t, _)| plane_width(t))?;
        let io_ok = self
            .inputs
            .iter()
            .chain(&self.outputs)
            .all(|(_, t, _)| plane_width(t) == Some(w));
        let const_ok = |s: Slot| match &self.consts[s] {
            Some(t) => t.numel() == 1 || t.shape.last() == Some(&1) && t.rank() <= 4,
            None => true,
        };
        let channel_axis = |a: i64| a == 1 || a == -3;
        let not_width = |axes: &Option<Vec<i64>>| {
            axes.as_ref()
                .is_some_and(|v| v.iter().all(|&a| a != 3 && a != -1))
        };
        let steps_ok = self.steps.iter().all(|s| match &s.kind {
            Kind::Conv { bias, .. } => bias.is_none_or(const_ok),
            Kind::Unary { .. } | Kind::Cast { .. } => true,
            Kind::Reduce { axes, keep, .. } => *keep && not_width(axes),
            Kind::Softmax { axis, .. } => not_width(&Some(vec![*axis])),
            Kind::LayerNorm { axes, .. } => not_width(axes),
            Kind::Binary { x, y, .. } | Kind::Compare { x, y, .. } => const_ok(*x) && const_ok(*y),
            Kind::Select { cond, a, b } => const_ok(*cond) && const_ok(*a) && const_ok(*b),
            Kind::Concat { xs, axis } => channel_axis(*axis) && xs.iter().all(|&x| const_ok(x)),
            Kind::Split { axis, .. } => channel_axis(*axis),
            _ => false,
        });
        (io_ok && steps_ok).then_some(w)
    }

    /// Runs the function on `inputs` (in declaration order). For a function with a
    /// [`column_width`](Self::column_width), inputs may be narrower than declared (the first
    /// columns); the outputs are then as narrow.
    pub fn run(&self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>> {
        let err = |m: String| MilError::invalid(format!("function {}: {m}", self.function));
        if inputs.len() != self.inputs.len() {
            return Err(err(format!(
                "{} inputs given, {} expected",
                inputs.len(),
                self.inputs.len()
            )));
        }
        let mut vals: Vec<Option<Tensor>> = vec![None; self.consts.len()];
        for ((name, ty, slot), t) in self.inputs.iter().zip(inputs) {
            let narrowed = self.width.is_some()
                && t.rank() == 4
                && t.shape[..3] == ty.shape[..3]
                && (1..=ty.shape[3]).contains(&t.shape[3]);
            if t.dtype != ty.dtype || (t.shape != ty.shape && !narrowed) {
                return Err(err(format!(
                    "input {name} is {} {:?}, expected {ty}",
                    t.dtype, t.shape
                )));
            }
            vals[*slot] = Some(t);
        }
        for step in &self.steps {
            let outs = self
                .exec(&step.kind, &vals)
                .map_err(|e| e.context(format!("function {}, {}", self.function, step.label)))?;
            for (&slot, t) in step.outputs.iter().zip(outs) {
                vals[slot] = Some(t);
            }
            for &s in &step.frees {
                vals[s] = None;
            }
        }
        self.outputs
            .iter()
            .map(|(name, _, slot)| {
                vals[*slot]
                    .clone()
                    .or_else(|| self.consts[*slot].clone())
                    .ok_or_else(|| err(format!("output {name} was not computed")))
            })
            .collect()
    }

    /// Marks, for every computed value that is not an output, the step that reads it last.
    fn plan_frees(&mut self) {
        let keep: Vec<Slot> = self.outputs.iter().map(|o| o.2).collect();
        let mut last = vec![None; self.consts.len()];
        for (i, s) in self.steps.iter().enumerate() {
            for r in reads(&s.kind) {
                last[r] = Some(i);
            }
        }
        for (slot, at) in last.into_iter().enumerate() {
            if let Some(i) = at {
                if !keep.contains(&slot) && self.consts[slot].is_none() {
                    self.steps[i].frees.push(slot);
                }
            }
        }
    }

    fn get<'a>(&'a self, vals: &'a [Option<Tensor>], s: Slot) -> Result<&'a Tensor> {
        vals[s].as_ref().or(self.consts[s].as_ref()).ok_or_else(|| {
            MilError::invalid("an operand has no value (a state or string used as a tensor?)")
        })
    }

    fn bounds(&self, vals: &[Option<Tensor>], b: &Bounds) -> Result<Vec<i64>> {
        match b {
            Bounds::Static(v) => Ok(v.clone()),
            Bounds::Runtime(s) => Ok(self
                .get(vals, *s)?
                .ints()?
                .iter()
                .map(|&v| v as i64)
                .collect()),
        }
    }

    fn exec(&self, kind: &Kind, vals: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
        let t = |s: Slot| self.get(vals, s);
        let axis_of = |a: i64, x: &Tensor| norm_axis(a, x.rank());
        let axes_of = |a: &Option<Vec<i64>>, x: &Tensor| -> Result<Vec<usize>> {
            match a {
                Some(v) => v.iter().map(|&a| axis_of(a, x)).collect(),
                None => Ok((0..x.rank()).collect()),
            }
        };
        let one = |r: Result<Tensor>| r.map(|t| vec![t]);
        match kind {
            Kind::Conv { x, w, bias } => {
                let y = linalg::conv1x1(t(*x)?, w)?;
                match bias {
                    // [Cout] bias broadcast over [N, Cout, H, W].
                    Some(b) => {
                        let b = t(*b)?.clone().reshaped(vec![w.cout, 1, 1])?;
                        one(elementwise::binary(Binary::Add, &y, &b))
                    }
                    None => Ok(vec![y]),
                }
            }
            Kind::Matmul { x, y, tx, ty } => one(linalg::matmul(t(*x)?, t(*y)?, *tx, *ty)),
            Kind::Unary { x, f, eps } => one(elementwise::unary(*f, t(*x)?, *eps)),
            Kind::Binary { x, y, f } => one(elementwise::binary(*f, t(*x)?, t(*y)?)),
            Kind::Compare { x, y, f } => one(elementwise::compare(*f, t(*x)?, t(*y)?)),
            Kind::Logical { op, x, y } => {
                one(elementwise::logical(op, t(*x)?, y.map(t).transpose()?))
            }
            Kind::Select { cond, a, b } => one(elementwise::select(t(*cond)?, t(*a)?, t(*b)?)),
            Kind::Reduce { x, f, axes, keep } => {
                let x = t(*x)?;
                one(reduce::reduce(*f, x, &axes_of(axes, x)?, *keep))
            }
            Kind::Argmax { x, axis, keep } => {
                let x = t(*x)?;
                one(reduce::argmax(x, axis_of(*axis, x)?, *keep))
            }
            Kind::Softmax { x, axis } => {
                let x = t(*x)?;
                one(reduce::softmax(x, axis_of(*axis, x)?))
            }
            Kind::LayerNorm {
                x,
                axes,
                gamma,
                beta,
                eps,
            } => {
                let x = t(*x)?;
                one(reduce::layer_norm(
                    x,
                    &axes_of(axes, x)?,
                    gamma.map(t).transpose()?,
                    beta.map(t).transpose()?,
                    *eps,
                ))
            }
            Kind::Reshape { x, shape } => one(t(*x)?.clone().reshaped(shape.clone())),
            Kind::Transpose { x, perm } => {
                let x = t(*x)?;
                let perm = perm
                    .iter()
                    .map(|&a| axis_of(a, x))
                    .collect::<Result<Vec<_>>>()?;
                one(shape::transpose(x, &perm))
            }
            Kind::Concat { xs, axis } => {
                let xs = xs.iter().map(|&s| t(s)).collect::<Result<Vec<_>>>()?;
                let axis = axis_of(*axis, xs[0])?;
                one(shape::concat(&xs, axis))
            }
            Kind::Split {
                x,
                axis,
                sizes,
                parts,
            } => {
                let x = t(*x)?;
                let a = axis_of(*axis, x)?;
                let sizes = match sizes {
                    Some(s) => s.clone(),
                    None if x.shape[a] % parts == 0 => vec![x.shape[a] / parts; *parts],
                    None => {
                        return Err(MilError::invalid(format!(
                            "{} does not split into {parts} parts",
                            x.shape[a]
                        )))
                    }
                };
                shape::split(x, a, &sizes)
            }
            Kind::SliceBySize { x, begin, size } => {
                let x = t(*x)?;
                one(shape::slice(
                    x,
                    &Slice::by_size(&x.shape, &self.bounds(vals, begin)?, size)?,
                ))
            }
            Kind::SliceByIndex {
                x,
                begin,
                end,
                stride,
                begin_mask,
                end_mask,
                out_shape,
            } => {
                let x = t(*x)?;
                let s = index_slice(
                    x,
                    self.bounds(vals, begin)?,
                    self.bounds(vals, end)?,
                    stride,
                    begin_mask,
                    end_mask,
                )?;
                // A squeeze_mask only drops length-1 axes: the declared shape has them removed.
                one(shape::slice(x, &s)?.reshaped(out_shape.clone()))
            }
            Kind::SliceUpdate {
                x,
                update,
                begin,
                end,
                stride,
                begin_mask,
                end_mask,
            } => {
                let x = t(*x)?;
                let s = index_slice(
                    x,
                    self.bounds(vals, begin)?,
                    self.bounds(vals, end)?,
                    stride,
                    begin_mask,
                    end_mask,
                )?;
                one(shape::slice_update(x, t(*update)?, &s))
            }
            Kind::Cast { x, dtype } => one(t(*x)?.cast(*dtype)),
        }
    }
}

fn index_slice(
    x: &Tensor,
    begin: Vec<i64>,
    end: Vec<i64>,
    stride: &Option<Vec<i64>>,
    bm: &Option<Vec<bool>>,
    em: &Option<Vec<bool>>,
) -> Result<Slice> {
    let r = x.rank();
    let stride = stride.clone().unwrap_or_else(|| vec![1; r]);
    let bm = bm.clone().unwrap_or_else(|| vec![false; r]);
    let em = em.clone().unwrap_or_else(|| vec![false; r]);
    Slice::by_index(&x.shape, &begin, &end, &stride, &bm, &em)
}

/// `W` of a `[1, C, 1, W]` tensor type.
fn plane_width(t: &TensorType) -> Option<usize> {
    match t.shape.as_slice() {
        &[1, _, 1, w] => Some(w),
        _ => None,
    }
}

/// Slots a step reads.
fn reads(k: &Kind) -> Vec<Slot> {
    let bound = |b: &Bounds| match b {
        Bounds::Runtime(s) => Some(*s),
        Bounds::Static(_) => None,
    };
    match k {
        Kind::Conv { x, bias, .. } => [Some(*x), *bias].into_iter().flatten().collect(),
        Kind::Matmul { x, y, .. } | Kind::Binary { x, y, .. } | Kind::Compare { x, y, .. } => {
            vec![*x, *y]
        }
        Kind::Logical { x, y, .. } => [Some(*x), *y].into_iter().flatten().collect(),
        Kind::Select { cond, a, b } => vec![*cond, *a, *b],
        Kind::Unary { x, .. }
        | Kind::Reduce { x, .. }
        | Kind::Argmax { x, .. }
        | Kind::Softmax { x, .. }
        | Kind::Reshape { x, .. }
        | Kind::Transpose { x, .. }
        | Kind::Split { x, .. }
        | Kind::Cast { x, .. } => vec![*x],
        Kind::LayerNorm { x, gamma, beta, .. } => {
            [Some(*x), *gamma, *beta].into_iter().flatten().collect()
        }
        Kind::Concat { xs, .. } => xs.clone(),
        Kind::SliceBySize { x, begin, .. } => {
            [Some(*x), bound(begin)].into_iter().flatten().collect()
        }
        Kind::SliceByIndex { x, begin, end, .. } => [Some(*x), bound(begin), bound(end)]
            .into_iter()
            .flatten()
            .collect(),
        Kind::SliceUpdate {
            x,
            update,
            begin,
            end,
            ..
        } => [Some(*x), Some(*update), bound(begin), bound(end)]
            .into_iter()
            .flatten()
            .collect(),
    }
}
