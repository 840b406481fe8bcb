//! The text of a model reference, parsed: what the user typed, before any store is looked at
//! (except that an existing path always wins, so a local `org/name` directory is never shadowed).

use std::fmt;
use std::path::{Path, PathBuf};

use crate::{HubError, Result};

/// Which file of a GGUF repository: `:Q4_K_M` (matched case-insensitively against the file
/// names, as llama.cpp's `-hf` does) or `:file.gguf`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pick {
    Quant(String),
    File(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelRef {
    /// A GGUF file or a Hugging Face model directory on disk.
    Path(PathBuf),
    /// `org/name[@revision][:QUANT|:file.gguf]` on the Hugging Face Hub.
    Hub {
        repo: String,
        revision: Option<String>,
        pick: Option<Pick>,
    },
    /// `ollama:name[:tag]` in Ollama's store.
    Ollama { name: String, tag: String },
    /// A bare name, looked up among the models `anelm list` shows.
    Name(String),
}

/// The forms a reference takes, for messages.
pub const FORMS: &str = "a path, org/name[@revision][:QUANT|:file.gguf], ollama:name[:tag], \
                         or a name from `anelm list`";

/// A name part of a repository id: letters, digits, `-`, `_`, `.`, not starting with `-` or `.`.
fn repo_part_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 96
        && !s.starts_with(['-', '.'])
        && !s.contains("..")
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// A git revision as the Hub takes it: a branch, a tag, a commit, `refs/pr/N`.
fn revision_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && !s.contains("..")
        && !s.starts_with('/')
        && !s.ends_with('/')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

/// A file name inside a repository: relative, no `..` component.
pub(crate) fn repo_file_ok(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('/')
        && !s.contains('\\')
        && s.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

fn looks_like_path(s: &str) -> bool {
    s.starts_with(['/', '~'])
        || s.starts_with("./")
        || s.starts_with("../")
        || s.to_ascii_lowercase().ends_with(".gguf") && s.contains('/') && !s.contains(':')
}

impl ModelRef {
    /// Parses `s`. A path that exists is a path, whatever it looks like.
    pub fn parse(s: &str) -> Result<ModelRef> {
        let bad = |why: &str| HubError::BadReference(format!("'{s}': {why}; a model is {FORMS}"));
        if s.trim().is_empty() {
            return Err(bad("empty model reference"));
        }
        if Path::new(s).exists() {
            return Ok(ModelRef::Path(PathBuf::from(s)));
        }
        if let Some(rest) = s.strip_prefix("ollama:") {
            let (name, tag) = match rest.rsplit_once(':') {
                Some((n, t)) => (n, t),
                None => (rest, "latest"),
            };
            let parts: Vec<&str> = name.split('/').collect();
            if parts.len() > 3 || !parts.iter().all(|p| repo_part_ok(p)) || !repo_part_ok(tag) {
                return Err(bad("not an Ollama model name (ollama:name[:tag])"));
            }
            return Ok(ModelRef::Ollama {
                name: name.to_string(),
                tag: tag.to_string(),
            });
        }
        if looks_like_path(s) {
            return Err(HubError::NotFound(format!(
                "{s}: no such file or directory"
            )));
        }
        if !s.contains('/') {
            if s.contains(['@', ':']) || !repo_part_ok(s) {
                return Err(bad("not a file, a Hub repository or a model name"));
            }
            return Ok(ModelRef::Name(s.to_string()));
        }
        // org/name[@revision][:pick]; revisions and file names never hold ':'.
        let (head, pick) = match s.rsplit_once(':') {
            Some((h, p)) if !p.is_empty() => (h, Some(p)),
            Some(_) => return Err(bad("nothing after ':'")),
            None => (s, None),
        };
        let (repo, revision) = match head.split_once('@') {
            Some((r, rev)) => (r, Some(rev)),
            None => (head, None),
        };
        let ok_repo = match repo.split_once('/') {
            Some((org, name)) => repo_part_ok(org) && repo_part_ok(name),
            None => false,
        };
        if !ok_repo {
            return Err(HubError::NotFound(format!(
                "{s}: no such file or directory, and not a Hub repository (org/name); a model is {FORMS}"
            )));
        }
        if let Some(rev) = revision {
            if !revision_ok(rev) {
                return Err(bad("not a git revision after '@'"));
            }
        }
        let pick = match pick {
            None => None,
            Some(p) if p.to_ascii_lowercase().ends_with(".gguf") => {
                if !repo_file_ok(p) {
                    return Err(bad("not a file name after ':'"));
                }
                Some(Pick::File(p.to_string()))
            }
            Some(p) => {
                if !p
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
                {
                    return Err(bad("not a quantisation name after ':' (e.g. Q4_K_M)"));
                }
                Some(Pick::Quant(p.to_string()))
            }
        };
        Ok(ModelRef::Hub {
            repo: repo.to_string(),
            revision: revision.map(str::to_string),
            pick,
        })
    }

    /// Whether the reference names a local path (not a store).
    pub fn is_path(&self) -> bool {
        matches!(self, ModelRef::Path(_))
    }
}

impl fmt::Display for Pick {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pick::Quant(q) => f.write_str(q),
            Pick::File(n) => f.write_str(n),
        }
    }
}

