//! One thread's view of a forward pass, and the pieces every layer shares: preparing the
//! inputs of a product (8-bit quantisation), the products, norms, residuals, embedding, head.

use std::ops::Range;

use anelm_model::plan::{Linear, Norm};
use anelm_model::{Model, Weight};

use super::buffers::{Private, Views};
use super::Chunk;
use crate::kernels::{select, select_exact, Kernel};
use crate::matmul::{matmul, Input, Product};
use crate::ops::{norm_into, norm_row};
use crate::pool::Ctx;
use crate::q8::ActKind;
use crate::resident::Resident;
use crate::shared::SharedSlice;
use crate::simd::Isa;

/// One thread's view of a forward pass over a chunk.
pub(super) struct Forward<'a> {
    pub(super) m: &'a Model,
    pub(super) isa: Isa,
    pub(super) exact: bool,
    pub(super) resident: &'a Resident,
    pub(super) ctx: &'a Ctx<'a>,
    pub(super) v: &'a Views<'a>,
    pub(super) c: &'a Chunk<'a>,
    /// Rows of the current product's inputs (the chunk's tokens, or those routed to an expert).
    pub(super) n: usize,
    pub(super) p: &'a mut Private,
}

impl Forward<'_> {
    pub(super) fn kernel(&self, w: &Weight) -> Kernel {
        if self.exact {
            select_exact(w.dtype, self.isa)
        } else {
            select(w.dtype, self.isa)
        }
    }

    /// Puts rows `rows` of `src` (width `w`) into this thread's input buffers, for a product with
    /// each weight of `ws`: f32 into `xn` (unless `src` is `xn`), 8-bit into the Q8 buffers.
    pub(super) fn prepare(&mut self, src: Src<'_>, w: usize, rows: Range<usize>, ws: &[&Weight]) {
        let mut kinds = [false; 3];
        for wt in ws {
            kinds[self.kernel(wt).act() as usize] = true;
        }
        let p = &mut *self.p;
        let row = |t: usize| t * w..(t + 1) * w;
        p.q8b.cols = w;
        p.q8k.cols = w;
        for t in rows {
            if let (Src::Shared(s), true) = (src, kinds[ActKind::F32 as usize]) {
                // SAFETY: the shared rows were written before the last barrier.
                p.xn[row(t)].copy_from_slice(unsafe { s.range(row(t)) });
            }
            let x: &[f32] = match src {
                Src::Xn => &p.xn[row(t)],
                // SAFETY: as above.
                Src::Shared(s) => unsafe { s.range(row(t)) },
            };
            if kinds[ActKind::Q8B32 as usize] {
                p.q8b.quantize_row(t, x);
            }
            if kinds[ActKind::Q8K as usize] {
                p.q8k.quantize_row(t, x);
            }
        }
    }

    /// `out = x Wᵀ + b` for this thread's prepared inputs; see [`matmul`] for `align`/`done`.
    pub(super) fn product(
        &mut self,
        w: &Weight,
        bias: Option<&[f32]>,
        out: &SharedSlice<'_, f32>,
        align: usize,
        done: impl FnMut(Range<usize>, Range<usize>),
    ) {
        self.products([(w, bias, out)], align, done);
    }

    /// Products over the same output rows in one [`matmul`], each `(W, b, out)`.
    pub(super) fn products<const N: usize>(
        &mut self,
        ws: [Target<'_>; N],
        align: usize,
        done: impl FnMut(Range<usize>, Range<usize>),
    ) {
        let kernels = ws.map(|(w, ..)| self.kernel(w));
        let (n, resident) = (self.n, self.resident);
        let p = &mut *self.p;
        let ps: [Product<'_>; N] = std::array::from_fn(|i| {
            let ((w, bias, out), kernel) = (ws[i], kernels[i]);
            let input = match kernel.act() {
                ActKind::F32 => Input::F32(&p.xn[..n * w.cols]),
                ActKind::Q8B32 => Input::Q8(&p.q8b),
                ActKind::Q8K => Input::Q8(&p.q8k),
            };
            let view = resident.view(w);
            Product {
                kernel,
                w,
                bias,
                input,
                out,
                bytes: view.bytes,
                packed: view.packed,
            }
        });
        matmul(self.ctx, &ps, n, &mut p.scratch, align, done);
    }

    pub(super) fn linear(&mut self, lin: &Linear, out: &SharedSlice<'_, f32>) {
        self.product(&lin.weight, lin.bias.as_deref(), out, 1, |_, _| {});
    }

    /// `xn = norm(x)` for every token.
    pub(super) fn norm_into_xn(&mut self, norm: &Norm) {
        let h = self.m.config.hidden_size;
        let p = &mut *self.p;
        for t in 0..self.n {
            norm_into(
                norm,
                &p.x[t * h..(t + 1) * h],
                &mut p.xn[t * h..(t + 1) * h],
            );
        }
    }

    /// `x += post_norm(o)` for every token.
    pub(super) unsafe fn residual(&mut self, post: Option<&Norm>) {
        let o = self.v.o.range(0..self.n * self.m.config.hidden_size);
        add_residual(self.p, self.m.config.hidden_size, self.n, o, post);
    }

    /// `x += post_norm(moe_acc)` for every token.
    pub(super) fn residual_moe(&mut self, post: Option<&Norm>) {
        let p = &mut *self.p;
        let acc = std::mem::take(&mut p.moe_acc);
        add_residual(p, self.m.config.hidden_size, self.n, &acc, post);
        p.moe_acc = acc;
    }

    pub(super) fn embed(&mut self) {
        let (m, h) = (self.m, self.m.config.hidden_size);
        let p = &mut *self.p;
        for t in 0..self.n {
            let row = &mut p.x[t * h..(t + 1) * h];
            let id = self.c.tokens[t] as usize;
            // From the weights' copy when the embedding is the output head too: reading the
            // mapping would bring its pages back beside the copy.
            let bytes = self.resident.row(&m.embedding, id, &mut p.row);
            anelm_formats::quant::dequantize(m.embedding.dtype, bytes, row)
                .expect("embedding rows are whole blocks (checked at load)");
            if let Some(sc) = m.embed_scale {
                row.iter_mut().for_each(|v| *v *= sc);
            }
            if let Some(pe) = &m.pos_embedding {
                let pos = &mut p.scratch[..h];
                pe.dequantize_row(self.c.at(t).1, pos)
                    .expect("position rows are whole blocks (checked at load)");
                row.iter_mut().zip(pos.iter()).for_each(|(v, p)| *v += p);
            }
        }
    }

    /// The final norm and the output head for the wanted rows (the normed rows themselves for
    /// hidden states).
    pub(super) unsafe fn head(&mut self) {
        let rows = self.c.rows;
        if rows.is_empty() {
            return;
        }
        let h = self.m.config.hidden_size;
        let p = &mut *self.p;
        for (i, &t) in rows.iter().enumerate() {
            let (x, xn) = (&p.x[t * h..(t + 1) * h], &mut p.xn[i * h..(i + 1) * h]);
            norm_into(&self.m.final_norm, x, xn);
        }
        if self.c.hidden {
            // The normed rows are the output; the caller's thread writes them.
            if self.ctx.ith == 0 {
                let out = self.v.out.range_mut(0..rows.len() * h);
                out.copy_from_slice(&p.xn[..rows.len() * h]);
            }
            return;
        }
        self.n = rows.len();
        let w = &self.m.lm_head;
        self.prepare(Src::Xn, h, 0..rows.len(), &[w]);
        self.product(w, None, &self.v.out, 1, |_, _| {});
    }
}

/// `x += post_norm(o)` for `n` tokens of width `h`, into `p`'s residual stream.
pub(super) fn add_residual(p: &mut Private, h: usize, n: usize, o: &[f32], post: Option<&Norm>) {
    for t in 0..n {
        let x = &mut p.x[t * h..(t + 1) * h];
        let ot = &o[t * h..(t + 1) * h];
        match post {
            Some(pn) => {
                let tmp = &mut p.scratch[..h];
                tmp.copy_from_slice(ot);
                norm_row(pn, tmp);
                x.iter_mut().zip(tmp.iter()).for_each(|(x, o)| *x += o);
            }
            None => x.iter_mut().zip(ot).for_each(|(x, o)| *x += o),
        }
    }
}

/// A weight of a product, its bias, and the buffer of its outputs.
pub(super) type Target<'a> = (&'a Weight, Option<&'a [f32]>, &'a SharedSlice<'a, f32>);

/// Where the input of a product comes from.
#[derive(Clone, Copy)]
pub(super) enum Src<'a> {
    /// This thread's `xn`.
    Xn,
    /// Rows of a shared buffer.
    Shared(&'a SharedSlice<'a, f32>),
}
