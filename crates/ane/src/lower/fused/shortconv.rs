//! LFM2's gated short convolution inside a fused chunk: `B | C | x` from one projection, the
//! causal depthwise conv of `B · x` over the history input `conv{l}` (`[1, h, 1, kernel - 1]`,
//! oldest first) and the chunk's own tokens, times `C`, then the output projection. The
//! chunk outputs `B · x` of its columns as `conv{l}_new`; the engine keeps the history (its
//! last `kernel - 1` values) beside the KV cache and writes it into the input every step.

use anelm_mil::{TensorType, ValueId};

use super::consts::LayerConsts;
use super::graph::ChunkGraph;
use crate::error::{AneError, Result};

impl ChunkGraph<'_> {
    pub(super) fn short_conv(&mut self, li: usize, x: ValueId, c: &LayerConsts) -> Result<ValueId> {
        let sc = c
            .short_conv
            .as_ref()
            .ok_or_else(|| AneError::Unsupported(format!("layer {li}: no short-conv constants")))?;
        let (h, w) = (self.model.config.hidden_size, self.w);
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
        self.f.rename(bx, &format!("conv{li}_new"))?;
        self.f.output(bx)?;
        let hist = self.input(&format!("conv{li}"))?;
        let all = alts.concat(&mut self.f, &format!("{p}_hist_bx"), &[hist, bx], 3)?;
        let mut acc: Option<ValueId> = None;
        for (j, tap) in sc.taps.iter().enumerate() {
            let at = self.f.name_next(&format!("{p}_at{j}")).slice_by_size(
                all,
                &[0, 0, 0, j as i32],
                &[1, h as i32, 1, w as i32],
            )?;
            let t = (self.f).weight(
                &format!("{p}_tap{j}"),
                TensorType::fp16([1, h, 1, 1]),
                tap.clone(),
            )?;
            let term = self.f.name_next(&format!("{p}_term{j}")).mul(at, t)?;
            acc = Some(match acc {
                Some(a) => self.f.name_next(&format!("{p}_acc{j}")).add(a, term)?,
                None => term,
            });
        }
        let mut conv = acc.ok_or_else(|| {
            AneError::Unsupported(format!("layer {li}: a short conv without taps"))
        })?;
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
}
