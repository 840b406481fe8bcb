//! `y = x Wᵀ + b` inside a pool job: the threads claim blocks of output rows; each block runs
//! over every input row, four at a time (eight for the packed kernel), so a weight block is
//! unpacked once per four (eight) tokens and stays in L1 while the activations stream from L2.
//! The weights are read as quantised blocks, never expanded: in their ggml layout, or for the
//! 32-value types on x86 (AVX2 or AVX-512) as repacked at load (sixteen rows interleaved,
//! [`crate::kernels::packed`]).

use std::ops::Range;

use anelm_model::Weight;

use crate::kernels::packed::Packed;
#[cfg(target_arch = "x86_64")]
use crate::kernels::packed::{Layout, MAX_TOKENS, ROWS};
use crate::kernels::{prefetch, Kernel, MAX_ROWS};
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
const GROUPS_PER_CALL: usize = 8;

/// How far ahead of the row kernels' reads the rows are prefetched (see [`prefetch`]).
const PREFETCH_BYTES: usize = 2048;

/// Input rows per tile of a product (see [`matmul`]).
pub const TOKEN_BLOCK: usize = 64;

/// Output rows per claimed block: a thread claims the blocks of its own share of the matrix
/// first (see [`Ctx::chunks`]) and steals the others' only at the end, so a block is the unit
/// of rebalancing, and each costs a claim, a kernel call and a `done` call. At least 256 rows
/// and at least a 128th of the matrix measured best in decode (SmolLM2 tg128 on 2 threads,
/// medians of 8 alternating runs: 128 rows 315 tok/s, 256 rows 345, 512 rows 337, 16 rows
/// 276); a multiple of `align` and of the packed layout's rows. The blocks are made a multiple
/// of the `threads` in number where the alignment allows, so that a small matrix splits evenly
/// (576 rows as four blocks of 144 rather than three of 192, where one thread would do two and
/// the other wait).
fn block_rows(rows: usize, align: usize, threads: usize) -> usize {
    let align = lcm(align.max(1), crate::kernels::packed::ROWS);
    let n_blocks = rows.div_ceil(rows.div_ceil(128).max(256));
    rows.div_ceil(n_blocks.next_multiple_of(threads.max(1)))
        .next_multiple_of(align)
}

fn lcm(a: usize, b: usize) -> usize {
    let (mut x, mut y) = (a, b);
    while y != 0 {
        (x, y) = (y, x % y);
    }
    a / x * b
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

/// Writes `vals` (plus the bias) as rows `r..` of input row `t` of `out` (`rows` per input row).
fn store(
    out: &SharedSlice<'_, f32>,
    bias: Option<&[f32]>,
    rows: usize,
    t: usize,
    r: usize,
    vals: &[f32],
) {
    let at = t * rows + r;
    // SAFETY: the caller's thread claimed these rows of this input row: it alone writes them.
    let dst = unsafe { out.range_mut(at..at + vals.len()) };
    match bias {
        Some(b) => dst
            .iter_mut()
            .zip(vals.iter().zip(&b[r..]))
            .for_each(|(d, (v, b))| *d = v + b),
        None => dst.copy_from_slice(vals),
    }
}

/// Output rows `r0..r1` of the packed product `p` for the input rows `tokens`: up to
/// [`MAX_TOKENS`] of them per pass over the weights.
#[cfg(target_arch = "x86_64")]
fn packed_tile(
    p: &Product<'_>,
    w: Packed<'_>,
    q: &Q8Buf,
    r0: usize,
    r1: usize,
    tokens: Range<usize>,
) {
    let lay = Layout::of(w.dtype).expect("packed types have a layout");
    let group_bytes = w.blocks * lay.column();
    let groups = r0 / ROWS..r1.div_ceil(ROWS);
    let mut sums = [0f32; MAX_TOKENS * GROUPS_PER_CALL * ROWS];
    for t0 in tokens.clone().step_by(MAX_TOKENS) {
        let tn = (tokens.end - t0).min(MAX_TOKENS);
        let xs: [Q8Row<'_>; MAX_TOKENS] = std::array::from_fn(|t| q.row(t0 + t.min(tn - 1)));
        for g0 in groups.clone().step_by(GROUPS_PER_CALL) {
            let g1 = (g0 + GROUPS_PER_CALL).min(groups.end);
            let sums = &mut sums[..tn * (g1 - g0) * ROWS];
            let data = &w.data[g0 * group_bytes..g1 * group_bytes];
            // SAFETY: weights are packed only for an instruction set the CPU has (see `Resident`).
            unsafe {
                crate::kernels::x86_packed::packed_dot(w.isa, data, w.blocks, lay, &xs[..tn], sums)
            };
            let (start, end) = (g0 * ROWS, r1.min(g1 * ROWS));
            for (t, row) in sums.chunks_exact((g1 - g0) * ROWS).enumerate() {
                store(p.out, p.bias, p.w.rows, t0 + t, start, &row[..end - start]);
            }
        }
    }
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
    #[cfg(target_arch = "x86_64")]
    if let (Kernel::Q8 { .. }, Input::Q8(q), Some(packed)) = (kernel, input, packed) {
        return packed_tile(p, packed, q, r0, r1, tokens);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = packed;
    let (rows, cols) = (w.rows, w.cols);
    let rb = all.len() / rows.max(1);
    let row = |r: usize| &all[r * rb..(r + 1) * rb];
    for t0 in tokens.clone().step_by(MAX_ROWS) {
        let tn = (tokens.end - t0).min(MAX_ROWS);
        let mut res = [0f32; MAX_ROWS];
        let emit = |r: usize, res: &[f32]| {
            for (t, v) in res.iter().enumerate() {
                store(out, bias, rows, t0 + t, r, std::slice::from_ref(v));
            }
        };
        match (kernel, input) {
            (Kernel::Q8 { f, .. }, Input::Q8(q)) => {
                let xs: [Q8Row<'_>; MAX_ROWS] = std::array::from_fn(|t| q.row(t0 + t.min(tn - 1)));
                let ahead = PREFETCH_BYTES.div_ceil(rb.max(1));
                for r in r0..r1 {
                    if r + ahead < r1 {
                        prefetch(row(r + ahead));
                    }
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
