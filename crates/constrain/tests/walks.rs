//! Random walks through the masks: on a small vocabulary (every byte, some words, a special stop
//! token), a walker picks uniformly among the allowed tokens, preferring to stop once it may;
//! every finished text must validate against its schema, and every mask must leave a way on.

use anelm_constrain::{CallFormat, Grammars, Piece, Spec, ToolSpec};
use anelm_engine::Constraint;
use serde_json::{json, Value};

const STOP: u32 = 0;

const WORDS: [&str; 23] = [
    "é",
    "😀",
    "ü",
    "\": ",
    "{\"",
    "\"}",
    "}]",
    "true",
    "false",
    "null",
    "12",
    "-3",
    ".5",
    "e+",
    "name",
    " \"",
    "\\n",
    "\\u00",
    "<tool_call>",
    "</tool_call>",
    "[TOOL_CALLS]",
    "Paris",
    "city",
];

/// Every token: the stop, 95 printable bytes, a newline, the words and one unused id.
const VOCAB: usize = 1 + 95 + 1 + WORDS.len() + 1;

fn grammars() -> Grammars {
    let mut pieces = vec![Piece::Special("<|end|>".into())];
    // Printable ASCII one byte each, a few multi-byte UTF-8 characters, and words that cross
    // JSON's structure ("\": ", "{\"", "}]"), as BPE vocabularies have.
    pieces.extend((0x20u8..0x7f).map(|b| Piece::Text(vec![b])));
    pieces.push(Piece::Text(b"\n".to_vec()));
    for w in WORDS {
        pieces.push(Piece::Text(w.as_bytes().to_vec()));
    }
    pieces.push(Piece::Unused);
    Grammars::new(pieces, &[STOP], None).expect("vocabulary")
}

/// A small deterministic generator (xorshift).
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Walks until the stop token (or `max` tokens); the text, or None when the walk ran out.
fn walk(
    g: &Grammars,
    spec: &Spec,
    seed: u64,
    max: usize,
    text_of: &dyn Fn(u32) -> Vec<u8>,
) -> Option<String> {
    walk_on(g, spec, seed, max, 0, text_of)
}

/// [`walk`], never stopping by choice before step `first_stop`.
fn walk_on(
    g: &Grammars,
    spec: &Spec,
    seed: u64,
    max: usize,
    first_stop: usize,
    text_of: &dyn Fn(u32) -> Vec<u8>,
) -> Option<String> {
    let mut c = g.compile(spec).expect("compiles");
    let mut rng = Rng(seed * 2654435761 + 1);
    let mut out = Vec::new();
    for step in 0..max {
        let mut logits = vec![0.0f32; VOCAB];
        c.mask(&mut logits);
        let allowed: Vec<u32> = (0..logits.len() as u32)
            .filter(|&i| logits[i as usize].is_finite())
            .collect();
        assert!(
            !allowed.is_empty(),
            "step {step}: nothing allowed after {:?}",
            String::from_utf8_lossy(&out)
        );
        assert!(c.failure().is_none(), "{:?}", c.failure());
        // Past the middle of the budget, stop as soon as the grammar allows it.
        // Exponents of more than two digits overflow an f64 (valid JSON, but serde_json
        // refuses it): the walker avoids them while it has another way.
        let tame: Vec<u32> = allowed
            .iter()
            .copied()
            .filter(|&t| !long_exponent(&[&out[..], &text_of(t)].concat()))
            .collect();
        let pool = if tame.is_empty() { &allowed } else { &tame };
        let may_stop = allowed.contains(&STOP) && step >= first_stop;
        let pick = if may_stop && (step > max / 4 || rng.below(3) == 0) {
            STOP
        } else {
            pool[rng.below(pool.len())]
        };
        if pick == STOP {
            assert!(c.complete(), "stop allowed before the text is complete");
            return Some(String::from_utf8(out).expect("UTF-8"));
        }
        assert!(
            !c.complete() || allowed.contains(&STOP),
            "complete, yet no stop allowed"
        );
        c.accept(pick);
        out.extend(text_of(pick));
    }
    None
}

/// Whether the text ends in an exponent with more than two digits (`e+123`).
fn long_exponent(text: &[u8]) -> bool {
    let digits = text.iter().rev().take_while(|b| b.is_ascii_digit()).count();
    let rest = &text[..text.len() - digits];
    let rest = rest
        .strip_suffix(b"+")
        .or_else(|| rest.strip_suffix(b"-"))
        .unwrap_or(rest);
    digits > 2 && matches!(rest.last(), Some(b'e' | b'E'))
}

