//! MIL weight blob storage, version 2 (FACTS §2, COREML.md §6; coremltools
//! `MILBlob/Blob/StorageFormat.hpp`). All integers little-endian:
//!
//! ```text
//! storage_header (64 B at 0):   u32 count | u32 version = 2 | 56 zero bytes
//! per record, 64-aligned:       blob_metadata (64 B): u32 0xDEADBEEF | u32 dtype | u64 size
//!                               | u64 data offset (= metadata offset + 64) | u64 padding bits
//!                               | 32 zero bytes;  then the data, zero-padded to 64
//! ```
//!
//! A `BLOBFILE(..., offset = N)` reference names the **metadata** offset N, not the data.
//!
//! [`BlobLayout`] decides where every in-memory weight of a [`Program`] goes (one file, or one
//! file per tensor — [`BlobPolicy`]); the MIL text printer and the package writer both read
//! their `BLOBFILE` references from it, and [`BlobLayout::write_files`] writes the files.

use crate::dtype::DType;
use crate::error::{MilError, Result};
use crate::ir::Program;
use crate::literal::{BlobSource, Literal, WeightData};
use crate::types::TensorType;
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

pub const ALIGN: u64 = 64;
pub const HEADER_BYTES: u64 = 64;
pub const METADATA_BYTES: u64 = 64;
pub const SENTINEL: u32 = 0xDEAD_BEEF;
pub const STORAGE_VERSION: u32 = 2;
/// `@model_path` prefix of weight paths in MIL text and protobuf.
pub const MODEL_PATH_PREFIX: &str = "@model_path/";

fn align_up(v: u64) -> u64 {
    v.div_ceil(ALIGN) * ALIGN
}

/// Metadata offsets of records of the given data sizes, in order, and the file size. Like
/// coremltools' `StorageWriter`, padding goes before each record, none after the last.
pub fn record_offsets(sizes: &[u64]) -> (Vec<u64>, u64) {
    let mut end = HEADER_BYTES;
    let mut out = Vec::with_capacity(sizes.len());
    for &s in sizes {
        let meta = align_up(end);
        out.push(meta);
        end = meta + METADATA_BYTES + s;
    }
    (out, end)
}

/// Padding bits of the last byte of a sub-byte tensor (coremltools `padding_size_in_bits`).
fn padding_bits(w: &WeightData) -> u64 {
    let bits = w.len() as u64 * w.dtype().bits() as u64;
    (8 - bits % 8) % 8
}

/// Writes one storage-v2 file holding `records` in order; returns their metadata offsets.
pub fn write_blob_file<W: Write>(
    out: &mut W,
    records: &[&WeightData],
) -> std::io::Result<Vec<u64>> {
    let sizes: Vec<u64> = records.iter().map(|r| r.as_bytes().len() as u64).collect();
    let (offsets, _) = record_offsets(&sizes);
    let count = u32::try_from(records.len()).map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "too many blob records")
    })?;
    let mut header = [0u8; HEADER_BYTES as usize];
    header[0..4].copy_from_slice(&count.to_le_bytes());
    header[4..8].copy_from_slice(&STORAGE_VERSION.to_le_bytes());
    out.write_all(&header)?;
    let mut pos = HEADER_BYTES;
    for (r, &meta) in records.iter().zip(&offsets) {
        out.write_all(&vec![0u8; (meta - pos) as usize])?;
        let code = r.dtype().blob_code().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} has no blob dtype code", r.dtype()),
            )
        })?;
        let mut m = [0u8; METADATA_BYTES as usize];
        m[0..4].copy_from_slice(&SENTINEL.to_le_bytes());
        m[4..8].copy_from_slice(&code.to_le_bytes());
        m[8..16].copy_from_slice(&(r.as_bytes().len() as u64).to_le_bytes());
        m[16..24].copy_from_slice(&(meta + METADATA_BYTES).to_le_bytes());
        m[24..32].copy_from_slice(&padding_bits(r).to_le_bytes());
        out.write_all(&m)?;
        out.write_all(r.as_bytes())?;
        pos = meta + METADATA_BYTES + r.as_bytes().len() as u64;
    }
    Ok(offsets)
}

