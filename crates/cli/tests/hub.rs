//! Models by reference from the command line: `run --model org/name` against a Hub served by
//! the test (downloaded once into HF_HUB_CACHE, then used from it), `--draft` by reference,
//! `ollama:name:tag` from a store laid out as Ollama lays it out, `pull`, `list`, `rm`, and
//! one clear line for references that name nothing.

use std::path::Path;
use std::process::Command;

use anelm_testkit::fake_hub::{FakeFile, FakeHub};

const C: &str = "0123456789abcdef0123456789abcdef01234567";

/// `anelm args` with every store under `root` and the Hub at `endpoint`: (ok, stdout, stderr).
fn anelm(
    root: &Path,
    endpoint: &str,
    extra_env: &[(&str, &str)],
    args: &[&str],
) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_anelm"));
    cmd.args(args)
        .env("HOME", root)
        .env("HF_ENDPOINT", endpoint)
        .env("HF_HUB_CACHE", root.join("hf"))
        .env("OLLAMA_MODELS", root.join("ollama"))
        .env("ANELM_MODELS", root.join("anelm"))
        .env_remove("HF_HOME")
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE");
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run anelm");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(r: (bool, String, String)) -> String {
    assert!(r.0, "anelm failed: {}", r.2);
    r.1
}

/// The one `error: ...` line of a failure.
fn one_line_error(r: (bool, String, String)) -> String {
    assert!(!r.0, "anelm should have failed: {}", r.1);
    let lines: Vec<&str> = r.2.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {}", r.2);
    assert!(lines[0].starts_with("error: "), "{}", r.2);
    lines[0].to_string()
}

