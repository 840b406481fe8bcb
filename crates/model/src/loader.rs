//! Reading weights out of a TensorStore by name, with the checks every family needs: presence,
//! shape, conversion of small vectors to f32, and norm construction.

use std::path::Path;
use std::sync::Arc;

use anelm_formats::TensorStore;

use crate::error::{ModelError, Result};
use crate::plan::{Linear, Norm, NormKind};
use crate::weight::Weight;

pub(crate) struct TensorLoader {
    pub store: Arc<TensorStore>,
    /// Multimodal checkpoints (`*ForConditionalGeneration`) keep the text model's tensors under
    /// `model.language_model.` where text-only ones use `model.`.
    language_model_prefix: bool,
}

const LM_PREFIX: &str = "model.language_model.";

impl TensorLoader {
    pub fn new(store: TensorStore) -> Self {
        let language_model_prefix = store.infos().iter().any(|t| t.name.starts_with(LM_PREFIX));
        TensorLoader {
            store: Arc::new(store),
            language_model_prefix,
        }
    }

    /// How many tensors the files hold (each layer needs at least one).
    pub fn n_tensors(&self) -> usize {
        self.store.len()
    }

    /// The stored name of tensor `name` (given in the text-only convention).
    fn stored<'a>(&self, name: &'a str) -> std::borrow::Cow<'a, str> {
        match name.strip_prefix("model.") {
            Some(rest) if self.language_model_prefix => format!("{LM_PREFIX}{rest}").into(),
            _ => name.into(),
        }
    }

    /// The tensor `name`, or an error naming the file and the missing tensor.
    pub fn require(&self, name: &str) -> Result<anelm_formats::Tensor<'_>> {
        Ok(self.store.require(&self.stored(name))?)
    }

    pub fn path(&self) -> &Path {
        self.store.primary_path()
    }

    pub fn has(&self, name: &str) -> bool {
        self.store.contains(&self.stored(name))
    }

    /// A `[rows, cols]` matrix, checked against the expected shape.
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Weight> {
        let t = self.require(name)?;
        let w = Weight::mapped(&self.store, &t)?;
        if (w.rows, w.cols) != (rows, cols) || t.shape.len() != 2 {
            return Err(ModelError::shape(
                t.file,
                name,
                format!("shape {:?}, expected [{rows}, {cols}]", t.shape),
            ));
        }
        Ok(w)
    }

    /// The `n` matrices `[rows, cols]` stacked in the 3-D tensor `name` (`[n, rows, cols]`, as
    /// llama.cpp merges experts), each a view of the same bytes.
    pub fn stacked(&self, name: &str, n: usize, rows: usize, cols: usize) -> Result<Vec<Weight>> {
        let t = self.require(name)?;
        if t.shape != [n, rows, cols] {
            return Err(ModelError::shape(
                t.file,
                name,
                format!("shape {:?}, expected [{n}, {rows}, {cols}]", t.shape),
            ));
        }
        let all = Weight::mapped_flat(&self.store, &t)?;
        Ok((0..n)
            .map(|e| all.slice_rows(&format!("{name}[{e}]"), e * rows, rows))
            .collect())
    }

    /// A vector of `n` values as f32.
    pub fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>> {
        let t = self.require(name)?;
        if t.n_elems() != n {
            return Err(ModelError::shape(
                t.file,
                name,
                format!("shape {:?}, expected {n} values", t.shape),
            ));
        }
        Ok(t.to_f32()?)
    }

    pub fn vector_opt(&self, name: &str, n: usize) -> Result<Option<Vec<f32>>> {
        if self.has(name) {
            self.vector(name, n).map(Some)
        } else {
            Ok(None)
        }
    }

    /// A linear layer `[out, in]` with an optional bias `bias_name`.
    pub fn linear(
        &self,
        name: &str,
        out: usize,
        inp: usize,
        bias_name: Option<&str>,
    ) -> Result<Linear> {
        let weight = self.matrix(name, out, inp)?;
        let bias = match bias_name {
            Some(b) => self.vector_opt(b, out)?,
            None => None,
        };
        Ok(Linear { weight, bias })
    }

    /// A norm of width `n`; `plus_one` adds 1 to the stored weight (HF Gemma's `(1 + w)`).
    pub fn norm(
        &self,
        name: &str,
        n: usize,
        kind: NormKind,
        eps: f32,
        plus_one: bool,
        bias: Option<&str>,
    ) -> Result<Norm> {
        let mut weight = self.vector(name, n)?;
        if plus_one {
            weight.iter_mut().for_each(|w| *w += 1.0);
        }
        let bias = match bias {
            Some(b) => Some(self.vector(b, n)?),
            None => None,
        };
        Ok(Norm {
            kind,
            eps,
            weight,
            bias,
        })
    }
}
