//! `Hub::pull` against a Hub served by the test (anelm_testkit::fake_hub): fresh downloads into
//! the shared cache layout, resume after a cut connection, corrupted files refused, revision
//! pinning, offline mode and the Hub's refusals.

use std::path::{Path, PathBuf};

use anelm_hub::{Hub, HubError, NoProgress, Pick, Resolver, Settings};
use anelm_testkit::fake_hub::{FakeFile, FakeHub};

const C1: &str = "1111111111111111111111111111111111111111";
const C2: &str = "2222222222222222222222222222222222222222";

fn settings(hub: &FakeHub, cache: &Path) -> Settings {
    Settings {
        endpoint: hub.url().to_string(),
        token: None,
        offline: false,
        hf_cache: cache.join("hub"),
        ollama_root: cache.join("ollama"),
        anelm_models: cache.join("anelm"),
    }
}

fn gguf_bytes() -> Vec<u8> {
    std::fs::read(anelm_testkit::tiny_gguf("gpt2")).unwrap()
}

/// A GGUF repository (two quantisations, one of them the fixture) and a safetensors one.
fn hub_with_repos() -> (FakeHub, FakeFile, Vec<FakeFile>) {
    let hub = FakeHub::start();
    let gguf = FakeFile::new("tiny-F32.gguf", gguf_bytes(), true);
    hub.add_commit(
        "org/tiny-GGUF",
        C1,
        &["main"],
        vec![
            FakeFile::new("README.md", b"# tiny\n".to_vec(), false),
            FakeFile::new("tiny-Q8_0.gguf", b"not this one".to_vec(), true),
            gguf.clone(),
        ],
    );
    let dir = anelm_testkit::tiny("llama");
    let st: Vec<FakeFile> = ["config.json", "generation_config.json", "model.safetensors"]
        .iter()
        .map(|f| {
            FakeFile::new(
                f,
                std::fs::read(dir.join(f)).unwrap(),
                f.ends_with(".safetensors"),
            )
        })
        .collect();
    hub.add_commit("org/tiny", C1, &["main"], st.clone());
    (hub, gguf, st)
}

fn blobs(cache: &Path, repo: &str) -> PathBuf {
    cache
        .join("hub")
        .join(format!("models--{}", repo.replace('/', "--")))
        .join("blobs")
}

fn gets_of(hub: &FakeHub, suffix: &str) -> Vec<Option<String>> {
    hub.log()
        .iter()
        .filter(|l| l.method == "GET" && l.path.ends_with(suffix))
        .map(|l| l.range.clone())
        .collect()
}

#[test]
fn a_fresh_pull_fills_the_cache_as_huggingface_hub_lays_it_out() {
    let (hub, gguf, st) = hub_with_repos();
    let tmp = tempfile::tempdir().unwrap();
    let client = Hub::new(settings(&hub, tmp.path()));
    let snap = client
        .pull(
            "org/tiny-GGUF",
            None,
            Some(&Pick::Quant("f32".into())),
            &NoProgress,
        )
        .unwrap();
    assert_eq!(snap.commit, C1);
    assert_eq!(snap.files, vec!["tiny-F32.gguf".to_string()]);
    let model = snap.model_path();
    assert_eq!(std::fs::read(&model).unwrap(), gguf.bytes);
    // snapshots/<commit>/<file> -> ../../blobs/<sha256>, refs/main holds the commit.
    let link = std::fs::read_link(&model).unwrap();
    assert_eq!(link, Path::new("../../blobs").join(gguf.sha256()));
    let refs = tmp.path().join("hub/models--org--tiny-GGUF/refs/main");
    assert_eq!(std::fs::read_to_string(refs).unwrap(), C1);
    assert!(
        !blobs(tmp.path(), "org/tiny-GGUF")
            .join(FakeFile::new("x", b"not this one".to_vec(), true).sha256())
            .exists(),
        "only the picked quantisation"
    );

    let snap = client.pull("org/tiny", None, None, &NoProgress).unwrap();
    assert_eq!(snap.model_path(), snap.dir);
    for f in &st {
        assert_eq!(
            std::fs::read(snap.dir.join(&f.name)).unwrap(),
            f.bytes,
            "{}",
            f.name
        );
        assert!(
            blobs(tmp.path(), "org/tiny").join(f.etag()).is_file(),
            "{} under its etag",
            f.name
        );
    }
    // The git blob id is what git itself computes.
    let cfg = snap.dir.join("config.json");
    let out = std::process::Command::new("git")
        .arg("hash-object")
        .arg(&cfg)
        .output()
        .expect("git");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        anelm_hub::git_blob_sha1(&cfg).unwrap()
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        st[0].git_sha1()
    );

    // Pulling again downloads nothing.
    let before = gets_of(&hub, ".safetensors").len();
    client.pull("org/tiny", None, None, &NoProgress).unwrap();
    assert_eq!(gets_of(&hub, ".safetensors").len(), before);
}