/// One record of a parsed blob file.
#[derive(Debug, Clone, PartialEq)]
pub struct BlobRecord {
    pub metadata_offset: u64,
    pub dtype: DType,
    pub size: u64,
    pub data_offset: u64,
    pub padding_bits: u64,
}

/// A storage-v2 blob file read into memory and checked record by record.
#[derive(Debug)]
pub struct BlobFile {
    name: String,
    bytes: Vec<u8>,
    records: Vec<BlobRecord>,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl BlobFile {
    pub fn open(path: &Path) -> Result<BlobFile> {
        let bytes = std::fs::read(path).map_err(|e| MilError::io(path, e))?;
        BlobFile::parse(path.display().to_string(), bytes)
    }

    /// Parses file content; `name` is used in error messages.
    pub fn parse(name: String, bytes: Vec<u8>) -> Result<BlobFile> {
        let fail = |msg: String| MilError::format(&name, msg);
        if bytes.len() < HEADER_BYTES as usize {
            return Err(fail(format!(
                "{} bytes is shorter than the 64-byte storage header",
                bytes.len()
            )));
        }
        let count = u32_at(&bytes, 0) as usize;
        let version = u32_at(&bytes, 4);
        if version != STORAGE_VERSION {
            return Err(fail(format!(
                "storage version {version}, expected {STORAGE_VERSION}"
            )));
        }
        let mut records = Vec::with_capacity(count);
        let mut off = HEADER_BYTES;
        for i in 0..count {
            if off + METADATA_BYTES > bytes.len() as u64 {
                return Err(fail(format!(
                    "header says {count} records, record {i} at {off} is past the end"
                )));
            }
            let at = off as usize;
            let sentinel = u32_at(&bytes, at);
            if sentinel != SENTINEL {
                return Err(fail(format!(
                    "record {i} at {off}: sentinel {sentinel:#010x}, expected 0xdeadbeef"
                )));
            }
            let code = u32_at(&bytes, at + 4);
            let dtype = DType::from_blob_code(code)
                .ok_or_else(|| fail(format!("record {i} at {off}: unknown dtype code {code}")))?;
            let size = u64_at(&bytes, at + 8);
            let data_offset = u64_at(&bytes, at + 16);
            let padding_bits = u64_at(&bytes, at + 24);
            if !data_offset.is_multiple_of(ALIGN) || data_offset < off + METADATA_BYTES {
                return Err(fail(format!("record {i} at {off}: data offset {data_offset} is not aligned after its metadata")));
            }
            let end = data_offset
                .checked_add(size)
                .filter(|&e| e <= bytes.len() as u64);
            let end = end.ok_or_else(|| {
                fail(format!(
                    "record {i} at {off}: {size} bytes at {data_offset} run past the end"
                ))
            })?;
            records.push(BlobRecord {
                metadata_offset: off,
                dtype,
                size,
                data_offset,
                padding_bits,
            });
            off = align_up(end);
        }
        Ok(BlobFile {
            name,
            bytes,
            records,
        })
    }

    pub fn records(&self) -> &[BlobRecord] {
        &self.records
    }

    /// The record whose metadata is at `offset` (what a BLOBFILE reference names).
    pub fn record(&self, offset: u64) -> Result<&BlobRecord> {
        self.records
            .iter()
            .find(|r| r.metadata_offset == offset)
            .ok_or_else(|| {
                MilError::format(
                    &self.name,
                    format!("no blob_metadata record at offset {offset}"),
                )
            })
    }

    /// The record at `offset` as weight data of type `ty` (dtype and size must match).
    pub fn read(&self, offset: u64, ty: &TensorType) -> Result<WeightData> {
        let r = self.record(offset)?;
        if r.dtype != ty.dtype {
            return Err(MilError::format(
                &self.name,
                format!("record at {offset} holds {}, the constant is {ty}", r.dtype),
            ));
        }
        if r.size != ty.packed_bytes() as u64 {
            return Err(MilError::format(
                &self.name,
                format!(
                    "record at {offset} holds {} bytes, {ty} needs {}",
                    r.size,
                    ty.packed_bytes()
                ),
            ));
        }
        let data = self.bytes[r.data_offset as usize..(r.data_offset + r.size) as usize].to_vec();
        WeightData::from_bytes(ty.dtype, ty.numel(), data)
    }
}

/// Where weights go when a program is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlobPolicy {
    /// Every weight in one file `weights/<name>` (e.g. `weight.bin`, what Core ML packages use).
    SingleFile(String),
    /// One file per tensor, `weights/<const name>.bin`, each referenced at offset 64 — the
    /// most widely hardware-proven form and the only one reported on M1 (FACTS §2).
    PerTensor,
}

