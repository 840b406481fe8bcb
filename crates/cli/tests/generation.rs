//! `anelm run` with sampling flags and `anelm template`, on SmolLM2: seeded sampling is
//! reproducible, stop strings end the text, logprobs come out, bad flags are named, and the
//! template command prints what transformers renders.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anelm_testkit::SMOLLM2;
use serde_json::Value;

fn model() -> String {
    anelm_testkit::model(SMOLLM2).to_str().unwrap().to_string()
}

fn anelm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_anelm"))
        .args(args)
        .output()
        .unwrap()
}

fn run_json(extra: &[&str]) -> Value {
    let m = model();
    let mut args = vec![
        "run",
        "--model",
        &m,
        "--prompt",
        "Once upon a time",
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = anelm(&args);
    assert!(
        out.status.success(),
        "anelm {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn stderr_of_failure(args: &[&str]) -> String {
    let out = anelm(args);
    assert!(!out.status.success(), "anelm {args:?} should fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn seeded_sampling_is_reproducible() {
    let flags = [
        "--temp", "1.0", "--top-k", "0", "--top-p", "0.95", "--min-p", "0", "-n", "20",
    ];
    let a = run_json(&[&flags[..], &["--seed", "7"]].concat());
    let b = run_json(&[&flags[..], &["--seed", "7"]].concat());
    let c = run_json(&[&flags[..], &["--seed", "8"]].concat());
    assert_eq!(a["ids"], b["ids"]);
    assert_eq!(a["seed"], 7);
    assert_ne!(a["ids"], c["ids"]);
    for key in ["prompt_ids", "ids", "text", "finish_reason", "usage"] {
        assert!(a.get(key).is_some(), "--json has {key}");
    }
    assert_eq!(a["usage"]["completion_tokens"], 20);
}

#[test]
fn penalties_and_bias_change_the_greedy_text() {
    let plain = run_json(&["-n", "12"]);
    let first = plain["ids"][0].as_u64().unwrap();
    // Banning the greedy first token makes the first token something else.
    let banned = run_json(&["-n", "12", "--logit-bias", &format!("{first}=-inf")]);
    assert_ne!(banned["ids"][0], plain["ids"][0]);
    // A strong presence penalty forbids repeating a generated token.
    let penalised = run_json(&["-n", "24", "--presence-penalty", "100"]);
    let ids: Vec<u64> = penalised["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let mut unique = ids.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), ids.len(), "{ids:?}");
}

#[test]
fn a_stop_string_ends_the_text() {
    let m = model();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--model",
            &m,
            "--prompt",
            "The capital of France is",
            "-n",
            "16",
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = anelm(&args);
        assert!(out.status.success());
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let full = run(&[]);
    let text = full["text"].as_str().unwrap();
    let cut = text
        .find('.')
        .expect("the greedy continuation has a full stop");
    let stopped = run(&["--stop", "."]);
    assert_eq!(stopped["text"].as_str().unwrap(), &text[..cut]);
    assert_eq!(stopped["finish_reason"], "stop");
    assert_eq!(full["finish_reason"], "length");
}

#[test]
fn logprobs_are_reported_per_token() {
    let v = run_json(&["-n", "5", "--logprobs", "3"]);
    let lps = v["logprobs"].as_array().unwrap();
    assert_eq!(lps.len(), 5);
    for (lp, id) in lps.iter().zip(v["ids"].as_array().unwrap()) {
        assert_eq!(&lp["id"], id);
        let top = lp["top"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(&top[0][0], id);
        assert!(lp["logprob"].as_f64().unwrap() <= 0.0);
    }
}

#[test]
fn bad_sampling_flags_are_named() {
    let m = model();
    let base = ["run", "--model", &m, "--prompt", "x"];
    let err = stderr_of_failure(&[&base[..], &["--top-p", "2"]].concat());
    assert!(err.contains("top_p"), "{err}");
    let err = stderr_of_failure(&[&base[..], &["--logit-bias", "99999999=1"]].concat());
    assert!(err.contains("outside the vocabulary"), "{err}");
    let err = stderr_of_failure(&[&base[..], &["--logit-bias", "5"]].concat());
    assert!(err.contains("ID=BIAS"), "{err}");
    let err = stderr_of_failure(&[&base[..], &["--temp", "-1"]].concat());
    assert!(err.contains("temperature"), "{err}");
}

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../engine/tests/fixtures/chat_templates")
        .join(rel)
}

#[test]
fn template_prints_what_transformers_renders() {
    let m = model();
    let conversations: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("conversations.json")).unwrap())
            .unwrap();
    let golden: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("smollm2.json")).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("messages.json");
    std::fs::write(&file, conversations["multi_turn"].to_string()).unwrap();
    let f = file.to_str().unwrap();
    for (flags, agp) in [(&[][..], true), (&["--no-generation-prompt"][..], false)] {
        let out = anelm(&[&["template", "--model", &m, "--messages", f][..], flags].concat());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let want = golden["renders"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["conversation"] == "multi_turn" && r["add_generation_prompt"] == agp)
            .unwrap();
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            want["expected"].as_str().unwrap()
        );
    }
    // An OpenAI request body works too.
    std::fs::write(
        &file,
        format!(
            "{{\"model\": \"x\", \"messages\": {}}}",
            conversations["user"]
        ),
    )
    .unwrap();
    assert!(anelm(&["template", "--model", &m, "--messages", f])
        .status
        .success());
    // Bad files are named.
    std::fs::write(&file, "[{\"content\": \"no role\"}]").unwrap();
    let err = stderr_of_failure(&["template", "--model", &m, "--messages", f]);
    assert!(
        err.contains("messages.json") && err.contains("role"),
        "{err}"
    );
    std::fs::write(&file, "{not json").unwrap();
    let err = stderr_of_failure(&["template", "--model", &m, "--messages", f]);
    assert!(
        err.contains("messages.json") && err.contains("invalid JSON"),
        "{err}"
    );
}

