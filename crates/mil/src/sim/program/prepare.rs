//! Preparing a function: each operation becomes a step, the constants it reads materialised
//! as tensors and its constant operands parsed.

use super::*;

/// Turns operations into steps, materialising the constants they read as tensors.
pub(super) struct Builder<'a> {
    pub(super) f: &'a Function,
    pub(super) consts: Vec<Option<Tensor>>,
    /// Conv weights by value, shared by every conv reading the same weight.
    pub(super) conv_weights: HashMap<crate::ValueId, Arc<ConvWeights>>,
}

impl Builder<'_> {
    /// A tensor operand: a computed value, or a constant (materialised once).
    pub(super) fn tensor(&mut self, op: &Operation, p: &str) -> Result<Slot> {
        match op.input(p) {
            Some(Argument::Single(b)) => self.binding(b),
            Some(Argument::Tuple(_)) => Err(MilError::invalid(format!(
                "operand {p} must not be a tuple"
            ))),
            None => Err(MilError::invalid(format!("missing operand {p}"))),
        }
    }

    pub(super) fn opt_tensor(&mut self, op: &Operation, p: &str) -> Result<Option<Slot>> {
        if op.input(p).is_some() {
            self.tensor(op, p).map(Some)
        } else {
            Ok(None)
        }
    }

    pub(super) fn binding(&mut self, b: &Binding) -> Result<Slot> {
        match b {
            Binding::Value(id) => {
                let slot = id.index();
                if let Some(lit) = self.f.const_value(*id) {
                    if self.consts[slot].is_none() {
                        self.consts[slot] = Some(
                            Tensor::from_literal(lit)
                                .map_err(|e| e.context(self.f.name_of(*id)))?,
                        );
                    }
                } else if let ValueDef::Op { op, .. } = self.f.value(*id).def {
                    let producer = &self.f.ops()[op].op_type;
                    if crate::constexpr::is_evaluated(producer) {
                        if self.consts[slot].is_none() {
                            self.consts[slot] = Some(dequant::constexpr_tensor(self.f, *id)?);
                        }
                    } else if producer.starts_with("constexpr_") {
                        return Err(MilError::invalid(format!(
                            "{producer} is not supported by the simulator"
                        )));
                    }
                }
                Ok(slot)
            }
            Binding::Literal(lit) => {
                self.consts.push(Some(Tensor::from_literal(lit)?));
                Ok(self.consts.len() - 1)
            }
        }
    }

    pub(super) fn literal<'b>(&'b self, op: &'b Operation, p: &str) -> Result<Option<&'b Literal>> {
        match op.input(p) {
            None if op.attribute(p).is_none() => Ok(None),
            _ => self.f.operand_literal(op, p).map(Some).ok_or_else(|| {
                MilError::invalid(format!("operand {p} must be a constant for the simulator"))
            }),
        }
    }

    pub(super) fn ints(&self, op: &Operation, p: &str) -> Result<Option<Vec<i64>>> {
        self.literal(op, p)?
            .map(|l| {
                l.to_i64s()
                    .ok_or_else(|| MilError::invalid(format!("operand {p} must be integers")))
            })
            .transpose()
    }

    pub(super) fn int(&self, op: &Operation, p: &str, default: i64) -> Result<i64> {
        match self.ints(op, p)?.as_deref() {
            None => Ok(default),
            Some([v]) => Ok(*v),
            Some(v) => Err(MilError::invalid(format!(
                "operand {p} must be one integer, is {v:?}"
            ))),
        }
    }

    pub(super) fn flag(&self, op: &Operation, p: &str, default: bool) -> Result<bool> {
        match self.literal(op, p)? {
            None => Ok(default),
            Some(l) => l
                .to_bool()
                .ok_or_else(|| MilError::invalid(format!("operand {p} must be a bool"))),
        }
    }

    pub(super) fn float(&self, op: &Operation, p: &str, default: f32) -> Result<f32> {
        match self.literal(op, p)? {
            None => Ok(default),
            Some(l) => l
                .to_f64()
                .map(|v| v as f32)
                .ok_or_else(|| MilError::invalid(format!("operand {p} must be a number"))),
        }
    }

    pub(super) fn bools(&self, op: &Operation, p: &str) -> Result<Option<Vec<bool>>> {
        match self.literal(op, p)? {
            None => Ok(None),
            Some(l) => match l.elements() {
                Some(crate::Elements::Bool(v)) => Ok(Some(v.clone())),
                _ => Err(MilError::invalid(format!("operand {p} must be bools"))),
            },
        }
    }

    /// Constant integers, or a runtime int32 tensor.
    pub(super) fn bounds(&mut self, op: &Operation, p: &str) -> Result<Bounds> {
        match op.value_input(p) {
            Some(id) if self.f.const_value(id).is_none() => {
                Ok(Bounds::Runtime(self.tensor(op, p)?))
            }
            _ => self
                .ints(op, p)?
                .map(Bounds::Static)
                .ok_or_else(|| MilError::invalid(format!("missing operand {p}"))),
        }
    }

    pub(super) fn out_shape(&self, op: &Operation) -> Result<Vec<usize>> {
        let id = op
            .outputs
            .first()
            .ok_or_else(|| MilError::invalid("op has no output"))?;
        Ok(self.f.type_of(*id).tensor().shape.clone())
    }

    pub(super) fn kind(&mut self, op: &Operation) -> Result<Kind> {
        let t = op.op_type.as_str();
        if let Some(f) = Unary::from_name(t) {
            return Ok(Kind::Unary {
                x: self.tensor(op, "x")?,
                f,
                eps: self.float(op, "epsilon", 0.0)?,
            });
        }
        if let Some(f) = Binary::from_name(t) {
            return Ok(Kind::Binary {
                x: self.tensor(op, "x")?,
                y: self.tensor(op, "y")?,
                f,
            });
        }
        if let Some(f) = Compare::from_name(t) {
            return Ok(Kind::Compare {
                x: self.tensor(op, "x")?,
                y: self.tensor(op, "y")?,
                f,
            });
        }
        if let Some(f) = Reduce::from_name(t) {
            return Ok(Kind::Reduce {
                x: self.tensor(op, "x")?,
                f,
                axes: self.ints(op, "axes")?,
                keep: self.flag(op, "keep_dims", false)?,
            });
        }
        Ok(match t {
            "conv" => self.conv(op)?,
            "matmul" => Kind::Matmul {
                x: self.tensor(op, "x")?,
                y: self.tensor(op, "y")?,
                tx: self.flag(op, "transpose_x", false)?,
                ty: self.flag(op, "transpose_y", false)?,
            },
            "logical_and" | "logical_or" | "logical_xor" => Kind::Logical {
                op: t.to_string(),
                x: self.tensor(op, "x")?,
                y: Some(self.tensor(op, "y")?),
            },
            "logical_not" => Kind::Logical {
                op: t.to_string(),
                x: self.tensor(op, "x")?,
                y: None,
            },
            "select" => Kind::Select {
                cond: self.tensor(op, "cond")?,
                a: self.tensor(op, "a")?,
                b: self.tensor(op, "b")?,
            },
            "reduce_argmax" => {
                if self
                    .literal(op, "output_dtype")?
                    .and_then(|l| l.as_str())
                    .is_some_and(|d| d != "int32")
                {
                    return Err(MilError::invalid(
                        "reduce_argmax: the simulator returns int32 indices only",
                    ));
                }
                Kind::Argmax {
                    x: self.tensor(op, "x")?,
                    axis: self.int(op, "axis", -1)?,
                    keep: self.flag(op, "keep_dims", false)?,
                }
            }
            "softmax" => Kind::Softmax {
                x: self.tensor(op, "x")?,
                axis: self.int(op, "axis", -1)?,
            },
            "layer_norm" => Kind::LayerNorm {
                x: self.tensor(op, "x")?,
                axes: self.ints(op, "axes")?,
                gamma: self.opt_tensor(op, "gamma")?,
                beta: self.opt_tensor(op, "beta")?,
                eps: self.float(op, "epsilon", 1e-5)?,
            },
            "reshape" | "expand_dims" | "squeeze" => Kind::Reshape {
                x: self.tensor(op, "x")?,
                shape: self.out_shape(op)?,
            },
            "transpose" => Kind::Transpose {
                x: self.tensor(op, "x")?,
                perm: self.ints(op, "perm")?.unwrap_or_default(),
            },
            "concat" => {
                if self.flag(op, "interleave", false)? {
                    return Err(MilError::invalid(
                        "concat with interleave = true is not supported by the simulator",
                    ));
                }
                let bindings = op
                    .input("values")
                    .map(|a| a.bindings().to_vec())
                    .unwrap_or_default();
                let xs = bindings
                    .iter()
                    .map(|b| self.binding(b))
                    .collect::<Result<_>>()?;
                Kind::Concat {
                    xs,
                    axis: self.int(op, "axis", 0)?,
                }
            }
            "split" => {
                let sizes = self
                    .ints(op, "split_sizes")?
                    .map(|v| v.into_iter().map(|s| s.max(0) as usize).collect());
                Kind::Split {
                    x: self.tensor(op, "x")?,
                    axis: self.int(op, "axis", 0)?,
                    sizes,
                    parts: op.outputs.len(),
                }
            }
            "slice_by_size" => Kind::SliceBySize {
                x: self.tensor(op, "x")?,
                begin: self.bounds(op, "begin")?,
                size: self.ints(op, "size")?.unwrap_or_default(),
            },
            "slice_by_index" => Kind::SliceByIndex {
                x: self.tensor(op, "x")?,
                begin: self.bounds(op, "begin")?,
                end: self.bounds(op, "end")?,
                stride: self.ints(op, "stride")?,
                begin_mask: self.bools(op, "begin_mask")?,
                end_mask: self.bools(op, "end_mask")?,
                out_shape: self.out_shape(op)?,
            },
            "slice_update" => {
                if self
                    .bools(op, "squeeze_mask")?
                    .is_some_and(|m| m.iter().any(|&b| b))
                {
                    return Err(MilError::invalid(
                        "slice_update with a squeeze_mask is not supported by the simulator",
                    ));
                }
                Kind::SliceUpdate {
                    x: self.tensor(op, "x")?,
                    update: self.tensor(op, "update")?,
                    begin: self.bounds(op, "begin")?,
                    end: self.bounds(op, "end")?,
                    stride: self.ints(op, "stride")?,
                    begin_mask: self.bools(op, "begin_mask")?,
                    end_mask: self.bools(op, "end_mask")?,
                }
            }
            "cast" => {
                let name = self
                    .literal(op, "dtype")?
                    .and_then(|l| l.as_str())
                    .ok_or_else(|| MilError::invalid("cast needs a dtype"))?;
                let dtype = DType::from_name(name)
                    .ok_or_else(|| MilError::invalid(format!("unknown dtype {name:?}")))?;
                Kind::Cast {
                    x: self.tensor(op, "x")?,
                    dtype,
                }
            }
            other => {
                return Err(MilError::invalid(format!(
                    "op {other} is not supported by the simulator"
                )))
            }
        })
    }

    pub(super) fn conv(&mut self, op: &Operation) -> Result<Kind> {
        let ones = |v: Option<Vec<i64>>| v.is_none_or(|v| v.iter().all(|&s| s == 1));
        let zeros = |v: Option<Vec<i64>>| v.is_none_or(|v| v.iter().all(|&s| s == 0));
        let pad_type = self
            .literal(op, "pad_type")?
            .and_then(|l| l.as_str())
            .unwrap_or("valid")
            .to_string();
        if !ones(self.ints(op, "strides")?)
            || !ones(self.ints(op, "dilations")?)
            || self.int(op, "groups", 1)? != 1
            || !zeros(self.ints(op, "pad")?)
            || !matches!(pad_type.as_str(), "valid" | "custom" | "same")
        {
            return Err(MilError::invalid("the simulator runs stride-1, undilated, unpadded, single-group 1x1 convolutions only"));
        }
        let wid = op
            .value_input("weight")
            .ok_or_else(|| MilError::invalid("conv weight must be a value"))?;
        let w = match self.conv_weights.get(&wid) {
            Some(w) => w.clone(),
            None => {
                let w = Arc::new(dequant::conv_weights(self.f, wid)?);
                self.conv_weights.insert(wid, w.clone());
                w
            }
        };
        Ok(Kind::Conv {
            x: self.tensor(op, "x")?,
            w,
            bias: self.opt_tensor(op, "bias")?,
        })
    }
}
