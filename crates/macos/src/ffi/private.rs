//! The private in-memory path (FACTS §3): `_ANEInMemoryModelDescriptor` from MIL text and weights
//! → `_ANEInMemoryModel` → stage files under `NSTemporaryDirectory()/<hexStringIdentifier>` →
//! compile (skipped when the daemon has it cached) → load (transient failures retried) →
//! `modelAttributes` → requests over IOSurfaces → evaluate → unload.

use std::ffi::{c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libloading::Library;

use super::foundation::{foundation, ErrorOut, Foundation};
use super::iosurface::{iosurface, IoSurface};
use super::loader::{self, APPLE_NEURAL_ENGINE};
use super::objc::{msg, AutoreleasePool, Class, Id, ObjcBool, Retained, Sel, NO};
use crate::budget::{process_budget, CompileBudget};
use crate::error::{MacError, Result, Step, Unavailable};
use crate::layout::{resolve, DeclaredFunction, ModelAttributes, ProcedureIo};
use crate::retry::RetryPolicy;
use crate::saved::SavedFiles;
use crate::staging::{self, ModelFiles, WEIGHT_DATA_KEY, WEIGHT_OFFSET, WEIGHT_OFFSET_KEY};

pub const DESCRIPTOR_CLASS: &CStr = c"_ANEInMemoryModelDescriptor";
pub const MODEL_CLASS: &CStr = c"_ANEInMemoryModel";
pub const REQUEST_CLASS: &CStr = c"_ANERequest";
pub const SURFACE_OBJECT_CLASS: &CStr = c"_ANEIOSurfaceObject";
/// The classes FACTS §3.1 resolves.
pub const CLASSES: [&CStr; 4] = [
    DESCRIPTOR_CLASS,
    MODEL_CLASS,
    REQUEST_CLASS,
    SURFACE_OBJECT_CLASS,
];

const MODEL_WITH_MIL: &CStr = c"modelWithMILText:weights:optionsPlist:";
const IN_MEMORY_MODEL: &CStr = c"inMemoryModelWithDescriptor:";
const REQUEST_WITH: &CStr =
    c"requestWithInputs:inputIndices:outputs:outputIndices:weightsBuffer:perfStats:procedureIndex:";
const OBJECT_WITH_SURFACE: &CStr = c"objectWithIOSurface:";
const HEX_ID: &CStr = c"hexStringIdentifier";
const COMPILE: &CStr = c"compileWithQoS:options:error:";
const LOAD: &CStr = c"loadWithQoS:options:error:";
const EVALUATE: &CStr = c"evaluateWithQoS:options:request:error:";
const UNLOAD: &CStr = c"unloadWithQoS:error:";
const ATTRIBUTES: &CStr = c"modelAttributes";
const COMPILED_EXISTS: &CStr = c"compiledModelExists";

/// `_ANEQoSMapper`'s "Default" level, which every project passes (FACTS §3.2).
pub const DEFAULT_QOS: u32 = 21;

/// How models are compiled and loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    pub qos: u32,
    /// For `loadWithQoS:` failures the framework may recover from (FACTS §3.6).
    pub retry: RetryPolicy,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            qos: DEFAULT_QOS,
            retry: RetryPolicy::default(),
        }
    }
}

struct AneFramework {
    fnd: &'static Foundation,
    descriptor: Class,
    model: Class,
    request: Class,
    surface_object: Class,
    /// `-compiledModelExists` is optional (FACTS §3.2): without it every load compiles.
    has_cache_query: bool,
    _lib: Library,
}

fn ane_framework() -> Result<&'static AneFramework, Unavailable> {
    static ANE_FRAMEWORK: OnceLock<Result<AneFramework, Unavailable>> = OnceLock::new();
    ANE_FRAMEWORK
        .get_or_init(AneFramework::load)
        .as_ref()
        .map_err(Clone::clone)
}

