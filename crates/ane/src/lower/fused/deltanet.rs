//! A gated DeltaNet layer inside a fused chunk: the `qkv | z | b | a` projection, the causal
//! conv over the history input `conv{l}` (`[1, C, 1, K - 1]`, the pre-conv `qkv` of the last
//! tokens) and the function's columns, then SiLU, q and k L2-normed (their largest magnitude
//! divided out first, so no square overflows fp16), the gates, the delta rule on the state
//! input `s{l}` (`[1, n_v · dk · dv, 1, 1]`) — the recurrence itself in the decode function,
//! the chunked form ([`super::delta_chunks`]) in the prefill function —, the read-out, the
//! gated RMSNorm and `out`. The chunk outputs the new state as `s{l}_new` and the columns'
//! pre-conv `qkv` as `conv{l}_new`; the engine keeps both beside the KV cache.

use std::sync::Arc;

use anelm_mil::{DType, TensorType, ValueId, WeightData};
use anelm_model::plan::DeltaNet;

use super::consts::{LayerConsts, NormConst};
use super::graph::ChunkGraph;
use crate::error::{AneError, Result};

/// A DeltaNet's constants beyond its projections.
pub(super) struct DeltaNetConsts {
    /// Conv tap `j` of every channel (`[1, C, 1, 1]`); tap `K - 1` multiplies the current token.
    taps: Vec<Arc<WeightData>>,
    /// `-exp(A_log)` and `dt_bias`, `[1, n_v, 1, 1]` each.
    neg_a: Arc<WeightData>,
    dt_bias: Arc<WeightData>,
    norm: NormConst,
    n_k: usize,
    n_v: usize,
    dk: usize,
    dv: usize,
    /// The key head of each value head.
    key_head: Vec<usize>,
}

impl DeltaNetConsts {
    pub(super) fn new(d: &DeltaNet) -> DeltaNetConsts {
        let (k, c) = (d.conv_kernel, d.conv_channels());
        let f16 = |v: &[f32]| Arc::new(WeightData::f16_from_f32(v));
        DeltaNetConsts {
            taps: (0..k)
                .map(|j| f16(&(0..c).map(|ch| d.conv[ch * k + j]).collect::<Vec<_>>()))
                .collect(),
            neg_a: f16(&d.neg_a),
            dt_bias: f16(&d.dt_bias),
            norm: NormConst::new(&d.norm, 1.0, 1.0, None),
            n_k: d.n_k_heads,
            n_v: d.n_v_heads,
            dk: d.k_dim,
            dv: d.v_dim,
            key_head: (0..d.n_v_heads).map(|h| d.key_head(h)).collect(),
        }
    }
}

