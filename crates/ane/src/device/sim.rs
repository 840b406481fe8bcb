//! The simulator device: compiles a unit the way the private path receives it — the MIL text
//! is parsed and every `BLOBFILE` is read from the unit's weight files — and runs it with
//! [`anelm_mil::sim`], through buffers laid out like the ANE's IOSurfaces. For tests it can be
//! told to refuse a unit the way a hardware driver might ([`SimRefusal`], `ANELM_SIM_FAIL`).

use std::collections::HashMap;
use std::path::Path;

use anelm_mil::blob::BlobFile;
use anelm_mil::sim::{Simulator, Tensor};
use anelm_mil::{DType, MilError, TensorType};
use half::f16;

use super::{Device, DeviceError, IoLayout, IoType, KernelIo, Stage};
use crate::unit::CompileUnit;

/// Runs MIL programs on the CPU with the ANE's fp16 numerics.
#[derive(Debug, Default)]
pub struct SimDevice {
    refusal: Option<SimRefusal>,
}

/// The testing hook's environment variable: `[compile:|bind:|evaluate:]<unit-name substring>`
/// (several substrings separated by commas).
pub const SIM_FAIL_ENV: &str = "ANELM_SIM_FAIL";

/// A testing hook: the simulator refuses, at `stage`, every unit whose name contains `unit` (or
/// one of its comma-separated parts) —
/// so the paths that handle a device refusing a unit (messages, `--fallback`) run without a Mac.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimRefusal {
    pub stage: Stage,
    pub unit: String,
}

impl SimRefusal {
    /// `compile:NAME`, `bind:NAME`, `evaluate:NAME`, or `NAME` (compile).
    pub fn parse(spec: &str) -> Result<SimRefusal, String> {
        let (stage, unit) = match spec.split_once(':') {
            Some(("compile", u)) => (Stage::Compile, u),
            Some(("bind", u)) => (Stage::Bind, u),
            Some(("evaluate", u)) => (Stage::Evaluate, u),
            Some((s, _)) => {
                return Err(format!(
                    "{SIM_FAIL_ENV}={spec}: stage {s} is not compile, bind or evaluate"
                ))
            }
            None => (Stage::Compile, spec),
        };
        if unit.is_empty() {
            return Err(format!("{SIM_FAIL_ENV}={spec}: no unit name to refuse"));
        }
        Ok(SimRefusal {
            stage,
            unit: unit.to_string(),
        })
    }
}

impl SimDevice {
    pub fn new() -> SimDevice {
        SimDevice::default()
    }

    /// A simulator that refuses what `refusal` names.
    pub fn refusing(refusal: SimRefusal) -> SimDevice {
        SimDevice {
            refusal: Some(refusal),
        }
    }

    /// A simulator with the refusal `ANELM_SIM_FAIL` names, if it is set (the testing hook).
    pub fn from_env() -> Result<SimDevice, String> {
        match std::env::var(SIM_FAIL_ENV) {
            Ok(spec) if !spec.is_empty() => Ok(SimDevice::refusing(SimRefusal::parse(&spec)?)),
            _ => Ok(SimDevice::new()),
        }
    }

    fn check(&self, stage: Stage, unit: &str) -> Result<(), DeviceError> {
        match &self.refusal {
            Some(r)
                if r.stage == stage
                    && r.unit.split(',').any(|u| !u.is_empty() && unit.contains(u)) =>
            {
                Err(Self::error(
                    stage,
                    unit,
                    format!("refused on request ({SIM_FAIL_ENV}, a testing hook)"),
                ))
            }
            _ => Ok(()),
        }
    }
}

pub struct SimKernel {
    name: String,
    functions: Vec<(Simulator, KernelIo)>,
}

/// The I/O buffers of one function, as plain memory.
pub struct SimBinding {
    function: usize,
    inputs: Vec<Vec<u8>>,
    outputs: Vec<Vec<u8>>,
}

