//! Compiled programs on disk, keyed by the SHA-256 of a unit's MIL text and weight files
//! ([`CompileUnit::cache_key`]) under the device's [`Device::cache_tag`], so that the second
//! start of a model does not recompile. An entry is published by renaming a finished temporary
//! directory (a crash leaves no half entry; of two processes racing, one wins); an entry that
//! fails to load is removed and compiled again.

use std::path::{Path, PathBuf};

use anelm_mil::MilError;

use crate::device::{Device, DeviceError};
use crate::error::Result;
use crate::unit::CompileUnit;

/// What one [`ProgramCache::compile`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Loaded from the cache.
    Hit,
    /// Compiled, and stored.
    Stored,
    /// Compiled; the device keeps no cacheable form.
    Compiled,
    /// The entry did not load; compiled again and stored.
    Repaired,
}

pub struct ProgramCache {
    dir: PathBuf,
}

fn io(path: &Path, e: std::io::Error) -> MilError {
    MilError::io(path, e)
}

impl ProgramCache {
    pub fn new(dir: impl Into<PathBuf>) -> ProgramCache {
        ProgramCache { dir: dir.into() }
    }

    /// The entry directory of `unit` for `device`.
    pub fn entry<D: Device>(&self, device: &D, unit: &CompileUnit) -> PathBuf {
        self.dir.join(device.cache_tag()).join(unit.cache_key())
    }

    /// `unit` compiled on `device`, from the cache when it holds it.
    pub fn compile<D: Device>(
        &self,
        device: &mut D,
        unit: &CompileUnit,
    ) -> Result<(D::Kernel, Outcome)> {
        let entry = self.entry(device, unit);
        let mut repaired = false;
        if entry.is_dir() {
            match device.load_compiled(&entry, &unit.name) {
                Ok(k) => return Ok((k, Outcome::Hit)),
                Err(e) => {
                    tracing::warn!(
                        "program cache: {} does not load ({e}); compiling again",
                        entry.display()
                    );
                    std::fs::remove_dir_all(&entry).map_err(|e| io(&entry, e))?;
                    repaired = true;
                }
            }
        }
        let kernel = device.compile(unit)?;
        if !self.store(device, &kernel, unit, &entry)? {
            return Ok((kernel, Outcome::Compiled));
        }
        Ok((
            kernel,
            if repaired {
                Outcome::Repaired
            } else {
                Outcome::Stored
            },
        ))
    }

    fn store<D: Device>(
        &self,
        device: &D,
        kernel: &D::Kernel,
        unit: &CompileUnit,
        entry: &Path,
    ) -> Result<bool> {
        let parent = entry.parent().unwrap_or(&self.dir);
        std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
        let tmp = parent.join(format!(".tmp-{}-{}", std::process::id(), unit.cache_key()));
        std::fs::create_dir_all(&tmp).map_err(|e| io(&tmp, e))?;
        let saved: std::result::Result<bool, DeviceError> =
            device.save_compiled(kernel, unit, &tmp);
        let publish = match saved {
            Ok(true) => std::fs::rename(&tmp, entry).is_ok() || entry.is_dir(),
            Ok(false) => false,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&tmp);
                return Err(e.into());
            }
        };
        if tmp.exists() {
            // Not published (nothing to store, or another process published first).
            let _ = std::fs::remove_dir_all(&tmp);
        }
        Ok(publish)
    }
}

/// `unit` compiled on `device`, through the cache in `dir` when one is given.
pub fn compile<D: Device>(
    device: &mut D,
    unit: &CompileUnit,
    dir: Option<&Path>,
) -> Result<D::Kernel> {
    match dir {
        Some(d) => Ok(ProgramCache::new(d).compile(device, unit)?.0),
        None => Ok(device.compile(unit)?),
    }
}