impl fmt::Display for ModelRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelRef::Path(p) => write!(f, "{}", p.display()),
            ModelRef::Hub {
                repo,
                revision,
                pick,
            } => {
                f.write_str(repo)?;
                if let Some(r) = revision {
                    write!(f, "@{r}")?;
                }
                if let Some(p) = pick {
                    write!(f, ":{p}")?;
                }
                Ok(())
            }
            ModelRef::Ollama { name, tag } => write!(f, "ollama:{name}:{tag}"),
            ModelRef::Name(n) => f.write_str(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub(repo: &str, rev: Option<&str>, pick: Option<Pick>) -> ModelRef {
        ModelRef::Hub {
            repo: repo.into(),
            revision: rev.map(Into::into),
            pick,
        }
    }

    #[test]
    fn hub_references_parse_with_revision_and_pick() {
        assert_eq!(
            ModelRef::parse("Qwen/Qwen3-0.6B").unwrap(),
            hub("Qwen/Qwen3-0.6B", None, None)
        );
        assert_eq!(
            ModelRef::parse("org/m-GGUF@v1.0:q4_k_m").unwrap(),
            hub(
                "org/m-GGUF",
                Some("v1.0"),
                Some(Pick::Quant("q4_k_m".into()))
            )
        );
        assert_eq!(
            ModelRef::parse("org/m@refs/pr/3:Model-Q8_0.gguf").unwrap(),
            hub(
                "org/m",
                Some("refs/pr/3"),
                Some(Pick::File("Model-Q8_0.gguf".into()))
            )
        );
        let r = ModelRef::parse("org/m@abc:Q4_0").unwrap();
        assert_eq!(r.to_string(), "org/m@abc:Q4_0");
    }

    #[test]
    fn ollama_references_default_to_latest() {
        assert_eq!(
            ModelRef::parse("ollama:qwen3").unwrap(),
            ModelRef::Ollama {
                name: "qwen3".into(),
                tag: "latest".into()
            }
        );
        assert_eq!(
            ModelRef::parse("ollama:user/m:0.6b").unwrap(),
            ModelRef::Ollama {
                name: "user/m".into(),
                tag: "0.6b".into()
            }
        );
        assert!(ModelRef::parse("ollama:../x").is_err());
        assert!(ModelRef::parse("ollama:").is_err());
    }

    #[test]
    fn bad_references_say_what_a_reference_is() {
        for s in [
            "",
            "a/b/c",
            "org/../x",
            "org/m@",
            "org/m:",
            "/no/such/file.gguf",
            "org/m:a b",
            "x@y",
        ] {
            let e = ModelRef::parse(s).unwrap_err().to_string();
            assert!(!e.is_empty() && !e.contains('\n'), "{s}: {e}");
        }
        let e = ModelRef::parse("a/b/c").unwrap_err().to_string();
        assert!(e.contains("no such file") && e.contains("org/name"), "{e}");
        assert_eq!(
            ModelRef::parse("SmolLM2").unwrap(),
            ModelRef::Name("SmolLM2".into())
        );
    }

    #[test]
    fn an_existing_path_wins() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("org/name");
        std::fs::create_dir_all(&p).unwrap();
        let s = p.to_str().unwrap();
        assert_eq!(ModelRef::parse(s).unwrap(), ModelRef::Path(p.clone()));
    }
}
