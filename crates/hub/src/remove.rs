//! `anelm rm`: a model out of the Hugging Face cache (its snapshot, and each blob no other
//! snapshot uses) or out of anelm's own directory. Ollama's store is Ollama's to change.

use crate::hf_cache::HfCache;
use crate::inventory::{answers_to, list, Store};
use crate::select::pick_gguf;
use crate::{HubError, ModelRef, Result, Settings};

/// What was removed.
#[derive(Debug)]
pub struct Removal {
    /// The reference removed.
    pub name: String,
    pub files: usize,
    pub bytes: u64,
}

/// Removes the model `r` names; a reference to nothing in the stores is refused.
pub fn remove(settings: &Settings, r: &ModelRef) -> Result<Removal> {
    match r {
        ModelRef::Hub { repo, revision, pick } => {
            let cache = HfCache::new(&settings.hf_cache);
            let rev = revision.as_deref().unwrap_or("main");
            let Some(commit) = cache.commit_for(repo, rev) else {
                return Err(HubError::NotFound(format!(
                    "{r} is not in the Hugging Face cache ({}); `anelm list` shows what is",
                    settings.hf_cache.display()
                )));
            };
            let files = match pick {
                None => None,
                Some(p) => Some(pick_gguf(&cache.snapshot_files(repo, &commit), Some(p), &r.to_string())?),
            };
            let done = cache.remove(repo, &commit, files.as_deref())?;
            Ok(Removal {
                name: r.to_string(),
                files: done.files,
                bytes: done.bytes,
            })
        }
        ModelRef::Ollama { name, tag } => Err(HubError::BadReference(format!(
            "{r}: anelm reads Ollama's store and leaves changing it to Ollama: `ollama rm {name}:{tag}`"
        ))),
        ModelRef::Path(p) => Err(HubError::BadReference(format!(
            "{}: a path, not a stored model; `anelm rm` removes what `anelm list` shows",
            p.display()
        ))),
        ModelRef::Name(n) => {
            let entries = list(settings, false);
            let hits: Vec<_> = entries.iter().filter(|e| answers_to(e, n)).collect();
            match hits.as_slice() {
                [] => Err(HubError::NotFound(format!("{n}: no stored model of that name; `anelm list` shows what there is"))),
                [e] if e.store == Store::Anelm => {
                    let bytes = e.size;
                    let res = if e.path.is_dir() {
                        std::fs::remove_dir_all(&e.path)
                    } else {
                        std::fs::remove_file(&e.path)
                    };
                    res.map_err(|err| HubError::io(&e.path, err))?;
                    Ok(Removal { name: e.name.clone(), files: 1, bytes })
                }
                [e] => remove(settings, &ModelRef::parse(&e.name)?),
                many => {
                    let names: Vec<&str> = many.iter().map(|e| e.name.as_str()).collect();
                    Err(HubError::Ambiguous(format!("{n} names {} models: {}; give one of these", many.len(), names.join(", "))))
                }
            }
        }
    }
}
