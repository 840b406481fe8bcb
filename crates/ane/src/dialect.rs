//! Which of the two hardware-proven MIL dialects (FACTS §1.1) the lowering emits, and how `auto`
//! picks one: from what this machine was seen to accept (remembered on disk, `probe.json`),
//! else from the OS version — no public source reports dialect A on macOS 14 (issue #14).
//!
//! Dialect A is `program(1.3)` / `ios18` (Core ML spec 9: states and multifunction packages);
//! dialect B is `program(1.0)` / `ios16` (spec 7): the KV cache is then always inputs and
//! outputs, and a Core ML package holds one function.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anelm_mil::{Dialect, Opset};
use serde_json::{json, Value};

/// One of the two dialects.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MilDialect {
    /// `program(1.3)`, `func main<ios18>`, short scalars.
    #[default]
    A,
    /// `program(1.0)`, `func main<ios16>`, scalars as `tensor<T, []>`.
    B,
}

impl MilDialect {
    pub const ALL: [MilDialect; 2] = [MilDialect::A, MilDialect::B];

    /// `a` or `b` (the CLI's and probe.json's spelling).
    pub fn name(self) -> &'static str {
        match self {
            MilDialect::A => "a",
            MilDialect::B => "b",
        }
    }

    pub fn from_name(s: &str) -> Option<MilDialect> {
        MilDialect::ALL.into_iter().find(|d| d.name() == s)
    }

    /// The text form.
    pub fn mil(self) -> Dialect {
        match self {
            MilDialect::A => Dialect::a(),
            MilDialect::B => Dialect::b(),
        }
    }

    /// The opset every function is built for (A ↔ ios18, B ↔ ios16, FACTS §1.2).
    pub fn opset(self) -> Opset {
        self.mil().proven_opset()
    }

    /// Whether Core ML packages of this dialect can hold states and several functions
    /// (both need specificationVersion 9, COREML.md §7–8).
    pub fn has_states_and_multifunction(self) -> bool {
        self.opset() >= Opset::Ios18
    }
}

impl std::fmt::Display for MilDialect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What the user asked for (`--mil-dialect`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DialectChoice {
    #[default]
    Auto,
    Fixed(MilDialect),
}

/// The dialect from the OS alone: macOS older than 15 gets B, anything else (macOS 15+, or no
/// macOS at all — the simulator) A. `os_version` is `kern.osproductversion` ("14.6.1").
pub fn dialect_for_os(os_version: Option<&str>) -> MilDialect {
    let major = os_version
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.trim().parse::<u32>().ok());
    match major {
        Some(m) if m < 15 => MilDialect::B,
        _ => MilDialect::A,
    }
}

/// What a machine answered when a program of a dialect was compiled and run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Accepted,
    Rejected,
}

impl Verdict {
    fn name(self) -> &'static str {
        match self {
            Verdict::Accepted => "accepted",
            Verdict::Rejected => "rejected",
        }
    }

    fn from_name(s: &str) -> Option<Verdict> {
        [Verdict::Accepted, Verdict::Rejected]
            .into_iter()
            .find(|v| v.name() == s)
    }
}

/// The remembered probe answers (`$ANELM_PROGRAMS/probe.json`), per machine: a machine is its
/// chip and OS build, since an OS update may change the compiler's answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProbeMemory {
    machines: BTreeMap<String, BTreeMap<MilDialect, Verdict>>,
    /// Per machine and dialect: the census forms probed there, and whether each passed.
    forms: BTreeMap<String, BTreeMap<MilDialect, BTreeMap<String, bool>>>,
}

/// The file name under the programs cache directory.
pub const PROBE_FILE: &str = "probe.json";
const FORMAT: u64 = 1;

/// Where [`ProbeMemory`] lives for a programs cache directory.
pub fn probe_path(programs_dir: &Path) -> PathBuf {
    programs_dir.join(PROBE_FILE)
}

/// The key of a machine in [`ProbeMemory`]: `chip/os_build` ("Apple M1 Pro/23G93").
pub fn machine_key(chip: &str, os_build: &str) -> String {
    format!("{chip}/{os_build}")
}

