//! An agent framework end to end: the OpenAI Agents SDK (pinned in
//! scripts/requirements-test.txt) runs a two-tool task against the scripted model
//! ([`common::scripted`]) over the Responses API and Chat Completions, plain and streamed.

mod common;

use common::{run_python_clients, scripted};

#[test]
fn the_openai_agents_sdk_runs_a_two_tool_task() {
    let (scripted, _dir) = scripted::start();
    run_python_clients(
        "agents_sdk.py",
        &[("ANELM_SCRIPTED_BASE", common::base(&scripted))],
        5,
    );
}
