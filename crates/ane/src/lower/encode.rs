//! How each weight matrix is held in a program: fp16, or the file's own integers as blockwise
//! weights (`constexpr_blockwise_shift_scale`: `w = scale * (data - offset)` per block of a row).
//!
//! Decode streams every weight byte once per token, so holding a Q4 file as fp16 reads 3-4x the
//! bytes the file needs. The integer-block GGUF types are integers times a per-block scale (plus
//! a bias): their integers go into the program as they are ([`anelm_formats::quant::blockwise`]),
//! only the scales (and offsets `-bias / scale`) are rounded to fp16. Q8_0, Q4_0 and Q5_0 (fp16
//! scales, no bias) map exactly; for the others the rounding of `d * sc` and of the offset is
//! the whole difference, measured per tensor ([`TensorReport`]). Float weights stay fp16 unless
//! a compressing policy asks: int8 (symmetric per block of 32, round to nearest) or int4 (a
//! 16-entry k-means palette per 16 rows, [`palette`]). Those are iOS18 ops; dialect B (iOS16)
//! holds weights as fp16 or as per-channel int8 ([`affine`]).

use std::sync::Arc;

use anelm_mil::{DType, FunctionBuilder, TensorType, ValueId, WeightData};
use anelm_model::Weight;
use half::f16;
use rayon::prelude::*;

use crate::dialect::MilDialect;
use crate::error::{AneError, Result};
pub use forms::Forms;

/// What `--weights` asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WeightPolicy {
    /// The file's own precision: integer blocks as they are, float weights as fp16.
    #[default]
    Auto,
    /// Every weight dequantised to fp16 (the form proven on hardware).
    Fp16,
    /// At most 8-bit integers: the file's integer blocks as they are, float weights quantised to
    /// int8 per block of 32.
    Int8,
    /// 4-bit weights: integer blocks of up to 4 bits as they are, wider integer blocks quantised
    /// to int4 per block of 32, float weights palettised (16 k-means fp16 entries per 16 rows).
    Int4,
}

impl std::str::FromStr for WeightPolicy {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Ok(match s {
            "auto" => WeightPolicy::Auto,
            "fp16" => WeightPolicy::Fp16,
            "int8" => WeightPolicy::Int8,
            "int4" => WeightPolicy::Int4,
            _ => {
                return Err(format!(
                    "unknown weight policy {s:?} (auto, fp16, int8, int4)"
                ))
            }
        })
    }
}

impl std::fmt::Display for WeightPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WeightPolicy::Auto => "auto",
            WeightPolicy::Fp16 => "fp16",
            WeightPolicy::Int8 => "int8",
            WeightPolicy::Int4 => "int4",
        })
    }
}

/// A policy for the programs of one MIL dialect: what the dialect's opset can hold decides the
/// forms (blockwise and grouped palettes are iOS18 ops, dialect A).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WeightTarget {
    pub policy: WeightPolicy,
    pub dialect: MilDialect,
    /// The integer forms the machine takes.
    pub forms: Forms,
}

impl From<WeightPolicy> for WeightTarget {
    /// The policy in dialect A, every form allowed.
    fn from(policy: WeightPolicy) -> WeightTarget {
        WeightTarget {
            policy,
            dialect: MilDialect::A,
            forms: Forms::all(),
        }
    }
}

impl WeightPolicy {
    /// Whether the policy re-quantises float weights (its error is then measured against the
    /// uncompressed model, not only against the file).
    pub fn compresses(self) -> bool {
        matches!(self, WeightPolicy::Int8 | WeightPolicy::Int4)
    }
}

/// A `[rows, cols]` matrix as integers with a scale and an optional bias per block of a row:
/// `w = scale * q + bias` (f32).
#[derive(Clone, Debug, PartialEq)]
struct IntMatrix {
    block: usize,
    ints: Vec<i8>,
    scales: Vec<f32>,
    biases: Option<Vec<f32>>,
}

