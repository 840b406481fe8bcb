//! The graph of one function of a chunk: norms, attention and FFN of each layer, built op by
//! op over the chunk's shared constants.

use std::sync::Arc;

use anelm_mil::{DType, FunctionBuilder, TensorType, ValueId, WeightData};
use anelm_model::plan::{Attention, NormKind};
use anelm_model::Model;

use super::super::graph::{activate, linear, normalize};
use super::consts::{FfnConsts, LayerConsts, LinearConst, NormConst};
use super::{FusedPlan, KvForm};
use crate::error::{AneError, Result};
use crate::support::{attention, ffn_activation};

/// Builds one function of a chunk.
pub(super) struct ChunkGraph<'a> {
    pub(super) f: FunctionBuilder,
    pub(super) model: &'a Model,
    pub(super) plan: &'a FusedPlan,
    /// Columns of this function.
    pub(super) w: usize,
    /// The batch function's columns, each a sequence over its own cache and recurrent state
    /// (inputs `k{l}_s{j}`, `conv{l}_s{j}`, `s{l}_s{j}` of slot `j`); 0: the columns are one
    /// sequence's consecutive tokens.
    pub(super) slots: usize,
    pub(super) form: KvForm,
    /// Inputs created on first use: (name, value).
    pub(super) inputs: Vec<(String, ValueId)>,
}

