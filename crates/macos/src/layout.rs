//! The I/O layout of a loaded program, read from `-[_ANEInMemoryModel modelAttributes]` given
//! as plain data (FACTS §3.5, C3) — never assumed:
//!
//! - `ANEFModelDescription` maps procedure names to IDs (`kANEFModelProcedureNameToIDMapKey`),
//!   gives each procedure's input and output *symbol indices* (`ANEFModelProcedures`), and the
//!   symbol names (`kANEFModelInputSymbolsArrayKey`, `kANEFModelOutputSymbolsArrayKey`, output
//!   names suffixed `@output`). A request binds surface `i` to symbol `indices[i]`; the MIL
//!   declaration order, alphabetical order and return order all have their advocates (C3), so
//!   we match by name.
//! - `NetworkStatusList` has one entry per procedure (`Name`) with `LiveInputList` and
//!   `LiveOutputList`: per tensor `Name`/`Symbol`, `Type`, `Channels`, `Height`, `Width`,
//!   `PlaneStride` (bytes from one channel to the next of a `[1, C, 1, W]` tensor), `RowStride`,
//!   `BatchStride` (bytes to allocate) and more.
//!
//! [`ModelAttributes`] mirrors that dictionary (what `anelm-macos` converts the `NSDictionary`
//! to, through JSON); [`resolve`] checks it against what the MIL function declares.

use std::collections::BTreeMap;

use serde::Deserialize;

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
    pub inputs: Vec<TensorSlot>,
    pub outputs: Vec<TensorSlot>,
}

