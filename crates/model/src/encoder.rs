//! Encoder (embedding) models: BERT and its kin — every token attends to every other, a
//! LayerNorm after each residual, learned positions. They embed text and never generate, so
//! they have their own plan beside the decoder's [`crate::Model`], read from a Hugging Face
//! directory (with sentence-transformers' pooling and normalisation) or a GGUF `bert` file.

use std::path::Path;

use anelm_formats::{Gguf, HfConfig};

use crate::error::{ModelError, Result};
use crate::loader::TensorLoader;
use crate::model::ModelSource;
use crate::plan::{Linear, Norm, NormKind};
use crate::weight::Weight;

/// How a text's token vectors become one vector.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pooling {
    /// The average over the tokens (special tokens included, as sentence-transformers does;
    /// llama.cpp's default for a model that names none).
    #[default]
    Mean,
    /// The first token's (BERT's [CLS]).
    Cls,
    /// The last token's (decoder embedding models: e5-mistral, Qwen3-Embedding).
    Last,
}

impl std::str::FromStr for Pooling {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Pooling, String> {
        match s {
            "mean" => Ok(Pooling::Mean),
            "last" => Ok(Pooling::Last),
            "cls" => Ok(Pooling::Cls),
            other => Err(format!("pooling '{other}': use mean, last or cls")),
        }
    }
}

/// Pools `hidden` (`width` floats per token) into one vector, scaled to unit length when
/// `normalize` (a zero vector stays zero); sums in f64.
pub fn pool(hidden: &[f32], width: usize, pooling: Pooling, normalize: bool) -> Vec<f32> {
    let n = hidden.len() / width.max(1);
    let mut v = match pooling {
        Pooling::Cls => hidden[..width].to_vec(),
        Pooling::Last => hidden[(n - 1) * width..n * width].to_vec(),
        Pooling::Mean => {
            let mut acc = vec![0f64; width];
            for row in hidden.chunks_exact(width) {
                acc.iter_mut().zip(row).for_each(|(a, &b)| *a += b as f64);
            }
            acc.iter().map(|a| (a / n as f64) as f32).collect()
        }
    };
    if normalize {
        let norm = v
            .iter()
            .map(|&a| (a as f64) * (a as f64))
            .sum::<f64>()
            .sqrt();
        if norm > 0.0 {
            v.iter_mut().for_each(|a| *a = (*a as f64 / norm) as f32);
        }
    }
    v
}

impl Pooling {
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }
}

/// The FFN's activation: transformers' `gelu` is the exact (erf) one, `gelu_new` and
/// `gelu_pytorch_tanh` the tanh approximation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gelu {
    Erf,
    Tanh,
}

/// One block: `x = norm1(x + o(attn(x)))`, `x = norm2(x + down(gelu(up(x))))`.
#[derive(Debug)]
pub struct EncoderLayer {
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub attn_norm: Norm,
    pub up: Linear,
    pub down: Linear,
    pub ffn_norm: Norm,
}

#[derive(Debug)]
pub struct Encoder {
    /// The directory's or file's name.
    pub name: String,
    pub source: ModelSource,
    /// The architecture as the source names it (`bert`).
    pub arch: String,
    pub hidden: usize,
    pub n_heads: usize,
    pub vocab_size: usize,
    /// Most tokens in one text (the learned positions).
    pub max_positions: usize,
    pub gelu: Gelu,
    /// Token embeddings `[vocab, hidden]`.
    pub word: Weight,
    /// Position embeddings `[max_positions, hidden]` with token type 0's embedding added (a
    /// single text is all type 0).
    pub position: Vec<f32>,
    pub embed_norm: Norm,
    pub layers: Vec<EncoderLayer>,
    pub pooling: Pooling,
    /// Whether the pooled vector is scaled to unit length.
    pub normalize: bool,
}

/// The architectures read as encoders, by HF `model_type` / GGUF `general.architecture`.
pub const ENCODER_ARCHS: &[&str] = &["bert"];

/// Whether a source holds an encoder (by its declared architecture).
pub fn is_encoder_arch(arch: &str) -> bool {
    ENCODER_ARCHS.contains(&arch)
}