impl AneFramework {
    fn load() -> Result<AneFramework, Unavailable> {
        let fnd = foundation()?;
        iosurface()?;
        let lib = loader::open(APPLE_NEURAL_ENGINE)?;
        let rt = fnd.rt;
        let fw = AneFramework {
            fnd,
            descriptor: rt.class(DESCRIPTOR_CLASS)?,
            model: rt.class(MODEL_CLASS)?,
            request: rt.class(REQUEST_CLASS)?,
            surface_object: rt.class(SURFACE_OBJECT_CLASS)?,
            has_cache_query: false,
            _lib: lib,
        };
        rt.require_class_method(fw.descriptor, DESCRIPTOR_CLASS, MODEL_WITH_MIL)?;
        rt.require_class_method(fw.model, MODEL_CLASS, IN_MEMORY_MODEL)?;
        rt.require_class_method(fw.request, REQUEST_CLASS, REQUEST_WITH)?;
        rt.require_class_method(fw.surface_object, SURFACE_OBJECT_CLASS, OBJECT_WITH_SURFACE)?;
        for sel in [HEX_ID, COMPILE, LOAD, EVALUATE, UNLOAD, ATTRIBUTES] {
            rt.require_method(fw.model, MODEL_CLASS, sel)?;
        }
        Ok(AneFramework {
            has_cache_query: rt.responds(fw.model, COMPILED_EXISTS),
            ..fw
        })
    }
}

/// The private driver of this process.
pub struct PrivateAne {
    fw: &'static AneFramework,
    options: LoadOptions,
    budget: &'static CompileBudget,
}

impl std::fmt::Debug for PrivateAne {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrivateAne")
            .field("options", &self.options)
            .field("compiles", &self.budget.used())
            .finish()
    }
}

impl PrivateAne {
    /// Opens AppleNeuralEngine.framework and checks every class and method the driver calls;
    /// off a Mac this is [`MacError::Unavailable`].
    pub fn open(options: LoadOptions) -> Result<PrivateAne> {
        Ok(PrivateAne {
            fw: ane_framework()?,
            options,
            budget: process_budget()?,
        })
    }

