//! Which instruction set the kernels use, chosen once at run time. The scalar kernels are always
//! compiled; the x86 ones behind `cfg(target_arch = "x86_64")` and `is_x86_feature_detected!`,
//! the NEON ones behind `cfg(target_arch = "aarch64")` (NEON is part of the aarch64 baseline).

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    Scalar,
    /// AVX2 + FMA + F16C (Haswell and later, Zen).
    Avx2,
    /// AVX2 plus AVX-512 F/BW/VL with VNNI (Ice Lake and later, Zen 4): 8-bit dot products in
    /// one instruction and byte masks.
    Avx512,
    Neon,
}

impl Isa {
    /// The best instruction set this CPU runs; `ANELM_ISA=scalar|avx2|avx512|neon` caps it (for
    /// comparing kernels), never raising it above what the CPU has.
    pub fn detect() -> Isa {
        let best = Isa::available().into_iter().max().unwrap_or(Isa::Scalar);
        match std::env::var("ANELM_ISA")
            .ok()
            .as_deref()
            .and_then(Isa::parse)
        {
            Some(cap) if Isa::available().contains(&cap) => cap,
            _ => best,
        }
    }

    /// AVX2 + FMA + F16C are there (both x86 levels).
    pub fn has_avx2(self) -> bool {
        matches!(self, Isa::Avx2 | Isa::Avx512)
    }

    /// [`Isa::detect`], computed once per process.
    pub fn detect_cached() -> Isa {
        static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *ISA.get_or_init(Isa::detect)
    }

    pub fn parse(name: &str) -> Option<Isa> {
        Some(match name {
            "scalar" => Isa::Scalar,
            "avx2" => Isa::Avx2,
            "avx512" => Isa::Avx512,
            "neon" => Isa::Neon,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
        }
    }

    /// Every instruction set this CPU runs, scalar first (the property tests try them all).
    pub fn available() -> Vec<Isa> {
        #[allow(unused_mut)]
        let mut v = vec![Isa::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
            {
                v.push(Isa::Avx2);
                if is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
                {
                    v.push(Isa::Avx512);
                }
            }
        }
        #[cfg(target_arch = "aarch64")]
        v.push(Isa::Neon);
        v
    }
}
