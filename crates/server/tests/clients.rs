//! The official `openai` and `anthropic` Python packages (pinned in
//! scripts/requirements-test.txt) talk to the server on the real SmolLM2.

mod common;

use std::process::Command;

use common::{base, config, start, MODEL};

#[test]
fn the_official_python_clients_work() {
    let server = start(anelm_server::ServerConfig {
        api_key: Some("test-key".into()),
        ..config(2, 8)
    });
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/official_clients.py");
    let out = Command::new(anelm_testkit::python())
        .arg(&script)
        .env("ANELM_BASE", base(&server))
        .env("ANELM_MODEL", MODEL)
        .env("ANELM_KEY", "test-key")
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
    assert!(stdout.contains("14 passed, 0 failed"), "{stdout}");
}