    pub fn budget(&self) -> &'static CompileBudget {
        self.budget
    }

    /// `@{ key: @{ @"offset": @0, @"data": NSData } }` with the exact BLOBFILE path strings as
    /// keys (FACTS §2 end); `@{}` for a program without weights (nil crashed, ORI #11).
    fn weights_dictionary(&self, files: &ModelFiles) -> Result<Retained> {
        let fnd = self.fw.fnd;
        let (offset_key, data_key, offset) = (
            fnd.string(WEIGHT_OFFSET_KEY)?,
            fnd.string(WEIGHT_DATA_KEY)?,
            fnd.number(WEIGHT_OFFSET)?,
        );
        let mut keep = Vec::with_capacity(files.weights.len() * 3);
        let mut entries = Vec::with_capacity(files.weights.len());
        for (key, bytes) in files.weights {
            let data = fnd.data(bytes)?;
            let inner =
                fnd.dictionary(&[(offset_key.id(), offset.id()), (data_key.id(), data.id())])?;
            let key = fnd.string(key)?;
            entries.push((key.id(), inner.id()));
            keep.extend([data, inner, key]);
        }
        fnd.dictionary(&entries)
    }

    /// Compiles (unless the daemon has it cached) and loads one program. Its `modelAttributes`
    /// are saved as JSON next to the staged program ([`AneModel::saved_files`]); on any failure
    /// the MIL text is saved too and the error names both files ([`MacError::Saved`]).
    pub fn load(&self, files: &ModelFiles) -> Result<AneModel> {
        self.open_model(files, true)
    }

    /// Loads one program the daemon holds compiled, compiling nothing: the same MIL text and
    /// weight bytes give the same `hexStringIdentifier`, and `compiledModelExists` says whether
    /// `loadWithQoS:` can skip the compiler (FACTS §3.3; the daemon's cache is keyed by that
    /// identifier, which covers the weight bytes). [`MacError::NotCompiled`] when it cannot.
    pub fn load_compiled(&self, files: &ModelFiles) -> Result<AneModel> {
        self.open_model(files, false)
    }

    fn open_model(&self, files: &ModelFiles, may_compile: bool) -> Result<AneModel> {
        let tmp = self.fw.fnd.temporary_directory().ok_or(MacError::call(
            Step::Describe,
            "NSTemporaryDirectory",
            None,
        ))?;
        let mut saved = SavedFiles::new(&tmp, files.name, None, files.mil_text);
        self.load_in(files, &tmp, &mut saved, may_compile)
            .map_err(|e| saved.fail(e, files.mil_text))
    }

    fn load_in(
        &self,
        files: &ModelFiles,
        tmp: &Path,
        saved: &mut SavedFiles,
        may_compile: bool,
    ) -> Result<AneModel> {
        staging::check(files)?;
        let (fw, fnd) = (self.fw, self.fw.fnd);
        let rt = fnd.rt;
        let _pool = AutoreleasePool::new(rt);
        let mil = fnd.data(files.mil_text.as_bytes())?;
        let weights = self.weights_dictionary(files)?;
        // (Class, SEL, id NSData*, id NSDictionary*, id) -> id — FACTS §3.2 (optionsPlist nil)
        // SAFETY: the selector was checked at open; mil and weights are live objects.
        let desc = unsafe {
            msg!(rt, fn(Class, Sel, Id, Id, Id) -> Id)(
                fw.descriptor,
                rt.sel(MODEL_WITH_MIL),
                mil.id(),
                weights.id(),
                Id::NIL,
            )
        };
        if desc.is_nil() {
            return Err(MacError::call(
                Step::Describe,
                "modelWithMILText:weights:optionsPlist:",
                None,
            ));
        }
        // (Class, SEL, id) -> id — FACTS §3.2
        // SAFETY: checked at open; desc is a live descriptor (autoreleased in this pool).
        let model =
            unsafe { msg!(rt, fn(Class, Sel, Id) -> Id)(fw.model, rt.sel(IN_MEMORY_MODEL), desc) };
        // SAFETY: model is nil or a live autoreleased object.
        let model = unsafe { Retained::retain(rt, model) }.ok_or(MacError::call(
            Step::Describe,
            "inMemoryModelWithDescriptor:",
            None,
        ))?;
        // (id, SEL) -> id NSString* — FACTS §3.2
        // SAFETY: checked at open; model is live.
        let hex = unsafe { msg!(rt, fn(Id, Sel) -> Id)(model.id(), rt.sel(HEX_ID)) };
        let hex = fnd.read_string(hex).ok_or(MacError::call(
            Step::Describe,
            "hexStringIdentifier",
            None,
        ))?;
        *saved = SavedFiles::new(tmp, files.name, Some(&hex), files.mil_text);
        let staging = staging::staging_dir(tmp, &hex)?;
        let mut m = AneModel {
            fw,
            model,
            options: fnd.dictionary(&[])?,
            hex,
            staging,
            qos: self.options.qos,
            attributes: serde_json::Value::Null,
            saved: saved.clone(),
            compiled: false,
            loaded: false,
        };
        staging::stage(&m.staging, files)?;
        let cached = fw.has_cache_query && m.compiled_model_exists();
        if !cached && !may_compile {
            return Err(MacError::NotCompiled {
                identifier: m.hex.clone(),
            });
        }
        if !cached {
            self.compile(&m)?;
            m.compiled = true;
        }
        match self.load_with_retry(&m) {
            Ok(()) => {}
            // OMX: a restored (cached) program that fails to load is recompiled once.
            Err(e) if cached && may_compile && !e.is_unavailable() => {
                self.compile(&m)?;
                m.compiled = true;
                self.load_with_retry(&m)?;
            }
            Err(e) => return Err(e),
        }
        m.loaded = true;
        // (id, SEL) -> id NSDictionary* — FACTS §3.2 (optional list) and §3.5
        // SAFETY: checked at open; the model is loaded.
        let attrs = unsafe { msg!(rt, fn(Id, Sel) -> Id)(m.model.id(), rt.sel(ATTRIBUTES)) };
        m.attributes = fnd.to_json(attrs);
        // Kept whatever follows: layout resolution reads them next, and may fail.
        if let Err(e) = m.saved.save_attributes(&m.attributes) {
            tracing::warn!(
                "modelAttributes of {}: could not save them: {e}",
                files.name
            );
        }
        Ok(m)
    }

    fn compile(&self, m: &AneModel) -> Result<()> {
        self.budget.take()?;
        let rt = self.fw.fnd.rt;
        let _pool = AutoreleasePool::new(rt);
        let mut err = ErrorOut::new();
        // (id, SEL, uint32_t, id NSDictionary*, id* NSError**) -> BOOL — FACTS §3.2 (options @{})
        // SAFETY: checked at open; model and options are live; err is a valid out-pointer.
        let ok = unsafe {
            msg!(rt, fn(Id, Sel, u32, Id, *mut Id) -> ObjcBool)(
                m.model.id(),
                rt.sel(COMPILE),
                m.qos,
                m.options.id(),
                err.ptr(),
            )
        };
        if ok == NO {
            return Err(MacError::call(
                Step::Compile,
                "compileWithQoS:options:error:",
                self.fw.fnd.error_info(err.0),
            ));
        }
        Ok(())
    }

    fn load_with_retry(&self, m: &AneModel) -> Result<()> {
        let rt = self.fw.fnd.rt;
        let once = || {
            let _pool = AutoreleasePool::new(rt);
            let mut err = ErrorOut::new();
            // (id, SEL, uint32_t, id NSDictionary*, id* NSError**) -> BOOL — FACTS §3.2
            // SAFETY: as in compile.
            let ok = unsafe {
                msg!(rt, fn(Id, Sel, u32, Id, *mut Id) -> ObjcBool)(
                    m.model.id(),
                    rt.sel(LOAD),
                    m.qos,
                    m.options.id(),
                    err.ptr(),
                )
            };
            if ok == NO {
                return Err(MacError::call(
                    Step::Load,
                    "loadWithQoS:options:error:",
                    self.fw.fnd.error_info(err.0),
                ));
            }
            Ok(())
        };
        self.options
            .retry
            .run(once, MacError::is_transient, std::thread::sleep)
    }
}

