//! The programs of the projection strategy, one per [`KernelSpec`].

use std::sync::Arc;

use anelm_mil::{FunctionBuilder, Program, TensorType, ValueId, WeightData};
use anelm_model::plan::{Activation, Ffn, GatedMlp, Linear};
use anelm_model::Model;

use super::encode::{Encoded, TensorReport, WeightTarget};
use super::graph::{activate, linear, normalize};
use super::weights::{bias_data, linear_biases, row_range, stacked};
use super::{KernelSpec, LoweringOptions, Port, Projection, DESCALE};
use crate::error::{AneError, Result};
use crate::support::{ensure_lowerable, mixer_inputs, mixer_output, mixture, unsupported};
use crate::unit::CompileUnit;

fn port(name: &str, channels: usize) -> Port {
    Port {
        name: name.to_string(),
        channels,
        first: 0,
    }
}

/// Every kernel of the projection strategy for `model`, in execution order.
pub fn projection_kernels(model: &Model, opts: &LoweringOptions) -> Result<Vec<KernelSpec>> {
    ensure_lowerable(model)?;
    let h = model.config.hidden_size;
    let mut out = Vec::new();
    for (i, l) in model.layers.iter().enumerate() {
        let ins = mixer_inputs(l);
        let rows: usize = ins.iter().map(|l| l.out_features()).sum();
        let spec = |suffix: &str, projection, input: Port, output: Port| KernelSpec {
            name: format!("layer{i:02}_{suffix}"),
            projection,
            total_rows: output.channels,
            input,
            outputs: vec![output],
        };
        out.push(spec(
            "qkv",
            Projection::Qkv(i),
            port("x", h),
            port("qkv", rows),
        ));
        out.push(spec(
            "o",
            Projection::O(i),
            port("x", mixer_output(l).in_features()),
            port("y", h),
        ));
        match &l.ffn {
            Ffn::Moe(m) => {
                for e in 0..m.experts.len() {
                    let name = format!("expert{e:03}");
                    out.push(spec(
                        &name,
                        Projection::Expert(i, e),
                        port("x", h),
                        port("y", h),
                    ));
                }
                if m.shared.is_some() {
                    out.push(spec(
                        "shared",
                        Projection::Shared(i),
                        port("x", h),
                        port("y", h),
                    ));
                }
            }
            _ => out.push(spec("ffn", Projection::Ffn(i), port("x", h), port("y", h))),
        }
    }
    let vocab = model.lm_head.rows;
    let tile = opts.head_tile_rows.max(1);
    let tiles: Vec<(usize, usize)> = (0..vocab)
        .step_by(tile)
        .map(|r| (r, tile.min(vocab - r)))
        .collect();
    let per_program = (opts.head_program_bytes / (tile * h * 2).max(1)).max(1);
    let groups: Vec<&[(usize, usize)]> = tiles.chunks(per_program).collect();
    for (g, group) in groups.iter().enumerate() {
        let name = if groups.len() == 1 {
            "lm_head".to_string()
        } else {
            format!("lm_head{g}")
        };
        let outputs = group
            .iter()
            .enumerate()
            .map(|(t, &(first, rows))| Port {
                name: format!("logits{t}"),
                channels: rows,
                first,
            })
            .collect();
        out.push(KernelSpec {
            name,
            projection: Projection::Head,
            input: port("x", h),
            outputs,
            total_rows: vocab,
        });
    }
    Ok(out)
}

/// A kernel's program and the bound its input scaling needs.
pub struct Lowered {
    pub unit: CompileUnit,
    /// The largest row L1 norm of the (fp16) weights that read the kernel's input.
    pub input_bound: f32,
}

/// The program being built, with the values every conv needs.
struct Builder {
    f: FunctionBuilder,
    /// The `[1, 1, 1, W]` per-column descale input.
    descale: ValueId,
    /// The largest row L1 norm of the weights of convs over scaled inputs.
    bound: f32,
    policy: WeightTarget,
    alts: super::Alternatives,
    /// What became of each weight tensor.
    reports: Vec<TensorReport>,
}

impl Builder {
    /// A linear over the kernel's (CPU-scaled) input: descaled by the descale input, its
    /// weights counted in the input bound.
    fn input_linear(
        &mut self,
        name: &str,
        x: ValueId,
        w: Encoded,
        bias: Option<Arc<WeightData>>,
    ) -> Result<ValueId> {
        self.bound = self.bound.max(w.max_row_l1());
        let y = linear(&mut self.f, name, x, Some(self.descale), &w, bias)?;
        self.reports.extend(w.reports);
        Ok(y)
    }

    fn input_linear_of(&mut self, name: &str, x: ValueId, l: &Linear) -> Result<ValueId> {
        let w = stacked(&[&l.weight], self.policy)?;
        self.input_linear(name, x, w, bias_data(linear_biases(&[l])))
    }

