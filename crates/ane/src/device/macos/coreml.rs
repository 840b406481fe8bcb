//! The ANE through Core ML as a [`Device`]: a unit's program is written as a `.mlpackage`,
//! compiled, and loaded for CPU_AND_NE — one `MLModel` per function (COREML.md §7), an
//! `MLState` per binding for stateful functions (COREML.md §8). Buffers are ours, laid out like
//! the ANE's; input arrays wrap them without a copy, outputs are copied back from inside
//! `-[MLMultiArray getMutableBytesWithHandler:]` with the strides that handler reports
//! (`anelm_macos::Prediction::copy_output`), not through the deprecated `dataPointer`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use anelm_macos::{CompiledModel, CoreMl, Input, MacError, MlModel, MlState, Planar};
use anelm_mil::blob::BlobPolicy;
use anelm_mil::package::{write_package, PackageOptions};

use super::{declared, elem_type, error, io_type};
use crate::device::{Device, DeviceError, IoLayout, KernelIo, Stage};
use crate::unit::CompileUnit;

const NAME: &str = "coreml";

/// The Core ML driver. Opening it off a Mac is [`MacError::Unavailable`].
#[derive(Debug)]
pub struct CoreMlDevice {
    driver: CoreMl,
    /// The program cache's tag: this driver, the chip, the OS build.
    tag: String,
}

/// In a program-cache entry: the compiled model (one package; `model-<function>.mlmodelc` per
/// function where the dialect has no multifunction packages).
const COMPILED_DIR: &str = "model.mlmodelc";

/// The cache entry's directory for the package of `function` (`None`: the one package).
fn compiled_dir(function: Option<&str>) -> String {
    function.map_or(COMPILED_DIR.to_string(), |f| format!("model-{f}.mlmodelc"))
}
/// In a program-cache entry: the program's MIL text (weights not kept), for its declared I/O.
const PROGRAM_FILE: &str = "program.mil";

impl CoreMlDevice {
    pub fn open() -> Result<CoreMlDevice, MacError> {
        let driver = CoreMl::open()?;
        Ok(CoreMlDevice {
            driver,
            tag: super::machine_tag(NAME),
        })
    }

    /// Loads every function of the compiled packages (from [`crate::unit::coreml_packages`]:
    /// `None` is the one package of every function, `Some(f)` the package of function `f`),
    /// with the I/O the program declares.
    fn load_functions(
        &self,
        name: &str,
        program: &anelm_mil::Program,
        compiled: Vec<(Option<String>, CompiledModel)>,
    ) -> Result<CoreMlKernel, DeviceError> {
        let fail = |m: String| error(NAME, Stage::Compile, name, m);
        let mut decls = Vec::new();
        for f in &program.functions {
            decls.push(declared(f).map_err(&fail)?);
        }
        let several = decls.len() > 1;
        let mut functions = Vec::with_capacity(decls.len());
        for (decl, states) in decls {
            let (package, model) = compiled
                .iter()
                .find(|(f, _)| f.as_deref().is_none_or(|f| f == decl.name))
                .ok_or_else(|| fail(format!("no compiled package for function {}", decl.name)))?;
            // A function's own package holds it as `main`, the only function.
            let function = (several && package.is_none()).then_some(decl.name.as_str());
            let model = self
                .driver
                .load(model, function)
                .map_err(|e| fail(e.to_string()))?;
            let layout = |t: &anelm_macos::DeclaredTensor| {
                IoLayout::ane(&t.name, io_type(t.dtype), t.channels, t.width)
            };
            let io = KernelIo {
                function: decl.name.clone(),
                inputs: decl.inputs.iter().map(layout).collect(),
                outputs: decl.outputs.iter().map(layout).collect(),
            };
            functions.push(Function {
                io,
                stateful: !states.is_empty(),
                model,
            });
        }
        Ok(CoreMlKernel {
            name: name.to_string(),
            functions,
            compiled,
        })
    }
}

/// Copies the directory tree `from` to `to` (which must not exist).
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let dst = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_tree(&e.path(), &dst)?;
        } else {
            std::fs::copy(e.path(), dst)?;
        }
    }
    Ok(())
}

struct Function {
    io: KernelIo,
    stateful: bool,
    model: MlModel,
}

pub struct CoreMlKernel {
    name: String,
    functions: Vec<Function>,
    /// Kept until the models are gone (declared last: dropped last): one per package.
    compiled: Vec<(Option<String>, CompiledModel)>,
}

pub struct CoreMlBinding {
    function: usize,
    inputs: Vec<Vec<u8>>,
    outputs: Vec<Vec<u8>>,
    state: Option<MlState>,
}

fn planar(l: &IoLayout) -> Planar {
    Planar {
        dtype: elem_type(l.dtype),
        channels: l.channels,
        width: l.width,
        channel_stride: l.row_stride,
    }
}