#[test]
fn a_cut_connection_is_resumed_with_a_range() {
    let (hub, gguf, _) = hub_with_repos();
    let tmp = tempfile::tempdir().unwrap();
    let client = Hub::new(settings(&hub, tmp.path()));
    hub.cut("tiny-F32.gguf", 300_000, 1);
    let snap = client
        .pull(
            "org/tiny-GGUF",
            None,
            Some(&Pick::File("tiny-F32.gguf".into())),
            &NoProgress,
        )
        .unwrap();
    assert_eq!(std::fs::read(snap.model_path()).unwrap(), gguf.bytes);
    let sha = gguf.sha256();
    assert_eq!(
        gets_of(&hub, &sha),
        vec![None, Some("bytes=300000-".to_string())]
    );
}

#[test]
fn a_server_without_ranges_or_hashes_in_its_listing_still_gives_checked_files() {
    let (hub, gguf, st) = hub_with_repos();
    hub.bare_listing();
    hub.ignore_ranges();
    hub.cut("tiny-F32.gguf", 100_000, 1);
    let tmp = tempfile::tempdir().unwrap();
    let client = Hub::new(settings(&hub, tmp.path()));
    let snap = client
        .pull(
            "org/tiny-GGUF",
            None,
            Some(&Pick::Quant("F32".into())),
            &NoProgress,
        )
        .unwrap();
    assert_eq!(
        std::fs::read(snap.model_path()).unwrap(),
        gguf.bytes,
        "the whole file again, not appended"
    );
    assert!(
        blobs(tmp.path(), "org/tiny-GGUF")
            .join(gguf.sha256())
            .is_file(),
        "named by X-Linked-Etag"
    );
    assert!(
        hub.log().iter().any(|l| l.method == "HEAD"),
        "hashes asked of the file"
    );
    let snap = client.pull("org/tiny", None, None, &NoProgress).unwrap();
    for f in &st {
        assert!(
            blobs(tmp.path(), "org/tiny").join(f.etag()).is_file(),
            "{}",
            f.name
        );
        assert_eq!(std::fs::read(snap.dir.join(&f.name)).unwrap(), f.bytes);
    }
}

#[test]
fn pulls_at_once_wait_for_each_other() {
    let (hub, gguf, _) = hub_with_repos();
    let tmp = tempfile::tempdir().unwrap();
    let pulls: Vec<_> = (0..4)
        .map(|_| {
            let client = Hub::new(settings(&hub, tmp.path()));
            std::thread::spawn(move || {
                client.pull(
                    "org/tiny-GGUF",
                    None,
                    Some(&Pick::Quant("F32".into())),
                    &NoProgress,
                )
            })
        })
        .collect();
    for p in pulls {
        let snap = p.join().unwrap().unwrap();
        assert_eq!(std::fs::read(snap.model_path()).unwrap(), gguf.bytes);
    }
    assert!(tmp
        .path()
        .join("hub/.locks/models--org--tiny-GGUF")
        .join(format!("{}.lock", gguf.sha256()))
        .exists());
}

#[test]
fn a_download_broken_in_one_process_is_resumed_by_the_next() {
    let (hub, gguf, _) = hub_with_repos();
    let tmp = tempfile::tempdir().unwrap();
    let mut client = Hub::new(settings(&hub, tmp.path()));
    client.retries = 0;
    hub.cut("tiny-F32.gguf", 200_000, 1);
    let pick = Pick::Quant("F32".into());
    let e = client
        .pull("org/tiny-GGUF", None, Some(&pick), &NoProgress)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("200000 bytes so far are kept") && e.contains("resumes"),
        "{e}"
    );
    let part = blobs(tmp.path(), "org/tiny-GGUF").join(format!("{}.incomplete", gguf.sha256()));
    assert_eq!(std::fs::metadata(&part).unwrap().len(), 200_000);
    assert!(
        client.cached("org/tiny-GGUF", None, Some(&pick)).is_none(),
        "nothing half-written is linked"
    );
    let snap = client
        .pull("org/tiny-GGUF", None, Some(&pick), &NoProgress)
        .unwrap();
    assert_eq!(std::fs::read(snap.model_path()).unwrap(), gguf.bytes);
    assert!(!part.exists());
    assert_eq!(
        gets_of(&hub, &gguf.sha256()).last().unwrap().as_deref(),
        Some("bytes=200000-")
    );
}

