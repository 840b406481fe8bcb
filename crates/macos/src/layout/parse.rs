//! `modelAttributes` (as JSON) read into plain structs, tolerantly: unknown keys are ignored,
//! missing lists are empty, and a value of the wrong kind is one error naming its key path.
//!
//! Shapes seen in public dumps (the fixtures under `crates/macos/tests/fixtures` follow them):
//! - freedomtan/coreml_to_ane_hwx `ane/README.md` @ 2194b677 (M1, macOS 15): two procedures
//!   with *global* symbol indices (procedure 1 binds input symbol 1), the same symbol name listed
//!   twice, `kANEFModelProcedureNameToIDMapKey = {"0@default" = 1; "0@res_320x320" = 0}`, and
//!   `LiveInputList` entries with no `Channels`/`PlaneStride` but a `PlaneDescriptor` array of
//!   `{PlaneID, RowStride}` plus `4CCFormat`, `Height`, `Width`, `Name`, `Symbol`.
//! - the same repo's `ane/run_hwx_with_ane_client.m` searches `LiveInputParamList`,
//!   `LiveInputList` and `LiveStateList` for each input symbol, by `Name`; an objc2 Rust runtime
//!   in the code index (`bindings()` over `["LiveInputList", "LiveStateList",
//!   "LiveInputParamList"]`) does the same and finds `Int32` scalar parameters there.
//! - a `_ANEClient` MUL check in the code index matches entries by `Name` or `Symbol`, reads
//!   `Batches, Channels, Height, Width, Depth, Interleave, RowStride, PlaneStride, BatchStride`,
//!   and treats a zero or missing `RowStride`/`PlaneStride` as "packed".

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::error::{MacError, Result};

/// `modelAttributes`, as far as the driver reads it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelAttributes {
    /// `ANEFModelDescription`.
    pub description: Option<ModelDescription>,
    /// `NetworkStatusList`.
    pub network_status: Vec<NetworkStatus>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelDescription {
    /// `ANEFModelProcedures`.
    pub procedures: Vec<Procedure>,
    /// `kANEFModelInputSymbolsArrayKey`: global across procedures.
    pub input_symbols: Vec<String>,
    /// `kANEFModelOutputSymbolsArrayKey` (names suffixed `@output`).
    pub output_symbols: Vec<String>,
    /// `kANEFModelProcedureNameToIDMapKey`.
    pub procedure_ids: BTreeMap<String, u32>,
    /// `ANEFModelInput16KAlignmentArray`, by global symbol index.
    pub input_16k_alignment: Vec<u32>,
    /// `ANEFModelOutput16KAlignmentArray`.
    pub output_16k_alignment: Vec<u32>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Procedure {
    /// `ANEFModelProcedureID`.
    pub id: u32,
    /// `ANEFModelInputSymbolIndexArray`: global input symbol indices.
    pub inputs: Vec<u32>,
    /// `ANEFModelOutputSymbolIndexArray`.
    pub outputs: Vec<u32>,
}

/// One `NetworkStatusList` entry: a procedure's live tensors.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NetworkStatus {
    pub name: Option<String>,
    /// `LiveInputList`.
    pub inputs: Vec<LiveTensor>,
    /// `LiveInputParamList`: inputs the compiler treats as parameters (small broadcast tensors,
    /// scalars).
    pub params: Vec<LiveTensor>,
    /// `LiveStateList`.
    pub states: Vec<LiveTensor>,
    /// `LiveOutputList`.
    pub outputs: Vec<LiveTensor>,
}

/// The lists an input may be described in, searched in this order.
pub const INPUT_LISTS: [&str; 3] = ["LiveInputList", "LiveInputParamList", "LiveStateList"];
pub const OUTPUT_LIST: &str = "LiveOutputList";

impl NetworkStatus {
    /// Every input entry with the list it came from.
    pub fn input_entries(&self) -> impl Iterator<Item = (&'static str, &LiveTensor)> {
        let tag = |list: &'static str| move |t| (list, t);
        self.inputs
            .iter()
            .map(tag(INPUT_LISTS[0]))
            .chain(self.params.iter().map(tag(INPUT_LISTS[1])))
            .chain(self.states.iter().map(tag(INPUT_LISTS[2])))
    }
}

/// A tensor's `Symbol`: its name in every dump seen, an index conceivably.
#[derive(Clone, Debug, PartialEq)]
pub enum SymbolRef {
    Index(u32),
    Name(String),
}

/// One live tensor entry, kept whole: fields are read on demand, and the raw entry goes into
/// the warning when its layout has to be assumed.
#[derive(Clone, Debug, PartialEq)]
pub struct LiveTensor(pub Map<String, Value>);

impl LiveTensor {
    pub fn text(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(Value::as_str)
    }

    /// A count or byte size: absent (or null) is `None`; a number, an integral float or a
    /// decimal string is read; anything else is an error naming the key.
    pub fn number(&self, key: &str) -> Result<Option<u64>, String> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => count(v)
                .map(Some)
                .ok_or_else(|| format!("{key} is {}, not a count", short(v))),
        }
    }

    pub fn symbol(&self) -> Option<SymbolRef> {
        match self.0.get("Symbol")? {
            Value::String(s) => Some(SymbolRef::Name(s.clone())),
            v => count(v)
                .and_then(|i| u32::try_from(i).ok())
                .map(SymbolRef::Index),
        }
    }

    /// `PlaneDescriptor`: the `RowStride` of each plane, when the entry has one.
    pub fn plane_row_strides(&self) -> Result<Option<Vec<u64>>, String> {
        let Some(v) = self.0.get("PlaneDescriptor") else {
            return Ok(None);
        };
        let planes = v
            .as_array()
            .ok_or_else(|| format!("PlaneDescriptor is {}, not a list", short(v)))?;
        planes
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let stride = p
                    .get("RowStride")
                    .and_then(count)
                    .filter(|&r| r > 0)
                    .ok_or_else(|| format!("PlaneDescriptor[{i}] is {}: no RowStride", short(p)))?;
                Ok(stride)
            })
            .collect::<Result<Vec<_>, String>>()
            .map(Some)
    }

    /// The entry as one line of JSON (for warnings).
    pub fn raw(&self) -> String {
        Value::Object(self.0.clone()).to_string()
    }
}

