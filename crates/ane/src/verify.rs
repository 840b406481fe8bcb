//! `verify`: a model through a device executor and through the CPU engine on the same prompts —
//! logits after each prompt and along greedy decoding, compared.

use std::sync::Arc;

use anelm_cpu::CpuExecutor;
use anelm_model::{Executor, Model};

use crate::compare::{compare_greedy, PromptCase, PromptComparison};
use crate::dequant::dequantized;
use crate::error::Result;

/// What the device path is compared with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reference {
    /// The CPU engine on the dequantised weights: f32 activations and KV cache, exact
    /// arithmetic on the weights the kernels hold.
    CpuF32,
    /// The CPU engine as it runs the model (8-bit activations for quantised weights, f16 KV).
    Cpu,
}

impl Reference {
    pub fn name(self) -> &'static str {
        match self {
            Reference::CpuF32 => "cpu-f32",
            Reference::Cpu => "cpu",
        }
    }
}

pub struct VerifyReport {
    pub reference: Reference,
    pub prompts: Vec<PromptComparison>,
    pub device_seconds: f64,
    pub reference_seconds: f64,
}

impl VerifyReport {
    pub fn max_rel_err(&self) -> f32 {
        self.prompts
            .iter()
            .map(|p| p.max_rel_err)
            .fold(0.0, f32::max)
    }

    pub fn max_abs_diff(&self) -> f32 {
        self.prompts
            .iter()
            .map(|p| p.max_abs_diff)
            .fold(0.0, f32::max)
    }

    pub fn greedy_same(&self) -> bool {
        self.prompts.iter().all(|p| p.greedy_same())
    }

    pub fn same_but_near_ties(&self) -> bool {
        self.prompts.iter().all(|p| p.same_but_near_ties())
    }
}

/// Runs `prompts` (and `n_greedy` greedy tokens each) through `device` and the CPU engine on
/// `threads` threads (0: one per core).
pub fn verify(
    model: &Arc<Model>,
    device: &mut dyn Executor,
    prompts: &[PromptCase],
    n_greedy: usize,
    reference: Reference,
    threads: usize,
) -> Result<VerifyReport> {
    let mut cpu = match reference {
        Reference::CpuF32 => CpuExecutor::new(Arc::new(dequantized(model)?), threads),
        Reference::Cpu => CpuExecutor::new(model.clone(), threads),
    };
    let (prompts, device_seconds, reference_seconds) =
        compare_greedy(device, &mut cpu, prompts, n_greedy)?;
    Ok(VerifyReport {
        reference,
        prompts,
        device_seconds,
        reference_seconds,
    })
}