#[test]
fn a_corrupted_file_is_refused_and_nothing_of_it_is_kept() {
    let (hub, _, st) = hub_with_repos();
    let tmp = tempfile::tempdir().unwrap();
    let client = Hub::new(settings(&hub, tmp.path()));
    for f in ["model.safetensors", "config.json"] {
        hub.corrupt(f);
        let e = client
            .pull("org/tiny", None, None, &NoProgress)
            .unwrap_err();
        assert!(matches!(e, HubError::Integrity(_)), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains(f)
                && msg.contains("not the file the Hub describes")
                && msg.contains("removed"),
            "{msg}"
        );
        let kind = if f == "config.json" {
            "git blob id"
        } else {
            "sha256"
        };
        assert!(msg.contains(kind), "{msg}");
        let etag = st.iter().find(|x| x.name == f).unwrap().etag();
        let b = blobs(tmp.path(), "org/tiny");
        assert!(!b.join(&etag).exists() && !b.join(format!("{etag}.incomplete")).exists());
        assert!(!tmp
            .path()
            .join(format!("hub/models--org--tiny/snapshots/{C1}/{f}"))
            .exists());
        assert!(client.cached("org/tiny", None, None).is_none());
        hub.heal(f);
    }
    client.pull("org/tiny", None, None, &NoProgress).unwrap();
    assert!(client.cached("org/tiny", None, None).is_some());
}

#[test]
fn a_revision_pins_its_commit() {
    let hub = FakeHub::start();
    let v = |s: &str| vec![FakeFile::new("m-Q4_0.gguf", s.as_bytes().to_vec(), true)];
    hub.add_commit("org/m", C1, &["v1.0"], v("first"));
    hub.add_commit("org/m", C2, &["main"], v("second"));
    let tmp = tempfile::tempdir().unwrap();
    let client = Hub::new(settings(&hub, tmp.path()));
    let read = |s: anelm_hub::Snapshot| std::fs::read_to_string(s.model_path()).unwrap();
    assert_eq!(
        read(
            client
                .pull("org/m", Some("v1.0"), None, &NoProgress)
                .unwrap()
        ),
        "first"
    );
    assert_eq!(
        read(client.pull("org/m", None, None, &NoProgress).unwrap()),
        "second"
    );
    assert_eq!(
        read(client.pull("org/m", Some(C1), None, &NoProgress).unwrap()),
        "first"
    );
    let refs = tmp.path().join("hub/models--org--m/refs");
    assert_eq!(std::fs::read_to_string(refs.join("v1.0")).unwrap(), C1);
    assert_eq!(std::fs::read_to_string(refs.join("main")).unwrap(), C2);
    assert_eq!(
        client.cached("org/m", Some("v1.0"), None).unwrap().commit,
        C1
    );
    let e = client
        .pull("org/m", Some("v9"), None, &NoProgress)
        .unwrap_err()
        .to_string();
    assert!(e.contains("org/m@v9: no such revision"), "{e}");
}

#[test]
fn offline_uses_the_cache_and_names_what_it_lacks() {
    let (hub, gguf, _) = hub_with_repos();
    let tmp = tempfile::tempdir().unwrap();
    let online = Resolver::new(settings(&hub, tmp.path()));
    let pulled = online
        .resolve_str("org/tiny-GGUF:F32", &NoProgress)
        .unwrap();
    let seen = hub.log().len();
    let mut s = settings(&hub, tmp.path());
    s.offline = true;
    let offline = Resolver::new(s);
    let again = offline
        .resolve_str("org/tiny-GGUF:f32", &NoProgress)
        .unwrap();
    assert_eq!(again.path, pulled.path);
    assert_eq!(std::fs::read(&again.path).unwrap(), gguf.bytes);
    let e = offline.resolve_str("org/tiny", &NoProgress).unwrap_err();
    assert!(matches!(e, HubError::Offline(_)), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("HF_HUB_OFFLINE is set and org/tiny is not in the Hugging Face cache"),
        "{msg}"
    );
    let e = offline
        .hub
        .pull(
            "org/tiny-GGUF",
            None,
            Some(&Pick::Quant("Q8_0".into())),
            &NoProgress,
        )
        .unwrap_err();
    assert!(e.to_string().contains("org/tiny-GGUF:Q8_0"), "{e}");
    assert_eq!(hub.log().len(), seen, "offline, nothing reached the Hub");
    // A cached model is used as it is, online too.
    online
        .resolve_str("org/tiny-GGUF:F32", &NoProgress)
        .unwrap();
    assert_eq!(hub.log().len(), seen);
}

