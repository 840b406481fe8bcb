//! The ANE through the private in-memory driver (FACTS §3) as a [`Device`]: a unit's MIL text and
//! weight files go to `_ANEInMemoryModelDescriptor`; each function's I/O order and strides come
//! from `modelAttributes` (FACTS §3.5, C3); buffers are IOSurfaces bound once per function.

use std::sync::Mutex;

use anelm_macos::{AneModel, AneRequest, LoadOptions, MacError, PrivateAne, ProcedureIo};

use super::{declared, error, io_type};
use crate::device::{Device, DeviceError, IoLayout, KernelIo, Stage};
use crate::unit::CompileUnit;

const NAME: &str = "ane";
/// In a program-cache entry: the framework's `hexStringIdentifier` of the program.
const IDENTIFIER_FILE: &str = "identifier.txt";
/// In a program-cache entry: `modelAttributes` when it was compiled.
const ATTRIBUTES_FILE: &str = "attributes.json";

/// The private driver. Opening it off a Mac is [`MacError::Unavailable`].
#[derive(Debug)]
pub struct PrivateAneDevice {
    driver: PrivateAne,
    /// The program cache's tag: this driver, the chip, the OS build.
    tag: String,
}

impl PrivateAneDevice {
    pub fn open(options: LoadOptions) -> Result<PrivateAneDevice, MacError> {
        let driver = PrivateAne::open(options)?;
        Ok(PrivateAneDevice {
            driver,
            tag: super::machine_tag(NAME),
        })
    }

    /// Compiles so far in this process, and the limit (FACTS §4).
    pub fn compiles(&self) -> (u32, u32) {
        (self.driver.budget().used(), self.driver.budget().limit())
    }
}

pub struct PrivateAneKernel {
    name: String,
    /// (the driver's layout, the device's view of it) per function.
    functions: Vec<(ProcedureIo, KernelIo)>,
    model: AneModel,
}

impl PrivateAneKernel {
    /// `modelAttributes` as the framework gave them (for reports).
    pub fn attributes(&self) -> &serde_json::Value {
        self.model.attributes_json()
    }

    /// False when the daemon had the program cached and nothing was compiled.
    pub fn compiled(&self) -> bool {
        self.model.compiled()
    }
}

pub struct PrivateAneBinding {
    function: usize,
    request: AneRequest,
    /// An IOSurface lock that failed in `write_input`/`read_output` (which cannot return an
    /// error): reported by the next `evaluate`.
    failed: Mutex<Option<String>>,
}

impl PrivateAneBinding {
    fn fail(&self, e: MacError) {
        if let Ok(mut f) = self.failed.lock() {
            f.get_or_insert(e.to_string());
        }
    }
}

fn kernel_io(p: &ProcedureIo) -> KernelIo {
    let layout = |s: &anelm_macos::TensorSlot| IoLayout {
        name: s.name.clone(),
        dtype: io_type(s.dtype),
        channels: s.channels,
        width: s.width,
        row_stride: s.channel_stride,
        size: s.bytes,
    };
    KernelIo {
        function: p.function.clone(),
        inputs: p.inputs.iter().map(layout).collect(),
        outputs: p.outputs.iter().map(layout).collect(),
    }
}

impl PrivateAneDevice {
    /// Opens `unit` through `load` (compile-or-load, or load only) and resolves each function's
    /// I/O from `modelAttributes`.
    fn open_unit(
        &mut self,
        unit: &CompileUnit,
        load: fn(&PrivateAne, &anelm_macos::staging::ModelFiles) -> Result<AneModel, MacError>,
    ) -> Result<PrivateAneKernel, DeviceError> {
        let fail = |m: String| error(NAME, Stage::Compile, &unit.name, m);
        let bytes: Vec<Vec<u8>> = unit.weights.iter().map(|w| w.bytes()).collect();
        let weights: Vec<(&str, &[u8])> = (unit.weights.iter().zip(&bytes))
            .map(|(w, b)| (w.path.as_str(), b.as_slice()))
            .collect();
        let files = anelm_macos::staging::ModelFiles {
            mil_text: &unit.text,
            weights: &weights,
        };
        let model = load(&self.driver, &files).map_err(|e| fail(e.to_string()))?;
        let n = unit.program.functions.len();
        let mut functions = Vec::with_capacity(n);
        for f in &unit.program.functions {
            let (decl, states) = declared(f).map_err(&fail)?;
            if let Some(s) = states.first() {
                return Err(fail(format!(
                    "function {} has state {s}: the private driver binds no states",
                    f.name
                )));
            }
            let p = model.io(&decl, n).map_err(|e| fail(e.to_string()))?;
            let io = kernel_io(&p);
            functions.push((p, io));
        }
        Ok(PrivateAneKernel {
            name: unit.name.clone(),
            functions,
            model,
        })
    }
}

impl Device for PrivateAneDevice {
    type Kernel = PrivateAneKernel;
    type Binding = PrivateAneBinding;

    fn name(&self) -> &str {
        NAME
    }

    fn compile(&mut self, unit: &CompileUnit) -> Result<PrivateAneKernel, DeviceError> {
        self.open_unit(unit, PrivateAne::load)
    }

    fn cache_tag(&self) -> String {
        self.tag.clone()
    }

