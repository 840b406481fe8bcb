//! A model with everything needed to talk to it: the weights and plan, the tokenizer.

use std::path::Path;
use std::sync::Arc;

use anelm_model::{Model, ModelSource};
use anelm_tokenize::Tokenizer;

/// A loaded model and its tokenizer (absent for HF directories without tokenizer.json).
pub struct LoadedModel {
    pub model: Arc<Model>,
    pub tokenizer: Option<Arc<Tokenizer>>,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Model(#[from] anelm_model::ModelError),
    #[error(transparent)]
    Tokenizer(#[from] anelm_tokenize::TokenizeError),
}

impl LoadedModel {
    pub fn load(path: &Path) -> Result<LoadedModel, LoadError> {
        let model = anelm_model::load(path)?;
        let tokenizer = match &model.source {
            ModelSource::Gguf { metadata, .. } => Some(Tokenizer::from_gguf(metadata)?),
            ModelSource::HfDir { dir } if dir.join("tokenizer.json").exists() => Some(Tokenizer::from_hf_dir(dir)?),
            ModelSource::HfDir { .. } => None,
        };
        Ok(LoadedModel { model: Arc::new(model), tokenizer: tokenizer.map(Arc::new) })
    }
}
