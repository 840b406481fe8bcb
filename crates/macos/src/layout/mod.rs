//! The I/O layout of a loaded program, read from `-[_ANEInMemoryModel modelAttributes]` given
//! as plain data (FACTS §3.5, C3) — never assumed where the attributes speak, and assumed (with
//! a warning) only where they are silent:
//!
//! - `ANEFModelDescription` maps procedure names to IDs (`kANEFModelProcedureNameToIDMapKey`),
//!   gives each procedure's input and output *symbol indices* (`ANEFModelProcedures`; global
//!   across procedures), and the symbol names (`kANEFModelInputSymbolsArrayKey`,
//!   `kANEFModelOutputSymbolsArrayKey`, output names suffixed `@output`). A request binds surface
//!   `i` to symbol `indices[i]`; we match by name (C3).
//! - `NetworkStatusList` has one entry per procedure (`Name`): inputs in `LiveInputList`,
//!   `LiveInputParamList` (small broadcast inputs the compiler treats as parameters) or
//!   `LiveStateList`, outputs in `LiveOutputList`; per tensor `Name`/`Symbol`, `Type`,
//!   `Channels`, `Height`, `Width`, and strides: `PlaneStride`, `RowStride`, or a
//!   `PlaneDescriptor` list of per-plane `RowStride` ([`parse`] cites the public dumps).
//!
//! [`resolve`] checks that against what the MIL function declares. It bends where the hardware
//! may legitimately differ — missing strides fall back to 64-byte rows ([`fallback_channel_stride`]),
//! a declared input the compiler dropped is *unbound* ([`ProcedureIo::unbound`]), unknown keys
//! are ignored — and refuses only what would give wrong numbers (a shape or type that disagrees
//! with the declaration, strides that cannot hold a row, a malformed dictionary).

mod parse;
mod slot;

pub use parse::{
    LiveTensor, ModelAttributes, ModelDescription, NetworkStatus, Procedure, SymbolRef,
    INPUT_LISTS, OUTPUT_LIST,
};
pub use slot::fallback_channel_stride;

use slot::{note, slot, Entry};

use crate::error::{MacError, Result};

/// Suffix the framework appends to output symbol names (FACTS §3.5).
pub const OUTPUT_SUFFIX: &str = "@output";
/// Granule of the `…16KAlignmentArray` flags [INF: the name says 16 KiB].
pub const ALIGN_16K: usize = 16 * 1024;

/// Element type of an I/O tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElemType {
    Fp16,
    Fp32,
}

impl ElemType {
    pub fn bytes(self) -> usize {
        match self {
            ElemType::Fp16 => 2,
            ElemType::Fp32 => 4,
        }
    }

    /// From a `Type` string of `NetworkStatusList` (`Float16`, `Float32`, …).
    pub fn from_ane(s: &str) -> Option<ElemType> {
        match s {
            "Float16" => Some(ElemType::Fp16),
            "Float32" => Some(ElemType::Fp32),
            _ => None,
        }
    }
}

/// An input or output as the MIL function declares it: `[1, channels, 1, width]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeclaredTensor {
    pub name: String,
    pub dtype: ElemType,
    pub channels: usize,
    pub width: usize,
}

/// A MIL function: one procedure of the compiled program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeclaredFunction {
    pub name: String,
    pub inputs: Vec<DeclaredTensor>,
    pub outputs: Vec<DeclaredTensor>,
}

/// Where one bound tensor lives: element (c, w) at byte `c * channel_stride + w * dtype.bytes()`
/// of a surface of `bytes` bytes, bound to symbol `symbol`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSlot {
    pub name: String,
    /// The global symbol index the request binds this surface to.
    pub symbol: u32,
    pub dtype: ElemType,
    pub channels: usize,
    pub width: usize,
    /// `PlaneStride`.
    pub channel_stride: usize,
    /// Bytes to allocate: `BatchStride`, at least `channels * channel_stride`.
    pub bytes: usize,
}