    /// `down(act(gate x) * up x)`, named `name`.
    fn gated_ffn(
        &mut self,
        name: &str,
        x: ValueId,
        act: Activation,
        gate: &Linear,
        up: &Linear,
        down: &Linear,
    ) -> Result<ValueId> {
        let g = self.input_linear_of("gate", x, gate)?;
        let u = self.input_linear_of("up", x, up)?;
        let a = activate(&mut self.f, act, g, "act")?;
        let hidden = self.f.name_next("hidden").mul(a, u)?;
        self.normalized_linear(name, hidden, down)
    }

    fn gated_mlp(
        &mut self,
        name: &str,
        x: ValueId,
        act: Activation,
        m: &GatedMlp,
    ) -> Result<ValueId> {
        self.gated_ffn(name, x, act, &m.gate, &m.up, &m.down)
    }

    /// A linear over an intermediate value `h` (the FFN's hidden state): `h` is first brought
    /// per column to a largest magnitude of `2^14 / L1` (`L1` the weights' largest row L1 norm),
    /// so that partial sums stay ≤ 2^14 and products far above the flush threshold, and the
    /// result is scaled back. The factor is an fp16 quotient, so this costs two roundings.
    fn normalized_linear(&mut self, name: &str, h: ValueId, l: &Linear) -> Result<ValueId> {
        let w = stacked(&[&l.weight], self.policy)?;
        let (hs, back) = normalize(&mut self.f, name, h, &[1], w.max_row_l1(), 1.0, &self.alts)?;
        let y = linear(
            &mut self.f,
            name,
            hs,
            Some(back),
            &w,
            bias_data(linear_biases(&[l])),
        )?;
        self.reports.extend(w.reports);
        Ok(y)
    }
}

/// Builds the program of `spec` with the model's weights.
pub fn build_unit(model: &Model, spec: &KernelSpec, opts: &LoweringOptions) -> Result<Lowered> {
    let w = opts.width;
    let mut f = FunctionBuilder::new("main", opts.dialect.opset());
    let x = f.input(
        &spec.input.name,
        TensorType::fp16([1, spec.input.channels, 1, w]),
    )?;
    let descale = f.input(DESCALE, TensorType::fp16([1, 1, 1, w]))?;
    let mut b = Builder {
        f,
        descale,
        bound: 0.0,
        policy: opts.weight_target(),
        alts: opts.alternatives.clone(),
        reports: Vec::new(),
    };
    let layer = |i: usize| {
        model.layers.get(i).ok_or_else(|| {
            AneError::Unsupported(format!("{}: the model has no layer {i}", spec.name))
        })
    };
    let mut outputs = Vec::new();
    match spec.projection {
        Projection::Qkv(i) => {
            let ls = mixer_inputs(layer(i)?);
            let ws = stacked(&ls.iter().map(|l| &l.weight).collect::<Vec<_>>(), b.policy)?;
            outputs.push(b.input_linear(
                &spec.outputs[0].name,
                x,
                ws,
                bias_data(linear_biases(&ls)),
            )?);
        }
        Projection::O(i) => {
            outputs.push(b.input_linear_of(&spec.outputs[0].name, x, mixer_output(layer(i)?))?)
        }
        Projection::Ffn(i) => {
            let y = match &layer(i)?.ffn {
                Ffn::Gated {
                    act,
                    gate,
                    up,
                    down,
                } => b.gated_ffn(&spec.outputs[0].name, x, *act, gate, up, down)?,
                Ffn::Plain { act, up, down } => {
                    let u = b.input_linear_of("up", x, up)?;
                    let hidden = activate(&mut b.f, *act, u, "hidden")?;
                    b.normalized_linear(&spec.outputs[0].name, hidden, down)?
                }
                Ffn::Moe(_) => return Err(unsupported(i, "a mixture as one FFN kernel")),
            };
            outputs.push(y);
        }
        Projection::Expert(i, e) => {
            let m = mixture(layer(i)?, i)?;
            let mlp = m.experts.get(e).ok_or_else(|| {
                AneError::Unsupported(format!("{}: layer {i} has no expert {e}", spec.name))
            })?;
            outputs.push(b.gated_mlp(&spec.outputs[0].name, x, m.act, mlp)?);
        }
        Projection::Shared(i) => {
            let m = mixture(layer(i)?, i)?;
            let s = m.shared.as_ref().ok_or_else(|| {
                AneError::Unsupported(format!("{}: layer {i} has no shared expert", spec.name))
            })?;
            outputs.push(b.gated_mlp(&spec.outputs[0].name, x, m.act, &s.mlp)?);
        }
        Projection::Head => {
            let head = &model.lm_head;
            for p in &spec.outputs {
                let w = row_range(head, p.first, p.channels, b.policy)?;
                outputs.push(b.input_linear(&p.name, x, w, None)?);
            }
        }
    }
    for o in outputs {
        b.f.output(o)?;
    }
    let mut program = Program::new(opts.dialect.mil());
    program.add_function(b.f.finish()?)?;
    let unit = CompileUnit::new(&spec.name, program)?.with_weight_reports(b.reports);
    Ok(Lowered {
        unit,
        input_bound: b.bound,
    })
}
