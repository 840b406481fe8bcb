//! The in-memory MIL program: functions of typed SSA values and operations with named
//! arguments. Built by [`crate::FunctionBuilder`] or parsed from text; printed as MIL text,
//! written as a Core ML package, linted and (by the simulator) executed from the same object.
//!
//! Walking a function: `for op in f.ops()`, read `op.inputs` (param name → [`Argument`]),
//! resolve [`Binding::Value`] ids with [`Function::value`], read constants with
//! [`Function::const_value`], and weight bytes with [`crate::Literal::weight_data`].

use crate::literal::{BlobSource, Literal, WeightData};
use crate::types::{TensorType, ValueType};
use std::collections::HashMap;
use std::sync::Arc;

/// Deployment target of a function (the `<ios18>` tag / the Core ML opset).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Opset {
    Ios15,
    Ios16,
    Ios17,
    Ios18,
    Ios26,
}

impl Opset {
    /// (opset, `iosNN` tag, Core ML opset name, specificationVersion) — COREML.md §4.
    const TABLE: [(Opset, &'static str, &'static str, i32); 5] = [
        (Opset::Ios15, "ios15", "CoreML5", 6),
        (Opset::Ios16, "ios16", "CoreML6", 7),
        (Opset::Ios17, "ios17", "CoreML7", 8),
        (Opset::Ios18, "ios18", "CoreML8", 9),
        (Opset::Ios26, "ios26", "CoreML9", 10),
    ];

    fn row(self) -> &'static (Opset, &'static str, &'static str, i32) {
        &Self::TABLE[self as usize]
    }

    /// The `iosNN` spelling used in MIL text.
    pub fn ios_name(self) -> &'static str {
        self.row().1
    }

    /// The Core ML opset name (`CoreML8`), used in protobuf and in some MIL texts.
    pub fn coreml_name(self) -> &'static str {
        self.row().2
    }

    /// The Core ML `specificationVersion` that introduced this opset.
    pub fn spec_version(self) -> i32 {
        self.row().3
    }

    /// Parses either spelling (`ios18` or `CoreML8`).
    pub fn from_name(s: &str) -> Option<Opset> {
        Self::TABLE
            .iter()
            .find(|r| r.1 == s || r.2 == s)
            .map(|r| r.0)
    }

    pub fn from_coreml_name(s: &str) -> Option<Opset> {
        Self::TABLE.iter().find(|r| r.2 == s).map(|r| r.0)
    }
}

/// How rank-0 values are spelled in text: `int32(1)` (dialect A) or `tensor<int32, []>(1)` (B).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScalarSpelling {
    Short,
    Tensor,
}

/// How the function deployment tag is spelled: `<ios18>` or `<CoreML8>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpsetSpelling {
    Ios,
    CoreMl,
}

/// The surface syntax of MIL text (FACTS §1.1). [`Dialect::a`] and [`Dialect::b`] are the two
/// hardware-proven forms; the parser records whatever variant it read so printing it again
/// reproduces it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Dialect {
    /// The `program(...)` version, e.g. `1.3` or `1.0`.
    pub version: String,
    /// Spelling of scalar types and literals.
    pub scalars: ScalarSpelling,
    /// Spelling of the buildInfo dict key/value types.
    pub dict: ScalarSpelling,
    pub opset_names: OpsetSpelling,
}

impl Dialect {
    /// Dialect A: `program(1.3)`, `ios18`, short scalars (MAD, ORI, ESP, MPB, INF).
    pub fn a() -> Dialect {
        Dialect {
            version: "1.3".into(),
            scalars: ScalarSpelling::Short,
            dict: ScalarSpelling::Short,
            opset_names: OpsetSpelling::Ios,
        }
    }

    /// Dialect B: `program(1.0)`, `ios16`, scalars as `tensor<T, []>` (ALM, FG).
    pub fn b() -> Dialect {
        Dialect {
            version: "1.0".into(),
            scalars: ScalarSpelling::Tensor,
            dict: ScalarSpelling::Tensor,
            opset_names: OpsetSpelling::Ios,
        }
    }

    /// The opset this dialect is proven with (A ↔ ios18, B ↔ ios16; FACTS §1.2).
    pub fn proven_opset(&self) -> Opset {
        if self.version == "1.0" {
            Opset::Ios16
        } else {
            Opset::Ios18
        }
    }

