//! The shared builder of pre-norm decoder stacks (Llama, Mistral, Qwen2/3, Gemma 1–3). A family
//! file describes its quirks in a [`Recipe`]; this file turns it into the LayerPlan.

use anelm_formats::RopeParams;

use crate::error::{ModelError, Result};
use crate::hparams::Hparams;
use crate::hybrid::{self, DeltaNetSpec, MoeSpec, ShortConvSpec};
use crate::loader::TensorLoader;
use crate::model::{Family, Model, ModelConfig, ModelSource};
use crate::plan::{Activation, Attention, Ffn, Layer, Mixer, Norm, NormKind, Rope, RopePairing};

/// Tensor naming convention of the file.
#[derive(Clone, Copy)]
pub(crate) enum Naming {
    /// llama.cpp's `blk.N.attn_q.weight`.
    Gguf,
    /// transformers' `model.layers.N.self_attn.q_proj.weight`; `sandwich` models name their
    /// FFN pre-norm `pre_feedforward_layernorm` and use `post_attention_layernorm` as the
    /// post-attention norm.
    Hf { sandwich: bool },
    /// transformers' LFM2: `operator_norm`, `self_attn.out_proj`, `q_layernorm`,
    /// `feed_forward.w1|w3|w2`, the final norm `embedding_norm`.
    Lfm2,
}

#[derive(Clone, Copy)]
pub(crate) enum Role {
    AttnNorm,
    Q,
    K,
    V,
    O,
    QNorm,
    KNorm,
    PostAttnNorm,
    FfnNorm,
    Gate,
    Up,
    Down,
    PostFfnNorm,
}

impl Naming {
    /// Name of a layer tensor without the `.weight` / `.bias` suffix.
    pub fn layer(self, i: usize, role: Role) -> String {
        match self {
            Naming::Gguf => {
                let r = match role {
                    Role::AttnNorm => "attn_norm",
                    Role::Q => "attn_q",
                    Role::K => "attn_k",
                    Role::V => "attn_v",
                    Role::O => "attn_output",
                    Role::QNorm => "attn_q_norm",
                    Role::KNorm => "attn_k_norm",
                    Role::PostAttnNorm => "post_attention_norm",
                    Role::FfnNorm => "ffn_norm",
                    Role::Gate => "ffn_gate",
                    Role::Up => "ffn_up",
                    Role::Down => "ffn_down",
                    Role::PostFfnNorm => "post_ffw_norm",
                };
                format!("blk.{i}.{r}")
            }
            Naming::Hf { sandwich } => {
                let r = match role {
                    Role::AttnNorm => "input_layernorm",
                    Role::Q => "self_attn.q_proj",
                    Role::K => "self_attn.k_proj",
                    Role::V => "self_attn.v_proj",
                    Role::O => "self_attn.o_proj",
                    Role::QNorm => "self_attn.q_norm",
                    Role::KNorm => "self_attn.k_norm",
                    Role::PostAttnNorm => "post_attention_layernorm",
                    Role::FfnNorm if sandwich => "pre_feedforward_layernorm",
                    Role::FfnNorm => "post_attention_layernorm",
                    Role::Gate => "mlp.gate_proj",
                    Role::Up => "mlp.up_proj",
                    Role::Down => "mlp.down_proj",
                    Role::PostFfnNorm => "post_feedforward_layernorm",
                };
                format!("model.layers.{i}.{r}")
            }
            Naming::Lfm2 => {
                let r = match role {
                    Role::AttnNorm => "operator_norm",
                    Role::Q => "self_attn.q_proj",
                    Role::K => "self_attn.k_proj",
                    Role::V => "self_attn.v_proj",
                    Role::O => "self_attn.out_proj",
                    Role::QNorm => "self_attn.q_layernorm",
                    Role::KNorm => "self_attn.k_layernorm",
                    Role::FfnNorm => "ffn_norm",
                    Role::Gate => "feed_forward.w1",
                    Role::Up => "feed_forward.w3",
                    Role::Down => "feed_forward.w2",
                    // LFM2 has no sandwich norms.
                    Role::PostAttnNorm => "post_attention_norm",
                    Role::PostFfnNorm => "post_feedforward_norm",
                };
                format!("model.layers.{i}.{r}")
            }
        }
    }

    pub fn embedding(self) -> &'static str {
        match self {
            Naming::Gguf => "token_embd.weight",
            Naming::Hf { .. } | Naming::Lfm2 => "model.embed_tokens.weight",
        }
    }

    pub fn final_norm(self) -> &'static str {
        match self {
            Naming::Gguf => "output_norm.weight",
            Naming::Hf { .. } => "model.norm.weight",
            Naming::Lfm2 => "model.embedding_norm.weight",
        }
    }

    pub fn output(self) -> &'static str {
        match self {
            Naming::Gguf => "output.weight",
            Naming::Hf { .. } | Naming::Lfm2 => "lm_head.weight",
        }
    }
}

/// Attention settings that vary by layer (sliding vs global layers).
#[derive(Clone, Debug)]
pub(crate) struct AttnKind {
    pub window: Option<usize>,
    pub rope: RopeParams,
    pub scale: f32,
    pub softcap: Option<f32>,
}

