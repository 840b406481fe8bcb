//! Continuous batching: requests in progress advance together, one batched step per token;
//! one that arrives joins at the next step, and one whose client leaves drops out — and every
//! greedy reply is exactly the reply the request gets alone.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const PROMPTS: [(&str, u32); 4] = [
    ("Name three colours.", 40),
    ("What is the capital of France? Answer in one word.", 12),
    (
        "Write a short poem about the rain falling on a quiet town at night.",
        48,
    ),
    ("Count from one to ten.", 30),
];

fn reply(v: &Value) -> (String, String, u64) {
    let choice = &v["choices"][0];
    (
        choice["message"]["content"]
            .as_str()
            .unwrap_or_else(|| panic!("a reply: {v}"))
            .to_string(),
        choice["finish_reason"].as_str().unwrap_or("").to_string(),
        v["usage"]["completion_tokens"].as_u64().unwrap_or(0),
    )
}

async fn ask(c: &reqwest::Client, url: &str, i: usize) -> (String, String, u64) {
    let (prompt, max_tokens) = PROMPTS[i];
    let (status, v) = post(c, url, &chat(prompt, max_tokens)).await;
    assert_eq!(status, 200, "{v}");
    reply(&v)
}

#[tokio::test]
async fn concurrent_greedy_requests_equal_their_solo_replies() {
    let server = start(config(4, 8));
    let (c, base) = (client(), base(&server));
    let url = format!("{base}/v1/chat/completions");

    let mut solo = Vec::new();
    for i in 0..PROMPTS.len() {
        solo.push(ask(&c, &url, i).await);
    }
    assert_eq!(health(&c, &base).await["widest_step"], 1);

    // All four at once, then again with a late arrival and a client that leaves mid-way.
    let together: Vec<_> = (0..PROMPTS.len())
        .map(|i| {
            let (c, url) = (c.clone(), url.clone());
            tokio::spawn(async move { ask(&c, &url, i).await })
        })
        .collect();
    for (i, t) in together.into_iter().enumerate() {
        assert_eq!(t.await.unwrap(), solo[i], "prompt {i} together vs alone");
    }
    let h = health(&c, &base).await;
    assert!(h["widest_step"].as_u64().unwrap() >= 3, "{h}");

    let early: Vec<_> = [0, 2]
        .into_iter()
        .map(|i| {
            let (c, url) = (c.clone(), url.clone());
            (i, tokio::spawn(async move { ask(&c, &url, i).await }))
        })
        .collect();
    let leaving = tokio::spawn({
        let (c, url) = (c.clone(), url.clone());
        async move {
            c.post(&url)
                .json(&chat("Tell me a long story.", 4000))
                .send()
                .await
        }
    });
    let t = Instant::now();
    while health(&c, &base).await["busy"] != 3 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "three requests never ran together"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let late = {
        let (c, url) = (c.clone(), url.clone());
        tokio::spawn(async move { ask(&c, &url, 3).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    leaving.abort();
    assert_eq!(late.await.unwrap(), solo[3], "the late arrival");
    for (i, t) in early {
        assert_eq!(
            t.await.unwrap(),
            solo[i],
            "prompt {i} beside a late one and a leaving one"
        );
    }
    let t = Instant::now();
    loop {
        let h = health(&c, &base).await;
        if h["busy"] == 0 {
            assert_eq!(h["cancelled"], 1, "{h}");
            assert_eq!(h["failed"], 0, "{h}");
            assert_eq!(h["completed"], 11, "{h}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{h}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// With prompt lookup (`serve --lookup`), greedy replies are the replies without it — alone
/// and several at once (speculating generations verify on their own beside the batch) — and
/// JSON mode still gives JSON.
#[tokio::test]
async fn prompt_lookup_keeps_every_greedy_reply() {
    let plain = start(config(4, 8));
    let mut cfg = config(4, 8);
    cfg.scheduler.lookup = Some(anelm_server::LookupConfig { k: 6, max_ngram: 3 });
    let lookup = start(cfg);
    let c = client();
    let (plain_url, lookup_url) = (
        format!("{}/v1/chat/completions", base(&plain)),
        format!("{}/v1/chat/completions", base(&lookup)),
    );
    let mut solo = Vec::new();
    for i in 0..PROMPTS.len() {
        solo.push(ask(&c, &plain_url, i).await);
        assert_eq!(ask(&c, &lookup_url, i).await, solo[i], "prompt {i} alone");
    }
    // A reply that repeats its prompt, where lookup drafts the most.
    let text = "The quick brown fox jumps over the lazy dog near the old river bank.";
    let echo = chat(&format!("Repeat exactly: {text}"), 40);
    let (s1, a) = post(&c, &plain_url, &echo).await;
    let (s2, b) = post(&c, &lookup_url, &echo).await;
    assert_eq!((s1, s2), (200, 200));
    assert_eq!(reply(&a), reply(&b), "the echo");
    assert!(a["timings"].get("draft_n").is_none(), "{a}");
    let (drafted, accepted) = (&b["timings"]["draft_n"], &b["timings"]["draft_n_accepted"]);
    assert!(
        accepted.as_u64().unwrap() > 0,
        "lookup drafted {drafted}, kept {accepted}"
    );
    let together: Vec<_> = (0..PROMPTS.len())
        .map(|i| {
            let (c, url) = (c.clone(), lookup_url.clone());
            tokio::spawn(async move { ask(&c, &url, i).await })
        })
        .collect();
    for (i, t) in together.into_iter().enumerate() {
        assert_eq!(
            t.await.unwrap(),
            solo[i],
            "prompt {i} with lookup, together"
        );
    }
    let mut json = chat("Give a JSON object with a name and an age.", 40);
    json["response_format"] = serde_json::json!({"type": "json_object"});
    let (status, v) = post(&c, &lookup_url, &json).await;
    assert_eq!(status, 200, "{v}");
    let content = reply(&v).0;
    if reply(&v).1 == "stop" {
        serde_json::from_str::<Value>(&content).unwrap_or_else(|e| panic!("{e}: {content}"));
    }
}

/// With a draft model (`serve --draft`), greedy replies are the replies without it, alone and
/// four at once; the draft models are reused between requests (never more than the slots).
#[tokio::test]
async fn a_draft_model_keeps_every_greedy_reply() {
    let plain = start(config(4, 8));
    let mut cfg = config(4, 8);
    let (draft, made) = self_draft(4);
    cfg.scheduler.draft = Some(draft);
    let drafting = start(cfg);
    let c = client();
    let (plain_url, draft_url) = (
        format!("{}/v1/chat/completions", base(&plain)),
        format!("{}/v1/chat/completions", base(&drafting)),
    );
    let mut solo = Vec::new();
    for i in 0..PROMPTS.len() {
        solo.push(ask(&c, &plain_url, i).await);
        let (status, v) = post(&c, &draft_url, &chat(PROMPTS[i].0, PROMPTS[i].1)).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(reply(&v), solo[i], "prompt {i} alone");
        let accepted = v["timings"]["draft_n_accepted"].as_u64().unwrap_or(0);
        assert!(accepted > 0, "the self-draft kept nothing: {v}");
    }
    assert_eq!(
        made.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "one draft model, reused"
    );
    let together: Vec<_> = (0..PROMPTS.len())
        .map(|i| {
            let (c, url) = (c.clone(), draft_url.clone());
            tokio::spawn(async move { ask(&c, &url, i).await })
        })
        .collect();
    for (i, t) in together.into_iter().enumerate() {
        assert_eq!(
            t.await.unwrap(),
            solo[i],
            "prompt {i} with a draft, together"
        );
    }
    let n = made.load(std::sync::atomic::Ordering::Relaxed);
    assert!((2..=4).contains(&n), "{n} draft models for 4 slots");
}

/// Requests that arrive together and begin alike (a long shared context, then each its own
/// question) prefill the shared part once: the first computes it, the others wait a step and
/// copy its keys and values — reported as cached prompt tokens — and every reply is still the
/// one the request gets alone.
#[tokio::test]
async fn concurrent_requests_with_a_shared_prefix_prefill_it_once() {
    let context = "The lighthouse keeper wrote in his log every evening: the weather, the ships \
        that passed, the state of the lamp and the oil left in the store. "
        .repeat(6);
    let questions = [
        "What did the keeper write about?",
        "Name one thing the log recorded.",
        "Why would a keeper record the oil?",
    ];
    let bodies: Vec<Value> = questions
        .iter()
        .map(|q| chat(&format!("{context}\nQuestion: {q}"), 24))
        .collect();
    let server = start(config(4, 8));
    let (c, base) = (client(), base(&server));
    let url = format!("{base}/v1/chat/completions");
    let together: Vec<_> = bodies
        .iter()
        .map(|b| {
            let (c, url, b) = (c.clone(), url.clone(), b.clone());
            tokio::spawn(async move { post(&c, &url, &b).await })
        })
        .collect();
    let mut replies = Vec::new();
    let mut cached = Vec::new();
    for t in together {
        let (status, v) = t.await.unwrap();
        assert_eq!(status, 200, "{v}");
        let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
        cached.push((
            v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap(),
            prompt,
        ));
        replies.push(reply(&v));
    }
    // All but one took the shared context (well over a hundred tokens) by copy.
    let copied = cached.iter().filter(|(c, p)| *c >= 100 && c < p).count();
    assert!(copied >= 2, "cached / prompt tokens: {cached:?}");
    // Alone, on a server that never saw them: the same replies.
    let fresh = start(config(1, 8));
    let fresh_url = format!("{}/v1/chat/completions", common::base(&fresh));
    for (b, want) in bodies.iter().zip(&replies) {
        let (status, v) = post(&c, &fresh_url, b).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(&reply(&v), want, "a copied prefix changed a reply");
    }
}

/// A fixed-seed mixture of what a busy server sees — arrivals at random moments, requests that
/// share a system prompt or are identical, a completion whose prompt begins another's, long
/// prompts prefilled in budgeted chunks beside decoding ones, seeded sampling, and clients that
/// leave — gives every request that stays its reply alone, in two rounds.
#[tokio::test]
async fn a_random_mixture_of_requests_each_get_their_solo_reply() {
    let server = start(config(4, 32));
    let (c, base) = (client(), base(&server));
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let story =
        "The river ran past the old mill, the quiet farms and the stone bridge. ".repeat(70);
    let system = "You are a careful assistant. Answer briefly and precisely. ".repeat(4);
    let mut requests: Vec<(String, Value)> = Vec::new();
    for i in 0..14 {
        let max_tokens = 3 + next(37);
        let (path, body) = match next(6) {
            0 => (
                "chat/completions",
                serde_json::json!({"model": MODEL, "max_tokens": max_tokens, "temperature": 0,
                    "messages": [{"role": "system", "content": system},
                                 {"role": "user", "content": format!("Tell me about topic {}.", next(4))}]}),
            ),
            1 => (
                "chat/completions",
                chat("Write a poem about the sea.", max_tokens as u32),
            ),
            2 => (
                "chat/completions",
                chat(
                    &format!(
                        "Summarise: {}",
                        &story[..200 + next(story.len() as u64 - 200) as usize]
                    ),
                    max_tokens as u32,
                ),
            ),
            3 => (
                "completions",
                serde_json::json!({"model": MODEL, "max_tokens": max_tokens, "temperature": 0,
                    "prompt": &story[..[60, 300, 1500, 3000][next(4) as usize]]}),
            ),
            4 => (
                "chat/completions",
                serde_json::json!({"model": MODEL, "max_tokens": max_tokens, "temperature": 0.9,
                    "seed": next(3), "messages": [{"role": "user", "content": "Name some fruits."}]}),
            ),
            _ => (
                "completions",
                serde_json::json!({"model": MODEL, "max_tokens": max_tokens,
                    "temperature": 0, "prompt": format!("Once upon a time{}", " there was".repeat(i))}),
            ),
        };
        requests.push((format!("{base}/v1/{path}"), body));
    }
    let text = |v: &Value| {
        let choice = &v["choices"][0];
        choice["text"]
            .as_str()
            .or(choice["message"]["content"].as_str())
            .unwrap_or_else(|| panic!("a reply: {v}"))
            .to_string()
    };
    let mut solo = Vec::new();
    for (url, body) in &requests {
        let (status, v) = post(&c, url, body).await;
        assert_eq!(status, 200, "{v}");
        solo.push(text(&v));
    }
    for round in 0..2 {
        let tasks: Vec<_> = requests
            .iter()
            .map(|(url, body)| {
                let (c, url, body) = (c.clone(), url.clone(), body.clone());
                let (delay, leaves) = (next(800), next(8) == 0);
                let task = tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                    post(&c, &url, &body).await
                });
                if leaves {
                    let abort = task.abort_handle();
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(delay + 30)).await;
                        abort.abort();
                    });
                }
                task
            })
            .collect();
        let mut kept = 0;
        for (i, t) in tasks.into_iter().enumerate() {
            let Ok((status, v)) = t.await else {
                continue;
            };
            assert_eq!(status, 200, "{v}");
            assert_eq!(
                text(&v),
                solo[i],
                "round {round}: request {i} differs from alone"
            );
            kept += 1;
        }
        assert!(
            kept >= requests.len() / 2,
            "round {round}: only {kept} stayed"
        );
    }
    let h = health(&c, &base).await;
    assert!(h["widest_step"].as_u64().unwrap() >= 3, "{h}");
    assert_eq!(h["failed"], 0, "{h}");
}