fn text_of_vocab() -> impl Fn(u32) -> Vec<u8> {
    let mut words: Vec<Vec<u8>> = vec![Vec::new()];
    words.extend((0x20u8..0x7f).map(|b| vec![b]));
    words.push(b"\n".to_vec());
    for w in WORDS {
        words.push(w.as_bytes().to_vec());
    }
    move |id| words.get(id as usize).cloned().unwrap_or_default()
}

fn schemas() -> Vec<Value> {
    vec![
        json!({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
        }, "required": ["name", "age"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
            "kind": {"enum": ["cat", "dog", "é😀"]},
            "score": {"type": "number"},
            "nested": {"type": "object", "properties": {
                "ok": {"type": "boolean"}, "note": {"type": ["string", "null"], "maxLength": 8}
            }, "required": ["ok"], "additionalProperties": false},
        }, "required": ["kind", "nested"], "additionalProperties": false}),
        json!({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 4}),
        json!({"$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
            "required": ["x", "y"], "additionalProperties": false}},
            "type": "object", "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"anyOf": [{"$ref": "#/$defs/point"}, {"type": "null"}]}},
            "required": ["a", "b"], "additionalProperties": false}),
        json!({"type": "string", "pattern": "^[a-c]{2,5}$"}),
    ]
}

#[test]
fn every_finished_walk_validates_against_its_schema() {
    let g = grammars();
    let text_of = text_of_vocab();
    for schema in schemas() {
        let validator = jsonschema::validator_for(&schema).expect("a valid schema");
        let mut finished = 0;
        for seed in 0..40 {
            if let Some(text) = walk(&g, &Spec::JsonSchema(schema.clone()), seed, 400, &text_of) {
                let value: Value = serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("{text:?} is not JSON: {e}"));
                assert!(
                    validator.is_valid(&value),
                    "{text} does not validate against {schema}"
                );
                finished += 1;
            }
        }
        assert!(
            finished >= 20,
            "only {finished} of 40 walks finished for {schema}"
        );
    }
}

#[test]
fn json_object_allows_any_object_and_only_objects() {
    let g = grammars();
    let text_of = text_of_vocab();
    for seed in 0..30 {
        if let Some(text) = walk(&g, &Spec::JsonObject, seed, 300, &text_of) {
            let v: Value = serde_json::from_str(&text).expect("JSON");
            assert!(v.is_object(), "{text}");
        }
    }
}

