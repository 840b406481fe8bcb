//! Hugging Face `config.json`, in the transformers 4.x and 5.x layouts. Values are read by key
//! through accessors that name the file and key on error; multimodal configs keep the text
//! model's settings under `text_config`, which the accessors look into first.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{FormatError, Result};

pub struct HfConfig {
    path: PathBuf,
    root: Value,
}

impl HfConfig {
    pub fn open(dir: &Path) -> Result<HfConfig> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| FormatError::io(&path, e))?;
        Self::parse(&path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<HfConfig> {
        let root: Value = serde_json::from_str(text)
            .map_err(|e| FormatError::malformed(path, format!("invalid JSON: {e}")))?;
        if !root.is_object() {
            return Err(FormatError::malformed(
                path,
                "config.json is not a JSON object",
            ));
        }
        Ok(HfConfig {
            path: path.to_path_buf(),
            root,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The value of `key`: from `text_config` when present there, else from the top level.
    /// A JSON null counts as absent (transformers writes null for unset options).
    pub fn get(&self, key: &str) -> Option<&Value> {
        let text = self
            .root
            .get("text_config")
            .and_then(|t| t.get(key))
            .filter(|v| !v.is_null());
        text.or_else(|| self.root.get(key).filter(|v| !v.is_null()))
    }

    fn bad(&self, key: &str, msg: &str) -> FormatError {
        FormatError::BadValue {
            path: self.path.clone(),
            key: key.to_string(),
            msg: msg.to_string(),
        }
    }

    fn missing(&self, key: &str) -> FormatError {
        FormatError::MissingKey {
            path: self.path.clone(),
            key: key.to_string(),
        }
    }

    pub fn model_type(&self) -> Result<&str> {
        // A multimodal wrapper names the text model's type in text_config.
        self.str("model_type")
    }

    pub fn usize_opt(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| self.bad(key, "expected a non-negative integer")),
        }
    }

    pub fn usize(&self, key: &str) -> Result<usize> {
        self.usize_opt(key)?.ok_or_else(|| self.missing(key))
    }

    /// An optional count that must be at least 1 (heads, layers, widths: a zero would divide).
    pub fn positive_opt(&self, key: &str) -> Result<Option<usize>> {
        match self.usize_opt(key)? {
            Some(0) => Err(self.bad(key, "must be at least 1, found 0")),
            v => Ok(v),
        }
    }

    pub fn f64_opt(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.bad(key, "expected a number")),
        }
    }

    pub fn f64(&self, key: &str) -> Result<f64> {
        self.f64_opt(key)?.ok_or_else(|| self.missing(key))
    }

    pub fn bool_opt(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.bad(key, "expected true or false")),
        }
    }

    pub fn str_opt(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.bad(key, "expected a string")),
        }
    }

    pub fn str(&self, key: &str) -> Result<&str> {
        self.str_opt(key)?.ok_or_else(|| self.missing(key))
    }

    /// A list of strings (`layer_types`).
    pub fn strings_opt(&self, key: &str) -> Result<Option<Vec<&str>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_str()
                        .ok_or_else(|| self.bad(key, "expected a list of strings"))
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(_) => Err(self.bad(key, "expected a list of strings")),
        }
    }

    /// `layer_types`, one string per layer (checked against `n_layers`), if present.
    pub fn layer_types(&self, n_layers: usize) -> Result<Option<Vec<String>>> {
        match self.strings_opt("layer_types")? {
            Some(t) if t.len() == n_layers => Ok(Some(t.into_iter().map(String::from).collect())),
            Some(t) => Err(self.bad(
                "layer_types",
                &format!("{} entries for {n_layers} layers", t.len()),
            )),
            None => Ok(None),
        }
    }

    /// The first of several alternative keys that is present (`n_embd` vs `hidden_size`, ...).
    pub fn usize_any(&self, keys: &[&str]) -> Result<usize> {
        self.any(keys, Self::usize_opt)
    }

    /// [`Self::usize_any`] for a count that must be at least 1.
    pub fn positive_any(&self, keys: &[&str]) -> Result<usize> {
        self.any(keys, Self::positive_opt)
    }

    fn any(&self, keys: &[&str], get: fn(&Self, &str) -> Result<Option<usize>>) -> Result<usize> {
        for k in keys {
            if let Some(v) = get(self, k)? {
                return Ok(v);
            }
        }
        Err(self.missing(keys[0]))
    }

    /// RoPE parameters for a layer type: 5.x `rope_parameters` (flat, or keyed by layer type as
    /// Gemma 3 writes it), else 4.x `rope_theta` / `rope_scaling` (+ `rope_local_base_freq` for
    /// Gemma 3's sliding layers).
    pub fn rope(&self, layer_type: Option<&str>) -> Result<RopeParams> {
        if let Some(params) = self.get("rope_parameters") {
            let params = match layer_type.and_then(|t| params.get(t)) {
                Some(p) => p,
                None => params,
            };
            return self.rope_from_object(params, "rope_parameters");
        }
        let mut theta = self.f64_opt("rope_theta")?.unwrap_or(10_000.0);
        if layer_type == Some("sliding_attention") {
            if let Some(local) = self.f64_opt("rope_local_base_freq")? {
                theta = local;
            }
        }
        let mut rope = match self.get("rope_scaling") {
            Some(s) if layer_type != Some("sliding_attention") => {
                self.rope_from_object(s, "rope_scaling")?
            }
            _ => RopeParams::default(),
        };
        rope.theta = theta;
        if let Some(f) = self.f64_opt("partial_rotary_factor")? {
            rope.partial_rotary_factor = f;
        }
        Ok(rope)
    }

    fn rope_from_object(&self, v: &Value, key: &str) -> Result<RopeParams> {
        let obj = v
            .as_object()
            .ok_or_else(|| self.bad(key, "expected an object"))?;
        let num = |k: &str| obj.get(k).and_then(Value::as_f64);
        let rope_type = obj
            .get("rope_type")
            .or_else(|| obj.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_string();
        Ok(RopeParams {
            theta: num("rope_theta").unwrap_or(10_000.0),
            rope_type,
            factor: num("factor"),
            low_freq_factor: num("low_freq_factor"),
            high_freq_factor: num("high_freq_factor"),
            original_max_position_embeddings: num("original_max_position_embeddings"),
            partial_rotary_factor: num("partial_rotary_factor")
                .or(self.f64_opt("partial_rotary_factor")?)
                .unwrap_or(1.0),
        })
    }
}

