//! Core ML `.mlpackage` writer and reader (COREML.md):
//!
//! ```text
//! Foo.mlpackage/
//!   Manifest.json
//!   Data/com.apple.CoreML/model.mlmodel        CoreML.Specification.Model (ML Program)
//!   Data/com.apple.CoreML/weights/weight.bin   blob storage v2 (absent without weights)
//! ```
//!
//! Single-function programs need a function named `main` (described at the top level);
//! several functions become a multifunction model (spec 9) whose functions share weight blobs
//! when their consts hold the same `Arc<WeightData>`. State inputs become iOS18 states.

mod manifest;
pub mod proto;
mod read;
mod write;

pub use read::program_from_model;
pub use write::{model_proto, PackageOptions};

use crate::blob::{load_blobs, BlobLayout, BlobPolicy};
use crate::error::{MilError, Result};
use crate::ir::Program;
use crate::literal::{BlobSource, Literal};
use manifest::{manifest_json, read_manifest, AUTHOR, MODEL_FILE};
use prost::Message;
use std::path::Path;

/// Writes `program` as a `.mlpackage` directory at `path` (replacing nothing: `path` must not
/// exist yet). Weights go to `Data/com.apple.CoreML/weights/` per `policy`.
pub fn write_package(
    program: &Program,
    path: &Path,
    opts: &PackageOptions,
    policy: &BlobPolicy,
) -> Result<()> {
    if path.exists() {
        return Err(MilError::format(path, "already exists"));
    }
    if let Some((path, offset)) = unloaded_blob(program) {
        return Err(MilError::invalid(format!(
            "weight {path} at offset {offset} is a reference without data; load the blobs first (blob::load_blobs)"
        )));
    }
    let layout = BlobLayout::plan(program, policy);
    let model = model_proto(program, &layout, opts)?.encode_to_vec();
    let data = path.join("Data").join(AUTHOR);
    std::fs::create_dir_all(&data).map_err(|e| MilError::io(&data, e))?;
    let model_path = data.join(MODEL_FILE);
    std::fs::write(&model_path, &model).map_err(|e| MilError::io(&model_path, e))?;
    // BLOBFILE paths are `@model_path/weights/...`; the package keeps weights/ beside model.mlmodel.
    layout.write_files(&data)?;
    let manifest = path.join("Manifest.json");
    std::fs::write(&manifest, manifest_json(&model, !layout.files().is_empty()))
        .map_err(|e| MilError::io(&manifest, e))?;
    Ok(())
}

/// The first `BLOBFILE` reference whose data is not in memory (a package must carry its weights).
fn unloaded_blob(program: &Program) -> Option<(String, u64)> {
    program
        .functions
        .iter()
        .flat_map(|f| f.ops())
        .flat_map(|op| op.literals())
        .find_map(|l| match l {
            Literal::Blob {
                source: BlobSource::File { path, offset },
                ..
            } => Some((path.clone(), *offset)),
            _ => None,
        })
}

/// Reads a `.mlpackage` written by [`write_package`] (or within its subset) back into a
/// Program, with its weights loaded.
pub fn read_package(path: &Path) -> Result<Program> {
    let items = read_manifest(&path.join("Manifest.json"))?;
    let model_path = path.join("Data").join(&items.model);
    let bytes = std::fs::read(&model_path).map_err(|e| MilError::io(&model_path, e))?;
    let model = proto::Model::decode(bytes.as_slice())
        .map_err(|e| MilError::format(&model_path, format!("not a Core ML model protobuf: {e}")))?;
    let mut program = program_from_model(&model).map_err(|e| match e {
        MilError::Invalid(m) => MilError::format(&model_path, m),
        other => other,
    })?;
    // `@model_path` is the directory holding model.mlmodel and weights/.
    let model_dir = model_path.parent().unwrap_or(path);
    if let Some(w) = &items.weights {
        let expected = path.join("Data").join(w);
        if expected != model_dir.join("weights") {
            return Err(MilError::format(
                path,
                format!("weights item at Data/{w}, expected beside the model"),
            ));
        }
    }
    load_blobs(&mut program, model_dir)?;
    Ok(program)
}
