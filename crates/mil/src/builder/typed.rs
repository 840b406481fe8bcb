//! The typed helpers the lowering uses: one method per op form, each binding its parameters
//! to named consts as hardware-proven programs do.

use super::*;

impl FunctionBuilder {
    /// A 1×1 convolution with the exact parameter consts of hardware-proven programs
    /// (FACTS §1.4: `pad_type="valid"`, `strides=[1,1]`, `pad=[0,0,0,0]`, `dilations=[1,1]`, `groups=1`).
    pub fn conv1x1(&mut self, x: ValueId, weight: ValueId) -> Result<ValueId> {
        let w = self.type_of(weight)?;
        if w.rank() != 4 || w.shape[2] != 1 || w.shape[3] != 1 {
            return Err(MilError::invalid(format!(
                "conv1x1 weight must be [Cout, Cin, 1, 1], is {w}"
            )));
        }
        self.conv(x, weight, &ConvParams::default())
    }

    /// A general convolution; every parameter is emitted as a named const.
    pub fn conv(&mut self, x: ValueId, weight: ValueId, p: &ConvParams) -> Result<ValueId> {
        let spatial = p.strides.len();
        let (pad_type, pad) = match &p.pad {
            Pad::Valid => ("valid", vec![0; 2 * spatial]),
            Pad::Same => ("same", vec![0; 2 * spatial]),
            Pad::Custom(v) => ("custom", v.clone()),
        };
        let mut args = vec![
            ("x", Arg::Value(x)),
            ("weight", Arg::Value(weight)),
            ("strides", Literal::i32s(p.strides.clone()).into()),
            ("pad_type", Literal::string(pad_type).into()),
            ("pad", Literal::i32s(pad).into()),
            ("dilations", Literal::i32s(p.dilations.clone()).into()),
            ("groups", Literal::i32(p.groups).into()),
        ];
        if let Some(b) = p.bias {
            args.push(("bias", Arg::Value(b)));
        }
        self.op1("conv", args)
    }

    pub fn matmul(
        &mut self,
        x: ValueId,
        y: ValueId,
        transpose_x: bool,
        transpose_y: bool,
    ) -> Result<ValueId> {
        self.op1(
            "matmul",
            vec![
                ("x", x.into()),
                ("y", y.into()),
                ("transpose_x", Literal::bool(transpose_x).into()),
                ("transpose_y", Literal::bool(transpose_y).into()),
            ],
        )
    }

    pub fn linear(
        &mut self,
        x: ValueId,
        weight: ValueId,
        bias: Option<ValueId>,
    ) -> Result<ValueId> {
        let mut args = vec![("x", x.into()), ("weight", weight.into())];
        if let Some(b) = bias {
            args.push(("bias", b.into()));
        }
        self.op1("linear", args)
    }

    /// Any two-operand elementwise op (`add`, `mul`, `greater`, ...).
    pub fn binary(&mut self, op_type: &str, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.op1(op_type, vec![("x", x.into()), ("y", y.into())])
    }

    pub fn add(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary("add", x, y)
    }

    pub fn sub(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary("sub", x, y)
    }

    pub fn mul(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary("mul", x, y)
    }

    pub fn real_div(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary("real_div", x, y)
    }

    pub fn pow(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary("pow", x, y)
    }

    pub fn maximum(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary("maximum", x, y)
    }

    pub fn minimum(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary("minimum", x, y)
    }

    pub fn greater(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary("greater", x, y)
    }

    pub fn less(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary("less", x, y)
    }

    /// `op_type(x, y = c)` with `c` a scalar const of x's dtype (e.g. `mul` by 1/N, `pow` by -0.5).
    pub fn binary_scalar(&mut self, op_type: &str, x: ValueId, c: f32) -> Result<ValueId> {
        let d = self.type_of(x)?.dtype;
        self.op1(
            op_type,
            vec![("x", x.into()), ("y", Literal::float(d, c)?.into())],
        )
    }

    pub fn select(&mut self, cond: ValueId, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.op1(
            "select",
            vec![("cond", cond.into()), ("a", a.into()), ("b", b.into())],
        )
    }

    /// Any one-operand op (`sigmoid`, `tanh`, `exp`, `sqrt`, `relu`, `silu`, `identity`, `gelu`, `rsqrt`, ...).
    pub fn unary(&mut self, op_type: &str, x: ValueId) -> Result<ValueId> {
        self.op1(op_type, vec![("x", x.into())])
    }

    pub fn sigmoid(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary("sigmoid", x)
    }

    pub fn silu(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary("silu", x)
    }