impl Default for BlobPolicy {
    fn default() -> Self {
        BlobPolicy::SingleFile("weight.bin".into())
    }
}

/// A `BLOBFILE` reference: the path as written (`@model_path/weights/weight.bin`) and the
/// metadata offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobLocation {
    pub path: String,
    pub offset: u64,
}

/// One planned blob file.
#[derive(Debug, Clone)]
pub struct PlannedFile {
    /// Path relative to the model directory, e.g. `weights/weight.bin`.
    pub relative_path: String,
    pub records: Vec<Arc<WeightData>>,
    pub offsets: Vec<u64>,
    pub size: u64,
}

impl PlannedFile {
    /// The path as MIL references it (`@model_path/...`).
    pub fn mil_path(&self) -> String {
        format!("{MODEL_PATH_PREFIX}{}", self.relative_path)
    }

    pub fn write_to<W: Write>(&self, out: &mut W) -> std::io::Result<()> {
        let refs: Vec<&WeightData> = self.records.iter().map(|r| r.as_ref()).collect();
        write_blob_file(out, &refs).map(|_| ())
    }

    /// The whole file in memory (the private path passes it as NSData).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.size as usize);
        // Writing to a Vec cannot fail; dtype codes were checked when the data was made.
        let _ = self.write_to(&mut v);
        v
    }
}

/// The placement of every in-memory weight of a program.
#[derive(Debug, Clone, Default)]
pub struct BlobLayout {
    locations: HashMap<usize, BlobLocation>,
    files: Vec<PlannedFile>,
}

fn key(d: &Arc<WeightData>) -> usize {
    Arc::as_ptr(d) as usize
}

impl BlobLayout {
    /// Plans the files for every distinct weight of `program` (shared `Arc`s stored once).
    pub fn plan(program: &Program, policy: &BlobPolicy) -> BlobLayout {
        // (first const name using it, data), in program order.
        let mut weights: Vec<(String, Arc<WeightData>)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for f in &program.functions {
            for op in f.ops() {
                let name = op
                    .name
                    .clone()
                    .or_else(|| op.outputs.first().map(|&o| f.name_of(o).to_string()));
                for lit in op.literals() {
                    if let Some(d) = lit.weight_data() {
                        if seen.insert(key(d)) {
                            weights
                                .push((name.clone().unwrap_or_else(|| "weight".into()), d.clone()));
                        }
                    }
                }
            }
        }
        let mut layout = BlobLayout::default();
        match policy {
            BlobPolicy::SingleFile(name) => {
                if !weights.is_empty() {
                    layout.add_file(
                        format!("weights/{name}"),
                        weights.into_iter().map(|(_, d)| d).collect(),
                    );
                }
            }
            BlobPolicy::PerTensor => {
                let mut used = std::collections::HashSet::new();
                for (name, d) in weights {
                    let mut file = format!("weights/{name}.bin");
                    let mut n = 1;
                    while !used.insert(file.clone()) {
                        file = format!("weights/{name}_{n}.bin");
                        n += 1;
                    }
                    layout.add_file(file, vec![d]);
                }
            }
        }
        layout
    }

