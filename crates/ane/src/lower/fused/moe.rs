//! A mixture of experts inside a fused chunk, every expert dense in the program (right for
//! small expert counts): the router's softmax, the top-k choice and the combine in the graph.
//!
//! The choice is the CPU engine's ([`anelm_cpu::moe::route`]): expert `e` is picked when fewer
//! than `k` experts rank before it — a higher probability, or an equal one at a lower index —
//! counted from pairwise comparisons (`greater`, `greater_equal`, cast to fp16), so no `topk`
//! op is needed. Every expert runs on every token; the ones not picked get weight 0. The
//! probabilities are fp16, so experts whose f32 probabilities differ by less than fp16
//! resolves may be chosen otherwise than by the CPU: the chunk outputs each mixture's router
//! logits `rl{l}`, its choice `rs{l}` and its normed input `rx{l}`, and takes `route{l}`
//! (`[1, E, 1, W]`, added to the ranks: 0, or `∓E` to force an expert in or out), so the host
//! can settle near-ties in f32 and evaluate again ([`crate::exec`]'s route settling).
//!
//! A mixture whose weights are more than one program holds is split by experts
//! ([`super::ChunkSpec::cut`] and [`super::ChunkSpec::resume`]): every part computes the whole
//! router and choice (the same fp16 ops on the same input, and the same forced choices) and
//! adds its experts' weighted outputs; the first part also holds the shared expert and reports
//! the router for the host.

use std::ops::Range;
use std::sync::Arc;

use anelm_mil::{DType, TensorType, ValueId, WeightData};
use anelm_model::plan::{Activation, GatedMlp, Moe};

use super::super::graph::activate;
use super::super::weights::linear_biases;
use super::super::WeightTarget;
use super::consts::LinearConst;
use super::graph::ChunkGraph;
use crate::error::Result;
use crate::support::moe_in_fused;

/// Most experts a fused chunk holds densely.
pub const MAX_DENSE_EXPERTS: usize = 64;

/// A mixture's weights as constants.
pub(super) struct MoeConsts {
    /// One row per expert, then the shared expert's gate row when it has one.
    router: LinearConst,
    /// The part's experts' gate and up rows (expert by expert), then the shared expert's.
    gate_up: LinearConst,
    /// The part's experts' downs, then the shared expert's.
    downs: Vec<LinearConst>,
    /// Hidden width of each of them.
    hidden: Vec<usize>,
    /// Which expert each of them is (None: the shared expert).
    ids: Vec<Option<usize>>,
    /// Whether this part reports the router (`rl`, `rs`, `rx`) for the host: the first.
    report: bool,
    /// `[E, E, 1, 1]`: 1 where `j < e` (a tie ranks the lower index first).
    lower: Arc<WeightData>,
    n_experts: usize,
    top_k: usize,
    norm_top_k: bool,
    shared_gate: bool,
}

/// A mixture's fp16 bytes for segmenting: what every part holds (the router, with the
/// shared expert's gate row), the shared expert (first part only), and each expert. Refuses
/// more experts than [`MAX_DENSE_EXPERTS`].
#[derive(Debug)]
pub(super) struct MoeBytes {
    pub router: u64,
    pub shared: u64,
    pub experts: Vec<u64>,
}

fn mlp_bytes(e: &GatedMlp) -> u64 {
    [&e.gate, &e.up, &e.down]
        .iter()
        .map(|l| (l.out_features() * l.in_features() * 2) as u64)
        .sum()
}

pub(super) fn moe_bytes(m: &Moe, index: usize) -> Result<MoeBytes> {
    if m.experts.len() > MAX_DENSE_EXPERTS {
        return Err(moe_in_fused(
            index,
            &format!("{} experts (at most {MAX_DENSE_EXPERTS})", m.experts.len()),
        ));
    }
    let gate = m.shared.as_ref().and_then(|s| s.gate.as_ref());
    Ok(MoeBytes {
        router: ((m.router.rows + usize::from(gate.is_some())) * m.router.cols * 2) as u64,
        shared: m.shared.as_ref().map_or(0, |s| mlp_bytes(&s.mlp)),
        experts: m.experts.iter().map(mlp_bytes).collect(),
    })
}

