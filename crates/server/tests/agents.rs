//! An agent framework end to end: the OpenAI Agents SDK (pinned in
//! scripts/requirements-test.txt) runs a two-tool task against the scripted model
//! ([`common::scripted`]) over the Responses API and Chat Completions, plain and streamed.

mod common;

use std::process::Command;

use common::scripted;

#[test]
fn the_openai_agents_sdk_runs_a_two_tool_task() {
    let (scripted, _dir) = scripted::start();
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/agents_sdk.py");
    let out = Command::new(anelm_testkit::python())
        .arg(&script)
        .env("ANELM_SCRIPTED_BASE", common::base(&scripted))
        .output()
        .expect("running the agents SDK");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    print!("{stdout}");
    assert!(
        out.status.success(),
        "{} failed ({}):\n{stdout}\n{stderr}\n(missing packages? run scripts/setup-python.sh)",
        script.display(),
        out.status
    );
    assert!(stdout.contains("5 passed, 0 failed"), "{stdout}");
}
