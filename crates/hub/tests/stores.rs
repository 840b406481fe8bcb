//! Ollama's store as Ollama lays it out, `anelm list`'s inventory across the three stores,
//! names from it, and `rm`.

use std::path::Path;

use anelm_hub::inventory::{list, Store};
use anelm_hub::remove::remove;
use anelm_hub::{HubError, ModelRef, NoProgress, Resolver, Settings};
use anelm_testkit::fake_hub::{FakeFile, FakeHub};

fn settings(root: &Path, endpoint: &str) -> Settings {
    Settings {
        endpoint: endpoint.to_string(),
        token: None,
        offline: false,
        hf_cache: root.join("hf/hub"),
        ollama_root: root.join("ollama/models"),
        anelm_models: root.join("anelm/models"),
    }
}

/// An Ollama model: a manifest under manifests/registry.ollama.ai/<ns>/<name>/<tag> naming the
/// GGUF blob (and a config and template layer, as Ollama writes them).
pub fn ollama_model(
    root: &Path,
    ns: &str,
    name: &str,
    tag: &str,
    gguf: &[u8],
) -> std::path::PathBuf {
    use sha2::Digest;
    let hex = |b: &[u8]| -> String {
        sha2::Sha256::digest(b)
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect()
    };
    let blobs = root.join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let (m, t, c) = (hex(gguf), hex(b"{{ .Prompt }}"), hex(b"{}"));
    std::fs::write(blobs.join(format!("sha256-{m}")), gguf).unwrap();
    std::fs::write(blobs.join(format!("sha256-{t}")), b"{{ .Prompt }}").unwrap();
    std::fs::write(blobs.join(format!("sha256-{c}")), b"{}").unwrap();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": format!("sha256:{c}"), "size": 2},
        "layers": [
            {"mediaType": "application/vnd.ollama.image.model", "digest": format!("sha256:{m}"), "size": gguf.len()},
            {"mediaType": "application/vnd.ollama.image.template", "digest": format!("sha256:{t}"), "size": 13}
        ]
    });
    let dir = root
        .join("manifests/registry.ollama.ai")
        .join(ns)
        .join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(tag), manifest.to_string()).unwrap();
    blobs.join(format!("sha256-{m}"))
}

fn gguf() -> Vec<u8> {
    std::fs::read(anelm_testkit::tiny_gguf("gpt2")).unwrap()
}

#[test]
fn ollama_models_are_used_in_place() {
    let tmp = tempfile::tempdir().unwrap();
    let s = settings(tmp.path(), "http://127.0.0.1:1");
    let blob = ollama_model(&s.ollama_root, "library", "tiny", "latest", &gguf());
    let user = ollama_model(&s.ollama_root, "someone", "other", "q8", b"GGUF?");
    let r = Resolver::new(s.clone());
    assert_eq!(
        r.resolve_str("ollama:tiny:latest", &NoProgress)
            .unwrap()
            .path,
        blob
    );
    assert_eq!(
        r.resolve_str("ollama:tiny", &NoProgress).unwrap().path,
        blob
    );
    assert_eq!(
        r.resolve_str("ollama:someone/other:q8", &NoProgress)
            .unwrap()
            .path,
        user
    );
    let e = r
        .resolve_str("ollama:tiny:7b", &NoProgress)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("ollama:tiny:7b is not in Ollama's store") && e.contains("ollama pull tiny:7b"),
        "{e}"
    );
}

#[test]
fn a_manifest_naming_a_missing_blob_is_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let s = settings(tmp.path(), "http://127.0.0.1:1");
    let blob = ollama_model(&s.ollama_root, "library", "tiny", "latest", &gguf());
    std::fs::remove_file(&blob).unwrap();
    let e = Resolver::new(s.clone())
        .resolve_str("ollama:tiny", &NoProgress)
        .unwrap_err();
    assert!(matches!(e, HubError::NotFound(_)));
    let msg = e.to_string();
    assert!(
        msg.contains("its manifest names the blob sha256-")
            && msg.contains("which is missing")
            && !msg.contains('\n'),
        "{msg}"
    );
    // A truncated blob is caught by the manifest's size.
    let blob = ollama_model(&s.ollama_root, "library", "cut", "latest", &gguf());
    std::fs::write(&blob, &gguf()[..1000]).unwrap();
    let msg = Resolver::new(s)
        .resolve_str("ollama:cut", &NoProgress)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("has 1000 bytes where its manifest says"),
        "{msg}"
    );
}