/// Under `tool_choice: auto` with strict tools a reply is free text, or text and then calls
/// that parse and fit their schemas; the text never opens a call it does not finish.
#[test]
fn strict_auto_replies_are_text_then_valid_calls() {
    let g = grammars();
    let text_of = text_of_vocab();
    let tools = [ToolSpec {
        name: "get_weather".into(),
        parameters: Some(
            json!({"type": "object", "properties": {"city": {"type": "string", "pattern": "^[A-Za-z ]{1,10}$"}},
            "required": ["city"], "additionalProperties": false}),
        ),
    }];
    assert!(CallFormat::Bare { parameters: true }
        .auto_spec(&tools, true)
        .unwrap()
        .is_none());
    for (format, opener) in [
        (CallFormat::Tagged, "<tool_call>"),
        (CallFormat::Mistral, "[TOOL_CALLS]"),
    ] {
        let spec = format.auto_spec(&tools, true).unwrap().expect("a grammar");
        let (mut with_calls, mut plain) = (0, 0);
        for seed in 0..40 {
            let Some(text) = walk_on(&g, &spec, seed, 600, 80, &text_of) else {
                continue;
            };
            let Some(at) = text.find(opener) else {
                plain += 1;
                continue;
            };
            with_calls += 1;
            let calls: Vec<Value> = match format {
                CallFormat::Tagged => text[at..]
                    .split("<tool_call>")
                    .skip(1)
                    .map(|c| {
                        let (body, rest) = c.split_once("</tool_call>").expect("closed");
                        assert!(rest.trim().is_empty(), "text after the calls: {text}");
                        serde_json::from_str(body.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
                    })
                    .collect(),
                _ => serde_json::from_str(&text[at + opener.len()..])
                    .unwrap_or_else(|e| panic!("{e}: {text}")),
            };
            assert!(!calls.is_empty(), "{text}");
            for call in calls {
                assert_eq!(call["name"], "get_weather", "{text}");
                let city = call["arguments"]["city"].as_str().expect("a city");
                assert!((1..=10).contains(&city.len()), "{text}");
            }
        }
        assert!(
            with_calls >= 5 && plain >= 5,
            "{format:?}: {with_calls} walks with calls, {plain} without"
        );
    }
}

#[test]
fn forced_tool_calls_parse_in_every_format() {
    let g = grammars();
    let text_of = text_of_vocab();
    let tools = [
        ToolSpec {
            name: "get_weather".into(),
            parameters: Some(
                json!({"type": "object", "properties": {"city": {"type": "string", "pattern": "^[A-Za-z ]{1,10}$"}},
                "required": ["city"], "additionalProperties": false}),
            ),
        },
        ToolSpec {
            name: "now".into(),
            // No arguments (a walk through free-form ones could write the closing tag).
            parameters: Some(
                json!({"type": "object", "properties": {}, "additionalProperties": false}),
            ),
        },
    ];
    for format in [
        CallFormat::Tagged,
        CallFormat::Mistral,
        CallFormat::Bare { parameters: true },
    ] {
        let spec = format.spec(&tools, true).expect("a grammar");
        let mut finished = 0;
        for seed in 0..20 {
            let Some(text) = walk(&g, &spec, seed, 400, &text_of) else {
                continue;
            };
            finished += 1;
            let calls: Vec<Value> = match format {
                CallFormat::Tagged => text
                    .split("<tool_call>")
                    .skip(1)
                    .map(|c| {
                        serde_json::from_str(c.split("</tool_call>").next().unwrap().trim())
                            .unwrap_or_else(|e| panic!("{e}: {text}"))
                    })
                    .collect(),
                CallFormat::Mistral => {
                    let list = text.strip_prefix("[TOOL_CALLS]").expect("the marker");
                    serde_json::from_str(list).expect("a JSON list")
                }
                CallFormat::Bare { .. } => {
                    vec![serde_json::from_str(&text).expect("one JSON call")]
                }
            };
            assert!(!calls.is_empty(), "{text}");
            let key = if format == (CallFormat::Bare { parameters: true }) {
                "parameters"
            } else {
                "arguments"
            };
            for call in calls {
                let name = call["name"].as_str().expect("a name");
                assert!(name == "get_weather" || name == "now", "{text}");
                let args = &call[key];
                assert!(args.is_object(), "{text}");
                if name == "get_weather" {
                    assert!(args["city"].is_string(), "{text}");
                }
            }
        }
        assert!(finished >= 10, "{format:?}: only {finished} walks finished");
    }
}

#[test]
fn bad_schemas_and_grammars_are_refused_with_a_reason() {
    let g = grammars();
    for spec in [
        Spec::JsonSchema(json!({"type": "frobnicate"})),
        Spec::JsonSchema(json!([1, 2])),
        Spec::JsonSchema(json!({"$ref": "#/$defs/missing"})),
        Spec::Lark("start: undefined_rule".into()),
        Spec::Regex("(unclosed".into()),
    ] {
        let err = g
            .compile(&spec)
            .err()
            .unwrap_or_else(|| panic!("{spec:?} compiled"));
        assert!(!err.to_string().is_empty());
    }
    let bad_tool = [ToolSpec {
        name: "f".into(),
        parameters: Some(json!("a string")),
    }];
    assert!(CallFormat::Tagged.spec(&bad_tool, false).is_err());
}

#[test]
fn formats_are_read_from_the_template() {
    assert_eq!(
        CallFormat::detect("... <tool_call>\\n{\"name\": ..."),
        CallFormat::Tagged
    );
    assert_eq!(
        CallFormat::detect("{{ '[TOOL_CALLS]' }}"),
        CallFormat::Mistral
    );
    assert_eq!(
        CallFormat::detect(r#"{"name": function name, "parameters": dictionary}"#),
        CallFormat::Bare { parameters: true }
    );
}

/// A word-level vocabulary where one token holds a whole call (as the server tests' scripted
/// model has): the forced grammar allows that token, and nothing that is not a call.
#[test]
fn a_token_holding_a_whole_call_is_allowed() {
    let call =
        "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>";
    let words = ["<unk>", "hi", "<think>", "weather", call, "<end>"];
    let pieces: Vec<Piece> = words
        .iter()
        .enumerate()
        .map(|(i, w)| match i {
            0 | 5 => Piece::Special(w.to_string()),
            _ => Piece::Text(w.as_bytes().to_vec()),
        })
        .collect();
    let g = Grammars::new(pieces, &[5], None).unwrap();
    let tools = [ToolSpec {
        name: "get_weather".into(),
        parameters: Some(
            json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        ),
    }];
    let mut c = g
        .compile(&CallFormat::Tagged.spec(&tools, true).unwrap())
        .unwrap();
    assert_eq!(c.allowed(), Some(vec![4]));
    c.accept(4);
    assert!(c.complete());
    assert_eq!(
        c.allowed().unwrap(),
        vec![5],
        "after the call only the end of the turn"
    );
}
