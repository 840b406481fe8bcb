//! The ANE through Core ML as a [`Device`]: a unit's program is written as a `.mlpackage`,
//! compiled, and loaded for CPU_AND_NE — one `MLModel` per function (COREML.md §7), an
//! `MLState` per binding for stateful functions (COREML.md §8). Buffers are ours, laid out like
//! the ANE's; input arrays wrap them without a copy, outputs are copied back.

use std::path::PathBuf;
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
}

impl CoreMlDevice {
    pub fn open() -> Result<CoreMlDevice, MacError> {
        Ok(CoreMlDevice {
            driver: CoreMl::open()?,
        })
    }
}

struct Function {
    io: KernelIo,
    stateful: bool,
    model: MlModel,
}

pub struct CoreMlKernel {
    name: String,
    functions: Vec<Function>,
    /// Kept until the models are gone (declared last: dropped last); one per package.
    _compiled: Vec<CompiledModel>,
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
        let mut decls = Vec::new();
        for f in &unit.program.functions {
            decls.push(declared(f).map_err(&fail)?);
        }
        // One package, or one per function where the opset has no multifunction (dialect B).
        let mut compiled = Vec::new();
        let mut functions = Vec::with_capacity(decls.len());
        let packages = crate::unit::coreml_packages(&unit.program);
        let several = packages.len() == 1 && decls.len() > 1;
        for (function, program) in packages {
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
            let done = done?;
            for (decl, states) in &decls {
                if function.as_deref().is_some_and(|f| f != decl.name) {
                    continue;
                }
                let model = self
                    .driver
                    .load(&done, several.then_some(decl.name.as_str()))
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
            compiled.push(done);
        }
        Ok(CoreMlKernel {
            name: unit.name.clone(),
            functions,
            _compiled: compiled,
        })
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