impl MoeConsts {
    /// The part of layer `index`'s mixture holding experts `part` (and, when it is the first,
    /// the shared expert).
    pub(super) fn new(
        m: &Moe,
        index: usize,
        policy: WeightTarget,
        part: Range<usize>,
    ) -> Result<MoeConsts> {
        moe_bytes(m, index)?;
        let ne = m.experts.len();
        let first = part.start == 0;
        let shared = m.shared.iter().filter(|_| first).map(|s| &s.mlp);
        let mlps: Vec<&GatedMlp> = m.experts[part.clone()].iter().chain(shared).collect();
        if mlps.iter().any(|e| e.down.bias.is_some()) {
            return Err(crate::error::AneError::Unsupported(format!(
                "layer {index}: an expert with a down-projection bias (the fused mixture weights \
                 the experts' hidden states, which would leave the bias unweighted)"
            )));
        }
        let shared_gate = m.shared.as_ref().and_then(|s| s.gate.as_ref());
        let mut router = vec![&m.router];
        router.extend(shared_gate);
        let ids = part
            .clone()
            .map(Some)
            .chain((first && m.shared.is_some()).then_some(None))
            .collect();
        let gate_up: Vec<_> = mlps.iter().flat_map(|e| [&e.gate, &e.up]).collect();
        Ok(MoeConsts {
            router: LinearConst::new(&router, None, policy)?,
            gate_up: LinearConst::new(
                &gate_up.iter().map(|l| &l.weight).collect::<Vec<_>>(),
                linear_biases(&gate_up),
                policy,
            )?,
            downs: mlps
                .iter()
                .map(|e| LinearConst::new(&[&e.down.weight], None, policy))
                .collect::<Result<_>>()?,
            hidden: mlps.iter().map(|e| e.up.out_features()).collect(),
            ids,
            report: first,
            lower: Arc::new(WeightData::f16_from_f32(
                &(0..ne * ne)
                    .map(|i| f32::from(u8::from(i / ne < i % ne)))
                    .collect::<Vec<_>>(),
            )),
            n_experts: ne,
            top_k: m.top_k.min(m.experts.len()),
            norm_top_k: m.norm_top_k,
            shared_gate: shared_gate.is_some(),
        })
    }

    pub(super) fn linears(&self) -> Vec<&LinearConst> {
        let mut v = vec![&self.router, &self.gate_up];
        v.extend(&self.downs);
        v
    }
}