impl ProbeMemory {
    /// Reads `path`; a missing file is an empty memory. A file that is not a probe memory is an
    /// error naming it (the caller decides whether to ignore it).
    pub fn load(path: &Path) -> Result<ProbeMemory, String> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ProbeMemory::default()),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    fn parse(text: &str) -> Result<ProbeMemory, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        if v["format"].as_u64() != Some(FORMAT) {
            return Err(format!("not a probe memory of format {FORMAT}"));
        }
        let machines = v["machines"]
            .as_object()
            .ok_or("\"machines\" is not an object")?;
        let mut out = ProbeMemory::default();
        for (key, m) in machines {
            let dialects = m["dialects"]
                .as_object()
                .ok_or_else(|| format!("machine {key:?}: \"dialects\" is not an object"))?;
            if let Some(forms) = m.get("forms") {
                let forms = forms
                    .as_object()
                    .ok_or_else(|| format!("machine {key:?}: \"forms\" is not an object"))?;
                for (d, verdicts) in forms {
                    let dialect = MilDialect::from_name(d)
                        .ok_or_else(|| format!("machine {key:?}: unknown dialect {d:?}"))?;
                    let bad = || format!("machine {key:?}: forms {d}: not form -> pass|fail");
                    let verdicts = verdicts.as_object().ok_or_else(bad)?;
                    let mut list = Vec::new();
                    for (form, v) in verdicts {
                        let pass = match v.as_str() {
                            Some("pass") => true,
                            Some("fail") => false,
                            _ => return Err(bad()),
                        };
                        list.push((form.clone(), pass));
                    }
                    out.set_forms(key, dialect, list);
                }
            }
            let entry = out.machines.entry(key.clone()).or_default();
            for (d, verdict) in dialects {
                let dialect = MilDialect::from_name(d)
                    .ok_or_else(|| format!("machine {key:?}: unknown dialect {d:?}"))?;
                let verdict = verdict
                    .as_str()
                    .and_then(Verdict::from_name)
                    .ok_or_else(|| format!("machine {key:?}: dialect {d}: bad verdict"))?;
                entry.insert(dialect, verdict);
            }
        }
        out.machines.retain(|_, d| !d.is_empty());
        Ok(out)
    }

    fn to_json(&self) -> Value {
        let keys: BTreeSet<&String> = self.machines.keys().chain(self.forms.keys()).collect();
        let machines: serde_json::Map<String, Value> = keys
            .into_iter()
            .map(|k| {
                let d: serde_json::Map<String, Value> = (self.machines.get(k).into_iter())
                    .flatten()
                    .map(|(d, v)| (d.name().to_string(), json!(v.name())))
                    .collect();
                let mut m = json!({ "dialects": d });
                if let Some(f) = self.forms.get(k) {
                    let f: serde_json::Map<String, Value> = f
                        .iter()
                        .map(|(d, forms)| {
                            let v: serde_json::Map<String, Value> = (forms.iter())
                                .map(|(k, &ok)| {
                                    (k.clone(), json!(if ok { "pass" } else { "fail" }))
                                })
                                .collect();
                            (d.name().to_string(), json!(v))
                        })
                        .collect();
                    m["forms"] = json!(f);
                }
                (k.clone(), m)
            })
            .collect();
        json!({ "format": FORMAT, "machines": machines })
    }

    /// Writes `path` (creating its directory) through a temporary file and a rename, so a
    /// reader never sees half a file.
    pub fn save(&self, path: &Path) -> Result<(), String> {
        let fail = |e: std::io::Error| format!("{}: {e}", path.display());
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(fail)?;
        }
        let tmp = path.with_extension(format!("json.tmp{}", std::process::id()));
        let text = serde_json::to_string_pretty(&self.to_json()).expect("JSON of strings");
        std::fs::write(&tmp, text + "\n").map_err(fail)?;
        std::fs::rename(&tmp, path).map_err(fail)
    }

    pub fn record(&mut self, machine: &str, dialect: MilDialect, verdict: Verdict) {
        self.machines
            .entry(machine.to_string())
            .or_default()
            .insert(dialect, verdict);
    }

    /// Replaces what is remembered of the census forms probed on `machine` in `dialect`
    /// (form key, passed).
    pub fn set_forms(&mut self, machine: &str, dialect: MilDialect, forms: Vec<(String, bool)>) {
        let m = self.forms.entry(machine.to_string()).or_default();
        if forms.is_empty() {
            m.remove(&dialect);
        } else {
            m.insert(dialect, forms.into_iter().collect());
        }
    }

    /// The census forms probed on `machine` in `dialect`, and whether each passed.
    pub fn forms(&self, machine: &str, dialect: MilDialect) -> Vec<(String, bool)> {
        (self.forms.get(machine).and_then(|m| m.get(&dialect)))
            .map(|m| m.iter().map(|(k, &v)| (k.clone(), v)).collect())
            .unwrap_or_default()
    }

    /// The op types with a census form that failed on `machine` in `dialect` (sorted).
    pub fn failed_ops(&self, machine: &str, dialect: MilDialect) -> Vec<String> {
        let ops: BTreeSet<String> = (self.forms(machine, dialect).into_iter())
            .filter(|(_, ok)| !ok)
            .map(|(k, _)| k.split('(').next().unwrap_or(&k).to_string())
            .collect();
        ops.into_iter().collect()
    }

    pub fn verdict(&self, machine: &str, dialect: MilDialect) -> Option<Verdict> {
        self.machines.get(machine)?.get(&dialect).copied()
    }

    /// The dialect this machine is known to accept: A if it accepted A, else B if it accepted
    /// B; None when nothing was accepted (or nothing is known).
    pub fn accepted(&self, machine: &str) -> Option<MilDialect> {
        MilDialect::ALL
            .into_iter()
            .find(|&d| self.verdict(machine, d) == Some(Verdict::Accepted))
    }
}

