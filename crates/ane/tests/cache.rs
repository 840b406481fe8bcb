//! The compiled-program cache with the simulator device: a miss stores, a hit loads the same
//! program, other weights are another entry, a damaged entry is compiled again.

use std::sync::Arc;

use anelm_ane::cache::{Outcome, ProgramCache};
use anelm_ane::lower::{build_unit, projection_kernels};
use anelm_ane::{Device, LoweringOptions, ProjectionExecutor, SimDevice};
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
