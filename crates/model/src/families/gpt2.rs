//! GPT-2: learned absolute positions, LayerNorm with biases, fused QKV, a GELU-tanh MLP, biases
//! everywhere, tied head. HF stores Conv1D weights `[in, out]` (transposed here); GGUF stores
//! them `[out, in]` with Q|K|V fused along the output.

use anelm_formats::HfConfig;

use crate::error::{ModelError, Result};
use crate::hparams::Hparams;
use crate::loader::TensorLoader;
use crate::model::{Family, Model, ModelConfig, ModelSource};
use crate::plan::{Activation, Attention, Ffn, Layer, Linear, Mixer, Norm, NormKind};
use crate::weight::Weight;

/// Where each tensor lives under one naming convention.
struct Names {
    gguf: bool,
    /// HF prefix: `transformer.` or nothing (the original `gpt2` checkpoint).
    prefix: String,
}

impl Names {
    fn global(&self, gguf: &str, hf: &str) -> String {
        if self.gguf {
            gguf.to_string()
        } else {
            format!("{}{hf}", self.prefix)
        }
    }
    fn layer(&self, i: usize, gguf: &str, hf: &str) -> String {
        if self.gguf {
            format!("blk.{i}.{gguf}")
        } else {
            format!("{}h.{i}.{hf}", self.prefix)
        }
    }
}

/// An HF Conv1D weight `[in, out]` as a `[out, in]` f32 matrix.
fn conv1d(l: &TensorLoader, name: &str, inp: usize, out: usize) -> Result<Weight> {
    let t = l.require(name)?;
    if t.shape != [inp, out] {
        return Err(ModelError::shape(
            t.file,
            name,
            format!("shape {:?}, expected [{inp}, {out}]", t.shape),
        ));
    }
    let v = t.to_f32()?;
    let mut tr = vec![0f32; v.len()];
    for i in 0..inp {
        for o in 0..out {
            tr[o * inp + i] = v[i * out + o];
        }
    }
    Ok(Weight::from_f32(name, out, inp, &tr))
}

pub(crate) fn load(
    l: &TensorLoader,
    hp: Hparams,
    hf: Option<&HfConfig>,
    source: ModelSource,
    name: String,
) -> Result<Model> {
    let names = Names {
        gguf: hf.is_none(),
        prefix: if l.has("transformer.wte.weight") {
            "transformer.".into()
        } else {
            String::new()
        },
    };
    let h = hp.hidden;
    let (nh, hd) = (hp.n_heads, hp.head_dim);
    if nh * hd != h {
        return Err(ModelError::invalid(
            l.path(),
            format!("{nh} heads of {hd} do not make hidden size {h}"),
        ));
    }
    let ln = |w: &str| {
        let (wn, bn) = (format!("{w}.weight"), format!("{w}.bias"));
        let bias = l.vector(&bn, h)?;
        Ok::<Norm, ModelError>(Norm {
            kind: NormKind::Layer,
            eps: hp.eps,
            weight: l.vector(&wn, h)?,
            bias: Some(bias),
        })
    };
    // A linear layer: HF transposes a Conv1D, GGUF maps the matrix.
    let lin = |g: &str, hfn: &str, inp: usize, out: usize| -> Result<Linear> {
        let weight = if names.gguf {
            l.matrix(&format!("{g}.weight"), out, inp)?
        } else {
            conv1d(l, &format!("{hfn}.weight"), inp, out)?
        };
        let bias = Some(l.vector(&format!("{}.bias", if names.gguf { g } else { hfn }), out)?);
        Ok(Linear { weight, bias })
    };

    let wte = names.global("token_embd.weight", "wte.weight");
    let vocab = l.require(&wte)?.rows_cols().0;
    let embedding = l.matrix(&wte, vocab, h)?;
    let wpe = names.global("position_embd.weight", "wpe.weight");
    let n_pos = l.require(&wpe)?.rows_cols().0;
    let pos_embedding = l.matrix(&wpe, n_pos, h)?;
    let out_name = if names.gguf {
        "output.weight".to_string()
    } else {
        "lm_head.weight".to_string()
    };
    let lm_head = if l.has(&out_name) {
        l.matrix(&out_name, vocab, h)?
    } else {
        l.matrix(&wte, vocab, h)?
    };

    let mut layers = Vec::with_capacity(hp.n_layers);
    for i in 0..hp.n_layers {
        let at = |g: &str, hfn: &str| names.layer(i, g, hfn);
        let qkv = lin(
            &at("attn_qkv", "attn.c_attn"),
            &at("attn_qkv", "attn.c_attn"),
            h,
            3 * h,
        )?;
        let bias = qkv.bias.as_deref().unwrap_or_default();
        let part = |j: usize, what: &str| Linear {
            weight: qkv
                .weight
                .slice_rows(&format!("{}.{what}", qkv.weight.name), j * h, h),
            bias: Some(bias[j * h..(j + 1) * h].to_vec()),
        };
        let attention = Attention {
            n_heads: nh,
            n_kv_heads: nh,
            head_dim: hd,
            scale: (hd as f32).powf(-0.5),
            window: None,
            softcap: None,
            rope: None,
            q: part(0, "q"),
            k: part(1, "k"),
            v: part(2, "v"),
            o: lin(
                &at("attn_output", "attn.c_proj"),
                &at("attn_output", "attn.c_proj"),
                h,
                h,
            )?,
            q_norm: None,
            k_norm: None,
            output_gate: None,
        };
        layers.push(Layer {
            attn_norm: ln(&at("attn_norm", "ln_1"))?,
            mixer: Mixer::Attention(attention),
            post_attn_norm: None,
            ffn_norm: ln(&at("ffn_norm", "ln_2"))?,
            ffn: Ffn::Plain {
                act: Activation::GeluTanh,
                up: lin(
                    &at("ffn_up", "mlp.c_fc"),
                    &at("ffn_up", "mlp.c_fc"),
                    h,
                    hp.ffn,
                )?,
                down: lin(
                    &at("ffn_down", "mlp.c_proj"),
                    &at("ffn_down", "mlp.c_proj"),
                    hp.ffn,
                    h,
                )?,
            },
            post_ffn_norm: None,
        });
    }
    Ok(Model {
        config: ModelConfig {
            family: Family::Gpt2,
            name,
            vocab_size: vocab,
            hidden_size: h,
            context_length: hp.context.min(n_pos),
        },
        source,
        embedding,
        embed_scale: None,
        pos_embedding: Some(pos_embedding),
        layers,
        final_norm: ln(&names.global("output_norm", "ln_f"))?,
        lm_head,
        final_softcap: None,
    })
}