#[test]
fn gated_and_missing_repositories_say_so() {
    let (hub, _, _) = hub_with_repos();
    hub.gate("org/tiny", "hf_secret");
    let tmp = tempfile::tempdir().unwrap();
    let client = Hub::new(settings(&hub, tmp.path()));
    let e = client
        .pull("org/tiny", None, None, &NoProgress)
        .unwrap_err();
    assert!(matches!(e, HubError::Denied(_)), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("org/tiny is gated or private (HTTP 401)") && msg.contains("set HF_TOKEN"),
        "{msg}"
    );
    let mut s = settings(&hub, tmp.path());
    s.token = Some("hf_wrong".into());
    let msg = Hub::new(s.clone())
        .pull("org/tiny", None, None, &NoProgress)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("the token in HF_TOKEN has no access"), "{msg}");
    s.token = Some("hf_secret".into());
    Hub::new(s)
        .pull("org/tiny", None, None, &NoProgress)
        .unwrap();
    assert!(hub
        .log()
        .iter()
        .any(|l| l.authorization.as_deref() == Some("Bearer hf_secret")));

    let e = client
        .pull("org/nothing", None, None, &NoProgress)
        .unwrap_err();
    assert!(matches!(e, HubError::NotFound(_)), "{e}");
    assert!(
        e.to_string().contains("org/nothing: no such repository"),
        "{e}"
    );
    let msg = client
        .pull(
            "org/tiny-GGUF",
            None,
            Some(&Pick::Quant("Q2_K".into())),
            &NoProgress,
        )
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("no GGUF file for Q2_K") && msg.contains("tiny-F32.gguf, tiny-Q8_0.gguf"),
        "{msg}"
    );
}

#[test]
fn the_token_goes_to_the_hub_and_not_to_its_storage() {
    let (hub, _, _) = hub_with_repos();
    let tmp = tempfile::tempdir().unwrap();
    let mut s = settings(&hub, tmp.path());
    s.token = Some("hf_t".into());
    Hub::new(s)
        .pull("org/tiny-GGUF", None, None, &NoProgress)
        .unwrap();
    let log = hub.log();
    let (storage, own): (Vec<_>, Vec<_>) = log
        .iter()
        .partition(|l| l.path.starts_with("/lfs-storage/"));
    assert!(!storage.is_empty() && !own.is_empty());
    assert!(
        own.iter()
            .all(|l| l.authorization.as_deref() == Some("Bearer hf_t")),
        "{own:?}"
    );
    assert!(
        storage.iter().all(|l| l.authorization.is_none()),
        "{storage:?}"
    );
}

#[test]
fn an_unreachable_hub_is_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = FakeHub::start();
    let mut s = settings(&hub, tmp.path());
    s.endpoint = "http://127.0.0.1:1".into();
    let e = Hub::new(s)
        .pull("org/tiny", None, None, &NoProgress)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cannot reach http://127.0.0.1:1")
            && e.contains("HF_HUB_OFFLINE")
            && !e.contains('\n'),
        "{e}"
    );
}

/// A full disk (the partial download written to /dev/full, which refuses every write with
/// ENOSPC) is one line naming the file, and nothing is linked.
#[cfg(target_os = "linux")]
#[test]
fn a_full_disk_is_one_line_and_links_nothing() {
    let (hub, gguf, _) = hub_with_repos();
    let tmp = tempfile::tempdir().unwrap();
    let client = Hub::new(settings(&hub, tmp.path()));
    let b = blobs(tmp.path(), "org/tiny-GGUF");
    std::fs::create_dir_all(&b).unwrap();
    std::os::unix::fs::symlink("/dev/full", b.join(format!("{}.incomplete", gguf.sha256())))
        .unwrap();
    let pick = Pick::Quant("F32".into());
    let e = client
        .pull("org/tiny-GGUF", None, Some(&pick), &NoProgress)
        .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, HubError::Io { .. }), "{msg}");
    assert!(
        msg.contains(".incomplete")
            && msg.contains("No space left on device")
            && !msg.contains('\n'),
        "{msg}"
    );
    assert!(!b.join(gguf.sha256()).exists());
    assert!(client.cached("org/tiny-GGUF", None, Some(&pick)).is_none());
}
