//! Several models in one server: each loaded when a request first names it, the least recently
//! used idle one unloaded when the budget (`max_loaded`, `memory`) would be passed, a model in
//! use never unloaded (503 with Retry-After instead), a failed or oversized load refused in one
//! line while the others keep serving — and real models answer after a reload as before.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anelm_engine::LoadedModel;
use anelm_server::{Budget, LoadFn, LoadedParts, ModelSpec, Server, ServerConfig};
use common::scripted::{model_dir, next};
use common::*;
use serde_json::{json, Value};

/// The scripted model (its directory leaked: it must outlive every load) with an executor
/// that waits `delay` per token and, when `endless`, never ends a reply.
fn scripted(delay: Duration, endless: bool) -> LoadedParts {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(model_dir);
    let loaded = LoadedModel::load(dir.path()).expect("the model loads");
    let vocab = loaded.model.config.vocab_size;
    let exec = anelm_testkit::FnExec::new(vocab, move |history, row| {
        std::thread::sleep(delay);
        let last = *history.last().expect("a token");
        row[if endless { 6 } else { next(last) } as usize] = 100.0;
    });
    LoadedParts {
        loaded,
        exec: Box::new(exec),
        draft: None,
    }
}

/// A model named `id` whose loads are counted; each takes `load_time`.
fn spec(id: &str, load_time: Duration, endless: bool) -> (ModelSpec, Arc<AtomicUsize>) {
    let loads = Arc::new(AtomicUsize::new(0));
    let counter = loads.clone();
    let load: LoadFn = Arc::new(move || {
        counter.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(load_time);
        Ok(scripted(Duration::from_millis(if endless { 20 } else { 0 }), endless).into())
    });
    let spec = ModelSpec {
        id: id.into(),
        load,
        bytes_hint: 1 << 20,
    };
    (spec, loads)
}

fn serve(budget: Budget, specs: Vec<ModelSpec>) -> Server {
    let mut specs = specs.into_iter();
    let first = specs.next().expect("a model");
    let parts = (first.load)().expect("the first model loads");
    let config = ServerConfig {
        budget,
        ..config(2, 4)
    };
    Server::start_many(config, (first, parts), specs.collect()).expect("the server starts")
}

fn ask(model: &str, content: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 20})
}

