//! One file from the Hub into the cache: resumed from its `.incomplete` blob with an HTTP Range,
//! checked against its etag, and only then renamed into `blobs/` and linked into the snapshot.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use ureq::http::{HeaderMap, Response};

use crate::hub::{encode_path, header, Hub, Progress, Sibling};
use crate::{Etag, HubError, Result};

/// What the Hub's answers about a file said (taken from the first answer that says it: the
/// Hub's own, before a redirect to its storage).
#[derive(Default)]
struct Described {
    etag: Option<Etag>,
    size: Option<u64>,
}

impl Described {
    fn take(&mut self, h: &HeaderMap) {
        if self.etag.is_none() {
            self.etag = header(h, "x-linked-etag")
                .or_else(|| header(h, "etag"))
                .and_then(Etag::parse);
        }
        if self.size.is_none() {
            self.size = header(h, "x-linked-size").and_then(|s| s.trim().parse().ok());
        }
    }
}

fn io<T>(path: &Path, r: std::io::Result<T>) -> Result<T> {
    r.map_err(|e| HubError::io(path, e))
}

fn len_of(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

/// The first byte a `206` answer holds (`Content-Range: bytes START-END/TOTAL`).
fn range_start(h: &HeaderMap) -> Option<u64> {
    let v = header(h, "content-range")?;
    let spec = v.trim().strip_prefix("bytes")?.trim();
    spec.split('-').next()?.trim().parse().ok()
}

/// The total a `Content-Range` names.
fn range_total(h: &HeaderMap) -> Option<u64> {
    header(h, "content-range")?
        .rsplit('/')
        .next()?
        .trim()
        .parse()
        .ok()
}

impl Hub {
    /// `method` on `url`, following redirects by hand; what the answers described is merged.
    fn follow(
        &self,
        method: &str,
        url: &str,
        range: Option<u64>,
        d: &mut Described,
        what: &str,
    ) -> Result<Response<ureq::Body>> {
        let mut url = url.to_string();
        for _ in 0..10 {
            let resp = self.request(method, &url, range)?;
            d.take(resp.headers());
            if !resp.status().is_redirection() {
                return Ok(resp);
            }
            let Some(loc) = header(resp.headers(), "location") else {
                return Err(HubError::Http(format!(
                    "{what}: a redirect without a Location"
                )));
            };
            url = if loc.contains("://") {
                loc.to_string()
            } else {
                // A relative redirect (a renamed repository): same scheme and host.
                let (scheme, rest) = url.split_once("://").expect("absolute URL");
                let host = rest.split('/').next().unwrap_or("");
                format!("{scheme}://{host}/{}", loc.trim_start_matches('/'))
            };
        }
        Err(HubError::Http(format!("{what}: more than 10 redirects")))
    }

    /// Puts `sib` of `commit` into the snapshot (a no-op when it is there), returning its path.
    pub(crate) fn fetch(
        &self,
        repo: &str,
        commit: &str,
        sib: &Sibling,
        progress: &dyn Progress,
    ) -> Result<PathBuf> {
        let dst = self.cache.snapshot_dir(repo, commit).join(&sib.name);
        if dst.is_file() {
            return Ok(dst);
        }
        let what = format!("{repo}: {}", sib.name);
        let url = format!(
            "{}/{repo}/resolve/{commit}/{}",
            self.settings.endpoint,
            encode_path(&sib.name)
        );
        let mut described = Described {
            etag: None,
            size: sib.size,
        };
        if sib.etag.is_none() {
            let resp = self.follow("HEAD", &url, None, &mut described, &what)?;
            if !resp.status().is_success() {
                return Err(self.refusal(resp.status(), resp.headers(), &what));
            }
        }
        let Some(etag) = sib.etag.clone().or(described.etag.take()) else {
            return Err(HubError::Http(format!(
                "{what}: the Hub gave no sha256 or git etag to check it by"
            )));
        };
        let blob = self.cache.blob_path(repo, &etag);
        if !blob.is_file() {
            // One writer per blob, across processes (huggingface_hub's lock file, so its
            // downloads and ours wait for each other too).
            let _lock = self.lock_blob(repo, &etag)?;
            if !blob.is_file() {
                let size = described.size;
                self.download(&url, &blob, &etag, size, &sib.name, &what, progress)?;
            }
        }
        self.cache.link(repo, commit, &sib.name, &etag)
    }

    /// Holds `.locks/models--org--name/<etag>.lock` until the returned file is dropped.
    fn lock_blob(&self, repo: &str, etag: &Etag) -> Result<std::fs::File> {
        let repo_dir = self.cache.repo_dir(repo);
        let name = repo_dir.file_name().expect("a repository folder");
        let dir = self.cache.root().join(".locks").join(name);
        io(&dir, std::fs::create_dir_all(&dir))?;
        let path = dir.join(format!("{}.lock", etag.hex()));
        let f = io(
            &path,
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path),
        )?;
        io(&path, f.lock())?;
        Ok(f)
    }

    /// Downloads into `<blob>.incomplete` (resuming it), checks it and renames it to `blob`.
    #[allow(clippy::too_many_arguments)]
    fn download(
        &self,
        url: &str,
        blob: &Path,
        etag: &Etag,
        size: Option<u64>,
        name: &str,
        what: &str,
        progress: &dyn Progress,
    ) -> Result<()> {
        let dir = blob.parent().expect("blobs/ holds the blob");
        io(dir, std::fs::create_dir_all(dir))?;
        let part = PathBuf::from(format!("{}.incomplete", blob.display()));
        let mut size = size;
        let mut bar = progress.file(name, size, len_of(&part));
        let mut failures = 0;
        loop {
            let have = len_of(&part);
            if size.is_some_and(|s| have > s) {
                io(&part, std::fs::remove_file(&part))?;
                continue;
            }
            if size == Some(have) {
                break;
            }
            let mut d = Described::default();
            let resp = self.follow("GET", url, (have > 0).then_some(have), &mut d, what)?;
            let status = resp.status().as_u16();
            if let Some(e) = d.etag.as_ref().filter(|e| *e != etag) {
                return Err(HubError::Integrity(format!(
                    "{what}: the Hub now serves {e} where its listing says {etag}; pull again"
                )));
            }
            size = size.or(d.size).or_else(|| range_total(resp.headers()));
            let append = match status {
                206 if range_start(resp.headers()) == Some(have) => true,
                200 => false,
                206 => {
                    return Err(HubError::Http(format!(
                        "{what}: asked for bytes from {have}, the server sent another range"
                    )))
                }
                // Nothing past what we have: check it.
                416 => break,
                _ => return Err(self.refusal(resp.status(), resp.headers(), what)),
            };
            if size.is_none() && status == 200 {
                size = header(resp.headers(), "content-length").and_then(|s| s.parse().ok());
            }
            let mut file = io(
                &part,
                std::fs::OpenOptions::new()
                    .create(true)
                    .write(true)
                    .append(append)
                    .truncate(!append)
                    .open(&part),
            )?;
            let mut done = if append { have } else { 0 };
            let mut reader = resp.into_body().into_reader();
            let mut buf = vec![0u8; 256 << 10];
            let broke = loop {
                match reader.read(&mut buf) {
                    Ok(0) => break None,
                    Ok(n) => {
                        io(&part, file.write_all(&buf[..n]))?;
                        done += n as u64;
                        bar.advance(done);
                    }
                    Err(e) => break Some(e.to_string()),
                }
            };
            io(&part, file.sync_all())?;
            let short = size.is_some_and(|s| done < s);
            match (broke, short) {
                (None, false) => break,
                (why, _) => {
                    failures += 1;
                    let why = why.unwrap_or_else(|| format!("the body ended at {done} bytes"));
                    if failures > self.retries {
                        return Err(HubError::Http(format!(
                            "{what}: the download broke {failures} times ({why}); the {done} bytes so far are kept, and pulling again resumes them"
                        )));
                    }
                    tracing::warn!("{what}: the download broke at {done} bytes ({why}); resuming");
                }
            }
        }
        if let Err(e) = etag.check(&part) {
            let _ = std::fs::remove_file(&part);
            return Err(HubError::Integrity(format!(
                "{what}: the download is not the file the Hub describes ({e}); it was removed"
            )));
        }
        io(blob, std::fs::rename(&part, blob))?;
        bar.finish();
        Ok(())
    }
}
