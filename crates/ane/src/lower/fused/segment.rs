//! Which layers go in which chunk: consecutive whole layers under both ceilings (layers and
//! weight bytes per program), balanced in layers — and a mixture whose weights are more than a
//! program holds split by experts over consecutive chunks, the first holding the mixer, the
//! router and the shared expert, each of the others the router again and more experts.

use std::ops::Range;

use anelm_model::plan::{Ffn, Layer, Linear};
use anelm_model::Model;

use super::moe::moe_bytes;
use super::LoweringOptions;
use crate::error::{AneError, Result};

/// Some of a mixture's experts: `experts` of the `of` that layer `layer` has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertSlice {
    pub layer: usize,
    pub experts: Range<usize>,
    pub of: usize,
}

impl ExpertSlice {
    /// Whether the slice ends the mixture.
    pub fn ends(&self) -> bool {
        self.experts.end == self.of
    }
}

/// Consecutive layers compiled as one program.
#[derive(Clone, Debug, PartialEq)]
pub struct ChunkSpec {
    pub name: String,
    /// Layers whose mixer (attention, conv or DeltaNet) and FFN this chunk runs.
    pub layers: Range<usize>,
    /// Before them, more experts of a mixture an earlier chunk began: its pre-FFN residual
    /// comes in as input `hm`, the partial sum as `x`.
    pub resume: Option<ExpertSlice>,
    /// The last of `layers` holds only these first experts of its mixture here (the others
    /// follow in the next chunks): its pre-FFN residual goes out as `hm`.
    pub cut: Option<ExpertSlice>,
    /// Whether the final norm and the lm_head are in this chunk (the last one).
    pub head: bool,
    /// fp16 weight bytes.
    pub weight_bytes: u64,
}

impl ChunkSpec {
    /// The layer whose mixture this chunk leaves unfinished (its output `y` is a partial sum
    /// and `hm` goes out), if any.
    pub fn open_layer(&self) -> Option<usize> {
        match (&self.cut, &self.resume) {
            (Some(c), _) => Some(c.layer),
            (None, Some(r)) if !r.ends() => Some(r.layer),
            _ => None,
        }
    }

    /// The last layer whose output this chunk hands on whole, if any.
    pub fn last_layer(&self) -> Option<usize> {
        if self.open_layer().is_some() {
            None
        } else if !self.layers.is_empty() {
            Some(self.layers.end - 1)
        } else {
            self.resume.as_ref().map(|r| r.layer)
        }
    }

    /// "layers 2..4", "experts 40..64 of layer 1, layers 2..3", "+ head".
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(r) = &self.resume {
            parts.push(format!(
                "experts {}..{} of {} of layer {}",
                r.experts.start, r.experts.end, r.of, r.layer
            ));
        }
        if !self.layers.is_empty() {
            parts.push(format!("layers {}..{}", self.layers.start, self.layers.end));
        }
        if let Some(c) = &self.cut {
            parts.push(format!(
                "(layer {}: experts {}..{} of {})",
                c.layer, c.experts.start, c.experts.end, c.of
            ));
        }
        if self.head {
            parts.push("+ head".into());
        }
        parts.join(" ")
    }
}

fn linear_bytes(l: &Linear) -> u64 {
    (l.out_features() * l.in_features() * 2) as u64
}

/// A layer's fp16 bytes: what must stay together (the mixer, a dense FFN; a mixture's router and
/// shared expert) and, of a mixture, each expert and the router again for later parts.
struct Cost {
    base: u64,
    router: u64,
    experts: Vec<u64>,
}

impl Cost {
    fn of(l: &Layer, index: usize) -> Result<Cost> {
        let mixer: u64 = l.mixer.linears().into_iter().map(linear_bytes).sum();
        Ok(match &l.ffn {
            Ffn::Gated { gate, up, down, .. } => Cost {
                base: mixer + linear_bytes(gate) + linear_bytes(up) + linear_bytes(down),
                router: 0,
                experts: Vec::new(),
            },
            Ffn::Plain { up, down, .. } => Cost {
                base: mixer + linear_bytes(up) + linear_bytes(down),
                router: 0,
                experts: Vec::new(),
            },
            Ffn::Moe(m) => {
                let b = moe_bytes(m, index)?;
                Cost {
                    base: mixer + b.router + b.shared,
                    router: b.router,
                    experts: b.experts,
                }
            }
        })
    }

