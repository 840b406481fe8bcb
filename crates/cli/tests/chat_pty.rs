//! `anelm chat` driven through a pseudo-terminal, as a person would use it: two turns (the
//! second answered from the cached conversation), then the commands.

#![cfg(unix)]

use std::process::Command;

use anelm_testkit::{model, SMOLLM2};
use rexpect::session::{spawn_command, PtySession};

/// The numbers of the line printed after an answer: (completion, prompt, cached) tokens.
fn stats(p: &mut PtySession) -> (String, usize, usize, usize) {
    let (answer, line) = p
        .exp_regex(r"\[\d+ tokens, [0-9.]+ tok/s \| prompt \d+ tokens, \d+ cached[^\]]*\]")
        .expect("the statistics line after an answer");
    let nums: Vec<usize> = line
        .split(|c: char| !c.is_ascii_digit() && c != '.')
        .filter(|s| !s.is_empty() && !s.contains('.'))
        .map(|s| s.parse().unwrap())
        .collect();
    (answer, nums[0], nums[1], nums[2])
}

/// rexpect hands over the terminal's bytes one char per byte; this is the text they encode
/// (failing if the stream was not UTF-8) with the terminal's CR LF as LF.
fn terminal_text(s: &str) -> String {
    let bytes: Vec<u8> = s
        .chars()
        .map(|c| u8::try_from(u32::from(c)).expect("one byte per char"))
        .collect();
    String::from_utf8(bytes)
        .expect("the terminal received UTF-8")
        .replace("\r\n", "\n")
}

/// What `anelm run --chat` answers to the same first question (greedy, so the same text).
fn first_answer(model: &str, question: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_anelm"))
        .args([
            "run", "--model", model, "--chat", "--prompt", question, "-n", "20", "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["text"].as_str().unwrap().to_string()
}

#[test]
fn chat_two_turns_the_second_from_the_cache() {
    let m = model(SMOLLM2);
    let m = m.to_str().unwrap();
    let question = "What is the capital of France?";
    let expected = first_answer(m, question);

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_anelm"));
    cmd.args(["chat", "--model", m, "--temp", "0", "-n", "20"]);
    let mut p = spawn_command(cmd, Some(180_000)).unwrap();
    p.exp_string("/help for commands").unwrap();
    p.exp_string("> ").unwrap();

    p.send_line(question).unwrap();
    let (answer, n1, prompt1, cached1) = stats(&mut p);
    // The terminal shows the echoed question, then the streamed answer.
    let shown = terminal_text(&answer);
    let first_line = expected.lines().next().unwrap_or_default();
    assert!(
        !first_line.is_empty() && shown.contains(first_line),
        "streamed {shown:?}, expected {expected:?}"
    );
    assert_eq!(cached1, 0, "nothing cached on the first turn");
    assert!(n1 > 0 && prompt1 > 0);

    p.exp_string("> ").unwrap();
    p.send_line("And of Germany?").unwrap();
    let (_, _, prompt2, cached2) = stats(&mut p);
    assert!(prompt2 > prompt1);
    assert!(
        cached2 >= prompt1,
        "the second turn reuses the first: {cached2} cached of {prompt2}, first prompt {prompt1}"
    );

    for (line, reply) in [
        ("/temp 0.5", "[temperature 0.5]"),
        ("/topp 0.9", "[top-p 0.9]"),
        ("/topp lots", "/topp needs a number"),
        ("/system Be brief.", "[system message set]"),
        ("/bogus", "unknown command /bogus"),
        ("/help", "/reset"),
        ("/reset", "[conversation cleared]"),
    ] {
        p.exp_string("> ").unwrap();
        p.send_line(line).unwrap();
        p.exp_string(reply)
            .unwrap_or_else(|e| panic!("{line}: {e}"));
    }
    // After /reset nothing is reused: the system message changed and the history is gone.
    p.exp_string("> ").unwrap();
    p.send_line("Hi").unwrap();
    let (_, _, _, cached3) = stats(&mut p);
    assert_eq!(cached3, 0, "after /reset nothing is cached");
    p.exp_string("> ").unwrap();
    p.send_line("/quit").unwrap();
    p.exp_eof().unwrap();
}