impl IntMatrix {
    /// Repeats each scale (and bias) so that blocks are `block` long (`block` divides ours).
    fn reblock(mut self, block: usize) -> IntMatrix {
        if block != self.block {
            fn spread(v: Vec<f32>, k: usize) -> Vec<f32> {
                v.into_iter()
                    .flat_map(|s| std::iter::repeat_n(s, k))
                    .collect()
            }
            let k = self.block / block;
            self.scales = spread(self.scales, k);
            self.biases = self.biases.map(|b| spread(b, k));
            self.block = block;
        }
        self
    }

    fn with_biases(mut self) -> IntMatrix {
        if self.biases.is_none() {
            self.biases = Some(vec![0.0; self.scales.len()]);
        }
        self
    }

    fn int_range(&self) -> (i8, i8) {
        self.ints
            .iter()
            .fold((i8::MAX, i8::MIN), |(lo, hi), &q| (lo.min(q), hi.max(q)))
    }
}

/// Symmetric round-to-nearest quantisation of `values` (rows of whole blocks of 32) to integers
/// in `-limit..=limit`, one scale per block (fp16-representable, so the stored scale is exact).
fn quantize_f32(values: &[f32], limit: i8) -> IntMatrix {
    const BLOCK: usize = 32;
    let mut ints = Vec::with_capacity(values.len());
    let mut scales = Vec::with_capacity(values.len() / BLOCK);
    for b in values.chunks(BLOCK) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let s = f16::from_f32(amax / f32::from(limit)).to_f32();
        scales.push(s);
        ints.extend(b.iter().map(|&v| {
            if s == 0.0 {
                0
            } else {
                (v / s)
                    .round()
                    .clamp(-f32::from(limit) - 1.0, f32::from(limit)) as i8
            }
        }));
    }
    IntMatrix {
        block: BLOCK,
        ints,
        scales,
        biases: None,
    }
}

/// The encoding of one matrix (or of several stacked row-wise) in a program.
#[derive(Clone, Debug)]
pub enum Encoding {
    /// fp16 values `[rows, cols]`.
    Fp16(Arc<WeightData>),
    /// `w = scale * (data - offset)`: `data` `[rows, cols]` (int4, uint4 or int8), `scale` and
    /// `offset` (fp16) `[rows, cols / block]`.
    Blockwise {
        data: Arc<WeightData>,
        scale: Arc<WeightData>,
        offset: Option<Arc<WeightData>>,
        block: usize,
    },
    /// `w = lut[row / group][indices]` (`constexpr_lut_to_dense`): uint4 `indices`
    /// `[rows, cols]`, one 16-entry fp16 palette per `group` rows.
    Lut {
        indices: Arc<WeightData>,
        lut: Arc<WeightData>,
        group: usize,
    },
    /// `w = scale[row] * (data - zero_point[row])` (iOS16 `constexpr_affine_dequantize` along
    /// axis 0): uint8 `data` `[rows, cols]`, fp16 `scale` and uint8 `zero_point` per row.
    Affine {
        data: Arc<WeightData>,
        scale: Arc<WeightData>,
        zero_point: Arc<WeightData>,
    },
}

/// Rows per palette of the int4 palettisation (Core ML's `per_grouped_channel` granularity).
pub const LUT_GROUP: usize = 16;
/// Seed of the k-means palettiser: the same weights give the same palettes.
pub const LUT_SEED: u64 = 0x0061_6e65_6c6d;

/// What became of one source tensor (a row range of it, for head tiles).
#[derive(Clone, Debug, PartialEq)]
pub struct TensorReport {
    pub name: String,
    /// The file's type of the tensor (`Q4_K`).
    pub source: String,
    /// `fp16`, `int8/32`, `uint4/32+offset`, … (data type / block, with fp16 offsets).
    pub encoding: String,
    /// Weights the program holds for it.
    pub weights: u64,
    /// Bytes it takes in the program (its share of data, scales and offsets).
    pub bytes: u64,
    /// Whether every weight the program defines equals the file's (its dequantised f32 value)
    /// bit for bit.
    pub exact: bool,
    /// Largest |program weight - file weight| (before the final fp16 rounding both share).
    pub max_abs_err: f32,
    /// Largest |file weight|, to read the error against.
    pub max_abs: f32,
    /// Why the tensor is held as fp16 when the policy asked for integers.
    pub kept_fp16: Option<String>,
}

