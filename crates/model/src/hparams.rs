//! Hyperparameters common to the decoder families, read from GGUF metadata
//! (`<arch>.block_count`, ...) or from a Hugging Face config.json (`num_hidden_layers`, ...).

use std::path::Path;

use anelm_formats::{HfConfig, MetaValue, Metadata, RopeParams};

use crate::error::{ModelError, Result};

#[derive(Clone, Debug)]
pub(crate) struct Hparams {
    pub n_layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub eps: f32,
    pub context: usize,
    /// Global (or only) RoPE settings.
    pub rope: RopeParams,
    /// Rotated dimensions per head.
    pub rope_dims: usize,
    pub sliding_window: Option<usize>,
    pub attn_softcap: Option<f32>,
    pub final_softcap: Option<f32>,
}

impl Hparams {
    /// Reads `<arch>.*` from GGUF metadata; `n_tensors` bounds the layer count (each layer needs
    /// a tensor), so a corrupt count cannot size the per-layer tables.
    pub fn from_gguf(meta: &Metadata, arch: &str, n_tensors: usize) -> Result<Hparams> {
        let k = |s: &str| format!("{arch}.{s}");
        let n_heads = meta.positive(&k("attention.head_count"))?;
        let hidden = meta.positive(&k("embedding_length"))?;
        let head_dim = meta
            .positive_opt(&k("attention.key_length"))?
            .unwrap_or(hidden / n_heads);
        let eps = match meta.f32_opt(&k("attention.layer_norm_rms_epsilon"))? {
            Some(e) => e,
            None => meta
                .f32_opt(&k("attention.layer_norm_epsilon"))?
                .unwrap_or(1e-5),
        };
        let mut rope = RopeParams {
            theta: meta.f32_opt(&k("rope.freq_base"))?.unwrap_or(10_000.0) as f64,
            ..Default::default()
        };
        if let Some(t) = meta.str_opt(&k("rope.scaling.type"))? {
            rope.rope_type = t.to_string();
            rope.factor = meta.f32_opt(&k("rope.scaling.factor"))?.map(f64::from);
            rope.original_max_position_embeddings = meta
                .usize_opt(&k("rope.scaling.original_context_length"))?
                .map(|v| v as f64);
        }
        let rope_dims = meta
            .usize_opt(&k("rope.dimension_count"))?
            .unwrap_or(head_dim);
        Hparams {
            n_layers: meta.positive(&k("block_count"))?,
            hidden,
            ffn: meta
                .usize_opt(&k("feed_forward_length"))?
                .unwrap_or(4 * hidden),
            n_heads,
            n_kv_heads: kv_heads(meta, &k("attention.head_count_kv"))?.unwrap_or(n_heads),
            head_dim,
            eps,
            context: meta.usize_opt(&k("context_length"))?.unwrap_or(2048),
            rope,
            rope_dims,
            sliding_window: meta.usize_opt(&k("attention.sliding_window"))?,
            attn_softcap: meta.f32_opt(&k("attn_logit_softcapping"))?,
            final_softcap: meta.f32_opt(&k("final_logit_softcapping"))?,
        }
        .checked(meta.path(), &k("block_count"), n_tensors)
    }

    /// Reads config.json; `n_tensors` as in [`Self::from_gguf`].
    pub fn from_hf(cfg: &HfConfig, n_tensors: usize) -> Result<Hparams> {
        let hidden = cfg.positive_any(&["hidden_size", "n_embd"])?;
        let n_heads = cfg.positive_any(&["num_attention_heads", "n_head"])?;
        let head_dim = cfg.positive_opt("head_dim")?.unwrap_or(hidden / n_heads);
        let rope = cfg.rope(Some("full_attention"))?;
        let rope_dims = (head_dim as f64 * rope.partial_rotary_factor) as usize;
        let eps = match cfg.f64_opt("rms_norm_eps")? {
            Some(e) => e,
            None => cfg
                .f64_opt("layer_norm_epsilon")?
                .or(cfg.f64_opt("layer_norm_eps")?)
                .or(cfg.f64_opt("norm_eps")?)
                .unwrap_or(1e-5),
        } as f32;
        Hparams {
            n_layers: cfg.positive_any(&["num_hidden_layers", "n_layer"])?,
            hidden,
            ffn: match cfg.usize_opt("intermediate_size")? {
                Some(f) => f,
                None => cfg.usize_opt("n_inner")?.unwrap_or(4 * hidden),
            },
            n_heads,
            n_kv_heads: cfg.positive_opt("num_key_value_heads")?.unwrap_or(n_heads),
            head_dim,
            eps,
            context: cfg
                .usize_any(&["max_position_embeddings", "n_positions"])
                .unwrap_or(2048),
            rope,
            rope_dims,
            sliding_window: cfg.usize_opt("sliding_window")?,
            attn_softcap: cfg.f64_opt("attn_logit_softcapping")?.map(|v| v as f32),
            final_softcap: cfg.f64_opt("final_logit_softcapping")?.map(|v| v as f32),
        }
        .checked(cfg.path(), "num_hidden_layers", n_tensors)
    }

    /// Consistency the file cannot be trusted with: a head width of at least 1, a layer count
    /// the tensors can back.
    fn checked(self, path: &Path, layers_key: &str, n_tensors: usize) -> Result<Hparams> {
        if self.head_dim == 0 {
            return Err(ModelError::invalid(
                path,
                format!(
                    "{} heads in a width of {} leave no head dimension",
                    self.n_heads, self.hidden
                ),
            ));
        }
        if n_tensors == 0 {
            return Err(ModelError::invalid(
                path,
                "the file holds no tensors (a vocabulary-only GGUF): `anelm tokenize` and \
                 `anelm template` work on it, running needs the weights",
            ));
        }
        if self.n_layers > n_tensors {
            return Err(ModelError::invalid(
                path,
                format!(
                    "{layers_key} is {} but the weights hold only {n_tensors} tensors",
                    self.n_layers
                ),
            ));
        }
        Ok(self)
    }
}

/// The KV heads of the attention layers under `key`: one count, or (LFM2) one per layer with 0
/// for the layers without attention, of which the largest (which must be at least 1).
pub(crate) fn kv_heads(meta: &Metadata, key: &str) -> Result<Option<usize>> {
    match meta.get(key) {
        Some(MetaValue::Array(a)) => {
            let counts = per_layer_counts(meta, key, a)?;
            match counts.iter().copied().max() {
                Some(n) if n > 0 => Ok(Some(n)),
                _ => Err(ModelError::invalid(
                    meta.path(),
                    format!("'{key}': no layer has a KV head"),
                )),
            }
        }
        _ => Ok(meta.positive_opt(key)?),
    }
}

/// The integers of a per-layer array under `key`.
pub(crate) fn per_layer_counts(meta: &Metadata, key: &str, a: &[MetaValue]) -> Result<Vec<usize>> {
    a.iter()
        .map(|v| v.as_i64().and_then(|n| usize::try_from(n).ok()))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| {
            ModelError::invalid(meta.path(), format!("'{key}' must hold counts per layer"))
        })
}
