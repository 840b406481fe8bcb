//! Dot products of weight rows, read straight from their ggml blocks, with 1 to 4 input rows at a
//! time (decode uses 1; prefill 4, so each weight block is unpacked once for four tokens); the
//! x86 kernels of the repacked 32-value types ([`packed`], [`x86_packed`]) take up to eight.
//!
//! Quantised types take 8-bit activations ([`crate::q8`]) and do the block arithmetic in
//! integers, as ggml does: Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 against 32-value blocks, Q4_K, Q5_K
//! and Q6_K against 256-value blocks. F32, F16 and BF16 take f32 activations and stay exact.
//! Every other type is dequantised a row at a time into f32 (see `matmul`).
//!
//! [`scalar`] is the reference of every kernel; [`x86`] has AVX2 and AVX-512 VNNI versions and
//! `neon` the aarch64 ones. The property tests in `tests.rs` check them against the reference.

use anelm_formats::GgmlType;

use crate::q8::{ActKind, Q8Row};
use crate::simd::Isa;

#[cfg(target_arch = "aarch64")]
pub mod neon;
pub mod packed;
pub mod scalar;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
pub mod x86;
#[cfg(target_arch = "x86_64")]
pub mod x86_packed;

/// Values per block of the 32-value types.
pub const QK: usize = 32;
/// The most input rows one kernel call takes.
pub const MAX_ROWS: usize = 4;

/// Asks for `bytes` to be brought towards L1 ahead of use (nothing where there is no such hint):
/// the hardware's streamer stops at each 4 KiB page, and a kernel busy with several input rows
/// otherwise waits for each page's first lines from L3 or memory.
#[inline(always)]
pub fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        // SAFETY: a hint only; the address is inside `bytes`.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                line.as_ptr() as *const i8
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// `out[t] = row · xs[t]` for 8-bit activation rows; `xs.len() == out.len()` in `1..=MAX_ROWS`.
/// Unsafe only because SIMD versions need their CPU features, which [`select`] checked.
pub type Q8Kernel = unsafe fn(row: &[u8], xs: &[Q8Row<'_>], out: &mut [f32]);
/// The same for f32 activations.
pub type F32Kernel = unsafe fn(row: &[u8], xs: &[&[f32]], out: &mut [f32]);

/// How rows of one weight type are multiplied.
#[derive(Clone, Copy)]
pub enum Kernel {
    Q8 {
        act: ActKind,
        f: Q8Kernel,
    },
    F32(F32Kernel),
    /// No direct kernel: rows are dequantised to f32 and go through the F32 kernel.
    Dequant(F32Kernel),
}

impl Kernel {
    pub fn act(self) -> ActKind {
        match self {
            Kernel::Q8 { act, .. } => act,
            Kernel::F32(_) | Kernel::Dequant(_) => ActKind::F32,
        }
    }
}

/// The kernel for weights of `dtype` on `isa` (which must be one of `Isa::available()`).
pub fn select(dtype: GgmlType, isa: Isa) -> Kernel {
    use GgmlType::*;
    let b32 = ActKind::Q8B32;
    let k = ActKind::Q8K;
    macro_rules! pick {
        ($name:ident) => {{
            let f: Q8Kernel = match isa {
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => x86::avx512::$name,
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => x86::avx2::$name,
                #[cfg(target_arch = "aarch64")]
                Isa::Neon => neon::$name,
                _ => scalar::$name,
            };
            f
        }};
    }
    let f32_kernel = |scalar_f: F32Kernel, name: &str| -> F32Kernel {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 | Isa::Avx2 => x86::f32_kernel(name),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => neon::f32_kernel(name),
            _ => {
                let _ = name;
                scalar_f
            }
        }
    };
    match dtype {
        Q4_0 => Kernel::Q8 {
            act: b32,
            f: pick!(q4_0),
        },
        Q4_1 => Kernel::Q8 {
            act: b32,
            f: pick!(q4_1),
        },
        Q5_0 => Kernel::Q8 {
            act: b32,
            f: pick!(q5_0),
        },
        Q5_1 => Kernel::Q8 {
            act: b32,
            f: pick!(q5_1),
        },
        Q8_0 => Kernel::Q8 {
            act: b32,
            f: pick!(q8_0),
        },
        Q4K => Kernel::Q8 {
            act: k,
            f: pick!(q4_k),
        },
        Q5K => Kernel::Q8 {
            act: k,
            f: pick!(q5_k),
        },
        Q6K => Kernel::Q8 {
            act: k,
            f: pick!(q6_k),
        },
        F32 => Kernel::F32(f32_kernel(scalar::f32, "f32")),
        F16 => Kernel::F32(f32_kernel(scalar::f16, "f16")),
        BF16 => Kernel::F32(f32_kernel(scalar::bf16, "bf16")),
        _ => Kernel::Dequant(f32_kernel(scalar::f32, "f32")),
    }
}

/// The kernel for `dtype` with f32 activations: quantised types dequantise their rows instead of
/// quantising the activations, so every product is exact f32 arithmetic (slower; for checking).
pub fn select_exact(dtype: GgmlType, isa: Isa) -> Kernel {
    match select(dtype, isa) {
        Kernel::Q8 { .. } => select(GgmlType::Q2K, isa),
        k => k,
    }
}

/// Block byte sizes (ggml's `block_*` structs).
pub mod bytes {
    pub const Q4_0: usize = 18;
    pub const Q4_1: usize = 20;
    pub const Q5_0: usize = 22;
    pub const Q5_1: usize = 24;
    pub const Q8_0: usize = 34;
    pub const Q4_K: usize = 144;
    pub const Q5_K: usize = 176;
    pub const Q6_K: usize = 210;
}

/// The f16 at `b[at..]`, widened exactly.
#[inline(always)]
pub fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// The 6-bit scales and mins of the 8 sub-blocks of a Q4_K/Q5_K block from its 12 scale bytes:
/// sub-blocks 0..4 keep them in the low 6 bits of bytes `j` and `j + 4`; 4..8 keep their low 4
/// bits in byte `j + 4` and their top 2 bits in the top of bytes `j - 4` (scale) and `j` (min).
/// Worked four bytes at a time in u32 words: prefill decodes every block once per four tokens.
#[inline(always)]
pub fn k4_scales_mins(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let word = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (w0, w1, w2) = (word(0), word(1), word(2));
    let sc_hi = (w2 & LOW4) | (((w0 >> 6) & LOW2) << 4);
    let mn_hi = ((w2 >> 4) & LOW4) | (((w1 >> 6) & LOW2) << 4);
    let join = |lo: u32, hi: u32| (u64::from(lo) | (u64::from(hi) << 32)).to_le_bytes();
    (join(w0 & LOW6, sc_hi), join(w1 & LOW6, mn_hi))
}
