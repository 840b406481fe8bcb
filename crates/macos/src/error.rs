//! Errors of the macOS drivers, and the mapping of `NSError` domains and codes onto them.
//!
//! The codes of the ANE framework's generic domain are those `_ANEErrors` creates (decompiled
//! iOS 18.2 `AppleNeuralEngine.framework/_ANEErrors.m`, the DEC source of FACTS §0):
//! 1 entitlement, 2 real-time priority, 3 timed out, 4 program creation, 5 inference overflow,
//! 6 program load failure (`(0x…)` status in the text), 7 code signing, 8 inference error,
//! 9 file access, 10 invalid model, 11 invalid model key, 13/14 IOSurface map/unmap,
//! 16 file not found, 17 model identifier not found, 20 invalid model instance,
//! 21 new-instance load failure, 22 host too old, 23 program not found.

use std::path::PathBuf;

/// The domain of the ANE framework's own errors (FACTS §3.6).
pub const ANE_DOMAIN: &str = "com.apple.appleneuralengine";
/// The domain of the ANE compiler's errors (FACTS §3.6: `ANECCompile() FAILED`).
pub const ANE_COMPILER_DOMAIN: &str = "com.apple.appleneuralengine.compiler";
/// Core ML's error domain (`MLModelErrorDomain`).
pub const COREML_DOMAIN: &str = "com.apple.CoreML";

/// An `NSError` as plain data: what the drivers read off it before it is released.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NsErrorInfo {
    pub domain: String,
    pub code: i64,
    /// `-description`, which carries the domain, code and the framework's message.
    pub description: String,
}

impl std::fmt::Display for NsErrorInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.description)
    }
}

/// The driver step an Objective-C call belonged to: the same code means different things at
/// different steps (a timeout on load is worth a retry, a compile failure never is).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Describe,
    Compile,
    Load,
    Evaluate,
    Unload,
    Predict,
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Step::Describe => "describing the model",
            Step::Compile => "compiling",
            Step::Load => "loading",
            Step::Evaluate => "evaluating",
            Step::Unload => "unloading",
            Step::Predict => "predicting",
        })
    }
}

/// What an `NSError` means for the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NsErrorKind {
    /// The compiler rejected the program; `invalid_program` when it said `InvalidMILProgram`
    /// (a grammar or type problem) rather than a failure inside the compiler.
    CompileRejected { invalid_program: bool },
    /// A load failure that may go away when retried: the daemon timed out, or reported a load
    /// failure without the device-window status 0x20004 (FACTS §4: OMX) that a retry cannot fix.
    TransientLoad,
    /// A load failure a retry will not fix; `status` is the `(0x…)` of the message.
    Load { status: Option<u32> },
    /// The program ran and failed (`status=0x1d` and friends, FACTS §3.6).
    Evaluate { status: Option<u32> },
    /// The process lacks an entitlement or a code signature the call needs.
    NotPermitted,
    /// The OS has no ANE hardware for this process (in a VM: `hostTooOld`).
    NoHardware,
    /// Anything else.
    Other,
}

/// Reads the `status=0x…` or `(0x…)` hexadecimal status out of a framework message.
pub fn status_code(description: &str) -> Option<u32> {
    let hex_after = |marker: &str| {
        let at = description.find(marker)? + marker.len();
        let digits: String = description[at..]
            .chars()
            .take_while(char::is_ascii_hexdigit)
            .collect();
        u32::from_str_radix(&digits, 16).ok()
    };
    hex_after("status=0x").or_else(|| hex_after("(0x"))
}

impl NsErrorInfo {
    /// Classifies the error of a call at `step`.
    pub fn kind(&self, step: Step) -> NsErrorKind {
        let status = status_code(&self.description);
        if self.domain == ANE_COMPILER_DOMAIN {
            return NsErrorKind::CompileRejected {
                invalid_program: self.description.contains("InvalidMILProgram"),
            };
        }
        if self.domain != ANE_DOMAIN {
            return NsErrorKind::Other;
        }
        match (self.code, step) {
            (1 | 2 | 7, _) => NsErrorKind::NotPermitted,
            (22, _) => NsErrorKind::NoHardware,
            (3, Step::Load) => NsErrorKind::TransientLoad,
            (6, Step::Load) if status != Some(DEVICE_WINDOW_STATUS) => NsErrorKind::TransientLoad,
            (6 | 21, _) => NsErrorKind::Load { status },
            (4 | 9 | 10 | 11 | 16, Step::Compile) => NsErrorKind::CompileRejected {
                invalid_program: false,
            },
            (5 | 8 | 13 | 23, _) => NsErrorKind::Evaluate { status },
            _ => NsErrorKind::Other,
        }
    }
}

