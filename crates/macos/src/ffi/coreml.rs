//! The Core ML path: compile a `.mlpackage` (`+[MLModel compileModelAtURL:error:]`), load it with
//! compute units CPU_AND_NE (and a function name for multifunction packages, COREML.md §7), and
//! predict with `MLMultiArray`s that wrap the caller's planar buffers — with an `MLState` for
//! stateful packages (COREML.md §8). Outputs are read inside
//! `-[MLMultiArray getMutableBytesWithHandler:]` (Apple, MLMultiArray, macOS 12.3+), with the
//! strides that handler reports: Apple documents that the `strides` property and the deprecated
//! `dataPointer` may not describe the real buffer (an ANE output is often IOSurface-backed).

use std::ffi::{c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libloading::Library;

use super::block::HandlerBlock;
use super::foundation::{foundation, ErrorOut, Foundation};
use super::loader::{self, CORE_ML, LIBSYSTEM};
use super::objc::{alloc, msg, AutoreleasePool, Class, Id, NsInteger, Retained, Sel};
use crate::error::{MacError, Result, Step, Unavailable};
use crate::multiarray::{copy_into_planar, planar_view, ArrayDesc, ArrayType, Planar};

pub const MODEL_CLASS: &CStr = c"MLModel";
pub const CONFIGURATION_CLASS: &CStr = c"MLModelConfiguration";
pub const MULTI_ARRAY_CLASS: &CStr = c"MLMultiArray";
pub const FEATURE_VALUE_CLASS: &CStr = c"MLFeatureValue";
pub const PROVIDER_CLASS: &CStr = c"MLDictionaryFeatureProvider";
/// The classes the Core ML driver resolves.
pub const CLASSES: [&CStr; 5] = [
    MODEL_CLASS,
    CONFIGURATION_CLASS,
    MULTI_ARRAY_CLASS,
    FEATURE_VALUE_CLASS,
    PROVIDER_CLASS,
];

const COMPILE: &CStr = c"compileModelAtURL:error:";
const LOAD: &CStr = c"modelWithContentsOfURL:configuration:error:";
const SET_COMPUTE_UNITS: &CStr = c"setComputeUnits:";
const SET_FUNCTION_NAME: &CStr = c"setFunctionName:";
const INIT_ARRAY: &CStr = c"initWithDataPointer:shape:dataType:strides:deallocator:error:";
const FEATURE_WITH_ARRAY: &CStr = c"featureValueWithMultiArray:";
const INIT_PROVIDER: &CStr = c"initWithDictionary:error:";
const PREDICT: &CStr = c"predictionFromFeatures:error:";
const PREDICT_WITH_STATE: &CStr = c"predictionFromFeatures:usingState:error:";
const NEW_STATE: &CStr = c"newState";
/// `- (void)getMutableBytesWithHandler:(void (^)(void *mutableBytes, NSInteger size,
/// NSArray<NSNumber *> *strides))handler` (Apple, MLMultiArray, macOS 12.3+).
const GET_MUTABLE_BYTES: &CStr = c"getMutableBytesWithHandler:";
/// The `isa` of stack blocks (Block ABI; exported by libSystem's libsystem_blocks).
const STACK_BLOCK: &CStr = c"_NSConcreteStackBlock";

/// `MLComputeUnitsCPUAndNeuralEngine`.
pub const CPU_AND_NE: NsInteger = 3;

struct CoreMlFramework {
    fnd: &'static Foundation,
    model: Class,
    configuration: Class,
    multi_array: Class,
    feature_value: Class,
    provider: Class,
    /// macOS 15 / iOS 18 additions: multifunction loading and states.
    has_function_name: bool,
    has_state: bool,
    /// `&_NSConcreteStackBlock`, as an address (for the handler blocks, `ffi/block.rs`).
    stack_block: usize,
    _lib: Library,
    _system: Library,
}

fn coreml_framework() -> Result<&'static CoreMlFramework, Unavailable> {
    static CORE_ML_FRAMEWORK: OnceLock<Result<CoreMlFramework, Unavailable>> = OnceLock::new();
    CORE_ML_FRAMEWORK
        .get_or_init(CoreMlFramework::load)
        .as_ref()
        .map_err(Clone::clone)
}