    fn add_file(&mut self, relative_path: String, records: Vec<Arc<WeightData>>) {
        let sizes: Vec<u64> = records.iter().map(|r| r.as_bytes().len() as u64).collect();
        let (offsets, size) = record_offsets(&sizes);
        let path = format!("{MODEL_PATH_PREFIX}{relative_path}");
        for (r, &o) in records.iter().zip(&offsets) {
            self.locations.insert(
                key(r),
                BlobLocation {
                    path: path.clone(),
                    offset: o,
                },
            );
        }
        self.files.push(PlannedFile {
            relative_path,
            records,
            offsets,
            size,
        });
    }

    /// Where `data` was placed.
    pub fn location(&self, data: &Arc<WeightData>) -> Option<&BlobLocation> {
        self.locations.get(&key(data))
    }

    pub fn files(&self) -> &[PlannedFile] {
        &self.files
    }

    /// Writes every planned file under `model_dir` (creating `weights/`).
    pub fn write_files(&self, model_dir: &Path) -> Result<()> {
        for f in &self.files {
            let path = model_dir.join(&f.relative_path);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| MilError::io(parent, e))?;
            }
            let file = std::fs::File::create(&path).map_err(|e| MilError::io(&path, e))?;
            let mut w = std::io::BufWriter::new(file);
            f.write_to(&mut w)
                .and_then(|_| w.flush())
                .map_err(|e| MilError::io(&path, e))?;
        }
        Ok(())
    }
}

/// Loads every `BLOBFILE` reference of `program` from files under `model_dir` (where
/// `@model_path` points), so the program holds its weight data (for the simulator, or to
/// write it again elsewhere).
pub fn load_blobs(program: &mut Program, model_dir: &Path) -> Result<()> {
    let mut files: HashMap<String, BlobFile> = HashMap::new();
    program.resolve_blobs(|path, offset, ty| {
        let rel = path.strip_prefix(MODEL_PATH_PREFIX).ok_or_else(|| {
            MilError::invalid(format!(
                "blob path {path:?} does not start with {MODEL_PATH_PREFIX}"
            ))
        })?;
        if !files.contains_key(rel) {
            files.insert(rel.to_string(), BlobFile::open(&model_dir.join(rel))?);
        }
        files[rel].read(offset, ty)
    })
}

