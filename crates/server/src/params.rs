//! Request fields shared by the APIs, checked and turned into the engine's parameters. Every
//! bad value is a 400 naming the field.

use std::collections::HashMap;

use anelm_engine::{GenerateParams, SamplingParams};
use serde::Deserialize;

use crate::error::ApiError;
use crate::limits::Limits;

/// OpenAI's sampling fields, with llama.cpp's extras (`top_k`, `min_p`, `repeat_penalty`).
/// Absent fields keep llama.cpp's defaults.
#[derive(Debug, Default, Deserialize)]
pub struct Sampling {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub seed: Option<i64>,
    /// Token id (as a string) to a bias in [-100, 100]; -100 bans the token.
    pub logit_bias: Option<HashMap<String, f32>>,
}

/// One stop string or several.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    /// How many stop strings `stop` holds.
    pub fn count(stop: &Option<Stop>) -> usize {
        match stop {
            None => 0,
            Some(Stop::One(_)) => 1,
            Some(Stop::Many(v)) => v.len(),
        }
    }

    pub fn into_vec(stop: Option<Stop>) -> Vec<String> {
        match stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s],
            Some(Stop::Many(v)) => v,
        }
    }
}

impl Sampling {
    /// The engine's sampling parameters; `max_temperature` is the API's bound (2 for OpenAI,
    /// 1 for Anthropic).
    pub fn to_params(
        &self,
        limits: &Limits,
        vocab: usize,
        max_temperature: f32,
    ) -> Result<SamplingParams, ApiError> {
        if let Some(bias) = &self.logit_bias {
            limits.logit_bias(bias.len())?;
        }
        let mut p = SamplingParams::default();
        if let Some(t) = self.temperature {
            in_range("temperature", t, 0.0, max_temperature)?;
            p.temperature = t;
        }
        if let Some(v) = self.top_p {
            if !(v > 0.0 && v <= 1.0) {
                return Err(ApiError::bad_param(
                    "top_p",
                    format!("top_p must be in (0, 1], got {v}"),
                ));
            }
            p.top_p = v;
        }
        if let Some(k) = self.top_k {
            p.top_k = usize::try_from(k).map_err(|_| {
                ApiError::bad_param("top_k", format!("top_k must be >= 0, got {k}"))
            })?;
        }
        if let Some(v) = self.min_p {
            in_range("min_p", v, 0.0, 1.0)?;
            p.min_p = v;
        }
        if let Some(v) = self.presence_penalty {
            in_range("presence_penalty", v, -2.0, 2.0)?;
            p.presence_penalty = v;
        }
        if let Some(v) = self.frequency_penalty {
            in_range("frequency_penalty", v, -2.0, 2.0)?;
            p.frequency_penalty = v;
        }
        if let Some(v) = self.repeat_penalty {
            if !(v.is_finite() && v > 0.0) {
                return Err(ApiError::bad_param(
                    "repeat_penalty",
                    format!("repeat_penalty must be > 0, got {v}"),
                ));
            }
            p.repeat_penalty = v;
        }
        // A negative seed is as good a seed as any: keep its bits.
        p.seed = self.seed.map(|s| s as u64);
        if let Some(bias) = &self.logit_bias {
            p.logit_bias = logit_bias(bias, vocab)?;
        }
        Ok(p)
    }
}

fn in_range(name: &str, v: f32, lo: f32, hi: f32) -> Result<(), ApiError> {
    if v.is_finite() && (lo..=hi).contains(&v) {
        Ok(())
    } else {
        Err(ApiError::bad_param(
            name,
            format!("{name} must be in [{lo}, {hi}], got {v}"),
        ))
    }
}

fn logit_bias(bias: &HashMap<String, f32>, vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let mut out: Vec<(u32, f32)> = bias
        .iter()
        .map(|(key, &b)| {
            let id: u32 = key.trim().parse().map_err(|_| {
                ApiError::bad_param(
                    "logit_bias",
                    format!("logit_bias keys are token ids, got '{key}'"),
                )
            })?;
            if id as usize >= vocab {
                return Err(ApiError::bad_param(
                    "logit_bias",
                    format!("logit_bias: token id {id} is outside the vocabulary (size {vocab})"),
                ));
            }
            in_range("logit_bias", b, -100.0, 100.0)?;
            // OpenAI: -100 bans the token outright.
            Ok((id, if b <= -100.0 { f32::NEG_INFINITY } else { b }))
        })
        .collect::<Result<_, _>>()?;
    out.sort_by_key(|&(id, _)| id);
    Ok(out)
}

