//! Every op in the table, built by the builder, written as a package and re-type-checked by
//! coremltools: our shape/type inference must agree with MIL's for each of them.

mod common;

use anelm_mil::blob::BlobPolicy;
use anelm_mil::package::{read_package, write_package, PackageOptions};
use anelm_mil::{
    Arg, ConvParams, DType, FunctionBuilder, Literal, Opset, Pad, Program, Result, TensorType,
    ValueId, WeightData,
};
use common::*;
use std::collections::BTreeSet;

fn c(f: &mut FunctionBuilder, name: &str, t: TensorType, v: Vec<f32>) -> Result<ValueId> {
    f.weight(name, t, WeightData::f16_from_f32(&v))
}

/// A decoder-layer-shaped function touching every op of the table (except the iOS16 attribute
/// form constexpr_affine_dequantize, covered by the package tests).
fn everything() -> Result<Program> {
    let mut f = FunctionBuilder::new("main", Opset::Ios18);
    let x = f.input("x", TensorType::fp16([1, 64, 1, 32]))?;
    let ids = f.input("ids", TensorType::int32([1, 32]))?;
    let begin = f.input("begin", TensorType::int32([4]))?;
    let end = f.input("end", TensorType::int32([4]))?;
    let cache = f.state_input("k_cache", TensorType::fp16([1, 64, 1, 64]))?;

    // embedding lookup and layout
    let emb = c(
        &mut f,
        "emb",
        TensorType::fp16([100, 64]),
        (0..6400).map(|i| (i % 17) as f32 / 32.0).collect(),
    )?;
    let g = f.gather(emb, ids, 0)?; // [1, 32, 64]
    let gt = f.transpose(g, &[0, 2, 1])?; // [1, 64, 32]
    let e4 = f.expand_dims(gt, &[2])?; // [1, 64, 1, 32]
    let h = f.add(x, e4)?;

    // RMSNorm as LayerNorm over concat(x, -x) (DESIGN)
    let neg = f.binary_scalar("mul", h, -1.0)?;
    let cat = f.concat(&[h, neg], 1)?;
    let gamma = c(&mut f, "gamma", TensorType::fp16([128]), vec![1.0; 128])?;
    let beta = c(&mut f, "beta", TensorType::fp16([128]), vec![0.0; 128])?;
    let ln = f.layer_norm(cat, &[1], Some(gamma), Some(beta), 1e-5)?;
    let hn = f.slice_by_size(ln, &[0, 0, 0, 0], &[1, 64, 1, 32])?;

    // projections
    let wq = f.weight("wq", TensorType::fp16([64, 64, 1, 1]), weights(64 * 64, 1))?;
    let wk = f.weight("wk", TensorType::fp16([64, 64, 1, 1]), weights(64 * 64, 2))?;
    let q = f.conv1x1(hn, wq)?;
    let k = f.conv1x1(hn, wk)?;

    // KV cache: write k at a runtime position, read back a window at that position
    let kc = f.read_state(cache)?;
    let kc2 = f.slice_update_at(kc, k, begin, end)?;
    let kc3 = f.update_state(cache, kc2)?;
    let kwin = f.slice_by_size_at(kc3, begin, &[1, 64, 1, 32])?;

    // heads, RoPE-style rotation, attention written out
    let q4 = f.reshape(q, &[1, 4, 16, 32])?;
    let qh = f.transpose(q4, &[0, 1, 3, 2])?; // [1,4,32,16]
    let k4 = f.reshape(kwin, &[1, 4, 16, 32])?;
    let kh = f.transpose(k4, &[0, 1, 3, 2])?;
    let halves = f.split(qh, -1, 2)?;
    let nh = f.binary_scalar("mul", halves[1], -1.0)?;
    let rot = f.concat(&[nh, halves[0]], -1)?;
    let cos = c(&mut f, "cos", TensorType::fp16([32, 16]), vec![0.5; 512])?;
    let sin = c(&mut f, "sin", TensorType::fp16([32, 16]), vec![0.25; 512])?;
    let qc = f.mul(qh, cos)?;
    let qs = f.mul(rot, sin)?;
    let qr = f.add(qc, qs)?;
    let scores = f.matmul(qr, kh, false, true)?; // [1,4,32,32]
    let scaled = f.binary_scalar("mul", scores, 0.25)?;
    let rows = f.constant(
        "rows",
        Literal::immediate(
            TensorType::fp16([32, 1]),
            anelm_mil::Elements::F16((0..32).map(|i| half::f16::from_f32(i as f32)).collect()),
        )?,
    )?;
    let cols = f.constant(
        "cols",
        Literal::immediate(
            TensorType::fp16([1, 32]),
            anelm_mil::Elements::F16((0..32).map(|i| half::f16::from_f32(i as f32)).collect()),
        )?,
    )?;
    let causal = f.greater(cols, rows)?; // [32, 32] bool
    let fill = f.scalar("fill", DType::Fp16, -30000.0)?;
    let masked = f.select(causal, fill, scaled)?;
    let probs = f.softmax(masked, -1)?;
    let v4 = f.reshape(hn, &[1, 4, 16, 32])?;
    let v = f.transpose(v4, &[0, 1, 3, 2])?;
    let att = f.matmul(probs, v, false, false)?; // [1,4,32,16]
    let sdpa = f.scaled_dot_product_attention(qr, kh, v, None)?;
    let both = f.add(att, sdpa)?;
    let bt = f.transpose(both, &[0, 1, 3, 2])?;
    let merged = f.reshape(bt, &[1, 64, 1, 32])?;
    let wo = f.weight("wo", TensorType::fp16([64, 64, 1, 1]), weights(64 * 64, 3))?;
    let o = f.conv1x1(merged, wo)?;
    let res = f.add(o, h)?;

    // general conv: 1x3 kernel, custom pad, grouped, with bias
    let wg = f.weight(
        "wg",
        TensorType::fp16([64, 32, 1, 3]),
        weights(64 * 32 * 3, 4),
    )?;
    let bias = c(&mut f, "bias", TensorType::fp16([64]), vec![0.125; 64])?;
    let params = ConvParams {
        pad: Pad::Custom(vec![0, 0, 1, 1]),
        groups: 2,
        bias: Some(bias),
        ..Default::default()
    };
    let cg = f.conv(res, wg, &params)?;
    let same = ConvParams {
        pad: Pad::Same,
        strides: vec![1, 2],
        ..Default::default()
    };
    let wsame = f.weight(
        "ws",
        TensorType::fp16([64, 64, 1, 3]),
        weights(64 * 64 * 3, 5),
    )?;
    let cs = f.conv(cg, wsame, &same)?; // [1, 64, 1, 16]

    // elementwise chain over every unary / binary op
    let mut t = cs;
    for op in [
        "abs", "ceil", "floor", "round", "sign", "square", "identity", "relu", "relu6", "sigmoid",
        "silu", "tanh", "exp", "exp2", "sin", "cos", "erf", "softplus", "gelu",
    ] {
        t = f.unary(op, t)?;
    }
    let pos = f.binary_scalar("add", t, 1.5)?;
    let sq = f.sqrt(pos)?;
    let lg = f.unary("log", sq)?;
    let rs = f.unary("rsqrt", pos)?;
    let inv = f.unary("inverse", pos)?;
    let lr = f.op1(
        "leaky_relu",
        vec![("x", lg.into()), ("alpha", Arg::Const(Literal::f16(0.1)))],
    )?;
    let cl = f.op1(
        "clip",
        vec![
            ("x", lr.into()),
            ("alpha", Arg::Const(Literal::f16(-1.0))),
            ("beta", Arg::Const(Literal::f16(1.0))),
        ],
    )?;
    let mut u = cl;
    for op in [
        "add",
        "sub",
        "mul",
        "real_div",
        "floor_div",
        "mod",
        "pow",
        "maximum",
        "minimum",
    ] {
        u = f.binary(op, u, rs)?;
    }
    let u = f.add(u, inv)?;
    let mut flags = Vec::new();
    for op in [
        "equal",
        "not_equal",
        "greater",
        "greater_equal",
        "less",
        "less_equal",
    ] {
        flags.push(f.binary(op, u, rs)?);
    }
    let mut b = flags[0];
    for (op, other) in ["logical_and", "logical_or", "logical_xor"]
        .iter()
        .zip(&flags[1..])
    {
        b = f.binary(op, b, *other)?;
    }
    let nb = f.unary("logical_not", b)?;
    let sel = f.select(nb, u, rs)?;

    // reductions
    let mut reds = Vec::new();
    for op in [
        "reduce_sum",
        "reduce_mean",
        "reduce_max",
        "reduce_min",
        "reduce_prod",
    ] {
        reds.push(f.reduce(op, sel, &[1], true)?); // [1, 1, 1, 16]
    }
    let amax = f.argmax(sel, 1, false)?; // int32 [1, 1, 16]
    let amin = f.op1(
        "reduce_argmin",
        vec![("x", sel.into()), ("axis", Literal::i32(-1).into())],
    )?; // [1, 64, 1]

    // shapes, casts, linear, quantization
    let sq2 = f.squeeze(reds[0], &[1])?; // [1, 1, 16]
    let tl = f.tile(sq2, &[1, 2, 1])?; // [1, 2, 16]
    let si = f.slice_by_index(tl, &[0, 1, 0], &[1, 2, 16])?; // [1, 1, 16]
    let x32 = f.cast(si, DType::Fp32)?;
    let back = f.cast(x32, DType::Fp16)?;
    let sizes = f.split_sizes(back, 2, &[4, 12])?;
    let lw = c(&mut f, "lw", TensorType::fp16([8, 12]), vec![0.5; 96])?;
    let lin = f.linear(sizes[1], lw, None)?; // [1, 1, 8]
    let q8 = f.quantize(lin, 0.05, DType::Int8)?;
    let dq = f.dequantize(q8, 0.05, DType::Fp16)?;

    // int8 weights through constexpr_blockwise_shift_scale
    let qd: Vec<i8> = (0..64 * 64).map(|i| (i % 127) as i8).collect();
    let data = f.constant(
        "q_data",
        Literal::weight(TensorType::int8([64, 64, 1, 1]), WeightData::i8(&qd).into())?,
    )?;
    let scale = c(
        &mut f,
        "q_scale",
        TensorType::fp16([64, 1, 1, 1]),
        vec![0.01; 64],
    )?;
    let wdq = f.blockwise_shift_scale(data, scale, None)?;
    let yq = f.conv1x1(res, wdq)?;

    // uint4 palettes (one per half of the output channels) through constexpr_lut_to_dense
    let idx: Vec<u8> = (0..64 * 64).map(|i| (i * 7 % 16) as u8).collect();
    let lut: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) / 64.0).collect();
    let wl = f.lut_weight(
        "l",
        TensorType::fp16([64, 64, 1, 1]),
        WeightData::pack(DType::Uint4, &idx)?.into(),
        WeightData::f16_from_f32(&lut).into(),
        &[2, 1, 1, 1, 16, 1],
    )?;
    let yl = f.conv1x1(res, wl)?;

    for (i, out) in [yq, dq, amax, amin, reds[4], sizes[0], yl]
        .into_iter()
        .enumerate()
    {
        f.rename(out, &format!("out{i}"))?;
        f.output(out)?;
    }
    Ok(Program::single(f.finish()?))
}

#[test]
fn every_op_type_checks_in_coremltools() {
    let p = everything().unwrap();
    let used: BTreeSet<&str> = p.functions[0]
        .ops()
        .iter()
        .map(|o| o.op_type.as_str())
        .collect();
    let missing: Vec<&str> = anelm_mil::ops::all_ops()
        .iter()
        .map(|d| d.name)
        .filter(|n| !used.contains(n) && *n != "constexpr_affine_dequantize")
        .collect();
    assert!(missing.is_empty(), "ops not covered: {missing:?}");

    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("everything.mlpackage");
    write_package(&p, &pkg, &PackageOptions::default(), &BlobPolicy::default()).unwrap();
    let (code, report) = validate(&pkg);
    assert_eq!(code, 0, "{:#}", report["errors"]);
    assert_eq!(report["warnings"], serde_json::json!([]));
    assert_eq!(report["summary"]["states"], serde_json::json!(["k_cache"]));
    let back = read_package(&pkg).unwrap();
    assert_eq!(back.functions[0].ops().len(), p.functions[0].ops().len());
}
