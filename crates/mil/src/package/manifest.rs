//! `Manifest.json` of a `.mlpackage` (COREML.md §2; coremltools `modelpackage/src/ModelPackage.cpp`).

use crate::error::{MilError, Result};
use serde_json::{json, Value};
use std::path::Path;

pub const AUTHOR: &str = "com.apple.CoreML";
pub const MODEL_FILE: &str = "model.mlmodel";
pub const WEIGHTS_DIR: &str = "weights";

/// A deterministic UUID-shaped identifier derived from `seed` (so equal programs give equal
/// packages, which the compiled-program cache relies on). Version-4 / RFC 4122 variant bits set.
fn identifier(seed: &[u8], salt: u64) -> String {
    let fnv = |basis: u64| {
        seed.iter().fold(basis ^ salt, |h, &b| {
            (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
        })
    };
    let hi = fnv(0xcbf2_9ce4_8422_2325);
    let lo = fnv(0x8422_2325_cbf2_9ce4).rotate_left(29) ^ hi.rotate_right(17);
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&hi.to_be_bytes());
    b[8..].copy_from_slice(&lo.to_be_bytes());
    b[6] = (b[6] & 0x0F) | 0x40;
    b[8] = (b[8] & 0x3F) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02X}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The manifest for a package whose model bytes are `model` (and a weights dir if `weights`).
pub fn manifest_json(model: &[u8], weights: bool) -> String {
    let root = identifier(model, 1);
    let mut entries = serde_json::Map::new();
    entries.insert(
        root.clone(),
        json!({"author": AUTHOR, "description": "CoreML Model Specification",
               "name": MODEL_FILE, "path": format!("{AUTHOR}/{MODEL_FILE}")}),
    );
    if weights {
        entries.insert(
            identifier(model, 2),
            json!({"author": AUTHOR, "description": "CoreML Model Weights",
                   "name": WEIGHTS_DIR, "path": format!("{AUTHOR}/{WEIGHTS_DIR}")}),
        );
    }
    let m = json!({"fileFormatVersion": "1.0.0", "itemInfoEntries": entries, "rootModelIdentifier": root});
    // Serializing a json Value cannot fail.
    serde_json::to_string_pretty(&m).unwrap_or_default() + "\n"
}

/// Paths (relative to `Data/`) of the root model item and the weights item, read from a manifest.
pub struct ManifestItems {
    pub model: String,
    pub weights: Option<String>,
}

pub fn read_manifest(path: &Path) -> Result<ManifestItems> {
    let fail = |msg: String| MilError::format(path, msg);
    let text = std::fs::read_to_string(path).map_err(|e| MilError::io(path, e))?;
    let m: Value = serde_json::from_str(&text).map_err(|e| fail(format!("not JSON: {e}")))?;
    let version = m["fileFormatVersion"]
        .as_str()
        .ok_or_else(|| fail("no fileFormatVersion".into()))?;
    let parts: Vec<u32> = version
        .split('.')
        .map(|p| p.parse().unwrap_or(u32::MAX))
        .collect();
    if parts.len() != 3 || parts > vec![1, 0, 0] {
        return Err(fail(format!("unsupported fileFormatVersion {version}")));
    }
    let entries = m["itemInfoEntries"]
        .as_object()
        .ok_or_else(|| fail("no itemInfoEntries".into()))?;
    let root = m["rootModelIdentifier"]
        .as_str()
        .ok_or_else(|| fail("no rootModelIdentifier".into()))?;
    let path_of = |e: &Value| e["path"].as_str().map(str::to_string);
    let model = entries
        .get(root)
        .and_then(path_of)
        .ok_or_else(|| fail(format!("root item {root} has no path")))?;
    let weights = entries
        .values()
        .find(|e| e["name"] == WEIGHTS_DIR && e["author"] == AUTHOR)
        .and_then(path_of);
    Ok(ManifestItems { model, weights })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_uuid_shaped_deterministic_and_distinct() {
        let a = identifier(b"model", 1);
        assert_eq!(a, identifier(b"model", 1));
        assert_ne!(a, identifier(b"model", 2));
        assert_ne!(a, identifier(b"other", 1));
        let groups: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12]);
        assert_eq!(&a[14..15], "4");
    }
}