/// Tensor names of one source's convention.
struct Names {
    word: String,
    position: String,
    token_type: String,
    embed_norm: String,
    /// `{i}` stands for the layer; each entry names the weight, the bias is `.bias` beside it.
    layer: [&'static str; 8],
}

const HF_LAYER: [&str; 8] = [
    "encoder.layer.{i}.attention.self.query",
    "encoder.layer.{i}.attention.self.key",
    "encoder.layer.{i}.attention.self.value",
    "encoder.layer.{i}.attention.output.dense",
    "encoder.layer.{i}.attention.output.LayerNorm",
    "encoder.layer.{i}.intermediate.dense",
    "encoder.layer.{i}.output.dense",
    "encoder.layer.{i}.output.LayerNorm",
];

const GGUF_LAYER: [&str; 8] = [
    "blk.{i}.attn_q",
    "blk.{i}.attn_k",
    "blk.{i}.attn_v",
    "blk.{i}.attn_output",
    "blk.{i}.attn_output_norm",
    "blk.{i}.ffn_up",
    "blk.{i}.ffn_down",
    "blk.{i}.layer_output_norm",
];

/// The numbers that shape an encoder.
struct Shape {
    hidden: usize,
    n_heads: usize,
    ffn: usize,
    n_layers: usize,
    max_positions: usize,
    eps: f32,
}

/// Loads an encoder: a Hugging Face directory or a GGUF file.
pub fn load(path: &Path) -> Result<Encoder> {
    if path.is_dir() {
        load_hf(path)
    } else {
        load_gguf(path)
    }
}

fn load_hf(dir: &Path) -> Result<Encoder> {
    from_hf(dir, HfConfig::open(dir)?, || {
        Ok(anelm_formats::safetensors::open_dir(dir)?)
    })
}

/// The encoder of a parsed config.json; `tensors` opens the weights once the architecture is
/// known to be an encoder's.
pub fn from_hf(
    dir: &Path,
    cfg: HfConfig,
    tensors: impl FnOnce() -> Result<anelm_formats::TensorStore>,
) -> Result<Encoder> {
    let arch = cfg.model_type()?.to_string();
    if !is_encoder_arch(&arch) {
        return Err(not_encoder(cfg.path(), &arch));
    }
    let loader = TensorLoader::new(tensors()?);
    // BertForMaskedLM and kin keep the encoder under `bert.`.
    let prefix = if loader.has("bert.embeddings.word_embeddings.weight") {
        "bert."
    } else {
        ""
    };
    let shape = Shape {
        hidden: cfg.positive_any(&["hidden_size"])?,
        n_heads: cfg.positive_any(&["num_attention_heads"])?,
        ffn: cfg.positive_any(&["intermediate_size"])?,
        n_layers: cfg.positive_any(&["num_hidden_layers"])?,
        max_positions: cfg.positive_any(&["max_position_embeddings"])?,
        eps: cfg.f64_opt("layer_norm_eps")?.unwrap_or(1e-12) as f32,
    };
    let gelu = match cfg.str_opt("hidden_act")?.unwrap_or("gelu") {
        "gelu" => Gelu::Erf,
        "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Gelu::Tanh,
        other => {
            return Err(ModelError::invalid(
                cfg.path(),
                format!(
                    "hidden_act '{other}' is not supported (gelu, gelu_new, gelu_pytorch_tanh)"
                ),
            ))
        }
    };
    let names = Names {
        word: format!("{prefix}embeddings.word_embeddings.weight"),
        position: format!("{prefix}embeddings.position_embeddings.weight"),
        token_type: format!("{prefix}embeddings.token_type_embeddings.weight"),
        embed_norm: format!("{prefix}embeddings.LayerNorm"),
        layer: HF_LAYER,
    };
    let (pooling, normalize) = sentence_transformers_head(dir)?;
    let source = ModelSource::HfDir {
        dir: dir.to_path_buf(),
    };
    build(
        &loader, &names, prefix, shape, gelu, pooling, normalize, source, arch,
    )
}

fn load_gguf(path: &Path) -> Result<Encoder> {
    from_gguf(path, Gguf::open(path)?)
}

/// The encoder of a parsed GGUF file (`path` names it in errors).
pub fn from_gguf(path: &Path, gguf: Gguf) -> Result<Encoder> {
    let Gguf {
        metadata, tensors, ..
    } = gguf;
    let arch = metadata.str("general.architecture")?.to_string();
    if !is_encoder_arch(&arch) {
        return Err(not_encoder(path, &arch));
    }
    let k = |s: &str| format!("{arch}.{s}");
    let shape = Shape {
        hidden: metadata.positive(&k("embedding_length"))?,
        n_heads: metadata.positive(&k("attention.head_count"))?,
        ffn: metadata.positive(&k("feed_forward_length"))?,
        n_layers: metadata.positive(&k("block_count"))?,
        max_positions: metadata.positive(&k("context_length"))?,
        eps: metadata
            .f32_opt(&k("attention.layer_norm_epsilon"))?
            .unwrap_or(1e-12),
    };
    // llama.cpp's pooling types: 0 none, 1 mean, 2 cls, 3 last, 4 rank.
    let pooling = match metadata.usize_opt(&k("pooling_type"))? {
        None | Some(1) => Pooling::Mean,
        Some(2) => Pooling::Cls,
        Some(3) => Pooling::Last,
        Some(other) => {
            return Err(ModelError::invalid(
                path,
                format!(
                    "{}: pooling type {other} is not supported (1 mean, 2 cls, 3 last)",
                    k("pooling_type")
                ),
            ))
        }
    };
    let loader = TensorLoader::new(tensors);
    let names = Names {
        word: "token_embd.weight".into(),
        position: "position_embd.weight".into(),
        token_type: "token_types.weight".into(),
        embed_norm: "token_embd_norm".into(),
        layer: GGUF_LAYER,
    };
    let source = ModelSource::Gguf {
        path: path.to_path_buf(),
        metadata: Box::new(metadata),
    };
    // GGUF keeps no normalisation setting; llama.cpp's embeddings are unit length by default.
    build(
        &loader,
        &names,
        "",
        shape,
        Gelu::Erf,
        pooling,
        true,
        source,
        arch,
    )
}

#[allow(clippy::too_many_arguments)]
fn build(
    loader: &TensorLoader,
    names: &Names,
    prefix: &str,
    s: Shape,
    gelu: Gelu,
    pooling: Pooling,
    normalize: bool,
    source: ModelSource,
    arch: String,
) -> Result<Encoder> {
    let path = loader.path().to_path_buf();
    if !s.hidden.is_multiple_of(s.n_heads) {
        return Err(ModelError::invalid(
            &path,
            format!("{} heads do not divide a width of {}", s.n_heads, s.hidden),
        ));
    }
    if s.n_layers > loader.n_tensors() {
        return Err(ModelError::invalid(
            &path,
            format!(
                "{} layers but the weights hold only {} tensors",
                s.n_layers,
                loader.n_tensors()
            ),
        ));
    }
    let word = loader.require(&names.word)?;
    let vocab_size = word.shape.first().copied().unwrap_or(0);
    let word = loader.matrix(&names.word, vocab_size, s.hidden)?;
    let positions = loader.matrix(&names.position, s.max_positions, s.hidden)?;
    let mut position = positions.to_f32()?;
    if loader.has(&names.token_type) {
        let t = loader.require(&names.token_type)?;
        let types = t.shape.first().copied().unwrap_or(0);
        let first = loader.matrix(&names.token_type, types, s.hidden)?;
        let mut row = vec![0f32; s.hidden];
        first.dequantize_row(0, &mut row)?;
        for p in position.chunks_exact_mut(s.hidden) {
            p.iter_mut().zip(&row).for_each(|(a, b)| *a += b);
        }
    }
    let norm = |name: &str| {
        loader.norm(
            &format!("{name}.weight"),
            s.hidden,
            NormKind::Layer,
            s.eps,
            false,
            Some(&format!("{name}.bias")),
        )
    };
    let embed_norm = norm(&names.embed_norm)?;
    let mut layers = Vec::with_capacity(s.n_layers);
    for i in 0..s.n_layers {
        let n: Vec<String> = (names.layer.iter())
            .map(|t| format!("{prefix}{}", t.replace("{i}", &i.to_string())))
            .collect();
        let lin = |name: &str, out: usize, inp: usize| {
            loader.linear(
                &format!("{name}.weight"),
                out,
                inp,
                Some(&format!("{name}.bias")),
            )
        };
        let h = s.hidden;
        layers.push(EncoderLayer {
            q: lin(&n[0], h, h)?,
            k: lin(&n[1], h, h)?,
            v: lin(&n[2], h, h)?,
            o: lin(&n[3], h, h)?,
            attn_norm: norm(&n[4])?,
            up: lin(&n[5], s.ffn, h)?,
            down: lin(&n[6], h, s.ffn)?,
            ffn_norm: norm(&n[7])?,
        });
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().trim_end_matches(".gguf").to_string())
        .unwrap_or_else(|| "encoder".into());
    let name = match &source {
        ModelSource::HfDir { dir } => dir
            .file_name()
            .map_or(name, |n| n.to_string_lossy().into_owned()),
        ModelSource::Gguf { .. } => name,
    };
    Ok(Encoder {
        name,
        source,
        arch,
        hidden: s.hidden,
        n_heads: s.n_heads,
        vocab_size,
        max_positions: s.max_positions,
        gelu,
        word,
        position,
        embed_norm,
        layers,
        pooling,
        normalize,
    })
}

/// sentence-transformers' modules (modules.json): the Pooling module's mode and whether a
/// Normalize module follows. Without modules.json: mean pooling, unit length.
fn sentence_transformers_head(dir: &Path) -> Result<(Pooling, bool)> {
    Ok(configured_pooling_hf(dir)?.unwrap_or((Pooling::Mean, true)))
}

/// The pooling a model's own configuration names: sentence-transformers' modules.json in a
/// Hugging Face directory (with whether it normalises), or a GGUF file's `<arch>.pooling_type`
/// (llama.cpp's: 1 mean, 2 cls, 3 last; unit length). None when it names none.
pub fn configured_pooling(source: &ModelSource) -> Result<Option<(Pooling, bool)>> {
    match source {
        ModelSource::HfDir { dir } => configured_pooling_hf(dir),
        ModelSource::Gguf { path, metadata } => {
            let Some(arch) = metadata.str_opt("general.architecture")? else {
                return Ok(None);
            };
            let key = format!("{arch}.pooling_type");
            Ok(match metadata.usize_opt(&key)? {
                None | Some(0) => None,
                Some(1) => Some((Pooling::Mean, true)),
                Some(2) => Some((Pooling::Cls, true)),
                Some(3) => Some((Pooling::Last, true)),
                Some(other) => {
                    return Err(ModelError::invalid(
                        path,
                        format!(
                            "{key}: pooling type {other} is not supported (1 mean, 2 cls, 3 last)"
                        ),
                    ))
                }
            })
        }
    }
}

fn configured_pooling_hf(dir: &Path) -> Result<Option<(Pooling, bool)>> {
    let modules_path = dir.join("modules.json");
    let Ok(text) = std::fs::read_to_string(&modules_path) else {
        return Ok(None);
    };
    let bad = |msg: String| ModelError::invalid(&modules_path, msg);
    let modules: Vec<serde_json::Value> =
        serde_json::from_str(&text).map_err(|e| bad(format!("not a module list: {e}")))?;
    let kind = |m: &serde_json::Value| m["type"].as_str().unwrap_or("").to_string();
    let normalize = modules.iter().any(|m| kind(m).ends_with("Normalize"));
    let Some(pool) = modules.iter().find(|m| kind(m).ends_with("Pooling")) else {
        return Ok(Some((Pooling::Mean, normalize)));
    };
    let pool_dir = dir.join(pool["path"].as_str().unwrap_or(""));
    let config_path = pool_dir.join("config.json");
    let cfg: serde_json::Value = std::fs::read_to_string(&config_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .ok_or_else(|| {
            ModelError::invalid(
                &config_path,
                "the Pooling module's config.json is missing or not JSON",
            )
        })?;
    let flag = |k: &str| cfg[k].as_bool().unwrap_or(false);
    let pooling = match cfg["pooling_mode"].as_str() {
        Some("mean") => Pooling::Mean,
        Some("cls") => Pooling::Cls,
        Some("lasttoken") => Pooling::Last,
        Some(other) => {
            return Err(ModelError::invalid(
                &config_path,
                format!("pooling_mode '{other}' is not supported (mean, cls, lasttoken)"),
            ))
        }
        None if flag("pooling_mode_mean_tokens") => Pooling::Mean,
        None if flag("pooling_mode_cls_token") => Pooling::Cls,
        None if flag("pooling_mode_lasttoken") => Pooling::Last,
        None => {
            return Err(ModelError::invalid(
                &config_path,
                "no supported pooling mode is set (mean, cls, lasttoken)",
            ))
        }
    };
    Ok(Some((pooling, normalize)))
}

fn not_encoder(path: &Path, arch: &str) -> ModelError {
    ModelError::invalid(
        path,
        format!(
            "'{arch}' is not an encoder (embedding) architecture (encoders: {})",
            ENCODER_ARCHS.join(", ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_takes_the_named_rows() {
        let h = [1.0, 2.0, 3.0, 6.0, 5.0, 10.0];
        assert_eq!(pool(&h, 2, Pooling::Cls, false), [1.0, 2.0]);
        assert_eq!(pool(&h, 2, Pooling::Last, false), [5.0, 10.0]);
        assert_eq!(pool(&h, 2, Pooling::Mean, false), [3.0, 6.0]);
        let u = pool(&h, 2, Pooling::Mean, true);
        assert!((u[0] - 0.447_213_6).abs() < 1e-6 && (u[1] - 0.894_427_2).abs() < 1e-6);
        assert_eq!(pool(&[0.0, 0.0], 2, Pooling::Mean, true), [0.0, 0.0]);
        assert_eq!("cls".parse::<Pooling>(), Ok(Pooling::Cls));
        assert!("max".parse::<Pooling>().is_err());
    }
}