/// The I/O of one procedure, in the function's declaration order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcedureIo {
    pub function: String,
    /// The `procedureIndex` of a request.
    pub procedure: u32,
    /// The inputs the request binds.
    pub inputs: Vec<TensorSlot>,
    pub outputs: Vec<TensorSlot>,
    /// Declared inputs the compiled procedure does not take (the compiler dropped them as
    /// unused): nothing binds them, and what a caller writes for them is never read.
    pub unbound: Vec<DeclaredTensor>,
    /// What had to be assumed (fallback layouts, unbound inputs), one line each; every line was
    /// also logged as a warning.
    pub notes: Vec<String>,
}

fn strip_output(name: &str) -> &str {
    name.strip_suffix(OUTPUT_SUFFIX).unwrap_or(name)
}

impl LiveTensor {
    /// Whether this entry describes symbol `index` named `name`: by `Symbol` (a name or an
    /// index), else by `Name`.
    fn is(&self, index: u32, name: &str) -> bool {
        let named = |n: &str| strip_output(n) == name;
        match self.symbol() {
            Some(SymbolRef::Index(i)) => i == index,
            Some(SymbolRef::Name(n)) => named(&n) || self.text("Name").is_some_and(named),
            None => self.text("Name").is_some_and(named),
        }
    }
}

/// The procedure ID of MIL function `function` of a program of `n_functions` functions.
fn procedure_id(desc: &ModelDescription, function: &str, n_functions: usize) -> Result<u32> {
    if let Some(&id) = desc.procedure_ids.get(function) {
        return Ok(id);
    }
    // Keys like "0@default" (FACTS §3.5 dumps) carry the name after or before an '@'.
    let tagged: Vec<u32> = desc
        .procedure_ids
        .iter()
        .filter(|(k, _)| k.split('@').any(|part| part == function))
        .map(|(_, &id)| id)
        .collect();
    match (tagged.as_slice(), desc.procedures.as_slice()) {
        ([id], _) => Ok(*id),
        ([], [only]) if n_functions == 1 => Ok(only.id),
        _ => Err(MacError::Layout(format!(
            "no procedure for function {function} (kANEFModelProcedureNameToIDMapKey has {:?})",
            desc.procedure_ids.keys().collect::<Vec<_>>()
        ))),
    }
}

/// The `NetworkStatusList` entry of procedure `id`: by name, else by position when there is one
/// entry per procedure.
fn status_of<'a>(
    attrs: &'a ModelAttributes,
    desc: &ModelDescription,
    id: u32,
) -> Result<&'a NetworkStatus> {
    let names: Vec<&str> = desc
        .procedure_ids
        .iter()
        .filter(|(_, &v)| v == id)
        .map(|(k, _)| k.as_str())
        .collect();
    if let Some(s) = attrs
        .network_status
        .iter()
        .find(|s| s.name.as_deref().is_some_and(|n| names.contains(&n)))
    {
        return Ok(s);
    }
    if attrs.network_status.len() == desc.procedures.len().max(1) {
        if let Some(s) = attrs.network_status.get(id as usize) {
            return Ok(s);
        }
    }
    Err(MacError::Layout(format!(
        "NetworkStatusList has no entry for procedure {id} ({} entries)",
        attrs.network_status.len()
    )))
}

/// One side (inputs or outputs) of a procedure.
struct Side<'a> {
    what: &'static str,
    indices: &'a [u32],
    names: &'a [String],
    alignment: &'a [u32],
    live: Vec<(&'static str, &'a LiveTensor)>,
}

/// The slots of one side, and the declared tensors the procedure does not take.
type Slots = (Vec<TensorSlot>, Vec<DeclaredTensor>);

