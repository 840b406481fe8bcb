//! Lint: what public sources report failing (or silently misbehaving) on ANE hardware, checked
//! over the IR, per chip where the sources differ by chip. Every rule cites its source
//! ([`evidence::RULES`]); an info-level rule names every op or form no hardware-proven program
//! uses ([`evidence::PROVEN_OPS`]) — what a probe must settle. Findings are advice — the
//! hardware verdict is the compiler's — so nothing here rejects a program.

pub mod evidence;

pub use evidence::Chip;

use crate::dtype::DType;
use crate::ir::{Binding, Function, Operation, Program, ValueDef, ValueId};
use crate::literal::Literal;
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// Reported context or a weaker report; worth knowing.
    Info,
    /// Reported failing on some chips / OS versions, or contradicted between sources.
    Warning,
    /// Reported failing (compile, eval or silently wrong results) on hardware.
    Error,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Error => "error",
        })
    }
}

/// One finding: which rule, how bad, where (function and the op's first output), what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LintFinding {
    pub rule: &'static str,
    pub severity: Severity,
    pub function: String,
    /// The value the op defines (or the input concerned); None for program-wide findings.
    pub value: Option<String>,
    pub message: String,
}

impl LintFinding {
    /// The public evidence of the finding's rule.
    pub fn evidence(&self) -> &'static str {
        evidence::evidence(self.rule).unwrap_or("")
    }
}