/// RoPE settings as transformers names them.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeParams {
    pub theta: f64,
    /// `default`, `linear`, `llama3`, `yarn`, ...
    pub rope_type: String,
    pub factor: Option<f64>,
    pub low_freq_factor: Option<f64>,
    pub high_freq_factor: Option<f64>,
    pub original_max_position_embeddings: Option<f64>,
    pub partial_rotary_factor: f64,
}

impl Default for RopeParams {
    fn default() -> Self {
        RopeParams {
            theta: 10_000.0,
            rope_type: "default".into(),
            factor: None,
            low_freq_factor: None,
            high_freq_factor: None,
            original_max_position_embeddings: None,
            partial_rotary_factor: 1.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> HfConfig {
        HfConfig::parse(Path::new("/m/config.json"), text).unwrap()
    }

    #[test]
    fn reads_both_rope_layouts() {
        let v5 = cfg(
            r#"{"rope_parameters": {"full_attention": {"rope_theta": 1e6, "rope_type": "linear", "factor": 8.0},
                         "sliding_attention": {"rope_theta": 1e4, "rope_type": "default"}}}"#,
        );
        assert_eq!(v5.rope(Some("full_attention")).unwrap().theta, 1e6);
        assert_eq!(v5.rope(Some("full_attention")).unwrap().factor, Some(8.0));
        assert_eq!(v5.rope(Some("sliding_attention")).unwrap().theta, 1e4);
        let v4 = cfg(
            r#"{"rope_theta": 1e6, "rope_local_base_freq": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}"#,
        );
        assert_eq!(v4.rope(Some("full_attention")).unwrap().theta, 1e6);
        assert_eq!(v4.rope(Some("full_attention")).unwrap().factor, Some(8.0));
        let local = v4.rope(Some("sliding_attention")).unwrap();
        assert_eq!((local.theta, local.factor), (1e4, None));
        let flat =
            cfg(r#"{"rope_parameters": {"rope_theta": 500.0, "partial_rotary_factor": 0.25}}"#);
        assert_eq!(flat.rope(None).unwrap().partial_rotary_factor, 0.25);
    }

    #[test]
    fn text_config_and_nulls() {
        let c = cfg(
            r#"{"model_type": "x", "hidden_size": 8, "text_config": {"model_type": "y", "hidden_size": 16, "sliding_window": null}, "sliding_window": 4}"#,
        );
        assert_eq!(c.model_type().unwrap(), "y");
        assert_eq!(c.usize("hidden_size").unwrap(), 16);
        assert_eq!(c.usize_opt("sliding_window").unwrap(), Some(4));
        let e = c.usize("num_hidden_layers").unwrap_err().to_string();
        assert!(
            e.contains("/m/config.json") && e.contains("num_hidden_layers"),
            "{e}"
        );
        let e = cfg(r#"{"hidden_size": "big"}"#)
            .usize("hidden_size")
            .unwrap_err()
            .to_string();
        assert!(e.contains("non-negative integer"), "{e}");
        assert!(HfConfig::parse(Path::new("c.json"), "{oops").is_err());
    }
}
