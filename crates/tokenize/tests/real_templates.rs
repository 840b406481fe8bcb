//! Real models' chat templates (llama.cpp's collection, tests/fixtures/real_templates) rendered
//! for every case of cases.json and compared byte for byte with transformers' apply_chat_template
//! (goldens written by `scripts/gen-template-goldens.py --real`); where transformers raised, we
//! must refuse too (a `raise_exception` with the same message). Prints the fidelity figure.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anelm_tokenize::{ChatTemplate, ChatTemplateError, Message, RenderOptions, TemplateOrigin};
use serde_json::Value;

/// Templates we do not match, each with the reason. Listed ones must differ (so the list stays
/// honest); every other template must match on every case.
const EXCEPTIONS: &[(&str, &str)] = &[];

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/real_templates")
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The clock the generator gave transformers (`"now"` of a golden, ISO local time).
fn fixed_now(golden: &Value) -> jiff::civil::DateTime {
    golden["now"].as_str().unwrap().parse().unwrap()
}

/// How one case came out.
enum Outcome {
    Identical,
    RefusedAlike,
    Differs(String),
}

fn compare(want: &Value, got: Result<String, ChatTemplateError>) -> Outcome {
    let expected = want.get("expected").and_then(Value::as_str);
    let error = want.get("error").and_then(Value::as_str);
    match (expected, error, got) {
        (Some(w), _, Ok(g)) if w == g => Outcome::Identical,
        (Some(w), _, Ok(g)) => {
            let at = w
                .char_indices()
                .zip(g.chars())
                .find(|((_, a), b)| a != b)
                .map_or(w.len().min(g.len()), |((i, _), _)| i);
            let ctx = |s: &str| {
                let (mut start, mut end) = (at.saturating_sub(40), (at + 60).min(s.len()));
                while !s.is_char_boundary(start) {
                    start -= 1;
                }
                while !s.is_char_boundary(end) {
                    end += 1;
                }
                format!("{:?}", &s[start..end])
            };
            Outcome::Differs(format!(
                "differs at byte {at}: want {} got {}",
                ctx(w),
                ctx(&g)
            ))
        }
        (None, Some("raised"), Err(ChatTemplateError::Raised { msg, .. }))
            if Some(msg.as_str()) == want["message"].as_str() =>
        {
            Outcome::RefusedAlike
        }
        (None, Some("render"), Err(ChatTemplateError::Render { .. })) => Outcome::RefusedAlike,
        (_, _, got) => Outcome::Differs(format!(
            "want {}, got {}",
            match expected {
                Some(_) => "a render".to_string(),
                None => format!("{} error {:?}", error.unwrap_or("?"), want["message"]),
            },
            match got {
                Ok(_) => "a render".to_string(),
                Err(e) => e.to_string(),
            }
        )),
    }
}

