//! `verify`: a model through a device executor and through the CPU engine on the same prompts —
//! logits after each prompt and along greedy decoding, compared.

use std::sync::Arc;

use anelm_cpu::CpuExecutor;
use anelm_model::{Executor, Model};

use crate::compare::{compare_greedy, PromptCase, PromptComparison};
use crate::dequant::{dequantized, dequantized_as};
use crate::error::Result;
use crate::lower::encode::WeightTarget;

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
    /// Under a compressing weight policy: the same prompts against the uncompressed model
    /// (the file's weights in f32), to see what the compression costs.
    pub uncompressed: Option<Vec<PromptComparison>>,
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

    /// [`Self::max_rel_err`] away from the reference's router near-ties.
    pub fn max_rel_err_clear(&self) -> f32 {
        self.prompts
            .iter()
            .map(|p| p.max_rel_err_clear)
            .fold(0.0, f32::max)
    }

    pub fn same_but_near_ties(&self) -> bool {
        self.prompts.iter().all(|p| p.same_but_near_ties())
    }

    /// The largest relative error against the uncompressed model, when it was measured.
    pub fn uncompressed_rel_err(&self) -> Option<f32> {
        (self.uncompressed.as_ref()).map(|ps| ps.iter().map(|p| p.max_rel_err).fold(0.0, f32::max))
    }
}

/// Runs `prompts` (and `n_greedy` greedy tokens each) through `device` (lowered with `weights`)
/// and the CPU engine on `threads` threads (0: one per core). The f32 reference holds the
/// weights the programs define under `weights`; a compressing policy is also compared with the
/// uncompressed model.
pub fn verify(
    model: &Arc<Model>,
    device: &mut dyn Executor,
    prompts: &[PromptCase],
    n_greedy: usize,
    reference: Reference,
    threads: usize,
    weights: WeightTarget,
) -> Result<VerifyReport> {
    let mut cpu = match reference {
        Reference::CpuF32 => CpuExecutor::new(Arc::new(dequantized_as(model, weights)?), threads),
        Reference::Cpu => CpuExecutor::new(model.clone(), threads),
    };
    let (cases, device_seconds, reference_seconds) =
        compare_greedy(device, &mut cpu, prompts, n_greedy)?;
    let uncompressed = if weights.policy.compresses() && reference == Reference::CpuF32 {
        drop(cpu);
        let mut plain = CpuExecutor::new(Arc::new(dequantized(model)?), threads);
        Some(compare_greedy(device, &mut plain, prompts, n_greedy)?.0)
    } else {
        None
    };
    Ok(VerifyReport {
        reference,
        prompts: cases,
        uncompressed,
        device_seconds,
        reference_seconds,
    })
}
