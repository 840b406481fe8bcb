//! Compiled programs on disk, so that the second start of a model compiles nothing: one entry
//! per unit, keyed by the SHA-256 of its MIL text and weight files ([`CompileUnit::cache_key`])
//! under the device's [`Device::cache_tag`] (device kind, chip, OS build: [`machine_tag`]).
//!
//! The device writes what it needs to reload a kernel ([`Device::save_compiled`]); this module
//! alone decides hit, miss and repair, for every device. Each entry carries a manifest
//! (`anelm-entry.json`: unit, key, tag, and the size and SHA-256 of every file), so a damaged
//! entry is found before the device sees it and never runs. An entry is published by renaming a
//! finished temporary directory (a crash leaves no half entry; of two processes racing, one
//! wins); an entry that is damaged or does not load is removed and compiled again, with one
//! warning.

use std::io::Read;
use std::path::{Path, PathBuf};

use anelm_mil::MilError;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::device::Device;
use crate::error::Result;
use crate::unit::CompileUnit;

/// The manifest of an entry.
pub const MANIFEST: &str = "anelm-entry.json";
/// Bumped when the layout of entries changes: older entries are then misses.
const FORMAT: u64 = 1;

/// What one [`ProgramCache::compile`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Loaded from the cache: nothing compiled.
    Hit,
    /// Compiled, and stored.
    Stored,
    /// Compiled; not stored (no cache, or the device keeps no cacheable form).
    Compiled,
    /// The entry was damaged or did not load; compiled again and stored.
    Repaired,
}

impl Outcome {
    /// Whether the device compiled the unit.
    pub fn compiled(self) -> bool {
        self != Outcome::Hit
    }

    pub fn name(self) -> &'static str {
        match self {
            Outcome::Hit => "loaded",
            Outcome::Stored => "compiled",
            Outcome::Compiled => "compiled (not cached)",
            Outcome::Repaired => "repaired",
        }
    }
}

/// What became of every unit of a model: compiled or loaded from the cache.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheReport {
    pub units: Vec<(String, Outcome)>,
}

impl CacheReport {
    pub fn push(&mut self, unit: &str, outcome: Outcome) {
        self.units.push((unit.to_string(), outcome));
    }

    /// Units the device compiled.
    pub fn compiled(&self) -> usize {
        self.units.iter().filter(|(_, o)| o.compiled()).count()
    }

    /// Units loaded from the cache.
    pub fn loaded(&self) -> usize {
        self.units.len() - self.compiled()
    }

    /// Entries found damaged (or not loading) and rebuilt.
    pub fn repaired(&self) -> usize {
        self.units
            .iter()
            .filter(|(_, o)| *o == Outcome::Repaired)
            .count()
    }

    /// `{"compiled", "loaded", "repaired", "units": {name: outcome}}`.
    pub fn to_json(&self) -> Value {
        let units: serde_json::Map<String, Value> = self
            .units
            .iter()
            .map(|(n, o)| (n.clone(), Value::from(o.name())))
            .collect();
        json!({
            "compiled": self.compiled(),
            "loaded": self.loaded(),
            "repaired": self.repaired(),
            "units": units,
        })
    }
}

/// The cache tag of a hardware device: its kind, the chip and the OS build, as one directory
/// name. A compiler of another chip or OS build gets other entries; what is unknown says so.
pub fn machine_tag(kind: &str, chip: Option<&str>, os_build: Option<&str>) -> String {
    let clean = |s: &str| -> String {
        s.trim()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    format!(
        "{}-{}-{}",
        clean(kind),
        clean(chip.unwrap_or("unknown-chip")),
        clean(os_build.unwrap_or("unknown-os"))
    )
}

pub struct ProgramCache {
    dir: PathBuf,
}

fn io(path: &Path, e: std::io::Error) -> MilError {
    MilError::io(path, e)
}

fn sha256_file(path: &Path) -> std::io::Result<(u64, String)> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf)?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok((n, h.finalize().iter().map(|b| format!("{b:02x}")).collect()))
}

