//! The Hugging Face Hub over HTTP: a revision's file listing, and `pull`, which puts a model's
//! files into the shared cache (each one checked before it is linked into the snapshot).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use ureq::http::{HeaderMap, StatusCode};
use ureq::tls::{TlsConfig, TlsProvider};

use crate::hf_cache::HfCache;
use crate::select::{has_safetensors, pick_gguf, select};
use crate::{Etag, HubError, Pick, Result, Settings};

/// How a download reports itself (a bar per file on a terminal, or nothing).
pub trait Progress: Sync {
    /// A file starts: `total` bytes if known, `done` of them already here (a resumed download).
    fn file(&self, name: &str, total: Option<u64>, done: u64) -> Box<dyn FileProgress>;
}

pub trait FileProgress {
    fn advance(&mut self, done: u64);
    fn finish(&mut self);
}

/// Reports nothing.
pub struct NoProgress;

struct Quiet;

impl FileProgress for Quiet {
    fn advance(&mut self, _: u64) {}
    fn finish(&mut self) {}
}

impl Progress for NoProgress {
    fn file(&self, _: &str, _: Option<u64>, _: u64) -> Box<dyn FileProgress> {
        Box::new(Quiet)
    }
}

/// One file of a revision, as the API lists it.
#[derive(Clone, Debug)]
pub struct Sibling {
    pub name: String,
    pub size: Option<u64>,
    /// The LFS sha256, else the git blob id.
    pub etag: Option<Etag>,
}

/// A revision of a repository: its commit and files.
#[derive(Clone, Debug)]
pub struct RepoInfo {
    pub commit: String,
    pub files: Vec<Sibling>,
}

/// The files of a model in a snapshot of the cache.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub repo: String,
    pub commit: String,
    pub dir: PathBuf,
    /// The model's files, relative to `dir`.
    pub files: Vec<String>,
}

impl Snapshot {
    /// What the loader opens: the (first) GGUF file, else the snapshot directory.
    pub fn model_path(&self) -> PathBuf {
        match self.files.first() {
            Some(f) if f.to_ascii_lowercase().ends_with(".gguf") => self.dir.join(f),
            _ => self.dir.clone(),
        }
    }
}

#[derive(Deserialize)]
struct ApiLfs {
    sha256: Option<String>,
    size: Option<u64>,
}

#[derive(Deserialize)]
struct ApiSibling {
    rfilename: String,
    size: Option<u64>,
    #[serde(rename = "blobId")]
    blob_id: Option<String>,
    lfs: Option<ApiLfs>,
}

#[derive(Deserialize)]
struct ApiRevision {
    sha: String,
    #[serde(default)]
    siblings: Vec<ApiSibling>,
}