impl ChunkGraph<'_> {
    /// The mixture of layer `li` over the normed `xn` (`[1, H, 1, W]`), its output times
    /// `out_scale`.
    pub(super) fn moe(
        &mut self,
        li: usize,
        p: &str,
        xn: ValueId,
        act: Activation,
        m: &MoeConsts,
        out_scale: f32,
    ) -> Result<ValueId> {
        let (w, ne) = (self.w as i32, m.n_experts);
        let alts = self.plan.alternatives.clone();
        let r = self.linear(&format!("{p}_router"), xn, &m.router, 1.0)?;
        let (logits, gate) = if m.shared_gate {
            let parts = alts.split(&mut self.f, &format!("{p}_rsplit"), r, 1, &[ne, 1])?;
            (parts[0], Some(parts[1]))
        } else {
            (r, None)
        };
        let weights = self.route(li, p, logits, m)?;
        if m.report {
            // The router's input for the host's f32 recheck.
            let rx = self.f.name_next(&format!("rx{li}")).identity(xn)?;
            self.f.output(rx)?;
        }
        let gu = self.linear(&format!("{p}_experts_gu"), xn, &m.gate_up, 1.0)?;
        let sizes: Vec<usize> = m.hidden.iter().flat_map(|&i| [i, i]).collect();
        let parts = alts.split(&mut self.f, &format!("{p}_egu"), gu, 1, &sizes)?;
        let mut y: Option<ValueId> = None;
        for (i, (down, id)) in m.downs.iter().zip(&m.ids).enumerate() {
            let q = match id {
                Some(e) => format!("{p}_e{e}"),
                None => format!("{p}_shared"),
            };
            let a = activate(&mut self.f, act, parts[2 * i], &format!("{q}_act"))?;
            let mut hidden = self
                .f
                .name_next(&format!("{q}_hidden"))
                .mul(a, parts[2 * i + 1])?;
            let scale = match (id, gate) {
                (Some(e), _) => Some(self.f.name_next(&format!("{q}_w")).slice_by_size(
                    weights,
                    &[0, *e as i32, 0, 0],
                    &[1, 1, 1, w],
                )?),
                (None, Some(g)) => Some(self.f.name_next(&format!("{q}_gate")).sigmoid(g)?),
                (None, None) => None,
            };
            if let Some(s) = scale {
                hidden = self.f.name_next(&format!("{q}_scaled")).mul(hidden, s)?;
            }
            let ye = self.linear(&format!("{q}_down"), hidden, down, out_scale)?;
            y = Some(match y {
                Some(acc) => self.f.name_next(&format!("{q}_sum")).add(acc, ye)?,
                None => ye,
            });
        }
        Ok(y.expect("a mixture has experts"))
    }

    /// Each expert's weight per column (`[1, E, 1, W]`): its softmax probability where it is
    /// among the top k, else 0; renormalised over the picked ones when the model says so.
    fn route(&mut self, li: usize, p: &str, logits: ValueId, m: &MoeConsts) -> Result<ValueId> {
        let (w, ne) = (self.w as i32, m.n_experts);
        let force = self.input(&format!("route{li}"))?;
        let f = &mut self.f;
        if m.report {
            let rl = f.name_next(&format!("rl{li}")).identity(logits)?;
            f.output(rl)?;
        }
        let mx = f
            .name_next(&format!("{p}_rmax"))
            .reduce("reduce_max", logits, &[1], true)?;
        let d = f.name_next(&format!("{p}_rd")).sub(logits, mx)?;
        let e = f.name_next(&format!("{p}_re")).exp(d)?;
        let z = f
            .name_next(&format!("{p}_rz"))
            .reduce("reduce_sum", e, &[1], true)?;
        let probs = f.name_next(&format!("{p}_probs")).real_div(e, z)?;
        // [j, e]: whether expert j ranks before expert e.
        let pj = f
            .name_next(&format!("{p}_pj"))
            .reshape(probs, &[ne as i32, 1, 1, w])?;
        let pe = f
            .name_next(&format!("{p}_pe"))
            .reshape(probs, &[1, ne as i32, 1, w])?;
        let gt = f.name_next(&format!("{p}_gtb")).greater(pj, pe)?;
        let gt = f.name_next(&format!("{p}_gt")).cast(gt, DType::Fp16)?;
        let ge = f
            .name_next(&format!("{p}_geb"))
            .binary("greater_equal", pj, pe)?;
        let ge = f.name_next(&format!("{p}_ge")).cast(ge, DType::Fp16)?;
        let lower = f.weight(
            &format!("{p}_lower"),
            TensorType::fp16([ne, ne, 1, 1]),
            m.lower.clone(),
        )?;
        let tie = f.name_next(&format!("{p}_tie")).sub(ge, gt)?;
        let tie = f.name_next(&format!("{p}_tiel")).mul(tie, lower)?;
        let before = f.name_next(&format!("{p}_before")).add(gt, tie)?;
        let rank = f
            .name_next(&format!("{p}_rank"))
            .reduce("reduce_sum", before, &[0], true)?;
        let rank = f.name_next(&format!("{p}_rankf")).add(rank, force)?;
        let k = f.scalar(&format!("{p}_k"), DType::Fp16, m.top_k as f32 - 0.5)?;
        let sel = f.name_next(&format!("{p}_selb")).less(rank, k)?;
        let sel = f.name_next(&format!("{p}_sel")).cast(sel, DType::Fp16)?;
        if m.report {
            let rs = f.name_next(&format!("rs{li}")).identity(sel)?;
            f.output(rs)?;
        }
        let mut weights = f.name_next(&format!("{p}_wsel")).mul(probs, sel)?;
        if m.norm_top_k {
            let s = f
                .name_next(&format!("{p}_wsum"))
                .reduce("reduce_sum", weights, &[1], true)?;
            weights = f.name_next(&format!("{p}_wnorm")).real_div(weights, s)?;
        }
        Ok(weights)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anelm_model::plan::{GatedMlp, Linear};
    use anelm_model::Weight;

    fn moe(experts: usize) -> Moe {
        let lin = || Linear {
            weight: Weight::from_f32("w", 1, 1, &[0.5]),
            bias: None,
        };
        Moe {
            act: Activation::Silu,
            router: Weight::from_f32("router", experts, 1, &vec![0.0; experts]),
            experts: (0..experts)
                .map(|_| GatedMlp {
                    gate: lin(),
                    up: lin(),
                    down: lin(),
                })
                .collect(),
            top_k: 2,
            norm_top_k: true,
            shared: None,
        }
    }

    #[test]
    fn many_experts_are_refused_with_the_way_out() {
        let b = moe_bytes(&moe(4), 0).unwrap();
        assert_eq!((b.router, b.shared, b.experts), (8, 0, vec![6; 4]));
        let e = moe_bytes(&moe(MAX_DENSE_EXPERTS + 1), 3)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("layer 3")
                && e.contains("65 experts")
                && e.contains("--strategy projection"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
    }
}
