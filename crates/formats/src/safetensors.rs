//! Hugging Face safetensors, single file or sharded (`model.safetensors.index.json`), on memory
//! maps, as a [`TensorStore`].

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use crate::error::{FormatError, Result};
use crate::store::{TensorInfo, TensorStore};
use crate::GgmlType;

/// Opens the safetensors weights of a Hugging Face model directory: `model.safetensors`, or the
/// shards listed by `model.safetensors.index.json`.
pub fn open_dir(dir: &Path) -> Result<TensorStore> {
    let index = dir.join("model.safetensors.index.json");
    let single = dir.join("model.safetensors");
    let files: Vec<PathBuf> = if index.exists() {
        shard_files(&index)?
            .into_iter()
            .map(|f| dir.join(f))
            .collect()
    } else if single.exists() {
        vec![single]
    } else {
        return Err(FormatError::malformed(
            dir,
            "no model.safetensors or model.safetensors.index.json in this directory",
        ));
    };
    open_files(&files)
}

/// The distinct shard file names of an index, in sorted order.
fn shard_files(index: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(index).map_err(|e| FormatError::io(index, e))?;
    parse_index(index, &text)
}

/// The distinct shard file names of the index text `text` (read from `index`), sorted.
pub fn parse_index(index: &Path, text: &str) -> Result<Vec<String>> {
    let json: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| FormatError::malformed(index, format!("invalid JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| FormatError::malformed(index, "no \"weight_map\" object"))?;
    let mut files = BTreeSet::new();
    for (tensor, file) in map {
        let f = file.as_str().ok_or_else(|| {
            FormatError::malformed(index, format!("weight_map[\"{tensor}\"] is not a string"))
        })?;
        if f.contains("..") || Path::new(f).is_absolute() {
            return Err(FormatError::malformed(
                index,
                format!("shard path '{f}' leaves the model directory"),
            ));
        }
        files.insert(f.to_string());
    }
    Ok(files.into_iter().collect())
}

/// Opens safetensors files as one store; a tensor name present in two files is an error.
pub fn open_files(files: &[PathBuf]) -> Result<TensorStore> {
    let mut maps = Vec::with_capacity(files.len());
    let mut infos: Vec<TensorInfo> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (source, path) in files.iter().enumerate() {
        let file = File::open(path).map_err(|e| FormatError::io(path, e))?;
        // SAFETY: read-only map; the file must not be truncated while the store lives.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| FormatError::io(path, e))?;
        for info in parse_file(path, &map, source)? {
            if !seen.insert(info.name.clone()) {
                return Err(FormatError::malformed(
                    path,
                    format!("tensor '{}' appears in two shards", info.name),
                ));
            }
            infos.push(info);
        }
        maps.push((path.clone(), map));
    }
    infos.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(TensorStore::from_parts(maps, infos))
}

/// One safetensors file held in memory (copied to an anonymous map) as a store.
pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<TensorStore> {
    let mut infos = parse_file(path, bytes, 0)?;
    infos.sort_by(|a, b| a.name.cmp(&b.name));
    let map = crate::store::anon_map(bytes).map_err(|e| FormatError::io(path, e))?;
    Ok(TensorStore::from_parts(
        vec![(path.to_path_buf(), map)],
        infos,
    ))
}

/// The tensor infos of one safetensors file's bytes `buf` (from `path`, shard number `source`),
/// each checked against the file's length.
pub(crate) fn parse_file(path: &Path, buf: &[u8], source: usize) -> Result<Vec<TensorInfo>> {
    let (header_len, meta) = SafeTensors::read_metadata(buf)
        .map_err(|e| FormatError::malformed(path, format!("not a valid safetensors file: {e}")))?;
    let data_start = 8 + header_len;
    let mut infos = Vec::new();
    for (name, info) in meta.tensors() {
        let dtype = map_dtype(info.dtype).ok_or_else(|| {
            FormatError::malformed(
                path,
                format!("tensor '{name}' has unsupported dtype {:?}", info.dtype),
            )
        })?;
        let (start, end) = info.data_offsets;
        let len = end.checked_sub(start);
        let n = info.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let fits = data_start.checked_add(end).is_some_and(|e| e <= buf.len());
        let Some(len) = len.filter(|&l| fits && n.and_then(|n| dtype.bytes_for(n)) == Some(l))
        else {
            return Err(FormatError::malformed(
                path,
                format!("tensor '{name}' has inconsistent size"),
            ));
        };
        infos.push(TensorInfo::new(
            name,
            dtype,
            info.shape.clone(),
            source,
            data_start + start,
            len,
        ));
    }
    Ok(infos)
}

fn map_dtype(d: Dtype) -> Option<GgmlType> {
    Some(match d {
        Dtype::F32 => GgmlType::F32,
        Dtype::F16 => GgmlType::F16,
        Dtype::BF16 => GgmlType::BF16,
        Dtype::F64 => GgmlType::F64,
        Dtype::I8 => GgmlType::I8,
        Dtype::I16 => GgmlType::I16,
        Dtype::I32 => GgmlType::I32,
        Dtype::I64 => GgmlType::I64,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_st(path: &Path, tensors: &[(&str, &[usize], &[f32])]) {
        let data: Vec<(String, Vec<u8>, Vec<usize>)> = tensors
            .iter()
            .map(|(n, s, v)| {
                (
                    n.to_string(),
                    v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                    s.to_vec(),
                )
            })
            .collect();
        let views: Vec<(String, safetensors::tensor::TensorView)> = data
            .iter()
            .map(|(n, b, s)| {
                (
                    n.clone(),
                    safetensors::tensor::TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
                )
            })
            .collect();
        safetensors::serialize_to_file(views, None, path).unwrap();
    }

    #[test]
    fn single_and_sharded_dirs_load() {
        let d = tempfile::tempdir().unwrap();
        write_st(
            &d.path().join("model.safetensors"),
            &[("a", &[2, 2], &[1., 2., 3., 4.])],
        );
        let s = open_dir(d.path()).unwrap();
        assert_eq!(
            s.require("a").unwrap().to_f32().unwrap(),
            vec![1., 2., 3., 4.]
        );

        let d = tempfile::tempdir().unwrap();
        write_st(&d.path().join("m-1.safetensors"), &[("a", &[2], &[1., 2.])]);
        write_st(&d.path().join("m-2.safetensors"), &[("b", &[1], &[5.])]);
        std::fs::write(
            d.path().join("model.safetensors.index.json"),
            r#"{"metadata": {}, "weight_map": {"a": "m-1.safetensors", "b": "m-2.safetensors"}}"#,
        )
        .unwrap();
        let s = open_dir(d.path()).unwrap();
        assert_eq!(s.require("b").unwrap().to_f32().unwrap(), vec![5.]);
        assert_eq!(s.require("a").unwrap().shape, &[2]);
        assert!(s
            .require("c")
            .unwrap_err()
            .to_string()
            .contains("missing tensor 'c'"));
    }

    #[test]
    fn corrupt_files_are_errors() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("model.safetensors");
        write_st(&p, &[("a", &[4], &[1., 2., 3., 4.])]);
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 3]).unwrap();
        let e = open_dir(d.path()).err().unwrap().to_string();
        assert!(e.contains("model.safetensors"), "{e}");
        std::fs::write(&p, b"garbage").unwrap();
        assert!(open_dir(d.path()).is_err());
        let empty = tempfile::tempdir().unwrap();
        assert!(open_dir(empty.path())
            .err()
            .unwrap()
            .to_string()
            .contains("no model.safetensors"));
    }
}
