//! The official `openai` and `anthropic` Python packages (pinned in
//! scripts/requirements-test.txt) talk to the server on the real SmolLM2.

mod common;

use common::{base, config, run_python_clients, start, MODEL};

#[test]
fn the_official_python_clients_work() {
    let server = start(anelm_server::ServerConfig {
        api_key: Some("test-key".into()),
        ..config(2, 8)
    });
    run_python_clients(
        "official_clients.py",
        &[
            ("ANELM_BASE", base(&server)),
            ("ANELM_MODEL", MODEL.to_string()),
            ("ANELM_KEY", "test-key".to_string()),
        ],
        14,
    );
}