/// A fresh directory for one package.
fn scratch_dir(unit: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    std::env::temp_dir().join(format!(
        "anelm-coreml-{}-{}-{unit}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

impl Device for CoreMlDevice {
    type Kernel = CoreMlKernel;
    type Binding = CoreMlBinding;

    fn name(&self) -> &str {
        NAME
    }

    fn compile(&mut self, unit: &CompileUnit) -> Result<CoreMlKernel, DeviceError> {
        let fail = |m: String| error(NAME, Stage::Compile, &unit.name, m);
        // Refuse I/O the driver cannot bind before compiling anything.
        for f in &unit.program.functions {
            declared(f).map_err(&fail)?;
        }
        // One package, or one per function where the opset has no multifunction (dialect B).
        let mut compiled = Vec::new();
        for (function, program) in crate::unit::coreml_packages(&unit.program) {
            let dir = scratch_dir(&unit.name);
            let stem = function
                .as_deref()
                .map_or(unit.name.clone(), |f| format!("{}_{f}", unit.name));
            let package = dir.join(format!("{stem}.mlpackage"));
            let done = write_package(
                &program,
                &package,
                &PackageOptions::default(),
                &BlobPolicy::default(),
            )
            .map_err(|e| fail(e.to_string()))
            .and_then(|()| {
                self.driver
                    .compile(&package)
                    .map_err(|e| fail(e.to_string()))
            });
            let _ = std::fs::remove_dir_all(&dir);
            compiled.push((function, done?));
        }
        self.load_functions(&unit.name, &unit.program, compiled)
    }

    fn cache_tag(&self) -> String {
        self.tag.clone()
    }

    /// The compiled `.mlmodelc` (what `modelWithContentsOfURL:` loads without compiling) and
    /// the program's text for its declared I/O.
    fn save_compiled(
        &self,
        kernel: &CoreMlKernel,
        unit: &CompileUnit,
        dir: &Path,
    ) -> Result<bool, DeviceError> {
        let fail = |m: String| error(NAME, Stage::Compile, &unit.name, m);
        for (function, compiled) in &kernel.compiled {
            copy_tree(
                compiled.path(),
                &dir.join(compiled_dir(function.as_deref())),
            )
            .map_err(|e| {
                fail(format!(
                    "copying {} into the program cache: {e}",
                    compiled.path().display()
                ))
            })?;
        }
        std::fs::write(dir.join(PROGRAM_FILE), &unit.text)
            .map_err(|e| fail(format!("{PROGRAM_FILE}: {e}")))?;
        Ok(true)
    }

    fn load_compiled(&mut self, dir: &Path, unit_name: &str) -> Result<CoreMlKernel, DeviceError> {
        let fail = |m: String| error(NAME, Stage::Compile, unit_name, m);
        let text = std::fs::read_to_string(dir.join(PROGRAM_FILE))
            .map_err(|e| fail(format!("{PROGRAM_FILE}: {e}")))?;
        let program = anelm_mil::text::parse_program(&text)
            .map_err(|e| fail(format!("{PROGRAM_FILE}: {e}")))?;
        let compiled = crate::unit::coreml_packages(&program)
            .into_iter()
            .map(|(function, _)| {
                let at = CompiledModel::at(&dir.join(compiled_dir(function.as_deref())));
                (function, at)
            })
            .collect();
        self.load_functions(unit_name, &program, compiled)
    }

    fn io<'k>(&self, kernel: &'k CoreMlKernel, function: &str) -> Option<&'k KernelIo> {
        kernel
            .functions
            .iter()
            .map(|f| &f.io)
            .find(|io| io.function == function)
    }

    fn bind(
        &mut self,
        kernel: &CoreMlKernel,
        function: &str,
    ) -> Result<CoreMlBinding, DeviceError> {
        let fail = |m: String| error(NAME, Stage::Bind, &kernel.name, m);
        let index = kernel
            .functions
            .iter()
            .position(|f| f.io.function == function)
            .ok_or_else(|| fail(format!("no function {function}")))?;
        let f = &kernel.functions[index];
        let state = if f.stateful {
            Some(f.model.new_state().map_err(|e| fail(e.to_string()))?)
        } else {
            None
        };
        let zeros = |ls: &[IoLayout]| ls.iter().map(|l| vec![0u8; l.size]).collect();
        Ok(CoreMlBinding {
            function: index,
            inputs: zeros(&f.io.inputs),
            outputs: zeros(&f.io.outputs),
            state,
        })
    }

    fn write_input<R>(
        &mut self,
        binding: &mut CoreMlBinding,
        index: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> R {
        f(&mut binding.inputs[index])
    }

    fn read_output<R>(
        &self,
        binding: &CoreMlBinding,
        index: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> R {
        f(&binding.outputs[index])
    }

    fn evaluate(
        &mut self,
        kernel: &CoreMlKernel,
        binding: &mut CoreMlBinding,
        _live_columns: usize,
    ) -> Result<(), DeviceError> {
        let fail = |m: String| error(NAME, Stage::Evaluate, &kernel.name, m);
        let f = &kernel.functions[binding.function];
        let mut inputs: Vec<Input> =
            f.io.inputs
                .iter()
                .zip(binding.inputs.iter_mut())
                .map(|(l, bytes)| Input {
                    name: &l.name,
                    layout: planar(l),
                    bytes,
                })
                .collect();
        let prediction = f
            .model
            .predict(&mut inputs, binding.state.as_ref())
            .map_err(|e| fail(e.to_string()))?;
        for (l, out) in f.io.outputs.iter().zip(binding.outputs.iter_mut()) {
            prediction
                .copy_output(&l.name, &planar(l), out)
                .map_err(|e| fail(e.to_string()))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compiled_model_tree_is_copied_whole() {
        let d = tempfile::tempdir().unwrap();
        let from = d.path().join("m.mlmodelc");
        std::fs::create_dir_all(from.join("weights")).unwrap();
        std::fs::write(from.join("coremldata.bin"), b"abc").unwrap();
        std::fs::write(from.join("weights/weight.bin"), b"0123").unwrap();
        let to = d.path().join("entry").join(COMPILED_DIR);
        copy_tree(&from, &to).unwrap();
        assert_eq!(std::fs::read(to.join("coremldata.bin")).unwrap(), b"abc");
        assert_eq!(
            std::fs::read(to.join("weights/weight.bin")).unwrap(),
            b"0123"
        );
        // A model kept elsewhere stays when its handle drops.
        drop(CompiledModel::at(&to));
        assert!(to.join("weights/weight.bin").exists());
        assert!(copy_tree(&d.path().join("missing"), &d.path().join("x")).is_err());
    }
}
