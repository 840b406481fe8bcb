//! What this process finds of the ANE: libraries, classes, the machine, and whether each driver
//! opens — `anelm info`.

use crate::ffi::coreml::{self, CoreMl};
use crate::ffi::loader::{self, LibrarySpec};
use crate::ffi::objc::objc;
use crate::ffi::private::{self, LoadOptions, PrivateAne};
use crate::ffi::sysinfo::{machine_info, MachineInfo};

#[derive(Clone, Debug)]
pub struct LibraryStatus {
    pub spec: LibrarySpec,
    /// Why `dlopen` failed; None when it opened.
    pub error: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassStatus {
    pub name: String,
    pub resolved: bool,
}

#[derive(Clone, Debug)]
pub struct SystemReport {
    /// `os/arch` of this build.
    pub platform: String,
    pub machine: Result<MachineInfo, String>,
    pub libraries: Vec<LibraryStatus>,
    /// Empty when the Objective-C runtime did not load.
    pub classes: Vec<ClassStatus>,
    pub private_driver: Result<(), String>,
    pub coreml_driver: Result<(), String>,
}

/// Looks at everything; opening the drivers registers their classes, so they go first.
pub fn system_report() -> SystemReport {
    let private_driver = PrivateAne::open(LoadOptions::default()).map(drop).map_err(|e| e.to_string());
    let coreml_driver = CoreMl::open().map(drop).map_err(|e| e.to_string());
    let libraries = loader::ALL.iter().map(|&spec| LibraryStatus { spec, error: loader::open(spec).err().map(|e| e.reason) }).collect();
    let classes = match objc() {
        Ok(rt) => private::CLASSES.iter().chain(&coreml::CLASSES).map(|c| ClassStatus { name: c.to_string_lossy().into_owned(), resolved: rt.class(c).is_ok() }).collect(),
        Err(_) => Vec::new(),
    };
    SystemReport {
        platform: format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
        machine: machine_info().map_err(|e| e.to_string()),
        libraries,
        classes,
        private_driver,
        coreml_driver,
    }
}

impl SystemReport {
    /// One line: whether the ANE can be used here, and if not, why.
    pub fn verdict(&self) -> String {
        match (&self.private_driver, &self.coreml_driver) {
            (Ok(()), Ok(())) => "ANE: available through the private driver and Core ML".into(),
            (Ok(()), Err(e)) => format!("ANE: available through the private driver; Core ML is not ({e})"),
            (Err(e), Ok(())) => format!("ANE: available through Core ML only; the private driver is not ({e})"),
            (Err(e), Err(_)) if !self.platform.starts_with("macos/") => {
                format!("ANE: none — this is {}; the Apple Neural Engine is reachable only on macOS on Apple silicon ({e})", self.platform)
            }
            (Err(e), Err(_)) => format!("ANE: unavailable — {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(private_driver: Result<(), String>, coreml_driver: Result<(), String>, platform: &str) -> SystemReport {
        SystemReport { platform: platform.into(), machine: Err("x".into()), libraries: vec![], classes: vec![], private_driver, coreml_driver }
    }

    #[test]
    fn verdicts() {
        let no = || Err("no ANE here: libobjc is not available: /usr/lib/libobjc.A.dylib: cannot open".to_string());
        let v = report(no(), no(), "linux/x86_64").verdict();
        assert!(v.starts_with("ANE: none — this is linux/x86_64;") && v.contains("libobjc") && !v.contains('\n'), "{v}");
        assert!(report(no(), no(), "macos/x86_64").verdict().starts_with("ANE: unavailable — no ANE here"));
        assert_eq!(report(Ok(()), Ok(()), "macos/aarch64").verdict(), "ANE: available through the private driver and Core ML");
        assert!(report(no(), Ok(()), "macos/aarch64").verdict().starts_with("ANE: available through Core ML only"));
    }

    #[test]
    fn this_machine() {
        let r = system_report();
        assert_eq!(r.libraries.len(), loader::ALL.len());
        if r.platform.starts_with("macos/") {
            assert!(r.libraries[0].error.is_none(), "libobjc opens on macOS");
        } else {
            assert!(r.libraries.iter().all(|l| l.error.is_some()), "no macOS library opens on {}", r.platform);
            assert!(r.classes.is_empty() && r.machine.is_err());
            assert!(r.private_driver.as_ref().unwrap_err().starts_with("no ANE here: "));
            assert!(r.coreml_driver.as_ref().unwrap_err().starts_with("no ANE here: "));
        }
    }
}
