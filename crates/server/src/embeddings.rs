//! `POST /v1/embeddings` (OpenAI's shape). A chat model's: each input's final-normed hidden
//! states pooled (mean over its tokens, its last token, or its first — CLS, as `serve
//! --pooling` says) and scaled to unit length, the pass run on the engine thread between decode
//! steps ([`EmbedJob`]) on a fresh state, so embeddings never touch a conversation's cache. An
//! embedding model's ([`crate::embedder`]): its own tokenizer pipeline, pooling and
//! normalisation.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::app::App;
use crate::embedder::Embedder;
use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::models::{Models, Served};
use anelm_model::Executor;

pub use anelm_model::encoder::Pooling;

/// Pools `hidden` (`n` token-major rows of `h`) and scales the result to unit length.
pub fn pool(hidden: &[f32], h: usize, pooling: Pooling) -> Vec<f32> {
    anelm_model::encoder::pool(hidden, h, pooling, true)
}

/// Inputs to embed, and where their vectors go.
pub struct EmbedJob {
    pub inputs: Vec<Vec<u32>>,
    pub pooling: Pooling,
    pub reply: oneshot::Sender<Result<Vec<Vec<f32>>, String>>,
}

impl EmbedJob {
    /// Runs every input on a fresh state of `exec` (on the engine thread).
    pub fn run(self, exec: &mut dyn Executor) {
        let mut out = Vec::new();
        let mut vectors = Vec::with_capacity(self.inputs.len());
        for ids in &self.inputs {
            let result = exec
                .new_state(ids.len())
                .and_then(|mut state| exec.hidden_states(state.as_mut(), ids, &mut out));
            if let Err(e) = result {
                let _ = self.reply.send(Err(e.to_string()));
                return;
            }
            let h = out.len() / ids.len();
            vectors.push(pool(&out, h, self.pooling));
        }
        let _ = self.reply.send(Ok(vectors));
    }
}

#[derive(Debug, Deserialize)]
pub struct EmbeddingsRequest {
    model: String,
    input: Value,
    encoding_format: Option<String>,
    dimensions: Option<i64>,
    /// The rest (`user`, …), ignored.
    #[serde(flatten)]
    _rest: serde_json::Map<String, Value>,
}

/// Most inputs per request.
pub const MAX_INPUTS: usize = 256;

/// `input` as OpenAI takes it: a string, a list of strings, a list of token ids, or a list of
/// such lists.
pub(crate) fn inputs(input: Value) -> Result<Vec<Result<String, Vec<u32>>>, ApiError> {
    let bad = |m: &str| ApiError::bad_param("input", m);
    let ids = |v: &Value| -> Option<Vec<u32>> {
        v.as_array()?
            .iter()
            .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect()
    };
    let items = match input {
        Value::String(s) => vec![Ok(s)],
        Value::Array(a) if a.is_empty() => return Err(bad("input must not be empty")),
        Value::Array(a) if a.iter().all(Value::is_number) => {
            vec![Err(
                ids(&Value::Array(a)).ok_or_else(|| bad("token ids must be integers"))?
            )]
        }
        Value::Array(a) => a
            .into_iter()
            .map(|v| match v {
                Value::String(s) => Ok(Ok(s)),
                Value::Array(_) => ids(&v)
                    .map(Err)
                    .ok_or_else(|| bad("token ids must be integers")),
                _ => Err(bad("each input is a string or a list of token ids")),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(bad("input is a string, a list of strings or token ids")),
    };
    if items.len() > MAX_INPUTS {
        return Err(bad(&format!("at most {MAX_INPUTS} inputs per request")));
    }
    Ok(items)
}

/// `POST /v1/embeddings`.
pub async fn handle(
    State(models): State<Arc<Models>>,
    JsonBody(req): JsonBody<EmbeddingsRequest>,
) -> Result<Json<Value>, ApiError> {
    let served = models.get_served(&req.model).await?;
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::bad_param(
                "encoding_format",
                format!("encoding_format '{other}': use float or base64"),
            ))
        }
    };
    if let Some(d) = req.dimensions {
        return Err(ApiError::bad_param(
            "dimensions",
            format!("dimensions {d}: this model's embeddings have a fixed size"),
        ));
    }
    let items = inputs(req.input)?;
    let (vectors, tokens) = match &served {
        Served::Chat(app) => embed_with_decoder(app, items).await?,
        Served::Embed(m) => embed_with_encoder(m, items).await?,
    };
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(index, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Value::String(base64::engine::general_purpose::STANDARD.encode(&bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": served.id(),
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })))
}

