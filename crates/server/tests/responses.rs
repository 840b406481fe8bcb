//! The Responses API through the official `openai` package (and thinking blocks through the
//! `anthropic` one, with its tools): text on the real SmolLM2, compared with chat completions; function tools
//! and reasoning on the scripted model ([`common::scripted`]), whose replies are known.

mod common;

use std::process::Command;

use common::{base, config, scripted, start, MODEL};

#[test]
fn the_official_clients_drive_the_responses_api_and_reasoning() {
    let server = start(config(2, 8));
    let (scripted, _dir) = scripted::start();
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/responses_api.py");
    let out = Command::new(anelm_testkit::python())
        .arg(&script)
        .env("ANELM_BASE", base(&server))
        .env("ANELM_MODEL", MODEL)
        .env("ANELM_SCRIPTED_BASE", base(&scripted))
        .output()
        .expect("running the Python clients");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    print!("{stdout}");
    assert!(
        out.status.success(),
        "{} failed ({}):\n{stdout}\n{stderr}\n(missing packages? run scripts/setup-python.sh)",
        script.display(),
        out.status
    );
    assert!(stdout.contains("18 passed, 0 failed"), "{stdout}");
}