/// The most tokens to generate: the request's (at least 1), else what the context leaves,
/// and never more than the context leaves (the rest of a long answer ends with `length`).
pub fn max_tokens(
    name: &str,
    requested: Option<i64>,
    prompt_tokens: usize,
    ctx: usize,
) -> Result<usize, ApiError> {
    let room = ctx.saturating_sub(prompt_tokens).max(1);
    match requested {
        None => Ok(room),
        Some(n) if n < 1 => Err(ApiError::bad_param(
            name,
            format!("{name} must be at least 1, got {n}"),
        )),
        Some(n) => Ok(usize::try_from(n).unwrap_or(usize::MAX).min(room)),
    }
}

/// `n` copies of the parameters (`n` within the server's limit); with a seed, choice `i` draws
/// with seed + i, so the choices differ but the whole answer is reproducible.
pub fn choices(
    limits: &Limits,
    n: Option<i64>,
    params: GenerateParams,
) -> Result<Vec<GenerateParams>, ApiError> {
    let n = limits.choices(n)?;
    Ok((0..n as u64)
        .map(|i| {
            let mut p = params.clone();
            p.sampling.seed = p.sampling.seed.map(|s| s.wrapping_add(i));
            p
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_checked_and_named() {
        let bad = [
            (
                Sampling {
                    temperature: Some(2.5),
                    ..Default::default()
                },
                "temperature",
            ),
            (
                Sampling {
                    top_p: Some(0.0),
                    ..Default::default()
                },
                "top_p",
            ),
            (
                Sampling {
                    presence_penalty: Some(-3.0),
                    ..Default::default()
                },
                "presence_penalty",
            ),
            (
                Sampling {
                    top_k: Some(-1),
                    ..Default::default()
                },
                "top_k",
            ),
            (
                Sampling {
                    temperature: Some(f32::NAN),
                    ..Default::default()
                },
                "temperature",
            ),
        ];
        for (s, name) in bad {
            let e = s.to_params(&Limits::default(), 100, 2.0).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(name), "{}", e.message);
        }
        let anthropic = Sampling {
            temperature: Some(1.5),
            ..Default::default()
        };
        assert!(anthropic.to_params(&Limits::default(), 100, 1.0).is_err());
        assert!(anthropic.to_params(&Limits::default(), 100, 2.0).is_ok());
    }

    #[test]
    fn logit_bias_keys_are_token_ids_in_the_vocabulary() {
        let bias = |pairs: &[(&str, f32)]| Sampling {
            logit_bias: Some(pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()),
            ..Default::default()
        };
        let p = bias(&[("7", 5.0), ("3", -100.0)])
            .to_params(&Limits::default(), 10, 2.0)
            .unwrap();
        assert_eq!(p.logit_bias, vec![(3, f32::NEG_INFINITY), (7, 5.0)]);
        for bad in [
            bias(&[("x", 1.0)]),
            bias(&[("10", 1.0)]),
            bias(&[("1", 101.0)]),
        ] {
            assert_eq!(
                bad.to_params(&Limits::default(), 10, 2.0)
                    .unwrap_err()
                    .param
                    .as_deref(),
                Some("logit_bias")
            );
        }
        let one = Limits {
            max_logit_bias: 1,
            ..Limits::default()
        };
        let e = bias(&[("1", 1.0), ("2", 1.0)])
            .to_params(&one, 10, 2.0)
            .unwrap_err();
        assert!(e.message.contains("--max-logit-bias"), "{}", e.message);
    }

    #[test]
    fn max_tokens_is_positive_and_fits_the_context() {
        assert_eq!(max_tokens("max_tokens", None, 100, 4096).unwrap(), 3996);
        assert_eq!(max_tokens("max_tokens", Some(10), 100, 4096).unwrap(), 10);
        assert_eq!(
            max_tokens("max_tokens", Some(10_000), 100, 4096).unwrap(),
            3996
        );
        for n in [0, -5] {
            let e = max_tokens("max_tokens", Some(n), 100, 4096).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("max_tokens"));
        }
    }

    #[test]
    fn choices_get_consecutive_seeds() {
        let mut p = GenerateParams::default();
        p.sampling.seed = Some(41);
        let l = Limits::default();
        let c = choices(&l, Some(3), p).unwrap();
        let seeds: Vec<_> = c.iter().map(|p| p.sampling.seed).collect();
        assert_eq!(seeds, [Some(41), Some(42), Some(43)]);
        assert!(choices(&l, Some(0), GenerateParams::default()).is_err());
        let over = Some(l.max_choices as i64 + 1);
        assert!(choices(&l, over, GenerateParams::default()).is_err());
    }
}