impl CoreMlFramework {
    fn load() -> Result<CoreMlFramework, Unavailable> {
        let fnd = foundation()?;
        let lib = loader::open(CORE_ML)?;
        let rt = fnd.rt;
        let (model, configuration) = (rt.class(MODEL_CLASS)?, rt.class(CONFIGURATION_CLASS)?);
        let (multi_array, feature_value, provider) = (
            rt.class(MULTI_ARRAY_CLASS)?,
            rt.class(FEATURE_VALUE_CLASS)?,
            rt.class(PROVIDER_CLASS)?,
        );
        rt.require_class_method(model, MODEL_CLASS, COMPILE)?;
        rt.require_class_method(model, MODEL_CLASS, LOAD)?;
        rt.require_method(model, MODEL_CLASS, PREDICT)?;
        rt.require_method(configuration, CONFIGURATION_CLASS, SET_COMPUTE_UNITS)?;
        rt.require_method(multi_array, MULTI_ARRAY_CLASS, INIT_ARRAY)?;
        rt.require_class_method(feature_value, FEATURE_VALUE_CLASS, FEATURE_WITH_ARRAY)?;
        rt.require_method(provider, PROVIDER_CLASS, INIT_PROVIDER)?;
        rt.require_method(multi_array, MULTI_ARRAY_CLASS, GET_MUTABLE_BYTES)?;
        let system = loader::open(LIBSYSTEM)?;
        // SAFETY: a data symbol, read as its address (libloading: `Symbol<*const T>`).
        let stack_block =
            unsafe { loader::symbol::<*const c_void>(&system, LIBSYSTEM, STACK_BLOCK)? } as usize;
        let has_function_name = rt.responds(configuration, SET_FUNCTION_NAME);
        let has_state = rt.responds(model, NEW_STATE) && rt.responds(model, PREDICT_WITH_STATE);
        Ok(CoreMlFramework {
            fnd,
            model,
            configuration,
            multi_array,
            feature_value,
            provider,
            has_function_name,
            has_state,
            stack_block,
            _lib: lib,
            _system: system,
        })
    }

    fn error(&self, step: Step, call: &'static str, err: &ErrorOut) -> MacError {
        MacError::call(step, call, self.fnd.error_info(err.0))
    }
}

/// The Core ML driver of this process.
pub struct CoreMl {
    fw: &'static CoreMlFramework,
}

impl std::fmt::Debug for CoreMl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoreMl")
            .field("functions", &self.fw.has_function_name)
            .field("states", &self.fw.has_state)
            .finish()
    }
}

impl CoreMl {
    /// Opens CoreML.framework and checks the classes and methods the driver calls; off a Mac
    /// this is [`MacError::Unavailable`].
    pub fn open() -> Result<CoreMl> {
        Ok(CoreMl {
            fw: coreml_framework()?,
        })
    }

    /// Compiles a `.mlpackage` into a `.mlmodelc` directory (removed when the result drops).
    pub fn compile(&self, package: &Path) -> Result<CompiledModel> {
        let (fw, fnd) = (self.fw, self.fw.fnd);
        let rt = fnd.rt;
        let _pool = AutoreleasePool::new(rt);
        let url = fnd.directory_url(package)?;
        let mut err = ErrorOut::new();
        // (Class, SEL, id NSURL*, id* NSError**) -> id NSURL* — FACTS §3.8 (Core ML public API)
        // SAFETY: checked at open; url is live; err is a valid out-pointer.
        let out = unsafe {
            msg!(rt, fn(Class, Sel, Id, *mut Id) -> Id)(
                fw.model,
                rt.sel(COMPILE),
                url.id(),
                err.ptr(),
            )
        };
        let path = fnd
            .url_path(out)
            .ok_or_else(|| fw.error(Step::Compile, "compileModelAtURL:error:", &err))?;
        Ok(CompiledModel { path, owned: true })
    }

