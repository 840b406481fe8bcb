//! The ANE through the private in-memory driver (FACTS §3) as a [`Device`]: a unit's MIL text and
//! weight files go to `_ANEInMemoryModelDescriptor`; each function's I/O order and strides come
//! from `modelAttributes` (FACTS §3.5, C3); buffers are IOSurfaces bound once per function.
//! Inputs the compiler dropped are written to host buffers no request reads; when a unit fails,
//! its error names the attributes and MIL text the driver saved.

use std::sync::Mutex;

use anelm_macos::layout::{resolve, ModelAttributes};
use anelm_macos::{AneModel, AneRequest, LoadOptions, MacError, PrivateAne, ProcedureIo};
use anelm_mil::Program;

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

    /// Where the attributes were saved (and the MIL text, after a failure).
    pub fn attributes_path(&self) -> std::path::PathBuf {
        self.model.saved_files().attributes_path()
    }

    /// What the layout resolution had to assume, per function (fallback strides, unbound
    /// inputs); each line was also logged as a warning.
    pub fn notes(&self) -> impl Iterator<Item = (&str, &str)> {
        self.functions.iter().flat_map(|(p, _)| {
            p.notes
                .iter()
                .map(move |n| (p.function.as_str(), n.as_str()))
        })
    }
}

pub struct PrivateAneBinding {
    function: usize,
    request: AneRequest,
    /// Inputs `bound..` of the function's [`KernelIo`] are unbound: host buffers nothing reads.
    bound: usize,
    scratch: Vec<Vec<u8>>,
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

/// The device's view of a procedure: its bound inputs, then the unbound ones (laid out as the
/// ANE would, in buffers no request reads), then its outputs.
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
        inputs: p
            .inputs
            .iter()
            .map(layout)
            .chain(
                p.unbound
                    .iter()
                    .map(|d| IoLayout::ane(&d.name, io_type(d.dtype), d.channels, d.width)),
            )
            .collect(),
        outputs: p.outputs.iter().map(layout).collect(),
    }
}

