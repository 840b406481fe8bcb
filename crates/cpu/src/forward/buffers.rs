//! The run state of the forward pass, allocated once for the largest chunk seen: the shared
//! activation buffers the products write, and each thread's private ones.

use std::sync::Mutex;

use anelm_model::plan::{Attention, DeltaNet, Ffn, Layer, Mixer};
use anelm_model::Model;

use super::linears;
use super::ATTN_BLOCK;
use crate::attention::MAX_PARTS;
use crate::q8::{ActKind, Q8Buf};
use crate::shared::SharedSlice;

/// Widths of the activation buffers (the largest over the layers).
pub(super) struct Dims {
    pub(super) hidden: usize,
    /// Queries, a DeltaNet's `q | k | v` projection, or a short conv's `B | C | x`.
    pub(super) q: usize,
    pub(super) kv: usize,
    /// An attention output gate, or a DeltaNet's `z`.
    pub(super) z: usize,
    /// A DeltaNet's value heads (`b`, `a`).
    pub(super) heads: usize,
    /// Router logits of a mixture of experts.
    pub(super) experts: usize,
    pub(super) ffn: usize,
    /// The longest weight row in values (dequantisation scratch).
    pub(super) cols: usize,
    /// The most rotated dimensions of a head.
    pub(super) rope: usize,
}

impl Dims {
    pub(super) fn of(m: &Model) -> Dims {
        let max = |f: &dyn Fn(&Layer) -> usize| m.layers.iter().map(f).max().unwrap_or(0);
        let attn = |f: &dyn Fn(&Attention) -> usize| max(&|l| l.attention().map_or(0, f));
        let dn = |f: &dyn Fn(&DeltaNet) -> usize| {
            max(&|l| match &l.mixer {
                Mixer::DeltaNet(d) => f(d),
                _ => 0,
            })
        };
        Dims {
            hidden: m.config.hidden_size,
            q: attn(&|a| a.n_heads * a.head_dim)
                .max(dn(&|d| d.conv_channels()))
                .max(max(&|l| match &l.mixer {
                    Mixer::ShortConv(_) => 3 * m.config.hidden_size,
                    _ => 0,
                })),
            kv: attn(&|a| a.n_kv_heads * a.head_dim),
            z: attn(&|a| a.output_gate.as_ref().map_or(0, |g| g.out_features()))
                .max(dn(&|d| d.n_v_heads * d.v_dim)),
            heads: dn(&|d| d.n_v_heads),
            experts: max(&|l| match &l.ffn {
                Ffn::Moe(moe) => moe.router.rows,
                _ => 0,
            }),
            ffn: max(&|l| l.ffn.hidden_features()),
            cols: m
                .layers
                .iter()
                .flat_map(linears)
                .map(|l| l.in_features())
                .max()
                .unwrap_or(0)
                .max(m.config.hidden_size),
            rope: attn(&|a| a.rope.as_ref().map_or(0, |r| r.dims)),
        }
    }

    pub(super) fn widest(&self) -> usize {
        self.hidden.max(self.q).max(self.z).max(self.ffn)
    }
}

/// The buffers of one chunk of tokens. Products write the shared ones (each thread its rows);
/// every thread keeps its own copy of the residual stream and of the inputs of the next product,
/// computing the cheap per-token steps redundantly instead of waiting at a barrier for them.
pub(super) struct Buffers {
    /// Tokens the buffers hold.
    pub(super) cap: usize,
    pub(super) q: Vec<f32>,
    pub(super) k: Vec<f32>,
    pub(super) v: Vec<f32>,
    pub(super) att: Vec<f32>,
    /// Output of the attention projection and of the FFN.
    pub(super) o: Vec<f32>,
    pub(super) g: Vec<f32>,
    pub(super) u: Vec<f32>,
    /// Attention output gate or DeltaNet `z`.
    pub(super) z: Vec<f32>,
    /// DeltaNet `b` and `a`.
    pub(super) b: Vec<f32>,
    pub(super) a: Vec<f32>,
    /// Router logits.
    pub(super) r: Vec<f32>,
    /// Decode attention's parts: outputs and softmax statistics of each query head and part.
    pub(super) part: Vec<f32>,
    pub(super) part_stats: Vec<(f32, f32)>,
    /// Values of `part` one decoded row takes.
    pub(super) part_row: usize,
    pub(super) own: Vec<Mutex<Private>>,
}

