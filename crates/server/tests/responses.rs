//! The Responses API through the official `openai` package (and thinking blocks through the
//! `anthropic` one, with its tools): text on the real SmolLM2, compared with chat completions; function tools
//! and reasoning on the scripted model ([`common::scripted`]), whose replies are known.

mod common;

use common::{base, config, run_python_clients, scripted, start, MODEL};

#[test]
fn the_official_clients_drive_the_responses_api_and_reasoning() {
    let server = start(config(2, 8));
    let (scripted, _dir) = scripted::start();
    run_python_clients(
        "responses_api.py",
        &[
            ("ANELM_BASE", base(&server)),
            ("ANELM_MODEL", MODEL.to_string()),
            ("ANELM_SCRIPTED_BASE", base(&scripted)),
        ],
        18,
    );
}