/// A compiled and loaded program. Unloaded (and its staging directory removed) on drop.
pub struct AneModel {
    fw: &'static AneFramework,
    model: Retained,
    /// The `@{}` options of every call.
    options: Retained,
    hex: String,
    staging: PathBuf,
    qos: u32,
    attributes: serde_json::Value,
    saved: SavedFiles,
    compiled: bool,
    loaded: bool,
}

impl std::fmt::Debug for AneModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AneModel")
            .field("hex", &self.hex)
            .field("staging", &self.staging)
            .field("compiled", &self.compiled)
            .finish()
    }
}

impl AneModel {
    fn compiled_model_exists(&self) -> bool {
        let rt = self.fw.fnd.rt;
        // (id, SEL) -> BOOL — FACTS §3.2 (optional list; the daemon's cache, §3.3)
        // SAFETY: only called when the class responds to it (has_cache_query); model is live.
        unsafe { msg!(rt, fn(Id, Sel) -> ObjcBool)(self.model.id(), rt.sel(COMPILED_EXISTS)) != NO }
    }

    /// `hexStringIdentifier`: the framework's key of this program.
    pub fn identifier(&self) -> &str {
        &self.hex
    }

    /// False when the daemon had the program cached and no compile ran.
    pub fn compiled(&self) -> bool {
        self.compiled
    }

    /// `modelAttributes` as JSON (for reports).
    pub fn attributes_json(&self) -> &serde_json::Value {
        &self.attributes
    }

    /// Where this program's attributes (and, after a failure, its MIL text) are saved.
    pub fn saved_files(&self) -> &SavedFiles {
        &self.saved
    }

    /// The layout of MIL function `f` (one of `n_functions`), from `modelAttributes`.
    pub fn io(&self, f: &DeclaredFunction, n_functions: usize) -> Result<ProcedureIo> {
        resolve(
            &ModelAttributes::from_json(&self.attributes)?,
            f,
            n_functions,
        )
    }

