//! Structured output on the real SmolLM2: replies under `response_format: json_schema` (chat)
//! and `text.format` (Responses) validate against their schemas — nested objects, arrays,
//! enums, numbers, strings with escapes, optional keys — greedy and sampled; constrained and
//! plain requests share the batched steps; completions and llama-server's `json_schema` field take
//! schemas too; a bad schema is a 400 and the server keeps serving.

mod common;

use std::sync::LazyLock;

use anelm_server::Server;
use common::{base, chat, client, config, health, post, start};
use serde_json::{json, Value};

static SERVER: LazyLock<Server> = LazyLock::new(|| start(config(4, 16)));

fn schemas() -> Vec<(&'static str, Value)> {
    vec![
        (
            "Describe a cat as JSON.",
            json!({"type": "object", "properties": {
                "name": {"type": "string", "maxLength": 24},
                "age": {"type": "integer", "minimum": 0, "maximum": 40},
                "indoor": {"type": "boolean"},
            }, "required": ["name", "age", "indoor"], "additionalProperties": false}),
        ),
        (
            "List three fruits with their colours.",
            json!({"type": "object", "properties": {
                "fruits": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
                    "type": "object",
                    "properties": {
                        "fruit": {"type": "string", "maxLength": 16},
                        "colour": {"enum": ["red", "green", "yellow", "orange", "purple"]},
                    },
                    "required": ["fruit", "colour"], "additionalProperties": false,
                }},
            }, "required": ["fruits"], "additionalProperties": false}),
        ),
        (
            "Give a quotation with the person who said it, in JSON.",
            json!({"type": "object", "properties": {
                "quote": {"type": "string", "maxLength": 60},
                "author": {"type": "string", "maxLength": 30},
                "year": {"type": ["integer", "null"]},
                "source": {"type": "string", "maxLength": 30},
            }, "required": ["quote", "author"], "additionalProperties": false}),
        ),
        (
            "The temperature and a reading of the weather, as JSON.",
            json!({"$defs": {"reading": {"type": "object", "properties": {
                    "celsius": {"type": "number", "minimum": -80, "maximum": 60},
                    "sky": {"enum": ["clear", "cloudy", "rain", "snow"]},
                }, "required": ["celsius", "sky"], "additionalProperties": false}},
            "type": "object", "properties": {
                "city": {"type": "string", "maxLength": 20},
                "now": {"$ref": "#/$defs/reading"},
                "later": {"anyOf": [{"$ref": "#/$defs/reading"}, {"type": "null"}]},
            }, "required": ["city", "now", "later"], "additionalProperties": false}),
        ),
        (
            "Write a file path and a line of code with quotes in it.",
            json!({"type": "object", "properties": {
                "path": {"type": "string", "pattern": "^[a-z/_.]{1,30}$"},
                "code": {"type": "string", "maxLength": 50},
            }, "required": ["path", "code"], "additionalProperties": false}),
        ),
    ]
}

fn format(schema: &Value) -> Value {
    json!({"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": true}})
}

#[tokio::test]
async fn every_reply_validates_against_its_schema() {
    let base = base(&SERVER);
    let c = client();
    let url = format!("{base}/v1/chat/completions");
    let mut finished = 0;
    let mut replies = 0;
    for (ask, schema) in schemas() {
        let validator = jsonschema::validator_for(&schema).expect("a valid schema");
        let mut body = chat(ask, 160);
        body["response_format"] = format(&schema);
        let (status, greedy) = post(&c, &url, &body).await;
        assert_eq!(status, 200, "{greedy}");
        body["temperature"] = json!(1.0);
        body["seed"] = json!(7);
        body["n"] = json!(3);
        let (status, sampled) = post(&c, &url, &body).await;
        assert_eq!(status, 200, "{sampled}");
        for choice in greedy["choices"]
            .as_array()
            .unwrap()
            .iter()
            .chain(sampled["choices"].as_array().unwrap())
        {
            replies += 1;
            let text = choice["message"]["content"].as_str().unwrap();
            if choice["finish_reason"] != "stop" {
                // Cut by max_tokens: the start of a valid reply.
                assert_eq!(choice["finish_reason"], "length", "{choice}");
                assert!(text.starts_with('{'), "{text}");
                continue;
            }
            finished += 1;
            let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
            let errors: Vec<String> = validator
                .iter_errors(&value)
                .map(|e| e.to_string())
                .collect();
            assert!(errors.is_empty(), "{text} against {schema}: {errors:?}");
        }
    }
    assert!(
        finished * 10 >= replies * 7,
        "only {finished} of {replies} replies ended before the token limit"
    );
}

