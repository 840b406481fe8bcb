//! Kernel by kernel: every projection a forward pass makes runs on the device and on the f32
//! reference with the same input, and the outputs are compared.

use std::sync::Arc;

use anelm_model::{Executor, Logits, Model};

use crate::compare::{argmax, diff};
use crate::device::Device;
use crate::error::{AneError, Result};
use crate::exec::{
    DeviceProjections, FusedExecutor, ProjectionExecutor, Projections, ReferenceProjections,
};
use crate::lower::{LoweringOptions, Projection};
use crate::strategy::Strategy;

/// How far one kernel's output was from the reference.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelCheck {
    pub kernel: String,
    /// Tokens (columns) it was checked on.
    pub tokens: usize,
    pub max_abs_diff: f32,
    /// `max_abs_diff` over the reference's largest magnitude.
    pub rel_err: f32,
}

/// The kernel name of a projection (the files `anelm compile` writes; all head tiles together).
pub fn kernel_name(p: Projection) -> String {
    match p {
        Projection::Qkv(i) => format!("layer{i:02}_qkv"),
        Projection::O(i) => format!("layer{i:02}_o"),
        Projection::Ffn(i) => format!("layer{i:02}_ffn"),
        Projection::Expert(i, e) => format!("layer{i:02}_expert{e:03}"),
        Projection::Shared(i) => format!("layer{i:02}_shared"),
        Projection::Head => "lm_head".into(),
    }
}

/// Runs `device`, then `reference` on the same input, records the difference and passes the
/// device's output on.
pub struct CheckingProjections<D, R> {
    pub device: D,
    pub reference: R,
    pub checks: Vec<KernelCheck>,
}

impl<D: Projections, R: Projections> CheckingProjections<D, R> {
    pub fn new(device: D, reference: R) -> Self {
        CheckingProjections {
            device,
            reference,
            checks: Vec::new(),
        }
    }
}

impl<D: Projections, R: Projections> Projections for CheckingProjections<D, R> {
    fn project(&mut self, p: Projection, x: &[f32], n: usize, out: &mut [f32]) -> Result<()> {
        self.device.project(p, x, n, out)?;
        let mut want = vec![0f32; out.len()];
        self.reference.project(p, x, n, &mut want)?;
        let (max_abs_diff, rel_err) = diff(out, &want);
        self.checks.push(KernelCheck {
            kernel: kernel_name(p),
            tokens: n,
            max_abs_diff,
            rel_err,
        });
        Ok(())
    }

    fn max_tokens(&self) -> usize {
        self.device.max_tokens().min(self.reference.max_tokens())
    }
}

/// Every kernel of `model` on `device` against the f32 reference, on the activations of
/// `prompt` (one prefill evaluation per kernel) and of the greedy token after it (decode, one
/// column): one check per kernel evaluation, in order.
pub fn check_kernels<D: Device>(
    model: &Arc<Model>,
    device: D,
    opts: &LoweringOptions,
    prompt: &[u32],
) -> Result<Vec<KernelCheck>> {
    let dev = DeviceProjections::new(model, device, opts, |_| {})?;
    let mut exec = ProjectionExecutor::new(
        model.clone(),
        CheckingProjections::new(dev, ReferenceProjections::new(model.clone())),
    );
    let mut state = exec.new_state(prompt.len() + 1)?;
    let mut logits = Vec::new();
    exec.forward(state.as_mut(), prompt, Logits::Last, &mut logits)?;
    exec.forward(
        state.as_mut(),
        &[argmax(&logits)],
        Logits::Last,
        &mut logits,
    )?;
    Ok(std::mem::take(&mut exec.projections_mut().checks))
}

/// The hidden state after each layer `0..=upto` of a forward pass over `prompt`.
fn hidden_states<P: Projections>(
    exec: &mut ProjectionExecutor<P>,
    prompt: &[u32],
    upto: usize,
) -> Result<Vec<Vec<f32>>> {
    let mut out = vec![Vec::new(); upto + 1];
    let mut state = exec.new_state(prompt.len())?;
    exec.forward_traced(
        state.as_mut(),
        prompt,
        Logits::None,
        &mut Vec::new(),
        &mut |l, x| {
            if l <= upto {
                out[l].extend_from_slice(x);
            }
        },
    )?;
    Ok(out)
}