/// Each model's state from /v1/models.
async fn states(c: &reqwest::Client, base: &str) -> Vec<(String, String)> {
    let v = get_json(c, &format!("{base}/v1/models")).await;
    v["data"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|m| {
            (
                m["id"].as_str().unwrap().to_string(),
                m["state"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn named(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[tokio::test]
async fn models_load_on_first_use_and_the_least_recently_used_idle_one_is_unloaded() {
    let (a, loads_a) = spec("a", Duration::ZERO, false);
    let (b, loads_b) = spec("b", Duration::ZERO, false);
    let (c_, loads_c) = spec("c", Duration::ZERO, false);
    let budget = Budget {
        max_loaded: Some(2),
        memory: None,
    };
    let server = serve(budget, vec![a, b, c_]);
    let (c, base) = (client(), base(&server));
    let url = format!("{base}/v1/chat/completions");
    assert_eq!(
        states(&c, &base).await,
        named(&[("a", "loaded"), ("b", "unloaded"), ("c", "unloaded")])
    );
    let (status, v) = post(&c, &url, &ask("b", "hi")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["model"], "b");
    assert_eq!(v["choices"][0]["message"]["content"], "answer", "{v}");
    assert_eq!(
        states(&c, &base).await,
        named(&[("a", "loaded"), ("b", "loaded"), ("c", "unloaded")])
    );
    // Two are loaded, the most allowed: c takes the place of a, used least recently.
    let (status, v) = post(&c, &url, &ask("c", "weather")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        states(&c, &base).await,
        named(&[("a", "unloaded"), ("b", "loaded"), ("c", "loaded")])
    );
    let metrics = get_text(&c, &format!("{base}/metrics")).await;
    assert!(metrics.contains("anelm_models_loaded 2"), "{metrics}");
    // a comes back (in place of b) and answers as before.
    let (status, v) = post(&c, &url, &ask("a", "hi")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], "answer", "{v}");
    assert_eq!(
        states(&c, &base).await,
        named(&[("a", "loaded"), ("b", "unloaded"), ("c", "loaded")])
    );
    // The first load of a was the one the test made before starting the server.
    let counts = [&loads_a, &loads_b, &loads_c].map(|l| l.load(Ordering::SeqCst));
    assert_eq!(counts, [2, 1, 1]);
    // Tokenizing names a model too, or takes the first.
    let (status, v) = post(&c, &format!("{base}/tokenize"), &json!({"content": "hi"})).await;
    assert_eq!((status, &v["tokens"]), (200, &json!([1])), "{v}");
    let (status, v) = post(
        &c,
        &format!("{base}/tokenize"),
        &json!({"content": "hi", "model": "nobody"}),
    )
    .await;
    assert_eq!(
        (status, &v["error"]["code"]),
        (404, &json!("model_not_found"))
    );
}

#[tokio::test]
async fn requests_for_a_loading_model_wait_for_one_load() {
    let (a, _) = spec("a", Duration::ZERO, false);
    let (slow, loads) = spec("slow", Duration::from_millis(800), false);
    let server = serve(Budget::default(), vec![a, slow]);
    let (c, base) = (client(), base(&server));
    let url = format!("{base}/v1/chat/completions");
    let asks = (0..3).map(|_| {
        let (c, url) = (c.clone(), url.clone());
        tokio::spawn(async move { post(&c, &url, &ask("slow", "hi")).await })
    });
    let asks: Vec<_> = asks.collect();
    // While it loads, /health says so and the other model answers.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let h = get_json(&c, &format!("{base}/health")).await;
        if h["status"] == "loading" {
            assert_eq!(h["models"][1]["state"], "loading", "{h}");
            break;
        }
        assert!(Instant::now() < deadline, "never seen loading: {h}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, v) = post(&c, &url, &ask("a", "weather")).await;
    assert_eq!(status, 200, "{v}");
    for t in asks {
        let (status, v) = t.await.unwrap();
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["model"], "slow");
    }
    assert_eq!(
        loads.load(Ordering::SeqCst),
        1,
        "one load for three requests"
    );
}

#[tokio::test]
async fn a_model_in_use_is_not_unloaded() {
    let (busy, _) = spec("busy", Duration::ZERO, true);
    let (other, _) = spec("other", Duration::ZERO, false);
    let budget = Budget {
        max_loaded: Some(1),
        memory: None,
    };
    let server = serve(budget, vec![busy, other]);
    let (c, base) = (client(), base(&server));
    let url = format!("{base}/v1/chat/completions");
    // A long streamed reply keeps `busy` in use (20 ms a token, 400 tokens).
    let mut body = ask("busy", "hi");
    body["max_tokens"] = json!(400);
    body["stream"] = json!(true);
    let mut stream = c.post(&url).json(&body).send().await.unwrap();
    assert_eq!(stream.status(), 200);
    let first = stream.chunk().await.unwrap().expect("a first chunk");
    assert!(!first.is_empty());
    let r = c.post(&url).json(&ask("other", "hi")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let v: Value = r.json().await.unwrap();
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("'other' cannot be loaded now") && message.contains("'busy'"),
        "{message}"
    );
    assert_eq!(
        states(&c, &base).await,
        named(&[("busy", "loaded"), ("other", "unloaded")])
    );
    // The client leaves; once the reply is cancelled, `busy` is idle and gives way.
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, v) = post(&c, &url, &ask("other", "hi")).await;
        if status == 200 {
            break;
        }
        assert_eq!(status, 503, "{v}");
        assert!(Instant::now() < deadline, "never given way: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        states(&c, &base).await,
        named(&[("busy", "unloaded"), ("other", "loaded")])
    );
}

#[tokio::test]
async fn a_model_that_fails_to_load_or_cannot_fit_is_refused_and_the_others_keep_serving() {
    let (a, _) = spec("a", Duration::ZERO, false);
    let broken = ModelSpec {
        id: "broken".into(),
        load: Arc::new(|| Err("missing tensor 'blk.0.attn_q.weight'".into())),
        bytes_hint: 0,
    };
    let (mut huge, huge_loads) = spec("huge", Duration::ZERO, false);
    huge.bytes_hint = 64 << 30;
    let budget = Budget {
        max_loaded: None,
        memory: Some(8 << 30),
    };
    let server = serve(budget, vec![a, broken, huge]);
    let (c, base) = (client(), base(&server));
    let url = format!("{base}/v1/chat/completions");
    let (status, v) = post(&c, &url, &ask("broken", "hi")).await;
    assert_eq!(status, 500, "{v}");
    assert_eq!(
        v["error"]["message"],
        "The model 'broken' could not be loaded: missing tensor 'blk.0.attn_q.weight'"
    );
    let (status, v) = post(&c, &url, &ask("huge", "hi")).await;
    assert_eq!(
        (status, &v["error"]["code"]),
        (400, &json!("model_too_large")),
        "{v}"
    );
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("65536 MiB") && message.contains("8192 MiB"),
        "{message}"
    );
    assert_eq!(huge_loads.load(Ordering::SeqCst), 0, "never loaded");
    // Anthropic's shape for the same refusal.
    let (status, v) = post(
        &c,
        &format!("{base}/v1/messages"),
        &json!({"model": "broken", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!((status, &v["type"]), (500, &json!("error")), "{v}");
    let (status, v) = post(&c, &url, &ask("a", "hi")).await;
    assert_eq!(status, 200, "{v}");
    let list = get_json(&c, &format!("{base}/health")).await;
    assert_eq!(list["models"][1]["state"], "failed", "{list}");
    assert!(list["models"][1]["error"]
        .as_str()
        .is_some_and(|e| e.contains("missing tensor")));
    assert_eq!(list["models"][2]["state"], "unloaded", "{list}");
}

/// An embedding model beside a chat model: BERT from its directory and from llama.cpp's GGUF
/// of it, each with its own tokenizer pipeline and pooling, gives sentence-transformers'
/// embeddings; asked to chat, it says what it is.
#[tokio::test]
async fn embedding_models_embed_as_sentence_transformers_does() {
    use anelm_testkit::{repo_tiny, tiny_gguf};
    let encoder = |path: std::path::PathBuf| -> LoadFn {
        Arc::new(move || {
            let enc = anelm_model::encoder::load(&path).map_err(|e| e.to_string())?;
            let text = anelm_engine::TextSide::load(&path).map_err(|e| e.to_string())?;
            let tokenizer = text.tokenizer().map_err(|e| e.to_string())?.clone();
            let runner = anelm_cpu::encoder::EncoderRunner::new(Arc::new(enc), 1);
            Ok(anelm_server::EncoderParts { runner, tokenizer }.into())
        })
    };
    let (chat_model, _) = spec("chat", Duration::ZERO, false);
    let specs = vec![
        chat_model,
        ModelSpec {
            id: "bert-hf".into(),
            load: encoder(repo_tiny("bert")),
            bytes_hint: 0,
        },
        ModelSpec {
            id: "bert-gguf".into(),
            load: encoder(tiny_gguf("bert")),
            bytes_hint: 0,
        },
    ];
    let server = serve(Budget::default(), specs);
    let (c, b) = (client(), base(&server));
    let reference: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_tiny("bert").join("reference.json")).unwrap(),
    )
    .unwrap();
    let cases = reference["cases"].as_array().unwrap();
    let texts: Vec<&str> = cases.iter().map(|c| c["text"].as_str().unwrap()).collect();
    for model in ["bert-hf", "bert-gguf"] {
        let (status, v) = post(
            &c,
            &format!("{b}/v1/embeddings"),
            &json!({"model": model, "input": texts}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        let mut tokens = 0;
        for (i, case) in cases.iter().enumerate() {
            let got = v["data"][i]["embedding"].as_array().unwrap();
            let want = case["embedding"].as_array().unwrap();
            assert_eq!(got.len(), want.len());
            let worst = (got.iter().zip(want))
                .map(|(a, b)| (a.as_f64().unwrap() - b.as_f64().unwrap()).abs())
                .fold(0.0, f64::max);
            assert!(worst < 2e-6, "{model} '{}': off by {worst}", texts[i]);
            tokens += case["input_ids"].as_array().unwrap().len();
            // The model's own tokenizer pipeline: [CLS] … [SEP], lower case, accents off.
            let (status, t) = post(
                &c,
                &format!("{b}/tokenize"),
                &json!({"model": model, "content": texts[i], "add_special": true}),
            )
            .await;
            assert_eq!(status, 200, "{t}");
            assert_eq!(t["tokens"], case["input_ids"], "{model} '{}'", texts[i]);
        }
        assert_eq!(v["usage"]["prompt_tokens"], tokens, "{v}");
        assert_eq!(v["model"], model);
        // Token ids work as input too.
        let (status, v) = post(
            &c,
            &format!("{b}/v1/embeddings"),
            &json!({"model": model, "input": cases[2]["input_ids"]}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        let got = v["data"][0]["embedding"].as_array().unwrap();
        let want = cases[2]["embedding"].as_array().unwrap();
        let worst = (got.iter().zip(want))
            .map(|(a, b)| (a.as_f64().unwrap() - b.as_f64().unwrap()).abs())
            .fold(0.0, f64::max);
        assert!(worst < 2e-6, "{model} from ids: off by {worst}");
    }
    // Asked to generate, an embedding model says what it is; too long an input is a 400.
    let (status, v) = post(
        &c,
        &format!("{b}/v1/chat/completions"),
        &ask("bert-hf", "hi"),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("is an embedding model"),
        "{v}"
    );
    let long = vec!["word"; 80].join(" ");
    let (status, v) = post(
        &c,
        &format!("{b}/v1/embeddings"),
        &json!({"model": "bert-hf", "input": long}),
    )
    .await;
    assert_eq!(
        (status, &v["error"]["code"]),
        (400, &json!("context_length_exceeded")),
        "{v}"
    );
    let list = get_json(&c, &format!("{b}/health")).await;
    let bert = &list["models"][1];
    assert_eq!(
        (
            &bert["kind"],
            &bert["pooling"],
            &bert["normalize"],
            &bert["context_length"]
        ),
        (
            &json!("embedding"),
            &json!("mean"),
            &json!(true),
            &json!(64)
        ),
        "{list}"
    );
}

/// A chat model whose sentence-transformers configuration names last-token pooling (as decoder
/// embedding models such as Qwen3-Embedding do) is pooled that way unless the server says
/// otherwise.
#[tokio::test]
async fn a_chat_model_pools_as_its_configuration_says() {
    let dir = model_dir();
    std::fs::write(
        dir.path().join("modules.json"),
        r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
            {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"}]"#,
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("1_Pooling")).unwrap();
    std::fs::write(
        dir.path().join("1_Pooling/config.json"),
        r#"{"word_embedding_dimension": 64, "pooling_mode_lasttoken": true}"#,
    )
    .unwrap();
    let ids = [1u32, 8, 6, 3];
    let loaded = LoadedModel::load(dir.path()).unwrap();
    let mut exec = anelm_cpu::CpuExecutor::new(loaded.model.clone(), 1);
    let mut hidden = Vec::new();
    let mut state = anelm_model::Executor::new_state(&exec, ids.len()).unwrap();
    anelm_model::Executor::hidden_states(&mut exec, state.as_mut(), &ids, &mut hidden).unwrap();
    let h = hidden.len() / ids.len();
    let (last, mean) = (
        anelm_model::encoder::pool(&hidden, h, anelm_server::Pooling::Last, true),
        anelm_model::encoder::pool(&hidden, h, anelm_server::Pooling::Mean, true),
    );
    assert_ne!(
        last, mean,
        "the two poolings must differ for this test to tell them apart"
    );
    for (asked, pooling) in [
        (None, anelm_server::Pooling::Last),
        (
            Some(anelm_server::Pooling::Mean),
            anelm_server::Pooling::Mean,
        ),
    ] {
        let want = anelm_model::encoder::pool(&hidden, h, pooling, true);
        let loaded = LoadedModel::load(dir.path()).unwrap();
        let exec = Box::new(anelm_cpu::CpuExecutor::new(loaded.model.clone(), 1));
        let mut cfg = config(1, 4);
        cfg.pooling = asked;
        cfg.model_id = Some("m".into());
        let server = Server::start(cfg, loaded, exec).unwrap();
        let (status, v) = post(
            &client(),
            &format!("{}/v1/embeddings", base(&server)),
            &json!({"model": "m", "input": ids}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        let got: Vec<f32> = (v["data"][0]["embedding"].as_array().unwrap().iter())
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(got, want, "{asked:?}");
    }
}

/// SmolLM2 and Gemma 3 in one server with room for one: every switch unloads the other, and
/// each answers exactly as it did before (greedy) and as SmolLM2 alone does.
#[tokio::test]
async fn real_models_take_turns_and_answer_as_alone() {
    use anelm_testkit::{model, GEMMA3, SMOLLM2};
    let load_real = |file: &'static str| -> LoadFn {
        Arc::new(move || {
            let loaded = LoadedModel::load(&model(file)).map_err(|e| e.to_string())?;
            let exec = Box::new(anelm_cpu::CpuExecutor::new(loaded.model.clone(), 0));
            Ok(LoadedParts {
                loaded,
                exec,
                draft: None,
            }
            .into())
        })
    };
    let specs = vec![
        ModelSpec {
            id: "smol".into(),
            load: load_real(SMOLLM2),
            bytes_hint: 0,
        },
        ModelSpec {
            id: "gemma".into(),
            load: load_real(GEMMA3),
            bytes_hint: 0,
        },
    ];
    let budget = Budget {
        max_loaded: Some(1),
        memory: None,
    };
    let server = serve(budget, specs);
    let (c, b) = (client(), base(&server));
    let url = format!("{b}/v1/chat/completions");
    let mut answers = Vec::new();
    for id in ["gemma", "smol", "gemma", "smol"] {
        let mut body = chat("Name three colours.", 16);
        body["model"] = json!(id);
        let (status, v) = post(&c, &url, &body).await;
        assert_eq!(status, 200, "{v}");
        answers.push(v["choices"][0]["message"]["content"].clone());
        let loaded: Vec<_> = (states(&c, &b).await.into_iter())
            .filter(|(_, s)| s == "loaded")
            .map(|(m, _)| m)
            .collect();
        assert_eq!(loaded, vec![id.to_string()]);
    }
    assert_eq!(answers[0], answers[2], "Gemma after a reload");
    assert_eq!(answers[1], answers[3], "SmolLM2 after a reload");
    drop(server);
    let alone = start(common::config(2, 4));
    let (status, v) = post(
        &c,
        &format!("{}/v1/chat/completions", base(&alone)),
        &chat("Name three colours.", 16),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], answers[1]);
}