/// Percent-encodes one path segment (RFC 3986 unreserved characters pass).
pub(crate) fn encode_segment(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A `/`-separated path with each segment encoded.
pub(crate) fn encode_path(s: &str) -> String {
    s.split('/')
        .map(encode_segment)
        .collect::<Vec<_>>()
        .join("/")
}

pub(crate) fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// A client of one Hub endpoint, writing into one cache.
pub struct Hub {
    pub(crate) settings: Settings,
    pub(crate) cache: HfCache,
    pub(crate) agent: ureq::Agent,
    /// Times a broken download is resumed within one pull before it gives up.
    pub retries: u32,
}

/// The TLS stack this target's build carries (see the crate's Cargo.toml): the platform's own on
/// Apple targets, rustls elsewhere.
fn tls_provider() -> TlsProvider {
    if cfg!(target_vendor = "apple") {
        TlsProvider::NativeTls
    } else {
        TlsProvider::Rustls
    }
}

impl Hub {
    pub fn new(settings: Settings) -> Hub {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            // Redirects are followed by hand: the Hub's own answer carries the etag and
            // commit, and the token must not follow the file to another host.
            .max_redirects(0)
            .timeout_connect(Some(Duration::from_secs(30)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            .user_agent(concat!("anelm/", env!("CARGO_PKG_VERSION")))
            .tls_config(TlsConfig::builder().provider(tls_provider()).build())
            .build()
            .into();
        Hub {
            cache: HfCache::new(&settings.hf_cache),
            settings,
            agent,
            retries: 4,
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn cache(&self) -> &HfCache {
        &self.cache
    }

    pub(crate) fn is_hub_host(&self, url: &str) -> bool {
        let host = |u: &str| {
            u.split_once("://")
                .map(|(_, r)| r.split('/').next().unwrap_or("").to_string())
        };
        host(url).is_some() && host(url) == host(&self.settings.endpoint)
    }

    pub(crate) fn request(
        &self,
        method: &str,
        url: &str,
        range: Option<u64>,
    ) -> Result<ureq::http::Response<ureq::Body>> {
        let mut req = match method {
            "HEAD" => self.agent.head(url),
            _ => self.agent.get(url),
        };
        if let (Some(t), true) = (&self.settings.token, self.is_hub_host(url)) {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        if let Some(from) = range {
            req = req.header("Range", format!("bytes={from}-"));
        }
        req.call().map_err(|e| {
            // The Hub, or the storage it redirected to: name the one that failed.
            let origin = match url.split_once("://") {
                Some((scheme, rest)) => {
                    format!("{scheme}://{}", rest.split('/').next().unwrap_or(""))
                }
                None => url.to_string(),
            };
            HubError::Http(format!(
                "cannot reach {origin} ({e}); with HF_HUB_OFFLINE=1 only the cache is used"
            ))
        })
    }

    /// The error for a refusal (`status` not 2xx) of a request about `what`.
    pub(crate) fn refusal(&self, status: StatusCode, h: &HeaderMap, what: &str) -> HubError {
        let code = header(h, "x-error-code").unwrap_or("");
        let msg = header(h, "x-error-message")
            .map(|m| format!(": {m}"))
            .unwrap_or_default();
        let endpoint = &self.settings.endpoint;
        match (status.as_u16(), code) {
            (_, "RevisionNotFound") => {
                HubError::NotFound(format!("{what}: no such revision on {endpoint}{msg}"))
            }
            (_, "EntryNotFound") => {
                HubError::NotFound(format!("{what}: no such file on {endpoint}{msg}"))
            }
            (_, "RepoNotFound" | "RepositoryNotFound") | (404, _) => HubError::NotFound(format!(
                "{what}: no such repository on {endpoint} (or it is private: set HF_TOKEN){msg}"
            )),
            (401 | 403, _) => {
                let hint = if self.settings.token.is_some() {
                    "the token in HF_TOKEN has no access to it; accept its terms on the Hub with that account"
                } else {
                    "accept its terms on the Hub and set HF_TOKEN"
                };
                HubError::Denied(format!(
                    "{what} is gated or private (HTTP {}){msg}; {hint}",
                    status.as_u16()
                ))
            }
            (s, _) => HubError::Http(format!("{what}: the Hub answered HTTP {s}{msg}")),
        }
    }

    /// The commit and files of `revision`.
    pub fn info(&self, repo: &str, revision: &str) -> Result<RepoInfo> {
        self.info_for(repo, revision, &format!("{repo}@{revision}"))
    }

    /// [`Hub::info`], its errors about `what`.
    fn info_for(&self, repo: &str, revision: &str, what: &str) -> Result<RepoInfo> {
        let url = format!(
            "{}/api/models/{repo}/revision/{}?blobs=true",
            self.settings.endpoint,
            encode_segment(revision)
        );
        let resp = self.request("GET", &url, None)?;
        if !resp.status().is_success() {
            return Err(self.refusal(resp.status(), resp.headers(), what));
        }
        let text = resp
            .into_body()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .map_err(|e| HubError::Http(format!("{what}: reading the file listing: {e}")))?;
        let api: ApiRevision = serde_json::from_str(&text).map_err(|e| {
            HubError::Http(format!(
                "{what}: the file listing is not the Hub's JSON: {e}"
            ))
        })?;
        if !crate::hf_cache::is_commit(&api.sha) {
            return Err(HubError::Http(format!(
                "{what}: the Hub named commit '{}', not a commit id",
                api.sha
            )));
        }
        let mut files = Vec::new();
        for s in api.siblings {
            if !crate::reference::repo_file_ok(&s.rfilename) {
                return Err(HubError::Http(format!(
                    "{what}: the listing names a file '{}' outside the repository",
                    s.rfilename
                )));
            }
            let lfs = s.lfs.as_ref();
            let etag = lfs
                .and_then(|l| l.sha256.as_deref())
                .or(s.blob_id.as_deref())
                .and_then(Etag::parse);
            files.push(Sibling {
                name: s.rfilename,
                size: lfs.and_then(|l| l.size).or(s.size),
                etag,
            });
        }
        Ok(RepoInfo {
            commit: api.sha.to_ascii_lowercase(),
            files,
        })
    }

    /// The model `pick` names in the cached `revision` (default `main`), if every file of it is
    /// there. Needs no network.
    pub fn cached(
        &self,
        repo: &str,
        revision: Option<&str>,
        pick: Option<&Pick>,
    ) -> Option<Snapshot> {
        let commit = self.cache.commit_for(repo, revision.unwrap_or("main"))?;
        let dir = self.cache.snapshot_dir(repo, &commit);
        let present: Vec<String> = self
            .cache
            .snapshot_files(repo, &commit)
            .into_iter()
            .filter(|f| dir.join(f).is_file())
            .collect();
        let files = if pick.is_some() || !has_safetensors(&present) {
            pick_gguf(&present, pick, repo).ok()?
        } else if present.iter().any(|f| f == "config.json") && shards_present(&dir, &present) {
            // Our pulls link config.json last: a snapshot with it is whole.
            present
        } else {
            return None;
        };
        Some(Snapshot {
            repo: repo.to_string(),
            commit,
            dir,
            files,
        })
    }

    /// Downloads the model `pick` names at `revision` (default `main`) into the cache: what is
    /// there already is kept, a half-downloaded file is resumed, every file is checked.
    pub fn pull(
        &self,
        repo: &str,
        revision: Option<&str>,
        pick: Option<&Pick>,
        progress: &dyn Progress,
    ) -> Result<Snapshot> {
        let rev = revision.unwrap_or("main");
        let what = match revision {
            Some(r) => format!("{repo}@{r}"),
            None => repo.to_string(),
        };
        if self.settings.offline {
            return self.cached(repo, revision, pick).ok_or_else(|| {
                HubError::Offline(format!(
                    "HF_HUB_OFFLINE is set and {what}{} is not in the Hugging Face cache ({}); unset it, or pull it where the Hub is reachable",
                    pick.map(|p| format!(":{p}")).unwrap_or_default(),
                    self.cache.root().display()
                ))
            });
        }
        let info = self.info_for(repo, rev, &what)?;
        let names: Vec<String> = info.files.iter().map(|s| s.name.clone()).collect();
        let wanted = select(&names, pick, &what)?;
        for name in &wanted {
            let sib = info
                .files
                .iter()
                .find(|s| &s.name == name)
                .expect("selected from the listing");
            self.fetch(repo, &info.commit, sib, progress)?;
        }
        self.cache.write_ref(repo, rev, &info.commit)?;
        Ok(Snapshot {
            repo: repo.to_string(),
            dir: self.cache.snapshot_dir(repo, &info.commit),
            commit: info.commit,
            files: wanted,
        })
    }
}

/// Whether every shard `model.safetensors.index.json` names (if there is one) is present.
fn shards_present(dir: &std::path::Path, present: &[String]) -> bool {
    let Ok(text) = std::fs::read_to_string(dir.join("model.safetensors.index.json")) else {
        return true;
    };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
        return false;
    };
    v.get("weight_map")
        .and_then(|m| m.as_object())
        .is_some_and(|m| {
            m.values()
                .filter_map(|f| f.as_str())
                .all(|f| present.iter().any(|p| p == f))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sharded_snapshot_is_whole_only_with_every_shard() {
        let d = tempfile::tempdir().unwrap();
        let index = r#"{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}"#;
        std::fs::write(d.path().join("model.safetensors.index.json"), index).unwrap();
        let mut present = vec![
            "config.json".to_string(),
            "model-00001-of-00002.safetensors".to_string(),
        ];
        assert!(!shards_present(d.path(), &present));
        present.push("model-00002-of-00002.safetensors".to_string());
        assert!(shards_present(d.path(), &present));
    }

    #[test]
    fn paths_are_encoded_per_segment() {
        assert_eq!(encode_segment("refs/pr/1"), "refs%2Fpr%2F1");
        assert_eq!(encode_path("sub dir/a+b.json"), "sub%20dir/a%2Bb.json");
    }
}