#[test]
fn list_shows_every_store_with_format_and_quantisation_and_names_resolve() {
    let hub = FakeHub::start();
    let c = "3333333333333333333333333333333333333333";
    hub.add_commit(
        "org/tiny-GGUF",
        c,
        &["main"],
        vec![FakeFile::new("tiny-F32.gguf", gguf(), true)],
    );
    let dir = anelm_testkit::tiny("llama");
    let st = ["config.json", "model.safetensors"]
        .map(|f| FakeFile::new(f, std::fs::read(dir.join(f)).unwrap(), f != "config.json"));
    hub.add_commit("org/llama-tiny", c, &["main"], st.to_vec());
    let tmp = tempfile::tempdir().unwrap();
    let s = settings(tmp.path(), hub.url());
    let r = Resolver::new(s.clone());
    r.resolve_str("org/tiny-GGUF:F32", &NoProgress).unwrap();
    r.resolve_str("org/llama-tiny", &NoProgress).unwrap();
    ollama_model(&s.ollama_root, "library", "tiny", "latest", &gguf());
    std::fs::create_dir_all(&s.anelm_models).unwrap();
    std::fs::copy(
        anelm_testkit::tiny_gguf("gemma"),
        s.anelm_models.join("gemma-tiny.gguf"),
    )
    .unwrap();

    let entries = list(&s, true);
    let row = |n: &str| {
        entries
            .iter()
            .find(|e| e.name == n)
            .unwrap_or_else(|| panic!("{n} in {entries:?}"))
    };
    let g = row("org/tiny-GGUF:tiny-F32.gguf");
    assert_eq!(
        (g.format, g.store, g.size),
        ("gguf", Store::HfCache, gguf().len() as u64)
    );
    let expected_quant = anelm_hub::inventory::gguf_quant(&anelm_testkit::tiny_gguf("gpt2"))
        .expect("a quantisation");
    assert_eq!(g.quant.as_deref(), Some(expected_quant.as_str()));
    let l = row("org/llama-tiny");
    assert_eq!((l.format, l.store), ("safetensors", Store::HfCache));
    let cfg: serde_json::Value = serde_json::from_slice(&st[0].bytes).unwrap();
    let dtype = cfg
        .get("torch_dtype")
        .or(cfg.get("dtype"))
        .and_then(|d| d.as_str())
        .map(str::to_string);
    assert_eq!(l.quant, dtype);
    assert_eq!(l.size, (st[0].bytes.len() + st[1].bytes.len()) as u64);
    assert_eq!(row("ollama:tiny:latest").store, Store::Ollama);
    assert_eq!(row("gemma-tiny.gguf").store, Store::Anelm);
    assert_eq!(entries.len(), 4, "{entries:?}");

    // Every listed name is a reference, and short names find their one model.
    for e in &entries {
        assert_eq!(
            r.resolve_str(&e.name, &NoProgress).unwrap().path,
            e.path,
            "{}",
            e.name
        );
    }
    assert_eq!(
        r.resolve_str("llama-tiny", &NoProgress).unwrap().path,
        l.path
    );
    assert_eq!(
        r.resolve_str("gemma-tiny", &NoProgress).unwrap().path,
        s.anelm_models.join("gemma-tiny.gguf")
    );
    assert_eq!(
        r.resolve_str("tiny", &NoProgress).unwrap().name,
        "ollama:tiny:latest"
    );
    std::fs::copy(
        anelm_testkit::tiny_gguf("gemma"),
        s.anelm_models.join("tiny.gguf"),
    )
    .unwrap();
    let e = r.resolve_str("tiny", &NoProgress).unwrap_err().to_string();
    assert!(
        e.contains("tiny names 2 models: ollama:tiny:latest, tiny.gguf"),
        "{e}"
    );
    let e = r
        .resolve_str("nothing", &NoProgress)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("nothing: no such file, and no model of that name") && !e.contains('\n'),
        "{e}"
    );
}

#[test]
fn rm_takes_a_snapshot_and_its_own_blobs_and_refuses_the_unknown() {
    let hub = FakeHub::start();
    let (c1, c2) = (
        "4444444444444444444444444444444444444444",
        "5555555555555555555555555555555555555555",
    );
    let shared = FakeFile::new("m-Q4_0.gguf", gguf(), true);
    let other = FakeFile::new("m-Q8_0.gguf", b"eight".to_vec(), true);
    hub.add_commit("org/m", c1, &["v1"], vec![shared.clone(), other.clone()]);
    hub.add_commit("org/m", c2, &["main"], vec![shared.clone()]);
    let tmp = tempfile::tempdir().unwrap();
    let s = settings(tmp.path(), hub.url());
    let r = Resolver::new(s.clone());
    r.resolve_str("org/m@v1:Q4_0", &NoProgress).unwrap();
    r.resolve_str("org/m@v1:Q8_0", &NoProgress).unwrap();
    r.resolve_str("org/m", &NoProgress).unwrap();
    let blobs = s.hf_cache.join("models--org--m/blobs");

    // One file of a snapshot; then the snapshot, keeping the blob main still uses.
    let done = remove(&s, &ModelRef::parse("org/m@v1:Q8_0").unwrap()).unwrap();
    assert_eq!((done.files, done.bytes), (1, 5));
    assert!(!blobs.join(other.sha256()).exists());
    let done = remove(&s, &ModelRef::parse("org/m@v1").unwrap()).unwrap();
    assert_eq!((done.files, done.bytes), (1, 0));
    assert!(blobs.join(shared.sha256()).exists());
    assert!(!s.hf_cache.join("models--org--m/refs/v1").exists());
    assert!(r.hub.cached("org/m", None, None).is_some());
    let done = remove(&s, &ModelRef::parse("org/m").unwrap()).unwrap();
    assert_eq!(done.bytes, gguf().len() as u64);
    assert!(!s.hf_cache.join("models--org--m").exists());

    for (bad, says) in [
        ("org/m", "org/m is not in the Hugging Face cache"),
        ("nothing", "nothing: no stored model of that name"),
        ("ollama:tiny", "ollama rm tiny:latest"),
    ] {
        let e = remove(&s, &ModelRef::parse(bad).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains(says), "{bad}: {e}");
    }
}
