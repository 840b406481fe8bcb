//! Off a Mac, every entry point of the drivers answers "no ANE here" as a typed error; on a Mac
//! the same entry points open.

use anelm_macos::{machine_info, CoreMl, IoSurface, LoadOptions, MacError, PrivateAne};

fn on_mac() -> bool {
    std::env::consts::OS == "macos"
}

fn assert_no_ane<T: std::fmt::Debug>(what: &str, r: Result<T, MacError>) {
    match r {
        Err(e) => {
            assert!(e.is_unavailable(), "{what}: {e}");
            let msg = e.to_string();
            assert!(
                msg.starts_with("no ANE here: ")
                    && (msg.contains(".dylib") || msg.contains(".framework")),
                "{what}: {msg}"
            );
        }
        Ok(v) => panic!("{what} opened on {}: {v:?}", std::env::consts::OS),
    }
}

#[test]
fn private_driver() {
    let r = PrivateAne::open(LoadOptions::default());
    if on_mac() {
        assert!(r.is_ok(), "{:?}", r.err());
    } else {
        assert_no_ane("PrivateAne::open", r);
    }
}

#[test]
fn core_ml_driver() {
    let r = CoreMl::open();
    if on_mac() {
        assert!(r.is_ok(), "{:?}", r.err());
    } else {
        assert_no_ane("CoreMl::open", r);
    }
}

#[test]
fn iosurface() {
    let r = IoSurface::new(4096);
    if on_mac() {
        let mut s = r.unwrap();
        s.write(|b| b[4095] = 7).unwrap();
        assert_eq!(s.read(|b| b[4095]).unwrap(), 7);
    } else {
        assert_no_ane("IoSurface::new", r.map(|s| s.len()));
    }
}

#[test]
fn machine() {
    let r = machine_info();
    if on_mac() {
        assert!(r.unwrap().os_version.is_some());
    } else {
        let e = r.unwrap_err();
        assert!(e.component.contains("libSystem"), "{e}");
    }
}

#[test]
fn repeated_opens_give_the_same_answer() {
    // The loaders cache their result: the second call must not retry or panic.
    let a = PrivateAne::open(LoadOptions::default())
        .map(drop)
        .map_err(|e| e.to_string());
    let b = PrivateAne::open(LoadOptions::default())
        .map(drop)
        .map_err(|e| e.to_string());
    assert_eq!(a, b);
}