    pub fn tanh(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary("tanh", x)
    }

    pub fn exp(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary("exp", x)
    }

    pub fn sqrt(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary("sqrt", x)
    }

    pub fn relu(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary("relu", x)
    }

    pub fn identity(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary("identity", x)
    }

    pub fn softmax(&mut self, x: ValueId, axis: i32) -> Result<ValueId> {
        self.op1(
            "softmax",
            vec![("x", x.into()), ("axis", Literal::i32(axis).into())],
        )
    }

    /// `reduce_sum` / `reduce_max` / `reduce_mean` / ... over `axes`.
    pub fn reduce(
        &mut self,
        op_type: &str,
        x: ValueId,
        axes: &[i32],
        keep_dims: bool,
    ) -> Result<ValueId> {
        self.op1(
            op_type,
            vec![
                ("x", x.into()),
                ("axes", Literal::i32s(axes.to_vec()).into()),
                ("keep_dims", Literal::bool(keep_dims).into()),
            ],
        )
    }

    /// `reduce_argmax` (int32 indices) along `axis`.
    pub fn argmax(&mut self, x: ValueId, axis: i32, keep_dims: bool) -> Result<ValueId> {
        self.op1(
            "reduce_argmax",
            vec![
                ("x", x.into()),
                ("axis", Literal::i32(axis).into()),
                ("keep_dims", Literal::bool(keep_dims).into()),
            ],
        )
    }

    pub fn layer_norm(
        &mut self,
        x: ValueId,
        axes: &[i32],
        gamma: Option<ValueId>,
        beta: Option<ValueId>,
        epsilon: f32,
    ) -> Result<ValueId> {
        let d = self.type_of(x)?.dtype;
        let mut args = vec![
            ("x", x.into()),
            ("axes", Literal::i32s(axes.to_vec()).into()),
            ("epsilon", Literal::float(d, epsilon)?.into()),
        ];
        if let Some(g) = gamma {
            args.push(("gamma", g.into()));
        }
        if let Some(b) = beta {
            args.push(("beta", b.into()));
        }
        self.op1("layer_norm", args)
    }

    pub fn reshape(&mut self, x: ValueId, shape: &[i32]) -> Result<ValueId> {
        self.op1(
            "reshape",
            vec![
                ("x", x.into()),
                ("shape", Literal::i32s(shape.to_vec()).into()),
            ],
        )
    }

    pub fn transpose(&mut self, x: ValueId, perm: &[i32]) -> Result<ValueId> {
        self.op1(
            "transpose",
            vec![
                ("x", x.into()),
                ("perm", Literal::i32s(perm.to_vec()).into()),
            ],
        )
    }

    pub fn concat(&mut self, values: &[ValueId], axis: i32) -> Result<ValueId> {
        self.op1(
            "concat",
            vec![
                ("values", Arg::Tuple(values.to_vec())),
                ("axis", Literal::i32(axis).into()),
                ("interleave", Literal::bool(false).into()),
            ],
        )
    }

    /// Splits `x` into `num_splits` equal parts along `axis`.
    pub fn split(&mut self, x: ValueId, axis: i32, num_splits: i32) -> Result<Vec<ValueId>> {
        self.op(
            "split",
            vec![
                ("x", x.into()),
                ("axis", Literal::i32(axis).into()),
                ("num_splits", Literal::i32(num_splits).into()),
            ],
        )
    }

    /// Splits `x` into parts of the given sizes along `axis`.
    pub fn split_sizes(&mut self, x: ValueId, axis: i32, sizes: &[i32]) -> Result<Vec<ValueId>> {
        self.op(
            "split",
            vec![
                ("x", x.into()),
                ("axis", Literal::i32(axis).into()),
                ("split_sizes", Literal::i32s(sizes.to_vec()).into()),
            ],
        )
    }

    pub fn slice_by_size(&mut self, x: ValueId, begin: &[i32], size: &[i32]) -> Result<ValueId> {
        self.op1(
            "slice_by_size",
            vec![
                ("x", x.into()),
                ("begin", Literal::i32s(begin.to_vec()).into()),
                ("size", Literal::i32s(size.to_vec()).into()),
            ],
        )
    }

    pub fn slice_by_index(&mut self, x: ValueId, begin: &[i32], end: &[i32]) -> Result<ValueId> {
        self.op1(
            "slice_by_index",
            vec![
                ("x", x.into()),
                ("begin", Literal::i32s(begin.to_vec()).into()),
                ("end", Literal::i32s(end.to_vec()).into()),
            ],
        )
    }

