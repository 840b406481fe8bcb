//! What the ANE path needs from a device, and the simulator that provides it on any machine.
//!
//! A [`Device`] compiles a [`CompileUnit`] (MIL text + weight blob files, and the same program
//! in memory for back ends that write packages) into a kernel; [`Device::bind`] allocates the
//! I/O buffers of one of its functions (IOSurfaces on the ANE) and prepares the request once;
//! the engine then writes inputs, calls [`Device::evaluate`] and reads outputs, as often as it
//! needs. The device, not the engine, says how I/O is laid out ([`KernelIo`]): names, order,
//! row strides — a hardware driver reads them from the compiled model (`modelAttributes`,
//! FACTS §3.5) instead of assuming them.

mod macos;
mod sim;

pub use macos::{
    CoreMlBinding, CoreMlDevice, CoreMlKernel, PrivateAneBinding, PrivateAneDevice,
    PrivateAneKernel,
};
pub use sim::{SimBinding, SimDevice, SimKernel, SimRefusal, SIM_FAIL_ENV};

use crate::unit::CompileUnit;

/// Element type of an I/O tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoType {
    Fp16,
    Fp32,
}

impl IoType {
    pub fn bytes(self) -> usize {
        match self {
            IoType::Fp16 => 2,
            IoType::Fp32 => 4,
        }
    }
}

/// Where the elements of a `[1, C, 1, W]` input or output live in its buffer: channel `c`,
/// column `w` at byte `c * row_stride + w * dtype.bytes()`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoLayout {
    /// The MIL name of the input or output.
    pub name: String,
    pub dtype: IoType,
    pub channels: usize,
    pub width: usize,
    /// Bytes from one channel's row to the next.
    pub row_stride: usize,
    /// Bytes the buffer holds (at least `channels * row_stride`).
    pub size: usize,
}

impl IoLayout {
    /// The ANE's layout when the device says nothing else: each channel row padded to 64 bytes
    /// (FACTS §4: `rowBytes = alignUp(W * 2, 64)`, measured by H3).
    pub fn ane(name: &str, dtype: IoType, channels: usize, width: usize) -> IoLayout {
        let row_stride =
            anelm_macos::layout::fallback_channel_stride(macos::elem_type(dtype), width);
        IoLayout {
            name: name.to_string(),
            dtype,
            channels,
            width,
            row_stride,
            size: channels * row_stride,
        }
    }

    /// Byte offset of channel `c`, column `w`.
    pub fn offset(&self, c: usize, w: usize) -> usize {
        c * self.row_stride + w * self.dtype.bytes()
    }
}

/// The inputs and outputs of one function of a compiled kernel, in the order the device binds
/// them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelIo {
    pub function: String,
    pub inputs: Vec<IoLayout>,
    pub outputs: Vec<IoLayout>,
}

impl KernelIo {
    pub fn input(&self, name: &str) -> Option<usize> {
        self.inputs.iter().position(|l| l.name == name)
    }

    pub fn output(&self, name: &str) -> Option<usize> {
        self.outputs.iter().position(|l| l.name == name)
    }
}

/// The step of a device call that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Compile,
    Bind,
    Evaluate,
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stage::Compile => "compiling",
            Stage::Bind => "binding",
            Stage::Evaluate => "evaluating",
        })
    }
}

/// A device call that failed, with the device's own message (an `NSError` description on the
/// ANE, the interpreter's error in the simulator) and the files saved for a report (the staged
/// program, its `modelAttributes`), which the message lists.
#[derive(Debug, thiserror::Error)]
pub struct DeviceError {
    pub device: String,
    pub stage: Stage,
    pub kernel: String,
    pub message: String,
    /// Files kept for whoever reads the error (empty when none were saved).
    pub files: Vec<std::path::PathBuf>,
}

impl DeviceError {
    pub fn new(device: &str, stage: Stage, kernel: &str, message: impl ToString) -> DeviceError {
        DeviceError {
            device: device.to_string(),
            stage,
            kernel: kernel.to_string(),
            message: message.to_string(),
            files: Vec::new(),
        }
    }

    /// The same error, naming `files` as saved for it.
    pub fn with_files(mut self, files: impl IntoIterator<Item = std::path::PathBuf>) -> Self {
        self.files.extend(files);
        self
    }
}

impl std::fmt::Display for DeviceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} {}: {}",
            self.device, self.stage, self.kernel, self.message
        )?;
        if !self.files.is_empty() {
            let files: Vec<String> = self.files.iter().map(|p| p.display().to_string()).collect();
            write!(f, " (saved: {})", files.join(", "))?;
        }
        Ok(())
    }
}

/// A device that runs compiled MIL programs.
pub trait Device: Send {
    /// A compiled (and loaded) program.
    type Kernel: Send;
    /// One function of a kernel with its I/O buffers allocated and bound.
    type Binding: Send;

    /// A short name for messages (`sim`, `ane`).
    fn name(&self) -> &str;

    /// Compiles and loads every function of `unit`.
    fn compile(&mut self, unit: &CompileUnit) -> Result<Self::Kernel, DeviceError>;

    /// The I/O of `function` in `kernel`, as the device lays it out.
    fn io<'k>(&self, kernel: &'k Self::Kernel, function: &str) -> Option<&'k KernelIo>;

    /// Allocates the I/O buffers of `function` and binds them for evaluation.
    fn bind(&mut self, kernel: &Self::Kernel, function: &str)
        -> Result<Self::Binding, DeviceError>;

    /// Runs `f` on the bytes of input `index` (laid out as `io().inputs[index]` says).
    fn write_input<R>(
        &mut self,
        binding: &mut Self::Binding,
        index: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> R;

    /// Runs `f` on the bytes of output `index`.
    fn read_output<R>(
        &self,
        binding: &Self::Binding,
        index: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> R;

    /// Evaluates the bound function. Columns from `live_columns` on hold no data the caller
    /// needs: a device may skip them (the simulator does, for column-independent programs; the
    /// ANE computes them anyway). Their output values are unspecified.
    fn evaluate(
        &mut self,
        kernel: &Self::Kernel,
        binding: &mut Self::Binding,
        live_columns: usize,
    ) -> Result<(), DeviceError>;

    /// What identifies this device's compiler (kind, chip, OS build) to the program cache:
    /// entries made by one do not serve another.
    fn cache_tag(&self) -> String {
        self.name().to_string()
    }

    /// Writes what [`Device::load_compiled`] needs to recreate `kernel` into the empty directory
    /// `dir` (the program cache); `false` when this device keeps no such form.
    fn save_compiled(
        &self,
        _kernel: &Self::Kernel,
        _unit: &CompileUnit,
        _dir: &std::path::Path,
    ) -> Result<bool, DeviceError> {
        Ok(false)
    }

    /// The kernel `unit_name` from a directory [`Device::save_compiled`] wrote.
    fn load_compiled(
        &mut self,
        _dir: &std::path::Path,
        unit_name: &str,
    ) -> Result<Self::Kernel, DeviceError> {
        Err(DeviceError::new(
            self.name(),
            Stage::Compile,
            unit_name,
            "this device has no cached form",
        ))
    }
}
