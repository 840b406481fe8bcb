//! Fuzz entry point for the MIL text parser, called by the libFuzzer harness in `fuzz/` and by
//! the corpus replay tests: any input returns, parsed or refused, never a panic.

/// MIL text through the parser and, when it parses, the printer.
pub fn mil_text(data: &[u8]) {
    if let Ok(src) = std::str::from_utf8(data) {
        let _ = crate::print_text(src);
    }
}
