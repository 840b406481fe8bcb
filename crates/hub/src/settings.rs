//! Where the stores are and how to reach the Hub, from the environment variables that
//! huggingface_hub and Ollama themselves read, so that all three tools agree.

use std::path::PathBuf;

/// The Hub used when HF_ENDPOINT is not set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

#[derive(Clone, Debug)]
pub struct Settings {
    /// `HF_ENDPOINT`, without a trailing slash.
    pub endpoint: String,
    /// `HF_TOKEN`, else the token file huggingface-cli writes (`$HF_TOKEN_PATH`, else
    /// `$HF_HOME/token`).
    pub token: Option<String>,
    /// `HF_HUB_OFFLINE` (1/true/yes/on): never touch the network.
    pub offline: bool,
    /// `HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`.
    pub hf_cache: PathBuf,
    /// `OLLAMA_MODELS`, else `~/.ollama/models`.
    pub ollama_root: PathBuf,
    /// anelm's own models: `ANELM_MODELS`, else `~/.cache/anelm/models`.
    pub anelm_models: PathBuf,
}

fn home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// huggingface_hub's reading of a boolean variable.
fn truthy(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes" | "on"
    )
}

/// anelm's model directory: `ANELM_MODELS`, else `~/.cache/anelm/models`.
pub fn anelm_models_dir() -> PathBuf {
    var("ANELM_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".cache/anelm/models"))
}

impl Settings {
    pub fn from_env() -> Settings {
        let hf_home = var("HF_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| home().join(".cache/huggingface"));
        let hf_cache = var("HF_HUB_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| hf_home.join("hub"));
        let token = var("HF_TOKEN").or_else(|| {
            let path = var("HF_TOKEN_PATH")
                .map(PathBuf::from)
                .unwrap_or_else(|| hf_home.join("token"));
            std::fs::read_to_string(path)
                .ok()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
        });
        Settings {
            endpoint: var("HF_ENDPOINT")
                .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string())
                .trim_end_matches('/')
                .to_string(),
            token,
            offline: var("HF_HUB_OFFLINE").is_some_and(|v| truthy(&v)),
            hf_cache,
            ollama_root: var("OLLAMA_MODELS")
                .map(PathBuf::from)
                .unwrap_or_else(|| home().join(".ollama/models")),
            anelm_models: anelm_models_dir(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::truthy;

    #[test]
    fn offline_values_read_as_huggingface_hub_reads_them() {
        for v in ["1", "true", "YES", " on "] {
            assert!(truthy(v), "{v}");
        }
        for v in ["0", "false", "no", "off", "2"] {
            assert!(!truthy(v), "{v}");
        }
    }
}