/// A lowered matrix: its encoding and the report of each tensor in it.
#[derive(Clone, Debug)]
pub struct Encoded {
    pub encoding: Encoding,
    pub rows: usize,
    pub cols: usize,
    pub reports: Vec<TensorReport>,
    /// The largest row L1 norm of the weights (measured as they are encoded).
    max_row_l1: f32,
}

/// One source part: rows `first..first + rows` of `weight`.
#[derive(Clone, Copy)]
pub struct Part<'a> {
    pub weight: &'a Weight,
    pub first: usize,
    pub rows: usize,
}

impl<'a> Part<'a> {
    pub fn whole(weight: &'a Weight) -> Part<'a> {
        Part {
            weight,
            first: 0,
            rows: weight.rows,
        }
    }

    fn name(&self) -> String {
        if self.first == 0 && self.rows == self.weight.rows {
            self.weight.name.clone()
        } else {
            format!(
                "{}[{}..{}]",
                self.weight.name,
                self.first,
                self.first + self.rows
            )
        }
    }

    /// The part's values as the file defines them (f32).
    fn values(&self) -> Result<Vec<f32>> {
        let cols = self.weight.cols;
        let mut out = vec![0f32; self.rows * cols];
        out.par_chunks_mut(cols)
            .enumerate()
            .try_for_each(|(r, dst)| self.weight.dequantize_row(self.first + r, dst))?;
        Ok(out)
    }

    /// The file's integer blocks, when its type is one.
    fn file_ints(&self) -> Option<Result<IntMatrix>> {
        use anelm_formats::quant::blockwise::{decompose_row, int_form};
        let w = self.weight;
        let form = int_form(w.dtype)?;
        let (block, biased) = (form.block, form.biased);
        let (cols, per_row) = (w.cols, w.cols / block);
        let mut m = IntMatrix {
            block,
            ints: vec![0; self.rows * cols],
            scales: vec![0.0; self.rows * per_row],
            biases: biased.then(|| vec![0.0; self.rows * per_row]),
        };
        // Each row decomposed straight into its slots (no second copy of the matrix); rows of
        // a type without biases fill a scratch vector that is dropped.
        let mut biases = m
            .biases
            .take()
            .unwrap_or_else(|| vec![0.0; self.rows * per_row]);
        let done = (m.ints.par_chunks_mut(cols))
            .zip(m.scales.par_chunks_mut(per_row))
            .zip(biases.par_chunks_mut(per_row))
            .enumerate()
            .try_for_each(|(r, ((q, sc), bi))| {
                let row = decompose_row(w.dtype, w.row(self.first + r), cols)
                    .expect("int_form says the type decomposes")
                    .map_err(|e| AneError::Unsupported(format!("{}: {e}", w.name)))?;
                q.copy_from_slice(&row.ints);
                sc.copy_from_slice(&row.scales);
                if let Some(rb) = row.biases {
                    bi.copy_from_slice(&rb);
                }
                Ok(())
            });
        if biased {
            m.biases = Some(biases);
        }
        Some(done.map(|()| m))
    }
}

/// How a part enters a blockwise stack, or why it stays fp16.
enum Plan {
    Ints(IntMatrix),
    Fp16(String),
}

/// The integers `policy` gives `part`.
fn plan(part: &Part, policy: WeightPolicy) -> Result<Plan> {
    let dtype = part.weight.dtype;
    let file = part.file_ints().transpose()?;
    Ok(match (policy, file) {
        (WeightPolicy::Fp16, _) => Plan::Fp16("--weights fp16".into()),
        (WeightPolicy::Int4, Some(m))
            if {
                let (lo, hi) = m.int_range();
                !(lo >= -8 && hi <= 7 || lo >= 0 && hi <= 15)
            } =>
        {
            Plan::Ints(quantize_f32(&part.values()?, 7))
        }
        (_, Some(m)) => Plan::Ints(m),
        (WeightPolicy::Auto, None) => Plan::Fp16(format!(
            "{dtype} is not integers times a block scale: the file's precision is kept as fp16"
        )),
        (WeightPolicy::Int8, None) => Plan::Ints(quantize_f32(&part.values()?, 127)),
        (WeightPolicy::Int4, None) => Plan::Ints(quantize_f32(&part.values()?, 7)),
    })
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The fp16 scale and offset of a block of `scale * q + bias`, as `scale' * (q - offset)`. A
/// block whose bias the scale cannot carry (a zero scale, or an offset beyond fp16) holds the
/// bias in its scale and `q = 1`: its integers' share, `scale * q`, is then below an fp16 step
/// of the bias (and measured).
fn fp16_block(scale: f32, bias: f32) -> (f16, f16, bool) {
    let offset = if bias == 0.0 { 0.0 } else { -bias / scale };
    let (s, o) = (f16::from_f32(scale), f16::from_f32(offset));
    if bias != 0.0 && (s.to_f32() == 0.0 || !o.is_finite()) {
        return (f16::from_f32(bias), f16::ZERO, true);
    }
    (s, o, false)
}

/// `parts` stacked row-wise (all with the same columns) in the form `target` gives them. The
/// parts' pages of a memory-mapped file are given back afterwards (they are read once here;
/// lowering a model then holds the programs' weights, not the file's too).
pub fn encode(parts: &[Part], target: impl Into<WeightTarget>) -> Result<Encoded> {
    let t = target.into();
    let e = match t.dialect {
        MilDialect::A => encode_parts(parts, t.policy, &t.forms),
        MilDialect::B => affine::encode_ios16(parts, t.policy, &t.forms),
    };
    let maps = anelm_cpu::mem::file_mappings();
    for p in parts {
        let rb = p.weight.row_bytes();
        let bytes = p.weight.bytes();
        anelm_cpu::mem::release(&bytes[p.first * rb..(p.first + p.rows) * rb], &maps);
    }
    e
}

/// The one line for a policy the machine's forms rule out.
fn cannot(parts: &[Part], policy: WeightPolicy, why: &str) -> AneError {
    AneError::Unsupported(format!(
        "{}: --weights {policy} cannot apply: {why}",
        parts[0].name()
    ))
}

fn encode_parts(parts: &[Part], policy: WeightPolicy, forms: &Forms) -> Result<Encoded> {
    let cols = parts[0].weight.cols;
    if let Some(p) = parts.iter().find(|p| p.weight.cols != cols) {
        return Err(AneError::Unsupported(format!(
            "{} has {} columns, {} has {cols}",
            p.weight.name, p.weight.cols, parts[0].weight.name
        )));
    }
    let rows: usize = parts.iter().map(|p| p.rows).sum();
    match (policy, forms.int8, forms.int4) {
        (WeightPolicy::Fp16, _, _) => {}
        (WeightPolicy::Auto, Some(why), _) => {
            let plans: Vec<Plan> = (parts.iter())
                .map(|_| Plan::Fp16(format!("held as fp16: {why}")))
                .collect();
            return fp16_stack(parts, &plans, 0, rows, cols);
        }
        (_, Some(why), _) | (WeightPolicy::Int4, None, Some(why)) => {
            return Err(cannot(parts, policy, why))
        }
        _ => {}
    }
    let is_float = |p: &Part| anelm_formats::quant::blockwise::int_form(p.weight.dtype).is_none();
    if policy == WeightPolicy::Int4 && parts.iter().all(is_float) {
        if let Some(why) = forms.lut {
            return Err(cannot(parts, policy, why));
        }
        return lut_stack(parts, rows, cols);
    }
    let plans = parts
        .iter()
        .map(|p| plan(p, policy))
        .collect::<Result<Vec<_>>>()?;
    if let Some(i) = plans.iter().position(|p| matches!(p, Plan::Fp16(_))) {
        return fp16_stack(parts, &plans, i, rows, cols);
    }
    let mats: Vec<IntMatrix> = plans
        .into_iter()
        .map(|p| match p {
            Plan::Ints(m) => m,
            Plan::Fp16(_) => unreachable!("handled above"),
        })
        .collect();
    blockwise_stack(parts, mats, rows, cols, forms.int4.is_none())
}

impl Encoded {
    /// The weights the program defines, in f32 (the op's definition before its fp16 result).
    pub fn to_f32(&self) -> Vec<f32> {
        match &self.encoding {
            Encoding::Fp16(w) => w.to_f32(),
            Encoding::Blockwise {
                data,
                scale,
                offset,
                block,
            } => {
                let (d, s) = (data.to_f32(), scale.to_f32());
                let o = offset.as_ref().map(|o| o.to_f32());
                d.iter()
                    .enumerate()
                    .map(|(i, &q)| {
                        let b = i / block;
                        s[b] * (q - o.as_ref().map_or(0.0, |o| o[b]))
                    })
                    .collect()
            }
            Encoding::Lut {
                indices,
                lut,
                group,
            } => {
                let (i, l) = (indices.to_f32(), lut.to_f32());
                let per_group = group * self.cols;
                i.iter()
                    .enumerate()
                    .map(|(n, &j)| l[n / per_group * 16 + j as usize])
                    .collect()
            }
            Encoding::Affine {
                data,
                scale,
                zero_point,
            } => affine::to_f32(data, scale, zero_point, self.cols),
        }
    }

    /// Bytes the program holds for this matrix (data, scales and offsets).
    pub fn bytes(&self) -> u64 {
        match &self.encoding {
            Encoding::Fp16(w) => w.as_bytes().len() as u64,
            Encoding::Blockwise {
                data,
                scale,
                offset,
                ..
            } => {
                (data.as_bytes().len()
                    + scale.as_bytes().len()
                    + offset.as_ref().map_or(0, |o| o.as_bytes().len())) as u64
            }
            Encoding::Lut { indices, lut, .. } => {
                (indices.as_bytes().len() + lut.as_bytes().len()) as u64
            }
            Encoding::Affine {
                data,
                scale,
                zero_point,
            } => {
                (data.as_bytes().len() + scale.as_bytes().len() + zero_point.as_bytes().len())
                    as u64
            }
        }
    }

    /// The largest row L1 norm of the weights.
    pub fn max_row_l1(&self) -> f32 {
        self.max_row_l1
    }

    /// The weight as a `[rows, cols, 1, 1]` fp16 value of `f`: a const, or the constexpr op over
    /// the blockwise consts.
    pub fn emit(&self, f: &mut FunctionBuilder, name: &str) -> Result<ValueId> {
        let (rows, cols) = (self.rows, self.cols);
        Ok(match &self.encoding {
            Encoding::Fp16(w) => f.weight(name, TensorType::fp16([rows, cols, 1, 1]), w.clone())?,
            Encoding::Blockwise {
                data,
                scale,
                offset,
                block,
            } => f.blockwise_weight(
                name,
                TensorType::fp16([rows, cols, 1, 1]),
                data.clone(),
                scale.clone(),
                offset.clone(),
                &[rows, cols / block, 1, 1],
            )?,
            Encoding::Lut {
                indices,
                lut,
                group,
            } => f.lut_weight(
                name,
                TensorType::fp16([rows, cols, 1, 1]),
                indices.clone(),
                lut.clone(),
                &[rows / group, 1, 1, 1, 16, 1],
            )?,
            Encoding::Affine {
                data,
                scale,
                zero_point,
            } => f.affine_weight(
                name,
                TensorType::fp16([rows, cols, 1, 1]),
                data.clone(),
                anelm_mil::Literal::weight_vector(zero_point.clone()),
                anelm_mil::Literal::weight_vector(scale.clone()),
                0,
            )?,
        })
    }
}

pub mod affine;
pub mod forms;
pub mod palette;
mod stacks;
pub mod summary;

#[cfg(test)]
mod tests;

use stacks::{blockwise_stack, fp16_stack, lut_stack};