#[test]
fn real_templates_match_transformers() {
    let cases = read_json(&dir().join("cases.json"));
    let mut goldens: Vec<PathBuf> = std::fs::read_dir(dir().join("goldens"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    goldens.sort();
    assert!(goldens.len() >= 60, "{} goldens", goldens.len());

    let (mut total, mut identical, mut refused) = (0, 0, 0);
    let mut differing: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for path in &goldens {
        let golden = read_json(path);
        let name = golden["template"].as_str().unwrap().to_string();
        let source_path = dir().join("templates").join(&name);
        let source = std::fs::read_to_string(&source_path).unwrap();
        let renders = golden["renders"].as_array().unwrap();
        assert_eq!(
            renders.len(),
            2 * cases.as_object().unwrap().len(),
            "{name}: every case, both ways"
        );
        total += renders.len();
        let template = match ChatTemplate::new(
            &source,
            TemplateOrigin::HfFile(source_path),
            golden["bos_token"].as_str().map(str::to_string),
            golden["eos_token"].as_str().map(str::to_string),
        ) {
            Ok(t) => t,
            Err(e) => {
                differing.entry(name).or_default().push(e.to_string());
                continue;
            }
        };
        for r in renders {
            let case = &cases[r["case"].as_str().unwrap()];
            let messages: Vec<Message> = serde_json::from_value(case["messages"].clone()).unwrap();
            let opts = RenderOptions {
                add_generation_prompt: r["add_generation_prompt"].as_bool().unwrap(),
                tools: case.get("tools").map(|t| t.as_array().unwrap().clone()),
                variables: case
                    .get("kwargs")
                    .map(|k| k.as_object().unwrap().clone())
                    .unwrap_or_default(),
                now: Some(fixed_now(&golden)),
            };
            match compare(r, template.render(&messages, &opts)) {
                Outcome::Identical => identical += 1,
                Outcome::RefusedAlike => refused += 1,
                Outcome::Differs(why) => differing.entry(name.clone()).or_default().push(format!(
                    "{} (add_generation_prompt={}): {why}",
                    r["case"], opts.add_generation_prompt
                )),
            }
        }
    }
    let differ: usize = total - identical - refused;
    println!(
        "real chat templates: {total} cases across {} templates: {identical} byte-identical, \
         {refused} refused where transformers raises, {differ} differ (in {} named exceptions)",
        goldens.len(),
        EXCEPTIONS.len()
    );
    for (name, why) in &differing {
        println!("{name}: {} differ; first: {}", why.len(), why[0]);
    }
    let excepted: Vec<&str> = EXCEPTIONS.iter().map(|(n, _)| *n).collect();
    let failing: Vec<&str> = differing.keys().map(String::as_str).collect();
    assert_eq!(
        failing, excepted,
        "templates that differ from transformers vs the named exceptions"
    );
}

/// One-line templates we do not match, each with the reason (listed ones must differ).
const SEMANTICS_EXCEPTIONS: &[(&str, &str)] = &[
    ("{{ '%s-%d' % ('a', 3) }}", PRINTF),
    ("{{ '%.2f' % 3.14159 }}", PRINTF),
    ("{{ '%5s|' % 'ab' }}", PRINTF),
    (
        "{{ 'x'.encode }}",
        "Python prints a bound method with its memory address",
    ),
];

const PRINTF: &str = "Python's printf-style `str % args`: minijinja's `%` is arithmetic only and \
                      its operators cannot be extended; no template of the collection uses it";

#[test]
fn python_jinja_semantics_match_transformers() {
    let golden = read_json(&dir().join("semantics_goldens.json"));
    let messages: Vec<Message> = serde_json::from_value(golden["messages"].clone()).unwrap();
    let sources = read_json(&dir().join("semantics_cases.json"));
    let renders = golden["renders"].as_array().unwrap();
    assert_eq!(renders.len(), sources.as_array().unwrap().len());
    let opts = RenderOptions {
        now: Some(fixed_now(&golden)),
        ..RenderOptions::default()
    };
    let mut differing = Vec::new();
    for r in renders {
        let source = r["template"].as_str().unwrap();
        let got = ChatTemplate::new(
            source,
            TemplateOrigin::Builtin("semantics"),
            golden["bos_token"].as_str().map(str::to_string),
            golden["eos_token"].as_str().map(str::to_string),
        )
        .map_err(|e| e.to_string());
        let outcome = match got {
            Ok(t) => compare(r, t.render(&messages, &opts)),
            Err(e) => Outcome::Differs(e),
        };
        if let Outcome::Differs(why) = outcome {
            println!("{source}: {why}");
            differing.push(source);
        }
    }
    println!(
        "python-jinja semantics: {} one-line templates, {} differ (named exceptions: {})",
        renders.len(),
        differing.len(),
        SEMANTICS_EXCEPTIONS.len()
    );
    let mut excepted: Vec<&str> = SEMANTICS_EXCEPTIONS.iter().map(|(s, _)| *s).collect();
    excepted.sort_unstable();
    differing.sort_unstable();
    assert_eq!(
        differing, excepted,
        "one-line templates that differ vs the named exceptions"
    );
}