/// Every function's layout in a loaded program, from its `modelAttributes` (as JSON). Pure, so
/// it is tested without a Mac; errors name the unit.
fn layouts(
    unit: &str,
    program: &Program,
    attributes: &serde_json::Value,
) -> Result<Vec<(ProcedureIo, KernelIo)>, DeviceError> {
    let fail = |m: String| error(NAME, Stage::Compile, unit, m);
    let attrs = ModelAttributes::from_json(attributes).map_err(|e| fail(e.to_string()))?;
    let n = program.functions.len();
    program
        .functions
        .iter()
        .map(|f| {
            let (decl, states) = declared(f).map_err(&fail)?;
            if let Some(s) = states.first() {
                return Err(fail(format!(
                    "function {} has state {s}: the private driver binds no states",
                    f.name
                )));
            }
            let p = resolve(&attrs, &decl, n).map_err(|e| fail(e.to_string()))?;
            let io = kernel_io(&p);
            Ok((p, io))
        })
        .collect()
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
            name: &unit.name,
            mil_text: &unit.text,
            weights: &weights,
        };
        let model = load(&self.driver, &files).map_err(|e| fail(e.to_string()))?;
        let functions =
            layouts(&unit.name, &unit.program, model.attributes_json()).map_err(|e| {
                // Name the saved attributes and MIL text.
                let saved = model
                    .saved_files()
                    .fail(MacError::Invalid(e.message), &unit.text);
                fail(saved.to_string())
            })?;
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
        let (p, io) = &kernel.functions[index];
        let request = kernel.model.request(p).map_err(|e| fail(e.to_string()))?;
        let bound = p.inputs.len();
        Ok(PrivateAneBinding {
            function: index,
            request,
            bound,
            scratch: io.inputs[bound..].iter().map(|l| vec![0; l.size]).collect(),
            failed: Mutex::new(None),
        })
    }

    fn write_input<R>(
        &mut self,
        binding: &mut PrivateAneBinding,
        index: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> R {
        if let Some(i) = index.checked_sub(binding.bound) {
            // An unbound input: the program does not read it.
            return f(&mut binding.scratch[i]);
        }
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
            unbound: vec![anelm_macos::DeclaredTensor {
                name: "descale".into(),
                dtype: ElemType::Fp16,
                channels: 1,
                width: 17,
            }],
            notes: vec![],
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
        // The unbound input follows the bound ones, laid out as the ANE would.
        assert_eq!(io.input("descale"), Some(1));
        assert_eq!(
            io.inputs[1],
            IoLayout::ane("descale", crate::device::IoType::Fp16, 1, 17)
        );
    }

    fn fixture(name: &str) -> serde_json::Value {
        let path = format!(
            "{}/../macos/tests/fixtures/attributes/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
    }

    /// `main(x [1, 2, 1, 16]) -> y`, the function the malformed fixtures describe.
    fn small_program() -> Program {
        use anelm_mil::{FunctionBuilder, Opset, TensorType};
        let mut f = FunctionBuilder::new("main", Opset::Ios18);
        let x = f.input("x", TensorType::fp16([1, 2, 1, 16])).unwrap();
        let y = f.name_next("y").sigmoid(x).unwrap();
        f.output(y).unwrap();
        Program::single(f.finish().unwrap())
    }

    #[test]
    fn malformed_attributes_fail_the_unit_with_one_line() {
        let program = small_program();
        let cases = fixture("malformed.json");
        for c in cases.as_array().unwrap() {
            let e = match layouts("layer07_ffn", &program, &c["attributes"]) {
                Ok(_) => panic!("{}: resolved", c["case"]),
                Err(e) => e.to_string(),
            };
            assert!(
                e.starts_with("ane: compiling layer07_ffn: modelAttributes: ")
                    && e.contains(c["error"].as_str().unwrap())
                    && !e.contains('\n'),
                "{}: {e}",
                c["case"]
            );
        }
    }

    #[test]
    fn a_fused_program_binds_both_functions_and_leaves_the_dropped_mask_unbound() {
        use anelm_mil::{FunctionBuilder, Opset, TensorType};
        let function = |name: &str, w: usize, inputs: &[(&str, usize)]| {
            let mut f = FunctionBuilder::new(name, Opset::Ios18);
            let mut ids = Vec::new();
            for &(n, c) in inputs {
                ids.push(f.input(n, TensorType::fp16([1, c, 1, w])).unwrap());
            }
            let y = f.name_next("y").sigmoid(ids[0]).unwrap();
            f.output(y).unwrap();
            f.finish().unwrap()
        };
        let mut program = Program::single(function(
            "prefill",
            64,
            &[("x", 8), ("cos0", 4), ("sin0", 4), ("mask", 1)],
        ));
        // decode: width 1, and kv0 [1, 8, 1, 16] of its own width.
        let mut f = FunctionBuilder::new("decode", Opset::Ios18);
        let x = f.input("x", TensorType::fp16([1, 8, 1, 1])).unwrap();
        for (n, c) in [("cos0", 4), ("sin0", 4), ("mask", 1)] {
            f.input(n, TensorType::fp16([1, c, 1, 1])).unwrap();
        }
        f.input("kv0", TensorType::fp16([1, 8, 1, 16])).unwrap();
        let y = f.name_next("y").sigmoid(x).unwrap();
        f.output(y).unwrap();
        program.functions.push(f.finish().unwrap());
        let fs = layouts("chunk0", &program, &fixture("fused_prefill_decode.json")).unwrap();
        let (p, io) = &fs[1];
        assert_eq!((p.procedure, io.function.as_str()), (1, "decode"));
        let names: Vec<&str> = io.inputs.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            names,
            ["x", "cos0", "sin0", "kv0", "mask"],
            "bound first, then unbound"
        );
        assert_eq!(p.inputs.len(), 4);
        assert_eq!(io.inputs[4].size, 64, "the unbound mask still has a buffer");
        assert_eq!(fs[0].0.inputs.len(), 4, "prefill binds its mask");
    }
}
