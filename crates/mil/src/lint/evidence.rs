//! What the lint stands on, as data: the chips whose answers differ, every rule's public source
//! (a ../shared/ane/FACTS.md section and its evidence tag), and the ops and op forms that
//! hardware-proven public programs use — so a rule can be checked against its source, and the
//! probe census knows which ops and forms no public program has settled.

/// The Apple chip family a program is linted for. Where sources disagree by chip, the rule
/// follows the chip; [`Chip::Unknown`] (the default) takes the conservative reading.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Chip {
    #[default]
    Unknown,
    M1,
    M2,
    M3,
    M4,
    M5,
}

impl Chip {
    pub const ALL: [Chip; 6] = [
        Chip::Unknown,
        Chip::M1,
        Chip::M2,
        Chip::M3,
        Chip::M4,
        Chip::M5,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Chip::Unknown => "unknown",
            Chip::M1 => "m1",
            Chip::M2 => "m2",
            Chip::M3 => "m3",
            Chip::M4 => "m4",
            Chip::M5 => "m5",
        }
    }

    /// The family of a `machdep.cpu.brand_string` ("Apple M3 Max" → M3); Unknown otherwise.
    pub fn from_brand(brand: &str) -> Chip {
        let word = brand
            .split_whitespace()
            .find(|w| w.len() == 2 && w.starts_with(['M', 'm']))
            .map(str::to_ascii_lowercase);
        Chip::ALL
            .into_iter()
            .find(|c| Some(c.name()) == word.as_deref())
            .unwrap_or(Chip::Unknown)
    }

    /// The largest tensor dimension shown to work on this chip, or the conservative limit:
    /// FACTS §4 — MAD's classifier produces `[1, 32000, 1, S]` and softmaxes it on M4 [HW];
    /// elsewhere only "max dimension 16384" (a Core ML tuning gist, [REP]) and ALM/FG's 16384-row
    /// head chunks (M3 Max) are known.
    pub fn max_dim(self) -> usize {
        match self {
            Chip::M4 => 32000,
            _ => 16384,
        }
    }
}

/// A lint rule and the public evidence it rests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub id: &'static str,
    pub evidence: &'static str,
}

const fn rule(id: &'static str, evidence: &'static str) -> Rule {
    Rule { id, evidence }
}