    /// Loads a compiled model for CPU_AND_NE; `function` selects one function of a
    /// multifunction package (COREML.md §7; macOS 15).
    pub fn load(&self, compiled: &CompiledModel, function: Option<&str>) -> Result<MlModel> {
        let (fw, fnd) = (self.fw, self.fw.fnd);
        let rt = fnd.rt;
        let _pool = AutoreleasePool::new(rt);
        // (id, SEL) -> id — FACTS §3.8 (-[NSObject init])
        // SAFETY: alloc'd object of a class with init.
        let config =
            unsafe { msg!(rt, fn(Id, Sel) -> Id)(alloc(rt, fw.configuration), rt.sel(c"init")) };
        // SAFETY: alloc/init returns +1 or nil.
        let config = unsafe { Retained::from_owned(rt, config) }.ok_or(MacError::call(
            Step::Load,
            "MLModelConfiguration init",
            None,
        ))?;
        // (id, SEL, NSInteger) -> void — FACTS §3.8 (-[MLModelConfiguration setComputeUnits:])
        // SAFETY: checked at open; config is live.
        unsafe {
            msg!(rt, fn(Id, Sel, NsInteger))(config.id(), rt.sel(SET_COMPUTE_UNITS), CPU_AND_NE)
        };
        if let Some(name) = function {
            if !fw.has_function_name {
                return Err(MacError::Unavailable(Unavailable {
                    component: "-[MLModelConfiguration setFunctionName:]".into(),
                    reason: format!("function {name} of a multifunction package needs macOS 15"),
                }));
            }
            let name = fnd.string(name)?;
            // (id, SEL, id NSString*) -> void — COREML.md §7 (MLModelConfiguration.functionName)
            // SAFETY: the class responds to it (has_function_name); both objects are live.
            unsafe { msg!(rt, fn(Id, Sel, Id))(config.id(), rt.sel(SET_FUNCTION_NAME), name.id()) };
        }
        let url = fnd.directory_url(&compiled.path)?;
        let mut err = ErrorOut::new();
        // (Class, SEL, id NSURL*, id MLModelConfiguration*, id* NSError**) -> id — FACTS §3.8 (Core ML public API)
        // SAFETY: checked at open; arguments are live; err is a valid out-pointer.
        let model = unsafe {
            msg!(rt, fn(Class, Sel, Id, Id, *mut Id) -> Id)(
                fw.model,
                rt.sel(LOAD),
                url.id(),
                config.id(),
                err.ptr(),
            )
        };
        // SAFETY: model is nil or a live autoreleased object.
        let model = unsafe { Retained::retain(rt, model) }.ok_or_else(|| {
            fw.error(
                Step::Load,
                "modelWithContentsOfURL:configuration:error:",
                &err,
            )
        })?;
        Ok(MlModel { fw, model })
    }
}

/// A compiled model directory (`.mlmodelc`): the compiler's output, removed on drop, or one kept
/// elsewhere (the program cache), left in place.
#[derive(Debug)]
pub struct CompiledModel {
    path: PathBuf,
    owned: bool,
}