fn layout(name: &str, t: &TensorType) -> Result<IoLayout, String> {
    let dtype = match t.dtype {
        DType::Fp16 => IoType::Fp16,
        DType::Fp32 => IoType::Fp32,
        d => return Err(format!("I/O {name} is {d}; fp16 or fp32 expected")),
    };
    match t.shape.as_slice() {
        &[1, c, 1, w] => Ok(IoLayout::ane(name, dtype, c, w)),
        s => Err(format!("I/O {name} has shape {s:?}; [1, C, 1, W] expected")),
    }
}

/// Parses the unit's text and loads its blobs from the unit's weight files.
fn load(unit: &CompileUnit) -> Result<anelm_mil::Program, MilError> {
    let mut program = anelm_mil::text::parse_program(&unit.text)?;
    let mut files: HashMap<&str, BlobFile> = HashMap::new();
    for w in &unit.weights {
        files.insert(&w.path, BlobFile::parse(w.path.clone(), w.bytes())?);
    }
    program.resolve_blobs(|path, offset, ty| {
        files
            .get(path)
            .ok_or_else(|| {
                MilError::invalid(format!(
                    "the text names {path}, which the unit does not have"
                ))
            })?
            .read(offset, ty)
    })?;
    Ok(program)
}

/// Prepares every function of a loaded program.
fn kernel(name: &str, program: &anelm_mil::Program) -> Result<SimKernel, DeviceError> {
    let fail = |m: String| SimDevice::error(Stage::Compile, name, m);
    let mut functions = Vec::new();
    for f in &program.functions {
        let sim = Simulator::new(f).map_err(|e| fail(e.to_string()))?;
        let inputs = sim
            .inputs()
            .map(|(n, t)| layout(n, t))
            .collect::<Result<_, _>>()
            .map_err(&fail)?;
        let outputs = sim
            .outputs()
            .map(|(n, t)| layout(n, t))
            .collect::<Result<_, _>>()
            .map_err(&fail)?;
        functions.push((
            sim,
            KernelIo {
                function: f.name.clone(),
                inputs,
                outputs,
            },
        ));
    }
    Ok(SimKernel {
        name: name.to_string(),
        functions,
    })
}

impl SimDevice {
    fn error(stage: Stage, kernel: &str, message: impl ToString) -> DeviceError {
        DeviceError::new("sim", stage, kernel, message)
    }
}

impl Device for SimDevice {
    type Kernel = SimKernel;
    type Binding = SimBinding;

    fn name(&self) -> &str {
        "sim"
    }

    fn compile(&mut self, unit: &CompileUnit) -> Result<SimKernel, DeviceError> {
        self.check(Stage::Compile, &unit.name)?;
        let program = load(unit).map_err(|e| Self::error(Stage::Compile, &unit.name, e))?;
        kernel(&unit.name, &program)
    }

    /// The simulator's compiled form is the unit itself: MIL text and weight files.
    fn save_compiled(
        &self,
        _kernel: &SimKernel,
        unit: &CompileUnit,
        dir: &Path,
    ) -> Result<bool, DeviceError> {
        unit.write_mil_dir(dir)
            .map_err(|e| Self::error(Stage::Compile, &unit.name, e))?;
        Ok(true)
    }

    fn load_compiled(&mut self, dir: &Path, unit_name: &str) -> Result<SimKernel, DeviceError> {
        self.check(Stage::Compile, unit_name)?;
        let program = anelm_mil::text::read_model_dir(dir)
            .map_err(|e| Self::error(Stage::Compile, unit_name, e))?;
        kernel(unit_name, &program)
    }

