//! LFM2's gated short convolution inside a fused chunk: `B | C | x` from one projection, the
//! causal depthwise conv of `B · x` over the history input `conv{l}` (`[1, h, 1, kernel - 1]`,
//! oldest first) and the chunk's own tokens, times `C`, then the output projection. The
//! chunk outputs `B · x` of its columns as `conv{l}_new`; the engine keeps the history (its
//! last `kernel - 1` values) beside the KV cache and writes it into the input every step.

use std::sync::Arc;

use anelm_mil::{TensorType, ValueId, WeightData};

use super::consts::LayerConsts;
use super::graph::ChunkGraph;
use crate::error::{AneError, Result};

impl ChunkGraph<'_> {
    pub(super) fn short_conv(&mut self, li: usize, x: ValueId, c: &LayerConsts) -> Result<ValueId> {
        let sc = c
            .short_conv
            .as_ref()
            .ok_or_else(|| AneError::Unsupported(format!("layer {li}: no short-conv constants")))?;
        let h = self.model.config.hidden_size;
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
        let bcx = self.linear(&format!("{p}_in"), xn, &c.qkv, 1.0)?;
        let parts = alts.split(&mut self.f, &format!("{p}_bcx"), bcx, 1, &[h, h, h])?;
        let bx = self
            .f
            .name_next(&format!("{p}_bx"))
            .mul(parts[0], parts[2])?;
        let mut conv = self.conv_history(&p, li, bx, h, &sc.taps)?;
        if let Some(b) = &sc.bias {
            let bt = (self.f).weight(
                &format!("{p}_conv_b"),
                TensorType::fp16([1, h, 1, 1]),
                b.clone(),
            )?;
            conv = self
                .f
                .name_next(&format!("{p}_conv_biased"))
                .add(conv, bt)?;
        }
        let gated = self
            .f
            .name_next(&format!("{p}_gated"))
            .mul(parts[1], conv)?;
        let shift = if c.post_attn_norm.is_some() {
            1.0
        } else {
            self.shift()
        };
        let mut y = self.linear(&format!("{p}_conv_o"), gated, &c.o, shift)?;
        if let Some(n) = &c.post_attn_norm {
            y = self.norm(&format!("{p}_post_attn"), y, 1, h, vec![1, h, 1, 1], n)?;
        }
        Ok(self.f.name_next(&format!("{p}_h")).add(x, y)?)
    }
    /// The causal depthwise conv of `new` (`[1, ch, 1, w]`, the function's columns, out as
    /// `conv{li}_new`) over the history input `conv{li}` (`[1, ch, 1, taps - 1]`, oldest first)
    /// and the columns themselves, tap by tap. In the batch function each column runs over its
    /// own slot's history (`conv{li}_s{j}`), op for op as the decode function runs its one.
    pub(super) fn conv_history(
        &mut self,
        p: &str,
        li: usize,
        new: ValueId,
        ch: usize,
        taps: &[Arc<WeightData>],
    ) -> Result<ValueId> {
        if taps.is_empty() {
            return Err(AneError::Unsupported(format!(
                "layer {li}: a causal conv without taps"
            )));
        }
        self.f.rename(new, &format!("conv{li}_new"))?;
        self.f.output(new)?;
        let alts = self.plan.alternatives.clone();
        let taps = (taps.iter().enumerate())
            .map(|(j, tap)| {
                let ty = TensorType::fp16([1, ch, 1, 1]);
                Ok(self.f.weight(&format!("{p}_tap{j}"), ty, tap.clone())?)
            })
            .collect::<Result<Vec<_>>>()?;
        // (column prefix, history input, the columns it convolves)
        let runs: Vec<(String, String, ValueId, usize)> = if self.slots == 0 {
            vec![(p.to_string(), format!("conv{li}"), new, self.w)]
        } else {
            (0..self.slots)
                .map(|j| -> Result<_> {
                    let pj = format!("{p}_s{j}");
                    let col = self.f.name_next(&format!("{pj}_new")).slice_by_size(
                        new,
                        &[0, 0, 0, j as i32],
                        &[1, ch as i32, 1, 1],
                    )?;
                    Ok((pj, format!("conv{li}_s{j}"), col, 1))
                })
                .collect::<Result<_>>()?
        };
        let mut outs = Vec::new();
        for (pj, hist, cols, w) in runs {
            let hist = self.input(&hist)?;
            let all = alts.concat(&mut self.f, &format!("{pj}_hist_new"), &[hist, cols], 3)?;
            let mut acc: Option<ValueId> = None;
            for (j, &t) in taps.iter().enumerate() {
                let at = self.f.name_next(&format!("{pj}_at{j}")).slice_by_size(
                    all,
                    &[0, 0, 0, j as i32],
                    &[1, ch as i32, 1, w as i32],
                )?;
                let term = self.f.name_next(&format!("{pj}_term{j}")).mul(at, t)?;
                acc = Some(match acc {
                    Some(a) => self.f.name_next(&format!("{pj}_acc{j}")).add(a, term)?,
                    None => term,
                });
            }
            outs.extend(acc);
        }
        if outs.len() == 1 {
            return Ok(outs[0]);
        }
        alts.concat(&mut self.f, &format!("{p}_conv_slots"), &outs, 3)
    }
}