/// A chat model's embeddings: each input through the engine thread's pass without the head,
/// pooled as `serve --pooling` says. Returns the vectors and the tokens read.
async fn embed_with_decoder(
    app: &Arc<App>,
    items: Vec<Result<String, Vec<u32>>>,
) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    let mut ids = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        let prompt = match item {
            Ok(text) => app.tokenize_text(text).await?,
            Err(tokens) => app.model.id_prompt(tokens)?,
        };
        check_length(i, prompt.len(), app.model.ctx)?;
        ids.push(prompt);
    }
    let tokens: usize = ids.iter().map(Vec::len).sum();
    let (reply, rx) = oneshot::channel();
    app.scheduler
        .embed(EmbedJob {
            inputs: ids,
            pooling: app.pooling,
            reply,
        })
        .map_err(|_| ApiError::busy())?;
    let vectors = rx
        .await
        .map_err(|_| ApiError::internal("the engine stopped"))?
        .map_err(|e| ApiError::bad_request(format!("embeddings: {e}")))?;
    Ok((vectors, tokens))
}

/// An embedding model's: its own tokenizer pipeline and pooling, on a blocking thread.
async fn embed_with_encoder(
    m: &Arc<Embedder>,
    items: Vec<Result<String, Vec<u32>>>,
) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    let m = m.clone();
    tokio::task::spawn_blocking(move || {
        let mut ids = Vec::new();
        for (i, item) in items.into_iter().enumerate() {
            let prompt = match item {
                Ok(text) => m.tokens(&text)?,
                Err(tokens) => {
                    if let Some(bad) = tokens.iter().find(|&&t| t as usize >= m.vocab_size) {
                        return Err(ApiError::bad_param(
                            "input",
                            format!(
                                "token id {bad} is outside the vocabulary (size {})",
                                m.vocab_size
                            ),
                        ));
                    }
                    tokens
                }
            };
            check_length(i, prompt.len(), m.max_positions)?;
            ids.push(prompt);
        }
        let tokens = ids.iter().map(Vec::len).sum();
        let vectors = m
            .embed(&ids)
            .map_err(|e| ApiError::bad_request(format!("embeddings: {e}")))?;
        Ok((vectors, tokens))
    })
    .await
    .map_err(|e| ApiError::internal(format!("embedding failed: {e}")))?
}

/// An input has at least one token and fits the model.
fn check_length(i: usize, n: usize, limit: usize) -> Result<(), ApiError> {
    if n == 0 {
        return Err(ApiError::bad_param(
            &format!("input[{i}]"),
            "an input must have at least one token",
        ));
    }
    if n > limit {
        return Err(ApiError::context_exceeded("input", n, limit));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_and_unit_length() {
        let hidden = [3.0, 0.0, 0.0, 4.0];
        assert_eq!(pool(&hidden, 2, Pooling::Cls), [1.0, 0.0]);
        assert_eq!(pool(&hidden, 2, Pooling::Last), [0.0, 1.0]);
        assert_eq!(pool(&hidden, 2, Pooling::Mean), [0.6, 0.8]);
    }

    #[test]
    fn inputs_in_every_shape() {
        assert_eq!(inputs(json!("a")).unwrap().len(), 1);
        assert_eq!(inputs(json!(["a", "b"])).unwrap().len(), 2);
        assert!(matches!(&inputs(json!([1, 2, 3])).unwrap()[0], Err(ids) if ids == &[1, 2, 3]));
        assert_eq!(inputs(json!([[1, 2], [3]])).unwrap().len(), 2);
        for bad in [
            json!([]),
            json!(3),
            json!([1.5]),
            json!([{"a": 1}]),
            json!([[-1]]),
        ] {
            assert!(inputs(bad.clone()).is_err(), "{bad}");
        }
    }
}