/// Makes `lit` a reference to its planned location (text printer, package writer).
pub(crate) fn blob_location<'a>(lit: &'a Literal, layout: &'a BlobLayout) -> Result<(String, u64)> {
    match lit {
        Literal::Blob {
            source: BlobSource::File { path, offset },
            ..
        } => Ok((path.clone(), *offset)),
        Literal::Blob {
            source: BlobSource::Data(d),
            ty,
        } => layout
            .location(d)
            .map(|l| (l.path.clone(), l.offset))
            .ok_or_else(|| {
                MilError::invalid(format!(
                    "weight of type {ty} has no place in the blob layout"
                ))
            }),
        Literal::Immediate { .. } => Err(MilError::invalid("not a blob literal")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worked_example_offsets() {
        // FACTS §2 worked example: Wq fp16 [768,768,1,1] then W1 fp16 [2048,768,1,1].
        let wq = WeightData::f16_from_f32(&vec![0.25; 768 * 768]);
        let w1 = WeightData::f16_from_f32(&vec![-1.0; 2048 * 768]);
        let mut buf = Vec::new();
        let offs = write_blob_file(&mut buf, &[&wq, &w1]).unwrap();
        assert_eq!(offs, vec![64, 1_179_776]);
        assert_eq!(buf.len(), 4_325_568);
        assert_eq!(&buf[0..8], &[2, 0, 0, 0, 2, 0, 0, 0]);
        assert!(buf[8..64].iter().all(|&b| b == 0));
        assert_eq!(&buf[64..72], &[0xEF, 0xBE, 0xAD, 0xDE, 1, 0, 0, 0]);
        assert_eq!(u64_at(&buf, 72), 1_179_648);
        assert_eq!(u64_at(&buf, 80), 128);
        assert!(buf[88..128].iter().all(|&b| b == 0));
        assert_eq!(&buf[128..130], &[0x00, 0x34]); // 0.25 in fp16
        assert_eq!(u32_at(&buf, 1_179_776), SENTINEL);
        assert_eq!(u64_at(&buf, 1_179_776 + 8), 3_145_728);
        assert_eq!(u64_at(&buf, 1_179_776 + 16), 1_179_840);
        assert_eq!(&buf[1_179_840..1_179_842], &[0x00, 0xBC]); // -1.0
        let file = BlobFile::parse("example".into(), buf).unwrap();
        let back = file
            .read(1_179_776, &TensorType::fp16([2048, 768, 1, 1]))
            .unwrap();
        assert_eq!(back, w1);
    }

    #[test]
    fn records_start_on_64_byte_boundaries() {
        // ESP's golden for two 6x4 fp16 tensors (48 B each) chains metadata at 0x40 and 0xB0,
        // which is not 64-aligned and was never run (FACTS §2); coremltools pads to 0xC0.
        let (offs, size) = record_offsets(&[48, 48]);
        assert_eq!(offs, vec![0x40, 0xC0]);
        assert_eq!(size, 0x130, "no padding after the last record");
        let (offs, _) = record_offsets(&[64, 1, 0]);
        assert_eq!(offs, vec![64, 192, 320]);
    }

    #[test]
    fn sub_byte_records_carry_padding_bits() {
        let w = WeightData::int4(&[1, 2, 3]).unwrap();
        let mut buf = Vec::new();
        write_blob_file(&mut buf, &[&w]).unwrap();
        assert_eq!(u32_at(&buf, 68), 8); // Int4 code
        assert_eq!(u64_at(&buf, 72), 2);
        assert_eq!(u64_at(&buf, 88), 4); // 3 * 4 bits = 12, pad 4
        let f = BlobFile::parse("int4".into(), buf).unwrap();
        assert_eq!(f.read(64, &TensorType::new(DType::Int4, [3])).unwrap(), w);
    }

    #[test]
    fn mixed_dtype_records_round_trip() {
        let a = WeightData::f32(&[1.5, -2.0, 3.25]);
        let b = WeightData::u8(&[0, 200, 255, 7, 9]);
        let c = WeightData::i8(&[-128, 127]);
        let mut buf = Vec::new();
        let offs = write_blob_file(&mut buf, &[&a, &b, &c]).unwrap();
        assert_eq!(offs, vec![64, 192, 320]);
        assert_eq!(buf.len(), 386);
        let f = BlobFile::parse("mixed".into(), buf).unwrap();
        let codes: Vec<DType> = f.records().iter().map(|r| r.dtype).collect();
        assert_eq!(codes, [DType::Fp32, DType::Uint8, DType::Int8]);
        assert_eq!(f.read(64, &TensorType::fp32([3])).unwrap(), a);
        assert_eq!(f.read(192, &TensorType::uint8([5])).unwrap(), b);
        assert_eq!(
            f.read(320, &TensorType::int8([1, 2])).unwrap().to_f32(),
            vec![-128.0, 127.0]
        );
    }

    #[test]
    fn reader_rejects_corruption() {
        let w = WeightData::i8(&[1, -1, 5]);
        let mut buf = Vec::new();
        write_blob_file(&mut buf, &[&w]).unwrap();
        let good = BlobFile::parse("ok".into(), buf.clone()).unwrap();
        assert!(
            good.read(128, &TensorType::int8([3])).is_err(),
            "data offset is not a record offset"
        );
        assert!(
            good.read(64, &TensorType::uint8([3])).is_err(),
            "dtype mismatch"
        );
        assert!(
            good.read(64, &TensorType::int8([4])).is_err(),
            "size mismatch"
        );
        let mut bad = buf.clone();
        bad[64] = 0;
        let e = BlobFile::parse("bad.bin".into(), bad)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("bad.bin") && e.contains("sentinel"), "{e}");
        let mut v1 = buf.clone();
        v1[4] = 1;
        assert!(BlobFile::parse("v1".into(), v1).is_err());
        assert!(BlobFile::parse("short".into(), buf[..100].to_vec()).is_err());
    }
}