/// The hidden state after each layer `0..=upto`, through `device` and through the f32 reference
/// (same CPU-side code), over `prompt`: per layer (max |diff|, relative error). Projection
/// strategy: the kernels as used. Fused strategy: one chunk per layer, so that every layer's
/// output leaves the device (the last layer's only as logits: it can be bisected up to the one
/// before).
pub fn compare_layers<D: Device>(
    model: &Arc<Model>,
    device: D,
    strategy: Strategy,
    opts: &LoweringOptions,
    prompt: &[u32],
    upto: usize,
) -> Result<Vec<(f32, f32)>> {
    let n = model.n_layers();
    let last = match strategy {
        Strategy::Projection => n,
        Strategy::Fused => n - 1,
    };
    if upto >= last {
        return Err(AneError::Unsupported(format!(
            "layer {upto} asked for; the model has {n} layers, comparable here up to {}",
            last.saturating_sub(1)
        )));
    }
    let got = match strategy {
        Strategy::Projection => hidden_states(
            &mut ProjectionExecutor::on_device(model.clone(), device, opts)?,
            prompt,
            upto,
        )?,
        Strategy::Fused => {
            let per_layer = LoweringOptions {
                chunk_layers: 1,
                ..opts.clone()
            };
            let mut e = FusedExecutor::new(model.clone(), device, &per_layer, |_| {})?;
            let mut out = vec![Vec::new(); upto + 1];
            let mut state = e.new_state(prompt.len())?;
            e.forward_traced(
                state.as_mut(),
                prompt,
                Logits::None,
                &mut Vec::new(),
                &mut |c, x| {
                    if c <= upto {
                        out[c].extend_from_slice(x);
                    }
                },
            )?;
            out
        }
    };
    let want = hidden_states(
        &mut ProjectionExecutor::new(model.clone(), ReferenceProjections::new(model.clone())),
        prompt,
        upto,
    )?;
    Ok(got.iter().zip(&want).map(|(a, b)| diff(a, b)).collect())
}

/// The fused strategy's programs against the f32 reference, over `prompt` and then its greedy
/// token: the hidden state each chunk hands on (against the reference's after the same layer)
/// and the last chunk's logits. Each chunk runs on the device path's own input, so errors
/// accumulate along the chunks, as they do in use.
pub fn check_chunks<D: Device>(
    model: &Arc<Model>,
    device: D,
    opts: &LoweringOptions,
    prompt: &[u32],
) -> Result<Vec<KernelCheck>> {
    let mut dev = FusedExecutor::new(model.clone(), device, opts, |_| {})?;
    let mut reference =
        ProjectionExecutor::new(model.clone(), ReferenceProjections::new(model.clone()));
    let chunks = dev.plan().chunks.clone();
    let (mut ds, mut rs) = (
        dev.new_state(prompt.len() + 1)?,
        reference.new_state(prompt.len() + 1)?,
    );
    let mut checks = Vec::new();
    let mut tokens = prompt.to_vec();
    for _ in 0..2 {
        let (mut got, mut want) = (
            vec![Vec::new(); chunks.len()],
            vec![Vec::new(); model.n_layers()],
        );
        let (mut dl, mut rl) = (Vec::new(), Vec::new());
        dev.forward_traced(ds.as_mut(), &tokens, Logits::Last, &mut dl, &mut |c, x| {
            got[c].extend_from_slice(x)
        })?;
        reference.forward_traced(rs.as_mut(), &tokens, Logits::Last, &mut rl, &mut |l, x| {
            want[l].extend_from_slice(x)
        })?;
        for (c, spec) in chunks.iter().enumerate() {
            let (max_abs_diff, rel_err) = if spec.head {
                diff(&dl, &rl)
            } else if let Some(l) = spec.last_layer() {
                diff(&got[c], &want[l])
            } else {
                // It ends inside a mixture split across chunks: the next chunk's check covers it.
                continue;
            };
            let kernel = if spec.head {
                format!("{} (logits)", spec.name)
            } else {
                spec.name.clone()
            };
            checks.push(KernelCheck {
                kernel,
                tokens: tokens.len(),
                max_abs_diff,
                rel_err,
            });
        }
        tokens = vec![argmax(&rl)];
    }
    Ok(checks)
}