/// The dialect to emit: a fixed choice as given; `auto` from what this machine accepted, else
/// from the OS version — except that a dialect the machine rejected is avoided when the other
/// is not also rejected.
pub fn resolve(
    choice: DialectChoice,
    os_version: Option<&str>,
    memory: &ProbeMemory,
    machine: Option<&str>,
) -> MilDialect {
    let d = match choice {
        DialectChoice::Fixed(d) => return d,
        DialectChoice::Auto => dialect_for_os(os_version),
    };
    let Some(m) = machine else { return d };
    if let Some(ok) = memory.accepted(m) {
        return ok;
    }
    let other = match d {
        MilDialect::A => MilDialect::B,
        MilDialect::B => MilDialect::A,
    };
    if memory.verdict(m, d) == Some(Verdict::Rejected)
        && memory.verdict(m, other) != Some(Verdict::Rejected)
    {
        other
    } else {
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_version_picks_b_below_macos_15() {
        assert_eq!(dialect_for_os(Some("14.6.1")), MilDialect::B);
        assert_eq!(dialect_for_os(Some("13.0")), MilDialect::B);
        assert_eq!(dialect_for_os(Some("15.0")), MilDialect::A);
        assert_eq!(dialect_for_os(Some("26.3.1")), MilDialect::A);
        assert_eq!(dialect_for_os(None), MilDialect::A);
        assert_eq!(dialect_for_os(Some("garbage")), MilDialect::A);
    }

    #[test]
    fn dialects_name_their_opsets() {
        assert_eq!(MilDialect::A.opset(), Opset::Ios18);
        assert_eq!(MilDialect::B.opset(), Opset::Ios16);
        assert_eq!(MilDialect::B.mil().version, "1.0");
        assert!(!MilDialect::B.has_states_and_multifunction());
        assert_eq!(MilDialect::from_name("b"), Some(MilDialect::B));
        assert_eq!(MilDialect::from_name("c"), None);
    }

    #[test]
    fn memory_round_trips_through_the_file() {
        let d = tempfile::tempdir().unwrap();
        let path = probe_path(&d.path().join("programs"));
        assert_eq!(ProbeMemory::load(&path).unwrap(), ProbeMemory::default());
        let mut m = ProbeMemory::default();
        let mac = machine_key("Apple M1 Pro", "23G93");
        m.record(&mac, MilDialect::A, Verdict::Rejected);
        m.record(&mac, MilDialect::B, Verdict::Accepted);
        m.record("Apple M4/24D60", MilDialect::A, Verdict::Accepted);
        let f = |k: &str, ok| (k.to_string(), ok);
        m.set_forms(
            &mac,
            MilDialect::B,
            vec![
                f("abs(x=r4:fp16) -> r4:fp16", false),
                f("concat(axis=[3], values=(r4:fp16)) -> r4:fp16", false),
                f("conv(x=r4:fp16, weight=const r4:fp16) -> r4:fp16", true),
            ],
        );
        m.set_forms(
            "only-ops/1",
            MilDialect::A,
            vec![f("matmul(x=r3:fp16) -> r3:fp16", false)],
        );
        m.save(&path).unwrap();
        let back = ProbeMemory::load(&path).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.accepted(&mac), Some(MilDialect::B));
        assert_eq!(back.verdict(&mac, MilDialect::A), Some(Verdict::Rejected));
        assert_eq!(back.accepted("other/1"), None);
        assert_eq!(back.failed_ops(&mac, MilDialect::B), ["abs", "concat"]);
        assert_eq!(back.forms(&mac, MilDialect::B).len(), 3);
        assert!(back.failed_ops(&mac, MilDialect::A).is_empty());
        assert_eq!(back.failed_ops("only-ops/1", MilDialect::A), ["matmul"]);
        let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers, vec![std::ffi::OsString::from(PROBE_FILE)]);
    }

    #[test]
    fn a_bad_file_is_one_error_naming_it() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join(PROBE_FILE);
        for bad in [
            "{",
            "[]",
            r#"{"format": 2, "machines": {}}"#,
            r#"{"format": 1, "machines": {"m": {"dialects": {"z": "accepted"}}}}"#,
            r#"{"format": 1, "machines": {"m": {"dialects": {"a": "maybe"}}}}"#,
            r#"{"format": 1, "machines": {"m": {"dialects": {}, "forms": {"a": {"abs()": 1}}}}}"#,
            r#"{"format": 1, "machines": {"m": {"dialects": {}, "forms": []}}}"#,
            r#"{"format": 1, "machines": {"m": {"dialects": {}, "forms": {"a": {"x": "maybe"}}}}}"#,
        ] {
            std::fs::write(&path, bad).unwrap();
            let e = ProbeMemory::load(&path).unwrap_err();
            assert!(e.starts_with(&path.display().to_string()), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn auto_prefers_what_the_machine_accepted() {
        let mac = "Apple M1 Pro/23G93";
        let mut m = ProbeMemory::default();
        let auto = DialectChoice::Auto;
        assert_eq!(resolve(auto, Some("15.1"), &m, Some(mac)), MilDialect::A);
        assert_eq!(resolve(auto, Some("14.1"), &m, Some(mac)), MilDialect::B);
        m.record(mac, MilDialect::A, Verdict::Rejected);
        assert_eq!(resolve(auto, Some("15.1"), &m, Some(mac)), MilDialect::B);
        m.record(mac, MilDialect::B, Verdict::Rejected);
        assert_eq!(resolve(auto, Some("15.1"), &m, Some(mac)), MilDialect::A);
        m.record(mac, MilDialect::A, Verdict::Accepted);
        assert_eq!(resolve(auto, Some("14.1"), &m, Some(mac)), MilDialect::A);
        // Another machine's answers do not count; a fixed choice is never overridden.
        assert_eq!(resolve(auto, Some("14.1"), &m, Some("x/1")), MilDialect::B);
        let b = DialectChoice::Fixed(MilDialect::B);
        assert_eq!(resolve(b, Some("15.1"), &m, Some(mac)), MilDialect::B);
    }
}
