//! What a device compiles: one MIL program in the form the private path takes (MIL text and the
//! weight blob files it names, one file per tensor — the most widely hardware-proven layout,
//! FACTS §2) and in memory (for back ends that write a Core ML package instead).

use std::path::Path;

use anelm_mil::blob::{BlobPolicy, MODEL_PATH_PREFIX};
use anelm_mil::{MilError, Program};
use sha2::{Digest, Sha256};

/// One weight blob file: its path as the MIL text names it (`@model_path/weights/w.bin`) and
/// its content (storage v2), made from the program's weights when it is read — a unit does not
/// hold its weights twice.
#[derive(Clone, Debug)]
pub struct WeightFile {
    pub path: String,
    content: Content,
}

#[derive(Clone, Debug)]
enum Content {
    Planned(anelm_mil::blob::PlannedFile),
    Bytes(Vec<u8>),
}

impl WeightFile {
    /// The file's bytes.
    pub fn bytes(&self) -> Vec<u8> {
        match &self.content {
            Content::Planned(f) => f.to_bytes(),
            Content::Bytes(b) => b.clone(),
        }
    }

    /// Writes the file's bytes to `out`.
    pub fn write_to<W: std::io::Write>(&self, out: &mut W) -> std::io::Result<()> {
        match &self.content {
            Content::Planned(f) => f.write_to(out),
            Content::Bytes(b) => out.write_all(b),
        }
    }