    /// Writes `update` into `x[begin..end]` (the KV-cache append).
    pub fn slice_update(
        &mut self,
        x: ValueId,
        update: ValueId,
        begin: &[i32],
        end: &[i32],
    ) -> Result<ValueId> {
        self.op1(
            "slice_update",
            vec![
                ("x", x.into()),
                ("update", update.into()),
                ("begin", Literal::i32s(begin.to_vec()).into()),
                ("end", Literal::i32s(end.to_vec()).into()),
            ],
        )
    }

    /// `slice_by_size` with a runtime `begin` (int32 `[rank]`, e.g. a position input).
    pub fn slice_by_size_at(
        &mut self,
        x: ValueId,
        begin: ValueId,
        size: &[i32],
    ) -> Result<ValueId> {
        self.op1(
            "slice_by_size",
            vec![
                ("x", x.into()),
                ("begin", begin.into()),
                ("size", Literal::i32s(size.to_vec()).into()),
            ],
        )
    }

    /// `slice_update` with runtime `begin`/`end` (int32 `[rank]`): the KV-cache write at the
    /// current position.
    pub fn slice_update_at(
        &mut self,
        x: ValueId,
        update: ValueId,
        begin: ValueId,
        end: ValueId,
    ) -> Result<ValueId> {
        self.op1(
            "slice_update",
            vec![
                ("x", x.into()),
                ("update", update.into()),
                ("begin", begin.into()),
                ("end", end.into()),
            ],
        )
    }

    pub fn cast(&mut self, x: ValueId, dtype: DType) -> Result<ValueId> {
        self.op1(
            "cast",
            vec![
                ("x", x.into()),
                ("dtype", Literal::string(dtype.name()).into()),
            ],
        )
    }

    /// Rows of `x` selected by integer `indices` along `axis` (embedding lookup).
    pub fn gather(&mut self, x: ValueId, indices: ValueId, axis: i32) -> Result<ValueId> {
        self.op1(
            "gather",
            vec![
                ("x", x.into()),
                ("indices", indices.into()),
                ("axis", Literal::i32(axis).into()),
            ],
        )
    }

    pub fn expand_dims(&mut self, x: ValueId, axes: &[i32]) -> Result<ValueId> {
        self.op1(
            "expand_dims",
            vec![
                ("x", x.into()),
                ("axes", Literal::i32s(axes.to_vec()).into()),
            ],
        )
    }

    pub fn squeeze(&mut self, x: ValueId, axes: &[i32]) -> Result<ValueId> {
        self.op1(
            "squeeze",
            vec![
                ("x", x.into()),
                ("axes", Literal::i32s(axes.to_vec()).into()),
            ],
        )
    }

    pub fn tile(&mut self, x: ValueId, reps: &[i32]) -> Result<ValueId> {
        self.op1(
            "tile",
            vec![
                ("x", x.into()),
                ("reps", Literal::i32s(reps.to_vec()).into()),
            ],
        )
    }

    /// Activation quantization to int8/uint8 with a scalar scale.
    pub fn quantize(&mut self, x: ValueId, scale: f32, output: DType) -> Result<ValueId> {
        let d = self.type_of(x)?.dtype;
        self.op1(
            "quantize",
            vec![
                ("input", x.into()),
                ("scale", Literal::float(d, scale)?.into()),
                ("output_dtype", Literal::string(output.name()).into()),
            ],
        )
    }

    /// Dequantization of int8/uint8 activations to `dtype` with a scalar scale.
    pub fn dequantize(&mut self, x: ValueId, scale: f32, dtype: DType) -> Result<ValueId> {
        self.op1(
            "dequantize",
            vec![
                ("input", x.into()),
                ("scale", Literal::float(dtype, scale)?.into()),
            ],
        )
    }

    pub fn read_state(&mut self, state: ValueId) -> Result<ValueId> {
        self.op1("read_state", vec![("input", state.into())])
    }

    /// Writes `value` into `state`; returns the written value (coremltools' `coreml_update_state`).
    pub fn update_state(&mut self, state: ValueId, value: ValueId) -> Result<ValueId> {
        self.op1(
            "coreml_update_state",
            vec![("state", state.into()), ("value", value.into())],
        )
    }

    pub fn scaled_dot_product_attention(
        &mut self,
        query: ValueId,
        key: ValueId,
        value: ValueId,
        attn_mask: Option<ValueId>,
    ) -> Result<ValueId> {
        let mut args = vec![
            ("query", query.into()),
            ("key", key.into()),
            ("value", value.into()),
        ];
        if let Some(m) = attn_mask {
            args.push(("attn_mask", m.into()));
        }
        self.op1("scaled_dot_product_attention", args)
    }
}