#[tokio::test]
async fn the_responses_api_takes_a_schema_too() {
    let base = base(&SERVER);
    let c = client();
    let (_, schema) = &schemas()[0];
    let body = json!({
        "model": common::MODEL,
        "input": "Describe a cat as JSON.",
        "max_output_tokens": 120,
        "temperature": 0,
        "text": {"format": {"type": "json_schema", "name": "cat", "schema": schema, "strict": true}},
    });
    let (status, v) = post(&c, &format!("{base}/v1/responses"), &body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["text"]["format"]["type"], "json_schema", "{v}");
    let text = v["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["type"] == "message")
        .and_then(|m| m["content"][0]["text"].as_str())
        .unwrap_or_else(|| panic!("{v}"));
    let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert!(jsonschema::is_valid(schema, &value), "{text}");
    let mut bad = body.clone();
    bad["text"]["format"]["schema"] =
        json!({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}});
    let (status, v) = post(&c, &format!("{base}/v1/responses"), &bad).await;
    assert_eq!(
        (status, v["error"]["param"].as_str()),
        (400, Some("text.format")),
        "{v}"
    );
}

#[tokio::test]
async fn constrained_and_plain_requests_step_together() {
    let server = start(config(4, 8));
    let base = base(&server);
    let c = client();
    let url = format!("{base}/v1/chat/completions");
    let (_, schema) = &schemas()[1];
    let plain = chat("Tell me about the sea.", 40);
    let mut constrained = chat("List three fruits with their colours.", 120);
    constrained["response_format"] = format(schema);
    // Alone first: the first constraint builds the vocabulary's trie, which on a loaded machine
    // takes longer than the plain replies, which would then end before the constrained join.
    let (_, alone) = post(&c, &url, &constrained).await;
    let (a, b, c2, d) = tokio::join!(
        post(&c, &url, &constrained),
        post(&c, &url, &plain),
        post(&c, &url, &constrained),
        post(&c, &url, &plain),
    );
    for (status, v) in [&a, &c2] {
        assert_eq!(*status, 200, "{v}");
        // Greedy, batched or not: the same reply.
        assert_eq!(v["choices"][0]["message"], alone["choices"][0]["message"]);
    }
    let (_, plain_alone) = post(&c, &url, &plain).await;
    for (status, v) in [&b, &d] {
        assert_eq!(*status, 200, "{v}");
        assert_eq!(
            v["choices"][0]["message"],
            plain_alone["choices"][0]["message"]
        );
    }
    let widest = health(&c, &base).await["widest_step"].as_u64().unwrap();
    assert!(
        widest >= 3,
        "constrained generations joined the batch: widest step {widest}"
    );
}

#[tokio::test]
async fn bad_schemas_are_refused_and_the_server_keeps_serving() {
    let base = base(&SERVER);
    let c = client();
    let url = format!("{base}/v1/chat/completions");
    for schema in [
        json!({"type": "object", "properties": {"a": {"type": "strange"}}}),
        json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/none"}}}),
        json!({"type": "string", "pattern": "(unclosed"}),
        json!({"allOf": [{"type": "string"}, {"type": "integer"}]}),
    ] {
        let mut body = chat("Hi", 8);
        body["response_format"] = format(&schema);
        let (status, v) = post(&c, &url, &body).await;
        assert_eq!(
            (status, v["error"]["param"].as_str()),
            (400, Some("response_format")),
            "{schema}: {v}"
        );
        assert!(!v["error"]["message"].as_str().unwrap().is_empty());
    }
    let (status, v) = post(&c, &url, &chat("Hi", 4)).await;
    assert_eq!(status, 200, "{v}");
}

#[tokio::test]
async fn completions_and_llama_server_fields_take_schemas_too() {
    let base = base(&SERVER);
    let c = client();
    let (_, schema) = &schemas()[0];
    let validator = jsonschema::validator_for(schema).unwrap();
    let prompt = "A cat described as JSON: ";
    for body in [
        json!({"model": common::MODEL, "prompt": prompt, "max_tokens": 80, "temperature": 0,
               "response_format": format(schema)}),
        json!({"model": common::MODEL, "prompt": prompt, "max_tokens": 80, "temperature": 0,
               "json_schema": schema}),
    ] {
        let (status, v) = post(&c, &format!("{base}/v1/completions"), &body).await;
        assert_eq!(status, 200, "{v}");
        let text = v["choices"][0]["text"].as_str().unwrap();
        let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(validator.is_valid(&value), "{text}");
    }
    let mut body = chat("Describe a cat.", 80);
    body["json_schema"] = schema.clone();
    let (status, v) = post(&c, &format!("{base}/v1/chat/completions"), &body).await;
    assert_eq!(status, 200, "{v}");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        validator.is_valid(&serde_json::from_str::<Value>(text).unwrap()),
        "{text}"
    );
    for (extra, param) in [
        (json!({"grammar": "root ::= \"x\""}), "grammar"),
        (
            json!({"json_schema": schema, "response_format": {"type": "json_object"}}),
            "json_schema",
        ),
        (json!({"json_schema": "not a schema"}), "json_schema"),
    ] {
        let mut body = chat("Hi", 4);
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (status, v) = post(&c, &format!("{base}/v1/chat/completions"), &body).await;
        assert_eq!(
            (status, v["error"]["param"].as_str()),
            (400, Some(param)),
            "{v}"
        );
    }
}
