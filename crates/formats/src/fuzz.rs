//! Fuzz entry points: one `fn(&[u8])` per parser, called by the libFuzzer harnesses in `fuzz/` and
//! by the corpus replay tests. Each must return (any `Result`) and never panic, hang or over-allocate.

use std::path::Path;

use crate::{gguf, quant, safetensors, GgmlType};

/// Elements dequantised per tensor at most: enough to run every block decoder over its blocks
/// without letting a 1-bit type expand a file 20-fold into f32.
pub const MAX_DEQUANT_ELEMS: usize = 1 << 16;

/// GGUF: header, metadata, tensor infos, then the typed accessors and the dequantisation of
/// (the first [`MAX_DEQUANT_ELEMS`] elements of) every tensor the file declares.
pub fn gguf(data: &[u8]) {
    let path = Path::new("fuzz.gguf");
    let Ok((_, meta, infos)) = gguf::parse(path, data) else {
        return;
    };
    for (key, _) in meta.entries() {
        let _ = meta.usize_opt(key);
        let _ = meta.f32_opt(key);
        let _ = meta.str_opt(key);
        let _ = meta.byte_strings_opt(key);
        let _ = meta.f32_array_opt(key);
        let _ = meta.i64_array_opt(key);
    }
    for info in &infos {
        let bytes = &data[info.byte_range()];
        dequantize_prefix(info.dtype, bytes);
    }
}

/// Dequantises whole blocks from the start of `bytes`, at most [`MAX_DEQUANT_ELEMS`] elements.
fn dequantize_prefix(dtype: GgmlType, bytes: &[u8]) {
    let blocks = (bytes.len() / dtype.block_bytes()).min(MAX_DEQUANT_ELEMS / dtype.block_elems());
    let mut out = vec![0f32; blocks * dtype.block_elems()];
    quant::dequantize(dtype, &bytes[..blocks * dtype.block_bytes()], &mut out)
        .expect("whole blocks dequantise");
}

/// Raw block bytes for every quantisation type: the first byte picks the type, the rest are its
/// blocks (a partial last block is dropped). Reaches block decoders no GGUF header stands before.
pub fn dequant(data: &[u8]) {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let dtype = GgmlType::ALL[first as usize % GgmlType::ALL.len()];
    dequantize_prefix(dtype, rest);
}

/// One safetensors file's header and tensor table.
pub fn safetensors(data: &[u8]) {
    if let Ok(infos) = safetensors::parse_file(Path::new("fuzz.safetensors"), data, 0) {
        for info in infos {
            assert!(info.byte_range().end <= data.len(), "tensor past the end");
        }
    }
}

/// A `model.safetensors.index.json`.
pub fn safetensors_index(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = safetensors::parse_index(Path::new("model.safetensors.index.json"), text);
    }
}