fn greedy_ids(json: &str) -> Vec<u64> {
    let v: serde_json::Value =
        serde_json::from_str(json.trim()).unwrap_or_else(|e| panic!("{e}: {json}"));
    v["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

const RUN: [&str; 6] = ["--ids", "1,2,3", "-n", "4", "--json", "--temp=0"];

fn tiny_files() -> (Vec<FakeFile>, Vec<FakeFile>) {
    let dir = anelm_testkit::tiny("llama");
    let st = ["config.json", "generation_config.json", "model.safetensors"]
        .iter()
        .map(|f| {
            FakeFile::new(
                f,
                std::fs::read(dir.join(f)).unwrap(),
                f.ends_with(".safetensors"),
            )
        })
        .collect();
    let gguf = vec![
        FakeFile::new("README.md", b"tiny".to_vec(), false),
        FakeFile::new(
            "llama-tiny-F32.gguf",
            std::fs::read(dir.join("model.gguf")).unwrap(),
            true,
        ),
    ];
    (st, gguf)
}

#[test]
fn run_by_hub_reference_downloads_once_then_uses_the_cache() {
    let hub = FakeHub::start();
    let (st, gguf) = tiny_files();
    hub.add_commit("org/llama-tiny", C, &["main"], st);
    hub.add_commit("org/llama-tiny-GGUF", C, &["main"], gguf);
    let tmp = tempfile::tempdir().unwrap();
    let (root, url) = (tmp.path(), hub.url());
    let dir = anelm_testkit::tiny("llama");
    let by_path = |p: &Path| {
        greedy_ids(&ok(anelm(
            root,
            url,
            &[],
            &[&["run", "--model", p.to_str().unwrap()][..], &RUN].concat(),
        )))
    };

    let (good, out, err) = anelm(
        root,
        url,
        &[],
        &[&["run", "--model", "org/llama-tiny"][..], &RUN].concat(),
    );
    assert!(good, "{err}");
    assert!(
        err.contains("downloading model.safetensors"),
        "a line per file off a terminal: {err}"
    );
    let ids = greedy_ids(&out);
    assert_eq!(ids.len(), 4);
    assert_eq!(ids, by_path(&dir));
    assert!(root
        .join(format!(
            "hf/models--org--llama-tiny/snapshots/{C}/config.json"
        ))
        .is_file());

    let gets = hub.log().len();
    let (good, out, err) = anelm(
        root,
        url,
        &[],
        &[&["run", "--model", "org/llama-tiny"][..], &RUN].concat(),
    );
    assert!(good && !err.contains("downloading"), "{err}");
    assert_eq!(greedy_ids(&out), ids);
    assert_eq!(hub.log().len(), gets, "a cached model needs no network");

    // A GGUF repository by quantisation, and as a draft for the safetensors model.
    let g = ok(anelm(
        root,
        url,
        &[],
        &[&["run", "--model", "org/llama-tiny-GGUF:f32"][..], &RUN].concat(),
    ));
    assert_eq!(greedy_ids(&g), by_path(&dir.join("model.gguf")));
    let spec = [
        "run",
        "--model",
        "org/llama-tiny",
        "--draft",
        "org/llama-tiny-GGUF:llama-tiny-F32.gguf",
        "--ids",
        "1,2,3",
        "-n",
        "4",
        "--json",
    ];
    assert_eq!(
        greedy_ids(&ok(anelm(root, url, &[], &spec))),
        ids,
        "speculative output is the target's greedy output"
    );

    // Offline: the cache answers; a miss is one line.
    let off = [("HF_HUB_OFFLINE", "1")];
    assert_eq!(
        greedy_ids(&ok(anelm(
            root,
            "http://127.0.0.1:1",
            &off,
            &[&["run", "--model", "org/llama-tiny"][..], &RUN].concat()
        ))),
        ids
    );
    let e = one_line_error(anelm(
        root,
        url,
        &off,
        &["run", "--model", "org/other", "--ids", "1"],
    ));
    assert!(
        e.contains("HF_HUB_OFFLINE is set and org/other is not in the Hugging Face cache"),
        "{e}"
    );
}

#[test]
fn pull_list_and_rm() {
    let hub = FakeHub::start();
    let (st, gguf) = tiny_files();
    hub.add_commit("org/llama-tiny", C, &["main"], st);
    hub.add_commit("org/llama-tiny-GGUF", C, &["main"], gguf);
    hub.add_commit(
        "org/gated",
        C,
        &["main"],
        vec![FakeFile::new("m.gguf", b"x".to_vec(), true)],
    );
    hub.gate("org/gated", "hf_secret");
    let tmp = tempfile::tempdir().unwrap();
    let (root, url) = (tmp.path(), hub.url());

    let out = ok(anelm(root, url, &[], &["pull", "org/llama-tiny-GGUF:F32"]));
    let path = root.join(format!(
        "hf/models--org--llama-tiny-GGUF/snapshots/{C}/llama-tiny-F32.gguf"
    ));
    assert_eq!(out.trim(), path.to_str().unwrap());
    ok(anelm(root, url, &[], &["pull", "org/llama-tiny"]));

    let listed: serde_json::Value =
        serde_json::from_str(&ok(anelm(root, url, &[], &["list", "--json"]))).unwrap();
    let names: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["org/llama-tiny", "org/llama-tiny-GGUF:llama-tiny-F32.gguf"]
    );
    assert_eq!(listed[0]["format"], "safetensors");
    assert_eq!(listed[0]["quant"], "float32");
    assert_eq!(listed[1]["format"], "gguf");
    assert_eq!(listed[1]["store"], "hf-cache");
    let table = ok(anelm(root, url, &[], &["list"]));
    assert!(table.lines().next().unwrap().starts_with("NAME"), "{table}");
    assert!(
        table.contains("org/llama-tiny-GGUF:llama-tiny-F32.gguf"),
        "{table}"
    );

    // A listed name is a reference.
    let ids = |m: &str| {
        greedy_ids(&ok(anelm(
            root,
            url,
            &[],
            &[&["run", "--model", m][..], &RUN].concat(),
        )))
    };
    assert_eq!(
        ids("org/llama-tiny-GGUF:llama-tiny-F32.gguf"),
        ids("llama-tiny-F32")
    );

    let out = ok(anelm(root, url, &[], &["rm", "org/llama-tiny-GGUF"]));
    assert!(
        out.contains("removed org/llama-tiny-GGUF: 1 file(s)"),
        "{out}"
    );
    assert!(!root.join("hf/models--org--llama-tiny-GGUF").exists());
    let e = one_line_error(anelm(root, url, &[], &["rm", "org/llama-tiny-GGUF"]));
    assert!(
        e.contains("org/llama-tiny-GGUF is not in the Hugging Face cache"),
        "{e}"
    );

    let e = one_line_error(anelm(root, url, &[], &["pull", "org/gated"]));
    assert!(
        e.contains("org/gated is gated or private (HTTP 401)") && e.contains("HF_TOKEN"),
        "{e}"
    );
    ok(anelm(
        root,
        url,
        &[("HF_TOKEN", "hf_secret")],
        &["pull", "org/gated"],
    ));
    let e = one_line_error(anelm(root, url, &[], &["pull", "org/missing"]));
    assert!(e.contains("org/missing: no such repository"), "{e}");
}

/// An Ollama store: manifests/registry.ollama.ai/library/<name>/<tag> naming blobs/sha256-<hex>.
fn ollama_store(root: &Path, name: &str, gguf: &[u8]) -> std::path::PathBuf {
    let sha = FakeFile::new("m", gguf.to_vec(), true).sha256();
    let blobs = root.join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::write(blobs.join(format!("sha256-{sha}")), gguf).unwrap();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": format!("sha256:{}", "0".repeat(64)), "size": 2},
        "layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": format!("sha256:{sha}"), "size": gguf.len()}]
    });
    let dir = root.join("manifests/registry.ollama.ai/library").join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("latest"), manifest.to_string()).unwrap();
    blobs.join(format!("sha256-{sha}"))
}