    /// The buildInfo entries of the byte-exact header of dialect A or B (FACTS §1.1).
    pub fn default_build_info(&self) -> Vec<(String, String)> {
        let pairs: &[(&str, &str)] = if self.version == "1.0" {
            &[("coremlc-version", "3505.4.1")]
        } else {
            &[
                ("coremlc-component-MIL", "3510.2.1"),
                ("coremlc-version", "3505.4.1"),
                ("coremltools-component-milinternal", ""),
                ("coremltools-version", "9.0"),
            ]
        };
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
}

/// Index of an SSA value in its function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

impl ValueId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Where a value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueDef {
    /// The n-th function input.
    Input(usize),
    /// Output `output` of operation `op` (index into [`Function::ops`]).
    Op { op: usize, output: usize },
}

#[derive(Debug, Clone, PartialEq)]
pub struct ValueInfo {
    pub name: String,
    pub ty: ValueType,
    pub def: ValueDef,
}

/// One operand: a reference to an earlier value, or a literal written in place.
#[derive(Debug, Clone, PartialEq)]
pub enum Binding {
    Value(ValueId),
    Literal(Literal),
}

/// An argument: one binding (`x = a`) or a tuple (`values = (a, b, c)`).
#[derive(Debug, Clone, PartialEq)]
pub enum Argument {
    Single(Binding),
    Tuple(Vec<Binding>),
}

impl Argument {
    pub fn bindings(&self) -> &[Binding] {
        match self {
            Argument::Single(b) => std::slice::from_ref(b),
            Argument::Tuple(v) => v,
        }
    }
}

impl From<ValueId> for Argument {
    fn from(v: ValueId) -> Self {
        Argument::Single(Binding::Value(v))
    }
}

/// One MIL operation: `outputs = op_type(inputs...)[attributes..., name = "..."]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Operation {
    pub op_type: String,
    /// Named operands, in printed order.
    pub inputs: Vec<(String, Argument)>,
    /// Bracket attributes other than `name`: `val` of a `const`, the operands of an
    /// attribute-style `constexpr_*` op.
    pub attributes: Vec<(String, Literal)>,
    /// The `[name = string("...")]` attribute; `None` when the text had none.
    pub name: Option<String>,
    pub outputs: Vec<ValueId>,
}

impl Operation {
    pub fn input(&self, param: &str) -> Option<&Argument> {
        self.inputs.iter().find(|(k, _)| k == param).map(|(_, a)| a)
    }

    /// The value bound to single operand `param`, when it is a reference.
    pub fn value_input(&self, param: &str) -> Option<ValueId> {
        match self.input(param)? {
            Argument::Single(Binding::Value(id)) => Some(*id),
            _ => None,
        }
    }

    pub fn attribute(&self, param: &str) -> Option<&Literal> {
        self.attributes
            .iter()
            .find(|(k, _)| k == param)
            .map(|(_, l)| l)
    }

    pub fn is_const(&self) -> bool {
        self.op_type == "const"
    }

    /// Every literal this op carries (attributes and literal bindings).
    pub fn literals(&self) -> impl Iterator<Item = &Literal> {
        self.attributes
            .iter()
            .map(|(_, l)| l)
            .chain(self.inputs.iter().flat_map(|(_, a)| {
                a.bindings().iter().filter_map(|b| match b {
                    Binding::Literal(l) => Some(l),
                    Binding::Value(_) => None,
                })
            }))
    }
}

/// A function: typed inputs, operations in order, outputs.
#[derive(Debug, Clone, PartialEq)]
pub struct Function {
    pub name: String,
    pub opset: Opset,
    pub(crate) values: Vec<ValueInfo>,
    pub(crate) inputs: Vec<ValueId>,
    pub(crate) ops: Vec<Operation>,
    pub(crate) outputs: Vec<ValueId>,
}

impl Function {
    pub fn inputs(&self) -> &[ValueId] {
        &self.inputs
    }

    pub fn outputs(&self) -> &[ValueId] {
        &self.outputs
    }

    pub fn ops(&self) -> &[Operation] {
        &self.ops
    }

    pub fn values(&self) -> &[ValueInfo] {
        &self.values
    }

    pub fn value(&self, id: ValueId) -> &ValueInfo {
        &self.values[id.index()]
    }

    pub fn name_of(&self, id: ValueId) -> &str {
        &self.values[id.index()].name
    }

    pub fn type_of(&self, id: ValueId) -> &ValueType {
        &self.values[id.index()].ty
    }

    /// Looks a value up by its SSA name.
    pub fn find(&self, name: &str) -> Option<ValueId> {
        self.values
            .iter()
            .position(|v| v.name == name)
            .map(|i| ValueId(i as u32))
    }

