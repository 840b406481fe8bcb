//! The gated delta rule over many tokens at once — the chunked (WY / UT-transform) form, so a
//! prompt costs one evaluation per `width` tokens rather than one per token. The function's
//! columns are cut into sub-chunks of `L` tokens (the plan's `delta_chunk`); inside one, per
//! value head, with `c_i` the cumulative log-decay and `D_ij = exp(c_i - c_j)` (j ≤ i):
//! `A = I + strict_lower(β_i k_i·k_j D_ij)`, `[U | W] = A⁻¹ [β v | β k e^c]` by forward
//! substitution (stable where the Neumann product is not), `V' = U - W S`,
//! `O = (q e^c) S + (q·k D) V'`, `S ← e^{c_L} S + Σ_j k_j D_Lj V'_j` — the math of
//! ../shared/models/ARCHITECTURES.md §4.4.8.
//!
//! fp16 care: `c_i - c_j` is summed directly over the tokens between (all log-decays have one
//! sign, so no cancellation of large cumulative sums); every exponent is ≤ 0; every matmul has
//! its operands normalised ([`ChunkGraph::scaled_matmul`]); the right-hand sides are
//! normalised before the substitution with headroom for `A⁻¹`'s growth. Columns past the
//! tokens given (`live` = 0) have β = 0, no decay and zero q, k, v, so they leave the state
//! as it was and the live columns' bits do not depend on what the padding held.

use anelm_mil::{TensorType, ValueId, WeightData};
use std::sync::Arc;

use super::super::graph::normalize;
use super::graph::ChunkGraph;
use crate::error::Result;

/// Headroom the substitution leaves for `A⁻¹` amplifying its right-hand sides.
const SOLVE_HEADROOM: f32 = 16.0;

/// The per-value-head tensors of a DeltaNet over the function's `w` columns.
pub(super) struct DeltaInputs {
    /// L2-normed queries (times `dk^-0.5`) and keys, `[n_v, dk, w]`.
    pub q: ValueId,
    pub k: ValueId,
    /// `[n_v, dv, w]`.
    pub v: ValueId,
    /// `β = sigmoid(b)` and the log-decay `g = -exp(A_log) softplus(a + dt_bias)`, `[n_v, 1, w]`.
    pub beta: ValueId,
    pub g: ValueId,
    /// The state entering the function, `[n_v, dk, dv]`.
    pub s: ValueId,
}