#[test]
fn a_model_without_tokenizer_has_a_template_but_no_chat() {
    let tiny = anelm_testkit::tiny("llama");
    let tiny = tiny.to_str().unwrap();
    let err = stderr_of_failure(&["chat", "--model", tiny]);
    assert!(err.contains("no tokenizer"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("m.json");
    std::fs::write(&file, r#"[{"role": "user", "content": "Hi"}]"#).unwrap();
    let out = anelm(&[
        "template",
        "--model",
        tiny,
        "--messages",
        file.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        text,
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    );
}

#[test]
fn template_kwargs_come_from_the_file_and_the_command_line() {
    // A model directory whose own template prints its kwargs: hf-tiny llama's weights beside it.
    let dir = tempfile::tempdir().unwrap();
    let tiny = anelm_testkit::tiny("llama");
    for f in ["config.json", "model.safetensors"] {
        std::os::unix::fs::symlink(tiny.join(f), dir.path().join(f)).unwrap();
    }
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        "{{ enable_thinking }}|{{ custom.a }}|{{ messages[0].content }}",
    )
    .unwrap();
    let m = dir.path().to_str().unwrap();
    let file = dir.path().join("m.json");
    std::fs::write(
        &file,
        r#"{"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"enable_thinking": true, "custom": {"a": 1}}}"#,
    )
    .unwrap();
    let f = file.to_str().unwrap();
    let render = |extra: &[&str]| {
        let out = anelm(&[&["template", "--model", m, "--messages", f][..], extra].concat());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(render(&[]), "True|1|Hi");
    // The command line wins over the file, key by key.
    assert_eq!(
        render(&["--kwargs", r#"{"enable_thinking": false}"#]),
        "False|1|Hi"
    );

    // Kwargs that are not a JSON object: one clear error, on every subcommand that takes them.
    let err = stderr_of_failure(&["template", "--model", m, "--messages", f, "--kwargs", "[1]"]);
    assert!(
        err.contains("--kwargs") && err.contains("JSON object"),
        "{err}"
    );
    for cmd in ["run", "chat", "serve"] {
        let err = stderr_of_failure(&[cmd, "--model", m, "--chat-template-kwargs", "{bad"]);
        assert!(
            err.contains("--chat-template-kwargs") && err.contains("invalid JSON"),
            "{cmd}: {err}"
        );
    }
    std::fs::write(
        &file,
        r#"{"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": "x"}"#,
    )
    .unwrap();
    let err = stderr_of_failure(&["template", "--model", m, "--messages", f]);
    assert!(
        err.contains("m.json") && err.contains("chat_template_kwargs") && err.contains("a string"),
        "{err}"
    );
}

#[test]
fn run_with_a_draft_prints_the_plain_greedy_output() {
    let tiny = |arch: &str| anelm_testkit::tiny(arch).to_str().unwrap().to_string();
    let (target, draft) = (tiny("llama"), tiny("qwen3"));
    let reference = anelm_testkit::shared_json("fixtures/hf-tiny/llama/reference.json");
    let prompt: Vec<String> = reference["cases"]["short"]["input_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.to_string())
        .collect();
    let prompt = prompt.join(",");
    let run = |extra: &[&str]| -> Value {
        let mut args = vec![
            "run", "--model", &target, "--ids", &prompt, "--temp", "0", "-n", "20", "--json",
        ];
        args.extend_from_slice(extra);
        let out = anelm(&args);
        assert!(
            out.status.success(),
            "anelm {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let plain = run(&[]);
    assert_eq!(plain["ids"].as_array().unwrap().len(), 20, "{plain}");
    // transformers' greedy tokens for this prompt, the first 16 of them.
    let want = &reference["cases"]["short"]["greedy"]["tokens"];
    assert_eq!(
        plain["ids"].as_array().unwrap()[..16],
        want.as_array().unwrap()[..]
    );
    for k in ["1", "3", "6"] {
        let spec = run(&["--draft", &draft, "--draft-k", k]);
        assert_eq!(spec["ids"], plain["ids"], "--draft-k {k}: {spec}");
        assert!(
            spec["speculative"]["drafted"].as_u64().unwrap() > 0,
            "{spec}"
        );
        let lookup = run(&["--lookup", "--draft-k", k]);
        assert_eq!(
            lookup["ids"], plain["ids"],
            "--lookup --draft-k {k}: {lookup}"
        );
    }
    // Sampling speculatively: as many tokens, reproducible by the seed.
    let sampled = || -> Value {
        let args = [
            "run", "--model", &target, "--ids", &prompt, "--temp", "0.9", "--seed", "7", "-n",
            "20", "--json", "--draft", &draft,
        ];
        let out = anelm(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let (a, b) = (sampled(), sampled());
    assert_eq!(a["ids"], b["ids"]);
    assert_eq!(a["ids"].as_array().unwrap().len(), 20, "{a}");
    let err = stderr_of_failure(&[
        "run",
        "--model",
        &target,
        "--ids",
        &prompt,
        "--lookup",
        "--draft-k",
        "0",
    ]);
    assert!(err.contains("k ≥ 1"), "{err}");
    // A draft of another vocabulary is refused, naming the draft.
    let err = stderr_of_failure(&[
        "run",
        "--model",
        &target,
        "--ids",
        &prompt,
        "--temp",
        "0",
        "--draft",
        &model(),
    ]);
    assert!(
        err.contains("--draft") && err.contains("vocabulary"),
        "{err}"
    );
}

#[test]
fn run_with_a_json_schema_prints_a_valid_reply() {
    let dir = tempfile::tempdir().unwrap();
    let schema = dir.path().join("cat.json");
    std::fs::write(
        &schema,
        r#"{"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 30}},
            "required": ["name", "age"], "additionalProperties": false}"#,
    )
    .unwrap();
    let s = schema.to_str().unwrap();
    for extra in [&["--temp", "0"][..], &["--temp", "1", "--seed", "9"]] {
        let mut args = vec!["--chat", "-n", "60", "--json-schema", s];
        args.extend_from_slice(extra);
        let v = run_json(&args);
        assert_eq!(v["finish_reason"], "stop", "{v}");
        let reply: Value = serde_json::from_str(v["text"].as_str().unwrap())
            .unwrap_or_else(|e| panic!("{e}: {v}"));
        assert!(
            reply["name"].is_string() && reply["age"].is_u64(),
            "{reply}"
        );
        assert_eq!(reply.as_object().unwrap().len(), 2, "{reply}");
    }
    // A bad schema, a grammar that does not parse, and speculation with a constraint: one
    // clear line each.
    std::fs::write(dir.path().join("bad.json"), r#"{"type": "nothing"}"#).unwrap();
    std::fs::write(dir.path().join("bad.lark"), "start: missing").unwrap();
    let bad_json = dir.path().join("bad.json");
    let bad_lark = dir.path().join("bad.lark");
    for (args, says) in [
        (
            vec!["--json-schema", bad_json.to_str().unwrap()],
            "--json-schema",
        ),
        (vec!["--grammar", bad_lark.to_str().unwrap()], "--grammar"),
        (vec!["--json-schema", s, "--lookup"], "one token at a time"),
    ] {
        let m = model();
        let mut all = vec!["run", "--model", &m, "--prompt", "Hi", "-n", "4"];
        all.extend_from_slice(&args);
        let err = stderr_of_failure(&all);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
