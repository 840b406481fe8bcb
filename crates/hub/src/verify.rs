//! Checking a downloaded file against the Hub's etag: the sha256 of the content for LFS files,
//! the git blob id (sha1 of `blob <len>\0` + content) for the others.

use std::fmt;
use std::io::Read;
use std::path::Path;

use sha1::Digest as _;

use crate::{HubError, Result};

/// The Hub's name for a file's content, and the name of its blob in the cache.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Etag {
    /// An LFS file: the sha256 of its bytes (64 hex digits).
    Sha256(String),
    /// A file kept in git: its blob id (40 hex digits).
    GitSha1(String),
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn is_hex(s: &str, n: usize) -> bool {
    s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit())
}

impl Etag {
    /// An etag as a header or the API gives it (quotes and a weak `W/` prefix are dropped);
    /// `None` for anything that is neither a sha256 nor a git blob id.
    pub fn parse(s: &str) -> Option<Etag> {
        let s = s.trim();
        let s = s.strip_prefix("W/").unwrap_or(s).trim_matches('"');
        let lower = s.to_ascii_lowercase();
        if is_hex(&lower, 64) {
            Some(Etag::Sha256(lower))
        } else if is_hex(&lower, 40) {
            Some(Etag::GitSha1(lower))
        } else {
            None
        }
    }

    /// The hex digest, which is also the blob's file name in the cache.
    pub fn hex(&self) -> &str {
        match self {
            Etag::Sha256(h) | Etag::GitSha1(h) => h,
        }
    }

    /// The digest of `path` computed the way this etag was.
    pub fn compute(&self, path: &Path) -> Result<String> {
        match self {
            Etag::Sha256(_) => sha256_file(path),
            Etag::GitSha1(_) => git_blob_sha1(path),
        }
    }

    /// Fails with the expected and the actual digest when `path` is not this content.
    pub fn check(&self, path: &Path) -> Result<()> {
        let got = self.compute(path)?;
        if got != self.hex() {
            let kind = match self {
                Etag::Sha256(_) => "sha256",
                Etag::GitSha1(_) => "git blob id",
            };
            return Err(HubError::Integrity(format!(
                "{kind} {got} where the Hub says {}",
                self.hex()
            )));
        }
        Ok(())
    }
}

impl fmt::Display for Etag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.hex())
    }
}

fn digest_file<D: sha1::Digest>(
    mut d: D,
    path: &Path,
    prefix: impl FnOnce(u64) -> Vec<u8>,
) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| HubError::io(path, e))?;
    let len = f.metadata().map_err(|e| HubError::io(path, e))?.len();
    d.update(prefix(len));
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| HubError::io(path, e))?;
        if n == 0 {
            break;
        }
        d.update(&buf[..n]);
    }
    Ok(hex(&d.finalize()))
}

/// The sha256 of a file, in lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    digest_file(sha2::Sha256::new(), path, |_| Vec::new())
}

/// The git blob id of a file (what `git hash-object` prints).
pub fn git_blob_sha1(path: &Path) -> Result<String> {
    digest_file(sha1::Sha1::new(), path, |len| {
        format!("blob {len}\0").into_bytes()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_parse_from_headers() {
        let sha = "a".repeat(64);
        assert_eq!(
            Etag::parse(&format!("\"{sha}\"")),
            Some(Etag::Sha256(sha.clone()))
        );
        assert_eq!(
            Etag::parse(&format!("W/\"{}\"", "B".repeat(40))),
            Some(Etag::GitSha1("b".repeat(40)))
        );
        assert_eq!(Etag::parse("\"abc\""), None);
        assert_eq!(Etag::parse(&"g".repeat(64)), None);
    }

    #[test]
    fn digests_match_known_values() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"hello\n").unwrap();
        // `printf 'hello\n' | sha256sum` and `git hash-object`.
        assert_eq!(
            sha256_file(&p).unwrap(),
            "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
        );
        assert_eq!(
            git_blob_sha1(&p).unwrap(),
            "ce013625030ba8dba906f756967f9e9ca394464a"
        );
        let e = Etag::Sha256("0".repeat(64))
            .check(&p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("5891b5b5") && e.contains(&"0".repeat(64)), "{e}");
    }
}
