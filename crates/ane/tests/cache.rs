//! The compiled-program cache with the simulator device and with a fake one that counts
//! compiles: a miss stores, a hit loads the same program without compiling, other weights or
//! another OS build are other entries, a damaged or unloadable entry is compiled again.

use std::path::Path;
use std::sync::Arc;

use anelm_ane::cache::{machine_tag, CacheReport, Outcome, ProgramCache, MANIFEST};
use anelm_ane::device::{KernelIo, Stage};
use anelm_ane::lower::{build_unit, projection_kernels};
use anelm_ane::{CompileUnit, Device, DeviceError, LoweringOptions, ProjectionExecutor, SimDevice};
use anelm_model::{Executor, Logits};

#[test]
fn hits_misses_and_repairs() {
    let m = anelm_model::load(&anelm_testkit::tiny("llama")).unwrap();
    let opts = LoweringOptions::default();
    let specs = projection_kernels(&m, &opts).unwrap();
    let (a, b) = (
        build_unit(&m, &specs[0], &opts).unwrap().unit,
        build_unit(&m, &specs[2], &opts).unwrap().unit,
    );
    let dir = tempfile::tempdir().unwrap();
    let cache = ProgramCache::new(dir.path());
    let mut dev = SimDevice::new();
    assert_eq!(cache.compile(&mut dev, &a).unwrap().1, Outcome::Stored);
    let entry = cache.entry(&dev, &a);
    assert!(entry.join("model.mil").exists(), "{}", entry.display());
    assert_eq!(cache.compile(&mut dev, &a).unwrap().1, Outcome::Hit);
    assert_eq!(
        cache.compile(&mut dev, &b).unwrap().1,
        Outcome::Stored,
        "another program, another entry"
    );
    assert_ne!(cache.entry(&dev, &b), entry);
    // A damaged entry: a weight file gone.
    let weights = entry.join("weights");
    let first = std::fs::read_dir(&weights)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::remove_file(first).unwrap();
    assert_eq!(cache.compile(&mut dev, &a).unwrap().1, Outcome::Repaired);
    assert_eq!(cache.compile(&mut dev, &a).unwrap().1, Outcome::Hit);
    let leftovers: Vec<_> = std::fs::read_dir(entry.parent().unwrap())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(".tmp")
        })
        .collect();
    assert!(
        leftovers.is_empty(),
        "no temporary directories are left behind"
    );
}

#[test]
fn a_cached_model_gives_the_same_logits() {
    let m = Arc::new(anelm_model::load(&anelm_testkit::tiny("qwen3")).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let opts = LoweringOptions {
        cache_dir: Some(dir.path().to_path_buf()),
        ..Default::default()
    };
    let run = || {
        let mut e = ProjectionExecutor::on_device(m.clone(), SimDevice::new(), &opts).unwrap();
        let mut s = e.new_state(8).unwrap();
        let mut out = Vec::new();
        e.forward(s.as_mut(), &[5, 17, 300, 42], Logits::All, &mut out)
            .unwrap();
        out
    };
    let first = run();
    let entries = std::fs::read_dir(dir.path().join(SimDevice::new().cache_tag()))
        .unwrap()
        .count();
    assert_eq!(entries, 3 * m.n_layers() + 1, "every kernel stored");
    assert_eq!(run(), first, "the cached programs compute the same");
}

/// A device that compiles nothing real: it counts compiles and loads, can be told to fail every
/// load, and reports a chosen chip and OS build — the cache's logic without a Mac.
struct Fake {
    os_build: String,
    compiles: usize,
    loads: usize,
    fail_loads: bool,
}

impl Fake {
    fn new(os_build: &str) -> Fake {
        Fake {
            os_build: os_build.into(),
            compiles: 0,
            loads: 0,
            fail_loads: false,
        }
    }
}

const PROGRAM: &str = "program.bin";

impl Device for Fake {
    /// The unit's name and key, as the "compiled program".
    type Kernel = (String, String);
    type Binding = ();

    fn name(&self) -> &str {
        "fake"
    }

    fn compile(&mut self, unit: &CompileUnit) -> Result<Self::Kernel, DeviceError> {
        self.compiles += 1;
        Ok((unit.name.clone(), unit.cache_key()))
    }

    fn io<'k>(&self, _: &'k Self::Kernel, _: &str) -> Option<&'k KernelIo> {
        None
    }

    fn bind(&mut self, _: &Self::Kernel, _: &str) -> Result<(), DeviceError> {
        Ok(())
    }

    fn write_input<R>(&mut self, _: &mut (), _: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
        f(&mut [])
    }

    fn read_output<R>(&self, _: &(), _: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        f(&[])
    }

    fn evaluate(&mut self, _: &Self::Kernel, _: &mut (), _: usize) -> Result<(), DeviceError> {
        Ok(())
    }

    fn cache_tag(&self) -> String {
        machine_tag("fake", Some("Test Chip"), Some(&self.os_build))
    }

    fn save_compiled(
        &self,
        kernel: &Self::Kernel,
        _: &CompileUnit,
        dir: &Path,
    ) -> Result<bool, DeviceError> {
        std::fs::write(dir.join(PROGRAM), &kernel.1)
            .map_err(|e| DeviceError::new("fake", Stage::Compile, &kernel.0, e))?;
        Ok(true)
    }

    fn load_compiled(&mut self, dir: &Path, name: &str) -> Result<Self::Kernel, DeviceError> {
        self.loads += 1;
        if self.fail_loads {
            return Err(DeviceError::new(
                "fake",
                Stage::Compile,
                name,
                "told to fail",
            ));
        }
        let key = std::fs::read_to_string(dir.join(PROGRAM))
            .map_err(|e| DeviceError::new("fake", Stage::Compile, name, e))?;
        Ok((name.to_string(), key))
    }
}

