//! GGUF v2/v3 reader on a memory map: header, metadata (every value type, nested arrays), tensor
//! infos, `general.alignment`. Tensor bytes are never copied; [`crate::TensorStore`] hands out
//! slices of the map.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::{FormatError, Result};
use crate::store::{TensorInfo, TensorStore};
use crate::GgmlType;

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;

/// The heap the parser may use for metadata and tensor infos: this many bytes per byte of file,
/// plus [`MEMORY_FLOOR`]. A real model's metadata is a small fraction of its file, while a crafted
/// array of one-byte elements would otherwise cost `size_of::<MetaValue>()` (32) bytes per byte.
pub const MEMORY_PER_FILE_BYTE: usize = 8;
/// Heap allowed regardless of the file's size (small fixtures, empty files).
pub const MEMORY_FLOOR: usize = 64 << 10;

/// One metadata value. Strings keep their raw bytes: GGUF says UTF-8, but tokenizer vocabularies
/// are byte strings to llama.cpp and must reach the tokenizer unchanged.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(Vec<u8>),
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// The value as an integer, for any integer or bool type.
    pub fn as_i64(&self) -> Option<i64> {
        Some(match *self {
            MetaValue::U8(v) => v.into(),
            MetaValue::I8(v) => v.into(),
            MetaValue::U16(v) => v.into(),
            MetaValue::I16(v) => v.into(),
            MetaValue::U32(v) => v.into(),
            MetaValue::I32(v) => v.into(),
            MetaValue::U64(v) => i64::try_from(v).ok()?,
            MetaValue::I64(v) => v,
            MetaValue::Bool(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as a float, for any numeric type.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            MetaValue::Str(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        self.as_bytes().and_then(|b| std::str::from_utf8(b).ok())
    }

    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(v) => Some(v),
            _ => None,
        }
    }

    /// Short type name for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "u8",
            MetaValue::I8(_) => "i8",
            MetaValue::U16(_) => "u16",
            MetaValue::I16(_) => "i16",
            MetaValue::U32(_) => "u32",
            MetaValue::I32(_) => "i32",
            MetaValue::U64(_) => "u64",
            MetaValue::I64(_) => "i64",
            MetaValue::F32(_) => "f32",
            MetaValue::F64(_) => "f64",
            MetaValue::Bool(_) => "bool",
            MetaValue::Str(_) => "string",
            MetaValue::Array(_) => "array",
        }
    }
}

