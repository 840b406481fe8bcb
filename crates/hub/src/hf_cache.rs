//! The Hugging Face cache layout (`models--org--name/{blobs,snapshots/<commit>,refs/<rev>}`),
//! read and written exactly as huggingface_hub does, so its downloads and ours are one cache.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::{Etag, HubError, Result};

/// A Hugging Face hub cache directory (`HF_HUB_CACHE`).
#[derive(Clone, Debug)]
pub struct HfCache {
    root: PathBuf,
}

/// What [`HfCache::remove`] took away.
#[derive(Debug, Default)]
pub struct Removed {
    /// Snapshot entries unlinked.
    pub files: usize,
    /// Bytes of blobs deleted (blobs another snapshot still uses are kept).
    pub bytes: u64,
}

pub(crate) fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn io<T>(path: &Path, r: std::io::Result<T>) -> Result<T> {
    r.map_err(|e| HubError::io(path, e))
}

impl HfCache {
    pub fn new(root: impl Into<PathBuf>) -> HfCache {
        HfCache { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `models--org--name`.
    pub fn repo_dir(&self, repo: &str) -> PathBuf {
        self.root
            .join(format!("models--{}", repo.replace('/', "--")))
    }

    pub fn blob_path(&self, repo: &str, etag: &Etag) -> PathBuf {
        self.repo_dir(repo).join("blobs").join(etag.hex())
    }

    pub fn snapshot_dir(&self, repo: &str, commit: &str) -> PathBuf {
        self.repo_dir(repo).join("snapshots").join(commit)
    }

    fn ref_path(&self, repo: &str, revision: &str) -> PathBuf {
        self.repo_dir(repo).join("refs").join(revision)
    }

    /// The commit `revision` names here: a commit with a snapshot, or a ref's content.
    pub fn commit_for(&self, repo: &str, revision: &str) -> Option<String> {
        if is_commit(revision) && self.snapshot_dir(repo, revision).is_dir() {
            return Some(revision.to_string());
        }
        let c = std::fs::read_to_string(self.ref_path(repo, revision)).ok()?;
        let c = c.trim();
        is_commit(c).then(|| c.to_string())
    }

    /// Records that `revision` is `commit` (nothing to record when it is the commit itself).
    pub fn write_ref(&self, repo: &str, revision: &str, commit: &str) -> Result<()> {
        if revision == commit {
            return Ok(());
        }
        let p = self.ref_path(repo, revision);
        if let Some(parent) = p.parent() {
            io(parent, std::fs::create_dir_all(parent))?;
        }
        // Written whole then renamed, so a reader never sees half a commit id.
        let tmp = beside(&p);
        io(&tmp, std::fs::write(&tmp, commit))?;
        io(&p, std::fs::rename(&tmp, &p))
    }

    /// Links `snapshots/<commit>/<file>` to the blob `etag` (which must already be in place).
    pub fn link(&self, repo: &str, commit: &str, file: &str, etag: &Etag) -> Result<PathBuf> {
        let dst = self.snapshot_dir(repo, commit).join(file);
        let parent = dst.parent().expect("a snapshot entry has a parent");
        io(parent, std::fs::create_dir_all(parent))?;
        // From snapshots/<commit>/<file>: up past the file's folders, the commit and snapshots.
        let depth = file.split('/').count() + 1;
        let mut target = PathBuf::new();
        for _ in 0..depth {
            target.push("..");
        }
        target.push("blobs");
        target.push(etag.hex());
        // Made beside it and renamed over it: two pulls linking at once both succeed.
        let tmp = beside(&dst);
        #[cfg(unix)]
        io(&tmp, std::os::unix::fs::symlink(&target, &tmp))?;
        #[cfg(not(unix))]
        io(&tmp, std::fs::hard_link(self.blob_path(repo, etag), &tmp))?;
        io(&dst, std::fs::rename(&tmp, &dst))?;
        Ok(dst)
    }

    /// The repositories present, as `org/name`.
    pub fn repos(&self) -> Vec<String> {
        let mut out: Vec<String> = dir_names(&self.root)
            .into_iter()
            .filter_map(|n| {
                let rest = n.strip_prefix("models--")?;
                let (org, name) = rest.split_once("--")?;
                Some(format!("{org}/{}", name.replace("--", "/")))
            })
            .collect();
        out.sort();
        out
    }

    /// The commits with a snapshot.
    pub fn snapshots(&self, repo: &str) -> Vec<String> {
        let mut v: Vec<String> = dir_names(&self.repo_dir(repo).join("snapshots"))
            .into_iter()
            .filter(|c| is_commit(c))
            .collect();
        v.sort();
        v
    }

    /// Every ref (`main`, `v1.0`, `refs/pr/1`) with the commit it names.
    pub fn refs(&self, repo: &str) -> Vec<(String, String)> {
        let base = self.repo_dir(repo).join("refs");
        let mut out = Vec::new();
        for rel in files_under(&base) {
            if let Some(c) = self.commit_for(repo, &rel) {
                out.push((rel, c));
            }
        }
        out.sort();
        out
    }

    /// The entries of a snapshot (relative names, `/`-separated), sorted.
    pub fn snapshot_files(&self, repo: &str, commit: &str) -> Vec<String> {
        files_under(&self.snapshot_dir(repo, commit))
    }

    /// Removes `files` (all when `None`) from a snapshot, and each blob no other snapshot
    /// entry links to; a snapshot left empty goes with its refs, a repository left without
    /// snapshots goes whole (with any half-downloaded blobs).
    pub fn remove(&self, repo: &str, commit: &str, files: Option<&[String]>) -> Result<Removed> {
        let snap = self.snapshot_dir(repo, commit);
        let all = self.snapshot_files(repo, commit);
        let gone: Vec<String> = match files {
            None => all.clone(),
            Some(f) => f.iter().filter(|f| all.contains(f)).cloned().collect(),
        };
        let mut removed = Removed::default();
        let mut candidates = HashSet::new();
        for f in &gone {
            let p = snap.join(f);
            if let Some(blob) = link_blob(&p) {
                candidates.insert(blob);
            }
            io(&p, std::fs::remove_file(&p))?;
            removed.files += 1;
        }
        let mut still_used = HashSet::new();
        for c in self.snapshots(repo) {
            for f in self.snapshot_files(repo, &c) {
                if let Some(b) = link_blob(&self.snapshot_dir(repo, &c).join(&f)) {
                    still_used.insert(b);
                }
            }
        }
        let blobs = self.repo_dir(repo).join("blobs");
        for b in candidates.difference(&still_used) {
            let p = blobs.join(b);
            if let Ok(m) = std::fs::metadata(&p) {
                removed.bytes += m.len();
                io(&p, std::fs::remove_file(&p))?;
            }
        }
        if self.snapshot_files(repo, commit).is_empty() {
            let _ = std::fs::remove_dir_all(&snap);
            for (r, c) in self.refs(repo) {
                if c == commit {
                    let p = self.ref_path(repo, &r);
                    io(&p, std::fs::remove_file(&p))?;
                }
            }
        }
        if self.snapshots(repo).is_empty() {
            let d = self.repo_dir(repo);
            io(&d, std::fs::remove_dir_all(&d))?;
        }
        Ok(removed)
    }
}

/// A name beside `p` that no other writer (thread or process) uses, for write-then-rename.
fn beside(p: &Path) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    PathBuf::from(format!(
        "{}.{}-{n}.anelm-tmp",
        p.display(),
        std::process::id()
    ))
}

/// The blob a snapshot entry links to (its target's file name).
fn link_blob(p: &Path) -> Option<String> {
    let t = std::fs::read_link(p).ok()?;
    Some(t.file_name()?.to_string_lossy().into_owned())
}

fn dir_names(d: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(d) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Files and symlinks below `base`, as `/`-separated relative names, sorted.
fn files_under(base: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![(base.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let rel = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push((e.path(), rel)),
                Ok(_) if !rel.ends_with(".anelm-tmp") => out.push(rel),
                _ => {}
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_round_trips_and_remove_keeps_shared_blobs() {
        let d = tempfile::tempdir().unwrap();
        let c = HfCache::new(d.path());
        let repo = "org/name";
        assert!(c.repo_dir(repo).ends_with("models--org--name"));
        let (a, b) = ("a".repeat(40), "b".repeat(40));
        let shared = Etag::Sha256("1".repeat(64));
        let only_a = Etag::GitSha1("2".repeat(40));
        std::fs::create_dir_all(c.repo_dir(repo).join("blobs")).unwrap();
        std::fs::write(c.blob_path(repo, &shared), b"weights").unwrap();
        std::fs::write(c.blob_path(repo, &only_a), b"{}").unwrap();
        c.link(repo, &a, "model.safetensors", &shared).unwrap();
        c.link(repo, &a, "sub/config.json", &only_a).unwrap();
        c.link(repo, &b, "model.safetensors", &shared).unwrap();
        c.write_ref(repo, "main", &a).unwrap();
        c.write_ref(repo, "refs/pr/1", &b).unwrap();
        assert_eq!(c.repos(), vec![repo.to_string()]);
        assert_eq!(
            std::fs::read(c.snapshot_dir(repo, &a).join("sub/config.json")).unwrap(),
            b"{}"
        );
        assert_eq!(c.commit_for(repo, "main").as_deref(), Some(a.as_str()));
        assert_eq!(c.commit_for(repo, &b).as_deref(), Some(b.as_str()));
        assert_eq!(c.refs(repo).len(), 2);
        let r = c.remove(repo, &a, None).unwrap();
        assert_eq!(
            (r.files, r.bytes),
            (2, 2),
            "only the blob no other snapshot uses"
        );
        assert!(c.blob_path(repo, &shared).exists());
        assert!(c.commit_for(repo, "main").is_none());
        let r = c.remove(repo, &b, None).unwrap();
        assert_eq!((r.files, r.bytes), (1, 7));
        assert!(!c.repo_dir(repo).exists());
    }
}