    /// The operation that produces `id` (None for inputs).
    pub fn producer(&self, id: ValueId) -> Option<&Operation> {
        match self.values[id.index()].def {
            ValueDef::Op { op, .. } => Some(&self.ops[op]),
            ValueDef::Input(_) => None,
        }
    }

    /// The literal of a value defined by a `const` op.
    pub fn const_value(&self, id: ValueId) -> Option<&Literal> {
        let op = self.producer(id)?;
        if op.is_const() {
            op.attribute("val")
        } else {
            None
        }
    }

    /// The constant value of operand `param` of `op`, however it is written: a reference to a
    /// `const`, a literal in place, or a bracket attribute (constexpr ops).
    pub fn operand_literal<'a>(&'a self, op: &'a Operation, param: &str) -> Option<&'a Literal> {
        match op.input(param) {
            Some(Argument::Single(Binding::Value(id))) => self.const_value(*id),
            Some(Argument::Single(Binding::Literal(l))) => Some(l),
            Some(Argument::Tuple(_)) => None,
            None => op.attribute(param),
        }
    }

    /// Checks that every op exists in `opset` (e.g. `constexpr_lut_to_dense` needs ios18): the
    /// error names the function, the op and both opsets.
    pub fn check_opset(&self, opset: Opset) -> crate::Result<()> {
        for op in &self.ops {
            if let Some(def) = crate::ops::lookup(&op.op_type) {
                if def.since > opset {
                    return Err(crate::MilError::invalid(format!(
                        "function {}: {} needs {}, the target is {}",
                        self.name,
                        op.op_type,
                        def.since.ios_name(),
                        opset.ios_name()
                    )));
                }
            }
        }
        Ok(())
    }

    /// Mutable access to every literal (used to resolve blob references).
    pub(crate) fn literals_mut(&mut self) -> impl Iterator<Item = &mut Literal> {
        self.ops.iter_mut().flat_map(|op| {
            op.attributes
                .iter_mut()
                .map(|(_, l)| l)
                .chain(op.inputs.iter_mut().flat_map(|(_, a)| {
                    let bs: &mut [Binding] = match a {
                        Argument::Single(b) => std::slice::from_mut(b),
                        Argument::Tuple(v) => v,
                    };
                    bs.iter_mut().filter_map(|b| match b {
                        Binding::Literal(l) => Some(l),
                        Binding::Value(_) => None,
                    })
                }))
        })
    }
}

/// One distinct stored weight tensor of a program.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredWeight {
    /// `function/const` of the const holding it, or `function/output.param` for a literal
    /// operand of another op (first use).
    pub name: String,
    /// Its type as stored (`int8`, `uint4`, `fp16`, ...), not the dense type it may expand to.
    pub ty: TensorType,
    /// Bytes as stored in a blob record (sub-byte types packed).
    pub bytes: u64,
    /// In memory (false: an unloaded `BLOBFILE` reference, sized from its declared type).
    pub loaded: bool,
}

/// A MIL program: one or more functions sharing weight data.
#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    pub dialect: Dialect,
    /// `buildInfo` entries; empty means no buildInfo line.
    pub build_info: Vec<(String, String)>,
    pub functions: Vec<Function>,
}

impl Program {
    /// An empty program in `dialect` with that dialect's byte-exact buildInfo.
    pub fn new(dialect: Dialect) -> Program {
        let build_info = dialect.default_build_info();
        Program {
            dialect,
            build_info,
            functions: Vec::new(),
        }
    }

    /// Adds a finished function; names must be unique in the program.
    pub fn add_function(&mut self, f: Function) -> crate::Result<()> {
        if self.function(&f.name).is_some() {
            return Err(crate::MilError::invalid(format!(
                "duplicate function name {}",
                f.name
            )));
        }
        self.functions.push(f);
        Ok(())
    }

    /// A program holding one function, in the dialect proven for its opset (A for ios17+,
    /// B for ios16 and older).
    pub fn single(f: Function) -> Program {
        let dialect = if f.opset <= Opset::Ios16 {
            Dialect::b()
        } else {
            Dialect::a()
        };
        let mut p = Program::new(dialect);
        p.functions.push(f);
        p
    }

