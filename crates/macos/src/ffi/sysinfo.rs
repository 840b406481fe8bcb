//! The machine, through `sysctlbyname` from a dlopen'd libSystem (no link against libc's
//! macOS-only symbols): chip, model, OS version.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

use libloading::Library;

use super::loader::{self, LIBSYSTEM};
use crate::error::Unavailable;

type SysctlByName =
    unsafe extern "C" fn(*const c_char, *mut c_void, *mut usize, *mut c_void, usize) -> c_int;

struct Sysctl {
    _lib: Library,
    by_name: SysctlByName,
}

fn sysctl() -> Result<&'static Sysctl, Unavailable> {
    static SYSCTL: OnceLock<Result<Sysctl, Unavailable>> = OnceLock::new();
    SYSCTL
        .get_or_init(|| {
            let lib = loader::open(LIBSYSTEM)?;
            // SAFETY: `int sysctlbyname(const char *, void *, size_t *, void *, size_t)` (<sys/sysctl.h>).
            let by_name =
                unsafe { loader::symbol::<SysctlByName>(&lib, LIBSYSTEM, c"sysctlbyname")? };
            Ok(Sysctl { _lib: lib, by_name })
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// A string-valued sysctl; None when it does not exist.
fn string(name: &CStr) -> Result<Option<String>, Unavailable> {
    let s = sysctl()?;
    let mut len = 0usize;
    // SAFETY: a null old-buffer asks for the size only.
    if unsafe {
        (s.by_name)(
            name.as_ptr(),
            std::ptr::null_mut(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    } != 0
        || len == 0
    {
        return Ok(None);
    }
    let mut buf = vec![0u8; len];
    // SAFETY: buf holds len bytes, as the call is told.
    if unsafe {
        (s.by_name)(
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    } != 0
    {
        return Ok(None);
    }
    buf.truncate(len);
    Ok(CString::from_vec_with_nul(buf)
        .ok()
        .and_then(|c| c.into_string().ok())
        .map(|s| s.trim().to_string()))
}

/// What the machine says about itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineInfo {
    /// `machdep.cpu.brand_string` ("Apple M3 Max").
    pub chip: Option<String>,
    /// `hw.model` ("Mac15,8").
    pub model: Option<String>,
    /// `kern.osproductversion` ("15.3").
    pub os_version: Option<String>,
    /// `kern.osversion` (the build, "24D60").
    pub os_build: Option<String>,
}

/// Reads [`MachineInfo`]; Unavailable when libSystem does not open (not macOS).
pub fn machine_info() -> Result<MachineInfo, Unavailable> {
    Ok(MachineInfo {
        chip: string(c"machdep.cpu.brand_string")?,
        model: string(c"hw.model")?,
        os_version: string(c"kern.osproductversion")?,
        os_build: string(c"kern.osversion")?,
    })
}
