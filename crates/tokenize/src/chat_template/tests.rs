use super::*;

fn template(source: &str) -> ChatTemplate {
    ChatTemplate::new(
        source,
        TemplateOrigin::Builtin("test"),
        Some("<s>".into()),
        Some("</s>".into()),
    )
    .unwrap()
}

fn render(source: &str, messages: &[Message]) -> Result<String, ChatTemplateError> {
    template(source).render(messages, &RenderOptions::default())
}

/// A JSON-encoded string, as Python printed it (`json.dumps(json.dumps(...))`).
fn py(encoded: &str) -> String {
    serde_json::from_str(encoded).unwrap()
}

const TOOL: &str = r#"{"name": "get_weather", "description": "Temp in \"°C\" <now> & \\ tab\t", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "default": 3}, "ratio": {"type": "number", "default": 0.25}}, "required": ["city"], "empty": {}, "none": []}, "emoji": "😀", "null": null, "flag": true}"#;

fn tool_options() -> RenderOptions {
    RenderOptions {
        add_generation_prompt: false,
        tools: Some(vec![serde_json::from_str(TOOL).unwrap()]),
        ..RenderOptions::default()
    }
}

#[test]
fn tojson_is_python_json_dumps() {
    // Expected strings: Python 3.11 json.dumps on the same object.
    let t = template("{{ tools[0] | tojson }}");
    let want = py(
        r#""{\"name\": \"get_weather\", \"description\": \"Temp in \\\"\u00b0C\\\" <now> & \\\\ tab\\t\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\", \"default\": 3}, \"ratio\": {\"type\": \"number\", \"default\": 0.25}}, \"required\": [\"city\"], \"empty\": {}, \"none\": []}, \"emoji\": \"\ud83d\ude00\", \"null\": null, \"flag\": true}""#,
    );
    assert_eq!(t.render(&[], &tool_options()).unwrap(), want);

    let t = template("{{ tools[0].parameters | tojson(indent=2, sort_keys=true) }}");
    let want = py(
        r#""{\n  \"empty\": {},\n  \"none\": [],\n  \"properties\": {\n    \"city\": {\n      \"type\": \"string\"\n    },\n    \"days\": {\n      \"default\": 3,\n      \"type\": \"integer\"\n    },\n    \"ratio\": {\n      \"default\": 0.25,\n      \"type\": \"number\"\n    }\n  },\n  \"required\": [\n    \"city\"\n  ],\n  \"type\": \"object\"\n}""#,
    );
    assert_eq!(t.render(&[], &tool_options()).unwrap(), want);

    let t = template("{{ tools[0] | tojson(ensure_ascii=true) }}");
    let want = py(
        r#""{\"name\": \"get_weather\", \"description\": \"Temp in \\\"\\u00b0C\\\" <now> & \\\\ tab\\t\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\", \"default\": 3}, \"ratio\": {\"type\": \"number\", \"default\": 0.25}}, \"required\": [\"city\"], \"empty\": {}, \"none\": []}, \"emoji\": \"\\ud83d\\ude00\", \"null\": null, \"flag\": true}""#,
    );
    assert_eq!(t.render(&[], &tool_options()).unwrap(), want);

    let t = template("{{ tools | tojson(separators=[',', ':']) }}");
    let out = t.render(&[], &tool_options()).unwrap();
    assert!(
        out.starts_with(r#"[{"name":"get_weather","description":"#),
        "{out}"
    );
    assert!(template("{{ tools | tojson(bogus=1) }}")
        .render(&[], &tool_options())
        .is_err());
}

#[test]
fn whitespace_control_is_transformers() {
    // trim_blocks + lstrip_blocks + loop controls; expected from jinja2 3.1.6 with those settings.
    let out = render("{% if true %}\n  x\n{% endif %}\n  {%- for i in [1,2,3] %}{% if i == 2 %}{% continue %}{% endif %}{{ i }}{% endfor %}\nend", &[]);
    assert_eq!(out.unwrap(), "  x\n13end");
}

#[test]
fn raise_exception_is_a_refusal_with_its_message() {
    let err = render(
        "{{ raise_exception('Only user and assistant roles are supported!') }}",
        &[],
    )
    .unwrap_err();
    match err {
        ChatTemplateError::Raised { msg, .. } => {
            assert_eq!(msg, "Only user and assistant roles are supported!")
        }
        other => panic!("expected a refusal, got {other}"),
    }
    let err = render(
        "{{ messages[0].content.nosuchmethod() }}",
        &[Message::user("x")],
    )
    .unwrap_err();
    assert!(matches!(err, ChatTemplateError::Render { .. }), "{err}");
}

#[test]
fn python_string_and_dict_methods() {
    let src = "{{ messages[0].content.strip().upper() }}|{{ 'a,b'.split(',') | join('+') }}|\
               {{ messages[0].content.startswith(' he') }}|{% for k, v in {'x': 1}.items() %}{{ k }}={{ v }}{% endfor %}|\
               {{ 'abc'.replace('b', 'B') }}|{{ '  q'.lstrip() }}";
    assert_eq!(
        render(src, &[Message::user(" hello ")]).unwrap(),
        "HELLO|a+b|True|x=1|aBc|q"
    );
}

#[test]
fn strftime_now_formats_the_local_date() {
    let out = render("{{ strftime_now('%Y-%m-%d') }}", &[]).unwrap();
    let today = jiff::Zoned::now().date().to_string();
    // Rendering may cross midnight; then the date is one day before today.
    let yesterday = jiff::Zoned::now().date().yesterday().unwrap().to_string();
    assert!(out == today || out == yesterday, "{out} vs {today}");
}

#[test]
fn variables_match_apply_chat_template() {
    // Null content is dropped (transformers removes None-valued keys); extra fields pass through;
    // tools and documents are defined as none; special tokens are the given strings.
    let mut call = Message::new("assistant", "");
    call.content = serde_json::Value::Null;
    call.extra.insert(
        "tool_calls".into(),
        serde_json::json!([{"function": {"name": "f", "arguments": {"b": 1, "a": 2}}}]),
    );
    let src = "{{ bos_token }}{{ messages[0].content is defined }} {{ messages[0].tool_calls[0].function.arguments | tojson }} \
               {{ tools is none }} {{ documents is none }} {{ add_generation_prompt }}{{ eos_token }}";
    let t = template(src);
    let opts = RenderOptions {
        add_generation_prompt: true,
        ..RenderOptions::default()
    };
    assert_eq!(
        t.render(&[call], &opts).unwrap(),
        "<s>False {\"b\": 1, \"a\": 2} True True True</s>"
    );
    // Unset special tokens stay undefined.
    let t = ChatTemplate::new(
        "[{{ bos_token }}]{{ bos_token is defined }}",
        TemplateOrigin::Builtin("t"),
        None,
        None,
    )
    .unwrap();
    assert_eq!(t.render(&[], &RenderOptions::default()).unwrap(), "[]False");
}

#[test]
fn syntax_errors_name_the_origin() {
    let path = PathBuf::from("/models/x.gguf");
    let err = ChatTemplate::new("{% for %}", TemplateOrigin::Gguf(path), None, None)
        .err()
        .unwrap();
    let text = err.to_string();
    assert!(matches!(err, ChatTemplateError::Syntax { .. }));
    assert!(
        text.contains("/models/x.gguf") && text.contains("does not parse"),
        "{text}"
    );
}

#[test]
fn every_builtin_template_renders_a_conversation() {
    let chat = [
        Message::user("Hi"),
        Message::assistant("Hello"),
        Message::user("Bye"),
    ];
    for family in [
        "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gpt2",
    ] {
        let b = builtin_template(family).unwrap();
        let t = ChatTemplate::builtin(b, None, None);
        let out = t
            .render(
                &chat,
                &RenderOptions {
                    add_generation_prompt: true,
                    ..RenderOptions::default()
                },
            )
            .unwrap();
        assert!(
            out.contains("Hi") && out.contains("Hello") && out.contains("Bye"),
            "{family}: {out}"
        );
    }
    assert!(builtin_template("bert").is_none());
}

#[test]
fn messages_parse_from_openai_json() {
    let json = r#"[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                   {"role": "tool", "content": "42", "tool_call_id": "c1"}]"#;
    let msgs: Vec<Message> = serde_json::from_str(json).unwrap();
    assert_eq!(msgs[0].text(), "ab");
    assert_eq!(
        msgs[1].extra.get("tool_call_id").and_then(|v| v.as_str()),
        Some("c1")
    );
}

#[test]
fn hf_template_files_are_found_in_transformers_order() {
    let dir = tempfile::tempdir().unwrap();
    assert!(hf_chat_template(dir.path()).unwrap().is_none());
    let cfg = dir.path().join("tokenizer_config.json");
    std::fs::write(&cfg, r#"{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}"#).unwrap();
    let (src, origin) = hf_chat_template(dir.path()).unwrap().unwrap();
    assert_eq!(
        (src.as_str(), origin),
        ("D", TemplateOrigin::HfFile(cfg.clone()))
    );
    std::fs::write(dir.path().join("chat_template.jinja"), "J").unwrap();
    assert_eq!(hf_chat_template(dir.path()).unwrap().unwrap().0, "J");
    std::fs::remove_file(dir.path().join("chat_template.jinja")).unwrap();

    std::fs::write(
        &cfg,
        r#"{"chat_template": [{"name": "tool_use", "template": "T"}]}"#,
    )
    .unwrap();
    let err = hf_chat_template(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("tokenizer_config.json") && err.contains("default"),
        "{err}"
    );
    std::fs::write(&cfg, "{not json").unwrap();
    let err = hf_chat_template(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("tokenizer_config.json") && err.contains("invalid JSON"),
        "{err}"
    );
}

#[test]
fn extra_variables_reach_the_template() {
    let t = template("{{ bos_token }}|{{ enable_thinking }}|{{ messages | length }}");
    let mut opts = RenderOptions::default();
    opts.variables
        .insert("enable_thinking".into(), false.into());
    opts.variables.insert("bos_token".into(), "<B>".into());
    // A variable cannot replace the conversation.
    opts.variables
        .insert("messages".into(), serde_json::json!([1, 2, 3]));
    assert_eq!(
        t.render(&[Message::user("x")], &opts).unwrap(),
        "<B>|False|1"
    );
}

fn render_error(source: &str) -> String {
    match render(source, &[Message::user("hi")]) {
        Ok(out) => panic!("rendered {} bytes", out.len()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn untrusted_templates_cannot_hang_or_exhaust_memory() {
    // An endless-looking loop, a huge string and a huge output all run out of fuel.
    for (what, source) in [
        (
            "loop",
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        ),
        ("string", "{{ 'x' * 1000000000 }}"),
        (
            "output",
            "{% for i in range(10000) %}{% for j in range(10000) %}xxxxxxxxxxxxxxxx{% endfor %}{% endfor %}",
        ),
    ] {
        let start = std::time::Instant::now();
        let e = render_error(source);
        assert!(e.contains("fuel"), "{what}: {e}");
        assert!(start.elapsed().as_secs() < 5, "{what} took {:?}", start.elapsed());
    }
    // Unbounded recursion is an error, not a stack overflow.
    let e = render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
    assert!(e.contains("recursion"), "{e}");
}

#[test]
fn the_fuel_suffices_for_a_long_conversation_with_a_builtin_template() {
    let t = ChatTemplate::builtin(builtin_template("qwen3").unwrap(), None, None);
    let long = "word ".repeat(400);
    let msgs: Vec<Message> = (0..200)
        .map(|i| {
            if i % 2 == 0 {
                Message::user(&long)
            } else {
                Message::assistant(&long)
            }
        })
        .collect();
    let out = t.render(&msgs, &tool_options()).unwrap();
    assert!(out.len() > 200 * long.len(), "{}", out.len());
}

#[test]
fn reasoning_is_copied_as_transformers_5_copies_it() {
    // {"thinking": r, **message, "reasoning_content": r}, from the first non-null of
    // reasoning_content / thinking / reasoning; a message's own thinking keeps its value.
    let t = template("{{ messages[0] | tojson }}");
    let mut m = Message::assistant("c");
    m.extra.insert("reasoning".into(), "r".into());
    assert_eq!(
        t.render(&[m], &RenderOptions::default()).unwrap(),
        r#"{"thinking": "r", "role": "assistant", "content": "c", "reasoning": "r", "reasoning_content": "r"}"#
    );
    let mut m = Message::assistant("c");
    m.extra.insert("thinking".into(), "t".into());
    m.extra.insert("reasoning_content".into(), "rc".into());
    assert_eq!(
        t.render(&[m], &RenderOptions::default()).unwrap(),
        r#"{"thinking": "t", "role": "assistant", "content": "c", "reasoning_content": "rc"}"#
    );
    let mut m = Message::assistant("c");
    m.extra.insert("reasoning".into(), serde_json::Value::Null);
    assert_eq!(
        t.render(&[m], &RenderOptions::default()).unwrap(),
        r#"{"role": "assistant", "content": "c"}"#
    );
}

#[test]
fn strftime_now_reads_the_injected_clock() {
    let opts = RenderOptions {
        now: Some("2024-07-26T09:05:00".parse().unwrap()),
        ..RenderOptions::default()
    };
    let t = template("{{ strftime_now('%d %b %Y, %A %H:%M') }}");
    assert_eq!(t.render(&[], &opts).unwrap(), "26 Jul 2024, Friday 09:05");
    // A template kwarg of that name wins, as over transformers' global.
    let mut opts = opts;
    opts.variables.insert("strftime_now".into(), "fixed".into());
    assert_eq!(
        template("{{ strftime_now }}").render(&[], &opts).unwrap(),
        "fixed"
    );
}

#[test]
fn the_variables_a_template_reads_and_kwargs_that_are_not_an_object() {
    let t = template(
        "{% set x = 1 %}{% if enable_thinking %}{{ x }}{{ messages | length }}{% endif %}",
    );
    assert!(t.uses_variable("enable_thinking") && t.uses_variable("messages"));
    assert!(!t.uses_variable("x") && !t.uses_variable("reasoning_effort"));
    assert_eq!(
        template_kwargs(serde_json::json!({"a": 1})).unwrap()["a"],
        1
    );
    for (bad, kind) in [
        (serde_json::json!([1]), "an array"),
        (serde_json::json!("x"), "a string"),
        (serde_json::json!(null), "null"),
    ] {
        let e = template_kwargs(bad).unwrap_err();
        assert!(e.contains("JSON object") && e.contains(kind), "{e}");
    }
}

#[test]
fn generation_blocks_render_their_body_in_a_scope_of_their_own() {
    // As transformers' AssistantTracker: the body in place; a `set` inside does not leak out,
    // a namespace attribute does.
    let src = "{% set ns = namespace(n=0) %}{% set x = 'out' %}{% for m in messages %}\
               {%- generation -%}[{{ m.content }}]{% set x = 'in' %}{% set ns.n = ns.n + 1 %}{%- endgeneration -%}\
               {% endfor %}{{ x }}{{ ns.n }}";
    let out = render(src, &[Message::user("a"), Message::assistant("b")]).unwrap();
    assert_eq!(out, "[a][b]out2");
}
