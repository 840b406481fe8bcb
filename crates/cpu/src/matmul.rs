//! `y = x Wᵀ + b` inside a pool job: the threads claim blocks of output rows; each block runs
//! over every input row, four at a time, so a weight block is unpacked once per four tokens and
//! stays in L1 while the activations stream from L2. The weights are read as quantised blocks,
//! never expanded: in their ggml layout, or for the 32-value types on AVX-512 as repacked at
//! load (four rows interleaved, [`crate::kernels::packed`]).

use std::ops::Range;

use anelm_model::Weight;

use crate::kernels::packed::Packed;
#[cfg(target_arch = "x86_64")]
use crate::kernels::packed::{Layout, ROWS};
use crate::kernels::{Kernel, MAX_ROWS};
use crate::pool::Ctx;
use crate::q8::{Q8Buf, Q8Row};
use crate::shared::SharedSlice;

/// The input rows of a product, in the form the weight's kernel takes.
#[derive(Clone, Copy)]
pub enum Input<'a> {
    /// `n` rows of `cols` floats, one after the other.
    F32(&'a [f32]),
    Q8(&'a Q8Buf),
}

/// Packed row groups per kernel call: enough to amortise the call, few enough for a stack buffer.
#[cfg(target_arch = "x86_64")]
const GROUPS_PER_CALL: usize = 16;

/// Input rows per tile of a product (see [`matmul`]).
pub const TOKEN_BLOCK: usize = 64;

/// Output rows per claimed block: a thread claims the blocks of its own share of the matrix
/// first (see [`Ctx::chunks`]) and steals the others' only at the end, so a block is the unit
/// of rebalancing, and each costs a claim, a kernel call and a `done` call. At least 256 rows
/// and at least a 128th of the matrix measured best in decode (SmolLM2 tg128 on 2 threads,
/// medians of 8 alternating runs: 128 rows 315 tok/s, 256 rows 345, 512 rows 337, 16 rows
/// 276); a multiple of `align`. The blocks are made a multiple of the `threads` in number where
/// the alignment allows, so that a small matrix splits evenly (576 rows as four blocks of 144
/// rather than three of 192, where one thread would do two and the other wait).
fn block_rows(rows: usize, align: usize, threads: usize) -> usize {
    let align = align.max(4);
    let n_blocks = rows.div_ceil(rows.div_ceil(128).max(256));
    rows.div_ceil(n_blocks.next_multiple_of(threads.max(1)))
        .next_multiple_of(align)
}

/// One weight of a product: `out[t * W.rows + r] = x[t] · W[r] (+ bias[r])` for the input rows.
#[derive(Clone, Copy)]
pub struct Product<'a> {
    pub kernel: Kernel,
    pub w: &'a Weight,
    pub bias: Option<&'a [f32]>,
    pub input: Input<'a>,
    pub out: &'a SharedSlice<'a, f32>,
    /// The weight's rows as in the file, and its packed copy where it has one.
    pub bytes: &'a [u8],
    pub packed: Option<Packed<'a>>,
}