impl ChunkGraph<'_> {
    /// The input `name`, declared by [`build_function`] before any op.
    pub(super) fn input(&self, name: &str) -> Result<ValueId> {
        self.inputs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
            .ok_or_else(|| AneError::Unsupported(format!("input {name} was not declared")))
    }

    pub(super) fn declare(&mut self, name: &str, ty: TensorType, state: bool) -> Result<()> {
        if self.inputs.iter().all(|(n, _)| n != name) {
            let v = if state {
                self.f.state_input(name, ty)?
            } else {
                self.f.input(name, ty)?
            };
            self.inputs.push((name.to_string(), v));
        }
        Ok(())
    }

    fn constant(
        &mut self,
        name: &str,
        shape: Vec<usize>,
        data: &Arc<WeightData>,
    ) -> Result<ValueId> {
        Ok(self.f.weight(name, TensorType::fp16(shape), data.clone())?)
    }

    /// RMSNorm or LayerNorm of `x` over `axis` (of length `n`), weight shaped `wshape`. The
    /// input is first divided by its largest magnitude: no square can overflow.
    pub(super) fn norm(
        &mut self,
        p: &str,
        x: ValueId,
        axis: i32,
        n: usize,
        wshape: Vec<usize>,
        c: &NormConst,
    ) -> Result<ValueId> {
        let f = &mut self.f;
        let a = self.plan.alternatives.abs(f, &format!("{p}_abs"), x)?;
        let m = f
            .name_next(&format!("{p}_max"))
            .reduce("reduce_max", a, &[axis], true)?;
        let m = f
            .name_next(&format!("{p}_maxf"))
            .binary_scalar("add", m, 6.1e-5)?;
        let one = f.scalar(&format!("{p}_one"), DType::Fp16, 1.0)?;
        let r = f.name_next(&format!("{p}_r")).real_div(one, m)?;
        let xs = f.name_next(&format!("{p}_xs")).mul(x, r)?;
        // eps scales with the input: (r · √eps)², which stays within fp16 where eps alone may not.
        let er = f
            .name_next(&format!("{p}_er"))
            .binary_scalar("mul", r, c.eps.sqrt())?;
        let eps = f.name_next(&format!("{p}_eps")).mul(er, er)?;
        let centred = match c.kind {
            NormKind::Rms => xs,
            NormKind::Layer => {
                let s = f
                    .name_next(&format!("{p}_sum"))
                    .reduce("reduce_sum", xs, &[axis], true)?;
                let mean =
                    f.name_next(&format!("{p}_mean"))
                        .binary_scalar("mul", s, 1.0 / n as f32)?;
                f.name_next(&format!("{p}_d")).sub(xs, mean)?
            }
        };
        let sq = f.name_next(&format!("{p}_sq")).mul(centred, centred)?;
        let ss = f
            .name_next(&format!("{p}_ss"))
            .reduce("reduce_sum", sq, &[axis], true)?;
        let ms = f
            .name_next(&format!("{p}_ms"))
            .binary_scalar("mul", ss, 1.0 / n as f32)?;
        let v = f.name_next(&format!("{p}_v")).add(ms, eps)?;
        let inv = f
            .name_next(&format!("{p}_inv"))
            .binary_scalar("pow", v, -0.5)?;
        let y = f.name_next(&format!("{p}_n")).mul(centred, inv)?;
        let wt = self.constant(&format!("{p}_w"), wshape.clone(), &c.weight)?;
        let mut y = self.f.name_next(&format!("{p}_y")).mul(y, wt)?;
        if let Some(b) = &c.bias {
            let bt = self.constant(&format!("{p}_b"), wshape, b)?;
            y = self.f.name_next(&format!("{p}_yb")).add(y, bt)?;
        }
        Ok(y)
    }

    /// A linear over a `[1, C, 1, W]` value, its input normalised per column; the result is
    /// multiplied by `out_scale`.
    pub(super) fn linear(
        &mut self,
        name: &str,
        x: ValueId,
        c: &LinearConst,
        out_scale: f32,
    ) -> Result<ValueId> {
        let (xs, back) = normalize(
            &mut self.f,
            name,
            x,
            &[1],
            c.l1,
            out_scale,
            &self.plan.alternatives,
        )?;
        linear(&mut self.f, name, xs, Some(back), &c.w, c.bias.clone())
    }

    /// Half-split RoPE of `t` (`[1, heads, hd, W]`) over its first `dims` dimensions.
    fn rope(&mut self, p: &str, t: ValueId, heads: usize, hd: usize, r: usize) -> Result<ValueId> {
        let (w, dims) = (self.w as i32, self.plan.ropes[r].dims);
        let d2 = dims / 2;
        let cos = self.input(&format!("cos{r}"))?;
        let sin = self.input(&format!("sin{r}"))?;
        let f = &mut self.f;
        let cos = f
            .name_next(&format!("{p}_cos"))
            .reshape(cos, &[1, 1, d2 as i32, w])?;
        let sin = f
            .name_next(&format!("{p}_sin"))
            .reshape(sin, &[1, 1, d2 as i32, w])?;
        let (h, d2i) = (heads as i32, d2 as i32);
        let x1 =
            f.name_next(&format!("{p}_x1"))
                .slice_by_size(t, &[0, 0, 0, 0], &[1, h, d2i, w])?;
        let x2 =
            f.name_next(&format!("{p}_x2"))
                .slice_by_size(t, &[0, 0, d2i, 0], &[1, h, d2i, w])?;
        let a = f.name_next(&format!("{p}_a")).mul(x1, cos)?;
        let b = f.name_next(&format!("{p}_b")).mul(x2, sin)?;
        let r1 = f.name_next(&format!("{p}_r1")).sub(a, b)?;
        let c = f.name_next(&format!("{p}_c")).mul(x2, cos)?;
        let d = f.name_next(&format!("{p}_d")).mul(x1, sin)?;
        let r2 = f.name_next(&format!("{p}_r2")).add(c, d)?;
        let mut parts = vec![r1, r2];
        if dims < hd {
            parts.push(f.name_next(&format!("{p}_pass")).slice_by_size(
                t,
                &[0, 0, dims as i32, 0],
                &[1, h, (hd - dims) as i32, w],
            )?);
        }
        (self.plan.alternatives).concat(f, &format!("{p}_rot"), &parts, 2)
    }

    /// Positions attention runs over: the cache and the new tokens side by side (inputs form),
    /// or the state, which holds the prefill width beyond the context so that both functions
    /// share one state shape and a write near the end stays inside it (states form).
    pub(super) fn kv_len(&self) -> usize {
        match self.form {
            KvForm::Inputs if self.slots > 0 => self.plan.context + 1,
            KvForm::Inputs => self.plan.context + self.w,
            KvForm::States => self.plan.context + self.plan.width,
        }
    }

    /// The layer's keys (`k4`, `[1, nkv, hd, W]`) and values with the cached ones:
    /// `[nkv, hd, kv_len]` each. States form: written into the states first.
    fn keys_values(
        &mut self,
        li: usize,
        a: &Attention,
        k4: ValueId,
        v4: ValueId,
    ) -> Result<(ValueId, ValueId)> {
        let (w, kvd) = (self.w, a.n_kv_heads * a.head_dim);
        let (nkv, hd, total) = (a.n_kv_heads as i32, a.head_dim as i32, self.kv_len() as i32);
        let mut out = Vec::new();
        for (kind, new) in [("k", k4), ("v", v4)] {
            let name = format!("{kind}{li}");
            let flat = self
                .f
                .name_next(&format!("{name}_flat"))
                .reshape(new, &[1, kvd as i32, 1, w as i32])?;
            let all = match self.form {
                KvForm::Inputs => {
                    self.f.rename(flat, &format!("{name}_new"))?;
                    self.f.output(flat)?;
                    let cache = self.input(&name)?;
                    (self.plan.alternatives).concat(
                        &mut self.f,
                        &format!("{name}_all"),
                        &[cache, flat],
                        3,
                    )?
                }
                KvForm::States => {
                    let (state, begin, end) = (
                        self.input(&name)?,
                        self.input("kv_begin")?,
                        self.input("kv_end")?,
                    );
                    let cache = self
                        .f
                        .name_next(&format!("{name}_read"))
                        .read_state(state)?;
                    let upd = self
                        .f
                        .name_next(&format!("{name}_upd"))
                        .slice_update_at(cache, flat, begin, end)?;
                    self.f
                        .name_next(&format!("{name}_all"))
                        .update_state(state, upd)?
                }
            };
            out.push(
                self.f
                    .name_next(&format!("{name}_heads"))
                    .reshape(all, &[nkv, hd, total])?,
            );
        }
        Ok((out[0], out[1]))
    }

    pub(super) fn attention(&mut self, li: usize, x: ValueId, c: &LayerConsts) -> Result<ValueId> {
        let m = self.model;
        let a = attention(&m.layers[li], li)?;
        let (h, w) = (m.config.hidden_size, self.w);
        let (nh, nkv, hd) = (a.n_heads, a.n_kv_heads, a.head_dim);
        let (qd, kvd) = (nh * hd, nkv * hd);
        let p = format!("l{li}");
        let xn = self.norm(
            &format!("{p}_attn_norm"),
            x,
            1,
            h,
            vec![1, h, 1, 1],
            &c.attn_norm,
        )?;
        let qkv = self.linear(&format!("{p}_qkv"), xn, &c.qkv, 1.0)?;
        let mut sizes = vec![qd, kvd, kvd];
        if a.output_gate.is_some() {
            sizes.push(qd);
        }
        let parts =
            (self.plan.alternatives).split(&mut self.f, &format!("{p}_split"), qkv, 1, &sizes)?;
        let (wi, hdi) = (w as i32, hd as i32);
        let mut q = self
            .f
            .name_next(&format!("{p}_q4"))
            .reshape(parts[0], &[1, nh as i32, hdi, wi])?;
        let mut k = self
            .f
            .name_next(&format!("{p}_k4"))
            .reshape(parts[1], &[1, nkv as i32, hdi, wi])?;
        let v = self
            .f
            .name_next(&format!("{p}_v4"))
            .reshape(parts[2], &[1, nkv as i32, hdi, wi])?;
        if let Some(n) = &c.q_norm {
            q = self.norm(&format!("{p}_q_norm"), q, 2, hd, vec![1, 1, hd, 1], n)?;
        }
        if let Some(n) = &c.k_norm {
            k = self.norm(&format!("{p}_k_norm"), k, 2, hd, vec![1, 1, hd, 1], n)?;
        }
        if let Some(r) = self.plan.layer_rope[li] {
            q = self.rope(&format!("{p}_qr"), q, nh, hd, r)?;
            k = self.rope(&format!("{p}_kr"), k, nkv, hd, r)?;
        }
        let total = self.kv_len() as i32;
        let mask = self.input(&format!("mask{}", self.plan.layer_window[li]))?;
        let mut o = if self.slots == 0 {
            let (kk, vv) = self.keys_values(li, a, k, v)?;
            let mask = self
                .f
                .name_next(&format!("{p}_mask"))
                .reshape(mask, &[1, 1, wi, total])?;
            self.attend(&p, a, q, (kk, vv), mask, w)?
        } else {
            self.attend_per_slot(li, a, q, (k, v), mask)?
        };
        if a.output_gate.is_some() {
            let f = &mut self.f;
            let g = f.name_next(&format!("{p}_ogate")).sigmoid(parts[3])?;
            o = f.name_next(&format!("{p}_gated")).mul(o, g)?;
        }
        let shift = if c.post_attn_norm.is_some() {
            1.0
        } else {
            self.shift()
        };
        let mut y = self.linear(&format!("{p}_o"), o, &c.o, shift)?;
        if let Some(n) = &c.post_attn_norm {
            y = self.norm(&format!("{p}_post_attn"), y, 1, h, vec![1, h, 1, 1], n)?;
        }
        Ok(self.f.name_next(&format!("{p}_h")).add(x, y)?)
    }

    /// Grouped-query attention of `q` (`[1, nh, hd, w]`, roped) over `kk`/`vv`
    /// (`[nkv, hd, total]`, the cached positions and the new ones) under `mask`
    /// (`[1, 1, w, total]`): `[1, nh·hd, 1, w]`.
    fn attend(
        &mut self,
        p: &str,
        a: &Attention,
        q: ValueId,
        (kk, vv): (ValueId, ValueId),
        mask: ValueId,
        w: usize,
    ) -> Result<ValueId> {
        let (nh, nkv, hd) = (a.n_heads, a.n_kv_heads, a.head_dim);
        let (qd, g) = (nh * hd, nh / nkv);
        let (wi, hdi) = (w as i32, hd as i32);
        let total = self.kv_len();
        let f = &mut self.f;
        let q = f
            .name_next(&format!("{p}_qs"))
            .binary_scalar("mul", q, a.scale)?;
        // Queries grouped per KV head: the g heads of a group become g·W rows.
        let q = f
            .name_next(&format!("{p}_qg"))
            .reshape(q, &[nkv as i32, g as i32, hdi, wi])?;
        let q = f
            .name_next(&format!("{p}_qt"))
            .transpose(q, &[0, 2, 1, 3])?;
        let q = f
            .name_next(&format!("{p}_qm"))
            .reshape(q, &[nkv as i32, hdi, (g * w) as i32])?;
        let mut s =
            (self.plan.alternatives).matmul(f, &format!("{p}_scores"), q, kk, true, false)?;
        if let Some(cap) = a.softcap {
            let t = f
                .name_next(&format!("{p}_capin"))
                .binary_scalar("mul", s, 1.0 / cap)?;
            let t = f.name_next(&format!("{p}_tanh")).tanh(t)?;
            s = f
                .name_next(&format!("{p}_capped"))
                .binary_scalar("mul", t, cap)?;
        }
        let s = f
            .name_next(&format!("{p}_s4"))
            .reshape(s, &[nkv as i32, g as i32, wi, total as i32])?;
        let s = f.name_next(&format!("{p}_masked")).add(s, mask)?;
        let mx = f
            .name_next(&format!("{p}_smax"))
            .reduce("reduce_max", s, &[3], true)?;
        let d = f.name_next(&format!("{p}_sd")).sub(s, mx)?;
        let e = f.name_next(&format!("{p}_e")).exp(d)?;
        let z = f
            .name_next(&format!("{p}_z"))
            .reduce("reduce_sum", e, &[3], true)?;
        // Weights ≤ 1 over S + W positions: values normalised per KV head to keep Σ e·v ≤ 2^14.
        let (vn, vback) = normalize(
            f,
            &format!("{p}_vn"),
            vv,
            &[1, 2],
            total as f32,
            1.0,
            &self.plan.alternatives,
        )?;
        let e = f
            .name_next(&format!("{p}_e3"))
            .reshape(e, &[nkv as i32, (g * w) as i32, total as i32])?;
        let o = (self.plan.alternatives).matmul(f, &format!("{p}_pv"), e, vn, false, true)?;
        let o = f
            .name_next(&format!("{p}_o4"))
            .reshape(o, &[nkv as i32, g as i32, wi, hdi])?;
        let o = f.name_next(&format!("{p}_oz")).real_div(o, z)?;
        let vback = f
            .name_next(&format!("{p}_vb4"))
            .reshape(vback, &[nkv as i32, 1, 1, 1])?;
        let o = f.name_next(&format!("{p}_ov")).mul(o, vback)?;
        let o = f
            .name_next(&format!("{p}_ot"))
            .transpose(o, &[0, 1, 3, 2])?;
        Ok(f.name_next(&format!("{p}_att"))
            .reshape(o, &[1, qd as i32, 1, wi])?)
    }

    /// The batch function's attention: the new keys and values of all columns go out as
    /// `k{l}_new`/`v{l}_new` (column `j` is slot `j`'s), and column `j`'s query attends over
    /// slot `j`'s cache and its own key — op for op the decode function's attention, so each
    /// column gives the bits of its token decoded alone.
    fn attend_per_slot(
        &mut self,
        li: usize,
        a: &Attention,
        q: ValueId,
        (k4, v4): (ValueId, ValueId),
        mask: ValueId,
    ) -> Result<ValueId> {
        let (w, kvd) = (self.w as i32, (a.n_kv_heads * a.head_dim) as i32);
        let (nh, nkv, hd) = (a.n_heads as i32, a.n_kv_heads as i32, a.head_dim as i32);
        let total = self.kv_len() as i32;
        let mut flats = Vec::new();
        for (kind, new) in [("k", k4), ("v", v4)] {
            let name = format!("{kind}{li}");
            let flat = self
                .f
                .name_next(&format!("{name}_flat"))
                .reshape(new, &[1, kvd, 1, w])?;
            self.f.rename(flat, &format!("{name}_new"))?;
            self.f.output(flat)?;
            flats.push(flat);
        }
        let mut outs = Vec::new();
        for j in 0..self.slots {
            let (p, ji) = (format!("l{li}_s{j}"), j as i32);
            let qj = self.f.name_next(&format!("{p}_q")).slice_by_size(
                q,
                &[0, 0, 0, ji],
                &[1, nh, hd, 1],
            )?;
            let mut kv = Vec::new();
            for (kind, flat) in ["k", "v"].into_iter().zip(&flats) {
                let name = format!("{kind}{li}_s{j}");
                let new = self.f.name_next(&format!("{name}_col")).slice_by_size(
                    *flat,
                    &[0, 0, 0, ji],
                    &[1, kvd, 1, 1],
                )?;
                let cache = self.input(&name)?;
                let all = (self.plan.alternatives).concat(
                    &mut self.f,
                    &format!("{name}_all"),
                    &[cache, new],
                    3,
                )?;
                kv.push(
                    self.f
                        .name_next(&format!("{name}_heads"))
                        .reshape(all, &[nkv, hd, total])?,
                );
            }
            let mj = self.f.name_next(&format!("{p}_maskj")).slice_by_size(
                mask,
                &[0, ji, 0, 0],
                &[1, 1, 1, total],
            )?;
            let mj = self
                .f
                .name_next(&format!("{p}_mask"))
                .reshape(mj, &[1, 1, 1, total])?;
            outs.push(self.attend(&p, a, qj, (kv[0], kv[1]), mj, 1)?);
        }
        let p = format!("l{li}_att_slots");
        (self.plan.alternatives).concat(&mut self.f, &p, &outs, 3)
    }

    pub(super) fn shift(&self) -> f32 {
        2f32.powi(-self.plan.residual_shift)
    }

    pub(super) fn ffn(&mut self, li: usize, x: ValueId, c: &LayerConsts) -> Result<ValueId> {
        let post = c.post_ffn_norm.as_ref();
        self.ffn_onto(li, x, x, &c.ffn_norm, &c.ffn, post)
    }

    /// Layer `li`'s FFN of the residual `x` (normed by `ffn_norm`), its output added to `onto`:
    /// `x` itself for a whole FFN; for the rest of a split mixture, the partial sum so far.
    pub(super) fn ffn_onto(
        &mut self,
        li: usize,
        x: ValueId,
        onto: ValueId,
        ffn_norm: &NormConst,
        ffn: &FfnConsts,
        post_ffn_norm: Option<&NormConst>,
    ) -> Result<ValueId> {
        let h = self.model.config.hidden_size;
        let act = ffn_activation(&self.model.layers[li], li)?;
        let p = format!("l{li}");
        let xn = self.norm(
            &format!("{p}_ffn_norm"),
            x,
            1,
            h,
            vec![1, h, 1, 1],
            ffn_norm,
        )?;
        let shift = if post_ffn_norm.is_some() {
            1.0
        } else {
            self.shift()
        };
        let mut y = match ffn {
            FfnConsts::Dense {
                gate_up,
                gated,
                down,
            } => {
                let gu = self.linear(&format!("{p}_gate_up"), xn, gate_up, 1.0)?;
                let hidden = if *gated {
                    let half = gate_up.w.rows / 2;
                    let parts = (self.plan.alternatives).split(
                        &mut self.f,
                        &format!("{p}_gu"),
                        gu,
                        1,
                        &[half, half],
                    )?;
                    let a = activate(&mut self.f, act, parts[0], &format!("{p}_act"))?;
                    self.f.name_next(&format!("{p}_hidden")).mul(a, parts[1])?
                } else {
                    activate(&mut self.f, act, gu, &format!("{p}_hidden"))?
                };
                self.linear(&format!("{p}_down"), hidden, down, shift)?
            }
            FfnConsts::Moe(m) => self.moe(li, &p, xn, act, m, shift)?,
        };
        if let Some(n) = post_ffn_norm {
            y = self.norm(&format!("{p}_post_ffn"), y, 1, h, vec![1, h, 1, 1], n)?;
        }
        Ok(self.f.name_next(&format!("{p}_out")).add(onto, y)?)
    }
}
