//! `y = x W^T + b` for a weight of any ggml type: rows of W are dequantised a tile at a time into
//! a small f32 buffer and dotted with every input row while the tile is hot in cache. Work is
//! split across threads by output rows.

use anelm_model::plan::Linear;
use anelm_model::Weight;
use rayon::prelude::*;

use crate::ops::dot;

/// Output rows dequantised together (one tile per task step).
const TILE_ROWS: usize = 16;

/// A raw pointer to the output, shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint (token, row) elements; the pointer outlives the parallel scope.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// `out[t][r] = x[t] · W[r] (+ b[r])` for `n` input rows of `W.cols` values.
pub fn linear(lin: &Linear, x: &[f32], n: usize, out: &mut [f32]) {
    matmul(&lin.weight, x, n, out);
    if let Some(b) = &lin.bias {
        for row in out.chunks_exact_mut(lin.weight.rows) {
            row.iter_mut().zip(b).for_each(|(o, b)| *o += b);
        }
    }
}

/// `out[t][r] = x[t] · W[r]`.
pub fn matmul(w: &Weight, x: &[f32], n: usize, out: &mut [f32]) {
    let (rows, cols) = (w.rows, w.cols);
    assert_eq!(x.len(), n * cols, "matmul input size");
    assert_eq!(out.len(), n * rows, "matmul output size");
    let ptr = OutPtr(out.as_mut_ptr());
    let n_tiles = rows.div_ceil(TILE_ROWS);
    (0..n_tiles).into_par_iter().for_each_init(
        || vec![0f32; TILE_ROWS * cols],
        |tile, t| {
            let r0 = t * TILE_ROWS;
            let r1 = (r0 + TILE_ROWS).min(rows);
            for r in r0..r1 {
                let dst = &mut tile[(r - r0) * cols..(r - r0 + 1) * cols];
                w.dequantize_row(r, dst).expect("weight rows are whole blocks (checked at load)");
            }
            let p = ptr;
            for tok in 0..n {
                let xr = &x[tok * cols..(tok + 1) * cols];
                for r in r0..r1 {
                    let v = dot(xr, &tile[(r - r0) * cols..(r - r0 + 1) * cols]);
                    // SAFETY: (tok, r) is written by this task only; index < n * rows.
                    unsafe { *p.0.add(tok * rows + r) = v };
                }
            }
        },
    );
}