/// The products `ps` (weights of the same number of rows) for the `n` input rows, shared by the
/// pool's threads; `scratch` is this thread's f32 row buffer (used by types without a direct
/// kernel). Work is shared in tiles of a block of output rows (a multiple of `align` but the
/// last) by a block of input rows (all of them in decode; [`TOKEN_BLOCK`] in prefill, so that a
/// matrix of few row blocks still keeps every thread busy); a tile covers those rows of every
/// product, and `done(rows, tokens)` runs after each of this thread's tiles is complete — so an
/// elementwise step over several outputs (the FFN's gate and up) needs no barrier before it.
/// Every thread of the pool must call this with the same arguments.
pub fn matmul(
    ctx: &Ctx,
    ps: &[Product<'_>],
    n: usize,
    scratch: &mut Vec<f32>,
    align: usize,
    mut done: impl FnMut(Range<usize>, Range<usize>),
) {
    let rows = ps.first().map_or(0, |p| p.w.rows);
    debug_assert!(ps
        .iter()
        .all(|p| p.w.rows == rows && p.out.len() >= n * rows));
    let br = block_rows(rows, align, ctx.n);
    let n_row_blocks = rows.div_ceil(br);
    ctx.chunks(n_row_blocks * n.div_ceil(TOKEN_BLOCK), |c| {
        let (rb_i, tb) = (c % n_row_blocks, c / n_row_blocks);
        let (r0, r1) = (rb_i * br, ((rb_i + 1) * br).min(rows));
        let tokens = tb * TOKEN_BLOCK..((tb + 1) * TOKEN_BLOCK).min(n);
        for p in ps {
            tile(p, r0, r1, tokens.clone(), scratch);
        }
        done(r0..r1, tokens);
    });
}

/// Output rows `r0..r1` of product `p` for the input rows `tokens`, a tile this thread claimed.
fn tile(p: &Product<'_>, r0: usize, r1: usize, tokens: Range<usize>, scratch: &mut Vec<f32>) {
    let Product {
        kernel,
        w,
        bias,
        input,
        out,
        bytes: all,
        packed,
    } = *p;
    let (rows, cols) = (w.rows, w.cols);
    let rb = all.len() / rows.max(1);
    let row = |r: usize| &all[r * rb..(r + 1) * rb];
    #[cfg(not(target_arch = "x86_64"))]
    let _ = packed;
    for t0 in tokens.clone().step_by(MAX_ROWS) {
        let tn = (tokens.end - t0).min(MAX_ROWS);
        let mut res = [0f32; MAX_ROWS];
        // Rows `r..r + vals.len()` of input row `t0 + t`.
        let put = |t: usize, r: usize, vals: &[f32]| {
            let at = (t0 + t) * rows + r;
            // SAFETY: this thread claimed rows r0..r1 of these input rows: it alone writes them.
            let dst = unsafe { out.range_mut(at..at + vals.len()) };
            match bias {
                Some(b) => dst
                    .iter_mut()
                    .zip(vals.iter().zip(&b[r..]))
                    .for_each(|(d, (v, b))| *d = v + b),
                None => dst.copy_from_slice(vals),
            }
        };
        let emit = |r: usize, res: &[f32]| {
            for (t, v) in res.iter().enumerate() {
                put(t, r, std::slice::from_ref(v));
            }
        };
        match (kernel, input) {
            #[cfg(target_arch = "x86_64")]
            (Kernel::Q8 { .. }, Input::Q8(q)) if packed.is_some() => {
                let p = packed.expect("checked");
                let lay = Layout::of(p.dtype).expect("packed types have a layout");
                let group_bytes = p.blocks * lay.column();
                let xs: [Q8Row<'_>; MAX_ROWS] = std::array::from_fn(|t| q.row(t0 + t.min(tn - 1)));
                let mut sums = [0f32; MAX_ROWS * GROUPS_PER_CALL * ROWS];
                let groups = r0 / ROWS..r1.div_ceil(ROWS);
                for g0 in groups.clone().step_by(GROUPS_PER_CALL) {
                    let g1 = (g0 + GROUPS_PER_CALL).min(groups.end);
                    let sums = &mut sums[..tn * (g1 - g0) * ROWS];
                    let data = &p.data[g0 * group_bytes..g1 * group_bytes];
                    // SAFETY: weights are packed only when the CPU has AVX-512 (see `Resident`).
                    unsafe {
                        crate::kernels::x86::packed_dot(data, p.blocks, lay, &xs[..tn], sums)
                    };
                    let (start, end) = (g0 * ROWS, r1.min(g1 * ROWS));
                    for (t, row) in sums.chunks_exact((g1 - g0) * ROWS).enumerate() {
                        put(t, start, &row[..end - start]);
                    }
                }
            }
            (Kernel::Q8 { f, .. }, Input::Q8(q)) => {
                let xs: [Q8Row<'_>; MAX_ROWS] = std::array::from_fn(|t| q.row(t0 + t.min(tn - 1)));
                for r in r0..r1 {
                    // SAFETY: `select` returns kernels of available instruction sets only.
                    unsafe { f(row(r), &xs[..tn], &mut res[..tn]) };
                    emit(r, &res[..tn]);
                }
            }
            (Kernel::F32(f), Input::F32(x)) => {
                let xs = f32_rows(x, cols, t0, tn);
                for r in r0..r1 {
                    // SAFETY: as above.
                    unsafe { f(row(r), &xs[..tn], &mut res[..tn]) };
                    emit(r, &res[..tn]);
                }
            }
            (Kernel::Dequant(f), Input::F32(x)) => {
                let xs = f32_rows(x, cols, t0, tn);
                scratch.resize(cols, 0.0);
                for r in r0..r1 {
                    anelm_formats::quant::dequantize(w.dtype, row(r), scratch)
                        .expect("weight rows are whole blocks of a known type (checked at load)");
                    // SAFETY: as above; the f32 kernel reads the dequantised row's bytes.
                    unsafe { f(f32_bytes(scratch), &xs[..tn], &mut res[..tn]) };
                    emit(r, &res[..tn]);
                }
            }
            _ => unreachable!("the forward pass prepares the input kind the kernel takes"),
        }
    }
}

/// Input rows `t0..t0 + tn` of `x` (the unused slots repeat the last row and are not read).
fn f32_rows(x: &[f32], cols: usize, t0: usize, tn: usize) -> [&[f32]; MAX_ROWS] {
    std::array::from_fn(|t| &x[(t0 + t.min(tn - 1)) * cols..][..cols])
}

/// The bytes of an f32 slice (the layout of an F32 weight row).
fn f32_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: any f32 is four initialised bytes; u8 has no alignment requirement.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}
