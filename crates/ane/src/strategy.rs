//! The two ways the ANE path runs a model, behind one executor: projection kernels (the linear
//! layers on the device, the rest on the CPU; about three dispatches per layer) or fused layer
//! chunks (whole layers on the device; one dispatch per chunk).

use std::sync::Arc;

use anelm_model::{ExecError, Executor, KvState, Logits, Model};

use crate::cache::CacheReport;
use crate::device::Device;
use crate::error::Result;
use crate::exec::{DeviceProjections, FusedExecutor, ProjectionExecutor};
use crate::lower::LoweringOptions;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    Projection,
    Fused,
}

impl Strategy {
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Projection => "projection",
            Strategy::Fused => "fused",
        }
    }
}

/// A model compiled for a device under a strategy.
pub enum AneExecutor<D: Device> {
    Projection(ProjectionExecutor<DeviceProjections<D>>),
    Fused(Box<FusedExecutor<D>>),
}

impl<D: Device> AneExecutor<D> {
    /// Lowers `model` and compiles every program on `device`.
    pub fn new(
        model: Arc<Model>,
        device: D,
        strategy: Strategy,
        opts: &LoweringOptions,
    ) -> Result<Self> {
        Ok(match strategy {
            Strategy::Projection => {
                AneExecutor::Projection(ProjectionExecutor::on_device(model, device, opts)?)
            }
            Strategy::Fused => {
                AneExecutor::Fused(Box::new(FusedExecutor::new(model, device, opts, |_| {})?))
            }
        })
    }

    fn inner(&mut self) -> &mut dyn Executor {
        match self {
            AneExecutor::Projection(e) => e,
            AneExecutor::Fused(e) => e.as_mut(),
        }
    }
}

/// A model compiled for a device, as the CLI and the engine see it: an executor that also tells
/// how it runs on the device.
pub trait DevicePath: Executor {
    fn strategy(&self) -> Strategy;
    /// Device evaluations one decoded token costs.
    fn dispatches_per_token(&self) -> usize;
    /// Device evaluations so far.
    fn dispatches(&self) -> u64;
    /// Of [`Self::dispatches`], evaluations repeated to force a router choice settled in f32
    /// (fused mixtures; the projection strategy routes on the host and repeats none).
    fn route_redos(&self) -> u64 {
        0
    }
    /// Most tokens one pass of the prefill programs takes.
    fn prefill_width(&self) -> usize;
    /// Programs compiled.
    fn programs(&self) -> usize;
    /// What the lowering made of each weight tensor the programs hold.
    fn weight_reports(&self) -> Vec<crate::lower::TensorReport>;
    /// Which programs were compiled and which loaded from the program cache.
    fn cache_report(&self) -> &CacheReport;
    /// Whether near-tied top logits are recomputed in f32 on the CPU (on by default; off, the
    /// logits are the device's alone).
    fn set_settle_ties(&mut self, on: bool);
}

impl<D: Device> DevicePath for AneExecutor<D> {
    fn strategy(&self) -> Strategy {
        match self {
            AneExecutor::Projection(_) => Strategy::Projection,
            AneExecutor::Fused(_) => Strategy::Fused,
        }
    }

    fn dispatches_per_token(&self) -> usize {
        match self {
            AneExecutor::Projection(e) => e.projections().dispatches_per_token(e.model()),
            AneExecutor::Fused(e) => e.plan().dispatches_per_token(),
        }
    }

    fn dispatches(&self) -> u64 {
        match self {
            AneExecutor::Projection(e) => e.projections().dispatches(),
            AneExecutor::Fused(e) => e.dispatches(),
        }
    }

    fn route_redos(&self) -> u64 {
        match self {
            AneExecutor::Projection(_) => 0,
            AneExecutor::Fused(e) => e.route_redos(),
        }
    }

    fn prefill_width(&self) -> usize {
        match self {
            AneExecutor::Projection(e) => crate::exec::Projections::max_tokens(e.projections()),
            AneExecutor::Fused(e) => e.plan().width,
        }
    }

    fn programs(&self) -> usize {
        match self {
            AneExecutor::Projection(e) => e.projections().n_kernels(),
            AneExecutor::Fused(e) => e.plan().chunks.len(),
        }
    }

    fn weight_reports(&self) -> Vec<crate::lower::TensorReport> {
        match self {
            AneExecutor::Projection(e) => e.projections().weight_reports().to_vec(),
            AneExecutor::Fused(e) => e.weight_reports().to_vec(),
        }
    }

    fn cache_report(&self) -> &CacheReport {
        match self {
            AneExecutor::Projection(e) => e.projections().cache_report(),
            AneExecutor::Fused(e) => e.cache_report(),
        }
    }

    fn set_settle_ties(&mut self, on: bool) {
        match self {
            AneExecutor::Projection(e) => e.set_settle_ties(on),
            AneExecutor::Fused(e) => e.set_settle_ties(on),
        }
    }
}

impl<D: Device> Executor for AneExecutor<D> {
    fn new_state(&self, capacity: usize) -> std::result::Result<Box<dyn KvState>, ExecError> {
        match self {
            AneExecutor::Projection(e) => e.new_state(capacity),
            AneExecutor::Fused(e) => e.new_state(capacity),
        }
    }

    fn forward(
        &mut self,
        state: &mut dyn KvState,
        tokens: &[u32],
        logits: Logits,
        out: &mut Vec<f32>,
    ) -> std::result::Result<(), ExecError> {
        self.inner().forward(state, tokens, logits, out)
    }

    fn forward_batch(
        &mut self,
        states: &mut [&mut dyn KvState],
        tokens: &[u32],
        out: &mut Vec<f32>,
    ) -> std::result::Result<(), ExecError> {
        self.inner().forward_batch(states, tokens, out)
    }

    fn force_routes(&mut self, routes: &[anelm_model::RouteChoice]) -> bool {
        self.inner().force_routes(routes)
    }

    fn vocab_size(&self) -> usize {
        match self {
            AneExecutor::Projection(e) => e.vocab_size(),
            AneExecutor::Fused(e) => e.vocab_size(),
        }
    }
}

impl<D: Device> Drop for AneExecutor<D> {
    fn drop(&mut self) {
        tracing::info!(
            strategy = self.strategy().name(),
            dispatches = self.dispatches(),
            per_token = self.dispatches_per_token(),
            "ANE path: {} device evaluations, {} per decoded token",
            self.dispatches(),
            self.dispatches_per_token()
        );
    }
}