impl ChunkGraph<'_> {
    pub(super) fn delta_net(&mut self, li: usize, x: ValueId, c: &LayerConsts) -> Result<ValueId> {
        let d = c
            .delta_net
            .as_ref()
            .ok_or_else(|| AneError::Unsupported(format!("layer {li}: no DeltaNet constants")))?;
        let w = self.w;
        let h = self.model.config.hidden_size;
        let (nk, nv, dk, dv) = (d.n_k, d.n_v, d.dk, d.dv);
        let (kd, vd) = (nk * dk, nv * dv);
        let ch = 2 * kd + vd;
        let p = format!("l{li}");
        let alts = self.plan.alternatives.clone();
        let xn = self.norm(
            &format!("{p}_attn_norm"),
            x,
            1,
            h,
            vec![1, h, 1, 1],
            &c.attn_norm,
        )?;
        let inp = self.linear(&format!("{p}_in"), xn, &c.qkv, 1.0)?;
        let parts = alts.split(
            &mut self.f,
            &format!("{p}_qkvzba"),
            inp,
            1,
            &[ch, vd, nv, nv],
        )?;
        let (mixed, z, b, a) = (parts[0], parts[1], parts[2], parts[3]);
        // The causal conv over the history and the token, then SiLU.
        let conv = self.conv_history(&p, li, mixed, ch, &d.taps)?;
        let sig = self.f.name_next(&format!("{p}_conv_sig")).sigmoid(conv)?;
        let u = self.f.name_next(&format!("{p}_u")).mul(conv, sig)?;
        let qkv = alts.split(&mut self.f, &format!("{p}_u_qkv"), u, 1, &[kd, kd, vd])?;
        let q = self.l2_heads(&format!("{p}_q"), qkv[0], nk, dk, (dk as f32).powf(-0.5))?;
        let k = self.l2_heads(&format!("{p}_k"), qkv[1], nk, dk, 1.0)?;
        // Each value head's key head: [n_v, dk, w].
        let q = self.per_value_head(&format!("{p}_qv"), q, &d.key_head, dk)?;
        let k = self.per_value_head(&format!("{p}_kv"), k, &d.key_head, dk)?;
        let o = if self.slots == 0 {
            let s_in = self.input(&format!("s{li}"))?;
            let (o, s) = if w == 1 {
                self.delta_step(&p, d, (q, k), qkv[2], (b, a), s_in)?
            } else {
                self.delta_many(&p, d, (q, k), qkv[2], (b, a), s_in)?
            };
            self.state_out(&format!("s{li}_new"), s, d)?;
            o
        } else {
            // The batch function: each column steps its own slot's state, as decode does.
            let mut outs = Vec::new();
            for j in 0..self.slots {
                let (pj, ji) = (format!("{p}_s{j}"), j as i32);
                let f = &mut self.f;
                let (nvi, dki) = (nv as i32, dk as i32);
                let col = |f: &mut anelm_mil::FunctionBuilder, what: &str, x, c: i32| {
                    f.name_next(&format!("{pj}_{what}")).slice_by_size(
                        x,
                        &[0, 0, 0, ji],
                        &[1, c, 1, 1],
                    )
                };
                let qj = f.name_next(&format!("{pj}_qj")).slice_by_size(
                    q,
                    &[0, 0, ji],
                    &[nvi, dki, 1],
                )?;
                let kj = f.name_next(&format!("{pj}_kj")).slice_by_size(
                    k,
                    &[0, 0, ji],
                    &[nvi, dki, 1],
                )?;
                let vj = col(f, "vj", qkv[2], vd as i32)?;
                let bj = col(f, "bj", b, nvi)?;
                let aj = col(f, "aj", a, nvi)?;
                let s_in = self.input(&format!("s{li}_s{j}"))?;
                let (o, s) = self.delta_step(&pj, d, (qj, kj), vj, (bj, aj), s_in)?;
                self.state_out(&format!("s{li}_s{j}_new"), s, d)?;
                outs.push(o);
            }
            alts.concat(&mut self.f, &format!("{p}_o_slots"), &outs, 3)?
        };
        // Gated RMSNorm per value head, then out.
        let on = self.norm(&format!("{p}_gnorm"), o, 2, dv, vec![1, 1, dv, 1], &d.norm)?;
        let f = &mut self.f;
        let z = f
            .name_next(&format!("{p}_z4"))
            .reshape(z, &[1, nv as i32, dv as i32, w as i32])?;
        let zs = f.name_next(&format!("{p}_zsig")).sigmoid(z)?;
        let zs = f.name_next(&format!("{p}_zsilu")).mul(z, zs)?;
        let gated = f.name_next(&format!("{p}_gated")).mul(on, zs)?;
        let gated = f
            .name_next(&format!("{p}_gated_flat"))
            .reshape(gated, &[1, vd as i32, 1, w as i32])?;
        let shift = if c.post_attn_norm.is_some() {
            1.0
        } else {
            self.shift()
        };
        let mut y = self.linear(&format!("{p}_dn_o"), gated, &c.o, shift)?;
        if let Some(n) = &c.post_attn_norm {
            y = self.norm(&format!("{p}_post_attn"), y, 1, h, vec![1, h, 1, 1], n)?;
        }
        Ok(self.f.name_next(&format!("{p}_h")).add(x, y)?)
    }

    /// A new recurrent state `[n_v, dk, dv]` out as `name` (`[1, n_v·dk·dv, 1, 1]`).
    fn state_out(&mut self, name: &str, s: ValueId, d: &DeltaNetConsts) -> Result<()> {
        let size = (d.n_v * d.dk * d.dv) as i32;
        let out = self.f.name_next(name).reshape(s, &[1, size, 1, 1])?;
        Ok(self.f.output(out)?)
    }

    /// The gates of `b` and `a` (`[1, n_v, 1, w]`): `β = sigmoid(b)` and the log-decay
    /// `g = -exp(A_log) · softplus(a + dt_bias)`.
    fn delta_gates(
        &mut self,
        p: &str,
        d: &DeltaNetConsts,
        b: ValueId,
        a: ValueId,
    ) -> Result<(ValueId, ValueId)> {
        let nv = d.n_v;
        let f = &mut self.f;
        let beta = f.name_next(&format!("{p}_beta")).sigmoid(b)?;
        let dt = f.weight(
            &format!("{p}_dt_bias"),
            TensorType::fp16([1, nv, 1, 1]),
            d.dt_bias.clone(),
        )?;
        let na = f.weight(
            &format!("{p}_neg_a"),
            TensorType::fp16([1, nv, 1, 1]),
            d.neg_a.clone(),
        )?;
        let adt = f.name_next(&format!("{p}_adt")).add(a, dt)?;
        let sp = f.name_next(&format!("{p}_sp")).unary("softplus", adt)?;
        let g = f.name_next(&format!("{p}_g")).mul(sp, na)?;
        Ok((beta, g))
    }

    /// Many tokens: the chunked form ([`super::delta_chunks`]). The read-outs `[1, n_v, dv, w]`
    /// and the new state `[n_v, dk, dv]`.
    fn delta_many(
        &mut self,
        p: &str,
        d: &DeltaNetConsts,
        (q, k): (ValueId, ValueId),
        v: ValueId,
        (b, a): (ValueId, ValueId),
        s_in: ValueId,
    ) -> Result<(ValueId, ValueId)> {
        let (nv, dk, dv, w) = (d.n_v as i32, d.dk as i32, d.dv as i32, self.w as i32);
        let (beta, g) = self.delta_gates(p, d, b, a)?;
        let f = &mut self.f;
        let inputs = super::delta_chunks::DeltaInputs {
            q,
            k,
            v: f.name_next(&format!("{p}_v3")).reshape(v, &[nv, dv, w])?,
            beta: f
                .name_next(&format!("{p}_beta3"))
                .reshape(beta, &[nv, 1, w])?,
            g: f.name_next(&format!("{p}_g3")).reshape(g, &[nv, 1, w])?,
            s: f.name_next(&format!("{p}_s3"))
                .reshape(s_in, &[nv, dk, dv])?,
        };
        self.delta_chunks(p, &inputs, (d.n_v, d.dk, d.dv))
    }

    /// One token: the recurrence itself. The read-out `[1, n_v, dv, 1]` and the new state.
    fn delta_step(
        &mut self,
        p: &str,
        d: &DeltaNetConsts,
        (q, k): (ValueId, ValueId),
        v: ValueId,
        (b, a): (ValueId, ValueId),
        s_in: ValueId,
    ) -> Result<(ValueId, ValueId)> {
        let (nv, dk, dv) = (d.n_v, d.dk, d.dv);
        let (beta, g) = self.delta_gates(p, d, b, a)?;
        let f = &mut self.f;
        let v = f
            .name_next(&format!("{p}_v3"))
            .reshape(v, &[nv as i32, 1, dv as i32])?;
        let beta = f
            .name_next(&format!("{p}_beta3"))
            .reshape(beta, &[nv as i32, 1, 1])?;
        let decay = f.name_next(&format!("{p}_decay")).exp(g)?;
        let decay = f
            .name_next(&format!("{p}_decay3"))
            .reshape(decay, &[nv as i32, 1, 1])?;
        // The delta rule on S [n_v, dk, dv].
        let s = f
            .name_next(&format!("{p}_s3"))
            .reshape(s_in, &[nv as i32, dk as i32, dv as i32])?;
        let s = f.name_next(&format!("{p}_sd")).mul(s, decay)?;
        let sk = f.name_next(&format!("{p}_sk")).mul(s, k)?;
        let kv = f
            .name_next(&format!("{p}_kvr"))
            .reduce("reduce_sum", sk, &[1], true)?;
        let dlt = f.name_next(&format!("{p}_vmkv")).sub(v, kv)?;
        let dlt = f.name_next(&format!("{p}_delta")).mul(dlt, beta)?;
        let upd = f.name_next(&format!("{p}_kdelta")).mul(k, dlt)?;
        let s = f.name_next(&format!("{p}_s_upd")).add(s, upd)?;
        let sq = f.name_next(&format!("{p}_sq")).mul(s, q)?;
        let o = f
            .name_next(&format!("{p}_o3"))
            .reduce("reduce_sum", sq, &[1], true)?;
        let o = f
            .name_next(&format!("{p}_o4"))
            .reshape(o, &[1, nv as i32, dv as i32, 1])?;
        Ok((o, s))
    }

    /// `[1, heads·d, 1, w]` L2-normed per head and column (eps 1e-6 inside the root, as the CPU
    /// engine), times `scale`: `[heads, d, w]`. The largest magnitude is divided out first.
    fn l2_heads(
        &mut self,
        p: &str,
        x: ValueId,
        heads: usize,
        d: usize,
        scale: f32,
    ) -> Result<ValueId> {
        let alts = self.plan.alternatives.clone();
        let f = &mut self.f;
        let x = f
            .name_next(&format!("{p}_h3"))
            .reshape(x, &[heads as i32, d as i32, self.w as i32])?;
        let a = alts.abs(f, &format!("{p}_abs"), x)?;
        let m = f
            .name_next(&format!("{p}_max"))
            .reduce("reduce_max", a, &[1], true)?;
        let m = f
            .name_next(&format!("{p}_maxf"))
            .binary_scalar("add", m, 6.1e-5)?;
        let one = f.scalar(&format!("{p}_one"), DType::Fp16, 1.0)?;
        let r = f.name_next(&format!("{p}_r")).real_div(one, m)?;
        let xs = f.name_next(&format!("{p}_xs")).mul(x, r)?;
        let sq = f.name_next(&format!("{p}_sq")).mul(xs, xs)?;
        let ss = f
            .name_next(&format!("{p}_ss"))
            .reduce("reduce_sum", sq, &[1], true)?;
        // eps · r², as (r · 1e-3)².
        let er = f
            .name_next(&format!("{p}_er"))
            .binary_scalar("mul", r, 1e-3)?;
        let eps = f.name_next(&format!("{p}_eps")).mul(er, er)?;
        let v = f.name_next(&format!("{p}_v")).add(ss, eps)?;
        let inv = f
            .name_next(&format!("{p}_inv"))
            .binary_scalar("pow", v, -0.5)?;
        let y = f.name_next(&format!("{p}_n")).mul(xs, inv)?;
        Ok(f.name_next(&format!("{p}_scaled"))
            .binary_scalar("mul", y, scale)?)
    }

    /// The key heads `x` (`[n_k, d, w]`) as one per value head (`[n_v, d, w]`), head `h` being
    /// key head `key_head[h]`.
    fn per_value_head(
        &mut self,
        p: &str,
        x: ValueId,
        key_head: &[usize],
        d: usize,
    ) -> Result<ValueId> {
        let alts = self.plan.alternatives.clone();
        let heads = (key_head.iter().enumerate())
            .map(|(h, &g)| {
                self.f.name_next(&format!("{p}_{h}")).slice_by_size(
                    x,
                    &[g as i32, 0, 0],
                    &[1, d as i32, self.w as i32],
                )
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        alts.concat(&mut self.f, &format!("{p}_all"), &heads, 0)
    }
}