    /// What the framework needs to reload the program without compiling: the same MIL text and
    /// weight files (their bytes give the same `hexStringIdentifier`, under which the daemon
    /// keeps the compiled program; FACTS §3.3), with the identifier and `modelAttributes` for
    /// reports.
    fn save_compiled(
        &self,
        kernel: &PrivateAneKernel,
        unit: &CompileUnit,
        dir: &std::path::Path,
    ) -> Result<bool, DeviceError> {
        let fail = |m: String| error(NAME, Stage::Compile, &unit.name, m);
        unit.write_mil_dir(dir).map_err(|e| fail(e.to_string()))?;
        let attributes = format!("{:#}\n", kernel.attributes());
        for (file, text) in [
            (IDENTIFIER_FILE, kernel.model.identifier()),
            (ATTRIBUTES_FILE, attributes.as_str()),
        ] {
            std::fs::write(dir.join(file), text).map_err(|e| fail(format!("{file}: {e}")))?;
        }
        Ok(true)
    }

    /// Loads the saved program from the daemon's cache; fails (and the program cache compiles
    /// it again) when the daemon no longer holds it.
    fn load_compiled(
        &mut self,
        dir: &std::path::Path,
        unit_name: &str,
    ) -> Result<PrivateAneKernel, DeviceError> {
        let unit = CompileUnit::read_mil_dir(dir, unit_name)
            .map_err(|e| error(NAME, Stage::Compile, unit_name, e))?;
        self.open_unit(&unit, PrivateAne::load_compiled)
    }

    fn io<'k>(&self, kernel: &'k PrivateAneKernel, function: &str) -> Option<&'k KernelIo> {
        kernel
            .functions
            .iter()
            .map(|(_, io)| io)
            .find(|io| io.function == function)
    }

    fn bind(
        &mut self,
        kernel: &PrivateAneKernel,
        function: &str,
    ) -> Result<PrivateAneBinding, DeviceError> {
        let fail = |m: String| error(NAME, Stage::Bind, &kernel.name, m);
        let index = kernel
            .functions
            .iter()
            .position(|(_, io)| io.function == function)
            .ok_or_else(|| fail(format!("no function {function}")))?;
        let request = kernel
            .model
            .request(&kernel.functions[index].0)
            .map_err(|e| fail(e.to_string()))?;
        Ok(PrivateAneBinding {
            function: index,
            request,
            failed: Mutex::new(None),
        })
    }

    fn write_input<R>(
        &mut self,
        binding: &mut PrivateAneBinding,
        index: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> R {
        let mut f = Some(f);
        let surface = binding
            .request
            .input(index)
            .expect("input index within the kernel's io()");
        let size = surface.len();
        match surface.write(|bytes| f.take().map(|f| f(bytes))) {
            Ok(Some(r)) => r,
            Ok(None) => unreachable!("write runs its closure once"),
            Err(e) => {
                binding.fail(e);
                // The caller still gets its bytes; the evaluation that follows reports the failure.
                (f.take().expect("not run: the lock failed"))(&mut vec![0; size])
            }
        }
    }

    fn read_output<R>(
        &self,
        binding: &PrivateAneBinding,
        index: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> R {
        let mut f = Some(f);
        let surface = binding
            .request
            .output(index)
            .expect("output index within the kernel's io()");
        match surface.read(|bytes| f.take().map(|f| f(bytes))) {
            Ok(Some(r)) => r,
            Ok(None) => unreachable!("read runs its closure once"),
            Err(e) => {
                let size = surface.len();
                binding.fail(e);
                (f.take().expect("not run: the lock failed"))(&vec![0; size])
            }
        }
    }

    fn evaluate(
        &mut self,
        kernel: &PrivateAneKernel,
        binding: &mut PrivateAneBinding,
        _live_columns: usize,
    ) -> Result<(), DeviceError> {
        let fail = |m: String| error(NAME, Stage::Evaluate, &kernel.name, m);
        if let Some(m) = binding.failed.get_mut().ok().and_then(Option::take) {
            return Err(fail(m));
        }
        debug_assert!(binding.function < kernel.functions.len());
        kernel
            .model
            .evaluate(&binding.request)
            .map_err(|e| fail(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anelm_macos::{ElemType, TensorSlot};

    #[test]
    fn the_device_layout_is_the_drivers() {
        let slot = |name: &str, symbol, stride, bytes| TensorSlot {
            name: name.into(),
            symbol,
            dtype: ElemType::Fp16,
            channels: 3,
            width: 17,
            channel_stride: stride,
            bytes,
        };
        let p = ProcedureIo {
            function: "main".into(),
            procedure: 0,
            inputs: vec![slot("x", 1, 128, 16384)],
            outputs: vec![slot("y", 0, 64, 192)],
        };
        let io = kernel_io(&p);
        assert_eq!(io.function, "main");
        let x = &io.inputs[0];
        assert_eq!(
            (
                x.name.as_str(),
                x.row_stride,
                x.size,
                x.channels,
                x.width,
                x.dtype
            ),
            ("x", 128, 16384, 3, 17, crate::device::IoType::Fp16)
        );
        assert_eq!(
            x.offset(2, 5),
            2 * 128 + 5 * 2,
            "element (c, w) where the driver put it"
        );
        assert_eq!((io.outputs[0].row_stride, io.outputs[0].size), (64, 192));
    }
}
