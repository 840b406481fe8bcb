//! The feed-forward half of one layer: a dense gated or plain MLP, or a mixture of experts
//! (routed experts over the tokens sent to them, and an optional gated shared expert).

use std::ops::Range;

use anelm_model::plan::{Activation, Ffn, GatedMlp, Layer, Linear, Moe};
use anelm_model::ROUTE_NEAR_TIE;

use super::layer::{Forward, Src};
use crate::moe::{boundary_gap, route};
use crate::shared::SharedSlice;
use crate::vecmath::{gate, Gate};

impl Forward<'_> {
    /// A mixture of experts: route every token, run each chosen expert over the tokens routed
    /// to it, sum the weighted outputs (and the gated shared expert) into `moe_acc`.
    pub(super) unsafe fn moe(&mut self, layer: &Layer, moe: &Moe, li: usize) {
        let (ctx, v, n) = (self.ctx, self.v, self.n);
        let h = self.m.config.hidden_size;
        let n_exp = moe.router.rows;
        self.norm_into_xn(&layer.ffn_norm);
        self.prepare(Src::Xn, h, 0..n, &[&moe.router]);
        self.product(&moe.router, None, &v.r, 1, |_, _| {});
        ctx.barrier();
        {
            let p = &mut *self.p;
            p.moe_x[..n * h].copy_from_slice(&p.xn[..n * h]);
            p.moe_acc[..n * h].fill(0.0);
            p.routes.iter_mut().for_each(Vec::clear);
            for t in 0..n {
                route(
                    v.r.range(t * n_exp..(t + 1) * n_exp),
                    moe.top_k,
                    moe.norm_top_k,
                    &mut p.probs,
                    &mut p.picked,
                );
                for &(e, w) in &p.picked {
                    p.routes[e].push((t, w));
                }
                let gap = boundary_gap(v.r.range(t * n_exp..(t + 1) * n_exp), moe.top_k);
                p.route_gap[t] = p.route_gap[t].min(gap);
                if gap < ROUTE_NEAR_TIE {
                    let mut experts: Vec<usize> = p.picked.iter().map(|&(e, _)| e).collect();
                    experts.sort_unstable();
                    p.route_ties.push((t, li, experts));
                }
            }
        }
        for (e, expert) in moe.experts.iter().enumerate() {
            let routes = std::mem::take(&mut self.p.routes[e]);
            if !routes.is_empty() {
                let rows: Vec<usize> = routes.iter().map(|r| r.0).collect();
                self.expert(moe.act, expert, &rows, |i| routes[i].1, h);
            }
            self.p.routes[e] = routes;
        }
        if let Some(shared) = &moe.shared {
            // sigmoid(x · gate) per token, from this thread's copy of the inputs.
            let mut scale = vec![1f32; n];
            if let Some(gw) = &shared.gate {
                let p = &mut *self.p;
                let row = &mut p.scratch[..h];
                gw.dequantize_row(0, row)
                    .expect("gate rows are whole blocks (checked at load)");
                for (t, sc) in scale.iter_mut().enumerate() {
                    let dot: f32 = p.moe_x[t * h..(t + 1) * h]
                        .iter()
                        .zip(row.iter())
                        .map(|(x, w)| x * w)
                        .sum();
                    *sc = 1.0 / (1.0 + (-dot).exp());
                }
            }
            let rows: Vec<usize> = (0..n).collect();
            self.expert(moe.act, &shared.mlp, &rows, |i| scale[i], h);
        }
        self.n = n;
        self.residual_moe(layer.post_ffn_norm.as_ref());
    }

    /// Runs `mlp` over the tokens `rows` (of `moe_x`) and adds `weight(i)` times the output of
    /// the `i`-th into `moe_acc`.
    pub(super) unsafe fn expert(
        &mut self,
        act: Activation,
        mlp: &GatedMlp,
        rows: &[usize],
        weight: impl Fn(usize) -> f32,
        h: usize,
    ) {
        let v = self.v;
        let count = rows.len();
        {
            let p = &mut *self.p;
            for (i, &t) in rows.iter().enumerate() {
                p.xn[i * h..(i + 1) * h].copy_from_slice(&p.moe_x[t * h..(t + 1) * h]);
            }
        }
        self.n = count;
        self.mlp(act, Some(&mlp.gate), &mlp.up, &mlp.down);
        let p = &mut *self.p;
        let o = v.o.range(0..count * h);
        for (i, &t) in rows.iter().enumerate() {
            let w = weight(i);
            p.moe_acc[t * h..(t + 1) * h]
                .iter_mut()
                .zip(&o[i * h..(i + 1) * h])
                .for_each(|(a, y)| *a += w * y);
        }
    }

    pub(super) unsafe fn ffn(&mut self, layer: &Layer, li: usize) {
        match &layer.ffn {
            Ffn::Gated {
                act,
                gate,
                up,
                down,
            } => self.dense_ffn(layer, *act, Some(gate), up, down),
            Ffn::Plain { act, up, down } => self.dense_ffn(layer, *act, None, up, down),
            Ffn::Moe(moe) => self.moe(layer, moe, li),
        }
    }

    /// `down(act(gate(x)) * up(x))`, or `down(act(up(x)))` without a gate.
    pub(super) unsafe fn dense_ffn(
        &mut self,
        layer: &Layer,
        act: Activation,
        gate_lin: Option<&Linear>,
        up: &Linear,
        down: &Linear,
    ) {
        self.norm_into_xn(&layer.ffn_norm);
        self.mlp(act, gate_lin, up, down);
        self.residual(layer.post_ffn_norm.as_ref());
    }

    /// `o = down(act(gate(xn)) * up(xn))`, or `down(act(up(xn)))` without a gate, for the
    /// tokens in this thread's `xn`. The activation runs on each tile of gate and up rows as
    /// soon as both are computed, so it costs no barrier of its own.
    pub(super) unsafe fn mlp(
        &mut self,
        act: Activation,
        gate_lin: Option<&Linear>,
        up: &Linear,
        down: &Linear,
    ) {
        let (ctx, v, n) = (self.ctx, self.v, self.n);
        let (h, f) = (self.m.config.hidden_size, up.out_features());
        let (act, isa) = (gate_of(act), self.isa);
        let activate =
            |u: Option<&SharedSlice<'_, f32>>, rows: Range<usize>, tokens: Range<usize>| {
                for t in tokens {
                    let at = t * f + rows.start..t * f + rows.end;
                    gate(isa, act, v.g.range_mut(at.clone()), u.map(|u| u.range(at)));
                }
            };
        match gate_lin {
            Some(g) => {
                self.prepare(Src::Xn, h, 0..n, &[&g.weight, &up.weight]);
                let gw = (&g.weight, g.bias.as_deref(), &v.g);
                let uw = (&up.weight, up.bias.as_deref(), &v.u);
                self.products([gw, uw], 1, |r, t| activate(Some(&v.u), r, t));
            }
            None => {
                self.prepare(Src::Xn, h, 0..n, &[&up.weight]);
                self.product(&up.weight, up.bias.as_deref(), &v.g, 1, |r, t| {
                    activate(None, r, t)
                });
            }
        }
        ctx.barrier();
        self.prepare(Src::Shared(&v.g), f, 0..n, &[&down.weight]);
        self.linear(down, &v.o);
        ctx.barrier();
    }
}

fn gate_of(act: Activation) -> Gate {
    match act {
        Activation::Silu => Gate::Silu,
        Activation::GeluTanh => Gate::GeluTanh,
    }
}