impl Side<'_> {
    fn symbol_name(&self, index: u32) -> Result<&str> {
        self.names
            .get(index as usize)
            .map(|n| strip_output(n))
            .ok_or_else(|| {
                MacError::Layout(format!(
                    "{} symbol index {index} is past the {} symbol names",
                    self.what,
                    self.names.len()
                ))
            })
    }

    fn slots(&self, declared: &[DeclaredTensor], notes: &mut Vec<String>) -> Result<Slots> {
        let mut by_name = Vec::with_capacity(self.indices.len());
        for &i in self.indices {
            by_name.push((self.symbol_name(i)?, i));
        }
        if let Some((extra, _)) = by_name
            .iter()
            .find(|(n, _)| !declared.iter().any(|d| d.name == *n))
        {
            return Err(MacError::Layout(format!(
                "the program has {} {extra}, which the MIL function does not declare",
                self.what
            )));
        }
        let mut slots = Vec::with_capacity(declared.len());
        let mut unbound = Vec::new();
        for d in declared {
            let Some(&(_, symbol)) = by_name.iter().find(|(n, _)| *n == d.name) else {
                if self.what == "input" {
                    note(
                        notes,
                        format!(
                            "input {} is not among the procedure's symbols {:?}: the compiler dropped it; it stays unbound",
                            d.name,
                            by_name.iter().map(|(n, _)| n).collect::<Vec<_>>()
                        ),
                    );
                    unbound.push(d.clone());
                    continue;
                }
                return Err(MacError::Layout(format!(
                    "output {} is not among the procedure's symbols {:?}",
                    d.name,
                    by_name.iter().map(|(n, _)| n).collect::<Vec<_>>()
                )));
            };
            let entry = self
                .live
                .iter()
                .find(|(_, t)| t.is(symbol, &d.name))
                .map(|&(list, tensor)| Entry { list, tensor });
            let aligned = self.alignment.get(symbol as usize).is_some_and(|&a| a != 0);
            slots.push(slot(self.what, d, symbol, entry, aligned, notes)?);
        }
        Ok((slots, unbound))
    }
}

/// The layout of MIL function `f` (one of `n_functions`) in a loaded program.
pub fn resolve(
    attrs: &ModelAttributes,
    f: &DeclaredFunction,
    n_functions: usize,
) -> Result<ProcedureIo> {
    resolve_inner(attrs, f, n_functions).map_err(|e| match e {
        MacError::Layout(m) => MacError::Layout(format!("function {}: {m}", f.name)),
        other => other,
    })
}