    /// The file's size in bytes.
    pub fn len(&self) -> u64 {
        match &self.content {
            Content::Planned(f) => f.size,
            Content::Bytes(b) => b.len() as u64,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Replaces the content with `bytes` (tests use it to corrupt a file).
    pub fn set_bytes(&mut self, bytes: Vec<u8>) {
        self.content = Content::Bytes(bytes);
    }
}

#[derive(Debug)]
pub struct CompileUnit {
    /// A name for files and messages (`layer03_ffn`).
    pub name: String,
    pub program: Program,
    /// The program as MIL text (dialect A, FACTS §1.1).
    pub text: String,
    pub weights: Vec<WeightFile>,
    /// What the lowering made of each weight tensor the program holds (its encoding, bytes and
    /// error against the file).
    pub weight_reports: Vec<crate::lower::TensorReport>,
}

/// An environment variable whose value, when set, goes into every program's `buildInfo`: the
/// programs then differ from any compiled before, so neither our cache nor the OS's compiler
/// cache serves them — how `scripts/mac-hardware-check.sh` measures a cold compile.
pub const SALT_VAR: &str = "ANELM_PROGRAM_SALT";

impl CompileUnit {
    pub fn new(name: &str, program: Program) -> Result<CompileUnit, MilError> {
        let salt = std::env::var(SALT_VAR).ok().filter(|s| !s.is_empty());
        Self::salted(name, program, salt)
    }

    /// [`CompileUnit::new`] with `salt` (if any) in the program's `buildInfo`.
    pub fn salted(
        name: &str,
        mut program: Program,
        salt: Option<String>,
    ) -> Result<CompileUnit, MilError> {
        if let Some(salt) = salt {
            if !program.build_info.is_empty() {
                program.build_info.push(("anelm-salt".into(), salt));
            }
        }
        let art = anelm_mil::text::to_artifacts(&program, &BlobPolicy::PerTensor)?;
        let weights = art
            .layout
            .files()
            .iter()
            .map(|f| WeightFile {
                path: f.mil_path(),
                content: Content::Planned(f.clone()),
            })
            .collect();
        Ok(CompileUnit {
            name: name.to_string(),
            program,
            text: art.text,
            weights,
            weight_reports: Vec::new(),
        })
    }

    /// The unit with the lowering's report of its weight tensors.
    pub fn with_weight_reports(mut self, r: Vec<crate::lower::TensorReport>) -> CompileUnit {
        self.weight_reports = r;
        self
    }

    /// The key of the compiled-program cache: SHA-256 of the MIL text and of every weight file
    /// (path and bytes), hex. Equal keys mean byte-identical compiler input.
    pub fn cache_key(&self) -> String {
        let mut h = Sha256::new();
        let field = |h: &mut Sha256, b: &[u8]| {
            h.update((b.len() as u64).to_le_bytes());
            h.update(b);
        };
        field(&mut h, b"anelm-compile-unit-1");
        field(&mut h, self.text.as_bytes());
        for w in &self.weights {
            field(&mut h, w.path.as_bytes());
            h.update(w.len().to_le_bytes());
            // Hashing cannot fail; the file streams through without being held.
            let _ = w.write_to(&mut h);
        }
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Bytes of weight files.
    pub fn weight_bytes(&self) -> u64 {
        self.weights.iter().map(WeightFile::len).sum()
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
            let mut out =
                std::io::BufWriter::new(std::fs::File::create(&p).map_err(|e| io(&p, e))?);
            w.write_to(&mut out)
                .and_then(|()| std::io::Write::flush(&mut out))
                .map_err(|e| io(&p, e))?;
        }
        Ok(())
    }
}

impl CompileUnit {
    /// The unit `name` from a directory [`CompileUnit::write_mil_dir`] wrote: the text as it was
    /// (the program parsed from it, weights not loaded into it: what a device needs of it is
    /// the I/O) and the weight files it names, byte for byte.
    pub fn read_mil_dir(dir: &Path, name: &str) -> Result<CompileUnit, MilError> {
        let model = dir.join(anelm_mil::text::MODEL_FILE);
        let text = std::fs::read_to_string(&model).map_err(|e| MilError::io(&model, e))?;
        let program = anelm_mil::text::parse_program(&text).map_err(|e| match e {
            MilError::Parse { line, col, msg } => {
                MilError::format(&model, format!("{line}:{col}: {msg}"))
            }
            other => other,
        })?;
        let mut weights = Vec::new();
        for path in anelm_macos::staging::blobfile_paths(&text) {
            let rel = anelm_macos::staging::relative_path(path)
                .map_err(|e| MilError::format(&model, e.to_string()))?;
            let p = dir.join(rel);
            let bytes = std::fs::read(&p).map_err(|e| MilError::io(&p, e))?;
            weights.push(WeightFile {
                path: path.to_string(),
                content: Content::Bytes(bytes),
            });
        }
        Ok(CompileUnit {
            name: name.to_string(),
            program,
            text,
            weights,
            weight_reports: Vec::new(),
        })
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
    fn a_salt_changes_the_text_and_key_not_the_program() {
        let plain = unit(0.5);
        let program = || {
            let mut f = FunctionBuilder::new("main", Opset::Ios18);
            let x = f.input("x", TensorType::fp16([1, 4, 1, 64])).unwrap();
            let w = (f.weight(
                "w",
                TensorType::fp16([4, 4, 1, 1]),
                WeightData::f16_from_f32(&[0.5; 16]),
            ))
            .unwrap();
            let y = f.name_next("y").conv1x1(x, w).unwrap();
            f.output(y).unwrap();
            Program::single(f.finish().unwrap())
        };
        let salted = CompileUnit::salted("t", program(), Some("run-7".into())).unwrap();
        assert_ne!(salted.text, plain.text);
        assert!(
            salted.text.contains("\"anelm-salt\", \"run-7\""),
            "{}",
            salted.text
        );
        assert_ne!(salted.cache_key(), plain.cache_key());
        let unsalted = CompileUnit::salted("t", program(), None).unwrap();
        assert_eq!(unsalted.cache_key(), plain.cache_key());
        let p = anelm_mil::text::parse_program(&salted.text).unwrap();
        assert_eq!(
            p.functions[0].ops().len(),
            plain.program.functions[0].ops().len()
        );
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
        let back = CompileUnit::read_mil_dir(d.path(), "t").unwrap();
        assert_eq!(back.cache_key(), u.cache_key(), "the same compiler input");
        assert_eq!(back.program.functions[0].inputs().len(), 1);
        std::fs::remove_file(d.path().join("weights/w.bin")).unwrap();
        let e = CompileUnit::read_mil_dir(d.path(), "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("w.bin"), "{e}");
    }
}
