//! Our blob storage writer against coremltools' own (`libmilstoragepython._BlobStorageWriter`):
//! the same tensors must give a byte-identical file.

mod common;

use anelm_mil::blob::{write_blob_file, BlobFile};
use anelm_mil::{DType, WeightData};

const WRITE_WITH_COREMLTOOLS: &str = r#"
import sys, numpy as np
from coremltools.libmilstoragepython import _BlobStorageWriter
w = _BlobStorageWriter(sys.argv[1])
offsets = [
    w.write_fp16_data(np.array([1.0, -0.5, 0.25, 65504.0, 1e-7], dtype=np.float16).view(np.uint16)),
    w.write_float_data(np.array([1.5, -2.0, 3.0e38], dtype=np.float32)),
    w.write_int8_data(np.array([-128, 127, 3, 0, -1], dtype=np.int8)),
    w.write_uint8_data(np.array([0, 200, 255], dtype=np.uint8)),
    w.write_int4_data(np.array([1, -2, 7, -8, 0], dtype=np.int8)),
    w.write_uint4_data(np.array([15, 0, 3], dtype=np.uint8)),
    w.write_int32_data(np.array([-7, 1 << 30], dtype=np.int32)),
    w.write_uint1_data(np.array([1, 0, 1, 1, 0, 0, 0, 1, 1], dtype=np.uint8)),
    w.write_uint2_data(np.array([3, 0, 2, 1, 1], dtype=np.uint8)),
    w.write_uint3_data(np.array([1, 2, 3, 4, 5, 6, 7, 0, 1], dtype=np.uint8)),
    w.write_uint6_data(np.array([63, 1, 32, 5, 0], dtype=np.uint8)),
]
del w
print(" ".join(map(str, offsets)))
"#;

#[test]
fn byte_identical_to_coremltools_storage_writer() {
    let records = [
        WeightData::f16_from_f32(&[1.0, -0.5, 0.25, 65504.0, 1e-7]),
        WeightData::f32(&[1.5, -2.0, 3.0e38]),
        WeightData::i8(&[-128, 127, 3, 0, -1]),
        WeightData::u8(&[0, 200, 255]),
        WeightData::int4(&[1, -2, 7, -8, 0]).unwrap(),
        WeightData::uint4(&[15, 0, 3]).unwrap(),
        WeightData::i32(&[-7, 1 << 30]),
        WeightData::pack(DType::Uint1, &[1u8, 0, 1, 1, 0, 0, 0, 1, 1]).unwrap(),
        WeightData::pack(DType::Uint2, &[3u8, 0, 2, 1, 1]).unwrap(),
        WeightData::pack(DType::Uint3, &[1u8, 2, 3, 4, 5, 6, 7, 0, 1]).unwrap(),
        WeightData::pack(DType::Uint6, &[63u8, 1, 32, 5, 0]).unwrap(),
    ];
    let mut ours = Vec::new();
    let refs: Vec<&WeightData> = records.iter().collect();
    let offsets = write_blob_file(&mut ours, &refs).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ct.bin");
    let out = std::process::Command::new(common::python())
        .arg("-c")
        .arg(WRITE_WITH_COREMLTOOLS)
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs_offsets: Vec<u64> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(offsets, theirs_offsets);
    let theirs = std::fs::read(&path).unwrap();
    assert_eq!(ours.len(), theirs.len());
    assert!(
        ours == theirs,
        "first difference at byte {:?}",
        ours.iter().zip(&theirs).position(|(a, b)| a != b)
    );
    // And our reader reads theirs.
    let f = BlobFile::parse("ct.bin".into(), theirs).unwrap();
    assert_eq!(f.records().len(), records.len());
}