    /// Surfaces for every input and output of `io` and the request binding them to their
    /// symbols (FACTS §3.4; built once and reused).
    pub fn request(&self, io: &ProcedureIo) -> Result<AneRequest> {
        let (fw, fnd) = (self.fw, self.fw.fnd);
        let rt = fnd.rt;
        let _pool = AutoreleasePool::new(rt);
        let inputs = io
            .inputs
            .iter()
            .map(|s| IoSurface::new(s.bytes))
            .collect::<Result<Vec<_>>>()?;
        let outputs = io
            .outputs
            .iter()
            .map(|s| IoSurface::new(s.bytes))
            .collect::<Result<Vec<_>>>()?;
        let wrap = |s: &IoSurface| {
            // (Class, SEL, IOSurfaceRef) -> id — FACTS §3.2
            // SAFETY: checked at open; s is a live IOSurface.
            let o = unsafe {
                msg!(rt, fn(Class, Sel, *mut c_void) -> Id)(
                    fw.surface_object,
                    rt.sel(OBJECT_WITH_SURFACE),
                    s.raw(),
                )
            };
            // SAFETY: o is nil or a live autoreleased object.
            unsafe { Retained::retain(rt, o) }.ok_or(MacError::call(
                Step::Evaluate,
                "objectWithIOSurface:",
                None,
            ))
        };
        let ids = |v: &[Retained]| v.iter().map(Retained::id).collect::<Vec<_>>();
        let numbers = |v: &mut dyn Iterator<Item = u32>| {
            v.map(|i| fnd.number(i as i64)).collect::<Result<Vec<_>>>()
        };
        let in_objs = inputs.iter().map(wrap).collect::<Result<Vec<_>>>()?;
        let out_objs = outputs.iter().map(wrap).collect::<Result<Vec<_>>>()?;
        let in_idx = numbers(&mut io.inputs.iter().map(|s| s.symbol))?;
        let out_idx = numbers(&mut io.outputs.iter().map(|s| s.symbol))?;
        let (in_arr, out_arr) = (fnd.array(&ids(&in_objs))?, fnd.array(&ids(&out_objs))?);
        let (in_idx_arr, out_idx_arr) = (fnd.array(&ids(&in_idx))?, fnd.array(&ids(&out_idx))?);
        let procedure = fnd.number(io.procedure as i64)?;
        // (Class, SEL, id NSArray*, id NSArray<NSNumber*>*, id NSArray*, id NSArray<NSNumber*>*, id, id, id NSNumber*) -> id — FACTS §3.2 (weightsBuffer nil, perfStats nil)
        // SAFETY: checked at open; every argument is a live object or nil where FACTS allows.
        let req = unsafe {
            msg!(rt, fn(Class, Sel, Id, Id, Id, Id, Id, Id, Id) -> Id)(
                fw.request,
                rt.sel(REQUEST_WITH),
                in_arr.id(),
                in_idx_arr.id(),
                out_arr.id(),
                out_idx_arr.id(),
                Id::NIL,
                Id::NIL,
                procedure.id(),
            )
        };
        // SAFETY: req is nil or a live autoreleased object.
        let request = unsafe { Retained::retain(rt, req) }.ok_or(MacError::call(
            Step::Evaluate,
            "requestWithInputs:…procedureIndex:",
            None,
        ))?;
        Ok(AneRequest {
            request,
            _surface_objects: in_objs.into_iter().chain(out_objs).collect(),
            inputs,
            outputs,
        })
    }

    /// Runs the request's procedure; the call returns when the outputs are written (FACTS §3.6b).
    pub fn evaluate(&self, req: &AneRequest) -> Result<()> {
        let rt = self.fw.fnd.rt;
        let _pool = AutoreleasePool::new(rt);
        let mut err = ErrorOut::new();
        // (id, SEL, uint32_t, id NSDictionary*, id _ANERequest*, id* NSError**) -> BOOL — FACTS §3.2
        // SAFETY: checked at open; model, options and request are live; the request's surfaces
        // are owned by `req` and unlocked (every lock is scoped to one closure).
        let ok = unsafe {
            msg!(rt, fn(Id, Sel, u32, Id, Id, *mut Id) -> ObjcBool)(
                self.model.id(),
                rt.sel(EVALUATE),
                self.qos,
                self.options.id(),
                req.request.id(),
                err.ptr(),
            )
        };
        if ok == NO {
            return Err(MacError::call(
                Step::Evaluate,
                "evaluateWithQoS:options:request:error:",
                self.fw.fnd.error_info(err.0),
            ));
        }
        Ok(())
    }
}

impl Drop for AneModel {
    fn drop(&mut self) {
        if self.loaded {
            let rt = self.fw.fnd.rt;
            let _pool = AutoreleasePool::new(rt);
            let mut err = ErrorOut::new();
            // (id, SEL, uint32_t, id* NSError**) -> BOOL — FACTS §3.2 (also deletes the staging dir, [DEC])
            // SAFETY: checked at open; the model is loaded. A failed unload leaves nothing to
            // release on our side; there is no caller to report it to.
            unsafe {
                msg!(rt, fn(Id, Sel, u32, *mut Id) -> ObjcBool)(
                    self.model.id(),
                    rt.sel(UNLOAD),
                    self.qos,
                    err.ptr(),
                )
            };
        }
        // Unload removes the directory itself; after a failed compile or load we do.
        let _ = std::fs::remove_dir_all(&self.staging);
    }
}

/// The surfaces of one procedure and the request that binds them.
pub struct AneRequest {
    request: Retained,
    _surface_objects: Vec<Retained>,
    inputs: Vec<IoSurface>,
    outputs: Vec<IoSurface>,
}

impl AneRequest {
    /// Input `i`, in the order of [`ProcedureIo::inputs`].
    pub fn input(&mut self, i: usize) -> Option<&mut IoSurface> {
        self.inputs.get_mut(i)
    }

    /// Output `i`, in the order of [`ProcedureIo::outputs`].
    pub fn output(&self, i: usize) -> Option<&IoSurface> {
        self.outputs.get(i)
    }
}