/// Every rule the lint reports, with its evidence.
pub const RULES: &[Rule] = &[
    rule("gelu", "FACTS §1.5 [HW] ORI ane_constraints #10 (M4 Max): ANECCompile() FAILED"),
    rule("rsqrt", "FACTS §1.5, C4 [HW] MPB README (M4, compile), FG program.md (M3 Max, eval 0x1d)"),
    rule("inverse", "FACTS §1.5 [HW] MPB README (M4): compile failure"),
    rule("reduce_mean", "FACTS §1.5, C4 [HW] ESP blog + hollance #44 (M3 Max), Espresso #18 (M1 Ultra) reject it; ORI GPT-2 runs it (M4 Max)"),
    rule("tile", "FACTS §1.5/§4 [HW] FG tests/test_dynamic16.cpp (M3 Max): later evals fail 0x1d"),
    rule("affine-dequantize", "FACTS §5, C5 [REP] ESP blog (M3 Max) InvalidMILProgram; [HW] MAD ane_int8_bench.m (M4) runs it"),
    rule("cast", "FACTS §4, C1 [REP] maderix/ANE PR #6 (M1 Pro); [HW] M3/M4/M5 run fp32 I/O casts (MAD community results)"),
    rule("fp32-io", "FACTS §4, C1 [REP] maderix/ANE PR #6 (M1/M2 cannot cast); [HW] MAD README: fp16 I/O ~37% faster"),
    rule("sdpa-mask", "FACTS §1.5 [HW] MAD README, ORI #6, MPB README: attn_mask silently ignored"),
    rule("softmax-length", "FACTS §1.5/§4 [REP] ESP docs (M3 Max) reject non-power-of-two lengths; [HW] MAD ane_classifier.h softmaxes 32000 channels (M4, train_large_ane)"),
    rule("conv-bias", "FACTS §1.5 [REP] ORI README: conv with bias= fails to compile"),
    rule("conv-runtime-weight", "FACTS §1.5/§4 [HW] FG README (M3 Max): compiles, weights silently ignored; issue #14: an ANE run of a runtime-weight conv elsewhere"),
    rule("conv-input-channels", "FACTS §1.5/§4 [HW M4] MAD training/ane_classifier.h: 'ANE rejects conv with 32000 input channels'"),
    rule("slice-input", "FACTS §1.5 [REP] ESP blog (M3 Max): slice_by_index on a function input in a complex graph; issue #14: hardware-run programs slice inputs (M3 Max)"),
    rule("max-dim", "FACTS §4 [REP] 'max dimension 16384' (Core ML tuning gist), ALM/FG 16384-row head chunks (M3 Max); [HW] MAD [1, 32000, 1, S] classifier (M4)"),
    rule("io-row-padding", "FACTS §4 [HW] H3 (M3 Ultra): channel rows padded to 64 bytes"),
    rule("input-spatial-window", "FACTS §1.5/§4 [REP] MPB README (M4): input width 14593-14622 fails 0x1d"),
    rule("output-written-to-state", "COREML.md §8: apple/coremltools PR #2713 (runtime proxy crash)"),
    rule("duplicate-op-name", "FACTS §1.2 [INF] proven programs name ops uniquely; issue #14: a reused const name ran (M3 Max)"),
    rule("inline-literal", "FACTS §1.2 [INF] no hardware-proven program passes an inline literal to a non-constexpr op; ORI [REP] inline bools rejected"),
    rule("unknown-op", "crates/mil/src/ops.rs: anelm's op table"),
    rule("unproven", "FACTS §1.4/§1.5/§5: the ops and forms hardware-proven programs use (lint::evidence::PROVEN_OPS)"),
    rule("weights-size", "FACTS §4 [REP] coremltools PR #2593 (2 GiB maximum), ANEForge PR #45 (~1.5 GB compiles, 3.4 GB fails)"),
    rule("too-many-layers", "FACTS §1.5 [HW] Espresso issue #18 (M1 Ultra, macOS 26): large graphs fail without diagnostics; anelm's budget (issue #4)"),
    rule("too-many-procedures", "FACTS §1.2/§4 [HW] OMX (M3 Ultra): 121 resident handles, banks of <= 112 procedures"),
];

/// The evidence of rule `id`.
pub fn evidence(id: &str) -> Option<&'static str> {
    RULES.iter().find(|r| r.id == id).map(|r| r.evidence)
}

/// An op hardware-proven public programs use, in the form they use it, and who ran it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProvenOp {
    pub op: &'static str,
    /// The form proven (what [`super`] checks beyond the op's name); empty: any.
    pub form: &'static str,
    pub evidence: &'static str,
}

const fn proven(op: &'static str, form: &'static str, evidence: &'static str) -> ProvenOp {
    ProvenOp { op, form, evidence }
}

