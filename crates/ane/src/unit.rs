//! What a device compiles: one MIL program in the form the private path takes (MIL text and the
//! weight blob files it names, one file per tensor — the most widely hardware-proven layout,
//! FACTS §2) and in memory (for back ends that write a Core ML package instead).

use std::path::Path;

use anelm_mil::blob::{BlobPolicy, MODEL_PATH_PREFIX};
use anelm_mil::{MilError, Program};
use sha2::{Digest, Sha256};

/// One weight blob file: its path as the MIL text names it (`@model_path/weights/w.bin`) and
/// its bytes (storage v2).
#[derive(Clone, Debug)]
pub struct WeightFile {
    pub path: String,
    pub bytes: Vec<u8>,
}

#[derive(Debug)]
pub struct CompileUnit {
    /// A name for files and messages (`layer03_ffn`).
    pub name: String,
    pub program: Program,
    /// The program as MIL text (dialect A, FACTS §1.1).
    pub text: String,
    pub weights: Vec<WeightFile>,
}

impl CompileUnit {
    pub fn new(name: &str, program: Program) -> Result<CompileUnit, MilError> {
        let art = anelm_mil::text::to_artifacts(&program, &BlobPolicy::PerTensor)?;
        let weights = art
            .layout
            .files()
            .iter()
            .map(|f| WeightFile {
                path: f.mil_path(),
                bytes: f.to_bytes(),
            })
            .collect();
        Ok(CompileUnit {
            name: name.to_string(),
            program,
            text: art.text,
            weights,
        })
    }

    /// The key of the compiled-program cache: SHA-256 of the MIL text and of every weight file
    /// (path and bytes), hex. Equal keys mean byte-identical compiler input.
    pub fn cache_key(&self) -> String {
        let mut h = Sha256::new();
        let mut field = |b: &[u8]| {
            h.update((b.len() as u64).to_le_bytes());
            h.update(b);
        };
        field(b"anelm-compile-unit-1");
        field(self.text.as_bytes());
        for w in &self.weights {
            field(w.path.as_bytes());
            field(&w.bytes);
        }
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Bytes of weight files.
    pub fn weight_bytes(&self) -> u64 {
        self.weights.iter().map(|w| w.bytes.len() as u64).sum()
    }

    /// Writes `dir/model.mil` and the weight files beside it (`dir` is what `@model_path`
    /// names) — the directory the private path stages before compiling (FACTS §3.3).
    pub fn write_mil_dir(&self, dir: &Path) -> Result<(), MilError> {
        let io = |p: &Path, e| MilError::io(p, e);
        let model = dir.join(anelm_mil::text::MODEL_FILE);
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        std::fs::write(&model, &self.text).map_err(|e| io(&model, e))?;
        for w in &self.weights {
            let rel = w.path.strip_prefix(MODEL_PATH_PREFIX).ok_or_else(|| {
                MilError::invalid(format!(
                    "weight path {} is not under {MODEL_PATH_PREFIX}",
                    w.path
                ))
            })?;
            let p = dir.join(rel);
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
            }
            std::fs::write(&p, &w.bytes).map_err(|e| io(&p, e))?;
        }
        Ok(())
    }
}

/// The Core ML packages that hold `program`: `(None, program)` — one package, multifunction
/// when it has several functions — if its opset allows (multifunction needs iOS18 / spec 9,
/// COREML.md §7); else one single-function package per function, its function renamed `main`:
/// `(Some(original name), program)`. Dialect B's packages do not share weights between
/// functions.
pub fn coreml_packages(program: &Program) -> Vec<(Option<String>, Program)> {
    let multi_ok = program
        .functions
        .iter()
        .all(|f| f.opset >= anelm_mil::Opset::Ios18);
    if multi_ok || (program.functions.len() == 1 && program.functions[0].name == "main") {
        return vec![(None, program.clone())];
    }
    program
        .functions
        .iter()
        .map(|f| {
            let mut one = Program::new(program.dialect.clone());
            one.build_info = program.build_info.clone();
            let mut f = f.clone();
            let name = std::mem::replace(&mut f.name, "main".into());
            one.functions.push(f);
            (Some(name), one)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use anelm_mil::{FunctionBuilder, Opset, TensorType, WeightData};

    fn unit(w: f32) -> CompileUnit {
        let mut f = FunctionBuilder::new("main", Opset::Ios18);
        let x = f.input("x", TensorType::fp16([1, 4, 1, 64])).unwrap();
        let wt = f
            .weight(
                "w",
                TensorType::fp16([4, 4, 1, 1]),
                WeightData::f16_from_f32(&[w; 16]),
            )
            .unwrap();
        let y = f.name_next("y").conv1x1(x, wt).unwrap();
        f.output(y).unwrap();
        CompileUnit::new("t", Program::single(f.finish().unwrap())).unwrap()
    }

    #[test]
    fn key_covers_text_and_weights() {
        let (a, b, c) = (unit(0.5), unit(0.5), unit(0.25));
        assert_eq!(a.cache_key(), b.cache_key());
        assert_ne!(a.cache_key(), c.cache_key(), "same text, other weights");
        assert_eq!(a.text, c.text);
        assert_eq!(a.weights[0].path, "@model_path/weights/w.bin");
        assert_eq!(a.cache_key().len(), 64);
    }

    #[test]
    fn packages_split_only_below_ios18() {
        let two = |opset| {
            let mut p = Program::new(if opset == Opset::Ios16 {
                anelm_mil::Dialect::b()
            } else {
                anelm_mil::Dialect::a()
            });
            for name in ["prefill", "decode"] {
                let mut f = FunctionBuilder::new(name, opset);
                let x = f.input("x", TensorType::fp16([1, 4, 1, 64])).unwrap();
                let y = f.name_next("y").sigmoid(x).unwrap();
                f.output(y).unwrap();
                p.add_function(f.finish().unwrap()).unwrap();
            }
            p
        };
        let a = coreml_packages(&two(Opset::Ios18));
        assert_eq!(a.len(), 1);
        assert_eq!((a[0].0.as_deref(), a[0].1.functions.len()), (None, 2));
        let b = coreml_packages(&two(Opset::Ios16));
        let names: Vec<_> = b
            .iter()
            .map(|(n, p)| (n.as_deref(), p.functions[0].name.as_str()))
            .collect();
        assert_eq!(names, [(Some("prefill"), "main"), (Some("decode"), "main")]);
        assert!(b
            .iter()
            .all(|(_, p)| p.functions.len() == 1 && p.dialect.version == "1.0"));
        let one = coreml_packages(&unit(0.5).program);
        assert_eq!((one.len(), one[0].0.as_deref()), (1, None));
    }

    #[test]
    fn mil_dir_reads_back() {
        let d = tempfile::tempdir().unwrap();
        let u = unit(0.5);
        u.write_mil_dir(d.path()).unwrap();
        let p = anelm_mil::text::read_model_dir(d.path()).unwrap();
        assert_eq!(
            p.functions[0].ops().len(),
            u.program.functions[0].ops().len()
        );
    }
}