    fn io<'k>(&self, kernel: &'k SimKernel, function: &str) -> Option<&'k KernelIo> {
        kernel
            .functions
            .iter()
            .map(|(_, io)| io)
            .find(|io| io.function == function)
    }

    fn bind(&mut self, kernel: &SimKernel, function: &str) -> Result<SimBinding, DeviceError> {
        self.check(Stage::Bind, &kernel.name)?;
        let index = kernel
            .functions
            .iter()
            .position(|(_, io)| io.function == function)
            .ok_or_else(|| {
                Self::error(Stage::Bind, &kernel.name, format!("no function {function}"))
            })?;
        let io = &kernel.functions[index].1;
        let zeros = |ls: &[IoLayout]| ls.iter().map(|l| vec![0u8; l.size]).collect();
        Ok(SimBinding {
            function: index,
            inputs: zeros(&io.inputs),
            outputs: zeros(&io.outputs),
        })
    }

    fn write_input<R>(
        &mut self,
        binding: &mut SimBinding,
        index: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> R {
        f(&mut binding.inputs[index])
    }

    fn read_output<R>(&self, binding: &SimBinding, index: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        f(&binding.outputs[index])
    }

    fn evaluate(
        &mut self,
        kernel: &SimKernel,
        binding: &mut SimBinding,
        live_columns: usize,
    ) -> Result<(), DeviceError> {
        self.check(Stage::Evaluate, &kernel.name)?;
        let (sim, io) = &kernel.functions[binding.function];
        let fail = |m: String| Self::error(Stage::Evaluate, &kernel.name, m);
        // Column-independent programs run on the live columns only; others on all of them.
        let width = |l: &IoLayout| match sim.column_width() {
            Some(w) => live_columns.clamp(1, w),
            None => l.width,
        };
        let inputs = io
            .inputs
            .iter()
            .zip(&binding.inputs)
            .map(|(l, b)| decode(l, b, width(l)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| fail(e.to_string()))?;
        let outputs = sim.run(inputs).map_err(|e| fail(e.to_string()))?;
        for ((l, b), t) in io.outputs.iter().zip(&mut binding.outputs).zip(&outputs) {
            encode(l, t, b).map_err(|e| fail(e.to_string()))?;
        }
        Ok(())
    }
}

/// The first `n` columns of a buffer as a `[1, C, 1, n]` tensor.
fn decode(l: &IoLayout, bytes: &[u8], n: usize) -> Result<Tensor, MilError> {
    let mut v = Vec::with_capacity(l.channels * n);
    for c in 0..l.channels {
        let row = &bytes[l.offset(c, 0)..];
        match l.dtype {
            IoType::Fp16 => v.extend(
                row.chunks_exact(2)
                    .take(n)
                    .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()),
            ),
            IoType::Fp32 => v.extend(
                row.chunks_exact(4)
                    .take(n)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            ),
        }
    }
    let dtype = if l.dtype == IoType::Fp16 {
        DType::Fp16
    } else {
        DType::Fp32
    };
    Tensor::float(dtype, vec![1, l.channels, 1, n], v)
}