    /// Switches the text dialect (and its default buildInfo) and retargets every function to the
    /// opset proven with it (A ↔ ios18, B ↔ ios16): e.g. to emit the cross-chip-safe dialect B
    /// (FACTS C1) from a program built for ios18. Fails, changing nothing, if an op needs a
    /// newer opset than the dialect's.
    pub fn set_dialect(&mut self, dialect: Dialect) -> crate::Result<()> {
        let opset = dialect.proven_opset();
        for f in &self.functions {
            f.check_opset(opset)?;
        }
        for f in &mut self.functions {
            f.opset = opset;
        }
        self.build_info = dialect.default_build_info();
        self.dialect = dialect;
        Ok(())
    }

    pub fn function(&self, name: &str) -> Option<&Function> {
        self.functions.iter().find(|f| f.name == name)
    }

    /// Every distinct weight tensor held in memory (shared `Arc`s counted once), in first-use order.
    pub fn weights(&self) -> Vec<&Arc<WeightData>> {
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for f in &self.functions {
            for op in &f.ops {
                for l in op.literals() {
                    if let Some(d) = l.weight_data() {
                        if seen.insert(Arc::as_ptr(d)) {
                            out.push(d);
                        }
                    }
                }
            }
        }
        out
    }

    /// Total stored bytes of the distinct in-memory (loaded) weight tensors of
    /// [`Program::stored_weights`]: the compressed size for constexpr operands (int8, packed
    /// int4 / palette indices, scales), never the dense size they expand to. Unloaded
    /// `BLOBFILE` references are not counted here (the listing has them).
    pub fn weight_bytes(&self) -> u64 {
        self.stored_weights()
            .iter()
            .filter(|w| w.loaded)
            .map(|w| w.bytes)
            .sum()
    }

    /// Every distinct blob-backed tensor (loaded data, shared `Arc`s once; unloaded `BLOBFILE`
    /// references once per path and offset), in first-use order, with its stored size.
    pub fn stored_weights(&self) -> Vec<StoredWeight> {
        let mut seen_data = std::collections::HashSet::new();
        let mut seen_file = std::collections::HashSet::new();
        let mut out = Vec::new();
        for f in &self.functions {
            for op in &f.ops {
                let owner = op.outputs.first().map(|&o| f.name_of(o)).unwrap_or("?");
                let params =
                    op.attributes
                        .iter()
                        .map(|(k, l)| (k, l))
                        .chain(op.inputs.iter().flat_map(|(k, a)| {
                            a.bindings().iter().filter_map(move |b| match b {
                                Binding::Literal(l) => Some((k, l)),
                                Binding::Value(_) => None,
                            })
                        }));
                for (param, lit) in params {
                    let Literal::Blob { ty, source } = lit else {
                        continue;
                    };
                    let (new, bytes, loaded) = match source {
                        BlobSource::Data(d) => {
                            (seen_data.insert(Arc::as_ptr(d)), d.as_bytes().len(), true)
                        }
                        BlobSource::File { path, offset } => (
                            seen_file.insert((path.clone(), *offset)),
                            ty.packed_bytes(),
                            false,
                        ),
                    };
                    if new {
                        let name = if op.is_const() {
                            format!("{}/{owner}", f.name)
                        } else {
                            format!("{}/{owner}.{param}", f.name)
                        };
                        out.push(StoredWeight {
                            name,
                            ty: ty.clone(),
                            bytes: bytes as u64,
                            loaded,
                        });
                    }
                }
            }
        }
        out
    }

    /// Replaces every `BLOBFILE` reference by the data it points at, reading blob files
    /// through `load` (path as written, offset) → data. References to the same
    /// (path, offset) share one `Arc`.
    pub fn resolve_blobs(
        &mut self,
        mut load: impl FnMut(&str, u64, &TensorType) -> crate::Result<WeightData>,
    ) -> crate::Result<()> {
        let mut cache: HashMap<(String, u64), Arc<WeightData>> = HashMap::new();
        for f in &mut self.functions {
            for lit in f.literals_mut() {
                if let Literal::Blob { ty, source } = lit {
                    if let BlobSource::File { path, offset } = source {
                        let key = (path.clone(), *offset);
                        let data = match cache.get(&key) {
                            Some(d) => d.clone(),
                            None => {
                                let d = Arc::new(load(path, *offset, ty)?);
                                cache.insert(key, d.clone());
                                d
                            }
                        };
                        if data.dtype() != ty.dtype || data.len() != ty.numel() {
                            return Err(crate::MilError::invalid(format!(
                                "blob {path} offset {offset} holds {} x {}, the constant is {ty}",
                                data.len(),
                                data.dtype()
                            )));
                        }
                        *source = BlobSource::Data(data);
                    }
                }
            }
        }
        Ok(())
    }
}
