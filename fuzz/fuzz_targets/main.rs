//! One libFuzzer binary for every target: `ANELM_FUZZ_TARGET` names it (see `anelm_fuzz::TARGETS`).
#![no_main]

use std::sync::OnceLock;

static TARGET: OnceLock<anelm_fuzz::Target> = OnceLock::new();

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let run = TARGET.get_or_init(|| {
        let name = std::env::var("ANELM_FUZZ_TARGET").unwrap_or_default();
        anelm_fuzz::target(&name)
            .unwrap_or_else(|| panic!("ANELM_FUZZ_TARGET={name:?} is not a fuzz target"))
    });
    run(data);
});