/// Writes a `[1, C, 1, n]` tensor into the first `n` columns of a buffer; the other columns
/// become zero.
fn encode(l: &IoLayout, t: &Tensor, bytes: &mut [u8]) -> Result<(), MilError> {
    let v = t.floats()?;
    let n = match t.shape.as_slice() {
        &[1, c, 1, n] if c == l.channels && n <= l.width => n,
        s => {
            return Err(MilError::invalid(format!(
                "output {} is {s:?}, the buffer holds [1, {}, 1, {}]",
                l.name, l.channels, l.width
            )))
        }
    };
    let e = l.dtype.bytes();
    for c in 0..l.channels {
        let row = &mut bytes[l.offset(c, 0)..l.offset(c, 0) + l.width * e];
        let (live, dead) = row.split_at_mut(n * e);
        let src = &v[c * n..(c + 1) * n];
        match l.dtype {
            IoType::Fp16 => live
                .chunks_exact_mut(2)
                .zip(src)
                .for_each(|(d, &x)| d.copy_from_slice(&f16::from_f32(x).to_le_bytes())),
            IoType::Fp32 => live
                .chunks_exact_mut(4)
                .zip(src)
                .for_each(|(d, &x)| d.copy_from_slice(&x.to_le_bytes())),
        }
        dead.fill(0);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use anelm_mil::{FunctionBuilder, Opset, Program, WeightData};

    /// y = W x + b with W = [[1, 2], [3, 4]], b = [0.5, -0.5]; width 64.
    fn unit() -> CompileUnit {
        let mut f = FunctionBuilder::new("main", Opset::Ios18);
        let x = f.input("x", TensorType::fp16([1, 2, 1, 64])).unwrap();
        let w = f
            .weight(
                "w",
                TensorType::fp16([2, 2, 1, 1]),
                WeightData::f16_from_f32(&[1.0, 2.0, 3.0, 4.0]),
            )
            .unwrap();
        let b = f
            .weight(
                "b",
                TensorType::fp16([1, 2, 1, 1]),
                WeightData::f16_from_f32(&[0.5, -0.5]),
            )
            .unwrap();
        let y = f.conv1x1(x, w).unwrap();
        let y = f.name_next("y").add(y, b).unwrap();
        f.output(y).unwrap();
        CompileUnit::new("affine", Program::single(f.finish().unwrap())).unwrap()
    }

    #[test]
    fn runs_through_padded_planar_buffers() {
        let mut d = SimDevice::new();
        let k = d.compile(&unit()).unwrap();
        let io = d.io(&k, "main").unwrap().clone();
        assert_eq!((io.inputs[0].row_stride, io.inputs[0].size), (128, 256));
        let mut b = d.bind(&k, "main").unwrap();
        d.write_input(&mut b, 0, |bytes| {
            bytes.fill(0xFF); // garbage in the dead columns must not matter
            for (c, v) in [(0, 1.0f32), (1, 2.0)] {
                let at = io.inputs[0].offset(c, 0);
                bytes[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
            }
        });
        d.evaluate(&k, &mut b, 1).unwrap();
        let got: Vec<f32> = d.read_output(&b, 0, |bytes| {
            (0..2)
                .map(|c| f16::from_le_bytes([bytes[c * 128], bytes[c * 128 + 1]]).to_f32())
                .collect()
        });
        assert_eq!(got, [5.5, 10.5]);
        d.read_output(&b, 0, |bytes| {
            assert!(
                bytes[2..128].iter().all(|&x| x == 0),
                "dead columns are zeroed"
            )
        });
    }

    #[test]
    fn refuses_what_the_testing_hook_names() {
        let r = SimRefusal::parse("evaluate:aff").unwrap();
        assert_eq!((r.stage, r.unit.as_str()), (Stage::Evaluate, "aff"));
        assert_eq!(SimRefusal::parse("ffn").unwrap().stage, Stage::Compile);
        assert!(SimRefusal::parse("load:x")
            .unwrap_err()
            .contains("stage load"));
        assert!(SimRefusal::parse("bind:").is_err());
        let mut d = SimDevice::refusing(r);
        let k = d.compile(&unit()).unwrap();
        let mut b = d.bind(&k, "main").unwrap();
        let e = d.evaluate(&k, &mut b, 1).unwrap_err();
        assert_eq!(e.stage, Stage::Evaluate);
        assert!(
            e.to_string().starts_with("sim: evaluating affine: refused"),
            "{e}"
        );
        let mut d = SimDevice::refusing(SimRefusal::parse("compile:other").unwrap());
        assert!(d.compile(&unit()).is_ok(), "other units compile");
        let e = DeviceError::new("ane", Stage::Bind, "u", "no")
            .with_files(["/t/a.json".into(), "/t/model.mil".into()]);
        assert_eq!(
            e.to_string(),
            "ane: binding u: no (saved: /t/a.json, /t/model.mil)"
        );
    }

    #[test]
    fn errors_name_the_kernel_and_the_problem() {
        let mut d = SimDevice::new();
        let mut u = unit();
        let mut b = u.weights[0].bytes();
        b[64] = 0; // break a sentinel
        u.weights[0].set_bytes(b);
        let e = d.compile(&u).err().unwrap().to_string();
        assert!(
            e.starts_with("sim: compiling affine:") && e.contains("sentinel"),
            "{e}"
        );
        let mut u = unit();
        u.text = u.text.replace("add(", "gelu(");
        let e = d.compile(&u).err().unwrap().to_string();
        assert!(e.contains("compiling affine"), "{e}");
    }
}