/// One thread's buffers.
pub(super) struct Private {
    /// The residual stream.
    pub(super) x: Vec<f32>,
    /// The f32 input of the next product.
    pub(super) xn: Vec<f32>,
    pub(super) q8b: Q8Buf,
    pub(super) q8k: Q8Buf,
    /// Dequantised weight rows, attention scores, position embeddings.
    pub(super) scratch: Vec<f32>,
    /// RoPE's cos and sin per token of the current layer.
    pub(super) angles: Vec<f32>,
    /// A weight row unpacked from its packed copy (an embedding row).
    pub(super) row: Vec<u8>,
    /// Prefill attention's keys and values of a window of the cache, as f32.
    pub(super) window: Vec<f32>,
    /// Prefill attention's running softmaxes of each part of a block of queries: outputs and
    /// statistics.
    pub(super) part: Vec<f32>,
    pub(super) part_stats: Vec<(f32, f32)>,
    /// Mixture of experts: the normalised inputs, the weighted sum of the experts, the routes.
    pub(super) moe_x: Vec<f32>,
    pub(super) moe_acc: Vec<f32>,
    pub(super) routes: Vec<Vec<(usize, f32)>>,
    pub(super) probs: Vec<f32>,
    pub(super) picked: Vec<(usize, f32)>,
    /// Per row of the chunk, the narrowest top-k boundary of any router it met
    /// ([`crate::moe::boundary_gap`]; infinite without a mixture).
    pub(super) route_gap: Vec<f32>,
    /// Per router near-tie ([`anelm_model::ROUTE_NEAR_TIE`]) met in the chunk: the row, the
    /// layer and the experts chosen.
    pub(super) route_ties: Vec<(usize, usize, Vec<usize>)>,
    /// Decode attention: where each row's work items begin.
    pub(super) items: Vec<usize>,
}

impl Buffers {
    /// Room in the decode attention's parts for `rows` rows decoded at once.
    pub(super) fn reserve_decode(&mut self, rows: usize) {
        let len = rows * self.part_row;
        if self.part.len() < len {
            self.part.resize(len, 0.0);
            self.part_stats.resize(len, (0.0, 0.0));
        }
    }

    pub(super) fn new(d: &Dims, cap: usize, threads: usize) -> Buffers {
        let z = |w: usize| vec![0f32; cap * w];
        let widest = d.widest();
        Buffers {
            cap,
            q: z(d.q),
            k: z(d.kv),
            v: z(d.kv),
            att: z(d.q),
            o: z(d.hidden),
            g: z(d.ffn),
            u: z(d.ffn),
            z: z(d.z),
            b: z(d.heads),
            a: z(d.heads),
            r: z(d.experts),
            // A head is at least one value wide, so `q` bounds the number of heads too.
            part: vec![0.0; MAX_PARTS * d.q],
            part_stats: vec![(0.0, 0.0); MAX_PARTS * d.q],
            part_row: MAX_PARTS * d.q,
            own: (0..threads)
                .map(|_| {
                    Mutex::new(Private {
                        x: z(d.hidden),
                        xn: z(widest),
                        // Q8K needs whole 256-value blocks; only widths that are multiples of 256 use it.
                        q8b: Q8Buf::new(ActKind::Q8B32, cap, widest.next_multiple_of(32)),
                        q8k: Q8Buf::new(ActKind::Q8K, cap, widest.next_multiple_of(256)),
                        scratch: vec![0.0; d.cols],
                        angles: vec![0.0; cap * d.rope],
                        row: Vec::new(),
                        window: Vec::new(),
                        part: vec![0.0; ATTN_BLOCK * MAX_PARTS * d.q],
                        part_stats: vec![(0.0, 0.0); ATTN_BLOCK * MAX_PARTS * d.q],
                        moe_x: if d.experts > 0 {
                            z(d.hidden)
                        } else {
                            Vec::new()
                        },
                        moe_acc: if d.experts > 0 {
                            z(d.hidden)
                        } else {
                            Vec::new()
                        },
                        routes: vec![Vec::new(); d.experts],
                        probs: Vec::new(),
                        picked: Vec::new(),
                        route_gap: Vec::new(),
                        route_ties: Vec::new(),
                        items: Vec::new(),
                    })
                })
                .collect(),
        }
    }
}

/// The shared buffers as the pool's threads see them.
pub(super) struct Views<'a> {
    pub(super) q: SharedSlice<'a, f32>,
    pub(super) k: SharedSlice<'a, f32>,
    pub(super) v: SharedSlice<'a, f32>,
    pub(super) att: SharedSlice<'a, f32>,
    pub(super) o: SharedSlice<'a, f32>,
    pub(super) g: SharedSlice<'a, f32>,
    pub(super) u: SharedSlice<'a, f32>,
    pub(super) z: SharedSlice<'a, f32>,
    pub(super) b: SharedSlice<'a, f32>,
    pub(super) a: SharedSlice<'a, f32>,
    pub(super) r: SharedSlice<'a, f32>,
    pub(super) part: SharedSlice<'a, f32>,
    pub(super) part_stats: SharedSlice<'a, (f32, f32)>,
    pub(super) out: SharedSlice<'a, f32>,
}