/// `Program load failure (0x20004)`: the program's weights do not fit the ANE's device address
/// window (FACTS §4, OMX); the same program fails again however often it is retried.
pub const DEVICE_WINDOW_STATUS: u32 = 0x20004;

/// Why the ANE (or Core ML) cannot be used in this process: the normal answer off a Mac.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{component} is not available: {reason}")]
pub struct Unavailable {
    /// What is missing: a library path, a class, a selector.
    pub component: String,
    pub reason: String,
}

#[derive(Debug, thiserror::Error)]
pub enum MacError {
    /// No ANE here: a framework did not load, or lacks a class or method the driver calls.
    #[error("no ANE here: {0}")]
    Unavailable(Unavailable),
    /// An Objective-C call failed with an `NSError`.
    #[error("{step} ({call}): {error}")]
    Call {
        step: Step,
        call: &'static str,
        kind: NsErrorKind,
        error: NsErrorInfo,
    },
    /// An Objective-C call returned nil or NO without saying why.
    #[error("{step} ({call}): the call failed and gave no NSError")]
    Silent { step: Step, call: &'static str },
    /// This process has compiled as many programs as the ANE takes (FACTS §4).
    #[error("compile budget exhausted: {used} ANE compiles in this process, the limit is {limit} (FACTS §4: compiles fail past ~119; set ANELM_ANE_COMPILE_BUDGET to change it)")]
    BudgetExhausted { used: u32, limit: u32 },
    /// A load that must not compile found no compiled program for it (the daemon's cache was
    /// purged, or this OS cannot say: no `compiledModelExists`).
    #[error("the ANE daemon holds no compiled program {identifier} (compiledModelExists is NO or missing); it must be compiled again")]
    NotCompiled { identifier: String },
    /// `modelAttributes` do not describe the I/O the program declares.
    #[error("modelAttributes: {0}")]
    Layout(String),
    /// Writing the staged model files failed.
    #[error("staging {}: {source}", path.display())]
    Staging {
        path: PathBuf,
        source: std::io::Error,
    },
    /// An IOSurface call failed.
    #[error("IOSurface {call} failed: {detail}")]
    Surface { call: &'static str, detail: String },
    /// Any of the above, with the files saved for the person debugging it (`saved.rs`): the
    /// program's MIL text and `modelAttributes`.
    #[error("{error}{}", saved_note(files, unsaved))]
    Saved {
        error: Box<MacError>,
        files: Vec<PathBuf>,
        /// Files that could not be written, with the reason.
        unsaved: Vec<String>,
    },
    /// The caller asked for something the driver cannot express (a weight path outside
    /// `@model_path`, a tensor of an unsupported type, …).
    #[error("{0}")]
    Invalid(String),
}

fn saved_note(files: &[PathBuf], unsaved: &[String]) -> String {
    let mut parts = Vec::new();
    if !files.is_empty() {
        let list: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
        parts.push(format!("saved {}", list.join(", ")));
    }
    if !unsaved.is_empty() {
        parts.push(format!("could not save: {}", unsaved.join("; ")));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join("; "))
    }
}

// Not `#[from]`: that would make the Unavailable the error's source too, and error chains
// (anyhow's `{:#}`) would print it twice.
impl From<Unavailable> for MacError {
    fn from(u: Unavailable) -> MacError {
        MacError::Unavailable(u)
    }
}

impl MacError {
    /// The error itself, without the files saved for it.
    pub fn inner(&self) -> &MacError {
        match self {
            MacError::Saved { error, .. } => error.inner(),
            e => e,
        }
    }

    /// The files saved for this error.
    pub fn saved_files(&self) -> &[PathBuf] {
        match self {
            MacError::Saved { files, .. } => files,
            _ => &[],
        }
    }

    /// True when the error means "no ANE here" rather than a failure of the ANE.
    pub fn is_unavailable(&self) -> bool {
        let e = self.inner();
        matches!(e, MacError::Unavailable(_))
            || matches!(self, MacError::Unavailable(_))
            || matches!(
                e,
                MacError::Call {
                    kind: NsErrorKind::NoHardware,
                    ..
                }
            )
    }

    /// True for a load failure that a retry may fix.
    pub fn is_transient(&self) -> bool {
        matches!(
            self.inner(),
            MacError::Call {
                kind: NsErrorKind::TransientLoad,
                ..
            }
        )
    }

