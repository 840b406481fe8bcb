//! MIL text: the form the private in-memory path compiles (FACTS §1).
mod lex;
mod number;
mod parse;
mod print;

pub use parse::parse_program;
pub use print::{print_program, HEADER_A, HEADER_B};

use crate::blob::{BlobLayout, BlobPolicy};
use crate::error::{MilError, Result};
use crate::ir::Program;
use std::path::Path;

/// File name of the MIL text in a model directory (what the private path stages as `model.mil`).
pub const MODEL_FILE: &str = "model.mil";

/// The private-path form of a program: MIL text plus the blob files its `BLOBFILE`s name.
#[derive(Debug, Clone)]
pub struct MilArtifacts {
    pub text: String,
    pub layout: BlobLayout,
}

/// Plans the weight files of `program` under `policy` and prints the text that references them.
pub fn to_artifacts(program: &Program, policy: &BlobPolicy) -> Result<MilArtifacts> {
    let layout = BlobLayout::plan(program, policy);
    let text = print_program(program, &layout)?;
    Ok(MilArtifacts { text, layout })
}

/// Writes `dir/model.mil` and `dir/weights/*.bin` (`dir` is what `@model_path` names).
pub fn write_model_dir(program: &Program, dir: &Path, policy: &BlobPolicy) -> Result<MilArtifacts> {
    let art = to_artifacts(program, policy)?;
    std::fs::create_dir_all(dir).map_err(|e| MilError::io(dir, e))?;
    let path = dir.join(MODEL_FILE);
    std::fs::write(&path, &art.text).map_err(|e| MilError::io(&path, e))?;
    art.layout.write_files(dir)?;
    Ok(art)
}

/// Reads `dir/model.mil` and loads every blob it references from `dir`.
pub fn read_model_dir(dir: &Path) -> Result<Program> {
    let path = dir.join(MODEL_FILE);
    let src = std::fs::read_to_string(&path).map_err(|e| MilError::io(&path, e))?;
    let mut program = parse_program(&src).map_err(|e| match e {
        MilError::Parse { line, col, msg } => {
            MilError::format(&path, format!("{line}:{col}: {msg}"))
        }
        other => other,
    })?;
    crate::blob::load_blobs(&mut program, dir)?;
    Ok(program)
}