#[test]
fn run_from_ollamas_store_and_bad_references_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let url = "http://127.0.0.1:1";
    let gguf = anelm_testkit::tiny("llama").join("model.gguf");
    let blob = ollama_store(&root.join("ollama"), "tiny", &std::fs::read(&gguf).unwrap());
    let run = |m: &str| {
        greedy_ids(&ok(anelm(
            root,
            url,
            &[],
            &[&["run", "--model", m][..], &RUN].concat(),
        )))
    };
    assert_eq!(run("ollama:tiny:latest"), run(gguf.to_str().unwrap()));
    assert_eq!(run("ollama:tiny"), run("tiny"));

    std::fs::remove_file(&blob).unwrap();
    let e = one_line_error(anelm(
        root,
        url,
        &[],
        &["run", "--model", "ollama:tiny", "--ids", "1"],
    ));
    assert!(
        e.contains("ollama:tiny:latest: its manifest names the blob sha256-")
            && e.contains("missing"),
        "{e}"
    );
    for (bad, says) in [
        (
            "no/such/thing",
            "no such file or directory, and not a Hub repository",
        ),
        (
            "./missing.gguf",
            "./missing.gguf: no such file or directory",
        ),
        ("nothing-here", "no model of that name"),
        (
            "ollama:ghost",
            "ollama:ghost:latest is not in Ollama's store",
        ),
        ("org/m:bad quant", "not a quantisation name"),
    ] {
        let e = one_line_error(anelm(
            root,
            url,
            &[],
            &["run", "--model", bad, "--ids", "1"],
        ));
        assert!(e.contains(says), "{bad}: {e}");
    }
    let e = one_line_error(anelm(
        root,
        url,
        &[],
        &["run", "--model", "org/m", "--ids", "1"],
    ));
    assert!(e.contains("cannot reach http://127.0.0.1:1"), "{e}");
}

#[test]
fn serve_loads_a_hub_reference_and_names_the_model_by_it() {
    use std::io::{BufRead, BufReader, Read, Write};
    let hub = FakeHub::start();
    let (_, gguf) = tiny_files();
    hub.add_commit("org/llama-tiny-GGUF", C, &["main"], gguf);
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let mut child = Command::new(env!("CARGO_BIN_EXE_anelm"))
        .args(["serve", "--model", "org/llama-tiny-GGUF:F32", "--port", "0"])
        .env("HOME", root)
        .env("HF_ENDPOINT", hub.url())
        .env("HF_HUB_CACHE", root.join("hf"))
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let (line, addr) = loop {
        let line = lines.next().expect("serve prints its address").unwrap();
        if let Some(rest) = line.split("http://").nth(1) {
            let addr = rest.split([' ', '/']).next().unwrap().to_string();
            break (line, addr);
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    assert!(
        line.starts_with("anelm serve: org/llama-tiny-GGUF:F32 on"),
        "{line}"
    );
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        s,
        "GET /v1/models HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let body = resp.split("\r\n\r\n").nth(1).unwrap_or("");
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {resp}"));
    assert_eq!(v["data"][0]["id"], "org/llama-tiny-GGUF:F32", "{v}");
}
