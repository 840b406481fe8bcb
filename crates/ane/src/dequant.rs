//! The model with every matrix it multiplies dequantised to f32. The CPU engine then takes f32
//! activations and an f32 KV cache instead of 8-bit activations and an f16 cache: exact
//! arithmetic on the very weights the kernels were lowered from — the reference the device path
//! is verified against (the quantised engine's own rounding moves logits by a few percent).
//! Under an integer weight policy the matrices are the weights the programs define (the file's
//! where they map exactly, the re-quantised ones where the policy compresses), so that the
//! only difference left is the device's fp16 arithmetic.

use anelm_model::plan::{
    Attention, DeltaNet, Ffn, GatedMlp, Layer, Linear, Mixer, Moe, Norm, SharedExpert, ShortConv,
};
use anelm_model::{Model, ModelSource, Weight};

use crate::error::Result;
use crate::lower::encode::{encode, Encoding, Part, WeightPolicy, WeightTarget};

fn f32_weight(w: &Weight, target: WeightTarget) -> Result<Weight> {
    let values = match target.policy {
        WeightPolicy::Fp16 => w.to_f32()?,
        _ => {
            let e = encode(&[Part::whole(w)], target)?;
            match e.encoding {
                // fp16 programs are compared with the file's values (as they always were).
                Encoding::Fp16(_) => w.to_f32()?,
                Encoding::Blockwise { .. } | Encoding::Lut { .. } | Encoding::Affine { .. } => {
                    e.to_f32()
                }
            }
        }
    };
    Ok(Weight::from_f32(&w.name, w.rows, w.cols, &values))
}

fn copy(w: &Weight) -> Weight {
    Weight::from_bytes(&w.name, w.dtype, w.rows, w.cols, w.bytes().to_vec())
}

fn linear(l: &Linear, p: WeightTarget) -> Result<Linear> {
    Ok(Linear {
        weight: f32_weight(&l.weight, p)?,
        bias: l.bias.clone(),
    })
}

fn norm(n: &Norm) -> Norm {
    Norm {
        kind: n.kind,
        eps: n.eps,
        weight: n.weight.clone(),
        bias: n.bias.clone(),
    }
}

fn mixer(m: &Mixer, p: WeightTarget) -> Result<Mixer> {
    Ok(match m {
        Mixer::Attention(a) => Mixer::Attention(Attention {
            n_heads: a.n_heads,
            n_kv_heads: a.n_kv_heads,
            head_dim: a.head_dim,
            scale: a.scale,
            window: a.window,
            softcap: a.softcap,
            rope: a.rope.clone(),
            q: linear(&a.q, p)?,
            k: linear(&a.k, p)?,
            v: linear(&a.v, p)?,
            o: linear(&a.o, p)?,
            q_norm: a.q_norm.as_ref().map(norm),
            k_norm: a.k_norm.as_ref().map(norm),
            output_gate: a.output_gate.as_ref().map(|g| linear(g, p)).transpose()?,
        }),
        Mixer::DeltaNet(d) => Mixer::DeltaNet(DeltaNet {
            n_k_heads: d.n_k_heads,
            n_v_heads: d.n_v_heads,
            k_dim: d.k_dim,
            v_dim: d.v_dim,
            conv_kernel: d.conv_kernel,
            key_head_of: d.key_head_of,
            qkv: linear(&d.qkv, p)?,
            z: linear(&d.z, p)?,
            b: linear(&d.b, p)?,
            a: linear(&d.a, p)?,
            conv: d.conv.clone(),
            neg_a: d.neg_a.clone(),
            dt_bias: d.dt_bias.clone(),
            norm: norm(&d.norm),
            out: linear(&d.out, p)?,
        }),
        Mixer::ShortConv(c) => Mixer::ShortConv(ShortConv {
            kernel: c.kernel,
            in_proj: linear(&c.in_proj, p)?,
            conv: c.conv.clone(),
            conv_bias: c.conv_bias.clone(),
            out: linear(&c.out, p)?,
        }),
    })
}

fn layer(l: &Layer, p: WeightTarget) -> Result<Layer> {
    let ffn = match &l.ffn {
        Ffn::Gated {
            act,
            gate,
            up,
            down,
        } => Ffn::Gated {
            act: *act,
            gate: linear(gate, p)?,
            up: linear(up, p)?,
            down: linear(down, p)?,
        },
        Ffn::Plain { act, up, down } => Ffn::Plain {
            act: *act,
            up: linear(up, p)?,
            down: linear(down, p)?,
        },
        Ffn::Moe(m) => {
            let mlp = |g: &GatedMlp| -> Result<GatedMlp> {
                Ok(GatedMlp {
                    gate: linear(&g.gate, p)?,
                    up: linear(&g.up, p)?,
                    down: linear(&g.down, p)?,
                })
            };
            Ffn::Moe(Moe {
                act: m.act,
                router: f32_weight(&m.router, p)?,
                experts: m.experts.iter().map(mlp).collect::<Result<_>>()?,
                top_k: m.top_k,
                norm_top_k: m.norm_top_k,
                shared: match &m.shared {
                    Some(s) => Some(SharedExpert {
                        mlp: mlp(&s.mlp)?,
                        gate: s.gate.as_ref().map(|g| f32_weight(g, p)).transpose()?,
                    }),
                    None => None,
                },
            })
        }
    };
    Ok(Layer {
        attn_norm: norm(&l.attn_norm),
        mixer: mixer(&l.mixer, p)?,
        post_attn_norm: l.post_attn_norm.as_ref().map(norm),
        ffn_norm: norm(&l.ffn_norm),
        ffn,
        post_ffn_norm: l.post_ffn_norm.as_ref().map(norm),
    })
}

/// A copy of `m` whose layer matrices and output head are f32 (embeddings, read a row at a
/// time and dequantised exactly by every executor, keep their type).
pub fn dequantized(m: &Model) -> Result<Model> {
    dequantized_as(m, WeightPolicy::Fp16.into())
}

/// [`dequantized`], with the matrices the programs hold under `policy` (in its dialect).
pub fn dequantized_as(m: &Model, policy: WeightTarget) -> Result<Model> {
    let source = match &m.source {
        ModelSource::Gguf { path, metadata } => ModelSource::Gguf {
            path: path.clone(),
            metadata: metadata.clone(),
        },
        ModelSource::HfDir { dir } => ModelSource::HfDir { dir: dir.clone() },
    };
    Ok(Model {
        config: m.config.clone(),
        source,
        embedding: copy(&m.embedding),
        embed_scale: m.embed_scale,
        pos_embedding: m.pos_embedding.as_ref().map(copy),
        layers: (m.layers.iter())
            .map(|l| layer(l, policy))
            .collect::<Result<_>>()?,
        final_norm: norm(&m.final_norm),
        lm_head: f32_weight(&m.lm_head, policy)?,
        final_softcap: m.final_softcap,
    })
}
