//! A small GGUF v3 writer. Tests use it to build synthetic models and corrupt files; tools can use
//! it to write converted models.

use std::io::Write;

use crate::{GgmlType, MetaValue};

/// Collects metadata and tensors, then serialises them as GGUF v3.
pub struct GgufWriter {
    alignment: usize,
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<PendingTensor>,
}

struct PendingTensor {
    name: String,
    dtype: GgmlType,
    /// Row-major (outermost first), as everywhere in anelm.
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter {
            alignment: 32,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn meta(&mut self, key: &str, value: MetaValue) -> &mut Self {
        if key == "general.alignment" {
            if let Some(a) = value.as_i64() {
                self.alignment = a.max(1) as usize;
            }
        }
        self.metadata.push((key.to_string(), value));
        self
    }

    pub fn meta_str(&mut self, key: &str, value: &str) -> &mut Self {
        self.meta(key, MetaValue::Str(value.as_bytes().to_vec()))
    }

    /// Adds a tensor with raw bytes of `dtype`; `shape` is row-major (outermost first).
    pub fn tensor(
        &mut self,
        name: &str,
        dtype: GgmlType,
        shape: &[usize],
        data: Vec<u8>,
    ) -> &mut Self {
        self.tensors.push(PendingTensor {
            name: name.to_string(),
            dtype,
            shape: shape.to_vec(),
            data,
        });
        self
    }

    pub fn tensor_f32(&mut self, name: &str, shape: &[usize], values: &[f32]) -> &mut Self {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor(name, GgmlType::F32, shape, data)
    }

    /// The file bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            write_str(&mut out, k.as_bytes());
            out.extend_from_slice(&type_id(v).to_le_bytes());
            write_value(&mut out, v);
        }
        let mut offset = 0usize;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            write_str(&mut out, t.name.as_bytes());
            out.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
            for &d in t.shape.iter().rev() {
                out.extend_from_slice(&(d as u64).to_le_bytes());
            }
            out.extend_from_slice(&(t.dtype as u32).to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offsets.push(offset);
            offset = (offset + t.data.len()).div_ceil(self.alignment) * self.alignment;
        }
        let data_start = out.len().div_ceil(self.alignment) * self.alignment;
        out.resize(data_start, 0);
        for (t, off) in self.tensors.iter().zip(offsets) {
            out.resize(data_start + off, 0);
            out.extend_from_slice(&t.data);
        }
        out
    }

    pub fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        w.write_all(&self.to_bytes())
    }
}

fn write_str(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s);
}

fn type_id(v: &MetaValue) -> u32 {
    match v {
        MetaValue::U8(_) => 0,
        MetaValue::I8(_) => 1,
        MetaValue::U16(_) => 2,
        MetaValue::I16(_) => 3,
        MetaValue::U32(_) => 4,
        MetaValue::I32(_) => 5,
        MetaValue::F32(_) => 6,
        MetaValue::Bool(_) => 7,
        MetaValue::Str(_) => 8,
        MetaValue::Array(_) => 9,
        MetaValue::U64(_) => 10,
        MetaValue::I64(_) => 11,
        MetaValue::F64(_) => 12,
    }
}

fn write_value(out: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.push(*x as u8),
        MetaValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(u8::from(*x)),
        MetaValue::Str(s) => write_str(out, s),
        MetaValue::Array(items) => {
            // An empty array's element type is arbitrary; u8 keeps it smallest.
            let elem = items.first().map(type_id).unwrap_or(0);
            out.extend_from_slice(&elem.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for it in items {
                write_value(out, it);
            }
        }
    }
}
