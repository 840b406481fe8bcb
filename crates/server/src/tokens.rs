//! `POST /tokenize` and `POST /detokenize` in llama-server's shapes, so its clients (and scripts
//! that count tokens) work unchanged: `content` (text, or an array of texts and ids),
//! `add_special`, `parse_special`, `with_pieces` -> `tokens`; `tokens` -> `content`.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::models::Models;
use anelm_tokenize::Tokenizer;

/// Text, or an array of texts and token ids (llama-server's "mixed" prompt).
#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Mixed(Vec<Part>),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Part {
    Id(u32),
    Text(String),
}

#[derive(Deserialize)]
pub struct TokenizeRequest {
    content: Content,
    /// Add BOS (and EOS) as the model's tokenizer settings say; only before a leading text.
    #[serde(default)]
    add_special: bool,
    /// Turn the text of special tokens into those tokens.
    #[serde(default = "yes")]
    parse_special: bool,
    /// Return `{id, piece}` objects instead of bare ids.
    #[serde(default)]
    with_pieces: bool,
    /// Whose tokenizer (default: the server's first model).
    #[serde(default)]
    model: Option<String>,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
pub struct DetokenizeRequest {
    tokens: Vec<u32>,
    #[serde(default)]
    model: Option<String>,
}

pub async fn tokenize(
    State(models): State<Arc<Models>>,
    JsonBody(req): JsonBody<TokenizeRequest>,
) -> Result<Json<Value>, ApiError> {
    let tok = models
        .get_or_default(req.model.as_deref())
        .await?
        .tokenizer()
        .clone();
    let with_pieces = req.with_pieces;
    let t = tok.clone();
    // Tokenizing a long text takes a while: off the async threads.
    let ids = tokio::task::spawn_blocking(move || ids_of(&t, &req))
        .await
        .map_err(|e| ApiError::internal(format!("tokenizing failed: {e}")))??;
    let tokens: Vec<Value> = if with_pieces {
        ids.iter()
            .map(|&id| json!({"id": id, "piece": piece_json(&tok, id)}))
            .collect()
    } else {
        ids.iter().map(|&id| json!(id)).collect()
    };
    Ok(Json(json!({ "tokens": tokens })))
}

pub async fn detokenize(
    State(models): State<Arc<Models>>,
    JsonBody(req): JsonBody<DetokenizeRequest>,
) -> Result<Json<Value>, ApiError> {
    let served = models.get_or_default(req.model.as_deref()).await?;
    let tok = served.tokenizer();
    check_ids(tok, &req.tokens, "tokens")?;
    let bytes: Vec<u8> = (req.tokens.iter())
        .flat_map(|&id| tok.token_to_piece(id))
        .collect();
    Ok(Json(json!({ "content": String::from_utf8_lossy(&bytes) })))
}

fn ids_of(tok: &Tokenizer, req: &TokenizeRequest) -> Result<Vec<u32>, ApiError> {
    let encode = |text: &str, add_special: bool| {
        tok.encode(text, add_special, req.parse_special)
            .map_err(|e| ApiError::bad_param("content", e.to_string()))
    };
    match &req.content {
        Content::Text(text) => encode(text, req.add_special),
        Content::Mixed(parts) => {
            let mut ids = Vec::new();
            for (i, part) in parts.iter().enumerate() {
                match part {
                    Part::Text(text) => ids.extend(encode(text, req.add_special && i == 0)?),
                    Part::Id(id) => ids.push(*id),
                }
            }
            check_ids(tok, &ids, "content")?;
            Ok(ids)
        }
    }
}

/// Every id must be in the vocabulary.
fn check_ids(tok: &Tokenizer, ids: &[u32], param: &str) -> Result<(), ApiError> {
    let n = tok.vocab_size();
    match ids.iter().find(|&&id| id as usize >= n) {
        Some(bad) => Err(ApiError::bad_param(
            param,
            format!("Token id {bad} is outside the vocabulary (size {n})"),
        )),
        None => Ok(()),
    }
}

/// A piece as text when it is valid UTF-8, else as its byte values (llama-server's rule).
fn piece_json(tok: &Tokenizer, id: u32) -> Value {
    let bytes = tok.token_to_piece(id);
    match String::from_utf8(bytes) {
        Ok(text) => json!(text),
        Err(e) => json!(e.into_bytes()),
    }
}