fn count(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < 9.0e15)
                .map(|f| f as u64)
        }),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A value for an error message, cut short.
fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 60 {
        format!("{}…", s.chars().take(60).collect::<String>())
    } else {
        s
    }
}

fn malformed(path: &str, v: &Value, want: &str) -> MacError {
    MacError::Layout(format!("{path} is {}, expected {want}", short(v)))
}

fn object<'a>(v: &'a Value, path: &str) -> Result<&'a Map<String, Value>> {
    v.as_object()
        .ok_or_else(|| malformed(path, v, "a dictionary"))
}

/// The list at `key` of `m` (absent or null: empty).
fn list<'a>(m: &'a Map<String, Value>, key: &str, path: &str) -> Result<&'a [Value]> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(v) => Err(malformed(&format!("{path}.{key}"), v, "a list")),
    }
}

fn index(v: &Value, path: &str) -> Result<u32> {
    count(v)
        .and_then(|i| u32::try_from(i).ok())
        .ok_or_else(|| malformed(path, v, "an index"))
}

fn indices(m: &Map<String, Value>, key: &str, path: &str) -> Result<Vec<u32>> {
    list(m, key, path)?
        .iter()
        .enumerate()
        .map(|(i, v)| index(v, &format!("{path}.{key}[{i}]")))
        .collect()
}

fn names(m: &Map<String, Value>, key: &str, path: &str) -> Result<Vec<String>> {
    list(m, key, path)?
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| malformed(&format!("{path}.{key}[{i}]"), v, "a name"))
        })
        .collect()
}

impl ModelAttributes {
    /// From the JSON form of the `NSDictionary`.
    pub fn from_json(v: &Value) -> Result<ModelAttributes> {
        let top = object(v, "modelAttributes")?;
        let description = match top.get("ANEFModelDescription") {
            None | Some(Value::Null) => None,
            Some(d) => Some(ModelDescription::parse(d)?),
        };
        let network_status = list(top, "NetworkStatusList", "modelAttributes")?
            .iter()
            .enumerate()
            .map(|(i, s)| NetworkStatus::parse(s, &format!("NetworkStatusList[{i}]")))
            .collect::<Result<_>>()?;
        Ok(ModelAttributes {
            description,
            network_status,
        })
    }
}

impl ModelDescription {
    fn parse(v: &Value) -> Result<ModelDescription> {
        let p = "ANEFModelDescription";
        let m = object(v, p)?;
        let procedures = list(m, "ANEFModelProcedures", p)?
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let path = format!("{p}.ANEFModelProcedures[{i}]");
                let pm = object(v, &path)?;
                let id = pm.get("ANEFModelProcedureID").ok_or_else(|| {
                    MacError::Layout(format!("{path} has no ANEFModelProcedureID"))
                })?;
                Ok(Procedure {
                    id: index(id, &format!("{path}.ANEFModelProcedureID"))?,
                    inputs: indices(pm, "ANEFModelInputSymbolIndexArray", &path)?,
                    outputs: indices(pm, "ANEFModelOutputSymbolIndexArray", &path)?,
                })
            })
            .collect::<Result<_>>()?;
        let map_key = "kANEFModelProcedureNameToIDMapKey";
        let procedure_ids = match m.get(map_key) {
            None | Some(Value::Null) => BTreeMap::new(),
            Some(v) => object(v, &format!("{p}.{map_key}"))?
                .iter()
                .map(|(k, id)| Ok((k.clone(), index(id, &format!("{p}.{map_key}.{k}"))?)))
                .collect::<Result<_>>()?,
        };
        Ok(ModelDescription {
            procedures,
            input_symbols: names(m, "kANEFModelInputSymbolsArrayKey", p)?,
            output_symbols: names(m, "kANEFModelOutputSymbolsArrayKey", p)?,
            procedure_ids,
            input_16k_alignment: indices(m, "ANEFModelInput16KAlignmentArray", p)?,
            output_16k_alignment: indices(m, "ANEFModelOutput16KAlignmentArray", p)?,
        })
    }
}

impl NetworkStatus {
    fn parse(v: &Value, path: &str) -> Result<NetworkStatus> {
        let m = object(v, path)?;
        let tensors = |key: &str| -> Result<Vec<LiveTensor>> {
            list(m, key, path)?
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    Ok(LiveTensor(
                        object(t, &format!("{path}.{key}[{i}]"))?.clone(),
                    ))
                })
                .collect()
        };
        Ok(NetworkStatus {
            name: m.get("Name").and_then(Value::as_str).map(str::to_string),
            inputs: tensors(INPUT_LISTS[0])?,
            params: tensors(INPUT_LISTS[1])?,
            states: tensors(INPUT_LISTS[2])?,
            outputs: tensors(OUTPUT_LIST)?,
        })
    }
}