pub(crate) struct Recipe {
    pub family: Family,
    pub hp: Hparams,
    pub naming: Naming,
    /// Stored norm weights are `w` of a `(1 + w)` norm (HF Gemma); GGUF stores `1 + w` already.
    pub norm_plus_one: bool,
    pub sandwich: bool,
    pub act: Activation,
    pub embed_scale: Option<f32>,
    pub pairing: RopePairing,
    /// Per-layer RoPE frequency divisors (llama.cpp's `rope_freqs.weight`, Llama 3).
    pub freq_factors: Option<Vec<f32>>,
    pub layers: Vec<AttnKind>,
    /// Mixture-of-experts FFNs on the layers it marks.
    pub moe: Option<MoeSpec>,
    /// Gated DeltaNet mixers on the layers it marks.
    pub deltanet: Option<DeltaNetSpec>,
    /// LFM2's short convolutions on the layers it marks.
    pub short_conv: Option<ShortConvSpec>,
    /// The final norm's stored name where it is not the naming's (llama.cpp's LFM2:
    /// `token_embd_norm.weight`).
    pub final_norm: Option<&'static str>,
    /// `q_proj` carries a per-head output gate (Qwen3-Next, Qwen3.5).
    pub gated_attention: bool,
    /// The stored name of the FFN pre-norm: `ffn_norm` in most GGUF files, `post_attention_norm`
    /// in llama.cpp's Qwen3-Next / Qwen3.5 files.
    pub ffn_norm: Role,
}

impl Recipe {
    /// The plain pre-norm SwiGLU decoder that most families are, so a family states only what
    /// differs (`Recipe { sandwich: true, ..Recipe::new(..) }`): every layer global with the
    /// model's RoPE and a `head_dim^-0.5` scale, stored norms used as they are, rotate-half RoPE.
    pub fn new(family: Family, hp: Hparams, naming: Naming) -> Recipe {
        let layers = vec![
            AttnKind {
                window: None,
                rope: hp.rope.clone(),
                scale: (hp.head_dim as f32).powf(-0.5),
                softcap: None,
            };
            hp.n_layers
        ];
        Recipe {
            family,
            hp,
            naming,
            norm_plus_one: false,
            sandwich: false,
            act: Activation::Silu,
            embed_scale: None,
            pairing: RopePairing::HalfSplit,
            freq_factors: None,
            layers,
            moe: None,
            deltanet: None,
            short_conv: None,
            final_norm: None,
            gated_attention: false,
            ffn_norm: Role::FfnNorm,
        }
    }
}

/// Inverse RoPE frequencies for `dims` rotated dimensions under `p`'s scaling.
pub(crate) fn rope_inv_freq(
    p: &RopeParams,
    dims: usize,
    freq_factors: Option<&[f32]>,
) -> std::result::Result<Vec<f32>, String> {
    let mut f = Rope::plain_inv_freq(p.theta, dims);
    match p.rope_type.as_str() {
        "default" | "none" => {}
        "linear" => {
            let factor = p.factor.ok_or("linear RoPE scaling without a factor")? as f32;
            f.iter_mut().for_each(|x| *x /= factor);
        }
        "llama3" => {
            let factor = p.factor.ok_or("llama3 RoPE scaling without a factor")?;
            let low = p.low_freq_factor.unwrap_or(1.0);
            let high = p.high_freq_factor.unwrap_or(4.0);
            let old = p.original_max_position_embeddings.unwrap_or(8192.0);
            let (low_wl, high_wl) = (old / low, old / high);
            for x in f.iter_mut() {
                let freq = *x as f64;
                let wavelen = 2.0 * std::f64::consts::PI / freq;
                *x = if wavelen < high_wl {
                    freq
                } else if wavelen > low_wl {
                    freq / factor
                } else {
                    let smooth = (old / wavelen - low) / (high - low);
                    (1.0 - smooth) * freq / factor + smooth * freq
                } as f32;
            }
        }
        other => return Err(format!("RoPE scaling '{other}' is not supported")),
    }
    if let Some(ff) = freq_factors {
        if ff.len() != f.len() {
            return Err(format!(
                "rope_freqs has {} values, expected {}",
                ff.len(),
                f.len()
            ));
        }
        f.iter_mut().zip(ff).for_each(|(x, d)| *x /= d);
    }
    Ok(f)
}