impl ChunkGraph<'_> {
    /// `x · y` (each transposed as flagged) over `[n, a, b]` operands contracting `k` values:
    /// `x` brought to a largest magnitude of `2^14 / k` and `y`, unless `y_bounded` (its
    /// entries already ≤ 1), to 1 — per batch — so no partial sum reaches 2^15 and no product
    /// falls below the flush threshold; the result scaled back.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn scaled_matmul(
        &mut self,
        name: &str,
        x: ValueId,
        y: ValueId,
        transpose_x: bool,
        transpose_y: bool,
        k: usize,
        y_bounded: bool,
    ) -> Result<ValueId> {
        let alts = self.plan.alternatives.clone();
        let f = &mut self.f;
        let (xs, xb) = normalize(f, &format!("{name}_nx"), x, &[1, 2], k as f32, 1.0, &alts)?;
        let (ys, yb) = if y_bounded {
            (y, None)
        } else {
            let (ys, yb) = normalize(f, &format!("{name}_ny"), y, &[1, 2], 16384.0, 1.0, &alts)?;
            (ys, Some(yb))
        };
        let m = alts.matmul(f, &format!("{name}_mm"), xs, ys, transpose_x, transpose_y)?;
        let mut r = f.name_next(&format!("{name}_bx")).mul(m, xb)?;
        if let Some(yb) = yb {
            r = f.name_next(name).mul(r, yb)?;
        }
        Ok(r)
    }

    /// The delta rule over the function's columns from the state `s`: the read-outs
    /// `[1, n_v, dv, w]` and the state after the last live column, `[n_v, dk, dv]`.
    pub(super) fn delta_chunks(
        &mut self,
        p: &str,
        d: &DeltaInputs,
        (nv, dk, dv): (usize, usize, usize),
    ) -> Result<(ValueId, ValueId)> {
        let w = self.w;
        let step = self.plan.delta_chunk.clamp(1, w);
        // Columns past the tokens given: β = 0, g = 0.
        let live = self.input("live")?;
        let f = &mut self.f;
        let live = f
            .name_next(&format!("{p}_live3"))
            .reshape(live, &[1, 1, w as i32])?;
        let beta = f.name_next(&format!("{p}_beta_live")).mul(d.beta, live)?;
        let g = f.name_next(&format!("{p}_g_live")).mul(d.g, live)?;
        // And zero q, k, v: a padding column's stale values would otherwise move the scales
        // of the sub-chunk's normalised products, and with them the live columns' rounding.
        let q = f.name_next(&format!("{p}_q_live")).mul(d.q, live)?;
        let k = f.name_next(&format!("{p}_k_live")).mul(d.k, live)?;
        let v = f.name_next(&format!("{p}_v_live")).mul(d.v, live)?;
        let mut s = d.s;
        let mut outs = Vec::new();
        for (ci, t0) in (0..w).step_by(step).enumerate() {
            let l = step.min(w - t0);
            let cp = format!("{p}_c{ci}");
            let cut = |f: &mut anelm_mil::FunctionBuilder, v: ValueId, rows: usize, tag: &str| {
                f.name_next(&format!("{cp}_{tag}")).slice_by_size(
                    v,
                    &[0, 0, t0 as i32],
                    &[nv as i32, rows as i32, l as i32],
                )
            };
            let f = &mut self.f;
            let (q, k, v) = (
                cut(f, q, dk, "q")?,
                cut(f, k, dk, "k")?,
                cut(f, v, dv, "v")?,
            );
            let (bc, gc) = (cut(f, beta, 1, "b")?, cut(f, g, 1, "g")?);
            let (o, s_next) = self.sub_chunk(&cp, (q, k, v, bc, gc), s, (nv, dk, dv, l))?;
            outs.push(o);
            s = s_next;
        }
        let alts = self.plan.alternatives.clone();
        let o = if outs.len() == 1 {
            outs[0]
        } else {
            alts.concat(&mut self.f, &format!("{p}_o_rows"), &outs, 1)?
        };
        // [n_v, w, dv] → [1, n_v, dv, w].
        let f = &mut self.f;
        let o = f.name_next(&format!("{p}_o_t")).transpose(o, &[0, 2, 1])?;
        let o = f
            .name_next(&format!("{p}_o4"))
            .reshape(o, &[1, nv as i32, dv as i32, w as i32])?;
        Ok((o, s))
    }

    /// One sub-chunk of `l` tokens: its read-outs `[n_v, l, dv]` and the state after it.
    fn sub_chunk(
        &mut self,
        p: &str,
        (q, k, v, b, g): (ValueId, ValueId, ValueId, ValueId, ValueId),
        s: ValueId,
        (nv, dk, dv, l): (usize, usize, usize, usize),
    ) -> Result<(ValueId, ValueId)> {
        let (nvi, li) = (nv as i32, l as i32);
        let alts = self.plan.alternatives.clone();
        let strict = self.lower_mask(&format!("{p}_strict"), l, false)?;
        let incl = self.lower_mask(&format!("{p}_incl"), l, true)?;
        let f = &mut self.f;
        // Log-decays between tokens: F_ij = Σ_{j<m≤i} g_m as (g_m [m ≤ i]) · [m > j]; the
        // cumulative c_i = Σ_{m≤i} g_m as its row sums.
        let (gs, gback) = normalize(f, &format!("{p}_gn"), g, &[2], l as f32, 1.0, &alts)?;
        let gm = f.name_next(&format!("{p}_gm")).mul(gs, incl)?;
        let fm = alts.matmul(f, &format!("{p}_fmm"), gm, strict, false, false)?;
        let fm = f.name_next(&format!("{p}_f")).mul(fm, gback)?;
        let dm = f.name_next(&format!("{p}_fe")).exp(fm)?;
        let dm = f.name_next(&format!("{p}_d")).mul(dm, incl)?;
        let c = f
            .name_next(&format!("{p}_cs"))
            .reduce("reduce_sum", gm, &[2], true)?;
        let c = f.name_next(&format!("{p}_c")).mul(c, gback)?;
        let ec = f.name_next(&format!("{p}_ec")).exp(c)?; // [nv, l, 1]
        let brow = f
            .name_next(&format!("{p}_brow"))
            .reshape(b, &[nvi, li, 1])?;
        // A's strict lower part N = β_i (k_i·k_j) D_ij.
        let kk = self.scaled_matmul(&format!("{p}_kk"), k, k, true, false, dk, true)?;
        let f = &mut self.f;
        let n = f.name_next(&format!("{p}_kkd")).mul(kk, dm)?;
        let n = f.name_next(&format!("{p}_kks")).mul(n, strict)?;
        let n = f.name_next(&format!("{p}_n")).mul(n, brow)?;
        // Right-hand sides, token-major: β v and β k e^c, each normalised.
        let vt = f.name_next(&format!("{p}_vt")).transpose(v, &[0, 2, 1])?;
        let rv = f.name_next(&format!("{p}_rv")).mul(vt, brow)?;
        let kt = f.name_next(&format!("{p}_kt")).transpose(k, &[0, 2, 1])?;
        let bec = f.name_next(&format!("{p}_bec")).mul(brow, ec)?;
        let rk = f.name_next(&format!("{p}_rk")).mul(kt, bec)?;
        let l1 = SOLVE_HEADROOM * l as f32;
        let (rv, vback) = normalize(f, &format!("{p}_rvn"), rv, &[1, 2], l1, 1.0, &alts)?;
        let (rk, kback) = normalize(f, &format!("{p}_rkn"), rk, &[1, 2], l1, 1.0, &alts)?;
        let r = alts.concat(f, &format!("{p}_r"), &[rv, rk], 2)?;
        let x = self.forward_substitute(p, n, r, nv, l, dv + dk)?;
        let f = &mut self.f;
        let u =
            f.name_next(&format!("{p}_u"))
                .slice_by_size(x, &[0, 0, 0], &[nvi, li, dv as i32])?;
        let u = f.name_next(&format!("{p}_ub")).mul(u, vback)?;
        let wm = f.name_next(&format!("{p}_w")).slice_by_size(
            x,
            &[0, 0, dv as i32],
            &[nvi, li, dk as i32],
        )?;
        let wm = f.name_next(&format!("{p}_wb")).mul(wm, kback)?;
        // V' = U - W S.
        let ws = self.scaled_matmul(&format!("{p}_ws"), wm, s, false, false, dk, false)?;
        let vp = self.f.name_next(&format!("{p}_vp")).sub(u, ws)?;
        // O = (q e^c) S + (q·k ⊙ D) V'.
        let qk = self.scaled_matmul(&format!("{p}_qk"), q, k, true, false, dk, true)?;
        let f = &mut self.f;
        let pm = f.name_next(&format!("{p}_p")).mul(qk, dm)?;
        let ecc = f
            .name_next(&format!("{p}_ecc"))
            .reshape(ec, &[nvi, 1, li])?;
        let qe = f.name_next(&format!("{p}_qe")).mul(q, ecc)?;
        let o_state = self.scaled_matmul(&format!("{p}_os"), qe, s, true, false, dk, false)?;
        let o_local = self.scaled_matmul(&format!("{p}_ol"), pm, vp, false, false, l, false)?;
        let o = self.f.name_next(&format!("{p}_o")).add(o_state, o_local)?;
        // S ← e^{c_last} S + (k ⊙ D_last) V'.
        let f = &mut self.f;
        let d_last =
            f.name_next(&format!("{p}_dl"))
                .slice_by_size(dm, &[0, li - 1, 0], &[nvi, 1, li])?;
        let kd = f.name_next(&format!("{p}_kd")).mul(k, d_last)?;
        let ec_last =
            f.name_next(&format!("{p}_ecl"))
                .slice_by_size(ec, &[0, li - 1, 0], &[nvi, 1, 1])?;
        let s_decayed = f.name_next(&format!("{p}_sdec")).mul(s, ec_last)?;
        let upd = self.scaled_matmul(&format!("{p}_supd"), kd, vp, false, false, l, false)?;
        let s = self.f.name_next(&format!("{p}_s")).add(s_decayed, upd)?;
        Ok((o, s))
    }

    /// `X` with `(I + N) X = R` for a strictly lower `N` (`[nv, l, l]`), `R` `[nv, l, cols]`:
    /// row `i` is `R_i - N_{i,<i} X_{<i}`, one row after another.
    fn forward_substitute(
        &mut self,
        p: &str,
        n: ValueId,
        r: ValueId,
        nv: usize,
        l: usize,
        cols: usize,
    ) -> Result<ValueId> {
        let alts = self.plan.alternatives.clone();
        let f = &mut self.f;
        let (nvi, ci) = (nv as i32, cols as i32);
        let mut rows =
            vec![f
                .name_next(&format!("{p}_x0"))
                .slice_by_size(r, &[0, 0, 0], &[nvi, 1, ci])?];
        let mut done = rows[0];
        for i in 1..l {
            let ii = i as i32;
            let ni =
                f.name_next(&format!("{p}_n{i}"))
                    .slice_by_size(n, &[0, ii, 0], &[nvi, 1, ii])?;
            let ri =
                f.name_next(&format!("{p}_r{i}"))
                    .slice_by_size(r, &[0, ii, 0], &[nvi, 1, ci])?;
            let acc = alts.matmul(f, &format!("{p}_nx{i}"), ni, done, false, false)?;
            let xi = f.name_next(&format!("{p}_x{i}")).sub(ri, acc)?;
            rows.push(xi);
            done = alts.concat(f, &format!("{p}_xs{i}"), &rows, 1)?;
        }
        Ok(done)
    }

    /// The `[1, l, l]` mask with ones below the diagonal (and on it, if `diagonal`).
    fn lower_mask(&mut self, name: &str, l: usize, diagonal: bool) -> Result<ValueId> {
        let m: Vec<f32> = (0..l * l)
            .map(|at| {
                let (i, j) = (at / l, at % l);
                if j < i || (diagonal && i == j) {
                    1.0
                } else {
                    0.0
                }
            })
            .collect();
        Ok(self.f.weight(
            name,
            TensorType::fp16([1, l, l]),
            Arc::new(WeightData::f16_from_f32(&m)),
        )?)
    }
}
