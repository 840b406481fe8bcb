//! `POST /v1/embeddings` (OpenAI's shape): each input's final-normed hidden states pooled
//! (mean over its tokens, its last token, or its first — CLS) and scaled to unit length. The
//! pass runs on the engine thread between decode steps ([`EmbedJob`]), each input on a fresh
//! state, so embeddings never touch a conversation's cache.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::models::Models;
use anelm_model::Executor;

/// How the hidden states of an input's tokens become one vector.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over every token (llama.cpp's default for a model that names none).
    #[default]
    Mean,
    /// The last token (decoder embedding models: e5-mistral, Qwen3-Embedding).
    Last,
    /// The first token (BERT's CLS).
    Cls,
}

impl std::str::FromStr for Pooling {
    type Err = String;
    fn from_str(s: &str) -> Result<Pooling, String> {
        match s {
            "mean" => Ok(Pooling::Mean),
            "last" => Ok(Pooling::Last),
            "cls" => Ok(Pooling::Cls),
            other => Err(format!("pooling '{other}': use mean, last or cls")),
        }
    }
}

/// Pools `hidden` (`n` token-major rows of `h`) and scales the result to unit length.
pub fn pool(hidden: &[f32], h: usize, pooling: Pooling) -> Vec<f32> {
    let n = hidden.len() / h;
    let mut v = match pooling {
        Pooling::Cls => hidden[..h].to_vec(),
        Pooling::Last => hidden[(n - 1) * h..].to_vec(),
        Pooling::Mean => {
            let mut sum = vec![0f64; h];
            for row in hidden.chunks_exact(h) {
                sum.iter_mut().zip(row).for_each(|(s, &x)| *s += x as f64);
            }
            sum.iter().map(|s| (s / n as f64) as f32).collect()
        }
    };
    let norm = v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
    }
    v
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
    let app = models.get(&req.model).await?;
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
    let mut ids = Vec::new();
    for (i, item) in inputs(req.input)?.into_iter().enumerate() {
        let prompt = match item {
            Ok(text) => app.tokenize_text(text).await?,
            Err(tokens) => app.model.id_prompt(tokens)?,
        };
        if prompt.is_empty() {
            return Err(ApiError::bad_param(
                &format!("input[{i}]"),
                "an input must have at least one token",
            ));
        }
        if prompt.len() > app.model.ctx {
            return Err(ApiError::context_exceeded(
                "input",
                prompt.len(),
                app.model.ctx,
            ));
        }
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
        "model": app.model.id,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })))
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
