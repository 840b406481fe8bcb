//! The projections run as compiled kernels on a [`Device`]: activations are scattered into the
//! kernels' planar input buffers, evaluated, and gathered back.

use std::collections::BTreeMap;

use anelm_model::plan::Ffn;
use anelm_model::Model;

use super::Projections;
use crate::cache::CacheReport;
use crate::device::{Device, KernelIo};
use crate::error::{AneError, Result};
use crate::lower::{
    build_unit, input_exponent, projection_kernels, KernelSpec, LoweringOptions, Projection,
    DESCALE,
};
use crate::planar::{gather, scatter};

/// One compiled kernel with its bound buffers.
struct Bound<D: Device> {
    spec: KernelSpec,
    kernel: D::Kernel,
    binding: D::Binding,
    io: KernelIo,
    input: usize,
    descale: usize,
    /// The largest row L1 norm of the weights reading the input (see [`input_exponent`]).
    input_bound: f32,
    /// The device's output index of each of `spec.outputs`.
    outputs: Vec<usize>,
}

pub struct DeviceProjections<D: Device> {
    device: D,
    width: usize,
    kernels: BTreeMap<Projection, Vec<Bound<D>>>,
    /// Device evaluations so far.
    dispatches: u64,
    /// What the lowering made of each weight tensor.
    weight_reports: Vec<crate::lower::TensorReport>,
    cache: CacheReport,
}

impl<D: Device> DeviceProjections<D> {
    /// Lowers, compiles and binds every kernel of `model`; `on_kernel` sees each spec before it
    /// is compiled (progress reporting).
    pub fn new(
        model: &Model,
        mut device: D,
        opts: &LoweringOptions,
        mut on_kernel: impl FnMut(&KernelSpec),
    ) -> Result<Self> {
        let mut kernels: BTreeMap<Projection, Vec<Bound<D>>> = BTreeMap::new();
        let mut weight_reports = Vec::new();
        let mut cache = CacheReport::default();
        for spec in projection_kernels(model, opts)? {
            on_kernel(&spec);
            let lowered = build_unit(model, &spec, opts)?;
            let (kernel, outcome) =
                crate::cache::compile(&mut device, &lowered.unit, opts.cache_dir.as_deref())?;
            weight_reports.extend(lowered.unit.weight_reports.iter().cloned());
            cache.push(&spec.name, outcome);
            drop(lowered.unit);
            let io = device
                .io(&kernel, "main")
                .ok_or_else(|| {
                    AneError::Unsupported(format!(
                        "{}: the device reports no function main",
                        spec.name
                    ))
                })?
                .clone();
            let mismatch = |what: &str| {
                AneError::Unsupported(format!(
                    "{}: the device's {what} does not match the lowering",
                    spec.name
                ))
            };
            let input = io
                .input(&spec.input.name)
                .ok_or_else(|| mismatch("input"))?;
            let descale = io.input(DESCALE).ok_or_else(|| mismatch("inputs"))?;
            let (l, d) = (&io.inputs[input], &io.inputs[descale]);
            if l.channels != spec.input.channels
                || l.width != opts.width
                || d.channels != 1
                || d.width != opts.width
            {
                return Err(mismatch("input shapes"));
            }
            let outputs = spec
                .outputs
                .iter()
                .map(|p| {
                    io.output(&p.name)
                        .filter(|&i| io.outputs[i].channels == p.channels)
                })
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| mismatch("outputs"))?;
            let binding = device.bind(&kernel, "main")?;
            kernels.entry(spec.projection).or_default().push(Bound {
                spec,
                kernel,
                binding,
                io,
                input,
                descale,
                input_bound: lowered.input_bound,
                outputs,
            });
        }
        Ok(DeviceProjections {
            device,
            width: opts.width,
            kernels,
            dispatches: 0,
            weight_reports,
            cache,
        })
    }

    /// Which kernels were compiled and which loaded from the program cache.
    pub fn cache_report(&self) -> &CacheReport {
        &self.cache
    }

    pub fn device(&self) -> &D {
        &self.device
    }

    /// Kernels compiled.
    pub fn n_kernels(&self) -> usize {
        self.kernels.values().map(Vec::len).sum()
    }

    /// Device evaluations one decoded token costs: every kernel but the experts, and per
    /// mixture layer its `top_k` experts (the ones the router picks).
    pub fn dispatches_per_token(&self, model: &Model) -> usize {
        let experts: usize = (model.layers.iter())
            .map(|l| match &l.ffn {
                Ffn::Moe(m) => m.top_k.min(m.experts.len()),
                _ => 0,
            })
            .sum();
        let others: usize = (self.kernels.iter())
            .filter(|(p, _)| !matches!(p, Projection::Expert(..)))
            .map(|(_, b)| b.len())
            .sum();
        others + experts
    }

    /// Device evaluations so far.
    pub fn dispatches(&self) -> u64 {
        self.dispatches
    }

    /// What the lowering made of each weight tensor.
    pub fn weight_reports(&self) -> &[crate::lower::TensorReport] {
        &self.weight_reports
    }
}

impl<D: Device> Projections for DeviceProjections<D> {
    fn project(&mut self, p: Projection, x: &[f32], n: usize, out: &mut [f32]) -> Result<()> {
        if n > self.width {
            return Err(AneError::Unsupported(format!(
                "{n} tokens in one evaluation; the kernels are {} wide",
                self.width
            )));
        }
        let bound = self
            .kernels
            .get_mut(&p)
            .ok_or_else(|| AneError::Unsupported(format!("no kernel for {p:?}")))?;
        for b in bound {
            let layout = &b.io.inputs[b.input];
            let ch = layout.channels;
            // Per token: the input times 2^s, and 2^-s for the kernel to undo it.
            let exps: Vec<i32> = (0..n)
                .map(|t| {
                    input_exponent(
                        x[t * ch..(t + 1) * ch]
                            .iter()
                            .fold(0f32, |m, v| m.max(v.abs())),
                        b.input_bound,
                    )
                })
                .collect();
            let scales: Vec<f32> = exps.iter().map(|&s| 2f32.powi(s)).collect();
            let descales: Vec<f32> = exps.iter().map(|&s| 2f32.powi(-s)).collect();
            self.device.write_input(&mut b.binding, b.input, |bytes| {
                scatter(layout, x, n, &scales, bytes)
            });
            let layout = &b.io.inputs[b.descale];
            self.device.write_input(&mut b.binding, b.descale, |bytes| {
                scatter(layout, &descales, n, &vec![1.0; n], bytes)
            });
            self.device.evaluate(&b.kernel, &mut b.binding, n)?;
            self.dispatches += 1;
            for (port, &o) in b.spec.outputs.iter().zip(&b.outputs) {
                let layout = &b.io.outputs[o];
                self.device.read_output(&b.binding, o, |bytes| {
                    gather(layout, bytes, 0..n, out, b.spec.total_rows, port.first)
                });
            }
        }
        Ok(())
    }

    fn max_tokens(&self) -> usize {
        self.width
    }
}