impl fmt::Display for LintFinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}] {}", self.severity, self.rule, self.function)?;
        if let Some(v) = &self.value {
            write!(f, "/{v}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Limits the lint checks against.
#[derive(Debug, Clone, PartialEq)]
pub struct LintConfig {
    /// The chip linted for: rules the sources settle differently by chip follow it.
    pub chip: Chip,
    /// Warn above this many bytes of weights in one program.
    pub weight_bytes_warn: u64,
    /// Error above this many bytes of weights in one program.
    pub weight_bytes_error: u64,
    /// Largest per-op dimension ([`Chip::max_dim`]).
    pub max_dim: usize,
    /// Most transformer layers to fuse into one program.
    pub max_layers: usize,
    /// Layers in the program, when the caller (the lowering) knows; otherwise estimated as
    /// the number of attention ops (softmax / scaled_dot_product_attention).
    pub layers: Option<usize>,
}

impl Default for LintConfig {
    fn default() -> Self {
        LintConfig::for_chip(Chip::Unknown)
    }
}

impl LintConfig {
    /// The limits of `chip`.
    pub fn for_chip(chip: Chip) -> Self {
        LintConfig {
            chip,
            // FACTS §4: ANEForge PR #45 measured ~1.5 GB compiling and ~3.4 GB failing; coremltools
            // PR #2593 quotes the 2 GiB (2147483648-byte) weight-file maximum.
            weight_bytes_warn: 1_600_000_000,
            weight_bytes_error: 2_147_483_648,
            max_dim: chip.max_dim(),
            // The fused-chunk budget of this project (issue #4); FACTS §1.5 cites Espresso issue #18
            // (large graphs failing to compile on macOS 26 without diagnostics).
            max_layers: 24,
            layers: None,
        }
    }
}

/// Lints a whole program with the default limits.
pub fn lint(program: &Program) -> Vec<LintFinding> {
    lint_with(program, &LintConfig::default())
}

pub fn lint_with(program: &Program, cfg: &LintConfig) -> Vec<LintFinding> {
    let mut out = Vec::new();
    for f in &program.functions {
        let mut cx = FnLint {
            f,
            cfg,
            out: &mut out,
        };
        cx.inputs();
        for op in f.ops() {
            cx.op(op);
            cx.proven(op);
        }
        cx.outputs();
        cx.names();
    }
    program_rules(program, cfg, &mut out);
    out
}

struct FnLint<'a> {
    f: &'a Function,
    cfg: &'a LintConfig,
    out: &'a mut Vec<LintFinding>,
}

/// Bytes per element of an I/O dtype (fp16 2, fp32 4, ...).
fn elem_bytes(d: DType) -> usize {
    (d.bits() as usize).div_ceil(8).max(1)
}

impl FnLint<'_> {
    fn push(
        &mut self,
        rule: &'static str,
        severity: Severity,
        value: Option<&str>,
        message: String,
    ) {
        self.out.push(LintFinding {
            rule,
            severity,
            function: self.f.name.clone(),
            value: value.map(str::to_string),
            message,
        });
    }

    fn op_label<'b>(&'b self, op: &'b Operation) -> &'b str {
        op.outputs
            .first()
            .map(|&o| self.f.name_of(o))
            .or(op.name.as_deref())
            .unwrap_or("?")
    }

    fn is_input(&self, id: ValueId) -> bool {
        matches!(self.f.value(id).def, ValueDef::Input(_))
    }

    fn io_row(&mut self, name: &str, t: &crate::TensorType, what: &str) {
        // FACTS §4 [HW H3, M3 Ultra]: each channel row is padded to 64 bytes; packed data is
        // wrong unless the row (last dim x element size) is a multiple of 64 B.
        if let Some(&w) = t.shape.last() {
            let row = w * elem_bytes(t.dtype);
            if !row.is_multiple_of(64) {
                self.push(
                    "io-row-padding",
                    Severity::Warning,
                    Some(name),
                    format!("{what} {t}: rows of {row} bytes are padded to {} on the ANE; marshal with a 64-byte row stride", row.div_ceil(64) * 64),
                );
            }
        }
    }

    fn inputs(&mut self) {
        for &id in self.f.inputs() {
            let name = self.f.name_of(id).to_string();
            let t = self.f.type_of(id).tensor().clone();
            if self.f.type_of(id).is_state() {
                continue;
            }
            self.io_row(&name, &t, "input");
            // FACTS §1.5 / §4: MPB README — input spatial 14593–14622 fails eval (0x1d) in complex graphs.
            if let Some(&w) = t.shape.last() {
                if (14593..=14622).contains(&w) {
                    self.push(
                        "input-spatial-window",
                        Severity::Warning,
                        Some(&name),
                        format!(
                            "input width {w} is in the 14593-14622 range MPB saw fail with 0x1d"
                        ),
                    );
                }
            }
            self.dims(&name, &t);
            if t.dtype == DType::Fp32 {
                if let Some(sev) = self.m1_m2_severity() {
                    self.push(
                        "fp32-io",
                        sev,
                        Some(&name),
                        "fp32 I/O needs cast ops, which fail on M1/M2; fp16 I/O is ~37% faster (MAD)"
                            .into(),
                    );
                }
            }
        }
    }

    fn outputs(&mut self) {
        for &id in self.f.outputs() {
            let name = self.f.name_of(id).to_string();
            let t = self.f.type_of(id).tensor().clone();
            self.io_row(&name, &t, "output");
            // COREML.md §8: a function output that is also the source of a state write crashes the
            // runtime proxy (apple/coremltools PR #2713).
            let feeds_state = self.f.ops().iter().any(|op| {
                op.op_type == "coreml_update_state" && op.value_input("value") == Some(id)
            });
            if feeds_state {
                self.push("output-written-to-state", Severity::Error, Some(&name), "an output that is also written to a state crashes the Core ML runtime proxy (coremltools PR #2713); output the coreml_update_state result instead".into());
            }
        }
    }

    /// Severity of a rule that only M1/M2 contradict (C1): a warning there, info when the chip is
    /// unknown, nothing on M3 and later (proven).
    fn m1_m2_severity(&self) -> Option<Severity> {
        match self.cfg.chip {
            Chip::M1 | Chip::M2 => Some(Severity::Warning),
            Chip::Unknown => Some(Severity::Info),
            _ => None,
        }
    }

    fn names(&mut self) {
        // FACTS §1.2: op names are unique in proven programs — but a reused const name ran on
        // M3 Max (issue #14), so that is only info.
        let mut seen = std::collections::HashMap::new();
        let mut dups = Vec::new();
        for op in self.f.ops() {
            if let Some(n) = &op.name {
                if let Some(first_const) = seen.insert(n.clone(), op.is_const()) {
                    dups.push((n.clone(), first_const && op.is_const()));
                }
            }
        }
        for (d, consts) in dups {
            let (sev, what) = if consts {
                (Severity::Info, "const name")
            } else {
                (Severity::Warning, "op name")
            };
            self.push(
                "duplicate-op-name",
                sev,
                Some(&d),
                format!("{what} {d:?} is used more than once"),
            );
        }
    }

    fn dims(&mut self, label: &str, t: &crate::TensorType) {
        let max = self.cfg.max_dim;
        if let Some(&d) = t.shape.iter().find(|&&d| d > max) {
            let chip = self.cfg.chip.name();
            self.push(
                "max-dim",
                Severity::Warning,
                Some(label),
                format!("{t} has a dimension {d} > {max}, the largest known to work on chip {chip} (M4 ran 32000, MAD); split the op, as ALM chunks the LM head"),
            );
        }
    }

    fn op(&mut self, op: &Operation) {
        let label = self.op_label(op).to_string();
        let l = Some(label.as_str());
        match op.op_type.as_str() {
            // FACTS §1.5: ORI ane_constraints #10 (M4 Max) `ANECCompile() FAILED`.
            "gelu" => self.push("gelu", Severity::Error, l, "gelu fails to compile (ORI #10); decompose with tanh".into()),
            // FACTS §1.5: MPB README (compile), FG program.md (eval 0x1d on runtime tensors).
            "rsqrt" => self.push("rsqrt", Severity::Error, l, "rsqrt fails (MPB compile, FG eval 0x1d); use pow(x, -0.5)".into()),
            // FACTS §1.5: MPB README.
            "inverse" => self.push("inverse", Severity::Error, l, "inverse fails to compile (MPB); use real_div(1, x)".into()),
            "reduce_mean" if self.cfg.chip != Chip::M4 => self.push("reduce_mean", Severity::Warning, l, "reduce_mean is rejected on M3 Max / macOS 26 (ESP, Espresso #18) though ORI runs it on M4 Max; use reduce_sum x 1/N".into()),
            "tile" => self.push("tile", Severity::Error, l, "tile may run once, then every later eval fails 0x1d until the process exits (FG)".into()),
            "constexpr_affine_dequantize" if self.cfg.chip != Chip::M4 => self.push("affine-dequantize", Severity::Warning, l, "constexpr_affine_dequantize failed on M3 Max (ESP) but ran on M4 (MAD); prefer constexpr_blockwise_shift_scale (C5)".into()),
            "cast" => {
                if let Some(sev) = self.m1_m2_severity() {
                    self.push("cast", sev, l, "cast fails on M1/M2 (maderix PR #6)".into());
                }
            }
            "scaled_dot_product_attention" if op.input("attn_mask").is_some() => {
                // FACTS §1.5: MAD README, ORI #6, MPB README — the mask is silently ignored.
                self.push("sdpa-mask", Severity::Error, l, "scaled_dot_product_attention ignores attn_mask on the ANE (MAD, ORI #6, MPB): results are wrong; write attention out with matmul/softmax".into())
            }
            "softmax" => self.softmax(op, &label),
            "conv" => self.conv(op, &label),
            "slice_by_index" if op.value_input("x").is_some_and(|x| self.is_input(x)) => {
                self.push("slice-input", Severity::Info, l, "slice_by_index on a function input failed in a complex graph (ESP, M3 Max); simpler programs slicing inputs ran".into());
            }
            t if crate::ops::lookup(t).is_none() => {
                self.push("unknown-op", Severity::Info, l, format!("{t} is not in anelm's op table: its types were taken as declared"));
            }
            _ => {}
        }
        if !op.op_type.starts_with("constexpr_") && !op.is_const() {
            // FACTS §1.2: no hardware-proven program passes an inline literal as an op argument.
            let inline = op.inputs.iter().any(|(_, a)| {
                a.bindings()
                    .iter()
                    .any(|b| matches!(b, Binding::Literal(_)))
            });
            if inline {
                self.push("inline-literal", Severity::Warning, l, "an argument is an inline literal; bind every parameter to a named const (FACTS §1.2)".into());
            }
        }
        // Activations only: weight consts are matrices (Cout=32000 convs run, FACTS §4).
        if !op.is_const() && !op.op_type.starts_with("constexpr_") {
            for &o in &op.outputs {
                let t = self.f.type_of(o).tensor().clone();
                self.dims(&label, &t);
            }
        }
    }

    /// The info rule "used by no hardware-proven program": an op missing from
    /// [`evidence::PROVEN_OPS`] (unless another rule already reports it failing), or a form
    /// other than the proven one.
    fn proven(&mut self, op: &Operation) {
        const REPORTED: [&str; 4] = ["gelu", "rsqrt", "inverse", "tile"];
        let label = self.op_label(op).to_string();
        let t = op.op_type.as_str();
        let sub_byte = op.literals().find_map(|lit| match lit {
            Literal::Blob { ty, .. } if ty.dtype.is_sub_byte() => Some(ty.clone()),
            _ => None,
        });
        if let Some(ty) = sub_byte {
            // FACTS §5: no public program uses sub-8-bit weights on the ANE.
            return self.unproven(&label, format!("{t} with {ty} data: no hardware-proven program uses sub-8-bit weights (FACTS §5)"));
        }
        let Some(p) = evidence::proven_op(t) else {
            if !REPORTED.contains(&t) {
                self.unproven(
                    &label,
                    format!("{t} is used by no hardware-proven public program"),
                );
            }
            return;
        };
        let form = match t {
            "conv" => {
                let k = op
                    .value_input("weight")
                    .map(|w| self.f.type_of(w).tensor().shape.clone())
                    .unwrap_or_default();
                let groups = self
                    .f
                    .operand_literal(op, "groups")
                    .and_then(Literal::to_i64);
                (k.len() == 4 && k[2..] != [1, 1] || groups.is_some_and(|g| g != 1))
                    .then(|| format!("conv with kernel {k:?} and groups {}", groups.unwrap_or(1)))
            }
            "matmul" => {
                let tx = self
                    .f
                    .operand_literal(op, "transpose_x")
                    .and_then(Literal::to_bool);
                (tx == Some(true)).then(|| "matmul with transpose_x = true".to_string())
            }
            "concat" => {
                let rank = op
                    .input("values")
                    .and_then(|a| match a.bindings().first() {
                        Some(Binding::Value(v)) => Some(self.f.type_of(*v).tensor().rank()),
                        _ => None,
                    })
                    .unwrap_or(4);
                let axis = self.f.operand_literal(op, "axis").and_then(Literal::to_i64);
                let axis = axis.and_then(|a| crate::ops::norm_axis(a, rank).ok());
                (axis.is_some_and(|a| a != 1))
                    .then(|| format!("concat on axis {}", axis.unwrap_or(1)))
            }
            _ => None,
        };
        if let Some(form) = form {
            self.unproven(
                &label,
                format!(
                    "{form}: proven programs use {t} as {} ({})",
                    p.form, p.evidence
                ),
            );
        }
    }

    fn unproven(&mut self, label: &str, message: String) {
        self.push("unproven", Severity::Info, Some(label), message);
    }

    fn softmax(&mut self, op: &Operation, label: &str) {
        // FACTS §1.5/§4: ESP docs (M3 Max) — softmax over a non-power-of-two length → InvalidMILProgram.
        let Some(x) = op.value_input("x") else {
            return;
        };
        let t = self.f.type_of(x).tensor();
        let axis = match self.f.operand_literal(op, "axis") {
            Some(l) => l.to_i64(),
            None => Some(-1),
        };
        let Some(axis) = axis.and_then(|a| crate::ops::norm_axis(a, t.rank()).ok()) else {
            return;
        };
        let n = t.shape[axis];
        let sev = match self.cfg.chip {
            Chip::M3 => Severity::Warning,
            Chip::M4 => return,
            _ => Severity::Info,
        };
        if !n.is_power_of_two() {
            self.push(
                "softmax-length",
                sev,
                Some(label),
                format!(
                    "softmax over length {n} (not a power of two) was rejected on M3 Max (ESP); M4 ran 32000 (MAD)"
                ),
            );
        }
    }

    fn conv(&mut self, op: &Operation, label: &str) {
        let l = Some(label);
        if op.input("bias").is_some() {
            // FACTS §1.5: ORI README — conv with bias= fails to compile.
            self.push(
                "conv-bias",
                Severity::Error,
                l,
                "conv with bias fails to compile (ORI); add the bias with a separate add".into(),
            );
        }
        if let Some(w) = op.value_input("weight") {
            let producer = self.f.producer(w).map(|p| p.op_type.as_str());
            let is_const =
                matches!(producer, Some(p) if p == "const" || p.starts_with("constexpr_"));
            if !is_const {
                let sev = if self.cfg.chip == Chip::M3 {
                    Severity::Error
                } else {
                    Severity::Warning
                };
                self.push("conv-runtime-weight", sev, l, "conv weights that are not constants were silently ignored on M3 Max (FG); use matmul for runtime weights".into());
            }
            let cin = self
                .f
                .type_of(w)
                .tensor()
                .shape
                .get(1)
                .copied()
                .unwrap_or(0);
            let groups = self
                .f
                .operand_literal(op, "groups")
                .and_then(Literal::to_i64)
                .unwrap_or(1);
            let total = cin * groups.max(1) as usize;
            if total >= 32000 {
                // FACTS §1.5/§4: MAD training/ane_classifier.h — "ANE rejects conv with 32000 input channels".
                self.push("conv-input-channels", Severity::Error, l, format!("conv with {total} input channels: the ANE rejected Cin=32000 (MAD); split the reduction"));
            }
        }
    }
}