    /// The error of a failed call at `step`, with its `NSError` when there was one.
    pub fn call(step: Step, call: &'static str, error: Option<NsErrorInfo>) -> MacError {
        match error {
            Some(error) => MacError::Call {
                step,
                call,
                kind: error.kind(step),
                error,
            },
            None => MacError::Silent { step, call },
        }
    }
}

pub type Result<T, E = MacError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(domain: &str, code: i64, description: &str) -> NsErrorInfo {
        NsErrorInfo {
            domain: domain.into(),
            code,
            description: description.into(),
        }
    }

    #[test]
    fn status_codes_are_read_from_the_framework_messages() {
        // Messages as FACTS §3.6 and the DEC format strings spell them.
        let eval = "processRequest:model:qos:qIndex:modelStringID:options:returnValue:error:: ANEProgramProcessRequestDirect() Failed with status=0x1d : statusType=0x9: Program Inference error";
        assert_eq!(status_code(eval), Some(0x1d));
        assert_eq!(
            status_code("loadModel: Program load failure (0x20004)"),
            Some(0x20004)
        );
        assert_eq!(status_code("_ANECompiler : ANECCompile() FAILED"), None);
        assert_eq!(status_code("status=0xzz"), None);
    }

    #[test]
    fn compile_errors_say_whether_the_program_was_invalid() {
        let e = ns(
            ANE_COMPILER_DOMAIN,
            1,
            "_ANECompiler : ANECCompile() FAILED err=(InvalidMILProgram)",
        );
        assert_eq!(
            e.kind(Step::Compile),
            NsErrorKind::CompileRejected {
                invalid_program: true
            }
        );
        let e = ns(
            ANE_COMPILER_DOMAIN,
            1,
            "_ANECompiler : ANECCompile() FAILED err=(CompilationFailure)",
        );
        assert_eq!(
            e.kind(Step::Compile),
            NsErrorKind::CompileRejected {
                invalid_program: false
            }
        );
    }

    #[test]
    fn load_failures_are_transient_unless_the_weights_do_not_fit() {
        assert_eq!(
            ns(ANE_DOMAIN, 3, "loadModel: timed out").kind(Step::Load),
            NsErrorKind::TransientLoad
        );
        assert_eq!(
            ns(ANE_DOMAIN, 6, "loadModel: Program load failure").kind(Step::Load),
            NsErrorKind::TransientLoad
        );
        assert_eq!(
            ns(ANE_DOMAIN, 6, "loadModel: Program load failure (0x20004)").kind(Step::Load),
            NsErrorKind::Load {
                status: Some(0x20004)
            }
        );
        // A timeout elsewhere is not a load to retry.
        assert_eq!(
            ns(ANE_DOMAIN, 3, "x: timed out").kind(Step::Evaluate),
            NsErrorKind::Other
        );
        let e = MacError::call(
            Step::Load,
            "loadWithQoS:options:error:",
            Some(ns(ANE_DOMAIN, 3, "timed out")),
        );
        assert!(e.is_transient() && !e.is_unavailable());
    }

    #[test]
    fn evaluation_and_permission_errors() {
        let e = ns(ANE_DOMAIN, 8, "processRequest: ANEProgramProcessRequestDirect() Failed with status=0x1d : Program Inference error");
        assert_eq!(
            e.kind(Step::Evaluate),
            NsErrorKind::Evaluate { status: Some(0x1d) }
        );
        assert_eq!(
            ns(ANE_DOMAIN, 1, "requires restricted access").kind(Step::Load),
            NsErrorKind::NotPermitted
        );
        assert_eq!(
            ns(ANE_DOMAIN, 22, "Host too old, ANE hardware not available").kind(Step::Evaluate),
            NsErrorKind::NoHardware
        );
        assert!(MacError::call(
            Step::Evaluate,
            "evaluateWithQoS:options:request:error:",
            Some(ns(ANE_DOMAIN, 22, "Host too old"))
        )
        .is_unavailable());
        assert_eq!(
            ns(COREML_DOMAIN, 0, "x").kind(Step::Predict),
            NsErrorKind::Other
        );
    }

    #[test]
    fn messages_name_the_step_and_the_call() {
        let e = MacError::call(
            Step::Compile,
            "compileWithQoS:options:error:",
            Some(ns(ANE_COMPILER_DOMAIN, 1, "ANECCompile() FAILED")),
        );
        assert_eq!(
            e.to_string(),
            "compiling (compileWithQoS:options:error:): ANECCompile() FAILED"
        );
        let e = MacError::call(Step::Load, "loadWithQoS:options:error:", None);
        assert_eq!(
            e.to_string(),
            "loading (loadWithQoS:options:error:): the call failed and gave no NSError"
        );
    }
}
