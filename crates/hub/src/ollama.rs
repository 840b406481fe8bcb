//! Ollama's model store, read in place: `manifests/<host>/<namespace>/<name>/<tag>` names the
//! layer of media type `application/vnd.ollama.image.model`, a GGUF at `blobs/sha256-<hex>`.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::{HubError, Result};

pub const MODEL_MEDIA_TYPE: &str = "application/vnd.ollama.image.model";
const REGISTRY: &str = "registry.ollama.ai";
const LIBRARY: &str = "library";

#[derive(Deserialize)]
struct Layer {
    #[serde(rename = "mediaType")]
    media_type: String,
    digest: String,
    size: Option<u64>,
}

#[derive(Deserialize)]
struct Manifest {
    #[serde(default)]
    layers: Vec<Layer>,
}

/// A model of the store: its reference and its GGUF blob.
#[derive(Clone, Debug)]
pub struct OllamaModel {
    /// `name:tag` as `ollama run` takes it (`qwen3:0.6b`, `user/m:latest`).
    pub name: String,
    pub blob: PathBuf,
    pub size: u64,
}

/// Ollama's store at `root` (`OLLAMA_MODELS`).
pub struct OllamaStore {
    root: PathBuf,
}

impl OllamaStore {
    pub fn new(root: impl Into<PathBuf>) -> OllamaStore {
        OllamaStore { root: root.into() }
    }

    /// `name` as a path under `manifests/`: `qwen3` is `registry.ollama.ai/library/qwen3`,
    /// `user/m` is `registry.ollama.ai/user/m`, `host/ns/m` is itself.
    fn manifest_path(&self, name: &str, tag: &str) -> PathBuf {
        let parts: Vec<&str> = name.split('/').collect();
        let base = self.root.join("manifests");
        let dir = match parts.as_slice() {
            [n] => base.join(REGISTRY).join(LIBRARY).join(n),
            [ns, n] => base.join(REGISTRY).join(ns).join(n),
            _ => base.join(name),
        };
        dir.join(tag)
    }

    /// The GGUF blob of `name:tag`, checked to be there with the manifest's size.
    pub fn model(&self, name: &str, tag: &str) -> Result<OllamaModel> {
        let what = format!("ollama:{name}:{tag}");
        let path = self.manifest_path(name, tag);
        if !path.is_file() {
            return Err(HubError::NotFound(format!(
                "{what} is not in Ollama's store ({}); `ollama pull {name}:{tag}` fetches it",
                self.root.display()
            )));
        }
        self.read_manifest(&path, &what, display_name(name, tag))
    }

    fn read_manifest(&self, path: &Path, what: &str, name: String) -> Result<OllamaModel> {
        let text = std::fs::read_to_string(path).map_err(|e| HubError::io(path, e))?;
        let m: Manifest = serde_json::from_str(&text).map_err(|e| {
            HubError::NotFound(format!(
                "{what}: the manifest {} is not Ollama's JSON ({e})",
                path.display()
            ))
        })?;
        let Some(layer) = m.layers.iter().find(|l| l.media_type == MODEL_MEDIA_TYPE) else {
            return Err(HubError::NotFound(format!(
                "{what}: the manifest {} has no model layer ({MODEL_MEDIA_TYPE})",
                path.display()
            )));
        };
        let hex = layer
            .digest
            .strip_prefix("sha256:")
            .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| {
                HubError::NotFound(format!(
                    "{what}: the manifest's model digest '{}' is not sha256:<64 hex>",
                    layer.digest
                ))
            })?;
        let blob = self.root.join("blobs").join(format!("sha256-{hex}"));
        let size = match std::fs::metadata(&blob) {
            Ok(m) if m.is_file() => m.len(),
            _ => {
                return Err(HubError::NotFound(format!(
                    "{what}: its manifest names the blob sha256-{hex}, which is missing from {}; `ollama pull` it again",
                    self.root.join("blobs").display()
                )))
            }
        };
        if let Some(want) = layer.size.filter(|&s| s != size) {
            return Err(HubError::Integrity(format!(
                "{what}: the blob sha256-{hex} has {size} bytes where its manifest says {want}; `ollama pull` it again"
            )));
        }
        Ok(OllamaModel { name, blob, size })
    }

    /// Every model of the store whose manifest and blob are whole, sorted by name.
    pub fn models(&self) -> Vec<OllamaModel> {
        let base = self.root.join("manifests");
        let mut out = Vec::new();
        // host/namespace/name/tag
        for host in subdirs(&base) {
            for ns in subdirs(&host) {
                for model in subdirs(&ns) {
                    let Ok(tags) = std::fs::read_dir(&model) else {
                        continue;
                    };
                    for t in tags.flatten().filter(|t| t.path().is_file()) {
                        let tag = t.file_name().to_string_lossy().into_owned();
                        let n = |p: &Path| {
                            p.file_name()
                                .unwrap_or_default()
                                .to_string_lossy()
                                .into_owned()
                        };
                        let (h, s, m) = (n(&host), n(&ns), n(&model));
                        let name = match (h.as_str(), s.as_str()) {
                            (REGISTRY, LIBRARY) => m,
                            (REGISTRY, _) => format!("{s}/{m}"),
                            _ => format!("{h}/{s}/{m}"),
                        };
                        let what = format!("ollama:{name}:{tag}");
                        match self.read_manifest(&t.path(), &what, display_name(&name, &tag)) {
                            Ok(m) => out.push(m),
                            Err(e) => tracing::debug!("not listed: {e}"),
                        }
                    }
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}

fn display_name(name: &str, tag: &str) -> String {
    format!("{name}:{tag}")
}

fn subdirs(d: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(d) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    v.sort();
    v
}
