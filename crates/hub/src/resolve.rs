//! A reference to local files: the one place that decides where a model named on the command
//! line (or in a request) is, downloading it from the Hub when the cache does not have it.

use std::path::PathBuf;

use crate::inventory::{answers_to, list};
use crate::ollama::OllamaStore;
use crate::reference::FORMS;
use crate::{Hub, HubError, ModelRef, Progress, Result, Settings};

/// A model found on disk.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// What the loader opens: a GGUF file or a Hugging Face model directory.
    pub path: PathBuf,
    /// The reference as given, for display and as the model's name in an API.
    pub name: String,
}

pub struct Resolver {
    pub hub: Hub,
}

impl Resolver {
    pub fn new(settings: Settings) -> Resolver {
        Resolver {
            hub: Hub::new(settings),
        }
    }

    pub fn from_env() -> Resolver {
        Resolver::new(Settings::from_env())
    }

    pub fn settings(&self) -> &Settings {
        self.hub.settings()
    }

    /// Parses `text` and finds its model ([`Resolver::resolve`]).
    pub fn resolve_str(&self, text: &str, progress: &dyn Progress) -> Result<Resolved> {
        self.resolve(&ModelRef::parse(text)?, progress)
    }

    /// The local files of `r`. A Hub model the cache holds is used as it is (no network); one it
    /// lacks is downloaded, unless HF_HUB_OFFLINE is set. Ollama models are used in place.
    pub fn resolve(&self, r: &ModelRef, progress: &dyn Progress) -> Result<Resolved> {
        let name = r.to_string();
        let path = match r {
            ModelRef::Path(p) => {
                if !p.exists() {
                    return Err(HubError::NotFound(format!(
                        "{}: no such file or directory",
                        p.display()
                    )));
                }
                p.clone()
            }
            ModelRef::Hub {
                repo,
                revision,
                pick,
            } => {
                let rev = revision.as_deref();
                match self.hub.cached(repo, rev, pick.as_ref()) {
                    Some(s) => s.model_path(),
                    None => self
                        .hub
                        .pull(repo, rev, pick.as_ref(), progress)?
                        .model_path(),
                }
            }
            ModelRef::Ollama { name, tag } => {
                OllamaStore::new(&self.settings().ollama_root)
                    .model(name, tag)?
                    .blob
            }
            ModelRef::Name(n) => return self.by_name(n, progress),
        };
        Ok(Resolved { path, name })
    }

    /// A bare name: a file of anelm's directory, else the one model of `anelm list` it names.
    fn by_name(&self, n: &str, progress: &dyn Progress) -> Result<Resolved> {
        let s = self.settings();
        let entries = list(s, false);
        let hits: Vec<_> = entries.iter().filter(|e| answers_to(e, n)).collect();
        match hits.as_slice() {
            [] => Err(HubError::NotFound(format!(
                "{n}: no such file, and no model of that name in the Hugging Face cache ({}), Ollama's store ({}) or {}; a model is {FORMS}",
                s.hf_cache.display(),
                s.ollama_root.display(),
                s.anelm_models.display()
            ))),
            [one] => {
                if one.name == n {
                    return Ok(Resolved { path: one.path.clone(), name: one.name.clone() });
                }
                let r = ModelRef::parse(&one.name).unwrap_or(ModelRef::Path(one.path.clone()));
                match r {
                    ModelRef::Name(_) => Ok(Resolved { path: one.path.clone(), name: one.name.clone() }),
                    r => self.resolve(&r, progress),
                }
            }
            many => {
                let names: Vec<&str> = many.iter().map(|e| e.name.as_str()).collect();
                Err(HubError::Ambiguous(format!("{n} names {} models: {}; give one of these", many.len(), names.join(", "))))
            }
        }
    }
}