fn program_rules(program: &Program, cfg: &LintConfig, out: &mut Vec<LintFinding>) {
    let mut push = |rule, severity, message| {
        out.push(LintFinding {
            rule,
            severity,
            function: "<program>".into(),
            value: None,
            message,
        })
    };
    // In-memory weights plus unloaded references, each distinct (path, offset) counted once.
    let files: std::collections::BTreeMap<(&str, u64), u64> = program
        .functions
        .iter()
        .flat_map(|f| f.ops())
        .flat_map(|op| op.literals())
        .filter_map(|l| match l {
            Literal::Blob {
                ty,
                source: crate::BlobSource::File { path, offset },
            } => Some(((path.as_str(), *offset), ty.packed_bytes() as u64)),
            _ => None,
        })
        .collect();
    let bytes = program.weight_bytes() + files.values().sum::<u64>();
    if bytes > cfg.weight_bytes_error {
        push("weights-size", Severity::Error, format!("{bytes} bytes of weights exceed the 2 GiB per-program maximum (coremltools PR #2593); split the program"));
    } else if bytes > cfg.weight_bytes_warn {
        push("weights-size", Severity::Warning, format!("{bytes} bytes of weights: ~1.5 GB is the largest reported compiling (ANEForge PR #45), 1 GiB on macOS 27 Core ML (eeANE)"));
    }
    let layers = cfg.layers.unwrap_or_else(|| {
        program
            .functions
            .iter()
            .map(|f| {
                f.ops()
                    .iter()
                    .filter(|op| {
                        matches!(
                            op.op_type.as_str(),
                            "softmax" | "scaled_dot_product_attention"
                        )
                    })
                    .count()
            })
            .max()
            .unwrap_or(0)
    });
    if layers > cfg.max_layers {
        push("too-many-layers", Severity::Warning, format!("{layers} layers in one program (budget {}); large graphs fail to compile without diagnostics (Espresso #18)", cfg.max_layers));
    }
    // FACTS §1.2: multi-procedure programs are proven in ios18 only (INF on M5, OMX on M3 Ultra).
    let old_opset = program
        .functions
        .iter()
        .any(|f| f.opset < crate::Opset::Ios18);
    if program.functions.len() > 1 && old_opset {
        push(
            "unproven",
            Severity::Info,
            format!(
                "{} functions in a {} program: multi-procedure programs are proven only in ios18 (INF, OMX; FACTS §1.2)",
                program.functions.len(),
                program.functions[0].opset.ios_name()
            ),
        );
    }
    // FACTS §1.2: OMX keeps banks to 112 procedures to stay under ~121 resident handles.
    if program.functions.len() > 112 {
        push(
            "too-many-procedures",
            Severity::Warning,
            format!(
                "{} functions in one program; OMX keeps banks at <= 112 procedures",
                program.functions.len()
            ),
        );
    }
}