pub(crate) fn build(
    loader: &TensorLoader,
    r: Recipe,
    source: ModelSource,
    name: String,
) -> Result<Model> {
    let hp = &r.hp;
    let path = loader.path().to_path_buf();
    if hp.n_heads == 0 || hp.n_kv_heads == 0 || !hp.n_heads.is_multiple_of(hp.n_kv_heads) {
        return Err(ModelError::invalid(
            &path,
            format!(
                "{} heads cannot share {} KV heads",
                hp.n_heads, hp.n_kv_heads
            ),
        ));
    }
    if !hp.rope_dims.is_multiple_of(2) || hp.rope_dims > hp.head_dim {
        return Err(ModelError::invalid(
            &path,
            format!("RoPE over {} of {} head dims", hp.rope_dims, hp.head_dim),
        ));
    }
    let n = r.naming;
    let embed_t = loader.require(n.embedding())?;
    let vocab = embed_t.rows_cols().0;
    let embedding = loader.matrix(n.embedding(), vocab, hp.hidden)?;
    let lm_head = if loader.has(n.output()) {
        loader.matrix(n.output(), vocab, hp.hidden)?
    } else {
        loader.matrix(n.embedding(), vocab, hp.hidden)?
    };
    let rms = |name: &str, width: usize| {
        loader.norm(
            &format!("{name}.weight"),
            width,
            NormKind::Rms,
            hp.eps,
            r.norm_plus_one,
            None,
        )
    };

    let (q_out, kv_out) = (hp.n_heads * hp.head_dim, hp.n_kv_heads * hp.head_dim);
    let mut layers = Vec::with_capacity(hp.n_layers);
    for (i, kind) in r.layers.iter().enumerate() {
        let lin = |role: Role, out: usize, inp: usize| {
            let base = n.layer(i, role);
            loader.linear(
                &format!("{base}.weight"),
                out,
                inp,
                Some(&format!("{base}.bias")),
            )
        };
        let head_norm = |role: Role| -> Result<Option<Norm>> {
            let name = n.layer(i, role);
            if loader.has(&format!("{name}.weight")) {
                rms(&name, hp.head_dim).map(Some)
            } else {
                Ok(None)
            }
        };
        let short_conv = r.short_conv.as_ref().filter(|c| c.layers[i]);
        let mixer = match (&r.deltanet, short_conv) {
            (Some(d), _) if d.layers[i] => {
                Mixer::DeltaNet(hybrid::deltanet(loader, i, d, hp.hidden, hp.eps)?)
            }
            (_, Some(c)) => Mixer::ShortConv(hybrid::short_conv(loader, i, c, hp.hidden, n)?),
            _ => {
                let inv_freq = rope_inv_freq(&kind.rope, hp.rope_dims, r.freq_factors.as_deref())
                    .map_err(|m| ModelError::invalid(&path, m))?;
                let (q, output_gate) = if r.gated_attention {
                    let name = format!("{}.weight", n.layer(i, Role::Q));
                    let (q, g) =
                        hybrid::gated_query(loader, &name, hp.n_heads, hp.head_dim, hp.hidden)?;
                    (q, Some(g))
                } else {
                    (lin(Role::Q, q_out, hp.hidden)?, None)
                };
                Mixer::Attention(Attention {
                    n_heads: hp.n_heads,
                    n_kv_heads: hp.n_kv_heads,
                    head_dim: hp.head_dim,
                    scale: kind.scale,
                    window: kind.window,
                    softcap: kind.softcap,
                    rope: Some(Rope {
                        dims: hp.rope_dims,
                        pairing: r.pairing,
                        inv_freq,
                        mscale: 1.0,
                    }),
                    q,
                    k: lin(Role::K, kv_out, hp.hidden)?,
                    v: lin(Role::V, kv_out, hp.hidden)?,
                    o: lin(Role::O, hp.hidden, q_out)?,
                    q_norm: head_norm(Role::QNorm)?,
                    k_norm: head_norm(Role::KNorm)?,
                    output_gate,
                })
            }
        };
        let post = |role: Role| -> Result<Option<Norm>> {
            if r.sandwich {
                rms(&n.layer(i, role), hp.hidden).map(Some)
            } else {
                Ok(None)
            }
        };
        let ffn = match &r.moe {
            Some(m) if m.layers[i] => Ffn::Moe(hybrid::moe(loader, i, m, r.act, hp.hidden, n)?),
            _ => Ffn::Gated {
                act: r.act,
                gate: lin(Role::Gate, hp.ffn, hp.hidden)?,
                up: lin(Role::Up, hp.ffn, hp.hidden)?,
                down: lin(Role::Down, hp.hidden, hp.ffn)?,
            },
        };
        layers.push(Layer {
            attn_norm: rms(&n.layer(i, Role::AttnNorm), hp.hidden)?,
            mixer,
            post_attn_norm: post(Role::PostAttnNorm)?,
            ffn_norm: rms(&n.layer(i, r.ffn_norm), hp.hidden)?,
            ffn,
            post_ffn_norm: post(Role::PostFfnNorm)?,
        });
    }
    let final_norm = loader.norm(
        r.final_norm.unwrap_or(n.final_norm()),
        hp.hidden,
        NormKind::Rms,
        hp.eps,
        r.norm_plus_one,
        None,
    )?;
    Ok(Model {
        config: ModelConfig {
            family: r.family,
            name,
            vocab_size: vocab,
            hidden_size: hp.hidden,
            context_length: hp.context,
        },
        source,
        embedding,
        embed_scale: r.embed_scale,
        pos_embedding: None,
        layers,
        final_norm,
        lm_head,
        final_softcap: hp.final_softcap,
    })
}