/// FACTS §1.4 (call forms) and §1.5 (proven in hardware-run programs) and §5 (quantised weights).
pub const PROVEN_OPS: &[ProvenOp] = &[
    proven("const", "", "FACTS §1.3 [HW] every program"),
    proven(
        "conv",
        "1x1 kernel, groups 1",
        "FACTS §1.4/§1.5 [HW] MAD stories_mil.h CONV_CONST (M1 Pro…M5)",
    ),
    proven("add", "", "FACTS §1.4 [HW] MAD, ORI"),
    proven("mul", "", "FACTS §1.4 [HW] MAD, ORI"),
    proven("sub", "", "FACTS §1.4/§1.5 [HW] MAD, ORI GPT-2 (M4 Max)"),
    proven(
        "real_div",
        "",
        "FACTS §1.4 [HW] MPB README (M4), ALM (M3 Max)",
    ),
    proven("pow", "", "FACTS §1.4 [HW] MAD, ORI, ESP: pow(x, -0.5)"),
    proven("sigmoid", "", "FACTS §1.4 [HW] MAD, ALM"),
    proven(
        "tanh",
        "",
        "FACTS §1.5 [HW] ORI gelu decomposition (M4 Max)",
    ),
    proven("exp", "", "FACTS §1.4 [HW] MAD, ALM"),
    proven("sqrt", "", "FACTS §1.4 [HW] MAD, ALM"),
    proven("silu", "", "FACTS §1.4 [HW] OMX (M3 Ultra), FG (M3 Max)"),
    proven(
        "softmax",
        "",
        "FACTS §1.4/§1.5 [HW] MAD (axis -1 over 256; axis 1 over 32000, M4)",
    ),
    proven(
        "matmul",
        "transpose_x false",
        "FACTS §1.4/§4 [HW] MAD (transpose_x=false), H3 two-input matmul (M3 Ultra)",
    ),
    proven("reshape", "", "FACTS §1.4 [HW] MAD"),
    proven("transpose", "", "FACTS §1.4 [HW] MAD perm [0,1,3,2]"),
    proven(
        "concat",
        "channel axis (1)",
        "FACTS §1.5, C2 [HW] MAD stories kernels (M1…M5), ALM fused QKV (M3 Max), ESP",
    ),
    proven("slice_by_size", "", "FACTS §1.4 [HW] MAD"),
    proven("slice_by_index", "", "FACTS §1.4 ORI codegen (M4 Max)"),
    proven("reduce_sum", "", "FACTS §1.4 [HW] MAD, ORI"),
    proven("reduce_max", "", "FACTS §1.5 [HW] ESP (M3 Max)"),
    proven("reduce_mean", "", "FACTS §1.5, C4 [HW] ORI GPT-2 (M4 Max)"),
    proven("cast", "", "FACTS §1.5, C1 [HW] MAD, ORI (M3/M4/M5)"),
    proven("identity", "", "FACTS §1.5 [HW] ORI GPT-2 (M4 Max)"),
    proven(
        "constexpr_blockwise_shift_scale",
        "int8 data",
        "FACTS §5 [HW] OMX (M3 Ultra, M5 Pro)",
    ),
    proven(
        "constexpr_affine_dequantize",
        "int8 data",
        "FACTS §5, C5 [HW] MAD ane_int8_bench.m (M4)",
    ),
    proven("quantize", "", "FACTS §5 [HW] MAD int8 bench (M4)"),
    proven("dequantize", "", "FACTS §5 [HW] MAD int8 bench (M4)"),
    proven(
        "scaled_dot_product_attention",
        "",
        "FACTS §1.4 [HW] MAD training/test_ane_sdpa5.m (probe; mask ignored)",
    ),
];

/// The proven entry of `op`, if any.
pub fn proven_op(op: &str) -> Option<&'static ProvenOp> {
    PROVEN_OPS.iter().find(|p| p.op == op)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_citation_names_its_source() {
        for r in RULES {
            assert!(
                r.evidence.contains("FACTS §")
                    || r.evidence.contains("COREML.md")
                    || r.id == "unknown-op",
                "{}",
                r.id
            );
        }
        for p in PROVEN_OPS {
            assert!(p.evidence.starts_with("FACTS §"), "{}", p.op);
        }
        let mut ids: Vec<_> = RULES.iter().map(|r| r.id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), RULES.len(), "rule ids are unique");
    }

    #[test]
    fn chips_from_brand_strings() {
        assert_eq!(Chip::from_brand("Apple M3 Max"), Chip::M3);
        assert_eq!(Chip::from_brand("Apple M1"), Chip::M1);
        assert_eq!(Chip::from_brand("Apple M4 Pro"), Chip::M4);
        assert_eq!(Chip::from_brand("Intel(R) Core(TM) i7"), Chip::Unknown);
        assert_eq!(Chip::from_brand("Apple M9"), Chip::Unknown);
        assert_eq!(Chip::M4.max_dim(), 32000);
        assert_eq!(Chip::default().max_dim(), 16384);
    }
}
