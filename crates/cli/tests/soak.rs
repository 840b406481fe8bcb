//! The soak: `anelm serve` on the real SmolLM2, loopback only, many clients for a while, mixing
//! both APIs streamed and not, cancellations mid-stream, slow readers, oversized and malformed
//! bodies, prompts near the context limit and a shared long prefix. It asserts: no crash; every
//! request answered correctly (a greedy answer equals the same conversation's answer alone — no
//! cross-talk between sessions), refused with 503, or (bad input) refused with its 4xx; `/health`
//! answering throughout with p99 under a bound; RSS at the end within 24 MiB of what the first
//! third (at least 10 s) of the soak reached (no leak); and after `kill -9` a new server serving at once. The figures go to stdout
//! and target/ci-artifacts/soak.json.
//!
//! CI runs a light version (24 clients, 20 s); `scripts/soak.sh` the full one (100 clients, 60 s)
//! through ANELM_SOAK_CLIENTS and ANELM_SOAK_SECONDS.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anelm_testkit::{model, SMOLLM2};
use serde_json::{json, Value};

const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1";
const CTX: usize = 512;
const MAX_TOKENS: u32 = 10;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Served {
    child: Child,
    addr: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(port: u16) -> Served {
    let m = model(SMOLLM2);
    let mut child = Command::new(env!("CARGO_BIN_EXE_anelm"))
        .args([
            "serve",
            "--model",
            m.to_str().unwrap(),
            "--port",
            &port.to_string(),
        ])
        .args([
            "--ctx",
            &CTX.to_string(),
            "--parallel",
            "4",
            "--queue",
            "16",
            "-t",
            "2",
        ])
        .args(["--max-body-bytes", "65536"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("serve prints its address").unwrap();
        if let Some(rest) = line.split("http://").nth(1) {
            break rest.split([' ', '/', ')']).next().unwrap().to_string();
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    Served { child, addr }
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// A response: status, headers (lower-case names) and the de-chunked body.
struct Response {
    status: u16,
    headers: String,
    body: Vec<u8>,
}

/// Sends one request (Connection: close). `slow`: read the body a few bytes at a time with
/// pauses; `cancel_after`: drop the connection once that many body bytes arrived.
fn send(
    addr: &str,
    path: &str,
    body: &[u8],
    slow: bool,
    cancel_after: Option<usize>,
) -> std::io::Result<Option<Response>> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    let method = if body.is_empty() { "GET" } else { "POST" };
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )?;
    s.write_all(body)?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 64];
    loop {
        let n = if slow {
            std::thread::sleep(Duration::from_millis(30));
            s.read(&mut buf[..16])?
        } else {
            s.read(&mut buf)?
        };
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        if let Some(limit) = cancel_after {
            if raw.len() > limit {
                return Ok(None);
            }
        }
    }
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a header block");
    let head = String::from_utf8_lossy(&raw[..split]).to_lowercase();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let rest = &raw[split + 4..];
    let body = if head.contains("transfer-encoding: chunked") {
        dechunk(rest)
    } else {
        rest.to_vec()
    };
    Ok(Some(Response {
        status,
        headers: head,
        body,
    }))
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size =
            usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap().trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[eol + 2 + size + 2..];
    }
    out
}

#[derive(Clone, Copy, Debug)]
enum Api {
    Chat,
    ChatStream,
    Messages,
    MessagesStream,
}

/// A conversation a client repeats: its API, its messages.
#[derive(Clone, Debug)]
struct Conversation {
    api: Api,
    messages: Value,
}

fn conversations() -> Vec<Conversation> {
    let shared = "You answer in one short sentence. ".repeat(12);
    let near_limit = format!(
        "Read this and say one word about it. {}",
        "The river bends past the old mill and the ferry. ".repeat(38)
    );
    let mut out = Vec::new();
    let topics = [
        "lighthouses",
        "volcanoes",
        "owls",
        "glaciers",
        "comets",
        "violins",
    ];
    for (i, t) in topics.iter().enumerate() {
        let api = [
            Api::Chat,
            Api::ChatStream,
            Api::Messages,
            Api::MessagesStream,
        ][i % 4];
        out.push(Conversation {
            api,
            messages: json!([{"role": "user", "content": format!("Write one sentence about {t}.")}]),
        });
        // The same long system prompt before different questions: a shared prefix.
        out.push(Conversation {
            api: [Api::ChatStream, Api::Chat][i % 2],
            messages: json!([{"role": "system", "content": shared},
                             {"role": "user", "content": format!("Name a colour of {t}.")}]),
        });
    }
    for api in [Api::Chat, Api::MessagesStream] {
        out.push(Conversation {
            api,
            messages: json!([{"role": "user", "content": near_limit}]),
        });
    }
    out
}

impl Conversation {
    fn request(&self) -> (&'static str, Vec<u8>) {
        let stream = matches!(self.api, Api::ChatStream | Api::MessagesStream);
        let body = json!({"model": MODEL, "messages": self.messages, "max_tokens": MAX_TOKENS,
                          "temperature": 0, "stream": stream});
        let path = match self.api {
            Api::Chat | Api::ChatStream => "/v1/chat/completions",
            Api::Messages | Api::MessagesStream => "/v1/messages",
        };
        (path, body.to_string().into_bytes())
    }

    /// The answer's text, from a JSON body or a complete event stream.
    fn answer(&self, body: &[u8]) -> Option<String> {
        let text = std::str::from_utf8(body).ok()?;
        let data: Vec<&str> = text
            .split("\n\n")
            .filter_map(|b| b.lines().find_map(|l| l.strip_prefix("data: ")))
            .collect();
        match self.api {
            Api::Chat => Some(
                serde_json::from_str::<Value>(text).ok()?["choices"][0]["message"]["content"]
                    .as_str()?
                    .to_string(),
            ),
            Api::Messages => Some(
                serde_json::from_str::<Value>(text).ok()?["content"][0]["text"]
                    .as_str()?
                    .to_string(),
            ),
            Api::ChatStream => {
                if data.last() != Some(&"[DONE]") {
                    return None;
                }
                let mut out = String::new();
                for d in &data[..data.len() - 1] {
                    let v: Value = serde_json::from_str(d).ok()?;
                    out += v["choices"][0]["delta"]["content"].as_str().unwrap_or("");
                }
                Some(out)
            }
            Api::MessagesStream => {
                let mut out = String::new();
                let mut stopped = false;
                for d in data {
                    let v: Value = serde_json::from_str(d).ok()?;
                    match v["type"].as_str()? {
                        "content_block_delta" => out += v["delta"]["text"].as_str().unwrap_or(""),
                        "message_stop" => stopped = true,
                        _ => {}
                    }
                }
                stopped.then_some(out)
            }
        }
    }
}

#[derive(Default, Debug)]
struct Tally {
    answered: usize,
    refused: usize,
    cancelled: usize,
    bad_input_refused: usize,
    wrong: Vec<String>,
    unexpected: Vec<String>,
}

/// What a client does on its `round`-th request.
fn one_request(
    addr: &str,
    client: usize,
    round: usize,
    convs: &[Conversation],
    want: &[String],
    t: &Mutex<Tally>,
) {
    let kind = (client + round) % 10;
    let conv_at = (client * 7 + round) % convs.len();
    let conv = &convs[conv_at];
    let (path, body) = conv.request();
    let outcome = match kind {
        // A malformed body and an oversized one: their 4xx.
        0 => {
            let r = send(
                addr,
                "/v1/chat/completions",
                b"{\"model\": \"x\", \"messages\": [",
                false,
                None,
            );
            match r {
                Ok(Some(r)) if r.status == 400 => Ok("bad"),
                Ok(Some(r)) => Err(format!(
                    "malformed body: {} {}",
                    r.status,
                    String::from_utf8_lossy(&r.body)
                )),
                other => Err(format!("malformed body: {:?}", other.err())),
            }
        }
        1 => {
            let big = format!("{{\"pad\": \"{}\"}}", "x".repeat(80 << 10));
            match send(addr, "/v1/messages", big.as_bytes(), false, None) {
                Ok(Some(r)) if r.status == 413 => Ok("bad"),
                // The server may close the connection before reading the whole body.
                Err(_) => Ok("bad"),
                Ok(Some(r)) => Err(format!("oversized body: {}", r.status)),
                Ok(None) => Err("oversized body: no answer".into()),
            }
        }
        // Cancelled mid-stream: the stream is dropped after its first bytes.
        2 => {
            let mut c = conv.clone();
            c.api = Api::ChatStream;
            let (p, b) = c.request();
            match send(addr, p, &b, false, Some(200)) {
                Ok(None) => Ok("cancelled"),
                Ok(Some(r)) if r.status == 503 || r.status == 200 => Ok("cancelled"),
                Ok(Some(r)) => Err(format!("cancelled stream: {}", r.status)),
                Err(e) => Err(format!("cancelled stream: {e}")),
            }
        }
        // A slow reader of a stream, or a normal client.
        _ => match send(addr, path, &body, kind == 3, None) {
            Ok(Some(r)) if r.status == 200 => match conv.answer(&r.body) {
                Some(a) if a == want[conv_at] => Ok("answered"),
                Some(a) => {
                    t.lock()
                        .unwrap()
                        .wrong
                        .push(format!("{conv:?}: {a:?} vs alone {:?}", want[conv_at]));
                    Ok("wrong")
                }
                None => Err(format!(
                    "a malformed answer: {}",
                    String::from_utf8_lossy(&r.body)
                )),
            },
            Ok(Some(r)) if r.status == 503 && r.headers.contains("retry-after") => Ok("refused"),
            Ok(Some(r)) => Err(format!(
                "{}: {}",
                r.status,
                String::from_utf8_lossy(&r.body)
            )),
            Ok(None) => Err("no answer".into()),
            Err(e) => Err(format!("transport: {e}")),
        },
    };
    let mut t = t.lock().unwrap();
    match outcome {
        Ok("answered") => t.answered += 1,
        Ok("refused") => {
            t.refused += 1;
            drop(t);
            // As a client honouring Retry-After would, briefly.
            std::thread::sleep(Duration::from_millis(250));
        }
        Ok("cancelled") => t.cancelled += 1,
        Ok("bad") => t.bad_input_refused += 1,
        Ok(_) => {}
        Err(e) => t.unexpected.push(e),
    }
}

#[test]
fn many_clients_for_a_while_then_kill_9_and_serve_again() {
    let clients = env_or("ANELM_SOAK_CLIENTS", 24) as usize;
    let seconds = env_or("ANELM_SOAK_SECONDS", 20);
    let mut server = serve(0);
    let addr = server.addr.clone();
    let pid = server.child.id();
    let convs = conversations();
    // Each conversation alone first: the answers the load must reproduce.
    let want: Vec<String> = convs
        .iter()
        .map(|c| {
            let (p, b) = c.request();
            let r = send(&addr, p, &b, false, None).unwrap().unwrap();
            assert_eq!(r.status, 200, "{c:?}: {}", String::from_utf8_lossy(&r.body));
            c.answer(&r.body).unwrap_or_else(|| panic!("{c:?}"))
        })
        .collect();
    let warm_rss = rss_kib(pid);

    let tally = Arc::new(Mutex::new(Tally::default()));
    let done = Arc::new(AtomicBool::new(false));
    let health: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let started = Instant::now();
    let monitor = {
        let (addr, done, health) = (addr.clone(), done.clone(), health.clone());
        std::thread::spawn(move || {
            // (seconds into the soak, RSS) every tick.
            let mut rss = Vec::new();
            while !done.load(Ordering::Relaxed) {
                let t = Instant::now();
                let r = send(&addr, "/health", b"", false, None)
                    .expect("/health answers")
                    .unwrap();
                assert_eq!(r.status, 200);
                health.lock().unwrap().push(t.elapsed());
                rss.push((started.elapsed().as_secs_f64(), rss_kib(pid)));
                std::thread::sleep(Duration::from_millis(100));
            }
            rss
        })
    };
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let workers: Vec<_> = (0..clients)
        .map(|client| {
            let (addr, convs, want, tally) =
                (addr.clone(), convs.clone(), want.clone(), tally.clone());
            std::thread::spawn(move || {
                let mut round = 0;
                while Instant::now() < deadline {
                    one_request(&addr, client, round, &convs, &want, &tally);
                    round += 1;
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("a client thread panicked");
    }
    done.store(true, Ordering::Relaxed);
    let rss = monitor.join().expect("the monitor");
    let peak_rss = rss.iter().map(|r| r.1).max().unwrap_or(0);
    // Warmed up under load: the largest RSS of the first third, and of at least the first 10 s
    // (every slot and cached session has been used by then). Warming up takes a time, not a share
    // of the run: the full 60 s run grows by under 1 MiB after its first third, while the light
    // 20 s one on a 2 vCPU AVX2 EPYC once ended 20 MiB above its first 6.7 s (8 and 16 MiB in
    // two reruns). A leak would keep growing past it.
    let warm_up = (seconds as f64 / 3.0).max(10.0);
    let loaded_rss = rss
        .iter()
        .filter(|r| r.0 < warm_up)
        .map(|r| r.1)
        .max()
        .unwrap_or(warm_rss);
    // Quiet again: the server settles, and the same conversations still get the same answers.
    std::thread::sleep(Duration::from_millis(500));
    for (c, w) in convs.iter().zip(&want) {
        let (p, b) = c.request();
        let r = send(&addr, p, &b, false, None).unwrap().unwrap();
        assert_eq!(c.answer(&r.body).as_ref(), Some(w), "{c:?} after the soak");
    }
    let end_rss = rss_kib(pid);
    let mut lat = health.lock().unwrap().clone();
    lat.sort();
    let p99 = lat[((lat.len() - 1) as f64 * 0.99).round() as usize];
    let t = tally.lock().unwrap();

    // kill -9, then a new server on the same port serves at once.
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    unsafe_kill_9(&mut server);
    let restarted = Instant::now();
    let again = serve(port);
    let (p, b) = convs[0].request();
    let r = send(&again.addr, p, &b, false, None).unwrap().unwrap();
    let restart_ms = restarted.elapsed().as_millis();
    assert_eq!(
        convs[0].answer(&r.body).as_ref(),
        Some(&want[0]),
        "after kill -9"
    );

    let figures = json!({
        "clients": clients, "seconds": seconds, "answered": t.answered, "refused_503": t.refused,
        "cancelled": t.cancelled, "bad_input_refused": t.bad_input_refused, "wrong": t.wrong.len(),
        "unexpected": t.unexpected.len(), "health_checks": lat.len(),
        "health_p99_ms": p99.as_secs_f64() * 1e3, "rss_warm_mib": warm_rss as f64 / 1024.0,
        "rss_first_third_mib": loaded_rss as f64 / 1024.0,
        "rss_peak_mib": peak_rss as f64 / 1024.0, "rss_end_mib": end_rss as f64 / 1024.0,
        "restart_to_first_answer_ms": restart_ms,
    });
    println!("{figures:#}");
    let dir = anelm_testkit::workspace_root().join("target/ci-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("soak.json"), format!("{figures:#}")).unwrap();

    assert!(
        t.unexpected.is_empty(),
        "unexpected outcomes: {:#?}",
        &t.unexpected[..t.unexpected.len().min(10)]
    );
    assert!(
        t.wrong.is_empty(),
        "answers that differ from alone: {:#?}",
        &t.wrong[..t.wrong.len().min(10)]
    );
    assert!(t.answered >= clients, "too few answers: {t:?}");
    assert!(t.cancelled > 0 && t.bad_input_refused > 0, "{t:?}");
    assert!(p99 < Duration::from_millis(500), "/health p99 {p99:?}");
    // No leak: the rest of the soak and the quiet check after it add at most 24 MiB to what the
    // warm-up under load reached (measured growth: under 1 MiB in the full run, 8–20 MiB in the
    // light one on a 2 vCPU AVX2 EPYC, where its 24 clients were still warming up).
    assert!(
        end_rss <= loaded_rss + 24 * 1024,
        "RSS {loaded_rss} KiB in the first third, {end_rss} KiB at the end"
    );
    assert!(restart_ms < 15_000, "restart took {restart_ms} ms");
}

/// `kill -9` the server (SIGKILL: no shutdown of any kind).
fn unsafe_kill_9(s: &mut Served) {
    let status = Command::new("kill")
        .args(["-9", &s.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let _ = s.child.wait();
}