fn resolve_inner(
    attrs: &ModelAttributes,
    f: &DeclaredFunction,
    n_functions: usize,
) -> Result<ProcedureIo> {
    let desc = attrs.description.as_ref().ok_or_else(|| {
        MacError::Layout("no ANEFModelDescription: the symbol order is unknown".into())
    })?;
    let id = procedure_id(desc, &f.name, n_functions)?;
    let proc_ =
        desc.procedures.iter().find(|p| p.id == id).ok_or_else(|| {
            MacError::Layout(format!("ANEFModelProcedures has no procedure {id}"))
        })?;
    let status = status_of(attrs, desc, id)?;
    let inputs = Side {
        what: "input",
        indices: &proc_.inputs,
        names: &desc.input_symbols,
        alignment: &desc.input_16k_alignment,
        live: status.input_entries().collect(),
    };
    let outputs = Side {
        what: "output",
        indices: &proc_.outputs,
        names: &desc.output_symbols,
        alignment: &desc.output_16k_alignment,
        live: status.outputs.iter().map(|t| (OUTPUT_LIST, t)).collect(),
    };
    let mut notes = Vec::new();
    let (in_slots, unbound) = inputs.slots(&f.inputs, &mut notes)?;
    let (out_slots, _) = outputs.slots(&f.outputs, &mut notes)?;
    Ok(ProcedureIo {
        function: f.name.clone(),
        procedure: id,
        inputs: in_slots,
        outputs: out_slots,
        unbound,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn t(name: &str, channels: usize, width: usize) -> DeclaredTensor {
        DeclaredTensor {
            name: name.into(),
            dtype: ElemType::Fp16,
            channels,
            width,
        }
    }

    /// A two-input, two-output program as the framework might describe it: symbols listed in
    /// alphabetical order, which is neither the declaration order nor the return order.
    fn attrs() -> serde_json::Value {
        let live = |name: &str, c: u64, w: u64, plane: u64| json!({"Name": name, "Symbol": name, "Type": "Float16", "Batches": 1, "Channels": c, "Height": 1, "Width": w, "Depth": 1, "Interleave": 1, "PlaneCount": c, "RowStride": plane, "PlaneStride": plane, "BatchStride": c * plane, "DepthStride": c * plane});
        json!({
            "ANEFModelDescription": {
                "ANEFModelProcedures": [{"ANEFModelProcedureID": 0, "ANEFModelInputSymbolIndexArray": [0, 1], "ANEFModelOutputSymbolIndexArray": [0, 1]}],
                "kANEFModelInputSymbolsArrayKey": ["a_bias", "x"],
                "kANEFModelOutputSymbolsArrayKey": ["k@output", "q@output"],
                "kANEFModelProcedureNameToIDMapKey": {"main": 0},
                "ANEFModelInput16KAlignmentArray": [0, 0],
                "ANEFModelOutput16KAlignmentArray": [0, 0]
            },
            "NetworkStatusList": [{
                "Name": "main",
                "LiveInputList": [live("x", 64, 17, 64), live("a_bias", 8, 1, 64)],
                "LiveOutputList": [live("k@output", 32, 17, 64), live("q@output", 64, 17, 64)]
            }]
        })
    }

    fn main_fn() -> DeclaredFunction {
        DeclaredFunction {
            name: "main".into(),
            inputs: vec![t("x", 64, 17), t("a_bias", 8, 1)],
            outputs: vec![t("q", 64, 17), t("k", 32, 17)],
        }
    }

    fn resolve_json(v: &serde_json::Value, f: &DeclaredFunction, n: usize) -> Result<ProcedureIo> {
        resolve(&ModelAttributes::from_json(v)?, f, n)
    }

    #[test]
    fn symbols_are_matched_by_name_not_position() {
        let io = resolve_json(&attrs(), &main_fn(), 1).unwrap();
        assert_eq!(io.procedure, 0);
        let got: Vec<(&str, u32)> = io
            .inputs
            .iter()
            .chain(&io.outputs)
            .map(|s| (s.name.as_str(), s.symbol))
            .collect();
        assert_eq!(got, [("x", 1), ("a_bias", 0), ("q", 1), ("k", 0)]);
        let x = &io.inputs[0];
        // W = 17 fp16 = 34 bytes, padded to a 64-byte row: the device says so, we do not guess.
        assert_eq!(
            (x.channel_stride, x.bytes, x.channels, x.width),
            (64, 64 * 64, 64, 17)
        );
    }

    #[test]
    fn strides_come_from_the_attributes() {
        let mut v = attrs();
        v["NetworkStatusList"][0]["LiveInputList"][0]["PlaneStride"] = json!(128);
        v["NetworkStatusList"][0]["LiveInputList"][0]["RowStride"] = json!(128);
        v["NetworkStatusList"][0]["LiveInputList"][0]["BatchStride"] = json!(16384);
        let io = resolve_json(&v, &main_fn(), 1).unwrap();
        assert_eq!(
            (io.inputs[0].channel_stride, io.inputs[0].bytes),
            (128, 16384)
        );
        v["ANEFModelDescription"]["ANEFModelInput16KAlignmentArray"] = json!([1, 0]);
        let io = resolve_json(&v, &main_fn(), 1).unwrap();
        assert_eq!(
            io.inputs[1].bytes, ALIGN_16K,
            "symbol 0 (a_bias) is flagged for 16 KiB"
        );
        assert_eq!(io.inputs[0].bytes, 16384);
    }

    #[test]
    fn multi_procedure_programs_use_the_name_map_and_global_indices() {
        // Two procedures sharing a symbol table; the status list is in its own order.
        let live = |name: &str, w: u64| json!({"Name": name, "Channels": 4, "Width": w, "PlaneStride": 64});
        let v = json!({
            "ANEFModelDescription": {
                "ANEFModelProcedures": [
                    {"ANEFModelProcedureID": 0, "ANEFModelInputSymbolIndexArray": [0], "ANEFModelOutputSymbolIndexArray": [0]},
                    {"ANEFModelProcedureID": 1, "ANEFModelInputSymbolIndexArray": [1], "ANEFModelOutputSymbolIndexArray": [1]}
                ],
                "kANEFModelInputSymbolsArrayKey": ["x0", "x1"],
                "kANEFModelOutputSymbolsArrayKey": ["y0@output", "y1@output"],
                "kANEFModelProcedureNameToIDMapKey": {"0@layer1": 1, "0@layer0": 0}
            },
            "NetworkStatusList": [
                {"Name": "0@layer1", "LiveInputList": [live("x1", 32)], "LiveOutputList": [live("y1@output", 32)]},
                {"Name": "0@layer0", "LiveInputList": [live("x0", 16)], "LiveOutputList": [live("y0@output", 16)]}
            ]
        });
        let f1 = DeclaredFunction {
            name: "layer1".into(),
            inputs: vec![t("x1", 4, 32)],
            outputs: vec![t("y1", 4, 32)],
        };
        let io = resolve_json(&v, &f1, 2).unwrap();
        assert_eq!(
            (
                io.procedure,
                io.inputs[0].symbol,
                io.outputs[0].symbol,
                io.inputs[0].width
            ),
            (1, 1, 1, 32)
        );
        let f0 = DeclaredFunction {
            name: "layer0".into(),
            inputs: vec![t("x0", 4, 16)],
            outputs: vec![t("y0", 4, 16)],
        };
        assert_eq!(resolve_json(&v, &f0, 2).unwrap().procedure, 0);
        let e = resolve_json(
            &v,
            &DeclaredFunction {
                name: "layer2".into(),
                ..f0
            },
            2,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("no procedure for function layer2") && e.contains("0@layer0"),
            "{e}"
        );
    }

    #[test]
    fn a_single_procedure_needs_no_name() {
        let mut v = attrs();
        v["ANEFModelDescription"]["kANEFModelProcedureNameToIDMapKey"] = json!({"0@default": 0});
        v["NetworkStatusList"][0]["Name"] = json!("0@default");
        assert!(resolve_json(&v, &main_fn(), 1).is_ok());
        v["ANEFModelDescription"]["kANEFModelProcedureNameToIDMapKey"] = json!({});
        v["NetworkStatusList"][0]
            .as_object_mut()
            .unwrap()
            .remove("Name");
        assert_eq!(
            resolve_json(&v, &main_fn(), 1).unwrap().procedure,
            0,
            "one procedure, one status entry"
        );
        assert!(
            resolve_json(&v, &main_fn(), 2).is_err(),
            "with two functions the name must be found"
        );
    }

    #[test]
    fn disagreements_with_the_declaration_are_errors() {
        let cases: Vec<(&str, serde_json::Value, &str)> = vec![
            (
                "/ANEFModelDescription/kANEFModelInputSymbolsArrayKey/1",
                json!("y"),
                "the program has input y, which the MIL function does not declare",
            ),
            (
                "/NetworkStatusList/0/LiveInputList/0/Channels",
                json!(32),
                "Channels 32, but the MIL declares 64",
            ),
            (
                "/NetworkStatusList/0/LiveInputList/0/Type",
                json!("Float32"),
                "Type Float32",
            ),
            (
                "/NetworkStatusList/0/LiveInputList/0/Type",
                json!("Int8"),
                "not Float16 or Float32",
            ),
            (
                "/NetworkStatusList/0/LiveInputList/0/PlaneStride",
                json!(32),
                "PlaneStride 32 is less than a row",
            ),
            (
                "/NetworkStatusList/0/LiveInputList/0/RowStride",
                json!(128),
                "RowStride 128 does not fit",
            ),
            (
                "/NetworkStatusList/0/LiveInputList/0/BatchStride",
                json!(100),
                "BatchStride 100",
            ),
            (
                "/NetworkStatusList/0/LiveInputList/0/Interleave",
                json!(2),
                "Interleave 2",
            ),
            (
                "/NetworkStatusList/0/LiveInputList/0/Channels",
                json!("many"),
                "input x: LiveInputList entry: Channels is \"many\", not a count",
            ),
            (
                "/ANEFModelDescription/ANEFModelProcedures/0/ANEFModelOutputSymbolIndexArray",
                json!([0]),
                "output q is not among the procedure's symbols [\"k\"]",
            ),
            (
                "/ANEFModelDescription/ANEFModelProcedures/0/ANEFModelInputSymbolIndexArray/1",
                json!(5),
                "symbol index 5 is past",
            ),
        ];
        for (pointer, value, want) in cases {
            let mut v = attrs();
            *v.pointer_mut(pointer).unwrap() = value;
            let e = resolve_json(&v, &main_fn(), 1).unwrap_err().to_string();
            assert!(
                e.contains(want) && e.starts_with("modelAttributes: "),
                "{pointer}: {e}"
            );
        }
        let mut f = main_fn();
        f.inputs.pop();
        let e = resolve_json(&attrs(), &f, 1).unwrap_err().to_string();
        assert!(
            e.contains("has input a_bias, which the MIL function does not declare"),
            "{e}"
        );
    }

    #[test]
    fn missing_or_malformed_attributes_are_errors() {
        let e = resolve_json(&json!({}), &main_fn(), 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no ANEFModelDescription"), "{e}");
        let e = ModelAttributes::from_json(&json!({"NetworkStatusList": 3}))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "modelAttributes: modelAttributes.NetworkStatusList is 3, expected a list"
        );
        let mut v = attrs();
        v["NetworkStatusList"] = json!([]);
        assert!(resolve_json(&v, &main_fn(), 1)
            .unwrap_err()
            .to_string()
            .contains("NetworkStatusList has no entry"));
    }

    #[test]
    fn numeric_symbols_match_by_index() {
        let mut v = attrs();
        for (i, name) in [(0, "x"), (1, "a_bias")] {
            let list = v["NetworkStatusList"][0]["LiveInputList"]
                .as_array_mut()
                .unwrap();
            let e = list.iter_mut().find(|e| e["Name"] == name).unwrap();
            e["Symbol"] = json!(if name == "x" { 1 } else { 0 });
            e["Name"] = json!(format!("unrelated{i}"));
        }
        let io = resolve_json(&v, &main_fn(), 1).unwrap();
        assert_eq!(io.inputs[0].symbol, 1);
    }

    #[test]
    fn strides_fall_back_from_plane_to_row_to_64_byte_rows() {
        let mut v = attrs();
        let x = "/NetworkStatusList/0/LiveInputList/0";
        v.pointer_mut(x)
            .unwrap()
            .as_object_mut()
            .unwrap()
            .remove("PlaneStride");
        *v.pointer_mut(&format!("{x}/RowStride")).unwrap() = json!(96);
        *v.pointer_mut(&format!("{x}/BatchStride")).unwrap() = json!(96 * 64);
        let io = resolve_json(&v, &main_fn(), 1).unwrap();
        assert_eq!(
            io.inputs[0].channel_stride, 96,
            "RowStride when no PlaneStride"
        );
        assert!(io.notes.is_empty(), "{:?}", io.notes);
        // Neither, and an unknown key: the 64-byte rows of FACTS §4, one note with the entry.
        let e = v.pointer_mut(x).unwrap().as_object_mut().unwrap();
        e.remove("RowStride");
        e.remove("BatchStride");
        e.insert("FutureField".into(), json!({"nested": [1, 2]}));
        let io = resolve_json(&v, &main_fn(), 1).unwrap();
        assert_eq!(
            (io.inputs[0].channel_stride, io.inputs[0].bytes),
            (64, 64 * 64)
        );
        assert_eq!(io.notes.len(), 1, "{:?}", io.notes);
        assert!(
            io.notes[0].contains("input x (symbol 1, LiveInputList)")
                && io.notes[0].contains("\"FutureField\":{\"nested\":[1,2]}"),
            "{}",
            io.notes[0]
        );
        assert_eq!(fallback_channel_stride(ElemType::Fp32, 17), 128);
        assert_eq!(fallback_channel_stride(ElemType::Fp16, 32), 64);
    }

    #[test]
    fn a_dropped_input_is_unbound_and_a_parameter_input_is_bound() {
        let mut v = attrs();
        // a_bias (symbol 0) listed as a parameter, x dropped from the procedure.
        let bias = v["NetworkStatusList"][0]["LiveInputList"][1].take();
        v["NetworkStatusList"][0]["LiveInputList"] = json!([]);
        v["NetworkStatusList"][0]["LiveInputParamList"] = json!([bias]);
        v["ANEFModelDescription"]["ANEFModelProcedures"][0]["ANEFModelInputSymbolIndexArray"] =
            json!([0]);
        let io = resolve_json(&v, &main_fn(), 1).unwrap();
        assert_eq!(io.inputs.len(), 1);
        assert_eq!(
            (io.inputs[0].name.as_str(), io.inputs[0].symbol),
            ("a_bias", 0)
        );
        assert_eq!(io.unbound, [t("x", 64, 17)]);
        assert!(
            io.notes[0].contains("input x is not among"),
            "{:?}",
            io.notes
        );
    }
}