impl CompiledModel {
    /// The `.mlmodelc` directory at `path`, which stays when the result drops; loading it with
    /// `modelWithContentsOfURL:configuration:error:` compiles nothing.
    pub fn at(path: &Path) -> CompiledModel {
        CompiledModel {
            path: path.to_path_buf(),
            owned: false,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for CompiledModel {
    fn drop(&mut self) {
        if self.owned {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// A loaded model (one function of its package).
pub struct MlModel {
    fw: &'static CoreMlFramework,
    model: Retained,
}

/// The states of a stateful model (KV caches), zero-filled when made (COREML.md §8).
pub struct MlState {
    state: Retained,
}

/// One input of a prediction: its feature name and the planar buffer holding it.
pub struct Input<'a> {
    pub name: &'a str,
    pub layout: Planar,
    pub bytes: &'a mut [u8],
}

impl MlModel {
    /// `-[MLModel newState]` (macOS 15).
    pub fn new_state(&self) -> Result<MlState> {
        let rt = self.fw.fnd.rt;
        if !self.fw.has_state {
            return Err(MacError::Unavailable(Unavailable {
                component: "-[MLModel newState]".into(),
                reason: "stateful models need macOS 15".into(),
            }));
        }
        // (id, SEL) -> id MLState* (+1: a `new` method) — COREML.md §8
        // SAFETY: the class responds to it (has_state); model is live.
        let s = unsafe { msg!(rt, fn(Id, Sel) -> Id)(self.model.id(), rt.sel(NEW_STATE)) };
        // SAFETY: `new…` returns +1 or nil.
        let state = unsafe { Retained::from_owned(rt, s) }.ok_or(MacError::call(
            Step::Load,
            "newState",
            None,
        ))?;
        Ok(MlState { state })
    }

    /// Runs one prediction on `inputs` (and `state` for a stateful model). The input arrays
    /// wrap the callers' buffers without a copy, for the duration of the call.
    pub fn predict(&self, inputs: &mut [Input], state: Option<&MlState>) -> Result<Prediction> {
        let (fw, fnd) = (self.fw, self.fw.fnd);
        let rt = fnd.rt;
        let _pool = AutoreleasePool::new(rt);
        let mut keep = Vec::with_capacity(inputs.len() * 2);
        let mut entries = Vec::with_capacity(inputs.len());
        for input in inputs.iter_mut() {
            if input.bytes.len() < input.layout.bytes() {
                return Err(MacError::Invalid(format!(
                    "input {}: {} bytes, the layout spans {}",
                    input.name,
                    input.bytes.len(),
                    input.layout.bytes()
                )));
            }
            let (shape, strides) = planar_view(&input.layout)?;
            let numbers = |v: &[usize]| {
                v.iter()
                    .map(|&n| fnd.number(n as i64))
                    .collect::<Result<Vec<_>>>()
            };
            let (shape, strides) = (numbers(&shape)?, numbers(&strides)?);
            let ids = |v: &[Retained]| v.iter().map(Retained::id).collect::<Vec<_>>();
            let (shape, strides) = (fnd.array(&ids(&shape))?, fnd.array(&ids(&strides))?);
            let mut err = ErrorOut::new();
            // (id, SEL, void*, id NSArray*, NSInteger MLMultiArrayDataType, id NSArray*, id block, id* NSError**) -> id — FACTS §3.8 (Core ML public API; nil deallocator: the caller owns the bytes)
            // SAFETY: checked at open; the buffer spans the layout (checked above) and outlives
            // the array, which is released with this pool before `predict` returns.
            let array = unsafe {
                msg!(
                    rt,
                    fn(Id, Sel, *mut c_void, Id, NsInteger, Id, Id, *mut Id) -> Id
                )(
                    alloc(rt, fw.multi_array),
                    rt.sel(INIT_ARRAY),
                    input.bytes.as_mut_ptr().cast(),
                    shape.id(),
                    ArrayType::of(input.layout.dtype).raw() as NsInteger,
                    strides.id(),
                    Id::NIL,
                    err.ptr(),
                )
            };
            // SAFETY: alloc/init returns +1 or nil.
            let array = unsafe { Retained::from_owned(rt, array) }.ok_or_else(|| {
                fw.error(
                    Step::Predict,
                    "initWithDataPointer:shape:dataType:strides:deallocator:error:",
                    &err,
                )
            })?;
            // (Class, SEL, id MLMultiArray*) -> id MLFeatureValue* — FACTS §3.8 (Core ML public API)
            // SAFETY: checked at open; array is live.
            let value = unsafe {
                msg!(rt, fn(Class, Sel, Id) -> Id)(
                    fw.feature_value,
                    rt.sel(FEATURE_WITH_ARRAY),
                    array.id(),
                )
            };
            let name = fnd.string(input.name)?;
            entries.push((name.id(), value));
            keep.extend([array, name]);
        }
        let dict = fnd.dictionary(&entries)?;
        let mut err = ErrorOut::new();
        // (id, SEL, id NSDictionary<NSString*, id>*, id* NSError**) -> id — FACTS §3.8 (Core ML public API)
        // SAFETY: checked at open; dict is live.
        let provider = unsafe {
            msg!(rt, fn(Id, Sel, Id, *mut Id) -> Id)(
                alloc(rt, fw.provider),
                rt.sel(INIT_PROVIDER),
                dict.id(),
                err.ptr(),
            )
        };
        // SAFETY: alloc/init returns +1 or nil.
        let provider = unsafe { Retained::from_owned(rt, provider) }
            .ok_or_else(|| fw.error(Step::Predict, "initWithDictionary:error:", &err))?;
        let mut err = ErrorOut::new();
        let out = match state {
            // (id, SEL, id<MLFeatureProvider>, id MLState*, id* NSError**) -> id — COREML.md §8
            // SAFETY: has_state holds whenever an MlState exists; all objects are live.
            Some(s) => unsafe {
                msg!(rt, fn(Id, Sel, Id, Id, *mut Id) -> Id)(
                    self.model.id(),
                    rt.sel(PREDICT_WITH_STATE),
                    provider.id(),
                    s.state.id(),
                    err.ptr(),
                )
            },
            // (id, SEL, id<MLFeatureProvider>, id* NSError**) -> id — FACTS §3.8 (Core ML public API)
            // SAFETY: checked at open; all objects are live.
            None => unsafe {
                msg!(rt, fn(Id, Sel, Id, *mut Id) -> Id)(
                    self.model.id(),
                    rt.sel(PREDICT),
                    provider.id(),
                    err.ptr(),
                )
            },
        };
        // SAFETY: out is nil or a live autoreleased object.
        let result = unsafe { Retained::retain(rt, out) }
            .ok_or_else(|| fw.error(Step::Predict, "predictionFromFeatures:error:", &err))?;
        Ok(Prediction {
            fnd,
            result,
            stack_block: fw.stack_block,
        })
    }
}

/// The outputs of one prediction.
pub struct Prediction {
    fnd: &'static Foundation,
    result: Retained,
    /// `&_NSConcreteStackBlock`, for the output handler.
    stack_block: usize,
}

impl Prediction {
    /// Copies output `name` into the planar buffer `out` laid out as `layout`.
    pub fn copy_output(&self, name: &str, layout: &Planar, out: &mut [u8]) -> Result<()> {
        let fnd = self.fnd;
        let rt = fnd.rt;
        let _pool = AutoreleasePool::new(rt);
        let key = fnd.string(name)?;
        // (id, SEL, id NSString*) -> id MLFeatureValue* — FACTS §3.8 (MLFeatureProvider)
        // SAFETY: result conforms to MLFeatureProvider; key is live.
        let value = unsafe {
            msg!(rt, fn(Id, Sel, Id) -> Id)(
                self.result.id(),
                rt.sel(c"featureValueForName:"),
                key.id(),
            )
        };
        if value.is_nil() {
            return Err(MacError::Invalid(format!(
                "the prediction has no output {name}"
            )));
        }
        // (id, SEL) -> id MLMultiArray* — FACTS §3.8 (-[MLFeatureValue multiArrayValue])
        // SAFETY: value is a live MLFeatureValue.
        let array = unsafe { msg!(rt, fn(Id, Sel) -> Id)(value, rt.sel(c"multiArrayValue")) };
        if array.is_nil() {
            return Err(MacError::Invalid(format!(
                "output {name} is not a multi-array"
            )));
        }
        // (id, SEL) -> NSInteger — FACTS §3.8 (-[MLMultiArray dataType])
        // SAFETY: array is a live MLMultiArray.
        let raw_type = unsafe { msg!(rt, fn(Id, Sel) -> NsInteger)(array, rt.sel(c"dataType")) };
        let dtype = ArrayType::from_raw(raw_type as i64).ok_or_else(|| {
            MacError::Invalid(format!("output {name} has MLMultiArrayDataType {raw_type}"))
        })?;
        // (id, SEL) -> id NSArray<NSNumber*>* — FACTS §3.8 (-[MLMultiArray shape])
        // SAFETY: as above.
        let shape = unsafe { msg!(rt, fn(Id, Sel) -> Id)(array, rt.sel(c"shape")) };
        let shape: Vec<usize> = fnd
            .integers(shape)
            .into_iter()
            .map(|n| n.max(0) as usize)
            .collect();
        let mut copied: Option<Result<()>> = None;
        {
            let mut block = HandlerBlock::new(
                self.stack_block as *const c_void,
                |bytes: *mut c_void, size: NsInteger, strides: Id| {
                    let strides = fnd.integers(strides);
                    copied = Some(ArrayDesc::locked(dtype, shape, strides, size).and_then(
                        |desc| {
                            if bytes.is_null() {
                                return Err(MacError::Invalid(format!(
                                    "output {name}: the array handler gave no buffer"
                                )));
                            }
                            // SAFETY: inside the handler the array's buffer is `size` bytes from
                            // `bytes` and stays put (Apple: the pointer is valid only in the handler).
                            let bytes = unsafe {
                                std::slice::from_raw_parts(
                                    bytes.cast::<u8>().cast_const(),
                                    desc.size,
                                )
                            };
                            copy_into_planar(&desc.array, bytes, layout, out)
                        },
                    ));
                },
            );
            // (id, SEL, void (^)(void*, NSInteger, NSArray*)) -> void — Apple, MLMultiArray
            // -getMutableBytesWithHandler: (checked at open)
            // SAFETY: array is a live MLMultiArray; the block lives on this frame until the call
            // returns, and the handler runs before it does (checked below).
            unsafe {
                msg!(rt, fn(Id, Sel, Id))(array, rt.sel(GET_MUTABLE_BYTES), block.as_block());
            }
        }
        // Never garbage: a handler that did not run before the call returned copied nothing.
        copied.unwrap_or_else(|| {
            Err(MacError::Invalid(format!(
                "output {name}: getMutableBytesWithHandler: returned without calling its handler"
            )))
        })
    }
}