/// `modelAttributes`, as far as the driver reads it. Unknown keys are ignored.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct ModelAttributes {
    #[serde(rename = "ANEFModelDescription")]
    pub description: Option<ModelDescription>,
    #[serde(rename = "NetworkStatusList", default)]
    pub network_status: Vec<NetworkStatus>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct ModelDescription {
    #[serde(rename = "ANEFModelProcedures", default)]
    pub procedures: Vec<Procedure>,
    #[serde(rename = "kANEFModelInputSymbolsArrayKey", default)]
    pub input_symbols: Vec<String>,
    #[serde(rename = "kANEFModelOutputSymbolsArrayKey", default)]
    pub output_symbols: Vec<String>,
    #[serde(rename = "kANEFModelProcedureNameToIDMapKey", default)]
    pub procedure_ids: BTreeMap<String, u32>,
    #[serde(rename = "ANEFModelInput16KAlignmentArray", default)]
    pub input_16k_alignment: Vec<u32>,
    #[serde(rename = "ANEFModelOutput16KAlignmentArray", default)]
    pub output_16k_alignment: Vec<u32>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Procedure {
    #[serde(rename = "ANEFModelProcedureID")]
    pub id: u32,
    #[serde(rename = "ANEFModelInputSymbolIndexArray", default)]
    pub inputs: Vec<u32>,
    #[serde(rename = "ANEFModelOutputSymbolIndexArray", default)]
    pub outputs: Vec<u32>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct NetworkStatus {
    #[serde(rename = "Name")]
    pub name: Option<String>,
    #[serde(rename = "LiveInputList", default)]
    pub inputs: Vec<LiveTensor>,
    #[serde(rename = "LiveOutputList", default)]
    pub outputs: Vec<LiveTensor>,
}

/// A tensor's `Symbol`: its name in every dump seen, an index conceivably.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum SymbolRef {
    Index(u32),
    Name(String),
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct LiveTensor {
    pub name: Option<String>,
    pub symbol: Option<SymbolRef>,
    #[serde(rename = "Type")]
    pub elem_type: Option<String>,
    pub batches: Option<u64>,
    pub channels: Option<u64>,
    pub height: Option<u64>,
    pub width: Option<u64>,
    pub depth: Option<u64>,
    pub interleave: Option<u64>,
    pub batch_stride: Option<u64>,
    pub plane_stride: Option<u64>,
    pub row_stride: Option<u64>,
}

impl ModelAttributes {
    /// From the JSON form of the `NSDictionary`.
    pub fn from_json(v: &serde_json::Value) -> Result<ModelAttributes> {
        ModelAttributes::deserialize(v)
            .map_err(|e| MacError::Layout(format!("unexpected shape: {e}")))
    }
}

fn strip_output(name: &str) -> &str {
    name.strip_suffix(OUTPUT_SUFFIX).unwrap_or(name)
}

impl LiveTensor {
    /// Whether this entry describes symbol `index` named `name`.
    fn is(&self, index: u32, name: &str) -> bool {
        let named = |n: &str| strip_output(n) == name;
        match &self.symbol {
            Some(SymbolRef::Index(i)) => *i == index,
            Some(SymbolRef::Name(n)) => named(n),
            None => self.name.as_deref().is_some_and(named),
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
    live: &'a [LiveTensor],
}

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

    fn slots(&self, declared: &[DeclaredTensor]) -> Result<Vec<TensorSlot>> {
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
        declared
            .iter()
            .map(|d| {
                let &(_, symbol) = by_name.iter().find(|(n, _)| *n == d.name).ok_or_else(|| {
                    MacError::Layout(format!(
                        "{} {} is not among the procedure's symbols {:?}",
                        self.what,
                        d.name,
                        by_name.iter().map(|(n, _)| n).collect::<Vec<_>>()
                    ))
                })?;
                let live = self
                    .live
                    .iter()
                    .find(|t| t.is(symbol, &d.name))
                    .ok_or_else(|| {
                        MacError::Layout(format!(
                            "no Live{}List entry for {} {}",
                            if self.what == "input" {
                                "Input"
                            } else {
                                "Output"
                            },
                            self.what,
                            d.name
                        ))
                    })?;
                let aligned = self.alignment.get(symbol as usize).is_some_and(|&a| a != 0);
                slot(d, symbol, live, aligned)
            })
            .collect()
    }
}

/// Checks one live tensor against its declaration and derives its slot.
fn slot(d: &DeclaredTensor, symbol: u32, t: &LiveTensor, align_16k: bool) -> Result<TensorSlot> {
    let bad = |what: String| MacError::Layout(format!("{}: {what}", d.name));
    if let Some(ty) = &t.elem_type {
        let got = ElemType::from_ane(ty)
            .ok_or_else(|| bad(format!("Type {ty} is not Float16 or Float32")))?;
        if got != d.dtype {
            return Err(bad(format!(
                "Type {ty}, but the MIL declares {:?}",
                d.dtype
            )));
        }
    }
    let expect = |field: &str, got: Option<u64>, want: usize| match got {
        Some(g) if g != want as u64 => {
            Err(bad(format!("{field} {g}, but the MIL declares {want}")))
        }
        _ => Ok(()),
    };
    expect("Channels", t.channels, d.channels)?;
    expect("Width", t.width, d.width)?;
    expect("Height", t.height, 1)?;
    expect("Batches", t.batches, 1)?;
    expect("Depth", t.depth, 1)?;
    expect("Interleave", t.interleave, 1)?;
    let row = d.width * d.dtype.bytes();
    let plane = t.plane_stride.ok_or_else(|| bad("no PlaneStride".into()))? as usize;
    if plane < row {
        return Err(bad(format!(
            "PlaneStride {plane} is less than a row of {} {:?} values ({row} bytes)",
            d.width, d.dtype
        )));
    }
    if let Some(r) = t
        .row_stride
        .filter(|&r| (r as usize) < row || r as usize > plane)
    {
        return Err(bad(format!(
            "RowStride {r} does not fit between a row ({row} bytes) and PlaneStride {plane}"
        )));
    }
    let min = d.channels * plane;
    let bytes = match t.batch_stride {
        Some(b) if (b as usize) < min => {
            return Err(bad(format!(
                "BatchStride {b} is less than Channels × PlaneStride = {min}"
            )))
        }
        Some(b) => b as usize,
        None => min,
    };
    let bytes = if align_16k {
        bytes.div_ceil(ALIGN_16K) * ALIGN_16K
    } else {
        bytes
    };
    Ok(TensorSlot {
        name: d.name.clone(),
        symbol,
        dtype: d.dtype,
        channels: d.channels,
        width: d.width,
        channel_stride: plane,
        bytes,
    })
}

/// The layout of MIL function `f` (one of `n_functions`) in a loaded program.
pub fn resolve(
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
        live: &status.inputs,
    };
    let outputs = Side {
        what: "output",
        indices: &proc_.outputs,
        names: &desc.output_symbols,
        alignment: &desc.output_16k_alignment,
        live: &status.outputs,
    };
    let in_slots = inputs.slots(&f.inputs).map_err(|e| context(e, f))?;
    let out_slots = outputs.slots(&f.outputs).map_err(|e| context(e, f))?;
    Ok(ProcedureIo {
        function: f.name.clone(),
        procedure: id,
        inputs: in_slots,
        outputs: out_slots,
    })
}

fn context(e: MacError, f: &DeclaredFunction) -> MacError {
    match e {
        MacError::Layout(m) => MacError::Layout(format!("function {}: {m}", f.name)),
        other => other,
    }
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
                "/ANEFModelDescription/ANEFModelProcedures/0/ANEFModelInputSymbolIndexArray",
                json!([0]),
                "input x is not among the procedure's symbols [\"a_bias\"]",
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
                "/NetworkStatusList/0/LiveOutputList/1/Symbol",
                json!("r@output"),
                "no LiveOutputList entry for output q",
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
        let mut v = attrs();
        v["NetworkStatusList"][0]["LiveInputList"][0]
            .as_object_mut()
            .unwrap()
            .remove("PlaneStride");
        assert!(resolve_json(&v, &main_fn(), 1)
            .unwrap_err()
            .to_string()
            .contains("x: no PlaneStride"));
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
        assert!(e.contains("unexpected shape"), "{e}");
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
}