    fn whole(&self) -> u64 {
        self.base + self.experts.iter().sum::<u64>()
    }
}

/// One chunk as it is filled.
struct Open {
    layers: Range<usize>,
    resume: Option<ExpertSlice>,
    cut: Option<ExpertSlice>,
    bytes: u64,
}

impl Open {
    /// Whether a whole layer may still join.
    fn takes_layers(&self) -> bool {
        self.cut.is_none() && self.resume.as_ref().is_none_or(ExpertSlice::ends)
    }
}

/// The experts from `from` on that fit in `room` bytes beside `used` (at least one).
fn fill(experts: &[u64], from: usize, used: u64, room: u64) -> usize {
    let mut end = from;
    let mut bytes = used;
    while end < experts.len() && (end == from || bytes + experts[end] <= room) {
        bytes += experts[end];
        end += 1;
    }
    end
}

/// The chunks of `model` under `opts`' ceilings, the head in the last one if it fits.
pub(super) fn segment(model: &Model, opts: &LoweringOptions) -> Result<Vec<ChunkSpec>> {
    let ceiling = opts.chunk_bytes;
    let n = model.n_layers();
    let costs = (model.layers.iter().enumerate())
        .map(|(i, l)| Cost::of(l, i))
        .collect::<Result<Vec<Cost>>>()?;
    let total: u64 = costs.iter().map(Cost::whole).sum();
    let n_chunks = n
        .div_ceil(opts.chunk_layers.max(1))
        .max(total.div_ceil(ceiling.max(1)) as usize)
        .max(1);
    let per_chunk = n.div_ceil(n_chunks).max(1);
    let mut open: Vec<Open> = Vec::new();
    for (i, c) in costs.iter().enumerate() {
        let whole = c.whole();
        if whole <= ceiling {
            match open.last_mut() {
                Some(o)
                    if o.takes_layers()
                        && o.layers.len() < per_chunk
                        && o.bytes + whole <= ceiling =>
                {
                    o.layers.end = i + 1;
                    o.bytes += whole;
                }
                _ => open.push(Open {
                    layers: i..i + 1,
                    resume: None,
                    cut: None,
                    bytes: whole,
                }),
            }
            continue;
        }
        // More than a program holds: only a mixture's experts can be spread, each part holding
        // at least one expert beside what it must.
        let biggest = c.experts.iter().copied().max().unwrap_or(0);
        let splittable = !c.experts.is_empty()
            && model.layers[i].post_ffn_norm.is_none()
            && c.base + c.experts[0] <= ceiling
            && c.router + biggest <= ceiling;
        if !splittable {
            let why = if c.experts.is_empty() || model.layers[i].post_ffn_norm.is_some() {
                String::new()
            } else {
                " even with its experts spread over several".into()
            };
            return Err(AneError::Unsupported(format!(
                "layer {i} holds {whole} bytes of fp16 weights, more than one program's {ceiling}{why}"
            )));
        }
        let of = c.experts.len();
        let end = fill(&c.experts, 0, c.base, ceiling);
        open.push(Open {
            layers: i..i + 1,
            resume: None,
            cut: Some(ExpertSlice {
                layer: i,
                experts: 0..end,
                of,
            }),
            bytes: c.base + c.experts[..end].iter().sum::<u64>(),
        });
        let mut from = end;
        while from < of {
            let end = fill(&c.experts, from, c.router, ceiling);
            open.push(Open {
                layers: i + 1..i + 1,
                resume: Some(ExpertSlice {
                    layer: i,
                    experts: from..end,
                    of,
                }),
                cut: None,
                bytes: c.router + c.experts[from..end].iter().sum::<u64>(),
            });
            from = end;
        }
    }
    let head_bytes = (model.lm_head.rows * model.lm_head.cols * 2) as u64;
    if open
        .last()
        .is_none_or(|o| o.bytes + head_bytes > ceiling || !o.takes_layers())
    {
        open.push(Open {
            layers: n..n,
            resume: None,
            cut: None,
            bytes: 0,
        });
    }
    let last = open.len() - 1;
    Ok(open
        .into_iter()
        .enumerate()
        .map(|(c, o)| ChunkSpec {
            name: format!("chunk{c}"),
            layers: o.layers,
            resume: o.resume,
            cut: o.cut,
            head: c == last,
            weight_bytes: o.bytes + if c == last { head_bytes } else { 0 },
        })
        .collect())
}