/// Every file under `dir` (recursively), as paths relative to it, sorted.
fn files_under(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        for e in std::fs::read_dir(dir.join(&rel))? {
            let e = e?;
            let r = rel.join(e.file_name());
            if e.file_type()?.is_dir() {
                todo.push(r);
            } else {
                out.push(r);
            }
        }
    }
    out.sort();
    Ok(out)
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
        let tag = device.cache_tag();
        let entry = self.entry(device, unit);
        let mut repaired = false;
        if entry.exists() {
            let loaded = self.check(&entry, &tag, unit).and_then(|()| {
                device
                    .load_compiled(&entry, &unit.name)
                    .map_err(|e| e.to_string())
            });
            match loaded {
                Ok(k) => return Ok((k, Outcome::Hit)),
                Err(why) => {
                    tracing::warn!(
                        "program cache: the entry of {} ({}) is unusable: {why}; compiling it again",
                        unit.name,
                        entry.display()
                    );
                    std::fs::remove_dir_all(&entry).map_err(|e| io(&entry, e))?;
                    repaired = true;
                }
            }
        }
        let kernel = device.compile(unit)?;
        if !self.store(device, &kernel, unit, &tag, &entry)? {
            return Ok((kernel, Outcome::Compiled));
        }
        let outcome = if repaired {
            Outcome::Repaired
        } else {
            Outcome::Stored
        };
        Ok((kernel, outcome))
    }

    /// Whether `entry`'s manifest is for `unit` under `tag` and every file it lists is intact.
    fn check(
        &self,
        entry: &Path,
        tag: &str,
        unit: &CompileUnit,
    ) -> std::result::Result<(), String> {
        let text = std::fs::read_to_string(entry.join(MANIFEST))
            .map_err(|e| format!("{MANIFEST}: {e}"))?;
        let m: Value = serde_json::from_str(&text).map_err(|e| format!("{MANIFEST}: {e}"))?;
        if m["format"].as_u64() != Some(FORMAT) {
            return Err(format!(
                "{MANIFEST}: format {} (expected {FORMAT})",
                m["format"]
            ));
        }
        let (key, want_key) = (m["key"].as_str(), unit.cache_key());
        if key != Some(want_key.as_str()) || m["tag"].as_str() != Some(tag) {
            return Err(format!("{MANIFEST} names another program or device"));
        }
        let files = m["files"]
            .as_array()
            .ok_or_else(|| format!("{MANIFEST}: no file list"))?;
        for f in files {
            let (Some(rel), Some(bytes), Some(sha)) = (
                f["path"].as_str(),
                f["bytes"].as_u64(),
                f["sha256"].as_str(),
            ) else {
                return Err(format!("{MANIFEST}: malformed file entry {f}"));
            };
            if Path::new(rel)
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
            {
                return Err(format!("{MANIFEST}: file path {rel} leaves the entry"));
            }
            let (n, h) = sha256_file(&entry.join(rel)).map_err(|e| format!("{rel}: {e}"))?;
            if n != bytes || h != sha {
                return Err(format!("{rel} has changed ({n} bytes, expected {bytes})"));
            }
        }
        Ok(())
    }

    fn store<D: Device>(
        &self,
        device: &D,
        kernel: &D::Kernel,
        unit: &CompileUnit,
        tag: &str,
        entry: &Path,
    ) -> Result<bool> {
        let parent = entry.parent().unwrap_or(&self.dir);
        std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
        let tmp = parent.join(format!(".tmp-{}-{}", std::process::id(), unit.cache_key()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(|e| io(&tmp, e))?;
        let written = device
            .save_compiled(kernel, unit, &tmp)
            .map_err(crate::AneError::from)
            .and_then(|saved| {
                if saved {
                    Self::write_manifest(&tmp, tag, unit)?;
                }
                Ok(saved)
            });
        let publish = match written {
            Ok(true) => std::fs::rename(&tmp, entry).is_ok() || entry.is_dir(),
            Ok(false) => false,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&tmp);
                return Err(e);
            }
        };
        if tmp.exists() {
            // Not published (nothing to store, or another process published first).
            let _ = std::fs::remove_dir_all(&tmp);
        }
        Ok(publish)
    }

    fn write_manifest(dir: &Path, tag: &str, unit: &CompileUnit) -> Result<()> {
        let files = files_under(dir).map_err(|e| io(dir, e))?;
        let mut list = Vec::with_capacity(files.len());
        for rel in files {
            let p = dir.join(&rel);
            let (bytes, sha) = sha256_file(&p).map_err(|e| io(&p, e))?;
            let rel: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            list.push(json!({"path": rel.join("/"), "bytes": bytes, "sha256": sha}));
        }
        let m = json!({
            "format": FORMAT,
            "unit": unit.name,
            "key": unit.cache_key(),
            "tag": tag,
            "files": list,
        });
        let p = dir.join(MANIFEST);
        std::fs::write(&p, format!("{m:#}\n")).map_err(|e| io(&p, e))?;
        Ok(())
    }
}

/// `unit` compiled on `device`, through the cache in `dir` when one is given.
pub fn compile<D: Device>(
    device: &mut D,
    unit: &CompileUnit,
    dir: Option<&Path>,
) -> Result<(D::Kernel, Outcome)> {
    match dir {
        Some(d) => ProgramCache::new(d).compile(device, unit),
        None => Ok((device.compile(unit)?, Outcome::Compiled)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_tags_name_chip_and_build_as_one_directory() {
        assert_eq!(
            machine_tag("ane", Some("Apple M3 Max"), Some("24D60")),
            "ane-Apple_M3_Max-24D60"
        );
        assert_eq!(
            machine_tag("coreml", None, Some("../x")),
            "coreml-unknown-chip-.._x"
        );
        assert_ne!(
            machine_tag("ane", Some("Apple M1"), Some("24D60")),
            machine_tag("ane", Some("Apple M1"), Some("24E248"))
        );
    }
}