fn units() -> Vec<CompileUnit> {
    let m = anelm_model::load(&anelm_testkit::tiny("llama")).unwrap();
    let opts = LoweringOptions::default();
    projection_kernels(&m, &opts).unwrap()[..3]
        .iter()
        .map(|s| build_unit(&m, s, &opts).unwrap().unit)
        .collect()
}

/// One start: every unit through the cache; the report of outcomes.
fn start(cache: &ProgramCache, dev: &mut Fake, units: &[CompileUnit]) -> CacheReport {
    let mut r = CacheReport::default();
    for u in units {
        let (k, o) = cache.compile(dev, u).unwrap();
        assert_eq!(
            k,
            (u.name.clone(), u.cache_key()),
            "the kernel of {}",
            u.name
        );
        r.push(&u.name, o);
    }
    r
}

#[test]
fn a_second_start_compiles_nothing_and_an_os_update_recompiles() {
    let units = units();
    let dir = tempfile::tempdir().unwrap();
    let cache = ProgramCache::new(dir.path());
    let mut first = Fake::new("24D60");
    let r = start(&cache, &mut first, &units);
    assert_eq!((first.compiles, first.loads), (3, 0));
    assert_eq!((r.compiled(), r.loaded()), (3, 0));
    assert!(r.units.iter().all(|(_, o)| *o == Outcome::Stored), "{r:?}");

    let mut second = Fake::new("24D60");
    let r = start(&cache, &mut second, &units);
    assert_eq!(
        (second.compiles, second.loads),
        (0, 3),
        "a second start compiles nothing"
    );
    assert_eq!((r.compiled(), r.loaded()), (0, 3));
    assert_eq!(r.to_json()["loaded"], 3);

    let mut updated = Fake::new("24E248");
    let r = start(&cache, &mut updated, &units);
    assert_eq!(
        (updated.compiles, updated.loads),
        (3, 0),
        "another OS build recompiles"
    );
    assert_eq!(r.compiled(), 3);
    assert_ne!(
        cache.entry(&updated, &units[0]),
        cache.entry(&second, &units[0])
    );
}

#[test]
fn damaged_or_unloadable_entries_are_rebuilt() {
    let units = units();
    let dir = tempfile::tempdir().unwrap();
    let cache = ProgramCache::new(dir.path());
    start(&cache, &mut Fake::new("b"), &units);

    // A flipped byte in one entry: found by the manifest, before the device loads it.
    let program = cache.entry(&Fake::new("b"), &units[1]).join(PROGRAM);
    let mut bytes = std::fs::read(&program).unwrap();
    bytes[0] ^= 1;
    std::fs::write(&program, bytes).unwrap();
    let mut dev = Fake::new("b");
    let r = start(&cache, &mut dev, &units);
    assert_eq!(
        (dev.compiles, dev.loads),
        (1, 2),
        "only the damaged unit is compiled"
    );
    assert_eq!(r.units[1].1, Outcome::Repaired);
    assert_eq!((r.compiled(), r.repaired(), r.loaded()), (1, 1, 2));

    // A manifest cut short, and one removed.
    let m0 = cache.entry(&dev, &units[0]).join(MANIFEST);
    let text = std::fs::read_to_string(&m0).unwrap();
    std::fs::write(&m0, &text[..text.len() / 2]).unwrap();
    std::fs::remove_file(cache.entry(&dev, &units[2]).join(MANIFEST)).unwrap();
    let mut dev = Fake::new("b");
    let r = start(&cache, &mut dev, &units);
    assert_eq!(dev.compiles, 2);
    assert_eq!(r.repaired(), 2, "{r:?}");

    // The device refuses every cached form: all rebuilt, then served again.
    let mut dev = Fake::new("b");
    dev.fail_loads = true;
    let r = start(&cache, &mut dev, &units);
    assert_eq!((dev.compiles, dev.loads, r.repaired()), (3, 3, 3));
    let mut dev = Fake::new("b");
    let r = start(&cache, &mut dev, &units);
    assert_eq!((dev.compiles, r.loaded()), (0, 3));
}
