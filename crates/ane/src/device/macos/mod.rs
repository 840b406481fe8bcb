//! The macOS drivers as devices, over `anelm-macos` (compiled on every platform; off a Mac,
//! opening one is the typed "no ANE here" error): [`PrivateAneDevice`] (the private in-memory
//! path, FACTS §3) and [`CoreMlDevice`] (Core ML, CPU_AND_NE).

mod coreml;
mod private_ane;

pub use coreml::{CoreMlBinding, CoreMlDevice, CoreMlKernel};
pub use private_ane::{PrivateAneBinding, PrivateAneDevice, PrivateAneKernel};

use anelm_macos::{DeclaredFunction, DeclaredTensor, ElemType};
use anelm_mil::{DType, Function, ValueType};

use super::{DeviceError, IoType, Stage};

pub(crate) fn elem_type(t: IoType) -> ElemType {
    match t {
        IoType::Fp16 => ElemType::Fp16,
        IoType::Fp32 => ElemType::Fp32,
    }
}

fn io_type(t: ElemType) -> IoType {
    match t {
        ElemType::Fp16 => IoType::Fp16,
        ElemType::Fp32 => IoType::Fp32,
    }
}

/// The I/O of a MIL function as the drivers check it: `[1, C, 1, W]` fp16/fp32 tensors. State
/// inputs are listed apart (only Core ML binds them).
fn declared(f: &Function) -> Result<(DeclaredFunction, Vec<String>), String> {
    let tensor = |id| -> Result<Option<DeclaredTensor>, String> {
        let name = f.name_of(id).to_string();
        let t = match f.type_of(id) {
            ValueType::Tensor(t) => t,
            ValueType::State(_) => return Ok(None),
        };
        let dtype = match t.dtype {
            DType::Fp16 => ElemType::Fp16,
            DType::Fp32 => ElemType::Fp32,
            d => {
                return Err(format!(
                    "I/O {name} of {} is {d}; fp16 or fp32 expected",
                    f.name
                ))
            }
        };
        match t.shape.as_slice() {
            &[1, channels, 1, width] => Ok(Some(DeclaredTensor {
                name,
                dtype,
                channels,
                width,
            })),
            s => Err(format!(
                "I/O {name} of {} has shape {s:?}; [1, C, 1, W] expected",
                f.name
            )),
        }
    };
    let mut inputs = Vec::new();
    let mut states = Vec::new();
    for &id in f.inputs() {
        match tensor(id)? {
            Some(t) => inputs.push(t),
            None => states.push(f.name_of(id).to_string()),
        }
    }
    let outputs = f
        .outputs()
        .iter()
        .map(|&id| {
            tensor(id)?.ok_or_else(|| format!("output {} of {} is a state", f.name_of(id), f.name))
        })
        .collect::<Result<_, _>>()?;
    Ok((
        DeclaredFunction {
            name: f.name.clone(),
            inputs,
            outputs,
        },
        states,
    ))
}

/// The program-cache tag of driver `kind` on this machine: chip and OS build from sysctl, so
/// programs compiled under another chip or OS build are never reused.
fn machine_tag(kind: &str) -> String {
    let info = anelm_macos::machine_info().unwrap_or_default();
    crate::cache::machine_tag(kind, info.chip.as_deref(), info.os_build.as_deref())
}

fn error(device: &str, stage: Stage, kernel: &str, message: impl ToString) -> DeviceError {
    DeviceError::new(device, stage, kernel, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use anelm_mil::{FunctionBuilder, Opset, TensorType};

    #[test]
    fn declared_io_of_a_function() {
        let mut f = FunctionBuilder::new("decode", Opset::Ios18);
        let x = f.input("x", TensorType::fp16([1, 8, 1, 64])).unwrap();
        let k = f
            .state_input("k_cache", TensorType::fp16([1, 8, 1, 64]))
            .unwrap();
        let c = f.read_state(k).unwrap();
        let y = f.name_next("y").add(x, c).unwrap();
        f.output(y).unwrap();
        let (d, states) = declared(&f.finish().unwrap()).unwrap();
        assert_eq!(d.name, "decode");
        assert_eq!(
            d.inputs,
            [DeclaredTensor {
                name: "x".into(),
                dtype: ElemType::Fp16,
                channels: 8,
                width: 64
            }]
        );
        assert_eq!(
            (d.outputs[0].name.as_str(), d.outputs[0].channels),
            ("y", 8)
        );
        assert_eq!(states, ["k_cache"]);
        assert_eq!(io_type(elem_type(IoType::Fp32)), IoType::Fp32);
    }

    #[test]
    fn off_a_mac_both_devices_say_no_ane() {
        let results = [
            PrivateAneDevice::open(anelm_macos::LoadOptions::default()).map(drop),
            CoreMlDevice::open().map(drop),
        ];
        for r in results {
            match (std::env::consts::OS, r) {
                ("macos", r) => assert!(r.is_ok(), "{r:?}"),
                (_, Err(e)) => assert!(
                    e.is_unavailable() && e.to_string().starts_with("no ANE here: "),
                    "{e}"
                ),
                (os, Ok(())) => panic!("a macOS driver opened on {os}"),
            }
        }
    }

    #[test]
    fn other_shapes_are_refused() {
        let mut f = FunctionBuilder::new("main", Opset::Ios18);
        let x = f.input("x", TensorType::fp16([4, 64])).unwrap();
        let y = f.name_next("y").sigmoid(x).unwrap();
        f.output(y).unwrap();
        let e = declared(&f.finish().unwrap()).unwrap_err();
        assert!(e.contains("I/O x of main has shape [4, 64]"), "{e}");
    }
}
