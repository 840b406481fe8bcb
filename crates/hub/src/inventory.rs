//! The models on this machine, in all three stores (the Hugging Face cache, Ollama's store,
//! anelm's own directory), each under the reference that names it, with size, format and
//! quantisation read from the GGUF header or config.json.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::hf_cache::HfCache;
use crate::ollama::OllamaStore;
use crate::Settings;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Store {
    HfCache,
    Ollama,
    Anelm,
}

impl Store {
    pub fn name(self) -> &'static str {
        match self {
            Store::HfCache => "hf-cache",
            Store::Ollama => "ollama",
            Store::Anelm => "anelm",
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Entry {
    /// The reference that names it (`org/name`, `org/name:file.gguf`, `ollama:m:tag`, a file name).
    pub name: String,
    pub path: PathBuf,
    pub size: u64,
    /// `gguf` or `safetensors`.
    pub format: &'static str,
    /// The GGUF file type (Q4_K_M...), or the checkpoint's dtype / quantisation method.
    pub quant: Option<String>,
    pub store: Store,
}

/// llama.cpp's `llama_ftype` names (llama.h), by the value of `general.file_type`.
fn ftype_name(t: i64) -> Option<&'static str> {
    Some(match t {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        36 => "TQ1_0",
        37 => "TQ2_0",
        38 => "MXFP4_MOE",
        _ => return None,
    })
}

/// The quantisation of a GGUF: its `general.file_type`, else the type holding most bytes.
pub fn gguf_quant(path: &Path) -> Option<String> {
    let g = anelm_formats::Gguf::open(path).ok()?;
    if let Some(t) = g.metadata.get("general.file_type").and_then(|v| v.as_i64()) {
        if let Some(n) = ftype_name(t) {
            return Some(n.to_string());
        }
    }
    let mut bytes: HashMap<&'static str, usize> = HashMap::new();
    for i in g.tensors.infos() {
        *bytes.entry(i.dtype.name()).or_default() += i.n_bytes();
    }
    bytes
        .into_iter()
        .max_by_key(|(n, b)| (*b, *n))
        .map(|(n, _)| n.to_uppercase())
}

/// What a checkpoint's config.json says of its weights: the quantisation method (with bits),
/// else the dtype.
pub fn config_quant(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    if let Some(q) = v.get("quantization_config") {
        let method = q
            .get("quant_method")
            .and_then(|m| m.as_str())
            .unwrap_or("quantized");
        return Some(match q.get("bits").and_then(|b| b.as_u64()) {
            Some(b) => format!("{method} {b}-bit"),
            None => method.to_string(),
        });
    }
    ["torch_dtype", "dtype"]
        .iter()
        .find_map(|k| v.get(*k).and_then(|d| d.as_str()))
        .map(str::to_string)
}

fn size_of(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

fn is_gguf(f: &str) -> bool {
    f.to_ascii_lowercase().ends_with(".gguf")
}

/// The models of the Hugging Face cache: a safetensors snapshot is one entry, each GGUF file
/// of a snapshot another. A snapshot is named by `main` if that ref points at it, else by
/// another ref, else by its commit.
pub fn hf_entries(cache: &HfCache, details: bool) -> Vec<Entry> {
    let mut out = Vec::new();
    for repo in cache.repos() {
        let refs = cache.refs(&repo);
        for commit in cache.snapshots(&repo) {
            let mut names: Vec<&str> = refs
                .iter()
                .filter(|(_, c)| *c == commit)
                .map(|(r, _)| r.as_str())
                .collect();
            names.sort_by_key(|r| (*r != "main", *r));
            let base = match names.first() {
                Some(&"main") => repo.clone(),
                Some(r) => format!("{repo}@{r}"),
                None => format!("{repo}@{commit}"),
            };
            let dir = cache.snapshot_dir(&repo, &commit);
            let files: Vec<String> = cache
                .snapshot_files(&repo, &commit)
                .into_iter()
                .filter(|f| dir.join(f).is_file())
                .collect();
            for f in files.iter().filter(|f| is_gguf(f)) {
                let p = dir.join(f);
                out.push(Entry {
                    name: format!("{base}:{f}"),
                    size: size_of(&p),
                    format: "gguf",
                    quant: if details { gguf_quant(&p) } else { None },
                    path: p,
                    store: Store::HfCache,
                });
            }
            if files.iter().any(|f| f == "config.json")
                && files.iter().any(|f| f.ends_with(".safetensors"))
            {
                out.push(Entry {
                    name: base,
                    size: files
                        .iter()
                        .filter(|f| !is_gguf(f))
                        .map(|f| size_of(&dir.join(f)))
                        .sum(),
                    format: "safetensors",
                    quant: if details { config_quant(&dir) } else { None },
                    path: dir,
                    store: Store::HfCache,
                });
            }
        }
    }
    out
}

/// The models of Ollama's store.
pub fn ollama_entries(store: &OllamaStore, details: bool) -> Vec<Entry> {
    store
        .models()
        .into_iter()
        .map(|m| Entry {
            name: format!("ollama:{}", m.name),
            size: m.size,
            format: "gguf",
            quant: if details { gguf_quant(&m.blob) } else { None },
            path: m.blob,
            store: Store::Ollama,
        })
        .collect()
}

/// anelm's own directory: GGUF files and Hugging Face model directories.
pub fn anelm_entries(dir: &Path, details: bool) -> Vec<Entry> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_file() && is_gguf(&name) {
            out.push(Entry {
                quant: if details { gguf_quant(&p) } else { None },
                size: size_of(&p),
                format: "gguf",
                name,
                path: p,
                store: Store::Anelm,
            });
        } else if p.join("config.json").is_file() {
            let size = std::fs::read_dir(&p)
                .map(|rd| rd.flatten().map(|f| size_of(&f.path())).sum())
                .unwrap_or(0);
            out.push(Entry {
                quant: if details { config_quant(&p) } else { None },
                size,
                format: "safetensors",
                name,
                path: p,
                store: Store::Anelm,
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Everything, store by store. `details` reads each model's header for its quantisation.
pub fn list(settings: &Settings, details: bool) -> Vec<Entry> {
    let mut out = hf_entries(&HfCache::new(&settings.hf_cache), details);
    out.extend(ollama_entries(
        &OllamaStore::new(&settings.ollama_root),
        details,
    ));
    out.extend(anelm_entries(&settings.anelm_models, details));
    out
}

/// Whether the bare `name` designates `e`: its full name, its file name without `.gguf`, the
/// repository's own name, or an Ollama name without its tag.
pub fn answers_to(e: &Entry, name: &str) -> bool {
    let eq = |a: &str| a.eq_ignore_ascii_case(name);
    if eq(&e.name) {
        return true;
    }
    match e.store {
        Store::Anelm => e.name.strip_suffix(".gguf").is_some_and(eq),
        Store::Ollama => {
            let n = e.name.trim_start_matches("ollama:");
            eq(n) || n.rsplit_once(':').is_some_and(|(m, _)| eq(m))
        }
        Store::HfCache => {
            // `org/name[@rev][:file]`: the name part, only for the main snapshot.
            let (repo, file) = match e.name.split_once(':') {
                Some((r, f)) => (r, Some(f)),
                None => (e.name.as_str(), None),
            };
            !repo.contains('@')
                && (repo.split_once('/').is_some_and(|(_, n)| eq(n))
                    || file.is_some_and(|f| f.strip_suffix(".gguf").is_some_and(eq)))
        }
    }
}