/// GGUF metadata: the key/value pairs in file order, with typed accessors that name the file and
/// key in their errors.
#[derive(Clone, Debug, Default)]
pub struct Metadata {
    path: PathBuf,
    entries: Vec<(String, MetaValue)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    pub fn new(path: PathBuf, entries: Vec<(String, MetaValue)>) -> Self {
        let index = entries
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
        Metadata {
            path,
            entries,
            index,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    pub fn entries(&self) -> impl Iterator<Item = (&str, &MetaValue)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    fn bad(&self, key: &str, msg: String) -> FormatError {
        FormatError::BadValue {
            path: self.path.clone(),
            key: key.to_string(),
            msg,
        }
    }

    fn missing(&self, key: &str) -> FormatError {
        FormatError::MissingKey {
            path: self.path.clone(),
            key: key.to_string(),
        }
    }

    /// An optional unsigned integer that must fit `usize`.
    pub fn usize_opt(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_i64().and_then(|i| usize::try_from(i).ok()) {
                Some(n) => Ok(Some(n)),
                None => Err(self.bad(
                    key,
                    format!("expected a non-negative integer, found {}", v.type_name()),
                )),
            },
        }
    }

    pub fn usize(&self, key: &str) -> Result<usize> {
        self.usize_opt(key)?.ok_or_else(|| self.missing(key))
    }

    /// An optional count that must be at least 1 (heads, layers, widths: a zero would divide).
    pub fn positive_opt(&self, key: &str) -> Result<Option<usize>> {
        match self.usize_opt(key)? {
            Some(0) => Err(self.bad(key, "must be at least 1, found 0".to_string())),
            v => Ok(v),
        }
    }

    pub fn positive(&self, key: &str) -> Result<usize> {
        self.positive_opt(key)?.ok_or_else(|| self.missing(key))
    }

    pub fn f32_opt(&self, key: &str) -> Result<Option<f32>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(f) => Ok(Some(f as f32)),
                None => Err(self.bad(key, format!("expected a number, found {}", v.type_name()))),
            },
        }
    }

    pub fn f32(&self, key: &str) -> Result<f32> {
        self.f32_opt(key)?.ok_or_else(|| self.missing(key))
    }

    pub fn bool_opt(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_bool() {
                Some(b) => Ok(Some(b)),
                None => Err(self.bad(key, format!("expected a bool, found {}", v.type_name()))),
            },
        }
    }

    pub fn str_opt(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_str() {
                Some(s) => Ok(Some(s)),
                None => Err(self.bad(
                    key,
                    format!("expected a UTF-8 string, found {}", v.type_name()),
                )),
            },
        }
    }

    pub fn str(&self, key: &str) -> Result<&str> {
        self.str_opt(key)?.ok_or_else(|| self.missing(key))
    }

    pub fn array_opt(&self, key: &str) -> Result<Option<&[MetaValue]>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_array() {
                Some(a) => Ok(Some(a)),
                None => Err(self.bad(key, format!("expected an array, found {}", v.type_name()))),
            },
        }
    }

    /// An array of strings as raw bytes (tokenizer vocabularies).
    pub fn byte_strings_opt(&self, key: &str) -> Result<Option<Vec<&[u8]>>> {
        let Some(arr) = self.array_opt(key)? else {
            return Ok(None);
        };
        arr.iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_bytes().ok_or_else(|| {
                    self.bad(
                        key,
                        format!("element {i} is {}, expected string", v.type_name()),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// An array of numbers as f32 (token scores).
    pub fn f32_array_opt(&self, key: &str) -> Result<Option<Vec<f32>>> {
        let Some(arr) = self.array_opt(key)? else {
            return Ok(None);
        };
        arr.iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_f64().map(|f| f as f32).ok_or_else(|| {
                    self.bad(
                        key,
                        format!("element {i} is {}, expected number", v.type_name()),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// An array of integers as i64 (token types, layer patterns).
    pub fn i64_array_opt(&self, key: &str) -> Result<Option<Vec<i64>>> {
        let Some(arr) = self.array_opt(key)? else {
            return Ok(None);
        };
        arr.iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_i64().ok_or_else(|| {
                    self.bad(
                        key,
                        format!("element {i} is {}, expected integer", v.type_name()),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

/// A parsed GGUF file: its metadata and its tensors on a memory map.
pub struct Gguf {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: TensorStore,
}

impl Gguf {
    /// Opens and parses `path`. Every size and offset is checked against the file length, so a
    /// truncated or corrupt file is an error, never a panic or a read past the map.
    pub fn open(path: impl AsRef<Path>) -> Result<Gguf> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| FormatError::io(path, e))?;
        // SAFETY: the map is read-only; as with every mmap, the file must not be truncated by
        // another process while we hold it.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| FormatError::io(path, e))?;
        let (version, metadata, infos) = parse(path, &map)?;
        let tensors = TensorStore::from_parts(vec![(path.to_path_buf(), map)], infos);
        Ok(Gguf {
            version,
            metadata,
            tensors,
        })
    }

    /// Parses GGUF bytes held in memory (copied to an anonymous map, so the result owns them).
    pub fn from_bytes(path: impl AsRef<Path>, bytes: &[u8]) -> Result<Gguf> {
        let path = path.as_ref();
        let (version, metadata, infos) = parse(path, bytes)?;
        let map = crate::store::anon_map(bytes).map_err(|e| FormatError::io(path, e))?;
        let tensors = TensorStore::from_parts(vec![(path.to_path_buf(), map)], infos);
        Ok(Gguf {
            version,
            metadata,
            tensors,
        })
    }

    /// The `general.architecture` value.
    pub fn architecture(&self) -> Result<&str> {
        self.metadata.str("general.architecture")
    }
}

/// A bounds-checked little-endian cursor over the file bytes, with the heap budget the file's
/// size justifies.
struct Cursor<'a> {
    path: &'a Path,
    buf: &'a [u8],
    pos: usize,
    heap_left: usize,
}

impl<'a> Cursor<'a> {
    fn err(&self, msg: impl Into<String>) -> FormatError {
        FormatError::malformed(self.path, format!("{} (at byte {})", msg.into(), self.pos))
    }

    /// Takes `bytes` from the heap budget before they are allocated.
    fn charge(&mut self, bytes: usize, what: &str) -> Result<()> {
        match self.heap_left.checked_sub(bytes) {
            Some(left) => {
                self.heap_left = left;
                Ok(())
            }
            None => Err(self.err(format!(
                "{what} would need more memory than a {}-byte file justifies (at most {} bytes per file byte)",
                self.buf.len(),
                MEMORY_PER_FILE_BYTE
            ))),
        }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                self.err(format!(
                    "truncated: {what} needs {n} bytes, file is {} bytes",
                    self.buf.len()
                ))
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>("u8")?[0])
    }
    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array("u16")?))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array("u32")?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array("u64")?))
    }

    /// A count that must be satisfiable by the remaining bytes, `min_elem_bytes` each; this stops
    /// a corrupt count from asking for a huge allocation.
    fn count(&mut self, min_elem_bytes: usize, what: &str) -> Result<usize> {
        let n = self.u64()?;
        let remaining = (self.buf.len() - self.pos) as u64;
        if n.saturating_mul(min_elem_bytes.max(1) as u64) > remaining {
            return Err(self.err(format!(
                "truncated or corrupt: {what} count {n} does not fit in the rest of the file"
            )));
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &str) -> Result<Vec<u8>> {
        let n = self.count(1, what)?;
        self.charge(n, what)?;
        Ok(self.take(n, what)?.to_vec())
    }

    fn value(&mut self, ty: u32, depth: usize) -> Result<MetaValue> {
        Ok(match ty {
            0 => MetaValue::U8(self.u8()?),
            1 => MetaValue::I8(self.u8()? as i8),
            2 => MetaValue::U16(self.u16()?),
            3 => MetaValue::I16(self.u16()? as i16),
            4 => MetaValue::U32(self.u32()?),
            5 => MetaValue::I32(self.u32()? as i32),
            6 => MetaValue::F32(f32::from_bits(self.u32()?)),
            7 => match self.u8()? {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => return Err(self.err(format!("bool value {b} is neither 0 nor 1"))),
            },
            8 => MetaValue::Str(self.string("string value")?),
            9 => {
                if depth > 16 {
                    return Err(self.err("arrays nested more than 16 deep"));
                }
                let elem_ty = self.u32()?;
                let n = self.count(elem_min_bytes(elem_ty), "array")?;
                self.charge(n.saturating_mul(size_of::<MetaValue>()), "array")?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.value(elem_ty, depth + 1)?);
                }
                MetaValue::Array(v)
            }
            10 => MetaValue::U64(self.u64()?),
            11 => MetaValue::I64(self.u64()? as i64),
            12 => MetaValue::F64(f64::from_bits(self.u64()?)),
            t => return Err(self.err(format!("unknown metadata value type {t}"))),
        })
    }
}

/// Heap per metadata entry in [`Metadata`]'s index besides the key: a `String` and a `usize`, with
/// the hash table's slack.
const INDEX_ENTRY_BYTES: usize = 2 * (size_of::<String>() + size_of::<usize>());

/// Smallest encoding of one element of type `ty` (used to bound array counts).
fn elem_min_bytes(ty: u32) -> usize {
    match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12,
        _ => 1,
    }
}

/// Parses the GGUF bytes `buf` (named `path` in errors): version, metadata, tensor infos (their
/// byte ranges in `buf`). [`Gguf::open`] runs it on a memory map; fuzzing and tools on a buffer.
pub fn parse(path: &Path, buf: &[u8]) -> Result<(u32, Metadata, Vec<TensorInfo>)> {
    let mut c = Cursor {
        path,
        buf,
        pos: 0,
        heap_left: buf
            .len()
            .saturating_mul(MEMORY_PER_FILE_BYTE)
            .saturating_add(MEMORY_FLOOR),
    };
    let magic = c.take(4, "magic").map_err(|_| {
        FormatError::malformed(
            path,
            format!(
                "not a GGUF file: {} bytes is too short for a header",
                buf.len()
            ),
        )
    })?;
    if magic != MAGIC {
        return Err(FormatError::malformed(
            path,
            format!(
                "not a GGUF file: magic is {:02x?}, expected \"GGUF\"",
                magic
            ),
        ));
    }
    let version = c.u32()?;
    match version {
        2 | 3 => {}
        1 => return Err(c.err("GGUF version 1 is not supported (re-convert the model)")),
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
            return Err(c.err("big-endian GGUF files are not supported"))
        }
        v => return Err(c.err(format!("unknown GGUF version {v}"))),
    }
    let n_tensors = c.count(24, "tensor")?;
    let n_kv = c.count(12, "metadata key/value")?;

    c.charge(
        n_kv.saturating_mul(size_of::<(String, MetaValue)>() + INDEX_ENTRY_BYTES),
        "metadata",
    )?;
    let mut entries = Vec::with_capacity(n_kv);
    for _ in 0..n_kv {
        let key = c.string("metadata key")?;
        // The key is stored twice: in the entry and in the index.
        c.charge(key.len(), "metadata key")?;
        let key = String::from_utf8(key).map_err(|_| c.err("metadata key is not UTF-8"))?;
        let ty = c.u32()?;
        let value = c.value(ty, 0).map_err(|e| match e {
            FormatError::Malformed { path, msg } => FormatError::Malformed {
                path,
                msg: format!("metadata key '{key}': {msg}"),
            },
            e => e,
        })?;
        entries.push((key, value));
    }
    let metadata = Metadata::new(path.to_path_buf(), entries);

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_i64() {
            Some(a) if a > 0 && (a as u64).is_power_of_two() => a as u64,
            _ => return Err(c.err("general.alignment must be a positive power of two")),
        },
    };

    struct RawInfo {
        name: String,
        dims: Vec<u64>,
        type_id: u32,
        offset: u64,
    }
    // Each tensor is held twice (raw, then checked), its name and dims each time.
    c.charge(
        n_tensors.saturating_mul(size_of::<RawInfo>() + size_of::<TensorInfo>()),
        "tensor infos",
    )?;
    let mut raw = Vec::with_capacity(n_tensors);
    for _ in 0..n_tensors {
        let name = c.string("tensor name")?;
        c.charge(name.len(), "tensor name")?;
        let name = String::from_utf8(name).map_err(|_| c.err("tensor name is not UTF-8"))?;
        let n_dims = c.u32()? as usize;
        if n_dims == 0 || n_dims > 8 {
            return Err(c.err(format!("tensor '{name}' has {n_dims} dimensions")));
        }
        c.charge(2 * n_dims * size_of::<u64>(), "tensor dims")?;
        let mut dims = Vec::with_capacity(n_dims);
        for _ in 0..n_dims {
            dims.push(c.u64()?);
        }
        let type_id = c.u32()?;
        let offset = c.u64()?;
        raw.push(RawInfo {
            name,
            dims,
            type_id,
            offset,
        });
    }
    let data_start = (c.pos as u64).div_ceil(alignment) * alignment;
    if data_start > buf.len() as u64 && n_tensors > 0 {
        return Err(FormatError::malformed(
            path,
            "truncated: the tensor data section is missing",
        ));
    }

    let mut infos = Vec::with_capacity(raw.len());
    for r in raw {
        let dtype = GgmlType::from_id(r.type_id).ok_or_else(|| FormatError::UnknownType {
            path: path.to_path_buf(),
            tensor: r.name.clone(),
            id: r.type_id,
        })?;
        let n_elems = r
            .dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| {
                FormatError::malformed(path, format!("tensor '{}' dimensions overflow", r.name))
            })?;
        if r.dims[0] % dtype.block_elems() as u64 != 0 {
            return Err(FormatError::malformed(
                path,
                format!(
                    "tensor '{}': row length {} is not a multiple of the {} block size {}",
                    r.name,
                    r.dims[0],
                    dtype,
                    dtype.block_elems()
                ),
            ));
        }
        let len = dtype.bytes_for(n_elems).ok_or_else(|| {
            FormatError::malformed(path, format!("tensor '{}' size overflows", r.name))
        })?;
        if r.offset % alignment != 0 {
            return Err(FormatError::malformed(
                path,
                format!(
                    "tensor '{}' offset {} is not aligned to {alignment}",
                    r.name, r.offset
                ),
            ));
        }
        let start = data_start.checked_add(r.offset);
        let end = start.and_then(|s| s.checked_add(len as u64));
        match (start, end) {
            (Some(s), Some(e)) if e <= buf.len() as u64 => {
                // GGUF lists dims innermost first; we store them outermost first (row-major).
                let shape = r.dims.iter().rev().map(|&d| d as usize).collect();
                infos.push(TensorInfo::new(r.name, dtype, shape, 0, s as usize, len));
            }
            _ => {
                return Err(FormatError::malformed(
                    path,
                    format!(
                        "tensor '{}' data (offset {}, {} bytes) runs past the end of the file ({} bytes)",
                        r.name,
                        data_start.saturating_add(r.offset),
                        len,
                        buf.len()
                    ),
                ))
            }
        }
    }
    Ok((version, metadata, infos))
}

#[cfg(test)]
pub(crate) mod tests;
